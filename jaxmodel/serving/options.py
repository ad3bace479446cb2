"""The settings that travel together through the serving models: the scheduler's (batch and
token caps, KV blocks, the KV pool's memory share, chunked prefill) with the latency limits
(:class:`ServingOptions`, a pytree), and the engine that runs the forward steps (precision,
runtime, the static code-path variant, speculative decoding: :class:`Engine`).

The public functions of :mod:`jaxmodel.serving` keep their keyword arguments and build these
objects at the API edge (:func:`scheduler_settings` fills the ones a call leaves out from the
runtime preset, :data:`jaxmodel.serving_runtime.SCHEDULER`); the single-configuration bodies
take ``(costs or system/model/plan, workload, options)``.

Units: tokens, requests, fractions, seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxmodel import serving_runtime as _rtp
from jaxmodel.numerics import INF
from jaxmodel.workload.layer import ANY

#: vLLM's defaults: KV block of 16 tokens, 90 % of device memory for weights + KV cache
#: (``--block-size 16``, ``--gpu-memory-utilization 0.9``; vLLM engine arguments).
BLOCK_TOKENS = 16.0
MEM_FRACTION = 0.9


def register(cls):
    """``cls`` registered as a pytree whose every field is a data leaf."""
    jax.tree_util.register_dataclass(
        cls, data_fields=[f.name for f in dataclasses.fields(cls)], meta_fields=[])
    return cls


@register
@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """Scheduler settings and latency limits of one serving configuration (a pytree: every
    field a number, so a batch may vary any of them).

    Attributes:
        max_batch: sequences per (decode) replica (vLLM ``max_num_seqs``, TensorRT-LLM
            ``max_batch_size``).
        max_tokens: tokens per iteration (``max_num_batched_tokens`` / ``max_num_tokens``).
        block_tokens: tokens per KV block.
        mem_fraction: the KV pool's share of device memory (vLLM
            ``gpu_memory_utilization``), or of the memory left after the weights and the
            activations where ``kv_of_free`` is 1 (TensorRT-LLM ``free_gpu_memory_fraction``).
        kv_of_free: 1 for TensorRT-LLM's sizing of the KV pool, 0 for vLLM's.
        chunk: prompt tokens per iteration with chunked prefill (0 = whole prompts).
        ttft_slo_s, tpot_slo_s: mean-latency limits of ``meets_slo`` / goodput, s.
        ttft_p99_s, tpot_p99_s: 99th-percentile limits of the SLO-bounded throughput, s.
    """

    max_batch: Any = 256.0
    max_tokens: Any = 8192.0
    block_tokens: Any = BLOCK_TOKENS
    mem_fraction: Any = MEM_FRACTION
    kv_of_free: Any = 0.0
    chunk: Any = 0.0
    ttft_slo_s: Any = INF
    tpot_slo_s: Any = INF
    ttft_p99_s: Any = INF
    tpot_p99_s: Any = INF


class Engine(NamedTuple):
    """How the forward steps run (a pytree passed through ``@batched``): ``precision`` and
    ``runtime`` as :func:`jaxmodel.inference` takes them, ``variant`` the static code paths
    (:func:`jaxmodel.workload.layer.variant_of`; for disaggregated serving a pair, prefill
    pool then decode pool), ``speculative`` None or a :class:`jaxmodel.Speculative`,
    ``gemm`` the GEMM function of :func:`jaxmodel.inference` (static; None = the tile
    search)."""

    precision: Any = None
    runtime: Any = None
    variant: Any = ANY
    speculative: Any = None
    gemm: Any = None


def scheduler_settings(runtime, **given) -> dict:
    """The scheduler settings of ``runtime``'s preset (:data:`jaxmodel.serving_runtime.
    SCHEDULER`), overridden by the ones given (not None); each must be finite and >= 0,
    ``max_batch``, ``max_tokens`` and ``block_tokens`` > 0 (a ``ValueError`` names it)."""
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
