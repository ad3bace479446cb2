"""Exhaustive parallelism search with GEMM de-duplication.

:func:`search_parallelism` enumerates every consistent 5D plan for a model on ``n`` devices —
``dp·tp·pp = n``, ``tp`` dividing the attention heads, ``pp`` (times the interleave) dividing
the layers, micro-batches dividing the per-replica batch, experts over ``ep | dp·tp`` — crossed
with sequence parallelism, pipeline schedule, virtual stages, activation recompute, ZeRO stage
and FlashAttention, and evaluates all of them with :func:`jaxmodel.train_step` in batched,
sharded calls (:func:`jaxmodel.sweep`).

The expensive part of one evaluation is the tile search of every GEMM (LLMCompass §III-B
mapper, a masked min over the candidate grid). A search has few distinct GEMM shapes — they
depend on a handful of plan fields (``tp``, ``micro_batch``, ...) — so the search

1. traces the training step once with a *recording* GEMM hook and reads from the jaxpr which
   plan fields the GEMM shapes depend on (a backward dependency walk, conservative through
   nested calls);
2. evaluates the recorded shapes only on the distinct combinations of those fields;
3. runs the tile search once per distinct ``(m, n, k, batch, dtype)``;
4. evaluates every plan with a *lookup* hook: the i-th GEMM call of the step returns entry
   ``i`` of its combination's row of the latency table.

The lookup returns bit-identical latencies to the tile search (same function, same inputs), so
the ranking is exact; the de-duplication is checked against direct evaluation in the tests.
DESIGN.md "Data flows one way": this module only calls ``parallel``/``ops``.

Source of the enumeration rules: Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC'21 §2–3 (PTD-P; interleaving needs the
micro-batch count to be a multiple of ``pp``); Korthikanti et al. 2022 (SP, selective
recompute); Rajbhandari et al. 2020 (ZeRO 1–3); seed 001 §III (5D parallelism, EP).

Example:
    >>> df = jm.search_parallelism(hw_db.system("dgx_a100", nodes=192),
    ...                            hw_db.model("gpt3-175b"), 1536, 1536, 2048)
    >>> df.iloc[0][["dp", "tp", "pp", "micro_batch", "step_time_s"]]
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxmodel.numerics import REASONS
from jaxmodel.types import (RECOMPUTE, SCHEDULES, Model, Parallelism, System, code_of,
                            is_concrete)

__all__ = ["search_parallelism", "enumerate_plans", "dedup_gemm"]

PAR_FIELDS = tuple(f.name for f in dataclasses.fields(Parallelism))


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _as_int(x, field: str) -> int:
    v = float(np.asarray(x))
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise ValueError(f"search_parallelism: {field} must be an integer >= 1, got {x!r}")
    return int(v)


def enumerate_plans(model: Model, n_devices: int, global_batch: int, *,
                    schedules: Sequence = SCHEDULES, recompute: Sequence = RECOMPUTE,
                    zero: Sequence[int] = (0, 1, 2, 3), sp: Sequence[bool] = (False, True),
                    flash_attention: Sequence[bool] = (False, True),
                    max_tp: int | None = None, max_pp: int | None = None,
                    micro_batches: Sequence[int] | None = None,
                    max_interleave: int | None = None) -> dict[str, np.ndarray]:
    """All consistent plans as columns ``{field: float array}`` (Parallelism field names).

    Rules (each plan is one row):

    - ``dp · tp · pp = n_devices``; ``tp`` divides the query heads and the KV heads divide
      over (or are replicated across) ``tp``; ``pp`` divides the layers;
    - ``dp`` divides the global batch; ``micro_batch`` divides ``global_batch / dp``;
    - ``ep`` divides the experts and ``dp · tp`` (1 for dense models);
    - ``sp`` only with ``tp > 1`` (it is a no-op otherwise); ZeRO stages > 0 only with
      ``dp > 1``;
    - GPipe and 1F1B use one chunk per device; the interleaved schedule needs ``pp > 1``,
      ``v >= 2`` virtual stages with ``pp · v`` dividing the layers and a micro-batch count
      that is a multiple of ``pp`` (PTD-P §2.2.2).

    Args:
        model: concrete model (counts are read as integers).
        n_devices, global_batch: integers.
        schedules, recompute: names or codes to consider.
        zero, sp, flash_attention: options to consider.
        max_tp, max_pp, max_interleave: optional caps; ``micro_batches``: allowed sizes.
    """
    if not is_concrete(model):
        raise ValueError("search_parallelism: the model must be concrete (not traced)")
    n = _as_int(n_devices, "n_devices")
    gb = _as_int(global_batch, "global_batch")
    L = _as_int(model.n_layers, "model.n_layers")
    H = _as_int(model.n_heads, "model.n_heads")
    Hkv = _as_int(model.n_kv_heads, "model.n_kv_heads")
    E = _as_int(model.n_experts, "model.n_experts")
    sched_codes = sorted({int(code_of(s, SCHEDULES, "schedules")) for s in schedules})
    rc_codes = sorted({int(code_of(r, RECOMPUTE, "recompute")) for r in recompute})
    for z in zero:
        if z not in (0, 1, 2, 3):
            raise ValueError(f"search_parallelism: zero stage {z!r} is not 0, 1, 2 or 3")
    zero = sorted(set(int(z) for z in zero))
    sp_opts = sorted(set(float(bool(s)) for s in sp))
    fa_opts = sorted(set(float(bool(f)) for f in flash_attention))
    if not (sched_codes and rc_codes and zero and sp_opts and fa_opts):
        raise ValueError("search_parallelism: every option list must be non-empty")

    blocks = []
    for tp in _divisors(n):
        if max_tp and tp > max_tp:
            continue
        if H % tp or not (Hkv % tp == 0 or tp % Hkv == 0):
            continue
        for pp in _divisors(n // tp):
            if (max_pp and pp > max_pp) or L % pp:
                continue
            dp = n // (tp * pp)
            if gb % dp:
                continue
            eps = [e for e in _divisors(E) if (dp * tp) % e == 0]
            mbs = [b for b in _divisors(gb // dp) if micro_batches is None or b in
                   micro_batches]
            for mb in mbs:
                m = gb // (dp * mb)
                sched_v = []
                for s in sched_codes:
                    if s == 2:
                        if pp == 1 or m % pp:
                            continue
                        sched_v += [(2, v) for v in _divisors(L // pp) if v >= 2 and
                                    (max_interleave is None or v <= max_interleave)]
                    else:
                        sched_v.append((s, 1))
                if not sched_v:
                    continue
                sps = [s for s in sp_opts if tp > 1 or s == 0.0] or [0.0]
                zs = [z for z in zero if dp > 1 or z == 0] or [0]
                grids = np.meshgrid(np.arange(len(sched_v)), sps, eps, rc_codes, zs, fa_opts,
                                    indexing="ij")
                flat = [g.reshape(-1) for g in grids]
                sv = np.asarray(sched_v, dtype=float)[flat[0].astype(int)]
                k = flat[0].size
                blocks.append(np.stack([
                    np.full(k, dp), np.full(k, tp), np.full(k, pp), flat[1], flat[2],
                    np.full(k, mb), sv[:, 1], sv[:, 0], flat[3], flat[4], flat[5]], axis=1))
    order = ("dp", "tp", "pp", "sp", "ep", "micro_batch", "interleave", "schedule",
             "recompute", "zero", "flash_attention")
    assert set(order) == set(PAR_FIELDS), "Parallelism gained a field: extend the search"
    table = (np.concatenate(blocks).astype(float) if blocks
             else np.zeros((0, len(order))))
    return {f: table[:, i] for i, f in enumerate(order)}


# --------------------------------------------------------------------------------------------
# GEMM de-duplication
# --------------------------------------------------------------------------------------------
_CALLBACKS = ("pure_callback", "io_callback")


def _sub_jaxprs(eqn) -> list:
    """``(jaxpr, consts)`` of every sub-jaxpr held in an equation's parameters."""
    out = []
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(x, "eqns"):
                out.append((x, ()))
            elif hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                out.append((x.jaxpr, getattr(x, "consts", ())))
    return out


def _has_callback(jaxpr) -> bool:
    return any(e.primitive.name in _CALLBACKS or any(_has_callback(j) for j, _ in
                                                     _sub_jaxprs(e)) for e in jaxpr.eqns)


def _inlinable(eqn):
    """The single sub-jaxpr of a call-like equation (``jit``, custom JVP/VJP) or None."""
    subs = _sub_jaxprs(eqn)
    if len(subs) >= 1:
        j, c = subs[0]
        if (len(j.invars) == len(eqn.invars) and len(j.outvars) == len(eqn.outvars)
                and all(not _has_callback(x) for x, _ in subs[1:])):
            return j, c
    return None


def _needed_inputs(jaxpr, const_in, needed_out) -> set:
    """Inputs of ``jaxpr`` that its GEMM callbacks (and the outputs ``needed_out``) use.

    A backward dependency walk. Call-like equations are followed into their sub-jaxpr; other
    equations holding a callback mark all operands (conservative). One deliberate shortcut:
    a ``select_n`` with a constant case — the double-where sanitisation ``where(plan_ok, x,
    1.0)`` of infeasible plans — does not depend on its predicate. That makes the GEMM shapes
    of a *consistent* plan depend only on the fields that really size the GEMMs; a plan for
    which the shortcut is wrong misses the lookup table, is flagged and re-evaluated with the
    tile search, so the shortcut can cost time but never accuracy.
    """
    const = {v: c for v, c in zip(jaxpr.invars, const_in)}
    for v in jaxpr.constvars:
        const[v] = True

    def is_const(v):
        return hasattr(v, "val") or const.get(v, False)

    for eqn in jaxpr.eqns:
        c = eqn.primitive.name not in _CALLBACKS and all(is_const(v) for v in eqn.invars)
        for v in eqn.outvars:
            const[v] = c
    needed = {jaxpr.outvars[i] for i in needed_out if not hasattr(jaxpr.outvars[i], "val")}

    def add(vs):
        needed.update(v for v in vs if not is_const(v))

    for eqn in reversed(jaxpr.eqns):
        hit = [i for i, v in enumerate(eqn.outvars) if v in needed]
        name = eqn.primitive.name
        if name in _CALLBACKS:
            add(eqn.invars)
            continue
        inner = _inlinable(eqn)
        has_cb = any(_has_callback(j) for j, _ in _sub_jaxprs(eqn))
        if not hit and not has_cb:
            continue
        if name == "select_n" and any(is_const(v) for v in eqn.invars[1:]):
            add(eqn.invars[1:])
        elif inner is not None:
            sub, _ = inner
            idx = _needed_inputs(sub, [is_const(v) for v in eqn.invars], hit)
            add([eqn.invars[i] for i in idx])
        else:
            add(eqn.invars)
    return {i for i, v in enumerate(jaxpr.invars) if v in needed}


@dataclasses.dataclass(frozen=True)
class GemmTable:
    """Latencies of distinct GEMM shapes with an exact by-value lookup usable under vmap.

    Each coordinate ``(m, n, k, batch, dtype_bytes)`` is mapped to its rank among the distinct
    values of that coordinate (``searchsorted``, nearest neighbour, exact-match check); the
    ranks form one int32 key searched in the sorted key table. A pytree: pass it as a traced
    argument, so XLA does not constant-fold the searches.

    Attributes:
        axes: distinct values of each coordinate (5 sorted arrays).
        keys: sorted int32 keys of the table's shapes.
        latency: seconds per key.
        card: number of distinct values per coordinate (static).
    """

    axes: tuple
    keys: jax.Array
    latency: jax.Array
    device: jax.Array
    card: tuple = ()

    @classmethod
    def build(cls, shapes: np.ndarray, latency: np.ndarray, device_leaves) -> "GemmTable":
        dtype = jnp.result_type(float)
        axes = [np.unique(shapes[:, j]) for j in range(5)]
        card = tuple(len(a) for a in axes)
        if math.prod(card) >= 2 ** 31 - 1:
            raise OverflowError("GEMM table too large for int32 keys")
        keys = np.zeros(len(shapes), dtype=np.int64)
        for j, (a, c) in enumerate(zip(axes, card)):
            keys = keys * c + np.searchsorted(a, shapes[:, j])
        order = np.argsort(keys)
        return cls(axes=tuple(jnp.asarray(a, dtype) for a in axes),
                   keys=jnp.asarray(keys[order], jnp.int32),
                   latency=jnp.asarray(np.asarray(latency)[order], dtype),
                   device=jnp.asarray(np.asarray(device_leaves, dtype=float), dtype), card=card)

    def lookup(self, m, n, k, batch=1.0, dtype_bytes=2.0, device_leaves=None):
        """``(seconds, hit)`` for GEMM shapes (any common shape); ``hit`` False if absent.

        ``device_leaves``: the leaves of the device the GEMM runs on; the lookup only hits
        when they equal the device the table was built for.
        """
        dtype = jnp.result_type(float)
        shape = jnp.shape(m)
        key = jnp.zeros(shape, jnp.int32)
        hit = jnp.ones(shape, bool)
        if device_leaves is not None:
            same = jnp.all(jnp.stack([jnp.asarray(x, dtype).reshape(-1)[0] if jnp.ndim(x)
                                      else jnp.asarray(x, dtype) for x in device_leaves])
                           == self.device)
            hit &= same
        for x, ax, c in zip((m, n, k, batch, dtype_bytes), self.axes, self.card):
            x = jnp.broadcast_to(jnp.asarray(x, dtype), shape)
            if c > 1:
                i = jnp.clip(jnp.searchsorted(ax, x), 1, c - 1)
                i = jnp.where(jnp.abs(ax[i - 1] - x) <= jnp.abs(ax[i] - x), i - 1, i)
            else:
                i = jnp.zeros(shape, jnp.int32)
            hit &= jnp.abs(ax[i] - x) <= 1e-6 * jnp.maximum(1.0, jnp.abs(x))
            key = key * c + i.astype(jnp.int32)
        j = jnp.clip(jnp.searchsorted(self.keys, key), 0, self.keys.shape[0] - 1)
        hit &= self.keys[j] == key
        return self.latency[j], hit

    def __call__(self, dev, m, n, k, batch=1.0, dtype_bytes=2.0):
        """GEMM-hook form ``(dev, m, n, k, batch, dtype_bytes) -> s`` (NaN when absent)."""
        t, hit = self.lookup(m, n, k, batch, dtype_bytes, jax.tree_util.tree_leaves(dev))
        return jnp.where(hit, t, jnp.nan)


jax.tree_util.register_dataclass(GemmTable, data_fields=["axes", "keys", "latency", "device"],
                                 meta_fields=["card"])


def _interpret(jaxpr, consts, args, table: GemmTable):
    """Evaluate ``jaxpr`` with every GEMM callback replaced by the table lookup.

    Returns ``(outputs, miss)``: ``miss`` is True when any GEMM shape was not in the table.
    Call-like equations holding a callback are inlined (forward evaluation only); other
    equations are re-bound as in ``jax.core.eval_jaxpr``. Any other primitive holding a
    callback (control flow) raises ``NotImplementedError``.
    """
    env = {}
    miss = jnp.asarray(False)

    def read(v):
        return v.val if hasattr(v, "val") else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive.name in _CALLBACKS:
            t, hit = table.lookup(*ins[-5:], device_leaves=ins[:-5])
            miss = miss | ~jnp.all(hit)
            outs = [t]
        elif any(_has_callback(j) for j, _ in _sub_jaxprs(eqn)):
            inner = _inlinable(eqn)
            if inner is None:
                raise NotImplementedError(f"GEMM call inside {eqn.primitive.name}")
            outs, m = _interpret(inner[0], inner[1], ins, table)
            miss = miss | m
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars], miss


def _slice(jaxpr, needed_out) -> tuple[set, set]:
    """Equations (indices) and variables of ``jaxpr`` that its GEMM callbacks or the outputs
    ``needed_out`` depend on."""
    needed = {jaxpr.outvars[i] for i in needed_out if not hasattr(jaxpr.outvars[i], "val")}
    keep = set()
    for n, eqn in enumerate(reversed(jaxpr.eqns)):
        if (eqn.primitive.name in _CALLBACKS or any(v in needed for v in eqn.outvars)
                or any(_has_callback(j) for j, _ in _sub_jaxprs(eqn))):
            keep.add(len(jaxpr.eqns) - 1 - n)
            needed.update(v for v in eqn.invars if not hasattr(v, "val"))
    return keep, needed


def _gemm_operands(jaxpr, consts, args, needed_out=(), sink=None):
    """Evaluate only the slice of ``jaxpr`` that sizes its GEMMs; collect their operands.

    Returns ``(outputs, sink)``: ``sink`` lists the operand tuples ``(m, n, k, batch,
    dtype_bytes)`` of every GEMM callback; outputs outside the slice are zeros. The rest of
    the training step (collectives, memory, pipeline) is never traced, so the program that
    records the shapes compiles in a fraction of the step's time.
    """
    sink = [] if sink is None else sink
    keep, needed = _slice(jaxpr, needed_out)
    env = {}

    def read(v):
        return v.val if hasattr(v, "val") else env.get(v, None)

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x
    for i, eqn in enumerate(jaxpr.eqns):
        if i not in keep:
            continue
        ins = [read(v) for v in eqn.invars]
        if eqn.primitive.name in _CALLBACKS:
            sink.append(tuple(ins))
            outs = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
        elif any(_has_callback(j) for j, _ in _sub_jaxprs(eqn)):
            inner = _inlinable(eqn)
            if inner is None:
                raise NotImplementedError(f"GEMM call inside {eqn.primitive.name}")
            sub_needed = [j for j, v in enumerate(eqn.outvars) if v in needed]
            outs, _ = _gemm_operands(inner[0], inner[1], ins, sub_needed, sink)
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    outs = [read(v) for v in jaxpr.outvars]
    outs = [jnp.zeros(v.aval.shape, v.aval.dtype) if x is None else x
            for v, x in zip(jaxpr.outvars, outs)]
    return outs, sink


def dedup_gemm(train_single: Callable, ctx, plans: dict[str, np.ndarray], call: Callable):
    """Tile-search each distinct GEMM shape of many plans once; return a lookup evaluator.

    The training step is traced once (Python tracing of a whole step is the slow part of a
    search) with a host-callback GEMM hook. From that jaxpr: the plan fields the GEMM shapes
    depend on (:func:`_needed_inputs`); the shapes of one representative plan (its first
    occurrence) per distinct combination of those fields — the jaxpr re-evaluated under
    ``vmap`` with the callbacks recording; and the evaluator of a plan — the jaxpr interpreted
    with the callbacks replaced by the :class:`GemmTable` lookup, which also reports misses.

    Args:
        train_single: ``train_single(par, ctx, gemm=hook)`` for one plan; calls
            ``hook(dev, m, n, k, batch, dtype_bytes)`` (possibly under an inner ``vmap``).
            The device is recorded too (the step may derive it, e.g. a sustained clock); it
            must be the same for every GEMM and plan, else ``NotImplementedError``.
        ctx: pytree of everything but the plan (system, model, workload). It is a traced
            input of the compiled step, never a compile-time constant (XLA would spend
            minutes constant-folding the plan-independent part of the step).
        plans: ``{field: array (N,)}`` as from :func:`enumerate_plans`.
        call: the tile search, ``call(dev, m, n, k, batch, dtype_bytes) -> s`` (batched).

    Returns:
        ``(table, evaluate, info)``: the :class:`GemmTable`, ``evaluate(par, table, ctx) ->
        (output, miss)`` for one plan, and statistics (incl. ``timings``).

    Raises:
        NotImplementedError: the step calls the GEMM hook inside control flow.
        OverflowError: too many distinct shapes for int32 keys.
    """
    dtype = jnp.result_type(float)
    timings = {}
    t0 = time.perf_counter()

    def cb(*xs):  # never runs: the hook only marks GEMM calls in the traced jaxpr
        return np.zeros(np.broadcast_shapes(*[np.shape(x) for x in xs]), dtype)

    dev_tree = []

    def hook(dev_, m, n, k, batch=1.0, dtype_bytes=2.0):
        leaves_, tree_ = jax.tree_util.tree_flatten(dev_)
        dev_tree.append(tree_)
        return jax.pure_callback(cb, jax.ShapeDtypeStruct(jnp.shape(m), dtype), *leaves_, m,
                                 n, k, batch, dtype_bytes, vmap_method="broadcast_all")

    def record(leaves, ctx_):
        return train_single(Parallelism(**dict(zip(PAR_FIELDS, leaves))), ctx_, gemm=hook)

    ctx_leaves, ctx_tree = jax.tree_util.tree_flatten(ctx)
    n_par = len(PAR_FIELDS)
    probe = [jnp.asarray(plans[f][0], dtype) for f in PAR_FIELDS]
    closed, out_shape = jax.make_jaxpr(record, return_shape=True)(probe, ctx)
    out_tree = jax.tree_util.tree_structure(out_shape)
    deps = sorted(i for i in _needed_inputs(closed.jaxpr, [False] * n_par
                                            + [True] * len(ctx_leaves), []) if i < n_par)
    dep_fields = [PAR_FIELDS[i] for i in deps]
    timings["trace_s"] = time.perf_counter() - t0
    n_plans = len(plans[PAR_FIELDS[0]])
    if dep_fields:
        _, first = np.unique(np.stack([plans[f] for f in dep_fields], axis=1), axis=0,
                             return_index=True)
    else:
        first = np.zeros(1, dtype=np.int64)
    leaves = [jnp.asarray(plans[f][first], dtype) for f in PAR_FIELDS]

    if not dev_tree or any(t != dev_tree[0] for t in dev_tree):
        raise NotImplementedError("dedup_gemm: GEMMs run on devices of different structure")

    def shapes_of(*xs):
        _, ops = _gemm_operands(closed.jaxpr, closed.consts, xs)
        # every operand (device leaves and m, n, k, batch, dtype) broadcast to the call's shape
        return [jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(x, dtype) for x in op]))
                for op in ops]

    axes = (0,) * n_par + (None,) * len(ctx_leaves)
    per_site = jax.jit(jax.vmap(shapes_of, in_axes=axes))(*leaves, *ctx_leaves)
    rows = np.concatenate([np.moveaxis(np.asarray(a), 1, -1).reshape(-1, a.shape[1])
                           for a in per_site])
    devices = np.unique(rows[:, :-5], axis=0)
    if len(devices) != 1:
        raise NotImplementedError("dedup_gemm: the GEMM device depends on the plan")
    dev = jax.tree_util.tree_unflatten(dev_tree[0], [float(x) for x in devices[0]])
    shapes = np.unique(rows[:, -5:], axis=0)
    timings["record_s"] = time.perf_counter() - t0 - timings["trace_s"]
    t1 = time.perf_counter()
    lat = np.asarray(call(dev, *(jnp.asarray(shapes[:, j], dtype) for j in range(5))))
    table = GemmTable.build(shapes, lat, devices[0])
    timings["tile_search_s"] = time.perf_counter() - t1

    def evaluate(par, table, ctx):
        args = [jnp.asarray(getattr(par, f), dtype) for f in PAR_FIELDS]
        args += jax.tree_util.tree_leaves(ctx)
        flat, miss = _interpret(closed.jaxpr, closed.consts, args, table)
        return jax.tree_util.tree_unflatten(out_tree, flat), miss

    # fail early (before the big sweep) when the jaxpr cannot be interpreted
    jax.eval_shape(evaluate, Parallelism(*probe), table, ctx)
    info = dict(shape_fields=dep_fields, n_combos=int(len(first)),
                n_unique_gemms=int(len(shapes)), timings=timings)
    return table, evaluate, info


def _scaled_system(system: System, n_devices: int) -> System:
    """``system`` with its outermost level resized so it holds ``n_devices`` devices."""
    have = float(np.asarray(system.n_devices))
    if have == n_devices:
        return system
    if not system.levels:
        raise ValueError(f"search_parallelism: n_devices={n_devices} but the system has "
                         f"{have:g} device(s) and no network level to scale")
    inner = math.prod(float(np.asarray(l.size)) for l in system.levels[:-1])
    outer = n_devices / inner
    if outer < 1 or outer != int(outer):
        raise ValueError(f"search_parallelism: n_devices={n_devices} is not a multiple of "
                         f"the {inner:g} devices below the system's outer level")
    levels = system.levels[:-1] + (dataclasses.replace(system.levels[-1], size=float(outer)),)
    return dataclasses.replace(system, levels=levels)


def search_parallelism(system: System, model: Model, n_devices: int, global_batch,
                       seq_len, *, dedup: bool = True, chunk: int = 4096,
                       progress: bool = True, top: int | None = None, step_fn=None,
                       **options) -> pd.DataFrame:
    """Rank every consistent parallelism plan for training ``model`` on ``n_devices``.

    Args:
        system: the hardware; its outermost network level is resized when it holds a
            different number of devices than ``n_devices``.
        model: the transformer.
        n_devices: devices to use (``dp·tp·pp``).
        global_batch: sequences per optimizer step.
        seq_len: tokens per sequence.
        dedup: GEMM de-duplication (tile search once per distinct shape; exact).
        chunk: plans per ``lax.map`` step.
        progress: tqdm progress bar.
        top: return only the best ``top`` rows.
        step_fn: the training step (default :func:`jaxmodel.train_step`); must expose
            ``.single(system, model, par, global_batch, seq_len, gemm=...)``.
        **options: enumeration options of :func:`enumerate_plans` (``schedules``,
            ``recompute``, ``zero``, ``sp``, ``flash_attention``, ``max_tp``, ...).

    Returns:
        DataFrame ranked by ``step_time_s`` (infeasible plans last, ``+inf``), one row per
        plan: the plan fields (``schedule``/``recompute`` as names), every scalar output of
        the training step (``step_time_s``, ``mfu``, ``tokens_per_s``, ``memory_bytes``,
        ``feasible``, ``reason`` and ``reason_name``, ``breakdown.*``). ``df.attrs`` has
        ``n_evaluated``, ``wall_s``, ``configs_per_s`` and the de-dup statistics.
    """
    t0 = time.perf_counter()
    if step_fn is None:
        from jaxmodel import parallel as _parallel
        step_fn = _parallel.train_step
    single = getattr(step_fn, "single", step_fn)
    n = _as_int(n_devices, "n_devices")
    gb = _as_int(global_batch, "global_batch")
    system = _scaled_system(system, n)
    plans = enumerate_plans(model, n, gb, **options)
    n_plans = len(plans["dp"])
    if n_plans == 0:
        raise ValueError(f"search_parallelism: no consistent plan for {n} devices, global "
                         f"batch {gb} and the given options")
    f = jnp.result_type(float)
    ctx = {"system": system, "model": model, "global_batch": jnp.asarray(gb, f),
           "seq_len": jnp.asarray(float(seq_len), f)}

    def train(par, ctx, gemm=None):
        return single(ctx["system"], ctx["model"], par, ctx["global_batch"], ctx["seq_len"],
                      gemm=gemm)

    info: dict = {}
    par_b = Parallelism(**{k: jnp.asarray(plans[k], f) for k in PAR_FIELDS})
    from jaxmodel.search.explore import sweep
    table = None
    if dedup:
        from jaxmodel import ops as _ops
        try:
            table, evaluate, info = dedup_gemm(train, ctx, plans, _ops.gemm_latency)
        except (OverflowError, NotImplementedError) as e:
            info = {"dedup_disabled": str(e)}
            table = None
    t1 = time.perf_counter()
    if table is None:
        df = sweep(train, par_b, chunk=chunk, progress=progress, consts={"ctx": ctx})
    else:
        df = sweep(evaluate, par_b, chunk=chunk, progress=progress,
                   consts={"table": table, "ctx": ctx})
        df = df.rename(columns=lambda c: c[2:] if c.startswith("0.") else c)
        miss = np.flatnonzero(df.pop("1").to_numpy())
        info["n_lookup_misses"] = int(len(miss))
        if len(miss):  # plans whose GEMMs the table lacks: evaluate with the tile search
            sub = Parallelism(**{k: jnp.asarray(plans[k][miss], f) for k in PAR_FIELDS})
            redo = sweep(train, sub, chunk=chunk, progress=False, consts={"ctx": ctx})
            df.iloc[miss, :] = redo[df.columns].to_numpy()
    info.setdefault("timings", {})["evaluate_s"] = time.perf_counter() - t1
    df = df.rename(columns={f"par.{f}": f for f in PAR_FIELDS})
    df["schedule"] = np.asarray(SCHEDULES)[df["schedule"].to_numpy().astype(int)]
    df["recompute"] = np.asarray(RECOMPUTE)[df["recompute"].to_numpy().astype(int)]
    if "reason" in df:
        df["reason_name"] = np.asarray(REASONS + ("?",))[np.clip(
            df["reason"].to_numpy().astype(int), 0, len(REASONS))]
    df = df.sort_values("step_time_s", kind="stable").reset_index(drop=True)
    wall = time.perf_counter() - t0
    attrs = dict(n_evaluated=int(n_plans), wall_s=wall, configs_per_s=n_plans / wall,
                 n_feasible=int(np.sum(np.isfinite(df["step_time_s"]))), **info)
    if top:
        df = df.head(int(top)).copy()
    df.attrs.update(attrs)
    return df
