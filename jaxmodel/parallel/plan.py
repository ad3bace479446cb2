"""The parallel plan: its rules and the placement of its groups, written once.

Every consumer — :func:`jaxmodel.train_step` (and :func:`~jaxmodel.parallel.train.
stage_times`), :func:`jaxmodel.inference`, :func:`jaxmodel.layer_breakdown`, the plan
enumeration of :func:`jaxmodel.search_parallelism` and the co-design objectives — reads the
rules and the placement from here.

**Rules** (:data:`RULES`): one list of :class:`PlanRule` ``(reason, scopes, ok, explain)``.
``ok(xp, p)`` is the condition on one configuration, written with the array module ``xp``
(``numpy`` or ``jax.numpy``), so the same rule serves

(a) the ``ValueError`` at the API edge (:func:`raise_if_invalid`: the first failing rule,
    a message naming the fields and their values),
(b) ``feasible``/``reason`` inside batches (:func:`checks`, jnp, double-where safe), and
(c) the enumeration of :func:`jaxmodel.search.parallelism.enumerate_plans` (numpy columns).

A rule applies to the *scopes* ``"train"``, ``"infer"`` and ``"layer"`` (one decoder layer,
:func:`jaxmodel.layer_breakdown`). Training and inference differ only where the physics
does: the global batch splits into ``dp·micro_batch`` micro-batches and the schedule,
interleave, recompute and ZeRO fields exist only in training; an inference replica serves
``batch/dp`` sequences and its pipeline has one chunk per stage.

Rules of the hardware (``invalid_device``, ``buffer_too_small``, ``invalid_network``,
``topology_mismatch``) need the :class:`~jaxmodel.types.System` and are evaluated with jnp
only (:func:`system_checks`; at the API edge the network rules run as one jitted call, the
device rules in numpy when hw_db loads the device). Results that are still not finite after all rules (a device
so slow that a time overflows, e.g. ``mem_bw = 1e-30``) are attributed by
:func:`finite_checks` to the device (compute) or the network (collectives). Memory is the
last rule (``out_of_memory``), added by the callers once they know the footprint.

**Placement** (Narayanan et al., SC'21, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", §3.2 "Takeaway #1/#2"): device id
``= tp_rank + tp·(pp_rank + pp·dp_rank)`` — TP innermost (inside a node), then PP, then DP.
The expert-parallel group takes ``ep`` consecutive data-parallel ranks (DeepSpeed-TED,
Singh et al., ICS 2023, eq. 2: ``TP × EP × DP_exp = TP × DP``), so ``ep | dp`` and the
expert-data-parallel group ``DP_exp = dp/ep`` has stride ``tp·pp·ep``; or, with ``ep > dp``,
it folds over all ``dp`` ranks and ``ep/dp`` ranks of each TP group (``ep/dp | tp``), the
experts keeping ``etp = tp·dp/ep``-way tensor parallelism (Megatron-core
megatron/core/parallel_state.py ``expert_tensor_parallel_size``: ``ETP × EP × EDP = TP × DP``;
the layout vLLM ``--enable-expert-parallel``, SGLang ``--ep-size`` and TensorRT-LLM
``moe_expert_parallel_size`` serve; :func:`jaxmodel.workload.params.expert_tp`), its members
then neighbouring devices (stride 1). That is what the MoE
time and memory model assumes (:func:`jaxmodel.workload.moe.alltoall_time` places the
all-to-all at stride ``tp·pp``; expert weights are ``E/ep`` per device and their gradients are
reduced over ``dp/ep``). A pipeline stage hop crosses the outermost network tier that the
``tp·cp·pp`` consecutive devices of one pipeline span (:func:`cross_stride`). The
context-parallel group ``cp`` (Megatron-core order ``tp-cp-…``) sits between TP and PP:
device id ``= tp_rank + tp·(cp_rank + cp·(pp_rank + pp·dp_rank))``, CP at stride ``tp``, PP
at ``tp·cp``, DP at ``tp·cp·pp``. Gradients and ZeRO shards span the combined ``dp·cp``
group (:attr:`Placement.dp_cp`), placed as Megatron builds its data-parallel groups: at
stride ``tp``, directly outside TP·CP (:class:`Placement`).

With ``par.order = 1`` (``"tp_cp_ep_dp_pp"``, Megatron-core's default ``order`` of
``initialize_model_parallel``, megatron/core/parallel_state.py) data and expert parallelism
sit at stride ``tp·cp`` and the pipeline stages ``tp·cp·dp`` apart (outermost): DeepSeek-V3's
64-way EP on 8 nodes (DeepSeek-V3 Technical Report §3.2).

Helpers :func:`xp_is_integer` and :func:`xp_divides` are the ``xp``-generic versions of the
:mod:`jaxmodel.numerics` ones (those are jnp-only).

Units: devices, counts; seconds and bytes where a rule reads a time or a size.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel.batching import call_batched
from jaxmodel.parallel.pipeline import DUALPIPE, INTERLEAVED, NORM_UPPROJ

TRAIN, INFER, LAYER = "train", "infer", "layer"
SCOPES = (TRAIN, INFER, LAYER)


# --------------------------------------------------------------------------------------------
# xp-generic helpers (numpy and jax.numpy alike)
# --------------------------------------------------------------------------------------------
def xp_is_integer(xp, x, tol=1e-6):
    """True where ``x`` is (numerically) an integer."""
    return xp.abs(x - xp.round(x)) <= tol * xp.maximum(1.0, xp.abs(x))


def xp_divides(xp, a, b):
    """True where ``a > 0`` divides ``b`` (both integers); finite for any ``a``."""
    pos = a > 0
    return pos & xp_is_integer(xp, b / xp.where(pos, a, 1.0))


def _int_ge1(xp, x):
    return (x >= 1) & xp_is_integer(xp, x)


def _code(xp, x, hi):
    return (x >= 0) & (x <= hi) & xp_is_integer(xp, x)


# --------------------------------------------------------------------------------------------
# The quantities the rules read
# --------------------------------------------------------------------------------------------
class PlanInputs(NamedTuple):
    """What the rules read, for one configuration (or numpy columns of many).

    ``batch`` is the global batch (training) or the served sequences (inference); ``seq_len``
    the training sequence or the prompt; ``gen_len`` the generated tokens (inference, else 1).
    ``n_devices`` is the system's device count (``nan``: unknown, layer scope).
    """

    n_devices: Any
    # model
    n_layers: Any
    d_model: Any
    n_heads: Any
    n_kv_heads: Any
    head_dim: Any
    d_ff: Any
    vocab_size: Any
    n_experts: Any
    # plan
    dp: Any
    tp: Any
    pp: Any
    ep: Any
    cp: Any
    sp: Any
    micro_batch: Any
    interleave: Any
    schedule: Any
    recompute: Any
    zero: Any
    flash_attention: Any
    # workload
    batch: Any
    seq_len: Any
    gen_len: Any
    dtype_bytes: Any
    attention: Any = 0.0      # model attention code (types.ATTENTIONS; 1 = MLA)


_MODEL = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size",
          "n_experts")
_PLAN = ("dp", "tp", "pp", "ep", "cp", "sp", "micro_batch", "interleave", "schedule",
         "recompute", "zero", "flash_attention")


def inputs(model, par, *, n_devices=float("nan"), batch=1.0, seq_len=1.0, gen_len=1.0,
           dtype_bytes=2.0) -> PlanInputs:
    """:class:`PlanInputs` from a model and a plan (pytrees or objects with those fields)."""
    kw = {k: getattr(model, k) for k in _MODEL}
    kw.update({k: getattr(par, k) for k in _PLAN})
    kw["attention"] = getattr(model, "attention", 0.0)
    return PlanInputs(n_devices=n_devices, batch=batch, seq_len=seq_len, gen_len=gen_len,
                      dtype_bytes=dtype_bytes, **kw)


def interleave_of(xp, p: PlanInputs, scope: str):
    """Model chunks per device: ``interleave`` with the interleaved schedule in training,
    1 otherwise (GPipe, 1F1B, and inference pipelines)."""
    if scope != TRAIN:
        return xp.ones_like(xp.asarray(p.pp, dtype=float))
    return xp.where(p.schedule == INTERLEAVED, xp.maximum(p.interleave, 1.0), 1.0)


def microbatches_of(xp, p: PlanInputs):
    """Micro-batches per step and replica ``m = B / (dp·b)`` (PTD-P §2.2); 0 when undefined."""
    den = p.dp * p.micro_batch
    return xp.where(den > 0, p.batch / xp.where(den > 0, den, 1.0), 0.0)


def _n_plan_devices(p: PlanInputs):
    return p.dp * p.tp * p.pp * p.cp


# --------------------------------------------------------------------------------------------
# The rules
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PlanRule:
    """One rule of a plan: ``ok(xp, p)`` must hold, else ``reason`` (``numerics.REASONS``).

    ``explain(v)`` gives the message of the ``ValueError`` for concrete values ``v`` (a dict
    field → float, :class:`PlanInputs` fields plus ``"v"`` and ``"m"``) when ``ok`` fails.
    """

    reason: str
    scopes: tuple
    ok: Callable
    explain: Callable


def _g(x):
    return f"{x:g}"


def _model_ok(xp, p):
    ok = xp.asarray(True)
    for k in _MODEL:
        ok = ok & (getattr(p, k) > 0)
    ok = ok & (p.n_experts >= 1)
    return ok if xp is np else nx.computed_once(ok)


def _train_workload_ok(xp, p):
    return _int_ge1(xp, p.batch) & (p.seq_len > 0) & (p.dtype_bytes > 0)


def _infer_workload_ok(xp, p):
    return (_int_ge1(xp, p.batch) & _int_ge1(xp, p.seq_len) & _int_ge1(xp, p.gen_len)
            & (p.dtype_bytes > 0))


def _degrees_ok(xp, p):
    ok = xp.asarray(True)
    for x in (p.dp, p.tp, p.pp, p.ep, p.cp):
        ok = ok & _int_ge1(xp, x)
    return ok & _code(xp, p.sp, 1) & _code(xp, p.flash_attention, 2)


def _execution_ok(xp, p):
    return (_int_ge1(xp, p.micro_batch) & _int_ge1(xp, p.interleave)
            & _code(xp, p.schedule, 3) & _code(xp, p.recompute, 3) & _code(xp, p.zero, 3)
            & ((p.interleave < 1.5) | (p.schedule == INTERLEAVED)))


def _heads_ok(xp, p):
    t = xp.maximum(p.tp, 1.0)
    return xp_divides(xp, t, p.n_heads) & (xp_divides(xp, t, p.n_kv_heads)
                                        | xp_divides(xp, p.n_kv_heads, t))


def cp_sequence_ok(xp, seq_len, cp, tp=1.0, sp=0.0):
    """Context parallelism's sequence rule: with ``cp > 1`` the sequence splits into ``2·cp``
    load-balancing chunks (Megatron-core / Transformer Engine causal CP: rank ``r`` holds
    chunks ``r`` and ``2cp−1−r``), and under sequence parallelism ``tp`` divides each rank's
    ``s/cp`` tokens."""
    c = xp.maximum(cp, 1.0)
    seq_ok = (c < 1.5) | xp_divides(xp, 2.0 * c, seq_len)
    return seq_ok & ((sp < 0.5) | xp_divides(xp, xp.maximum(tp, 1.0), seq_len / c))


def layers_ok(xp, p):
    """The pipeline's layer rule: every stage holds at least one layer (``pp ≤ n_layers``);
    stages may hold unequal counts (:func:`jaxmodel.parallel.pipeline.stage_layers`: the
    lighter ones at the ends, as Megatron-LM's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers``). The interleaved schedule's ``v`` model chunks
    per device are assigned round-robin (Narayanan et al., SC'21, §2.2.2) and need
    ``pp·v | L + s`` with ``s ∈ {0, 1, 2}`` pipeline slots taken by the embedding and the
    loss: Megatron-core's ``TransformerConfig.account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split`` count each as one layer of the split
    (``megatron/core/transformer/transformer_layer.py``, ``get_transformer_layer_offset``:
    ``num_layers += 1`` per flag, then ``num_layers // pp // vp`` layers per virtual stage),
    so the first chunk of the first stage holds one decoder layer less beside the embedding
    and the last chunk of the last stage one less beside the loss. Llama-3.1-405B's 126
    layers on PP 8 × VP 8 are such a layout (126 + 2 = 8·8·2): stages of 15 | 16 × 6 | 15
    layers, the same counts :func:`~jaxmodel.parallel.pipeline.stage_layers` gives. The
    bubble ``(p−1)/(m·v)`` and the activation count (Korthikanti et al. 2023 §4.2.3) are
    those of equal chunks."""
    pp = xp.maximum(p.pp, 1.0)
    v = xp.maximum(p.interleave_eff, 1.0)
    slots_ok = (xp_divides(xp, pp * v, p.n_layers) | xp_divides(xp, pp * v, p.n_layers + 1.0)
                | xp_divides(xp, pp * v, p.n_layers + 2.0))
    return (pp <= p.n_layers + 1e-6) & ((v < 1.5) | slots_ok)


def _bad(names, v):
    return "; ".join(f"{k}={_g(v[k])}" for k in names)


def _explain_degrees(v):
    bad = [f"{k}={_g(v[k])} must be an integer >= 1" for k in ("dp", "tp", "pp", "ep", "cp")
           if v[k] < 1 or v[k] != round(v[k])]
    bad += [f"{k}={_g(v[k])} must be 0..{hi}" for k, hi in (("sp", 1), ("flash_attention", 2))
            if v[k] not in range(hi + 1)]
    return "; ".join(bad)


def _explain_execution(v):
    bad = [f"{k}={_g(v[k])} must be an integer >= 1" for k in ("micro_batch", "interleave")
           if v[k] < 1 or v[k] != round(v[k])]
    bad += [f"{k} code {_g(v[k])} must be 0..{hi}" for k, hi in (("schedule", 3),
                                                                 ("recompute", 3), ("zero", 3))
            if v[k] not in range(hi + 1)]
    if not bad:
        bad = [f"interleave={_g(v['interleave'])} needs schedule='interleaved' (got schedule "
               f"code {_g(v['schedule'])})"]
    return "; ".join(bad)


def _explain_workload(v, names):
    return (", ".join(f"{k}={_g(v[k])}" for k in names) + " must be integers >= 1 "
            f"(seq_len > 0 in training) and dtype_bytes={_g(v['dtype_bytes'])} > 0")


RULES: tuple[PlanRule, ...] = (
    PlanRule("invalid_model", SCOPES, _model_ok,
         lambda v: "model dimensions must be > 0: " + _bad(_MODEL, v)),
    PlanRule("invalid_workload", (TRAIN,), _train_workload_ok,
         lambda v: _explain_workload(v, ("global_batch", "seq_len"))),
    PlanRule("invalid_workload", (INFER,), _infer_workload_ok,
         lambda v: _explain_workload(v, ("batch", "prompt_len", "gen_len"))),
    PlanRule("invalid_parallelism", SCOPES, _degrees_ok, _explain_degrees),
    PlanRule("invalid_parallelism", (TRAIN,), _execution_ok, _explain_execution),
    PlanRule("devices_mismatch", (TRAIN, INFER),
         lambda xp, p: xp.abs(_n_plan_devices(p) - p.n_devices) < 0.5,
         lambda v: (f"dp·tp·pp·cp = {_g(v['dp'])}·{_g(v['tp'])}·{_g(v['pp'])}·"
                    f"{_g(v['cp'])} = "
                    f"{_g(v['dp'] * v['tp'] * v['pp'] * v['cp'])} does not match the system's "
                    f"{_g(v['n_devices'])} devices")),
    PlanRule("heads_not_divisible", SCOPES, _heads_ok,
         lambda v: (f"tp={_g(v['tp'])} must divide n_heads={_g(v['n_heads'])} (and n_kv_heads="
                    f"{_g(v['n_kv_heads'])} must divide or be divisible by tp)")),
    PlanRule("layers_not_divisible", (TRAIN, INFER), layers_ok,
         lambda v: (f"n_layers={_g(v['n_layers'])} must be at least pp={_g(v['pp'])} (stages "
                    f"may hold unequal layers) and, with interleave={_g(v['v'])} > 1, n_layers "
                    f"+ 0, 1 or 2 (the embedding and loss as pipeline slots) divisible by "
                    f"pp·interleave = {_g(v['pp'] * v['v'])}")),
    PlanRule("batch_not_divisible", (TRAIN, INFER),
         lambda xp, p: (p.m >= 1) & xp_is_integer(xp, p.m),
         lambda v: (f"{v['batch_name']}={_g(v['batch'])} is not a multiple of "
                    f"{v['split_name']} = {v['split']}")),
    PlanRule("batch_not_divisible", (TRAIN,),
         lambda xp, p: ((p.schedule != INTERLEAVED) | (p.pp < 1.5)
                        | xp_divides(xp, xp.maximum(p.pp, 1.0), p.m)),
         lambda v: (f"the interleaved schedule needs the micro-batch count m = {_g(v['m'])} "
                    f"to be a multiple of pp = {_g(v['pp'])} (Megatron-LM)")),
    # deepseek-ai/DualPipe, dualpipe/dualpipe.py ``DualPipe.step``: ``num_ranks % 2 == 0``,
    # ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2`` (half the micro-batches enter
    # at each end of the pipeline)
    PlanRule("invalid_parallelism", (TRAIN,),
         lambda xp, p: (p.schedule != DUALPIPE) | xp_divides(xp, 2.0, p.pp),
         lambda v: f"the dualpipe schedule needs an even pp (got pp={_g(v['pp'])})"),
    PlanRule("batch_not_divisible", (TRAIN,),
         lambda xp, p: ((p.schedule != DUALPIPE) | (xp_divides(xp, 2.0, p.m)
                                                    & (p.m >= 2.0 * p.pp))),
         lambda v: (f"the dualpipe schedule needs an even micro-batch count m = {_g(v['m'])} "
                    f"of at least 2·pp = {_g(2 * v['pp'])} (DualPipe)")),
    # RMSNorm + MLA up-projection recomputation (DeepSeek-V3 §3.2.3) needs MLA's latents
    PlanRule("invalid_parallelism", (TRAIN,),
         lambda xp, p: (p.recompute != NORM_UPPROJ) | (p.attention > 0.5),
         lambda v: ("recompute='norm_upproj' recomputes the MLA up-projections: the model "
                    f"has no multi-head latent attention (attention code {_g(v['attention'])})")),
    PlanRule("invalid_parallelism", (INFER,), lambda xp, p: p.cp < 1.5,
         lambda v: f"cp={_g(v['cp'])}: context parallelism is modelled in training only"),
    PlanRule("sequence_not_divisible", (TRAIN, INFER),
         lambda xp, p: cp_sequence_ok(xp, p.seq_len, p.cp, p.tp, p.sp),
         lambda v: (f"{v['seq_name']}={_g(v['seq_len'])} must split into 2·cp = "
                    f"{_g(2 * v['cp'])} chunks (cp > 1) and, with sequence parallelism, "
                    f"tp={_g(v['tp'])} must divide its s/cp tokens")),
    PlanRule("experts_not_divisible", SCOPES,
         lambda xp, p: (xp_divides(xp, xp.maximum(p.ep, 1.0), p.n_experts)
                        & (xp_divides(xp, xp.maximum(p.ep, 1.0), xp.maximum(p.dp, 1.0))
                           | (xp_divides(xp, xp.maximum(p.dp, 1.0), xp.maximum(p.ep, 1.0))
                              & xp_divides(xp, xp.maximum(p.ep, 1.0) / xp.maximum(p.dp, 1.0),
                                        xp.maximum(p.tp, 1.0))))),
         lambda v: (f"ep={_g(v['ep'])} must divide n_experts={_g(v['n_experts'])} and either "
                    f"divide dp={_g(v['dp'])} or be dp times a divisor of tp={_g(v['tp'])} "
                    f"(experts are sharded over the data-parallel × tensor-parallel ranks)")),
)


class _Derived(NamedTuple):
    """:class:`PlanInputs` plus the derived ``interleave_eff`` and ``m`` the rules read."""

    p: PlanInputs
    interleave_eff: Any
    m: Any

    def __getattr__(self, name):
        return getattr(self.p, name)


def _derive(xp, p: PlanInputs, scope: str) -> _Derived:
    if scope == TRAIN:
        m = microbatches_of(xp, p)
    else:       # an inference replica serves batch/dp sequences at once (no micro-batches)
        m = microbatches_of(xp, p._replace(micro_batch=xp.ones_like(xp.asarray(p.dp * 1.0))))
    return _Derived(p, interleave_of(xp, p, scope), m)


def rules_for(scope: str) -> tuple[PlanRule, ...]:
    """The rules of one scope, in order (the first failing one names the reason)."""
    if scope not in SCOPES:
        raise ValueError(f"plan scope {scope!r} is not one of {SCOPES}")
    return tuple(r for r in RULES if scope in r.scopes)


def structure_checks(scope: str, p: PlanInputs, xp=jnp) -> list:
    """``[(ok, reason), ...]`` of the structural rules of ``scope`` on ``p`` (one
    configuration with jnp, or numpy columns)."""
    d = _derive(xp, p, scope)
    return [(r.ok(xp, d), r.reason) for r in rules_for(scope)]


def all_ok(checks, *reasons):
    """AND of the conditions of ``checks`` with one of ``reasons``."""
    ok = jnp.asarray(True)
    for cond, why in checks:
        if why in reasons:
            ok = ok & cond
    return ok


def numpy_mask(scope: str, p: PlanInputs) -> np.ndarray:
    """Rows of numpy columns ``p`` passing every structural rule of ``scope``."""
    ok = np.asarray(True)
    for cond, _ in structure_checks(scope, p, np):
        ok = ok & cond
    return np.asarray(ok)


# --------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------
class Group(NamedTuple):
    """A communication group: ``size`` members, consecutive members ``stride`` device ids
    apart (ids counted innermost network tier fastest)."""

    size: Any
    stride: Any


class Placement(NamedTuple):
    """Where the groups of a plan sit (Megatron order, module docstring).

    ``stage_hop`` is the 2-member pair of one pipeline stage boundary: it crosses the tier
    the ``tp·pp`` devices of one pipeline span (the first↔last and the worst neighbouring
    stage pair). ``dp_exp`` is the expert-data-parallel group ``dp/ep`` of the expert weights.
    ``dp_cp`` / ``dp_exp_cp``: the groups the gradients are reduced and ZeRO-sharded over,
    ``dp·cp`` (``dp_exp·cp`` for expert weights; Megatron-core folds CP into the data-parallel
    gradient group). ``dp_cp`` sits at stride ``tp`` as Megatron builds its data-parallel
    groups: DP directly outside TP·CP, PP outermost (Megatron-LM
    ``megatron/core/parallel_state.py`` ``initialize_model_parallel``, default ``order =
    "tp-cp-ep-dp-pp"``; its docstring example, TP 2 × PP 4 on 16 GPUs, has the data-parallel
    groups [g0, g2], [g1, g3], … and the pipeline groups [g0, g4, g8, g12], …), so a node of
    ``n`` devices holds ``n/tp`` members of each gradient group, whose ring crosses the node
    boundary once per node and shares the node's NICs among ``tp`` groups. (The pipeline hop
    ``stage_hop`` keeps the tier that ``tp·cp·pp`` consecutive devices span, and the MoE
    ``dp_exp_cp`` its ``tp·pp·ep`` stride with ``cp = 1``.)
    """

    tp: Group
    cp: Group
    pp: Group
    dp: Group
    ep: Group
    dp_exp: Group
    stage_hop: Group
    dp_cp: Group
    dp_exp_cp: Group


def cross_stride(system, span):
    """Stride of a 2-member group that crosses the outermost tier ``span`` devices reach.

    With ids counted innermost tier first, ``span`` consecutive devices cross tier k when
    ``span`` exceeds the devices inside one tier-k element. The returned stride (devices per
    element of that tier's inner block) makes :func:`jaxmodel.comm.collective_time` place
    the pair across exactly that tier. 1 when ``span`` fits the innermost tier.
    """
    stride = jnp.asarray(1.0)
    inner = 1.0
    for lvl in system.levels:
        stride = jnp.where(span > inner + 0.5, inner, stride)
        inner = inner * jnp.maximum(lvl.size, 1.0)
    return stride


def placement(system, par) -> Placement:
    """The groups of ``par`` on ``system`` (single configuration, degrees sanitised ≥ 1)."""
    tp = jnp.maximum(par.tp, 1.0)
    cp = jnp.maximum(par.cp, 1.0)
    pp = jnp.maximum(par.pp, 1.0)
    dp = jnp.maximum(par.dp, 1.0)
    ep = jnp.maximum(par.ep, 1.0)
    inner = tp * cp * pp                       # one pipeline: tp·cp·pp consecutive devices
    hop = jnp.maximum(cross_stride(system, inner), tp * cp)
    dp_exp = jnp.maximum(dp / ep, 1.0)
    multi_cp = cp > 1.5
    # Megatron-core's "tp-cp-ep-dp-pp" (``par.order`` 1): data (and expert) parallelism at
    # stride tp·cp, the stages tp·cp·dp apart
    mc = getattr(par, "order", 0.0) > 0.5
    dp_stride = jnp.where(mc, tp * cp, inner)
    return Placement(tp=Group(tp, 1.0), cp=Group(cp, tp),
                     pp=Group(pp, jnp.where(mc, tp * cp * dp, tp * cp)),
                     dp=Group(dp, dp_stride), ep=Group(ep, jnp.where(ep > dp, 1.0, dp_stride)),
                     dp_exp=Group(dp_exp, dp_stride * ep),
                     stage_hop=Group(2.0, jnp.where(mc, tp * cp * dp, hop)),
                     dp_cp=Group(dp * cp, tp),
                     dp_exp_cp=Group(dp_exp * cp, jnp.where(multi_cp, tp, dp_stride * ep)))


# --------------------------------------------------------------------------------------------
# Hardware rules (jnp, need the System)
# --------------------------------------------------------------------------------------------
def _level_ok(lvl):
    ok = jnp.asarray(True)
    for x in (lvl.size, lvl.bw_per_device, lvl.efficiency, lvl.flit_bytes,
              lvl.max_payload_bytes):
        ok = ok & (x > 0) & jnp.isfinite(x)
    for x in (lvl.link_latency, lvl.switch_latency, lvl.base_latency, lvl.header_bytes,
              lvl.chunk_latency, lvl.bw_per_node):
        ok = ok & (x >= 0) & jnp.isfinite(x)
    return ok & (lvl.size >= 1)


GROUPS = ("tp", "cp", "ep", "stage_hop", "dp", "dp_exp")


def _used_groups(scope: str, pl_: Placement, names=GROUPS):
    """``[(group, in_use)]`` of the groups (of ``names``) that communicate in ``scope``."""
    used = {"tp": pl_.tp.size > 1.5, "stage_hop": pl_.pp.size > 1.5,
            "ep": pl_.ep.size > 1.5, "cp": pl_.cp.size > 1.5}
    if scope == TRAIN:      # inference replicas never talk to each other
        used.update(dp=pl_.dp.size > 1.5, dp_exp=pl_.dp_exp.size > 1.5)
    return [(getattr(pl_, k), used[k]) for k in names if k in used]


def system_checks(scope: str, system, par, p_ok=True, placed=GROUPS, word=None,
                  compute=None) -> list:
    """``[(ok, reason), ...]`` of the hardware rules (single configuration, jnp).

    - ``invalid_device``: every rate, count and size the operator models read is a finite
      positive number, and so is ``mem_capacity``;
    - ``buffer_too_small``: some unclipped GEMM tile of the search grid fits the buffers
      (:func:`jaxmodel.ops.ops_feasible`, at fp16), and at ``word`` bytes per element
      where given (:func:`jaxmodel.precisions.widest_gemm_word`: an fp32 step needs tiles
      of 4-byte words). With ``compute`` (the step's compute times) the ``word`` rule only
      names the verdict on infinite times: GEMMs smaller than the grid's tiles clip them
      and may fit where no unclipped tile does, and such a step stays feasible;
    - ``invalid_network`` and ``topology_mismatch``: :func:`network_checks`.

    ``p_ok`` (the structural rules' verdict) sanitises the plan first (double-where).
    ``placed``: the groups whose placement is checked here (a caller that evaluates a
    group's collectives anyway may check that collective's own verdict instead).
    """
    dev = system.device
    ok, why = _ops.ops_feasible.single(dev)
    dev_ok = (ok | (why != nx.reason_code("invalid_device"))) & (
        dev.mem_capacity > 0) & jnp.isfinite(dev.mem_capacity)
    buf_ok = ok | (why != nx.reason_code("buffer_too_small"))
    if word is not None:
        fits = _ops.gemm.tile_fits(dev, word)
        if compute is not None:
            fits = fits | all_finite(compute)
        buf_ok = buf_ok & (~ok | fits)
    return ([(dev_ok, "invalid_device"), (buf_ok, "buffer_too_small")]
            + network_checks(scope, system, par, p_ok, placed))


def network_checks(scope: str, system, par, p_ok=True, placed=GROUPS) -> list:
    """``[(ok, reason), ...]`` of the network rules (single configuration, jnp).

    - ``invalid_network``: when any group of the plan communicates, every network tier has
      a finite positive size, bandwidth, efficiency and packet format and finite
      non-negative latencies (the collective model reads all tiers);
    - ``topology_mismatch``: every group the plan communicates over tiles the tiers
      (:func:`jaxmodel.comm.group_tiers`).

    ``p_ok`` and ``placed`` as in :func:`system_checks`.
    """
    par = sanitised(par, p_ok)
    pl_ = placement(system, par)
    talks = jnp.asarray(False)
    for _, used in _used_groups(scope, pl_):
        talks = talks | used
    groups = _used_groups(scope, pl_, placed)
    # the collective model needs every tier usable once a group communicates
    # (:func:`jaxmodel.comm.collective_time`); a plan without communication needs none
    net_ok = jnp.asarray(True)
    for lvl in system.levels:
        net_ok = net_ok & _level_ok(lvl)
    net_ok = net_ok | ~talks
    topo_ok = jnp.asarray(True)
    for g, used in groups:
        _, _, fits = _comm.group_tiers(system, jnp.where(used, g.size, 1.0),
                                       jnp.where(used, g.stride, 1.0))
        topo_ok = topo_ok & (~used | fits)
    return [(net_ok, "invalid_network"), (topo_ok, "topology_mismatch")]


def _network_verdicts(scope: str, system, par):
    """The verdicts of :func:`network_checks` alone (a module-level function, so that
    :func:`jaxmodel.batching.call_batched` can key it in the export cache)."""
    return tuple(ok for ok, _ in network_checks(scope, system, par))


def finite_checks(compute, comm) -> list:
    """Last rules before memory: every compute time finite (else the device is the binding
    constraint, ``invalid_device``), every communication time finite (``invalid_network``).
    Catches what no earlier rule can (e.g. ``mem_bw = 1e-30`` overflowing a time)."""
    return [(all_finite(compute), "invalid_device"), (all_finite(comm), "invalid_network")]


def all_finite(xs):
    """True where every time of ``xs`` is finite."""
    ok = jnp.asarray(True)
    for x in xs:
        ok = ok & jnp.isfinite(x)
    return ok


def sanitised(par, ok):
    """A structurally harmless plan where ``ok`` is False (double-where: no NaN anywhere)."""
    def s(x, fallback=1.0):
        return jnp.where(ok, x, fallback)
    return dataclasses.replace(
        par, dp=s(par.dp), tp=s(par.tp), pp=s(par.pp), ep=s(par.ep), cp=s(par.cp),
        micro_batch=s(par.micro_batch), interleave=s(par.interleave),
        schedule=s(par.schedule), recompute=s(par.recompute, 0.0), zero=s(par.zero, 0.0),
        sp=s(par.sp, 0.0))


def sanitised_model(model, ok):
    """The model with harmless dimensions where ``ok`` is False (double-where)."""
    def s(x):
        return jnp.where(ok, x, 1.0)
    return dataclasses.replace(
        model, n_layers=s(model.n_layers), d_model=s(model.d_model), n_heads=s(model.n_heads),
        n_kv_heads=s(model.n_kv_heads), head_dim=s(model.head_dim), d_ff=s(model.d_ff),
        vocab_size=s(model.vocab_size))


# --------------------------------------------------------------------------------------------
# The API edge: concrete single configurations
# --------------------------------------------------------------------------------------------
_NAMES = {TRAIN: ("global_batch", "seq_len"), INFER: ("batch", "prompt_len"),
          LAYER: ("batch", "seq_len")}


def raise_if_invalid(where: str, scope: str, p: PlanInputs, system=None, par=None):
    """Raise ``ValueError`` for the first failing rule of a concrete single configuration.

    The message names the reason, the fields and their values. With ``system`` and ``par``
    the hardware rules are checked too (``where: invalid_network: ...``).
    """
    vals = {k: float(np.asarray(x)) for k, x in p._asdict().items()}
    d = _derive(np, PlanInputs(**vals), scope)
    vals.update(v=float(np.asarray(d.interleave_eff)), m=float(np.asarray(d.m)))
    bname, sname = _NAMES[scope]
    vals.update(batch_name=bname, seq_name=sname, global_batch=vals["batch"],
                prompt_len=vals["seq_len"])
    if scope == TRAIN:
        vals.update(split_name="dp·micro_batch",
                    split=f"{_g(vals['dp'])}·{_g(vals['micro_batch'])}")
    else:
        vals.update(split_name="dp", split=_g(vals["dp"]))
    with np.errstate(all="ignore"):
        for r in rules_for(scope):
            if not bool(r.ok(np, d)):
                raise ValueError(f"{where}: {r.reason}: {r.explain(vals)}")
    if system is None:
        return
    # one jitted (export-cached) call rather than a few hundred eager operations; the
    # device rules are not raised here (the loaders validate devices, hw_db)
    verdicts = call_batched(_network_verdicts, scope, system, par)
    for ok, reason in zip(verdicts, ("invalid_network", "topology_mismatch")):
        if not bool(ok):
            levels = [float(np.asarray(l.size)) for l in system.levels]
            pl_ = placement(system, par)
            groups = ", ".join(f"{n}={float(g.size):g} at stride {float(g.stride):g}"
                               for n, g in zip(Placement._fields, pl_)
                               if float(g.size) > 1.5)
            raise ValueError(f"{where}: {reason}: the plan's groups ({groups}) on the "
                             f"system's tiers of sizes {levels}; device "
                             f"{getattr(system.device, 'name', '')!r}")
