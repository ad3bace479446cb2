"""Model families read from their public config.json: parameter counts against the published
figures, every key read or named, and the MLA / sliding-window / shared-expert formulas
against hand-derived values."""

import dataclasses
import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.workload import layer as L
from jaxmodel.workload import moe as M
from jaxmodel.workload.memory import kv_cache_bytes
from jaxmodel.workload.params import (model_flops_per_token, mtp_params, param_count,
                                      params_per_device)

NEW = ("llama3.1-8b", "llama3.2-1b", "llama3.2-3b", "mistral-7b", "mistral-nemo-12b",
       "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-72b", "qwen3-8b", "qwen3-30b-a3b", "gemma2-9b",
       "gemma3-1b", "phi3-mini", "deepseek-v2-lite", "deepseek-v3", "gpt-oss-120b",
       "falcon-7b", "gpt-j-6b", "llama3.1-405b", "llama4-scout", "llama4-maverick",
       "qwen3-235b-a22b")

# The Llama-4 totals count the vision encoder, which the configs (the language model) do not:
# vision_config of both Llama-4 config.json files: 34 layers of width 1408, MLP 5632 (four
# attention and two MLP matrices per layer), the 14x14x3 patch embedding, the pixel-shuffle
# adapter (1408*4 -> 4096 -> 4096) and the projector 4096 -> 5120 (biases and norms omitted).
LLAMA4_VISION = (34 * (4 * 1408**2 + 2 * 1408 * 5632) + 14 * 14 * 3 * 1408
                 + 1408 * 4 * 4096 + 4096 * 4096 + 4096 * 5120)
# Llama-3.3-70B has Llama-3-70B's architecture (80 layers, 8192 wide, GQA 64/8, FFN 28672,
# vocabulary 128256; only the RoPE scaling and context length differ, which do not change the
# cost): llama3-70b serves for it.

# Published totals (parameters). Sources:
PUBLISHED_TOTAL = {
    "llama3.1-405b": 405e9,       # Meta, Llama 3.1 model card ("405B")
    "llama3.1-8b": 8.03e9,        # Meta, Llama 3.1 model card ("8B"; 8,030,261,248 in the HF index)
    "llama3.2-1b": 1.23e9,        # Meta, Llama 3.2 model card, "Params 1.23B"
    "llama3.2-3b": 3.21e9,        # Meta, Llama 3.2 model card, "Params 3.21B"
    "mistral-7b": 7.3e9,          # Mistral AI, "Mistral 7B" announcement, 2023: "7.3B"
    "mistral-nemo-12b": 12.2e9,   # Mistral AI / NVIDIA, Mistral NeMo model card: 12.2B (HF)
    "mixtral-8x22b": 141e9,       # Mistral AI, "Cheaper, Better, Faster, Stronger", 2024
    "qwen2.5-7b": 7.61e9,         # Qwen team, Qwen2.5-7B model card
    "qwen2.5-72b": 72.7e9,        # Qwen team, Qwen2.5-72B model card
    "qwen3-8b": 8.2e9,            # Qwen team, Qwen3-8B model card
    "qwen3-30b-a3b": 30.5e9,      # Qwen team, Qwen3-30B-A3B model card
    "gemma2-9b": 917_504_000 + 8_324_201_984,  # Gemma Team 2024, "Gemma 2", Table 2
    "gemma3-1b": 302e6 + 698e6,   # Gemma Team 2025, "Gemma 3 Technical Report", Table 1
    "phi3-mini": 3.8e9,           # Abdin et al. 2024, "Phi-3 Technical Report" §2
    "deepseek-v2-lite": 15.7e9,   # DeepSeek-AI 2024, "DeepSeek-V2", DeepSeek-V2-Lite model card
    "deepseek-v3": 671e9,         # DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", abstract
    "gpt-oss-120b": 116.83e9,     # OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", Table 1
    "gpt-j-6b": 6_053_381_344,    # Wang & Komatsuzaki 2021, GPT-J-6B model card
    "llama4-scout": 109e9 - LLAMA4_VISION,     # Meta, Llama 4 model card: "109B" total
    "llama4-maverick": 400e9 - LLAMA4_VISION,  # Meta, Llama 4 model card: "400B" total
    "qwen3-235b-a22b": 235e9,     # Qwen team, Qwen3-235B-A22B model card ("235B")
    # NVIDIA 2024, "Nemotron-4 340B Technical Report", Table 1: 9.4B embedding + 331.6B other
    "nemotron4-340b": 9.4e9 + 331.6e9,
}
# Published active (per token) parameters of the MoE models and whether the figure counts the
# input embedding (param_count(active=True) does not: it is a lookup).
PUBLISHED_ACTIVE = {
    "mixtral-8x7b": (12.9e9, True),    # Jiang et al. 2024, "Mixtral of Experts" §2 ("13B")
    "mixtral-8x22b": (39e9, True),     # Mistral AI 2024 announcement
    "qwen3-30b-a3b": (3.3e9, True),    # Qwen3-30B-A3B model card
    "deepseek-v2-lite": (2.4e9, False),  # DeepSeek-V2-Lite model card ("2.4B activated")
    "deepseek-v3": (37e9, False),      # DeepSeek-V3 Technical Report, abstract
    "gpt-oss-120b": (5.13e9, False),   # gpt-oss model card, Table 1
    "llama4-scout": (17e9, True),      # Meta, Llama 4 model card ("17B active")
    "llama4-maverick": (17e9, True),   # Meta, Llama 4 model card ("17B active")
    "qwen3-235b-a22b": (22e9, True),   # Qwen3-235B-A22B model card ("22B activated")
}


def test_every_shipped_config_loads_with_every_key_read_or_named():
    for name in hw_db.names("model"):
        path = hw_db.ROOT / "models" / f"{name}.json"
        cfg = json.loads(path.read_text())
        assert "_source" in cfg, name
        for key, val in cfg.items():
            assert (key in hw_db.HF_MODELLED_KEYS or key in hw_db.HF_HARMLESS_KEYS
                    or (key in hw_db._HF_OFF_WHEN_FALSY and not val)), (name, key)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            hw_db.model(name)
    assert set(NEW) <= set(hw_db.names("model"))


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_total_params_within_1_percent_of_published(name):
    got = float(param_count(hw_db.model(name)))
    assert got == pytest.approx(PUBLISHED_TOTAL[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_active_params_within_3_percent_of_published(name):
    m = hw_db.model(name)
    want, with_embedding = PUBLISHED_ACTIVE[name]
    got = float(param_count(m, active=True))
    if with_embedding:
        got += float(m.vocab_size * m.d_model)
    assert got == pytest.approx(want, rel=0.03)
    assert got < float(param_count(m))


def test_nemo_gpt3_and_nemotron3_configs_by_hand():
    """NeMo's GPT-3 5B/20B (learned positions, biases, shared embeddings, vocab 50257) and
    Nemotron-3 8B/22B (no biases, squared ReLU, untied 256k embeddings): 12·d² + 13·d per
    GPT layer (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
    Clusters Using Megatron-LM", §5.1, with the biases and norms), 12·d² + 2·d per Nemotron
    layer (two LayerNorm1p weights, no biases), plus embeddings and the final norm."""
    for name, layers, d, vocab, tied, per_layer_extra in (
            ("gpt3-5b", 24, 4096, 50257, True, 13), ("gpt3-20b", 44, 6144, 50257, True, 13),
            ("nemotron3-8b", 32, 4096, 256000, False, 2),
            ("nemotron3-22b", 40, 6144, 256000, False, 2)):
        m = hw_db.model(name)
        emb = vocab * d * (1 if tied else 2) + (2048 * d if tied else 0)
        want = layers * (12 * d * d + per_layer_extra * d) + emb
        got = float(param_count(m))
        assert got == pytest.approx(want, rel=2e-3), name
    assert int(hw_db.model("nemotron4-340b").activation) == 4   # squared ReLU


def test_deepseek_v3_by_hand_and_its_mtp_module():
    m = hw_db.model("deepseek-v3")
    d, h, V = 7168.0, 128.0, 129280.0
    attn = (d * 1536 + 1536 + 1536 * h * 192            # query down, norm, up
            + d * (512 + 64) + 512 + 512 * h * (128 + 128)  # joint KV down, norm, up
            + h * 128 * d)                                # output
    expert = 3 * d * 2048
    moe = attn + (256 + 1) * expert + d * 256 + 4 * d
    dense = attn + 3 * d * 18432 + 4 * d
    total = 3 * dense + 58 * moe + 2 * V * d + 2 * d
    assert float(param_count(m)) == pytest.approx(total, rel=1e-6)
    active = 3 * dense + 58 * (moe - 248 * expert) + V * d + 2 * d
    assert float(param_count(m, active=True)) == pytest.approx(active, rel=1e-6)
    # the HF checkpoint: 671 B main model + 14 B MTP module, which stores its own copies of
    # the embedding and the head (DeepSeek-V3 model card)
    mtp = float(param_count(m, mtp=True) - param_count(m)) + 2 * V * d
    assert float(mtp_params(m)) == pytest.approx(float(param_count(m, mtp=True)
                                                       - param_count(m)), rel=1e-9)
    assert mtp == pytest.approx(14e9, rel=0.05)
    assert m.quantization.startswith("fp8 e4m3") and m.serving_precision == "fp8"
    # the MTP module is held for training, not loaded for plain serving
    one = jm.Parallelism()
    assert float(params_per_device(m, one)) == pytest.approx(float(param_count(m, mtp=True)),
                                                             rel=1e-9)
    assert float(params_per_device(m, one, mtp=False)) == pytest.approx(float(param_count(m)),
                                                                        rel=1e-9)
    jm.precision(m.serving_precision)           # a preset name


def test_gemma2_is_geglu_with_tied_embeddings_and_alternating_windows():
    m = hw_db.model("gemma2-9b")
    assert int(m.activation) == jm.ACTIVATIONS.index("geglu") and float(m.tied_embeddings) == 1
    assert (float(m.sliding_window), float(m.global_every)) == (4096.0, 2.0)
    # Gemma Team 2024, Table 2: 8,324,201,984 non-embedding parameters (RMSNorms w/o bias)
    non_emb = float(param_count(m)) - 256000 * 3584
    assert non_emb == pytest.approx(8_324_201_984, rel=1e-4)


def test_gpt_oss_reads_layer_types_attention_bias_and_mxfp4():
    m = hw_db.model("gpt-oss-120b")
    assert (float(m.sliding_window), float(m.global_every)) == (128.0, 2.0)
    assert float(m.qkv_bias) == 1.0 and "mxfp4" in m.quantization
    assert m.serving_precision == ""         # experts only: no preset matches the mix


def test_falcon_gptj_parallel_blocks_and_mqa_by_hand():
    f = hw_db.model("falcon-7b")
    assert (float(f.n_kv_heads), float(f.parallel_block), float(f.tied_embeddings)) == (1, 1, 1)
    d, V, L_ = 4544.0, 65024.0, 32.0
    want = L_ * (d * (d + 2 * 64) + d * d + 2 * d * 4 * d + 4 * d) + V * d + 2 * d
    assert float(param_count(f)) == pytest.approx(want, rel=1e-12)   # published: "7B"
    assert float(hw_db.model("gpt-j-6b").parallel_block) == 1.0
    assert float(hw_db.model("qwen2.5-7b").qkv_bias) == 1.0
    assert float(hw_db.model("llama3-8b").parallel_block) == 0.0


def test_existing_models_unchanged():
    # Llama-2-70B by the pre-family formula: GQA attention, SwiGLU, gain+bias norms, untied
    m = hw_db.model("llama2-70b")
    d, L_, V, f, kv = 8192.0, 80.0, 32000.0, 28672.0, 1024.0
    layer = d * (d + 2 * kv) + d * d + 3 * d * f + 4 * d
    assert float(param_count(m)) == pytest.approx(L_ * layer + 2 * V * d + 2 * d, rel=1e-12)
    s = 4096.0
    fwd = 2 * (layer - 4 * d) + 4 * s * 64 * 128
    want = 3 * L_ * fwd + 3 * 2 * d * V
    assert float(model_flops_per_token(m, s)) == pytest.approx(want, rel=1e-12)
    g = hw_db.model("gpt3-175b")
    assert float(param_count(g, active=True)) == float(param_count(g))     # tied, dense


def test_mla_and_window_kv_cache_by_hand():
    ds = hw_db.model("deepseek-v3")
    par = jm.Parallelism(tp=8)
    # latent (512 + 64) per token and layer, replicated on each TP rank
    got = float(kv_cache_bytes(ds, par, 2.0, 1000.0, 2.0))
    assert got == pytest.approx(2 * 1000 * 576 * 2 * 61, rel=1e-9)
    mi = hw_db.model("mistral-7b")                  # every layer local, window 4096
    one = jm.Parallelism()
    assert float(kv_cache_bytes(mi, one, 1.0, 8192.0)) == pytest.approx(
        2 * 4096 * 8 * 128 * 2 * 32, rel=1e-9)
    assert float(kv_cache_bytes(mi, one, 1.0, 1000.0)) == pytest.approx(
        2 * 1000 * 8 * 128 * 2 * 32, rel=1e-9)
    ge = hw_db.model("gemma2-9b")                   # 21 local (4096) + 21 global layers
    assert float(kv_cache_bytes(ge, one, 1.0, 8192.0)) == pytest.approx(
        2 * 8 * 256 * 2 * (21 * 4096 + 21 * 8192), rel=1e-9)
    g3 = hw_db.model("gemma3-1b")                   # 26 layers: 4 global (every 6th)
    assert float(kv_cache_bytes(g3, one, 1.0, 4096.0)) == pytest.approx(
        2 * 1 * 256 * 2 * (22 * 512 + 4 * 4096), rel=1e-9)


def test_window_flops_and_dense_first_layers_by_hand():
    mi = hw_db.model("mistral-7b")
    full = dataclasses.replace(mi, sliding_window=0.0)
    s = 16384.0
    diff = float(model_flops_per_token(full, s) - model_flops_per_token(mi, s))
    assert diff == pytest.approx(3 * 32 * 4 * (s - 4096) * 32 * 128, rel=1e-9)
    ds = hw_db.model("deepseek-v2-lite")
    no_dense = dataclasses.replace(ds, first_k_dense=0.0)
    d = 2048.0
    dense_ffn, moe_ffn = 3 * d * 10944, 8 * 3 * d * 1408 + d * 64
    got = float(model_flops_per_token(ds, 1.0) - model_flops_per_token(no_dense, 1.0))
    assert got == pytest.approx(3 * 2 * (dense_ffn - moe_ffn), rel=1e-9)


def test_param_count_batched_jit_and_gradient_float64():
    m = hw_db.model("deepseek-v2-lite")
    ranks = jnp.array([256.0, 512.0, 1024.0])
    batched = param_count(dataclasses.replace(m, kv_lora_rank=ranks))
    for i, r in enumerate([256.0, 512.0, 1024.0]):
        one = float(param_count(dataclasses.replace(m, kv_lora_rank=r)))
        assert float(batched[i]) == pytest.approx(one, rel=1e-12)
    eager = float(param_count.single(m, True))
    jitted = float(jax.jit(lambda mm: param_count.single(mm, True))(m))
    assert jitted == pytest.approx(eager, rel=1e-12)
    # d(params)/d(kv_lora_rank) = d + 1 + h·(nope + v) per layer (float64 finite difference)
    fn = lambda r: param_count.single(dataclasses.replace(m, kv_lora_rank=r))  # noqa: E731
    g = float(jax.grad(fn)(jnp.float64(512.0)))
    fd = float(fn(jnp.float64(513.0)) - fn(jnp.float64(511.0))) / 2
    assert g == pytest.approx(fd, rel=1e-9)
    assert g == pytest.approx(27 * (2048 + 1 + 16 * 256), rel=1e-12)
    # the KV cache grows by one element per token and layer with the latent rank
    kv = lambda r: kv_cache_bytes.single(dataclasses.replace(m, kv_lora_rank=r),  # noqa: E731
                                         jm.Parallelism(), 1.0, 100.0)
    assert float(jax.grad(kv)(jnp.float64(512.0))) == pytest.approx(100 * 2 * 27, rel=1e-12)


def test_param_count_and_kv_cache_float32(float32):
    m = hw_db.model("deepseek-v3")
    ranks = jnp.array([256.0, 512.0])
    kv = kv_cache_bytes(dataclasses.replace(m, kv_lora_rank=ranks), jm.Parallelism(), 1.0,
                        100.0)
    assert kv.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(kv)))
    assert float(param_count(m)) == pytest.approx(PUBLISHED_TOTAL["deepseek-v3"], rel=0.01)


def test_mla_gemm_shapes_and_absorbed_decode_core():
    m = hw_db.model("deepseek-v3")
    par = jm.Parallelism(tp=8)
    sh = L.shard(m, par)
    pre = L.mla_projections(m, sh, 10.0)
    shapes = {(float(g.m), float(g.n), float(g.k)) for g, c in pre["qkv"] if float(c) > 0}
    assert shapes == {(10, 1536, 7168), (10, 16 * 192, 1536), (10, 576, 7168),
                      (10, 16 * 256, 512)}
    dec = L.mla_projections(m, sh, 10.0, absorbed=True)
    assert any(float(g.n) == 512 and float(g.k) == 128 and float(g.batch) == 16
               for g, _ in dec["qkv"])
    core = L.mla_core_shard(m, sh, absorbed=True)
    assert (float(core.kv_heads), float(core.group), float(core.head_dim)) == (1, 16, 576)
    core = L.mla_core_shard(m, sh)
    assert (float(core.kv_heads), float(core.head_dim)) == (16, 192)


def test_shared_experts_are_a_dense_ffn_beside_the_routed_ones():
    m = hw_db.model("deepseek-v2-lite")
    par = jm.Parallelism(tp=2)
    sh = L.shard(m, par)
    dev = hw_db.device("h100_sxm")
    gemms, _ = M.ffn_rows(dev, m, par, sh, 64.0)
    f = 26 / 27
    w1 = [(float(g.m), float(g.n), float(g.k), float(c)) for g, c in gemms["w1"]]
    assert (64.0, 2 * 2 * 1408 / 2, 2048.0, pytest.approx(f)) in w1   # 2 shared, gate+up
    routed = [x for x in w1 if x[1] == 1408.0]                          # gate+up of one expert
    assert routed and routed[0][3] > 0
    dense = [x for x in w1 if x[1] == 2 * 10944 / 2]
    assert dense and dense[0][3] == pytest.approx(1 - f)
    # the routed experts split over ep, the shared ones only over tp
    full = float(params_per_device(m, jm.Parallelism()))
    ep = float(params_per_device(m, jm.Parallelism(ep=4)))
    assert full - ep == pytest.approx(26 * 64 * 3 * 2048 * 1408 * 3 / 4, rel=1e-9)


def test_unmodelled_keys_fail_with_their_name():
    base = json.loads((hw_db.ROOT / "models" / "qwen3-30b-a3b.json").read_text())
    cases = [({"shared_expert_intermediate_size": 5632}, "shared_expert_intermediate_size"),
             ({"mlp_only_layers": [0, 1]}, "mlp_only_layers"),
             ({"use_sliding_window": True, "sliding_window": 4096}, "max_window_layers"),
             ({"quantization_config": {"quant_method": "bitsandbytes"}},
              "quantization_config"),
             ({"num_experts_per_tok": 8, "experts_per_token": 4}, "experts_per_token")]
    for extra, key in cases:
        with pytest.raises(ValueError, match=key):
            hw_db.model({**base, **extra})
    oss = json.loads((hw_db.ROOT / "models" / "gpt-oss-120b.json").read_text())
    irregular = ["full_attention"] * 3 + ["sliding_attention"] * 33
    with pytest.raises(ValueError, match="layer_types"):
        hw_db.model({**oss, "layer_types": irregular})
    llama = {k: v for k, v in base.items() if k not in ("use_sliding_window",
                                                        "max_window_layers")}
    with pytest.raises(ValueError, match="sliding_window"):   # which layers is not known
        hw_db.model({**llama, "model_type": "llama", "sliding_window": 4096})


@pytest.mark.slow
def test_mla_and_window_branches_batched_equal_single_configs():
    """A batch mixing MLA/GQA and windowed/full layers (traced branches, ``jnp.where``)
    gives each configuration's own static-branch result; absorbed MLA decode reads the
    latent, far less than GQA-shaped keys and values of the same head sizes on one device
    (under TP the latent is replicated on every rank while per-head keys split)."""
    sys_ = hw_db.system("dgx_h100")
    par = jm.Parallelism(tp=1)
    m = hw_db.model("deepseek-v2-lite")
    both = dataclasses.replace(m, attention=jnp.array([1.0, 0.0]),
                               sliding_window=jnp.array([0.0, 512.0]))
    got = jm.layer_breakdown(sys_, both, par, 8, 1, phase="decode", kv_len=8192)
    for i, (att, win) in enumerate([(1.0, 0.0), (0.0, 512.0)]):
        one = jm.layer_breakdown(sys_, dataclasses.replace(m, attention=att,
                                                           sliding_window=win),
                                 par, 8, 1, phase="decode", kv_len=8192)
        for row in ("qkv", "qk", "av", "wo", "total"):
            assert float(got[row][i]) == pytest.approx(float(one[row]), rel=1e-5), row
    full = jm.layer_breakdown(sys_, dataclasses.replace(m, attention=0.0), par, 8, 1,
                              phase="decode", kv_len=8192)
    assert float(got["qk"][0]) < 0.5 * float(full["qk"])      # latent vs per-head keys
    assert float(got["qk"][1]) < float(full["qk"])            # window 512 of 8193 keys


# --------------------------------------------------------------------------------------------
# DeepSeek-V3 at its published scale (experiments/deepseek_v3.py prints the breakdowns)
# --------------------------------------------------------------------------------------------
def test_deepseek_v3_latent_kv_bytes_per_token_by_hand():
    """MLA caches ``d_c + d_h^R = 512 + 64`` elements per token and layer, on every TP rank;
    multi-head attention with the same heads would cache K (``d_h + d_h^R = 192``) and V
    (128) of 128 heads: 71× more per token, 8.9× more per GPU at TP 8."""
    m = hw_db.model("deepseek-v3")
    par = jm.Parallelism(tp=8)
    latent = float(kv_cache_bytes(m, par, 1.0, 1.0, 1.0))
    assert latent == 576 * 61
    mha_total = 128 * (192 + 128) * 61
    assert mha_total / latent == pytest.approx(71.1, rel=1e-3)
    assert float(kv_cache_bytes(m, jm.Parallelism(tp=8, pp=16), 1.0, 1.0, 1.0)) == 576 * 4


def test_deepseek_v3_training_memory_on_2048_h800_by_stage():
    """PP 16 (61 layers: 3 | 13 × 4, 3 | 3), EP 64, ZeRO-1 over dp 128, FP8, 1F1B with 120
    micro-batches: the memory formulas alone say full recomputation fits 80 GiB and the
    attention-only (selective) recomputation does not."""
    from jaxmodel.parallel import pipeline as pl
    m = hw_db.model("deepseek-v3")
    assert tuple(float(x) for x in pl.stage_layers(61.0, 16.0)) == (3.0, 4.0, 3.0)
    cap = float(hw_db.device("h800").mem_capacity)
    flight = pl.stage_in_flight(1.0, 16.0, 120.0, 1.0)
    got = {}
    for rc in ("selective", "full"):
        par = jm.Parallelism(dp=128, pp=16, ep=64, zero=1, recompute=rc, flash_attention=True)
        got[rc] = jm.training_memory(m, par, 4096.0, flight, precision="fp8")
    assert float(got["full"]["total"]) < cap < float(got["selective"]["total"])
    # routed experts: 4 of 256 per MoE layer on a device, optimizer states over dp/ep = 2;
    # the largest stage holds at least 3 layers' worth (the first: 3 layers + embedding)
    expert = 3 * 7168 * 2048
    assert float(got["full"]["optimizer"]) > 12.0 * 4 * (58 / 61 * 3) * expert / 2


@pytest.mark.slow
def test_deepseek_v3_trains_on_2048_h800_and_serves_on_8_h200():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "deepseek_v3.py"
    spec = importlib.util.spec_from_file_location("deepseek_v3", path)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    _, system, par, r = ex.training("full")
    assert bool(r.feasible) and int(system.n_devices) == 2048
    assert (float(par.pp), float(par.ep), float(par.zero)) == (16.0, 64.0, 1.0)
    step = float(r.step_time_s)
    assert sum(float(v) for v in r.breakdown.values()) == pytest.approx(step, rel=1e-9)
    assert 0.05 < float(r.mfu) < 0.6
    assert float(r.breakdown["ep_comm"]) > 0 and float(r.breakdown["bubble"]) > 0
    model, system, par, r = ex.serving()
    assert bool(r.feasible) and int(system.n_devices) == 8
    assert float(r.ttft_s) > 0 and float(r.tpot_s) > 0
    latent, mha = ex.kv_per_token(model, par, 1.0)
    assert mha / latent == pytest.approx(128 / 8 * 320 / 576, rel=1e-9)
