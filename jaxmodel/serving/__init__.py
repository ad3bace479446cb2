"""Serving systems in steady state: continuous batching with a paged KV cache, chunked
prefill, disaggregated prefill/decode pools, offline runs and SLO-bounded throughput — the
API edge (each public function checks and converts its arguments, builds the scheduler
options and maps the single-configuration body over any batch axes).

Modules: :mod:`~jaxmodel.serving.options` (the scheduler settings and limits that travel
together, :class:`ServingOptions`, and the engine, :class:`Engine`),
:mod:`~jaxmodel.serving.steady` (the per-iteration cost table, the queueing helpers and the
continuous-batching steady state; the model is documented there),
:mod:`~jaxmodel.serving.disaggregated` (separate prefill and decode pools),
:mod:`~jaxmodel.serving.offline` (every request queued; the highest rate meeting tail
limits).

Units: seconds, bytes, requests/s, tokens/s.
"""

from __future__ import annotations

import numpy as np

from jaxmodel import precisions as _precisions, serving_runtime as _rtp
from jaxmodel import speculative as _spec
from jaxmodel.serving.disaggregated import (Pools, _disaggregated, disaggregated_from_costs,
                                            disaggregated_single, disaggregated_state,
                                            kv_transfer_time)
from jaxmodel.serving.offline import (SLO_BISECTION_STEPS, OfflineResult, _offline_throughput,
                                      _slo_throughput, kv_capacity_of_free, offline_from_costs,
                                      offline_state, offline_throughput_single,
                                      slo_state, slo_throughput_from_costs,
                                      slo_throughput_single)
from jaxmodel.serving.options import (BLOCK_TOKENS, MEM_FRACTION, Engine, ServingOptions,
                                      scheduler_settings)
from jaxmodel.serving.steady import (TOKEN_GRID, Z99, ServingCosts, ServingResult,
                                     _continuous_batching, _serving_costs,
                                     aggregated_capacity, continuous_batching_from_costs,
                                     continuous_batching_single, kv_capacity_seqs, md1_wait,
                                     n_gpus, serving_costs_single, steady_state, step_time,
                                     wait_quantile)
from jaxmodel.types import Model, Parallelism, System, is_concrete
from jaxmodel.workload.layer import variant_of

__all__ = ["ServingCosts", "ServingResult", "OfflineResult", "serving_costs",
           "continuous_batching", "disaggregated", "offline_throughput", "slo_throughput",
           "TOKEN_GRID"]

# the scheduler settings of a runtime preset, checked (the name the tests and callers use)
_scheduler_args = scheduler_settings


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
    return _serving_costs(system, model, par, isl, osl, Engine(
        _prec_arg(precision), _rtp.runtime_arg(runtime), variant_of(model, par, system),
        _spec_arg(speculative)))


serving_costs.single = serving_costs_single


def _prec_arg(precision):
    return _precisions.resolve(precision, None)


def _spec_arg(speculative):
    """A validated :class:`jaxmodel.Speculative` or None (:mod:`jaxmodel.speculative`)."""
    s = _spec.speculative_arg(speculative)
    if s is not None and is_concrete(s):
        _spec.validate_speculative(s)
    return s



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
    opts = ServingOptions(max_batch=max_batch, chunk=chunk, block_tokens=block_tokens,
                          mem_fraction=mem_fraction, ttft_slo_s=ttft_slo_s,
                          tpot_slo_s=tpot_slo_s)
    return _continuous_batching(system, model, par, isl, osl, rate, opts, Engine(
        _prec_arg(precision), _rtp.runtime_arg(runtime), variant_of(model, par, system),
        _spec_arg(speculative)))


continuous_batching.single = continuous_batching_single


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
    opts = ServingOptions(max_batch=max_batch, block_tokens=block_tokens,
                          mem_fraction=mem_fraction, ttft_slo_s=ttft_slo_s,
                          tpot_slo_s=tpot_slo_s)
    return _disaggregated(system, model, (par_prefill, par_decode), isl, osl, rate, opts,
                          Engine(_prec_arg(precision), _rtp.runtime_arg(runtime),
                                 (variant_of(model, par_prefill, system),
                                  variant_of(model, par_decode, system))))


disaggregated.single = disaggregated_single


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
    s = scheduler_settings(runtime, max_batch=max_batch, max_tokens=max_tokens,
                           block_tokens=block_tokens, mem_fraction=mem_fraction)
    opts = ServingOptions(**{k: s[k] for k in ("max_batch", "max_tokens", "block_tokens",
                                               "mem_fraction", "kv_of_free")})
    return _offline_throughput(system, model, par, isl, osl, opts, Engine(
        _prec_arg(precision), _rtp.runtime_arg(runtime), variant_of(model, par, system),
        _spec_arg(speculative)))


offline_throughput.single = offline_throughput_single


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
    s = scheduler_settings(runtime, max_batch=max_batch, chunk=chunk,
                           block_tokens=block_tokens, mem_fraction=mem_fraction)
    opts = ServingOptions(max_batch=s["max_batch"], chunk=s["chunk"],
                          block_tokens=s["block_tokens"], mem_fraction=s["mem_fraction"],
                          ttft_p99_s=ttft_p99_s, tpot_p99_s=tpot_p99_s)
    return _slo_throughput(system, model, par, isl, osl, opts, Engine(
        _prec_arg(precision), _rtp.runtime_arg(runtime), variant_of(model, par, system),
        _spec_arg(speculative)))


slo_throughput.single = slo_throughput_single
