"""Llama-4 Scout / Maverick as served: the shipped configs against the HF ``config.json``
(``text_config``) of ``meta-llama/Llama-4-Scout-17B-16E-Instruct`` and
``meta-llama/Llama-4-Maverick-17B-128E-Instruct``, hand-derived layer and parameter counts.

Both: 48 layers, hidden 5120, 40 query / 8 KV heads of 128, vocabulary 202,048, routed experts
of ``intermediate_size`` 8192 with top-1 routing and one shared expert of the same width
(``Llama4TextMoe``), chunked attention (``attention_chunk_size`` 8192) on three of every four
layers and a global NoPE layer every fourth. Scout: 16 experts in every layer
(``interleave_moe_layer_step`` 1). Maverick: 128 experts in every second layer
(``interleave_moe_layer_step`` 2), the other layers a dense SwiGLU FFN of
``intermediate_size_mlp`` 16384.
"""

import pytest

import hw_db
from jaxmodel.workload.params import n_moe_layers, param_count

D, L, V, FF_E, FF_DENSE = 5120, 48, 202_048, 8192, 16_384
ATTN = D * (40 * 128 + 2 * 8 * 128 + 40 * 128)     # q, k, v, o projections
EXPERT = 3 * D * FF_E                              # gate, up, down
NORMS = 2 * D                                       # input + post-attention RMSNorm


def _hand_total(n_experts, moe_layers):
    """Weights of the language model (count): attention, norms, routed + shared experts and
    router on the MoE layers, a dense SwiGLU FFN on the others, untied embedding and LM head,
    final norm."""
    moe = ATTN + NORMS + (n_experts + 1) * EXPERT + D * n_experts
    dense = ATTN + NORMS + 3 * D * FF_DENSE
    return moe_layers * moe + (L - moe_layers) * dense + 2 * V * D + D


@pytest.mark.parametrize("name, experts, moe_layers", [("llama4-scout", 16, 48),
                                                      ("llama4-maverick", 128, 24)])
def test_llama4_configs_match_the_hf_config(name, experts, moe_layers):
    m = hw_db.model(name)
    assert (float(m.n_layers), float(m.d_model), float(m.n_heads), float(m.n_kv_heads),
            float(m.head_dim), float(m.vocab_size)) == (L, D, 40, 8, 128, V)
    assert (float(m.n_experts), float(m.top_k), float(m.n_shared_experts),
            float(m.expert_d_ff)) == (experts, 1, 1, FF_E)
    assert float(n_moe_layers(m)) == moe_layers
    assert (float(m.sliding_window), float(m.global_every)) == (8192, 4)
    if moe_layers < L:
        assert float(m.d_ff) == FF_DENSE
    # hand-derived total (the model gives each norm a bias as well, 2·d per layer: < 1e-5);
    # the model cards' 109B / 400B include the vision encoder (test_models.py)
    assert float(param_count(m)) == pytest.approx(_hand_total(experts, moe_layers), rel=1e-5)
    # active per token: attention, one routed + the shared expert and the router (or the
    # dense FFN) per layer, the LM head (the embedding is a lookup); 17B with the embedding
    moe = ATTN + NORMS + 2 * EXPERT + D * experts
    active = moe_layers * moe + (L - moe_layers) * (ATTN + NORMS + 3 * D * FF_DENSE) + V * D
    assert float(param_count(m, active=True)) == pytest.approx(active, rel=1e-4)
    assert float(param_count(m, active=True)) + V * D == pytest.approx(17e9, rel=0.06)
