"""LoRA / QLoRA: adapter parameters and memory states against hand-derived values, the
frozen base's skipped weight-gradient GEMMs, vmap/jit/grad, float32, and the fine-tuning
that fits where full training does not (Llama-3-70B on 8 H100)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel import ops
from jaxmodel.workload import layer as L

from jaxmodel.workload import finetune as lo
from jaxmodel import precisions as P

D, H, KV, DH, FF, V, NL = 1024.0, 16.0, 4.0, 64.0, 4096.0, 32000.0, 8.0
LLAMA = jm.Model(n_layers=NL, d_model=D, n_heads=H, n_kv_heads=KV, head_dim=DH, d_ff=FF,
                 vocab_size=V, activation="swiglu")
GPT = dataclasses.replace(LLAMA, activation="gelu", n_kv_heads=H)


def roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return ops.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


def test_constructor_names_and_errors():
    c = jm.lora(8, ("q", "v"))
    assert (float(c.rank), float(c.q), float(c.k), float(c.v), float(c.down)) == (
        8.0, 1.0, 0.0, 1.0, 0.0)
    assert float(c.base_bytes) == 0.0 and float(c.dequant) == 0.0
    q = jm.qlora(16)
    # w4a16: 4-bit words + one fp16 scale per 128 weights
    assert float(q.base_bytes) == pytest.approx(0.5 + 2.0 / 128.0)
    assert float(q.dequant) == 1.0 and q.name.startswith("qlora")
    assert float(jm.lora(16, "q, k").k) == 1.0
    with pytest.raises(ValueError, match="modules"):
        jm.lora(16, ("q", "mlp"))
    with pytest.raises(ValueError, match="rank"):
        jm.lora(0)


def test_adapter_params_by_hand_tp1_and_tp2():
    r = 16.0
    per_layer = r * ((D + H * DH) + 2 * (D + KV * DH) + (H * DH + D)   # q, k, v, o
                     + 2 * (D + FF) + (FF + D))                        # gate, up, down
    got = float(lo.adapter_params_per_device(LLAMA, jm.Parallelism(), jm.lora(r)))
    assert got == pytest.approx(NL * per_layer)
    # tp = 2, pp = 3 (8 layers: the most loaded stage holds 3): column-parallel modules split
    # B's outputs, row-parallel ones A's inputs
    t = 2.0
    per_layer_tp = r * ((D + H * DH / t) + 2 * (D + KV * DH / t) + (H * DH / t + D)
                        + 2 * (D + FF / t) + (FF / t + D))
    got = float(lo.adapter_params_per_device(LLAMA, jm.Parallelism(tp=2, pp=3), jm.lora(r)))
    assert got == pytest.approx(3 * per_layer_tp)
    # a GELU FFN has no gate: the flag is ignored
    got = float(lo.adapter_params_per_device(GPT, jm.Parallelism(), jm.lora(r, "gate")))
    assert got == 0.0


def test_moe_adapters_follow_their_experts():
    moe = dataclasses.replace(LLAMA, n_experts=8.0, top_k=2.0, moe_d_ff=512.0,
                              n_shared_experts=1.0)
    r = 4.0
    ffn = r * (2 * (D + 512.0) + (512.0 + D))
    for ep in (1.0, 4.0):
        got = float(lo.adapter_params_per_device(moe, jm.Parallelism(dp=4, ep=ep),
                                                 jm.lora(r, ("gate", "up", "down"))))
        assert got == pytest.approx(NL * ffn * (1.0 + 8.0 / ep))


def test_memory_states_by_hand():
    par = jm.Parallelism(dp=4, zero=1)
    prec = P.precision("bf16")
    n_ad = float(lo.adapter_params_per_device(LLAMA, par, jm.lora(16)))
    base = 1e9
    st = lo.memory_states(LLAMA, par, jm.lora(16), base, prec, 4.0)
    assert float(st["weights"]) == pytest.approx(2.0 * base + 2.0 * n_ad)
    assert float(st["gradients"]) == pytest.approx(4.0 * n_ad)
    assert float(st["optimizer"]) == pytest.approx(12.0 * n_ad / 4)    # ZeRO-1 over dp
    st = lo.memory_states(LLAMA, dataclasses.replace(par, zero=3.0), jm.qlora(16), base,
                          prec, 4.0)
    w = 0.5 + 2.0 / 128.0
    assert float(st["weights"]) == pytest.approx((w * base + 2.0 * n_ad) / 4)


def test_frozen_wgrad_is_the_weight_gemms_transposed_product():
    dev = hw_db.device("h100_sxm")
    par = jm.Parallelism(tp=2)
    prec = P.precision("bf16")
    gemms, _ = L.layer_graph(dev, LLAMA, par, 1.0, 512.0, 512.0, training=True,
                             precision=prec)
    want = 0.0
    for items in gemms.values():
        for g, c in items:
            if g.batch is None:                       # weights only, not QKᵀ / AV
                want += float(c) * float(roofline(dev, g.k, g.n, g.m))
    got = float(lo.frozen_wgrad_times(dev, gemms, roofline, prec))
    assert got == pytest.approx(want, rel=1e-9)
    # the layer's backward holds them: dgrad + wgrad of the weight GEMMs
    rows = L.evaluate(roofline, dev, gemms, {}, backward=True, precision=prec)
    bwd_w = sum(float(rows[r][1]) for r in ("qkv", "wo", "w1", "w2"))
    assert 0.3 * bwd_w < got < 0.7 * bwd_w


def test_adapter_times_vmap_jit_grad_float64():
    dev = hw_db.device("h100_sxm")
    prec = P.precision("bf16")
    par = jm.Parallelism(tp=2)

    def f(rank):
        c = dataclasses.replace(jm.lora(16), rank=rank)
        return lo.adapter_times(dev, LLAMA, par, 2048.0, c, roofline, prec)[1]

    ranks = jnp.asarray([8.0, 16.0, 64.0])
    loop = np.asarray([float(f(r)) for r in ranks])
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(ranks)), loop, rtol=1e-12)
    np.testing.assert_allclose(float(jax.jit(f)(16.0)), loop[1], rtol=1e-12)
    assert loop[0] < loop[1] < loop[2]
    g = float(jax.grad(f)(64.0))
    fd = (float(f(64.0 + 1e-3)) - float(f(64.0 - 1e-3))) / 2e-3
    assert np.isfinite(g) and g == pytest.approx(fd, rel=1e-4, abs=1e-12)
    # parameters are linear in the rank
    n = lambda r: lo.adapter_params_per_device(                             # noqa: E731
        LLAMA, par, dataclasses.replace(jm.lora(16), rank=r))
    assert float(jax.grad(n)(16.0)) == pytest.approx(float(n(16.0)) / 16.0)


def test_float32(float32):
    par = jm.Parallelism(tp=8)
    n = lo.adapter_params_per_device(hw_db.model("llama3-70b"), par, jm.lora(16))
    assert n.dtype == jnp.float32 and np.isfinite(float(n))


def test_lora_memory_fits_where_full_fine_tuning_does_not():
    """The memory side of the next test, from the memory formulas alone (fast): Llama-3-70B,
    TP 8 on 8 H100, full recomputation."""
    model = hw_db.model("llama3-70b")
    par = jm.Parallelism(tp=8, sp=True, recompute="full", flash_attention=True)
    cap = float(hw_db.device("h100_sxm").mem_capacity)
    full = jm.training_memory(model, par, 4096.0, 1.0)
    assert float(full["total"]) > cap
    st = lo.memory_states(model, par, jm.lora(16), jm.params_per_device(model, par),
                          P.precision("bf16"), 4.0)
    total = sum(float(v) for v in st.values()) + float(full["activations"])
    assert total < 0.3 * cap
    # r = 16 on every module: 207 M adapter parameters (1 M per device and layer under TP 8,
    # the A or B of each adapter replicated) against 8.8 G base parameters per device
    assert float(st["optimizer"]) < 0.02 * float(full["optimizer"])


@pytest.fixture(scope="module")
def llama70b_on_8_h100():
    """Llama-3-70B on one DGX H100 (TP 8, full recomputation, FlashAttention), 8 sequences
    of 4096 tokens: full fine-tuning, LoRA r = 16 on every module, QLoRA r = 16."""
    system = hw_db.system("dgx_h100")
    model = hw_db.model("llama3-70b")
    par = jm.Parallelism(dp=1, tp=8, pp=1, sp=True, recompute="full", flash_attention=True)
    cfgs = {"full": None, "lora": jm.lora(16), "qlora": jm.qlora(16)}
    return {k: jm.train_step(system, model, par, 8, 4096, gemm=roofline, finetune=c)
            for k, c in cfgs.items()}, model


@pytest.mark.slow
def test_lora_fits_where_full_fine_tuning_does_not(llama70b_on_8_h100):
    res, model = llama70b_on_8_h100
    cap = float(hw_db.device("h100_sxm").mem_capacity)
    full, lora, qlora = res["full"], res["lora"], res["qlora"]
    assert not bool(full.feasible)
    assert jm.numerics.REASONS[int(full.reason)] == "out_of_memory"
    # mixed-precision Adam: 2 + 4 + 12 B per parameter over 8 devices > 80 GiB
    n = float(jm.param_count(model))
    assert float(full.memory_bytes) > 18.0 * n / 8 > cap
    for r in (lora, qlora):
        assert bool(r.feasible) and float(r.memory_bytes) < cap
        assert np.isfinite(float(r.step_time_s))
        total = sum(float(v) for v in r.breakdown.values())
        assert total == pytest.approx(float(r.step_time_s), rel=1e-9)
    # the frozen base: 2 B (LoRA) or 0.5 B + scales (QLoRA) per parameter, the 16-bit
    # adapters beside it; no optimizer state for the base
    par = jm.Parallelism(tp=8)
    n_dev = float(jm.params_per_device(model, par))
    n_ad = float(lo.adapter_params_per_device(model, par, jm.lora(16)))
    assert float(lora.memory["weights"]) == pytest.approx(2.0 * n_dev + 2.0 * n_ad)
    assert float(qlora.memory["weights"]) == pytest.approx((0.5 + 2 / 128) * n_dev
                                                           + 2.0 * n_ad)
    assert float(lora.memory["gradients"]) == pytest.approx(4.0 * n_ad)
    assert float(lora.memory["optimizer"]) < 0.02 * float(full.memory["optimizer"])
    # activations are those of full training
    assert float(lora.memory["activations"]) == pytest.approx(
        float(full.memory["activations"]))
    # QLoRA pays its dequantisation
    assert float(qlora.breakdown["compute"]) > float(lora.breakdown["compute"])
