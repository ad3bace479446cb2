"""Parameter counts and model FLOPs of a decoder-only transformer.

Counts follow the op graph of :mod:`jaxmodel.workload.layer`: per layer the Q/K/V/O projections
(K and V follow ``n_kv_heads``, grouped-query attention), the FFN matrices (2 for GELU, 3 for
SwiGLU; ``n_experts`` copies plus a router on MoE layers), two layernorms (gain and bias); plus
the token embedding, an LM head unless tied, and the final layernorm. Biases of the linear layers
and learned position embeddings are left out (< 0.01 % of GPT-3 175B). FLOPs follow Narayanan et
al. 2021 (Megatron-LM, SC'21) eq. 3 and its derivation in their Appendix.

Units: parameters (count), FLOP.

Example:
    >>> import hw_db, jaxmodel as jm
    >>> float(jm.param_count(hw_db.model("gpt3-175b"))) / 1e9   # ~174.6 (billion)
    1.75e+02
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.types import Model, Parallelism


def attention_params(model: Model):
    """Weights of one attention block: ``d·(h + 2·h_kv)·d_h + h·d_h·d`` (count).

    Source: Vaswani et al. 2017 §3.2; GQA (Ainslie et al. 2023) shares K/V over query groups.
    For GPT-3 (``h·d_h = d``, ``h_kv = h``) this is ``4·d²``.
    """
    d_attn = model.n_heads * model.head_dim
    d_kv = model.n_kv_heads * model.head_dim
    return model.d_model * (d_attn + 2.0 * d_kv) + d_attn * model.d_model


def ffn_params(model: Model):
    """Weights of one dense FFN (one expert): ``ffn_matrices · d · d_ff`` (count).

    2 matrices for GELU (GPT: ``8·d²`` with ``d_ff = 4d``), 3 for SwiGLU (Shazeer 2020).
    """
    return model.ffn_matrices * model.d_model * model.d_ff


def n_moe_layers(model: Model):
    """Number of MoE layers: every ``moe_every``-th layer when ``n_experts > 1`` (HF
    ``decoder_sparse_step``), else 0."""
    every = jnp.maximum(model.moe_every, 1.0)
    return jnp.where(model.n_experts > 1, jnp.floor(model.n_layers / every + 1e-9), 0.0)


def layer_params(model: Model, moe: bool = False):
    """Weights of one decoder layer (count), dense (``moe=False``) or MoE (all experts + router).

    Layernorms: 2 × (gain + bias) of size ``d``.
    """
    ffn = ffn_params(model)
    if moe:
        ffn = model.n_experts * ffn + model.d_model * model.n_experts
    return attention_params(model) + ffn + 4.0 * model.d_model


def embedding_params(model: Model):
    """Token embedding + LM head (unless tied) + final layernorm (count)."""
    emb = model.vocab_size * model.d_model
    return emb * (2.0 - model.tied_embeddings) + 2.0 * model.d_model


@batched
def param_count(model: Model):
    """Total parameters of ``model`` (count).

    Sum of :func:`layer_params` over dense and MoE layers plus :func:`embedding_params`.
    Megatron (Narayanan et al. 2021 §5.1): ``P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12lh))``; this
    omits biases and position embeddings and counts an untied head twice.

    Example:
        >>> float(param_count(hw_db.model("llama2-7b"))) / 1e9   # ~6.74
        6.74
    """
    n_moe = n_moe_layers(model)
    dense = (model.n_layers - n_moe) * layer_params(model)
    sparse = n_moe * layer_params(model, moe=True)
    return dense + sparse + embedding_params(model)


def _sanitised_degrees(par: Parallelism):
    tp = jnp.maximum(par.tp, 1.0)
    pp = jnp.maximum(par.pp, 1.0)
    ep = jnp.maximum(par.ep, 1.0)
    return tp, pp, ep


@batched
def params_per_device(model: Model, par: Parallelism):
    """Parameters held by the most loaded device under TP/PP/EP (count).

    Megatron layout (Shoeybi et al. 2019; Narayanan et al. 2021): layer weights are split over
    ``tp`` (layernorm weights replicated) and the ``n_layers/pp`` layers of a stage; expert
    weights additionally over ``ep`` (DeepSpeed-TED, Guo et al. §III-C eq. 2). The vocabulary
    embedding is split over ``tp`` and lives on the first stage, the LM head on the last
    (a tied head is duplicated there when ``pp > 1``, as Megatron does). The maximum over stages
    is returned: stage layers plus one embedding-sized matrix, or both when ``pp = 1`` and untied.
    ZeRO sharding over ``dp`` is applied in :mod:`jaxmodel.workload.memory`, not here.

    Example:
        >>> p = params_per_device(hw_db.model("gpt3-175b"), jm.Parallelism(tp=8, pp=8))
    """
    tp, pp, ep = _sanitised_degrees(par)
    n_moe = n_moe_layers(model)
    dense_layer = (attention_params(model) + ffn_params(model)) / tp + 4.0 * model.d_model
    moe_layer = (attention_params(model) / tp + 4.0 * model.d_model
                 + model.n_experts * ffn_params(model) / (ep * tp)
                 + model.d_model * model.n_experts)
    layers = ((model.n_layers - n_moe) * dense_layer + n_moe * moe_layer) / pp
    emb = model.vocab_size * model.d_model / tp
    # pp = 1: the one stage holds the embedding and (if untied) the head; pp > 1: one of them.
    n_emb = jnp.where(pp > 1, 1.0, 2.0 - model.tied_embeddings)
    return layers + n_emb * emb + 2.0 * model.d_model


def layer_forward_flops_per_token(model: Model, seq_len, moe: bool = False):
    """Forward FLOP per token of one layer: ``2 × matmul weights + 4·s·h·d_h`` (attention).

    Source: Narayanan et al. 2021 Appendix (``24·B·s·h² + 4·B·s²·h`` per layer for GPT). The
    attention term counts the full ``s × s`` score matrix as Megatron does (no causal saving).
    MoE layers count ``top_k`` experts and the router GEMM.
    """
    ffn = ffn_params(model)
    if moe:
        ffn = model.top_k * ffn + model.d_model * model.n_experts
    matmul = attention_params(model) + ffn
    return 2.0 * matmul + 4.0 * seq_len * model.n_heads * model.head_dim


@batched
def model_flops_per_token(model: Model, seq_len, include_recompute: bool = False):
    """Training FLOP per token (forward + backward) for MFU, FLOP.

    Source: Narayanan et al. 2021 eq. 3: ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))`` per
    iteration *with* full activation recomputation (the forward of every layer runs twice:
    4 passes over the layers, 3 over the LM head). ``include_recompute=False`` (default) gives
    the model FLOPs of PaLM's MFU: 3 passes everywhere, ``72·B·s·l·h²·(1 + s/(6h) +
    V/(12·l·h))``. Per token means divided by ``B·s``. Generalised here to GQA, SwiGLU and MoE
    through :func:`layer_forward_flops_per_token`.

    Example:
        >>> f = model_flops_per_token(hw_db.model("gpt3-175b"), 2048, include_recompute=True)
    """
    n_moe = n_moe_layers(model)
    layers = ((model.n_layers - n_moe) * layer_forward_flops_per_token(model, seq_len)
              + n_moe * layer_forward_flops_per_token(model, seq_len, moe=True))
    head = 2.0 * model.d_model * model.vocab_size
    passes = 4.0 if include_recompute else 3.0
    return passes * layers + 3.0 * head
