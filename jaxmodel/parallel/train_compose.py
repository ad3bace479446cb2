"""The composition of a training step from its per-micro-batch stage times (single
configuration): the slowest stage, the data-parallel and ZeRO communication
(:mod:`jaxmodel.parallel.train_dp`), the pipeline schedule or DualPipe, the optimizer,
memory, feasibility and the FLOPs (the module docstring of :mod:`jaxmodel.parallel.train`
describes every part with its sources).

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel import precisions as _prec
from jaxmodel.parallel import context as _cx
from jaxmodel.parallel import overlap as _ov
from jaxmodel.parallel import pipeline as pl
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel import zero as _zero
from jaxmodel.parallel.train_dp import DPWork, blend, data_parallel, finite
from jaxmodel.parallel.train_options import (BREAKDOWN_KEYS, CONSTANTS, TrainOptions,
                                             TrainResult, TrainStatics, with_defaults)
from jaxmodel.parallel.train_stage import STAGE_KEYS, Prep
from jaxmodel.workload import finetune as _lora
from jaxmodel.workload import memory as _memory
from jaxmodel.workload import moe as _moe
from jaxmodel.workload import params as _params

_COMM_KEYS = ("tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd", "ep_comm_bwd", "emb_comm_fwd",
              "emb_comm_bwd")

#: SMs DeepSeek-V3 gives to the all-to-all and pipeline communication beside the paired
#: DualPipe chunks: 20 of the H800's 132 (DeepSeek-V3 Technical Report §3.2.2).
DUALPIPE_COMM_SMS = 20.0


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


def tp_hbm_bytes(par_s, micro_batch, seq_len, d_model, precision):
    """Main-memory bytes one device moves for the TP collectives of one layer and pass (the
    contention input of :func:`jaxmodel.parallel.overlap.te_tp_exposed`): two
    reduce-scatters + two all-gathers of the ``b·s·h`` activations (``act_bytes`` each) with
    sequence parallelism, two all-reduces without (Korthikanti et al. 2023 §4.2.2; ring
    traffic, :func:`jaxmodel.parallel.overlap.comm_hbm_bytes`), bytes."""
    tp = par_s.tp
    n = micro_batch * seq_len * d_model * precision.act_bytes
    sp = 2.0 * (_ov.comm_hbm_bytes("reduce_scatter", n, tp)
                + _ov.comm_hbm_bytes("all_gather", n, tp))
    return jnp.where(par_s.sp > 0.5, sp, 2.0 * _ov.comm_hbm_bytes("all_reduce", n, tp))


def _layer_times(t: dict, rcode, tp_overlap, dev, tp_hbm, hosts, tp) -> _Layer:
    """The stage times with the bias/dropout/residual kernels added and the TP collectives
    overlapped with the GEMMs that feed or drain them, as Transformer Engine's userbuffers
    do, under SM/memory contention (module docstring of :mod:`jaxmodel.parallel.train`;
    :func:`jaxmodel.parallel.overlap.te_tp_exposed`). ``tp_overlap``: the knob times
    :func:`jaxmodel.parallel.overlap.tp_eligible`; ``tp_hbm``: main-memory bytes of one
    pass's TP collectives (:func:`tp_hbm_bytes`); ``hosts``: the hosting GEMMs' shares
    (:func:`jaxmodel.parallel.overlap.tp_host_fractions`) and the extra time of their split
    chunks (stage keys ``tp_split_*``, :func:`jaxmodel.parallel.train_stage.tp_split_times`),
    a :class:`jaxmodel.parallel.overlap.TPHosts`."""
    fwd, bwd, rc = t["fwd"], t["bwd"], t["recompute"]
    tpf, tpb, epf, epb = t["tp_comm_fwd"], t["tp_comm_bwd"], t["ep_comm_fwd"], t["ep_comm_bwd"]
    # forward, the recomputed forward (full recompute repeats the forward's TP and EP
    # communication, inside ``rc``) and backward, each collective beside its own GEMM
    full_rc = pl.is_full_recompute(rcode)
    rc_tp = jnp.where(full_rc, tpf, 0.0)
    rc_compute = rc - rc_tp - jnp.where(full_rc, epf, 0.0)
    ovl_f, ovl_b = _ov.te_tp_exposed(fwd, bwd, tpf, tpb, hosts, tp, dev, tp_hbm)
    # a full recomputation repeats the forward with its split hosts
    ovl_rc = _ov.te_tp_exposed(rc_compute, 0.0, rc_tp, 0.0, hosts._replace(split_ag_bwd=0.0),
                               tp, dev, tp_hbm)[0]
    rc = rc - rc_tp + blend(rc_tp, ovl_rc, tp_overlap)
    tpf = blend(tpf, ovl_f, tp_overlap)
    tpb = blend(tpb, ovl_b, tp_overlap)
    # the bias/dropout/residual kernels the workload's layer omits (see
    # :func:`jaxmodel.parallel.train_stage.residual_dropout_times`; norm_upproj repeats
    # none of them: its recomputation is norms and up-projections)
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


class _Stage(NamedTuple):
    """The slowest stage of one configuration."""

    lt: _Layer          # per-layer times after the TP overlap
    m: Any              # micro-batches per step
    layers: Any         # layers per device (all v chunks)
    slow_n: Any         # layers of the slowest stage (DualPipe: of the slowest rank)
    slow_extra: Any     # its embedding / LM head + loss
    extra_mean: Any     # embedding + head + loss over the stages
    layer_f: Any        # forward of one micro-batch on the stage, s
    layer_b: Any        # backward (+ recompute) of one micro-batch, s
    dual: Any           # DualPipe


def _slowest_stage(prep: Prep, t: dict, opts: TrainOptions, prec) -> _Stage:
    """The layer times with the TP overlap, and the slowest stage (uneven stages:
    :func:`jaxmodel.parallel.pipeline.stage_layers`): first (embedding), the most loaded
    middle one, or last (LM head + loss); under DualPipe the slowest rank."""
    system, model_s, par_s, seq = prep.system, prep.model, prep.par, prep.seq_len
    tp, pp, b, cp = par_s.tp, par_s.pp, par_s.micro_batch, par_s.cp
    m = pl.n_microbatches(prep.global_batch, par_s.dp, b)
    layers = model_s.n_layers / pp                       # per device, all v chunks
    hosts = _ov.TPHosts(*_ov.tp_host_fractions(model_s, seq, par_s.flash_attention),
                        t["tp_split_ag_fwd"], t["tp_split_rs_fwd"], t["tp_split_ag_bwd"])
    lt = _layer_times(t, par_s.recompute, opts.tp_overlap * _ov.tp_eligible(par_s, system),
                      system.device, tp_hbm_bytes(par_s, b, seq / cp, model_s.d_model, prec),
                      hosts, tp)
    # sequence parallelism re-gathers the QKV / FC1 inputs in the backward beside their
    # input-gradient GEMMs, with or without the TP overlap (two all-gathers as the forward's)
    n_act = b * seq / cp * model_s.d_model * prec.act_bytes
    regather = _ov.sp_regather_exposed(t["bwd"], 0.5 * t["tp_comm_fwd"], hosts.ag,
                                       system.device,
                                       2.0 * _ov.comm_hbm_bytes("all_gather", n_act, tp))
    lt = lt._replace(tpb=lt.tpb + jnp.where(par_s.sp > 0.5, regather, 0.0))
    multi_stage = pp > 1.5
    extra_mean = (lt.first + lt.last) / pp
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
    return _Stage(lt, m, layers, slow_n, slow_extra, extra_mean, layer_f, layer_b, dual)


def _dp_work(prep: Prep, st: _Stage, opts: TrainOptions, prec, finetune):
    """The parameters and bytes of the data-parallel collectives (:class:`DPWork`) and the
    parameters the optimizer updates under LoRA (``None`` in full training)."""
    model_s, par_s = prep.model, prep.par
    tp, cp = par_s.tp, par_s.cp
    grad_bytes = opts.grad_bytes
    act_bytes = pl.p2p_bytes(par_s.micro_batch, prep.seq_len, model_s.d_model, tp,
                             prec.act_bytes) / cp          # s/cp tokens
    # DualPipe keeps two copies of every stage's parameters (pipeline.dualpipe_state_factor)
    dual_states = jnp.where(st.dual, 2.0, 1.0)
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
    return DPWork(n_par, n_exp, st.layer_f, st.layer_b, g_dp, w_dp, act_bytes, st.m,
                  st.layers), n_opt


def _optimizer_time(prep: Prep, where, work: DPWork, dual, n_opt, opts: TrainOptions):
    """Mixed-precision Adam on the local parameter shard (÷dp·cp from ZeRO-1, experts over
    DP_exp·cp; DualPipe under ZeRO: both copies of a stage shard over 2·dp), a memory-bound
    elementwise kernel: ``(raw, finite)`` seconds."""
    par_s = prep.par
    dp, cp, zero = par_s.dp, par_s.cp, par_s.zero
    n_par, n_exp = work.n_par, work.n_exp
    local = (n_par - n_exp) / jnp.where(zero >= 0.5, dp * cp, 1.0) + n_exp / jnp.where(
        zero >= 0.5, where.dp_exp_cp.size, 1.0)
    local = local / jnp.where(dual & (zero >= 0.5), 2.0, 1.0)
    if n_opt is not None:
        local = n_opt / jnp.where(zero >= 0.5, dp * cp, 1.0)
    adam_bytes = (CONSTANTS["adam_bytes_per_param"] if opts.adam_bytes_per_param is None
                  else opts.adam_bytes_per_param)
    raw = _ops.elementwise_latency.single(prep.system.device, local, adam_bytes,
                                          CONSTANTS["adam_flops_per_param"])
    return raw, finite(raw)


def _step_breakdown(prep: Prep, st: _Stage, dpc, t_opt, pp_overlap):
    """The step's parts in seconds (:data:`BREAKDOWN_KEYS`): pipeline (schedule bubble,
    stage transfers — serial, or with ``pp_overlap`` Megatron-core's ``overlap_p2p_comm``,
    :func:`jaxmodel.parallel.pipeline.overlapped_p2p_time` —, tied-embedding all-reduce) or
    DualPipe, DP, optimizer. Returns ``(breakdown, pp_net_ok)``."""
    par_s, model_s, lt, m = prep.par, prep.model, st.lt, st.m
    tp, pp = par_s.tp, par_s.pp
    multi_stage = pp > 1.5
    t_mean = st.layer_f + st.layer_b + st.extra_mean + dpc.per_micro
    t_regather = jnp.where((tp > 1.5) & (par_s.sp < 0.5), finite(dpc.regather), 0.0)
    t_p2p = jnp.where(multi_stage, finite(dpc.send) + t_regather, 0.0)
    pp_net_ok = ~multi_stage | dpc.send_ok
    n_p2p = pl.p2p_transfers_on_critical_path(par_s.schedule, pp, m, par_s.interleave)
    # Megatron-core's overlap_p2p_comm: the steady exchanges beside the chunks' computation
    v = pl.effective_interleave(par_s.schedule, par_s.interleave)
    p2p_ovl = pl.overlapped_p2p_time(par_s.schedule, pp, m, par_s.interleave, t_p2p,
                                     (st.layer_f / v, st.layer_b / v))
    bubble = pl.bubble_time(par_s.schedule, pp, par_s.interleave, t_mean)
    dpipe = _dualpipe(prep.system.device, st, dpc.per_micro, pp, finite(dpc.send) + t_regather)
    bubble = jnp.where(st.dual, dpipe["bubble"], bubble)
    # tied embeddings: first and last stage all-reduce the word-embedding gradient (Megatron)
    t_emb_ar = jnp.where(multi_stage & (model_s.tied_embeddings > 0.5),
                         finite(dpc.emb_allreduce), 0.0)
    breakdown = {
        "compute": m * st.slow_n * (lt.fwd + lt.bwd),
        "recompute": m * st.slow_n * lt.rc,
        "tp_comm": m * st.slow_n * (lt.tpf + lt.tpb),
        "embedding": m * st.slow_extra,
        "dp_comm": m * dpc.per_micro + dpc.per_step,
        "pp_comm": blend(n_p2p * t_p2p, p2p_ovl, pp_overlap) + t_emb_ar,
        "bubble": bubble,
        "optimizer": t_opt,
        "ep_comm": m * st.slow_n * (lt.epf + lt.epb),
    }
    # DualPipe: compute on the SMs the communication leaves, the all-to-all and the steady
    # stage transfers hidden behind the paired chunks (only their excess shows)
    for k in ("compute", "recompute", "embedding", "ep_comm"):
        breakdown[k] = jnp.where(st.dual, dpipe[k], breakdown[k])
    return breakdown, pp_net_ok


def _memory_terms(prep: Prep, st: _Stage, where, work: DPWork, opts: TrainOptions, prec,
                  finetune) -> dict:
    """Per-device memory by term (:data:`jaxmodel.workload.memory.TRAIN_MEMORY_TERMS` and
    ``total``), bytes: the largest of the first, most loaded and last stage; model states
    sharded over dp·cp; activations of the s/cp local tokens
    (:func:`jaxmodel.parallel.context.cp_activation_bytes`, the workload's inventory at
    cp = 1); ZeRO-3 as FSDP2 holds it; DualPipe's two copies; LoRA's frozen base;
    Transformer Engine's userbuffers where the TP overlap runs; the NCCL communicators'
    buffers (:func:`jaxmodel.workload.memory.nccl_buffer_bytes`)."""
    model_s, par_s, seq = prep.model, prep.par, prep.seq_len
    dp, b, cp, pp = par_s.dp, par_s.micro_batch, par_s.cp, par_s.pp
    grad_bytes, act_b = opts.grad_bytes, prec.act_bytes
    n_par, n_exp = work.n_par, work.n_exp
    in_flight = pl.stage_in_flight(par_s.schedule, pp, st.m, par_s.interleave)
    # FP8 recipes store their weight-GEMM inputs quantised (:func:`jaxmodel.workload.memory.
    # quantised_input_delta`, on the s/cp local tokens)
    act_layer = (_cx.cp_activation_bytes(model_s, par_s, b, seq, cp, act_bytes=act_b)
                 + _memory.quantised_input_delta(model_s, par_s, b, seq / cp, prec))
    # each term below reads them: kept once (numerics.materialized)
    act_layer, in_flight = nx.materialized((act_layer, in_flight))
    # the last stage's loss holds one micro-batch's logits and their fp32 copy
    # (:func:`jaxmodel.workload.memory.loss_logits_bytes`, the s/cp local tokens)
    mem = _memory.training_memory.single(
        model_s, dataclasses.replace(par_s, dp=dp * cp), seq, in_flight, grad_bytes, prec,
        act_per_layer=act_layer,
        last_stage_extra=_memory.loss_logits_bytes(model_s, par_s, b * seq / cp, act_b))
    # ZeRO-3 / FSDP: the sharded states plus the units alive unsharded at once (the computing
    # one, the one prefetched — none under DeepSpeed 2021 —, one unsharded gradient unit;
    # :func:`jaxmodel.parallel.zero.zero3_memory`); the weights and their FP8 caches alike
    # FSDP2 keeps no 16-bit shard beside the fp32 master and holds the unsharded gradients
    # beside the reduce-scatter input (:func:`jaxmodel.parallel.zero.impl_costs`); the FP8
    # caches are sharded and gathered like the weights
    units = jnp.maximum(st.layers, 1.0)
    prefetch = _zero.impl_args(par_s.zero3_impl, par_s.recompute)[0]
    w_b, c_b = prec.weight_bytes, _memory.weight_cache_bytes(prec)
    costs = _zero.impl_costs(par_s.zero3_impl, w_b, grad_bytes, prec.master_bytes)
    groups = ((n_par - n_exp, dp * cp), (n_exp, where.dp_exp_cp.size))
    z3m = [_zero.zero3_memory(n, units, group, weight_bytes=w_b, grad_bytes=grad_bytes,
                              prefetch=prefetch,
                              optimizer_bytes=prec.master_bytes + prec.optim_bytes,
                              shard_weight_bytes=costs["shard_weight_bytes"],
                              unsharded_grad_bytes=costs["unsharded_grad_bytes"])
           for n, group in groups]
    z3c = [_zero.zero3_memory(n, units, group, weight_bytes=c_b, prefetch=prefetch)["weights"]
           for n, group in groups]
    mem, z3m, z3c = nx.materialized((mem, z3m, z3c))
    z3_on = par_s.zero > 2.5
    mem["fp8_weight_cache"] = jnp.where(z3_on, z3c[0] + z3c[1], mem["fp8_weight_cache"])
    for k in ("weights", "gradients", "optimizer"):
        mem[k] = jnp.where(z3_on, z3m[0][k] + z3m[1][k], mem[k])
    # DualPipe: two stages per rank, ZeRO-sharded classes split over both copies' 2·dp ranks
    for k, z in (("weights", 3.0), ("gradients", 2.0), ("optimizer", 1.0)):
        mem[k] = mem[k] * jnp.where(st.dual, pl.dualpipe_state_factor(z, par_s.zero), 1.0)
    if finetune is not None:      # frozen base + adapters (:func:`jaxmodel.workload.finetune.
        mem.update(_lora.memory_states(                               # memory_states`;
            model_s, dataclasses.replace(par_s, dp=dp * cp), finetune, n_par, prec,
            grad_bytes))                                              # its weights hold
        mem["fp8_weight_cache"] = jnp.zeros_like(mem["weights"])      # the base's copies)
    # Transformer Engine's userbuffers, allocated where its TP overlap runs
    ub_on = (opts.tp_overlap * _ov.tp_eligible(par_s, prep.system) > 0.0) & (par_s.tp > 1.5)
    mem["tp_comm_buffers"] = jnp.where(
        ub_on, _memory.tp_comm_buffer_bytes(model_s, b * seq / cp, prec), 0.0)
    # the NCCL communicators the rank runs collectives on (outside the caching allocator)
    mem["nccl_buffers"] = _memory.nccl_buffer_bytes(
        model_s, par_s, CONSTANTS["nccl_comm_bytes"], CONSTANTS["nccl_pair_comm_bytes"])
    mem["total"] = sum(mem[k] for k in _memory.TRAIN_MEMORY_TERMS)
    return mem


def _feasibility(prep: Prep, times, t_opt_raw, dpc, pp_net_ok, mem_ok, prec):
    """The plan's rules, then the hardware's, then memory (the first failing one wins):
    ``(feasible, reason)``. DP, DP_exp and the stage hop give their collectives' own
    verdicts (evaluated here anyway); the network's own reason where a collective of the
    step does not fit it."""
    system, par_s = prep.system, prep.par
    compute_raw = [times[k] for k in STAGE_KEYS if k not in _COMM_KEYS] + [t_opt_raw]
    comm_raw = [times[k] for k in _COMM_KEYS]
    feasible, reason = nx.first_reason(
        prep.checks + _plan.system_checks(_plan.TRAIN, system, par_s, prep.structure_ok,
                                          placed=("tp", "ep", "cp"),
                                          word=_prec.widest_gemm_word(prec),
                                          compute=compute_raw)
        + [(dpc.ok & pp_net_ok, "topology_mismatch"),
           (_prec.supported(system.device, prec), "precision_unsupported")]
        + _plan.finite_checks(compute_raw, comm_raw) + [(mem_ok, "out_of_memory")])
    topo = reason == nx.reason_code("topology_mismatch")
    reason = jnp.where(topo & ~dpc.ok, dpc.why, reason)
    reason = jnp.where(topo & dpc.ok & ~pp_net_ok, dpc.send_why, reason).astype(jnp.int32)
    return feasible, reason


def _flops(prep: Prep, finetune):
    """Model FLOPs of one step (no recomputation; LoRA: no weight gradients of the frozen
    base) and hardware FLOPs (with the plan's recomputation), FLOP (PaLM Appendix B;
    Korthikanti et al. 2023 §6; PTD-P eq. 3 with full recomputation)."""
    model_s, par_s, gb, seq = prep.model, prep.par, prep.global_batch, prep.seq_len
    rcode = par_s.recompute
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
    return flops, hw_flops


def compose(prep: Prep, times: dict, options: TrainOptions, precision, finetune=None,
            statics: TrainStatics = TrainStatics()) -> TrainResult:
    """The step of one configuration from its stage times (:data:`STAGE_KEYS`, of
    :func:`jaxmodel.parallel.train_stage.stage_times_single`): layers, DP/ZeRO, pipeline,
    optimizer, memory and the plan's rules (feasibility). ``precision`` a
    :class:`jaxmodel.Precision`; ``statics``: the network variant, the ZeRO switches."""
    prec = precision
    opts = with_defaults(options)
    if opts.grad_bytes is None:
        opts = dataclasses.replace(opts, grad_bytes=prec.grad_bytes)
    # the sanitised inputs, read by every part below: kept once (numerics.materialized)
    model_s, par_s, gb, seq = nx.materialized((prep.model, prep.par, prep.global_batch,
                                               prep.seq_len))
    prep = prep._replace(model=model_s, par=par_s, global_batch=gb, seq_len=seq)
    par_s, structure_ok = prep.par, prep.structure_ok
    t = {k: finite(times[k]) for k in STAGE_KEYS}
    m_ = pl.n_microbatches(prep.global_batch, par_s.dp, par_s.micro_batch)
    # per-layer param.grad accumulation (Megatron-LM 2021): every micro-batch but the first
    t["rd_bwd"] = t["rd_bwd"] + (1.0 - 1.0 / jnp.maximum(m_, 1.0)) * t["grad_accum"]
    st = nx.materialized(_slowest_stage(prep, t, opts, prec))
    where = _plan.placement(prep.system, par_s)
    work, n_opt = _dp_work(prep, st, opts, prec, finetune)
    dpc = data_parallel(prep.system, prep.model, par_s, where, work, opts.dp_overlap, statics)
    t_opt_raw, t_opt = _optimizer_time(prep, where, work, st.dual, n_opt, opts)
    breakdown, pp_net_ok = _step_breakdown(prep, st, dpc, t_opt, opts.pp_overlap)
    step = sum(breakdown[k] for k in BREAKDOWN_KEYS)
    breakdown, step = nx.materialized((breakdown, step))     # read by every output
    mem = _memory_terms(prep, st, where, work, opts, prec, finetune)
    dev = prep.system.device
    mem_ok = mem["total"] <= _memory.usable_memory(dev.mem_capacity, dev.runtime_reserved_bytes)
    feasible, reason = _feasibility(prep, times, t_opt_raw, dpc, pp_net_ok, mem_ok, prec)
    flops, hw_flops = _flops(prep, finetune)
    n_dev = par_s.dp * par_s.tp * par_s.pp * par_s.cp
    safe_step = jnp.where(feasible & (step > 0), step, 1.0)
    step_time = jnp.where(feasible, step, jnp.inf)
    achieved = jnp.where(feasible, hw_flops / (safe_step * n_dev), 0.0)
    hfu = jnp.where(feasible, nx.safe_div(achieved, prep.peak, fill=0.0), 0.0)
    mfu = jnp.where(feasible, nx.safe_div(flops / (safe_step * n_dev), prep.peak, fill=0.0),
                    0.0)
    tokens = jnp.where(feasible, prep.global_batch * prep.seq_len / safe_step, 0.0)
    mem = {k: jnp.where(structure_ok, x, jnp.inf) for k, x in mem.items()}
    return TrainResult(
        step_time_s=step_time, mfu=mfu, tokens_per_s=tokens, memory_bytes=mem["total"],
        feasible=feasible, reason=reason,
        breakdown={k: jnp.where(feasible, x, jnp.inf) for k, x in breakdown.items()},
        memory=mem, flops_per_step=jnp.where(structure_ok, flops, 0.0),
        achieved_flops_per_device=achieved, microbatches=jnp.where(structure_ok, st.m, 0.0),
        hfu=hfu)


def _dualpipe(dev, st: _Stage, dp_micro, pp, t_send):
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
    lt, m, slow_n, slow_extra, layers = st.lt, st.m, st.slow_n, st.slow_extra, st.layers
    sms = jnp.maximum(dev.core_count, DUALPIPE_COMM_SMS + 1.0)
    share = sms / (sms - DUALPIPE_COMM_SMS)
    comm = (m * slow_n * (lt.epf + lt.epb)
            + pl.dualpipe_hidden_transfers(pp, m) * t_send)
    work = m * (slow_n * (lt.fwd + lt.bwd + lt.rc) + slow_extra)
    slowed, exposed = _moe.dualpipe_overlap(work, comm, sms, DUALPIPE_COMM_SMS)
    f_chunk = layers * (lt.fwd + lt.tpf) * share
    b_chunk = layers * (lt.bwd + lt.rc + lt.tpb) * share
    w_chunk = 0.5 * layers * lt.bwd * share
    fb = f_chunk + b_chunk + (st.extra_mean + dp_micro) * share + nx.safe_div(exposed, m,
                                                                              fill=0.0)
    return {"compute": m * slow_n * (lt.fwd + lt.bwd) * share,
            "recompute": m * slow_n * lt.rc * share, "embedding": m * slow_extra * share,
            "ep_comm": exposed, "bubble": pl.dualpipe_bubble(pp, fb, b_chunk, w_chunk)}
