"""Numerical helpers shared by every model: safe division, masked minima, feasibility.

Convention 4 of docs/architecture.md: no NaN, ever. Infeasible configurations carry ``feasible=False``, a
reason code and ``+inf`` time, and their gradients stay finite. The "double-where" trick is used
throughout: the *inputs* of a partial function are replaced by harmless values where the result
will be discarded, so the discarded branch never produces NaN (whose cotangent would poison the
gradient even though the forward value is masked).
"""

from __future__ import annotations

import functools
from typing import Iterable, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

INF = jnp.inf

# Reason codes for feasible=False (first failing check wins). One place for all modules.
REASONS = (
    "ok",                        # 0
    "invalid_device",            # 1  non-positive bandwidth, cores, clock ...
    "buffer_too_small",          # 2  no tile of the candidate grid fits the buffers
    "out_of_memory",             # 3  weights + activations + KV cache exceed capacity
    "devices_mismatch",          # 4  dp·tp·pp differs from the system's device count
    "heads_not_divisible",       # 5  attention heads (or KV heads) not divisible by tp
    "layers_not_divisible",      # 6  layers not divisible by pp · interleave
    "batch_not_divisible",       # 7  global batch not a multiple of dp · micro_batch
    "topology_mismatch",         # 8  group does not fit the topology (prime mesh, too large)
    "experts_not_divisible",     # 9  experts not divisible by ep, or ep not dividing dp·tp
    "invalid_parallelism",       # 10 a degree < 1 or not an integer
    "invalid_model",             # 11 non-positive dimensions
    "invalid_network",           # 12 non-positive link bandwidth / size
    "sequence_not_divisible",    # 13 sequence not divisible by tp under sequence parallelism
    "invalid_workload",          # 14 batch / prompt / generation length < 1 or not an integer
    "precision_unsupported",     # 15 the device has no tensor-core rate for the compute dtype
    "out_of_range",              # 16 a result overflows the float range (absurd magnitudes)
    "rate_above_capacity",       # 17 serving: arrivals outpace service (unbounded queue)
    "slo_unmet",                 # 18 serving: no arrival rate meets the latency limits
)


def reason_code(name: str) -> int:
    """Numeric code of a reason name (see ``REASONS``)."""
    return REASONS.index(name)


def reason_name(code) -> str:
    """Name of a (concrete) reason code.

    Example:
        >>> reason_name(0), reason_name(1)
        ('ok', 'invalid_device')
    """
    return REASONS[int(code)]


def safe_div(num, den, fill=0.0):
    """``num / den`` where ``den > 0``, else ``fill``; finite gradients in both branches."""
    ok = den > 0
    safe_den = jnp.where(ok, den, 1.0)
    return jnp.where(ok, num / safe_den, fill)


def ceil_div(a, b):
    """``ceil(a / b)`` on floats, exact wherever ``a`` and ``b`` are integers (``b > 0``; 0
    where ``b <= 0``). Used for tile counts; gradient is zero a.e.

    The float quotient can land one ulp above an integer (``3b/b → 3.0000002`` in float32
    when the division is compiled as a multiplication by ``1/b``), which a plain ``ceil``
    turns into one tile too many. The ceiling of the quotient is therefore corrected with
    products, which are exact for integers below ``2**24`` (float32) / ``2**53`` (float64):
    ``c − 1`` tiles already cover ``a`` when ``(c − 1)·b >= a``, and ``c`` tiles are too few
    when ``c·b < a``. No absolute margin is involved, so the result is the same in float32
    and float64 at any magnitude.
    """
    ok = b > 0
    den = jnp.where(ok, b, 1.0)
    c = jnp.ceil(a / den)
    c = jnp.where((c - 1.0) * den >= a, c - 1.0, c)
    c = jnp.where(c * den < a, c + 1.0, c)
    return jax.lax.stop_gradient(jnp.where(ok, c, 0.0))


def smooth_ceil_div(a, b):
    """``a / b`` rounded up in value but with the gradient of ``a / b``.

    Straight-through estimator: the forward value is the exact ceiling (:func:`ceil_div`, so
    latencies match the discrete model), the backward pass sees the continuous ratio, so
    d(latency)/d(bandwidth) is informative rather than zero almost everywhere.
    """
    x = safe_div(a, b, fill=0.0)
    return x + jax.lax.stop_gradient(ceil_div(a, b) - x)


def masked_min(values, mask, axis=-1):
    """Minimum of ``values`` over ``axis`` restricted to ``mask``; ``+inf`` when none qualify.

    Convention 3: the tile search is a fixed candidate grid + masked min. The gradient flows to
    the winning candidate only (envelope theorem; :func:`min_of`). Masked entries are replaced
    before the reduction, so infinities/NaNs in them never reach the gradient.
    """
    return min_of(jnp.where(mask, values, INF), axis)


def min_of(values, axis=-1):
    """``jnp.min(values, axis)`` (the same value, bit for bit) with the derivative of the
    winning entry: the one ``jnp.argmin`` selects (the first of tied entries), gathered.

    Every minimum over an axis of *candidates* (tiles, algorithms, protocols, kernels) on a
    differentiable path goes through this function (or :func:`max_of`), never through
    ``jnp.min``/``jnp.max`` directly: their derivative rule (``jax/_src/lax/lax.py``,
    ``_reduce_chooser_jvp_rule``, JAX 0.10) divides by the number of entries *equal* to the
    extremum, and a compiled graph may recompute the candidates in another fusion with other
    rounding than the extremum it compares them with: where no entry compares equal the count
    is 0 and the derivative 0/0 = NaN (seen in compiled reverse- and forward-mode derivatives
    of whole serving and layer steps, never in eager evaluation). This rule has no count and
    no division: the derivative is the winner's (envelope theorem; Milgrom and Segal,
    "Envelope Theorems for Arbitrary Choice Sets", Econometrica 70(2), 2002, Theorem 1, where
    the winner is unique; at a tie, one one-sided derivative). If a recomputation picks
    another of (nearly) tied winners, the derivative is that candidate's — finite either way.

    Args:
        values: candidates (s, bytes, ... any unit; a floating array); ``+inf`` entries are
            fine (their tangent is not taken unless every entry is ``+inf``, then it is that
            entry's, 0 where it was masked with ``jnp.where``).
        axis: the candidate axis (an int), or ``None`` for all entries.

    Returns:
        The minimum, same unit, the shape of ``values`` without ``axis``.

    Example:
        >>> float(min_of(jnp.array([3.0, 1.0, 2.0])))
        1.0
    """
    return _extreme(values, axis, False)


def max_of(values, axis=-1):
    """``jnp.max(values, axis)`` (the same value, bit for bit) with the derivative of the
    entry ``jnp.argmax`` selects (the first of tied entries): :func:`min_of`'s rule, for a
    maximum over candidates (the largest feasible grid, the best packing).

    Example:
        >>> float(max_of(jnp.array([3.0, 1.0, 2.0])))
        3.0
    """
    return _extreme(values, axis, True)


def _extreme(values, axis, largest):
    values = jnp.asarray(values)
    if not jnp.issubdtype(values.dtype, jnp.inexact):   # counts: no derivative to take
        return jnp.max(values, axis=axis) if largest else jnp.min(values, axis=axis)
    if axis is None:
        values, axis = jnp.ravel(values), 0
    return _pick(values, axis % values.ndim, largest)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _pick(v, axis, largest):
    """``jnp.max`` or ``jnp.min`` of ``v`` over ``axis`` (its value)."""
    return jnp.max(v, axis=axis) if largest else jnp.min(v, axis=axis)


@_pick.defjvp
def _pick_jvp(axis, largest, primals, tangents):
    """The tangent of the entry ``argmax``/``argmin`` selects (a gather: no count, no
    division)."""
    (v,), (dv,) = primals, tangents
    arg = jnp.argmax if largest else jnp.argmin
    i = jnp.expand_dims(arg(v, axis=axis), axis)
    return _pick(v, axis, largest), jnp.squeeze(jnp.take_along_axis(dv, i, axis=axis), axis)


def soft_min(values, mask, temperature):
    """Smooth minimum ``-T·logsumexp(-v/T)`` over the masked last axis (smooth optimisation).

    Tends to :func:`masked_min` as ``temperature → 0``; computed relative to the hard minimum so
    it is stable at any scale. Returns ``+inf`` when no entry qualifies.
    """
    hard = masked_min(values, mask)
    any_ok = jnp.any(mask, axis=-1)
    ref = jnp.where(any_ok, hard, 0.0)
    safe_vals = jnp.where(mask, values, ref[..., None])
    z = jnp.where(mask, -(safe_vals - ref[..., None]) / temperature, -INF)
    z = jnp.where(any_ok[..., None], z, 0.0)
    soft = ref - temperature * jax.nn.logsumexp(z, axis=-1)
    return jnp.where(any_ok, soft, INF)


def computed_once(flag):
    """``flag`` (bool), computed once however many results it gates.

    XLA:CPU fuses cheap elementwise producers (compares, ``and``, ``select``) into every
    consumer kernel, so a validity flag built from dozens of checks and gating many outputs
    was recomputed inside each output's fused kernel: the command line's inference graph held
    nine copies of its ~1,300-instruction rule chain (43.5 k instructions after optimisation,
    a 5 MB stored executable whose loading dominates a warm ``jaxmodel predict``). XLA
    does not duplicate an expensive producer (``InstructionFusion::IsExpensive``: square
    roots among them) into several consumers, so routing the flag through ``sqrt`` keeps one
    copy; exact, since ``sqrt(0) = 0`` and ``sqrt(1) = 1``. ``lax.optimization_barrier`` would
    say the same but XLA:CPU removes it before fusion. Values and gradients are unchanged
    (a bool carries none).

    >>> import jax.numpy as jnp
    >>> computed_once(jnp.array([True, False])).tolist()
    [True, False]
    """
    return jnp.sqrt(jnp.asarray(flag).astype(jnp.float32)) > 0.5


def materialized(tree):
    """``tree`` (a pytree of arrays) unchanged, kept in memory once for all its consumers
    (XLA:CPU otherwise recomputes a cheap producer chain inside every consumer kernel, see
    :func:`computed_once`): the values pass through a ``lax.cond`` whose predicate XLA
    cannot fold, and a conditional is never fused. Exact (the other branch adds ``+0`` to
    floats, taken only where the first leaf holds a NaN; integer and bool leaves pass as
    they are); under ``vmap`` with a batched predicate JAX evaluates both branches and
    selects (the same values)."""
    first = jax.tree_util.tree_leaves(tree)[0]
    keep = jnp.all(first == first)

    def plus_zero(v):       # floats only: integer and bool leaves keep their dtype
        return v + 0.0 if jnp.issubdtype(jnp.result_type(v), jnp.floating) else v
    return jax.lax.cond(keep, lambda t: t,
                        lambda t: jax.tree_util.tree_map(plus_zero, t), tree)


def first_reason(checks: Iterable[Tuple[jax.Array, str]]):
    """Combine feasibility checks; return ``(feasible, reason_code)``.

    Args:
        checks: pairs ``(ok, reason_name)``; the first failing check names the reason.

    Returns:
        ``feasible`` (bool array) and ``reason`` (int32 array, 0 when feasible).
    """
    checks = list(checks)
    if not checks:
        return jnp.asarray(True), jnp.int32(0)
    oks = jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(ok, dtype=bool) for ok, _ in checks]))
    # the rules evaluated once for both results (each is read by many outputs)
    oks = computed_once(oks)
    codes = jnp.asarray([reason_code(name) for _, name in checks], dtype=jnp.int32)
    feasible = computed_once(jnp.all(oks, axis=0))
    reason = jnp.where(feasible, jnp.int32(0), codes[jnp.argmin(oks, axis=0)])
    return feasible, reason


def where_feasible(feasible, value):
    """``value`` where feasible, else ``+inf`` (compute ``value`` from sanitised inputs)."""
    return jnp.where(feasible, value, INF)


def weighted(w, t):
    """``w·t`` for a non-negative weight (a count, a share) and a time that may be ``+inf``.

    ``0`` where ``w <= 0`` (even if ``t = inf``: no ``0·inf``), ``+inf`` where ``w > 0`` and ``t``
    is infinite, else ``w·t``. Gradients are finite everywhere: an infinite ``t`` contributes
    no gradient to ``w`` or ``t`` (double-where), so an infeasible operator inside a weighted
    sum cannot poison the derivatives of the weights (model dimensions, shares).
    """
    use = w > 0
    finite = jnp.isfinite(t)
    prod = w * jnp.where(use & finite, t, 0.0)
    return jnp.where(use & ~finite, INF, prod)


def finalize(value, feasible=True, reason=0):
    """The last step of a public result: ``(value, feasible, reason)`` with no NaN and no
    silent infinity.

    Where a configuration passed its checks but its value is not finite (float overflow of
    absurd magnitudes, e.g. ``1e30`` fields in float32, or ``0·inf`` arising from them), it
    becomes infeasible with reason ``out_of_range``; every infeasible value is ``+inf``.
    Inputs of the formulas should still be sanitised (double-where) so that gradients stay
    finite; this guard only fixes the forward value.

    Returns:
        ``value`` (finite where feasible, else ``+inf``), ``feasible`` (bool) and ``reason``
        (int32, 0 where feasible).
    """
    value = jnp.asarray(value)
    feasible = jnp.asarray(feasible, dtype=bool)
    finite = jnp.isfinite(value)
    reason = jnp.where(feasible & ~finite, jnp.int32(reason_code("out_of_range")),
                       jnp.asarray(reason, dtype=jnp.int32))
    feasible = feasible & finite
    return jnp.where(feasible, value, INF), feasible, reason


def sanitize(x, ok, fallback=1.0):
    """Double-where helper: replace ``x`` by ``fallback`` where ``ok`` is False."""
    return jnp.where(ok, x, fallback)


def is_integer(x, tol=1e-6):
    """True where ``x`` is (numerically) an integer."""
    return jnp.abs(x - jnp.round(x)) <= tol * jnp.maximum(1.0, jnp.abs(x))


def divides(a, b):
    """True where integer ``a`` divides ``b`` (``a > 0``)."""
    q = safe_div(b, a, fill=0.5)
    return (a > 0) & is_integer(q)


def broadcast_batch(*trees) -> Sequence:
    """Broadcast every leaf of several config pytrees to one common batch shape.

    docs/architecture.md: "configs whose leaves carry a leading batch axis (leaves broadcast against each
    other)". Returns the trees with leaves of identical shape (``()`` for a single config).
    """
    leaves = [jnp.asarray(x) for t in trees for x in jax.tree_util.tree_leaves(t)]
    shape = jnp.broadcast_shapes(*[x.shape for x in leaves]) if leaves else ()
    return [jax.tree_util.tree_map(lambda x: jnp.broadcast_to(jnp.asarray(x), shape), t)
            for t in trees], shape


def pareto_mask(cost, perf, maximize: bool = True) -> np.ndarray:
    """Boolean mask of Pareto-optimal points: lower ``cost`` and better ``perf``.

    A point is on the front when no other point has ``cost <=`` and ``perf >=`` (``<=`` when
    ``maximize`` is False) with one strict. Non-finite points are never on the front.
    O(n log n): sort by cost (ties: better perf first), keep strict running records.
    """
    cost = np.asarray(cost, dtype=float)
    perf = np.asarray(perf, dtype=float)
    p = perf if maximize else -perf
    ok = np.isfinite(cost) & np.isfinite(p)
    mask = np.zeros(cost.shape, dtype=bool)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return mask
    order = idx[np.lexsort((-p[idx], cost[idx]))]
    ps = p[order]
    prev = np.concatenate([[-np.inf], np.maximum.accumulate(ps)[:-1]])
    mask[order[ps > prev]] = True
    return mask


def packed_by_dtype(fn):
    """``(point, unpack)``: ``fn`` with its output leaves of each dtype concatenated into one
    flat array (weakly typed leaves apart, key ``""``), and ``unpack`` rebuilding ``fn``'s
    pytree from the mapped result (leading batch axis) — for ``lax.map`` / ``vmap`` over
    points (:func:`jaxmodel.batching.map_points`). XLA:CPU fuses into each output's update
    of the mapped buffers the whole expression behind it, shared parts once per output (a
    training step's ~30 outputs share its step time and feasibility: a third of its
    compiled graph); one array per dtype computes them in fewer, shared fusions. The values
    are only moved, never changed."""
    box = {}

    def point(x):
        leaves, box["tree"] = jax.tree_util.tree_flatten(fn(x))
        leaves = [jnp.asarray(v) for v in leaves]      # Python scalars: weakly typed arrays
        box["keys"] = [(jnp.shape(v), "" if getattr(v, "weak_type", False) else str(v.dtype))
                       for v in leaves]
        flat = {}
        for v, (_, k) in zip(leaves, box["keys"]):
            flat.setdefault(k, []).append(jnp.reshape(v, (-1,)) if k else v)
        return {k: jnp.concatenate(vs) if k else vs for k, vs in flat.items()}

    def unpack(out):
        pos, leaves = dict.fromkeys(out, 0), []
        for shape, k in box["keys"]:
            n = int(np.prod(shape)) if k else 1
            v = out[k][:, pos[k]:pos[k] + n] if k else out[k][pos[k]]
            leaves.append(v.reshape(v.shape[:1] + shape) if k else v)
            pos[k] += n
        return jax.tree_util.tree_unflatten(box["tree"], leaves)
    return point, unpack
