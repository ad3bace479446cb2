"""Computation–communication overlap with resource contention (single configuration).

An overlapped collective is not free: its kernels occupy streaming multiprocessors and move
bytes through main memory while the compute kernels beside it run. Rashidi et al., "Enabling
Compute-Communication Overlap in Distributed Deep Learning Training Platforms" (ISCA 2021,
§2–3) measure the slowdown of GEMMs run next to NCCL all-reduce kernels and attribute it to
the SMs the collective's thread blocks hold and to the memory bandwidth its
reductions/copies consume; Jangda et al., "Breaking the Computation and Communication
Abstraction Barrier in Distributed Machine Learning Workloads" (CoCoNet, ASPLOS 2022, §2) and
Wang et al., "Overlap Communication with Dependent Computation via Decomposition in Large Deep
Learning Models" (ASPLOS 2023, §2.2) make the same observation for tensor-parallel overlap.

**Resources taken by a collective** (one device):

- SMs: NCCL runs one CTA per channel, each CTA resident on one SM for the whole collective
  (NCCL documentation, ``NCCL_MIN_NCHANNELS``/``NCCL_MAX_NCHANNELS``, since 2.17
  ``NCCL_MIN_CTAS``/``NCCL_MAX_CTAS``, at most 32 by default). The share taken is
  ``sm_share = channels / core_count`` (:func:`sm_share`).
- Main-memory traffic per byte a device puts on the wire (:data:`HBM_BYTES_PER_WIRE_BYTE`,
  derived from the ring algorithm's data movement, NCCL "Simple" protocol, where the sender
  writes directly into the receiver's buffer): all-gather = the incoming write + the read that
  forwards it = 2; reduce-scatter = the incoming write + read of the incoming and of the local
  operand (the reduced result goes straight to the next peer, counted there) = 3; all-reduce
  = reduce-scatter + all-gather phases of equal wire volume = 2.5; point-to-point and
  all-to-all = a read at the sender + a write at the receiver = 2.
  Wire bytes per device (:func:`ring_send_bytes`) follow the ring algorithm: ``(g−1)/g · n`` for
  all-gather / reduce-scatter / all-to-all, ``2(g−1)/g · n`` for all-reduce, ``n`` for p2p.

**Overlapped execution** (:func:`overlapped_time`). A compute phase of standalone time
``t_c`` that moves ``compute_bytes`` through main memory, and a collective of standalone
time ``t_m`` of which a fraction ``overlappable`` can run beside the compute (the rest is
serial). While both run, the collective proceeds at its own speed (it is bound by the
network, not by the device), and compute proceeds at the rate

    ρ = min(1 − sm_share,  (B_mem − r_comm) / r_c, 1),  r_comm = comm_hbm_bytes / t_m,
    r_c = compute_bytes / t_c,  B_mem = mem_bw · mem_bw_efficiency

(an SM-proportional throughput for compute-bound kernels, the remaining memory bandwidth
for memory-bound ones; the binding one wins). With ``φ`` = overlappable and
``t_o = φ · t_m``::

    total = (1 − φ)·t_m + max(t_o,  t_c + (1 − ρ)·t_o)

so ``total ≥ max(t_c, t_m)``; ``ρ → 1`` gives ``max`` (ideal overlap), ``φ = 0`` or
``ρ → 0`` the serial sum, ``t_m = 0`` gives ``t_c``.

**Chunked pipelines** (:func:`pipelined_time`): work split into ``n`` equal chunks where each
chunk's communication follows (or precedes) its compute chunk — bucketed gradient reduction
during the backward (PyTorch DDP, Li et al., VLDB 2020, §3.2.3; Megatron-core
``overlap_grad_reduce``), the distributed optimizer's parameter all-gather before the
forward (``overlap_param_gather``), or TP GEMM+collective decomposition (Wang et al. 2023;
Transformer Engine userbuffers ``num_splits``). The first compute chunk and the last
communication chunk (or the reverse) cannot overlap: ``total = t_c/n + t_m/n +
overlapped_time((1−1/n)·t_c, (1−1/n)·t_m)``; without contention its exposed part is
``t_m/n + (1 − 1/n)·max(0, t_m − t_c)`` — the makespan of a two-stage pipeline. ``n = 1`` is
serial.

**Tensor-parallel overlap as Transformer Engine runs it** (:func:`te_tp_exposed`): each TP
collective only beside the GEMM that feeds or drains it (:func:`tp_host_fractions`), at the
default userbuffers configuration (ring-exchange all-gathers on the copy engines, pipelined
forward reduce-scatters with the SM margin on the whole host GEMM, bulk backward
reduce-scatters beside the weight-gradient GEMMs), and only where Megatron-core can run it
(:func:`tp_eligible`: sequence parallelism, the TP group inside one NVLink domain).

Cross-check of the aggregate: Lee et al., "Characterizing Compute-Communication Overlap in
GPU-Accelerated Distributed Deep Learning: Performance and Power Implications" (arXiv
2507.03114, 2025) measure on 4×A100/H100 (and MI250/MI210) GPT and LLaMA layers that compute
runs on average 18.9 % (at most 40 %) slower beside communication than alone, and that
serial execution is on average 10.2 % (at most 26.6 %) slower than overlapped; the SM
shares here (16/108 = 14.8 % on an A100) and the steps they give stay inside those ranges
(``experiments/search_gpt3.py`` prints the ratio for its plans).

Units: seconds, bytes, bytes/s. Every function is a single-configuration pure JAX function;
batch with ``jax.vmap``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxmodel import numerics as nx
from jaxmodel.ops.vector import elementwise_latency
from jaxmodel.workload.blocks import shard
from jaxmodel.workload.ffn import Gemm

# Main-memory bytes a device moves per byte it sends (ring algorithms, NCCL Simple
# protocol; derivation in the module docstring).
HBM_BYTES_PER_WIRE_BYTE = {"all_gather": 2.0, "reduce_scatter": 3.0, "all_reduce": 2.5,
                           "p2p": 2.0, "all_to_all": 2.0, "broadcast": 2.0}

# Default NCCL channel (= CTA = SM) counts of the collectives beside compute. NCCL chooses
# them at run time from the topology search (NCCL_MIN/MAX_NCHANNELS bound them, 32 CTAs at
# most by default since 2.17). Assumed values for DGX-class nodes with one NIC per GPU:
# two channels per NIC-rail ring for data-parallel / ZeRO / expert collectives across nodes
# (8 rails → 16). The TP overlap's SMs are Transformer Engine's (:data:`TE_COMM_SMS`).
DEFAULT_CHANNELS = {"dp": 16.0, "zero": 16.0, "ep": 16.0, "cp": 16.0}

# Transformer Engine userbuffers defaults (``initialize_ub``, ``get_default_config``): the
# ``pipeline`` reduce-scatter splits its GEMM in ``num_splits = 4`` chunks; ``pipeline`` and
# ``bulk`` overlaps run their collective on ``num_sm = 16`` SMs; ``ring_exchange``
# all-gathers copy with the copy engines (``use_ce``) and hold ``num_sm = 1``.
TP_OVERLAP_CHUNKS = 4.0
TE_COMM_SMS = 16.0
TE_RING_SMS = 1.0

# Megatron-core gradient bucket: ``bucket_size = max(40_000_000, 1_000_000 · dp)`` parameters
# when unset (megatron/core/distributed/distributed_data_parallel_config.py).
MCORE_BUCKET_PARAMS = 40e6
MCORE_BUCKET_PARAMS_PER_DP = 1e6

_MIN_RATE = 1e-3          # compute never stops entirely (keeps every quotient finite)
_MAX_SM_SHARE = 0.95


def ring_send_bytes(op: str, nbytes, group_size):
    """Bytes one device sends for a ring collective of buffer ``nbytes`` (NCCL's size
    convention, :mod:`jaxmodel.comm.collectives`) over ``group_size`` devices, bytes."""
    g = jnp.maximum(jnp.asarray(group_size, dtype=jnp.result_type(float)), 1.0)
    frac = (g - 1.0) / g
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return frac * nbytes
    if op == "all_reduce":
        return 2.0 * frac * nbytes
    if op in ("p2p", "broadcast"):
        return 1.0 * nbytes
    raise ValueError(f"ring_send_bytes: unknown op {op!r}; expected one of "
                     f"{sorted(HBM_BYTES_PER_WIRE_BYTE)}")


def comm_hbm_bytes(op: str, nbytes, group_size):
    """Main-memory bytes one device moves for a ring collective: ``ring_send_bytes ×``
    :data:`HBM_BYTES_PER_WIRE_BYTE` (module docstring), bytes."""
    return HBM_BYTES_PER_WIRE_BYTE[op] * ring_send_bytes(op, nbytes, group_size)


def sm_share(dev, channels):
    """Share of the device's cores a collective holds: ``channels / core_count`` (NCCL: one
    CTA per channel, each on its own SM), clipped to [0, 0.95]."""
    share = nx.safe_div(jnp.asarray(channels, dtype=jnp.result_type(float)), dev.core_count,
                        fill=0.0)
    return jnp.clip(share, 0.0, _MAX_SM_SHARE)


def compute_rate(t_compute, t_comm, compute_bytes, comm_bytes, share, dev):
    """Compute speed under an overlapped collective as a fraction of its standalone speed,
    ``ρ = min(1 − sm_share, (B_mem − r_comm)/r_c, 1)`` (module docstring), in
    [0.001, 1]. ``comm_bytes`` are the collective's main-memory bytes
    (:func:`comm_hbm_bytes`), ``compute_bytes`` the compute's."""
    f = jnp.result_type(float)
    bw = dev.mem_bw * dev.mem_bw_efficiency
    r_comm = nx.safe_div(jnp.asarray(comm_bytes, dtype=f), t_comm, fill=0.0)
    r_c = nx.safe_div(jnp.asarray(compute_bytes, dtype=f), t_compute, fill=0.0)
    left = jnp.maximum(bw - r_comm, 0.0)
    hbm_ok = r_c > 0
    hbm_rate = jnp.where(hbm_ok, left / jnp.where(hbm_ok, r_c, 1.0), 1.0)
    rate = jnp.minimum(jnp.minimum(1.0 - share, hbm_rate), 1.0)
    return jnp.clip(rate, _MIN_RATE, 1.0)


def overlapped_time(t_compute, t_comm, compute_bytes=0.0, comm_bytes=0.0, share=0.0,
                    dev=None, overlappable=1.0):
    """Time of a compute phase with a collective beside it, with contention.

    Source: module docstring (Rashidi et al. ISCA 2021 §3; Jangda et al. ASPLOS 2022 §2;
    Wang et al. ASPLOS 2023 §2.2): ``total = (1−φ)·t_m + max(φ·t_m, t_c + (1−ρ)·φ·t_m)``.

    Args:
        t_compute: standalone compute time ``t_c``, s.
        t_comm: standalone collective time ``t_m``, s.
        compute_bytes: main-memory bytes the compute moves (0: no memory contention), bytes.
        comm_bytes: main-memory bytes the collective moves (:func:`comm_hbm_bytes`), bytes.
        share: SM share the collective holds (:func:`sm_share`), 0..0.95.
        dev: the :class:`~jaxmodel.types.Device` (memory bandwidth); ``None`` = no memory
            contention.
        overlappable: fraction ``φ`` of the collective that may run beside the compute (0 =
            serial, 1 = all of it).

    Returns:
        ``(total_s, exposed_comm_s, compute_slowdown_s)``: the phase's time; the part of it
        beyond ``t_c`` (``total − t_c``); the extra time the compute itself takes through
        contention (``≤ exposed``).
    """
    f = jnp.result_type(float)
    t_c = jnp.maximum(jnp.asarray(t_compute, dtype=f), 0.0)
    t_m = jnp.maximum(jnp.asarray(t_comm, dtype=f), 0.0)
    phi = jnp.clip(jnp.asarray(overlappable, dtype=f), 0.0, 1.0)
    t_o = phi * t_m
    if dev is None:
        rho = jnp.clip(1.0 - jnp.asarray(share, dtype=f), _MIN_RATE, 1.0)
    else:
        rho = compute_rate(t_c, t_o, compute_bytes, phi * jnp.asarray(comm_bytes, dtype=f),
                           share, dev)
    total = (1.0 - phi) * t_m + jnp.maximum(t_o, t_c + (1.0 - rho) * t_o)
    # compute stretched while the collective runs: t_c/ρ if it ends first, else t_c + (1−ρ)t_o
    slowdown = jnp.minimum(t_c / rho, t_c + (1.0 - rho) * t_o) - t_c
    return total, total - t_c, slowdown


def pipelined_time(t_compute, t_comm, n_chunks, compute_bytes=0.0, comm_bytes=0.0,
                   share=0.0, dev=None):
    """A compute phase and a collective split into ``n_chunks`` dependent chunks (each
    chunk's collective follows or precedes its compute chunk), with contention.

    Source: module docstring — two-stage pipeline makespan (bucketed gradient reduction, Li
    et al. VLDB 2020 §3.2.3; Megatron-core ``overlap_grad_reduce`` / ``overlap_param_gather``;
    chunked TP GEMM+collective, Wang et al. ASPLOS 2023 §3): one compute chunk and one
    communication chunk are exposed, the remaining ``(1 − 1/n)`` of both overlap
    (:func:`overlapped_time`). ``n_chunks`` ≥ 1 (values below are taken as 1).

    Returns:
        ``(total_s, exposed_comm_s, compute_slowdown_s)`` as :func:`overlapped_time`.
    """
    f = jnp.result_type(float)
    n = jnp.maximum(jnp.asarray(n_chunks, dtype=f), 1.0)
    t_c = jnp.maximum(jnp.asarray(t_compute, dtype=f), 0.0)
    t_m = jnp.maximum(jnp.asarray(t_comm, dtype=f), 0.0)
    k = 1.0 - 1.0 / n
    tot, _, slow = overlapped_time(k * t_c, k * t_m, k * jnp.asarray(compute_bytes, dtype=f),
                                   k * jnp.asarray(comm_bytes, dtype=f), share, dev)
    total = t_c / n + t_m / n + tot
    return total, total - t_c, slow


def mcore_buckets(n_params, dp, bucket_params=None):
    """Gradient buckets of Megatron-core DDP / distributed optimizer for ``n_params`` local
    parameters: ``ceil(n_params / bucket)`` with ``bucket = max(40 M, 1 M · dp)`` parameters
    when ``bucket_params`` is None (``DistributedDataParallelConfig.bucket_size``)."""
    f = jnp.result_type(float)
    if bucket_params is None:
        bucket = jnp.maximum(MCORE_BUCKET_PARAMS,
                             MCORE_BUCKET_PARAMS_PER_DP * jnp.asarray(dp, dtype=f))
    else:
        bucket = jnp.asarray(bucket_params, dtype=f)
    return jnp.maximum(jnp.ceil(nx.safe_div(jnp.asarray(n_params, dtype=f), bucket,
                                            fill=1.0)), 1.0)


def bucketed_exposed(t_window, t_comm, n_buckets, compute_bytes=0.0, comm_bytes=0.0,
                     share=0.0, dev=None):
    """Exposed time of a bucketed collective behind a compute window (s): the
    ``overlap_grad_reduce`` gradient reduction during the backward of the last micro-batch,
    or the ``overlap_param_gather`` parameter all-gather before the forward of the first
    micro-batch (same two-stage pipeline, :func:`pipelined_time`): ``total − t_window``,
    including the window's own contention slowdown."""
    return pipelined_time(t_window, t_comm, n_buckets, compute_bytes, comm_bytes, share,
                          dev)[1]


def chunked_dp_exposed(t_chunk, t_comm, pp, v, n_buckets, comm_bytes=0.0, share=0.0,
                       dev=None):
    """Exposed data-parallel communication of the most loaded (first) pipeline stage under the
    interleaved schedule, where each of its ``v`` model chunks synchronises on its own (s).

    Source: Megatron-core ``forward_backward_pipelining_with_interleaving`` with
    ``overlap_grad_reduce`` / ``overlap_param_gather``: the gradient reduction of model chunk
    ``k`` is launched as soon as its last micro-batch's backward ends (``grad_sync_func``),
    and the parameter all-gather of the next chunk is launched during the current chunk's
    forward (``param_sync_func``); Narayanan et al. SC'21 §2.2.2 for the order of the chunks.
    On the first stage the chunks finish their last backward ``p`` chunk-steps apart (chunk
    ``v−1``, the deepest, first; chunk 0 at the very end), so chunk ``k``'s share
    ``t_comm/v`` becomes ready ``k·p·t_chunk`` before the end; the collectives run one after
    another on one stream, and chunk 0's share is bucketed behind its own backward
    (:func:`bucketed_exposed`). Ignoring the idle bubble time (extra window, so this is an
    upper bound)::

        F   = max_{k=1..v−1} (k·t_comm/v − k·p·t_chunk)      (backlog of the deeper chunks)
        end = max(F + t_comm/v,  pipelined_time(t_chunk, t_comm/v, n_b)[0] − t_chunk)
        exposed = max(end, 0) + contention slowdown of the (v−1)·p·t_chunk window


    ``v = 1`` gives :func:`bucketed_exposed` of one micro-batch's backward; the forward
    parameter all-gather is the mirror image (chunk 0 first, the next chunk ``p`` forward
    chunk-steps later: pass the forward chunk time).

    Args:
        t_chunk: one micro-batch's backward (or forward) of one model chunk on the stage, s.
        t_comm: the stage's whole DP collective (all chunks), s.
        pp: pipeline stages ``p``; v: model chunks per device (interleave).
        n_buckets: buckets of the stage's parameters (:func:`mcore_buckets`); chunk 0 gets
            ``n_buckets / v`` of them (at least one).
        comm_bytes, share, dev: contention inputs (:func:`overlapped_time`), whole collective.
    """
    f = jnp.result_type(float)
    v = jnp.maximum(jnp.asarray(v, dtype=f), 1.0)
    p = jnp.maximum(jnp.asarray(pp, dtype=f), 1.0)
    t_c = jnp.maximum(jnp.asarray(t_chunk, dtype=f), 0.0)
    t_m = jnp.maximum(jnp.asarray(t_comm, dtype=f), 0.0)
    share_c = t_m / v
    # the linear backlog peaks at k = 1 or k = v−1 (v ≥ 2); none when v = 1
    f1 = share_c - p * t_c
    fv = (v - 1.0) * (share_c - p * t_c)
    multi = v > 1.5
    backlog = jnp.where(multi, jnp.maximum(f1, fv), 0.0)
    nb0 = jnp.maximum(jnp.asarray(n_buckets, dtype=f) / v, 1.0)
    cb = jnp.asarray(comm_bytes, dtype=f)
    own = pipelined_time(t_c, share_c, nb0, 0.0, cb / v, share, dev)[0] - t_c
    end = jnp.where(multi, jnp.maximum(backlog + share_c, own), own)
    # the deeper chunks' collectives slow the backward passes they run beside
    k = (v - 1.0) / v
    slow = overlapped_time((v - 1.0) * p * t_c, k * t_m, 0.0, k * cb, share, dev)[2]
    return jnp.maximum(end, 0.0) + jnp.where(multi, slow, 0.0)


def tp_eligible(par, system):
    """1 where Megatron-core's ``--tp-comm-overlap`` can run for the plan, else 0.

    Sources: Megatron-LM ``megatron/training/arguments.py: validate_args`` asserts
    ``args.sequence_parallel`` when ``args.tp_comm_overlap`` is set ("Tensor parallel
    communication/GEMM overlap can happen only when sequence parallelism is enabled": the
    userbuffers of Transformer Engine's ``initialize_ub`` decompose only the all-gathers and
    reduce-scatters of sequence parallelism, not the all-reduce); Transformer Engine's
    comm+GEMM overlap example (``examples/pytorch/comm_gemm_overlap/README.md``,
    "Requirements") requires the tensor-parallel GPUs on a single node, connected over
    NVLink/NVSwitch (userbuffers map the peers' device memory through CUDA IPC or
    multicast handles), i.e. the ``tp`` consecutive devices within the system's innermost
    network tier. A plan that breaks either runs its TP collectives serially."""
    f = jnp.result_type(float)
    tp = jnp.maximum(jnp.asarray(par.tp, dtype=f), 1.0)
    inner = (jnp.asarray(system.levels[0].size, dtype=f) if system.levels
             else jnp.asarray(1.0, dtype=f))
    ok = (jnp.asarray(par.sp, dtype=f) > 0.5) & (tp <= inner + 0.5)
    return jnp.where(ok, 1.0, 0.0)


def tp_host_fractions(model, seq_len, flash_attention=0.0):
    """Shares of a layer's forward compute (FLOP shares) of the GEMMs that host the four
    tensor-parallel collectives under Transformer Engine's overlap, ``(ag_hosts, rs_hosts)``.

    Under sequence parallelism the all-gathers precede the QKV and FC1 GEMMs (their
    consumers) and the reduce-scatters follow the output-projection and FC2 GEMMs (their
    producers) (Korthikanti et al., MLSys 2023, §4.2.2, Fig. 5); Transformer Engine
    overlaps each collective only with the GEMM it feeds or drains (``qkv_fprop``,
    ``fc1_fprop``, ``proj_fprop``, ``fc2_fprop`` and their ``dgrad``/``wgrad``
    counterparts in ``initialize_ub``). FLOPs per token (forward): QKV ``2h(h_q + 2h_kv)``,
    output projection ``2h_q h``, FC1 ``2h·d_ff`` (×2 when gated), FC2 ``2d_ff h``,
    attention core ``4 s h_q`` (half under FlashAttention, which skips the masked causal
    half), with ``h_q = heads·d_head``; the memory-bound kernels are not counted, so
    the hosts' time is slightly overestimated (by their few per cent). The backward of
    every GEMM is twice its forward (input and weight gradient), so the same shares hold
    for the backward compute, half of each in its input-gradient (dgrad) GEMM and half
    in its weight-gradient (wgrad) GEMM. Dimensionless."""
    f = jnp.result_type(float)
    h = jnp.asarray(model.d_model, dtype=f)
    hq = model.n_heads * model.head_dim
    hkv = model.n_kv_heads * model.head_dim
    ff = model.d_ff * jnp.where(model.is_gated > 0.5, 2.0, 1.0)
    qkv, wo = 2.0 * h * (hq + 2.0 * hkv), 2.0 * hq * h
    w1, w2 = 2.0 * h * ff, 2.0 * model.d_ff * h
    attn = 4.0 * seq_len * hq * jnp.where(flash_attention > 0.5, 0.5, 1.0)
    tot = jnp.maximum(qkv + wo + w1 + w2 + attn, 1.0)
    return (qkv + w1) / tot, (wo + w2) / tot


class TPHosts(NamedTuple):
    """The GEMMs hosting the TP collectives under Transformer Engine's overlap
    (:func:`te_tp_exposed`): the shares of a pass's compute in the all-gather and the
    reduce-scatter hosts (:func:`tp_host_fractions`, dimensionless) and the extra seconds
    the split hosts take over the whole ones (:func:`te_split_gemms`; 0 = split GEMMs as
    fast as the whole one): ``split_ag_fwd`` the ring-exchange forward hosts (QKV, FC1),
    ``split_rs_fwd`` the pipelined forward hosts (output projection, FC2),
    ``split_ag_bwd`` the ring-exchange backward hosts (the output projection's and FC2's
    input-gradient GEMMs)."""

    ag: Any
    rs: Any
    split_ag_fwd: Any = 0.0
    split_rs_fwd: Any = 0.0
    split_ag_bwd: Any = 0.0


def te_split_gemms(model, par, tokens):
    """The hosting GEMMs of one layer's TP overlap, whole and as Transformer Engine splits
    them, as GEMM rows ``{row: [(Gemm, count)]}`` for :func:`jaxmodel.workload.layer.
    evaluate` (the extra time of the split hosts is ``row_split − row``).

    Source: Transformer Engine (v1.8–v2.x) ``transformer_engine/pytorch/module/base.py``,
    ``initialize_ub`` defaults (``ring_exchange`` for ``qkv_fprop``, ``fc1_fprop``,
    ``proj_dgrad``, ``fc2_dgrad`` with ``num_splits = tp_size``; ``pipeline`` for
    ``proj_fprop``, ``fc2_fprop`` with ``num_splits = 4``; ``bulk`` for the QKV / FC1
    input- and weight-gradient GEMMs, which stay whole), and
    ``transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp``:
    ``CommOverlapP2PBase::split_overlap_ag`` issues ``tp`` GEMMs, each on the ``b·s/tp``
    token rows of the shard received in the ring step before; ``CommOverlapBase::
    split_overlap_rs`` issues ``num_splits`` GEMMs of ``m_chunk = m / num_splits`` token rows,
    each chunk's reduce-scatter after its GEMM. Each chunk is a smaller GEMM than the whole
    one, so it runs at its own (lower) rate: the rows time them at the chunk shape (e.g. on
    an A100 cuBLASLt reaches ≈228 TFLOP/s on 4096³ vs ≈254 on 8192³, the shared GEMM
    microbenchmarks). The chunks are issued on up to three compute streams, so the tail of
    one chunk may overlap the next one's start: not modelled (an upper bound of the cost).

    Shapes (``M = tokens``, the ``b·s`` rows gathered by sequence parallelism; per-device
    widths of Megatron's TP split, :func:`jaxmodel.workload.layer.shard`): QKV
    ``[M, d]×[d, (h/t + 2·h_kv')·d_h]``, FC1 ``[M, d]×[d, (m−1)·d_ff/t]``, output projection
    ``[M, h·d_h/t]×[h·d_h/t, d]``, FC2 ``[M, d_ff/t]×[d_ff/t, d]``; the input gradients of the
    last two ``[M, d]×[d, h·d_h/t]`` and ``[M, d]×[d, d_ff/t]`` (the layer's op list,
    :func:`jaxmodel.workload.layer.layer_graph`, dense FFN). Rows ``ag_fwd``, ``rs_fwd``,
    ``ag_bwd`` hold the whole GEMMs, the ``_split`` rows their chunks with counts ``tp``,
    :data:`TP_OVERLAP_CHUNKS` and ``tp``. Counts of GEMMs, rows of tokens.
    """
    f = jnp.result_type(float)
    sh = shard(model, par)
    m = jnp.asarray(tokens, dtype=f)
    n_ring = sh.tp
    hq = sh.heads * sh.head_dim
    qkv_n = (sh.heads + 2.0 * sh.kv_heads) * sh.head_dim
    ring = [(qkv_n, sh.d_model), (sh.ffn_in, sh.d_model)]            # (n, k) of the AG hosts
    pipe = [(sh.d_model, hq), (sh.d_model, sh.d_ff)]                   # of the RS hosts
    dgrad = [(hq, sh.d_model), (sh.d_ff, sh.d_model)]                  # of the AG dgrad hosts

    def rows(shapes, n_split):
        whole = [(Gemm(m, n, k), 1.0) for n, k in shapes]
        split = [(Gemm(m / n_split, n, k), n_split) for n, k in shapes]
        return whole, split

    out = {}
    for name, shapes, n_split in (("ag_fwd", ring, n_ring), ("rs_fwd", pipe,
                                                             TP_OVERLAP_CHUNKS),
                                  ("ag_bwd", dgrad, n_ring)):
        out[name], out[name + "_split"] = rows(shapes, n_split)
    return out


#: The whole TP-overlap host GEMMs of :func:`te_split_gemms` as entries of a training layer's
#: GEMM rows (:func:`jaxmodel.workload.layer.layer_graph`, ``training=True``): ``(row,
#: index, part)`` with part 0 the forward GEMM, 1 its input gradient ``dX = dY·Wᵀ``. The
#: first entry of ``qkv`` and ``wo`` is the (fused) GQA projection and the first of ``w1``
#: and ``w2`` the dense FFN in every variant but multi-head latent attention's (its
#: projections are others), so a layer's evaluation can give these GEMMs' times to the
#: split hosts' rows instead of timing them again
#: (:func:`jaxmodel.workload.blocks.evaluate_with`).
TE_SPLIT_WHOLE_ENTRIES = {"ag_fwd": (("qkv", 0, 0), ("w1", 0, 0)),
                          "rs_fwd": (("wo", 0, 0), ("w2", 0, 0)),
                          "ag_bwd": (("wo", 0, 1), ("w2", 0, 1))}


def sp_regather_exposed(t_bwd, t_comm, ag_hosts, dev, comm_bytes=0.0):
    """Exposed time of the backward re-gathers of sequence parallelism: the column-parallel
    layers (QKV, FC1) keep only their sequence-sharded input for the backward and
    all-gather it again for their weight gradient, launched asynchronously before the
    input-gradient GEMM and awaited after it (s).

    Source: Megatron-LM (23.04 onwards) ``megatron/core/tensor_parallel/layers.py``,
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``
    (``_all_gather_base(..., async_op=True)``, ``grad_output.matmul(weight)``,
    ``handle.wait()``), the same in Megatron-core; under ``--tp-comm-overlap`` Transformer
    Engine runs it as the ``bulk`` overlaps ``qkv_dgrad`` / ``fc1_dgrad`` of
    ``initialize_ub`` (an all-gather on :data:`TE_COMM_SMS` SMs beside the input-gradient
    GEMM). Either way an all-gather of the ``b·s·h`` activation per layer beside the input-
    gradient GEMMs of QKV and FC1 (half of their backward, ``0.5 · ag_hosts · t_bwd``,
    :func:`tp_host_fractions`), holding :data:`TE_COMM_SMS` SMs (NCCL's channel count for
    the Megatron path is chosen at run time; the same 16 is assumed):
    :func:`overlapped_time`, at most the serial ``t_comm``.

    Args:
        t_bwd: the layer's backward compute, s.
        t_comm: the two all-gathers' serial time (as the forward's two), s.
        ag_hosts: share of the compute in the QKV and FC1 GEMMs (:func:`tp_host_fractions`).
        dev: the :class:`~jaxmodel.types.Device`.
        comm_bytes: main-memory bytes of the two all-gathers (:func:`comm_hbm_bytes`).
    """
    f = jnp.result_type(float)
    host = 0.5 * jnp.asarray(ag_hosts, dtype=f) * jnp.maximum(jnp.asarray(t_bwd, dtype=f), 0.0)
    t_m = jnp.maximum(jnp.asarray(t_comm, dtype=f), 0.0)
    exposed = overlapped_time(host, t_m, 0.0, comm_bytes, sm_share(dev, TE_COMM_SMS), dev)[1]
    return jnp.minimum(exposed, t_m)


def te_tp_exposed(t_fwd, t_bwd, t_comm_fwd, t_comm_bwd, hosts, tp, dev, comm_bytes=0.0):
    """Exposed TP communication of one layer's forward and backward under Megatron-core
    ``--tp-comm-overlap`` with Transformer Engine's default userbuffers configuration,
    ``(exposed_fwd_s, exposed_bwd_s)``, each including the compute slowdown it causes and
    the extra time of the split host GEMMs (:class:`TPHosts`, :func:`te_split_gemms`).

    Source: Transformer Engine ``initialize_ub`` defaults (``get_default_config``):

    - all-gathers (``qkv_fprop``, ``fc1_fprop``; backward ``proj_dgrad``, ``fc2_dgrad``):
      ``ring_exchange`` — ``tp`` GEMM chunks, each on the shard received in the step
      before, peer copies on the copy engines (``use_ce``, one SM): the first chunk's
      copy is exposed, the rest overlaps (:func:`pipelined_time` with ``n = tp``,
      :data:`TE_RING_SMS`);
    - forward reduce-scatters (``proj_fprop``, ``fc2_fprop``): ``pipeline`` —
      :data:`TP_OVERLAP_CHUNKS` chunks, the collective on :data:`TE_COMM_SMS` SMs with
      ``set_sm_margin``: the host GEMM is launched on ``core_count − TE_COMM_SMS`` SMs for
      its whole duration, i.e. runs ``1/(1 − σ)`` as long (``σ`` = :func:`sm_share`),
      whether or not the collective is running (the cost of reserving SMs; Rashidi et al.,
      ISCA 2021, §3: SMs held by collectives are lost to compute);
    - backward reduce-scatters (``qkv_dgrad``/``fc1_dgrad`` outputs): ``bulk`` — the whole
      collective beside the weight-gradient GEMM (``qkv_wgrad``, ``fc1_wgrad``) on
      :data:`TE_COMM_SMS` SMs without margin (:func:`overlapped_time`).

    The split hosts (ring exchange: ``tp`` chunks; pipeline: :data:`TP_OVERLAP_CHUNKS`)
    take ``host + split`` seconds instead of ``host`` (:class:`TPHosts`; smaller GEMMs run
    at lower rates, :func:`te_split_gemms`): the overlap of a kind costs
    ``pipelined_time(host + split, comm, n) − host``, the split included.

    Under sequence parallelism half of a pass's TP time is all-gathers and half
    reduce-scatters (equal bytes). Megatron-core switches each kind on or off on its own
    (``tp_comm_overlap_ag``, ``tp_comm_overlap_rs``, ``tp_comm_bulk_wgrad``), so each
    kind's exposure is at most its serial time (a tuned configuration turns off an
    overlap that loses).

    Args:
        t_fwd, t_bwd: the layer's forward / backward compute, s.
        t_comm_fwd, t_comm_bwd: its serial TP collectives of the forward / backward, s.
        hosts: ``(ag_hosts, rs_hosts)``, the shares of the compute in the GEMMs hosting the
            all-gathers / reduce-scatters (:func:`tp_host_fractions`), or a
            :class:`TPHosts` with the split hosts' extra seconds (absent: 0).
        tp: tensor-parallel degree (ring-exchange chunks).
        dev: the :class:`~jaxmodel.types.Device` (SM count, memory bandwidth).
        comm_bytes: main-memory bytes of one pass's TP collectives
            (:func:`comm_hbm_bytes`), the memory-contention input.
    """
    f = jnp.result_type(float)
    h = hosts if isinstance(hosts, TPHosts) else TPHosts(*hosts)
    ag_hosts, rs_hosts = h.ag, h.rs
    n_ring = jnp.maximum(jnp.asarray(tp, dtype=f), 1.0)
    sigma = sm_share(dev, TE_COMM_SMS)
    ring_share = sm_share(dev, TE_RING_SMS)
    half_b = 0.5 * jnp.asarray(comm_bytes, dtype=f)

    def split_host(host, extra):
        return jnp.maximum(host + jnp.asarray(extra, dtype=f), 0.0)

    def ring(host, comm, extra):
        ovl = pipelined_time(split_host(host, extra), comm, n_ring, 0.0, half_b, ring_share,
                             dev)[0] - host
        return jnp.minimum(ovl, comm)

    def rs_pipeline(host, comm, extra):
        # set_sm_margin: fewer SMs all along
        stretched = split_host(host, extra) / (1.0 - sigma)
        ovl = pipelined_time(stretched, comm, TP_OVERLAP_CHUNKS, 0.0, half_b, 0.0,
                             dev)[0] - host
        return jnp.minimum(ovl, comm)

    def rs_bulk(host, comm):
        return jnp.minimum(overlapped_time(host, comm, 0.0, half_b, sigma, dev)[1], comm)

    t_fwd = jnp.maximum(jnp.asarray(t_fwd, dtype=f), 0.0)
    t_bwd = jnp.maximum(jnp.asarray(t_bwd, dtype=f), 0.0)
    cf = 0.5 * jnp.maximum(jnp.asarray(t_comm_fwd, dtype=f), 0.0)
    cb = 0.5 * jnp.maximum(jnp.asarray(t_comm_bwd, dtype=f), 0.0)
    fwd = (ring(ag_hosts * t_fwd, cf, h.split_ag_fwd)
           + rs_pipeline(rs_hosts * t_fwd, cf, h.split_rs_fwd))
    # backward: the all-gathers of the output gradients before the projection / FC2 input-
    # gradient GEMMs (half of those GEMMs' backward), the reduce-scatters of the QKV / FC1
    # input gradients beside their weight-gradient GEMMs (the other half of theirs)
    bwd = (ring(0.5 * rs_hosts * t_bwd, cb, h.split_ag_bwd)
           + rs_bulk(0.5 * ag_hosts * t_bwd, cb))
    return fwd, bwd


def te_amax_sync_exposed(t_fwd_reduce, t_bwd_reduce, microbatches, interleave, pp):
    """Exposed seconds per step of Transformer Engine's blocking FP8 amax reductions, the
    reduction of each model chunk's amax values at the end of its forward and of its
    backward when they run on the compute stream's critical path.

    Source: Transformer Engine ``release_v0.8`` ``pytorch/fp8.py`` (``fp8_autocast``: on
    leaving the outermost autocast region ``global_amax_reduction`` all-reduces (MAX) the
    amaxes of every FP8 module the region ran, ``num_gemms·3`` fp32 values per module
    forward, ``num_gemms·2`` backward (``module.py``, ``init_fp8_meta_tensors``); its
    ``_prepare_backward`` does the same for the backward of the region's first module) over
    ``fp8_group`` — the amax reduction group, ``tp·dp`` consecutive ranks (Megatron-core /
    Apex ``parallel_state.initialize_model_parallel``, ``_AMAX_REDUCTION_GROUP``) — every
    ``NVTE_DP_AMAX_REDUCE_INTERVAL`` (default 1) forward and backward, over the TP group in
    between (interval 0: always the TP group, TE 1.x ``FP8GlobalStateManager``); with
    ``NVTE_ASYNC_AMAX_REDUCTION=0`` (the default) the all-reduce is issued synchronously
    (``torch.distributed.all_reduce(async_op=False)``: the compute stream waits for it), with
    ``1`` its handle is waited on only at the next region (overlapped, not counted here).
    NeMo wraps each model chunk's layers in one ``fp8_autocast`` per micro-batch
    (``ParallelTransformer.forward``), so a stage runs ``m·v`` such forwards and backwards
    per step; the critical path of the (interleaved) 1F1B schedule is ``m·v + p − 1``
    chunk forward-backward pairs of one stage (Narayanan et al., SC'21, §2.2: the bubble is
    ``(p − 1)/v`` micro-batches of ``v`` chunks), each lengthened by one forward and one
    backward reduction::

        exposed = (m·v + p − 1) · (t_fwd_reduce + t_bwd_reduce)

    Args:
        t_fwd_reduce, t_bwd_reduce: one blocking all-reduce of a chunk's forward / backward
            amaxes over its group (e.g. :func:`jaxmodel.collective_latency`), s; 0 where the
            reductions are asynchronous.
        microbatches: micro-batches per step per data-parallel replica, ``m``.
        interleave: model chunks per device, ``v`` (1 without interleaving).
        pp: pipeline stages, ``p``.

    Returns:
        Seconds per step (≥ 0).
    """
    f = jnp.result_type(float)
    steps, _ = _critical_chunk_steps(microbatches, interleave, pp)
    t = (jnp.maximum(jnp.asarray(t_fwd_reduce, dtype=f), 0.0)
         + jnp.maximum(jnp.asarray(t_bwd_reduce, dtype=f), 0.0))
    return steps * t


def _critical_chunk_steps(microbatches, interleave, pp):
    """``(m·v + p − 1, p)``: the chunk steps on an (interleaved) pipeline's critical path —
    every micro-batch's ``v`` chunks and the ``p − 1`` of the fill (Narayanan et al.,
    SC'21, §2.2) — and the stage count, from ``m ≥ 0``, ``v ≥ 1``, ``p ≥ 1``."""
    f = jnp.result_type(float)
    m = jnp.maximum(jnp.asarray(microbatches, dtype=f), 0.0)
    v = jnp.maximum(jnp.asarray(interleave, dtype=f), 1.0)
    p = jnp.maximum(jnp.asarray(pp, dtype=f), 1.0)
    return m * v + p - 1.0, p


def forward_only_p2p_exposed(t_hop, microbatches, interleave, pp):
    """Exposed stage-to-stage transfer seconds of one forward-only pass (an evaluation batch)
    through the (interleaved) pipeline.

    Source: Apex ``transformer/pipeline_parallel/schedules/
    fwd_bwd_pipelining_with_interleaving.py`` (commit ``7150e20``, March 2023, NeMo 1.17's
    schedule) and Megatron-core ``pipeline_parallel/schedules.py``
    ``forward_backward_pipelining_with_interleaving`` (commit ``df72712``, September 2023,
    and later): with ``forward_only`` every one of the ``m·v`` chunk
    forwards is a warm-up step, and with ``overlap_p2p_comm`` each one first waits on the
    handles of the previous step's ``send_forward_recv_forward`` (its own send and the
    receive of its input) — no backward runs beside the transfer. The interleaved order
    (Narayanan et al., SC'21, §2.2.2: groups of ``p`` micro-batches per model chunk) also
    closes a cycle: chunk ``c+1`` of micro-batch ``j`` on the first stage needs chunk ``c``
    of ``j`` from the last stage, ``p`` chunk steps earlier, so ``p`` steps must cover ``p``
    forwards and ``p`` hops. Every chunk forward on the critical path — ``m·v`` of them plus
    the ``p − 1`` of the fill — is followed by one hop::

        exposed = (m·v + p − 1) · t_hop        (0 without pipeline parallelism)

    A training step hides these transfers behind the backward passes of the 1F1B steady
    state (:func:`jaxmodel.parallel.pipeline.overlapped_p2p_time`); this is the forward-only
    counterpart.

    Args:
        t_hop: one stage-boundary transfer (the micro-batch's activations, ``[s/tp, b, h]``
            with sequence parallelism), s.
        microbatches: micro-batches of the pass per data-parallel replica, ``m``.
        interleave: model chunks per device, ``v`` (1 without interleaving).
        pp: pipeline stages, ``p``.

    Returns:
        Seconds per pass (≥ 0).
    """
    steps, p = _critical_chunk_steps(microbatches, interleave, pp)
    t = jnp.maximum(jnp.asarray(t_hop, dtype=jnp.result_type(float)), 0.0)
    return jnp.where(p > 1.5, steps * t, 0.0)


def te_weight_cast_time(dev, n_weights, bytes_per_weight, kernels=1.0):
    """Seconds of Transformer Engine's FP8 weight casts: ``kernels`` memory-bound kernels
    over ``n_weights`` 16-bit weights in all.

    Source: Transformer Engine ``release_v0.8`` ``pytorch/module.py``: a module's forward
    casts its weight when ``update_fp8_weights = is_first_microbatch is None or
    is_first_microbatch`` — with gradients ``fp8_cast_transpose_fused`` (read the bf16
    weight, write the FP8 weight and its FP8 transpose for the backward: 2 + 1 + 1 = 4 B per
    weight), without (evaluation) ``cast_to_fp8`` (2 + 1 = 3 B) — one kernel per FP8 GEMM
    weight (``LayerNormLinear`` QKV, ``Linear`` projection, ``LayerNormMLP`` FC1 and FC2:
    four per layer). Each kernel as :func:`jaxmodel.ops.elementwise_latency` (the amax,
    scale and convert, ~3 FLOP per element, and its launch floor)::

        t = kernels · elementwise_latency(dev, n_weights / kernels, bytes_per_weight, 3)

    Args:
        dev: the :class:`~jaxmodel.types.Device`.
        n_weights: weights cast, all kernels together (count).
        bytes_per_weight: main-memory bytes per weight, reads + writes (4 with the
            transpose, 3 without).
        kernels: cast kernels launched (≥ 1).

    Returns:
        Seconds (≥ 0).
    """
    f = jnp.result_type(float)
    k = jnp.maximum(jnp.asarray(kernels, dtype=f), 1.0)
    n = jnp.maximum(jnp.asarray(n_weights, dtype=f), 0.0)
    return k * elementwise_latency.single(dev, n / k, bytes_per_weight, 3.0)


__all__ = ["overlapped_time", "pipelined_time", "bucketed_exposed", "te_tp_exposed",
           "TPHosts", "te_split_gemms", "TE_SPLIT_WHOLE_ENTRIES", "sp_regather_exposed",
           "tp_eligible", "tp_host_fractions", "chunked_dp_exposed",
           "compute_rate", "sm_share", "ring_send_bytes", "comm_hbm_bytes", "mcore_buckets",
           "te_amax_sync_exposed", "forward_only_p2p_exposed", "te_weight_cast_time",
           "HBM_BYTES_PER_WIRE_BYTE", "DEFAULT_CHANNELS", "TP_OVERLAP_CHUNKS", "TE_COMM_SMS",
           "TE_RING_SMS"]
