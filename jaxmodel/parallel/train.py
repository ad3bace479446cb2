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
communication — plus the bias/dropout/residual kernels of :func:`~jaxmodel.parallel.train_stage.residual_dropout_times`),
plus the embedding on the first stage and the LM head + loss on the last (both on the one
stage when p = 1).

**Pipeline** (:mod:`jaxmodel.parallel.pipeline`): m·t_max + (p−1)/v·t_mean + exposed
stage-boundary transfers (2 per micro-batch and chunk, plus fill/drain; m + 1 for two
stages), each b·s·h·2/t bytes
(scatter/gather optimisation, PTD-P §4.1; the re-assembling all-gather over TP when SP is off).
With p > 1 and tied embeddings the first and last stage all-reduce the embedding gradient.
``pp_overlap = 1`` (Megatron-core ``overlap_p2p_comm``, set by NeMo's pipelined configs) posts
the interleaved schedule's exchanges asynchronously: the steady ones run beside the next
chunk (:func:`jaxmodel.parallel.pipeline.overlapped_p2p_time`); 0 (default) blocks as above.

**DualPipe** (``schedule="dualpipe"``; DeepSeek-V3 Technical Report §3.2.1–3.2.2, Table 2;
deepseek-ai/DualPipe): each rank runs stage ``i`` and ``p−1−i`` (its load per micro-batch the
mean of the two), the all-to-all and the steady stage transfers hidden behind the paired
forward/backward chunks with the computation on the SMs left by the communication's 20
(:func:`jaxmodel.parallel.train_compose._dualpipe`), bubble ``(p/2 − 1)(F&B + B − 3W)``, two copies of the parameters
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
weight-gradient GEMMs on 16 SMs; each kind at most its serial time. The split host GEMMs
(``tp`` ring-exchange chunks of ``b·s/tp`` rows, 4 pipeline chunks of ``b·s/4``) run at their
own chunk shape's rate: the stage keys ``tp_split_*``
(:func:`~jaxmodel.parallel.train_stage.tp_split_times`,
:func:`~jaxmodel.parallel.overlap.te_split_gemms`) add the chunks' extra time to the
overlap's cost. Only plans with sequence
parallelism whose TP group lies within the innermost network tier (one NVLink domain) can
overlap (:func:`~jaxmodel.parallel.overlap.tp_eligible`); the others run serially whatever
the knob. ``tp_overlap = 1`` is that, 0 serial, fractions interpolate. With or without the
knob, sequence parallelism re-gathers the QKV / FC1 inputs in the backward beside their
input-gradient GEMMs (Megatron's asynchronous all-gather; Transformer Engine's ``bulk``
``qkv_dgrad`` / ``fc1_dgrad``): :func:`~jaxmodel.parallel.overlap.sp_regather_exposed`,
in ``tp_comm``.

**Sustained clocks**: the device runs at ``freq_hz ×`` its sustained clock fraction under
training load (power limit; the device field ``sustained_clock_fraction``, derived from
sustained vs short-run
GEMM microbenchmarks), see :func:`sustained_device`.

**Optimizer**: mixed-precision Adam on the local parameter shard (÷dp from ZeRO-1), a
memory-bound elementwise kernel moving ``adam_bytes_per_param`` (hw_db/tech/training.toml).

**Memory**: ``training_memory`` with the schedule's in-flight micro-batches, by term
(:data:`jaxmodel.workload.memory.TRAIN_MEMORY_TERMS`: weights, Transformer Engine's FP8
weight caches, gradients, optimizer, activations with FP8-stored GEMM inputs and, on the
last stage, the loss's logits and their fp32 copy, Transformer Engine's userbuffers where
its TP overlap runs, the NCCL communicators' buffers; :func:`jaxmodel.memory_breakdown`),
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

**Structure** (the factories of JAX MD, Schoenholz & Cubuk, NeurIPS 2020):
:func:`make_train_step` fixes a system, model and plan with the precision, fine-tuning, recipe
and the static graph switches (:class:`~jaxmodel.parallel.train_options.TrainStatics`) once
and returns ``step(options) -> TrainResult``, a pure single-configuration function of the
continuous knobs (:class:`~jaxmodel.parallel.train_options.TrainOptions`: batch, sequence,
overlaps, gradient bytes, clock, dropout and the Megatron-LM 2021 kernel stack);
:func:`train_step` batches it at the API edge. The step is the per-micro-batch stage times
(:mod:`jaxmodel.parallel.train_stage`) composed (:mod:`jaxmodel.parallel.train_compose`)
with the data-parallel communication (:mod:`jaxmodel.parallel.train_dp`).

**Concrete inputs** (:func:`train_step` on concrete plans, one or a batch): the
per-layer times depend on few plan fields, so they are evaluated once per distinct stage
input (:func:`stage_times`) and every plan is composed from them
(:func:`jaxmodel.parallel.train_compose.compose`) — the same functions as the
single-configuration path, so the results are identical up to float rounding. Combine it
with :mod:`jaxmodel.parallel.gemm_table` to run each distinct GEMM's tile search once.

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import comm as _comm
from jaxmodel import precisions as _prec
from jaxmodel import recipes as _recipes
from jaxmodel.batching import batch_shape, batched, compile_ahead, dedup_map
from jaxmodel.parallel import context as _cx
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel.train_compose import DUALPIPE_COMM_SMS, compose
from jaxmodel.parallel.train_options import (BREAKDOWN_KEYS, CONSTANTS, TrainOptions,
                                             TrainResult, TrainStatics, dropout_mode_options,
                                             sustained_device)
from jaxmodel.parallel.train_stage import (LAYER_KEYS, STAGE_KEYS, prepare,
                                           residual_dropout_times, stage_plan,
                                           stage_times_single)
from jaxmodel.process import stage
from jaxmodel.types import (DROPOUT_MODES, Model, Parallelism, System, code_of, is_concrete,
                            static_flag, validate_knobs, validate_model, validate_parallelism,
                            validate_system)
from jaxmodel.workload import layer as _layer

__all__ = ["make_train_step", "train_step", "train_step_single", "stage_times",
           "TrainOptions", "TrainStatics", "TrainResult", "residual_dropout_times",
           "stage_times_single", "sustained_device", "CONSTANTS", "BREAKDOWN_KEYS",
           "STAGE_KEYS", "LAYER_KEYS", "DUALPIPE_COMM_SMS"]

DEDUP_MIN_BATCH = 1   # the split path also compiles faster for one plan (18 s vs 29 s)


# --------------------------------------------------------------------------------------------
# the factory: one configuration
# --------------------------------------------------------------------------------------------
def _recipe_options(options: TrainOptions, r: _recipes.Recipe) -> TrainOptions:
    """``options`` with the knobs it leaves ``None`` taken from the recipe's step settings
    (:data:`jaxmodel.recipes.STEP_KEYS`; its dropout mode as the dropout and kernel-stack
    fields)."""
    fill = {k: v for k, v in r.step.items()
            if k in ("dp_overlap", "tp_overlap", "pp_overlap", "grad_bytes")}
    if "dropout" in r.step:
        fill.update(dropout_mode_options(code_of(r.step["dropout"], DROPOUT_MODES, "dropout")))
    return dataclasses.replace(options, **{k: v for k, v in fill.items()
                                           if getattr(options, k) is None})


def make_train_step(system: System, model: Model, par: Parallelism, *, precision=None,
                    finetune=None, recipe=None,
                    statics: TrainStatics = TrainStatics()) -> Callable[..., TrainResult]:
    """The training step of one configuration as a pure function of its continuous knobs.

    Fixes ``system``, ``model``, the plan ``par``, the precision, fine-tuning, the recipe and
    the static graph switches once and returns ``step(options) -> TrainResult`` for a
    :class:`~jaxmodel.parallel.train_options.TrainOptions` (global batch, sequence length,
    overlaps, gradient bytes, clock, dropout, kernel stack; ``None`` knobs take the recipe's
    setting, else their defaults). Every leaf is traceable: ``jax.jit``, ``jax.grad`` and
    ``jax.vmap`` apply to ``step`` and to the factory's arguments alike (the factory may be
    called inside a traced function); :func:`train_step` batches exactly this function.

    Args:
        system, model, par: one configuration (scalar leaves).
        precision: preset name or :class:`jaxmodel.Precision` (default the recipe's, else
            ``"bf16"``).
        finetune: ``None`` or a :class:`jaxmodel.LoRA` (:func:`train_step`).
        recipe: ``None`` or a :class:`jaxmodel.recipes.Recipe` / its name: its plan fields
            replace ``par``'s and its step settings fill the ``None`` knobs of ``options``.
        statics: :class:`~jaxmodel.parallel.train_options.TrainStatics` (GEMM hook, op-graph
            variant, context-parallel and ZeRO switches; default every branch).

    Example:
        >>> step = jm.make_train_step(hw_db.system("dgx_a100", nodes=128),
        ...                           hw_db.model("gpt3-175b"),
        ...                           jm.Parallelism(dp=8, tp=8, pp=16, micro_batch=1,
        ...                                          interleave=3, schedule="interleaved",
        ...                                          recompute="full"))
        >>> r = jax.jit(step)(jm.TrainOptions(global_batch=1536, seq_len=2048))
        >>> float(r.step_time_s), float(r.mfu)
        (29.6, 0.358)
    """
    r = None if recipe is None else _recipes.recipe(recipe)
    if r is not None:
        par = r.parallelism(par)
        precision = r.step.get("precision") if precision is None else precision
    prec = _prec.precision(precision)

    def step(options: TrainOptions) -> TrainResult:
        opts = options if r is None else _recipe_options(options, r)
        prep = prepare(system, model, par, opts, prec)
        times = stage_times_single(prep.system, prep.model, stage_plan(prep.par),
                                   dataclasses.replace(opts, seq_len=prep.seq_len), prec,
                                   finetune, statics)
        return compose(prep, times, opts, prec, finetune, statics)

    return step


def _train_point(system, model, par, options, precision, finetune, statics):
    """:func:`make_train_step`'s step on one configuration (what :func:`train_step`
    batches)."""
    return make_train_step(system, model, par, precision=precision, finetune=finetune,
                           statics=statics)(options)


_STATIC_KEYS = ("gemm", "variant", "context")


def train_step_single(system: System, model: Model, par: Parallelism, global_batch, seq_len,
                      **knobs) -> TrainResult:
    """Single-configuration :func:`train_step` (use inside other formulas):
    ``make_train_step(system, model, par, ...)(TrainOptions(global_batch, seq_len, ...))``.

    ``knobs``: the fields of :class:`~jaxmodel.parallel.train_options.TrainOptions`,
    ``precision`` (and the legacy ``dtype_bytes``, :func:`jaxmodel.precisions.resolve`),
    ``finetune``, ``recipe``, ``dropout`` also as a name of
    :data:`jaxmodel.types.DROPOUT_MODES` (``"megatron2021"`` sets ``megatron2021_stack``), and
    the static ``gemm``, ``variant``, ``context`` of
    :class:`~jaxmodel.parallel.train_options.TrainStatics`.

    Raises:
        TypeError: an unknown keyword (named).
    """
    fields = {f.name for f in dataclasses.fields(TrainOptions)}
    known = fields | set(_STATIC_KEYS) | {"precision", "dtype_bytes", "finetune", "recipe"}
    unknown = sorted(set(knobs) - known)
    if unknown:
        raise TypeError(f"train_step_single: unknown keyword(s) {unknown}; known "
                        f"{sorted(known)}")
    opts = {k: v for k, v in knobs.items() if k in fields}
    if "dropout" in opts and "megatron2021_stack" not in opts:
        opts.update(dropout_mode_options(code_of(opts["dropout"], DROPOUT_MODES, "dropout")))
    statics = TrainStatics(**{k: knobs[k] for k in _STATIC_KEYS if k in knobs})
    prec = _prec.resolve(knobs.get("precision"), knobs.get("dtype_bytes"))
    step = make_train_step(system, model, par, precision=prec, finetune=knobs.get("finetune"),
                           recipe=knobs.get("recipe"), statics=statics)
    return step(TrainOptions(global_batch, seq_len, **opts))


# --------------------------------------------------------------------------------------------
# concrete batches: stage times once per distinct stage input, composed into every plan
# --------------------------------------------------------------------------------------------
def _stage_inputs(system, model, par, options, precision=None, finetune=None):
    """Inputs of :func:`stage_times_single` for one configuration (de-duplication key):
    ``(system, model, stage plan, options, precision, finetune)`` with the sanitised sequence
    and the kernel fields of ``options`` (of which ``global_batch``, ``seq_len``,
    ``clock_fraction``, ``dropout`` and ``megatron2021_stack`` are read)."""
    prec = _prec.precision(precision)
    prep = prepare(system, model, par, options, prec)
    kernels = TrainOptions(None, prep.seq_len, dropout=options.dropout,
                           megatron2021_stack=options.megatron2021_stack)
    return prep.system, prep.model, stage_plan(prep.par), kernels, prec, finetune


def _stage_times_row(system, model, par, options, precision, finetune,
                     statics=TrainStatics(), part=None):
    """:func:`stage_times_single` on the outputs of :func:`_stage_inputs` (their order)."""
    return stage_times_single(system, model, par, options, precision, finetune, statics, part)


def _compose_row(system, model, par, options, times, precision=None, finetune=None,
                 statics=TrainStatics()):
    """:func:`make_train_step`'s step with the stage times given (the de-duplicated
    path)."""
    prec = _prec.precision(precision)
    return compose(prepare(system, model, par, options, prec), times, options, prec, finetune,
                   statics)


def _stage_options(options: TrainOptions) -> TrainOptions:
    """The fields of ``options`` the stage inputs read (:func:`_stage_inputs`)."""
    return TrainOptions(options.global_batch, options.seq_len,
                        clock_fraction=options.clock_fraction, dropout=options.dropout,
                        megatron2021_stack=options.megatron2021_stack)


def _stage_times(system, model, par, options, precision, finetune, statics, chunk=None):
    """:func:`stage_times` on options and statics (``statics.variant`` from concrete inputs;
    the kernel fields of ``options`` scalars)."""
    kw = {} if chunk is None else {"chunk": chunk}
    sopts = _stage_options(options)
    shape = batch_shape(system, model, par, sopts, precision, finetune)
    if math.prod(shape) == 0:
        raise ValueError("train_step: empty batch of plans")
    with stage("train_step: stage inputs"):
        inputs = batched(_stage_inputs, **kw)(system, model, par, sopts, precision, finetune)
        jax.block_until_ready(inputs)
    with stage("train_step: stage times") as st:
        # the layer and the rest as two graphs: one compiles while the other traces
        parts = ({},) if finetune is not None else ({"part": "layer"}, {"part": "rest"})
        out = {k: v for p in dedup_map(_stage_times_row, inputs, shape=shape,
                                       statics=statics, parts=parts, **kw)
               for k, v in p.items()}
        jax.block_until_ready(out)
        st["note"] = f"{math.prod(shape):,} plans"
    return out


def stage_times(system: System, model: Model, par: Parallelism, global_batch, seq_len, *,
                gemm: Callable | None = None, chunk: int | None = None, **knobs) -> dict:
    """Per-micro-batch stage times (:data:`STAGE_KEYS`) of a batch of plans, each distinct
    stage input evaluated once.

    The layer and embedding times of a plan depend on few of its fields (``tp, sp, ep, pp,
    micro_batch, recompute, flash_attention`` with the system, model and sequence; see
    :func:`jaxmodel.parallel.train_stage.stage_plan`). The batch is reduced to its distinct
    rows of those inputs (exact ``numpy.unique`` on the sanitised values),
    :func:`stage_times_single` runs once per row, and the results are gathered back —
    bit-identical to evaluating every plan. Concrete inputs only. ``knobs``: ``precision``
    (``dtype_bytes``), ``clock_fraction``, ``dropout`` (a scalar name or code of
    :data:`jaxmodel.types.DROPOUT_MODES`), ``finetune``.

    Returns:
        dict key → seconds with the batch shape of the inputs.
    """
    unknown = sorted(set(knobs) - {"precision", "dtype_bytes", "clock_fraction", "dropout",
                                   "finetune"})
    if unknown:
        raise TypeError(f"stage_times: unknown keyword(s) {unknown}")
    prec = _prec.resolve(knobs.get("precision"), knobs.get("dtype_bytes"))
    options = TrainOptions(global_batch, seq_len, clock_fraction=knobs.get("clock_fraction"),
                           **dropout_mode_options(code_of(knobs.get("dropout", 1.0),
                                                          DROPOUT_MODES, "dropout")))
    statics = TrainStatics(gemm, _layer.variant_of(model, par, system), _cx.context_flag(par))
    return _stage_times(system, model, par, options, prec, knobs.get("finetune"), statics,
                        chunk)


def _dedup_step(system, model, par, options, prec, finetune, statics, chunk=None):
    """:func:`train_step` on concrete plans: :func:`stage_times` once per distinct stage
    input, then every plan composed from them (:func:`_compose_row`)."""
    kw = {} if chunk is None else {"chunk": chunk}
    statics = statics._replace(zero_used=static_flag(par.zero, lambda a: a > 0.5))
    # the composition needs only the shapes of the stage times: its graph is built in the
    # background while the stage times trace and compile (two graphs of similar size,
    # compiled on two cores at once)
    times_shape = batch_shape(system, model, par, _stage_options(options), prec, finetune)
    f = jnp.result_type(float)
    compose_statics = statics._replace(gemm=None)
    compile_ahead(_compose_row, system, model, par, options,
                  {k: jax.ShapeDtypeStruct(times_shape, f) for k in STAGE_KEYS}, prec, finetune,
                  compose_statics, **kw)
    with jax.ensure_compile_time_eval():      # de-duplication reads concrete values
        times = _stage_times(system, model, par, options, prec, finetune,
                             statics._replace(zero_used=None), chunk)
    with stage("train_step: composition") as st:
        out = batched(_compose_row, **kw)(system, model, par, options, times, prec, finetune,
                                          compose_statics)
        jax.block_until_ready(out)
        n = math.prod(batch_shape(system, model, par, options.global_batch, options.seq_len,
                                  prec, finetune))
        st["note"] = f"{n:,} plans"
    return out


def _validate(system, model, par, options: TrainOptions, prec, finetune, dropout):
    """The knob ranges, and a concrete single configuration against the plan's rules
    (raises ``ValueError`` naming the reason, fields and values)."""
    validate_knobs("train_step", global_batch=options.global_batch, seq_len=options.seq_len,
                   dp_overlap=options.dp_overlap, tp_overlap=options.tp_overlap,
                   grad_bytes=options.grad_bytes,
                   adam_bytes_per_param=options.adam_bytes_per_param,
                   clock_fraction=options.clock_fraction, dropout=dropout,
                   pp_overlap=options.pp_overlap)
    concrete = is_concrete(system, model, par, options.global_batch, options.seq_len,
                           options.clock_fraction, prec, finetune)
    if concrete and batch_shape(system, model, par, options.global_batch, options.seq_len,
                                prec, finetune) == ():
        validate_system(system)
        validate_model(model)
        validate_parallelism(par)
        with jax.ensure_compile_time_eval():      # concrete even inside an outer jax.jit
            _plan.raise_if_invalid("train_step", _plan.TRAIN, _plan.inputs(
                model, par, n_devices=system.n_devices, batch=options.global_batch,
                seq_len=options.seq_len, dtype_bytes=prec.act_bytes), system, par)


# --------------------------------------------------------------------------------------------
# the public entry point: batches the factory's step
# --------------------------------------------------------------------------------------------
def train_step(system: System, model: Model, par: Parallelism, global_batch, seq_len, *,
               gemm: Callable | None = None, dp_overlap=1.0, grad_bytes=None,
               adam_bytes_per_param=None, dtype_bytes=None, clock_fraction=None,
               dropout=1.0, dedup: bool | None = None, chunk: int | None = None,
               tp_overlap=0.0, precision=None, finetune=None, recipe=None,
               pp_overlap=0.0) -> TrainResult:
    """Time, throughput and memory of one training step (data × tensor × pipeline parallel).

    Source: Narayanan et al., SC'21 (PTD-P: placement §3, schedules §2.2, scatter/gather §4.1,
    eq. 3 FLOPs), Korthikanti et al., MLSys 2023 (SP, selective recompute, activation memory),
    Rajbhandari et al., SC'20 (ZeRO), Li et al., VLDB 2020 (DP overlap); see the module
    docstring for the composition and the overlap model. The batched form of
    :func:`make_train_step`'s single-configuration step.

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
        pp_overlap: 0 (default) = blocking stage-boundary exchanges; 1 = Megatron-core
            ``overlap_p2p_comm`` under the interleaved schedule (steady-state exchanges
            beside the next chunk, :func:`jaxmodel.parallel.pipeline.overlapped_p2p_time`).
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
            ``"megatron2021"`` (2) = Megatron GPT's dropout on the Megatron-LM 2021 software
            stack (the option fields ``dropout`` and ``megatron2021_stack`` of
            :class:`~jaxmodel.parallel.train_options.TrainOptions`).
        dedup: evaluate the per-layer times once per distinct stage input (:func:`
            stage_times`) and compose every plan from them — exact, and much faster for
            parallelism sweeps. ``None`` (default): on for concrete batches of at least
            ``DEDUP_MIN_BATCH`` plans with a scalar ``dropout`` (also for one plan: two
            smaller compiled graphs build faster than one big one).
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
            dp_overlap=dp_overlap, tp_overlap=tp_overlap, pp_overlap=pp_overlap),
            _TRAIN_STEP_DEFAULTS)
        return train_step(system, model, r.parallelism(par), global_batch, seq_len, gemm=gemm,
                          adam_bytes_per_param=adam_bytes_per_param, dtype_bytes=dtype_bytes,
                          clock_fraction=clock_fraction, dedup=dedup, chunk=chunk,
                          finetune=finetune, **kw)
    prec = _prec.resolve(precision, dtype_bytes)
    dropout = code_of(dropout, DROPOUT_MODES, "dropout")
    options = TrainOptions(global_batch, seq_len, dp_overlap, tp_overlap, grad_bytes,
                           adam_bytes_per_param, clock_fraction, **dropout_mode_options(dropout),
                           pp_overlap=pp_overlap)
    validate_knobs("train_step", dtype_bytes=dtype_bytes)
    _validate(system, model, par, options, prec, finetune, dropout)
    concrete = is_concrete(system, model, par, global_batch, seq_len, clock_fraction, prec,
                           finetune)
    scalar_knobs = np.ndim(dropout) == 0 and is_concrete(dropout)
    if dedup is None:
        dedup = concrete and scalar_knobs and math.prod(batch_shape(
            system, model, par, global_batch, seq_len, prec, finetune)) >= DEDUP_MIN_BATCH
    if dedup and not (concrete and scalar_knobs):
        raise ValueError("train_step(dedup=True) needs concrete inputs and a scalar dropout")
    # static op-graph switches from concrete inputs (smaller graphs, faster compiles)
    variant = (_layer.variant_of(model, par, system) if is_concrete(model, par)
               else _layer.ANY._replace(net=_comm.net_variant_of(system)))
    statics = TrainStatics(gemm, variant, _cx.context_flag(par))
    if dedup:
        return _dedup_step(system, model, par, options, prec, finetune, statics, chunk)
    kw = {} if chunk is None else {"chunk": chunk}
    return batched(_train_point, **kw)(system, model, par, options, prec, finetune, statics)


train_step.single = train_step_single
# the defaults a recipe's step settings fill in (read off the signature, not restated)
_TRAIN_STEP_DEFAULTS = {k: p.default for k, p in inspect.signature(train_step).parameters.items()
                        if k in _recipes.STEP_KEYS}
