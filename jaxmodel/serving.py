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
import numpy as np

from jaxmodel import precisions as _precisions, serving_runtime as _rtp
from jaxmodel import speculative as _spec
from jaxmodel.batching import batched
from jaxmodel.numerics import INF, REASONS, first_reason, reason_name
from jaxmodel.parallel.inference_step import inference_single
from jaxmodel.types import Model, Parallelism, System, is_concrete
from jaxmodel.workload.layer import ANY, Variant, variant_of
from jaxmodel.workload.memory import usable_memory

#: Tokens per decode iteration (per micro-batch) at which the cost table is evaluated:
#: powers of 4 (the iteration time is flat while memory-bound and linear once compute-bound,
#: so a coarse geometric grid interpolates it closely; each point is one inference call).
TOKEN_GRID = tuple(float(4 ** i) for i in range(8))
#: vLLM's defaults: KV block of 16 tokens, 90 % of device memory for weights + KV cache
#: (``--block-size 16``, ``--gpu-memory-utilization 0.9``; vLLM engine arguments).
BLOCK_TOKENS = 16.0
MEM_FRACTION = 0.9
_ATTN_OPS = ("qk", "av", "softmax")


def _register(cls):
    jax.tree_util.register_dataclass(
        cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])
    return cls


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
                         precision=None, runtime=None, variant: Variant = ANY,
                         speculative=None) -> ServingCosts:
    """Single-configuration body of :func:`serving_costs`.

    ``par.dp`` replicas each carry ``N`` sequences: :func:`jaxmodel.inference` runs at batch
    ``N·dp`` (``memory_rule=False``: the KV capacity is checked by the serving model), once
    per grid point (one trace, vmapped). ``variant`` (static): the code paths the inputs need
    (:func:`jaxmodel.workload.layer.variant_of`; ``ANY`` traces every one).
    ``speculative`` (:class:`jaxmodel.Speculative`): ``step_s`` is then one speculative
    iteration (``breakdown["spec.step"]``: ``k`` drafts + verification of ``1 + k`` tokens
    per sequence) and the table carries ``spec_k`` and ``spec_tokens``; the KV bytes per
    token include the proposer's cache.
    """
    f = jnp.result_type(float)
    grid = jnp.asarray(TOKEN_GRID, f)
    dp = jnp.maximum(par.dp, 1.0)
    isl = jnp.asarray(isl, f)
    osl = jnp.asarray(osl, f)
    rt = _rtp.runtime_arg(runtime)
    r = jax.vmap(lambda n: inference_single(system, model, par, n * dp, isl, osl,
                                            memory_rule=False, precision=precision,
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
def _serving_costs(system, model, par, isl, osl, precision, runtime, variant,
                   speculative=None):
    return serving_costs_single(system, model, par, isl, osl, precision, runtime, variant,
                                speculative)


def serving_costs(system: System, model: Model, par: Parallelism, isl, osl, precision=None,
                  runtime=None, speculative=None) -> ServingCosts:
    """Per-iteration cost table of one replica of ``par`` serving prompts of ``isl`` tokens
    and ``osl`` output tokens (means), from :func:`jaxmodel.inference` (module docstring,
    step 1). ``precision``/``runtime`` as in :func:`jaxmodel.inference`.

    Example:
        >>> c = jm.serving_costs(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"),
        ...                      jm.Parallelism(dp=8), 1024, 256, runtime="trtllm")
        >>> c.step_s.shape
        (8,)
    """
    return _serving_costs(system, model, par, isl, osl, _prec_arg(precision),
                          _rtp.runtime_arg(runtime), variant_of(model, par, system),
                          _spec_arg(speculative))


serving_costs.single = serving_costs_single


def _prec_arg(precision):
    return _precisions.resolve(precision, None)


def _spec_arg(speculative):
    """A validated :class:`jaxmodel.Speculative` or None (:mod:`jaxmodel.speculative`)."""
    s = _spec.speculative_arg(speculative)
    if s is not None and is_concrete(s):
        _spec.validate_speculative(s)
    return s


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


def _finish(feasible, reason, ttft, tpot, batch, it, tput, cap, kv, ttft_slo, tpot_slo,
            ttft_p99=None, tpot_p99=None):
    def gate(x):
        return jnp.where(feasible, x, INF)
    ttft_p99 = gate(ttft if ttft_p99 is None else ttft_p99)
    tpot_p99 = gate(tpot if tpot_p99 is None else tpot_p99)
    ttft, tpot, it = gate(ttft), gate(tpot), gate(it)
    safe_tpot = jnp.where(feasible & (tpot > 0), tpot, 1.0)
    per_user = jnp.where(feasible, 1.0 / safe_tpot, 0.0)
    tput = jnp.where(feasible, tput, 0.0)
    meets = feasible & (ttft <= ttft_slo) & (tpot <= tpot_slo)
    return ServingResult(
        ttft_s=ttft, tpot_s=tpot, batch=jnp.where(feasible, batch, 0.0), iteration_s=it,
        throughput_per_gpu=tput, tokens_per_s_per_user=per_user, capacity_rps=cap,
        kv_capacity_seqs=kv, meets_slo=meets, goodput_per_gpu=jnp.where(meets, tput, 0.0),
        feasible=feasible, reason=reason, ttft_p99_s=ttft_p99, tpot_p99_s=tpot_p99)


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


def continuous_batching_from_costs(costs: ServingCosts, isl, osl, rate, max_batch, *,
                                   dp=1.0, pp=1.0, n_gpus=1.0, chunk=0.0,
                                   block_tokens=BLOCK_TOKENS, mem_fraction=MEM_FRACTION,
                                   ttft_slo_s=INF, tpot_slo_s=INF) -> ServingResult:
    """Steady state of continuous batching over ``dp`` replicas (single configuration).

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
        isl, osl, rate, max_batch, dp, pp, n_gpus, chunk))
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
    return _finish(feasible, reason, jnp.where(chunked, ttft_c, ttft_u),
                   jnp.where(chunked, t_c / e_tok, tpot_u), batch,
                   jnp.where(chunked, t_c, t_u),
                   rate * osl / jnp.maximum(n_gpus, 1.0), cap, kv, ttft_slo_s, tpot_slo_s,
                   jnp.where(chunked, ttft99_c, ttft99_u),
                   jnp.where(chunked, t_c / e_tok, tpot99_u))


def continuous_batching_single(system: System, model: Model, par: Parallelism, isl, osl,
                               rate, max_batch=256.0, chunk=0.0, block_tokens=BLOCK_TOKENS,
                               mem_fraction=MEM_FRACTION, ttft_slo_s=INF, tpot_slo_s=INF,
                               precision=None, runtime=None,
                               variant: Variant = ANY, speculative=None) -> ServingResult:
    """Single-configuration body of :func:`continuous_batching`."""
    costs = serving_costs_single(system, model, par, isl, osl, precision, runtime, variant,
                                 speculative)
    return continuous_batching_from_costs(
        costs, isl, osl, rate, max_batch, dp=par.dp, pp=par.pp,
        n_gpus=jnp.maximum(par.dp, 1.0) * jnp.maximum(par.tp, 1.0) * jnp.maximum(par.pp, 1.0)
        * jnp.maximum(par.cp, 1.0), chunk=chunk, block_tokens=block_tokens,
        mem_fraction=mem_fraction, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)


@batched
def _continuous_batching(system, model, par, isl, osl, rate, max_batch, chunk, block_tokens,
                         mem_fraction, ttft_slo_s, tpot_slo_s, precision, runtime, variant,
                         speculative=None):
    return continuous_batching_single(system, model, par, isl, osl, rate, max_batch, chunk,
                                      block_tokens, mem_fraction, ttft_slo_s, tpot_slo_s,
                                      precision, runtime, variant, speculative)


def continuous_batching(system: System, model: Model, par: Parallelism, isl, osl, rate,
                        max_batch=256, chunk=0, *, block_tokens=BLOCK_TOKENS,
                        mem_fraction=MEM_FRACTION, ttft_slo_s=float("inf"),
                        tpot_slo_s=float("inf"), precision=None,
                        runtime="vllm", speculative=None) -> ServingResult:
    """Steady state of continuous batching (optionally with chunked prefill) on ``system``.

    Args:
        system, model: as :func:`jaxmodel.inference`.
        par: ``dp`` replicas of ``tp × pp`` devices (``dp·tp·pp`` = the system's devices).
        isl, osl: mean prompt and output tokens per request.
        rate: request arrival rate of the whole deployment, requests/s (Poisson).
        max_batch: the scheduler's cap on sequences per replica (vLLM ``max_num_seqs``,
            TensorRT-LLM ``max_batch_size``).
        chunk: prompt tokens per iteration with chunked prefill (0 = whole prompts as their
            own iterations).
        block_tokens, mem_fraction: KV block size (tokens) and the share of device memory for
            weights + KV cache.
        ttft_slo_s, tpot_slo_s: limits for ``meets_slo`` / ``goodput_per_gpu``.
        precision, runtime: as :func:`jaxmodel.inference` (default runtime ``"vllm"``).
        speculative: None or a :class:`jaxmodel.Speculative` (as :func:`jaxmodel.inference`;
            the iteration model of :func:`continuous_batching_from_costs`).

    Returns:
        :class:`ServingResult` (see :func:`continuous_batching_from_costs` for the model).

    Example:
        >>> r = jm.continuous_batching(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"),
        ...                            jm.Parallelism(dp=8), 1024, 256, rate=40.0)
        >>> bool(r.feasible), float(r.tpot_s) < 0.05
        (True, True)
    """
    return _continuous_batching(system, model, par, isl, osl, rate, max_batch, chunk,
                                block_tokens, mem_fraction, ttft_slo_s, tpot_slo_s,
                                _prec_arg(precision), _rtp.runtime_arg(runtime),
                                variant_of(model, par, system), _spec_arg(speculative))


continuous_batching.single = continuous_batching_single


# --------------------------------------------------------------------------------------------
# 3b. disaggregated prefill / decode
# --------------------------------------------------------------------------------------------
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


def disaggregated_from_costs(pre: ServingCosts, dec: ServingCosts, system: System, isl, osl,
                             rate, max_batch, *, dp_prefill=1.0, pp_prefill=1.0,
                             tp_prefill=1.0, dp_decode=1.0, pp_decode=1.0, tp_decode=1.0,
                             block_tokens=BLOCK_TOKENS, mem_fraction=MEM_FRACTION,
                             ttft_slo_s=INF, tpot_slo_s=INF) -> ServingResult:
    """Steady state of separate prefill and decode pools (single configuration).

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
    isl, osl, rate, max_batch = (jnp.asarray(x, f) for x in (isl, osl, rate, max_batch))
    dp_p, pp_p, tp_p, dp_d, pp_d, tp_d = (jnp.maximum(jnp.asarray(x, f), 1.0) for x in (
        dp_prefill, pp_prefill, tp_prefill, dp_decode, pp_decode, tp_decode))
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
    return _finish(feasible, reason, ttft, tpot, batch, tpot, rate * osl / (n_p + n_d), cap,
                   kv_d, ttft_slo_s, tpot_slo_s, ttft99, tpot)


def _pool_par(par: Parallelism, n_devices):
    """``par`` re-counted over the whole system (``dp = n/(tp·pp)``): the cost table of one
    replica does not depend on how many replicas there are, and the plan rules of
    :func:`jaxmodel.inference` then see a consistent device count."""
    return dataclasses.replace(par, dp=n_devices / (jnp.maximum(par.tp, 1.0)
                                                    * jnp.maximum(par.pp, 1.0)))


def disaggregated_single(system: System, model: Model, par_prefill: Parallelism,
                         par_decode: Parallelism, isl, osl, rate, max_batch=256.0,
                         block_tokens=BLOCK_TOKENS, mem_fraction=MEM_FRACTION, ttft_slo_s=INF,
                         tpot_slo_s=INF, precision=None, runtime=None,
                         variants: tuple = (ANY, ANY)) -> ServingResult:
    """Single-configuration body of :func:`disaggregated` (``variants``: static, of the
    prefill and the decode pool)."""
    n = system.n_devices
    pre = serving_costs_single(system, model, _pool_par(par_prefill, n), isl, osl, precision,
                               runtime, variants[0])
    dec = serving_costs_single(system, model, _pool_par(par_decode, n), isl, osl, precision,
                               runtime, variants[1])
    return disaggregated_from_costs(
        pre, dec, system, isl, osl, rate, max_batch, dp_prefill=par_prefill.dp,
        pp_prefill=par_prefill.pp, tp_prefill=par_prefill.tp, dp_decode=par_decode.dp,
        pp_decode=par_decode.pp, tp_decode=par_decode.tp, block_tokens=block_tokens,
        mem_fraction=mem_fraction, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)


@batched
def _disaggregated(system, model, par_prefill, par_decode, isl, osl, rate, max_batch,
                   block_tokens, mem_fraction, ttft_slo_s, tpot_slo_s, precision, runtime,
                   variants):
    return disaggregated_single(system, model, par_prefill, par_decode, isl, osl, rate,
                                max_batch, block_tokens, mem_fraction, ttft_slo_s, tpot_slo_s,
                                precision, runtime, variants)


def disaggregated(system: System, model: Model, par_prefill: Parallelism,
                  par_decode: Parallelism, isl, osl, rate, max_batch=256, *,
                  block_tokens=BLOCK_TOKENS, mem_fraction=MEM_FRACTION,
                  ttft_slo_s=float("inf"), tpot_slo_s=float("inf"), precision=None,
                  runtime="vllm") -> ServingResult:
    """Steady state of disaggregated prefill/decode serving on ``system``.

    ``par_prefill`` / ``par_decode``: each pool's ``dp`` replicas of ``tp × pp`` devices; the
    pools together may use at most the system's devices (``tp·pp`` of each must divide the
    system's device count). Other arguments as :func:`continuous_batching`; ``max_batch`` caps
    the sequences per decode replica. See :func:`disaggregated_from_costs`.

    Example:
        >>> r = jm.disaggregated(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"),
        ...                      jm.Parallelism(dp=2), jm.Parallelism(dp=6), 1024, 256,
        ...                      rate=20.0)
        >>> bool(r.feasible)
        True
    """
    return _disaggregated(system, model, par_prefill, par_decode, isl, osl, rate, max_batch,
                          block_tokens, mem_fraction, ttft_slo_s, tpot_slo_s,
                          _prec_arg(precision), _rtp.runtime_arg(runtime),
                          (variant_of(model, par_prefill, system),
                           variant_of(model, par_decode, system)))


disaggregated.single = disaggregated_single

__all__ = ["ServingCosts", "ServingResult", "OfflineResult", "serving_costs",
           "continuous_batching", "disaggregated", "offline_throughput", "slo_throughput",
           "TOKEN_GRID"]


# --------------------------------------------------------------------------------------------
# 4. offline (all requests queued) and SLO-bounded throughput
# --------------------------------------------------------------------------------------------
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


def offline_from_costs(costs: ServingCosts, isl, osl, *, max_batch, max_tokens, dp=1.0,
                       pp=1.0, n_gpus=1.0, block_tokens=BLOCK_TOKENS,
                       mem_fraction=MEM_FRACTION, kv_of_free=0.0) -> OfflineResult:
    """Offline throughput of in-flight batching with every request queued (single
    configuration; trtllm-bench ``throughput``, MLPerf Inference "Offline" scenario).

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
        isl, osl, max_batch, max_tokens, dp, pp, n_gpus))
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


def _n_gpus(par: Parallelism):
    return (jnp.maximum(par.dp, 1.0) * jnp.maximum(par.tp, 1.0) * jnp.maximum(par.pp, 1.0)
            * jnp.maximum(par.cp, 1.0))


def offline_throughput_single(system: System, model: Model, par: Parallelism, isl, osl,
                              max_batch, max_tokens, block_tokens, mem_fraction, kv_of_free,
                              precision=None, runtime=None,
                              variant: Variant = ANY, speculative=None) -> OfflineResult:
    """Single-configuration body of :func:`offline_throughput`."""
    costs = serving_costs_single(system, model, par, isl, osl, precision, runtime, variant,
                                 speculative)
    return offline_from_costs(costs, isl, osl, max_batch=max_batch, max_tokens=max_tokens,
                              dp=par.dp, pp=par.pp, n_gpus=_n_gpus(par),
                              block_tokens=block_tokens, mem_fraction=mem_fraction,
                              kv_of_free=kv_of_free)


@batched
def _offline_throughput(system, model, par, isl, osl, max_batch, max_tokens, block_tokens,
                        mem_fraction, kv_of_free, precision, runtime, variant,
                        speculative=None):
    return offline_throughput_single(system, model, par, isl, osl, max_batch, max_tokens,
                                     block_tokens, mem_fraction, kv_of_free, precision,
                                     runtime, variant, speculative)


def _scheduler_args(runtime, **given):
    """The scheduler settings of ``runtime``'s preset (:data:`jaxmodel.serving_runtime.
    SCHEDULER`), overridden by the ones given (not None)."""
    name = _rtp.runtime(runtime).name
    out = dict(_rtp.scheduler_defaults(name))
    out.update({k: v for k, v in given.items() if v is not None})
    for k, v in out.items():
        a = np.asarray(v, float)
        if not np.all(np.isfinite(a) & (a >= 0)):
            raise ValueError(f"{k}={v!r} must be finite and >= 0")
        if k in ("max_batch", "max_tokens", "block_tokens") and not np.all(a > 0):
            raise ValueError(f"{k}={v!r} must be > 0")
    return out


def offline_throughput(system: System, model: Model, par: Parallelism, isl, osl, *,
                       precision=None, runtime="trtllm_v1", max_batch=None, max_tokens=None,
                       block_tokens=None, mem_fraction=None,
                       speculative=None) -> OfflineResult:
    """Offline (all requests queued) throughput of in-flight batching on ``system``
    (trtllm-bench ``throughput``, MLPerf Inference Offline; see :func:`offline_from_costs`).

    Args:
        system, model, precision: as :func:`jaxmodel.inference`.
        par: ``dp`` replicas of ``tp × pp`` devices.
        isl, osl: prompt and output tokens per request.
        runtime: a preset name or :class:`jaxmodel.Runtime`; its scheduler defaults
            (:func:`jaxmodel.serving_runtime.scheduler_defaults`) fill the settings not given.
        max_batch: sequences per replica (TensorRT-LLM ``max_batch_size``, vLLM
            ``max_num_seqs``).
        max_tokens: tokens per iteration (``max_num_tokens`` / ``max_num_batched_tokens``).
        block_tokens: KV block, tokens. mem_fraction: the KV pool's share of memory.
        speculative: None or a :class:`jaxmodel.Speculative` (:func:`offline_from_costs`).

    Example:
        >>> r = jm.offline_throughput(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"),
        ...                           jm.Parallelism(dp=8), 1000, 1000, precision="fp8")
        >>> bool(r.feasible), float(r.throughput_per_gpu) > 1000
        (True, True)
    """
    s = _scheduler_args(runtime, max_batch=max_batch, max_tokens=max_tokens,
                        block_tokens=block_tokens, mem_fraction=mem_fraction)
    return _offline_throughput(system, model, par, isl, osl, s["max_batch"], s["max_tokens"],
                               s["block_tokens"], s["mem_fraction"], s["kv_of_free"],
                               _prec_arg(precision), _rtp.runtime_arg(runtime),
                               variant_of(model, par, system), _spec_arg(speculative))


offline_throughput.single = offline_throughput_single


#: Bisection steps of :func:`slo_throughput_from_costs` (the rate to 2⁻⁴⁰ of the capacity).
SLO_BISECTION_STEPS = 40


def slo_throughput_from_costs(costs: ServingCosts, isl, osl, *, ttft_p99_s, tpot_p99_s,
                              max_batch, chunk=0.0, dp=1.0, pp=1.0, n_gpus=1.0,
                              block_tokens=BLOCK_TOKENS,
                              mem_fraction=MEM_FRACTION) -> ServingResult:
    """The highest Poisson arrival rate whose steady state (:func:`continuous_batching_from_
    costs`) is feasible with ``ttft_p99_s >= TTFT₉₉`` and ``tpot_p99_s >= TPOT₉₉`` (the tail
    model of :class:`ServingResult`), and that steady state (single configuration).

    Both percentiles grow with the rate (longer waits, larger batches, more stalls), so the
    set of rates meeting them is an interval from 0: bisection on ``[0, capacity]`` in
    :data:`SLO_BISECTION_STEPS` steps. ``feasible=False`` with reason ``slo_unmet`` when no rate
    meets the limits (even an idle server's prefill or iteration exceeds them), else the plan's
    reason. The rate is a search result: zero gradient with respect to the inputs.
    """
    f = jnp.result_type(float)

    def at(rate):
        return continuous_batching_from_costs(
            costs, isl, osl, rate, max_batch, dp=dp, pp=pp, n_gpus=n_gpus, chunk=chunk,
            block_tokens=block_tokens, mem_fraction=mem_fraction)

    def ok(rate):
        r = at(rate)
        return r.feasible & (r.ttft_p99_s <= ttft_p99_s) & (r.tpot_p99_s <= tpot_p99_s)

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


def slo_throughput_single(system: System, model: Model, par: Parallelism, isl, osl,
                          ttft_p99_s, tpot_p99_s, max_batch, chunk, block_tokens,
                          mem_fraction, precision=None, runtime=None,
                          variant: Variant = ANY, speculative=None) -> ServingResult:
    """Single-configuration body of :func:`slo_throughput`."""
    costs = serving_costs_single(system, model, par, isl, osl, precision, runtime, variant,
                                 speculative)
    return slo_throughput_from_costs(
        costs, isl, osl, ttft_p99_s=ttft_p99_s, tpot_p99_s=tpot_p99_s, max_batch=max_batch,
        chunk=chunk, dp=par.dp, pp=par.pp, n_gpus=_n_gpus(par), block_tokens=block_tokens,
        mem_fraction=mem_fraction)


@batched
def _slo_throughput(system, model, par, isl, osl, ttft_p99_s, tpot_p99_s, max_batch, chunk,
                    block_tokens, mem_fraction, precision, runtime, variant,
                    speculative=None):
    return slo_throughput_single(system, model, par, isl, osl, ttft_p99_s, tpot_p99_s,
                                 max_batch, chunk, block_tokens, mem_fraction, precision,
                                 runtime, variant, speculative)


def slo_throughput(system: System, model: Model, par: Parallelism, isl, osl, *, ttft_p99_s,
                   tpot_p99_s, precision=None, runtime="vllm_v1", max_batch=None, chunk=None,
                   block_tokens=None, mem_fraction=None, speculative=None) -> ServingResult:
    """Throughput at the highest Poisson arrival rate meeting tail limits on the time to
    first token and the time per output token (see :func:`slo_throughput_from_costs`).

    Args:
        system, model, par, isl, osl, precision: as :func:`continuous_batching`.
        ttft_p99_s, tpot_p99_s: limits on the 99th percentiles, s.
        runtime: preset or :class:`jaxmodel.Runtime`; its scheduler defaults
            (:func:`jaxmodel.serving_runtime.scheduler_defaults`: ``max_batch``, ``chunk``
            for chunked prefill, ``block_tokens``, ``mem_fraction``) fill the settings not
            given.
        speculative: None or a :class:`jaxmodel.Speculative` (as
            :func:`continuous_batching`).

    Returns:
        :class:`ServingResult` at that rate (``capacity_rps`` the unbounded-queue rate; the
        chosen rate is ``throughput_per_gpu · n_gpus / osl``).

    Example:
        >>> r = jm.slo_throughput(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"),
        ...                       jm.Parallelism(dp=8), 1024, 256, ttft_p99_s=1.0,
        ...                       tpot_p99_s=0.05)
        >>> bool(r.feasible), float(r.tpot_p99_s) <= 0.05
        (True, True)
    """
    for k, v in (("ttft_p99_s", ttft_p99_s), ("tpot_p99_s", tpot_p99_s)):
        if not np.all(np.asarray(v, float) > 0):
            raise ValueError(f"{k}={v!r} must be > 0")
    s = _scheduler_args(runtime, max_batch=max_batch, chunk=chunk, block_tokens=block_tokens,
                        mem_fraction=mem_fraction)
    return _slo_throughput(system, model, par, isl, osl, ttft_p99_s, tpot_p99_s,
                           s["max_batch"], s["chunk"], s["block_tokens"], s["mem_fraction"],
                           _prec_arg(precision), _rtp.runtime_arg(runtime),
                           variant_of(model, par, system), _spec_arg(speculative))


slo_throughput.single = slo_throughput_single
