"""One training step of a decoder-only transformer under DP × TP × PP (+SP, ZeRO, recompute).

``train_step(system, model, par, global_batch, seq_len)`` → :class:`TrainResult`.

The step is built from per-layer times (:func:`jaxmodel.workload.layer.
training_layer_times`, :func:`~jaxmodel.workload.layer.embedding_times`), the collectives
(:func:`jaxmodel.comm.collective_cost`) and the elementwise kernel (optimizer), composed as
Megatron-LM executes them (Narayanan et al., SC'21, "PTD-P"; Korthikanti et al., MLSys 2023):

**Placement** (PTD-P §3.2 "Takeaway #1/#2"): device id = tp_rank + tp·(pp_rank + pp·dp_rank),
i.e. TP innermost (inside a node), then PP, then DP across nodes. Collective groups: TP
contiguous (stride 1), DP at stride tp·pp; pipeline transfers cross the outermost network tier
the tp·pp devices of one pipeline span.

**Per stage and micro-batch** (slowest stage): ``L/p`` layers (all ``v`` chunks of a device)
× (forward + backward + recompute + TP collectives, all serial — Megatron does not overlap TP
communication — plus the bias/dropout/residual kernels of :func:`residual_dropout_times`),
plus the embedding on the first stage and the LM head + loss on the last (both on the one
stage when p = 1).

**Pipeline** (:mod:`jaxmodel.parallel.pipeline`): m·t_max + (p−1)/v·t_mean + exposed
stage-boundary transfers (2 per micro-batch and chunk, plus fill/drain), each b·s·h·2/t bytes
(scatter/gather optimisation, PTD-P §4.1; the re-assembling all-gather over TP when SP is off).
With p > 1 and tied embeddings the first and last stage all-reduce the embedding gradient.

**Data parallelism and ZeRO** (Rajbhandari et al., SC'20, §5 and §7): gradients are reduced in
``grad_bytes`` (4 = fp32 main gradients, as Megatron-LM keeps them), parameters gathered in
2-byte precision, over the DP group of the most loaded stage:

===========  =====================================================  =======================
ZeRO stage   collectives                                           overlap window
===========  =====================================================  =======================
0            all-reduce(grads) once per step                       last micro-batch's bwd
1            reduce-scatter(grads) once + all-gather(params) once  last bwd / next first fwd
2            reduce-scatter(grads) every micro-batch + all-gather   that micro-batch's bwd /
             (params) once                                           next first fwd
3            per micro-batch: all-gather(params) for fwd and for    that micro-batch's fwd
             bwd, reduce-scatter(grads)                             and bwd
===========  =====================================================  =======================

**Overlap model.** Gradient buckets are reduced while the backward pass of the last
micro-batch still runs (PyTorch DDP, Li et al., VLDB 2020, §3.2.3 "bucketing" and overlap;
Megatron-core ``--overlap-grad-reduce``), and the ZeRO parameter all-gather overlaps the next
forward (``--overlap-param-gather``; FSDP prefetching, Zhao et al., VLDB 2023, §3.3). Only the
part of a collective longer than ``dp_overlap ×`` its compute window is exposed:
``exposed = max(0, t_comm − dp_overlap · t_window)``. ``dp_overlap = 1`` (default) is full
overlap; ``dp_overlap = 0`` serialises everything, as Megatron-LM 2021 did (its "local" DDP
all-reduced after the last backward). Contention of overlapped communication for memory
bandwidth/SMs is not modelled.

**TP communication overlap** (``tp_overlap``, default 0 = Megatron-LM 2021, which runs the TP
collectives serially): the layer's TP collectives are decomposed and pipelined with the
GEMMs that produce or consume them (Wang et al., ASPLOS 2023, "Overlap Communication with
Dependent Computation via Decomposition"; Megatron-core ``--tp-comm-overlap`` with Transformer
Engine userbuffers). Same rule per layer and pass: ``exposed = max(0, t_tp − tp_overlap ·
t_compute)`` with the layer's forward (backward incl. recompute) compute as the window.

**Sustained clocks**: the device runs at ``freq_hz ×`` its sustained clock fraction under
training load (power limit; ``hw_db/tech/training.toml``, derived from sustained vs short-run
GEMM microbenchmarks), see :func:`sustained_device`.

**Optimizer**: mixed-precision Adam on the local parameter shard (÷dp from ZeRO-1), a
memory-bound elementwise kernel moving ``adam_bytes_per_param`` (hw_db/tech/training.toml).

**Memory**: ``training_memory`` with the schedule's in-flight micro-batches; compared
with ``system.device.mem_capacity``.

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
import math
import tomllib
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel.batching import batch_shape, batched
from jaxmodel.parallel import pipeline as pl
from jaxmodel.types import (Model, Parallelism, System, is_concrete, validate_model,
                            validate_parallelism, validate_system)
from jaxmodel.workload import layer as _layer
from jaxmodel.workload import memory as _memory
from jaxmodel.workload import moe as _moe
from jaxmodel.workload import params as _params

# --------------------------------------------------------------------------------------------
# Training constants (hw_db/tech/training.toml, each with its source)
# --------------------------------------------------------------------------------------------
_TECH = Path(__file__).resolve().parents[2] / "hw_db" / "tech" / "training.toml"


def _load_table(name: str) -> dict:
    with open(_TECH, "rb") as f:
        data = tomllib.load(f)
    out = {}
    for key, entry in data.get(name, {}).items():
        if not isinstance(entry, dict) or "value" not in entry or not str(
                entry.get("source", "")).strip():
            raise ValueError(f"{_TECH}: field '{name}.{key}' must be "
                             f"{{value = ..., source = ...}}")
        out[key] = float(entry["value"])
    return out


CONSTANTS = _load_table("training")


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
            ``recompute``, ``tp_comm``, ``pp_comm``, ``dp_comm`` (exposed parts only),
            ``bubble`` (pipeline fill/drain), ``embedding`` (embedding, LM head, loss and their
            TP collectives), ``optimizer``, ``ep_comm`` (MoE dispatch/combine all-to-all,
            :func:`jaxmodel.workload.moe.alltoall_time`). They sum to ``step_time_s``.
        memory: dict bytes per device: ``weights``, ``gradients``, ``optimizer``,
            ``activations``, ``total``.
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


def _exposed(t_comm, window, overlap):
    """Non-overlapped part of a collective: ``max(0, t_comm − overlap · window)`` (s)."""
    return jnp.maximum(t_comm - overlap * window, 0.0)


def plan_checks(system: System, model: Model, par: Parallelism, global_batch, seq_len):
    """Structural checks of a training plan as ``[(ok, reason_name), ...]`` (single config).

    Degrees are integers ≥ 1, ZeRO ∈ {0..3}, schedule/recompute codes valid; dp·tp·pp equals
    the system's devices; tp divides the query heads (KV heads divide or are replicated);
    pp·v divides the layers; m = B/(dp·b) is a positive integer (and a multiple of p for the
    interleaved schedule, a Megatron-LM requirement, PTD-P §2.2.2); ``interleave > 1`` only
    with the interleaved schedule; under SP tp divides the sequence; ep divides the experts
    and dp. Memory is checked separately.
    """
    tp, pp, dp = par.tp, par.pp, par.dp
    ints = [par.dp, par.tp, par.pp, par.ep, par.micro_batch, par.interleave]
    degrees_ok = jnp.asarray(True)
    for x in ints:
        degrees_ok = degrees_ok & (x >= 1) & nx.is_integer(x)
    codes_ok = ((par.zero >= 0) & (par.zero <= 3) & nx.is_integer(par.zero)
                & (par.schedule >= 0) & (par.schedule <= 2) & nx.is_integer(par.schedule)
                & (par.recompute >= 0) & (par.recompute <= 2) & nx.is_integer(par.recompute))
    schedule_ok = (par.interleave < 1.5) | (par.schedule == pl.INTERLEAVED)
    model_ok = ((model.d_model > 0) & (model.n_heads > 0) & (model.n_kv_heads > 0)
                & (model.head_dim > 0) & (model.d_ff > 0) & (model.n_layers > 0)
                & (model.vocab_size > 0) & (seq_len > 0) & (global_batch > 0))
    t = jnp.maximum(tp, 1.0)
    heads_ok = nx.divides(t, model.n_heads) & (nx.divides(t, model.n_kv_heads)
                                                | nx.divides(model.n_kv_heads, t))
    v = pl.effective_interleave(par.schedule, par.interleave)
    layers_ok = nx.divides(jnp.maximum(pp, 1.0) * jnp.maximum(v, 1.0), model.n_layers)
    m = pl.n_microbatches(global_batch, dp, par.micro_batch)
    batch_ok = (m >= 1) & nx.is_integer(m)
    batch_ok = batch_ok & ((par.schedule != pl.INTERLEAVED) | (pp < 1.5)
                           | nx.divides(jnp.maximum(pp, 1.0), m))
    devices_ok = jnp.abs(dp * tp * pp - system.n_devices) < 0.5
    seq_ok = (par.sp < 0.5) | nx.divides(t, seq_len)
    experts_ok = (nx.divides(jnp.maximum(par.ep, 1.0), model.n_experts)
                  & nx.divides(jnp.maximum(par.ep, 1.0), jnp.maximum(dp, 1.0)))
    return [(model_ok, "invalid_model"),
            (degrees_ok & codes_ok & schedule_ok, "invalid_parallelism"),
            (devices_ok, "devices_mismatch"),
            (heads_ok, "heads_not_divisible"),
            (layers_ok, "layers_not_divisible"),
            (batch_ok, "batch_not_divisible"),
            (seq_ok, "sequence_not_divisible"),
            (experts_ok, "experts_not_divisible")]


def _sanitised(par: Parallelism, ok) -> Parallelism:
    """A structurally harmless plan where ``ok`` is False (double-where: no NaN anywhere)."""
    def s(x, fallback=1.0):
        return jnp.where(ok, x, fallback)
    return dataclasses.replace(
        par, dp=s(par.dp), tp=s(par.tp), pp=s(par.pp), ep=s(par.ep),
        micro_batch=s(par.micro_batch), interleave=s(par.interleave),
        schedule=s(par.schedule), recompute=s(par.recompute, 0.0), zero=s(par.zero, 0.0),
        sp=s(par.sp, 0.0))


def _sanitised_model(model: Model, ok) -> Model:
    def s(x):
        return jnp.where(ok, x, 1.0)
    return dataclasses.replace(
        model, n_layers=s(model.n_layers), d_model=s(model.d_model), n_heads=s(model.n_heads),
        n_kv_heads=s(model.n_kv_heads), head_dim=s(model.head_dim), d_ff=s(model.d_ff),
        vocab_size=s(model.vocab_size))


def _collectives(system: System, op: str, calls, net: _comm.NetVariant = _comm.ANY_NET):
    """Evaluate several ``op`` collectives ``[(nbytes, group, stride), ...]`` in one vmap.

    Returns ``(times, ok, reason)`` as tuples/arrays over the calls. One trace of the
    collective model per op keeps the compiled step small.
    """
    f = jnp.result_type(float)
    cols = [jnp.stack([jnp.asarray(c[i], dtype=f) for c in calls]) for i in range(3)]
    t, ok, why = jax.vmap(
        lambda n, g, s: _comm.collective_cost.single(system, op, n, g, "auto", s, net))(*cols)
    return tuple(t[i] for i in range(len(calls))), ok, why


def _cross_stride(system: System, span):
    """Stride of a 2-member group that crosses the outermost tier ``span`` devices reach.

    With ids counted innermost tier first, ``span`` consecutive devices cross tier k when
    ``span`` exceeds the devices inside one tier-k element. The returned stride (devices per
    element of that tier's inner block) makes :func:`jaxmodel.comm.collective_cost` place
    the pair across exactly that tier. 1 when ``span`` fits the innermost tier.
    """
    stride = jnp.asarray(1.0)
    inner = 1.0
    for lvl in system.levels:
        stride = jnp.where(span > inner + 0.5, inner, stride)
        inner = inner * jnp.maximum(lvl.size, 1.0)
    return stride


def residual_dropout_times(dev, model: Model, par: Parallelism, micro_batch, seq_len,
                           dropout=1.0, dtype_bytes=2.0):
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
    overhead). ``dropout`` is 1 (Megatron GPT) or 0 (no dropout, e.g. Llama recipes).
    """
    tp = jnp.maximum(par.tp, 1.0)
    heads = model.n_heads / tp
    e = micro_batch * seq_len * model.d_model
    e = jnp.where(par.sp > 0.5, e / tp, e)
    probs = micro_batch * heads * seq_len * seq_len
    on = dropout > 0.5
    w = dtype_bytes / 2.0                     # byte counts above are for 2-byte activations

    def k(n, nbytes, flops):
        return _ops.elementwise_latency.single(dev, n, nbytes * w, flops)

    bda_f = k(e, jnp.where(on, 7.0, 6.0), 3.0)
    bda_b = k(e, jnp.where(on, 5.0, 0.0), 1.0) + k(e, 6.0, 1.0) + k(e, 2.0, 1.0)
    bda_b = jnp.where(on, bda_b, k(e, 8.0, 1.0))
    attn = jnp.where(on & (par.flash_attention < 0.5), k(probs, 5.0, 1.0), 0.0)
    return 2.0 * bda_f + attn, 2.0 * bda_b + attn, attn


# --------------------------------------------------------------------------------------------
# the single-configuration model
# --------------------------------------------------------------------------------------------
def _prepare(system: System, model: Model, par: Parallelism, global_batch, seq_len,
             clock_fraction=None):
    """Sustained-clock system, plan checks and sanitised inputs (single configuration)."""
    f = jnp.result_type(float)
    peak = system.device.peak_matrix_flops          # nominal (datasheet) peak for the MFU
    system = dataclasses.replace(system, device=sustained_device(system.device, clock_fraction))
    global_batch = jnp.asarray(global_batch, dtype=f)
    seq_len = jnp.asarray(seq_len, dtype=f)
    checks = plan_checks(system, model, par, global_batch, seq_len)
    structure_ok, _ = nx.first_reason(checks)
    model_s = _sanitised_model(model, checks[0][0])
    par_s = _sanitised(par, structure_ok)
    gb = jnp.where(structure_ok, global_batch, par_s.dp * par_s.micro_batch)
    seq = jnp.where(checks[0][0], seq_len, 1.0)
    return system, peak, checks, structure_ok, model_s, par_s, gb, seq


def _stage_plan(par_s: Parallelism) -> Parallelism:
    """The plan fields the per-layer times may read, others canonical (dp = ep satisfies
    the expert checks; interleave, schedule and ZeRO do not enter a layer). Plans equal
    here share their stage times (the de-duplication key of :func:`train_step`)."""
    one = jnp.ones_like(par_s.dp)
    return dataclasses.replace(par_s, dp=jnp.maximum(par_s.ep, 1.0), interleave=one,
                               schedule=one, zero=0.0 * one)


STAGE_KEYS = ("fwd", "bwd", "recompute", "tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd",
              "ep_comm_bwd", "embed_fwd", "embed_bwd", "lm_head_fwd", "lm_head_bwd",
              "loss_fwd", "loss_bwd", "emb_comm_fwd", "emb_comm_bwd", "rd_fwd", "rd_bwd",
              "rd_selective")


def stage_times_single(system: System, model: Model, par: Parallelism, seq_len,
                       gemm: Callable | None = None, dtype_bytes=2.0, dropout=1.0,
                       variant: _layer.Variant = _layer.ANY) -> dict:
    """Per-layer and embedding times of one micro-batch (``par.micro_batch`` sequences) on
    one device, s: the workload's training layer and embedding times plus
    :func:`residual_dropout_times` (keys :data:`STAGE_KEYS`). ``system`` runs at its
    sustained clock, ``model``/``par`` are sanitised (see :func:`train_step_single`)."""
    b = par.micro_batch
    lt = _layer.training_layer_times.single(system, model, par, b, seq_len, gemm=gemm,
                                            dtype_bytes=dtype_bytes, variant=variant)
    et = _layer.embedding_times.single(system, model, par, b, seq_len, gemm=gemm,
                                       dtype_bytes=dtype_bytes, variant=variant)
    rd = residual_dropout_times(system.device, model, par, b, seq_len, dropout, dtype_bytes)
    out = {k: lt[k] for k in STAGE_KEYS[:7]}
    out.update({k: et[k] for k in STAGE_KEYS[7:13]})
    out.update(emb_comm_fwd=et["comm_fwd"], emb_comm_bwd=et["comm_bwd"], rd_fwd=rd[0],
               rd_bwd=rd[1], rd_selective=rd[2])
    return out


def train_step_single(system: System, model: Model, par: Parallelism, global_batch, seq_len,
                      gemm: Callable | None = None, dp_overlap=1.0, grad_bytes=None,
                      adam_bytes_per_param=None, dtype_bytes=2.0,
                      clock_fraction=None, dropout=1.0,
                      variant: _layer.Variant = _layer.ANY, tp_overlap=0.0) -> TrainResult:
    """Single-configuration body of :func:`train_step` (use inside other formulas).

    Args:
        gemm: static GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s`` passed
            to the workload's layer/embedding times (e.g. a :mod:`gemm_table` lookup); None
            uses the ops tile search.
        dp_overlap: fraction of the compute window usable to hide DP/ZeRO collectives (0..1).
        tp_overlap: fraction of a layer's compute usable to hide its TP collectives (0..1;
            0 = Megatron-LM 2021, 1 = Megatron-core ``--tp-comm-overlap``).
        grad_bytes: bytes per gradient element for memory and reduction traffic (default
            ``training.toml`` ``main_grad_bytes``).
        adam_bytes_per_param: main-memory bytes the optimizer step moves per parameter
            (default ``training.toml``).
        dtype_bytes: bytes per weight/activation element (2 = fp16/bf16).
        clock_fraction: sustained core-clock fraction (default: ``training.toml`` by device
            name, see :func:`sustained_device`); the GEMM hook receives the scaled device.
        dropout: 1 = Megatron GPT's hidden and attention dropout, 0 = none (changes the
            memory-bound kernels of :func:`residual_dropout_times`).
        variant: static branch switches of the workload's op graph
            (:class:`jaxmodel.workload.layer.Variant`; ``ANY`` keeps every branch).
    """
    prep = _prepare(system, model, par, global_batch, seq_len, clock_fraction)
    system_t, _, _, _, model_s, par_s, _, seq = prep
    times = stage_times_single(system_t, model_s, _stage_plan(par_s), seq, gemm, dtype_bytes,
                               dropout, variant)
    return _compose(prep, times, dp_overlap, grad_bytes, adam_bytes_per_param, dtype_bytes,
                    variant.net, tp_overlap)


def _from_stage_times(system, model, par, global_batch, seq_len, times, dp_overlap=1.0,
                      grad_bytes=None, adam_bytes_per_param=None, dtype_bytes=2.0,
                      clock_fraction=None, net: _comm.NetVariant = _comm.ANY_NET,
                      tp_overlap=0.0):
    """:func:`train_step_single` with the stage times given (the de-duplicated path)."""
    prep = _prepare(system, model, par, global_batch, seq_len, clock_fraction)
    return _compose(prep, times, dp_overlap, grad_bytes, adam_bytes_per_param, dtype_bytes,
                    net, tp_overlap)


def _stage_inputs(system, model, par, global_batch, seq_len, clock_fraction=None):
    """Inputs of :func:`stage_times_single` for one configuration (de-duplication key)."""
    system_t, _, _, _, model_s, par_s, _, seq = _prepare(system, model, par, global_batch,
                                                         seq_len, clock_fraction)
    return system_t, model_s, _stage_plan(par_s), seq


def _compose(prep, times, dp_overlap, grad_bytes, adam_bytes_per_param, dtype_bytes,
             net: _comm.NetVariant = _comm.ANY_NET, tp_overlap=0.0):
    """The step from the stage times: pipeline, DP/ZeRO, optimizer, memory, feasibility."""
    system, peak, checks, structure_ok, model_s, par_s, gb, seq = prep
    f = jnp.result_type(float)
    grad_bytes = CONSTANTS["main_grad_bytes"] if grad_bytes is None else grad_bytes
    adam_bytes = (CONSTANTS["adam_bytes_per_param"] if adam_bytes_per_param is None
                  else adam_bytes_per_param)
    dev = system.device
    tp, pp, dp, b = par_s.tp, par_s.pp, par_s.dp, par_s.micro_batch
    m = pl.n_microbatches(gb, dp, b)
    layers = model_s.n_layers / pp                       # per device, all v chunks

    times_ok = jnp.asarray(True)
    for k in STAGE_KEYS:
        times_ok = times_ok & jnp.isfinite(times[k])
    t = {k: _finite(times[k]) for k in STAGE_KEYS}
    fwd, bwd, rc = t["fwd"], t["bwd"], t["recompute"]
    tpf, tpb, epf, epb = t["tp_comm_fwd"], t["tp_comm_bwd"], t["ep_comm_fwd"], t["ep_comm_bwd"]
    # the bias/dropout/residual kernels the workload's layer omits (see residual_dropout_times)
    rcode = par_s.recompute
    rc = rc + jnp.select([rcode < 0.5, rcode < 1.5], [0.0, t["rd_selective"]], t["rd_fwd"])
    fwd = fwd + t["rd_fwd"]
    bwd = bwd + t["rd_bwd"]
    # TP collectives pipelined with the GEMMs of the same pass (module docstring, Wang et
    # al. 2023): forward, the recomputed forward (full recompute repeats the forward's TP
    # and EP communication, inside ``rc``) and backward, each against its own compute.
    tp_ov = jnp.asarray(tp_overlap, dtype=f)
    full_rc = rcode >= 1.5
    rc_tp = jnp.where(full_rc, tpf, 0.0)
    rc_compute = rc - rc_tp - jnp.where(full_rc, epf, 0.0)
    rc = rc - rc_tp + _exposed(rc_tp, rc_compute, tp_ov)
    tpf = _exposed(tpf, fwd, tp_ov)
    tpb = _exposed(tpb, bwd, tp_ov)
    emb_comm = t["emb_comm_fwd"] + t["emb_comm_bwd"]
    # embedding lookup on the first stage, LM head + loss on the last; their TP collectives
    # split evenly between the two (the embedding output all-reduce vs the head's input-grad
    # all-reduce + the two small loss all-reduces).
    first = t["embed_fwd"] + t["embed_bwd"] + 0.5 * emb_comm
    last = (t["lm_head_fwd"] + t["lm_head_bwd"] + t["loss_fwd"] + t["loss_bwd"]
            + 0.5 * emb_comm)
    multi_stage = pp > 1.5
    extra_max = jnp.where(multi_stage, jnp.maximum(first, last), first + last)
    extra_mean = (first + last) / pp

    layer_f = layers * (fwd + tpf + epf)                  # forward of one micro-batch
    layer_b = layers * (bwd + rc + tpb + epb)             # backward (+ recompute)
    window_f = layer_f
    window_b = layer_b

    # ---- data parallelism / ZeRO ---------------------------------------------------------
    n_par = _params.params_per_device.single(model_s, par_s)
    # MoE: expert weights are reduced/sharded over DP_exp = dp/ep only (DeepSpeed-TED),
    # whose members are tp·pp·ep devices apart; the rest over dp
    n_exp = _moe.expert_params_per_device(model_s, par_s)
    grads_b = grad_bytes * (n_par - n_exp)
    params_b = dtype_bytes * (n_par - n_exp)
    dp_stride = tp * pp
    dp_multi = dp > 1.5
    dp_group = jnp.where(dp_multi, dp, 2.0)         # double-where: never a group of 1
    dpe = jnp.maximum(dp / jnp.maximum(par_s.ep, 1.0), 1.0)
    dpe_multi = (dpe > 1.5) & (n_exp > 0)          # dense models: no expert reduction
    dpe_group = jnp.where(dpe_multi, dpe, 2.0)
    dpe_stride = dp_stride * jnp.maximum(par_s.ep, 1.0)
    tp_multi = tp > 1.5
    act_bytes = pl.p2p_bytes(b, seq, model_s.d_model, tp, dtype_bytes)
    cross = _cross_stride(system, tp * pp)
    pair_stride = jnp.maximum(cross, tp)            # first↔last / worst neighbouring stages
    emb_grad_b = grad_bytes * model_s.vocab_size * model_s.d_model / tp
    # One vmapped collective evaluation per op (each op's graph is traced once).
    (t_ar, t_emb_ar, t_ar_e), ok_ar, why_ar = _collectives(
        system, "all_reduce", [(grads_b, dp_group, dp_stride), (emb_grad_b, 2.0, pair_stride),
                               (grad_bytes * n_exp, dpe_group, dpe_stride)], net)
    (t_rs, t_rs_e), _, _ = _collectives(system, "reduce_scatter",
                                        [(grads_b, dp_group, dp_stride),
                                         (grad_bytes * n_exp, dpe_group, dpe_stride)], net)
    (t_ag, t_regather, t_ag_e), _, _ = _collectives(
        system, "all_gather", [(params_b, dp_group, dp_stride),
                               (act_bytes * tp, jnp.where(tp_multi, tp, 2.0), 1.0),
                               (dtype_bytes * n_exp, dpe_group, dpe_stride)], net)
    (t_send,), ok_p2p, why_p2p = _collectives(system, "p2p", [(act_bytes, 2.0, pair_stride)],
                                                net)
    t_ar, t_rs, t_ag = (jnp.where(dp_multi, _finite(x), 0.0)
                        + jnp.where(dpe_multi, _finite(x_e), 0.0)
                        for x, x_e in ((t_ar, t_ar_e), (t_rs, t_rs_e), (t_ag, t_ag_e)))
    dp_net_ok = (~dp_multi | ok_ar[0]) & (~dpe_multi | ok_ar[2])
    zero = par_s.zero
    ov = jnp.asarray(dp_overlap, dtype=f)
    # once per step
    z0 = _exposed(t_ar, window_b, ov)
    z12_rs = jnp.where(zero < 1.5, _exposed(t_rs, window_b, ov), 0.0)
    z12_ag = _exposed(t_ag, window_f, ov)
    dp_step = jnp.select([zero < 0.5, zero < 2.5], [z0, z12_rs + z12_ag], 0.0)
    # every micro-batch (on the stage's critical path)
    z2_mb = _exposed(t_rs, window_b, ov)
    z3_mb = _exposed(t_ag, window_f, ov) + _exposed(t_ag + t_rs, window_b, ov)
    dp_mb = jnp.select([zero < 1.5, zero < 2.5], [0.0, z2_mb], z3_mb)

    # ---- pipeline ---------------------------------------------------------------------------
    stage_core = layer_f + layer_b
    t_mean = stage_core + extra_mean + dp_mb
    t_regather = jnp.where(tp_multi & (par_s.sp < 0.5), _finite(t_regather), 0.0)
    t_p2p = jnp.where(multi_stage, _finite(t_send) + t_regather, 0.0)
    pp_net_ok = ~multi_stage | ok_p2p[0]
    why_ar, why_p2p = why_ar[0], why_p2p[0]
    n_p2p = pl.p2p_transfers_on_critical_path(par_s.schedule, pp, m, par_s.interleave)
    bubble = pl.bubble_time(par_s.schedule, pp, par_s.interleave, t_mean)
    # tied embeddings: first and last stage all-reduce the word-embedding gradient (Megatron)
    t_emb_ar = jnp.where(multi_stage & (model_s.tied_embeddings > 0.5), _finite(t_emb_ar), 0.0)

    # ---- optimizer ----------------------------------------------------------------------
    local = (n_par - n_exp) / jnp.where(zero >= 0.5, dp, 1.0) + n_exp / jnp.where(
        zero >= 0.5, dpe, 1.0)
    t_opt = _finite(_ops.elementwise_latency.single(dev, local, adam_bytes,
                                                    CONSTANTS["adam_flops_per_param"]))

    breakdown = {
        "compute": m * layers * (fwd + bwd),
        "recompute": m * layers * rc,
        "tp_comm": m * layers * (tpf + tpb),
        "embedding": m * extra_max,
        "dp_comm": m * dp_mb + dp_step,
        "pp_comm": n_p2p * t_p2p + t_emb_ar,
        "bubble": bubble,
        "optimizer": t_opt,
        "ep_comm": m * layers * (epf + epb),
    }
    step = sum(breakdown[k] for k in BREAKDOWN_KEYS)

    # ---- memory -------------------------------------------------------------------------
    in_flight = pl.in_flight_microbatches(par_s.schedule, pp, m, par_s.interleave)
    mem = _memory.training_memory.single(model_s, par_s, seq, in_flight, grad_bytes)
    mem_ok = mem["total"] <= dev.mem_capacity

    ops_ok, ops_why = _ops.ops_feasible.single(dev)
    feasible, reason = nx.first_reason(
        checks + [(ops_ok, "invalid_device"), (dp_net_ok & pp_net_ok, "topology_mismatch"),
                  (times_ok, "invalid_network"), (mem_ok, "out_of_memory")])
    # more specific codes from the device / network checks
    reason = jnp.where(reason == nx.reason_code("invalid_device"), ops_why, reason)
    reason = jnp.where((reason == nx.reason_code("topology_mismatch")) & ~dp_net_ok, why_ar,
                       reason)
    reason = jnp.where((reason == nx.reason_code("topology_mismatch")) & dp_net_ok & ~pp_net_ok,
                       why_p2p, reason).astype(jnp.int32)

    flops = _params.model_flops_per_token.single(model_s, seq, False) * gb * seq
    full_rc = (_params.model_flops_per_token.single(model_s, seq, True) * gb * seq - flops)
    # selective recompute repeats the QKᵀ and AV forward GEMMs (none under FlashAttention,
    # whose backward recomputation is part of its backward time, as in the layer model)
    attn_rc = jnp.where(par_s.flash_attention > 0.5, 0.0, 4.0 * seq * model_s.n_heads
                        * model_s.head_dim * model_s.n_layers * gb * seq)
    hw_flops = flops + jnp.select([rcode < 0.5, rcode < 1.5], [0.0, attn_rc], full_rc)
    n_dev = dp * tp * pp
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


_train_step_batched = batched(train_step_single)
DEDUP_MIN_BATCH = 1   # the split path also compiles faster for one plan (18 s vs 29 s)


def stage_times(system: System, model: Model, par: Parallelism, global_batch, seq_len, *,
                gemm: Callable | None = None, dtype_bytes=2.0, clock_fraction=None,
                dropout=1.0, chunk: int | None = None) -> dict:
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
    shape = batch_shape(system, model, par, global_batch, seq_len, clock_fraction)
    variant = _layer.variant_of(model, par, system)
    inputs = batched(_stage_inputs, **kw)(system, model, par, global_batch, seq_len,
                                          clock_fraction)
    leaves, tree = jax.tree_util.tree_flatten(inputs)
    n = math.prod(shape)
    if n == 0:
        raise ValueError("train_step: empty batch of plans")
    cols = [np.broadcast_to(np.asarray(x), shape).reshape(n) for x in leaves]
    # constant columns stay scalars: unmapped leaves let XLA fold the device and model
    # constants into the tile search (half the compile time), and the unique is cheaper
    varying = {i for i, c in enumerate(cols) if n and c.min() != c.max()}
    if varying:
        _, first, inverse = np.unique(np.stack([cols[i] for i in sorted(varying)], axis=1), axis=0,
                                      return_index=True, return_inverse=True)
    else:
        first, inverse = np.zeros(1, dtype=int), np.zeros(n, dtype=int)
    sub = jax.tree_util.tree_unflatten(tree, [
        jnp.asarray(c[first]) if i in varying else jnp.asarray(c[0]) for i, c in enumerate(cols)])
    times_u = batched(stage_times_single, **kw)(*sub, gemm=gemm, dtype_bytes=dtype_bytes,
                                                dropout=dropout, variant=variant)
    inverse = np.asarray(inverse).reshape(n)
    return {k: jnp.asarray(np.atleast_1d(np.asarray(v))[inverse].reshape(shape))
            for k, v in times_u.items()}


def train_step(system: System, model: Model, par: Parallelism, global_batch, seq_len, *,
               gemm: Callable | None = None, dp_overlap=1.0, grad_bytes=None,
               adam_bytes_per_param=None, dtype_bytes=2.0, clock_fraction=None,
               dropout=1.0, dedup: bool | None = None, chunk: int | None = None,
               tp_overlap=0.0) -> TrainResult:
    """Time, throughput and memory of one training step (data × tensor × pipeline parallel).

    Source: Narayanan et al., SC'21 (PTD-P: placement §3, schedules §2.2, scatter/gather §4.1,
    eq. 3 FLOPs), Korthikanti et al., MLSys 2023 (SP, selective recompute, activation memory),
    Rajbhandari et al., SC'20 (ZeRO), Li et al., VLDB 2020 (DP overlap); see the module
    docstring for the composition and the overlap model.

    Args:
        system: devices and network; ``system.n_devices`` must equal dp·tp·pp.
        model: the transformer.
        par: the plan (dp, tp, pp, sp, ep, micro_batch, interleave, schedule, recompute, zero).
        global_batch: sequences per optimizer step.
        seq_len: tokens per sequence.
        gemm: optional static GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s``
            (e.g. ``gemm_table.GemmTable.lookup``); default the ops tile search.
        dp_overlap: fraction of the backward/forward window that hides DP/ZeRO collectives
            (1 = full overlap, 0 = Megatron-LM 2021's serial all-reduce).
        tp_overlap: fraction of a layer's compute that hides its TP collectives (0 =
            default, Megatron-LM 2021; 1 = Megatron-core ``--tp-comm-overlap``, Wang et al.
            ASPLOS 2023).
        grad_bytes: gradient bytes per element (default 4, fp32 main gradients).
        adam_bytes_per_param: optimizer-step traffic per parameter (default from hw_db).
        dtype_bytes: bytes per weight/activation element.
        clock_fraction: sustained core-clock fraction under training load (default from
            ``hw_db/tech/training.toml`` by device name, 1.0 for unlisted devices).
        dropout: 1 (default) = Megatron GPT's dropout kernels, 0 = no dropout.
        dedup: evaluate the per-layer times once per distinct stage input (:func:`
            stage_times`) and compose every plan from them — exact, and much faster for
            parallelism sweeps. ``None`` (default): on for concrete batches of at least
            ``DEDUP_MIN_BATCH`` plans with scalar ``dtype_bytes`` and ``dropout`` — also
            for one plan: two smaller compiled graphs build faster than one big one.
        chunk: ``lax.map`` batch size for big batches (default ``batching.DEFAULT_CHUNK``).

    Returns:
        :class:`TrainResult` with the batch shape of the inputs in front of every field.

    Raises:
        ValueError: for a concrete single configuration whose plan is inconsistent (devices,
            divisibility, schedule, codes) — the message names the fields and values. Out of
            memory never raises: ``feasible=False``, reason ``out_of_memory``, memory figures.

    Example:
        >>> r = jm.train_step(hw_db.system("dgx_a100", nodes=128), hw_db.model("gpt3-175b"),
        ...                   jm.Parallelism(dp=8, tp=8, pp=16, micro_batch=1, interleave=3,
        ...                                  schedule="interleaved", recompute="full"),
        ...                   1536, 2048)
        >>> float(r.step_time_s), float(r.mfu)
    """
    concrete = is_concrete(system, model, par, global_batch, seq_len, clock_fraction)
    shape = batch_shape(system, model, par, global_batch, seq_len)
    if concrete and shape == ():
        validate_system(system)
        validate_model(model)
        validate_parallelism(par)
        _raise_if_inconsistent(system, model, par, global_batch, seq_len)
    kw = {} if chunk is None else {"chunk": chunk}
    scalar_knobs = all(np.ndim(x) == 0 and is_concrete(x) for x in (dtype_bytes, dropout))
    if dedup is None:
        dedup = concrete and scalar_knobs and math.prod(shape) >= DEDUP_MIN_BATCH
    if dedup:
        if not (concrete and scalar_knobs):
            raise ValueError("train_step(dedup=True) needs concrete inputs and scalar "
                             "dtype_bytes and dropout")
        times = stage_times(system, model, par, global_batch, seq_len, gemm=gemm,
                            dtype_bytes=dtype_bytes, clock_fraction=clock_fraction,
                            dropout=dropout, chunk=chunk)
        return batched(_from_stage_times, **kw)(
            system, model, par, global_batch, seq_len, times, dp_overlap=dp_overlap,
            grad_bytes=grad_bytes, adam_bytes_per_param=adam_bytes_per_param,
            dtype_bytes=dtype_bytes, clock_fraction=clock_fraction,
            net=_comm.net_variant_of(system), tp_overlap=tp_overlap)
    # static op-graph switches from concrete inputs (smaller graphs, faster compiles)
    variant = (_layer.variant_of(model, par, system) if is_concrete(model, par)
               else _layer.ANY._replace(net=_comm.net_variant_of(system)))
    kwargs = dict(gemm=gemm, dp_overlap=dp_overlap, grad_bytes=grad_bytes,
                  adam_bytes_per_param=adam_bytes_per_param, dtype_bytes=dtype_bytes,
                  clock_fraction=clock_fraction, dropout=dropout, variant=variant,
                  tp_overlap=tp_overlap)
    if chunk is None:
        return _train_step_batched(system, model, par, global_batch, seq_len, **kwargs)
    return batched(train_step_single, chunk=chunk)(system, model, par, global_batch, seq_len,
                                                   **kwargs)


train_step.single = train_step_single


def _raise_if_inconsistent(system, model, par, global_batch, seq_len):
    """Clear ``ValueError`` for an inconsistent concrete plan (API edge, single config)."""
    g = lambda x: float(np.asarray(x))  # noqa: E731
    dp, tp, pp, b = g(par.dp), g(par.tp), g(par.pp), g(par.micro_batch)
    v, sched = g(par.interleave), g(par.schedule)
    B, s, n = g(global_batch), g(seq_len), g(system.n_devices)
    L, H, KV = g(model.n_layers), g(model.n_heads), g(model.n_kv_heads)
    problems = []
    for name, x in (("dp", dp), ("tp", tp), ("pp", pp), ("ep", g(par.ep)),
                    ("micro_batch", b), ("interleave", v)):
        if x < 1 or x != round(x):
            problems.append(f"{name}={x:g} must be an integer >= 1")
    for name, x, hi in (("schedule", sched, 2), ("recompute", g(par.recompute), 2)):
        if x not in range(hi + 1):
            problems.append(f"{name} code {x:g} must be 0..{hi}")
    if problems:
        raise ValueError("train_step: invalid parallelism: " + "; ".join(problems))
    if v > 1 and sched != pl.INTERLEAVED:
        raise ValueError(f"train_step: interleave={v:g} needs schedule='interleaved' "
                         f"(got schedule code {sched:g})")
    if abs(dp * tp * pp - n) > 0.5:
        raise ValueError(f"train_step: dp·tp·pp = {dp:g}·{tp:g}·{pp:g} = {dp * tp * pp:g} "
                         f"does not match the system's {n:g} devices")
    if H % tp or (KV % tp and tp % KV):
        raise ValueError(f"train_step: tp={tp:g} must divide n_heads={H:g} (and n_kv_heads="
                         f"{KV:g} must divide or be divisible by tp)")
    vv = v if sched == pl.INTERLEAVED else 1.0
    if L % (pp * vv):
        raise ValueError(f"train_step: n_layers={L:g} is not divisible by pp·interleave = "
                         f"{pp:g}·{vv:g}")
    m = B / (dp * b)
    if m < 1 or m != round(m):
        raise ValueError(f"train_step: global_batch={B:g} is not a multiple of dp·micro_batch"
                         f" = {dp:g}·{b:g}")
    if sched == pl.INTERLEAVED and pp > 1 and m % pp:
        raise ValueError(f"train_step: the interleaved schedule needs the micro-batch count "
                         f"m = {m:g} to be a multiple of pp = {pp:g} (Megatron-LM)")
    if g(par.sp) > 0.5 and s % tp:
        raise ValueError(f"train_step: sequence parallelism needs tp={tp:g} to divide "
                         f"seq_len={s:g}")
    ep, E = g(par.ep), g(model.n_experts)
    if E % ep or dp % ep:
        raise ValueError(f"train_step: ep={ep:g} must divide n_experts={E:g} and dp={dp:g}")
    # the network must be able to place the DP group at stride tp·pp
    if dp > 1:
        _, ok, why = _comm.collective_cost(system, "all_reduce", 1.0, dp, "auto", tp * pp)
        if not bool(ok):
            from jaxmodel.numerics import reason_name
            raise ValueError(f"train_step: the data-parallel group (dp={dp:g}, stride tp·pp="
                             f"{tp * pp:g}) cannot be placed on the system's tiers "
                             f"{[g(l.size) for l in system.levels]}: {reason_name(why)}")
