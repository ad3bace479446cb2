"""Parameter counts and model FLOPs of a decoder-only transformer.

Counts follow the op graph of :mod:`jaxmodel.workload.layer`: per layer the attention
projections (Q/K/V/O with K and V following ``n_kv_heads``, grouped-query attention; or the
low-rank projections of multi-head latent attention), optional Q/K/V biases (Qwen2, GPT-OSS),
the FFN matrices (2 for GELU / ReLU / squared ReLU, 3 for SwiGLU / GeGLU; on MoE layers
``n_experts`` routed plus ``n_shared_experts`` shared experts of width ``moe_d_ff`` and a
router), two layernorms (gain and bias); plus the token embedding, an LM head unless tied, and
the final layernorm. Other biases and learned position embeddings are left out (< 0.01 % of
GPT-3 175B). Multi-token-prediction modules are counted only when asked (``mtp=True``): the
published totals of DeepSeek-V3 (671 B) exclude them. FLOPs follow Narayanan et al. 2021
(Megatron-LM, SC'21) eq. 3 and its derivation in their Appendix.

Active parameters (``param_count(model, active=True)``): the weights one token's forward pass
multiplies with — every layer's attention, dense FFNs, the ``top_k`` routed and all shared
experts and the router of MoE layers, the LM head; the input embedding is a row lookup and is
not counted unless tied to the head (the convention of OpenAI's gpt-oss model card and of
DeepSeek-AI's V2 report; Mistral AI and Qwen quote active counts that include it).

Units: parameters (count), FLOP.

Example:
    >>> import hw_db, jaxmodel as jm
    >>> float(jm.param_count(hw_db.model("gpt3-175b"))) / 1e9   # ~174.6 (billion)
    1.75e+02
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.parallel.pipeline import stage_layers
from jaxmodel.types import Model, Parallelism


def _mla_params(model: Model):
    """Weights of one MLA block (DeepSeek-AI 2024, "DeepSeek-V2", §2.1.2–2.1.3, eqs. 9–19),
    count: query down/up projections ``d·d_c' + d_c'·h·(d_h + d_h^R)`` (or ``d·h·(d_h +
    d_h^R)`` without query compression) with a norm of ``d_c'``; the joint KV down projection
    and the shared RoPE key ``d·(d_c + d_h^R)``, a norm of ``d_c``, the key/value up projection
    ``d_c·h·(d_h + d_v)``; the output ``h·d_v·d``."""
    d, h = model.d_model, model.n_heads
    q_in = h * (model.qk_nope_head_dim + model.qk_rope_head_dim)
    qr = model.q_lora_rank
    q = jnp.where(qr > 0, d * qr + qr + qr * q_in, d * q_in)
    kv = (d * (model.kv_lora_rank + model.qk_rope_head_dim) + model.kv_lora_rank
          + model.kv_lora_rank * h * (model.qk_nope_head_dim + model.v_head_dim))
    return q + kv + h * model.v_head_dim * d


def attention_params(model: Model):
    """Weights of one attention block (count).

    GQA/MHA/MQA: ``d·(h + 2·h_kv)·d_h + h·d_h·d`` (Vaswani et al. 2017 §3.2; GQA, Ainslie et al.
    2023, shares K/V over query groups; GPT-3 with ``h·d_h = d``, ``h_kv = h``: ``4·d²``), plus
    ``(h + 2·h_kv)·d_h`` Q/K/V biases when ``qkv_bias``. MLA: :func:`_mla_params`.
    """
    d_attn = model.n_heads * model.head_dim
    d_kv = model.n_kv_heads * model.head_dim
    gqa = (model.d_model * (d_attn + 2.0 * d_kv) + d_attn * model.d_model
           + model.qkv_bias * (d_attn + 2.0 * d_kv))
    return jnp.where(model.is_mla, _mla_params(model), gqa)


def ffn_params(model: Model):
    """Weights of one dense FFN: ``ffn_matrices · d · d_ff`` (count).

    2 matrices for GELU (GPT: ``8·d²`` with ``d_ff = 4d``), ReLU and squared ReLU (So et al.
    2021, "Primer"; Nemotron), 3 for SwiGLU and GeGLU (Shazeer 2020).
    """
    return model.ffn_matrices * model.d_model * model.d_ff


def expert_params(model: Model):
    """Weights of one routed or shared expert: ``ffn_matrices · d · moe_d_ff`` (count)."""
    return model.ffn_matrices * model.d_model * model.expert_d_ff


def n_moe_layers(model: Model):
    """Number of MoE layers: every ``moe_every``-th of the layers after the ``first_k_dense``
    dense ones when ``n_experts > 1`` (HF ``decoder_sparse_step``, DeepSeek's
    ``first_k_dense_replace`` and ``moe_layer_freq``), else 0."""
    every = jnp.maximum(model.moe_every, 1.0)
    sparse = jnp.maximum(model.n_layers - model.first_k_dense, 0.0)
    return jnp.where(model.n_experts > 1, jnp.floor(sparse / every + 1e-9), 0.0)


def moe_ffn_params(model: Model, active: bool = False):
    """Weights of the FFN of one MoE layer (count): ``n_experts`` routed (``top_k`` of them
    when ``active``) and ``n_shared_experts`` shared experts (DeepSeekMoE, Dai et al. 2024
    §3.2) of :func:`expert_params` each, and the router ``d × n_experts``."""
    routed = model.top_k if active else model.n_experts
    return ((routed + model.n_shared_experts) * expert_params(model)
            + model.d_model * model.n_experts)


def layer_params(model: Model, moe: bool = False, active: bool = False):
    """Weights of one decoder layer (count), dense (``moe=False``) or MoE (experts + router;
    ``active``: the ``top_k`` routed experts only).

    Layernorms: 2 × (gain + bias) of size ``d``.
    """
    ffn = moe_ffn_params(model, active) if moe else ffn_params(model)
    return attention_params(model) + ffn + 4.0 * model.d_model


def embedding_params(model: Model, active: bool = False):
    """Token embedding + LM head (unless tied) + final layernorm (count); ``active``: the head
    and the final layernorm only (the embedding is a lookup)."""
    emb = model.vocab_size * model.d_model
    n = 1.0 if active else 2.0 - model.tied_embeddings
    return emb * n + 2.0 * model.d_model


def mtp_params(model: Model, active: bool = False):
    """Weights of the multi-token-prediction modules (count): per module a projection
    ``[2d, d]``, three RMSNorms of ``d`` and one decoder layer (MoE when the model is); the
    embedding and the output head are shared with the main model (DeepSeek-AI 2024,
    "DeepSeek-V3 Technical Report", §2.2)."""
    layer = jnp.where(model.n_experts > 1, layer_params(model, moe=True, active=active),
                      layer_params(model))
    return model.n_mtp_layers * (2.0 * model.d_model ** 2 + 3.0 * model.d_model + layer)


@batched
def param_count(model: Model, active: bool = False, mtp: bool = False):
    """Total (or, ``active=True``, per-token) parameters of ``model`` (count).

    Sum of :func:`layer_params` over dense and MoE layers plus :func:`embedding_params`
    (and :func:`mtp_params` when ``mtp``). Megatron (Narayanan et al. 2021 §5.1):
    ``P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12lh))``; this omits biases and position embeddings
    and counts an untied head twice. Active: see the module docstring.

    Example:
        >>> float(param_count(hw_db.model("llama2-7b"))) / 1e9   # ~6.74
        6.74
    """
    n_moe = n_moe_layers(model)
    dense = (model.n_layers - n_moe) * layer_params(model)
    sparse = n_moe * layer_params(model, moe=True, active=active)
    extra = mtp_params(model, active) if mtp else 0.0
    return dense + sparse + embedding_params(model, active) + extra


def _sanitised_degrees(par: Parallelism):
    tp = jnp.maximum(par.tp, 1.0)
    pp = jnp.maximum(par.pp, 1.0)
    ep = jnp.maximum(par.ep, 1.0)
    return tp, pp, ep


def expert_tp(par: Parallelism):
    """Expert tensor-parallel degree ``etp`` and the TP ranks the EP group folds over ``ept``.

    Megatron-core (megatron/core/parallel_state.py, ``initialize_model_parallel``, core_r0.9+)
    builds the expert groups on the same ranks as the attention's ``TP × DP`` (per pipeline
    stage): ``ETP × EP × EDP = TP × DP`` with ``expert_tensor_parallel_size``. With
    ``ep ≤ dp`` the EP group is drawn from data-parallel ranks (DeepSpeed-TED, Singh et al.
    ICS 2023 eq. 2) and ``etp = tp``; with ``ep > dp`` (serving: vLLM
    ``--enable-expert-parallel`` gives EP = TP × DP, SGLang ``--ep-size``, TensorRT-LLM
    ``moe_expert_parallel_size`` with ``moe_tensor_parallel_size``) it also spans
    ``ept = ep/dp`` ranks of each TP group and the experts keep ``etp = tp/ept``-way tensor
    parallelism. Dimensionless; ``etp·ept = tp``.
    """
    tp, _, ep = _sanitised_degrees(par)
    dp = jnp.maximum(par.dp, 1.0)
    ept = jnp.clip(ep / dp, 1.0, tp)
    return tp / ept, ept


def stage_params(model: Model, par: Parallelism, mtp: bool = True):
    """Parameters on one device of the first, the most loaded and the last pipeline stage
    (counts, a tuple of three).

    Megatron layout (Shoeybi et al. 2019; Narayanan et al. 2021): layer weights are split over
    ``tp`` (layernorm weights replicated) and over the stage's layers
    (:func:`jaxmodel.parallel.pipeline.stage_layers`: ``⌊L/p⌋`` or ``⌈L/p⌉`` per stage, the
    lighter ones at the ends); each stage holds the average layer (dense and MoE layers in
    their model-wide proportion); expert weights additionally over ``ep`` (DeepSpeed-TED,
    Guo et al. §III-C eq. 2). The vocabulary embedding is split over ``tp`` and lives on the
    first stage, the LM head and the final layernorm on the last (a tied head is duplicated
    there when ``pp > 1``, as Megatron does), with the multi-token-prediction modules
    (:func:`mtp_params`, trained with the model, loaded for serving only with speculative
    decoding: ``mtp=False``). With ``pp = 1`` the one stage holds everything. Shared experts
    are split over ``tp`` like a dense FFN, routed ones over ``ep·etp`` (:func:`expert_tp`). ZeRO sharding over
    ``dp`` is applied in :mod:`jaxmodel.workload.memory`, not here.
    """
    tp, pp, ep = _sanitised_degrees(par)
    etp = expert_tp(par)[0]
    n_moe = n_moe_layers(model)
    dense_layer = (attention_params(model) + ffn_params(model)) / tp + 4.0 * model.d_model
    moe_layer = (attention_params(model) / tp + 4.0 * model.d_model
                 + model.n_experts * expert_params(model) / (ep * etp)
                 + model.n_shared_experts * expert_params(model) / tp
                 + model.d_model * model.n_experts)
    avg_layer = ((model.n_layers - n_moe) * dense_layer + n_moe * moe_layer) / jnp.maximum(
        model.n_layers, 1.0)
    first, most, last = stage_layers(model.n_layers, pp)
    emb = model.vocab_size * model.d_model / tp
    mtp_layer = jnp.where(model.n_experts > 1, moe_layer, dense_layer)
    mtp_w = model.n_mtp_layers * (2.0 * model.d_model ** 2 / tp + 3.0 * model.d_model
                                  + mtp_layer) if mtp else 0.0
    head = emb + 2.0 * model.d_model + mtp_w
    single = pp < 1.5
    # pp = 1: the one stage holds the embedding and (if untied) the head
    p_first = first * avg_layer + jnp.where(single, (1.0 - model.tied_embeddings) * emb
                                            + head, emb)
    p_last = last * avg_layer + head
    p_most = jnp.where(single, p_first, most * avg_layer)
    return p_first, p_most, jnp.where(single, p_first, p_last)


@batched
def params_per_device(model: Model, par: Parallelism, mtp: bool = True):
    """Parameters held by the most loaded device under TP/PP/EP (count): the largest of
    :func:`stage_params` (see there for the layout).

    Example:
        >>> p = params_per_device(hw_db.model("gpt3-175b"), jm.Parallelism(tp=8, pp=8))
    """
    first, most, last = stage_params(model, par, mtp)
    return jnp.maximum(jnp.maximum(first, most), last)


def attention_flops_per_token(model: Model, seq_len):
    """Forward FLOP per token of one layer's score and weighted-sum GEMMs over ``seq_len``
    keys: ``2·s·h·(d_qk + d_v)`` (``4·s·h·d_h`` for MHA/GQA; MLA: ``d_qk = d_h + d_h^R``,
    ``d_v`` = ``v_head_dim``, the non-absorbed form of DeepSeek-V2 §2.1)."""
    d_qk = jnp.where(model.is_mla, model.qk_nope_head_dim + model.qk_rope_head_dim,
                     model.head_dim)
    d_v = jnp.where(model.is_mla, model.v_head_dim, model.head_dim)
    return 2.0 * seq_len * model.n_heads * (d_qk + d_v)


def n_local_layers(model: Model):
    """Layers attending within ``sliding_window`` (count): all layers when ``global_every``
    is 0, else all but every ``global_every``-th; 0 without a window (Beltagy et al. 2020,
    "Longformer"; Jiang et al. 2023, "Mistral 7B" §2; Gemma Team 2024, "Gemma 2" §2)."""
    every = jnp.maximum(model.global_every, 1.0)
    n_global = jnp.where(model.global_every > 0, jnp.floor(model.n_layers / every + 1e-9), 0.0)
    return jnp.where(model.sliding_window > 0, model.n_layers - n_global, 0.0)


def attended_keys(model: Model, seq_len, local):
    """Keys each query attends to: ``seq_len``, or ``min(seq_len, sliding_window)`` on a local
    layer (``local`` True/False or a 0/1 array)."""
    win = jnp.where(model.sliding_window > 0, jnp.minimum(seq_len, model.sliding_window),
                    seq_len)
    return jnp.where(local, win, seq_len)


def layer_forward_flops_per_token(model: Model, seq_len, moe: bool = False, local=False):
    """Forward FLOP per token of one layer: ``2 × matmul weights + 4·s·h·d_h`` (attention).

    Source: Narayanan et al. 2021 Appendix (``24·B·s·h² + 4·B·s²·h`` per layer for GPT). The
    attention term counts the full ``s × s`` score matrix as Megatron does (no causal saving);
    on a local (sliding-window) layer ``s`` keys become ``min(s, window)``
    (:func:`attention_flops_per_token`). MoE layers count ``top_k`` routed experts, the shared
    experts and the router GEMM (:func:`moe_ffn_params` with ``active``).
    """
    ffn = moe_ffn_params(model, active=True) if moe else ffn_params(model)
    matmul = attention_params(model) + ffn
    return 2.0 * matmul + attention_flops_per_token(model, attended_keys(model, seq_len, local))


@batched
def model_flops_per_token(model: Model, seq_len, include_recompute: bool = False):
    """Training FLOP per token (forward + backward) for MFU, FLOP.

    Source: Narayanan et al. 2021 eq. 3: ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` per
    iteration *with* full activation recomputation (the forward of every layer runs twice:
    4 passes over the layers, 3 over the LM head). ``include_recompute=False`` (default) gives
    the model FLOPs of PaLM's MFU: 3 passes everywhere, ``72·B·s·l·h²·(1 + s/(6h) +
    V/(12·l·h))``. Per token means divided by ``B·s``. Generalised here to GQA, MLA, SwiGLU,
    GeGLU, sliding windows, MoE with shared experts and dense first layers through
    :func:`layer_forward_flops_per_token`; multi-token-prediction modules (DeepSeek-V3 §2.2)
    add per module one layer, the ``[2d, d]`` projection and one more pass through the LM head.

    Example:
        >>> f = model_flops_per_token(hw_db.model("gpt3-175b"), 2048, include_recompute=True)
    """
    n_moe = n_moe_layers(model)
    n_dense = model.n_layers - n_moe
    # local layers are spread over dense and MoE layers in proportion
    local_share = n_local_layers(model) / jnp.maximum(model.n_layers, 1.0)

    def layer(moe):
        return (local_share * layer_forward_flops_per_token(model, seq_len, moe, True)
                + (1.0 - local_share) * layer_forward_flops_per_token(model, seq_len, moe))

    layers = n_dense * layer(False) + n_moe * layer(True)
    mtp_layer = jnp.where(model.n_experts > 1, layer(True), layer(False))
    layers = layers + model.n_mtp_layers * (mtp_layer + 2.0 * 2.0 * model.d_model ** 2)
    head = 2.0 * model.d_model * model.vocab_size * (1.0 + model.n_mtp_layers)
    passes = 4.0 if include_recompute else 3.0
    return passes * layers + 3.0 * head
