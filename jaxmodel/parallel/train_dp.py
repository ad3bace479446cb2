"""The data-parallel and ZeRO communication of a training step, and the pipeline's
stage-boundary collectives (single configuration).

:func:`data_parallel` evaluates every collective of the step in one vmap per op
(:func:`collectives`) and returns what of it is exposed (Rajbhandari et al., SC'20, §5 and §7;
the table of stages in :mod:`jaxmodel.parallel.train`): the gradient all-reduce /
reduce-scatter and the parameter all-gather of ZeRO 0–2 beside the backward and forward
(Megatron-core's bucketed per-chunk synchronisation,
:func:`jaxmodel.parallel.overlap.chunked_dp_exposed`), and ZeRO-3 unit by unit as FSDP or
DeepSpeed 2021 ran it (:func:`jaxmodel.parallel.zero.zero3_step`).

Units: seconds, bytes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel.parallel import overlap as _ov
from jaxmodel.parallel import pipeline as pl
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel import zero as _zero
from jaxmodel.parallel.train_options import TrainStatics
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload import params as _params


def finite(x):
    """``x`` where finite, else 0 (double-where guard against inf·0 in the composition)."""
    x = jnp.asarray(x)
    return jnp.where(jnp.isfinite(x), x, 0.0)


def blend(serial, overlapped, knob):
    """``serial + knob·(overlapped − serial)``: the knob's two ends are the serial collective
    (0) and the contention model's overlapped one (1); fractions in between interpolate
    linearly (s)."""
    return serial + jnp.asarray(knob, dtype=jnp.result_type(float)) * (overlapped - serial)


def collectives(system: System, op: str, calls, net: _comm.NetVariant = _comm.ANY_NET):
    """Evaluate several ``op`` collectives ``[(nbytes, group, stride), ...]`` in one vmap.

    Returns ``(times, ok, reason)`` as tuples/arrays over the calls. One trace of the
    collective model per op keeps the compiled step small.
    """
    f = jnp.result_type(float)
    cols = [jnp.stack([jnp.asarray(c[i], dtype=f) for c in calls]) for i in range(3)]
    t, ok, why = jax.vmap(
        lambda n, g, s: _comm.collective_time.single(system, op, n, g, "auto", s, net))(*cols)
    return tuple(t[i] for i in range(len(calls))), ok, why


class DPWork(NamedTuple):
    """What the data-parallel collectives of the most loaded stage move and hide behind."""

    n_par: Any          # parameters per device (all v chunks)
    n_exp: Any          # of which routed-expert parameters
    window_f: Any       # forward of one micro-batch, s (the parameter gathers' window)
    window_b: Any       # backward (+ recompute) of one micro-batch, s
    grad_bytes: Any     # bytes per reduced gradient element
    weight_bytes: Any   # bytes per gathered parameter element
    act_bytes: Any      # one stage-boundary transfer, bytes
    m: Any              # micro-batches per step
    layers: Any         # layers per device (ZeRO-3 units)


class DataParallel(NamedTuple):
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


class _Groups(NamedTuple):
    """The DP group of the dense parameters and the DP_exp group of the experts."""

    dp: Any
    dp_multi: Any
    dp_group: Any       # double-where: never a group of 1
    dp_stride: Any
    dpe_multi: Any
    dpe_group: Any
    dpe_stride: Any


def _groups(where: _plan.Placement, n_exp) -> _Groups:
    """Gradients are reduced and ZeRO-sharded over dp·cp (Megatron-core folds the CP group
    into the data-parallel one). MoE: expert weights over DP_exp·cp = dp·cp/ep only
    (DeepSpeed-TED), whose members are tp·pp·ep devices apart (cp = 1)."""
    dp = where.dp_cp.size
    dp_multi = dp > 1.5
    dpe = where.dp_exp_cp.size
    dpe_multi = (dpe > 1.5) & (n_exp > 0)          # dense models: no expert reduction
    return _Groups(dp, dp_multi, jnp.where(dp_multi, dp, 2.0), where.dp_cp.stride, dpe_multi,
                   jnp.where(dpe_multi, dpe, 2.0), where.dp_exp_cp.stride)


def _zero3_tensors(model_s, par_s, w: DPWork, calls):
    """DeepSpeed 2021's per-tensor ZeRO-3 calls (:func:`jaxmodel.parallel.zero.
    layer_tensors`; the routed experts' FC1 and FC2 of every local expert of the MoE layers,
    averaged per unit): ``(dense elements, dense counts, expert elements, expert counts)``;
    empty when ``calls`` is False."""
    units = jnp.maximum(w.layers, 1.0)
    el, cnt = _zero.layer_tensors(model_s, par_s.tp) if calls else ((), ())
    cnt_e = (2.0 * model_s.n_experts / par_s.ep * _params.n_moe_layers(model_s)
             / jnp.maximum(model_s.n_layers, 1.0))
    el_e = [nx.safe_div(w.n_exp / units, cnt_e, fill=0.0)] if calls else []
    return el, cnt, el_e, cnt_e


def data_parallel(system: System, model_s: Model, par_s: Parallelism,
                  where: _plan.Placement, work: DPWork, dp_overlap,
                  statics: TrainStatics = TrainStatics()) -> DataParallel:
    """DP/ZeRO collectives (Rajbhandari et al. SC'20; table in
    :mod:`jaxmodel.parallel.train`), and the pipeline's stage-boundary collectives, all
    evaluated in one vmap per op. ``statics.variant.zero3_calls`` ``False``: no plan runs
    DeepSpeed's per-tensor ZeRO-3 calls, which then stay out of the graph;
    ``statics.zero_used`` ``False``: no plan uses ZeRO (every ``zero = 0``), which keeps its
    reduce-scatters and the ZeRO-3 schedule out of the graph (the same numbers); ``None``
    keeps them."""
    net, zero_used = statics.variant.net, statics.zero_used
    w, tp = work, par_s.tp
    gr = _groups(where, w.n_exp)
    grads_b = w.grad_bytes * (w.n_par - w.n_exp)
    params_b = w.weight_bytes * (w.n_par - w.n_exp)
    pair_stride = where.stage_hop.stride            # first↔last / worst neighbouring stages
    emb_grad_b = w.grad_bytes * model_s.vocab_size * model_s.d_model / tp
    dense = (gr.dp_group, gr.dp_stride)
    expert = (gr.dpe_group, gr.dpe_stride)
    (t_ar, t_emb_ar, t_ar_e), ok_ar, why_ar = collectives(
        system, "all_reduce", [(grads_b, *dense), (emb_grad_b, 2.0, pair_stride),
                               (w.grad_bytes * w.n_exp, *expert)], net)
    # ZeRO-3 gathers and reduce-scatters one unit (a layer, FSDP's transformer wrap policy)
    # at a time: their per-unit collectives join the batch. DeepSpeed 2021 (zero3_impl = 1)
    # issues one call per tensor
    units = jnp.maximum(w.layers, 1.0)
    calls = statics.variant.zero3_calls is not False and zero_used is not False
    el, cnt, el_e, cnt_e = _zero3_tensors(model_s, par_s, w, calls)
    g, wb = w.grad_bytes, w.weight_bytes
    rs = (0.0, 0.0, 0.0, 0.0, [])                    # ZeRO's reduce-scatters
    if zero_used is not False:
        t_rs, t_rs_e, u_rs, u_rs_e, *ds_rs = collectives(
            system, "reduce_scatter", [(grads_b, *dense), (g * w.n_exp, *expert),
                                       (grads_b / units, *dense),
                                       (g * w.n_exp / units, *expert)]
            + [(g * x, *dense) for x in el] + [(g * x, *expert) for x in el_e], net)[0]
        rs = (t_rs, t_rs_e, u_rs, u_rs_e, ds_rs)
    (t_ag, t_regather, t_ag_e, u_ag, u_ag_e, *ds_ag), _, _ = collectives(
        system, "all_gather", [(params_b, *dense),
                               (w.act_bytes * tp, jnp.where(tp > 1.5, tp, 2.0), 1.0),
                               (wb * w.n_exp, *expert), (params_b / units, *dense),
                               (wb * w.n_exp / units, *expert)]
        + [(wb * x, *dense) for x in el] + [(wb * x, *expert) for x in el_e], net)
    (t_send,), ok_p2p, why_p2p = collectives(system, "p2p", [(w.act_bytes, 2.0, pair_stride)],
                                               net)
    t_ar, t_rs, t_ag = (jnp.where(gr.dp_multi, finite(x), 0.0)
                        + jnp.where(gr.dpe_multi, finite(x_e), 0.0)
                        for x, x_e in ((t_ar, t_ar_e), (rs[0], rs[1]), (t_ag, t_ag_e)))
    dp_net_ok = (~gr.dp_multi | ok_ar[0]) & (~gr.dpe_multi | ok_ar[2])
    exposed = _exposed_fn(system, par_s, w, gr, dp_overlap)
    # once per step
    z0 = exposed(t_ar, w.window_b, "all_reduce", g)
    if zero_used is False:          # every plan zero = 0: the all-reduce once per step
        return DataParallel(z0, jnp.zeros_like(z0), dp_net_ok, why_ar[0], t_emb_ar,
                            t_regather, t_send, ok_p2p[0], why_p2p[0])
    zero = par_s.zero
    z12_rs = jnp.where(zero < 1.5, exposed(t_rs, w.window_b, "reduce_scatter", g), 0.0)
    z12_ag = exposed(t_ag, w.window_f, "all_gather", wb)
    dp_step = jnp.select([zero < 0.5, zero < 2.5], [z0, z12_rs + z12_ag], 0.0)
    # every micro-batch (on the stage's critical path)
    z2_mb = exposed(t_rs, w.window_b, "reduce_scatter", g)
    units_t = ((u_ag, rs[2], ds_ag[:len(el)], rs[4][:len(el)], el, cnt),
               (u_ag_e, rs[3], ds_ag[len(el):], rs[4][len(el):], el_e, (cnt_e,)))
    z3_mb = _zero3_exposed(system, par_s, w, gr, units_t, dp_overlap, statics, calls)
    dp_mb = jnp.select([zero < 1.5, zero < 2.5], [0.0, z2_mb], z3_mb)
    return DataParallel(dp_step, dp_mb, dp_net_ok, why_ar[0], t_emb_ar, t_regather,
                        t_send, ok_p2p[0], why_p2p[0])


def _exposed_fn(system, par_s, w: DPWork, gr: _Groups, dp_overlap):
    """``exposed(t_x, window, op, bytes_per_element)``: the exposed time of a once-per-step
    DP collective of serial time ``t_x`` overlapped with ``window`` — Megatron-core's
    per-chunk bucketed synchronisation of the interleaved schedule
    (:func:`jaxmodel.parallel.overlap.chunked_dp_exposed`), the NCCL kernels holding
    ``DEFAULT_CHANNELS["dp"]`` SMs and moving their ring traffic through memory — blended
    with the serial one by ``dp_overlap``."""
    v = pl.effective_interleave(par_s.schedule, par_s.interleave)
    n_buckets = _ov.mcore_buckets(w.n_par, gr.dp)
    share = _ov.sm_share(system.device, _ov.DEFAULT_CHANNELS["dp"])

    def hbm(op, bpe):
        return (jnp.where(gr.dp_multi, _ov.comm_hbm_bytes(op, bpe * (w.n_par - w.n_exp),
                                                           gr.dp_group), 0.0)
                + jnp.where(gr.dpe_multi, _ov.comm_hbm_bytes(op, bpe * w.n_exp, gr.dpe_group),
                            0.0))

    def exposed(t_x, window, op, bpe):
        ovl = _ov.chunked_dp_exposed(window / v, t_x, par_s.pp, v, n_buckets, hbm(op, bpe),
                                     share, system.device)
        # the chunked estimate bounds the backlog from above: never beyond the serial one
        return blend(t_x, jnp.minimum(ovl, t_x), dp_overlap)

    return exposed


def _zero3_exposed(system, par_s, w: DPWork, gr: _Groups, units_t, dp_overlap,
                   statics: TrainStatics, calls):
    """ZeRO-3 / FSDP per micro-batch: per-unit gathers prefetched one unit ahead in the
    forward and the backward, reduce-scatter of every micro-batch's gradients
    (:func:`jaxmodel.parallel.zero.zero3_step`); the dense and the expert parameters'
    collectives each against the whole compute (their overlaps are not stacked: an
    optimistic bound when both are large). DeepSpeed 2021
    (:func:`jaxmodel.parallel.zero.impl_args`): serial, re-gathered for the recomputation,
    per-tensor calls (persistent below ``PERSISTENCE_THRESHOLD`` elements). ``units_t``:
    per group (dense, expert) the unit's all-gather and reduce-scatter, the per-tensor
    calls' NCCL times, their elements and counts. Seconds per micro-batch."""
    g, wb, units = w.grad_bytes, w.weight_bytes, jnp.maximum(w.layers, 1.0)
    prefetch, regather, per_tensor = _zero.impl_args(par_s.zero3_impl, par_s.recompute)
    # FSDP2's copy-out / copy-in kernels on the compute stream (:func:`jaxmodel.parallel.
    # zero.impl_costs`; none for DeepSpeed 2021, whose list-API copies are per tensor)
    costs = _zero.impl_costs(par_s.zero3_impl, wb, g)
    groups = ((w.n_par - w.n_exp, gr.dp_multi, gr.dp_group, gr.dp_stride),
              (w.n_exp, gr.dpe_multi, gr.dpe_group, gr.dpe_stride))
    serial, overlapped = 0.0, 0.0
    for (n, on, group, stride), (u_ag, u_rs, ds_ag, ds_rs, el, cnt) in zip(groups, units_t):
        if calls:
            ds = [_zero.per_tensor_collectives(system, op, el, group, stride, elem_bytes=bpe,
                                               counts=cnt,
                                               nccl_times=[finite(t) for t in ts])[0]
                  for op, ts, bpe in (("all_gather", ds_ag, wb), ("reduce_scatter", ds_rs, g))]
        else:                                           # per_tensor is 0 in every plan
            ds = (finite(u_ag), finite(u_rs))
        g_unit, r_unit = (jnp.where(on, jnp.where(per_tensor, d, finite(x)), 0.0)
                          for x, d in zip((u_ag, u_rs), ds, strict=True))
        z = _zero.zero3_step(system, n, units, w.window_f / units, w.window_b / units, group,
                             w.m, weight_bytes=wb, grad_comm_bytes=g, stride=stride,
                             net=statics.variant.net, prefetch=prefetch,
                             recompute_gathers=regather,
                             collective_times=(g_unit, r_unit, 0.0),
                             copy_out_bytes=jnp.where(on, costs["copy_out_bytes"], 0.0),
                             copy_in_bytes=jnp.where(on, costs["copy_in_bytes"], 0.0))
        ser = z["gather"] + z["reduce_scatter"] + z["copies"]
        serial = serial + ser
        overlapped = overlapped + jnp.minimum(z["exposed_comm"] + z["contention"], ser)
    return blend(serial, overlapped, dp_overlap) / w.m
