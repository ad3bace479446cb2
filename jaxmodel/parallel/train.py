"""One training step of a decoder-only transformer under DP × TP × PP × CP (+SP, EP, ZeRO,
recompute).

``train_step(system, model, par, global_batch, seq_len)`` → :class:`TrainResult`.

The step is built from per-layer times (:func:`jaxmodel.workload.layer.
training_layer_times`, :func:`~jaxmodel.workload.layer.embedding_times`), the collectives
(:func:`jaxmodel.comm.collective_time`) and the elementwise kernel (optimizer), composed as
Megatron-LM executes them (Narayanan et al., SC'21, "PTD-P"; Korthikanti et al., MLSys 2023):

**Plan rules and placement** (:mod:`jaxmodel.parallel.plan`, PTD-P §3.2 "Takeaway #1/#2"):
device id = tp_rank + tp·(cp_rank + cp·(pp_rank + pp·dp_rank)), i.e. TP innermost (inside a
node), then CP, PP, then DP across nodes. Collective groups: TP contiguous (stride 1), CP at
stride tp, DP at stride tp·cp·pp, EP on ``ep`` consecutive DP ranks and DP_exp = dp/ep at
stride tp·cp·pp·ep; pipeline transfers cross the outermost network tier the tp·cp·pp devices
of one pipeline span. Feasibility is the plan
module's rules (structure, device, network, finiteness) followed by memory.

**Per stage and micro-batch** (slowest stage): its layers (all ``v`` chunks of a device;
``⌊L/p⌋`` or ``⌈L/p⌉`` when ``p`` does not divide ``L``, the lighter stages at the ends:
:func:`jaxmodel.parallel.pipeline.stage_layers`, the slowest of the first, the most loaded
and the last stage counts)
× (forward + backward + recompute + TP collectives, all serial — Megatron does not overlap TP
communication — plus the bias/dropout/residual kernels of :func:`residual_dropout_times`),
plus the embedding on the first stage and the LM head + loss on the last (both on the one
stage when p = 1).

**Pipeline** (:mod:`jaxmodel.parallel.pipeline`): m·t_max + (p−1)/v·t_mean + exposed
stage-boundary transfers (2 per micro-batch and chunk, plus fill/drain; m + 1 for two
stages), each b·s·h·2/t bytes
(scatter/gather optimisation, PTD-P §4.1; the re-assembling all-gather over TP when SP is off).
With p > 1 and tied embeddings the first and last stage all-reduce the embedding gradient.

**DualPipe** (``schedule="dualpipe"``; DeepSeek-V3 Technical Report §3.2.1–3.2.2, Table 2;
deepseek-ai/DualPipe): each rank runs stage ``i`` and ``p−1−i`` (its load per micro-batch the
mean of the two), the all-to-all and the steady stage transfers hidden behind the paired
forward/backward chunks with the computation on the SMs left by the communication's 20
(:func:`_dualpipe`), bubble ``(p/2 − 1)(F&B + B − 3W)``, two copies of the parameters
(weights and unsharded gradients 2×, ZeRO-sharded states split over both copies' ``2·dp``
ranks), ``p + 1`` micro-batches in flight. ``recompute="norm_upproj"``: RMSNorm and the MLA
up-projections recomputed (§3.2.3), the activations of §3.3.3.

**Context parallelism** (``par.cp``, :mod:`jaxmodel.parallel.context`; Liu et al., ICLR
2024, ring attention; Megatron-core ``--context-parallel-size``): placement tp → cp → pp →
dp (CP at stride ``tp``, DP at ``tp·cp·pp``, the pipeline spans ``tp·cp·pp`` devices). Every
token-wise operation, the embedding, the stage-boundary transfers and the stored
activations use the ``s/cp`` local tokens; the attention of the local queries runs against
all ``s`` keys with the ring's KV exchange overlapped block by block
(:func:`~jaxmodel.parallel.context.cp_layer_times`); gradients are reduced and ZeRO-sharded
over ``dp·cp``. ``cp = 1`` is the plain layer.

**Data parallelism and ZeRO** (Rajbhandari et al., SC'20, §5 and §7): gradients are reduced in
``grad_bytes`` (4 = fp32 main gradients, as Megatron-LM keeps them), parameters gathered in
the precision's ``weight_bytes`` (2), over the DP (·CP) group of the most loaded stage.
ZeRO-3 runs as FSDP does (:func:`jaxmodel.parallel.zero.zero3_step`, Zhao et al., VLDB 2023
§3.3): one unit per layer, gathered one unit ahead, its memory the shard plus the units
alive unsharded (:func:`jaxmodel.parallel.zero.zero3_memory`); with ``par.zero3_impl =
"deepspeed"`` as DeepSpeed's stage 3 of 2021 did (Rajbhandari et al., SC'20): serial
per-tensor collectives, three gathers per layer under full recomputation
(:func:`jaxmodel.parallel.zero.impl_args`):

===========  =====================================================  =======================
ZeRO stage   collectives                                           overlap window
===========  =====================================================  =======================
0            all-reduce(grads) once per step                       last micro-batch's bwd
1            reduce-scatter(grads) once + all-gather(params) once  last bwd / next first fwd
2            reduce-scatter(grads) every micro-batch + all-gather   that micro-batch's bwd /
             (params) once                                           next first fwd
3            per micro-batch and unit (layer): all-gather(params)   the unit before's fwd /
             for fwd and for bwd, reduce-scatter(grads)             bwd (prefetch 1 unit)
===========  =====================================================  =======================

**Overlap model** (:mod:`jaxmodel.parallel.overlap`, with SM and memory-bandwidth
contention, Rashidi et al. ISCA 2021 §3). Gradient buckets are reduced while the backward
pass still runs (PyTorch DDP, Li et al., VLDB 2020, §3.2.3 "bucketing"; Megatron-core
``--overlap-grad-reduce``, buckets of ``max(40 M, 1 M·dp)`` parameters), and the ZeRO
parameter all-gather overlaps the forward (``--overlap-param-gather``; FSDP prefetching, Zhao
et al., VLDB 2023, §3.3). Under the interleaved schedule each of the ``v`` model chunks of the
first stage synchronises on its own once its last backward ends
(:func:`~jaxmodel.parallel.overlap.chunked_dp_exposed`): the window of one chunk is
``1/v`` of one micro-batch's stage backward (forward for the gather), the deeper chunks'
collectives queue behind each other, and the collective's NCCL kernels hold
``DEFAULT_CHANNELS["dp"]`` SMs and move their ring traffic through main memory, which slows
the backward they run beside. The estimate is never above the serial collective.
``dp_overlap = 1`` (default) is this overlapped execution, ``dp_overlap = 0`` serialises
everything, as Megatron-LM 2021 did (its "local" DDP all-reduced after the last backward);
fractions interpolate linearly between the two.

**TP communication overlap** (``tp_overlap``, default 0 = Megatron-LM 2021, which runs the TP
collectives serially): Megatron-core ``--tp-comm-overlap`` with Transformer Engine's
userbuffers at the granularity they have (:func:`~jaxmodel.parallel.overlap.te_tp_exposed`):
each collective only beside the GEMM that feeds or drains it (shares of the layer's compute
from :func:`~jaxmodel.parallel.overlap.tp_host_fractions`) — all-gathers as ``tp``-step ring
exchanges on the copy engines, forward reduce-scatters pipelined in 4 chunks on 16 SMs
reserved for the whole host GEMM (``set_sm_margin``), backward reduce-scatters beside the
weight-gradient GEMMs on 16 SMs; each kind at most its serial time. Only plans with sequence
parallelism whose TP group lies within the innermost network tier (one NVLink domain) can
overlap (:func:`~jaxmodel.parallel.overlap.tp_eligible`); the others run serially whatever
the knob. ``tp_overlap = 1`` is that, 0 serial, fractions interpolate.

**Sustained clocks**: the device runs at ``freq_hz ×`` its sustained clock fraction under
training load (power limit; the device field ``sustained_clock_fraction``, derived from
sustained vs short-run
GEMM microbenchmarks), see :func:`sustained_device`.

**Optimizer**: mixed-precision Adam on the local parameter shard (÷dp from ZeRO-1), a
memory-bound elementwise kernel moving ``adam_bytes_per_param`` (hw_db/tech/training.toml).

**Memory**: ``training_memory`` with the schedule's in-flight micro-batches, by term
(:data:`jaxmodel.workload.memory.TRAIN_MEMORY_TERMS`: weights, Transformer Engine's FP8
weight caches, gradients, optimizer, activations with FP8-stored GEMM inputs and, on the
last stage, the loss's logits and their fp32 copy; :func:`jaxmodel.memory_breakdown`),
ZeRO-3 as FSDP2 holds it (:func:`jaxmodel.parallel.zero.impl_costs`); compared with
``system.device.mem_capacity`` less ``runtime_reserved_bytes`` (``usable_memory``).

**FLOPs, MFU and HFU** (Chowdhery et al. 2022, PaLM, Appendix B; Korthikanti et al. 2023
§6): the model FLOPs ``F = 72·B·s·l·h²·(1 + s/(6h) + V/(12lh))`` (forward + backward, no
recomputation; ``model_flops_per_token``, generalised to GQA/SwiGLU/MoE) give
``mfu = F / (T · N · peak)`` — independent of the plan, so ranking by ``mfu`` equals ranking by
time. The hardware FLOPs add what the plan recomputes: one forward of every layer with full
recomputation (then they equal Megatron's eq. 3, PTD-P §5.1, ``96·B·s·l·h²·(1 + s/(6h) +
V/(16lh))``, the "% of peak" of PTD-P Table 1), the attention-score GEMMs
(``4·B·s²·h`` per layer) with selective recomputation; ``hfu`` and
``achieved_flops_per_device`` use them.

**Concrete inputs** (:func:`train_step` on concrete plans, one or a batch): the
per-layer times depend on few plan fields, so they are evaluated once per distinct stage
input (:func:`stage_times`) and every plan is composed from them (:func:`_compose`) — the
same functions as the single-configuration path, so the results are identical up to float
rounding. Combine it
with :mod:`jaxmodel.parallel.gemm_table` to run each distinct GEMM's tile search once.

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel import recipes as _recipes
from jaxmodel.batching import batch_shape, batched, compile_ahead, dedup_map
from jaxmodel.process import stage
from jaxmodel.parallel import context as _cx
from jaxmodel.parallel import overlap as _ov
from jaxmodel.parallel import pipeline as pl
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel import zero as _zero
from jaxmodel import tech_tables as _tech_tables
from jaxmodel.types import (DROPOUT_MODES, Model, Parallelism, System, code_of, is_concrete,
                            static_flag, validate_knobs, validate_model, validate_parallelism,
                            validate_system)
from jaxmodel.workload import layer as _layer
from jaxmodel.workload import finetune as _lora
from jaxmodel.workload import memory as _memory
from jaxmodel.workload import moe as _moe
from jaxmodel.workload import params as _params
from jaxmodel import precisions as _prec

# --------------------------------------------------------------------------------------------
# Training constants (hw_db/tech/training.toml, each with its source)
# --------------------------------------------------------------------------------------------
CONSTANTS = {k: float(v) for k, v in _tech_tables.table("training")["training"].items()}


def sustained_device(dev, clock_fraction=None):
    """The device as it runs under sustained training load: ``freq_hz`` × the sustained
    clock fraction (the device field ``sustained_clock_fraction``, set in
    ``hw_db/devices/*.toml``; 1.0 by default), or ``clock_fraction`` when given.

    Tables of GEMM latencies for the ``gemm=`` hook must be built on this device
    (:meth:`jaxmodel.parallel.gemm_table.GemmTable.for_train_step` does).
    """
    frac = dev.sustained_clock_fraction if clock_fraction is None else clock_fraction
    return dataclasses.replace(dev, freq_hz=dev.freq_hz * frac)

BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble",
                  "embedding", "optimizer", "ep_comm")


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
            ``fp8_weight_cache``, ``gradients``, ``optimizer``, ``activations`` — and
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


# --------------------------------------------------------------------------------------------
# helpers (single configuration)
# --------------------------------------------------------------------------------------------
def _finite(x):
    """``x`` where finite, else 0 (double-where guard against inf·0 in the composition)."""
    x = jnp.asarray(x)
    return jnp.where(jnp.isfinite(x), x, 0.0)


def _collectives(system: System, op: str, calls, net: _comm.NetVariant = _comm.ANY_NET):
    """Evaluate several ``op`` collectives ``[(nbytes, group, stride), ...]`` in one vmap.

    Returns ``(times, ok, reason)`` as tuples/arrays over the calls. One trace of the
    collective model per op keeps the compiled step small.
    """
    f = jnp.result_type(float)
    cols = [jnp.stack([jnp.asarray(c[i], dtype=f) for c in calls]) for i in range(3)]
    t, ok, why = jax.vmap(
        lambda n, g, s: _comm.collective_time.single(system, op, n, g, "auto", s, net))(*cols)
    return tuple(t[i] for i in range(len(calls))), ok, why


def residual_dropout_times(dev, model: Model, par: Parallelism, micro_batch, seq_len,
                           dropout=1.0, dtype_bytes=2.0, kv_len=None):
    """Memory-bound kernels of a Megatron training layer that the LLMCompass-style layer
    (:mod:`jaxmodel.workload.layer`, "no residual adds, biases or dropout kernels") omits,
    per layer and micro-batch on one device: ``(fwd_s, bwd_s, selective_recompute_s)``.

    Source: Megatron-LM GPT layer (Shoeybi et al. 2019; Narayanan et al. 2021 code,
    ``ParallelTransformerLayer``): after attention and after the MLP a fused
    bias-dropout-add (``bias_dropout_add_fused_train``) on the ``[s, b, h]`` activations
    (sequence-sharded under SP, replicated over TP otherwise), and dropout on the attention
    probabilities ``[b, a/t, s, s]`` (unless FlashAttention fuses it); dropout 0.1 is
    Megatron's GPT default (``--hidden-dropout``, ``--attention-dropout``). Bytes per element
    (2-byte activations, 1-byte masks, as Korthikanti et al. 2023 §4.1 count them):

    - bias-dropout-add forward: read x and the residual, write out and the mask: 7 B
      (6 B without dropout: a fused bias + residual add);
    - its backward: dropout backward (read grad and mask, write: 5 B), the gradient sum at
      the residual fork (read 2 × 2, write 2: 6 B), the bias-gradient reduction (2 B): 13 B
      (8 B without dropout);
    - attention dropout: forward 5 B (read, write, mask), backward 5 B (read grad and mask,
      write); part of the attention core that selective recomputation repeats.

    Each kernel is one :func:`jaxmodel.ops.elementwise_latency` call (roofline + launch
    overhead). ``dropout`` is 1 (Megatron GPT) or 0 (no dropout, e.g. Llama recipes); 2 is
    1 on the Megatron-LM 2021 stack of Narayanan et al., SC'21, which adds the eager kernels of
    :func:`jaxmodel.workload.layer.megatron2021_kernels` (forward ones repeated by a full
    recomputation through ``fwd_s``).
    ``seq_len`` is the device's tokens (``s/cp`` under context parallelism), ``kv_len`` the
    keys each attends to (default ``seq_len``).
    """
    tp = jnp.maximum(par.tp, 1.0)
    heads = model.n_heads / tp
    e = micro_batch * seq_len * model.d_model
    e = jnp.where(par.sp > 0.5, e / tp, e)
    probs = micro_batch * heads * seq_len * (seq_len if kv_len is None else kv_len)
    on = dropout > 0.5
    w = dtype_bytes / 2.0                     # byte counts above are for 2-byte activations

    def k(n, nbytes, flops):
        return _ops.elementwise_latency.single(dev, n, nbytes * w, flops)

    bda_f = k(e, jnp.where(on, 7.0, 6.0), 3.0)
    bda_b = k(e, jnp.where(on, 5.0, 0.0), 1.0) + k(e, 6.0, 1.0) + k(e, 2.0, 1.0)
    bda_b = jnp.where(on, bda_b, k(e, 8.0, 1.0))
    attn = jnp.where(on & (par.flash_attention < 0.5), k(probs, 5.0, 1.0), 0.0)
    # dropout = 2: the Megatron-LM 2021 eager kernels on top (not part of the attention core)
    old_f, old_b = _layer.megatron2021_kernels(dev, model, par, micro_batch, seq_len,
                                               dtype_bytes)
    legacy = dropout > 1.5
    return (2.0 * bda_f + attn + jnp.where(legacy, old_f, 0.0),
            2.0 * bda_b + attn + jnp.where(legacy, old_b, 0.0), attn)


# --------------------------------------------------------------------------------------------
# the single-configuration model
# --------------------------------------------------------------------------------------------
class Prep(NamedTuple):
    """Inputs of the composition of one configuration (:func:`_prepare`)."""

    system: System            # at its sustained clock
    peak: Any                 # nominal (datasheet) matrix FLOP/s, for the MFU
    checks: list              # the plan's structural rules [(ok, reason)] (plan module)
    structure_ok: Any         # all of them hold
    model: Model              # sanitised (double-where)
    par: Parallelism          # sanitised
    global_batch: Any         # sanitised, sequences per step
    seq_len: Any              # sanitised, tokens per sequence


def _prepare(system: System, model: Model, par: Parallelism, global_batch, seq_len,
             clock_fraction=None, precision=None) -> Prep:
    """Sustained-clock system, the plan's rules and sanitised inputs (single configuration)."""
    f = jnp.result_type(float)
    peak = system.device.peak_matrix_flops          # nominal (datasheet) peak for the MFU
    system = dataclasses.replace(system, device=sustained_device(system.device, clock_fraction))
    global_batch = jnp.asarray(global_batch, dtype=f)
    seq_len = jnp.asarray(seq_len, dtype=f)
    checks = _plan.structure_checks(_plan.TRAIN, _plan.inputs(
        model, par, n_devices=system.n_devices, batch=global_batch, seq_len=seq_len,
        dtype_bytes=_prec.precision(precision).act_bytes))
    structure_ok, _ = nx.first_reason(checks)
    model_ok = _plan.all_ok(checks, "invalid_model")
    model_s = _plan.sanitised_model(model, model_ok)
    par_s = _plan.sanitised(par, structure_ok)
    gb = jnp.where(structure_ok, global_batch, par_s.dp * par_s.micro_batch)
    seq = jnp.where(model_ok & _plan.all_ok(checks, "invalid_workload"), seq_len, 1.0)
    return Prep(system, peak, checks, structure_ok, model_s, par_s, gb, seq)


def _stage_plan(par_s: Parallelism) -> Parallelism:
    """The plan fields the per-layer times may read, others canonical (dp = ep satisfies
    the expert checks; interleave, schedule and ZeRO with its implementation do not enter
    a layer). Plans equal here share their stage times (the de-duplication key of
    :func:`train_step`)."""
    one = jnp.ones_like(par_s.dp)
    return dataclasses.replace(par_s, dp=jnp.maximum(par_s.ep, 1.0), interleave=one,
                               schedule=one, zero=0.0 * one, zero3_impl=0.0 * one)


STAGE_KEYS = ("fwd", "bwd", "recompute", "tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd",
              "ep_comm_bwd", "embed_fwd", "embed_bwd", "lm_head_fwd", "lm_head_bwd",
              "loss_fwd", "loss_bwd", "emb_comm_fwd", "emb_comm_bwd", "rd_fwd", "rd_bwd",
              "rd_selective", "grad_accum")
LAYER_KEYS = STAGE_KEYS[:7]     # the transformer layer's (cp_layer_times)


def stage_times_single(system: System, model: Model, par: Parallelism, seq_len,
                       gemm: Callable | None = None, precision=None, dropout=1.0,
                       variant: _layer.Variant = _layer.ANY, finetune=None,
                       context: bool | None = None, part: str | None = None) -> dict:
    """Per-layer and embedding times of one micro-batch (``par.micro_batch`` sequences) on
    one device, s: the workload's training layer and embedding times plus
    :func:`residual_dropout_times` (keys :data:`STAGE_KEYS`), under context parallelism
    (:func:`jaxmodel.parallel.context.cp_layer_times`) on ``s/cp`` tokens. ``system`` runs at its
    sustained clock, ``model``/``par`` are sanitised (see :func:`train_step_single`).
    ``finetune`` (a :class:`jaxmodel.workload.finetune.LoRA`): :func:`_finetune_times`.
    ``context``: static CP switch (:func:`jaxmodel.parallel.context.context_flag`).
    ``part`` (static; without ``finetune``): ``"layer"`` the keys of the transformer layer
    (:data:`LAYER_KEYS`), ``"rest"`` the others, None all — the two parts are separate
    graphs that compile in parallel (:func:`stage_times`)."""
    if part not in (None, "layer", "rest") or part is not None and finetune is not None:
        raise ValueError(f"stage_times_single: part={part!r} (None, 'layer' or 'rest'; "
                         "None under fine-tuning)")
    b = par.micro_batch
    prec = _prec.precision(precision)
    # the layer under context parallelism (every token-wise op on s/cp tokens, the attention
    # of the local queries against all s keys with its ring exchange; the MoE all-to-all of
    # the b·s/cp local tokens); cp = 1 is the workload's training layer
    cp = jnp.maximum(par.cp, 1.0)
    local = seq_len / cp
    out = {}
    if part != "rest":
        lt = _cx.cp_layer_times(system, model, par, b, seq_len, cp, gemm=gemm,
                                precision=prec, variant=variant, context=context)
        out.update({k: lt[k] for k in LAYER_KEYS})
        if part == "layer":
            return out
    et = _layer.embedding_times.single(system, model, par, b, local, gemm=gemm,
                                       precision=prec, variant=variant)
    rd = residual_dropout_times(system.device, model, par, b, local, dropout, prec.act_bytes,
                                kv_len=seq_len)
    out.update({k: et[k] for k in STAGE_KEYS[7:13]})
    # the vocab-parallel cross entropy runs on fp32 logits, one kernel per line, in every
    # Megatron release: Megatron-LM 2021 ``vocab_parallel_cross_entropy(output.float(), ..)``
    # and Megatron-core (0.5-0.8, NeMo 24.0x) ``tensor_parallel/cross_entropy.py``,
    # ``VocabParallelCrossEntropy.calculate_logits_max`` (``vocab_parallel_logits.float()``,
    # max), ``calculate_predicted_logits`` (subtract, exp ``out=``, sum),
    # ``calculate_cross_entropy_loss`` (``exp_logits.div_``), backward ``mul_`` and the
    # cast's backward: :func:`jaxmodel.workload.layer.fp32_cross_entropy`'s kernels
    # (Megatron-core's ``cross_entropy_loss_fusion`` fuses some of them: not modelled)
    ce_f, ce_b = _layer.fp32_cross_entropy(system.device, b * local,
                                           model.vocab_size / jnp.maximum(par.tp, 1.0),
                                           prec.act_bytes)
    legacy = dropout > 1.5
    out.update(loss_fwd=ce_f, loss_bwd=ce_b,
               grad_accum=jnp.where(legacy, _layer.grad_accumulation(
                   system.device, model, par, prec.weight_bytes), 0.0))
    out.update(emb_comm_fwd=et["comm_fwd"], emb_comm_bwd=et["comm_bwd"], rd_fwd=rd[0],
               rd_bwd=rd[1], rd_selective=rd[2])
    if finetune is not None:
        out = _finetune_times(system, model, par, b, local, seq_len, out, finetune, gemm,
                              prec, variant)
    return out


def _finetune_times(system, model, par, b, local, seq_len, out, cfg, gemm, prec, variant):
    """The stage times under LoRA / QLoRA (:func:`jaxmodel.workload.finetune.
    stage_time_changes`: Hu et al., ICLR 2022; Dettmers et al., NeurIPS 2023): adapter GEMMs
    and QLoRA's dequantisation added to the forward, backward and a full recomputation; the
    frozen weights' and the LM head's weight-gradient GEMMs removed from the backward; no
    embedding gradient."""
    gemms, _ = _layer.layer_graph(system.device, model, par, b, local, seq_len, training=True,
                                  variant=variant, precision=prec)
    tokens = b * local
    head = _layer.Gemm(tokens, model.vocab_size / jnp.maximum(par.tp, 1.0), model.d_model)
    d = _lora.stage_time_changes(system.device, model, par, tokens, gemms, head, cfg,
                                 gemm or _layer.default_gemm, prec)
    out = dict(out)
    out["fwd"] = out["fwd"] + d["fwd"]
    out["bwd"] = out["bwd"] + d["bwd"]
    out["recompute"] = out["recompute"] + jnp.where(pl.is_full_recompute(par.recompute),
                                                    d["recompute_full"], 0.0)
    out["lm_head_bwd"] = out["lm_head_bwd"] + d["lm_head_bwd"]
    out["embed_bwd"] = 0.0 * out["embed_bwd"]
    return out


def train_step_single(system: System, model: Model, par: Parallelism, global_batch, seq_len,
                      gemm: Callable | None = None, dp_overlap=1.0, grad_bytes=None,
                      adam_bytes_per_param=None, dtype_bytes=None,
                      clock_fraction=None, dropout=1.0,
                      variant: _layer.Variant = _layer.ANY, tp_overlap=0.0,
                      precision=None, finetune=None,
                      context: bool | None = None) -> TrainResult:
    """Single-configuration body of :func:`train_step` (use inside other formulas).

    Args:
        gemm: static GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s`` passed
            to the workload's layer/embedding times (e.g. a :mod:`gemm_table` lookup); None
            uses the ops tile search.
        dp_overlap: 1 = DP/ZeRO collectives overlapped with the backward/forward under
            contention, 0 = serial, fractions interpolate (module docstring).
        tp_overlap: 1 = Megatron-core ``--tp-comm-overlap``: each TP collective beside the
            GEMM that feeds or drains it at Transformer Engine's granularity
            (:func:`~jaxmodel.parallel.overlap.te_tp_exposed`), only for plans that
            :func:`~jaxmodel.parallel.overlap.tp_eligible` admits (sequence parallelism, the
            TP group inside the innermost network tier; the others stay serial); 0 = serial
            (Megatron-LM 2021); fractions interpolate (module docstring).
        grad_bytes: bytes per gradient element for memory and reduction traffic (default
            the precision's ``grad_bytes``).
        adam_bytes_per_param: main-memory bytes the optimizer step moves per parameter
            (default ``training.toml``).
        dtype_bytes: legacy bytes per weight/activation element (sets those fields of
            ``precision``, :func:`jaxmodel.precisions.resolve`).
        precision: preset name or :class:`jaxmodel.Precision` (default ``"bf16"``).
        clock_fraction: sustained core-clock fraction (default: the device's
            ``sustained_clock_fraction``, see :func:`sustained_device`); the GEMM hook receives the scaled device.
        dropout: 1 = Megatron GPT's hidden and attention dropout, 0 = none (changes the
            memory-bound kernels of :func:`residual_dropout_times`); 2 = 1 on the Megatron-LM
            2021 stack (Narayanan et al., SC'21): its eager bias / copy / gradient-
            accumulation kernels (:func:`jaxmodel.workload.layer.megatron2021_kernels`) and
            the fp32 cross entropy (:func:`jaxmodel.workload.layer.fp32_cross_entropy`).
        variant: static branch switches of the workload's op graph
            (:class:`jaxmodel.workload.layer.Variant`; ``ANY`` keeps every branch).
        finetune: ``None`` (full training) or a :class:`jaxmodel.workload.finetune.LoRA`
            (LoRA / QLoRA fine-tuning, see :func:`train_step`).
        context: static switch of the context-parallel exchange
            (:func:`jaxmodel.parallel.context.context_flag`; ``None`` keeps it).
    """
    prec = _prec.resolve(precision, dtype_bytes)
    prep = _prepare(system, model, par, global_batch, seq_len, clock_fraction, prec)
    times = stage_times_single(prep.system, prep.model, _stage_plan(prep.par), prep.seq_len,
                               gemm, prec, dropout, variant, finetune, context)
    return _compose(prep, times, dp_overlap, grad_bytes, adam_bytes_per_param, prec,
                    variant.net, tp_overlap, finetune, variant.zero3_calls)


def _from_stage_times(system, model, par, global_batch, seq_len, times, dp_overlap=1.0,
                      grad_bytes=None, adam_bytes_per_param=None, precision=None,
                      clock_fraction=None, net: _comm.NetVariant = _comm.ANY_NET,
                      tp_overlap=0.0, finetune=None, zero3_calls=None, zero_used=None):
    """:func:`train_step_single` with the stage times given (the de-duplicated path)."""
    prec = _prec.precision(precision)
    prep = _prepare(system, model, par, global_batch, seq_len, clock_fraction, prec)
    return _compose(prep, times, dp_overlap, grad_bytes, adam_bytes_per_param, prec,
                    net, tp_overlap, finetune, zero3_calls, zero_used)


def _stage_inputs(system, model, par, global_batch, seq_len, clock_fraction=None,
                  precision=None, finetune=None):
    """Inputs of :func:`stage_times_single` for one configuration (de-duplication key)."""
    prec = _prec.precision(precision)
    prep = _prepare(system, model, par, global_batch, seq_len, clock_fraction, prec)
    return prep.system, prep.model, _stage_plan(prep.par), prep.seq_len, prec, finetune


_COMM_KEYS = ("tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd", "ep_comm_bwd", "emb_comm_fwd",
              "emb_comm_bwd")


class _Layer(NamedTuple):
    """Per-layer (and first/last-stage) times of one micro-batch after the TP overlap, s."""

    fwd: Any
    bwd: Any
    rc: Any
    tpf: Any
    tpb: Any
    epf: Any
    epb: Any
    first: Any      # embedding (+ half of the embedding-layer TP collectives)
    last: Any       # LM head + loss (+ the other half)


def _tp_hbm_bytes(par_s, micro_batch, seq_len, d_model, dtype_bytes):
    """Main-memory bytes one device moves for the TP collectives of one layer and pass (the
    contention input of :func:`jaxmodel.parallel.overlap.te_tp_exposed`): two
    reduce-scatters + two all-gathers of the ``b·s·h`` activations with sequence parallelism,
    two all-reduces without (Korthikanti et al. 2023 §4.2.2; ring traffic,
    :func:`jaxmodel.parallel.overlap.comm_hbm_bytes`), bytes."""
    tp = par_s.tp
    n = micro_batch * seq_len * d_model * dtype_bytes
    sp = 2.0 * (_ov.comm_hbm_bytes("reduce_scatter", n, tp)
                + _ov.comm_hbm_bytes("all_gather", n, tp))
    return jnp.where(par_s.sp > 0.5, sp, 2.0 * _ov.comm_hbm_bytes("all_reduce", n, tp))


def _blend(serial, overlapped, knob):
    """``serial + knob·(overlapped − serial)``: the knob's two ends are the serial collective
    (0) and the contention model's overlapped one (1); fractions in between interpolate
    linearly (s)."""
    return serial + jnp.asarray(knob, dtype=jnp.result_type(float)) * (overlapped - serial)


def _layer_times(t: dict, rcode, tp_overlap, dev, tp_hbm, hosts, tp) -> _Layer:
    """The stage times with the bias/dropout/residual kernels added and the TP collectives
    overlapped with the GEMMs that feed or drain them, as Transformer Engine's userbuffers
    do, under SM/memory contention (module docstring;
    :func:`jaxmodel.parallel.overlap.te_tp_exposed`). ``tp_overlap``: the knob times
    :func:`jaxmodel.parallel.overlap.tp_eligible`; ``tp_hbm``: main-memory bytes of one
    pass's TP collectives (:func:`_tp_hbm_bytes`); ``hosts``: the hosting GEMMs' shares
    (:func:`jaxmodel.parallel.overlap.tp_host_fractions`)."""
    fwd, bwd, rc = t["fwd"], t["bwd"], t["recompute"]
    tpf, tpb, epf, epb = t["tp_comm_fwd"], t["tp_comm_bwd"], t["ep_comm_fwd"], t["ep_comm_bwd"]
    # forward, the recomputed forward (full recompute repeats the forward's TP and EP
    # communication, inside ``rc``) and backward, each collective beside its own GEMM
    full_rc = pl.is_full_recompute(rcode)
    rc_tp = jnp.where(full_rc, tpf, 0.0)
    rc_compute = rc - rc_tp - jnp.where(full_rc, epf, 0.0)
    ovl_f, ovl_b = _ov.te_tp_exposed(fwd, bwd, tpf, tpb, hosts[0], hosts[1], tp, dev, tp_hbm)
    ovl_rc = _ov.te_tp_exposed(rc_compute, 0.0, rc_tp, 0.0, hosts[0], hosts[1], tp, dev,
                               tp_hbm)[0]
    rc = rc - rc_tp + _blend(rc_tp, ovl_rc, tp_overlap)
    tpf = _blend(tpf, ovl_f, tp_overlap)
    tpb = _blend(tpb, ovl_b, tp_overlap)
    # the bias/dropout/residual kernels the workload's layer omits (see residual_dropout_times)
    # (norm_upproj repeats none of them: its recomputation is norms and up-projections)
    rc = rc + jnp.select([rcode < 0.5, rcode < 1.5, rcode < 2.5],
                         [0.0, t["rd_selective"], t["rd_fwd"]], 0.0)
    fwd = fwd + t["rd_fwd"]
    bwd = bwd + t["rd_bwd"]
    emb_comm = t["emb_comm_fwd"] + t["emb_comm_bwd"]
    # embedding lookup on the first stage, LM head + loss on the last; their TP collectives
    # split evenly between the two (the embedding output all-reduce vs the head's input-grad
    # all-reduce + the two small loss all-reduces).
    first = t["embed_fwd"] + t["embed_bwd"] + 0.5 * emb_comm
    last = (t["lm_head_fwd"] + t["lm_head_bwd"] + t["loss_fwd"] + t["loss_bwd"]
            + 0.5 * emb_comm)
    return _Layer(fwd, bwd, rc, tpf, tpb, epf, epb, first, last)


class _DataParallel(NamedTuple):
    """Exposed DP/ZeRO communication (s) and what the network said about it."""

    per_step: Any        # once per step
    per_micro: Any       # every micro-batch, on the stage's critical path
    ok: Any              # the DP and DP_exp collectives fit the network
    why: Any             # the reason code of the DP all-reduce
    emb_allreduce: Any   # tied-embedding gradient all-reduce between first and last stage
    regather: Any        # TP all-gather re-assembling a scatter/gather stage transfer
    send: Any            # one stage-boundary transfer
    send_ok: Any
    send_why: Any


def _data_parallel(system, model_s, par_s, where: _plan.Placement, n_par, n_exp, window_f,
                   window_b, grad_bytes, weight_bytes, dp_overlap, act_bytes,
                   net, m, layers, zero3_calls=None, zero_used=None) -> _DataParallel:
    """DP/ZeRO collectives (Rajbhandari et al. SC'20; table in the module docstring), and the
    pipeline's stage-boundary collectives, all evaluated in one vmap per op. ``zero3_calls``
    (static): ``False`` when no plan runs DeepSpeed's per-tensor ZeRO-3 calls, which then
    stay out of the graph; ``None`` keeps them. ``zero_used`` (static): ``False`` when no
    plan uses ZeRO (every ``zero = 0``), which keeps its reduce-scatters and the ZeRO-3
    schedule out of the graph (the same numbers); ``None`` keeps them."""
    tp = par_s.tp
    # gradients are reduced and ZeRO-sharded over dp·cp (Megatron-core folds the CP group
    # into the data-parallel one). MoE: expert weights (n_exp of the n_par) over DP_exp·cp =
    # dp·cp/ep only (DeepSpeed-TED), whose members are tp·pp·ep devices apart (cp = 1)
    grads_b = grad_bytes * (n_par - n_exp)
    params_b = weight_bytes * (n_par - n_exp)
    dp, dp_stride = where.dp_cp.size, where.dp_cp.stride
    dp_multi = dp > 1.5
    dp_group = jnp.where(dp_multi, dp, 2.0)         # double-where: never a group of 1
    dpe = where.dp_exp_cp.size
    dpe_multi = (dpe > 1.5) & (n_exp > 0)          # dense models: no expert reduction
    dpe_group = jnp.where(dpe_multi, dpe, 2.0)
    dpe_stride = where.dp_exp_cp.stride
    tp_multi = tp > 1.5
    pair_stride = where.stage_hop.stride            # first↔last / worst neighbouring stages
    emb_grad_b = grad_bytes * model_s.vocab_size * model_s.d_model / tp
    (t_ar, t_emb_ar, t_ar_e), ok_ar, why_ar = _collectives(
        system, "all_reduce", [(grads_b, dp_group, dp_stride), (emb_grad_b, 2.0, pair_stride),
                               (grad_bytes * n_exp, dpe_group, dpe_stride)], net)
    # ZeRO-3 gathers and reduce-scatters one unit (a layer, FSDP's transformer wrap policy)
    # at a time: their per-unit collectives join the batch. DeepSpeed 2021 (zero3_impl = 1)
    # issues one call per tensor (:func:`jaxmodel.parallel.zero.layer_tensors`; the routed
    # experts' FC1 and FC2 of every local expert of the MoE layers, averaged per unit)
    units = jnp.maximum(layers, 1.0)
    calls = zero3_calls is not False and zero_used is not False
    el, cnt = _zero.layer_tensors(model_s, tp) if calls else ((), ())
    cnt_e = (2.0 * model_s.n_experts / par_s.ep * _params.n_moe_layers(model_s)
             / jnp.maximum(model_s.n_layers, 1.0))
    el_e = [nx.safe_div(n_exp / units, cnt_e, fill=0.0)] if calls else []
    k = len(el)
    t_rs = t_rs_e = u_rs = u_rs_e = 0.0               # ZeRO's reduce-scatters
    ds_rs = []
    if zero_used is not False:
        (t_rs, t_rs_e, u_rs, u_rs_e, *ds_rs), _, _ = _collectives(
            system, "reduce_scatter", [(grads_b, dp_group, dp_stride),
                                       (grad_bytes * n_exp, dpe_group, dpe_stride),
                                       (grads_b / units, dp_group, dp_stride),
                                       (grad_bytes * n_exp / units, dpe_group, dpe_stride)]
            + [(grad_bytes * x, dp_group, dp_stride) for x in el]
            + [(grad_bytes * x, dpe_group, dpe_stride) for x in el_e], net)
    (t_ag, t_regather, t_ag_e, u_ag, u_ag_e, *ds_ag), _, _ = _collectives(
        system, "all_gather", [(params_b, dp_group, dp_stride),
                               (act_bytes * tp, jnp.where(tp_multi, tp, 2.0), 1.0),
                               (weight_bytes * n_exp, dpe_group, dpe_stride),
                               (params_b / units, dp_group, dp_stride),
                               (weight_bytes * n_exp / units, dpe_group, dpe_stride)]
        + [(weight_bytes * x, dp_group, dp_stride) for x in el]
        + [(weight_bytes * x, dpe_group, dpe_stride) for x in el_e], net)
    (t_send,), ok_p2p, why_p2p = _collectives(system, "p2p", [(act_bytes, 2.0, pair_stride)],
                                                net)
    t_ar, t_rs, t_ag = (jnp.where(dp_multi, _finite(x), 0.0)
                        + jnp.where(dpe_multi, _finite(x_e), 0.0)
                        for x, x_e in ((t_ar, t_ar_e), (t_rs, t_rs_e), (t_ag, t_ag_e)))
    dp_net_ok = (~dp_multi | ok_ar[0]) & (~dpe_multi | ok_ar[2])
    zero = par_s.zero
    # overlapped: Megatron-core's per-chunk bucketed synchronisation of the interleaved
    # schedule (:func:`jaxmodel.parallel.overlap.chunked_dp_exposed`), the NCCL kernels
    # holding ``DEFAULT_CHANNELS["dp"]`` SMs and moving their ring traffic through memory
    v = pl.effective_interleave(par_s.schedule, par_s.interleave)
    n_buckets = _ov.mcore_buckets(n_par, dp)
    share = _ov.sm_share(system.device, _ov.DEFAULT_CHANNELS["dp"])

    def hbm(op, w):
        return (jnp.where(dp_multi, _ov.comm_hbm_bytes(op, w * (n_par - n_exp), dp_group), 0.0)
                + jnp.where(dpe_multi, _ov.comm_hbm_bytes(op, w * n_exp, dpe_group), 0.0))

    def exposed(t_x, window, op, w):
        ovl = _ov.chunked_dp_exposed(window / v, t_x, par_s.pp, v, n_buckets, hbm(op, w),
                                     share, system.device)
        # the chunked estimate bounds the backlog from above: never beyond the serial one
        return _blend(t_x, jnp.minimum(ovl, t_x), dp_overlap)

    g, wb = grad_bytes, weight_bytes
    # once per step
    z0 = exposed(t_ar, window_b, "all_reduce", g)
    if zero_used is False:          # every plan zero = 0: the all-reduce once per step
        return _DataParallel(z0, jnp.zeros_like(z0), dp_net_ok, why_ar[0], t_emb_ar,
                             t_regather, t_send, ok_p2p[0], why_p2p[0])
    z12_rs = jnp.where(zero < 1.5, exposed(t_rs, window_b, "reduce_scatter", g), 0.0)
    z12_ag = exposed(t_ag, window_f, "all_gather", wb)
    dp_step = jnp.select([zero < 0.5, zero < 2.5], [z0, z12_rs + z12_ag], 0.0)
    # every micro-batch (on the stage's critical path)
    z2_mb = exposed(t_rs, window_b, "reduce_scatter", g)
    # ZeRO-3 / FSDP: per-unit gathers prefetched one unit ahead in the forward and the
    # backward, reduce-scatter of every micro-batch's gradients (:func:`jaxmodel.parallel.
    # zero.zero3_step`); the dense and the expert parameters' collectives each against the
    # whole compute (their overlaps are not stacked: an optimistic bound when both are large)

    # DeepSpeed 2021 (:func:`jaxmodel.parallel.zero.impl_args`): serial, re-gathered for the
    # recomputation, per-tensor calls (persistent below PERSISTENCE_THRESHOLD elements)
    prefetch, regather, per_tensor = _zero.impl_args(par_s.zero3_impl, par_s.recompute)

    def per_unit(times, sizes, counts, group, stride):
        return [_zero.per_tensor_collectives(system, op, sizes, group, stride, w, counts,
                                             nccl_times=[_finite(t) for t in ts])[0]
                for op, ts, w in (("all_gather", times[0], wb),
                                  ("reduce_scatter", times[1], g))]

    if calls:
        ds_d = per_unit((ds_ag[:k], ds_rs[:k]), el, cnt, dp_group, dp_stride)
        ds_e = per_unit((ds_ag[k:], ds_rs[k:]), el_e, (cnt_e,), dpe_group, dpe_stride)
    else:                                           # per_tensor is 0 in every plan
        ds_d, ds_e = (_finite(u_ag), _finite(u_rs)), (_finite(u_ag_e), _finite(u_rs_e))

    # FSDP2's copy-out / copy-in kernels on the compute stream (:func:`jaxmodel.parallel.
    # zero.impl_costs`; none for DeepSpeed 2021, whose list-API copies are per tensor)
    costs = _zero.impl_costs(par_s.zero3_impl, wb, g)

    def z3(n, g_unit, r_unit, ds, on, group, stride):
        g_unit, r_unit = (jnp.where(on, jnp.where(per_tensor, d, _finite(x)), 0.0)
                          for x, d in zip((g_unit, r_unit), ds, strict=True))
        z = _zero.zero3_step(system, n, units, window_f / units, window_b / units, group, m,
                             dtype_bytes=wb, grad_comm_bytes=g, stride=stride, net=net,
                             prefetch=prefetch, recompute_gathers=regather,
                             collective_times=(g_unit, r_unit, 0.0),
                             copy_out_bytes=jnp.where(on, costs["copy_out_bytes"], 0.0),
                             copy_in_bytes=jnp.where(on, costs["copy_in_bytes"], 0.0))
        serial = z["gather"] + z["reduce_scatter"] + z["copies"]
        return serial, jnp.minimum(z["exposed_comm"] + z["contention"], serial)

    ser_d, ovl_d = z3(n_par - n_exp, u_ag, u_rs, ds_d, dp_multi, dp_group, dp_stride)
    ser_e, ovl_e = z3(n_exp, u_ag_e, u_rs_e, ds_e, dpe_multi, dpe_group, dpe_stride)
    z3_mb = _blend(ser_d + ser_e, ovl_d + ovl_e, dp_overlap) / m
    dp_mb = jnp.select([zero < 1.5, zero < 2.5], [0.0, z2_mb], z3_mb)
    return _DataParallel(dp_step, dp_mb, dp_net_ok, why_ar[0], t_emb_ar, t_regather,
                         t_send, ok_p2p[0], why_p2p[0])


def _compose(prep: Prep, times, dp_overlap, grad_bytes, adam_bytes_per_param, prec,
             net: _comm.NetVariant = _comm.ANY_NET, tp_overlap=0.0, finetune=None,
             zero3_calls=None, zero_used=None):
    """The step from the stage times: layers, DP/ZeRO, pipeline, optimizer, memory and the
    plan's rules (feasibility)."""
    system, peak, checks, structure_ok, model_s, par_s, gb, seq = prep
    grad_bytes = prec.grad_bytes if grad_bytes is None else grad_bytes
    dtype_bytes = prec.act_bytes
    adam_bytes = (CONSTANTS["adam_bytes_per_param"] if adam_bytes_per_param is None
                  else adam_bytes_per_param)
    dev = system.device
    tp, pp, dp, b, cp = par_s.tp, par_s.pp, par_s.dp, par_s.micro_batch, par_s.cp
    m = pl.n_microbatches(gb, dp, b)
    layers = model_s.n_layers / pp                       # per device, all v chunks
    where = _plan.placement(system, par_s)

    t = {k: _finite(times[k]) for k in STAGE_KEYS}
    # per-layer param.grad accumulation (dropout = 2): every micro-batch but the first
    t["rd_bwd"] = t["rd_bwd"] + (1.0 - 1.0 / jnp.maximum(m, 1.0)) * t["grad_accum"]
    rcode = par_s.recompute
    lt = _layer_times(t, rcode, tp_overlap * _ov.tp_eligible(par_s, system), dev,
                      _tp_hbm_bytes(par_s, b, seq / cp, model_s.d_model, dtype_bytes),
                      _ov.tp_host_fractions(model_s, seq, par_s.flash_attention), tp)
    multi_stage = pp > 1.5
    extra_mean = (lt.first + lt.last) / pp
    # the slowest stage (uneven stages: :func:`jaxmodel.parallel.pipeline.stage_layers`):
    # first (embedding), the most loaded middle one, or last (LM head + loss)
    per_layer = lt.fwd + lt.tpf + lt.epf + lt.bwd + lt.rc + lt.tpb + lt.epb
    n_first, n_most, n_last = pl.stage_layers(model_s.n_layers, pp)
    slow_n = n_first
    slow_extra = jnp.where(multi_stage, lt.first, lt.first + lt.last)
    for n_k, extra_k in ((n_most, 0.0), (n_last, jnp.where(multi_stage, lt.last, 0.0))):
        slower = n_k * per_layer + extra_k > slow_n * per_layer + slow_extra
        slow_n = jnp.where(slower, n_k, slow_n)
        slow_extra = jnp.where(slower, extra_k, slow_extra)
    # DualPipe: a rank holds stage i and stage p−1−i and runs half the micro-batches through
    # each, so its load per micro-batch is their mean — rank 0 pairs the first and the last
    # stage, a middle rank two stages of at most ⌈L/p⌉ layers
    dual = par_s.schedule == pl.DUALPIPE
    ends_n = 0.5 * (n_first + n_last)
    ends_extra = 0.5 * (lt.first + lt.last)
    ends_slower = ends_n * per_layer + ends_extra > n_most * per_layer
    slow_n = jnp.where(dual, jnp.where(ends_slower & multi_stage, ends_n, n_most), slow_n)
    slow_extra = jnp.where(dual, jnp.where(ends_slower & multi_stage, ends_extra, 0.0),
                           slow_extra)
    layer_f = layers * (lt.fwd + lt.tpf + lt.epf)           # forward of one micro-batch
    layer_b = layers * (lt.bwd + lt.rc + lt.tpb + lt.epb)   # backward (+ recompute)
    # DualPipe keeps two copies of every stage's parameters (pipeline.dualpipe_state_factor)
    dual_states = jnp.where(dual, 2.0, 1.0)

    # ---- data parallelism / ZeRO (and the stage-boundary collectives) ---------------------
    act_bytes = pl.p2p_bytes(b, seq, model_s.d_model, tp, dtype_bytes) / cp   # s/cp tokens
    n_par = _params.params_per_device.single(model_s, par_s) * dual_states
    n_exp = _moe.expert_params_per_device(model_s, par_s) * dual_states
    g_dp, w_dp, n_opt = grad_bytes, prec.weight_bytes, None
    if finetune is not None:
        # LoRA: only the adapters are reduced, gathered (ZeRO-1/2) and updated; ZeRO-3
        # still gathers the frozen base per layer in its storage type
        n_opt = _lora.adapter_params_per_device(model_s, par_s, finetune)
        frac = n_opt / jnp.maximum(n_par, 1.0)
        g_dp = grad_bytes * frac
        w_dp = jnp.where(par_s.zero > 2.5, jnp.where(finetune.base_bytes > 0,
                                                     finetune.base_bytes, prec.weight_bytes),
                         prec.weight_bytes * frac)
    dpc = _data_parallel(system, model_s, par_s, where, n_par, n_exp, layer_f, layer_b,
                         g_dp, w_dp, dp_overlap, act_bytes, net, m, layers, zero3_calls,
                         zero_used)

    # ---- pipeline ---------------------------------------------------------------------------
    t_mean = layer_f + layer_b + extra_mean + dpc.per_micro
    t_regather = jnp.where((tp > 1.5) & (par_s.sp < 0.5), _finite(dpc.regather), 0.0)
    t_p2p = jnp.where(multi_stage, _finite(dpc.send) + t_regather, 0.0)
    pp_net_ok = ~multi_stage | dpc.send_ok
    n_p2p = pl.p2p_transfers_on_critical_path(par_s.schedule, pp, m, par_s.interleave)
    bubble = pl.bubble_time(par_s.schedule, pp, par_s.interleave, t_mean)
    dpipe = _dualpipe(dev, lt, m, slow_n, slow_extra, layers, extra_mean, dpc.per_micro,
                      pp, _finite(dpc.send) + t_regather)
    bubble = jnp.where(dual, dpipe["bubble"], bubble)
    # tied embeddings: first and last stage all-reduce the word-embedding gradient (Megatron)
    t_emb_ar = jnp.where(multi_stage & (model_s.tied_embeddings > 0.5),
                         _finite(dpc.emb_allreduce), 0.0)

    # ---- optimizer ----------------------------------------------------------------------
    zero = par_s.zero
    local = (n_par - n_exp) / jnp.where(zero >= 0.5, dp * cp, 1.0) + n_exp / jnp.where(
        zero >= 0.5, where.dp_exp_cp.size, 1.0)
    # DualPipe under ZeRO: both copies of a stage shard its optimizer states over 2·dp
    local = local / jnp.where(dual & (zero >= 0.5), 2.0, 1.0)
    if n_opt is not None:
        local = n_opt / jnp.where(zero >= 0.5, dp * cp, 1.0)
    t_opt_raw = _ops.elementwise_latency.single(dev, local, adam_bytes,
                                                CONSTANTS["adam_flops_per_param"])
    t_opt = _finite(t_opt_raw)

    breakdown = {
        "compute": m * slow_n * (lt.fwd + lt.bwd),
        "recompute": m * slow_n * lt.rc,
        "tp_comm": m * slow_n * (lt.tpf + lt.tpb),
        "embedding": m * slow_extra,
        "dp_comm": m * dpc.per_micro + dpc.per_step,
        "pp_comm": n_p2p * t_p2p + t_emb_ar,
        "bubble": bubble,
        "optimizer": t_opt,
        "ep_comm": m * slow_n * (lt.epf + lt.epb),
    }
    # DualPipe: compute on the SMs the communication leaves, the all-to-all and the steady
    # stage transfers hidden behind the paired chunks (only their excess shows)
    for k in ("compute", "recompute", "embedding", "ep_comm"):
        breakdown[k] = jnp.where(dual, dpipe[k], breakdown[k])
    step = sum(breakdown[k] for k in BREAKDOWN_KEYS)

    # ---- memory -------------------------------------------------------------------------
    # the largest of the first, most loaded and last stage; model states sharded over dp·cp;
    # activations of the s/cp local tokens (:func:`jaxmodel.parallel.context.
    # cp_activation_bytes`, the workload's inventory at cp = 1)
    in_flight = pl.stage_in_flight(par_s.schedule, pp, m, par_s.interleave)
    # FP8 recipes store their weight-GEMM inputs quantised (:func:`jaxmodel.workload.memory.
    # quantised_input_delta`, on the s/cp local tokens)
    act_layer = (_cx.cp_activation_bytes(model_s, par_s, b, seq, cp, dtype_bytes=dtype_bytes)
                 + _memory.quantised_input_delta(model_s, par_s, b, seq / cp, prec))
    # the last stage's loss holds one micro-batch's logits and their fp32 copy
    # (:func:`jaxmodel.workload.memory.loss_logits_bytes`, the s/cp local tokens)
    mem = _memory.training_memory.single(
        model_s, dataclasses.replace(par_s, dp=dp * cp), seq, in_flight, grad_bytes, prec,
        act_per_layer=act_layer,
        last_stage_extra=_memory.loss_logits_bytes(model_s, par_s, b * seq / cp, dtype_bytes))
    # ZeRO-3 / FSDP: the sharded states plus the units alive unsharded at once (the computing
    # one, the one prefetched — none under DeepSpeed 2021 —, one unsharded gradient unit;
    # :func:`jaxmodel.parallel.zero.zero3_memory`); the weights and their FP8 caches alike
    # FSDP2 keeps no 16-bit shard beside the fp32 master and holds the unsharded gradients
    # beside the reduce-scatter input (:func:`jaxmodel.parallel.zero.impl_costs`); the FP8
    # caches are sharded and gathered like the weights
    units = jnp.maximum(layers, 1.0)
    prefetch = _zero.impl_args(par_s.zero3_impl, par_s.recompute)[0]
    w_b, c_b = prec.weight_bytes, _memory.weight_cache_bytes(prec)
    costs = _zero.impl_costs(par_s.zero3_impl, w_b, grad_bytes, prec.master_bytes)
    groups = ((n_par - n_exp, dp * cp), (n_exp, where.dp_exp_cp.size))
    z3m = [_zero.zero3_memory(n, units, group, dtype_bytes=w_b, grad_bytes=grad_bytes,
                              prefetch=prefetch,
                              optimizer_bytes=prec.master_bytes + prec.optim_bytes,
                              shard_weight_bytes=costs["shard_weight_bytes"],
                              unsharded_grad_bytes=costs["unsharded_grad_bytes"])
           for n, group in groups]
    z3c = [_zero.zero3_memory(n, units, group, dtype_bytes=c_b, prefetch=prefetch)["weights"]
           for n, group in groups]
    z3_on = par_s.zero > 2.5
    mem["fp8_weight_cache"] = jnp.where(z3_on, z3c[0] + z3c[1], mem["fp8_weight_cache"])
    for k in ("weights", "gradients", "optimizer"):
        mem[k] = jnp.where(z3_on, z3m[0][k] + z3m[1][k], mem[k])
    # DualPipe: two stages per rank, ZeRO-sharded classes split over both copies' 2·dp ranks
    for k, z in (("weights", 3.0), ("gradients", 2.0), ("optimizer", 1.0)):
        mem[k] = mem[k] * jnp.where(dual, pl.dualpipe_state_factor(z, par_s.zero), 1.0)
    if finetune is not None:      # frozen base + adapters (:func:`jaxmodel.workload.finetune.
        mem.update(_lora.memory_states(                               # memory_states`;
            model_s, dataclasses.replace(par_s, dp=dp * cp), finetune, n_par, prec,
            grad_bytes))                                              # its weights hold
        mem["fp8_weight_cache"] = jnp.zeros_like(mem["weights"])      # the base's copies)
    mem["total"] = sum(mem[k] for k in _memory.TRAIN_MEMORY_TERMS)
    mem_ok = mem["total"] <= _memory.usable_memory(dev.mem_capacity,
                                                   dev.runtime_reserved_bytes)

    # ---- the plan's rules, then the hardware's, then memory (first failing one wins) -----
    # DP, DP_exp and the stage hop: their collectives' own verdicts (evaluated here anyway)
    compute_raw = [times[k] for k in STAGE_KEYS if k not in _COMM_KEYS] + [t_opt_raw]
    comm_raw = [times[k] for k in _COMM_KEYS]
    feasible, reason = nx.first_reason(
        checks + _plan.system_checks(_plan.TRAIN, system, par_s, structure_ok,
                                     placed=("tp", "ep", "cp"),
                                     word=_prec.widest_gemm_word(prec),
                                     compute=compute_raw)
        + [(dpc.ok & pp_net_ok, "topology_mismatch"),
           (_prec.supported(dev, prec), "precision_unsupported")]
        + _plan.finite_checks(compute_raw, comm_raw) + [(mem_ok, "out_of_memory")])
    # the network's own reason where a collective of the step does not fit it
    topo = reason == nx.reason_code("topology_mismatch")
    reason = jnp.where(topo & ~dpc.ok, dpc.why, reason)
    reason = jnp.where(topo & dpc.ok & ~pp_net_ok, dpc.send_why, reason).astype(jnp.int32)

    flops = _params.model_flops_per_token.single(model_s, seq, False) * gb * seq
    if finetune is not None:      # no weight-gradient GEMMs for the frozen base
        flops = flops - _lora.frozen_flops_per_token(model_s) * gb * seq
    full_rc = (_params.model_flops_per_token.single(model_s, seq, True) * gb * seq - flops)
    # selective recompute repeats the QKᵀ and AV forward GEMMs (none under FlashAttention,
    # whose backward recomputation is part of its backward time, as in the layer model)
    attn_rc = jnp.where(par_s.flash_attention > 0.5, 0.0, 4.0 * seq * model_s.n_heads
                        * model_s.head_dim * model_s.n_layers * gb * seq)
    # norm_upproj repeats the MLA up-projections (2 FLOPs per weight and token; the norms
    # and the activation function are not counted as model FLOPs)
    h = model_s.n_heads
    upproj = (model_s.q_lora_rank * h * (model_s.qk_nope_head_dim + model_s.qk_rope_head_dim)
              + model_s.kv_lora_rank * h * (model_s.qk_nope_head_dim + model_s.v_head_dim))
    upproj_rc = 2.0 * upproj * model_s.n_layers * gb * seq
    hw_flops = flops + jnp.select([rcode < 0.5, rcode < 1.5, rcode < 2.5],
                                  [0.0, attn_rc, full_rc], upproj_rc)
    n_dev = dp * tp * pp * cp
    safe_step = jnp.where(feasible & (step > 0), step, 1.0)
    step_time = jnp.where(feasible, step, jnp.inf)
    achieved = jnp.where(feasible, hw_flops / (safe_step * n_dev), 0.0)
    hfu = jnp.where(feasible, nx.safe_div(achieved, peak, fill=0.0), 0.0)
    mfu = jnp.where(feasible, nx.safe_div(flops / (safe_step * n_dev), peak, fill=0.0), 0.0)
    tokens = jnp.where(feasible, gb * seq / safe_step, 0.0)
    mem = {k: jnp.where(structure_ok, x, jnp.inf) for k, x in mem.items()}
    return TrainResult(
        step_time_s=step_time, mfu=mfu, tokens_per_s=tokens, memory_bytes=mem["total"],
        feasible=feasible, reason=reason,
        breakdown={k: jnp.where(feasible, x, jnp.inf) for k, x in breakdown.items()},
        memory=mem, flops_per_step=jnp.where(structure_ok, flops, 0.0),
        achieved_flops_per_device=achieved, microbatches=jnp.where(structure_ok, m, 0.0),
        hfu=hfu)


#: SMs DeepSeek-V3 gives to the all-to-all and pipeline communication beside the paired
#: DualPipe chunks: 20 of the H800's 132 (DeepSeek-V3 Technical Report §3.2.2).
DUALPIPE_COMM_SMS = 20.0


def _dualpipe(dev, lt: _Layer, m, slow_n, slow_extra, layers, extra_mean, dp_micro, pp,
              t_send):
    """The parts of a DualPipe step (DeepSeek-V3 Technical Report §3.2.1–3.2.2, Table 2;
    deepseek-ai/DualPipe), s: every forward chunk runs paired with a backward chunk of
    another micro-batch, the all-to-all and the steady stage transfers (one activation and
    one gradient per micro-batch, :func:`jaxmodel.parallel.pipeline.dualpipe_hidden_transfers`)
    of each hidden behind the other's computation, which runs on the ``core_count −
    DUALPIPE_COMM_SMS`` SMs the communication leaves
    (:func:`jaxmodel.workload.moe.dualpipe_overlap`; the TP collectives stay serial).
    Returns ``compute``, ``recompute``, ``embedding`` (slowed), ``ep_comm`` (the exposed
    excess of the communication) and ``bubble`` ``(p/2 − 1)(F&B + B − 3W)``
    (:func:`jaxmodel.parallel.pipeline.dualpipe_bubble`) on the mean rank with ``F`` its
    forward chunk, ``B`` its full backward chunk (recomputation included), ``W`` the weight-
    gradient half of the backward GEMM work (the input and weight gradients have equal FLOPs,
    Narayanan et al. SC'21 §5.1) and ``F&B = F + B`` plus the pair's exposed communication.
    """
    sms = jnp.maximum(dev.core_count, DUALPIPE_COMM_SMS + 1.0)
    share = sms / (sms - DUALPIPE_COMM_SMS)
    comm = (m * slow_n * (lt.epf + lt.epb)
            + pl.dualpipe_hidden_transfers(pp, m) * t_send)
    work = m * (slow_n * (lt.fwd + lt.bwd + lt.rc) + slow_extra)
    slowed, exposed = _moe.dualpipe_overlap(work, comm, sms, DUALPIPE_COMM_SMS)
    f_chunk = layers * (lt.fwd + lt.tpf) * share
    b_chunk = layers * (lt.bwd + lt.rc + lt.tpb) * share
    w_chunk = 0.5 * layers * lt.bwd * share
    fb = f_chunk + b_chunk + (extra_mean + dp_micro) * share + nx.safe_div(exposed, m,
                                                                           fill=0.0)
    return {"compute": m * slow_n * (lt.fwd + lt.bwd) * share,
            "recompute": m * slow_n * lt.rc * share, "embedding": m * slow_extra * share,
            "ep_comm": exposed, "bubble": pl.dualpipe_bubble(pp, fb, b_chunk, w_chunk)}


_train_step_batched = batched(train_step_single)
DEDUP_MIN_BATCH = 1   # the split path also compiles faster for one plan (18 s vs 29 s)


def stage_times(system: System, model: Model, par: Parallelism, global_batch, seq_len, *,
                gemm: Callable | None = None, dtype_bytes=None, clock_fraction=None,
                dropout=1.0, chunk: int | None = None, precision=None,
                finetune=None) -> dict:
    """Per-micro-batch stage times (:data:`STAGE_KEYS`) of a batch of plans, each distinct
    stage input evaluated once.

    The layer and embedding times of a plan depend on few of its fields (``tp, sp, ep, pp,
    micro_batch, recompute, flash_attention`` with the system, model and sequence; see
    :func:`_stage_plan`). The batch is reduced to its distinct rows of those inputs (exact
    ``numpy.unique`` on the sanitised values), :func:`stage_times_single` runs once per
    row, and the results are gathered back — bit-identical to evaluating every plan.
    Concrete inputs only.

    Returns:
        dict key → seconds with the batch shape of the inputs.
    """
    kw = {} if chunk is None else {"chunk": chunk}
    prec = _prec.resolve(precision, dtype_bytes)
    shape = batch_shape(system, model, par, global_batch, seq_len, clock_fraction, prec,
                        finetune)
    variant = _layer.variant_of(model, par, system)
    if math.prod(shape) == 0:
        raise ValueError("train_step: empty batch of plans")
    with stage("train_step: stage inputs"):
        inputs = batched(_stage_inputs, **kw)(system, model, par, global_batch, seq_len,
                                              clock_fraction, prec, finetune)
        jax.block_until_ready(inputs)
    with stage("train_step: stage times") as st:
        # the layer and the rest as two graphs: one compiles while the other traces
        parts = ({},) if finetune is not None else ({"part": "layer"}, {"part": "rest"})
        out = {k: v for p in dedup_map(_stage_times_row, inputs, shape=shape, gemm=gemm,
                                       dropout=dropout, variant=variant,
                                       context=_cx.context_flag(par), parts=parts, **kw)
               for k, v in p.items()}
        jax.block_until_ready(out)
        st["note"] = f"{math.prod(shape):,} plans"
    return out


def _stage_times_row(system, model, par, seq_len, precision, finetune, gemm=None, dropout=1.0,
                     variant=_layer.ANY, context=None, part=None):
    """:func:`stage_times_single` on the outputs of :func:`_stage_inputs` (their order)."""
    return stage_times_single(system, model, par, seq_len, gemm, precision, dropout, variant,
                              finetune, context, part)


def train_step(system: System, model: Model, par: Parallelism, global_batch, seq_len, *,
               gemm: Callable | None = None, dp_overlap=1.0, grad_bytes=None,
               adam_bytes_per_param=None, dtype_bytes=None, clock_fraction=None,
               dropout=1.0, dedup: bool | None = None, chunk: int | None = None,
               tp_overlap=0.0, precision=None, finetune=None, recipe=None) -> TrainResult:
    """Time, throughput and memory of one training step (data × tensor × pipeline parallel).

    Source: Narayanan et al., SC'21 (PTD-P: placement §3, schedules §2.2, scatter/gather §4.1,
    eq. 3 FLOPs), Korthikanti et al., MLSys 2023 (SP, selective recompute, activation memory),
    Rajbhandari et al., SC'20 (ZeRO), Li et al., VLDB 2020 (DP overlap); see the module
    docstring for the composition and the overlap model.

    Args:
        system: devices and network; ``system.n_devices`` must equal dp·tp·pp·cp.
        model: the transformer.
        par: the plan (dp, tp, pp, cp, sp, ep, micro_batch, interleave, schedule, recompute,
            zero, flash_attention).
        global_batch: sequences per optimizer step.
        seq_len: tokens per sequence.
        gemm: optional static GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s``
            (e.g. ``gemm_table.GemmTable.lookup``); default the ops tile search.
        dp_overlap: 1 (default) = DP/ZeRO collectives overlapped with the backward/forward
            under SM/memory contention (Megatron-core bucketing), 0 = Megatron-LM 2021's
            serial all-reduce; fractions interpolate.
        tp_overlap: 0 (default, Megatron-LM 2021) = serial TP collectives; 1 = Megatron-core
            ``--tp-comm-overlap`` at Transformer Engine's granularity (each collective beside
            the GEMM that feeds or drains it, :func:`~jaxmodel.parallel.overlap.te_tp_exposed`)
            for plans that :func:`~jaxmodel.parallel.overlap.tp_eligible` admits (sequence
            parallelism, the TP group inside the innermost network tier), serial otherwise;
            fractions interpolate (module docstring).
        grad_bytes: gradient bytes per element (default ``precision.grad_bytes``: 4, fp32
            main gradients).
        adam_bytes_per_param: optimizer-step traffic per parameter (default from hw_db).
        dtype_bytes: legacy bytes per weight/activation element (sets those fields of
            ``precision``, :func:`jaxmodel.precisions.resolve`).
        precision: preset name (``"bf16"`` default, ``"fp8"`` Transformer-Engine recipe,
            ...) or a :class:`jaxmodel.Precision`, possibly batched; a device without a
            tensor-core rate for its compute dtypes gives ``feasible=False``, reason
            ``precision_unsupported``.
        clock_fraction: sustained core-clock fraction under training load (default from
            the device's ``sustained_clock_fraction`` field).
        dropout: a name or code of :data:`jaxmodel.types.DROPOUT_MODES`: ``"megatron"`` (1,
            default) = Megatron GPT's dropout kernels, ``"none"`` (0) = no dropout,
            ``"megatron2021"`` (2) = Megatron GPT's dropout on the Megatron-LM 2021 stack
            (:func:`train_step_single`).
        dedup: evaluate the per-layer times once per distinct stage input (:func:`
            stage_times`) and compose every plan from them — exact, and much faster for
            parallelism sweeps. ``None`` (default): on for concrete batches of at least
            ``DEDUP_MIN_BATCH`` plans with a scalar ``dropout`` — also
            for one plan: two smaller compiled graphs build faster than one big one.
        chunk: ``lax.map`` batch size for big batches (default ``batching.DEFAULT_CHUNK``).
        finetune: ``None`` (full training) or a :class:`jaxmodel.LoRA` (``jm.lora(16)``,
            ``jm.qlora(16)``; leaves may be batched): LoRA / QLoRA fine-tuning — frozen base in
            its storage type without gradients or optimizer states, adapters with full
            training state, no weight-gradient GEMMs for the base, adapter GEMMs added
            (:mod:`jaxmodel.workload.finetune`; Hu et al., ICLR 2022; Dettmers et al., NeurIPS
            2023). ``mfu`` then counts the fine-tuning's model FLOPs (forward and input
            gradients of the base, no weight gradients).
        recipe: ``None`` or a :class:`jaxmodel.recipes.Recipe` / its name
            (``"nemo-24.07"``, ``"megatron-2021"``, ``"torchtitan"``, ``"deepspeed"``): its
            plan fields (recompute, zero, zero3_impl, flash_attention, sp) replace ``par``'s,
            its step settings fill the keywords left at their defaults
            (:func:`jaxmodel.recipes.merge_step_kwargs`).

    Returns:
        :class:`TrainResult` with the batch shape of the inputs in front of every field.

    Raises:
        ValueError: for a concrete single configuration whose plan breaks a rule of
            :mod:`jaxmodel.parallel.plan` (devices, divisibility, schedule, codes, a group the
            network cannot place) — the message names the reason, fields and values. Out of
            memory never raises: ``feasible=False``, reason ``out_of_memory``, memory figures.

    Example:
        >>> r = jm.train_step(hw_db.system("dgx_a100", nodes=128), hw_db.model("gpt3-175b"),
        ...                   jm.Parallelism(dp=8, tp=8, pp=16, micro_batch=1, interleave=3,
        ...                                  schedule="interleaved", recompute="full"),
        ...                   1536, 2048)
        >>> float(r.step_time_s), float(r.mfu)
        (29.6, 0.358)
    """
    if recipe is not None:
        r = _recipes.recipe(recipe)
        kw = _recipes.merge_step_kwargs(r, dict(
            precision=precision, dropout=dropout, grad_bytes=grad_bytes,
            dp_overlap=dp_overlap, tp_overlap=tp_overlap), _TRAIN_STEP_DEFAULTS)
        return train_step(system, model, r.parallelism(par), global_batch, seq_len, gemm=gemm,
                          adam_bytes_per_param=adam_bytes_per_param, dtype_bytes=dtype_bytes,
                          clock_fraction=clock_fraction, dedup=dedup, chunk=chunk,
                          finetune=finetune, **kw)
    prec = _prec.resolve(precision, dtype_bytes)
    dropout = code_of(dropout, DROPOUT_MODES, "dropout")
    concrete = is_concrete(system, model, par, global_batch, seq_len, clock_fraction, prec,
                           finetune)
    shape = batch_shape(system, model, par, global_batch, seq_len, prec, finetune)
    validate_knobs("train_step", global_batch=global_batch, seq_len=seq_len,
                   dp_overlap=dp_overlap, tp_overlap=tp_overlap, grad_bytes=grad_bytes,
                   adam_bytes_per_param=adam_bytes_per_param, dtype_bytes=dtype_bytes,
                   clock_fraction=clock_fraction, dropout=dropout)
    if concrete and shape == ():
        validate_system(system)
        validate_model(model)
        validate_parallelism(par)
        with jax.ensure_compile_time_eval():      # concrete even inside an outer jax.jit
            _plan.raise_if_invalid("train_step", _plan.TRAIN, _plan.inputs(
                model, par, n_devices=system.n_devices, batch=global_batch, seq_len=seq_len,
                dtype_bytes=prec.act_bytes), system, par)
    kw = {} if chunk is None else {"chunk": chunk}
    scalar_knobs = np.ndim(dropout) == 0 and is_concrete(dropout)
    if dedup is None:
        dedup = concrete and scalar_knobs and math.prod(shape) >= DEDUP_MIN_BATCH
    if dedup:
        if not (concrete and scalar_knobs):
            raise ValueError("train_step(dedup=True) needs concrete inputs and a scalar "
                             "dropout")
        opts = dict(
            dp_overlap=dp_overlap, grad_bytes=grad_bytes,
            adam_bytes_per_param=adam_bytes_per_param, precision=prec,
            clock_fraction=clock_fraction, net=_comm.net_variant_of(system),
            tp_overlap=tp_overlap, finetune=finetune, zero3_calls=_layer.zero3_calls_flag(par),
            zero_used=static_flag(par.zero, lambda a: a > 0.5))
        # the composition needs only the shapes of the stage times: its graph is built in
        # the background while the stage times trace and compile (two graphs of similar
        # size, compiled on two cores at once)
        times_shape = batch_shape(system, model, par, global_batch, seq_len, clock_fraction,
                                  prec, finetune)
        f = jnp.result_type(float)
        compile_ahead(_from_stage_times, system, model, par, global_batch, seq_len,
                      {k: jax.ShapeDtypeStruct(times_shape, f) for k in STAGE_KEYS},
                      **opts, **kw)
        with jax.ensure_compile_time_eval():      # de-duplication reads concrete values
            times = stage_times(system, model, par, global_batch, seq_len, gemm=gemm,
                                precision=prec, clock_fraction=clock_fraction,
                                dropout=dropout, chunk=chunk, finetune=finetune)
        with stage("train_step: composition") as st:
            out = batched(_from_stage_times, **kw)(system, model, par, global_batch,
                                                   seq_len, times, **opts)
            jax.block_until_ready(out)
            st["note"] = f"{math.prod(shape):,} plans"
        return out
    # static op-graph switches from concrete inputs (smaller graphs, faster compiles)
    variant = (_layer.variant_of(model, par, system) if is_concrete(model, par)
               else _layer.ANY._replace(net=_comm.net_variant_of(system)))
    kwargs = dict(gemm=gemm, dp_overlap=dp_overlap, grad_bytes=grad_bytes,
                  adam_bytes_per_param=adam_bytes_per_param, precision=prec,
                  clock_fraction=clock_fraction, dropout=dropout, variant=variant,
                  tp_overlap=tp_overlap, finetune=finetune, context=_cx.context_flag(par))
    if chunk is None:
        return _train_step_batched(system, model, par, global_batch, seq_len, **kwargs)
    return batched(train_step_single, chunk=chunk)(system, model, par, global_batch, seq_len,
                                                   **kwargs)


train_step.single = train_step_single
# the defaults a recipe's step settings fill in (read off the signature, not restated)
_TRAIN_STEP_DEFAULTS = {k: p.default for k, p in inspect.signature(train_step).parameters.items()
                        if k in _recipes.STEP_KEYS}
