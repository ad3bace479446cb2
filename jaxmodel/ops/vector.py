"""Vector-unit operators on one device: softmax, layernorm, GELU, a generic elementwise kernel,
and the fused memory-bound kernels of Llama-family layers (RMSNorm, RoPE, SiLU·mul, residual
add, embedding lookup).

Source: LLMCompass §III-B3 "Other Operators" and ``software_model/{softmax,
layernorm,gelu}.py`` as described in. They run on the
vector units only; data move main memory → global buffer → local buffer like the GEMM, with a
small static search (softmax) or a closed-form tiling (layernorm, GELU). Element size is the
vector unit's (``dev.vector_dtype_bytes``: fp16 on A100, fp32 on MI210/TPUv3), as LLMCompass
forces it. Each adds its per-kernel overhead (``dev.<op>_overhead_s``) when ``overhead``.
"""

from __future__ import annotations

import functools
import itertools

import jax.numpy as jnp
import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.gemm import _f, _rates, device_feasible
from jaxmodel.types import validate_args

SOFTMAX_SPLITS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
SOFTMAX_L1_ROWS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
_SM_GRID = np.asarray(list(itertools.product(SOFTMAX_SPLITS, SOFTMAX_L1_ROWS, (0.0, 1.0))),
                      dtype=np.float64).T                      # (3, 108): splits, rows, dbuf



def _validated(fn):
    """A public operator that first checks a concrete single device (the API edge:
    :func:`jaxmodel.types.validate_args`, a ``ValueError`` naming the field and value, as
    :func:`jaxmodel.gemm_latency` does); batches and traced devices pass unchecked (infeasible
    points give ``+inf``). ``.single`` stays the raw single-configuration function."""
    @functools.wraps(fn)
    def wrapper(dev, *args, **kwargs):
        validate_args(dev, where=fn.__name__)
        return fn(dev, *args, **kwargs)
    return wrapper

def _row_op_inputs(dev, rows, cols):
    """``(ok, word, M, N)`` of a row-wise vector operator on ``[rows × cols]`` (single config):
    ``ok`` where the device is feasible and both dimensions positive; the vector word size,
    rows and columns sanitised (double-where) for the formulas."""
    ok = device_feasible(dev) & (rows > 0) & (cols > 0)
    word = nx.sanitize(dev.vector_dtype_bytes, dev.vector_dtype_bytes > 0)
    return ok, word, nx.sanitize(rows, rows > 0), nx.sanitize(cols, cols > 0)


def _softmax_single(dev, rows, cols, overhead=True):
    ok, word, M, N = _row_op_inputs(dev, rows, cols)
    freq, dram, l2bw, vec_core, cores = _rates(dev)
    exp = dev.exp_flops
    # L2 tile: full rows, as many as fit the global buffer.
    r2 = jnp.clip(jnp.floor(nx.safe_div(dev.global_buffer_bytes, N * word)), 1.0, M)
    n2 = nx.ceil_div(M, r2)
    rem = M - (n2 - 1.0) * r2

    g = _f(_SM_GRID)
    # Rows too wide for 32 chunks in the local buffer: one more candidate, one row split in
    # the smallest power of two of chunks that fits (single buffered), as the layernorm
    # model splits; it is used only where no candidate of the grid fits.
    need = jnp.maximum(nx.safe_div(N * word, dev.local_buffer_bytes, fill=1.0), 1.0)
    wide = 2.0 ** jnp.ceil(jnp.log2(need))
    wide = jnp.where(N / wide * word <= dev.local_buffer_bytes, wide, 2.0 * wide)  # rounding
    split = jnp.concatenate([g[0], wide[None]])
    l1_rows = jnp.concatenate([g[1], jnp.ones((1,), g.dtype)])
    dbuf = jnp.concatenate([g[2], jnp.zeros((1,), g.dtype)])
    n1 = jnp.maximum(N / split, 1.0)                             # L1 tile columns
    fits = ((l1_rows * n1 * word * (1.0 + dbuf) <= dev.local_buffer_bytes)
            & jnp.append(g[0] <= N, True))
    fits = fits.at[-1].set(fits[-1] & ~jnp.any(fits[:-1]))

    def l2_tile(r):                                              # r rows, (C,) cycles
        m1 = jnp.minimum(l1_rows, r)
        elems = m1 * n1
        compute = elems * (3.0 * exp + 7.0) / vec_core
        io = elems * word / l2bw                                 # read = write
        reduction = elems * (exp + 2.0) / vec_core + 2.0 * elems * word * cores / l2bw
        l1 = jnp.where(dbuf > 0, jnp.maximum(2.0 * io, compute), 2.0 * io + compute)
        l1 = l1 + jnp.log2(split) * reduction
        tiles = nx.ceil_div(r, m1) * split
        return (r * N * word / dram + (nx.ceil_div(tiles, cores) + 1.0) * l1
                + r * N * word / dram)

    cyc = (n2 - 1.0) * l2_tile(r2) + l2_tile(rem)
    best = nx.masked_min(cyc, fits)
    fin = jnp.isfinite(best)                  # no tile fits: +inf, d/dfreq finite (double-where)
    t = jnp.where(fin, jnp.where(fin, best, 0.0) / freq, jnp.inf)
    if overhead:
        t = t + dev.softmax_overhead_s
    return jnp.where(ok & ~jnp.isnan(t), t, jnp.inf)


@_validated
@batched
def softmax_latency(dev, rows, cols, overhead=True):
    """Softmax over the last axis of a ``[rows × cols]`` tensor, seconds.

    LLMCompass online softmax (LLMCompass §III-B3, notes §2): full-row L2 tiles; a search over the
    column split (1–32), L1 rows (1–256) and L1 double buffering (a row too wide for 32
    chunks is split in the smallest power of two of chunks that fits); per L1 tile
    ``compute = elems·(3·exp + 7) / core vector FLOP/cycle``, read and write at the global-buffer
    bandwidth, ``log2(splits)`` partial-row reductions; per L2 tile
    ``DRAM read + (ceil(L1 tiles / cores) + 1)·L1 step + DRAM write`` without overlap.

    Example:
        >>> softmax_latency(hw_db.device("a100_80gb"), 4096, 4096)
        Array(7.54e-05, dtype=...)
    """
    return _softmax_single(dev, rows, cols, overhead)


softmax_latency.single = _softmax_single


def _layernorm_single(dev, rows, cols, overhead=True):
    ok, word, M, N = _row_op_inputs(dev, rows, cols)
    freq, dram, l2bw, vec_core, cores = _rates(dev)
    lanes = nx.sanitize(dev.lanes_per_core, dev.lanes_per_core > 0)
    width = nx.sanitize(dev.vector_width, dev.vector_width > 0)
    fpc = nx.sanitize(dev.vector_flops_per_cycle, dev.vector_flops_per_cycle > 0)
    half_l1 = 0.5 * dev.local_buffer_bytes / word                # elements
    # L2 tile: full rows filling half the global buffer.
    r2 = jnp.clip(jnp.floor(nx.safe_div(0.5 * dev.global_buffer_bytes, N * word)), 1.0, M)
    n2 = nx.ceil_div(M, r2)
    rem = M - (n2 - 1.0) * r2
    # L1 tile: full rows in half the local buffer; N halved until >= `lanes` rows fit.
    need = nx.safe_div(lanes * N, half_l1, fill=1.0)
    split = jnp.where(need > 1.0, 2.0 ** jnp.ceil(jnp.log2(jnp.maximum(need, 1.0)) - 1e-6),
                      1.0)
    n1 = N / split
    rows_fit = jnp.maximum(jnp.floor(nx.safe_div(half_l1, n1)), 1.0)

    def l2_tile(r):
        m1 = jnp.minimum(rows_fit, r)
        passes = nx.ceil_div(n1 / width * m1 / lanes, fpc)
        compute = 7.0 * passes + 2.0 * jnp.log2(width)
        io = 4.0 * m1 * n1 * word / l2bw
        # A split row is normalised only once its statistics are complete: the chunk is read
        # again at the core's share of the global-buffer bandwidth, and the partial
        # statistics pass a reduction tree.
        reduction = m1 * n1 * word * cores / l2bw + 2.0 * jnp.log2(width)
        tiles = nx.ceil_div(r, m1) * split
        return (2.0 * r * N * word / dram
                + nx.ceil_div(tiles, cores) * (compute + io + (split - 1.0) * reduction))

    cyc = (n2 - 1.0) * l2_tile(r2) + l2_tile(rem)
    fin = jnp.isfinite(cyc)
    t = jnp.where(fin, jnp.where(fin, cyc, 0.0) / freq, jnp.inf)
    if overhead:
        t = t + dev.layernorm_overhead_s
    return jnp.where(ok & ~jnp.isnan(t), t, jnp.inf)   # overflow of absurd fields: +inf


@_validated
@batched
def layernorm_latency(dev, rows, cols, overhead=True):
    """LayerNorm over the last axis of a ``[rows × cols]`` tensor, seconds.

    LLMCompass: L2 tiles of full rows filling half the global
    buffer; L1 tiles of full rows filling half the local buffer, the row split in halves until
    at least ``lanes_per_core`` rows fit; 7 vector passes (mean 1, variance 2, normalise 4) plus
    ``2·log2(width)`` reduction-tree cycles, 3 reads + 1 write at global-buffer bandwidth; each
    extra column split costs one re-read of the chunk at the core's share of the global-buffer
    bandwidth plus a reduction tree (our reading of LLMCompass's split reduction); per L2 tile
    ``DRAM read + waves·L1 + DRAM write``, without overlap.

    Example:
        >>> layernorm_latency(hw_db.device("a100_80gb"), 4096, 12288)
        Array(0.000166, dtype=...)
    """
    return _layernorm_single(dev, rows, cols, overhead)


layernorm_latency.single = _layernorm_single


def _gelu_single(dev, n, overhead=True):
    ok = device_feasible(dev) & (n > 0)
    word = nx.sanitize(dev.vector_dtype_bytes, dev.vector_dtype_bytes > 0)
    n_ = nx.sanitize(n, n > 0)
    lanes_total = dev.core_count * dev.lanes_per_core * dev.vector_width
    padded = nx.ceil_div(n_, nx.sanitize(lanes_total, lanes_total > 0)) * lanes_total
    # A streaming kernel overlaps its main-memory and global-buffer traffic (LLMCompass adds
    # them, which double-charges a TPU's HBM and under-rates GPUs' achievable bandwidth).
    io = jnp.maximum(
        nx.safe_div(2.0 * padded * word, dev.achievable_mem_bw, fill=jnp.inf),
        nx.safe_div(2.0 * padded * word, dev.global_buffer_bw, fill=jnp.inf))
    compute = nx.safe_div(padded * (10.0 + dev.exp_flops), dev.peak_vector_flops, fill=jnp.inf)
    t = jnp.maximum(io, compute)
    if overhead:
        t = t + dev.gelu_overhead_s
    return jnp.where(ok & ~jnp.isnan(t), t, jnp.inf)   # overflow of absurd fields: +inf


@_validated
@batched
def gelu_latency(dev, n, overhead=True):
    """Tanh-approximate GELU over ``n`` elements, seconds.

    LLMCompass: ``n`` padded to a multiple of all vector lanes;
    ``io = max(2·n·word / achievable DRAM BW, 2·n·word / global-buffer BW)`` (LLMCompass sums
    the two; a streaming kernel overlaps them), ``compute = n·(10 + exp) / vector FLOP/s``,
    latency ``max(io, compute)``.

    Example:
        >>> gelu_latency(hw_db.device("a100_80gb"), 2**24)
        Array(8.46e-05, dtype=...)
    """
    return _gelu_single(dev, n, overhead)


gelu_latency.single = _gelu_single


def _elementwise_single(dev, n_elements, bytes_per_element_moved, flops_per_element,
                        overhead=True):
    ok = device_feasible(dev) & (n_elements >= 0)
    n = jnp.maximum(n_elements, 0.0)
    mem = nx.safe_div(n * bytes_per_element_moved, dev.achievable_mem_bw,
                      fill=jnp.inf)
    compute = nx.safe_div(n * flops_per_element, dev.peak_vector_flops, fill=jnp.inf)
    t = jnp.maximum(mem, compute)
    if overhead:
        t = t + dev.gelu_overhead_s
    return jnp.where(ok, t, jnp.inf)


@_validated
@batched
def elementwise_latency(dev, n_elements, bytes_per_element_moved, flops_per_element,
                        overhead=True):
    """A generic memory/vector-bound kernel (residual add, dropout, optimizer step), seconds.

    Roofline of one streaming kernel: ``max(n·bytes / achievable DRAM BW, n·flops / vector
    FLOP/s)`` — the GELU model of LLMCompass (notes §2) without its global-buffer term, which a
    streaming kernel overlaps. The per-kernel overhead is ``dev.gelu_overhead_s``: GELU is the
    one elementwise kernel whose launch floor is measured (LLMCompass anchors), and it stands
    for any single-pass elementwise kernel.

    Args:
        n_elements: elements processed.
        bytes_per_element_moved: main-memory bytes per element, reads + writes (e.g. a bf16
            residual add: 2 reads + 1 write = 6).
        flops_per_element: vector FLOP per element.

    Example:
        >>> dev = hw_db.device("a100_80gb")
        >>> float(elementwise_latency(dev, 8 * 2048 * 12288, 6.0, 1.0))
        0.00072
    """
    return _elementwise_single(dev, n_elements, bytes_per_element_moved, flops_per_element,
                               overhead)


elementwise_latency.single = _elementwise_single


# --------------------------------------------------------------------------------------------
# Fused memory-bound kernels of Llama-family decoder layers
# --------------------------------------------------------------------------------------------
ROW_BLOCK_THREADS = 1024.0   # vLLM's per-token kernels: blockDim = min(cols, 1024)
CORE_THREADS = 2048.0        # resident threads per SM (A100/H100; NVIDIA CUDA C Programming
                             # Guide, "Compute Capabilities" table)
_BLOCKS_PER_CORE = max(CORE_THREADS // ROW_BLOCK_THREADS, 1.0)   # resident row blocks


def _row_chain_seconds(dev, rows, serial_loads):
    """Latency chain of a kernel with one thread block per row, s.

    Each thread of a row's block walks its share of the row in ``serial_loads`` dependent
    global-memory round trips (``dev.mem_latency_s`` each); ``CORE_THREADS / block`` blocks are
    resident per core, so rows run in ``ceil(rows / (cores · blocks per core))`` waves. With
    few rows (decode) this chain, not the bandwidth, sets the time: Little's law, too few bytes
    in flight (Volkov, "Understanding Latency Hiding on GPUs", UC Berkeley PhD thesis 2016).
    """
    waves = nx.ceil_div(jnp.maximum(rows, 0.0), dev.core_count * _BLOCKS_PER_CORE)
    return waves * serial_loads * dev.mem_latency_s


def floor_combine(t, floor):
    """A kernel's body time ``t`` and its family floor combined in quadrature,
    ``sqrt(t² + floor²)``, s: equal to the floor for tiny kernels, to ``t`` for large ones,
    and between full overlap (``max``) and none (sum) where both are comparable.

    The quadrature (a 2-norm) is a modelling choice, fixed for every kernel family and device,
    not fitted per family: on the A100 kernel anchors (``experiments/calibrate.py``; 2-norm
    against 1, 3, 4, 6 and ∞ = ``max``) it beats ``max`` in sample and cross-validated by
    token band for RoPE, SiLU·mul, the residual add and the embedding and ties for RMSNorm;
    the sum (1-norm) is better for SiLU·mul only, worse for the others, because the measured times bend smoothly from the floor into the bandwidth line (add:
    2.0, 2.25, 3, 4 µs at 0.7, 1.5, 3, 6 MB, where ``max`` gives 2, 2, 2, 3.5 µs). ``+inf``
    passes through; the gradient is finite at ``t = floor = 0`` (double-where)."""
    fin = jnp.isfinite(t)
    tt = jnp.where(fin, t, 0.0)
    sq = tt * tt + floor * floor
    pos = sq > 0
    out = jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)
    return jnp.where(fin, out, jnp.inf)


def resident_bytes(dev, reused_bytes, footprint_bytes):
    """Bytes of a kernel's inputs read from the global buffer (L2) instead of main memory, B.

    The inputs the previous kernel produced (``reused_bytes``) are still in the L2 where
    they fit: a share ``min(1, C_eff / footprint)`` of them, ``footprint`` the kernel's
    distinct bytes (inputs and outputs) competing for the cache, ``C_eff =
    dev.global_buffer_reuse_fraction · dev.global_buffer_bytes`` the capacity that holds them
    when the kernel starts (a calibration constant, below one: the A100's L2 is two
    partitions, each caching the accesses of the SMs wired to it, so data read by every SM
    may sit in both; NVIDIA A100 Tensor Core GPU Architecture whitepaper, "L2 Cache and
    Memory Subsystem"; Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth",
    2023, measure the same split on A100 and H100). Outputs are charged to main memory in
    full: the L2 is write-back (Jia et al., "Dissecting the NVIDIA Volta GPU Architecture via
    Microbenchmarking", 2018, §3), so every written line is written back once to HBM, inside
    a stream of kernels as in one kernel. 0 where either size is not positive or the
    fraction is 0."""
    cap = jnp.maximum(dev.global_buffer_reuse_fraction, 0.0) * dev.global_buffer_bytes
    share = jnp.minimum(nx.safe_div(cap, footprint_bytes, fill=0.0), 1.0)
    return jnp.maximum(reused_bytes, 0.0) * share


def _stream_seconds(dev, nbytes, flops, family: str, overhead=True, chain_s=0.0,
                    reused_bytes=0.0, footprint_bytes=0.0):
    """One memory-bound kernel: ``floor_combine(max(transfer, flops / vector FLOP/s,
    chain_s), floor_f)``, s, with ``transfer = (bytes − r) / (mem_bw · η_f) + r / L2 BW``.

    ``r`` (:func:`resident_bytes`): the share of the ``reused_bytes`` inputs still in the
    global buffer (L2) for a kernel of ``footprint_bytes`` distinct bytes, read at the
    global-buffer bandwidth ``dev.global_buffer_bw`` (the L2 bandwidth; 5,120 B/cycle on A100
    in LLMCompass's preset) instead of main memory; ``r = 0`` (all bytes from main memory)
    where ``dev.global_buffer_reuse_fraction`` is 0.

    ``family`` names the kernel family whose device fields apply: ``η_f`` =
    ``dev.<family>_bw_efficiency``, ``floor_f`` = ``dev.<family>_overhead_s``.

    ``floor_f`` is the family's shortest kernel duration (launch, one memory
    round trip, the block reductions of one wave of thread blocks), measured by kernel timers;
    it partly overlaps the kernel's own transfers (:func:`floor_combine`): the measured times
    stay near it until the data take longer (e.g. RMSNorm on A100: 5 µs from 1 to ~200
    tokens of 4096, then linear in the bytes).

    ``η_f`` is the kernel family's achieved fraction of peak bandwidth (a calibration constant:
    a kernel with one block per token and scalar 2-byte loads keeps fewer bytes in flight than
    a vectorised streaming kernel, so it reaches less of the bandwidth; Little's law, see
    Volkov, "Understanding Latency Hiding on GPUs", UC Berkeley PhD thesis 2016, ch. 4);
    ``η_f = 0`` means the device's ``mem_bw_efficiency``. Roofline after Williams et al.,
    "Roofline" (CACM 2009). ``chain_s``: the latency chain of per-row kernels
    (:func:`_row_chain_seconds`), a third lower bound.
    """
    ok = device_feasible(dev) & (nbytes >= 0) & (flops >= 0)
    bw_efficiency = getattr(dev, f"{family}_bw_efficiency")
    eff = jnp.where(bw_efficiency > 0, bw_efficiency, dev.mem_bw_efficiency)
    nb = jnp.maximum(nbytes, 0.0)
    res = jnp.minimum(resident_bytes(dev, reused_bytes, footprint_bytes), nb)
    mem = (nx.safe_div(nb - res, dev.mem_bw * eff, fill=jnp.inf)
           + nx.safe_div(res, dev.global_buffer_bw, fill=0.0))
    compute = nx.safe_div(jnp.maximum(flops, 0.0), dev.peak_vector_flops, fill=jnp.inf)
    t = jnp.maximum(jnp.maximum(mem, compute), chain_s)
    if overhead:
        t = floor_combine(t, getattr(dev, f"{family}_overhead_s"))
    return jnp.where(ok, t, jnp.inf)


RMSNORM_FLOPS = 4.0     # x², accumulate, ·rsqrt, ·weight per element


def _rmsnorm_single(dev, rows, cols, dtype_bytes=2.0, overhead=True):
    n = jnp.maximum(rows, 0.0) * jnp.maximum(cols, 0.0)
    nbytes = (3.0 * n + cols) * dtype_bytes
    chain = _row_chain_seconds(dev, rows, 2.0 * nx.ceil_div(cols, ROW_BLOCK_THREADS))
    t = _stream_seconds(dev, nbytes, RMSNORM_FLOPS * n, "rmsnorm", overhead, chain)
    return jnp.where((rows > 0) & (cols > 0), t, jnp.inf)


@_validated
@batched
def rmsnorm_latency(dev, rows, cols, dtype_bytes=2, overhead=True):
    """RMSNorm over the last axis of ``[rows × cols]`` (Zhang & Sennrich, "Root Mean Square
    Layer Normalization", NeurIPS 2019: ``y = x / sqrt(mean(x²) + ε) · g``), seconds.

    Kernel modelled: vLLM's ``rms_norm_kernel`` (``csrc/layernorm_kernels.cu``, the kernel
    Sarathi-Serve and vLLM serve Llama models with): one thread block per row, a first pass
    reading ``x`` to accumulate ``Σx²``, a block reduction, a second pass reading ``x`` and
    the weight and writing ``y``. Bytes: ``(3·rows·cols + cols)·word`` (two reads and one
    write per element, the weight once); FLOP: 4 per element; latency chain
    ``2·ceil(cols / 1024)`` loads per thread (:func:`_row_chain_seconds`). Memory-bound
    (:func:`_stream_seconds` with ``dev.rmsnorm_bw_efficiency``), at least
    ``dev.rmsnorm_overhead_s``.

    Example:
        >>> rmsnorm_latency(hw_db.device("a100_80gb"), 4096, 4096)
        Array(9.49e-05, dtype=...)
    """
    return _rmsnorm_single(dev, rows, cols, dtype_bytes, overhead)


rmsnorm_latency.single = _rmsnorm_single

ROPE_FLOPS = 3.0        # x·cos − y·sin (or x·sin + y·cos): 2 multiplies + 1 add per element
ROPE_BLOCK_THREADS = 512.0   # vLLM rotary_embedding: blockDim = min(pairs, 512)


def _rope_single(dev, tokens, heads, kv_heads, head_dim, dtype_bytes=2.0, overhead=True):
    tok = jnp.maximum(tokens, 0.0)
    n = tok * (jnp.maximum(heads, 0.0) + jnp.maximum(kv_heads, 0.0)) * head_dim
    nbytes = (2.0 * n + tok * head_dim) * dtype_bytes
    pairs = 0.5 * (jnp.maximum(heads, 0.0) + jnp.maximum(kv_heads, 0.0)) * head_dim
    chain = _row_chain_seconds(dev, tok, nx.ceil_div(pairs, ROPE_BLOCK_THREADS))
    t = _stream_seconds(dev, nbytes, ROPE_FLOPS * n, "rope", overhead, chain)
    return jnp.where((tokens > 0) & (heads > 0) & (head_dim > 0) & (kv_heads >= 0), t, jnp.inf)


@_validated
@batched
def rope_latency(dev, tokens, heads, kv_heads, head_dim, dtype_bytes=2, overhead=True):
    """Rotary position embedding of the query and key heads (Su et al., "RoFormer", 2021,
    eq. 34), in place, seconds.

    Kernel modelled: vLLM's ``rotary_embedding_kernel`` (``csrc/pos_encoding_kernels.cu``):
    one block per token rotating every (x, y) pair of its ``heads + kv_heads`` query and key
    heads in place, cos/sin read from a ``[positions, head_dim]`` cache. Bytes:
    ``(2·tokens·(heads + kv_heads)·head_dim + tokens·head_dim)·word`` (read and write q and k,
    read one cos/sin row per token); FLOP: 3 per element; latency chain
    ``ceil(pairs / 512)`` per thread (:func:`_row_chain_seconds`). Memory-bound
    (``dev.rope_bw_efficiency``), at least ``dev.rope_overhead_s``.

    Example:
        >>> rope_latency(hw_db.device("a100_80gb"), 4096, 32, 8, 128)
        Array(9.69e-05, dtype=...)
    """
    return _rope_single(dev, tokens, heads, kv_heads, head_dim, dtype_bytes, overhead)


rope_latency.single = _rope_single


def _silu_mul_single(dev, n, dtype_bytes=2.0, overhead=True, rows=None):
    n_ = jnp.maximum(n, 0.0)
    if rows is None:
        chain = 0.0
    else:
        cols = nx.safe_div(n_, rows, fill=0.0)
        chain = _row_chain_seconds(dev, rows, nx.ceil_div(cols, ROW_BLOCK_THREADS))
    t = _stream_seconds(dev, 3.0 * n_ * dtype_bytes, (dev.exp_flops + 5.0) * n_,
                        "silu_mul", overhead, chain)
    return jnp.where(n > 0, t, jnp.inf)


@_validated
@batched
def silu_mul_latency(dev, n, dtype_bytes=2, overhead=True, rows=None):
    """SwiGLU activation ``silu(gate)·up`` over ``n`` output elements (Shazeer, "GLU Variants
    Improve Transformer", 2020, eq. 6), seconds.

    Kernel modelled: vLLM's ``silu_and_mul_kernel`` (``csrc/activation_kernels.cu``): one
    block per token reading the gate and up halves of the fused ``[tokens, 2·d_ff]`` GEMM
    output and writing ``[tokens, d_ff]``. Bytes ``3·n·word``; FLOP ``exp + 5`` per element
    (sigmoid: negate, exp, add, divide; two multiplies). With ``rows`` (tokens) given, the
    per-row latency chain (:func:`_row_chain_seconds`, ``ceil(d_ff / 1024)`` loads per thread)
    bounds it too. Memory-bound
    (``dev.silu_mul_bw_efficiency``), at least ``dev.silu_mul_overhead_s``.

    Example:
        >>> silu_mul_latency(hw_db.device("a100_80gb"), 4096 * 11008)
        Array(0.000276, dtype=...)
    """
    return _silu_mul_single(dev, n, dtype_bytes, overhead, rows)


silu_mul_latency.single = _silu_mul_single


def _add_single(dev, n, dtype_bytes=2.0, overhead=True):
    n_ = jnp.maximum(n, 0.0)
    t = _stream_seconds(dev, 3.0 * n_ * dtype_bytes, n_, "add", overhead, 0.0, n_ * dtype_bytes,
                        3.0 * n_ * dtype_bytes)
    return jnp.where(n > 0, t, jnp.inf)


@_validated
@batched
def add_latency(dev, n, dtype_bytes=2, overhead=True):
    """Residual add ``y = a + b`` over ``n`` elements, seconds.

    Kernel modelled: PyTorch's ``vectorized_elementwise_kernel`` (ATen
    ``native/cuda/CUDALoops.cuh``): vectorised loads of both inputs, one store. Bytes
    ``3·n·word``, 1 FLOP per element; memory-bound (``dev.add_bw_efficiency``), at least
    ``dev.add_overhead_s``. One input, the sublayer output the kernel before it wrote
    (``n·word`` of a ``3·n·word`` footprint), is read from the L2 where it is still resident
    (:func:`resident_bytes`, ``dev.global_buffer_reuse_fraction``); the residual stream was
    written a whole sublayer earlier and comes from main memory. On the A100 kernel anchors
    the adds reach 2.1 TB/s, above the 2.04 TB/s HBM peak, at 16–32 MB footprints and
    1.7 TB/s above 256 MB: the signature of this reuse (``experiments/calibrate.py``). The
    per-row kernels (RMSNorm, RoPE, SiLU·mul) read their inputs from main memory: their
    achieved bandwidth rises monotonically with the footprint on the same anchors, and the
    same reuse worsens their fit there.

    Example:
        >>> add_latency(hw_db.device("a100_80gb"), 4096 * 4096)
        Array(5.57e-05, dtype=...)
    """
    return _add_single(dev, n, dtype_bytes, overhead)


add_latency.single = _add_single


def _embedding_single(dev, tokens, hidden, dtype_bytes=2.0, overhead=True):
    tok = jnp.maximum(tokens, 0.0)
    nbytes = 2.0 * tok * jnp.maximum(hidden, 0.0) * dtype_bytes + 8.0 * tok
    t = _stream_seconds(dev, nbytes, 0.0 * tok, "embedding", overhead)
    return jnp.where((tokens > 0) & (hidden > 0), t, jnp.inf)


@_validated
@batched
def embedding_latency(dev, tokens, hidden, dtype_bytes=2, overhead=True):
    """Embedding lookup of ``tokens`` rows of width ``hidden``, seconds.

    Kernel modelled: PyTorch's ``F.embedding`` forward (ATen ``index_select`` gather,
    ``native/cuda/Indexing.cu``): reads one ``hidden``-wide row per token id and writes it.
    Bytes ``2·tokens·hidden·word + 8·tokens`` (int64 ids); no FLOP. Memory-bound
    (``dev.embedding_bw_efficiency``), at least ``dev.embedding_overhead_s``.

    Example:
        >>> embedding_latency(hw_db.device("a100_80gb"), 4096, 4096)
        Array(0.00022, dtype=...)
    """
    return _embedding_single(dev, tokens, hidden, dtype_bytes, overhead)


embedding_latency.single = _embedding_single
