"""ZeRO-3 / FSDP as it executes: per-unit parameter gathers and gradient reduce-scatters
(single configuration).

Sources: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (SC'20, §5.3 "P_os+g+p", §7.2.1 communication volume 3Ψ per step); Zhao et al.,
"PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023, §3.2 units
and hybrid sharding, §3.3 backward/forward prefetch, §3.3.2 rate limiter); DeepSpeed ZeRO
stage 3 (``stage3_prefetch_bucket_size``, parameters re-gathered for every micro-batch's
forward and backward, gradients reduce-scattered in every micro-batch's backward).

**Execution of one micro-batch on one device** (``n`` FSDP units, uniform; a unit = a
transformer layer by default, FSDP's transformer auto-wrap policy). Per unit: compute ``c_f``
(forward) and ``c_b`` (backward incl. recomputation), parameter all-gather ``g`` (output =
the unit's full parameters in ``dtype_bytes``), gradient reduce-scatter ``r`` (input = the
unit's full gradient in ``grad_comm_bytes``), all over the shard group. All collectives share
one network path; they run on their own stream beside the compute (:mod:`jaxmodel.parallel.
overlap`, with SM and memory-bandwidth contention).

- Forward, prefetch ≥ 1 unit: the first gather is exposed, then unit ``k`` computes while unit
  ``k+1`` is gathered: ``T_f = g + (n−1)·ov(c_f, g) + c_f``. Without prefetch (depth 0):
  ``T_f = n·(g + c_f)``.
- Backward (parameters were freed after the forward — ``reshard_after_forward``): unit ``k``
  computes its backward while unit ``k−1`` is gathered and unit ``k+1``'s gradients are
  reduce-scattered: ``T_b = g + (n−1)·ov(c_b, g + r) + c_b + r`` (the last reduce-scatter is
  exposed). Without prefetch: ``n·(g + c_b + r)``.
- ``ov(c, m)`` = :func:`jaxmodel.parallel.overlap.overlapped_time` (``max(c, m)`` without
  contention). Deeper prefetch changes nothing for uniform units (the steady state is set by
  the slower of compute and communication) but holds more gathered units in memory.
- Gradient accumulation over ``m`` micro-batches repeats both gathers every micro-batch
  (DeepSpeed stage 3 and FSDP both re-gather what they resharded); the reduce-scatter runs
  every micro-batch (DeepSpeed, ``reduce_every_microbatch = 1``) or only in the last one
  (FSDP ``no_sync``, ``0``: unsharded gradients accumulate locally).
- Hybrid sharding (HSDP, FSDP ``HYBRID_SHARD``; ZeRO++ hpZ is the same idea for the
  parameters): shard over ``shard_group`` devices (e.g. the 8 GPUs of a node), replicate over
  ``dp / shard_group``; in the last micro-batch each unit's reduced shard is then all-reduced
  over the replicas (``a``), in the backward's communication stream:
  ``T_b = g + (n−1)·ov(c_b, g + r + a) + c_b + r + a``.

**Per-tensor collectives** (:func:`call_overhead`): FSDP gathers a unit as one flat
parameter (one collective per unit). DeepSpeed's ZeRO-3 of 2021 (``partition_parameters.py``
``_allgather_param`` / ``_reduce_scatter_gradient``, before ``_all_gather_base``) issues one
all-gather and one reduce-scatter *per parameter tensor* through the list form of
``torch.distributed`` (one output/input view per rank), and PyTorch's ``ProcessGroupNCCL``
flattens that list with one copy kernel per rank. Every call then costs, beyond its bytes,
NCCL's ring latency over the flat ring of all ``g`` ranks — all-gather and reduce-scatter
have no tree in NCCL: ``baseLat + (g − nodes)·max(hwLat[NVLink], netOverhead) + (nodes −
1)·hwLat[NET]``
(NCCL's tuning constants, :mod:`jaxmodel.comm.nccl`; LL for small tensors, Simple for the
weight matrices) — plus ``g`` copy kernels (``Device.add_overhead_s`` each, the floor of a
small elementwise kernel). Both grow with ``g``: at fixed global batch the compute per device
falls as 1/devices while this cost rises with them.

Step (per device): ``Σ_micro-batches (T_f + T_b)``; the optimizer step, embedding and
pipeline terms are the caller's. With ``g, r ≫ c`` the step is communication-bound: the
collective volume per device is ~``3·Ψ·2`` bytes whatever the number of devices, so at fixed
global batch the throughput per device falls as 1/devices (Narayanan et al., SC'21, Table 2
and §5.2).

Units: seconds, bytes.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel.comm import collectives as _coll
from jaxmodel.parallel import overlap as ov

ZERO3_KEYS = ("compute", "exposed_comm", "contention", "gather", "reduce_scatter",
              "replica_allreduce")


def _collective(system, op, nbytes, group, stride, net):
    """``(seconds, feasible)`` of one collective over ``group`` devices (0 for a group of
    1; double-where: the model never sees a group of 1)."""
    multi = group > 1.5
    t, ok, _ = _comm.collective_cost.single(system, op, nbytes, jnp.where(multi, group, 2.0),
                                            "auto", stride, net)
    return jnp.where(multi, jnp.where(ok, t, 0.0), 0.0), ~multi | ok


def call_overhead(system, group, stride=1.0, big_calls=0.0, small_calls=0.0,
                  list_api=1.0):
    """Seconds that per-tensor collective calls add to one unit's gather or reduce-scatter
    over ``group`` ranks ``stride`` devices apart (module docstring, "Per-tensor
    collectives"): ``big_calls`` weight matrices at NCCL's Simple-protocol ring latency,
    ``small_calls`` vectors (biases, norm weights) at its LL ring latency, and with
    ``list_api`` one copy kernel per rank and call (``Device.add_overhead_s``).

    The flat ring over ``g`` ranks: :func:`jaxmodel.comm.collectives.nccl_ring_latency`
    (NCCL ``ncclTopoTuneModel``: ``nsteps = nRanks − 1`` for all-gather / reduce-scatter,
    ``nNodes − 1`` of them across the network). A unit gathered as one flat parameter (FSDP)
    is ``big_calls = 1``,
    ``small_calls = 0``, ``list_api = 0``, whose latency the collective model has already:
    the caller adds this only for the calls beyond it. Units: s.
    """
    f = jnp.result_type(float)
    g = jnp.maximum(jnp.asarray(group, dtype=f), 1.0)
    # per protocol (LL, LL128, Simple): NCCL's flat-ring latency over the g ranks
    lat = _coll.nccl_ring_latency(system, jnp.where(g > 1.5, g, 2.0), stride)
    multi = g > 1.5
    ring = big_calls * lat[2] + small_calls * lat[0]
    copies = list_api * (big_calls + small_calls) * g * system.device.add_overhead_s
    return jnp.where(multi, ring + copies, 0.0)


def unit_pass_time(t_compute, t_comm, n_units, prefetch=1.0, t_tail=0.0, compute_bytes=0.0,
                   comm_bytes=0.0, share=0.0, dev=None, t_head=None):
    """One pass (forward or backward) over ``n_units`` uniform units whose communication
    ``t_comm`` per unit is prefetched ``prefetch`` units ahead (module docstring):
    ``t_head + (n−1)·ov(t_compute, t_comm) + t_compute + t_tail`` with prefetch ≥ 1
    (``t_head``: the first unit's exposed collective, default ``t_comm``; ``t_tail``: the
    last unit's trailing collective, e.g. its reduce-scatter), else
    ``n·(t_comm + t_compute)``.

    Returns:
        ``(total_s, contention_s)``: the pass and the compute slowdown inside it.
    """
    f = jnp.result_type(float)
    n = jnp.maximum(jnp.asarray(n_units, dtype=f), 1.0)
    tot, _, slow = ov.overlapped_time(t_compute, t_comm, compute_bytes, comm_bytes, share, dev)
    head = t_comm if t_head is None else t_head
    pipelined = head + (n - 1.0) * tot + t_compute + t_tail
    serial = n * (t_comm + t_compute)
    on = jnp.asarray(prefetch, dtype=f) >= 0.5
    return jnp.where(on, pipelined, serial), jnp.where(on, (n - 1.0) * slow, 0.0)


def zero3_step(system, n_params, n_units, t_fwd_unit, t_bwd_unit, dp, micro_batches=1.0, *,
               dtype_bytes=2.0, grad_comm_bytes=2.0, prefetch=1.0, shard_group=None,
               reduce_every_microbatch=1.0, stride=1.0, channels=None,
               compute_bytes_fwd=0.0, compute_bytes_bwd=0.0,
               net: _comm.NetVariant = _comm.ANY_NET, collective_times=None):
    """Time of the ZeRO-3 / FSDP part of a training step on one device (module docstring).

    Args:
        system: the :class:`~jaxmodel.types.System` (collectives via
            :func:`jaxmodel.comm.collective_cost`).
        n_params: parameters sharded by ZeRO-3 (per pipeline stage / TP rank when combined
            with model parallelism).
        n_units: FSDP units (wrapped modules) they are split into, uniform.
        t_fwd_unit, t_bwd_unit: compute of one unit for one micro-batch, forward and backward
            (incl. recomputation), s.
        dp: data-parallel degree (devices over which the parameters are sharded, or sharded
            and replicated with ``shard_group``).
        micro_batches: micro-batches per step (gradient accumulation).
        dtype_bytes: bytes per gathered parameter (2 = fp16/bf16).
        grad_comm_bytes: bytes per reduced gradient element (2 = DeepSpeed's fp16 reduction,
            4 = fp32).
        prefetch: units gathered ahead (0 = none: serial; ≥ 1 pipelined).
        shard_group: HSDP shard-group size (``None`` or ``dp`` = plain ZeRO-3); must divide
            ``dp``; the replica all-reduce runs over ``dp / shard_group``.
        reduce_every_microbatch: 1 = reduce-scatter in every micro-batch (DeepSpeed); 0 =
            only in the last one (FSDP ``no_sync``).
        stride: devices between consecutive data-parallel ranks (``tp·pp`` under PTD-P
            placement, 1 for pure ZeRO-3).
        channels: NCCL channels (= SMs) of the collectives (default
            :data:`jaxmodel.parallel.overlap.DEFAULT_CHANNELS` ``["zero"]``).
        compute_bytes_fwd, compute_bytes_bwd: main-memory bytes of one unit's compute (0: no
            memory contention modelled for the compute).
        net: static :class:`jaxmodel.comm.NetVariant` of ``system`` (prunes the graph only).
        collective_times: ``(gather, reduce_scatter, replica_allreduce)`` seconds per unit
            when the caller has evaluated them already (e.g. in one batched call with its
            other collectives); ``None`` evaluates them here.

    Returns:
        dict: ``total`` (s, the ZeRO part of the step: all micro-batches' forward and backward
        passes), the components :data:`ZERO3_KEYS` — ``compute`` (standalone compute),
        ``exposed_comm`` (``total − compute − contention``), ``contention`` (compute
        slowdown under overlapped collectives), ``gather`` / ``reduce_scatter`` /
        ``replica_allreduce`` (standalone collective time per step, for reporting) — and
        ``feasible`` (the groups fit the network).
    """
    f = jnp.result_type(float)
    dev = system.device
    dp = jnp.maximum(jnp.asarray(dp, dtype=f), 1.0)
    n = jnp.maximum(jnp.asarray(n_units, dtype=f), 1.0)
    m = jnp.maximum(jnp.asarray(micro_batches, dtype=f), 1.0)
    shard = dp if shard_group is None else jnp.clip(jnp.asarray(shard_group, dtype=f), 1.0, dp)
    replicas = jnp.maximum(dp / shard, 1.0)
    p_unit = jnp.asarray(n_params, dtype=f) / n
    ag_bytes = p_unit * dtype_bytes
    rs_bytes = p_unit * grad_comm_bytes
    ar_bytes = nx.safe_div(rs_bytes, shard, fill=0.0)
    stride = jnp.asarray(stride, dtype=f)
    if collective_times is None:
        g, ok_g = _collective(system, "all_gather", ag_bytes, shard, stride, net)
        r, ok_r = _collective(system, "reduce_scatter", rs_bytes, shard, stride, net)
        a, ok_a = _collective(system, "all_reduce", ar_bytes, replicas, stride * shard, net)
    else:
        g, r, a = (jnp.asarray(x, dtype=f) for x in collective_times)
        ok_g = ok_r = ok_a = jnp.asarray(True)
    share = ov.sm_share(dev, ov.DEFAULT_CHANNELS["zero"] if channels is None else channels)
    h_g = ov.comm_hbm_bytes("all_gather", ag_bytes, shard)
    h_r = ov.comm_hbm_bytes("reduce_scatter", rs_bytes, shard)
    h_a = ov.comm_hbm_bytes("all_reduce", ar_bytes, replicas)

    def bwd(with_rs, with_ar):
        comm = g + with_rs * r + with_ar * a
        tail = with_rs * r + with_ar * a
        hb = h_g + with_rs * h_r + with_ar * h_a
        return unit_pass_time(t_bwd_unit, comm, n, prefetch, tail, compute_bytes_bwd, hb,
                              share, dev, t_head=g)

    t_f, s_f = unit_pass_time(t_fwd_unit, g, n, prefetch, 0.0, compute_bytes_fwd, h_g, share,
                              dev)
    every = jnp.clip(jnp.asarray(reduce_every_microbatch, dtype=f), 0.0, 1.0)
    t_b_mid, s_b_mid = bwd(every, 0.0)
    t_b_last, s_b_last = bwd(1.0, 1.0)
    total = m * t_f + (m - 1.0) * t_b_mid + t_b_last
    contention = m * s_f + (m - 1.0) * s_b_mid + s_b_last
    compute = m * n * (t_fwd_unit + t_bwd_unit)
    n_rs = (m - 1.0) * every + 1.0
    return {"total": total, "compute": compute, "contention": contention,
            "exposed_comm": total - compute - contention,
            "gather": 2.0 * m * n * g, "reduce_scatter": n_rs * n * r,
            "replica_allreduce": n * a, "feasible": ok_g & ok_r & ok_a}


def zero3_memory(n_params, n_units, dp, *, shard_group=None, prefetch=1.0, dtype_bytes=2.0,
                 grad_bytes=4.0, optimizer_bytes=12.0, reduce_every_microbatch=1.0):
    """Model-state memory per device under ZeRO-3 / FSDP, bytes (activations are the
    caller's).

    Source: Rajbhandari et al. SC'20 §5 (``(2 + 2 + K)·Ψ / N_d`` with K = 12 for mixed-
    precision Adam; here weights ``dtype_bytes``, gradients ``grad_bytes``, optimizer
    ``optimizer_bytes`` per parameter, each divided by the shard group); Zhao et al. VLDB
    2023 §3.3: the unsharded units alive at once — the computing unit, ``prefetch`` units
    being gathered, and in the backward one unsharded gradient unit before its
    reduce-scatter; FSDP ``no_sync`` (``reduce_every_microbatch = 0``) keeps the full
    unsharded gradients.

    Returns:
        dict bytes: ``weights`` (sharded + gathered units), ``gradients``, ``optimizer``,
        ``total``.
    """
    f = jnp.result_type(float)
    dp = jnp.maximum(jnp.asarray(dp, dtype=f), 1.0)
    shard = dp if shard_group is None else jnp.clip(jnp.asarray(shard_group, dtype=f), 1.0, dp)
    psi = jnp.asarray(n_params, dtype=f)
    unit = psi / jnp.maximum(jnp.asarray(n_units, dtype=f), 1.0)
    live = 1.0 + jnp.maximum(jnp.asarray(prefetch, dtype=f), 0.0)
    weights = dtype_bytes * (psi / shard + live * unit)
    every = jnp.clip(jnp.asarray(reduce_every_microbatch, dtype=f), 0.0, 1.0)
    grads = every * grad_bytes * (psi / shard + unit) + (1.0 - every) * grad_bytes * psi
    opt = optimizer_bytes * psi / shard
    return {"weights": weights, "gradients": grads, "optimizer": opt,
            "total": weights + grads + opt}


__all__ = ["zero3_step", "zero3_memory", "unit_pass_time", "call_overhead", "ZERO3_KEYS"]
