"""What a training step takes and gives: the continuous step knobs (:class:`TrainOptions`,
a frozen pytree), the static switches fixed once per compiled step (:class:`TrainStatics`),
the result (:class:`TrainResult`) and the training constants of ``hw_db/tech/training.toml``.

:func:`jaxmodel.parallel.train.make_train_step` builds the single-configuration step
``step(options) -> TrainResult`` from a system, a model, a plan and these statics (the
factories of JAX MD, Schoenholz & Cubuk, NeurIPS 2020: a builder fixes the static structure
once and returns a pure function of the traced inputs, which the caller batches).

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import tech_tables as _tech_tables
from jaxmodel.types import is_concrete
from jaxmodel.workload import layer as _layer

# --------------------------------------------------------------------------------------------
# Training constants (hw_db/tech/training.toml, each with its source)
# --------------------------------------------------------------------------------------------
CONSTANTS = {k: float(v) for k, v in _tech_tables.table("training")["training"].items()}

BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble",
                  "embedding", "optimizer", "ep_comm")


def sustained_device(dev, clock_fraction=None):
    """The device as it runs under sustained training load: ``freq_hz`` × the sustained
    clock fraction (the device field ``sustained_clock_fraction``, set in
    ``hw_db/devices/*.toml``; 1.0 by default), or ``clock_fraction`` when given.

    Tables of GEMM latencies for the ``gemm=`` hook must be built on this device
    (:meth:`jaxmodel.parallel.gemm_table.GemmTable.for_train_step` does).
    """
    frac = dev.sustained_clock_fraction if clock_fraction is None else clock_fraction
    return dataclasses.replace(dev, freq_hz=dev.freq_hz * frac)


# --------------------------------------------------------------------------------------------
# Options: the continuous (traced, batchable) knobs of one step
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainOptions:
    """The continuous knobs of one training step (frozen pytree; every leaf may carry a
    batch axis; ``None`` takes the default named below).

    Attributes:
        global_batch: sequences per optimizer step.
        seq_len: tokens per sequence.
        dp_overlap: 1 (default) = DP/ZeRO collectives overlapped with the backward/forward
            under SM/memory contention (Megatron-core bucketing), 0 = serial (Megatron-LM
            2021's "local" DDP); fractions interpolate linearly.
        tp_overlap: 0 (default) = serial TP collectives (Megatron-LM 2021), 1 = Megatron-core
            ``--tp-comm-overlap`` at Transformer Engine's granularity for the plans
            :func:`jaxmodel.parallel.overlap.tp_eligible` admits; fractions interpolate.
        pp_overlap: 0 (default) = blocking stage-boundary exchanges (Megatron-LM 2021;
            Megatron-core's default), 1 = Megatron-core ``overlap_p2p_comm`` under the
            interleaved schedule (:func:`jaxmodel.parallel.pipeline.overlapped_p2p_time`);
            fractions interpolate.
        grad_bytes: bytes per gradient element for memory and reduction traffic (default
            the precision's ``grad_bytes``).
        adam_bytes_per_param: main-memory bytes the optimizer step moves per parameter
            (default :data:`CONSTANTS`, ``hw_db/tech/training.toml``).
        clock_fraction: sustained core-clock fraction (default the device's
            ``sustained_clock_fraction``, :func:`sustained_device`).
        dropout: 1 (default) = Megatron GPT's hidden and attention dropout (0.1), 0 = none
            (e.g. the Llama recipes): the memory-bound kernels of
            :func:`jaxmodel.parallel.train_stage.residual_dropout_times`.
        megatron2021_stack: 1 = the software stack of Narayanan et al., SC'21 (Megatron-LM
            of 2021): its eager bias / copy / gradient-accumulation kernels
            (:func:`jaxmodel.workload.layer.megatron2021_kernels`,
            :func:`jaxmodel.workload.layer.grad_accumulation`); 0 (default) = today's fused
            kernels.

    Example:
        >>> o = jm.TrainOptions(global_batch=1536, seq_len=2048, dp_overlap=0.0)
        >>> o.seq_len, o.tp_overlap is None
        (2048, True)
    """

    global_batch: Any
    seq_len: Any
    dp_overlap: Any = None
    tp_overlap: Any = None
    grad_bytes: Any = None
    adam_bytes_per_param: Any = None
    clock_fraction: Any = None
    dropout: Any = None
    megatron2021_stack: Any = None
    pp_overlap: Any = None


jax.tree_util.register_dataclass(
    TrainOptions, data_fields=[f.name for f in dataclasses.fields(TrainOptions)],
    meta_fields=[])

#: The values the ``None`` fields of :class:`TrainOptions` take (``grad_bytes``,
#: ``adam_bytes_per_param`` and ``clock_fraction`` come from the precision, hw_db and the
#: device instead).
OPTION_DEFAULTS = {"dp_overlap": 1.0, "tp_overlap": 0.0, "dropout": 1.0,
                   "megatron2021_stack": 0.0, "pp_overlap": 0.0}


def with_defaults(options: TrainOptions) -> TrainOptions:
    """``options`` with its ``None`` knobs of :data:`OPTION_DEFAULTS` filled in."""
    return dataclasses.replace(options, **{
        k: v for k, v in OPTION_DEFAULTS.items() if getattr(options, k) is None})


def dropout_mode_options(code) -> dict:
    """The option fields of a :data:`jaxmodel.types.DROPOUT_MODES` code: ``"none"`` (0) →
    ``dropout=0``; ``"megatron"`` (1) → ``dropout=1``; ``"megatron2021"`` (2) →
    ``dropout=1, megatron2021_stack=1`` (Megatron GPT's dropout on the Megatron-LM 2021
    stack). Concrete codes give numpy values, traced ones jax arrays."""
    xp = np if is_concrete(code) else jnp
    c = xp.asarray(code)
    return {"dropout": xp.where(c > 0.5, 1.0, 0.0),
            "megatron2021_stack": xp.where(c > 1.5, 1.0, 0.0)}


# --------------------------------------------------------------------------------------------
# Statics: fixed once per compiled step
# --------------------------------------------------------------------------------------------
class TrainStatics(NamedTuple):
    """Static switches of a training step's graph, fixed once at the API edge (Python
    values: part of a compilation's cache key, never traced; ``None`` keeps every branch).

    Attributes:
        gemm: GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s`` (e.g.
            :meth:`jaxmodel.parallel.gemm_table.GemmTable.lookup`); None = the ops tile
            search.
        variant: the workload's op-graph switches (:class:`jaxmodel.workload.layer.Variant`,
            with the network tiers' static topologies and DeepSpeed's per-tensor ZeRO-3
            calls).
        context: the context-parallel exchange
            (:func:`jaxmodel.parallel.context.context_flag`).
        zero_used: ``False`` when no plan uses ZeRO (its reduce-scatters and the ZeRO-3
            schedule stay out of the graph: the same numbers).

    Example:
        >>> s = jm.TrainStatics(context=False)
        >>> s.gemm is None, s.context
        (True, False)
    """

    gemm: Callable | None = None
    variant: _layer.Variant = _layer.ANY
    context: bool | None = None
    zero_used: bool | None = None


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TrainResult:
    """One training step (frozen pytree; every field carries the batch shape in front).

    Attributes:
        step_time_s: seconds per optimizer step (``+inf`` when infeasible).
        mfu: model FLOPs utilisation (PaLM): model FLOPs (no recomputation) / (step time ·
            devices · peak matrix FLOP/s) (0 when infeasible).
        tokens_per_s: global_batch · seq_len / step time.
        memory_bytes: peak memory of the most loaded device (first stage), bytes — reported
            for infeasible (e.g. out-of-memory) plans too when their structure is valid.
        feasible: bool.
        reason: int32 code into :data:`jaxmodel.numerics.REASONS` (0 = ok).
        breakdown: dict seconds per step: ``compute`` (layer forward+backward),
            ``recompute``, ``tp_comm``, ``pp_comm``, ``dp_comm`` (exposed parts only; under
            ZeRO-3 the exposed per-unit parameter all-gathers and gradient reduce-scatters,
            :func:`jaxmodel.parallel.zero.zero3_step` — with ``zero3_impl="deepspeed"``,
            serial, exactly ``M·n·(3·g + r)`` under full recomputation),
            ``bubble`` (pipeline fill/drain), ``embedding`` (embedding, LM head, loss and their
            TP collectives), ``optimizer``, ``ep_comm`` (MoE dispatch/combine all-to-all,
            :func:`jaxmodel.workload.moe.alltoall_time`). They sum to ``step_time_s``.
        memory: dict bytes per device, the terms of
            :data:`jaxmodel.workload.memory.TRAIN_MEMORY_TERMS` — ``weights``,
            ``fp8_weight_cache``, ``gradients``, ``optimizer``, ``activations``,
            ``tp_comm_buffers``, ``nccl_buffers`` — and
            ``total``, their sum (:func:`jaxmodel.memory_breakdown` lists them in GiB).
        flops_per_step: model FLOPs of one step (all devices, no recomputation), FLOP.
        achieved_flops_per_device: hardware FLOPs (with the plan's recomputation) / (step
            time · devices), FLOP/s; with full recomputation Megatron's eq. 3 TFLOP/s.
        microbatches: micro-batches per step per data-parallel replica, m.
        hfu: hardware FLOPs utilisation, ``achieved_flops_per_device / peak``; with full
            recomputation comparable with PTD-P Table 1's "% of peak".
    """

    step_time_s: Any
    mfu: Any
    tokens_per_s: Any
    memory_bytes: Any
    feasible: Any
    reason: Any
    breakdown: dict
    memory: dict
    flops_per_step: Any
    achieved_flops_per_device: Any
    microbatches: Any
    hfu: Any


jax.tree_util.register_dataclass(
    TrainResult, data_fields=[f.name for f in dataclasses.fields(TrainResult)], meta_fields=[])
