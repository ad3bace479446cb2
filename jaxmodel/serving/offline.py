"""Offline serving (every request queued: trtllm-bench ``throughput``, MLPerf Inference
"Offline") and the throughput at the highest Poisson arrival rate that meets tail-latency
limits, on the cost tables and the continuous-batching steady state of
:mod:`jaxmodel.serving.steady`.

Units: seconds, bytes, requests/s, tokens/s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.numerics import INF, REASONS, reason_name
from jaxmodel.serving.options import Engine, ServingOptions, register as _register
from jaxmodel.serving.steady import (ServingCosts, ServingResult, _chunk_attention_delta,
                                     _combine, continuous_batching_from_costs,
                                     kv_capacity_seqs, n_gpus, serving_costs_single, step_time)
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload.memory import usable_memory

__all__ = ["OfflineResult", "kv_capacity_of_free", "offline_from_costs", "offline_state",
           "offline_throughput_single", "SLO_BISECTION_STEPS", "slo_throughput_from_costs",
           "slo_state", "slo_throughput_single"]


@_register
@dataclasses.dataclass(frozen=True)
class OfflineResult:
    """Steady state of an offline run: every request queued at t = 0 (a pytree; fields may
    carry batch axes).

    Attributes:
        throughput_per_gpu: output tokens/s per device of the deployment.
        requests_per_s: completed requests/s of the deployment.
        batch: sequences in decode per replica in the steady state.
        tokens_per_iteration: tokens (decode + prompt) of one micro-batch iteration.
        iteration_s: one micro-batch iteration (full pipeline traversal), s.
        tpot_s: time per output token seen by a request (= ``iteration_s``), s.
        kv_capacity_seqs: requests whose peak KV fits per replica.
        feasible, reason: the plan's rules, one request's KV must fit (``out_of_memory``).
    """

    throughput_per_gpu: jax.Array
    requests_per_s: jax.Array
    batch: jax.Array
    tokens_per_iteration: jax.Array
    iteration_s: jax.Array
    tpot_s: jax.Array
    kv_capacity_seqs: jax.Array
    feasible: jax.Array
    reason: jax.Array

    @property
    def reason_name(self) -> str:
        """Name of the reason code of a single (unbatched) result."""
        return reason_name(self.reason)


def kv_capacity_of_free(costs: ServingCosts, isl, osl, block_tokens, free_fraction,
                        working_tokens):
    """Requests whose peak KV fits when the KV pool is ``free_fraction`` of the memory left
    after the weights and the activation working set of ``working_tokens`` tokens (scaled
    linearly from the prompt's), bytes -> requests.

    TensorRT-LLM sizes its pool so: ``KvCacheConfig.free_gpu_memory_fraction`` (default 0.9) of
    the free memory measured after loading the weights and a profiling forward of
    ``max_num_tokens`` tokens (TensorRT-LLM v1.0 ``tensorrt_llm/_torch/pyexecutor/
    _util.py``, ``KvCacheCreator``); its default scheduler policy ``GUARANTEED_NO_EVICT``
    reserves each request's peak ``isl + osl`` tokens in blocks of ``tokens_per_block`` (32).
    Zero gradient (counts).
    """
    frac = working_tokens / jnp.maximum(isl, 1.0)
    free = (usable_memory(costs.mem_capacity, costs.reserved_bytes, 1.0)
            - costs.weights_bytes - frac * costs.act_bytes) * free_fraction
    block_bytes = block_tokens * jnp.maximum(costs.kv_bytes_per_token, 1e-30)
    blocks = jnp.floor(jnp.maximum(free, 0.0) / block_bytes)
    per_seq = jnp.ceil((isl + osl + costs.spec_k) / block_tokens)
    return jax.lax.stop_gradient(jnp.floor(blocks / jnp.maximum(per_seq, 1.0)))




def offline_from_costs(costs: ServingCosts, isl, osl, opts: ServingOptions, dp=1.0, pp=1.0,
                       n_gpus=1.0) -> OfflineResult:
    """Offline throughput of in-flight batching with every request queued over ``dp``
    replicas of ``pp`` stages on ``n_gpus`` devices (single configuration; trtllm-bench
    ``throughput``, MLPerf Inference "Offline" scenario), under the scheduler settings in
    ``opts`` (:class:`ServingOptions`: ``max_batch``, ``max_tokens``, ``block_tokens``,
    ``mem_fraction``, ``kv_of_free``).

    With the queue never empty the scheduler keeps the batch at its cap ``B = min(max_batch,
    KV capacity)`` (Orca §3.1 iteration-level scheduling; a finished sequence's slot is
    refilled by the next queued prompt). In the steady state every request passes ``isl``
    prompt tokens and ``osl`` decode tokens through the iterations, so an iteration of a
    micro-batch carries ``m = min(B(isl + osl)/(osl·pp), max_tokens)`` tokens of which the
    share ``isl/(isl + osl)`` are prompt tokens (``max_tokens``, TensorRT-LLM
    ``max_num_tokens`` / vLLM ``max_num_batched_tokens``: the per-iteration token budget that
    caps the prefill riding along; when it binds the decode batch stays below ``B``). The
    iteration takes ``T_it = T(m) + m·isl/(isl + osl)·δ`` (the cost table at ``m`` tokens
    with the prompt tokens' attention correction δ of :func:`_chunk_attention_delta`, as the
    chunked-prefill model of :func:`continuous_batching_from_costs`: Sarathi-Serve §4.2) and
    completes ``pp·m/((isl + osl)·T_it)`` requests per replica per second; the output tokens
    per second are ``osl`` times that. The decode batch is ``m·pp·osl/(isl + osl)``.

    KV capacity: ``kv_of_free`` 0 as vLLM (:func:`kv_capacity_seqs` with the activation
    working set of ``max_tokens`` tokens), 1 as TensorRT-LLM (:func:`kv_capacity_of_free`).

    Speculative decoding (``costs.spec_k = k > 0``, ``costs.spec_tokens = E``): the table is
    in *slots*, one decode sequence's iteration (``1 + k`` verified tokens and its drafts); a
    request passes ``osl/E`` decode iterations and its prompt is ``isl/(1 + k)`` slots (a
    prompt token costs the verifier's GEMMs of one of the ``1 + k`` tokens; its attention
    correction is ``(1 + k)·δ`` per slot). The formulas above hold with ``isl → isl/(1+k)``,
    ``osl → osl/E`` in the iteration counts, ``max_tokens → max_tokens/(1 + k)`` slots and
    ``osl`` output tokens per request; ``tpot_s = T_it/E``. ``k = 0`` is the formula above.
    Units: tokens, s, tokens/s.
    """
    f = jnp.result_type(float)
    isl, osl, max_batch, max_tokens, dp, pp, n_gpus = (jnp.asarray(x, f) for x in (
        isl, osl, opts.max_batch, opts.max_tokens, dp, pp, n_gpus))
    block_tokens, mem_fraction, kv_of_free = (opts.block_tokens, opts.mem_fraction,
                                              opts.kv_of_free)
    dp, pp = jnp.maximum(dp, 1.0), jnp.maximum(pp, 1.0)
    frac_tokens = jnp.minimum(max_tokens, jnp.maximum(isl, 1.0))
    kv_v = kv_capacity_seqs(costs, isl, osl, block_tokens, mem_fraction, frac_tokens)
    kv_t = kv_capacity_of_free(costs, isl, osl, block_tokens, mem_fraction, frac_tokens)
    kv = jnp.where(kv_of_free > 0.5, kv_t, kv_v)
    bmax = jnp.minimum(max_batch, kv)
    width = 1.0 + costs.spec_k                   # tokens one decode slot verifies
    isl_s = isl / width                          # prompt slots
    osl_i = osl / costs.spec_tokens              # decode iterations
    share = isl_s / jnp.maximum(isl_s + osl_i, 1e-9)
    m = jnp.minimum(bmax * (isl_s + osl_i) / (jnp.maximum(osl_i, 1e-9) * pp),
                    max_tokens / width)
    m = jnp.maximum(m, 1.0)
    delta = _chunk_attention_delta(costs, isl, width)
    t_it = step_time(costs, m) + m * share * delta
    ok_t = t_it > 0
    safe_t = jnp.where(ok_t, t_it, 1.0)
    rps = dp * pp * m / (jnp.maximum(isl_s + osl_i, 1e-9) * safe_t)
    feasible, reason = _combine([costs], [(kv >= 1.0, "out_of_memory")])
    feasible = feasible & ok_t

    def gate(x, bad):
        return jnp.where(feasible, x, bad)
    return OfflineResult(
        throughput_per_gpu=gate(rps * osl / jnp.maximum(n_gpus, 1.0), 0.0),
        requests_per_s=gate(rps, 0.0), batch=gate(m * pp * (1.0 - share), 0.0),
        tokens_per_iteration=gate(m, 0.0), iteration_s=gate(t_it, INF),
        tpot_s=gate(t_it / costs.spec_tokens, INF), kv_capacity_seqs=kv, feasible=feasible,
        reason=reason)


#: The name the search has used for it.
offline_state = offline_from_costs


def offline_throughput_single(system: System, model: Model, par: Parallelism, isl, osl,
                              opts: ServingOptions, engine: Engine = Engine()
                              ) -> OfflineResult:
    """Single-configuration body of :func:`jaxmodel.serving.offline_throughput`."""
    costs = serving_costs_single(system, model, par, isl, osl, engine)
    return offline_from_costs(costs, isl, osl, opts, par.dp, par.pp, n_gpus(par))


@batched
def _offline_throughput(system, model, par, isl, osl, opts, engine):
    return offline_throughput_single(system, model, par, isl, osl, opts, engine)


#: Bisection steps of :func:`slo_throughput_from_costs` (the rate to 2⁻⁴⁰ of the capacity).
SLO_BISECTION_STEPS = 40



def slo_throughput_from_costs(costs: ServingCosts, isl, osl, opts: ServingOptions, dp=1.0,
                              pp=1.0, n_gpus=1.0) -> ServingResult:
    """The highest Poisson arrival rate whose steady state (:func:`continuous_batching_from_
    costs`) is feasible with ``ttft_p99_s >= TTFT₉₉`` and ``tpot_p99_s >= TPOT₉₉`` (the tail
    model of :class:`ServingResult`), and that steady state (single configuration): ``opts``
    (:class:`ServingOptions`) carries the scheduler settings (``max_batch``, ``chunk``,
    ``block_tokens``, ``mem_fraction``) and the tail limits ``ttft_p99_s``, ``tpot_p99_s``;
    ``dp``, ``pp``, ``n_gpus`` as :func:`continuous_batching_from_costs`.

    Both percentiles grow with the rate (longer waits, larger batches, more stalls), so the
    set of rates meeting them is an interval from 0: bisection on ``[0, capacity]`` in
    :data:`SLO_BISECTION_STEPS` steps. ``feasible=False`` with reason ``slo_unmet`` when no rate
    meets the limits (even an idle server's prefill or iteration exceeds them), else the plan's
    reason. The rate is a search result: zero gradient with respect to the inputs.
    """
    f = jnp.result_type(float)

    # the steady state at a rate, without mean-latency limits (as the search runs it)
    queue = ServingOptions(max_batch=opts.max_batch, chunk=opts.chunk,
                           block_tokens=opts.block_tokens, mem_fraction=opts.mem_fraction)

    def at(rate):
        return continuous_batching_from_costs(costs, isl, osl, rate, queue, dp, pp, n_gpus)

    def ok(rate):
        r = at(rate)
        return (r.feasible & (r.ttft_p99_s <= opts.ttft_p99_s)
                & (r.tpot_p99_s <= opts.tpot_p99_s))

    cap = jax.lax.stop_gradient(at(jnp.asarray(0.0, f)).capacity_rps)
    cap = jnp.where(jnp.isfinite(cap), cap, 0.0)

    def body(_, lo_hi):
        lo, hi = lo_hi
        mid = 0.5 * (lo + hi)
        good = ok(mid)
        return jnp.where(good, mid, lo), jnp.where(good, hi, mid)

    lo, _ = jax.lax.fori_loop(0, SLO_BISECTION_STEPS, body,
                              (jnp.zeros_like(cap), cap))
    lo = jax.lax.stop_gradient(lo)
    any_ok = ok(lo) & (lo > 0)
    r = at(jnp.where(any_ok, lo, 0.0))
    reason = jnp.where(any_ok, r.reason, jnp.where(
        r.feasible, jnp.asarray(REASONS.index("slo_unmet"), r.reason.dtype), r.reason))
    return dataclasses.replace(
        r, feasible=any_ok, reason=reason,
        throughput_per_gpu=jnp.where(any_ok, r.throughput_per_gpu, 0.0),
        goodput_per_gpu=jnp.where(any_ok, r.throughput_per_gpu, 0.0),
        meets_slo=any_ok)


#: The name the SLO search has used for it.
slo_state = slo_throughput_from_costs


def slo_throughput_single(system: System, model: Model, par: Parallelism, isl, osl,
                          opts: ServingOptions, engine: Engine = Engine()) -> ServingResult:
    """Single-configuration body of :func:`jaxmodel.serving.slo_throughput`."""
    costs = serving_costs_single(system, model, par, isl, osl, engine)
    return slo_throughput_from_costs(costs, isl, osl, opts, par.dp, par.pp,
                                     n_gpus(par))


@batched
def _slo_throughput(system, model, par, isl, osl, opts, engine):
    return slo_throughput_single(system, model, par, isl, osl, opts, engine)
