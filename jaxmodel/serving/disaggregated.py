"""Disaggregated serving: separate prefill and decode pools of devices (Zhong et al.,
"DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large Language Model
Serving", OSDI'24, §3-4; Patel et al., "Splitwise: Efficient Generative LLM Inference Using
Phase Splitting", ISCA'24, §4), on the cost tables and queueing helpers of
:mod:`jaxmodel.serving.steady`: an M/D/1 prefill pool, the KV shard transfer between the
pools, and a decode pool in continuous batching without prefill interference.

Units: seconds, bytes, requests/s, tokens/s.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.numerics import INF
from jaxmodel.serving.options import Engine, ServingOptions
from jaxmodel.serving.steady import (ServingCosts, ServingResult, _combine, _finish,
                                     _fixed_point, kv_capacity_seqs, md1_wait,
                                     serving_costs_single, step_time, wait_quantile)
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload.layer import ANY

__all__ = ["kv_transfer_time", "disaggregated_from_costs", "disaggregated_state", "Pools",
           "disaggregated_single"]


def kv_transfer_time(system: System, nbytes, n_span):
    """Time to move ``nbytes`` from one device of the prefill pool to its peer in the decode
    pool, s: ``link_latency + nbytes / (efficiency·bw_per_device)`` on the innermost network
    tier that holds the ``n_span`` devices of both pools (NVLink inside a node, InfiniBand
    across nodes; DistServe §4.3, Splitwise §4.3). Every prefill device sends its own KV shard
    in parallel; the transfer is not overlapped with the prefill (conservative: Splitwise
    overlaps it layer by layer)."""
    t = INF + 0.0 * nbytes
    inner = 1.0
    cum = []
    for lvl in system.levels:
        inner = inner * jnp.maximum(lvl.size, 1.0)
        cum.append(inner)
    for lvl, c in reversed(list(zip(system.levels, cum))):   # the innermost match wins
        bw = jnp.maximum(lvl.bw_per_device * lvl.efficiency, 1e-30)
        t = jnp.where(c >= n_span, lvl.link_latency + nbytes / bw, t)
    return t





class Pools(NamedTuple):
    """Degrees of the two pools of disaggregated serving (a pytree): replicas, pipeline and
    tensor-parallel degrees of the prefill pool, then of the decode pool."""

    dp_prefill: object = 1.0
    pp_prefill: object = 1.0
    tp_prefill: object = 1.0
    dp_decode: object = 1.0
    pp_decode: object = 1.0
    tp_decode: object = 1.0


def disaggregated_from_costs(pre: ServingCosts, dec: ServingCosts, system: System, isl, osl,
                             rate, opts: ServingOptions, pools: Pools) -> ServingResult:
    """Steady state of separate prefill and decode pools (single configuration) whose
    degrees are ``pools`` (:class:`Pools`), under the scheduler settings and limits in
    ``opts`` (:class:`ServingOptions`: ``max_batch``, ``block_tokens``, ``mem_fraction``,
    ``ttft_slo_s``, ``tpot_slo_s``).

    Prefill pool (DistServe §3.1 eq. 1-2): ``dp_p`` replicas, each an M/D/1 server of the
    pipelined prompt: ``TTFT = t_p + λ_p·(t_p/pp_p)² / (2(1 − λ_p·t_p/pp_p)) + t_kv`` with
    ``λ_p = rate/dp_p`` and ``t_kv`` the KV shard transfer (:func:`kv_transfer_time`; bytes
    ``isl ×`` the prefill device's KV bytes per token). Decode pool: continuous batching
    without prefill interference: ``B = λ_d·osl·T(B/pp_d)`` (Little + table),
    ``TPOT = T(B/pp_d)``, ``λ_d = rate/dp_d``. ``B`` must stay within ``max_batch`` and the
    decode devices' KV capacity. Throughput per device ``rate·osl/(n_p + n_d)``; capacity
    ``min(dp_p·pp_p/t_p, dp_d·B_max/(osl·T(B_max/pp_d)))``.
    """
    f = jnp.result_type(float)
    isl, osl, rate, max_batch = (jnp.asarray(x, f) for x in (isl, osl, rate,
                                                             opts.max_batch))
    block_tokens, mem_fraction = opts.block_tokens, opts.mem_fraction
    dp_p, pp_p, tp_p, dp_d, pp_d, tp_d = (jnp.maximum(jnp.asarray(x, f), 1.0) for x in pools)
    n_p, n_d = dp_p * tp_p * pp_p, dp_d * tp_d * pp_d
    lam_p, lam_d = rate / dp_p, rate / dp_d
    t_p = pre.prefill_s
    t_kv = kv_transfer_time(system, isl * pre.kv_bytes_per_token, n_p + n_d)
    wait_p = md1_wait(lam_p, t_p / pp_p)
    ttft = t_p + wait_p + t_kv
    ttft99 = ttft - wait_p + wait_quantile(wait_p, lam_p * t_p / pp_p)
    kv_p = kv_capacity_seqs(pre, isl, osl, block_tokens, mem_fraction)
    kv_d = kv_capacity_seqs(dec, isl, osl, block_tokens, mem_fraction, 0.0)
    bmax = jnp.minimum(max_batch, kv_d)
    m, exists = _fixed_point(dec, lam_d * osl / pp_d)
    batch = m * pp_d
    tpot = step_time(dec, m)
    cap = jnp.minimum(dp_p * pp_p / t_p,
                      dp_d * bmax / (osl * step_time(dec, bmax / pp_d)))
    cap = jnp.where((bmax >= 1.0) & (kv_p >= 1.0), cap, 0.0)
    feasible, reason = _combine([pre, dec], [
        (n_p + n_d <= system.n_devices, "devices_mismatch"),
        ((kv_p >= 1.0) & (kv_d >= 1.0), "out_of_memory"),
        ((lam_p * t_p / pp_p < 1.0) & exists & (batch <= bmax), "rate_above_capacity")])
    return _finish(feasible, reason, opts, dict(
        ttft=ttft, tpot=tpot, batch=batch, it=tpot, tput=rate * osl / (n_p + n_d), cap=cap,
        kv=kv_d, ttft_p99=ttft99, tpot_p99=tpot))


#: The name the serving bodies have used for it.
disaggregated_state = disaggregated_from_costs


def _pool_par(par: Parallelism, n_devices):
    """``par`` re-counted over the whole system (``dp = n/(tp·pp)``): the cost table of one
    replica does not depend on how many replicas there are, and the plan rules of
    :func:`jaxmodel.inference` then see a consistent device count."""
    return dataclasses.replace(par, dp=n_devices / (jnp.maximum(par.tp, 1.0)
                                                    * jnp.maximum(par.pp, 1.0)))



def disaggregated_single(system: System, model: Model, pars: tuple, isl, osl, rate,
                         opts: ServingOptions, engine: Engine = Engine(variant=(ANY, ANY))
                         ) -> ServingResult:
    """Single-configuration body of :func:`jaxmodel.serving.disaggregated`: ``pars`` the
    prefill and the decode pool's plans, ``engine.variant`` their static variants (a pair)."""
    par_prefill, par_decode = pars
    n = system.n_devices
    pre = serving_costs_single(system, model, _pool_par(par_prefill, n), isl, osl,
                               Engine(engine.precision, engine.runtime, engine.variant[0]))
    dec = serving_costs_single(system, model, _pool_par(par_decode, n), isl, osl,
                               Engine(engine.precision, engine.runtime, engine.variant[1]))
    return disaggregated_from_costs(pre, dec, system, isl, osl, rate, opts, Pools(
        par_prefill.dp, par_prefill.pp, par_prefill.tp, par_decode.dp, par_decode.pp,
        par_decode.tp))


@batched
def _disaggregated(system, model, pars, isl, osl, rate, opts, engine):
    return disaggregated_single(system, model, pars, isl, osl, rate, opts, engine)
