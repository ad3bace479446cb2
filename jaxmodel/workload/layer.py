"""Op graph of one decoder layer on one device: inference (prefill/decode) and training.

Source: LLMCompass §III-C and Fig. 2, ``TransformerBlockInitComputationTP`` /
``TransformerBlockAutoRegressionTP`` ("Transformer
layer"); Megatron-LM tensor parallelism (Shoeybi et al. 2019) and sequence parallelism
(Korthikanti et al. 2022 §4.2.2); Guo et al. §III (Optimus-style training graph).

Semantics (LLMCompass): every kernel runs serially, each pays its per-kernel overhead (inside
the ``ops`` latencies), no compute/communication overlap, no residual adds, biases or dropout
kernels. Per device with tensor-parallel degree ``t``, ``b`` sequences, ``s`` new tokens each
and ``s_kv`` keys per sequence (``s`` in prefill, ``kv_len + s`` in decode):

==================  ==============================================================  ==========
row                 kernel(s)                                                        LLMCompass
==================  ==============================================================  ==========
``qkv``             Q [b·s, d]×[d, h·d_h/t]; K and V [b·s, d]×[d, h_kv'·d_h] each;    Q_K_V
                    Llama (SwiGLU) models: + RoPE on q and k
``qk``              batched: b·h_kv' × ([s·g, d_h]×[d_h, s_kv])                       Q_mul_K
``softmax``         rows b·h/t·s, cols s_kv                                           Softmax
``av``              batched: b·h_kv' × ([s·g, s_kv]×[s_kv, d_h])                      A_mul_V
``wo``              [b·s, h·d_h/t]×[h·d_h/t, d]                                       Wo_proj
``layernorm_mha``   rows b·s (b·s/t under SP), cols d; RMSNorm for SwiGLU models       LayerNorm_MHA
``allreduce_mha``   all-reduce of b·s·d words over t (SP: reduce-scatter+all-gather)  AllReduce_MHA
``w1``              [b·s, d]×[d, (m−1)·d_ff/t]  (m = 2 GELU, 3 SwiGLU: gate+up fused)  W1_proj
``act``             GELU (LLMCompass GeLU op) or fused SiLU·mul, b·s·d_ff/t elements   GeLU
``w2``              [b·s, d_ff/t]×[d_ff/t, d]                                         W2_proj
``layernorm_ffn``   as layernorm_mha                                                  LayerNorm_FFN
``allreduce_ffn``   as allreduce_mha (0 for a parallel block, :func:`tp_syncs`)        AllReduce_FFN
``moe_router``      MoE gate GEMM, softmax/top-k, permutations (0 for dense models)
``moe_alltoall``    MoE dispatch + combine all-to-all over ``ep`` (0 for dense models)
``total``           sum of the rows above
==================  ==============================================================  ==========

``h_kv' = max(h_kv/t, 1)`` KV heads per device (replicated when ``t > h_kv``) and
``g = (h/t)/h_kv'`` query heads per KV head: grouped-query attention folds the group into the
GEMM's M so each KV head (and, in decode, its slice of the KV cache) is read once per group;
with multi-head attention ``g = 1`` and the batched GEMMs are exactly LLMCompass's
(batch ``b·h/t``, ``[s, d_h]×[d_h, s_kv]``). In decode the KV cache is read through these two
GEMMs (the concat is not timed, as in LLMCompass).

The attention core (``qk, softmax, av``) and the FFN are separate functions
(:func:`attention_core`, :func:`ffn_block`); FlashAttention (``par.flash_attention``,
:mod:`jaxmodel.ops.attention`) and MoE layers (:mod:`jaxmodel.workload.moe`) replace them.
Discrete choices are numeric leaves selected with ``jnp.where``, so a batch may mix them; the
public functions additionally pass a static :class:`Variant` derived from concrete inputs
(:func:`variant_of`) so that, e.g., a dense model without SP or FlashAttention traces only
the all-reduce, the standard attention and the dense FFN (a ~2× smaller, faster program).
All GEMMs of a layer (and their gradient GEMMs in training) are timed in one vmapped call per
kind (:func:`evaluate`): the tile search is traced once per layer.

Training (:func:`training_layer_times`) reuses the same kernels: backward GEMMs are the two
transposed products ``dX = dY·Wᵀ`` and ``dW = Xᵀ·dY`` (2× the forward GEMM work, timed as real
GEMM shapes by the tile search); backward softmax/layernorm/activation are memory-bound
elementwise kernels. Megatron fuses the QKV projection into one GEMM in training.

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import batching as _batching
from jaxmodel import ops as _ops
from jaxmodel import serving_runtime as _rtp
from jaxmodel.batching import batched
from jaxmodel.ops import attention as _attention
from jaxmodel.workload import moe as _moe
from jaxmodel.workload.ffn import Gemm, _elementwise, ffn_block  # noqa: F401
from jaxmodel.workload import params as _params
from jaxmodel.numerics import INF, first_reason
from jaxmodel.types import (Model, Parallelism, System, is_concrete, static_flag,
                            validate_args)
from jaxmodel import precisions as _prec
# the building blocks, the embedding / LM head / loss and the Megatron-LM 2021 kernels live
# in their own modules; their names stay importable from here
from jaxmodel.workload.blocks import (  # noqa: F401
    ANY, GemmFn, Shard, Variant, _gemm_entries, default_gemm, evaluate, evaluate_with,
    layer_checks, layer_feasibility,
    quantize_times, raise_if_invalid, shard, tp_collective, tp_syncs, variant_of,
    zero3_calls_flag)
from jaxmodel.workload.embedding import (embedding_single, embedding_times,  # noqa: F401
                                         fp32_cross_entropy)
from jaxmodel.workload.megatron2021 import grad_accumulation, megatron2021_kernels  # noqa: F401

#: The 12 per-op rows of LLMCompass's layer breakdown, in the order of its CSVs.
LAYER_OPS = ("qkv", "qk", "av", "wo", "w1", "w2", "softmax", "layernorm_mha",
             "layernorm_ffn", "act", "allreduce_mha", "allreduce_ffn")


def qkv_projection(sh: Shard, tokens, fused=False):
    """Q, K, V projection GEMMs of ``tokens`` rows.

    LLMCompass: three kernels ``[b·s, d]×[d, d/t]``; K and V follow ``h_kv`` (GQA).
    ``fused=True``: one kernel ``[b·s, d]×[d, (h/t + 2h_kv')·d_h]`` (Megatron's
    ``query_key_value`` ColumnParallelLinear, used in training).
    """
    if fused:
        n = (sh.heads + 2.0 * sh.kv_heads) * sh.head_dim
        return {"qkv": [(Gemm(tokens, n, sh.d_model), 1.0)]}
    return {"qkv": [(Gemm(tokens, sh.heads * sh.head_dim, sh.d_model), 1.0),
                    (Gemm(tokens, sh.kv_heads * sh.head_dim, sh.d_model), 2.0)]}


def mla_projections(model: Model, sh: Shard, tokens, absorbed=False):
    """Projection GEMMs of multi-head latent attention (DeepSeek-AI 2024, "DeepSeek-V2",
    §2.1.2–2.1.3), ``tokens`` rows, heads split over ``t`` and the down projections replicated
    (vLLM / SGLang layout):

    - ``qkv``: query down ``[T, d]×[d, d_c']`` and up ``[T, d_c']×[d_c', h/t·(d_h + d_h^R)]``
      (one ``[T, d]×[d, h/t·(d_h + d_h^R)]`` without query compression); joint KV down with
      the shared RoPE key ``[T, d]×[d, d_c + d_h^R]``; prefill/training: the key/value up
      projection ``[T, d_c]×[d_c, h/t·(d_h + d_v)]``; ``absorbed`` (decode, §2.1.2 "we can
      absorb W^UK into W^Q"): per head ``q_nope·W^UK`` ``[T, d_h]×[d_h, d_c]`` instead;
    - ``wo``: ``absorbed``: per head the latent output through ``W^UV`` ``[T, d_c]×[d_c,
      d_v]``; always ``[T, h/t·d_v]×[h/t·d_v, d]``.

    Dimensions are floored at 1 so that a non-MLA model traced through this branch (weight 0)
    stays finite.
    """
    one = lambda x: jnp.maximum(x, 1.0)                                    # noqa: E731
    d, heads = sh.d_model, sh.heads
    nope, rope = one(model.qk_nope_head_dim), one(model.qk_rope_head_dim)
    v, c, cq = one(model.v_head_dim), one(model.kv_lora_rank), one(model.q_lora_rank)
    has_q = jnp.where(model.q_lora_rank > 0, 1.0, 0.0)
    q_out = heads * (nope + rope)
    qkv = [(Gemm(tokens, cq, d), has_q), (Gemm(tokens, q_out, cq), has_q),
           (Gemm(tokens, q_out, d), 1.0 - has_q), (Gemm(tokens, c + rope, d), 1.0)]
    if absorbed:
        qkv.append((Gemm(tokens, c, nope, heads), 1.0))
        wo = [(Gemm(tokens, v, c, heads), 1.0)]
    else:
        qkv.append((Gemm(tokens, heads * (nope + v), c), 1.0))
        wo = []
    wo.append((Gemm(tokens, d, heads * v), 1.0))
    return {"qkv": qkv, "wo": wo}


def mla_core_shard(model: Model, sh: Shard, absorbed=False) -> Shard:
    """The :class:`Shard` the attention core of MLA sees: prefill/training as multi-head
    attention with ``d_h + d_h^R`` per head (values padded to it: ``d_v ≤ d_h + d_h^R``);
    ``absorbed`` (decode) as multi-query attention over the cached latent, one KV "head" of
    ``d_c + d_h^R`` shared by the ``h/t`` query heads."""
    qk = jnp.maximum(model.qk_nope_head_dim + model.qk_rope_head_dim, 1.0)
    if absorbed:
        one = jnp.ones_like(sh.heads)
        return sh._replace(kv_heads=one, group=sh.heads,
                           head_dim=jnp.maximum(model.kv_lora_rank, 1.0)
                           + model.qk_rope_head_dim)
    return sh._replace(kv_heads=sh.heads, group=jnp.ones_like(sh.heads), head_dim=qk)


class FlashChoice(NamedTuple):
    """Which attention kernel :func:`attention_core` times: ``code`` (``par.flash_attention``:
    0 standard, 1 FA-1, 2 FA-2; may be traced), ``static`` (:attr:`Variant.flash`) and
    ``share_kv`` (Flash-Decoding's shared KV heads)."""

    code: Any = 0.0
    static: bool | None = None
    share_kv: Any = True


def attention_core(dev, sh: Shard, batch, seq_len, kv_seq, dtype_bytes=2.0, backward=False,
                   kernel: FlashChoice = FlashChoice()):
    """Scores, softmax and weighted sum of standard (unfused) attention, or FlashAttention.

    Source: LLMCompass §III-C / notes §2: ``Q·Kᵀ`` and ``A·V`` as batched GEMMs (one product per
    sequence and KV head, the query group folded into M), softmax over ``[b·h/t·s, s_kv]``.
    Softmax backward ``dx = y·(dy − Σ dy·y)`` reads ``y, dy`` and writes ``dx`` (3 words,
    4 FLOP per element; memory-bound).
    ``kernel.code`` (``par.flash_attention``: 1 FA-1, 2 FA-2) replaces the three kernels by one
    fused kernel (:func:`jaxmodel.ops.flash_attention_latency`, Guo et al. eq. 1, causal), its
    time spread over the same rows (:func:`jaxmodel.ops.attention.flash_attention_rows`).
    ``kernel.static`` (:attr:`Variant.flash`): ``False`` traces the standard kernels only,
    ``True`` FlashAttention only, ``None`` both (selected per configuration).
    ``kernel.share_kv``: FlashAttention decode reads each KV head once for its query group
    (Flash-Decoding; :func:`jaxmodel.ops.attention.flash_attention_rows`), else once per
    query head.

    Returns:
        ``(gemm_rows, vector_rows)`` with rows ``qk``, ``av`` and ``softmax``.
    """
    flash, flash_static, share_kv = kernel
    nb = batch * sh.kv_heads
    m = seq_len * sh.group
    rows = batch * sh.heads * seq_len
    if flash_static is True:
        fa_rows = _attention.flash_attention_rows(dev, _attention.AttentionShape(
            batch, sh.heads, seq_len, kv_seq, sh.head_dim, sh.kv_heads), _attention.AttentionKernel(
            version=flash, dtype_bytes=dtype_bytes), backward, share_kv)
        return {}, dict(fa_rows)
    if flash_static is False:
        sm = _ops.softmax_latency.single(dev, rows, kv_seq, overhead=True)
        sm_b = (_elementwise(dev, rows * kv_seq, 3.0 * dtype_bytes, 4.0) if backward
                else jnp.zeros_like(sm))
        return ({"qk": [(Gemm(m, kv_seq, sh.head_dim, nb), 1.0)],
                 "av": [(Gemm(m, sh.head_dim, kv_seq, nb), 1.0)]}, {"softmax": (sm, sm_b)})
    fa = flash > 0.5
    std = jnp.where(fa, 0.0, 1.0)
    gemms = {"qk": [(Gemm(m, kv_seq, sh.head_dim, nb), std)],
             "av": [(Gemm(m, sh.head_dim, kv_seq, nb), std)]}
    sm = _ops.softmax_latency.single(dev, rows, kv_seq, overhead=True)
    sm_b = (_elementwise(dev, rows * kv_seq, 3.0 * dtype_bytes, 4.0) if backward
            else jnp.zeros_like(sm))
    fa_rows = _attention.flash_attention_rows(dev, _attention.AttentionShape(
        batch, sh.heads, seq_len, kv_seq, sh.head_dim, sh.kv_heads), _attention.AttentionKernel(
        version=flash, dtype_bytes=dtype_bytes), backward, share_kv)
    vectors = {"softmax": (jnp.where(fa, fa_rows["softmax"][0], sm),
                           jnp.where(fa, fa_rows["softmax"][1], sm_b))}
    for row in ("qk", "av"):
        vectors[row] = tuple(jnp.where(fa, x, 0.0) for x in fa_rows[row])
    return gemms, vectors


def output_projection(sh: Shard, tokens):
    """``W_o``: ``[b·s, h·d_h/t]×[h·d_h/t, d]`` (RowParallelLinear)."""
    return {"wo": [(Gemm(tokens, sh.d_model, sh.heads * sh.head_dim), 1.0)]}


def layernorm(dev, sh: Shard, par: Parallelism, tokens, dtype_bytes=2.0, backward=False,
              rms=False):
    """One layernorm over ``[tokens, d]`` (``tokens/t`` rows under sequence parallelism), s.

    LLMCompass LayerNorm kernel (notes §2), or RMSNorm where ``rms`` (Llama family,
    :func:`jaxmodel.ops.rmsnorm_latency`); SP shards it (Korthikanti et al. 2022 §4.2.2).
    Backward: reads ``x, dy``, writes ``dx`` (3 words, ~10 FLOP per element), memory-bound.

    Returns:
        ``(fwd_s, bwd_s)``.
    """
    rows = jnp.where(par.sp > 0.5, tokens / sh.tp, tokens)
    fwd = jnp.where(rms, _ops.rmsnorm_latency.single(dev, rows, sh.d_model, dtype_bytes,
                                                     overhead=True),
                    _ops.layernorm_latency.single(dev, rows, sh.d_model, overhead=True))
    bwd = (_elementwise(dev, rows * sh.d_model, 3.0 * dtype_bytes, 10.0) if backward
           else jnp.zeros_like(fwd))
    return fwd, bwd



class GraphOptions(NamedTuple):
    """The keywords of :func:`layer_graph` beyond the layer's shape and ``training``: the
    static :class:`Variant`, the precision (a :class:`jaxmodel.Precision` or a preset name;
    the legacy ``dtype_bytes`` sets its byte fields, :func:`jaxmodel.precisions.resolve`),
    the attention word ``attn_word`` (bytes), MLA's static ``mla_absorbed`` and the serving
    ``runtime``."""

    variant: Variant = ANY
    precision: Any = None
    dtype_bytes: Any = None
    attn_word: Any = None
    mla_absorbed: bool = False
    runtime: Any = None


def layer_graph(dev, model: Model, par: Parallelism, batch, seq_len, kv_seq, training=False,
                **options):
    """All compute rows of one layer: ``(gemm_rows, vector_rows)`` (see :func:`evaluate`).

    ``batch`` sequences of ``seq_len`` new tokens against ``kv_seq`` keys each; ``options``:
    the fields of :class:`GraphOptions` (an unknown keyword raises ``TypeError``).
    ``training`` fuses the QKV GEMM (Megatron) and times the backward vector kernels.
    ``variant`` (static) drops the FlashAttention / MoE / MLA / window branches a
    configuration cannot use. MLA (:func:`mla_projections`, :func:`mla_core_shard`) runs its
    absorbed decode form when ``mla_absorbed`` (static; :func:`layer_times` sets it for
    ``phase="decode"``). Sliding-window layers (``model.sliding_window``) attend
    ``min(kv_seq, window)`` keys; the layer averages local and global attention by their share.
    Vector kernels move ``precision.act_bytes`` per element; FlashAttention runs at the
    ``attn_dtype`` rate on ``attn_word`` bytes (default ``act_bytes``).
    ``runtime`` (a :class:`jaxmodel.serving_runtime.Runtime`, serving only; None = eager, as
    LLMCompass) applies its fusions: ``fuse_norm`` times each norm as one streaming kernel
    (:func:`jaxmodel.ops.rmsnorm_latency`'s bandwidth model), ``fuse_act`` drops the ``act``
    kernel (GEMM epilogue), ``fuse_rope`` drops the RoPE kernel (QKV epilogue); its
    ``attention`` 2 or, on chunked-attention layers (``model.attention_chunk``),
    ``chunked_attention`` runs decode attention by the per-query-head kernel.
    """
    variant, precision, dtype_bytes, attn_word, mla_absorbed, runtime = GraphOptions(**options)
    prec = _prec.resolve(precision, dtype_bytes)
    dtype_bytes = prec.act_bytes
    attn_word = dtype_bytes if attn_word is None else attn_word
    sh = shard(model, par)
    tokens = batch * seq_len
    # MLA decodes through the absorbed latent (DeepSeek-V2 §2.1.2); prefill and training use
    # the explicit per-head keys and values.
    absorbed = bool(mla_absorbed) and not training
    is_mla = model.attention > 0.5
    if variant.mla is None:
        core_sh = Shard(*[jnp.where(is_mla, a, b) for a, b in
                          zip(mla_core_shard(model, sh, absorbed), sh)])
    else:
        core_sh = mla_core_shard(model, sh, absorbed) if variant.mla else sh
    adev = _prec.scaled_device(dev, prec.attn_dtype)
    share_kv = True if runtime is None else runtime.attention < 1.5
    kernel = FlashChoice(par.flash_attention, variant.flash, share_kv)
    core_g, core_v = attention_core(adev, core_sh, batch, seq_len, kv_seq, attn_word,
                                    training, kernel)
    if variant.window is not False:
        # local (sliding-window) layers attend min(kv, window) keys: the average layer mixes
        # both cores by the share of local layers
        share = _params.n_local_layers(model) / jnp.maximum(model.n_layers, 1.0)
        # chunked local layers under a runtime whose GQA decode kernel rejects chunks
        # (Runtime.chunked_attention): the per-query-head kernel there
        share_win = share_kv if runtime is None else share_kv & ~(
            (runtime.chunked_attention > 0.5) & (model.attention_chunk > 0))
        win_g, win_v = attention_core(adev, core_sh, batch, seq_len,
                                      _params.attended_keys(model, kv_seq, True), attn_word,
                                      training, FlashChoice(par.flash_attention, variant.flash,
                                                            share_win))
        core_g = {row: [(g, (1.0 - share) * c) for g, c in core_g[row]]
                  + [(g, share * c) for g, c in win_g[row]] for row in core_g}
        core_v = {row: tuple((1.0 - share) * a + share * b
                             for a, b in zip(core_v[row], win_v[row])) for row in core_v}
    if variant.moe is False:
        ffn_g, ffn_v = ffn_block(dev, model, sh, tokens, dtype_bytes, training)
        zero = jnp.zeros_like(ffn_v["act"][0])
        ffn_v = {**ffn_v, "moe_router": (zero, zero)}
    else:
        # dense FFN, or the share-weighted mix with the MoE FFN (dropless when serving)
        ffn_g, ffn_v = _moe.ffn_rows(dev, model, par, sh, tokens, dtype_bytes, training,
                                     _moe.ExpertDispatch(dropless=not training))
    # RMSNorm and rotary embeddings: the gated-FFN (Llama / Gemma / Qwen / Mistral) families
    llama = model.is_gated > 0.5
    ln = layernorm(dev, sh, par, tokens, dtype_bytes, training, rms=llama)
    gqa = {**qkv_projection(sh, tokens, fused=training), **output_projection(sh, tokens)}
    if variant.mla is None:
        mla = mla_projections(model, sh, tokens, absorbed)
        w = jnp.where(is_mla, 1.0, 0.0)
        proj = {row: [(g, (1.0 - w) * c) for g, c in gqa[row]]
                + [(g, w * c) for g, c in mla[row]] for row in gqa}
    else:
        proj = mla_projections(model, sh, tokens, absorbed) if variant.mla else gqa
    gemms = {**proj, **core_g, **ffn_g}
    # RoPE rotates q and k right after the QKV projection: timed in the ``qkv`` row; its
    # backward is the inverse rotation of dq and dk, the same kernel.
    rope = jnp.where(llama, _ops.rope_latency.single(dev, tokens, sh.heads, sh.kv_heads,
                                                     sh.head_dim, dtype_bytes, overhead=True),
                     0.0)
    if runtime is not None:
        rt = runtime
        rows = jnp.where(par.sp > 0.5, tokens / sh.tp, tokens)
        fused_ln = _ops.rmsnorm_latency.single(dev, rows, sh.d_model, dtype_bytes,
                                               overhead=True)
        ln = (jnp.where(rt.fuse_norm > 0.5, fused_ln, ln[0]), ln[1])
        rope = jnp.where(rt.fuse_rope > 0.5, 0.0, rope)
        ffn_v = {**ffn_v, "act": (jnp.where(rt.fuse_act > 0.5, 0.0, ffn_v["act"][0]),
                                  ffn_v["act"][1])}
    vectors = {**core_v, **ffn_v, "layernorm_mha": ln, "layernorm_ffn": ln,
               "qkv": (rope, rope if training else jnp.zeros_like(rope))}
    return gemms, vectors


# --------------------------------------------------------------------------------------------
# inference layer
# --------------------------------------------------------------------------------------------
def runtime_inputs(dev, par: Parallelism, variant: Variant, rt, decode):
    """``(dev, par, variant)`` under serving runtime ``rt`` (a resolved
    :class:`jaxmodel.serving_runtime.Runtime`, not the eager default): the device with the
    per-kernel overheads the runtime charges (:func:`jaxmodel.serving_runtime.device_for`;
    ``decode`` may be traced), FlashAttention-2 where ``rt.attention`` asks for fused
    attention, and the matching static FlashAttention switch."""
    dev = _rtp.device_for(dev, rt, decode)
    fused = rt.attention > 0.5
    par = dataclasses.replace(par, flash_attention=jnp.where(fused, 2.0, par.flash_attention))
    on = static_flag(rt.attention, lambda a: a > 0.5)
    if on is True or variant.flash is True:
        variant = variant._replace(flash=True)
    elif on is None:
        variant = variant._replace(flash=None)
    return dev, par, variant


class Work(NamedTuple):
    """The workload of one inference layer: ``batch`` sequences of ``seq_len`` new tokens
    each in ``phase`` (``"prefill"`` or ``"decode"``, static) against ``kv_len`` cached
    tokens (counts)."""

    batch: Any
    seq_len: Any
    phase: str = "prefill"
    kv_len: Any = 0.0


class LayerOptions(NamedTuple):
    """How :func:`layer_times` times a layer: the GEMM function (None = the ops tile search),
    the precision (a :class:`jaxmodel.Precision` or a preset name; None = bf16), the static
    :class:`Variant`, the serving runtime (a :class:`jaxmodel.Runtime`, a preset name or
    None: eager) and the static GEMM shapes (:func:`static_gemm_shapes`, or None)."""

    gemm: Any = None
    precision: Any = None
    variant: Variant = ANY
    runtime: Any = None
    shapes: Any = None


def _inference_graph(system: System, model: Model, par: Parallelism, work: Work,
                     variant: Variant, prec, runtime):
    """``(dev, par, variant, gemm_rows, vector_rows)`` of one prefill or decode layer
    (:func:`layer_graph` under the serving runtime's inputs, :func:`runtime_inputs`)."""
    batch, seq_len, phase, kv_len = work
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase={phase!r} must be 'prefill' or 'decode'")
    dev = system.device
    kv_seq = seq_len if phase == "prefill" else kv_len + seq_len
    rt = _rtp.runtime(runtime)
    if _rtp.is_eager(rt):
        rt = None              # the eager (LLMCompass) graph, bit-identical to no runtime
    else:
        dev, par, variant = runtime_inputs(dev, par, variant, rt, kv_seq > seq_len)
    # serving: the attention products read Q, K, V in the KV cache's storage type
    gemms, vectors = layer_graph(dev, model, par, batch, seq_len, kv_seq, variant=variant,
                                 precision=prec, attn_word=prec.kv_bytes,
                                 mla_absorbed=phase == "decode", runtime=rt)
    return dev, par, variant, gemms, vectors



def _gemm_shape_table(system, model, par, work: Work, variant, precision, runtime):
    """``[G, 4]``: ``(m, n, k, batch)`` of every GEMM :func:`evaluate` times in one inference
    layer, in its order (batch 1 for the weight GEMMs)."""
    _, _, _, gemms, _ = _inference_graph(system, model, par, work, variant,
                                         _prec.resolve(precision), runtime)
    plain, multi = _gemm_entries(gemms, False)
    rows = [jnp.stack([jnp.asarray(x, dtype=jnp.result_type(float)) for x in
                       (g.m, g.n, g.k, 1.0 if g.batch is None else g.batch)])
            for _, _, _, g in plain + multi]
    return jnp.stack(rows) if rows else jnp.zeros((0, 4))


_shape_table = _batching.jit_leaves(_gemm_shape_table)


def static_gemm_shapes(system: System, model: Model, par: Parallelism, work: Work,
                       variant: Variant = ANY, precision=None, runtime=None):
    """The GEMM shapes of one inference layer (``work``: :class:`Work`) as static strings (``"m,n,k,batch"``, in
    :func:`evaluate`'s order) for a sweep over hardware: None unless the inputs they depend
    on (``model``, ``par``, ``batch``, ``seq_len``, ``kv_len``, ``runtime``) are concrete
    single values and ``system`` carries a batch axis (a single configuration keeps the
    shapes as numbers: its executable serves any model and compiles faster).

    Computed at the API edge by one small compiled call (the shapes do not depend on the
    hardware: ``system``'s numbers are replaced by 1) and passed to :func:`evaluate` as a
    static argument: each distinct GEMM is timed once, by a tile search pruned to its shape
    (exact: the same minimum), and GEMVs by their path alone. The shapes become part of the
    compilation key, so the numbers of another model compile again.
    """
    inputs = (model, par, work.batch, work.seq_len, work.kv_len, precision, runtime)
    leaves = [x for x in jax.tree_util.tree_leaves(inputs) if not _batching.is_static(x)]
    if not is_concrete(*inputs) or any(np.size(x) != 1 for x in leaves):
        return None
    if all(np.size(x) == 1 for x in jax.tree_util.tree_leaves(system)
           if not _batching.is_static(x)):
        return None
    unit = jax.tree_util.tree_map(lambda x: x if _batching.is_static(x) else 1.0, system)
    with jax.ensure_compile_time_eval():
        table = _shape_table(unit, model, par, work, variant, precision, runtime)
    if not is_concrete(table):
        return None
    return tuple(",".join(repr(float(v)) for v in row) for row in np.asarray(table))


def layer_times(system: System, model: Model, par: Parallelism, work: Work,
                opts: LayerOptions = LayerOptions()):
    """Single-configuration body of :func:`layer_breakdown` (use inside other formulas):
    the layer's ``work`` (:class:`Work`: batch, new tokens, phase, cached tokens) timed as
    ``opts`` says (:class:`LayerOptions`: GEMM function, precision, variant, runtime, static
    GEMM shapes)."""
    gemm = opts.gemm or default_gemm
    prec = _prec.resolve(opts.precision)
    dtype_bytes = prec.act_bytes
    batch, seq_len, _, kv_len = work
    dev, par, variant, gemms, vectors = _inference_graph(
        system, model, par, work, opts.variant, prec, opts.runtime)
    rows = evaluate(gemm, dev, gemms, vectors, precision=prec, attn_word=prec.kv_bytes,
                    shapes=opts.shapes)
    out = {k: v[0] for k, v in rows.items()}
    sync = tp_collective(system, par, batch * seq_len * model.d_model * dtype_bytes, variant)
    out["allreduce_mha"] = sync
    out["allreduce_ffn"] = (tp_syncs(model) - 1.0) * sync    # 0 for a parallel block
    out["moe_alltoall"] = (jnp.zeros_like(sync) if variant.moe is False else
                           _moe.alltoall_time(system, model, par, batch * seq_len, dtype_bytes,
                                              net=variant.net,
                                              dropless=True))
    ok, _ = first_reason(layer_checks(model, par)
                         + [((batch > 0) & (seq_len > 0) & (kv_len >= 0), "invalid_workload")])
    ok = ok & _prec.supported(dev, prec)
    keys = LAYER_OPS + _moe.MOE_OPS + (("quantize",) if "quantize" in out else ())
    out = {k: jnp.where(ok, out[k], INF) for k in keys}
    out["total"] = sum(out[k] for k in keys)
    return out


#: Points per chunk of :func:`layer_breakdown`'s batched call: the candidate loops of a chunk
#: stay in cache (4,096: ~8 % slower on a hardware sweep).
LAYER_CHUNK = 1024


_layer_breakdown = batched(layer_times, chunk=LAYER_CHUNK)


def layer_breakdown(system: System, model: Model, par: Parallelism, batch, seq_len,
                    phase: str = "prefill", kv_len=0, gemm: GemmFn | None = None,
                    dtype_bytes=None, precision=None, runtime=None):
    """Latency of one decoder layer on one device, per op (LLMCompass layer model), s.

    Source: LLMCompass §III-C, notes §2: every kernel serial with its per-kernel
    overhead, two TP all-reduces (reduce-scatter + all-gather under ``par.sp``). See the module
    docstring for the op shapes. ``phase="decode"`` means ``seq_len`` new tokens per sequence
    against ``kv_len`` cached ones.

    Args:
        system: the device and its network (``system.device`` runs the kernels).
        model: the transformer (GQA through ``n_kv_heads``; GELU/SwiGLU FFN).
        par: parallelism; only ``tp`` and ``sp`` matter for one layer.
        batch: sequences (``b``).
        seq_len: new tokens per sequence (``s``): the prompt in prefill, usually 1 in decode.
        phase: ``"prefill"`` or ``"decode"`` (static).
        kv_len: cached tokens per sequence in decode.
        gemm: optional GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s``
            (static; default: the ops tile search).
        dtype_bytes: legacy bytes per activation/weight/KV element (2 = fp16/bf16); sets
            those fields of ``precision`` (:func:`jaxmodel.precisions.resolve`).
        precision: a preset name (``"bf16"`` default, ``"fp8"``, ...) or a
            :class:`jaxmodel.Precision`; a device without a tensor-core rate for its compute
            dtypes gives ``+inf``.
        runtime: serving runtime, a preset name (``"pytorch"`` default: eager per-call
            overheads, as LLMCompass; ``"trtllm"``, ``"vllm"``) or a
            :class:`jaxmodel.Runtime` (:mod:`jaxmodel.serving_runtime`): kernel floors vs
            eager overheads, fusions, CUDA-graph decode, fused attention.

    Returns:
        dict op name → seconds with the 12 rows of :data:`LAYER_OPS`, a ``"quantize"`` row
        when the precision has cast kernels (FP8, FP4, INT8), the MoE rows of
        :data:`jaxmodel.workload.moe.MOE_OPS` (``moe_router``, ``moe_alltoall``; 0 for dense
        models) and ``"total"``; leading batch axes as in the inputs. Infeasible TP splits
        (and experts not dividing over ``ep``) give ``+inf``. ``par.flash_attention``
        selects FlashAttention (1 FA-1, 2 FA-2) for the attention core; MoE layers are
        averaged in by their share (:func:`jaxmodel.workload.moe.ffn_rows`).

    Raises:
        ValueError: concrete single configuration with heads not divisible by ``tp``, or
            non-integer / < 1 degrees.

    Example:
        >>> t = jm.layer_breakdown(hw_db.system("hgx_a100_4gpu"), hw_db.model("gpt3-175b"),
        ...                        jm.Parallelism(tp=4), 8, 2048)
        >>> float(t["total"])  # ~0.066 s
        0.066

    ``layer_breakdown.single`` is :func:`layer_times`, the single-configuration body: the
    layer's :class:`Work` timed as its :class:`LayerOptions` say.
    """
    raise_if_invalid(model, par)
    _raise_if_cp(par)
    validate_args(system, model, par, where="layer_breakdown")
    prec = _prec.resolve(precision, dtype_bytes)
    variant = variant_of(model, par, system)
    rt = _rtp.runtime_arg(runtime)
    work = Work(batch, seq_len, phase, kv_len)
    shapes = static_gemm_shapes(system, model, par, work, variant, prec, rt)
    return _layer_breakdown(system, model, par, work, LayerOptions(gemm, prec, variant, rt,
                                                                   shapes))


layer_breakdown.single = layer_times


def _raise_if_cp(par):
    """Raise ``ValueError`` for a concrete ``cp > 1`` in one prefill/decode layer: context
    parallelism is a training dimension (:func:`jaxmodel.parallel.context.cp_layer_times`)."""
    import numpy as np

    if is_concrete(par) and bool(np.any(np.asarray(par.cp) > 1.5)):
        raise ValueError(f"layer_breakdown: cp={par.cp}: context parallelism is modelled in "
                         "training only (train_step; jaxmodel.parallel.context."
                         "cp_layer_times for one layer)")


# --------------------------------------------------------------------------------------------
# training layer
# --------------------------------------------------------------------------------------------
def norm_upproj_rows(model: Model, par: Parallelism, tokens):
    """The MLA up-projection GEMMs DeepSeek-V3's recomputation repeats
    (:func:`norm_upproj_recompute`) as one forward-only GEMM row ``{"norm_upproj": [(Gemm,
    count), ...]}`` for ``tokens`` rows: the query up projection ``[T, d_c']×[d_c',
    h/t·(d_h + d_h^R)]`` (when the queries are compressed) and the key/value up projection
    ``[T, d_c]×[d_c, h/t·(d_h + d_v)]`` of :func:`mla_projections`, timed in the training
    layer's own GEMM call (:func:`jaxmodel.workload.blocks.evaluate_with`)."""
    qkv = mla_projections(model, shard(model, par), tokens)["qkv"]
    return {"norm_upproj": [qkv[1], qkv[4]]}       # query up, key/value up


def norm_upproj_recompute(gemm, dev, model: Model, par: Parallelism, tokens, rows,
                          precision=None, t_up=None):
    """Forward work DeepSeek-V3's recomputation repeats in one layer's backward, s.

    Source: DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §3.2.3 ("recomputing all
    RMSNorm operations and MLA up-projections during back-propagation") and §3.3.3 (the
    SwiGLU output recomputed from its cached input): the two layer norms (``rows``'
    ``layernorm_mha`` and ``layernorm_ffn`` forward times), the FFN activation (``act``) and
    the MLA up-projections (:func:`norm_upproj_rows`), timed by ``gemm`` in the precision's
    GEMM type — or ``t_up``, their seconds already timed with the layer's GEMMs. ``rows``:
    the layer's evaluated rows (:func:`evaluate`). The latent norms of MLA (``[T, d_c']``
    and ``[T, d_c]``, a few percent of the main ones) are not counted.
    """
    if t_up is None:
        _, up = evaluate_with(gemm or default_gemm, dev, {}, {}, precision=precision,
                              forward_rows=norm_upproj_rows(model, par, tokens))
        t_up = up["norm_upproj"]
    return (rows["layernorm_mha"][0] + rows["layernorm_ffn"][0] + rows["act"][0] + t_up)


def training_layer_single(system: System, model: Model, par: Parallelism, micro_batch, seq_len,
                          gemm: GemmFn | None = None, variant: Variant = ANY, precision=None):
    """Single-configuration body of :func:`training_layer_times` (``precision``: a
    :class:`jaxmodel.Precision` or a preset name; the legacy ``dtype_bytes`` is resolved at
    the API edge)."""
    gemm = gemm or default_gemm
    dev = system.device
    prec = _prec.resolve(precision)
    dtype_bytes = prec.act_bytes
    gemms, vectors = layer_graph(dev, model, par, micro_batch, seq_len, seq_len,
                                 training=True, variant=variant, precision=prec)
    rows, up = evaluate_with(gemm, dev, gemms, vectors, backward=True, precision=prec,
                             forward_rows=norm_upproj_rows(model, par, micro_batch * seq_len))
    fwd = sum(f for f, _ in rows.values())
    bwd = sum(b for _, b in rows.values())
    # FlashAttention stores no scores: nothing to recompute selectively (its backward
    # recomputes them, already in bwd)
    attn_core_fwd = jnp.where(par.flash_attention > 0.5, 0.0,
                              rows["qk"][0] + rows["softmax"][0] + rows["av"][0])
    sync = tp_collective(system, par, micro_batch * seq_len * model.d_model * dtype_bytes,
                         variant)
    comm_fwd = tp_syncs(model) * sync
    comm_bwd = comm_fwd
    a2a, a2a_b = ((0.0 * sync, 0.0 * sync) if variant.moe is False else
                  _moe.alltoall_times(system, model, par, micro_batch * seq_len, dtype_bytes,
                                      net=variant.net, dispatch_bytes=prec.gemm_bytes))
    rc = par.recompute
    recompute = jnp.select([rc < 0.5, rc < 1.5, rc < 2.5],
                           [jnp.zeros_like(fwd), attn_core_fwd, fwd + comm_fwd + a2a],
                           norm_upproj_recompute(gemm, dev, model, par, micro_batch * seq_len,
                                                 rows, prec, up["norm_upproj"]))
    out = {"fwd": fwd, "bwd": bwd, "recompute": recompute, "tp_comm_fwd": comm_fwd,
           "tp_comm_bwd": comm_bwd, "ep_comm_fwd": a2a, "ep_comm_bwd": a2a_b}
    ok, _ = layer_feasibility(model, par)
    ok = ok & _prec.supported(dev, prec)
    return {k: jnp.where(ok, v, INF) for k, v in out.items()}


@batched
def _training_layer_times(system, model, par, micro_batch, seq_len, gemm, precision,
                          variant):
    return training_layer_single(system, model, par, micro_batch, seq_len, gemm,
                                 variant=variant, precision=precision)


def training_layer_times(system: System, model: Model, par: Parallelism, micro_batch, seq_len,
                         gemm: GemmFn | None = None, dtype_bytes=None, precision=None):
    """Per-layer, per-micro-batch, per-device training times (s).

    Source: Guo et al. §III (Optimus training graph); Narayanan et al. 2021 Appendix (backward =
    2× forward GEMM work); Korthikanti et al. 2022 §4.2 (TP/SP communication, §5 selective
    recomputation); LLMCompass kernels for every op.

    Returns:
        dict with
        ``fwd`` — forward compute (fused QKV, attention core, ``W_o``, FFN, 2 layernorms);
        ``bwd`` — backward compute: input- and weight-gradient GEMMs of every product,
        memory-bound backward softmax / layernorm / activation;
        ``recompute`` — extra forward work per ``par.recompute``: none = 0, selective = the
        attention core (``QKᵀ``, softmax, ``AV``), full = the whole forward incl. its TP
        collectives;
        ``tp_comm_fwd`` / ``tp_comm_bwd`` — 2 all-reduces each (SP: 2 × (reduce-scatter +
        all-gather)), 1 for a parallel attention + MLP block (:func:`tp_syncs`), not
        overlapped;
        ``ep_comm_fwd`` / ``ep_comm_bwd`` — MoE dispatch + combine all-to-all over ``ep``
        (share-weighted, 0 for dense models or ``ep = 1``; :func:`jaxmodel.workload.moe.
        alltoall_time`); full recomputation repeats the forward one.
        With FlashAttention, selective recomputation has nothing to recompute (0).
        Infeasible TP splits give ``+inf``.

    Args:
        gemm: optional static GEMM function ``(dev, m, n, k, batch, dtype_bytes) -> s`` that
            the parallelism search may substitute with a precomputed lookup.

    Example:
        >>> t = jm.training_layer_times(hw_db.system("hgx_a100_4gpu"), hw_db.model("gpt3-13b"),
        ...                             jm.Parallelism(tp=4), 1, 2048)
    """
    raise_if_invalid(model, par)
    return _training_layer_times(system, model, par, micro_batch, seq_len, gemm,
                                 _prec.resolve(precision, dtype_bytes),
                                 variant_of(model, par, system))


training_layer_times.single = training_layer_single
