"""GEMM latency on one device: LLMCompass's tile-level mapper as a masked min over a static grid.

Source: LLMCompass (seed 003) §III-B1 and Fig. 4; the ``heuristic-GPU`` mapper and simulator of
``software_model/matmul.py`` as described in shared/notes/llmcompass_internals.md §2.

The problem ``C[m×n] = A[m×k]·B[k×n]`` is tiled three times:

1. **main memory → global buffer (L2 tile ``TM×TN×TK``).** Tiles are walked in LLMCompass's fixed
   ``knm`` loop order (``m`` innermost, so a ``B`` tile is reused across the ``m`` loop and the
   partial ``C`` tile is re-read for every ``k > 0``). One step costs
   ``max(read, compute) + write`` when the working set fits half of the global buffer (double
   buffering), else ``read + compute + write``. Transfers run at the achievable main-memory
   bandwidth ``mem_bw · mem_bw_efficiency``.
2. **global buffer → local buffer (L1 tile ``tm×tn×tk`` per core).** The L1 tiles of one L2 tile
   run in waves of ``core_count`` tiles; a wave costs ``max(read, compute) + C traffic``, reads
   de-duplicated inside the wave (merged accesses, paper Fig. 4 scheme 1) and charged at the
   global-buffer bandwidth; ``C`` stays in the cores across ``k`` when all ``(m, n)`` sub-tiles
   of the L2 tile fit one wave (read-after-write elision). L1 tiles are double buffered, so the
   working set must fit half the local buffer; ``tk`` is the largest power of two that fits.
3. **local buffer → lanes (L0).** The L1 tile is split over the ``lanes_per_core`` systolic arrays
   along ``m`` and/or ``n`` (``i·j = lanes``); cycles from :func:`systolic_cycles`, plus the vector
   unit accumulating partial sums when ``k`` is split.

Edge tiles: every dimension has ``ceil(d/T) − 1`` full tiles and one remainder tile, so an L2
candidate has 8 tile classes (full/edge in m, n, k) whose costs are summed with their counts
(closed form, no per-tile enumeration). Inside an L2 tile, edge L1 tiles cost as much as full
ones (a wave lasts as long as its slowest tile, as in LLMCompass).

The candidate grid is static (powers of two, clipped to the problem) and every candidate is
evaluated at once; infeasible ones (working set larger than the buffer) are masked with ``+inf``
and :func:`jaxmodel.numerics.masked_min` picks the best (or a soft-min for smooth co-design).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.systolic import systolic_cycles

# ------------------------------------------------------------------------------------------
# Static candidate grid (independent of the problem shape; clipped to it at run time).
# LLMCompass heuristic-GPU: l2_M ∈ {64..2048}, l2_N ∈ {M/2, M, 2M}, l2_K ≈ K/{1,2,4,8},
# l1_M = l1_N ∈ {32, 64, 128, 256}. Here l2_K is a power of two (clipped to K) so the grid
# does not depend on K; l1_K is not searched: the largest power of two that fits wins.
# ------------------------------------------------------------------------------------------
L2_M = (128.0, 256.0, 512.0, 1024.0, 2048.0)
L2_N_RATIO = (0.5, 1.0, 2.0)
L2_K = (256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)
L1_MN = (32.0, 64.0, 128.0, 256.0)
L0_SPLIT_M = (1.0, 2.0, 4.0)          # lanes along m; the rest (lanes / i) along n


def _build_grid():
    rows = []
    for tk, tm, r, t1 in itertools.product(L2_K, L2_M, L2_N_RATIO, L1_MN):
        tn = tm * r
        if t1 <= min(tm, tn):
            rows.append((tm, tn, tk, t1))
    return np.asarray(rows, dtype=np.float64).T


GRID = _build_grid()                  # (4, C): L2 m, L2 n, L2 k, L1 m=n
N_CANDIDATES = GRID.shape[1]

# The 8 L2 tile classes: 0 = full tile, 1 = remainder tile, per dimension (m, n, k).
_CLS = np.asarray(list(itertools.product((0, 1), repeat=3)), dtype=np.float64).T  # (3, 8)

# Smallest tiles the search ever needs (used by the device-level feasibility check).
MIN_L1_TILE = 32.0
MIN_L2_TILE = (128.0, 64.0, 256.0)


def _f(x):
    return jnp.asarray(x, dtype=jnp.result_type(float))


def _pow2_floor(x):
    """Largest power of two ≤ x (x ≥ 1), straight-through: exact value, zero gradient."""
    x = jnp.maximum(x, 1.0)
    return jax.lax.stop_gradient(2.0 ** jnp.floor(jnp.log2(x) + 1e-6))


def _rates(dev):
    """Per-cycle rates of a device (bytes/cycle, FLOP/cycle), sanitised against zeros."""
    ok = (dev.freq_hz > 0) & (dev.mem_bw > 0) & (dev.mem_bw_efficiency > 0)
    freq = nx.sanitize(dev.freq_hz, ok)
    dram = nx.sanitize(dev.mem_bw * dev.mem_bw_efficiency, ok) / freq   # bytes / cycle
    l2bw = nx.sanitize(dev.global_buffer_bytes_per_cycle,
                       dev.global_buffer_bytes_per_cycle > 0)
    vec_core = nx.sanitize(dev.lanes_per_core * dev.vector_width * dev.vector_flops_per_cycle,
                           dev.lanes_per_core * dev.vector_width * dev.vector_flops_per_cycle > 0)
    cores = nx.sanitize(dev.core_count, dev.core_count > 0)
    return freq, dram, l2bw, vec_core, cores


def _device_ok(dev):
    """True where every field the operator models divide by is positive."""
    fields = (dev.freq_hz, dev.core_count, dev.lanes_per_core, dev.vector_width,
              dev.vector_flops_per_cycle, dev.sa_rows, dev.sa_cols, dev.sa_mac_per_cycle,
              dev.local_buffer_bytes, dev.global_buffer_bytes, dev.global_buffer_bytes_per_cycle,
              dev.mem_bw, dev.mem_bw_efficiency, dev.exp_flops, dev.vector_dtype_bytes)
    ok = jnp.asarray(True)
    for x in fields:
        ok = ok & (x > 0) & jnp.isfinite(x)
    return ok


def _tiled_cycles(dev, m, n, k, word, soft=None):
    """Best mapping's cycle count for one ``[m×k]·[k×n]`` GEMM (single config, scalar leaves).

    Returns ``(cycles, any_feasible)``; cycles is ``+inf`` when no candidate fits.
    """
    freq, dram, l2bw, vec_core, cores = _rates(dev)
    lanes = nx.sanitize(dev.lanes_per_core, dev.lanes_per_core > 0)
    H = nx.sanitize(dev.sa_rows, dev.sa_rows > 0)
    W = nx.sanitize(dev.sa_cols, dev.sa_cols > 0)
    mac = nx.sanitize(dev.sa_mac_per_cycle, dev.sa_mac_per_cycle > 0)
    vec_chip = vec_core * cores
    m = jnp.maximum(m, 1.0)
    n = jnp.maximum(n, 1.0)
    k = jnp.maximum(k, 1.0)

    g = _f(GRID)
    # ---- L2 tile (clipped to the problem) ---------------------------------------------
    TM = jnp.minimum(g[0], m)
    TN = jnp.minimum(g[1], n)
    TK = jnp.minimum(g[2], k)
    ws2 = (TM * TN + TN * TK + TM * TK) * word
    fit2 = ws2 <= dev.global_buffer_bytes
    db2 = ws2 <= 0.5 * dev.global_buffer_bytes

    # ---- L1 tile: tm = tn from the grid (clipped), tk the largest power of two fitting ----
    tm = jnp.minimum(g[3], TM)
    tn = jnp.minimum(g[3], TN)
    room = 0.5 * dev.local_buffer_bytes / word - tm * tn        # elements left for A and B
    fit1 = room >= (tm + tn)                                    # at least tk = 1
    tk = jnp.minimum(_pow2_floor(nx.safe_div(room, tm + tn, fill=1.0)), TK)
    mask = fit1 & fit2

    # ---- per dimension: (full, remainder) sizes and counts --------------------------------
    def split(d, T):
        cnt = nx.ceil_div(d, T)
        rem = d - (cnt - 1.0) * T
        return cnt, rem

    nM, rM = split(m, TM)
    nN, rN = split(n, TN)
    nK, rK = split(k, TK)
    cls = _f(_CLS)
    c = lambda x: x[:, None]                                    # noqa: E731  (C,) -> (C, 1)
    dM = jnp.where(cls[0] == 0, c(TM), c(rM))                   # (C, 8)
    dN = jnp.where(cls[1] == 0, c(TN), c(rN))
    dK = jnp.where(cls[2] == 0, c(TK), c(rK))
    count = (jnp.where(cls[0] == 0, c(nM - 1.0), 1.0) * jnp.where(cls[1] == 0, c(nN - 1.0), 1.0)
             * jnp.where(cls[2] == 0, c(nK - 1.0), 1.0))
    frac_k = c(nx.safe_div(nK - 1.0, nK))                       # steps with a partial C read

    # ---- L1 level inside one L2 tile of each class ----------------------------------------
    aM = nx.ceil_div(dM, c(tm))
    aN = nx.ceil_div(dN, c(tn))
    aK = nx.ceil_div(dK, c(tk))
    em = jnp.minimum(c(tm), dM)
    en = jnp.minimum(c(tn), dN)
    ek = jnp.minimum(c(tk), dK)
    tiles = aM * aN * aK
    waves = nx.ceil_div(tiles, cores)
    # L0: lanes split along m (i) and n (lanes / i); best of the static options.
    sa = jnp.inf
    for i in L0_SPLIT_M:
        j = lanes / i
        ok = (j >= 1.0) & nx.is_integer(j)
        cyc = systolic_cycles(nx.ceil_div(em, i), nx.ceil_div(en, jnp.where(ok, j, 1.0)), ek,
                              H, W, mac)
        sa = jnp.minimum(sa, jnp.where(ok, cyc, jnp.inf))
    acc = jnp.where(aK > 1.0, em * en / vec_core, 0.0)
    wave_compute = sa + acc
    # Distinct sub-blocks one wave of P consecutive tiles (m fastest) touches.
    P = jnp.minimum(tiles, cores)
    um = jnp.minimum(aM, P)
    un = jnp.minimum(aN, nx.ceil_div(P, aM))
    uk = jnp.minimum(aK, nx.ceil_div(P, aM * aN))
    wave_read = word * uk * ek * (um * em + un * en) / l2bw
    c_resident = aM * aN <= cores
    wave_c = jnp.where(c_resident, 0.0, 2.0 * word * um * un * em * en / l2bw)
    l1_time = (waves * (jnp.maximum(wave_read, wave_compute) + wave_c)
               + wave_read + word * dM * dN / l2bw)
    # Split-K across L2 tiles: the vector unit adds the re-read partial C (LLMCompass).
    l1_time = l1_time + frac_k * (dM * dN / vec_chip + 2.0 * word * dM * dN / l2bw)

    # ---- L2 level: main memory <-> global buffer ------------------------------------------
    read = word * (dM * dK + dK * dN / c(nM) + frac_k * dM * dN) / dram
    write = word * dM * dN / dram
    step = jnp.where(c(db2), jnp.maximum(read, l1_time), read + l1_time) + write
    prologue = word * (TM * TK + TK * TN) / dram
    cycles = jnp.sum(count * step, axis=-1) + prologue          # (C,)

    cycles = jnp.where(mask, cycles, jnp.inf)
    if soft is None:
        best = nx.masked_min(cycles, mask)
    else:
        hard = jax.lax.stop_gradient(nx.masked_min(cycles, mask))
        temp = soft * jnp.where(jnp.isfinite(hard), hard, 1.0)
        best = nx.soft_min(jnp.where(mask, cycles, 0.0), mask, temp)
    return best, jnp.any(mask)


def _gemv_seconds(dev, m, n, k, word):
    """GEMV fast path (m == 1 or n == 1): vector units, max(compute, memory traffic).

    Source: LLMCompass ``Matmul.compile_and_simulate`` heuristic modes (notes §2).
    """
    flops = 2.0 * m * n * k
    io = (m * k + n * k + m * n) * word
    vec = nx.safe_div(flops, dev.peak_vector_flops, fill=jnp.inf)
    mem = nx.safe_div(io, dev.mem_bw * dev.mem_bw_efficiency, fill=jnp.inf)
    return jnp.maximum(vec, mem)


def _one_gemm_seconds(dev, m, n, k, word, soft):
    freq, *_ = _rates(dev)
    cycles, any_ok = _tiled_cycles(dev, m, n, k, word, soft)
    tiled = cycles / freq
    is_gemv = (m <= 1.0) | (n <= 1.0)
    return jnp.where(is_gemv, _gemv_seconds(dev, m, n, k, word), tiled)


def _gemm_single(dev, m, n, k, batch=1.0, dtype_bytes=2.0, overhead=True, soft=None,
                 merged=True):
    """Single-config GEMM latency (see :func:`gemm_latency`)."""
    ok = _device_ok(dev) & (m > 0) & (n > 0) & (k > 0) & (batch > 0) & (dtype_bytes > 0)
    word = nx.sanitize(dtype_bytes, dtype_bytes > 0)
    b = nx.sanitize(batch, batch > 0)
    m_, n_, k_ = (nx.sanitize(x, x > 0) for x in (m, n, k))
    single = b * _one_gemm_seconds(dev, m_, n_, k_, word, soft)
    if merged:
        # LLMCompass BatchedMatmul: one [m, b·k]×[b·k, n] GEMM plus writing b−1 extra C's.
        fused = (_one_gemm_seconds(dev, m_, n_, b * k_, word, soft)
                 + nx.safe_div((b - 1.0) * m_ * n_ * word, dev.mem_bw * dev.mem_bw_efficiency,
                               fill=jnp.inf))
        t = jnp.minimum(single, fused)
    else:
        t = single
    if overhead:
        t = t + dev.matmul_overhead_s
    return jnp.where(ok, t, jnp.inf)


@batched
def _gemm_batched(dev, m, n, k, batch, dtype_bytes, overhead, soft, merged):
    return _gemm_single(dev, m, n, k, batch, dtype_bytes, overhead, soft, merged)


def _is_one(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 1


def gemm_latency(dev, m, n, k, batch=1, dtype_bytes=2, overhead=True, soft=None):
    """Latency of one (batched) GEMM kernel ``[batch×m×k] @ [batch×k×n]``, seconds.

    LLMCompass tile-level mapper (seed 003 §III-B1, notes §2): exhaustive search over a static
    grid of L2/L1/L0 tilings with double buffering, edge tiles, split-K and the closed-form
    systolic cycle count; GEMV fast path for ``m == 1`` or ``n == 1``; for ``batch > 1`` the
    better of ``batch ×`` one GEMM and LLMCompass's merged ``BatchedMatmul`` form. Adds
    ``dev.matmul_overhead_s`` (per-kernel launch overhead) when ``overhead``.

    Args:
        dev: :class:`jaxmodel.Device` (leaves may carry a batch axis).
        m, n, k: GEMM dimensions (floats; may be batched).
        batch: independent GEMMs in the kernel (attention heads × sequences).
        dtype_bytes: bytes per element (2 = fp16/bf16).
        overhead: add the per-kernel overhead.
        soft: ``None`` for the exact (hard) min over mappings, or a relative temperature
            (e.g. ``0.05``) for a smooth min whose gradient mixes near-optimal mappings.

    Returns:
        Seconds, with the broadcast batch shape of the inputs; ``+inf`` when infeasible
        (invalid device, no tile fits the buffers).

    Example:
        >>> t = gemm_latency(hw_db.device("a100_80gb"), 2048, 12288, 12288)   # ≈ 2.3e-3
    """
    return _gemm_batched(dev, m, n, k, batch, dtype_bytes, bool(overhead), soft,
                         not _is_one(batch))


def _gemm_latency_single(dev, m, n, k, batch=1, dtype_bytes=2, overhead=True, soft=None):
    return _gemm_single(dev, m, n, k, batch, dtype_bytes, overhead, soft, not _is_one(batch))


gemm_latency.single = _gemm_latency_single


@batched
def gemm_roofline(dev, m, n, k, batch=1, dtype_bytes=2):
    """Roofline GEMM time, seconds: ``max(FLOPs / peak, bytes / min(DRAM, L2 bandwidth))``.

    Source: LLMCompass ``Matmul.roofline_model`` (notes §2) with its element-vs-byte bug fixed:
    the memory term counts bytes (``dtype_bytes`` per element). No launch overhead.

    Example:
        >>> gemm_roofline(dev, 4096, 4096, 4096)    # 2·4096³ / 312e12 ≈ 4.4e-4 on A100
    """
    flops = 2.0 * batch * m * n * k
    io = batch * (m * k + k * n + m * n) * dtype_bytes
    bw = jnp.minimum(dev.mem_bw * dev.mem_bw_efficiency, dev.global_buffer_bw)
    ok = _device_ok(dev)
    t = jnp.maximum(nx.safe_div(flops, dev.peak_matrix_flops, fill=jnp.inf),
                    nx.safe_div(io, bw, fill=jnp.inf))
    return jnp.where(ok, t, jnp.inf)
