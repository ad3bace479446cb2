"""Pipeline-parallel schedules: micro-batches, bubble, in-flight activations, stage transfers.

Single-configuration formulas (scalar leaves); the schedule is a numeric code
(``types.SCHEDULES``: gpipe=0, 1f1b=1, interleaved=2, dualpipe=3) selected with ``jnp.where``.

Sources:
    * GPipe: Huang et al., "GPipe", NeurIPS 2019 — all forwards, then all backwards; bubble
      (p−1)/m; every micro-batch's activations are held until its backward (m in flight).
    * 1F1B (PipeDream-Flush): Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
      Training", ICML 2021, and Narayanan et al., "Efficient Large-Scale Language Model
      Training on GPU Clusters Using Megatron-LM", SC'21 (here "PTD-P") §2.2.1: same bubble
      (p−1)/m, at most p micro-batches in flight on the first stage.
    * Interleaved 1F1B: PTD-P §2.2.2 — each device holds v model chunks; bubble
      (p−1)/(m·v); the number of micro-batches must be a multiple of p; every micro-batch
      crosses v times more stage boundaries. Activation memory of the first stage
      (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
      MLSys 2023, §4.2.3): the L/p layers' activations of p micro-batches times
      (1 + (p−1)/(p·v)), i.e. p + (p−1)/v micro-batch-stages.
    * DualPipe: DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §3.2.1 and Table 2, and
      its code (deepseek-ai/DualPipe, ``dualpipe/dualpipe.py``): rank ``i`` holds stage ``i``
      and stage ``p−1−i`` (two copies of the parameters in the pipeline, "2×"), half the
      micro-batches enter at each end; PP+1 micro-batch-stages of activations in flight;
      bubble ``(p/2 − 1)(F&B + B − 3W)`` (:func:`dualpipe_bubble`); every forward chunk runs
      paired with a backward chunk of another micro-batch, each one's all-to-all and stage
      transfers hidden behind the other's computation (:func:`jaxmodel.workload.moe.
      dualpipe_overlap`). Needs ``p`` even and ``m ≥ 2p`` even (``DualPipe.step``'s asserts).

    * Uneven stages (:func:`stage_layers`, :func:`stage_in_flight`): ``⌊L/p⌋`` or ``⌈L/p⌉``
      layers per stage, the lighter ones at the ends (Megatron-LM
      ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``);
      the step's steady state runs at the slowest stage, the bubble at the mean stage
      (the fill and drain pass through every stage once), memory at the largest stage.

Symbols: p pipeline stages (``par.pp``), v virtual stages per device (``par.interleave``),
m micro-batches per step and per data-parallel replica.

Example:
    >>> from jaxmodel.parallel import pipeline
    >>> float(pipeline.bubble_time(1.0, 8.0, 1.0, 1.0)) / 64.0   # 1F1B, p=8, m=64
    0.109375
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.numerics import safe_div

GPIPE, ONE_F_ONE_B, INTERLEAVED, DUALPIPE = 0.0, 1.0, 2.0, 3.0
#: Recompute codes (``types.RECOMPUTE``): none, selective, full, norm_upproj (DeepSeek-V3
#: §3.2.3: RMSNorm and the MLA up-projections recomputed in the backward).
NO_RECOMPUTE, SELECTIVE, FULL, NORM_UPPROJ = 0.0, 1.0, 2.0, 3.0


def is_full_recompute(recompute):
    """True for the ``full`` recompute code (the whole layer repeated; Korthikanti et al.
    2023 §5): the one code whose activation inventory is the layer input only."""
    return jnp.abs(jnp.asarray(recompute) - FULL) < 0.5


def n_microbatches(global_batch, dp, micro_batch):
    """Micro-batches per step per data-parallel replica, m = B / (dp · b) (PTD-P §2.2).

    Args:
        global_batch: sequences per optimizer step (all replicas), B.
        dp: data-parallel degree.
        micro_batch: sequences per micro-batch, b.

    Returns:
        m (float; an integer for a consistent plan, checked by the caller).
    """
    return safe_div(global_batch, dp * micro_batch, fill=0.0)


def effective_interleave(schedule, interleave):
    """Virtual stages per device actually used: ``interleave`` for the interleaved schedule,
    1 otherwise (GPipe and 1F1B have one chunk per device)."""
    return jnp.where(schedule == INTERLEAVED, jnp.maximum(interleave, 1.0), 1.0)


def in_flight_microbatches(schedule, pp, m, interleave):
    """Micro-batches whose stage activations the most loaded (first) stage holds at its peak.

    In units of "one micro-batch's activations for the L/p layers of one stage":
    GPipe m; 1F1B min(p, m); interleaved p·(1 + (p−1)/(p·v)) = p + (p−1)/v, capped at
    m·(1 + (p−1)/(p·v)) when m < p (Korthikanti et al. 2023 §4.2.3; PTD-P §2.2); DualPipe
    min(p + 1, m) (DeepSeek-V3 Technical Report, Table 2: "Activation PP+1", per device).

    Args:
        schedule: schedule code.
        pp: pipeline stages p.
        m: micro-batches per step per replica.
        interleave: virtual stages per device v.

    Returns:
        In-flight micro-batch-stages (float ≥ 0).
    """
    v = effective_interleave(schedule, interleave)
    warm = jnp.minimum(pp, m)
    interleaved = warm * (1.0 + safe_div(pp - 1.0, pp * v, fill=0.0))
    dual = jnp.minimum(pp + 1.0, m)
    return jnp.select([schedule == GPIPE, schedule == INTERLEAVED, schedule == DUALPIPE],
                      [m, interleaved, dual], warm)


def p2p_bytes(micro_batch, seq_len, d_model, tp, act_bytes=2.0):
    """Bytes one tensor-parallel rank sends across a stage boundary per micro-batch, direction.

    The activation tensor is b·s·h elements (PTD-P §4.1). With tensor parallelism Megatron
    sends only a 1/t slice per rank: under sequence parallelism the activations are already
    sharded (Korthikanti §4.2.2); without it the "scatter/gather optimisation" (PTD-P §4.1)
    splits the replicated tensor and re-assembles it with an all-gather over the fast
    intra-node links on the receiving side (costed by the caller).

    Args:
        micro_batch: sequences per micro-batch b.
        seq_len: sequence length s.
        d_model: hidden size h.
        tp: tensor-parallel degree t.
        act_bytes: bytes per activation element (2 for fp16/bf16).

    Returns:
        Bytes, b·s·h·act_bytes / t.
    """
    return safe_div(micro_batch * seq_len * d_model * act_bytes, tp, fill=0.0)


def p2p_transfers_on_critical_path(schedule, pp, m, interleave):
    """Stage-boundary transfers (each one activation or one gradient) on the critical path.

    Megatron-LM as PTD-P ran it (2021, ``megatron/p2p_communication.py``) issues every
    exchange as ``batch_isend_irecv`` followed by ``wait`` and ``torch.cuda.synchronize()``,
    between compute steps: nothing overlaps them (PTD-P §4.1). Steady state: every device
    sends one activation and one gradient per micro-batch and chunk (2·m·v; under the
    interleaved schedule both go out in one exchange with the two neighbours, two tensors
    through the device's link); fill and drain add the 2·(p−1) hops the first forward and
    the last backward travel before every device is busy. With two stages and one chunk
    each, the first stage never sends a gradient and the last never sends an activation:
    under 1F1B one exchange per micro-batch (the first stage's ``send_forward_recv_backward``
    meets the last stage's ``send_backward_recv_forward``) plus the first forward's hop,
    m + 1. GPipe pairs nothing: the first stage sends m activations, then the last sends m
    gradients, each blocking between the sender's computes (forward ``f + m·(f + x)``,
    backward ``m·(b + x) + b``), 2m. DualPipe: its steady-state transfers run beside the
    paired chunks' computation (hidden, :func:`dualpipe_hidden_transfers` of them), only the
    2·(p−1) fill and drain hops are exposed. Zero for p = 1. A replay of Megatron-LM's
    ``schedules.py`` with these blocking exchanges agrees within a few transfers
    (``tests/parallel/test_pipeline_replay.py``).

    Returns:
        Number of transfers (float).
    """
    v = effective_interleave(schedule, interleave)
    two = (pp > 1.5) & (pp < 2.5) & (v < 1.5)
    n = jnp.select([two & (schedule == ONE_F_ONE_B), two & (schedule == GPIPE),
                    schedule == DUALPIPE],
                   [m + 1.0, 2.0 * m, 2.0 * (pp - 1.0)], 2.0 * (m * v + pp - 1.0))
    return jnp.where(pp > 1.0, n, 0.0)


def overlapped_p2p_time(schedule, pp, m, interleave, t_send, chunk_times):
    """Exposed stage-boundary transfer time of one step under Megatron-core's
    ``overlap_p2p_comm`` (``--overlap-p2p-communication``), s.

    Source: Megatron-core 0.7.0 ``megatron/core/pipeline_parallel/schedules.py``,
    ``forward_backward_pipelining_with_interleaving``: with ``config.overlap_p2p_comm`` the
    exchanges are posted asynchronously (``p2p_communication.send_forward_recv_forward`` /
    ``send_backward_recv_backward`` with ``overlap_p2p_comm=True`` return wait handles).
    In the steady 1F1B phase a forward chunk's send/receive is waited on only after the
    next backward chunk, and a backward's only after the next forward: each transfer runs
    beside one chunk's computation, exposed only by what it exceeds it by. The warm-up
    forwards wait for their transfer at the top of the next iteration and the cool-down
    backwards exchange synchronously: the first stage (the most warm-up micro-batches,
    ``W = min(2·(p−1) + (v−1)·p, m·v)``) exposes ``2·(W − (p−1))`` transfers — its warm-up
    and cool-down exchanges less the ``2·(p−1)`` that pass while the pipeline fills and
    drains (the bubble) — as a replay of the schedule shows
    (``tests/parallel/test_pipeline_replay.py``: exact while a transfer is shorter than a
    chunk, within a few per cent up to about its length); with ``m = p`` every micro-batch
    is a warm-up one and nothing overlaps. Only the interleaved schedule has this
    option (Megatron-core's non-interleaved schedule ignores it): the other schedules keep
    their serial count. The NCCL send/receive kernels' SM and memory contention with the
    chunk they overlap is not modelled.

    Args:
        schedule, pp, m, interleave: as :func:`p2p_transfers_on_critical_path`.
        t_send: one transfer (activation or gradient), s.
        chunk_times: ``(forward, backward)`` of one model chunk and micro-batch on the
            slowest stage, s.

    Returns:
        Exposed seconds per step (``n·t_send`` with the serial count ``n`` for the other
        schedules and for p = 1 zero).
    """
    v = effective_interleave(schedule, interleave)
    f_chunk, b_chunk = chunk_times
    serial = p2p_transfers_on_critical_path(schedule, pp, m, interleave) * t_send
    warm = jnp.minimum(2.0 * (pp - 1.0) + (v - 1.0) * pp, m * v)
    steady = jnp.maximum(m * v - warm, 0.0)
    overlapped = (2.0 * jnp.maximum(warm - (pp - 1.0), 0.0) * t_send
                  + steady * (jnp.maximum(t_send - f_chunk, 0.0)
                              + jnp.maximum(t_send - b_chunk, 0.0)))
    # m = p: every micro-batch is a warm-up one (Megatron-core's ``all_warmup_microbatches``),
    # no exchange waits behind a computation
    on = (schedule == INTERLEAVED) & (pp > 1.0) & (m > pp)
    return jnp.where(on, jnp.minimum(overlapped, serial), serial)


def dualpipe_hidden_transfers(pp, m):
    """Stage-boundary transfers of a DualPipe step that run beside computation: one
    activation and one gradient per micro-batch (2·m), counts; 0 for p = 1."""
    return jnp.where(pp > 1.0, 2.0 * m, 0.0)


def bubble_time(schedule, pp, interleave, t_mean):
    """Pipeline fill/drain time of one step, s: (p−1)/v · t_mean.

    The slowest stage bounds the steady state (m micro-batches, composed by the caller),
    the fill and drain cost (p−1)/v average stage-steps — a bubble fraction (p−1)/(m·v) of
    the ideal time for equal stages (GPipe and 1F1B: (p−1)/m; interleaved 1F1B: (p−1)/(m·v);
    PTD-P §2.2.1 and §2.2.2).

    Args:
        schedule: schedule code (gpipe=0, 1f1b=1, interleaved=2).
        pp: pipeline stages p.
        interleave: virtual stages per device v (ignored unless interleaved).
        t_mean: forward+backward time of one micro-batch averaged over the p devices, s.
    """
    v = effective_interleave(schedule, interleave)
    return safe_div(pp - 1.0, v, fill=0.0) * t_mean


# --------------------------------------------------------------------------------------------
# Uneven stages
# --------------------------------------------------------------------------------------------
def stage_layers(n_layers, pp):
    """Decoder layers on the first, the most loaded and the last pipeline stage (counts).

    Layout: every stage holds ``q = ⌊L/p⌋`` or ``c = ⌈L/p⌉`` layers (``L mod p`` stages hold
    ``c``); the lighter stages sit at the ends, where the embedding (first stage) and the LM
    head with the loss (last stage) add their load — the last stage takes ``q``, the first
    ``q`` too when at least two stages are light (``p − L mod p ≥ 2``), else ``c``. This is
    Megatron-LM's ``--decoder-first-pipeline-num-layers q --decoder-last-pipeline-num-layers
    q`` when the ``L − 2q`` middle layers divide evenly over the ``p − 2`` middle stages
    (e.g. 126 layers on 8 stages: 15 | 6 × 16 | 15; on 16: 7 | 14 × 8 | 7) and its
    ``--pipeline-model-parallel-layout`` otherwise (61 layers on 16 stages: 3 | 13 × 4, 3 |
    3; Megatron-core ``TransformerConfig.num_layers_in_first_pipeline_stage`` /
    ``num_layers_in_last_pipeline_stage``, ``pipeline_model_parallel_layout``). With
    ``p | L`` every stage holds ``L/p``; with ``p = 1`` the one stage holds ``L``.

    The most loaded stage holds ``c`` layers; the slowest stage is the largest of
    ``first·t + embedding``, ``c·t`` and ``last·t + head`` (composed by the caller).

    Args:
        n_layers: decoder layers ``L`` (an integer for a consistent model).
        pp: pipeline stages ``p`` (``1 ≤ p ≤ L``).

    Returns:
        ``(first, most, last)`` layers (floats; equal to ``L/p`` each when ``p | L``).
    """
    p = jnp.maximum(pp, 1.0)
    L = jnp.maximum(n_layers, 0.0)
    q = jnp.floor(L / p + 1e-9)
    c = jnp.ceil(L / p - 1e-9)
    rem = L - q * p
    first = jnp.where(p - rem >= 1.5, q, c)
    first = jnp.where(p < 1.5, L, first)
    last = jnp.where(p < 1.5, L, q)
    return first, c, last


def stage_in_flight(schedule, pp, m, interleave):
    """In-flight micro-batch-stages of the first stage and of the second one, the first
    middle stage (the most loaded middle stage of :func:`stage_layers` holds ``⌈L/p⌉``
    layers and sits right after the first): GPipe ``m`` each; 1F1B ``min(p − k, m)`` on
    stage ``k`` (PTD-P §2.2.1: stage ``k`` runs ``p − k`` warm-up forwards); interleaved:
    :func:`in_flight_microbatches` on both (its stages are even); DualPipe ``min(p + 1, m)``
    on every rank (Table 2 of the DeepSeek-V3 report counts it per device). The last stage
    holds ``min(1, m)`` under 1F1B (``m`` under GPipe).

    Returns:
        ``(first, second, last)`` in-flight micro-batch-stages (floats).
    """
    first = in_flight_microbatches(schedule, pp, m, interleave)
    k1 = jnp.where(pp > 1.5, 1.0, 0.0)
    same = (schedule == INTERLEAVED) | (schedule == DUALPIPE)
    second = jnp.select([schedule == GPIPE, same], [m, first], jnp.minimum(pp - k1, m))
    last = jnp.select([schedule == GPIPE, same],
                      [m, first], jnp.minimum(jnp.where(pp > 1.5, 1.0, pp), m))
    return first, second, last


# --------------------------------------------------------------------------------------------
# DualPipe
# --------------------------------------------------------------------------------------------
def dualpipe_bubble(pp, fb, b, w):
    """Pipeline bubble of DualPipe, s: ``(p/2 − 1)·(F&B + B − 3W)``.

    Source: DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §3.2.1, Table 2 (1F1B:
    ``(p − 1)(F + B)``; ZB1P: ``(p − 1)(F + B − 2W)``; DualPipe: ``(p/2 − 1)(F&B + B −
    3W)``), with ``F&B`` the time of a mutually overlapped forward and backward chunk,
    ``B`` the backward for inputs and ``W`` the backward for weights of one chunk (s);
    ``p`` even.
    """
    return jnp.maximum(pp / 2.0 - 1.0, 0.0) * jnp.maximum(fb + b - 3.0 * w, 0.0)


def dualpipe_state_factor(zero_stage_sharding, zero):
    """Copies of a class of model states a DualPipe rank holds relative to 1F1B, 1 or 2.

    Each rank holds two stages (``i`` and ``p−1−i``; DeepSeek-V3 Technical Report §3.2.1:
    "DualPipe requires keeping two copies of the model parameters", Table 2 "Parameter
    2×"), so every stage's parameters live on ``2·dp`` ranks. A state class sharded by ZeRO
    (``zero ≥ zero_stage_sharding``: 1 optimizer states, 2 gradients, 3 weights; Rajbhandari
    et al. 2020 §5) is split over those ``2·dp`` ranks and stays at its 1F1B size; an
    unsharded class is held twice. Count.
    """
    return jnp.where(zero >= zero_stage_sharding - 0.5, 1.0, 2.0)
