"""Training exporters: a :class:`~jaxmodel.export.plans.TrainPlan` as Megatron-LM arguments
(:func:`megatron_args`), a TorchTitan job TOML (:func:`torchtitan_toml`) or a NeMo 2.0 recipe
(:func:`nemo_recipe`); every flag from :data:`jaxmodel.export.flags.FLAGS`."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from jaxmodel.export.flags import LaunchConfig, SOURCES, _Emitter
from jaxmodel.export.plans import TrainPlan, _model_ints, _onoff, pipeline_stages


# --------------------------------------------------------------------------------------------
# Megatron-LM
# --------------------------------------------------------------------------------------------
def _megatron_pipeline(e: _Emitter, p: "_Ctx", notes: list) -> None:
    """Pipeline split flags (Megatron-LM core_v0.15.0 ``megatron/training/arguments.py``,
    ``validate_args``: at most one of ``--num-layers-per-virtual-pipeline-stage``,
    ``--num-virtual-stages-per-pipeline-rank``, ``--pipeline-model-parallel-layout``; the
    ``--account-for-{embedding,loss}-in-pipeline-split`` flags add one layer each to the
    count that ``pp`` (and ``pp·v``) must divide).

    Interleaved: ``pp·v | L + s`` (``s`` = 0, 1 or 2 slots, the model's
    :func:`jaxmodel.parallel.plan.layers_ok`) gives ``(L+s)/(pp·v)`` layers per virtual stage
    with ``s`` account flags (one slot: the loss's). Otherwise the model's stages
    (:func:`pipeline_stages`) are matched by, in order: an even split; the account flags
    (their stages: ``(L+s)/pp`` each, one less on the stage holding the embedding / loss);
    ``--decoder-first/last-pipeline-num-layers`` (the middle stages even); the explicit
    ``--pipeline-model-parallel-layout`` (``E`` embedding, ``t`` decoder layer, ``L`` loss,
    stages split by ``|``).
    """
    L, pp, v = p.model_ints["n_layers"], p.plan.pp, p.plan.v
    if pp == 1:
        return
    if v > 1:
        s = next(s for s in (0, 2, 1) if (L + s) % (pp * v) == 0)
        if s == 2:
            e("--account-for-embedding-in-pipeline-split")
        if s >= 1:
            e("--account-for-loss-in-pipeline-split")
        e("--num-layers-per-virtual-pipeline-stage", (L + s) // (pp * v))
        return
    want = pipeline_stages(L, pp)
    if len(set(want)) == 1:
        return
    for emb, loss in ((False, True), (True, True)):
        s = int(emb) + int(loss)
        if (L + s) % pp:
            continue
        k = (L + s) // pp
        stages = [k] * pp
        stages[0] -= int(emb)
        stages[-1] -= int(loss)
        if stages == want:
            if emb:
                e("--account-for-embedding-in-pipeline-split")
            e("--account-for-loss-in-pipeline-split")
            return
    mid = want[1:-1]
    if len(set(mid)) <= 1 and (pp > 2 or want[0] + want[-1] == L):
        e("--decoder-first-pipeline-num-layers", want[0])
        e("--decoder-last-pipeline-num-layers", want[-1])
        return
    layout = "|".join(("E" if i == 0 else "") + f"t*{n}" + ("L" if i == pp - 1 else "")
                      for i, n in enumerate(want))
    e("--pipeline-model-parallel-layout", layout)


def _torchrun(p: TrainPlan) -> list[str]:
    """``torchrun --nnodes=N --nproc-per-node=G`` (PyTorch ``torch/distributed/run.py``)
    when the system is known, else ``torchrun`` (its defaults: one node, one process)."""
    e = _Emitter("torchrun")
    if p.n_nodes is not None:
        e("--nnodes", p.n_nodes)
        e("--nproc-per-node", p.gpus_per_node)
    return ["torchrun"] + [f"{k}={v}" for k, v in e.flags.items()]


@dataclasses.dataclass(frozen=True)
class _Ctx:
    plan: TrainPlan
    model_ints: dict


def _megatron_model(e: _Emitter, p: TrainPlan, mi: dict, notes: list) -> None:
    """Model shape flags of :func:`megatron_args` (Megatron-LM core_v0.15.0
    ``megatron/training/arguments.py``): layers, hidden and FFN sizes (counts), heads, GQA
    groups, ``--kv-channels`` when the head dimension is not d/h, SwiGLU, MoE experts and
    router top-k, sequence length (tokens)."""
    e("--num-layers", mi["n_layers"])
    e("--hidden-size", mi["d_model"])
    e("--ffn-hidden-size", mi["d_ff"])
    e("--num-attention-heads", mi["n_heads"])
    if mi["head_dim"] * mi["n_heads"] != mi["d_model"]:
        e("--kv-channels", mi["head_dim"])
    if mi["n_kv_heads"] != mi["n_heads"]:
        e("--group-query-attention")
        e("--num-query-groups", mi["n_kv_heads"])
    if mi["activation"] == "swiglu":
        e("--swiglu")
    elif mi["activation"] != "gelu":
        notes.append(f"activation {mi['activation']!r}: set Megatron's activation flags by "
                     "hand (the export names only gelu and swiglu)")
    if mi["n_experts"] > 1:
        e("--num-experts", mi["n_experts"])
        e("--moe-router-topk", mi["top_k"])
        if mi["moe_d_ff"] > 0:
            e("--moe-ffn-hidden-size", mi["moe_d_ff"])
    e("--seq-length", p.seq_len)
    e("--max-position-embeddings", p.seq_len)


def _megatron_memory_numerics(e: _Emitter, p: TrainPlan, notes: list) -> None:
    """Recompute, ZeRO / Megatron-FSDP, precision and attention-backend flags of
    :func:`megatron_args` (Megatron-LM core_v0.15.0 ``megatron/training/arguments.py``;
    the mapping is listed there)."""
    # memory
    if p.recompute == "selective":
        e("--recompute-granularity", "selective")
    elif p.recompute == "full":
        e("--recompute-granularity", "full")
        e("--recompute-method", "uniform")
        e("--recompute-num-layers", 1)
    if p.zero == 1:
        e("--use-distributed-optimizer")
    elif p.zero >= 2:
        e("--use-megatron-fsdp")
        e("--data-parallel-sharding-strategy", "optim_grads" if p.zero == 2
          else "optim_grads_params")
        e("--ckpt-format", "fsdp_dtensor")
    # numerics
    if p.precision == "fp16":
        e("--fp16")
    elif p.precision in ("bf16", "fp8", "fp4"):
        e("--bf16")
    if p.precision == "fp8":
        e("--fp8-format", "hybrid")
        e("--fp8-recipe", "delayed")
    elif p.precision == "fp4":
        e("--fp4-format", "e2m1")
        e("--fp4-recipe", "nvfp4")
    e("--attention-backend", "unfused" if p.flash_attention == "standard" else "flash")
    if p.flash_attention == "standard":
        notes.append("flash_attention=0: standard (unfused) attention, as the model timed "
                     "the plan; a plan with flash_attention='fa2' exports --attention-backend "
                     "flash")


def megatron_args(p: TrainPlan) -> LaunchConfig:
    """``pretrain_gpt.py`` arguments of Megatron-LM core_v0.15.0 (flags of
    ``megatron/training/arguments.py`` at commit 0d7e02bd, :data:`SOURCES`).

    Mapping (Narayanan et al., SC'21 for TP/PP/DP and the interleaved schedule; Korthikanti
    et al., MLSys 2023 for SP and selective recompute):

    - dp is implied (world size / (tp·pp·cp)); tp, pp, cp, ep and the experts' tp
      (``--expert-tensor-parallel-size``, :func:`jaxmodel.workload.params.expert_tp`) as
      degrees; ``sp`` → ``--sequence-parallel`` (only with tp > 1: Megatron turns it off at
      tp = 1); cp uses ring attention (``--cp-comm-type p2p``).
    - schedule: 1F1B is Megatron's pipeline schedule, interleaved 1F1B takes the virtual
      stage flags (:func:`_megatron_pipeline`); GPipe has no Megatron schedule (error).
    - recompute: selective → ``--recompute-granularity selective`` (core attention, the
      default module); full → ``full`` with ``--recompute-method uniform
      --recompute-num-layers 1`` (every layer's input checkpointed).
    - ZeRO 1 → ``--use-distributed-optimizer`` (optimizer states sharded over the DP group);
      2 / 3 → Megatron-FSDP ``--use-megatron-fsdp --data-parallel-sharding-strategy
      optim_grads`` / ``optim_grads_params`` (it requires ``--ckpt-format fsdp_dtensor``);
      ZeRO-3 as DeepSpeed ran it (``zero3_impl="deepspeed"``) has no Megatron mode (error).
    - precision: bf16 → ``--bf16``, fp16 → ``--fp16``; fp8 (Transformer Engine, E4M3
      forward / E5M2 backward, per-tensor delayed scaling) → ``--bf16 --fp8-format hybrid
      --fp8-recipe delayed``; fp4 → ``--bf16 --fp4-format e2m1 --fp4-recipe nvfp4``; fp32 /
      tf32 → no flag (fp32 parameters); int8, w4a16 are not training precisions (error).
    - flash_attention: fa1/fa2 → ``--attention-backend flash`` (the installed kernel decides
      the version), standard → ``unfused``.
    - dp_overlap 1 → ``--overlap-grad-reduce`` (and ``--overlap-param-gather`` with a
      sharded optimizer, which Megatron requires for it), when dp·cp > 1; tp_overlap 1 →
      ``--tp-comm-overlap`` for plans with SP and tp > 1 (Megatron asserts SP; the model
      keeps the others serial, :func:`jaxmodel.parallel.overlap.tp_eligible`); fractions
      cannot be expressed (error). pp_overlap (``overlap_p2p_comm``): Megatron-LM's
      training arguments turn it on by default for the interleaved schedule and off for
      1F1B (``--no-overlap-p2p-communication``, ``store_false``), so an interleaved plan
      with pp_overlap 0 gets ``--no-overlap-p2p-communication`` and one with 1 gets no flag;
      pp_overlap 1 on a non-interleaved plan is noted (Megatron runs it without).
      (``pipeline.overlapped_p2p_time`` models the overlap of the interleaved schedule.)
    - model shape: ``--num-layers --hidden-size --ffn-hidden-size --num-attention-heads``
      (``--group-query-attention --num-query-groups`` for GQA, ``--kv-channels`` when the
      head dimension is not d/h, ``--swiglu``, ``--num-experts --moe-router-topk
      --moe-ffn-hidden-size`` for MoE), ``--seq-length`` = ``--max-position-embeddings``.
    """
    fw = "megatron"
    ctx = _Ctx(p, _model_ints(p.model))
    mi = ctx.model_ints
    e, notes = _Emitter(fw), []
    if p.schedule == "gpipe" and p.pp > 1:
        raise ValueError("megatron: schedule='gpipe' cannot be expressed: Megatron-LM runs "
                         "1F1B or interleaved 1F1B (megatron/core/pipeline_parallel/"
                         "schedules.py); use schedule='1f1b'")
    if p.zero == 3 and p.zero3_impl != "fsdp":
        raise ValueError(f"megatron: zero3_impl={p.zero3_impl!r} cannot be expressed: "
                         "Megatron's ZeRO-3 is Megatron-FSDP (zero3_impl='fsdp')")
    if p.precision in ("int8", "w4a16"):
        raise ValueError(f"megatron: precision={p.precision!r} is not a training precision "
                         "of Megatron-LM (bf16, fp16, fp8, fp4, fp32)")
    dp_on, tp_on = _onoff(fw, "dp_overlap", p.dp_overlap), _onoff(fw, "tp_overlap",
                                                                  p.tp_overlap)
    _megatron_model(e, p, mi, notes)
    # batch
    e("--micro-batch-size", p.micro_batch)
    e("--global-batch-size", p.global_batch)
    # layout
    e("--tensor-model-parallel-size", p.tp)
    e("--pipeline-model-parallel-size", p.pp)
    if p.sp and p.tp > 1:
        e("--sequence-parallel")
    if p.cp > 1:
        e("--context-parallel-size", p.cp)
        e("--cp-comm-type", "p2p")
    if p.ep > 1 or mi["n_experts"] > 1:
        e("--expert-model-parallel-size", p.ep)
        e("--expert-tensor-parallel-size", p.etp)
    _megatron_pipeline(e, ctx, notes)
    _megatron_memory_numerics(e, p, notes)
    # overlap
    if dp_on and p.dp * p.cp > 1:
        e("--overlap-grad-reduce")
        if p.zero >= 1:
            e("--overlap-param-gather")
    if p.pp > 1 and p.v > 1 and not _onoff(fw, "pp_overlap", p.pp_overlap):
        e("--no-overlap-p2p-communication")
    elif p.pp_overlap and not (p.pp > 1 and p.v > 1):
        notes.append("pp_overlap=1 on a non-interleaved plan: Megatron turns "
                     "overlap_p2p_comm off outside the interleaved schedule")
    if tp_on:
        if p.sp and p.tp > 1:
            e("--tp-comm-overlap")
        else:
            notes.append("tp_overlap=1 without sequence parallelism (or at tp=1): Megatron's "
                         "--tp-comm-overlap needs --sequence-parallel; the model keeps these "
                         "collectives serial, and so does this command")
    notes.append("tokenizer, data, optimizer, learning-rate and position-embedding flags are "
                 "the user's")
    return LaunchConfig(fw, SOURCES[fw].version,
                        tuple(_torchrun(p) + ["pretrain_gpt.py"] + e.argv()),
                        MappingProxyType(dict(e.flags)), MappingProxyType({}), tuple(notes))


# --------------------------------------------------------------------------------------------
# TorchTitan
# --------------------------------------------------------------------------------------------
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def _toml(keys: Mapping[str, Any]) -> str:
    """A TOML document from dotted keys (``section.sub.key``), tables in first-use order."""
    tables: dict[str, list[str]] = {}
    for k, v in keys.items():
        table, _, leaf = k.rpartition(".")
        tables.setdefault(table, []).append(f"{leaf} = {_toml_value(v)}")
    return "\n".join(f"[{t}]\n" + "\n".join(lines) + "\n" for t, lines in tables.items())


def torchtitan_toml(p: TrainPlan) -> LaunchConfig:
    """A TorchTitan v0.2.2 job TOML (keys of ``torchtitan/config/job_config.py`` at commit
    73a0e697, :data:`SOURCES`) for ``torchrun ... -m torchtitan.train --job.config_file``.

    Mapping (Liang et al., "TorchTitan: One-stop PyTorch native solution for production
    ready LLM pre-training", ICLR 2025, §2 for FSDP2 / TP / PP / CP composition):

    - ZeRO-3 (``zero3_impl="fsdp"``) → ``data_parallel_shard_degree = dp`` with
      ``fsdp_reshard_after_forward = "always"`` (parameters freed after each forward);
      ZeRO-2 → the same with ``"never"`` (gathered parameters kept until the backward,
      gradients and optimizer states sharded); ZeRO-0 → ``data_parallel_replicate_degree =
      dp`` (DDP, which TorchTitan allows only without TP/PP/CP: "DDP has not supported > 1D
      parallelism", ``torchtitan/models/*/infra/parallelize.py``); ZeRO-1 and DeepSpeed's
      ZeRO-3 have no TorchTitan mode (error).
    - ``tensor_parallel_degree`` (TorchTitan's TP always shards the sequence between
      blocks, i.e. SP; a plan with tp > 1 and sp = 0 cannot be expressed), tp_overlap 1 →
      ``enable_async_tensor_parallel`` with ``compile.enable`` (async TP needs compile).
    - ``pipeline_parallel_degree``, schedule gpipe / 1f1b / interleaved → ``"GPipe"``,
      ``"1F1B"``, ``"Interleaved1F1B"``, ``pipeline_parallel_microbatch_size`` = the
      micro-batch. The split (``torchtitan/distributed/pipeline_parallel.py``): ``⌈(L + f +
      l)/layers_per_stage⌉`` virtual stages, the first holding ``f`` layers less (the
      embedding), the last ``l`` less (the output); the model's stages (:func:`
      pipeline_stages`, or ``(L+s)/(pp·v)`` per chunk when interleaved) are matched with
      ``f, l ∈ {0, 1}``; other splits cannot be expressed (error).
    - ``local_batch_size`` = sequences per DP rank per step with PP (split into
      micro-batches), the micro-batch without PP (``global_batch_size`` then implies the
      gradient accumulation).
    - recompute none / selective / full → ``activation_checkpoint.mode`` ``"none"`` /
      ``"selective"`` (``selective_ac_option = "op"``: op-level, the attention kept
      recomputed) / ``"full"``.
    - precision bf16 / fp32 → ``mixed_precision_param`` ``"bfloat16"`` / ``"float32"``;
      fp8 → bf16 plus the ``quantize.linear.float8`` converter with ``recipe_name =
      "tensorwise"`` (per-tensor scaling; TorchTitan scales dynamically where the model's
      Transformer-Engine preset uses delayed scaling: same GEMM rate and bytes); fp16 and
      the others have no TorchTitan setting (error).
    - cp → ``context_parallel_degree``; ep, the experts' tp → ``expert_parallel_degree``,
      ``expert_tensor_parallel_degree``.
    """
    fw = "torchtitan"
    mi = _model_ints(p.model)
    e, notes = _Emitter(fw), []
    multi_d = p.tp * p.pp * p.cp > 1
    if p.zero == 1:
        raise ValueError("torchtitan: zero=1 cannot be expressed: FSDP2 shards gradients with "
                         "the optimizer states (zero=2: fsdp_reshard_after_forward='never'; "
                         "zero=3: 'always')")
    if p.zero == 3 and p.zero3_impl != "fsdp":
        raise ValueError(f"torchtitan: zero3_impl={p.zero3_impl!r} cannot be expressed: "
                         "TorchTitan's ZeRO-3 is FSDP2 (zero3_impl='fsdp')")
    if p.zero == 0 and p.dp > 1 and multi_d:
        raise ValueError(f"torchtitan: zero=0 with dp={p.dp} and tp·pp·cp="
                         f"{p.tp * p.pp * p.cp} cannot be expressed: TorchTitan's DDP "
                         "(data_parallel_replicate_degree) runs without TP/PP/CP; use zero=2 "
                         "or 3 (FSDP2)")
    if p.tp > 1 and not p.sp:
        raise ValueError(f"torchtitan: sp=0 with tp={p.tp} cannot be expressed: TorchTitan's "
                         "tensor parallelism always shards the sequence (sp=1)")
    if p.precision not in ("bf16", "fp32", "fp8"):
        raise ValueError(f"torchtitan: precision={p.precision!r} cannot be expressed "
                         "(training.mixed_precision_param is bfloat16 or float32; fp8 via "
                         "the quantize.linear.float8 converter)")
    tp_on = _onoff(fw, "tp_overlap", p.tp_overlap)
    _onoff(fw, "dp_overlap", p.dp_overlap)
    if p.precision == "fp8":
        e("model.converters", ["quantize.linear.float8"])
    e("training.local_batch_size", p.global_batch // p.dp if p.pp > 1 else p.micro_batch)
    e("training.global_batch_size", p.global_batch)
    e("training.seq_len", p.seq_len)
    e("training.mixed_precision_param", "float32" if p.precision == "fp32" else "bfloat16")
    e("parallelism.data_parallel_replicate_degree", p.dp if p.zero == 0 else 1)
    e("parallelism.data_parallel_shard_degree", 1 if p.zero == 0 else p.dp)
    if p.zero >= 2:
        e("parallelism.fsdp_reshard_after_forward", "never" if p.zero == 2 else "always")
    e("parallelism.tensor_parallel_degree", p.tp)
    if tp_on and p.tp > 1:
        e("parallelism.enable_async_tensor_parallel", True)
    e("parallelism.pipeline_parallel_degree", p.pp)
    if p.pp > 1:
        L, v = mi["n_layers"], p.v
        e("parallelism.pipeline_parallel_schedule",
          {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B"}[p.schedule])
        e("parallelism.pipeline_parallel_microbatch_size", p.micro_batch)
        want = pipeline_stages(L, p.pp) if v == 1 else None
        for f, l in ((0, 0), (1, 1), (0, 1), (1, 0)):
            if (L + f + l) % (p.pp * v):
                continue
            k = (L + f + l) // (p.pp * v)
            if v == 1 and [k - f] + [k] * (p.pp - 2) + [k - l] != want:
                continue
            e("parallelism.pipeline_parallel_layers_per_stage", k)
            e("parallelism.pipeline_parallel_first_stage_less_layers", f)
            e("parallelism.pipeline_parallel_last_stage_less_layers", l)
            break
        else:
            raise ValueError(f"torchtitan: n_layers={L} on pp={p.pp} (interleave={v}) cannot "
                             "be expressed: the split needs pp·interleave | n_layers + 0, 1 or "
                             "2 (first/last stage less layers)")
    e("parallelism.context_parallel_degree", p.cp)
    if mi["n_experts"] > 1:
        e("parallelism.expert_parallel_degree", p.ep)
        e("parallelism.expert_tensor_parallel_degree", p.etp)
    e("activation_checkpoint.mode", p.recompute)
    if p.recompute == "selective":
        e("activation_checkpoint.selective_ac_option", "op")
    if tp_on and p.tp > 1:
        e("compile.enable", True)
    if p.precision == "fp8":
        e("quantize.linear.float8.recipe_name", "tensorwise")
        if p.zero >= 2 and p.dp > 1:
            e("quantize.linear.float8.enable_fsdp_float8_all_gather", True)
            e("quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", True)
    notes.append("[model] name/flavor/hf_assets_path, the dataset, optimizer and steps are "
                 "the user's; the model's dimensions come from the flavor")
    launch = _Emitter("torchrun")
    launch("-m", "torchtitan.train")
    argv = _torchrun(p) + launch.argv() + ["--job.config_file", "plan.toml"]
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(dict(e.flags)),
                        MappingProxyType({"plan.toml": _toml(e.flags)}), tuple(notes))


# --------------------------------------------------------------------------------------------
# NeMo 2.0
# --------------------------------------------------------------------------------------------
#: LLM pretraining recipe factories of NeMo v2.4.0 (``nemo/collections/llm/recipes/``) that a
#: hw_db model name maps to ("." dropped, "-" → "_")
NEMO_FACTORIES = frozenset((
    "baichuan2_7b", "chatglm3_6b", "deepseek_v2", "deepseek_v2_lite", "deepseek_v3",
    "gemma2_27b", "gemma2_2b", "gemma2_9b", "gemma3_1b", "gemma_2b", "gemma_7b", "gpt3_175b",
    "llama2_7b", "llama31_405b", "llama31_70b", "llama31_8b", "llama32_1b", "llama32_3b",
    "llama3_70b", "llama3_8b", "mistral_7b", "mistral_nemo_12b", "mixtral_8x22b",
    "mixtral_8x7b", "nemotron3_22b", "nemotron3_4b", "nemotron3_8b", "nemotron4_15b",
    "nemotron4_340b", "phi3_mini_4k_instruct", "qwen25_14b", "qwen25_1p5b", "qwen25_32b",
    "qwen25_500m", "qwen25_72b", "qwen25_7b", "qwen2_1p5b", "qwen2_500m", "qwen2_72b",
    "qwen2_7b", "qwen3_14b", "qwen3_1p7b", "qwen3_235b_a22b", "qwen3_30b_a3b", "qwen3_32b",
    "qwen3_4b", "qwen3_600m", "qwen3_8b",
))

#: Megatron-LM flag -> NeMo 2.0 recipe attribute (the same Megatron-core setting)
_NEMO_OF_MEGATRON = MappingProxyType({
    "--tensor-model-parallel-size": "trainer.strategy.tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "trainer.strategy.pipeline_model_parallel_size",
    "--sequence-parallel": "trainer.strategy.sequence_parallel",
    "--context-parallel-size": "trainer.strategy.context_parallel_size",
    "--expert-model-parallel-size": "trainer.strategy.expert_model_parallel_size",
    "--expert-tensor-parallel-size": "trainer.strategy.expert_tensor_parallel_size",
    "--account-for-embedding-in-pipeline-split":
        "trainer.strategy.account_for_embedding_in_pipeline_split",
    "--account-for-loss-in-pipeline-split": "trainer.strategy.account_for_loss_in_pipeline_split",
    "--decoder-first-pipeline-num-layers": "trainer.strategy.num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "trainer.strategy.num_layers_in_last_pipeline_stage",
    "--pipeline-model-parallel-layout": "trainer.strategy.pipeline_model_parallel_layout",
    "--recompute-granularity": "model.config.recompute_granularity",
    "--recompute-method": "model.config.recompute_method",
    "--recompute-num-layers": "model.config.recompute_num_layers",
    "--micro-batch-size": "data.micro_batch_size",
    "--global-batch-size": "data.global_batch_size",
})


def nemo_recipe(p: TrainPlan) -> LaunchConfig:
    """``nemo llm pretrain --factory FACTORY key=value ...`` overrides and the same settings
    as a NeMo-Run recipe snippet (NeMo v2.4.0 at commit 2381f42f: ``MegatronStrategy``
    arguments of ``nemo/lightning/pytorch/strategies/megatron_strategy.py``,
    ``MegatronMixedPrecision`` of ``nemo/lightning/pytorch/plugins/mixed_precision.py``,
    ``MegatronCommOverlapCallback`` of ``nemo/lightning/pytorch/callbacks/
    megatron_comm_overlap.py``, the recipes' ``data`` / ``optim.config`` / ``model.config``
    attributes, ``nemo/collections/llm/recipes/llama31_405b.py``; :data:`SOURCES`).

    The plan's meaning is :func:`megatron_args`' (NeMo 2.0 drives Megatron-core); each of its
    flags maps to the recipe attribute of the same setting (:data:`_NEMO_OF_MEGATRON`), the
    interleaving as ``virtual_pipeline_model_parallel_size = v``. Settings a NeMo recipe
    turns on by default are written explicitly either way: ``optim.config.
    use_distributed_optimizer`` (ZeRO-1), ``trainer.strategy.ddp.overlap_grad_reduce`` /
    ``overlap_param_gather`` (dp_overlap). Precision: ``trainer.plugins.precision``
    ``bf16-mixed`` / ``16-mixed`` / ``32``, FP8 ``trainer.plugins.fp8 = hybrid`` with
    ``fp8_recipe = delayed``; tp_overlap → ``MegatronCommOverlapCallback(tp_comm_overlap=
    True)`` in the snippet (a callback, not a CLI override: noted). ZeRO-2/3 (Megatron-FSDP)
    and FP4 are not mapped for NeMo (error).
    """
    fw = "nemo"
    if p.zero >= 2:
        raise ValueError(f"nemo: zero={p.zero} is not mapped to NeMo 2.0 (Megatron-FSDP "
                         "there is trainer.strategy.fsdp='megatron'); use framework='megatron'")
    if p.precision == "fp4":
        raise ValueError("nemo: precision='fp4' is not mapped to NeMo 2.0's "
                         "MegatronMixedPrecision; use framework='megatron'")
    meg = megatron_args(p)
    e, notes = _Emitter(fw), []
    name = str(p.model.name).replace(".", "").replace("-", "_").lower()
    factory = name if name in NEMO_FACTORIES else "FACTORY"
    if factory == "FACTORY":
        notes.append(f"no NeMo v2.4.0 recipe is named after {p.model.name!r}: replace "
                     "FACTORY with the recipe of this architecture")
    if p.n_nodes is not None:
        e("trainer.num_nodes", p.n_nodes)
        e("trainer.devices", p.gpus_per_node)
    for flag, val in meg.flags.items():
        key = _NEMO_OF_MEGATRON.get(flag)
        if key is not None:
            e(key, val)
    if p.v > 1:
        e("trainer.strategy.virtual_pipeline_model_parallel_size", p.v)
    e("data.seq_length", p.seq_len)
    e("model.config.seq_length", p.seq_len)
    e("optim.config.use_distributed_optimizer", p.zero == 1)
    dp_on = "--overlap-grad-reduce" in meg.flags
    e("trainer.strategy.ddp.overlap_grad_reduce", dp_on)
    e("trainer.strategy.ddp.overlap_param_gather", "--overlap-param-gather" in meg.flags)
    e("trainer.plugins.precision", {"fp16": "16-mixed", "fp32": "32", "tf32": "32"}.get(
        p.precision, "bf16-mixed"))
    if p.precision == "fp8":
        e("trainer.plugins.fp8", "hybrid")
        e("trainer.plugins.fp8_recipe", "delayed")
    tp_on = "--tp-comm-overlap" in meg.flags
    if tp_on:
        notes.append("tp_overlap: the recipe snippet appends MegatronCommOverlapCallback("
                     "tp_comm_overlap=True) to trainer.callbacks (no CLI override)")
    notes.append("attention backend, tokenizer, data paths and optimizer hyper-parameters are "
                 "the recipe's")

    def lit(v):
        return "True" if v is True else "False" if v is False else (
            repr(v) if isinstance(v, str) else str(v))
    argv = ["nemo", "llm", "pretrain", "--factory", factory] + [
        f"{k}={v if isinstance(v, str) else lit(v)}" for k, v in e.flags.items()]
    lines = ["import nemo_run as run", "from nemo.collections import llm"]
    if tp_on:
        lines.append("from nemo.lightning.pytorch.callbacks.megatron_comm_overlap import "
                     "MegatronCommOverlapCallback")
    lines.append("")
    nodes = f"num_nodes={p.n_nodes}, num_gpus_per_node={p.gpus_per_node}" \
        if p.n_nodes is not None else ""
    lines.append(f"recipe = llm.{factory}.pretrain_recipe({nodes})")
    lines += [f"recipe.{k} = {lit(v)}" for k, v in e.flags.items()
              if k not in ("trainer.num_nodes", "trainer.devices")]
    if tp_on:
        lines.append("recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, "
                     "tp_comm_overlap=True))")
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(dict(e.flags)),
                        MappingProxyType({"recipe.py": "\n".join(lines) + "\n"}),
                        tuple(notes))
