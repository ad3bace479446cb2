"""Launch configurations: the command line and config files that run a plan the model picked.

:func:`export_plan` turns a training plan (a :class:`jaxmodel.Parallelism` with the model,
global batch, sequence length, precision and the recipe knobs of :func:`jaxmodel.train_step`)
into the arguments of a training framework, and a serving deployment (the plan and the
scheduler settings of :func:`jaxmodel.offline_throughput` / :func:`jaxmodel.slo_throughput`)
into a serving engine's launch command:

=============  ===========================================================================
framework      what comes out
=============  ===========================================================================
``megatron``   ``pretrain_gpt.py`` arguments (Megatron-LM / Megatron-core)
``nemo``       ``nemo llm pretrain --factory ...`` overrides and a NeMo-Run recipe snippet
``torchtitan`` a job TOML for ``python -m torchtitan.train --job.config_file``
``vllm``       ``vllm serve MODEL ...``
``sglang``     ``python -m sglang.launch_server ...``
``trtllm``     ``trtllm-serve MODEL ...`` with an ``--extra_llm_api_options`` YAML
=============  ===========================================================================

Every emitted flag or key is an entry of :data:`FLAGS`, which names the framework, the
version and the source file (argument parser or config dataclass) it was checked against
(:data:`SOURCES`); an entry missing from the table is a programming error
(``KeyError``), so the table is the complete list of what this module may print.

A plan a framework cannot express (a schedule it lacks, a ZeRO stage it has no mode for, an
overlap fraction where the framework has only on/off) raises ``ValueError`` naming the field
and its value. A plan the model itself rejects (``jaxmodel.parallel.plan`` rules: heads,
layers, batch divisibility) raises the same error :func:`jaxmodel.train_step` would.

The mapping of each model concept to its framework setting (units: counts, sequences, tokens)
is documented at the emitting function (:func:`megatron_args`, :func:`nemo_recipe`,
:func:`torchtitan_toml`, :func:`vllm_args`, :func:`sglang_args`, :func:`trtllm_args`).
Export reads the plan only (no ``train_step`` is evaluated): check the plan with
:func:`jaxmodel.train_step` / :func:`jaxmodel.offline_throughput` first.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import shlex
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from jaxmodel.types import ACTIVATIONS, FA_VERSIONS, Model, Parallelism, RECOMPUTE, SCHEDULES
from jaxmodel.types import ZERO3_IMPLS
from jaxmodel.types import validate_parallelism
from jaxmodel.precisions import PRESETS as _PRECISIONS
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel.pipeline import stage_layers
from jaxmodel.parallel.train import train_step
from jaxmodel.recipes import recipe as _recipe
from jaxmodel.serving_runtime import scheduler_defaults
from jaxmodel.workload.params import expert_tp


# --------------------------------------------------------------------------------------------
# Sources and the flag table
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Source:
    """Where a framework's flags were checked: project, release, commit, file(s)."""
    project: str
    version: str
    commit: str
    files: tuple[str, ...]


#: framework -> the release and source files its flags were checked against
SOURCES: Mapping[str, Source] = MappingProxyType({
    "megatron": Source("NVIDIA/Megatron-LM", "core_v0.15.0",
                       "0d7e02bd26d3eb347ad8d1bef625002babfa6df7",
                       ("megatron/training/arguments.py",
                        "megatron/core/transformer/pipeline_parallel_layer_layout.py",
                        "megatron/core/transformer/enums.py")),
    "torchtitan": Source("pytorch/torchtitan", "v0.2.2",
                         "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce",
                         ("torchtitan/config/job_config.py",
                          "torchtitan/distributed/pipeline_parallel.py",
                          "torchtitan/components/quantization/float8.py")),
    # the launcher of the training frameworks (PyTorch elastic)
    "torchrun": Source("pytorch/pytorch", "main@f34fa151",
                       "f34fa1515024423a239ce26f33a8b65ea9252502",
                       ("torch/distributed/run.py",)),
    "nemo": Source("NVIDIA/NeMo", "v2.4.0", "2381f42f6979449b5b99538f8f80135831009b51",
                   ("nemo/lightning/pytorch/strategies/megatron_strategy.py",
                    "nemo/lightning/pytorch/plugins/mixed_precision.py",
                    "nemo/collections/llm/recipes/llama31_405b.py",
                    "nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py")),
    # generated from the engine's config dataclasses; its deprecations name v0.12 and v0.13
    "vllm": Source("vllm-project/vllm", "0.11.x (main@99d7eb5d)",
                   "99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b", ("vllm/engine/arg_utils.py",)),
    # the server-arguments reference generated from python/sglang/srt/server_args.py
    "sglang": Source("sgl-project/sglang", "main@b36e8e19",
                     "b36e8e198b71553316b55bce53de6ecf9b3a9a47",
                     ("docs/advanced_features/server_arguments.md",)),
    "trtllm": Source("NVIDIA/TensorRT-LLM", "main@4c05a748",
                     "4c05a74891e4df8066f08ed4ce14b0972abe4e25",
                     ("tensorrt_llm/commands/serve.py", "tensorrt_llm/llmapi/llm_args.py")),
})

_MEGATRON_FLAGS = (
    # model shape
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--kv-channels", "--group-query-attention", "--num-query-groups", "--swiglu",
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--seq-length", "--max-position-embeddings",
    # batch
    "--micro-batch-size", "--global-batch-size",
    # parallel layout
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
    "--context-parallel-size", "--cp-comm-type", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout",
    # memory
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--ckpt-format",
    # numerics and kernels
    "--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe",
    "--attention-backend",
    # overlap
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
)

_TORCHTITAN_KEYS = (
    "model.converters",
    "training.local_batch_size", "training.global_batch_size", "training.seq_len",
    "training.mixed_precision_param",
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
    "parallelism.enable_async_tensor_parallel", "parallelism.pipeline_parallel_degree",
    "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_microbatch_size",
    "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.pipeline_parallel_first_stage_less_layers",
    "parallelism.pipeline_parallel_last_stage_less_layers",
    "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
    "parallelism.expert_tensor_parallel_degree",
    "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
    "compile.enable",
    "quantize.linear.float8.recipe_name", "quantize.linear.float8.enable_fsdp_float8_all_gather",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
)


_NEMO_STRATEGY_KEYS = tuple("trainer.strategy." + k for k in (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
    "pipeline_model_parallel_layout", "virtual_pipeline_model_parallel_size"))
_NEMO_PRECISION_KEYS = ("trainer.plugins.precision", "trainer.plugins.fp8",
                        "trainer.plugins.fp8_recipe")
#: recipe attributes as the v2.4.0 recipes set them (llama31_405b.py: ``trainer.num_nodes``,
#: ``trainer.devices``, ``data.*``, ``model.config.*``, ``optim.config.*``, ``ddp``)
_NEMO_RECIPE_KEYS = (
    "trainer.num_nodes", "trainer.devices", "data.micro_batch_size", "data.global_batch_size",
    "data.seq_length", "model.config.seq_length", "model.config.recompute_granularity",
    "model.config.recompute_method", "model.config.recompute_num_layers",
    "optim.config.use_distributed_optimizer", "trainer.strategy.ddp.overlap_grad_reduce",
    "trainer.strategy.ddp.overlap_param_gather",
)

_VLLM_FLAGS = (
    "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
    "--enable-expert-parallel", "--max-num-seqs", "--max-num-batched-tokens",
    "--enable-chunked-prefill", "--block-size", "--gpu-memory-utilization", "--dtype",
    "--quantization", "--kv-cache-dtype",
)

_SGLANG_FLAGS = (
    "--model-path", "--tp-size", "--pp-size", "--dp-size", "--ep-size",
    "--enable-dp-attention", "--max-running-requests", "--chunked-prefill-size",
    "--max-prefill-tokens", "--page-size", "--mem-fraction-static", "--dtype",
    "--quantization", "--kv-cache-dtype",
)

_TRTLLM_FLAGS = (
    "--backend", "--tp_size", "--pp_size", "--ep_size", "--max_batch_size",
    "--max_num_tokens", "--kv_cache_free_gpu_memory_fraction", "--enable_chunked_prefill",
    "--extra_llm_api_options",
)

#: keys of the ``--extra_llm_api_options`` YAML (``BaseLlmArgs`` / ``KvCacheConfig`` fields)
_TRTLLM_YAML_KEYS = (
    "dtype", "enable_attention_dp", "kv_cache_config.dtype",
    "kv_cache_config.tokens_per_block",
)


def _table(fw: str, names, file_index: int = 0) -> dict:
    s = SOURCES[fw]
    return {(fw, n): (s.project, s.version, s.files[file_index]) for n in names}


#: (framework, flag or config key) -> (project, version, source file): every flag this module
#: emits, and where it was read
FLAGS: Mapping[tuple[str, str], tuple[str, str, str]] = MappingProxyType({
    **_table("torchrun", ("--nnodes", "--nproc-per-node", "-m")),
    **_table("megatron", _MEGATRON_FLAGS),
    **_table("torchtitan", _TORCHTITAN_KEYS),
    **_table("nemo", _NEMO_STRATEGY_KEYS),
    **_table("nemo", _NEMO_PRECISION_KEYS, 1),
    **_table("nemo", _NEMO_RECIPE_KEYS, 2),
    **_table("vllm", _VLLM_FLAGS),
    **_table("sglang", _SGLANG_FLAGS),
    **_table("trtllm", _TRTLLM_FLAGS),
    **_table("trtllm", _TRTLLM_YAML_KEYS, 1),
})

TRAIN_FRAMEWORKS = ("megatron", "nemo", "torchtitan")
SERVE_FRAMEWORKS = ("vllm", "sglang", "trtllm")
FRAMEWORKS = TRAIN_FRAMEWORKS + SERVE_FRAMEWORKS


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """What to type to run a plan.

    Attributes:
        framework: a name of :data:`FRAMEWORKS`.
        version: the framework release the flags were checked against (:data:`SOURCES`).
        argv: the command, one token per element (the launcher, e.g. ``torchrun``, first).
        flags: flag or config key -> value (``True`` for a switch), in emission order.
        files: file name -> contents that the command reads (TOML, YAML); empty if none.
        notes: what the export assumed or left to the user (one sentence each).
    """
    framework: str
    version: str
    argv: tuple[str, ...]
    flags: Mapping[str, Any]
    files: Mapping[str, str]
    notes: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The command line, shell-quoted."""
        return shlex.join(self.argv)

    def __str__(self) -> str:
        out = [self.command]
        for name, text in self.files.items():
            out += [f"# --- {name} ---", text.rstrip("\n")]
        out += [f"# note: {n}" for n in self.notes]
        return "\n".join(out) + "\n"


class _Emitter:
    """Ordered flags of one framework, each checked against :data:`FLAGS`."""

    def __init__(self, fw: str):
        self.fw, self.flags = fw, {}

    def __call__(self, name: str, value: Any = True) -> None:
        if (self.fw, name) not in FLAGS:
            raise KeyError(f"{self.fw}: flag {name!r} is not in jaxmodel.export.FLAGS")
        self.flags[name] = value

    def argv(self) -> list[str]:
        out = []
        for k, v in self.flags.items():
            if v is True:
                out.append(k)
            elif isinstance(v, (list, tuple)):
                out += [k, *map(str, v)]
            else:
                out += [k, str(v)]
        return out


# --------------------------------------------------------------------------------------------
# Plan reading
# --------------------------------------------------------------------------------------------
def _scalar(where: str, name: str, v) -> float:
    a = np.asarray(v)
    if a.ndim != 0:
        raise ValueError(f"{where}: field '{name}' has shape {a.shape}; export takes one "
                         "configuration (index the batch first)")
    x = float(a)
    if not math.isfinite(x):
        raise ValueError(f"{where}: field '{name}' = {x} is not finite")
    return x


def _int(where: str, name: str, v, lo: int = 1) -> int:
    x = _scalar(where, name, v)
    if x != round(x) or x < lo:
        raise ValueError(f"{where}: field '{name}' = {x:g} must be an integer >= {lo}")
    return int(round(x))


def _onoff(fw: str, name: str, v) -> bool:
    x = _scalar(fw, name, v)
    if x not in (0.0, 1.0):
        raise ValueError(f"{fw}: {name}={x:g} cannot be expressed: the framework's overlap is "
                         "on (1) or off (0), not a fraction")
    return x == 1.0


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """One concrete training configuration, as integers and names (what the exporters read).

    Built by :func:`train_plan` from a :class:`jaxmodel.Parallelism` and the
    :func:`jaxmodel.train_step` arguments; ``etp`` is the experts' tensor-parallel degree
    (:func:`jaxmodel.workload.params.expert_tp`), ``m`` the micro-batches per replica and
    step, ``v`` the model chunks per device (1 unless interleaved).
    """
    model: Model
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    sp: bool
    micro_batch: int
    global_batch: int
    seq_len: int
    v: int
    m: int
    schedule: str
    recompute: str
    zero: int
    zero3_impl: str
    flash_attention: str
    precision: str
    dp_overlap: float
    tp_overlap: float
    n_nodes: int | None = None
    gpus_per_node: int | None = None


def _float_plan(par: Parallelism) -> Parallelism:
    """``par`` with float leaves (one compiled signature for every concrete plan)."""
    return Parallelism(**{f.name: float(np.asarray(getattr(par, f.name)))
                          for f in dataclasses.fields(Parallelism)})


def _train_defaults() -> dict:
    """The recipe knobs' defaults, read off :func:`jaxmodel.train_step`'s signature."""
    params = inspect.signature(train_step).parameters
    return {k: params[k].default for k in ("dp_overlap", "tp_overlap", "precision")}


def _precision_name(where: str, precision) -> str:
    if precision is None:
        return "bf16"
    name = precision if isinstance(precision, str) else getattr(precision, "name", None)
    key = str(name).lower().replace("-", "").replace("_", "") if name else ""
    if key not in _PRECISIONS:
        raise ValueError(f"{where}: precision={precision!r} is not a preset name "
                         f"({sorted(_PRECISIONS)}); export needs a named precision")
    return key


def train_plan(par: Parallelism, model: Model, global_batch, seq_len, *, precision=None,
               dp_overlap=None, tp_overlap=None, recipe=None, system=None) -> TrainPlan:
    """The concrete training configuration :func:`export_plan` reads.

    ``recipe`` (a :class:`jaxmodel.Recipe` or its name) applies as in
    :func:`jaxmodel.train_step`: its plan fields replace ``par``'s, its step knobs fill the
    arguments left ``None``; the rest take :func:`jaxmodel.train_step`'s defaults. The plan
    must pass the model's own rules (:func:`jaxmodel.parallel.plan.raise_if_invalid`).
    ``system`` (optional) gives the node size for the launcher.
    """
    where = "export_plan"
    if not isinstance(model, Model):
        raise ValueError(f"{where}: model must be a jaxmodel.Model (hw_db.model(name)), got "
                         f"{type(model).__name__}")
    par = validate_parallelism(par, f"{where}: plan")
    step = {}
    if recipe is not None:
        r = _recipe(recipe) if not hasattr(recipe, "step") else recipe
        par = r.parallelism(par)
        step = dict(r.step)
    given = {"precision": precision, "dp_overlap": dp_overlap, "tp_overlap": tp_overlap}
    knobs = {**_train_defaults(), **{k: v for k, v in step.items() if k in given},
             **{k: v for k, v in given.items() if v is not None}}
    gb = _int(where, "global_batch", global_batch)
    s = _int(where, "seq_len", seq_len)
    n_dev = float(par.dp * par.tp * par.pp * par.cp) if system is None else float(
        system.n_devices)
    _plan.raise_if_invalid(where, _plan.TRAIN, _plan.inputs(model, par, n_devices=n_dev,
                                                            batch=gb, seq_len=s))
    ints = {k: _int(where, k, getattr(par, k)) for k in ("dp", "tp", "pp", "cp", "ep",
                                                         "micro_batch", "interleave")}
    sched = SCHEDULES[_int(where, "schedule", par.schedule, 0)]
    v = ints["interleave"] if sched == "interleaved" else 1
    etp = _int(where, "etp", _jitted("expert_tp")(_float_plan(par))[0])
    nodes = gpn = None
    if system is not None and system.levels:
        gpn = _int(where, "system.levels[0].size", system.levels[0].size)
        nodes = max(1, int(math.ceil(n_dev / gpn)))
        gpn = min(gpn, int(n_dev))
    return TrainPlan(
        model=model, dp=ints["dp"], tp=ints["tp"], pp=ints["pp"], cp=ints["cp"],
        ep=ints["ep"], etp=etp, sp=_scalar(where, "sp", par.sp) >= 0.5,
        micro_batch=ints["micro_batch"], global_batch=gb, seq_len=s, v=v,
        m=gb // (ints["dp"] * ints["micro_batch"]), schedule=sched,
        recompute=RECOMPUTE[_int(where, "recompute", par.recompute, 0)],
        zero=_int(where, "zero", par.zero, 0),
        zero3_impl=ZERO3_IMPLS[_int(where, "zero3_impl", par.zero3_impl, 0)],
        flash_attention=FA_VERSIONS[_int(where, "flash_attention", par.flash_attention, 0)],
        precision=_precision_name(where, knobs["precision"]),
        dp_overlap=_scalar(where, "dp_overlap", knobs["dp_overlap"]),
        tp_overlap=_scalar(where, "tp_overlap", knobs["tp_overlap"]),
        n_nodes=nodes, gpus_per_node=gpn)


def _model_ints(model: Model) -> dict:
    w = "export_plan: model"
    out = {k: _int(w, k, getattr(model, k)) for k in ("n_layers", "d_model", "n_heads",
                                                      "n_kv_heads", "d_ff", "n_experts",
                                                      "top_k")}
    out["head_dim"] = _int(w, "head_dim", model.head_dim)
    out["moe_d_ff"] = _int(w, "moe_d_ff", model.moe_d_ff, 0)
    out["activation"] = ACTIVATIONS[_int(w, "activation", model.activation, 0)]
    return out


_JITTED: dict = {}


def _jitted(name: str):
    """One compiled call instead of one dispatch per jnp operation, for the model's own
    formulas evaluated on a single concrete plan (:func:`~jaxmodel.parallel.pipeline.
    stage_layers`, :func:`~jaxmodel.workload.params.expert_tp`)."""
    if name not in _JITTED:
        import jax
        _JITTED.update(stage_layers=jax.jit(stage_layers), expert_tp=jax.jit(expert_tp))
    return _JITTED[name]


def pipeline_stages(n_layers: int, pp: int) -> list[int]:
    """Decoder layers of each pipeline stage, first to last, as the model places them.

    :func:`jaxmodel.parallel.pipeline.stage_layers` gives the first, most loaded and last
    stage (``⌊L/p⌋`` or ``⌈L/p⌉`` layers, the light ones at the ends); the ``L mod p``
    heavy middle stages follow the first stage (the most loaded stage sits second,
    :func:`jaxmodel.parallel.pipeline.stage_in_flight`). Counts; ``sum == n_layers``.
    """
    first, most, last = (int(round(float(x))) for x in _jitted("stage_layers")(
        float(n_layers), float(pp)))
    if pp == 1:
        return [n_layers]
    middle_total = n_layers - first - last
    q = n_layers // pp
    n_heavy = middle_total - q * (pp - 2)
    middle = [q + 1] * n_heavy + [q] * (pp - 2 - n_heavy)
    return [first, *middle, last]


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
      cannot be expressed (error).
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
    # model shape
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
    # overlap
    if dp_on and p.dp * p.cp > 1:
        e("--overlap-grad-reduce")
        if p.zero >= 1:
            e("--overlap-param-gather")
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


# --------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------
#: the runtime preset whose scheduler defaults (:data:`jaxmodel.serving_runtime.SCHEDULER`)
#: fill the settings an export leaves out, per serving framework
SERVE_RUNTIME = MappingProxyType({"vllm": "vllm_v1", "sglang": "sglang",
                                  "trtllm": "trtllm_v1"})


@dataclasses.dataclass(frozen=True)
class ServePlan:
    """One concrete serving deployment, as integers and names (what the exporters read).

    ``max_batch`` sequences and ``max_tokens`` tokens per iteration and replica, ``chunk``
    the chunked-prefill tokens per iteration (0 = whole prompts), ``block_tokens`` per KV
    block, ``mem_fraction`` the KV pool's memory share, as :func:`jaxmodel.serving.
    offline_throughput` and :func:`jaxmodel.serving.slo_throughput` read them (the given
    values, else the runtime preset's :func:`jaxmodel.serving_runtime.scheduler_defaults`);
    ``max_tokens_given`` and ``chunk_given`` say whether the caller set them.
    """
    model: Model
    dp: int
    tp: int
    pp: int
    ep: int
    etp: int
    moe: bool
    max_batch: int
    max_tokens: int
    chunk: int
    block_tokens: int
    mem_fraction: float
    precision: str
    kv_fp8: bool
    runtime: str
    max_tokens_given: bool = False
    chunk_given: bool = False


def serve_plan(par: Parallelism, model: Model, *, framework: str, max_batch=None,
               max_tokens=None, chunk=None, precision=None, kv_dtype=None,
               runtime=None) -> ServePlan:
    """The concrete serving deployment :func:`export_plan` reads (see :class:`ServePlan`).

    ``kv_dtype``: ``None`` takes the precision's KV bytes (1 → FP8 cache, 2 → the model's
    16-bit type); ``"fp8"``, ``"bf16"``/``"fp16"``/``"auto"`` force it. The plan must pass
    the model's inference rules (:func:`jaxmodel.parallel.plan.raise_if_invalid`; no
    context parallelism when serving).
    """
    where = "export_plan"
    if not isinstance(model, Model):
        raise ValueError(f"{where}: model must be a jaxmodel.Model (hw_db.model(name)), got "
                         f"{type(model).__name__}")
    par = validate_parallelism(par, f"{where}: plan")
    ints = {k: _int(where, k, getattr(par, k)) for k in ("dp", "tp", "pp", "ep", "cp")}
    n_dev = float(ints["dp"] * ints["tp"] * ints["pp"] * ints["cp"])
    _plan.raise_if_invalid(where, _plan.INFER, _plan.inputs(model, par, n_devices=n_dev,
                                                            batch=float(ints["dp"])))
    rt = runtime or SERVE_RUNTIME[framework]
    d = scheduler_defaults(rt)
    prec = _precision_name(where, precision)
    kv_bytes = float(_PRECISIONS[prec].get("kv_bytes", 2.0))
    if kv_dtype is None:
        if kv_bytes not in (1.0, 2.0):
            raise ValueError(f"{where}: precision={prec!r} keeps a {kv_bytes:g}-byte KV cache, "
                             "which serving engines do not store (give kv_dtype)")
        kv_fp8 = kv_bytes == 1.0
    else:
        k = str(kv_dtype).lower()
        if k not in ("fp8", "bf16", "fp16", "auto"):
            raise ValueError(f"{where}: kv_dtype={kv_dtype!r} must be 'fp8', 'bf16', 'fp16' or "
                             "'auto'")
        kv_fp8 = k == "fp8"
    n_experts = _int(where, "model.n_experts", model.n_experts)
    return ServePlan(
        model=model, dp=ints["dp"], tp=ints["tp"], pp=ints["pp"], ep=ints["ep"],
        etp=_int(where, "etp", _jitted("expert_tp")(_float_plan(par))[0]), moe=n_experts > 1,
        max_batch=_int(where, "max_batch", d["max_batch"] if max_batch is None else max_batch),
        max_tokens=_int(where, "max_tokens",
                        d["max_tokens"] if max_tokens is None else max_tokens),
        chunk=_int(where, "chunk", d["chunk"] if chunk is None else chunk, 0),
        block_tokens=_int(where, "block_tokens", d["block_tokens"]),
        mem_fraction=float(d["mem_fraction"]), precision=prec, kv_fp8=kv_fp8, runtime=rt,
        max_tokens_given=max_tokens is not None, chunk_given=chunk is not None)


def _serve_precision(fw: str, p: ServePlan) -> None:
    if p.precision not in ("bf16", "fp16", "fp8"):
        raise ValueError(f"{fw}: precision={p.precision!r} is not mapped to {fw} (bf16, fp16 "
                         "and fp8 are); give a quantized checkpoint and its flags by hand")


def _token_budget(fw: str, p: ServePlan) -> tuple[int, bool]:
    """One token budget per iteration (vLLM ``max_num_batched_tokens``, TensorRT-LLM
    ``max_num_tokens``), which is also the prefill chunk when chunking is on: the chunk
    when chunked prefill is on, else ``max_tokens``; given both and different, an error."""
    if p.chunk > 0 and p.max_tokens_given and p.chunk_given and p.max_tokens != p.chunk:
        raise ValueError(f"{fw}: max_tokens={p.max_tokens} and chunk={p.chunk} cannot both "
                         "be expressed: the engine has one token budget per iteration, which "
                         "is also its prefill chunk")
    if p.chunk > 0 and not p.max_tokens_given:
        return p.chunk, True
    return p.max_tokens, p.chunk > 0


def _moe_layout(fw: str, p: ServePlan) -> str:
    """How the serving plan's experts map onto the engine (the model's placement,
    :func:`jaxmodel.workload.params.expert_tp`): ``"none"`` (dense, or ep = 1: experts
    tensor-parallel like the rest), ``"ep_tp"`` (dp = 1, ep | tp: experts over the TP
    group, ``etp = tp/ep``), ``"dp_attention"`` (dp > 1, dp | ep | dp·tp: attention data-
    parallel over dp replicas of tp, the experts over ep of the dp·tp devices with
    ``etp = dp·tp/ep``, SGLang ``--enable-dp-attention`` / TensorRT-LLM
    ``enable_attention_dp``). ``1 < ep < dp`` (experts replicated across replicas) has no
    engine layout (error)."""
    if not p.moe or p.ep == 1:
        return "none"
    if p.dp == 1:
        return "ep_tp"
    if p.ep % p.dp:
        raise ValueError(f"{fw}: ep={p.ep} with dp={p.dp} cannot be expressed: the engines' "
                         "expert parallelism spans the attention-data-parallel ranks (ep a "
                         "multiple of dp dividing dp·tp)")
    return "dp_attention"


def vllm_args(p: ServePlan) -> LaunchConfig:
    """``vllm serve MODEL ...`` (vLLM 0.11.x, ``vllm/engine/arg_utils.py`` at commit
    99d7eb5d, :data:`SOURCES`).

    Mapping (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
    PagedAttention", SOSP 2023, for the block pool): tp, pp → ``--tensor-parallel-size``,
    ``--pipeline-parallel-size``; dp > 1 → ``--data-parallel-size`` (replicas in one
    server); MoE: vLLM's ``--enable-expert-parallel`` gives the experts EP = tp·dp (its
    ``FusedMoEParallelConfig``), so the plan's ep must be 1 or tp·dp (else an error);
    ``max_batch`` → ``--max-num-seqs``; the token budget (:func:`_token_budget`) →
    ``--max-num-batched-tokens``, with ``--enable-chunked-prefill`` when chunking; KV block
    and pool → ``--block-size``, ``--gpu-memory-utilization``; precision bf16 / fp16 →
    ``--dtype bfloat16`` / ``float16``, fp8 → ``--quantization fp8`` (FP8 weights and
    GEMMs, quantized at load) with the FP8 KV cache ``--kv-cache-dtype fp8`` when the
    precision stores KV in one byte.
    """
    fw = "vllm"
    _serve_precision(fw, p)
    e, notes = _Emitter(fw), []
    e("--tensor-parallel-size", p.tp)
    e("--pipeline-parallel-size", p.pp)
    if p.dp > 1:
        e("--data-parallel-size", p.dp)
    if p.moe and p.ep > 1:
        if p.ep != p.dp * p.tp:
            raise ValueError(f"vllm: ep={p.ep} cannot be expressed: --enable-expert-parallel "
                             f"places the experts over tp·dp = {p.dp * p.tp} devices")
        e("--enable-expert-parallel")
    budget, chunked = _token_budget(fw, p)
    e("--max-num-seqs", p.max_batch)
    e("--max-num-batched-tokens", budget)
    if chunked:
        e("--enable-chunked-prefill")
    e("--block-size", p.block_tokens)
    e("--gpu-memory-utilization", p.mem_fraction)
    e("--dtype", "float16" if p.precision == "fp16" else "bfloat16")
    if p.precision == "fp8":
        e("--quantization", "fp8")
    if p.kv_fp8:
        e("--kv-cache-dtype", "fp8")
    argv = ["vllm", "serve", p.model.name] + e.argv()
    notes.append("MODEL is the jaxmodel model name: replace it with the checkpoint's path or "
                 "Hugging Face id")
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(dict(e.flags)),
                        MappingProxyType({}), tuple(notes))


def sglang_args(p: ServePlan) -> LaunchConfig:
    """``python -m sglang.launch_server ...`` (SGLang server arguments, ``docs/
    advanced_features/server_arguments.md`` at commit b36e8e19, generated from
    ``python/sglang/srt/server_args.py``; :data:`SOURCES`).

    Mapping (Zheng et al., "SGLang: Efficient Execution of Structured Language Model
    Programs", NeurIPS 2024): dense or ep = 1 → ``--tp-size tp --pp-size pp --dp-size dp``
    (dp replicas); MoE with ep > 1 (:func:`_moe_layout`): dp = 1 → ``--tp-size tp --ep-size
    ep``; dp > 1 → DP attention ``--tp-size dp·tp --dp-size dp --enable-dp-attention
    --ep-size ep`` (attention over dp groups of tp, experts over ep with the rest as expert
    TP); ``--max-running-requests`` = max_batch, ``--chunked-prefill-size`` = the chunk
    (-1 = off), ``--max-prefill-tokens`` = max_tokens, ``--page-size`` = KV block,
    ``--mem-fraction-static`` = the pool share (weights + KV); bf16 / fp16 → ``--dtype``;
    fp8 → ``--quantization fp8``; the FP8 KV cache → ``--kv-cache-dtype fp8_e4m3``.
    """
    fw = "sglang"
    _serve_precision(fw, p)
    layout = _moe_layout(fw, p)
    e, notes = _Emitter(fw), []
    e("--model-path", p.model.name)
    if layout == "dp_attention":
        e("--tp-size", p.dp * p.tp)
        e("--pp-size", p.pp)
        e("--dp-size", p.dp)
        e("--enable-dp-attention")
        e("--ep-size", p.ep)
    else:
        e("--tp-size", p.tp)
        e("--pp-size", p.pp)
        if p.dp > 1:
            e("--dp-size", p.dp)
        if layout == "ep_tp":
            e("--ep-size", p.ep)
    e("--max-running-requests", p.max_batch)
    e("--chunked-prefill-size", p.chunk if p.chunk > 0 else -1)
    e("--max-prefill-tokens", p.max_tokens)
    e("--page-size", p.block_tokens)
    e("--mem-fraction-static", p.mem_fraction)
    e("--dtype", "float16" if p.precision == "fp16" else "bfloat16")
    if p.precision == "fp8":
        e("--quantization", "fp8")
    if p.kv_fp8:
        e("--kv-cache-dtype", "fp8_e4m3")
    notes.append("--model-path is the jaxmodel model name: replace it with the checkpoint's "
                 "path or Hugging Face id")
    argv = ["python", "-m", "sglang.launch_server"] + e.argv()
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(dict(e.flags)),
                        MappingProxyType({}), tuple(notes))


def _yaml(keys: Mapping[str, Any]) -> str:
    """A YAML mapping from dotted keys (one level of nesting, scalars only)."""
    out: dict[str, Any] = {}
    for k, v in keys.items():
        head, _, leaf = k.partition(".")
        if leaf:
            out.setdefault(head, {})[leaf] = v
        else:
            out[head] = v

    def scalar(v):
        return "true" if v is True else "false" if v is False else str(v)
    lines = []
    for k, v in out.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {scalar(vv)}" for kk, vv in v.items()]
        else:
            lines.append(f"{k}: {scalar(v)}")
    return "\n".join(lines) + "\n"


def trtllm_args(p: ServePlan) -> LaunchConfig:
    """``trtllm-serve MODEL --backend pytorch ...`` with an ``--extra_llm_api_options``
    YAML (TensorRT-LLM at commit 4c05a748: CLI options of ``tensorrt_llm/commands/
    serve.py``, YAML keys of ``tensorrt_llm/llmapi/llm_args.py`` ``BaseLlmArgs`` /
    ``KvCacheConfig``; :data:`SOURCES`).

    Mapping: tp, pp → ``--tp_size``, ``--pp_size`` (one replica; dp > 1 replicas of a dense
    model or of ep = 1 run as dp servers behind a load balancer, noted); MoE with ep > 1
    (:func:`_moe_layout`): dp = 1 → ``--ep_size ep``; dp > 1 → ``--tp_size dp·tp --ep_size
    ep`` with ``enable_attention_dp: true``; ``--max_batch_size`` = max_batch,
    ``--max_num_tokens`` = the token budget (:func:`_token_budget`), ``--enable_chunked_
    prefill`` when chunking; ``--kv_cache_free_gpu_memory_fraction`` = the pool share of the
    memory left after weights; ``kv_cache_config.tokens_per_block`` = KV block;
    ``kv_cache_config.dtype: fp8`` for the FP8 KV cache; bf16 / fp16 → ``dtype``. The
    PyTorch backend takes FP8 weights from the checkpoint's quantization config (an FP8
    checkpoint, noted), not from a flag.
    """
    fw = "trtllm"
    _serve_precision(fw, p)
    layout = _moe_layout(fw, p)
    e, y, notes = _Emitter(fw), _Emitter(fw), []
    e("--backend", "pytorch")
    tp = p.dp * p.tp if layout == "dp_attention" else p.tp
    e("--tp_size", tp)
    e("--pp_size", p.pp)
    if layout != "none":
        e("--ep_size", p.ep)
    budget, chunked = _token_budget(fw, p)
    e("--max_batch_size", p.max_batch)
    e("--max_num_tokens", budget)
    e("--kv_cache_free_gpu_memory_fraction", p.mem_fraction)
    if chunked:
        e("--enable_chunked_prefill")
    e("--extra_llm_api_options", "extra_llm_api_options.yaml")
    y("dtype", "float16" if p.precision == "fp16" else "bfloat16")
    if layout == "dp_attention":
        y("enable_attention_dp", True)
    y("kv_cache_config.tokens_per_block", p.block_tokens)
    if p.kv_fp8:
        y("kv_cache_config.dtype", "fp8")
    if p.dp > 1 and layout != "dp_attention":
        notes.append(f"dp={p.dp}: run {p.dp} such servers (one per replica) behind a load "
                     "balancer")
    if p.precision == "fp8":
        notes.append("precision fp8: MODEL must be an FP8 checkpoint (TensorRT Model "
                     "Optimizer); the PyTorch backend reads its quantization config")
    notes.append("MODEL is the jaxmodel model name: replace it with the checkpoint's path or "
                 "Hugging Face id")
    argv = ["trtllm-serve", p.model.name] + e.argv()
    flags = {**e.flags, **{f"yaml:{k}": v for k, v in y.flags.items()}}
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(flags),
                        MappingProxyType({"extra_llm_api_options.yaml": _yaml(y.flags)}),
                        tuple(notes))


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------
def _plan_of(plan) -> tuple[Parallelism, dict]:
    """A :class:`jaxmodel.Parallelism` and the row's other entries from ``plan``: a
    Parallelism, or a mapping / table row with its fields (a row of
    :func:`jaxmodel.search_parallelism`: the plan fields, and ``precision``, ``dp_overlap``,
    ``tp_overlap`` when it searched them)."""
    if isinstance(plan, Parallelism):
        return plan, {}
    if not hasattr(plan, "keys"):
        raise ValueError(f"export_plan: plan must be a jaxmodel.Parallelism or a mapping of "
                         f"its fields, got {type(plan).__name__}")
    names = [f.name for f in dataclasses.fields(Parallelism)]
    row = {str(k): plan[k] for k in plan.keys()}
    kw = {k: row[k] for k in names if k in row and row[k] is not None}
    extra = {k: row[k] for k in ("precision", "dp_overlap", "tp_overlap") if k in row}
    return Parallelism(**kw), extra


_TRAIN_EXPORTERS = {"megatron": megatron_args, "nemo": nemo_recipe,
                    "torchtitan": torchtitan_toml}
_SERVE_EXPORTERS = {"vllm": vllm_args, "sglang": sglang_args, "trtllm": trtllm_args}
_ALIASES = {"megatronlm": "megatron", "megatroncore": "megatron", "tensorrtllm": "trtllm",
            "trtllmserve": "trtllm", "nemo2": "nemo"}


def framework_name(framework: str) -> str:
    """The canonical name of ``framework`` (case, ``-`` and ``_`` ignored; aliases
    ``megatron-lm``, ``megatron-core``, ``tensorrt-llm``)."""
    fw = str(framework).lower().replace("-", "").replace("_", "")
    fw = _ALIASES.get(fw, fw)
    if fw not in FRAMEWORKS:
        raise ValueError(f"export_plan: framework={framework!r} is not one of "
                         f"{list(FRAMEWORKS)}")
    return fw


def export_plan(plan: Parallelism, *, framework: str = "megatron", model: Model | None = None,
                global_batch=None, seq_len=None, precision=None, dp_overlap=None,
                tp_overlap=None, recipe=None, system=None, max_batch=None, max_tokens=None,
                chunk=None, kv_dtype=None, runtime=None) -> LaunchConfig:
    """The launch command (and files) that run ``plan`` on ``framework``.

    Args:
        plan: a :class:`jaxmodel.Parallelism` with scalar leaves (one configuration).
        framework: one of :data:`FRAMEWORKS`: training ``megatron``, ``torchtitan``;
            serving ``vllm``, ``sglang``, ``trtllm``.
        model: the :class:`jaxmodel.Model` (``hw_db.model(name)``).
        global_batch, seq_len: training: sequences per step, tokens per sequence (required).
        precision: a preset name (``None``: the recipe's, else ``"bf16"``).
        dp_overlap, tp_overlap, recipe: training, as :func:`jaxmodel.train_step` (``None``:
            the recipe's value, else train_step's default).
        system: training, optional :class:`jaxmodel.System`; its first network tier sets the
            launcher's nodes and processes per node.
        max_batch, max_tokens, chunk: serving: sequences and tokens per iteration and
            replica, chunked-prefill tokens (0 = off), as :func:`jaxmodel.offline_throughput`
            / :func:`jaxmodel.slo_throughput` (``None``: the runtime preset's defaults).
        kv_dtype: serving: ``"fp8"``, ``"bf16"``, ``"fp16"``, ``"auto"`` (``None``: from the
            precision's KV bytes).
        runtime: serving: the runtime preset whose scheduler defaults fill the settings left
            ``None`` (default :data:`SERVE_RUNTIME` of the framework).

    Returns:
        A :class:`LaunchConfig` (``.command``, ``.files``, ``.flags``, ``.notes``).

    Raises:
        ValueError: an unknown framework, a missing or bad argument, a plan the model rejects,
            or one the framework cannot express (the message names the field and value).

    Example:
        >>> cfg = jm.export_plan(jm.Parallelism(dp=8, tp=8, pp=8, sp=True, interleave=8,
        ...                      schedule="interleaved"), model=hw_db.model("llama3.1-405b"),
        ...                      global_batch=2048, seq_len=8192, precision="fp8")
        >>> [cfg.flags[k] for k in ("--account-for-embedding-in-pipeline-split",
        ...  "--account-for-loss-in-pipeline-split", "--num-layers-per-virtual-pipeline-stage")]
        [True, True, 2]
        >>> cfg.command.startswith("torchrun pretrain_gpt.py --num-layers 126")
        True
    """
    fw = framework_name(framework)
    if model is None:
        raise ValueError("export_plan: model is required (hw_db.model(name))")
    plan, row = _plan_of(plan)
    if fw in TRAIN_FRAMEWORKS:
        precision = row.get("precision") if precision is None else precision
        dp_overlap = row.get("dp_overlap") if dp_overlap is None else dp_overlap
        tp_overlap = row.get("tp_overlap") if tp_overlap is None else tp_overlap
    if fw in TRAIN_FRAMEWORKS:
        for name, v in (("global_batch", global_batch), ("seq_len", seq_len)):
            if v is None:
                raise ValueError(f"export_plan: {name} is required for a training export "
                                 f"({fw})")
        for name, v in (("max_batch", max_batch), ("max_tokens", max_tokens),
                        ("chunk", chunk), ("kv_dtype", kv_dtype), ("runtime", runtime)):
            if v is not None:
                raise ValueError(f"export_plan: {name} applies to serving frameworks "
                                 f"{list(SERVE_FRAMEWORKS)}, not {fw}")
        p = train_plan(plan, model, global_batch, seq_len, precision=precision,
                       dp_overlap=dp_overlap, tp_overlap=tp_overlap, recipe=recipe,
                       system=system)
        return _TRAIN_EXPORTERS[fw](p)
    for name, v in (("global_batch", global_batch), ("dp_overlap", dp_overlap),
                    ("tp_overlap", tp_overlap), ("recipe", recipe)):
        if v is not None:
            raise ValueError(f"export_plan: {name} applies to training frameworks "
                             f"{list(TRAIN_FRAMEWORKS)}, not {fw}")
    p = serve_plan(plan, model, framework=fw, max_batch=max_batch, max_tokens=max_tokens,
                   chunk=chunk, precision=precision, kv_dtype=kv_dtype, runtime=runtime)
    return _SERVE_EXPORTERS[fw](p)
