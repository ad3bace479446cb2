"""Gradient-guided hardware co-design with optax.

Every latency and cost formula in jaxmodel is a pure JAX function, so an objective such as
"seconds per token × dollars" is differentiable with respect to continuous hardware knobs
(memory bandwidth, buffer sizes, die area, link bandwidth; core counts and HBM stacks relaxed
to reals). :func:`codesign` minimises such an objective inside box constraints:

- each knob is optimised in normalised log space ``u = (log x − log lo) / (log hi − log lo)``
  so one learning rate fits knobs spanning 10⁹ (bytes/s) and 10¹ (stacks), and ratios — not
  differences — matter, as for sizing hardware;
- Adam (default) takes projected steps (``u`` clipped into ``[0, 1]`` after every update);
  L-BFGS (``CodesignOptions(optimizer="lbfgs")``) works on an unconstrained
  ``u = sigmoid(w)`` with optax's zoom line search;
- several starts run at once (``jax.vmap`` over starts, ``lax.scan`` over steps, one jit): start
  0 is ``init``, the others are drawn uniformly in ``u``-space; in a ``jax.distributed`` job
  each process optimises a contiguous share of the starts and their histories are gathered
  onto every process (:mod:`jaxmodel.distributed`), so the result is the single process's;
- constraints such as a cost cap are written by the caller as penalties inside the objective;
  non-finite gradients (an infeasible point) are zeroed so a start stalls rather than diverges;
- at the end, integer knobs are rounded (both neighbours of every discrete knob are tried,
  ``2^d`` combinations per start) and every candidate is re-evaluated with the exact objective
  (``exact=``, e.g. hard instead of soft tile minimum); the best feasible one is returned,
  optionally refined by a short derivative-free pattern search
  (``CodesignOptions(polish=...)``) for knobs whose gradient is uninformative.

Evaluations are counted honestly: one per start and step (value and gradient together), plus
line-search evaluations for L-BFGS, plus the rounding candidates.

Example:
    >>> def obj(p):   # toy: optimum at bw = 2e12, cores = 100
    ...     return (jnp.log(p["bw"] / 2e12)) ** 2 + (jnp.log(p["cores"] / 100)) ** 2
    >>> res = jm.codesign(obj, {"bw": 1e12, "cores": 64},
    ...                   {"bw": (1e11, 1e13), "cores": (8, 256)}, steps=200,
    ...                   integer=("cores",))
    >>> round(res.params["cores"])
    100
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import distributed
from jaxmodel.batching import map_blocks
from jaxmodel.process import stage

__all__ = ["codesign", "CodesignOptions", "CodesignResult"]


def _pattern_search(batch_fn, x, v, lo, hi, int_idx, budget, dtype):
    """Coordinate pattern search (Hooke & Jeeves 1961, exploratory moves) in log space.

    Each sweep evaluates, in one batched call, every knob moved up and down by the current
    step (first a quarter of its log range, ±1 for integer knobs), moves to the best improvement,
    and halves the step when none improves. Stops when ``budget`` evaluations are spent.
    Returns ``(x, value, evaluations)``.
    """
    d = len(x)
    h = 0.25
    used = 0
    while used + 2 * d <= budget and h > 1e-3:
        cands = []
        for i in range(d):
            for sgn in (-1.0, 1.0):
                y = x.copy()
                if i in int_idx:
                    y[i] = min(max(y[i] + sgn, math.ceil(math.exp(lo[i]) - 1e-9)),
                               math.floor(math.exp(hi[i]) + 1e-9))
                else:
                    y[i] = math.exp(min(max(math.log(y[i]) + sgn * h * (hi[i] - lo[i]),
                                            lo[i]), hi[i]))
                cands.append(y)
        vals = np.asarray(batch_fn(jnp.asarray(np.asarray(cands), dtype)))
        used += len(cands)
        j = int(np.argmin(vals))
        if vals[j] < v:
            x, v = np.asarray(cands[j], dtype=float), float(vals[j])
        else:
            h /= 2.0
    return x, v, used


@dataclasses.dataclass(frozen=True)
class CodesignResult:
    """Outcome of :func:`codesign`.

    Attributes:
        params: best design after rounding discrete knobs, ``{knob: float}`` (real units).
        value: exact objective at ``params``.
        continuous_params: best relaxed design seen during optimisation.
        continuous_value: objective at ``continuous_params``.
        history: objective per step and start, shape ``(steps, n_starts)``.
        best_history: best value so far over all starts, shape ``(steps,)``.
        final_params: last iterate of every start, ``{knob: array (n_starts,)}``.
        n_evals: objective evaluations in total (gradient steps, line search, rounding).
        n_grad_evals: of which value-and-gradient evaluations.
        init_value: ``objective`` at ``init`` (clipped into the bounds), for comparison.
    """

    params: dict
    value: float
    continuous_params: dict
    continuous_value: float
    history: np.ndarray
    best_history: np.ndarray
    final_params: dict
    n_evals: int
    n_grad_evals: int
    init_value: float = float("nan")


def _bounds_arrays(init: Mapping, bounds: Mapping):
    if not isinstance(bounds, Mapping) or not bounds:
        raise ValueError("codesign: bounds must be a non-empty mapping knob -> (lo, hi)")
    keys = tuple(bounds)
    lo, hi, x0 = [], [], []
    for k in keys:
        try:
            a, b = (float(v) for v in bounds[k])
        except (TypeError, ValueError):
            raise ValueError(f"codesign: bounds[{k!r}] must be (lo, hi), got {bounds[k]!r}") \
                from None
        if not (0 < a < b) or not math.isfinite(b):
            raise ValueError(f"codesign: bounds[{k!r}] must satisfy 0 < lo < hi < inf "
                             f"(log space), got {bounds[k]!r}")
        v = float(init[k]) if k in init else math.sqrt(a * b)
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"codesign: init[{k!r}] must be a finite number > 0, got {v!r}")
        lo.append(math.log(a))
        hi.append(math.log(b))
        x0.append(math.log(min(max(v, a), b)))
    unknown = set(init) - set(keys)
    if unknown:
        raise ValueError(f"codesign: init has knob(s) {sorted(unknown)} without bounds")
    return keys, np.array(lo), np.array(hi), np.array(x0)


def _adam_run(loss_u, learning_rate, steps):
    """``run(u_init) -> (u_last, (values, iterates, evaluations))``: projected Adam on the
    normalised knobs ``u`` in ``[0, 1]`` (Kingma & Ba, "Adam", ICLR 2015; optax)."""
    import optax   # imported here: ``import jaxmodel`` stays fast
    opt = optax.adam(learning_rate)

    def run(u_init):
        def step(carry, _):
            u, state = carry
            val, g = jax.value_and_grad(loss_u)(u)
            g = jnp.where(jnp.isfinite(g), g, 0.0)
            upd, state = opt.update(g, state, u)
            u_new = jnp.clip(optax.apply_updates(u, upd), 0.0, 1.0)
            return (u_new, state), (val, u, jnp.int32(1))
        (u_last, _), hist = jax.lax.scan(step, (u_init, opt.init(u_init)), None,
                                         length=steps)
        return u_last, hist
    return run


def _lbfgs_run(loss_u, steps):
    """``run(u_init)`` as :func:`_adam_run` with L-BFGS and its zoom line search (Nocedal &
    Wright, "Numerical Optimization", 2006, Alg. 7.5; optax ``lbfgs``) on ``w =
    logit(u)``: the box becomes unconstrained; the evaluations count the line search."""
    import optax   # imported here: ``import jaxmodel`` stays fast
    opt = optax.lbfgs()
    to_u = jax.nn.sigmoid

    def loss_w(w):
        return loss_u(to_u(w))

    vg = optax.value_and_grad_from_state(loss_w)

    def run(u_init):
        w_init = jnp.log(jnp.clip(u_init, 1e-4, 1 - 1e-4)) - jnp.log1p(
            -jnp.clip(u_init, 1e-4, 1 - 1e-4))

        def step(carry, _):
            w, state = carry
            val, g = vg(w, state=state)
            g = jnp.where(jnp.isfinite(g), g, 0.0)
            upd, state = opt.update(g, state, w, value=val, grad=g, value_fn=loss_w)
            w_new = optax.apply_updates(w, upd)
            n_ls = optax.tree_utils.tree_get(state, "num_linesearch_steps")
            return (w_new, state), (val, to_u(w), jnp.asarray(n_ls, jnp.int32) + 1)
        (w_last, _), hist = jax.lax.scan(step, (w_init, opt.init(w_init)), None,
                                         length=steps)
        return to_u(w_last), hist
    return run


def _x_batch(fn, keys, dtype, width):
    """``f(x_rows) -> values``: ``fn`` on rows of knob values in real units, jitted once and
    run in blocks of the fixed size ``width`` (one compiled shape); non-finite values are
    ``+inf``."""
    def at_x(x):
        v = jnp.asarray(fn({k: x[i] for i, k in enumerate(keys)}), dtype)
        return jnp.where(jnp.isfinite(v), v, jnp.inf)
    jitted = jax.jit(jax.vmap(at_x))
    return lambda x_rows: map_blocks(
        jitted, jnp.asarray(np.asarray(x_rows, dtype=float), dtype), width=width,
        progress=False).astype(float)


def _rounded_candidates(xs, lo, hi, int_idx):
    """Designs to evaluate exactly after rounding: for each row of ``xs`` (real units), every
    combination of the floor and ceiling of its integer knobs ``int_idx`` (clipped to the
    bounds ``exp(lo) … exp(hi)``), the other knobs as they are; duplicates removed."""
    cands = []
    for x in xs:
        options = []
        for i in range(len(x)):
            if i in int_idx:
                a, b = math.ceil(math.exp(lo[i]) - 1e-9), math.floor(math.exp(hi[i]) + 1e-9)
                opts = {min(max(math.floor(x[i]), a), b), min(max(math.ceil(x[i]), a), b)}
                options.append(sorted(opts))
            else:
                options.append([x[i]])
        cands.extend(itertools.product(*options))
    return np.unique(np.asarray(cands, dtype=float), axis=0)


class CodesignOptions(NamedTuple):
    """How :func:`codesign` searches (the defaults: one projected-Adam start, no polish).

    Attributes:
        optimizer: ``"adam"`` (projected, default) or ``"lbfgs"``.
        learning_rate: Adam step size in normalised log space (fraction of each knob's log
            range per step).
        n_starts: starts optimised in parallel (vmapped); start 0 is ``init``.
        seed: PRNG seed of the extra starts.
        polish: budget of exact evaluations for a final derivative-free refinement of the
            best rounded design (coordinate pattern search, :func:`_pattern_search`), for
            knobs whose gradient carries little information (buffer sizes: the tile search
            only changes at feasibility cliffs). 0 = off.

    Example:
        >>> jm.CodesignOptions(n_starts=4).optimizer
        'adam'
    """

    optimizer: str = "adam"
    learning_rate: float = 0.05
    n_starts: int = 1
    seed: int = 0
    polish: int = 0


def codesign(objective: Callable[[dict], Any], init: Mapping[str, float],
             bounds: Mapping[str, Sequence[float]], steps: int = 200, *,
             integer: Sequence[str] = (), exact: Callable | None = None,
             options: CodesignOptions = CodesignOptions()) -> CodesignResult:
    """Minimise ``objective`` over continuous hardware knobs inside box constraints.

    Args:
        objective: ``f(params) -> scalar`` (lower is better) with ``params`` a dict of 0-d
            float arrays in real units; must be JAX-traceable. Encode constraints (cost cap,
            memory capacity) as penalties.
        init: starting design ``{knob: value}``; knobs missing here start at the geometric
            middle of their bounds.
        bounds: ``{knob: (lo, hi)}`` with ``0 < lo < hi``; defines the knobs.
        steps: optimiser steps.
        integer: knobs rounded to integers at the end (core counts, HBM stacks).
        exact: objective used to re-evaluate the rounded candidates (default ``objective``).
        options: :class:`CodesignOptions` — ``optimizer``, ``learning_rate``, ``n_starts``,
            ``seed`` and the ``polish`` budget.

    Returns:
        :class:`CodesignResult`.

    Raises:
        ValueError: bad bounds, init or options (naming the knob); in a ``jax.distributed``
            job, arguments that differ between processes.
    """
    optimizer, learning_rate, n_starts, seed, polish = options
    distributed.check_same("codesign", dict(
        objective=objective, init=dict(init), bounds=dict(bounds), steps=steps,
        optimizer=optimizer, learning_rate=learning_rate, n_starts=n_starts, seed=seed,
        integer=tuple(integer), exact=exact, polish=polish))
    keys, lo, hi, x0 = _bounds_arrays(init, bounds)
    bad = [k for k in integer if k not in keys]
    if bad:
        raise ValueError(f"codesign: integer knob(s) {bad} are not in bounds")
    if optimizer not in ("adam", "lbfgs"):
        raise ValueError(f"codesign: optimizer={optimizer!r} is not 'adam' or 'lbfgs'")
    steps, n_starts = int(steps), int(n_starts)
    if steps < 1 or n_starts < 1:
        raise ValueError(f"codesign: steps and n_starts must be >= 1, got {steps}, {n_starts}")
    dtype = jnp.result_type(float)
    lo_j, span_j = jnp.asarray(lo, dtype), jnp.asarray(hi - lo, dtype)

    def to_params(u):
        x = jnp.exp(lo_j + jnp.clip(u, 0.0, 1.0) * span_j)
        return {k: x[i] for i, k in enumerate(keys)}

    def loss_u(u):
        v = jnp.asarray(objective(to_params(u)), dtype)
        return jnp.where(jnp.isfinite(v), v, jnp.finfo(dtype).max)

    u0 = (x0 - lo) / (hi - lo)
    rng = np.random.default_rng(seed)
    starts = np.concatenate([u0[None], rng.uniform(0, 1, (n_starts - 1, len(keys)))])
    starts = jnp.asarray(starts, dtype)
    run = (_adam_run(loss_u, learning_rate, steps) if optimizer == "adam"
           else _lbfgs_run(loss_u, steps))

    with stage(f"codesign: {steps} {optimizer} steps x {n_starts} start(s)"):
        share, keep = distributed.local_rows(n_starts)   # this process's starts
        out = jax.block_until_ready(jax.jit(jax.vmap(run))(starts[share]))
        out = distributed.gather_rows(jax.tree_util.tree_map(lambda x: np.asarray(x)[:keep],
                                                             out))
        u_last, (vals, us, n_ev) = out
    vals, us = np.asarray(vals).T, np.asarray(us).transpose(1, 0, 2)  # (steps, starts, ...)
    n_grad = steps * n_starts
    n_evals = int(np.asarray(n_ev).sum())

    # Every value-only evaluation below (final iterates, rounding candidates, pattern search)
    # goes through ONE compiled batch of fixed size: each new batch shape would recompile
    # the objective (seconds each).
    # Real units (not u): a round trip through log space would turn 56 cores into
    # 55.99999, which changes ceil(tiles / cores) in the tile search.
    width = max(n_starts, 2 * len(keys), 8)

    objective_batch = _x_batch(objective, keys, dtype, width)
    x_final = np.exp(lo + np.clip(np.asarray(u_last, dtype=float), 0, 1) * (hi - lo))
    x_init = np.asarray([min(max(float(init[k]), math.exp(lo[i])), math.exp(hi[i]))
                         if k in init else math.exp(x0[i]) for i, k in enumerate(keys)])
    final_vals = objective_batch(np.concatenate([x_final, x_init[None]]))
    init_value = float(final_vals[-1])
    final_vals = final_vals[:-1]
    n_evals += n_starts + 1
    all_vals = np.concatenate([vals, final_vals[None]], axis=0)
    all_us = np.concatenate([us, np.asarray(u_last)[None]], axis=0)
    t_best, s_best = np.unravel_index(np.argmin(all_vals), all_vals.shape)
    best_u = all_us[t_best, s_best]
    cont_params = {k: float(v) for k, v in to_params(jnp.asarray(best_u)).items()}

    # Rounding: per start, its best iterate; try floor/ceil of each integer knob.
    per_start_best = all_us[np.argmin(all_vals, axis=0), np.arange(n_starts)]
    xs = np.exp(lo + np.clip(per_start_best, 0, 1) * (hi - lo))
    int_idx = [keys.index(k) for k in integer]
    cands = _rounded_candidates(xs, lo, hi, int_idx)
    exact_batch = objective_batch if exact is None else _x_batch(exact, keys, dtype, width)
    with stage(f"codesign: {len(cands)} rounded candidate(s)"
               + (f", pattern search ({int(polish)} evaluations)" if polish > 0 else "")):
        cand_vals = np.asarray(exact_batch(cands))
        n_evals += len(cands)
        j = int(np.argmin(cand_vals))
        best_x, best_v = cands[j].copy(), float(cand_vals[j])
        if polish > 0:
            best_x, best_v, used = _pattern_search(exact_batch, best_x, best_v, lo, hi,
                                                   int_idx, int(polish), dtype)
            n_evals += used
    params = {k: float(best_x[i]) for i, k in enumerate(keys)}
    x_last = np.exp(lo + np.clip(np.asarray(u_last), 0, 1) * (hi - lo))
    return CodesignResult(
        params=params, value=best_v, continuous_params=cont_params,
        continuous_value=float(all_vals[t_best, s_best]), history=vals,
        best_history=np.minimum.accumulate(vals.min(axis=1)),
        final_params={k: x_last[:, i] for i, k in enumerate(keys)},
        n_evals=int(n_evals), n_grad_evals=int(n_grad), init_value=init_value)
