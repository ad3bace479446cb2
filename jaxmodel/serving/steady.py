"""Serving systems in steady state: continuous batching with a paged KV cache, chunked
prefill, and disaggregated prefill/decode pools.

:func:`jaxmodel.inference` times one static batch. A serving system admits requests as they
arrive and schedules at the granularity of one forward iteration (Yu et al., "Orca: A
Distributed Serving System for Transformer-Based Generative Models", OSDI'22, §3.1
iteration-level scheduling), keeps the KV cache in fixed-size blocks (Kwon et al., "Efficient
Memory Management for Large Language Model Serving with PagedAttention", SOSP'23, §4.2-4.3),
may split prompts into chunks that ride along with decode iterations (Agrawal et al., "Taming
Throughput-Latency Tradeoff in LLM Inference with Sarathi-Serve", OSDI'24, §4) or run prefill
and decode on separate pools of devices (Zhong et al., "DistServe: Disaggregating Prefill and
Decoding for Goodput-optimized Large Language Model Serving", OSDI'24, §3-4; Patel et al.,
"Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA'24, §4). This
module gives the steady state of each as a pure function of one configuration (scalar
leaves: vmappable, differentiable), in three steps:

1. **Per-iteration cost table** (:func:`serving_costs`): the time of one decode iteration of
   a replica carrying ``N`` tokens, for ``N`` on the fixed grid :data:`TOKEN_GRID` (1, 4, …
   16384), is the ``tpot_s`` of :func:`jaxmodel.inference` at batch ``N`` (its decode step averaged
   over the KV growth of a request, i.e. at the mean context ``isl + osl/2``, which is the
   mean over the sequences of a steady continuous batch); between grid points it is linear
   (the profile-and-interpolate approach of Vidur, Agrawal et al., MLSys'24, §4, and NVIDIA
   aiconfigurator, here with the analytical model in place of a profile). The prefill of one
   prompt is ``ttft_s`` at batch 1; weights, KV bytes per token and the prefill working set
   come from the same call's memory breakdown.
2. **KV capacity** (:func:`kv_capacity_seqs`): blocks of ``block_tokens`` tokens in
   ``mem_fraction`` of device memory minus the runtime's reserve, weights and the prefill
   working set (:func:`jaxmodel.workload.memory.usable_memory`, as vLLM); a request
   holds ``ceil((isl + osl)/block_tokens)`` blocks at its peak (PagedAttention §4.2: waste only
   in the last block; reserving the peak means no preemption in steady state).
3. **Steady state** (mean-value analysis): Little's law ``B = λ·W`` for the sequences in
   decode, a fixed point with the iteration time ``T(B)`` solved exactly on the piecewise-linear
   cost table (:func:`_fixed_point`), and the Pollaczek-Khinchine M/D/1 waiting time for
   prompts (Poisson arrivals, deterministic service of the *mean* prompt: input and output
   lengths enter as their means; DistServe §3.1 eq. 1 uses the same queue).

Pipeline parallelism: ``pp`` micro-batches of ``B/pp`` sequences are in flight (one per
stage, as vLLM's and TensorRT-LLM's pipeline-parallel schedulers keep them); each traverses
the pipeline in ``T(B/pp)`` (:func:`jaxmodel.inference`'s step is the full traversal), and a
prompt occupies each stage for ``t_prefill/pp`` (DistServe §3.1 eq. 2).

Infeasible configurations (the plan's rules of :func:`jaxmodel.inference`, weights leaving no
room for one request's KV: ``out_of_memory``; arrival rate at or above the capacity, i.e. an
unbounded queue: ``rate_above_capacity``) give ``feasible=False``, the reason, ``+inf`` times
and zero throughput, with finite gradients.

Units: seconds, bytes, requests/s, tokens/s.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxmodel import serving_runtime as _rtp
from jaxmodel import speculative as _spec
from jaxmodel.batching import batched
from jaxmodel.numerics import INF, first_reason, reason_name
from jaxmodel.parallel.inference_step import inference_single
from jaxmodel.serving.options import (BLOCK_TOKENS, MEM_FRACTION, Engine, ServingOptions,
                                      register as _register)
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload.memory import usable_memory

__all__ = ["TOKEN_GRID", "BLOCK_TOKENS", "MEM_FRACTION", "ServingCosts", "ServingResult",
           "serving_costs_single", "step_time", "kv_capacity_seqs", "md1_wait",
           "wait_quantile", "aggregated_capacity", "continuous_batching_from_costs",
           "steady_state", "continuous_batching_single"]

#: Tokens per decode iteration (per micro-batch) at which the cost table is evaluated:
#: powers of 4 (the iteration time is flat while memory-bound and linear once compute-bound,
#: so a coarse geometric grid interpolates it closely; each point is one inference call).
TOKEN_GRID = tuple(float(4 ** i) for i in range(8))
_ATTN_OPS = ("qk", "av", "softmax")


@_register
@dataclasses.dataclass(frozen=True)
class ServingCosts:
    """Per-iteration cost table of one replica (:func:`serving_costs`; a pytree).

    Attributes:
        step_s: [G] decode iteration (full pipeline traversal) with ``TOKEN_GRID[i]``
            sequences at the mean context ``isl + osl/2``, s.
        attn_s: [G] the attention share of ``step_s`` (all layers), s.
        prefill_s: prefill of one prompt of ``isl`` tokens (time to first token alone), s.
        prefill_attn_s: the attention share of ``prefill_s`` (all layers), s.
        weights_bytes: weights per device, bytes.
        kv_bytes_per_token: KV cache per device per token of context, bytes.
        act_bytes: prefill working set of one prompt per device, bytes.
        mem_capacity: device memory, bytes.
        reserved_bytes: memory the runtime holds besides the tensors
            (``Device.runtime_reserved_bytes``), bytes.
        feasible, reason: the plan's rules (memory excluded; see :func:`kv_capacity_seqs`).
        spec_k: draft tokens per step of speculative decoding (0 = none); a decode sequence
            then costs ``1 + spec_k`` verified tokens per iteration (``step_s`` is the whole
            iteration: drafts + verification).
        spec_tokens: tokens a decode sequence emits per iteration (Leviathan et al. 2023
            eq. 1; 1 = none).
    """

    step_s: jax.Array
    attn_s: jax.Array
    prefill_s: jax.Array
    prefill_attn_s: jax.Array
    weights_bytes: jax.Array
    kv_bytes_per_token: jax.Array
    act_bytes: jax.Array
    mem_capacity: jax.Array
    feasible: jax.Array
    reason: jax.Array
    reserved_bytes: jax.Array = 0.0
    spec_k: jax.Array = 0.0
    spec_tokens: jax.Array = 1.0


@_register
@dataclasses.dataclass(frozen=True)
class ServingResult:
    """Steady state of a serving configuration (every field may carry batch axes).

    Attributes:
        ttft_s: mean time to first token (queueing + prefill [+ KV transfer]), s.
        tpot_s: mean time per output token seen by a request, s.
        batch: sequences in decode per (decode) replica, the steady-state batch.
        iteration_s: one iteration of a micro-batch, s.
        throughput_per_gpu: output tokens/s per device of the deployment.
        tokens_per_s_per_user: ``1/tpot_s`` (interactivity).
        capacity_rps: the arrival rate at which the queue becomes unbounded, requests/s.
        kv_capacity_seqs: requests whose peak KV fits per (decode) replica.
        meets_slo: feasible and mean TTFT and TPOT within the limits.
        goodput_per_gpu: ``throughput_per_gpu`` where ``meets_slo``, else 0 (DistServe §2:
            goodput under SLOs; in a mean-value model attainment is all or nothing).
        feasible, reason: see the module docstring.
        ttft_p99_s: 99th percentile of the time to first token (:func:`wait_quantile` for
            the queueing part, the rest deterministic), s.
        tpot_p99_s: 99th percentile over requests of their mean time per output token
            (prefill stalls during a request's decode counted as Poisson arrivals, normal
            approximation; without stalls the mean), s.
    """

    ttft_s: jax.Array
    tpot_s: jax.Array
    batch: jax.Array
    iteration_s: jax.Array
    throughput_per_gpu: jax.Array
    tokens_per_s_per_user: jax.Array
    capacity_rps: jax.Array
    kv_capacity_seqs: jax.Array
    meets_slo: jax.Array
    goodput_per_gpu: jax.Array
    feasible: jax.Array
    reason: jax.Array
    ttft_p99_s: jax.Array = INF
    tpot_p99_s: jax.Array = INF

    @property
    def reason_name(self) -> str:
        """Name of the reason code of a single (unbatched) result."""
        return reason_name(self.reason)


# --------------------------------------------------------------------------------------------
# 1. cost table
# --------------------------------------------------------------------------------------------
def serving_costs_single(system: System, model: Model, par: Parallelism, isl, osl,
                         engine: Engine = Engine()) -> ServingCosts:
    """Single-configuration body of :func:`serving_costs`.

    ``par.dp`` replicas each carry ``N`` sequences: :func:`jaxmodel.inference` runs at batch
    ``N·dp`` (``memory_rule=False``: the KV capacity is checked by the serving model), once
    per grid point (one trace, vmapped). ``engine`` (:class:`Engine`): the precision and the
    runtime as :func:`jaxmodel.inference` takes them; ``engine.variant`` (static) the code
    paths the inputs need (:func:`jaxmodel.workload.layer.variant_of`; ``ANY`` traces every
    one); ``engine.speculative`` (:class:`jaxmodel.Speculative`): ``step_s`` is then one speculative
    iteration (``breakdown["spec.step"]``: ``k`` drafts + verification of ``1 + k`` tokens
    per sequence) and the table carries ``spec_k`` and ``spec_tokens``; the KV bytes per
    token include the proposer's cache.
    """
    precision, variant, speculative = engine.precision, engine.variant, engine.speculative
    f = jnp.result_type(float)
    grid = jnp.asarray(TOKEN_GRID, f)
    dp = jnp.maximum(par.dp, 1.0)
    isl = jnp.asarray(isl, f)
    osl = jnp.asarray(osl, f)
    rt = _rtp.runtime_arg(engine.runtime)
    r = jax.vmap(lambda n: inference_single(system, model, par, n * dp, isl, osl,
                                            engine.gemm, memory_rule=False, precision=precision,
                                            runtime=rt, variant=variant,
                                            speculative=speculative))(grid)
    br = r.breakdown
    n_layers = model.n_layers
    attn = n_layers * sum(br[f"decode.{k}"] for k in _ATTN_OPS)
    pre_attn = n_layers * sum(br[f"prefill.{k}"][0] for k in _ATTN_OPS)
    ctx = jnp.maximum(isl + osl, 1.0)
    ok = r.feasible[0]
    # a static session's per-request engine set-up (``Runtime.context_layer_overhead_s``) is
    # not paid by an in-flight batcher, which runs each iteration as one engine step
    prefill = r.ttft_s[0] - jnp.where(ok, br["request_setup"][0], 0.0)
    if speculative is None:
        step, k_d, e_tok = r.tpot_s, 0.0 * isl, 1.0 + 0.0 * isl
    else:
        step = br["spec.step"]
        k_d = _spec.draft_len(speculative) + 0.0 * isl
        e_tok = _spec.tokens_per_step(speculative) + 0.0 * isl
        ctx = ctx + k_d
    return ServingCosts(
        spec_k=k_d, spec_tokens=e_tok,
        step_s=step, attn_s=jnp.where(ok, attn, INF), prefill_s=prefill,
        prefill_attn_s=jnp.where(ok, pre_attn, INF),
        weights_bytes=br["memory.weights"][0],
        kv_bytes_per_token=br["memory.kv_cache"][0] / ctx,
        act_bytes=br["memory.activations"][0],
        mem_capacity=system.device.mem_capacity + 0.0 * isl,
        feasible=ok, reason=r.reason[0],
        reserved_bytes=system.device.runtime_reserved_bytes + 0.0 * isl)



@batched
def _serving_costs(system, model, par, isl, osl, engine):
    return serving_costs_single(system, model, par, isl, osl, engine)



# --------------------------------------------------------------------------------------------
# 2. helpers of the steady state
# --------------------------------------------------------------------------------------------
def step_time(costs: ServingCosts, tokens):
    """Decode-iteration time at ``tokens`` sequences per micro-batch, s: linear between the
    points of :data:`TOKEN_GRID`, flat below 1, extended with the last segment's slope."""
    f = jnp.result_type(float)
    grid = jnp.asarray(TOKEN_GRID, f)
    n = jnp.maximum(tokens, 1.0)
    i = jnp.clip(jnp.floor(jnp.log2(n) / 2.0 + 1e-9), 0, len(TOKEN_GRID) - 2).astype(
        jnp.int32)
    lo, hi = grid[i], grid[i + 1]
    s = costs.step_s
    return s[i] + (n - lo) / (hi - lo) * (s[i + 1] - s[i])


def _fixed_point(costs: ServingCosts, rate):
    """Smallest ``m >= 0`` with ``m = rate·T(m)`` (``T`` = :func:`step_time`), and whether it
    exists. ``m`` are sequences (tokens) per micro-batch, ``rate`` sequences entering per
    second per micro-batch times the iterations a sequence stays.

    ``g(m) = m − rate·T(m)`` is piecewise linear with knots at 0 and :data:`TOKEN_GRID`
    (``T`` flat on [0, 1]) and ``g(0) < 0``; the root lies in the first segment whose right
    knot has ``g > 0``, or beyond the grid on the last segment's line (no root when that line
    does not rise: the queue grows without bound). Exact on the table, differentiable.
    """
    f = jnp.result_type(float)
    knots = jnp.concatenate([jnp.zeros(1, f), jnp.asarray(TOKEN_GRID, f)])
    t = jnp.concatenate([costs.step_s[:1], costs.step_s])
    g = knots - rate * t
    up = g[1:] > 0
    inside = jnp.any(up)
    k = jnp.where(inside, jnp.argmax(up), len(TOKEN_GRID) - 1)
    g0, g1 = g[k], g[k + 1]
    m0, m1 = knots[k], knots[k + 1]
    slope = (g1 - g0) / (m1 - m0)
    exists = inside | (slope > 0)
    safe = jnp.where(exists & (slope > 0), slope, 1.0)
    m = jnp.where(exists, m0 - g0 / safe, 0.0)
    return jnp.maximum(m, 0.0), exists


def kv_capacity_seqs(costs: ServingCosts, isl, osl, block_tokens=BLOCK_TOKENS,
                     mem_fraction=MEM_FRACTION, prefill_tokens=None):
    """Requests whose peak KV cache fits on a device (module docstring, step 2).

    ``prefill_tokens``: tokens of one prefill step (a chunk; default the whole prompt) whose
    working set is reserved, scaled linearly from the whole prompt's. Zero gradient (counts).
    """
    frac = 1.0 if prefill_tokens is None else jnp.minimum(prefill_tokens / jnp.maximum(
        isl, 1.0), 1.0)
    free = (usable_memory(costs.mem_capacity, costs.reserved_bytes, mem_fraction)
            - costs.weights_bytes - frac * costs.act_bytes)
    block_bytes = block_tokens * jnp.maximum(costs.kv_bytes_per_token, 1e-30)
    blocks = jnp.floor(jnp.maximum(free, 0.0) / block_bytes)
    per_seq = jnp.ceil((isl + osl + costs.spec_k) / block_tokens)
    return jax.lax.stop_gradient(jnp.floor(blocks / jnp.maximum(per_seq, 1.0)))


def md1_wait(arrival_rate, service_s):
    """Mean waiting time of an M/D/1 queue, s: ``ρ·D / (2(1 − ρ))`` with ``ρ = λ·D``
    (Pollaczek-Khinchine; DistServe §3.1 eq. 1). ``+inf`` for ``ρ >= 1`` (finite gradient)."""
    rho = arrival_rate * service_s
    ok = rho < 1.0
    return jnp.where(ok, rho * service_s / (2.0 * jnp.where(ok, 1.0 - rho, 1.0)), INF)


def _combine(tables, checks):
    """``(feasible, reason)``: the first failing cost table's reason, else the first failing
    check's (:func:`jaxmodel.numerics.first_reason`)."""
    feasible, reason = first_reason(checks)
    for c in reversed(tables):
        reason = jnp.where(c.feasible, reason, c.reason.astype(reason.dtype))
        feasible = feasible & c.feasible
    return feasible, reason


#: Standard normal quantile at 0.99 (the one-sided 99th percentile).
Z99 = 2.3263478740408408


def wait_quantile(mean_wait, rho, q=0.99):
    """``q``-quantile of the waiting time of a single-server queue with mean wait
    ``mean_wait`` and utilisation ``rho``, s.

    Tail model: ``P(W > t) = ρ·exp(−ρ·t/W̄)`` — an atom ``1 − ρ`` at zero (the probability an
    arrival finds the server idle, exact for M/G/1 by PASTA) and an exponential tail whose
    mean keeps the mean wait ``W̄``: exact for M/M/1 (Kleinrock, "Queueing Systems Vol. 1",
    §3.2, eq. 3.29 ff.) and the heavy-traffic limit of GI/G/1 (Kingman, "On Queues in Heavy
    Traffic", J. R. Stat. Soc. B 24, 1962: the wait is asymptotically exponential). For the
    M/D/1 prompts of this module it overstates the tail slightly at low load (deterministic
    service has a lighter tail). ``W_q = (W̄/ρ)·ln(ρ/(1 − q))`` when ``ρ > 1 − q``, else 0;
    ``+inf`` where ``W̄`` is. Finite gradients.
    """
    p = 1.0 - q
    ok = (rho > p) & jnp.isfinite(mean_wait)
    r = jnp.where(ok, rho, 1.0)
    w = jnp.where(ok, mean_wait, 0.0)
    out = jnp.where(ok, w / r * jnp.log(r / p), 0.0)
    return jnp.where(jnp.isfinite(mean_wait), out, INF)


def _finish(feasible, reason, opts: ServingOptions, raw: dict) -> ServingResult:
    """The :class:`ServingResult` of a steady state: ``raw`` (``ttft, tpot, batch, it, tput,
    cap, kv`` and optionally ``ttft_p99, tpot_p99``, defaulting to the means) gated by
    ``feasible`` (``+inf`` times, zero batch and throughput) and checked against the mean
    limits ``opts.ttft_slo_s`` / ``opts.tpot_slo_s``."""
    def gate(x):
        return jnp.where(feasible, x, INF)
    ttft, tpot = raw["ttft"], raw["tpot"]
    ttft_p99 = gate(raw.get("ttft_p99", ttft))
    tpot_p99 = gate(raw.get("tpot_p99", tpot))
    ttft, tpot, it = gate(ttft), gate(tpot), gate(raw["it"])
    safe_tpot = jnp.where(feasible & (tpot > 0), tpot, 1.0)
    per_user = jnp.where(feasible, 1.0 / safe_tpot, 0.0)
    tput = jnp.where(feasible, raw["tput"], 0.0)
    meets = feasible & (ttft <= opts.ttft_slo_s) & (tpot <= opts.tpot_slo_s)
    return ServingResult(
        ttft_s=ttft, tpot_s=tpot, batch=jnp.where(feasible, raw["batch"], 0.0),
        iteration_s=it, throughput_per_gpu=tput, tokens_per_s_per_user=per_user,
        capacity_rps=raw["cap"], kv_capacity_seqs=raw["kv"], meets_slo=meets,
        goodput_per_gpu=jnp.where(meets, tput, 0.0), feasible=feasible, reason=reason,
        ttft_p99_s=ttft_p99, tpot_p99_s=tpot_p99)


def n_gpus(par: Parallelism):
    """Devices of a plan, ``dp·tp·pp·cp`` (each degree at least 1)."""
    return (jnp.maximum(par.dp, 1.0) * jnp.maximum(par.tp, 1.0) * jnp.maximum(par.pp, 1.0)
            * jnp.maximum(par.cp, 1.0))


# --------------------------------------------------------------------------------------------
# 3a. aggregated serving: continuous batching, optionally with chunked prefill
# --------------------------------------------------------------------------------------------
def aggregated_capacity(costs: ServingCosts, isl, osl, max_batch, pp, chunk=0.0,
                        block_tokens=BLOCK_TOKENS, mem_fraction=MEM_FRACTION):
    """Largest arrival rate per replica with a bounded queue, requests/s.

    Without chunking: the batch reaches ``B_max = min(max_batch, KV capacity)`` when
    ``λ = B_max / (osl·T(B_max/pp) + B_max·t_prefill/pp)`` (each request's decode share of a
    replica plus its prefill). With chunks of ``C`` tokens: the smaller of the rate that fills
    ``B_max`` and the rate at which the prompt tokens fill every chunk (see
    :func:`continuous_batching_from_costs`). With speculative decoding in its iteration
    counts (``osl/E`` iterations, ``isl/(1 + k)`` prompt slots).
    """
    chunked = chunk > 0
    bmax = jnp.minimum(max_batch, kv_capacity_seqs(
        costs, isl, osl, block_tokens, mem_fraction, jnp.where(chunked, chunk, isl)))
    width = 1.0 + costs.spec_k
    isl_w = isl / width                     # prompt slots
    osl = osl / costs.spec_tokens           # decode iterations
    delta = _chunk_attention_delta(costs, isl, width)
    plain = bmax / (osl * step_time(costs, bmax / pp) + bmax * costs.prefill_s / pp)
    m_b = bmax * (osl + isl_w) / (osl * pp)
    by_batch = bmax / (osl * step_time(costs, m_b) + bmax * isl_w * delta / pp)
    c = jnp.maximum(chunk, 1.0) / width
    m_c = c * (osl + isl_w) / isl_w
    it_c = step_time(costs, m_c) + c * delta
    by_chunk = pp * c / (isl_w * it_c)
    cap = jnp.where(chunked, jnp.minimum(by_batch, by_chunk), plain)
    return jnp.where(bmax >= 1.0, jnp.maximum(cap, 0.0), 0.0)


def _chunk_attention_delta(costs: ServingCosts, isl, width=1.0):
    """Correction per prompt slot of ``width`` tokens (1 without speculation; ``1 + k``
    with, :func:`offline_from_costs`) of a mixed iteration, s: the table charges a slot as a
    decode sequence's attention (reading a whole cache); it costs the prompt tokens' share
    of the prompt's own causal attention instead (Sarathi-Serve §4.2: chunks attend to the
    prompt's earlier chunks). Decode attention per sequence: the slope of ``attn_s`` over
    the last two grid points (launch overheads excluded)."""
    per_seq = (costs.attn_s[-1] - costs.attn_s[-2]) / (TOKEN_GRID[-1] - TOKEN_GRID[-2])
    return width * costs.prefill_attn_s / jnp.maximum(isl, 1.0) - per_seq


def continuous_batching_from_costs(costs: ServingCosts, isl, osl, rate, opts: ServingOptions,
                                   dp=1.0, pp=1.0, n_gpus=1.0) -> ServingResult:
    """Steady state of continuous batching over ``dp`` replicas of ``pp`` stages on ``n_gpus``
    devices (single configuration), under the scheduler settings and limits in ``opts``
    (:class:`ServingOptions`: ``max_batch``, ``chunk``, ``block_tokens``, ``mem_fraction``,
    ``ttft_slo_s``, ``tpot_slo_s``).

    ``rate`` (requests/s, Poisson) is split evenly: ``λ = rate/dp`` per replica.

    **Without chunking** (``chunk = 0``; Orca §3.1-3.2 iteration-level scheduling with
    vLLM's scheduler, which runs waiting prompts as a prefill iteration before the next decode
    iteration, Kwon et al. §4.5): prefill occupies a share ``ρ = λ·t_p/pp`` of each stage,
    during which decodes stall (Sarathi-Serve §3.3 "generation stalls"), so
    ``TPOT = T(B/pp)/(1 − ρ)``; Little's law ``B = λ·osl·TPOT`` and the table give
    ``B`` (:func:`_fixed_point`). ``TTFT = t_p + W_MD1(λ, t_p/pp) + (1 − ρ)·T/(2·pp)``
    (prefill, M/D/1 wait for earlier prompts, half an iteration of the running batch).

    **Chunked prefill** (``chunk = C > 0``; Sarathi-Serve §4.1-4.3 stall-free batching): every
    iteration of a micro-batch carries its decodes and ``c̄ <= C`` prompt tokens, so
    ``T_it = T(m) + c̄·δ`` with ``m = (B + pp·c̄)/pp`` tokens per micro-batch and ``δ`` the
    attention correction of :func:`_chunk_attention_delta`; prompt tokens arrive at
    ``λ·isl = pp·c̄/T_it`` and decodes stay ``B = λ·osl·T_it``, hence
    ``m = λ(osl + isl)/(pp(1 − λ·isl·δ/pp))·T(m)``. ``TPOT = T_it`` (the mean iteration: no
    stalls). A prompt needs ``ceil(isl/C)`` iterations that each carry a full chunk,
    ``T_full = T(m − c̄ + C) + C·δ``: service ``D = ceil(isl/C)·T_full``, prompts queue for
    the chunk slots as an M/D/1 server (arrivals ``λ/pp`` per micro-batch), and
    ``TTFT = W_MD1(λ/pp, D) + D + T_it/2``. Needs ``c̄ < C`` and ``λ·D/pp < 1``.

    Feasible when the plan is (``costs``), one request's KV fits, and the queue is bounded
    (``B <= min(max_batch, KV capacity)``, ``ρ < 1``, a fixed point exists).
    Throughput per device ``rate·osl/n_gpus``.

    Speculative decoding (``costs.spec_k``, ``costs.spec_tokens``): as in
    :func:`offline_from_costs`, the iteration counts use ``osl/E`` decode iterations and
    ``isl/(1 + k)`` prompt slots (chunks of ``C/(1 + k)`` slots), and a token's time is the
    iteration's divided by ``E``.
    """
    f = jnp.result_type(float)
    isl, osl, rate, max_batch, dp, pp, n_gpus, chunk = (jnp.asarray(x, f) for x in (
        isl, osl, rate, opts.max_batch, dp, pp, n_gpus, opts.chunk))
    block_tokens, mem_fraction = opts.block_tokens, opts.mem_fraction
    chunked = chunk > 0
    width = 1.0 + costs.spec_k
    e_tok = costs.spec_tokens
    osl_i = osl / e_tok                       # decode iterations per request
    isl_s = isl / width                       # prompt slots per request
    lam = rate / jnp.maximum(dp, 1.0)
    pp = jnp.maximum(pp, 1.0)
    kv = kv_capacity_seqs(costs, isl, osl, block_tokens, mem_fraction,
                          jnp.where(chunked, chunk, isl))
    bmax = jnp.minimum(max_batch, kv)
    t_p = costs.prefill_s
    cap = dp * aggregated_capacity(costs, isl, osl, max_batch, pp, chunk, block_tokens,
                                   mem_fraction)

    # without chunking
    rho = lam * t_p / pp
    rho_ok = rho < 1.0
    stall = jnp.where(rho_ok, 1.0 - rho, 1.0)
    m_u, ex_u = _fixed_point(costs, lam * osl_i / (pp * stall))
    b_u = m_u * pp
    t_u = step_time(costs, m_u)
    tpot_u = t_u / (stall * e_tok)
    wait_u = md1_wait(lam, t_p / pp)
    ttft_u = t_p + wait_u + stall * t_u / (2.0 * pp)
    ok_u = rho_ok & ex_u
    # tails: the prompt's wait (wait_quantile); a request's decode meets n ~ Poisson(λ·osl·
    # TPOT) prefills of t_p/pp each (normal approximation of the count's 99th percentile)
    n_st = lam * osl * tpot_u
    ttft99_u = ttft_u - wait_u + wait_quantile(wait_u, rho)
    tpot99_u = (t_u + (n_st + Z99 * jnp.sqrt(jnp.maximum(n_st, 0.0))) * t_p / (
        pp * jnp.maximum(osl_i, 1e-9))) / e_tok

    # chunked prefill
    c = jnp.maximum(chunk, 1.0) / width       # chunk slots
    delta = _chunk_attention_delta(costs, isl, width)
    den = 1.0 - lam * isl_s * delta / pp
    den_ok = den > 0
    den = jnp.where(den_ok, den, 1.0)
    m_c, ex_c = _fixed_point(costs, lam * (osl_i + isl_s) / (pp * den))
    t_c = step_time(costs, m_c) / den
    b_c = lam * osl_i * t_c
    cbar = lam * isl_s * t_c / pp
    t_full = step_time(costs, m_c - cbar + c) + c * delta     # an iteration with a full chunk
    service = jnp.ceil(isl_s / c) * t_full
    util_ok = (cbar < c) & (lam * service / pp < 1.0)
    wait_c = md1_wait(lam / pp, service)
    ttft_c = wait_c + service + t_c / 2.0
    ttft99_c = ttft_c - wait_c + wait_quantile(wait_c, lam * service / pp)
    ok_c = den_ok & ex_c & util_ok

    ok_q = jnp.where(chunked, ok_c, ok_u)
    batch = jnp.where(chunked, b_c, b_u)
    bounded = ok_q & (batch <= bmax)
    feasible, reason = _combine([costs], [
        (kv >= 1.0, "out_of_memory"),
        (bounded, "rate_above_capacity")])
    return _finish(feasible, reason, opts, dict(
        ttft=jnp.where(chunked, ttft_c, ttft_u), tpot=jnp.where(chunked, t_c / e_tok, tpot_u),
        batch=batch, it=jnp.where(chunked, t_c, t_u),
        tput=rate * osl / jnp.maximum(n_gpus, 1.0), cap=cap, kv=kv,
        ttft_p99=jnp.where(chunked, ttft99_c, ttft99_u),
        tpot_p99=jnp.where(chunked, t_c / e_tok, tpot99_u)))


def continuous_batching_single(system: System, model: Model, par: Parallelism, isl, osl,
                               rate, opts: ServingOptions, engine: Engine = Engine()
                               ) -> ServingResult:
    """Single-configuration body of :func:`jaxmodel.serving.continuous_batching` (``opts``:
    the scheduler settings and limits; ``engine``: precision, runtime, static variant and
    speculative decoding)."""
    costs = serving_costs_single(system, model, par, isl, osl, engine)
    return continuous_batching_from_costs(costs, isl, osl, rate, opts, par.dp, par.pp,
                                          n_gpus(par))


#: The name the search and the SLO bisection have used for it.
steady_state = continuous_batching_from_costs


@batched
def _continuous_batching(system, model, par, isl, osl, rate, opts, engine):
    return continuous_batching_single(system, model, par, isl, osl, rate, opts, engine)
