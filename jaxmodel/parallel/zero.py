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
the unit's full parameters in ``weight_bytes``), gradient reduce-scatter ``r`` (input = the
unit's full gradient in ``grad_comm_bytes``), all over the shard group. All collectives share
one network path; they run on their own stream beside the compute (:mod:`jaxmodel.parallel.
overlap`, with SM and memory-bandwidth contention).

- Forward, prefetch ≥ 1 unit: the first gather is exposed, then unit ``k`` computes while unit
  ``k+1`` is gathered: ``T_f = g + (n−1)·ov(c_f, g) + c_f``. Without prefetch (depth 0):
  ``T_f = n·(g + c_f)``.
- Backward (parameters were freed after the forward — ``reshard_after_forward``): unit ``k``
  computes its backward while unit ``k−1`` is gathered and unit ``k+1``'s gradients are
  reduce-scattered: ``T_b = g + (n−1)·ov(c_b, g + r) + c_b + r`` (the last reduce-scatter is
  exposed). Without prefetch: ``n·(g + c_b + r)``. With ``recompute_gathers`` every ``g`` of
  the backward counts twice (see "Re-gather for recomputation").
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

**Re-gather for recomputation** (``recompute_gathers = 1``): DeepSpeed's stage-3 hooks
release a module's gathered parameters after *every* forward (``_post_forward_module_hook``
→ ``release_sub_module``), including the re-forward of an activation-checkpointed layer in
the backward; the backward pre-hook then gathers them again. With full recomputation every
unit is thus gathered three times per micro-batch (forward, re-forward, backward), not twice.

**Per-tensor collectives** (:func:`per_tensor_collectives`): FSDP gathers a unit as one
flat parameter (one collective per unit). DeepSpeed's ZeRO-3 of 2021
(``partition_parameters.py`` ``_allgather_param`` / ``_reduce_scatter_gradient``, before
``_all_gather_base``) issues one all-gather and one reduce-scatter *per parameter tensor*
through the list form of ``torch.distributed`` (one output/input view per rank), each
gather after a ``torch.cuda.synchronize()`` (nothing overlaps it: ``prefetch = 0``).
Parameters below ``stage3_param_persistence_threshold`` (10⁵ elements, biases and
LayerNorms) stay gathered; their gradients are still reduce-scattered. Every call costs
the NCCL collective of its tensor (NCCL's flat ring over all ``g`` ranks — all-gather and
reduce-scatter have no tree in NCCL, :mod:`jaxmodel.comm`), ``g`` copy kernels of the list
API (PyTorch ``ProcessGroupNCCL`` flattens the list, one ``copy_`` per rank,
``Device.add_overhead_s`` each) and the main-memory traffic of the call path
(:data:`LIST_API_HBM`): for a gather the zero-filled full-size buffer (``torch.zeros``, 1×)
and the copy out of the flattened output (read + write, 2×); for a reduce-scatter the
gradient's pre-division (``tensor.div_(world_size)`` in stage 3's ``average_tensor``, 2×)
and the copy into the flattened input (2×). Both the latency and the copies grow with ``g``:
at fixed global batch the compute per device falls as 1/devices while this cost rises.

**FSDP2's copies on the compute stream** (PyTorch ``fully_shard``,
``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` and ``_fsdp_collectives.py``,
PyTorch 2.4–2.6): a unit is gathered as one flat buffer and then split into its parameters by
``foreach_all_gather_copy_out`` (``torch.split_with_sizes_copy``), which
``FSDPParamGroup.wait_for_unshard`` runs on the *current* stream — the compute waits for it:
it reads and writes the unit's unsharded parameters, ``2·w`` bytes per parameter. Before a
reduce-scatter, ``foreach_reduce`` copies the unsharded gradients (in the parameter dtype
``w``) into the flat reduce-scatter input in the reduce dtype (``g``; ``torch.ops.fsdp.
chunk_cat``) on the current stream as well ("only after the copy-in finishes can we free the
gradients"), ``w + g`` bytes per parameter; only then does the reduce-scatter stream start.
Both are memory-bound kernels of ``copy_out_bytes`` / ``copy_in_bytes`` per unit parameter
(:func:`impl_costs`), timed as the device's memory-bound elementwise kernels
(:func:`copy_time`, :func:`jaxmodel.ops.elementwise_latency`) and added to the unit's
compute, so they lengthen the pass whether or not the collectives are hidden.

**FSDP2's memory** (same sources, and ``MixedPrecisionPolicy``): the sharded parameter *is*
the fp32 master copy (``param_dtype`` applies to the all-gather only: the copy-in casts the
shard), so no 16-bit shard is kept beside the optimizer's ``master_bytes``
(``shard_weight_bytes = 0``); in the backward, a unit's unsharded gradients (``w`` bytes per
parameter) and the reduce-scatter input (``g``) of the unit before, still in flight, are
alive beside the computing and the prefetched units (``unsharded_grad_bytes = w``). The
forward's held all-gather output (``wait_for_unshard`` keeps the current unit's flat buffer
until the next copy-out) is no larger than the backward's unsharded gradient buffer, so the
backward is the peak. Not modelled: the caching allocator's reserved-but-unused blocks
(fragmentation across the four streams), which no anchor here measures.

**Implementations** (``Parallelism.zero3_impl``, :data:`jaxmodel.types.ZERO3_IMPLS`;
:func:`impl_args` maps the code to this module's options; ``jm.train_step`` applies them):

- ``"fsdp"`` (0, the default): PyTorch FSDP (Zhao et al., VLDB 2023; FSDP2 ``fully_shard``)
  — one flat parameter per unit, prefetched one unit ahead, one gather per backward, the
  copy-out and copy-in kernels and the memory above (:func:`impl_costs`).
- ``"deepspeed"`` (1): DeepSpeed's stage 3 as released in 2021 (Rajbhandari et al., SC'20;
  the ``partition_parameters.py`` / ``stage3.py`` code quoted above): serial
  (``prefetch = 0``), three gathers per layer under full recomputation
  (``recompute_gathers = 1``), per-tensor collectives of a Megatron GPT layer's tensors
  (:func:`layer_tensors`, :func:`per_tensor_collectives`) with the list API's copies, the
  persistent small parameters, and the calibrated :data:`FLAT_RING_EFFICIENCY` on rings
  crossing InfiniBand (:func:`ring_efficiency_of`). Validated on Narayanan et al., SC'21,
  Table 2 (``experiments/validate_table2.py``). Not modelled: the embedding's collectives
  (one tensor per step), the persistent parameters' memory (``8·d_model`` per layer).

Step (per device): ``Σ_micro-batches (T_f + T_b)``; the optimizer step, embedding and
pipeline terms are the caller's. With ``g, r ≫ c`` the step is communication-bound: the
collective volume per device is ~``3·Ψ·2`` bytes whatever the number of devices, so at fixed
global batch the throughput per device falls as 1/devices (Narayanan et al., SC'21, Table 2
and §5.2).

Units: seconds, bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel import tech_tables as _tech_tables
from jaxmodel.parallel import overlap as ov
from jaxmodel.workload import params as _params

ZERO3_KEYS = ("compute", "exposed_comm", "contention", "gather", "reduce_scatter",
              "replica_allreduce", "copies")


@dataclasses.dataclass(frozen=True)
class Zero3Options:
    """How ZeRO-3 / FSDP runs: the keywords of :func:`zero3_step`, :func:`zero3_memory`
    (numbers may be traced) and :func:`per_tensor_collectives`.

    Attributes:
        weight_bytes: bytes per gathered (unsharded) parameter (2 = fp16/bf16).
        grad_comm_bytes: bytes per reduced gradient element (2 = DeepSpeed's fp16 reduction,
            4 = fp32).
        grad_bytes: bytes per gradient element held in memory (:func:`zero3_memory`).
        optimizer_bytes: optimizer-state bytes per parameter (12 = mixed-precision Adam).
        shard_weight_bytes: bytes per sharded parameter of the weight shard (default
            ``weight_bytes``; :func:`impl_costs`).
        unsharded_grad_bytes: bytes per unit parameter of FSDP2's unsharded gradient buffer
            (:func:`impl_costs`; 0 = none).
        prefetch: units gathered ahead (0 = none: serial; ≥ 1 pipelined).
        shard_group: HSDP shard-group size (``None`` or ``dp`` = plain ZeRO-3); must divide
            ``dp``; the replica all-reduce runs over ``dp / shard_group``.
        reduce_every_microbatch: 1 = reduce-scatter in every micro-batch (DeepSpeed); 0 =
            only in the last one (FSDP ``no_sync``, which keeps the full unsharded gradients).
        recompute_gathers: 1 = every backward pass gathers each unit twice (re-forward of
            a checkpointed unit whose parameters the forward released, then its backward:
            DeepSpeed stage 3 with activation checkpointing); 0 = once (FSDP).
        stride: devices between consecutive data-parallel ranks (``tp·pp`` under PTD-P
            placement, 1 for pure ZeRO-3).
        channels: NCCL channels (= SMs) of the collectives (default
            :data:`jaxmodel.parallel.overlap.DEFAULT_CHANNELS` ``["zero"]``).
        compute_bytes_fwd, compute_bytes_bwd: main-memory bytes of one unit's compute (0: no
            memory contention modelled for the compute).
        collective_times: ``(gather, reduce_scatter, replica_allreduce)`` seconds per unit
            when the caller has evaluated them already (e.g. in one batched call with its
            other collectives); ``None`` evaluates them in :func:`zero3_step`.
        copy_out_bytes, copy_in_bytes: main-memory bytes per unit parameter of the copy
            kernels each gather / reduce-scatter runs on the compute stream (FSDP2:
            :func:`impl_costs`; 0 = none), :func:`copy_time` each, added to the unit's
            compute.
        net: static :class:`jaxmodel.comm.NetVariant` of the system (prunes the graph only).
    """

    weight_bytes: Any = 2.0
    grad_comm_bytes: Any = 2.0
    grad_bytes: Any = 4.0
    optimizer_bytes: Any = 12.0
    shard_weight_bytes: Any = None
    unsharded_grad_bytes: Any = 0.0
    prefetch: Any = 1.0
    shard_group: Any = None
    reduce_every_microbatch: Any = 1.0
    recompute_gathers: Any = 0.0
    stride: Any = 1.0
    channels: Any = None
    compute_bytes_fwd: Any = 0.0
    compute_bytes_bwd: Any = 0.0
    collective_times: Any = None
    copy_out_bytes: Any = 0.0
    copy_in_bytes: Any = 0.0
    net: _comm.NetVariant = _comm.ANY_NET


def zero3_options(where: str, options: dict) -> Zero3Options:
    """:class:`Zero3Options` from keywords; ``TypeError`` naming an unknown one."""
    known = {f.name for f in dataclasses.fields(Zero3Options)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"{where}: unknown keyword(s) {unknown}; known {sorted(known)}")
    return Zero3Options(**options)


def _collective(system, op, nbytes, group, stride, net):
    """``(seconds, feasible)`` of one collective over ``group`` devices (0 for a group of
    1; double-where: the model never sees a group of 1)."""
    multi = group > 1.5
    t, ok, _ = _comm.collective_time.single(system, op, nbytes, jnp.where(multi, group, 2.0),
                                            "auto", stride, net)
    return jnp.where(multi, jnp.where(ok, t, 0.0), 0.0), ~multi | ok


#: Main-memory bytes per byte of the tensor that DeepSpeed's per-tensor call path moves
#: beside NCCL (module docstring, "Per-tensor collectives"): all-gather = zero-fill (1) + copy
#: out of the flattened output (2); reduce-scatter = pre-division (2) + copy into the
#: flattened input (2).
LIST_API_HBM = {"all_gather": 3.0, "reduce_scatter": 4.0}

#: DeepSpeed's ``stage3_param_persistence_threshold`` default (DeepSpeed ZeRO stage 3
#: configuration, 2021): parameters with fewer elements stay gathered (never all-gathered).
PERSISTENCE_THRESHOLD = 1e5


#: Achieved fraction of the modelled NCCL speed of DeepSpeed's per-tensor flat rings that
#: cross an InfiniBand (NCCL network) tier: :func:`ring_efficiency_of`.
FLAT_RING_EFFICIENCY = float(
    _tech_tables.table("network")["infiniband"]["flat_ring_efficiency"])


def ring_efficiency_of(system, group, stride=1.0, efficiency=None):
    """Achieved fraction of the modelled NCCL collective speed for DeepSpeed's per-tensor
    rings over ``group`` ranks ``stride`` devices apart: ``efficiency`` (default
    :data:`FLAT_RING_EFFICIENCY`, calibrated on rings spanning 48–280 HDR InfiniBand nodes)
    where the ring crosses an NCCL network tier (``NetLevel.nccl_link = 2``), else 1 (no
    anchor constrains rings inside a node). Dimensionless."""
    f = jnp.result_type(float)
    eff = FLAT_RING_EFFICIENCY if efficiency is None else efficiency
    members, _, _ = _comm.group_tiers(system, jnp.maximum(jnp.asarray(group, dtype=f), 1.0),
                                      stride)
    crosses = jnp.asarray(False)
    for k, lvl in enumerate(system.levels):
        crosses = crosses | ((members[k] > 1.5) & (lvl.nccl_link > 1.5))
    return jnp.where(crosses, jnp.clip(jnp.asarray(eff, dtype=f), 1e-3, 1.0), 1.0)


def layer_tensors(model, tp=1.0):
    """Elements per tensor-parallel rank of one layer's parameter tensors as DeepSpeed's
    stage 3 partitions them (one collective each), for a Megatron-LM GPT layer of 2021
    (Shoeybi et al. 2019; every linear layer carries a bias): four weight matrices — fused
    QKV (MLA: all attention projections but the output, :func:`jaxmodel.workload.params.
    attention_params`), attention output, FC1 (gate and up fused for a gated FFN), FC2 —
    then eight vectors: the four biases (the output dimension of each matrix) and two
    LayerNorms' scale and shift (replicated over TP). The FFN is the dense one
    (``n_experts = 1``) or an MoE layer's shared experts; routed experts are counted apart
    by the caller.

    Returns:
        ``(elements, counts)``: static tuples of the 7 distinct sizes (QKV, output, FC1, FC2
        matrices; QKV bias, FC1 bias; the ``d_model`` vectors) and how many tensors of each
        a layer has (1, 1, 1, 1, 1, 1, 6 = output and FC2 biases and the LayerNorms; 0
        where the size is 0: no call).
    """
    f = jnp.result_type(float)
    tp = jnp.maximum(jnp.asarray(tp, dtype=f), 1.0)
    h = jnp.asarray(model.d_model, dtype=f)
    v_dim = jnp.where(model.is_mla, model.v_head_dim, model.head_dim)
    out = model.n_heads * v_dim * h
    d_q, d_kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    qkv = jnp.where(model.is_mla, _params.attention_params(model) - out,
                    h * (d_q + 2.0 * d_kv))
    gated = (model.activation > 0.5) & (model.activation < 2.5)     # swiglu, geglu
    expert_ff = jnp.where(model.moe_d_ff > 0, model.moe_d_ff, model.d_ff)
    d_ff = jnp.where(model.n_experts > 1.5, model.n_shared_experts * expert_ff, model.d_ff)
    fc1 = h * d_ff * jnp.where(gated, 2.0, 1.0)
    fc2 = h * d_ff
    sizes = (qkv / tp, out / tp, fc1 / tp, fc2 / tp, qkv / h / tp, fc1 / h / tp, h)
    counts = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 6.0)
    return (tuple(jnp.asarray(x, dtype=f) for x in sizes),
            tuple(jnp.where(x > 0, c, 0.0) for x, c in zip(sizes, counts, strict=True)))


def per_tensor_time(dev, op, nccl_times, tensor_bytes, group, counts=None, list_api=1.0,
                    ring_efficiency=1.0):
    """Seconds of ``op`` issued once per tensor, one after another (module docstring,
    "Per-tensor collectives"), from the NCCL times of the calls:
    ``Σ_i n_i·[T_nccl,i / ring_efficiency + list_api·(g·add_overhead_s + h·b_i /
    (mem_bw·add_bw_efficiency))]`` with ``h`` = :data:`LIST_API_HBM` ``[op]``, ``g`` the
    group, ``n_i`` the calls of size ``b_i`` (``counts``, default 1 each). 0 s for a group
    of one.

    Args:
        nccl_times: NCCL seconds of one call per tensor (a static sequence).
        tensor_bytes: bytes of each tensor, in the same order.
        list_api: 1 = the list form of ``torch.distributed`` (``g`` copy kernels and the
            buffer traffic per call), 0 = one flat buffer (``_all_gather_base``).
        ring_efficiency: achieved fraction of the modelled NCCL speed
            (:func:`ring_efficiency_of`).
    """
    f = jnp.result_type(float)
    g = jnp.maximum(jnp.asarray(group, dtype=f), 1.0)
    eff = jnp.clip(jnp.asarray(ring_efficiency, dtype=f), 1e-3, 1.0)
    mem = jnp.maximum(dev.mem_bw * dev.add_bw_efficiency, 1.0)
    counts = (1.0,) * len(tensor_bytes) if counts is None else counts
    total = jnp.asarray(0.0, dtype=f)
    for t, b, n in zip(nccl_times, tensor_bytes, counts, strict=True):
        total = total + n * (t / eff + list_api * (g * dev.add_overhead_s
                                                   + LIST_API_HBM[op] * b / mem))
    return jnp.where(g > 1.5, total, 0.0)


_PER_TENSOR_KEYS = {"elem_bytes": 2.0, "counts": None, "list_api": 1.0,
                    "ring_efficiency": None, "nccl_times": None, "net": _comm.ANY_NET}


def per_tensor_collectives(system, op, tensor_elements, group, stride=1.0, **options):
    """Seconds of DeepSpeed's per-tensor ``op`` (``"all_gather"`` or ``"reduce_scatter"``)
    over ``group`` ranks ``stride`` devices apart for tensors of ``tensor_elements``
    elements (``counts`` of each, default 1) in ``elem_bytes`` bytes: :func:`per_tensor_time`
    of the NCCL time of each call (:func:`jaxmodel.comm.collective_time`, or ``nccl_times``
    when the caller has them), where an all-gather skips the tensors below
    :data:`PERSISTENCE_THRESHOLD` (they stay gathered; their gradients are still
    reduce-scattered).

    Keywords (``options``):
        elem_bytes: bytes per element (default 2).
        counts: calls of each tensor (default 1 each).
        list_api: 1 (default) = the list form of ``torch.distributed``, 0 = one flat buffer
            (:func:`per_tensor_time`).
        ring_efficiency: ``None`` = :func:`ring_efficiency_of` of the ring (calibrated where it
            crosses InfiniBand), else the fraction to use (1 = the NCCL model as is).
        nccl_times: NCCL seconds of one call per tensor, when the caller has them.
        net: static :class:`jaxmodel.comm.NetVariant` of ``system``.

    Returns:
        ``(seconds, feasible)``; 0 s for a group of one.

    Raises:
        TypeError: an unknown keyword (named).
    """
    unknown = sorted(set(options) - set(_PER_TENSOR_KEYS))
    if unknown:
        raise TypeError(f"per_tensor_collectives: unknown keyword(s) {unknown}")
    o = {**_PER_TENSOR_KEYS, **options}
    elem_bytes, counts, list_api = o["elem_bytes"], o["counts"], o["list_api"]
    ring_efficiency, nccl_times, net = o["ring_efficiency"], o["nccl_times"], o["net"]
    f = jnp.result_type(float)
    g = jnp.maximum(jnp.asarray(group, dtype=f), 1.0)
    sizes = [jnp.asarray(x, dtype=f) for x in tensor_elements]
    counts = (1.0,) * len(sizes) if counts is None else counts
    if op == "all_gather":
        counts = [jnp.where(x >= PERSISTENCE_THRESHOLD, c, 0.0)
                  for x, c in zip(sizes, counts, strict=True)]
    nbytes = [elem_bytes * x for x in sizes]
    ok = jnp.asarray(True)
    if nccl_times is None:
        nccl_times = []
        for b in nbytes:
            t, ok_i = _collective(system, op, b, g, stride, net)
            nccl_times.append(t)
            ok = ok & ok_i
    eff = (ring_efficiency_of(system, g, stride) if ring_efficiency is None
           else ring_efficiency)
    return per_tensor_time(system.device, op, nccl_times, nbytes, g, counts, list_api,
                           eff), ok


def impl_args(zero3_impl, recompute):
    """:func:`zero3_step` options of a ``Parallelism.zero3_impl`` code (``types.ZERO3_IMPLS``)
    under the ``recompute`` code: ``(prefetch, recompute_gathers, per_tensor)`` — FSDP (0):
    prefetch one unit, one gather per backward, flat units; DeepSpeed 2021 (1): serial, a
    second backward gather under full recomputation (module docstring, "Re-gather for
    recomputation"; selective recomputation re-runs no parameterised module), per-tensor
    collectives through the list API."""
    f = jnp.result_type(float)
    ds = jnp.asarray(zero3_impl, dtype=f) > 0.5
    full = jnp.asarray(recompute, dtype=f) > 1.5
    return (jnp.where(ds, 0.0, 1.0), jnp.where(ds & full, 1.0, 0.0), ds)


def impl_costs(zero3_impl, weight_bytes=2.0, grad_bytes=4.0, master_bytes=4.0):
    """Per-parameter byte counts of a ``Parallelism.zero3_impl`` code beyond its collectives
    (module docstring, "FSDP2's copies" and "FSDP2's memory"), each a bytes-per-unit-parameter
    count:

    - ``copy_out_bytes``: main-memory bytes of the gather's copy-out on the compute stream —
      FSDP2 ``2·w`` (read + write the unsharded parameters), DeepSpeed 2021 0 (its list-API
      copies are in :func:`per_tensor_time`);
    - ``copy_in_bytes``: bytes of the reduce-scatter's copy-in on the compute stream —
      FSDP2 ``w + g`` (read the unsharded gradients, write the reduce dtype), DeepSpeed 0;
    - ``shard_weight_bytes``: bytes per sharded parameter of a low-precision shard kept
      beside the master — FSDP2 0 where a master copy exists (``master_bytes > 0``: the
      fp32 shard is the parameter), else ``w``; DeepSpeed ``w`` (its fp16 ``ds_tensor``
      partitions beside the optimizer's fp32 ones);
    - ``unsharded_grad_bytes``: bytes per unit parameter of the unsharded gradient buffer
      alive beside the reduce-scatter input — FSDP2 ``w``, DeepSpeed 0.

    Returns:
        dict of the four counts (arrays of the broadcast shape).
    """
    f = jnp.result_type(float)
    fsdp = jnp.asarray(zero3_impl, dtype=f) < 0.5
    w = jnp.asarray(weight_bytes, dtype=f)
    g = jnp.asarray(grad_bytes, dtype=f)
    master = jnp.asarray(master_bytes, dtype=f) > 0
    zero = jnp.zeros_like(w + g)
    return {"copy_out_bytes": jnp.where(fsdp, 2.0 * w, zero),
            "copy_in_bytes": jnp.where(fsdp, w + g, zero),
            "shard_weight_bytes": jnp.where(fsdp & master, zero, w + zero),
            "unsharded_grad_bytes": jnp.where(fsdp, w + zero, zero)}


def copy_time(dev, n_elements, bytes_per_element):
    """Seconds of a memory-bound copy kernel over ``n_elements`` moving ``bytes_per_element``
    of main memory each (reads + writes) on ``dev``: :func:`jaxmodel.ops.elementwise_latency`
    (achievable DRAM bandwidth and its launch floor), 0 where nothing is moved."""
    n = jnp.asarray(n_elements)
    b = jnp.asarray(bytes_per_element)
    on = (n * b) > 0
    t = _ops.elementwise_latency.single(dev, jnp.where(on, n, 1.0), jnp.where(on, b, 1.0),
                                        0.0)
    return jnp.where(on, t, 0.0)


def unit_pass_time(t_compute, t_comm, n_units, prefetch=1.0, t_tail=0.0, contention=None,
                   t_head=None):
    """One pass (forward or backward) over ``n_units`` uniform units whose communication
    ``t_comm`` per unit is prefetched ``prefetch`` units ahead (module docstring):
    ``t_head + (n−1)·ov(t_compute, t_comm) + t_compute + t_tail`` with prefetch ≥ 1
    (``t_head``: the first unit's exposed collective, default ``t_comm``; ``t_tail``: the
    last unit's trailing collective, e.g. its reduce-scatter), else
    ``n·(t_comm + t_compute)``; ``ov`` is :func:`jaxmodel.parallel.overlap.overlapped_time`
    with ``contention = (compute_bytes, comm_bytes, share, dev)`` (default none).

    Returns:
        ``(total_s, contention_s)``: the pass and the compute slowdown inside it.
    """
    f = jnp.result_type(float)
    n = jnp.maximum(jnp.asarray(n_units, dtype=f), 1.0)
    tot, _, slow = ov.overlapped_time(t_compute, t_comm,
                                      *(contention or (0.0, 0.0, 0.0, None)))
    head = t_comm if t_head is None else t_head
    pipelined = head + (n - 1.0) * tot + t_compute + t_tail
    serial = n * (t_comm + t_compute)
    on = jnp.asarray(prefetch, dtype=f) >= 0.5
    return jnp.where(on, pipelined, serial), jnp.where(on, (n - 1.0) * slow, 0.0)


def _unit_collectives(system, ag_bytes, rs_bytes, shard, replicas, o: Zero3Options):
    """Seconds of one unit's gather, reduce-scatter and HSDP replica all-reduce (or
    ``o.collective_times``) and whether the network fits them."""
    f = jnp.result_type(float)
    stride = jnp.asarray(o.stride, dtype=f)
    if o.collective_times is not None:
        g, r, a = (jnp.asarray(x, dtype=f) for x in o.collective_times)
        return g, r, a, jnp.asarray(True)
    ar_bytes = nx.safe_div(rs_bytes, shard, fill=0.0)
    g, ok_g = _collective(system, "all_gather", ag_bytes, shard, stride, o.net)
    r, ok_r = _collective(system, "reduce_scatter", rs_bytes, shard, stride, o.net)
    a, ok_a = _collective(system, "all_reduce", ar_bytes, replicas, stride * shard, o.net)
    return g, r, a, ok_g & ok_r & ok_a


def zero3_step(system, n_params, n_units, t_fwd_unit, t_bwd_unit, dp, micro_batches=1.0,
               **options):
    """Time of the ZeRO-3 / FSDP part of a training step on one device (module docstring).

    Args:
        system: the :class:`~jaxmodel.types.System` (collectives via
            :func:`jaxmodel.comm.collective_time`).
        n_params: parameters sharded by ZeRO-3 (per pipeline stage / TP rank when combined
            with model parallelism).
        n_units: FSDP units (wrapped modules) they are split into, uniform.
        t_fwd_unit, t_bwd_unit: compute of one unit for one micro-batch, forward and backward
            (incl. recomputation), s.
        dp: data-parallel degree (devices over which the parameters are sharded, or sharded
            and replicated with ``shard_group``).
        micro_batches: micro-batches per step (gradient accumulation).
        **options: the fields of :class:`Zero3Options` (``weight_bytes``,
            ``grad_comm_bytes``, ``prefetch``, ``shard_group``, ``reduce_every_microbatch``,
            ``recompute_gathers``, ``stride``, ``channels``, ``compute_bytes_fwd``,
            ``compute_bytes_bwd``, ``collective_times``, ``copy_out_bytes``,
            ``copy_in_bytes``, ``net``).

    Returns:
        dict: ``total`` (s, the ZeRO part of the step: all micro-batches' forward and backward
        passes), the components :data:`ZERO3_KEYS` — ``compute`` (standalone compute),
        ``exposed_comm`` (``total − compute − contention``, the copy kernels included),
        ``contention`` (compute slowdown under overlapped collectives), ``gather`` /
        ``reduce_scatter`` / ``replica_allreduce`` (standalone collective time per step, for
        reporting), ``copies`` (the copy kernels of the step, on the compute stream) — and
        ``feasible`` (the groups fit the network).

    Raises:
        TypeError: an unknown keyword (named).
    """
    o = zero3_options("zero3_step", options)
    f = jnp.result_type(float)
    dev = system.device
    dp = jnp.maximum(jnp.asarray(dp, dtype=f), 1.0)
    n = jnp.maximum(jnp.asarray(n_units, dtype=f), 1.0)
    m = jnp.maximum(jnp.asarray(micro_batches, dtype=f), 1.0)
    shard = (dp if o.shard_group is None
             else jnp.clip(jnp.asarray(o.shard_group, dtype=f), 1.0, dp))
    replicas = jnp.maximum(dp / shard, 1.0)
    p_unit = jnp.asarray(n_params, dtype=f) / n
    ag_bytes = p_unit * o.weight_bytes
    rs_bytes = p_unit * o.grad_comm_bytes
    ar_bytes = nx.safe_div(rs_bytes, shard, fill=0.0)
    g, r, a, ok = _unit_collectives(system, ag_bytes, rs_bytes, shard, replicas, o)
    share = ov.sm_share(dev, ov.DEFAULT_CHANNELS["zero"] if o.channels is None else o.channels)
    h_g = ov.comm_hbm_bytes("all_gather", ag_bytes, shard)
    h_r = ov.comm_hbm_bytes("reduce_scatter", rs_bytes, shard)
    h_a = ov.comm_hbm_bytes("all_reduce", ar_bytes, replicas)

    regather = 1.0 + jnp.clip(jnp.asarray(o.recompute_gathers, dtype=f), 0.0, 1.0)
    # FSDP2's copy-out after every gather and copy-in before every reduce-scatter run on the
    # compute stream (module docstring): they lengthen the unit's compute
    t_co = copy_time(dev, p_unit, jnp.asarray(o.copy_out_bytes, dtype=f))
    t_ci = copy_time(dev, p_unit, jnp.asarray(o.copy_in_bytes, dtype=f))

    def bwd(with_rs, with_ar):
        comm = regather * g + with_rs * r + with_ar * a
        tail = with_rs * r + with_ar * a
        hb = regather * h_g + with_rs * h_r + with_ar * h_a
        c_b = t_bwd_unit + regather * t_co + with_rs * t_ci
        return unit_pass_time(c_b, comm, n, o.prefetch, tail,
                              (o.compute_bytes_bwd, hb, share, dev), t_head=regather * g)

    t_f, s_f = unit_pass_time(t_fwd_unit + t_co, g, n, o.prefetch, 0.0,
                              (o.compute_bytes_fwd, h_g, share, dev))
    every = jnp.clip(jnp.asarray(o.reduce_every_microbatch, dtype=f), 0.0, 1.0)
    t_b_mid, s_b_mid = bwd(every, 0.0)
    t_b_last, s_b_last = bwd(1.0, 1.0)
    total = m * t_f + (m - 1.0) * t_b_mid + t_b_last
    contention = m * s_f + (m - 1.0) * s_b_mid + s_b_last
    compute = m * n * (t_fwd_unit + t_bwd_unit)
    n_rs = (m - 1.0) * every + 1.0
    return {"total": total, "compute": compute, "contention": contention,
            "exposed_comm": total - compute - contention,
            "gather": (1.0 + regather) * m * n * g, "reduce_scatter": n_rs * n * r,
            "replica_allreduce": n * a,
            "copies": (1.0 + regather) * m * n * t_co + n_rs * n * t_ci,
            "feasible": ok}


def zero3_memory(n_params, n_units, dp, **options):
    """Model-state memory per device under ZeRO-3 / FSDP, bytes (activations are the
    caller's); ``options``: the fields of :class:`Zero3Options` (``shard_group``,
    ``prefetch``, ``weight_bytes``, ``grad_bytes``, ``optimizer_bytes``,
    ``reduce_every_microbatch``, ``shard_weight_bytes``, ``unsharded_grad_bytes``).

    Source: Rajbhandari et al. SC'20 §5 (``(2 + 2 + K)·Ψ / N_d`` with K = 12 for mixed-
    precision Adam; here weights ``shard_weight_bytes`` (default ``weight_bytes``),
    gradients ``grad_bytes``, optimizer ``optimizer_bytes`` per parameter, each divided by
    the shard group); Zhao et al. VLDB 2023 §3.3: the unsharded units alive at once — the
    computing unit, ``prefetch`` units being gathered (``weight_bytes`` each), and in the
    backward one unsharded gradient unit before its reduce-scatter (the reduce-scatter input
    in ``grad_bytes`` plus, FSDP2, the unsharded gradients in ``unsharded_grad_bytes``;
    module docstring, "FSDP2's memory"); FSDP ``no_sync`` (``reduce_every_microbatch = 0``)
    keeps the full unsharded gradients.

    Returns:
        dict bytes: ``weights`` (sharded + gathered units), ``gradients``, ``optimizer``,
        ``total``.
    """
    o = zero3_options("zero3_memory", options)
    f = jnp.result_type(float)
    dp = jnp.maximum(jnp.asarray(dp, dtype=f), 1.0)
    shard = (dp if o.shard_group is None
             else jnp.clip(jnp.asarray(o.shard_group, dtype=f), 1.0, dp))
    psi = jnp.asarray(n_params, dtype=f)
    unit = psi / jnp.maximum(jnp.asarray(n_units, dtype=f), 1.0)
    live = 1.0 + jnp.maximum(jnp.asarray(o.prefetch, dtype=f), 0.0)
    w_shard = o.weight_bytes if o.shard_weight_bytes is None else o.shard_weight_bytes
    weights = w_shard * psi / shard + o.weight_bytes * live * unit
    every = jnp.clip(jnp.asarray(o.reduce_every_microbatch, dtype=f), 0.0, 1.0)
    grads = (every * (o.grad_bytes * (psi / shard + unit) + o.unsharded_grad_bytes * unit)
             + (1.0 - every) * o.grad_bytes * psi)
    opt = o.optimizer_bytes * psi / shard
    return {"weights": weights, "gradients": grads, "optimizer": opt,
            "total": weights + grads + opt}


__all__ = ["zero3_step", "zero3_memory", "Zero3Options", "impl_costs", "copy_time", "unit_pass_time",
           "per_tensor_collectives", "per_tensor_time", "layer_tensors", "ring_efficiency_of",
           "impl_args", "LIST_API_HBM", "PERSISTENCE_THRESHOLD", "FLAT_RING_EFFICIENCY",
           "ZERO3_KEYS"]
