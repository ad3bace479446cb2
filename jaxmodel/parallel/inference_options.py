"""What an inference step takes: the batched knobs of one request batch
(:class:`InferenceOptions`, a frozen pytree) and the static switches fixed once per compiled
step (:class:`InferenceStatics`).

:func:`jaxmodel.parallel.inference_step.make_inference_step` builds the single-configuration
step ``step(options) -> InferenceResult`` from a system, a model, a plan, the precision, the
serving runtime, the speculative proposer and these statics (the factories of JAX MD,
Schoenholz & Cubuk, NeurIPS 2020: a builder fixes the static structure once and returns a
pure function of the traced inputs, which the caller batches), as
:func:`jaxmodel.parallel.train.make_train_step` does for training.

Units: sequences, tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from jaxmodel.workload.blocks import ANY, Variant

#: Decode steps sampled over the KV growth for ``tpot_s``.
KV_SAMPLES = 3


@dataclasses.dataclass(frozen=True)
class InferenceOptions:
    """The batched knobs of one inference request batch (frozen pytree; every leaf may carry
    a batch axis).

    Attributes:
        batch: sequences served together (global over ``dp``).
        prompt_len: prompt tokens per sequence.
        gen_len: generated tokens per sequence (``>= 1``).
        micro_batches: micro-batches each replica's ``batch/dp`` sequences are split into
            (``>= 1``, clipped to the sequences; 1 = the whole batch as one, the
            latency-optimal pipeline; :mod:`jaxmodel.parallel.inference_step`).

    Example:
        >>> o = jm.InferenceOptions(batch=8, prompt_len=2048, gen_len=256)
        >>> o.gen_len, o.micro_batches
        (256, 1.0)
    """

    batch: Any
    prompt_len: Any
    gen_len: Any
    micro_batches: Any = 1.0


jax.tree_util.register_dataclass(
    InferenceOptions, data_fields=[f.name for f in dataclasses.fields(InferenceOptions)],
    meta_fields=[])


@dataclasses.dataclass(frozen=True)
class InferenceStatics:
    """Static switches of an inference step's graph, fixed once at the API edge (Python
    values: part of a compilation's cache key, never traced). ``gemm``, ``variant`` and
    ``memory_rule`` are pytree leaves that the batching keeps static (a function, booleans;
    :func:`jaxmodel.batching.is_static`), ``kv_samples`` is the pytree's metadata, so the
    integer stays a Python int inside a batched call.

    Attributes:
        gemm: GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s``; None = the
            ops tile search.
        variant: the workload's op-graph switches (:class:`jaxmodel.workload.layer.Variant`;
            :data:`~jaxmodel.workload.layer.ANY` keeps every branch).
        kv_samples: decode steps sampled over the KV growth for ``tpot_s`` (midpoint rule).
        memory_rule: False leaves out the last feasibility rule, ``out_of_memory`` (the
            times of a plan that does not fit stay finite).

    Example:
        >>> s = jm.InferenceStatics(memory_rule=False)
        >>> s.gemm is None, s.kv_samples, s.memory_rule
        (True, 3, False)
    """

    gemm: Callable | None = None
    variant: Variant = ANY
    kv_samples: int = KV_SAMPLES
    memory_rule: bool = True


jax.tree_util.register_dataclass(
    InferenceStatics, data_fields=["gemm", "variant", "memory_rule"], meta_fields=["kv_samples"])

__all__ = ["InferenceOptions", "InferenceStatics", "KV_SAMPLES"]
