"""GEMM latency on one device: LLMCompass's tile-level mapper as a masked min over a static grid.

Source: LLMCompass §III-B1 and Fig. 4; the ``heuristic-GPU`` mapper and simulator of
``software_model/matmul.py`` as described in.

The problem ``C[m×n] = A[m×k]·B[k×n]`` is tiled three times:

1. **main memory → global buffer (L2 tile ``TM×TN×TK``).** Two loop orders, the better wins:
   LLMCompass's fixed ``knm`` (``m`` innermost: a ``B`` tile is reused across the ``m`` loop,
   the partial ``C`` tile is re-read and written for every ``k`` step) and ``mnk`` (``k``
   innermost, as CUTLASS/XLA: ``C`` stays in the global buffer and is written once). One step
   costs ``max(read, compute) + write`` when the working set fits half of the global buffer
   (double buffering), else ``read + compute + write``. Transfers run at the achievable
   main-memory bandwidth ``Device.achievable_mem_bw``.
2. **global buffer → local buffer (L1 tile ``tm×tn×tk`` per core).** The L1 tiles of one L2 tile
   run in waves of ``core_count`` tiles; a wave costs ``max(read, compute) + C traffic``, reads
   de-duplicated inside the wave (merged accesses, paper Fig. 4 scheme 1) and charged at the
   global-buffer bandwidth; ``C`` stays in the cores across ``k`` when all ``(m, n)`` sub-tiles
   of the L2 tile fit one wave (read-after-write elision). L1 tiles are double buffered, so the
   working set must fit half the local buffer; ``tk`` is searched over :data:`L1_TK` (a
   bigger local buffer only unmasks candidates, so it is never slower).
3. **local buffer → lanes (L0).** The L1 tile is split over the ``lanes_per_core`` systolic arrays
   along ``m`` and/or ``n`` (``i·j = lanes``); cycles from :func:`systolic_cycles` (never below
   MACs / array size), plus the vector unit accumulating partial sums when ``k`` is split.

A GEMM kernel of a GPU library is in addition bounded by :func:`_library_seconds`: whole CTA
output tiles per core in waves over the cores (tile and wave quantisation), split-K / stream-K
to fill the cores when there are few tiles (decode), the main loop at a calibrated fraction of
the peak tensor rate, and the operand (weight) stream at a calibrated fraction of the memory
bandwidth. The kernel time is the larger of the two models (:func:`combine_parts`).

Edge tiles: every dimension has ``ceil(d/T) − 1`` full tiles and one remainder tile, so an L2
candidate has 8 tile classes (full/edge in m, n, k) whose costs are summed with their counts
(closed form, no per-tile enumeration). Inside an L2 tile, edge L1 tiles cost as much as full
ones (a wave lasts as long as its slowest tile, as in LLMCompass).

The candidate grid is static (160 tilings in powers of two × 9 L1 k-tiles, 1,292 mappings once
k-tiles that clip to the same value are merged; clipped to the problem; see
``experiments/select_gemm_grid.py``) and every candidate is evaluated at once; infeasible ones
(working set larger than a buffer) are masked with ``+inf`` and
:func:`jaxmodel.numerics.masked_min` picks the best (or a soft-min for smooth co-design).

Deviations from LLMCompass, all deliberate: the ``mnk`` loop order is searched too; L1
``tk`` is searched over a static set; L1 tiles are multiples of the systolic-array size (so
128×128 TPU arrays get big enough tiles); the candidate grid is independent of the shape; the
library-kernel bound above.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import itertools
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.systolic import pipelined_fold_cycles
from jaxmodel.ops.systolic import systolic_cycles  # noqa: F401  (inlined below; the reference)
from jaxmodel.types import validate_args

from jaxmodel.ops.gemm_grid import (GRID, GRID_CANDIDATES, L0_SPLIT_M, L1_TK,  # noqa: F401
                                     N_CANDIDATES, _mappings)



# Smallest tiles of the grid (device-level feasibility check, fp16): the L2 working set in
# elements, and the L1 m = n tile in systolic-array sizes.
MIN_L2_ELEMENTS = float(np.min(GRID[0] * GRID[1] + GRID[1] * GRID[2] + GRID[0] * GRID[2]))
MIN_L1_ARRAYS = float(np.min(GRID[3]))


def _f(x):
    """A static table as a numpy constant of JAX's default float type: sliced and combined
    with other constants in numpy, it never runs a JAX operation eagerly (one compiled
    kernel per operation under ``jax.ensure_compile_time_eval``)."""
    return np.asarray(x, dtype=jnp.result_type(float))


def _cxp(*xs):
    """numpy where every ``x`` is a constant (a Python or numpy number or array), else
    jax.numpy: arithmetic on constants is done once in numpy instead of as eager JAX
    operations (each compiled on first use) or staged graph constants."""
    return jnp if any(isinstance(x, jax.Array) for x in xs) else np


def _rates(dev):
    """Per-cycle rates of a device (bytes/cycle, FLOP/cycle), sanitised against zeros."""
    ok = (dev.freq_hz > 0) & (dev.mem_bw > 0) & (dev.mem_bw_efficiency > 0)
    freq = nx.sanitize(dev.freq_hz, ok)
    dram = nx.sanitize(dev.achievable_mem_bw, ok) / freq   # bytes / cycle
    l2bw = nx.sanitize(dev.global_buffer_bytes_per_cycle,
                       dev.global_buffer_bytes_per_cycle > 0)
    vec_core = nx.sanitize(dev.lanes_per_core * dev.vector_width * dev.vector_flops_per_cycle,
                           dev.lanes_per_core * dev.vector_width * dev.vector_flops_per_cycle > 0)
    cores = nx.sanitize(dev.core_count, dev.core_count > 0)
    return freq, dram, l2bw, vec_core, cores


def _device_ok(dev, xp=jnp):
    """True where every field the operator models divide by is positive (``xp``: numpy or
    jax.numpy)."""
    fields = (dev.freq_hz, dev.core_count, dev.lanes_per_core, dev.vector_width,
              dev.vector_flops_per_cycle, dev.sa_rows, dev.sa_cols, dev.sa_mac_per_cycle,
              dev.local_buffer_bytes, dev.global_buffer_bytes, dev.global_buffer_bytes_per_cycle,
              dev.mem_bw, dev.mem_bw_efficiency, dev.exp_flops, dev.vector_dtype_bytes)
    ok = (fields[0] > 0) & xp.isfinite(fields[0])
    for x in fields[1:]:
        ok = ok & (x > 0) & xp.isfinite(x)
    return ok if xp is np else nx.computed_once(ok)


_MIN_WORD = 2.0  # fp16: the precision the device-level buffer check is made for


def min_local_bytes(sa_rows, sa_cols):
    """Local-buffer bytes the grid's smallest L1 tile needs (``tk = 1``, double buffered, fp16)."""
    t = MIN_L1_ARRAYS * jnp.maximum(sa_rows, sa_cols)
    return 2.0 * (t * t + 2.0 * t) * _MIN_WORD


def min_global_bytes():
    """Global-buffer bytes the grid's smallest L2 tile needs (fp16)."""
    return MIN_L2_ELEMENTS * _MIN_WORD


# A problem dimension larger than every tile of the grid: no candidate is clipped.
_UNCLIPPED = float(2.0 * np.max(GRID[:3]))


def tile_fits(dev, word=_MIN_WORD, xp=jnp):
    """True where some unclipped candidate of the grid fits both buffers (single config).

    The search's own mask (:func:`_tiles`, read by :func:`_candidate_cycles`) on a problem
    larger than every grid
    tile, reduced with ``any``: the L1 tile (double buffered) in the local buffer *and* the
    L2 working set in the global buffer, at ``word`` bytes per element (fp16 by default).
    Smaller problems clip their tiles and need less, so where this holds every GEMM of that
    word size has a mapping. The device-level feasibility of every operator model
    (:func:`device_feasible`, :func:`jaxmodel.ops.ops_feasible`). ``xp``: numpy (concrete
    checks; device fields may carry batch axes before a trailing axis of length 1) or
    jax.numpy.
    """
    big = np.asarray(_UNCLIPPED, dtype=jnp.result_type(float))
    return xp.any(_tiles(xp, dev, big, big, big, word, _fit_front(GRID))[-1], axis=-1)


_FIT_FRONTS: dict = {}


def _fit_front(grid):
    """The mappings of ``grid`` that :func:`tile_fits` needs: those not dominated in
    (L2 working set, L2 m and n tiles, L1 tile in arrays, clipped L1 k-tile) by another one.
    Unclipped, a mapping fits the global buffer where its L2 working set does and the local
    buffer where ``2·(t_m·t_n + t_k·(t_m + t_n))·word`` does (``t_m = min(L1 tiles × array
    edge, T_m)``, :func:`_tiles`), both non-decreasing in the five, so a dominated mapping
    never fits where its dominator does not: ``any`` over the front equals ``any`` over the
    grid, for every device (memoised per grid)."""
    key = id(grid)
    if key not in _FIT_FRONTS:
        pts = np.stack([grid[0] * grid[1] + grid[1] * grid[2] + grid[0] * grid[2],
                        grid[0], grid[1], grid[3], np.minimum(grid[4], grid[2])])  # (5, C)
        le = np.all(pts[:, :, None] <= pts[:, None, :], axis=0)           # [d, c]: d <= c
        # d dominates c: d <= c everywhere and somewhere d < c, i.e. not also c <= d
        dominated = np.any(le & ~le.T, axis=0)
        _FIT_FRONTS[key] = (grid, grid[:, ~dominated])    # keep grid alive: id stays unique
    return _FIT_FRONTS[key][1]


def device_feasible(dev):
    """True where the operator models can run on ``dev`` at all (single config): every field
    they divide by is a finite positive number (:func:`_device_ok`) and some GEMM tile of
    the grid fits the buffers (:func:`tile_fits`). Each operator gates on it, so its result
    is finite exactly where this holds (and its own dimensions are valid).

    Traced, the check is built once per device and trace: a layer's dozens of operators
    share one copy in the graph instead of one each (about a fifth of a training step's
    stage-time graph), which shortens tracing and compiling, not the compiled program."""
    leaves = jax.tree_util.tree_leaves(dev)
    state = _trace_state() if any(isinstance(x, jax.core.Tracer) for x in leaves) else None
    if state is None:
        return _device_ok(dev) & tile_fits(dev)
    for old_state, old_leaves, ok_ref in _FEASIBLE:
        if (len(old_leaves) == len(leaves) and all(r() is x for r, x in zip(old_leaves, leaves))
                and old_state == state):
            ok = ok_ref()
            if ok is not None:
                return ok
    ok = _device_ok(dev) & tile_fits(dev)
    if not isinstance(ok, jax.core.Tracer):
        # the traced leaves are none of the checked fields: a constant, nothing to share (kept,
        # it would outlive the trace whose dead leaves can never match it again)
        return ok
    # tracers held weakly: an entry lives no longer than its trace's values (no leaked
    # tracer, no finished graph kept alive); a dead leaf never matches (ids may be reused),
    # so an entry with one is dropped
    live = [e for e in _FEASIBLE
            if e[2]() is not None and all(r() is not None for r in e[1])]
    _FEASIBLE[:] = ([(state, [_weak(x) for x in leaves], _weak(ok))] + live)[:_FEASIBLE_KEPT]
    return ok


def _weak(x):
    """A weak reference to tracer ``x``; a strong one (a call returning it) to a constant."""
    return weakref.ref(x) if isinstance(x, jax.core.Tracer) else (lambda: x)


# device_feasible's traced results: (trace state, references to the device leaves, reference
# to the result), newest first
_FEASIBLE: list = []
_FEASIBLE_KEPT = 8


def _trace_state():
    """An opaque token equal for calls inside the same JAX trace, or None where this JAX
    has no such token (then nothing is shared)."""
    get = _trace_state_getter()
    return None if get is None else get(convention="jaxmodel")


@functools.cache
def _trace_state_getter():
    """JAX's ``get_opaque_trace_state`` (``jax.extend.core``, older ``jax.core``), or None."""
    for mod in ("jax.extend.core", "jax.core"):
        get = getattr(importlib.import_module(mod), "get_opaque_trace_state", None)
        if get is not None:
            return get
    return None


def _cdiv(a, b):
    """``ceil(a / b)`` for a denominator known to be positive (sanitised or a grid constant)."""
    return _cxp(a, b).ceil(a / b)




def _tiles(xp, dev, m, n, k, word, grid=None):
    """Tiles of every candidate mapping of ``grid`` (default: :data:`GRID`) for one
    ``[m×k]·[k×n]`` GEMM (``m, n, k >= 1``) and whether they fit the buffers; ``xp`` is
    jax.numpy or numpy (concrete checks).

    Returns ``(H, W, TM, TN, TK, tm, tn, tk, ws2, mask)``: the systolic array (sanitised),
    the L2 and L1 tiles, the L2 working set (bytes) and the fit mask, shape ``(C,)``.
    """
    H = xp.where(dev.sa_rows > 0, dev.sa_rows, 1.0)              # nx.sanitize
    W = xp.where(dev.sa_cols > 0, dev.sa_cols, 1.0)
    g = _f(GRID if grid is None else grid)                       # (5, C), numpy
    # ---- L2 tile (clipped to the problem; numpy where the shape is constant) -----------
    cp = _cxp(m, n, k)
    TM = cp.minimum(g[0], m)
    TN = cp.minimum(g[1], n)
    TK = cp.minimum(g[2], k)
    ws2 = (TM * TN + TN * TK + TM * TK) * word
    fit2 = ws2 <= dev.global_buffer_bytes

    # ---- L1 tile: tm = tn a multiple of the systolic array (clipped); tk from the static set
    # L1_TK (the fifth grid row), each mapping masked where the double-buffered
    # working set overflows the local buffer: a bigger local buffer only unmasks candidates,
    # so it is never slower ------------------------------------------------------------------
    t1 = g[3] * xp.maximum(H, W)
    tm = xp.minimum(t1, TM)
    tn = xp.minimum(t1, TN)
    tk = cp.minimum(g[4], TK)
    fit1 = 2.0 * (tm * tn + tk * (tm + tn)) * word <= dev.local_buffer_bytes
    return H, W, TM, TN, TK, tm, tn, tk, ws2, fit1 & fit2


def _candidate_cycles(dev, m, n, k, word, grid=None, single=(False, False, False)):
    """Cycles of every candidate mapping of ``grid`` (default: :data:`GRID`) for one
    ``[m×k]·[k×n]`` GEMM (single config).

    Returns ``(cycles, mask)``, both of shape ``(C,)`` (``C = N_CANDIDATES`` for the default
    grid); ``mask`` is False where the tiles do not fit the buffers. The 8 tile classes (full
    or remainder tile in m, n and k) are an unrolled Python loop over ``(C,)`` arrays: XLA
    then fuses the whole cost into one elementwise loop over the candidates (a class axis
    would materialise intermediates). ``single`` (static, per dimension m, n, k): every
    tile of that dimension has the same size for every candidate of ``grid`` (the L2 tile
    divides the dimension), so its one class — size ``T``, count ``ceil(d/T)`` — replaces
    the full and remainder classes (same cycles, a quarter to an eighth of the work;
    :func:`_static_groups`).
    """
    freq, dram, l2bw, vec_core, cores = _rates(dev)
    lanes = nx.sanitize(dev.lanes_per_core, dev.lanes_per_core > 0)
    mac = nx.sanitize(dev.sa_mac_per_cycle, dev.sa_mac_per_cycle > 0)
    # reciprocals once per config: the per-candidate arithmetic multiplies instead
    r_l2, r_dram, r_vc = 1.0 / l2bw, 1.0 / dram, 1.0 / vec_core
    r_vchip, r_mac = r_vc / cores, 1.0 / mac
    one = _f(1.0)       # numpy shape columns of the static search stay numpy (_tiles)
    m, n, k = (_cxp(x).maximum(x, one) for x in (m, n, k))
    H, W, TM, TN, TK, tm, tn, tk, ws2, mask = _tiles(jnp, dev, m, n, k, word, grid)
    db2 = ws2 <= 0.5 * dev.global_buffer_bytes

    # ---- L0: lanes split along m (i) and n (lanes / i); chosen on the full L1 tile --------
    best_i, best_j, best_c = 1.0, lanes, jnp.inf
    for i in L0_SPLIT_M:
        j = lanes / i
        ok = (j >= 1.0) & nx.is_integer(j)
        j = jnp.where(ok, j, 1.0)
        cyc = jnp.where(ok, _cdiv(tm, i * H) * _cdiv(tn, j * W), jnp.inf)
        better = cyc < best_c
        best_i = jnp.where(better, i, best_i)
        best_j = jnp.where(better, j, best_j)
        best_c = jnp.where(better, cyc, best_c)
    r_lane = 1.0 / (best_i * best_j * H * W)       # one lane's MACs per cycle, reciprocal

    # ---- per dimension: tile count, then (size, count, L1 tiles, L1 extent, folds) of the
    # full and the remainder tile ------------------------------------------------------------
    def per_dim(d, T, t, lane_extent, one_class):
        cnt = _cdiv(d, T)
        # the remainder lies in (0, T]; clipped because float32 rounds it to 0 for huge d
        rem = jnp.clip(d - (cnt - 1.0) * T, jnp.minimum(d, 1.0), T)
        out = []
        for size, count in (((T, cnt),) if one_class else ((T, cnt - 1.0), (rem, 1.0))):
            e = jnp.minimum(t, size)
            out.append((size, count, _cdiv(size, t), e, _cdiv(e, lane_extent)))
        return cnt, out

    nM, cls_m = per_dim(m, TM, tm, best_i * H, single[0])
    nN, cls_n = per_dim(n, TN, tn, best_j * W, single[1])
    nK, cls_k = per_dim(k, TK, tk, 1.0, single[2])
    frac_k = (nK - 1.0) / nK                                    # L2 steps re-reading C
    reuse_a = jnp.where(nK > 1.0, 1.0, 1.0 / nN)                # mnk: A reused across n if nK == 1
    inv_nm = 1.0 / nM
    db = db2

    knm = 0.0
    mnk = 0.0
    for (dM, cM, aM, em, fm), (dN, cN, aN, en, fn) in itertools.product(cls_m, cls_n):
        mn_e = em * en
        mn_d = dM * dN
        aMN = aM * aN
        count_mn = cM * cN
        write = (word * r_dram) * mn_d
        for ck, (dK, cK, aK, ek, _) in enumerate(cls_k):
            # ---- L1 level inside one L2 tile of this class --------------------------------
            # systolic_cycles of one lane's share (folds pipelined, fill and drain once)
            sa = jnp.maximum(pipelined_fold_cycles(fm * fn, ek, H, W),
                             mn_e * ek * r_lane) * r_mac
            wave_compute = sa + jnp.where(aK > 1.0, mn_e * r_vc, 0.0)
            tiles = aMN * aK
            waves = _cdiv(tiles, cores)
            P = jnp.minimum(tiles, cores)                       # tiles in one wave
            um = jnp.minimum(aM, P)                             # distinct sub-blocks in it
            un = jnp.minimum(aN, _cdiv(P, aM))
            uk = jnp.minimum(aK, _cdiv(P, aMN))
            wave_read = (word * r_l2) * uk * ek * (um * em + un * en)
            wave_c = jnp.where(aMN <= cores, 0.0, (2.0 * word * r_l2) * um * un * mn_e)
            l1_time = (waves * (jnp.maximum(wave_read, wave_compute) + wave_c) + wave_read
                       + (word * r_l2) * mn_d
                       # split-K across L2 tiles: the vector units add the re-read partial C
                       + frac_k * mn_d * (r_vchip + 2.0 * word * r_l2))
            # ---- L2 level: main memory <-> global buffer ----------------------------------
            count = count_mn * cK
            ak = dK * (word * r_dram)
            # knm (LLMCompass): m innermost, B reused across m, partial C re-read and
            # written per k step.
            read = ak * (dM + dN * inv_nm) + frac_k * write
            step = jnp.where(db, jnp.maximum(read, l1_time), read + l1_time) + write
            knm = knm + count * step
            # mnk (k innermost, as CUTLASS/XLA): C stays in the global buffer across k and
            # is written once per (m, n) tile, after its last k step (the last k class).
            read = ak * (dN + dM * reuse_a)
            step = jnp.where(db, jnp.maximum(read, l1_time), read + l1_time)
            last = ck == len(cls_k) - 1
            mnk = mnk + count * step + (count_mn * write if last else 0.0)
    prologue = (word * r_dram) * (TM * TK + TK * TN)
    cycles = jnp.minimum(knm, mnk) + prologue
    return jnp.where(mask, cycles, jnp.inf), mask


def _is_static(*xs):
    """True when every ``x`` is a plain Python number (a shape known when tracing)."""
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)


_STATIC_GROUPS: dict = {}
_STATIC_GROUPS_MAX = 4096


def _static_groups(m, n, k):
    """The candidate grid of one GEMM of static shape ``m, n, k >= 1``, pruned and grouped.

    Two mappings whose clipped L2 tiles ``(min(T_m, m), min(T_n, n), min(T_k, k))``, L1 tile
    (in systolic arrays) and clipped L1 k-tile agree give the same cycles on every device
    (:func:`_tiles` derives every other quantity from these), so only the first is kept:
    the hard min is unchanged. The rest are grouped by which dimensions their L2 tile
    divides (:func:`_candidate_cycles`' ``single``). Returns ``[(grid, single), ...]``,
    static numpy grids (memoised per grid and shape, at most ``_STATIC_GROUPS_MAX`` shapes).
    """
    shape = (float(m), float(n), float(k))
    key = (id(GRID),) + shape
    if key not in _STATIC_GROUPS:
        if len(_STATIC_GROUPS) >= _STATIC_GROUPS_MAX:    # bounded: ≈ 50 kB per shape
            _STATIC_GROUPS.clear()
        g = GRID
        tiles = np.minimum(g[:3], np.asarray(shape)[:, None])        # clipped L2 tiles
        tk = np.minimum(g[4], tiles[2])
        _, first = np.unique(np.stack([*tiles, g[3], tk]), axis=1, return_index=True)
        keep = np.sort(first)
        one = np.asarray(shape)[:, None] % tiles[:, keep] == 0.0    # (3, C') divides
        groups = []
        for pattern in sorted(set(map(tuple, one.T.tolist()))):
            sel = keep[np.all(one.T == np.asarray(pattern), axis=1)]
            groups.append((g[:, sel], tuple(bool(p) for p in pattern)))
        _STATIC_GROUPS[key] = (g, groups)           # keep the grid alive: its id stays unique
    return _STATIC_GROUPS[key][1]


def _static_search(dev, shapes, word):
    """Best mapping's cycle count of each static GEMM shape ``(m, n, k)`` (all ``>= 1``) of
    ``shapes``: ``{shape: cycles}`` (``+inf`` where no candidate fits).

    One search for all of them: the pruned candidates of every shape
    (:func:`_static_groups`) with the same class pattern are concatenated into one
    :func:`_candidate_cycles` call (the problem dimensions as per-candidate columns), so a
    layer's GEMMs compile into a few candidate loops; each shape's minimum is then taken
    over its own slices.
    """
    shapes = list(dict.fromkeys(tuple(float(x) for x in s) for s in shapes))
    by_pattern = {}                                  # pattern -> [(shape index, grid)]
    for i, shape in enumerate(shapes):
        for grid, one in _static_groups(*shape):
            by_pattern.setdefault(one, []).append((i, grid))
    best = [[] for _ in shapes]
    for one, parts in by_pattern.items():
        grid = np.concatenate([g for _, g in parts], axis=1)
        dims = np.concatenate([np.repeat(np.asarray(shapes[i])[:, None], g.shape[1], axis=1)
                               for i, g in parts], axis=1)
        cycles, mask = _candidate_cycles(dev, dims[0], dims[1], dims[2], word, grid, one)
        start = 0
        for i, g in parts:
            stop = start + g.shape[1]
            best[i].append(nx.masked_min(cycles[start:stop], mask[start:stop]))
            start = stop
    return {shape: functools.reduce(jnp.minimum, b) for shape, b in zip(shapes, best)}


def _tiled_cycles(dev, m, n, k, word, soft=None):
    """Best mapping's cycle count for one ``[m×k]·[k×n]`` GEMM (single config, scalar leaves).

    Returns ``(cycles, any_feasible)``; cycles is ``+inf`` when no candidate fits. With a
    static shape (Python numbers ``>= 1``) and the hard min, the search runs over the pruned,
    grouped grid of :func:`_static_groups` (same minimum; :func:`_static_search`).
    """
    if soft is None and _is_static(m, n, k) and min(m, n, k) >= 1:
        best = _static_search(dev, [(m, n, k)], word)[(float(m), float(n), float(k))]
        return best, jnp.isfinite(best)
    cycles, mask = _candidate_cycles(dev, m, n, k, word)
    if soft is None:
        best = nx.masked_min(cycles, mask)
    else:
        hard = jax.lax.stop_gradient(nx.masked_min(cycles, mask))
        temp = soft * jnp.where(jnp.isfinite(hard), hard, 1.0)
        best = nx.soft_min(jnp.where(mask, cycles, 0.0), mask, temp)
    return best, jnp.any(mask)


# ------------------------------------------------------------------------------------------
# Library-kernel bound: what a GPU BLAS kernel adds to the tile-level mapper.
# Each core (SM) computes whole CTA output tiles; CUTLASS/cuBLAS tile shapes in units of the
# systolic-array edge (16 on A100: 256×128 … 64×64), and split-K factors that cuBLAS's
# heuristics and stream-K choose from to fill the cores when there are few output tiles.
# ------------------------------------------------------------------------------------------
CTA_TILES = tuple(itertools.product((1.0, 2.0, 4.0, 8.0, 16.0), repeat=2))
SPLIT_K = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)
_CTA = np.asarray([(a, b, s) for a, b in CTA_TILES for s in SPLIT_K], dtype=np.float64).T
_ACC_BYTES = 4.0   # split-K partial sums are fp32 (cuBLAS/CUTLASS workspace)


def _library_seconds(dev, m, n, k, word):
    """Time a library GEMM kernel needs at least, s: CTA-tile and wave quantisation, split-K,
    sustained tensor-core efficiency and the weight-streaming (memory) bound.

    Sources: NVIDIA, "Matrix Multiplication Background User's Guide" (Deep Learning
    Performance docs), §"Tile quantization" and §"Wave quantization": an ``m×n`` output is
    computed as ``ceil(m/Tm)·ceil(n/Tn)`` whole tiles, one per SM at a time, in
    ``ceil(tiles / SMs)`` waves; Osama et al., "Stream-K: Work-centric Parallel
    Decomposition for Dense Matrix-Matrix Multiplication on the GPU" (PPoPP 2023), §2–3:
    splitting ``k`` in ``s`` parts multiplies the work units by ``s`` (so few-tile GEMMs —
    decode, 1–64 tokens — fill the SMs) at the cost of a fixup reduction of ``s`` fp32
    partial ``C`` tiles. Per configuration the best (tile, split) pair counts, as a library
    heuristic picks it:

    ``t = max(waves·(max(Tm·Tn·k_s / (MAC/cycle/core · f · η),
    (Tm + Tn)·k_s·word / (global-buffer BW / cores)) + t_wave),``  (``k_s = ceil(k/s)``: the
    second term is the operand stream of one core, which makes small tiles slow),
    (A + B + C + [s>1]·2·s·m·n·4 B) / (mem_bw · η_mem))``,
    ``waves = ceil(ceil(m/Tm)·ceil(n/Tn)·s / cores)``; ``η`` = ``dev.matmul_efficiency``
    (fraction of the peak tensor rate a kernel's main loop sustains, calibrated), ``η_mem``
    = ``dev.matmul_bw_efficiency`` (the fraction of peak bandwidth a GEMM's operand stream
    reaches, calibrated; 0 = ``mem_bw_efficiency``) and
    ``t_wave`` = ``dev.matmul_wave_latency_s`` (pipeline fill and epilogue of one wave,
    calibrated). Units: seconds.
    """
    freq, dram, l2bw, vec_core, cores = _rates(dev)
    arrays_ok = (dev.sa_rows > 0) & (dev.sa_cols > 0) & (dev.lanes_per_core > 0)
    edge = nx.sanitize(jnp.maximum(dev.sa_rows, dev.sa_cols), arrays_ok)  # double-where
    rate = dev.lanes_per_core * dev.sa_rows * dev.sa_cols * dev.sa_mac_per_cycle  # MAC/cycle
    rate = nx.sanitize(rate * freq * dev.matmul_efficiency,
                       (rate > 0) & (dev.matmul_efficiency > 0))                 # MAC/s/core
    c = _f(_CTA)
    Tm, Tn, s = c[0] * edge, c[1] * edge, c[2]
    tiles = _cdiv(m, Tm) * _cdiv(n, Tn)
    waves = _cdiv(tiles * s, cores)
    kk = _cdiv(k, s)
    # a core streams its tile's A and B slices from the global buffer at its share of the
    # global-buffer bandwidth: small tiles are operand-bandwidth bound
    per_tile = jnp.maximum(Tm * Tn * kk / rate, nx.safe_div((Tm + Tn) * kk * word * cores,
                                                            l2bw * freq, fill=jnp.inf))
    compute = waves * (per_tile + dev.matmul_wave_latency_s)
    # a tile spans at least one systolic-array edge per lane in each dimension (CUTLASS
    # arranges a CTA's warps in a grid over the tile; 64 on A100, the smallest M and N of
    # cuBLAS's sm80 tensor-core kernels). Where no tile of the set is that big (more than 16
    # lanes per core) the set cannot stand for the library's kernels: the compute side of the
    # bound is dropped and the operand stream alone bounds the kernel.
    big = jnp.minimum(Tm, Tn) >= dev.lanes_per_core * edge
    compute = jnp.where(big, compute, jnp.where(jnp.any(big), jnp.inf, 0.0))
    traffic = (m * k + k * n + m * n) * word + jnp.where(s > 1.0, 2.0 * s * m * n * _ACC_BYTES,
                                                         0.0)
    bw = dev.mem_bw * jnp.where(dev.matmul_bw_efficiency > 0, dev.matmul_bw_efficiency,
                                dev.mem_bw_efficiency)
    memory = nx.safe_div(traffic, bw, fill=jnp.inf)
    return jnp.where(arrays_ok, nx.min_of(jnp.maximum(compute, memory), axis=None), jnp.inf)


def _gemv_seconds(dev, m, n, k, word):
    """GEMV fast path (m == 1 or n == 1): vector units, max(compute, memory traffic).

    Source: LLMCompass ``Matmul.compile_and_simulate`` heuristic modes (notes §2).
    """
    flops = 2.0 * m * n * k
    io = (m * k + n * k + m * n) * word
    vec = nx.safe_div(flops, dev.peak_vector_flops, fill=jnp.inf)
    mem = nx.safe_div(io, dev.achievable_mem_bw, fill=jnp.inf)
    return jnp.maximum(vec, mem)


def gemm_parts(dev, m, n, k, word, soft=None, searched=None):
    """The three terms of one GEMM's time, s: ``(tile_s, library_s, gemv_s)``.

    ``tile_s``: the tile-level mapper; ``library_s``: the library-kernel bound
    (:func:`_library_seconds`); ``gemv_s``: the vector-unit path used when ``m`` or ``n`` is 1.
    The kernel time is ``gemv_s`` for a GEMV, else ``max(tile_s, library_s)``
    (:func:`combine_parts`). Exposed so that a calibration can vary the library constants
    without re-running the tile search. ``searched``: ``{(m, n, k): cycles}`` of static
    shapes already searched (:func:`_static_search`).
    """
    freq, *_ = _rates(dev)
    if searched is not None and (m, n, k) in searched:
        cycles = searched[(m, n, k)]
    else:
        cycles, _ = _tiled_cycles(dev, m, n, k, word, soft)
    fin = jnp.isfinite(cycles)                 # no tile fits: +inf, d/dfreq finite (double-where)
    tile_s = jnp.where(fin, jnp.where(fin, cycles, 0.0) / freq, jnp.inf)
    return (tile_s, _library_seconds(dev, m, n, k, word),
            _gemv_seconds(dev, m, n, k, word))


def combine_parts(m, n, tile_s, library_s, gemv_s):
    """One GEMM's time from :func:`gemm_parts`, s."""
    is_gemv = (m <= 1.0) | (n <= 1.0)
    return jnp.where(is_gemv, gemv_s, jnp.maximum(tile_s, library_s))


def _is_gemv(m, n):
    return m <= 1.0 or n <= 1.0


def _one_gemm_seconds(dev, m, n, k, word, soft, searched=None):
    if _is_static(m, n) and _is_gemv(m, n):      # a static GEMV: its path alone
        return _gemv_seconds(dev, m, n, k, word)
    return combine_parts(m, n, *gemm_parts(dev, m, n, k, word, soft, searched))


class GemmMode(NamedTuple):
    """How :func:`_gemm_single` times a kernel (static choices and the soft-min temperature).

    ``overhead``: ``True`` the eager per-call overhead, ``"kernel"`` the device-side floor,
    ``False`` none; ``soft``: ``None`` (hard min over mappings) or a relative temperature;
    ``merged``: also try LLMCompass's merged ``BatchedMatmul`` form when ``batch > 1``."""

    overhead: Any = True
    soft: Any = None
    merged: bool = True


def _gemm_single(dev, m, n, k, batch=1.0, dtype_bytes=2.0, mode: GemmMode = GemmMode(),
                 searched=None):
    """Single-config GEMM latency (see :func:`gemm_latency`) timed as ``mode`` says;
    ``searched``: the tile searches of static shapes already done (:func:`gemm_latencies`)."""
    overhead, soft, merged = mode
    ok = (device_feasible(dev) & (m > 0) & (n > 0) & (k > 0) & (batch > 0)
          & (dtype_bytes > 0))
    word = nx.sanitize(dtype_bytes, dtype_bytes > 0)
    if _is_static(m, n, k, batch) and min(m, n, k, batch) > 0:
        # a static shape stays static (pruned tile search, GEMV path alone)
        b, m_, n_, k_ = float(batch), float(m), float(n), float(k)
    else:
        b = nx.sanitize(batch, batch > 0)
        m_, n_, k_ = (nx.sanitize(x, x > 0) for x in (m, n, k))
    single = nx.weighted(b, _one_gemm_seconds(dev, m_, n_, k_, word, soft, searched))
    if merged:
        # LLMCompass BatchedMatmul: one [m, b·k]×[b·k, n] GEMM plus writing b−1 extra C's.
        fused = (_one_gemm_seconds(dev, m_, n_, b * k_, word, soft, searched)
                 + nx.safe_div((b - 1.0) * m_ * n_ * word, dev.achievable_mem_bw,
                               fill=jnp.inf))
        t = jnp.minimum(single, fused)
    else:
        t = single
    if overhead == "kernel":
        t = t + dev.matmul_kernel_overhead_s
    elif overhead:
        t = t + dev.matmul_overhead_s
    return jnp.where(ok, t, jnp.inf)


@batched
def _gemm_batched(dev, m, n, k, batch, dtype_bytes, mode):
    return _gemm_single(dev, m, n, k, batch, dtype_bytes, mode)


def _is_one(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def with_matrix_rate(dev, rate_scale):
    """``dev`` with its systolic throughput × ``rate_scale`` (dimensionless): a compute
    dtype's tensor-core rate relative to the 16-bit one (2 = FP8 on H100;
    :func:`jaxmodel.precisions.matrix_ratio`, which :func:`jaxmodel.precisions.scaled_device`
    applies by dtype code). ``rate_scale <= 0`` leaves no matrix rate: :func:`gemm_latency`
    rejects such a concrete device (``ValueError`` naming ``sa_mac_per_cycle``), a traced one
    gives ``+inf``.

    Example:
        >>> h100 = hw_db.device("h100_sxm")
        >>> fp8 = with_matrix_rate(h100, h100.matrix_ratio_fp8)
        >>> float(fp8.sa_mac_per_cycle / h100.sa_mac_per_cycle)
        2.0
    """
    if isinstance(rate_scale, (int, float)) and rate_scale == 1:
        return dev
    return dataclasses.replace(dev, sa_mac_per_cycle=dev.sa_mac_per_cycle * rate_scale)


def gemm_latency(dev, m, n, k, batch=1, dtype_bytes=2, overhead=True, soft=None):
    """Latency of one (batched) GEMM kernel ``[batch×m×k] @ [batch×k×n]``, seconds.

    LLMCompass tile-level mapper (LLMCompass §III-B1, notes §2): exhaustive search over a static
    grid of L2/L1/L0 tilings with double buffering, edge tiles, split-K and the closed-form
    systolic cycle count, bounded below by the library-kernel model (:func:`_library_seconds`:
    CTA tile and wave quantisation, split-K, main-loop efficiency, weight streaming); GEMV fast
    path for ``m == 1`` or ``n == 1``; for ``batch > 1`` the better of ``batch ×`` one GEMM and
    LLMCompass's merged ``BatchedMatmul`` form. Adds ``dev.matmul_overhead_s`` (per-call
    overhead of a PyTorch-eager kernel, host dispatch included) when ``overhead`` is true, or
    the device-side kernel floor ``dev.matmul_kernel_overhead_s`` when ``overhead="kernel"``
    (kernel timers, CUDA graphs). A compute dtype faster than 16 bits on the tensor cores is
    the device at that rate, :func:`with_matrix_rate`.

    Args:
        dev: :class:`jaxmodel.Device` (leaves may carry a batch axis).
        m, n, k: GEMM dimensions (floats; may be batched).
        batch: independent GEMMs in the kernel (attention heads × sequences).
        dtype_bytes: bytes per element (2 = fp16/bf16).
        overhead: ``True`` adds the eager per-call overhead, ``"kernel"`` the device-side
            kernel floor, ``False`` nothing.
        soft: ``None`` for the exact (hard) min over mappings, or a relative temperature
            (e.g. ``0.05``) for a smooth min whose gradient mixes near-optimal mappings.

    Returns:
        Seconds, with the broadcast batch shape of the inputs; ``+inf`` when infeasible
        (invalid device, no tile fits the buffers).

    Example:
        >>> t = gemm_latency(hw_db.device("a100_80gb"), 2048, 12288, 12288)
        >>> float(t)
        0.00228
    """
    validate_args(dev, where="gemm_latency")      # a concrete single device: clear errors
    return _gemm_batched(dev, m, n, k, batch, dtype_bytes,
                         GemmMode(_overhead_mode(overhead), soft, not _is_one(batch)))


def _overhead_mode(overhead):
    """``"kernel"`` stays a string (static); anything else becomes a bool."""
    return "kernel" if isinstance(overhead, str) and overhead == "kernel" else bool(overhead)


def _gemm_latency_single(dev, m, n, k, batch=1, dtype_bytes=2, overhead=True, soft=None):
    return _gemm_single(dev, m, n, k, batch, dtype_bytes,
                        GemmMode(_overhead_mode(overhead), soft, not _is_one(batch)))


gemm_latency.single = _gemm_latency_single


def gemm_latencies(dev, shapes, dtype_bytes=2.0, overhead=True):
    """Latencies of several GEMM kernels of static shapes on one configuration, s.

    ``shapes``: ``[(m, n, k, batch), ...]`` as Python numbers (> 0); each entry is timed as
    ``gemm_latency.single(dev, m, n, k, batch, dtype_bytes, overhead)`` (the merged
    ``BatchedMatmul`` alternative where ``batch != 1``), with every tile search of the list
    (the GEMMs and their merged forms, GEMVs excepted) done by one pruned search
    (:func:`_static_search`): same times, a fraction of the work. Single config (``dev``
    scalar leaves; ``dtype_bytes`` may be traced). Returns a list of times.
    """
    word = nx.sanitize(dtype_bytes, dtype_bytes > 0)
    shapes = [tuple(float(x) for x in s) for s in shapes]
    if not all(min(s) > 0 for s in shapes):
        raise ValueError(f"static GEMM shapes must be positive: {shapes}")
    wanted = [(m, n, kk) for m, n, k, b in shapes if not _is_gemv(m, n)
              for kk in ((k,) if b == 1.0 else (k, b * k))]
    searched = _static_search(dev, wanted, word) if wanted else {}
    mode = _overhead_mode(overhead)
    return [_gemm_single(dev, m, n, k, b, dtype_bytes, GemmMode(mode, None, b != 1.0), searched)
            for m, n, k, b in shapes]


@batched
def gemm_roofline(dev, m, n, k, batch=1, dtype_bytes=2):
    """Roofline GEMM time, seconds: ``max(FLOPs / peak, bytes / min(DRAM, L2 bandwidth))``.

    Source: LLMCompass ``Matmul.roofline_model`` (notes §2) with its element-vs-byte bug fixed:
    the memory term counts bytes (``dtype_bytes`` per element). No launch overhead.

    Example:
        >>> dev = hw_db.device("a100_80gb")
        >>> float(gemm_roofline(dev, 4096, 4096, 4096))   # 2·4096³ / 312e12 ≈ 4.4e-4 on A100
        0.00044
    """
    flops = 2.0 * batch * m * n * k
    io = batch * (m * k + k * n + m * n) * dtype_bytes
    bw = jnp.minimum(dev.achievable_mem_bw, dev.global_buffer_bw)
    ok = _device_ok(dev)
    t = jnp.maximum(nx.safe_div(flops, dev.peak_matrix_flops, fill=jnp.inf),
                    nx.safe_div(io, bw, fill=jnp.inf))
    return jnp.where(ok, t, jnp.inf)
