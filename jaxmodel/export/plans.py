"""Plan reading for the launch exports: a :class:`jaxmodel.Parallelism` and its workload as
the integers and names the exporters print (:class:`TrainPlan`, :class:`ServePlan`), checked
by the model's own plan rules. Units: counts, sequences, tokens, bytes."""

from __future__ import annotations

import dataclasses
import inspect
import math
from types import MappingProxyType
from typing import Any

import numpy as np

from jaxmodel.types import (ACTIVATIONS, FA_VERSIONS, RECOMPUTE, SCHEDULES, ZERO3_IMPLS, Model,
                            Parallelism, validate_parallelism)
from jaxmodel.precisions import PRESETS as _PRECISIONS
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel.pipeline import stage_layers
from jaxmodel.parallel.train import train_step
from jaxmodel.recipes import recipe as _recipe
from jaxmodel.serving_runtime import scheduler_defaults
from jaxmodel.workload.params import expert_tp


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
class TrainExportOptions:
    """The training knobs of an export (:func:`jaxmodel.export_plan`, :func:`train_plan`);
    ``None`` takes the recipe's value, else :func:`jaxmodel.train_step`'s default.

    Attributes:
        dp_overlap, tp_overlap, pp_overlap: the overlap fractions of
            :class:`jaxmodel.TrainOptions` (a framework expresses only 0 or 1).
        recipe: a :class:`jaxmodel.Recipe` or its name; its plan fields replace the plan's.
        system: optional :class:`jaxmodel.System`; its first network tier sets the
            launcher's nodes and processes per node.

    Example:
        >>> jm.TrainExportOptions(tp_overlap=1).dp_overlap is None
        True
    """

    dp_overlap: Any = None
    tp_overlap: Any = None
    pp_overlap: Any = None
    recipe: Any = None
    system: Any = None


@dataclasses.dataclass(frozen=True)
class ServeExportOptions:
    """The scheduler settings of a serving export (:func:`jaxmodel.export_plan`,
    :func:`serve_plan`); ``None`` takes the runtime preset's default.

    Attributes:
        max_batch, max_tokens: sequences and tokens per iteration and replica, as
            :class:`jaxmodel.serving.ServingOptions`.
        chunk: chunked-prefill tokens (0 = off).
        kv_dtype: ``"fp8"``, ``"bf16"``, ``"fp16"``, ``"auto"`` (``None``: from the
            precision's KV bytes: 1 → FP8 cache, 2 → the model's 16-bit type).
        runtime: the runtime preset whose scheduler defaults fill the settings left ``None``
            (default :data:`SERVE_RUNTIME` of the framework).

    Example:
        >>> jm.ServeExportOptions(max_batch=128, chunk=2048).kv_dtype is None
        True
    """

    max_batch: Any = None
    max_tokens: Any = None
    chunk: Any = None
    kv_dtype: Any = None
    runtime: Any = None


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
    pp_overlap: float = 0.0
    gpus_per_node: int | None = None


def _float_plan(par: Parallelism) -> Parallelism:
    """``par`` with float leaves (one compiled signature for every concrete plan)."""
    return Parallelism(**{f.name: float(np.asarray(getattr(par, f.name)))
                          for f in dataclasses.fields(Parallelism)})


def _train_defaults() -> dict:
    """The recipe knobs' defaults, read off :func:`jaxmodel.train_step`'s signature."""
    params = inspect.signature(train_step).parameters
    return {k: params[k].default for k in ("dp_overlap", "tp_overlap", "pp_overlap",
                                           "precision")}


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
               options: TrainExportOptions = TrainExportOptions()) -> TrainPlan:
    """The concrete training configuration :func:`export_plan` reads.

    ``options.recipe`` (a :class:`jaxmodel.Recipe` or its name) applies as in
    :func:`jaxmodel.train_step`: its plan fields replace ``par``'s, its step knobs fill the
    arguments left ``None``; the rest take :func:`jaxmodel.train_step`'s defaults. The plan
    must pass the model's own rules (:func:`jaxmodel.parallel.plan.raise_if_invalid`).
    ``options.system`` (optional) gives the node size for the launcher
    (:class:`TrainExportOptions`).
    """
    where = "export_plan"
    dp_overlap, tp_overlap, pp_overlap = options.dp_overlap, options.tp_overlap, \
        options.pp_overlap
    recipe, system = options.recipe, options.system
    if not isinstance(model, Model):
        raise ValueError(f"{where}: model must be a jaxmodel.Model (hw_db.model(name)), got "
                         f"{type(model).__name__}")
    par = validate_parallelism(par, f"{where}: plan")
    step = {}
    if recipe is not None:
        r = _recipe(recipe) if not hasattr(recipe, "step") else recipe
        par = r.parallelism(par)
        step = dict(r.step)
    given = {"precision": precision, "dp_overlap": dp_overlap, "tp_overlap": tp_overlap,
             "pp_overlap": pp_overlap}
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
        n_nodes=nodes, gpus_per_node=gpn,
        pp_overlap=_scalar(where, "pp_overlap", knobs["pp_overlap"]))


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


def serve_plan(par: Parallelism, model: Model, *, framework: str, precision=None,
               options: ServeExportOptions = ServeExportOptions()) -> ServePlan:
    """The concrete serving deployment :func:`export_plan` reads (see :class:`ServePlan`).

    ``options.kv_dtype``: ``None`` takes the precision's KV bytes (1 → FP8 cache, 2 → the
    model's 16-bit type); ``"fp8"``, ``"bf16"``/``"fp16"``/``"auto"`` force it
    (:class:`ServeExportOptions`). The plan must pass the model's inference rules
    (:func:`jaxmodel.parallel.plan.raise_if_invalid`; no context parallelism when serving).
    """
    where = "export_plan"
    max_batch, max_tokens, chunk = options.max_batch, options.max_tokens, options.chunk
    kv_dtype, runtime = options.kv_dtype, options.runtime
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
