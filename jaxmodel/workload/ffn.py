"""The dense feed-forward block of a transformer layer and the GEMM record it is built of.

Shared by the dense layer (:mod:`jaxmodel.workload.layer`) and the Mixture-of-Experts rows
(:mod:`jaxmodel.workload.moe`), which both import it (so neither imports the other for it).
Units: seconds, elements, bytes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from jaxmodel import ops as _ops
from jaxmodel.types import Model


class Gemm(NamedTuple):
    """One GEMM kernel ``C[m, n] = A[m, k]·B[k, n]``; ``batch`` products (None: a weight GEMM)."""

    m: jnp.ndarray
    n: jnp.ndarray
    k: jnp.ndarray
    batch: jnp.ndarray | None = None


def _elementwise(dev, n, bytes_moved, flops):
    return _ops.elementwise_latency.single(dev, n, bytes_moved, flops, overhead=True)


def ffn_block(dev, model: Model, sh, tokens, dtype_bytes=2.0, backward=False):
    """Dense FFN of ``tokens`` rows: ``w1``, activation, ``w2``.

    GELU FFN (GPT): ``W1 [d, d_ff/t]``, GELU (LLMCompass GeLU kernel), ``W2 [d_ff/t, d]``.
    SwiGLU (Llama; Shazeer 2020): gate and up fused into one ``[d, 2·d_ff/t]`` GEMM, then
    ``silu(gate)·up`` (:func:`jaxmodel.ops.silu_mul_latency`, the fused SiLU·mul kernel),
    then ``W2``.
    Backward activation (memory-bound): GELU reads ``x, dy`` and writes ``dx`` (3 words,
    ``2·(10 + exp)`` FLOP, twice LLMCompass's forward count); SwiGLU reads ``gate, up, dy`` and
    writes ``dgate, dup`` (5 words, ``2·(exp + 5)`` FLOP).

    Returns:
        ``(gemm_rows, vector_rows)`` with rows ``w1``, ``w2`` and ``act``.
    """
    n_act = tokens * sh.d_ff
    gemms = {"w1": [(Gemm(tokens, sh.ffn_in, sh.d_model), 1.0)],
             "w2": [(Gemm(tokens, sh.d_model, sh.d_ff), 1.0)]}
    is_swiglu = model.is_gated > 0.5          # SwiGLU / GeGLU: the gated elementwise kernel
    gelu = _ops.gelu_latency.single(dev, n_act, overhead=True)
    swiglu = _ops.silu_mul_latency.single(dev, n_act, dtype_bytes, overhead=True, rows=tokens)
    act = jnp.where(is_swiglu, swiglu, gelu)
    if backward:
        gelu_b = _elementwise(dev, n_act, 3.0 * dtype_bytes, 2.0 * (10.0 + dev.exp_flops))
        swiglu_b = _elementwise(dev, n_act, 5.0 * dtype_bytes, 2.0 * (dev.exp_flops + 5.0))
        act_b = jnp.where(is_swiglu, swiglu_b, gelu_b)
    else:
        act_b = jnp.zeros_like(act)
    return gemms, {"act": (act, act_b)}
