"""Attention kernels on one device: standard (three-pass) attention and FlashAttention-1/2.

Sources:

- Guo et al. §III-B: standard attention is three passes over HBM — (I) ``S = Q·Kᵀ`` written to
  HBM, (II) ``P = softmax(S)`` (with masking / dropout) read and written, (III) ``O = P·V`` —
  with ``O(N²)`` memory traffic; FlashAttention fuses them into one tiled kernel whose time is
  eq. 1, ``t_FA = t_HBM-ld + t_GEMM + t_pt-reduc-ops + t_HBM-st``, with ``B × d`` tiles and
  ``4·B·d ≈ M`` (on-chip SRAM).
- Dao et al. 2022, "FlashAttention" (FA-1): Algorithm 1 (forward: outer loop over K/V blocks
  ``j``, inner loop over Q blocks ``i``, ``B_c = ⌈M/4d⌉``, ``B_r = min(B_c, d)``; ``Q_i, O_i,
  ℓ_i, m_i`` reloaded and ``O_i, ℓ_i, m_i`` stored for every ``(i, j)``), Algorithm 4
  (backward: ``Q_i, O_i, dO_i, dQ_i, ℓ_i, m_i`` reloaded and ``dQ_i`` stored for every
  ``(i, j)``; five block GEMMs), Theorem 2 (``Θ(N²d²/M)`` HBM accesses); one thread block per
  (sequence, head).
- Dao 2023, "FlashAttention-2" (FA-2): §3.1 fewer non-matmul FLOPs (un-scaled ``O`` rescaled
  once at the end, only the log-sum-exp stored), §3.2 parallelism over the sequence (one
  thread block per query block in the forward pass, per key block in the backward pass),
  loop order swapped (``Q_i`` stays on chip, ``K_j, V_j`` are streamed), ``dQ`` accumulated
  with atomic adds in fp32 and a ``D = rowsum(dO∘O)`` pre-processing kernel in the backward;
  §3.1 (multi-query / grouped-query attention): K and V are shared by index, and the backward
  pass runs per query head and sums ``dK``, ``dV`` over the heads that share them
  (flash-attn's ``mha_bwd``: a ``[b, n_kv, h, d]`` ``dk_expanded`` summed over the group).
  Decoding splits the KV sequence over thread blocks (Flash-Decoding, Dao et al. 2023).
- Hierarchical roofline (Guo et al. §III-A via Optimus/DeepFlow): each byte is charged at the
  slowest memory level it must cross; re-reads of a working set that fits the global buffer
  (L2) are served from it, otherwise from HBM.

Model of one FlashAttention call on one device (``b`` sequences, ``h`` query heads and
``h_kv`` KV heads on the device, ``n_q`` queries and ``n_kv`` keys per sequence, head
dimension ``d``, ``w`` bytes per element, SRAM ``M = dev.local_buffer_bytes`` per core):

- tiles ``B_c = ⌊M / (4·d·w)⌋`` (≤ ``n_kv``) and ``B_r = min(B_c, d)`` (≤ rows);
  a *unit* is one (sequence, head) for FA-1 and one (sequence, KV head) with its ``g = h/h_kv``
  query heads folded into the rows for FA-2 (GQA packing; ``g = 1`` for multi-head attention);
  ``T_r = ⌈rows/B_r⌉``, ``T_c = ⌈n_kv/B_c⌉``; causal masking skips fully masked blocks:
  a fraction ``f = min(1, 1 − (n_q − B_c)/(2·n_kv))`` of the ``T_r·T_c`` block pairs runs;
- ``t_GEMM``: block products on one core's ``lanes`` systolic arrays
  (:func:`~jaxmodel.ops.systolic.systolic_cycles`, best split of the block over the lanes),
  times the block pairs of one work item, times the waves ``⌈items / cores⌉`` (FA-1: one item
  per unit; FA-2: one per query block, per (key block, query head) in the backward, and KV
  splits to fill the cores in decoding);
- ``t_pt-reduc-ops``: scale, mask, row max, ``exp``, row sum and the output rescale per block
  on the core's vector units (FLOP counts below); dropout adds its RNG and multiply;
- ``t_HBM-ld`` / ``t_HBM-st``: every access of the algorithm crosses the global buffer; the
  HBM sees only the compulsory traffic (each operand read once, each result written once) when
  the re-read working set of the concurrently running work items fits the global buffer, and
  every access otherwise; each is charged at its level's bandwidth, the slower level wins;
- plus one kernel-launch overhead per kernel (``dev.matmul_overhead_s``; FA-1: one kernel
  forward, one backward; FA-2: one forward, three backward).

The four eq.-1 terms are added (no overlap), as in the seed.

Units: seconds, bytes, FLOP.

Example:
    >>> dev = hw_db.device("a100_40gb")
    >>> fa = jm.flash_attention_latency(dev, 8, 12, 1024, 1024, 64)
    >>> sa = jm.standard_attention_latency(dev, 8, 12, 1024, 1024, 64)
    >>> float(sa["fwd"] / fa["fwd"])          # FlashAttention forward speed-up
    4.77
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.gemm import L0_SPLIT_M, _device_ok, _rates
from jaxmodel.ops.gemm import _gemm_latency_single as _gemm
from jaxmodel.ops.systolic import systolic_cycles
from jaxmodel.ops.vector import _elementwise_single, _softmax_single
from jaxmodel.types import FA_VERSIONS

__all__ = ["flash_attention_latency", "standard_attention_latency", "flash_attention_tiles",
           "flash_attention_rows", "FA_VERSIONS", "AttentionShape", "AttentionKernel"]


# Non-matmul FLOP of the online softmax (Dao et al. 2022 Alg. 1 lines 9-12; 2023 §3.1.1),
# counted per element of a block of scores: scale 1, mask 1, row max 1, subtract 1, exp
# (``dev.exp_flops``), row sum 1 -> exp + 5.
_PT_PER_SCORE = 5.0
# Per element of an output block per block pair: FA-1 rescales O_i by diag(ℓ)^-1·e^(m - m_new)
# and adds the new term (4 FLOP); FA-2 keeps O un-normalised (2 FLOP: scale and add).
_PT_PER_OUT = {1: 4.0, 2: 2.0}
# Per row per block pair: new max, new sum and their exponentials: FA-1 2 exp + 6,
# FA-2 1 exp + 4 (only the running max needs an exp).
_PT_PER_ROW = {1: (2.0, 6.0), 2: (1.0, 4.0)}
# Backward, per score element: recompute P = exp(S·scale − L) (exp + 3), dS = P∘(dP − D) (2).
_PT_BWD_PER_SCORE = 5.0
# Dropout (Philox RNG + compare + scale) per score element, forward and regenerated backward.
_DROPOUT_FLOP = 6.0
_STAT_BYTES = 4.0   # ℓ, m, L, D statistics are fp32 (Dao et al. 2022 §3.1)


def flash_attention_tiles(dev, head_dim, rows, kv_len, dtype_bytes=2.0):
    """FA block sizes ``(B_r, B_c)`` (elements): ``B_c = ⌊M/(4·d·w)⌋``, ``B_r = min(B_c, d)``.

    Source: Dao et al. 2022 Algorithm 1 line 1 (``B_c = ⌈M/4d⌉``, ``B_r = min(⌈M/4d⌉, d)``,
    ``M`` in elements); Guo et al. §III-B (``4·B·d ≈ M``). Clipped to the problem
    (``B_c ≤ n_kv``, ``B_r ≤ rows``) and to at least one element. Single configuration.
    """
    word = nx.sanitize(dtype_bytes, dtype_bytes > 0)
    d = nx.sanitize(head_dim, head_dim > 0)
    bc = jnp.floor(nx.safe_div(dev.local_buffer_bytes, 4.0 * d * word, fill=1.0))
    bc = jnp.clip(bc, 1.0, jnp.maximum(kv_len, 1.0))
    br = jnp.clip(jnp.minimum(bc, d), 1.0, jnp.maximum(rows, 1.0))
    return br, bc


def _block_cycles(dev, m, n, k):
    """Cycles of one ``[m×k]·[k×n]`` block product on one core (best split over its lanes)."""
    lanes = nx.sanitize(dev.lanes_per_core, dev.lanes_per_core > 0)
    H = nx.sanitize(dev.sa_rows, dev.sa_rows > 0)
    W = nx.sanitize(dev.sa_cols, dev.sa_cols > 0)
    mac = nx.sanitize(dev.sa_mac_per_cycle, dev.sa_mac_per_cycle > 0)
    best = jnp.inf
    for i in L0_SPLIT_M:
        j = lanes / i
        ok = (j >= 1.0) & nx.is_integer(j)
        j = jnp.where(ok, j, 1.0)
        cyc = systolic_cycles(nx.ceil_div(m, i), nx.ceil_div(n, j), k, H, W, mac)
        best = jnp.minimum(best, jnp.where(ok, cyc, jnp.inf))
    return best


def _level_time(hbm_bytes, l2_bytes, dram_bw, l2_bw):
    """Hierarchical roofline of a transfer: the slower of HBM and global-buffer traffic (s)."""
    return jnp.maximum(nx.safe_div(hbm_bytes, dram_bw, fill=jnp.inf),
                       nx.safe_div(l2_bytes, l2_bw, fill=jnp.inf))


def _pick(a1, a2):
    """The two FlashAttention versions along a length-2 axis: ``a1`` (FA-1), ``a2`` (FA-2)."""
    return jnp.where(jnp.asarray([False, True]), a2, a1)


def _flash_work(dev, dims, w, causal):
    """Work decomposition of both versions (length-2 leaves) of the problem ``dims = (b, h,
    h_kv, n_q, n_kv, d)``: units (FA-1 per head, FA-2 per KV head), their query rows, the
    ``B_r × B_c`` blocks, block pairs per unit under the causal mask, thread blocks forward /
    backward and their waves over the cores."""
    b, h, hk, nq, nkv, d = dims
    cores = _rates(dev)[4]
    g = jnp.maximum(h / hk, 1.0)
    units = _pick(b * h, b * hk)
    rows = _pick(nq, g * nq)                             # query rows of one unit
    br, bc = flash_attention_tiles(dev, d, rows, nkv, w)
    br = _pick(br, jnp.clip(bc, 1.0, jnp.maximum(rows, 1.0)))   # FA-2: B×d tiles (seed)
    t_r, t_c = nx.ceil_div(rows, br), nx.ceil_div(nkv, bc)
    f = jnp.where(causal > 0.5, jnp.clip(1.0 - (nq - bc) / (2.0 * nkv), 0.0, 1.0), 1.0)
    # FA-2: a thread block per query block (fwd) / key block (bwd); Flash-Decoding splits the
    # keys when the query blocks alone cannot fill the cores. FA-1: one per unit.
    split = _pick(1.0, jnp.clip(jnp.floor(nx.safe_div(cores, units * t_r, fill=1.0)), 1.0, t_c))
    items_f = _pick(units, units * t_r * split)
    # FA-2 backward (§3.1 GQA): one thread block per (key block, query head), g per KV head
    items_b = _pick(units, units * g * t_c)
    return dict(g=g, units=units, rows=rows, br=br, bc=bc, t_r=t_r, t_c=t_c, f=f,
                pairs=f * t_r * t_c, split=split, items_f=items_f, items_b=items_b,
                waves_f=nx.ceil_div(items_f, cores), waves_b=nx.ceil_div(items_b, cores))


def _flash_compute(dev, k, d, dropout):
    """``t_GEMM`` (``S = Q·Kᵀ`` and ``O = P·V`` per block pair; backward S, dP, dV, dQ, dK)
    and ``t_pt-reduc-ops`` on the vector units of both versions, s."""
    freq, _, _, vec_core, _ = _rates(dev)
    br, bc, units, pairs = k["br"], k["bc"], k["units"], k["pairs"]
    c_qk = _block_cycles(dev, br, bc, d)                 # [B_r×d]·[d×B_c]
    c_pv = _block_cycles(dev, br, d, bc)                 # [B_r×B_c]·[B_c×d]
    c_kt = _block_cycles(dev, bc, d, br)                 # dK, dV: [B_c×B_r]·[B_r×d]
    per_item_f = pairs * units / k["items_f"]
    per_item_b = pairs * units / k["items_b"]
    waves_f, waves_b = k["waves_f"], k["waves_b"]
    out = {"gemm_qk": waves_f * per_item_f * c_qk / freq,
           "gemm_pv": waves_f * per_item_f * c_pv / freq,
           "gemm_qk_bwd": waves_b * per_item_b * (c_qk + c_pv + c_kt) / freq,   # S, dQ, dK
           "gemm_pv_bwd": waves_b * per_item_b * (c_qk + c_kt) / freq}          # dP, dV
    drop = jnp.where(dropout > 0, 1.0, 0.0)
    exp = dev.exp_flops
    per_out = _pick(_PT_PER_OUT[1], _PT_PER_OUT[2])
    per_row = _pick(_PT_PER_ROW[1][0] * exp + _PT_PER_ROW[1][1],
                    _PT_PER_ROW[2][0] * exp + _PT_PER_ROW[2][1])
    pt_pair = (br * bc * (exp + _PT_PER_SCORE + drop * _DROPOUT_FLOP) + br * d * per_out
               + br * per_row)
    # FA-1 computes D_i = rowsum(dO_i∘O_i) per pair; FA-2 in a pre-processing kernel
    pt_pair_b = (br * bc * (exp + _PT_BWD_PER_SCORE + drop * _DROPOUT_FLOP)
                 + _pick(2.0 * br * d, 0.0))
    pt = waves_f * per_item_f * pt_pair / vec_core / freq
    # FA-2 normalises O = diag(ℓ)^-1·O once at the end (FA-1 every step)
    out["pointwise"] = pt + _pick(0.0, waves_f * (k["rows"] * d / k["t_r"]) / vec_core / freq)
    out["pointwise_bwd"] = waves_b * per_item_b * pt_pair_b / vec_core / freq
    return out


def _flash_traffic(dev, k, nkv, d, w):
    """HBM / global-buffer traffic of both versions per pass: bytes loaded and stored
    (``hbm_*``) and their times (``load``, ``store``; backward ``*_bwd``), s and bytes."""
    freq, dram, l2bw, _, cores = _rates(dev)
    dram_bw, l2_bw = dram * freq, l2bw * freq            # bytes/s
    g, units, rows, t_r, t_c, f = (k[x] for x in ("g", "units", "rows", "t_r", "t_c", "f"))
    qo = rows * d * w                                   # Q (or O, dO) of one unit
    kv = nkv * d * w                                    # K (or V) of one unit
    st = rows * _STAT_BYTES                             # one fp32 statistic of one unit
    dq32 = rows * d * 4.0                               # FA-2 fp32 dQ accumulator
    r1, r2 = f * t_c, f * t_r                           # reload counts
    # FA-1 Alg. 1: K, V once; Q_i, O_i, ℓ_i, m_i loaded and O_i, ℓ_i, m_i stored per pair; O,
    # ℓ, m initialised in HBM. FA-2: Q_i stays on chip, K_j, V_j streamed per pair, O and the
    # log-sum-exp stored once.
    ld_all = _pick(2.0 * kv + r1 * (2.0 * qo + 2.0 * st), qo + r2 * 2.0 * kv)
    st_all = _pick((r1 + 1.0) * (qo + 2.0 * st), qo + st)
    ld_min = qo + 2.0 * kv
    st_min = _pick(qo + 2.0 * st, qo + st)
    live = _pick(jnp.minimum(units, cores),
                 jnp.minimum(units, nx.ceil_div(cores, t_r * k["split"])))
    ws = live * _pick(2.0 * qo + 2.0 * st, 2.0 * kv)
    # FA-1 Alg. 4: K, V once; Q_i, O_i, dO_i, dQ_i, ℓ_i, m_i per pair, dQ_i stored per pair;
    # dK, dV once. FA-2: pre-processing D = rowsum(dO∘O) (reads dO, O, writes D); the loop over
    # key blocks streams Q_i, dO_i, L_i, D_i and read-modify-writes dQ_i (fp32); dK, dV once;
    # dQ converted fp32 -> w (reads dq32, writes qo). Under GQA each of the g query heads
    # reads K, V and writes its own dK, dV; a sum kernel reads the g copies, writes dK, dV.
    pre = 2.0 * qo + st
    grouped = _pick(0.0, jnp.where(g > 1.0, 1.0, 0.0))
    kv_ld = _pick(2.0 * kv, 2.0 * g * kv * (1.0 + grouped))
    kv_st = _pick(2.0 * kv, 2.0 * g * kv + grouped * 2.0 * kv)
    ld_all_b = _pick(2.0 * kv + r1 * (4.0 * qo + 2.0 * st),
                     pre + kv_ld + r1 * (2.0 * qo + 2.0 * st + dq32) + dq32)
    st_all_b = _pick(r1 * qo + 2.0 * kv, st + r1 * dq32 + kv_st + qo)
    ld_min_b = _pick(2.0 * kv + 3.0 * qo + 2.0 * st, pre + kv_ld + 2.0 * qo + 2.0 * st + dq32)
    st_min_b = _pick(qo + 2.0 * kv, st + dq32 + kv_st + qo)
    live_b = _pick(jnp.minimum(units, cores), jnp.minimum(units * g, nx.ceil_div(cores, t_c)))
    ws_b = live_b * _pick(4.0 * qo + 2.0 * st, (2.0 * qo + 2.0 * st + dq32) / g)
    l2_cap = dev.global_buffer_bytes
    fits, fits_b = ws <= l2_cap, ws_b <= l2_cap
    hbm_ld = units * jnp.where(fits, ld_min, ld_all)
    hbm_st = units * jnp.where(fits, st_min, st_all)
    hbm_ld_b = units * jnp.where(fits_b, ld_min_b, ld_all_b)
    hbm_st_b = units * jnp.where(fits_b, st_min_b, st_all_b)
    return {"load": _level_time(hbm_ld, units * ld_all, dram_bw, l2_bw),
            "store": _level_time(hbm_st, units * st_all, dram_bw, l2_bw),
            "load_bwd": _level_time(hbm_ld_b, units * ld_all_b, dram_bw, l2_bw),
            "store_bwd": _level_time(hbm_st_b, units * st_all_b, dram_bw, l2_bw),
            "hbm_bytes": hbm_ld + hbm_st, "hbm_bytes_bwd": hbm_ld_b + hbm_st_b,
            "grouped": grouped}


class AttentionShape(NamedTuple):
    """One attention call's problem on one device: ``batch`` sequences, ``heads`` query heads
    and ``kv_heads`` KV heads (None = ``heads``), ``q_len`` queries and ``kv_len`` keys per
    sequence, ``head_dim`` (counts; :func:`flash_attention_latency`).

    Example:
        >>> s = AttentionShape(batch=8, heads=32, q_len=1, kv_len=4096, head_dim=128, kv_heads=8)
        >>> s.heads // s.kv_heads                     # query heads per KV head (GQA group)
        4
    """

    batch: Any
    heads: Any
    q_len: Any
    kv_len: Any
    head_dim: Any
    kv_heads: Any = None


class AttentionKernel(NamedTuple):
    """How an attention call runs (:func:`flash_attention_latency`,
    :func:`standard_attention_latency`, :func:`flash_attention_rows`).

    Attributes:
        causal: causal mask, 1 or 0 (FlashAttention skips fully masked blocks; standard
            attention computes the full score matrix either way).
        dropout: attention-dropout probability (> 0 adds the RNG work).
        version: FlashAttention version code, 1 (FA-1) or 2 (FA-2); may vary in a batch
            (standard attention ignores it).
        dtype_bytes: bytes per element of Q, K, V, O (and of the scores).
        overhead: add one kernel-launch overhead (``dev.matmul_overhead_s``) per kernel
            (a static bool).

    Example:
        >>> k = AttentionKernel(version=2)            # FA-2, causal, no dropout, 16-bit
        >>> k.causal, k.dropout, k.dtype_bytes, k.overhead
        (1.0, 0.0, 2.0, True)
    """

    causal: Any = 1.0
    dropout: Any = 0.0
    version: Any = 1.0
    dtype_bytes: Any = 2.0
    overhead: bool = True


def _flash_single(dev, shape: AttentionShape, kernel: AttentionKernel = AttentionKernel()):
    """Single-configuration body of :func:`flash_attention_latency`.

    Both versions are evaluated along a length-2 axis (FA-1, FA-2) in one trace
    (:func:`_flash_work`, :func:`_flash_compute`, :func:`_flash_traffic`) and the one named
    by the ``version`` code is returned.
    """
    batch, heads, q_len, kv_len, head_dim, kv_heads = shape
    causal, dropout, version, dtype_bytes, overhead = kernel
    kv_heads = heads if kv_heads is None else kv_heads
    ok = (_device_ok(dev) & (batch > 0) & (heads > 0) & (kv_heads > 0) & (q_len > 0)
          & (kv_len > 0) & (head_dim > 0) & (dtype_bytes > 0))
    b, h, hk, nq, nkv, d = (nx.sanitize(x, x > 0) for x in
                            (batch, heads, kv_heads, q_len, kv_len, head_dim))
    w = nx.sanitize(dtype_bytes, dtype_bytes > 0)
    k = _flash_work(dev, (b, h, hk, nq, nkv, d), w, causal)
    c = _flash_compute(dev, k, d, dropout)
    m = _flash_traffic(dev, k, nkv, d, w)
    ov = dev.matmul_overhead_s if overhead else 0.0
    res = {
        "load": m["load"], "gemm": c["gemm_qk"] + c["gemm_pv"], "pointwise": c["pointwise"],
        "store": m["store"],
        "overhead": _pick(1.0, 1.0) * ov,                    # one forward kernel
        "gemm_qk": c["gemm_qk"], "gemm_pv": c["gemm_pv"],
        "load_bwd": m["load_bwd"], "gemm_bwd": c["gemm_qk_bwd"] + c["gemm_pv_bwd"],
        "pointwise_bwd": c["pointwise_bwd"],
        # FA-2: pre, main, convert (+ the dK, dV group sum under GQA)
        "store_bwd": m["store_bwd"], "overhead_bwd": _pick(1.0, 3.0 + m["grouped"]) * ov,
        "gemm_qk_bwd": c["gemm_qk_bwd"], "gemm_pv_bwd": c["gemm_pv_bwd"],
        "hbm_bytes": m["hbm_bytes"], "hbm_bytes_bwd": m["hbm_bytes_bwd"],
        "flops": 4.0 * k["units"] * k["pairs"] * k["br"] * k["bc"] * d,
        "flops_bwd": 10.0 * k["units"] * k["pairs"] * k["br"] * k["bc"] * d,
        "block_rows": k["br"], "block_cols": k["bc"] * jnp.ones_like(k["br"]),
    }
    res["fwd"] = res["load"] + res["gemm"] + res["pointwise"] + res["store"] + res["overhead"]
    res["bwd"] = (res["load_bwd"] + res["gemm_bwd"] + res["pointwise_bwd"] + res["store_bwd"]
                  + res["overhead_bwd"])
    use2 = version > 1.5
    out = {key: jnp.where(use2, x[1], x[0]) for key, x in res.items()}
    for key in ("load", "gemm", "pointwise", "store", "overhead", "gemm_qk", "gemm_pv",
                "load_bwd", "gemm_bwd", "pointwise_bwd", "store_bwd", "overhead_bwd",
                "gemm_qk_bwd", "gemm_pv_bwd", "fwd", "bwd"):
        out[key] = jnp.where(ok, out[key], jnp.inf)
    out["total"] = out["fwd"] + out["bwd"]
    return out


@batched
def flash_attention_latency(dev, batch, heads, q_len, kv_len, head_dim, kv_heads=None,
                            kernel: AttentionKernel = AttentionKernel()):
    """FlashAttention forward and backward on one device (Guo et al. eq. 1), seconds.

    See the module docstring for the model (Dao et al. 2022 Alg. 1/4 for ``version=1``,
    Dao 2023 for ``version=2``).

    Args:
        dev: :class:`jaxmodel.Device`.
        batch: sequences ``b``.
        heads: query heads on the device ``h``.
        q_len: queries per sequence ``n_q`` (the prompt; 1 per step in decoding).
        kv_len: keys per sequence ``n_kv`` (``n_q`` in prefill and training; cached + new in
            decoding, read from the KV cache).
        head_dim: ``d``.
        kv_heads: KV heads on the device (GQA/MQA); default ``heads``.
        kernel: :class:`AttentionKernel` — ``causal`` (1: fully masked blocks are skipped,
            0: no mask; default 1), ``dropout`` probability (> 0 adds the RNG work; no extra
            traffic), ``version`` (1 FA-1, the seed's model, default; 2 FA-2; a code, may
            vary in a batch), ``dtype_bytes`` per element of Q, K, V, O (default 2) and
            ``overhead`` (one kernel-launch overhead ``dev.matmul_overhead_s`` per kernel;
            default True).

    Returns:
        dict of seconds — ``load``, ``gemm`` (= ``gemm_qk + gemm_pv``), ``pointwise``,
        ``store``, ``overhead``, ``fwd`` (their sum, eq. 1), the same with ``_bwd`` for the
        backward and ``total = fwd + bwd`` — plus ``hbm_bytes``/``hbm_bytes_bwd`` (main-memory
        traffic), ``flops``/``flops_bwd`` (matmul FLOP actually executed) and the tile sizes
        ``block_rows``/``block_cols``. ``+inf`` times for invalid inputs.

    Example:
        >>> r = flash_attention_latency(hw_db.device("a100_40gb"), 8, 16, 4096, 4096, 64)
        >>> float(r["gemm"] + r["pointwise"]) > float(r["load"] + r["store"])  # compute-bound
        True
    """
    return _flash_single(dev, AttentionShape(batch, heads, q_len, kv_len, head_dim, kv_heads),
                         kernel)


def _standard_single(dev, shape: AttentionShape, kernel: AttentionKernel = AttentionKernel()):
    """Single-configuration body of :func:`standard_attention_latency` (``kernel.causal`` and
    ``kernel.version`` do not apply: the full score matrix is computed)."""
    batch, heads, q_len, kv_len, head_dim, kv_heads = shape
    dropout, dtype_bytes, overhead = kernel.dropout, kernel.dtype_bytes, kernel.overhead
    kv_heads = heads if kv_heads is None else kv_heads
    ok = ((batch > 0) & (heads > 0) & (kv_heads > 0) & (q_len > 0) & (kv_len > 0)
          & (head_dim > 0))
    b, h, hk, nq, nkv, d = (nx.sanitize(x, x > 0) for x in
                            (batch, heads, kv_heads, q_len, kv_len, head_dim))
    w = dtype_bytes
    kvh = jnp.minimum(hk, h)
    g = h / kvh
    nb, m = b * kvh, g * nq                     # one product per (sequence, KV head)
    qk = _gemm(dev, m, nkv, d, nb, w, overhead)                      # pass I: S to HBM
    av = _gemm(dev, m, d, nkv, nb, w, overhead)                      # pass III: O = P·V
    # backward GEMMs: dQ = dS·K, dKᵀ = Qᵀ·dS; dP = dO·Vᵀ, dV = Pᵀ·dO
    qk_b = _gemm(dev, m, d, nkv, nb, w, overhead) + _gemm(dev, d, nkv, m, nb, w, overhead)
    av_b = _gemm(dev, m, nkv, d, nb, w, overhead) + _gemm(dev, nkv, d, m, nb, w, overhead)
    rows, n_scores = b * h * nq, b * h * nq * nkv
    sm = _softmax_single(dev, rows, nkv, overhead)                   # pass II (scale+mask)
    sm_b = _elementwise_single(dev, n_scores, 3.0 * w, 4.0, overhead)
    has_drop = dropout > 0
    # dropout: read P, write P' and a 1-byte mask; backward reads dP' and the mask, writes dP
    dr = jnp.where(has_drop, _elementwise_single(dev, n_scores, 2.0 * w + 1.0, _DROPOUT_FLOP,
                                                 overhead), 0.0)
    dr_b = jnp.where(has_drop, _elementwise_single(dev, n_scores, 2.0 * w + 1.0, 1.0,
                                                   overhead), 0.0)
    s_bytes = n_scores * w
    io = (2.0 * b * h * nq * d + 2.0 * b * kvh * nkv * d) * w        # Q, O and K, V
    hbm = io + s_bytes * (1.0 + 2.0 + 1.0) + has_drop * n_scores * (2.0 * w + 1.0)
    out = {"qk": qk, "softmax": sm, "dropout": dr, "av": av,
           "qk_bwd": qk_b, "softmax_bwd": sm_b, "dropout_bwd": dr_b, "av_bwd": av_b}
    out = {k: jnp.where(ok, v, jnp.inf) for k, v in out.items()}
    out["fwd"] = out["qk"] + out["softmax"] + out["dropout"] + out["av"]
    out["bwd"] = out["qk_bwd"] + out["softmax_bwd"] + out["dropout_bwd"] + out["av_bwd"]
    out["total"] = out["fwd"] + out["bwd"]
    out["hbm_bytes"] = hbm
    out["flops"] = 4.0 * b * h * nq * nkv * d
    return out


@batched
def standard_attention_latency(dev, batch, heads, q_len, kv_len, head_dim, kv_heads=None,
                               kernel: AttentionKernel = AttentionKernel()):
    """Standard (unfused, three-pass) attention forward and backward on one device, seconds.

    Guo et al. §III-B passes I–III as separate kernels, each through HBM, with the ops models:
    ``S = Q·Kᵀ`` and ``O = P·V`` as batched GEMMs (:func:`~jaxmodel.ops.gemm_latency`; one
    product per sequence and KV head, GQA query groups folded into M, as
    :func:`jaxmodel.workload.layer.attention_core`), the scale-mask-softmax fused kernel
    (:func:`~jaxmodel.ops.softmax_latency`; Megatron's ``FusedScaleMaskSoftmax``), an optional
    dropout kernel (reads ``P``, writes ``P'`` and a 1-byte mask). Backward: the four gradient
    GEMMs, the softmax backward (reads ``P, dP``, writes ``dS``: 3 words, 4 FLOP per element)
    and the dropout backward. The full ``n_q × n_kv`` score matrix is computed (no causal
    saving), as Megatron-LM does.

    Arguments as :func:`flash_attention_latency`; of the ``kernel`` (:class:`AttentionKernel`)
    only ``dropout``, ``dtype_bytes`` and ``overhead`` apply.

    Returns:
        dict of seconds: ``qk``, ``softmax``, ``dropout``, ``av``, the same with ``_bwd``,
        ``fwd``, ``bwd``, ``total``; plus ``hbm_bytes`` (forward main-memory traffic: Q, K, V,
        O and four passes over the score matrix, five with dropout) and ``flops``.

    Example:
        >>> r = standard_attention_latency(hw_db.device("a100_40gb"), 8, 12, 1024, 1024, 64)
    """
    return _standard_single(dev, AttentionShape(batch, heads, q_len, kv_len, head_dim,
                                                kv_heads), kernel)


def flash_attention_rows(dev, shape: AttentionShape,
                         kernel: AttentionKernel = AttentionKernel(), backward=False,
                         share_kv=True):
    """FlashAttention time spread over the standard attention rows, ``{row: (fwd_s, bwd_s)}``.

    Keeps a layer breakdown comparable between the two implementations (single configuration
    ``shape``; causal, no dropout, one launch overhead per kernel whatever ``kernel`` says:
    of the :class:`AttentionKernel` only ``version`` and ``dtype_bytes`` apply; ``backward``
    false gives zero backward times): ``qk`` = HBM loads + the score GEMMs (``S = Q·Kᵀ``;
    backward: ``S``, ``dQ``, ``dK``), ``softmax`` = the pointwise/reduction work + kernel
    launches, ``av`` = the value GEMMs (``P·V``; backward: ``dP``, ``dV``) + HBM stores. The
    rows sum to
    :func:`flash_attention_latency`'s ``fwd`` (and ``bwd`` when ``backward``).

    Decoding (``q_len < kv_len``: new tokens against a KV cache) runs the split-KV kernel of
    Flash-Decoding (Dao et al. 2023; TensorRT-LLM masked MHA, vLLM PagedAttention,
    FlashInfer) whatever ``version``: one work unit per (sequence, KV head) with its ``g``
    query heads folded into the rows, so each KV head's cache is read once per step, and the
    keys split over thread blocks to fill the cores (the FA-2 decomposition above). FA-1's
    unit per query head would reload K and V ``g`` times under grouped-query attention.
    ``share_kv`` false (may be traced) keeps that per-query-head decode kernel: one thread
    block per (sequence, query head), each reading its KV head's cache (TensorRT-LLM's masked
    MHA before its XQA kernel for GQA/MQA generation, v0.7).
    """
    heads, q_len, kv_len, version = shape.heads, shape.q_len, shape.kv_len, kernel.version
    decoding = (q_len < kv_len) & (version > 0.5)
    version = jnp.where(decoding & share_kv, jnp.maximum(version, 2.0), version)
    # per-query-head decode kernel: every query head is a unit reading its KV head's cache
    kv_heads = jnp.where(decoding & ~jnp.asarray(share_kv), heads, shape.kv_heads)
    r = _flash_single(dev, shape._replace(kv_heads=kv_heads),
                      AttentionKernel(1.0, 0.0, version, kernel.dtype_bytes, True))
    fwd = {"qk": r["load"] + r["gemm_qk"], "softmax": r["pointwise"] + r["overhead"],
           "av": r["gemm_pv"] + r["store"]}
    bwd = {"qk": r["load_bwd"] + r["gemm_qk_bwd"],
           "softmax": r["pointwise_bwd"] + r["overhead_bwd"],
           "av": r["gemm_pv_bwd"] + r["store_bwd"]}
    if not backward:
        bwd = {k: jnp.zeros_like(v) for k, v in bwd.items()}
    return {k: (fwd[k], bwd[k]) for k in fwd}
