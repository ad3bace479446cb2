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

import jax.numpy as jnp
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.workload import layer as _layer
from jaxmodel.workload import moe as _moe
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


# --------------------------------------------------------------------------------------------
# one decode iteration of Llama-4 Maverick under TP 8 (TensorRT-LLM's MoE-TP default): the
# weights streamed and the FLOPs of the model's GEMM rows against a hand count
# --------------------------------------------------------------------------------------------
def _rows_weights_flops(rows):
    """(weight elements, FLOPs) of weight-GEMM rows ``[(Gemm, count)]`` (batched products,
    i.e. attention scores, excluded)."""
    w = f = 0.0
    for g, c in rows:
        if g.batch is None:
            w += float(c) * float(g.k) * float(g.n)
            f += float(c) * 2.0 * float(g.m) * float(g.n) * float(g.k)
    return w, f


def test_maverick_tp8_decode_step_weights_and_flops_hand_count():
    """Per GPU, one decode iteration of ``T`` sequences (one new token each; the tokens are
    replicated over the TP group): every MoE layer streams its active routed experts
    (``E·(1 − (1 − 1/E)^T)`` of 128 under top-1), each split 8 ways (gate+up ``5120 × 2·1024``,
    down ``1024 × 5120``), the shared expert (same width, split 8 ways) and the router
    ``5120 × 128``; every dense layer its SwiGLU FFN of 16384 split 8 ways; every layer the
    attention projections (q, o: 5 of 40 heads, k, v: 1 of 8 KV heads, 128 wide). FLOPs are
    ``2·rows·weights`` per GEMM, the routed experts' rows being the ``T`` routed copies."""
    m = hw_db.model("llama4-maverick")
    dev = hw_db.system("dgx_h100").device
    par = jm.Parallelism(tp=8.0)
    sh = _layer.shard(m, par)
    T = 1024.0
    gemms, _ = _moe.ffn_rows(dev, m, par, sh, jnp.asarray(T), 1.0, False,
                             _moe.ExpertDispatch(dropless=True))
    proj = {**_layer.qkv_projection(sh, T), **_layer.output_projection(sh, T)}
    w_ffn, f_ffn = _rows_weights_flops([r for k in ("w1", "w2", "moe_router")
                                        for r in gemms[k]])
    w_att, f_att = _rows_weights_flops([r for k in proj for r in proj[k]])
    # the model's rows are one average layer: x 48
    w_ffn, f_ffn, w_att, f_att = (48.0 * x for x in (w_ffn, f_ffn, w_att, f_att))

    active = 128.0 * (1.0 - (1.0 - 1.0 / 128.0) ** T)          # 127.96 of 128
    expert = 3 * D * (FF_E // 8)                               # one expert's TP slice
    moe_w = 24 * (active * expert + expert + D * 128)          # routed, shared, router
    dense_w = 24 * 3 * D * (FF_DENSE // 8)
    assert w_ffn == pytest.approx(moe_w + dense_w, rel=1e-6)
    # FP8: ~48.3 GB of routed experts per GPU and iteration, 0.38 GB shared, 0.75 GB dense
    assert 24 * active * expert / 1e9 == pytest.approx(48.3, abs=0.1)
    moe_f = 24 * 2 * T * (expert + expert + D * 128)           # one routed copy + shared
    assert f_ffn == pytest.approx(moe_f + 2 * T * dense_w, rel=1e-6)
    att_w = 48 * D * (5 * 128 + 2 * 128 + 5 * 128)
    assert w_att == pytest.approx(att_w, rel=1e-6)
    assert f_att == pytest.approx(2 * T * att_w, rel=1e-6)
