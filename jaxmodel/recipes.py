"""Named training recipes: the knobs a framework release sets together.

A :class:`Recipe` holds two small mappings:

- ``step``: keyword arguments of :func:`jaxmodel.train_step` (``precision``, ``dropout``,
  ``grad_bytes``, ``dp_overlap``, ``tp_overlap``);
- ``plan``: :class:`jaxmodel.Parallelism` fields the framework fixes whatever the
  parallel layout (``recompute``, ``zero``, ``zero3_impl``, ``flash_attention``, ``sp``).

``train_step(..., recipe=r)`` applies ``r.step`` under the keyword arguments the caller
passes with a non-default value, and ``r.plan`` to the plan (the layout fields dp, tp, pp,
cp, micro_batch, interleave, schedule stay the caller's). To force a setting back to the
default value, derive a recipe: ``jm.recipe("nemo-24.07", dropout="megatron")``.
``search_parallelism(..., recipe=r)`` searches under ``r.step`` with the plan fields of
``r.plan`` as its only enumeration choices.

Each recipe cites the framework source its values come from (module-level table below).
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Mapping

from jaxmodel.precisions import precision as _precision
from jaxmodel.types import Parallelism

#: train_step keyword arguments a recipe may set
STEP_KEYS = ("precision", "dropout", "grad_bytes", "dp_overlap", "tp_overlap",
             "pp_overlap")
#: Parallelism fields a recipe may set
PLAN_KEYS = ("recompute", "zero", "zero3_impl", "flash_attention", "sp")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A framework's joint settings (see the module docstring).

    Attributes:
        name: the recipe's name.
        step: :func:`jaxmodel.train_step` keyword arguments (keys of :data:`STEP_KEYS`).
        plan: :class:`jaxmodel.Parallelism` fields (keys of :data:`PLAN_KEYS`).
        source: where the values come from.
    """
    name: str
    step: Mapping
    plan: Mapping
    source: str

    def __post_init__(self):
        for what, keys, allowed in (("step", self.step, STEP_KEYS),
                                    ("plan", self.plan, PLAN_KEYS)):
            bad = sorted(set(keys) - set(allowed))
            if bad:
                raise ValueError(f"Recipe {self.name!r}: unknown {what} key(s) {bad}; "
                                 f"allowed {allowed}")
        object.__setattr__(self, "step", MappingProxyType(dict(self.step)))
        object.__setattr__(self, "plan", MappingProxyType(dict(self.plan)))

    def with_(self, **overrides) -> "Recipe":
        """This recipe with some step or plan settings replaced (keys of either table)."""
        step, plan = dict(self.step), dict(self.plan)
        for k, v in overrides.items():
            if k in STEP_KEYS:
                step[k] = v
            elif k in PLAN_KEYS:
                plan[k] = v
            else:
                raise ValueError(f"recipe override {k!r}={v!r}: not a recipe setting; "
                                 f"allowed {STEP_KEYS + PLAN_KEYS}")
        return Recipe(self.name + "*" if overrides else self.name, step, plan, self.source)

    def parallelism(self, par=None, **fields):
        """``par`` (or a new :class:`jaxmodel.Parallelism` of ``fields``) with this recipe's
        plan fields set."""
        if par is None:
            return Parallelism(**{**self.plan, **fields})
        if fields:
            raise ValueError("Recipe.parallelism: pass either a Parallelism or fields")
        return dataclasses.replace(par, **self.plan)


_NEMO_LAUNCHER = ("NVIDIA NeMo-Framework-Launcher 24.07, launcher_scripts/conf/training/gpt3/"
                  "5b.yaml, 20b.yaml, 175b_fp8.yaml, llama/llama2_70b.yaml, nemotron/"
                  "nemotron_22b.yaml; NeMo 24.07 nemo/collections/nlp/models/language_modeling/"
                  "megatron_base_model.py (setup_optimization)")
_NEMO_SFT = ("NVIDIA NeMo-Framework-Launcher 24.07, examples/peft/llama/h100/70b_2node.sh, "
             "13b_1node.sh, 7b_1node.sh and launcher_scripts/conf/peft/llama/sft.yaml; NeMo "
             "24.07 megatron_base_model.py (setup_optimization); NVIDIA Apex "
             "apex/contrib/optimizers/distributed_fused_adam.py (DistributedFusedAdam)")

#: NeMo's distributed Adam with fp32 optimizer states on a bf16 model (the pre-training
#: configs leave ``optim.dtype`` at its fp32 default): ``setup_optimization`` sets
#: ``store_params=False, store_param_remainders=True`` when the optimizer dtype is fp32 and
#: the model dtype bf16, so Apex ``DistributedFusedAdam`` keeps, per parameter of its shard,
#: the low 16 bits of the fp32 master value (the bf16 model parameter holds the high 16) —
#: 2 B instead of a 4 B fp32 copy — beside fp32 ``exp_avg`` and ``exp_avg_sq`` (8 B).
NEMO_FP8 = _precision("fp8", master_bytes=2.0)

#: NeMo 24.07's SFT runs (``examples/peft/llama/h100/*.sh`` with ``conf/peft/llama/sft.yaml``):
#: ``fp8_params=true`` — Transformer Engine's ``fp8_model_init``: the model parameters are
#: FP8 (1 B; only their transpose is cached, :func:`jaxmodel.workload.memory.
#: weight_cache_bytes`) — and ``optim.dtype: bf16``: with FP8 parameters
#: ``setup_optimization`` sets ``store_params=True``, so ``DistributedFusedAdam`` keeps its
#: shard of the parameters in the optimizer dtype (bf16, 2 B) beside bf16 ``exp_avg`` and
#: ``exp_avg_sq`` (2 + 2 B); ``grad_sync_dtype: bf16`` with ``contiguous_grad_buffer``.
NEMO_SFT_FP8 = _precision("fp8", weight_bytes=1.0, master_bytes=2.0, optim_bytes=4.0)

RECIPES = {
    # NeMo 24.07 pre-training configs (NeMo-Framework-Launcher 24.07 conf/training): fp8
    # True with fp8_hybrid (E4M3 forward, E5M2 gradients: Transformer Engine's HYBRID
    # format); ub_tp_comm_overlap True (TE userbuffer TP overlap); optim
    # distributed_fused_adam (optimizer states sharded over DP: ZeRO-1) with
    # overlap_grad_sync and overlap_param_sync True and grad_sync_dtype bf16, fp32 states
    # with 16-bit master remainders (:data:`NEMO_FP8`); activations_checkpoint_granularity
    # null (no recomputation) in the GPT-3 5B/20B/175B, Llama 2/3 and Nemotron 8B/22B
    # configs; sequence_parallel True; mcore_gpt with transformer_engine True (TE's fused
    # attention: flash kernels). Dropout differs by model family: hidden_dropout 0.1 in the
    # GPT-3 configs, 0.0 in the Llama and Nemotron ones — the recipe carries 0 and the GPT-3
    # rows derive ``dropout="megatron"``. Memory: the pre-training configs do not set
    # fp8_params, so Transformer Engine keeps the bf16 parameters and caches their FP8 copy
    # and its transpose across micro-batches (:func:`jaxmodel.workload.memory.
    # weight_cache_bytes`), its Linear layers store their inputs in FP8, and
    # contiguous_grad_buffer holds the bf16 gradients (grad_sync_dtype) of the whole stage.
    # overlap_p2p_comm true with batch_p2p_comm false in the pipelined configs
    # (llama/llama2_70b.yaml; Megatron-core's interleaved schedule then posts the stage
    # exchanges asynchronously: pp_overlap = 1; the plans without interleaving ignore it).
    "nemo-24.07": Recipe(
        "nemo-24.07",
        step=dict(precision=NEMO_FP8, dropout="none", grad_bytes=2, dp_overlap=1,
                  tp_overlap=1, pp_overlap=1),
        plan=dict(recompute="none", zero=1, flash_attention="fa2", sp=True),
        source=_NEMO_LAUNCHER),
    # NeMo 24.07 supervised fine-tuning (full parameters, packed sequences): the pre-training
    # recipe with fp8_params and bf16 optimizer states (:data:`NEMO_SFT_FP8`);
    # activations_checkpoint_granularity null, sequence_parallel true and
    # ub_tp_comm_overlap true with TP > 1 (the 70B script), hidden_dropout 0.0;
    # overlap_p2p_comm true, batch_p2p_comm false (conf/peft/llama/sft.yaml).
    "nemo-24.07-sft": Recipe(
        "nemo-24.07-sft",
        step=dict(precision=NEMO_SFT_FP8, dropout="none", grad_bytes=2, dp_overlap=1,
                  tp_overlap=1, pp_overlap=1),
        plan=dict(recompute="none", zero=1, flash_attention="fa2", sp=True),
        source=_NEMO_SFT),
    # Megatron-LM as published in 2021 (Narayanan et al., SC'21, "Efficient Large-Scale
    # Language Model Training on GPU Clusters Using Megatron-LM"): fp16/bf16 mixed precision
    # with fp32 gradient all-reduce after the backward (no overlap), no TP overlap, full
    # activation recompute, no optimizer sharding, no flash attention, GPT dropout 0.1 on
    # the eager kernels of that stack (``dropout="megatron2021"``).
    # NVIDIA's MLPerf Training GPT-3 175B submissions on H100 (MLCommons training_results_v3.0
    # NVIDIA/benchmarks/gpt3/implementations/pytorch: config_common.sh sets
    # ACT_CKPT_GRANULARITY=null (no recomputation; run_and_time.sh passes it over the yaml's
    # "selective"), USE_DIST_OPTIMIZER=True; run_and_time.sh OVERLAP_P2P_COMM=True,
    # OVERLAP_GRAD_SYNC / OVERLAP_PARAM_SYNC True; conf/megatron_gpt_config.yaml
    # distributed_fused_adam with grad_sync_dtype bf16, hidden/attention dropout 0.0,
    # sequence_parallel True, transformer_engine True: attention by Transformer Engine's
    # DotProductAttention, whose FlashAttention backend keeps no s×s scores (flash-attn 1.x
    # in the v3.0 container: validate_mlperf.py passes "fa1" there; "fa2" from v3.1's
    # TE 1.x); config_fp8.sh FP8 hybrid; config_tp_h100.sh TP_COMM_OVERLAP=True). The v3.1 /
    # v4.0 configs (training_results_v3.1 conf/custom.yaml, v4.0 config_DGXH100_*.sh) keep
    # overlap_p2p_comm, TP_COMM_OVERLAP and the recomputation default null. Without
    # recomputation the plans fit only with flash attention (TP 4 PP 8 VP 12 micro-batch 1:
    # 96.5 GiB with the unfused softmax's scores kept).
    "mlperf-gpt3": Recipe(
        "mlperf-gpt3",
        step=dict(precision="fp8", dropout="none", grad_bytes=2, dp_overlap=1, tp_overlap=1,
                  pp_overlap=1),
        plan=dict(recompute="none", zero=1, flash_attention="fa2", sp=True),
        source="MLCommons training_results_v3.0/v3.1/v4.0, NVIDIA/benchmarks/gpt3 "
               "(config_common.sh, run_and_time.sh, conf/megatron_gpt_config.yaml, "
               "conf/custom.yaml, config_fp8.sh, config_tp_h100.sh)"),
    "megatron-2021": Recipe(
        "megatron-2021",
        step=dict(precision="bf16", dropout="megatron2021", grad_bytes=4, dp_overlap=0,
                  tp_overlap=0),
        plan=dict(recompute="full", zero=0, flash_attention=False, sp=False),
        source="Narayanan et al., SC'21, §5 (Megatron-LM 2021 training setup)"),
    # torchtitan (pytorch/torchtitan, train_configs/llama3_*.toml and
    # torchtitan/config_manager.py): FSDP2 (fully_shard: ZeRO-3, per-module all-gather),
    # bf16 parameters with fp32 gradient reduction (mixed_precision_reduce = float32),
    # activation checkpointing "selective" by default in the Llama configs, SDPA flash
    # attention, no dropout in the Llama model, no async TP by default. FSDP2's copy-out /
    # copy-in kernels, its fp32 shard as the master and its unsharded-gradient buffers follow
    # from ``zero3_impl="fsdp"`` (:func:`jaxmodel.parallel.zero.impl_costs`).
    "torchtitan": Recipe(
        "torchtitan",
        step=dict(precision="bf16", dropout="none", grad_bytes=4, dp_overlap=1, tp_overlap=0),
        plan=dict(recompute="selective", zero=3, zero3_impl="fsdp", flash_attention="fa2"),
        source="pytorch/torchtitan config_manager.py and train_configs/llama3_8b.toml"),
    # DeepSpeed ZeRO stage 3 as published (Rajbhandari et al., SC'20, "ZeRO: Memory
    # Optimizations Toward Training Trillion Parameter Models"; deepspeed/runtime/zero/
    # stage3.py): per-parameter gather with prefetch (zero3_impl "deepspeed"), fp32
    # gradient reduce-scatter overlapped with the backward, full activation checkpointing
    # (deepspeed.checkpointing), no flash attention.
    "deepspeed": Recipe(
        "deepspeed",
        step=dict(precision="bf16", dropout="megatron", grad_bytes=4, dp_overlap=1,
                  tp_overlap=0),
        plan=dict(recompute="full", zero=3, zero3_impl="deepspeed", flash_attention=False),
        source="Rajbhandari et al., SC'20; microsoft/DeepSpeed deepspeed/runtime/zero/stage3.py"),
}


def recipe(name_or_recipe, **overrides) -> Recipe:
    """The named :class:`Recipe` (``"nemo-24.07"``, ``"nemo-24.07-sft"``, ``"mlperf-gpt3"``,
    ``"megatron-2021"``, ``"torchtitan"``, ``"deepspeed"``), optionally with settings
    replaced (:meth:`Recipe.with_`).

    Raises:
        ValueError: an unknown name (the message lists the known ones) or override key.
    """
    if isinstance(name_or_recipe, Recipe):
        r = name_or_recipe
    else:
        if name_or_recipe not in RECIPES:
            raise ValueError(f"recipe={name_or_recipe!r}: unknown; known {sorted(RECIPES)}")
        r = RECIPES[name_or_recipe]
    return r.with_(**overrides) if overrides else r


def merge_step_kwargs(r, passed: Mapping, defaults: Mapping) -> dict:
    """The recipe's step settings under the caller's: a keyword the caller passed with a
    value other than its default wins, the recipe's value fills the rest."""
    r = recipe(r)
    out = dict(passed)
    for k, v in r.step.items():
        mine = passed.get(k, defaults.get(k))
        if mine is defaults.get(k) or (_scalar(mine) and _scalar(defaults.get(k))
                                       and mine == defaults.get(k)):
            out[k] = v
    return out


def _scalar(x):
    return x is None or isinstance(x, (int, float, str, bool))
