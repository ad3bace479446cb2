"""Why and what if: elasticities of a metric with respect to every continuous hardware knob,
checked against one-sided finite differences, and the bottleneck view of a step.

**Elasticity** (the log-log derivative, e.g. Sydsæter & Hammond, "Essential Mathematics for
Economic Analysis", §7.7): ``ε = d ln f / d ln x = (x / f)·∂f/∂x``, dimensionless. ``ε = −1``
for a step time means the time halves when the knob doubles (fully bound by it); ``ε = 0`` means
the knob does not matter at this point. :func:`sensitivity` writes every selected leaf ``x_i``
of a config pytree as ``x_i·exp(u_i)`` and takes ``jax.jacrev`` of ``ln f`` at ``u = 0``: one
reverse-mode pass per metric gives the elasticities with respect to all knobs at once.

**Kinks.** The model is piecewise smooth: the GEMM tile search is a masked minimum over a
fixed grid of mappings (the derivative is the winning mapping's, envelope theorem), NCCL's
algorithm/protocol choice and ``max``-type overlaps switch branches, and feasibility rules
are steps. At a switch the derivative is one-sided. :func:`sensitivity` evaluates, in one
vmapped call, the forward and backward differences ``(ln f(x·e^{±h}) − ln f(x)) / (±h)`` of
every knob and flags the knob (``kink``) when they disagree by more than
``kink_tol·max(1, |ε|)`` — the point sits within a relative step ``h`` of a switch, and
``elasticity`` then describes one side only (the finite differences give both) — or when
the elasticity is zero while a difference exceeds ``kink_tol / 10``: a knob the metric
depends on only through discrete choices (a buffer size deciding which GEMM tiles fit) is
a staircase, flat between its steps, whose differences measure the steps within ``±h``,
not a slope.

**Many points** (:func:`sensitivity_batch`, :func:`explain_train_batch`,
:func:`explain_serve_batch`): the per-point answer — the reverse pass and the ``2k`` vmapped
steps, compiled as two graphs — mapped over stacked points with ``jax.lax.map(batch_size=
...)`` (the gradient is mapped, not differentiated through the map); one compile serves all
points of one static variant.

**Bottleneck view** (:func:`bottleneck`): a result's time breakdown grouped into compute-,
memory-, communication-, bubble- and overhead-bound seconds; the grouping of each breakdown
key is listed in :data:`TRAIN_GROUPS` and :func:`bottleneck`.

**Knobs** (:func:`knobs`): every leaf of a ``Device`` or ``NetLevel`` inside the config whose
admissible range (:data:`jaxmodel.types.RANGES`) is continuous — not a count, code or flag —,
whose value is finite and positive (an elasticity at 0 is 0 by definition; ``0``/``-1``
values are sentinels), except the data-format and area-only fields in :data:`NOT_KNOBS`.

Units: elasticities are dimensionless; values are in the fields' SI units.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import energy as _energy
from jaxmodel.cost.area import AREA_FIELDS as _AREA_FIELDS, area_fields as _area_fields
from jaxmodel.cost.ownership import tco as _tco
from jaxmodel.parallel import train as _train
from jaxmodel.parallel.inference_options import InferenceOptions
from jaxmodel.parallel.inference_step import inference_single as _inference_single
from jaxmodel.types import Device, NetLevel, System, rule_of
from jaxmodel.workload import layer as _layer
from jaxmodel.parallel import context as _cx
from jaxmodel import serving_runtime as _rtp
from jaxmodel import precisions as _prec

__all__ = ["sensitivity", "sensitivity_batch", "knobs", "bottleneck", "ranked",
           "explain_train", "explain_serve", "explain_train_batch", "explain_serve_batch",
           "Explanation", "JacobianMap", "TRAIN_GROUPS", "GROUPS", "NOT_KNOBS"]

#: Fields that are not continuous hardware knobs: data formats and datasheet ratios between
#: dtypes (``matrix_ratio_*``), the element size of the vector unit, the cost of one ``exp``,
#: the process node and the area model's die inventory (``cost.area.AREA_FIELDS``: capital
#: cost only), the packet format of a link and NCCL's link class
#: and channel count (codes and counts the range table does not list as such).
NOT_KNOBS = frozenset({"vector_dtype_bytes", "exp_flops", "process_node_nm", "flit_bytes",
                       "header_bytes", "max_payload_bytes", "nccl_link", "nccl_channels",
                       "in_network_reduction"})

#: The five groups of :func:`bottleneck`.
GROUPS = ("compute", "memory", "communication", "bubble", "overhead")

#: Group of each key of ``jm.train_step(...).breakdown`` (:data:`jaxmodel.parallel.train.
#: BREAKDOWN_KEYS`): layer forward/backward, recomputation and the embedding/LM-head/loss
#: stage extras are GEMM-dominated (compute); the optimizer step is an elementwise
#: main-memory-bound kernel; exposed TP/DP/PP/EP collectives are communication; pipeline
#: fill and drain is the bubble.
TRAIN_GROUPS = {"compute": "compute", "recompute": "compute", "embedding": "compute",
                "optimizer": "memory", "tp_comm": "communication", "dp_comm": "communication",
                "pp_comm": "communication", "ep_comm": "communication", "bubble": "bubble"}

# per-layer operators of the inference breakdown that are collectives
_COMM_OPS = ("allreduce_mha", "allreduce_ffn", "moe_alltoall")


# --------------------------------------------------------------------------------------------
# knobs
# --------------------------------------------------------------------------------------------
def _is_knob(cls, field: str, value) -> bool:
    if field in NOT_KNOBS or field.startswith("matrix_ratio_") or field in _AREA_FIELDS:
        return False
    rule = rule_of(cls, field)
    if rule.integer or rule.what in ("code", "flag"):
        return False
    try:
        v = float(value)
    except (TypeError, ValueError):     # batched or traced leaves are not knobs of one point
        return False
    return math.isfinite(v) and v > 0


def _walk(obj, prefix: str):
    """``(name, owner, field)`` for every Device/NetLevel data field below ``obj``."""
    if isinstance(obj, (Device, NetLevel)):
        for f in dataclasses.fields(obj):
            if f.name != "name":
                yield f"{prefix}{f.name}", obj, f.name
    elif isinstance(obj, System):
        yield from _walk(obj.device, f"{prefix}device.")
        for i, lvl in enumerate(obj.levels):
            yield from _walk(lvl, f"{prefix}levels[{i}].")
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            yield from _walk(x, f"{prefix}[{i}].")
    elif isinstance(obj, Mapping):
        for k, x in obj.items():
            yield from _walk(x, f"{prefix}{k}.")


def knobs(config) -> list[str]:
    """Names of the continuous hardware knobs of ``config`` (a System, Device, NetLevel or a
    tuple/dict of them), e.g. ``"device.freq_hz"``, ``"levels[1].bw_per_device"``."""
    return [n for n, o, f in _walk(config, "") if _is_knob(type(o), f, getattr(o, f))]


def _get(config, name: str):
    for n, o, f in _walk(config, ""):
        if n == name:
            return getattr(o, f)
    raise ValueError(f"sensitivity: wrt={name!r} is not a field of the config "
                     f"(knobs: {', '.join(knobs(config)[:8])}, ...)")


def _set_all(config, values: Mapping[str, Any]):
    """``config`` with the fields named in ``values`` replaced (pure; traced values fine)."""
    def rebuild(obj, prefix):
        if isinstance(obj, (Device, NetLevel)):
            upd = {f.name: values[prefix + f.name] for f in dataclasses.fields(obj)
                   if prefix + f.name in values}
            return dataclasses.replace(obj, **upd) if upd else obj
        if isinstance(obj, System):
            return dataclasses.replace(
                obj, device=rebuild(obj.device, prefix + "device."),
                levels=tuple(rebuild(lvl, f"{prefix}levels[{i}].")
                             for i, lvl in enumerate(obj.levels)))
        if isinstance(obj, (tuple, list)):
            return type(obj)(rebuild(x, f"{prefix}[{i}].") for i, x in enumerate(obj))
        if isinstance(obj, Mapping):
            return {k: rebuild(x, f"{prefix}{k}.") for k, x in obj.items()}
        return obj
    return rebuild(config, "")


# --------------------------------------------------------------------------------------------
# sensitivity
# --------------------------------------------------------------------------------------------
def _as_metrics(out) -> dict:
    if isinstance(out, Mapping):
        return {str(k): v for k, v in out.items()}
    return {"f": out}


def _safe_log(v):
    """``ln v`` where ``v`` is finite and positive, else 0 (double-where: finite gradient)."""
    ok = jnp.isfinite(v) & (v > 0)
    return jnp.where(ok, jnp.log(jnp.where(ok, v, 1.0)), 0.0), ok


@dataclasses.dataclass(frozen=True)
class _Compiled:
    fn: Callable
    names: tuple


_CACHE: dict = {}


def _compiled(fn, config, names, h, args, has_aux):
    """The jitted answer for ``fn`` over ``names`` (cached on the function, the knob names,
    the structures of the config and the extra arguments, the step)."""
    key = (fn, names, jax.tree_util.tree_structure((config, args)), h, has_aux)
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    hit = _Compiled(jax.jit(_point_answer(fn, names, h, has_aux)), names)
    _CACHE[key] = hit
    return hit


def _point_answer(fn, names, h, has_aux):
    """``answer(cfg, x0, extra) -> (per-metric dict, aux)`` of one point: the elasticities
    (one ``jax.jacrev`` of the log metrics at ``u = 0``) and the ``2k`` one-sided steps
    ``x·e^{±h}`` in one vmapped call (pure; jitted by :func:`sensitivity`, mapped over points
    by :func:`sensitivity_batch`)."""
    def metrics_at(cfg, x0, u, extra):
        vals = {n: x0[i] * jnp.exp(u[i]) for i, n in enumerate(names)}
        out = fn(_set_all(cfg, vals), *extra)
        out, aux = out if has_aux else (out, None)
        return {k: jnp.asarray(v, dtype=u.dtype) for k, v in _as_metrics(out).items()}, aux

    def grad(cfg, x0, extra, mode="rev"):
        """The Jacobian of the log metrics at ``u = 0``: one reverse pass per metric, or
        (``mode="fwd"``) one forward-mode pass per knob."""
        def log_metrics(u):
            m, aux = metrics_at(cfg, x0, u, extra)
            return {name: _safe_log(v)[0] for name, v in m.items()}, aux
        jac = jax.jacrev if mode == "rev" else jax.jacfwd
        return jac(log_metrics, has_aux=True)(jnp.zeros(len(names), dtype=x0.dtype))

    def steps(cfg, x0, extra):
        """The metrics at the base point and the ``2k`` one-sided steps, one vmapped call."""
        k = len(names)
        eye = jnp.eye(k, dtype=x0.dtype) * h
        us = jnp.concatenate([jnp.zeros((1, k), dtype=x0.dtype), eye, -eye], axis=0)
        return jax.vmap(lambda u: metrics_at(cfg, x0, u, extra)[0])(us)

    def combine(jac, vals):
        k = len(names)
        out = {}
        for m, v in vals.items():
            f0, fp, fm = v[0], v[1:k + 1], v[k + 1:]
            # ln of the ratio (not a difference of logs: float32 keeps its relative
            # precision in the ratio, not in ln f itself)
            ok0 = _safe_log(f0)[1]
            safe0 = jnp.where(ok0, f0, 1.0)
            lp, okp = _safe_log(fp / safe0)
            lm, okm = _safe_log(safe0 / fm)
            ok = ok0 & okp & okm
            fwd = jnp.where(ok, lp / h, 0.0)
            bwd = jnp.where(ok, lm / h, 0.0)
            out[m] = dict(value=f0, feasible=ok0, elasticity=jnp.where(ok0, jac[m], 0.0),
                          fd_forward=fwd, fd_backward=bwd, fd_ok=ok)
        return out

    def answer(cfg, x0, extra):
        jac, aux = grad(cfg, x0, extra)
        return combine(jac, steps(cfg, x0, extra)), aux

    answer.parts = (grad, steps, combine)
    return answer


def _kinks(eps, fwd, bwd, fd_ok, kink_tol):
    """Knobs whose one-sided differences disagree by more than ``kink_tol·max(1, |ε|)``, or
    with a zero elasticity (below 1e-12: the reverse and forward passes round apart) and a
    difference over ``kink_tol / 10`` (a step within ``±h`` of a staircase)."""
    kink = np.abs(fwd - bwd) > kink_tol * np.maximum(1.0, np.abs(eps))
    step = (np.abs(eps) < 1e-12) & (np.maximum(np.abs(fwd), np.abs(bwd)) > 0.1 * kink_tol)
    return (kink | step) & np.asarray(fd_ok, bool)


def sensitivity(fn: Callable, config, wrt: Sequence[str] | None = None, *,
                step: float | None = None, kink_tol: float = 0.02, args: tuple = (),
                has_aux: bool = False):
    """Elasticities ``d ln metric / d ln knob`` of ``fn(config)`` with respect to every
    continuous hardware knob, with a one-sided finite-difference check (module docstring).

    Args:
        fn: a pure JAX function of one configuration, ``fn(config) -> scalar`` or a dict of
            scalars (several metrics: one reverse pass each). Reuse the same function object
            across calls: its compiled answer is cached.
        config: a :class:`jaxmodel.System` (or Device, NetLevel, or a tuple/dict of them)
            with scalar leaves.
        wrt: knob names (:func:`knobs` spelling, e.g. ``"device.mem_bw"``); default all.
        step: relative step ``h`` of the finite differences (``x·e^{±h}``); default 1e-3
            in float32, 1e-4 in float64.
        kink_tol: the one-sided differences disagreeing by more than
            ``kink_tol·max(1, |ε|)`` flags the knob as sitting at a kink.
        args: further pytree arguments, ``fn(config, *args)`` (traced, not differentiated:
            a model, a plan, batch sizes — calls differing only in them share one compile).
        has_aux: ``fn`` returns ``(metrics, aux)``; ``aux`` (any pytree, at the given
            point) is returned in ``attrs["aux"]``.

    Returns:
        ``pandas.DataFrame``, one row per (metric, knob), ranked by ``|elasticity|`` within
        each metric: ``metric, knob, value`` (the knob, SI), ``elasticity``, ``fd_forward``,
        ``fd_backward``, ``fd_central``, ``kink`` (bool), ``metric_value``, ``feasible``.
        Infeasible or non-positive metrics give ``feasible=False`` and elasticities 0 (never
        NaN). ``attrs["metrics"]`` maps each metric to its value.

    Raises:
        ValueError: an unknown ``wrt`` name, a knob that is not a positive finite scalar,
            or a non-positive ``step``.

    Example (a toy time: 1e12/mem_bw + 1e9/freq_hz = 0.49 + 0.71 on an A100):
        >>> s = jm.sensitivity(lambda sy: 1e12 / sy.device.mem_bw + 1e9 / sy.device.freq_hz,
        ...                    hw_db.system("dgx_a100"), wrt=["device.mem_bw", "device.freq_hz"])
        >>> s[["knob", "elasticity"]].round(2).values.tolist()
        [['device.freq_hz', -0.59], ['device.mem_bw', -0.41]]
    """
    import pandas as pd
    names = tuple(knobs(config) if wrt is None else wrt)
    values = [_knob_value(config, n, "sensitivity") for n in names]
    if not names:
        raise ValueError("sensitivity: the config has no continuous knob")
    dtype, h = _step_size(step, "sensitivity")
    x0 = jnp.asarray(values, dtype=dtype)
    out, aux = jax.device_get(_compiled(fn, config, names, h, tuple(args), has_aux).fn(
        config, x0, tuple(args)))
    rows = []
    for m, d in out.items():
        eps = np.asarray(d["elasticity"], dtype=float)
        fwd, bwd = np.asarray(d["fd_forward"], float), np.asarray(d["fd_backward"], float)
        kink = _kinks(eps, fwd, bwd, d["fd_ok"], kink_tol)
        for i, n in enumerate(names):
            rows.append(dict(metric=m, knob=n, value=float(x0[i]), elasticity=float(eps[i]),
                             fd_forward=float(fwd[i]), fd_backward=float(bwd[i]),
                             fd_central=0.5 * float(fwd[i] + bwd[i]), kink=bool(kink[i]),
                             metric_value=float(d["value"]), feasible=bool(d["feasible"])))
    df = pd.DataFrame(rows)
    df["_rank"] = -df["elasticity"].abs()
    df = (df.sort_values(["metric", "_rank"], kind="stable").drop(columns="_rank")
          .reset_index(drop=True))
    order = {m: i for i, m in enumerate(out)}
    df = df.sort_values("metric", key=lambda s: s.map(order), kind="stable").reset_index(
        drop=True)
    df.attrs["metrics"] = {m: float(d["value"]) for m, d in out.items()}
    if has_aux:
        df.attrs["aux"] = aux
    return df


def _knob_value(config, name: str, where: str) -> float:
    """The knob's value, which must be a positive finite scalar (elasticities are taken in
    log space); ``where`` prefixes the error."""
    v = _get(config, name)
    if np.ndim(v) != 0 or not np.isfinite(float(v)) or float(v) <= 0:
        raise ValueError(f"{where}: knob {name}={v!r} must be a positive finite scalar")
    return float(v)


def _step_size(step, where: str):
    """``(dtype, h)``: the float width in use and the log-space step (1e-4 in float64, 1e-3
    in float32 unless given)."""
    x64 = jax.config.jax_enable_x64
    h = float(step) if step is not None else (1e-4 if x64 else 1e-3)
    if not (h > 0 and math.isfinite(h)):
        raise ValueError(f"{where}: step={step!r} must be positive")
    return (jnp.float64 if x64 else jnp.float32), h


_BATCH_CACHE: dict = {}


class JacobianMap(NamedTuple):
    """How :func:`sensitivity_batch` maps the per-point answer over the points.

    Attributes:
        batch_size: points evaluated together inside the ``jax.lax.map``.
        mode: ``"rev"`` (reverse mode, as :func:`sensitivity`) or ``"fwd"`` (forward mode,
            ``jax.jacfwd``: one pass per knob, no transposed graph — a smaller compile; the
            same derivative: the model's one custom rule, the tile search's minimum in
            :func:`jaxmodel.numerics.masked_min`, is a JVP).
    """

    batch_size: int = 8
    mode: str = "rev"


def sensitivity_batch(fn: Callable, configs: Sequence, wrt: Sequence[str] | None = None, *,
                      step: float | None = None, kink_tol: float = 0.02,
                      args: list | tuple = (), has_aux: bool = False,
                      jacobian: JacobianMap = JacobianMap()) -> dict:
    """:func:`sensitivity` of many points in one compiled call: the points' configs (and
    arguments) are stacked on a leading axis and ``jax.lax.map(..., batch_size=...)`` runs
    the per-point answer — one ``jax.jacrev`` and the ``2k`` one-sided steps vmapped —
    ``batch_size`` points at a time (the gradient is mapped, never a gradient of the map).

    Args:
        fn: as for :func:`sensitivity` (``has_aux``: its ``aux`` is dropped here).
        configs: a sequence of single-point configs of one structure (a Device's ``name``
            is static metadata: give the points one name).
        wrt: knob names; default :func:`knobs` of the first point. Every point must have a
            positive finite value for each.
        args: one tuple of further arguments shared by all points, or a list of tuples,
            one per point (stacked like the configs: models and plans may vary when their
            static variants agree).
        jacobian: :class:`JacobianMap` — ``batch_size`` points evaluated together inside
            the map, reverse (``"rev"``) or forward (``"fwd"``) ``mode``.

    Returns:
        dict: ``knobs`` (names), ``step`` (``h``), and per metric a dict of NumPy arrays
        ``value [N]``, ``feasible [N]``, ``elasticity``, ``fd_forward``, ``fd_backward``,
        ``fd_central``, ``fd_ok``, ``kink`` (each ``[N, k]``). Infeasible points give
        elasticities and differences 0.

    Raises:
        ValueError: no point, an unknown knob or a non-positive knob value (naming the
            point and the knob), a non-positive ``step`` or ``batch_size``.
    """
    batch_size, mode = jacobian
    configs = list(configs)
    if not configs:
        raise ValueError("sensitivity_batch: configs is empty")
    if mode not in ("rev", "fwd"):
        raise ValueError(f"sensitivity_batch: mode={mode!r} must be 'rev' or 'fwd'")
    if int(batch_size) < 1:
        raise ValueError(f"sensitivity_batch: batch_size={batch_size!r} must be >= 1")
    names = tuple(knobs(configs[0]) if wrt is None else wrt)
    if not names:
        raise ValueError("sensitivity_batch: the config has no continuous knob")
    dtype, h = _step_size(step, "sensitivity_batch")
    x0 = np.asarray([[_knob_value(c, n, f"sensitivity_batch: point {p}") for n in names]
                     for p, c in enumerate(configs)], dtype=float)
    if isinstance(args, list):
        if len(args) != len(configs):
            raise ValueError(f"sensitivity_batch: args has {len(args)} entries for "
                             f"{len(configs)} points")
        extras = [tuple(a) for a in args]
    else:
        extras = [tuple(args)] * len(configs)
    stack = lambda *xs: jnp.asarray(np.stack([np.asarray(x, dtype=float) for x in xs]))  # noqa: E731
    cfgs = jax.tree_util.tree_map(stack, *configs)
    ext = jax.tree_util.tree_map(stack, *extras)
    key = (fn, names, jax.tree_util.tree_structure((configs[0], extras[0])), h, has_aux,
           int(batch_size), mode)
    run = _BATCH_CACHE.get(key)
    if run is None:
        grad, steps, combine = _point_answer(fn, names, h, has_aux).parts
        bs = int(batch_size)
        # two compiled maps (the reverse pass, the forward steps): each graph is about half
        # of the single-point answer's, which bounds the compiler's memory
        g = jax.jit(lambda c, x, e: jax.lax.map(lambda t: grad(*t, mode=mode)[0], (c, x, e),
                                                batch_size=bs))
        f = jax.jit(lambda c, x, e: jax.lax.map(lambda t: steps(*t), (c, x, e),
                                                batch_size=bs))
        comb = jax.jit(jax.vmap(combine))
        run = _BATCH_CACHE[key] = lambda c, x, e: comb(g(c, x, e), f(c, x, e))
    out = jax.device_get(run(cfgs, jnp.asarray(x0, dtype=dtype), ext))
    res: dict = {"knobs": list(names), "step": h}
    for m, d in out.items():
        eps = np.asarray(d["elasticity"], float)
        fwd, bwd = np.asarray(d["fd_forward"], float), np.asarray(d["fd_backward"], float)
        res[m] = dict(value=np.asarray(d["value"], float),
                      feasible=np.asarray(d["feasible"], bool), elasticity=eps,
                      fd_forward=fwd, fd_backward=bwd, fd_central=0.5 * (fwd + bwd),
                      fd_ok=np.asarray(d["fd_ok"], bool),
                      kink=_kinks(eps, fwd, bwd, d["fd_ok"], kink_tol))
    return res


def ranked(df, metric: str | None = None, top: int | None = None):
    """Rows of one metric of a :func:`sensitivity` table, largest ``|elasticity|`` first."""
    metric = metric or df["metric"].iloc[0]
    sub = df[df["metric"] == metric]
    return sub if top is None else sub.head(top)


# --------------------------------------------------------------------------------------------
# bottleneck view
# --------------------------------------------------------------------------------------------
def bottleneck(result, model=None) -> dict:
    """Seconds of a step (or request) grouped by what bounds them (:data:`GROUPS`).

    Training (:class:`~jaxmodel.parallel.train.TrainResult`, one step): the breakdown keys
    per :data:`TRAIN_GROUPS`; they sum to ``step_time_s``.

    Inference (:class:`~jaxmodel.parallel.inference_step.InferenceResult`, one request batch,
    ``ttft + (gen − 1)·tpot`` not known here, so per phase: the keys are prefixed
    ``prefill``/``decode`` and give one prefill and one decode step): the per-layer
    collectives (``allreduce_*``, ``moe_alltoall``) × layers and the pipeline hops are
    communication; the runtime's ``step_overhead`` and ``request_setup`` are overhead; the
    other layer operators, embedding and LM head are compute in the prefill (GEMMs over all
    prompt tokens: arithmetic intensity ≈ tokens, far above the ridge point of any device)
    and memory in the decode (one token per sequence reads all weights and the KV cache:
    Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023, §2.1; LLMCompass
    §IV-A). ``model`` gives the layer count (default: inferred as
    ``prefill_layers / prefill.total`` when the breakdown has it).

    Returns:
        dict ``group -> seconds`` (training) or ``{"prefill": {...}, "decode": {...}}``.
    """
    bd = {k: float(np.asarray(v)) for k, v in result.breakdown.items()
          if np.ndim(v) == 0 and not k.startswith("memory.")}
    if "decode_layers" not in bd:
        out = {g: 0.0 for g in GROUPS}
        for k, v in bd.items():
            out[TRAIN_GROUPS.get(k, "compute")] += v
        return out
    per_layer_total = bd.get("prefill.total", 0.0)
    if model is not None:
        n_layers = float(np.asarray(model.n_layers))
    else:
        n_layers = bd["prefill_layers"] / per_layer_total if per_layer_total > 0 else 0.0
    views = {}
    for ph, bound in (("prefill", "compute"), ("decode", "memory")):
        g = {k: 0.0 for k in GROUPS}
        comm = sum(bd.get(f"{ph}.{op}", 0.0) for op in _COMM_OPS) * n_layers
        g["communication"] = comm + bd.get(f"pp_comm_{ph}", 0.0)
        g[bound] = (bd[f"{ph}_layers"] - comm + bd.get(f"embedding_{ph}", 0.0)
                    + bd.get(f"head_{ph}", 0.0))
        g["overhead"] = bd.get("step_overhead", 0.0) + (
            bd.get("request_setup", 0.0) if ph == "prefill" else 0.0)
        views[ph] = g
    return views


# --------------------------------------------------------------------------------------------
# training and serving answers
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Explanation:
    """One explain answer.

    Attributes:
        table: the :func:`sensitivity` DataFrame (metric, knob, elasticity, checks).
        metrics: dict metric -> value at the point.
        bottleneck: :func:`bottleneck` of the point (seconds by group; per phase for serving).
        power_w: mean board power per device, W; ``power_limited``: the activities ask for
            more than TDP (:mod:`jaxmodel.energy`).
        feasible, reason: the point's feasibility and reason code.
    """

    table: Any
    metrics: dict
    bottleneck: dict
    power_w: float
    power_limited: bool
    feasible: bool
    reason: int


@functools.lru_cache(maxsize=None)
def _train_fn(variant, context):
    def f(system, model, par, gb, seq, prec):
        r = _train.train_step_single(system, model, par, gb, seq, precision=prec,
                                     variant=variant, context=context)
        e = _energy.train_energy(system, model, par, r, prec)
        n = system.n_devices
        t = _tco.single(system, r.tokens_per_s, power_w_per_device=e.power_w)
        metrics = {"step_time_s": r.step_time_s, "tokens_per_s_per_gpu": r.tokens_per_s / n,
                   "usd_per_mtok": t.usd_per_million_tokens,
                   "joules_per_token": e.joules_per_token}
        return metrics, (r, e)
    return f


@functools.lru_cache(maxsize=None)
def _serve_fn(variant):
    def f(system, model, par, batch, isl, osl, prec, rt):
        r = _inference_single(system, model, par, batch, isl, osl, precision=prec,
                              runtime=rt, variant=variant)
        e = _energy.inference_energy(system, model, par, r, InferenceOptions(batch, isl, osl),
                                     prec, rt)
        n = system.n_devices
        t = _tco.single(system, r.tokens_per_s, power_w_per_device=e.power_w)
        metrics = {"ttft_s": r.ttft_s, "tpot_s": r.tpot_s,
                   "tokens_per_s_per_gpu": r.tokens_per_s / n,
                   "usd_per_mtok": t.usd_per_million_tokens,
                   "joules_per_token": e.joules_per_token}
        return metrics, (r, e)
    return f


def _with_area(system: System) -> System:
    """The system with its device's derived constants made explicit before differentiating:
    the area model's die inventory (by name) and the silicon's dynamic power where it is
    derived from TDP (``-1``; :func:`jaxmodel.energy.dynamic_power`), so that a what-if of
    ``tdp_w`` moves the power cap only."""
    dev = _area_fields(system.device)
    if float(np.asarray(dev.dynamic_power_w)) < 0:
        dev = dataclasses.replace(dev, dynamic_power_w=float(_energy.dynamic_power(dev)))
    return dataclasses.replace(system, device=dev)


def _answer(df, model) -> Explanation:
    r, e = df.attrs.pop("aux")
    return Explanation(table=df, metrics=df.attrs["metrics"], bottleneck=bottleneck(r, model),
                       power_w=float(e.power_w), power_limited=bool(e.power_limited),
                       feasible=bool(r.feasible), reason=int(r.reason))


def explain_train(system: System, model, par, global_batch, seq_len, *, precision=None,
                  wrt: Sequence[str] | None = None, **kw) -> Explanation:
    """Elasticities of a training step's time, tokens/s per GPU, TCO per million tokens
    (:func:`jaxmodel.tco` with the modelled board power) and energy per token
    (:func:`jaxmodel.energy.train_energy`) with respect to every hardware knob, and its
    bottleneck view. The step is ``jm.train_step``'s single-configuration body
    (:func:`jaxmodel.parallel.train.train_step_single`, overlap settings at their defaults).
    ``kw`` goes to :func:`sensitivity`."""
    prec = _prec.resolve(precision)
    variant = _layer.variant_of(model, par, system)
    fn = _train_fn(variant, _cx.context_flag(par))
    df = sensitivity(fn, _with_area(system), wrt, has_aux=True,
                     args=(model, par, float(global_batch), float(seq_len), prec), **kw)
    return _answer(df, model)


def explain_serve(system: System, model, par, work: InferenceOptions, *, precision=None,
                  runtime=None, wrt: Sequence[str] | None = None, **kw) -> Explanation:
    """Elasticities of serving one request batch (``jm.inference``'s single-configuration
    body; ``work``: the :class:`jaxmodel.InferenceOptions` ``batch``, ``prompt_len``,
    ``gen_len``): TTFT, TPOT, output tokens/s per GPU, TCO per million tokens and energy per
    generated token (:func:`jaxmodel.energy.inference_energy`), and the bottleneck view of
    its prefill and decode. ``kw`` goes to :func:`sensitivity`."""
    prec = _prec.resolve(precision)
    rt = _rtp.runtime_arg(runtime)
    variant = _layer.variant_of(model, par, system)
    df = sensitivity(_serve_fn(variant), _with_area(system), wrt, has_aux=True,
                     args=(model, par, float(work.batch), float(work.prompt_len),
                           float(work.gen_len), prec, rt), **kw)
    return _answer(df, model)


def _one_variant(what, values):
    vs = set(values)
    if len(vs) != 1:
        raise ValueError(f"{what}: the points need one static variant (sequence parallelism, "
                         f"TP > 1, MoE, FlashAttention, topologies, ...), got {len(vs)}")
    return vs.pop()


def _renamed(x, name="batch"):
    """``x`` with its ``name`` metadata replaced (stacked points share one structure)."""
    if isinstance(x, System):
        return dataclasses.replace(x, name=name, device=dataclasses.replace(x.device,
                                                                             name=name))
    return dataclasses.replace(x, name=name)


def explain_train_batch(systems: Sequence[System], models, pars, global_batch, seq_len, *,
                        precision=None, wrt: Sequence[str] | None = None, **kw) -> dict:
    """:func:`explain_train`'s elasticities and finite differences at many points in one
    compiled call (:func:`sensitivity_batch`; no bottleneck view). ``models``, ``pars``,
    ``global_batch`` and ``seq_len`` are one value each or one per point; the points must
    share one static variant (:func:`jaxmodel.workload.layer.variant_of`). ``kw`` goes to
    :func:`sensitivity_batch`."""
    n = len(systems)
    per = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * n  # noqa: E731
    models, pars, gbs, seqs = per(models), per(pars), per(global_batch), per(seq_len)
    prec = _prec.resolve(precision)
    variant = _one_variant("explain_train_batch", (
        _layer.variant_of(m, p, s) for s, m, p in zip(systems, models, pars)))
    context = _one_variant("explain_train_batch", (_cx.context_flag(p) for p in pars))
    return sensitivity_batch(
        _train_fn(variant, context), [_renamed(_with_area(s)) for s in systems], wrt,
        has_aux=True, args=[(_renamed(m), p, float(g), float(q), prec)
                            for m, p, g, q in zip(models, pars, gbs, seqs)], **kw)


def explain_serve_batch(systems: Sequence[System], models, pars, work, *, precision=None,
                        runtime=None, wrt: Sequence[str] | None = None, **kw) -> dict:
    """:func:`explain_serve`'s elasticities and finite differences at many points in one
    compiled call (as :func:`explain_train_batch`; ``work``: one
    :class:`jaxmodel.InferenceOptions` or one per point)."""
    n = len(systems)
    per = lambda v: list(v) if isinstance(v, (list, tuple)) else [v] * n  # noqa: E731
    models, pars, work = per(models), per(pars), per(work)
    bs, isl, osl = ([getattr(w, k) for w in work] for k in ("batch", "prompt_len", "gen_len"))
    prec = _prec.resolve(precision)
    rt = _rtp.runtime_arg(runtime)
    variant = _one_variant("explain_serve_batch", (
        _layer.variant_of(m, p, s) for s, m, p in zip(systems, models, pars)))
    return sensitivity_batch(
        _serve_fn(variant), [_renamed(_with_area(s)) for s in systems], wrt, has_aux=True,
        args=[(_renamed(m), p, float(b), float(i), float(o), prec, rt)
              for m, p, b, i, o in zip(models, pars, bs, isl, osl)], **kw)
