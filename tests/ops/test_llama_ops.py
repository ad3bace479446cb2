"""Fused memory-bound kernels of Llama-family layers: hand values, floors, batching, grads."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm


def _toy(a100):
    """The A100 with round kernel constants (hand values do not depend on a calibration)."""
    return dataclasses.replace(
        a100, mem_bw=2e12, mem_bw_efficiency=0.8, rmsnorm_bw_efficiency=0.5,
        rope_bw_efficiency=0.4, silu_mul_bw_efficiency=0.5, add_bw_efficiency=0.9,
        embedding_bw_efficiency=0.0, rmsnorm_overhead_s=5e-6, rope_overhead_s=4e-6,
        silu_mul_overhead_s=4e-6, add_overhead_s=2e-6, embedding_overhead_s=3e-6,
        mem_latency_s=0.0, global_buffer_reuse_fraction=0.0)


def test_rmsnorm_hand_value(a100):
    d = _toy(a100)
    rows, cols = 8192.0, 4096.0
    want = (3 * rows * cols + cols) * 2 / (2e12 * 0.5)        # two reads + one write, fp16
    # the 5 µs floor combines with the transfer in quadrature
    assert float(jm.rmsnorm_latency(d, rows, cols)) == pytest.approx(math.hypot(want, 5e-6),
                                                                     rel=1e-6)
    # one token: the floor (the transfer of 24 KiB takes 25 ns)
    assert float(jm.rmsnorm_latency(d, 1.0, 4096.0)) == pytest.approx(
        math.hypot(5e-6, (3 * 4096 + 4096) * 2 / 1e12), rel=1e-6)
    assert float(jm.rmsnorm_latency(d, 1.0, 4096.0, overhead=False)) == pytest.approx(
        (3 * 4096 + 4096) * 2 / 1e12, rel=1e-6)


def test_row_latency_chain_hand_value(a100):
    # one block per row, 2 blocks per SM: 108·2 rows per wave; RMSNorm walks each row twice
    # in ceil(cols / 1024) dependent loads per thread
    d = dataclasses.replace(_toy(a100), mem_latency_s=0.5e-6, rmsnorm_overhead_s=0.0)
    assert float(jm.rmsnorm_latency(d, 1.0, 8192.0)) == pytest.approx(2 * 8 * 0.5e-6)
    assert float(jm.rmsnorm_latency(d, 217.0, 8192.0)) == pytest.approx(2 * 2 * 8 * 0.5e-6)
    # SiLU·mul: ceil(28672 / 1024) = 28 loads per thread when the rows are given
    got = float(jm.silu_mul_latency(d, 4.0 * 28672, rows=4.0))
    assert got == pytest.approx(math.hypot(max(28 * 0.5e-6, 3 * 4 * 28672 * 2 / 1e12), 4e-6),
                                rel=1e-6)
    assert float(jm.silu_mul_latency(d, 4.0 * 28672)) < got     # no rows: no chain


def test_rope_silu_add_embedding_hand_values(a100):
    d = _toy(a100)
    t, h, kv, hd = 4096.0, 32.0, 8.0, 128.0
    assert float(jm.rope_latency(d, t, h, kv, hd)) == pytest.approx(
        math.hypot((2 * t * (h + kv) * hd + t * hd) * 2 / (2e12 * 0.4), 4e-6), rel=1e-6)
    n = 4096.0 * 14336
    assert float(jm.silu_mul_latency(d, n)) == pytest.approx(
        math.hypot(3 * n * 2 / 1e12, 4e-6), rel=1e-6)
    assert float(jm.add_latency(d, n)) == pytest.approx(
        math.hypot(3 * n * 2 / (2e12 * 0.9), 2e-6), rel=1e-6)
    # bw efficiency 0 falls back to the device's mem_bw_efficiency
    assert float(jm.embedding_latency(d, t, 4096.0)) == pytest.approx(
        math.hypot((2 * t * 4096 * 2 + 8 * t) / (2e12 * 0.8), 3e-6), rel=1e-6)


def test_add_l2_resident_input_hand_values(a100):
    # 40 MiB L2 at 5,120 B/cycle x 1.41 GHz; half of it holds the previous kernel's output
    d = dataclasses.replace(_toy(a100), global_buffer_reuse_fraction=0.5)
    l2_bw, cap = 5120 * 1.41e9, 0.5 * 40 * 2 ** 20
    hbm = 2e12 * 0.9
    n = 2.0 ** 21                      # footprint 12 MiB < 20 MiB: the whole input resident
    want = 4 * n / hbm + 2 * n / l2_bw
    assert float(jm.add_latency(d, n, overhead=False)) == pytest.approx(want, rel=1e-6)
    assert float(jm.add_latency(d, n)) == pytest.approx(math.hypot(want, 2e-6), rel=1e-6)
    n = 2.0 ** 26                      # footprint 384 MiB: a share cap / footprint of it
    r = 2 * n * cap / (6 * n)
    want = (6 * n - r) / hbm + r / l2_bw
    assert float(jm.add_latency(d, n, overhead=False)) == pytest.approx(want, rel=1e-6)
    # faster than without reuse, by less as the footprint outgrows the L2; still monotone
    ns = jnp.logspace(3, 10, 29)
    t0 = np.asarray(jm.add_latency(_toy(a100), ns))
    t1 = np.asarray(jm.add_latency(d, ns))
    assert np.all(t1 <= t0) and np.all(np.diff(t1) > 0)
    gain = 1 - t1 / t0
    assert gain[-1] < 0.01 and gain.max() > 0.2


def test_add_reuse_gradient_matches_finite_difference(a100):
    d = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), _toy(a100))

    def f(frac):
        return jm.add_latency.single(
            dataclasses.replace(d, global_buffer_reuse_fraction=frac), 2.0 ** 25)

    g = float(jax.grad(f)(0.3))
    h = 1e-6
    assert g == pytest.approx((float(f(0.3 + h)) - float(f(0.3 - h))) / (2 * h), rel=1e-5)
    assert g < 0
    assert np.isfinite(float(jax.grad(f)(0.0)))


def test_floor_combine_hand_values_inf_and_gradient():
    from jaxmodel.ops.vector import floor_combine
    assert float(floor_combine(3e-6, 4e-6)) == pytest.approx(5e-6, rel=1e-6)
    assert float(floor_combine(0.0, 2e-6)) == pytest.approx(2e-6, rel=1e-6)
    assert np.isinf(float(floor_combine(jnp.inf, 2e-6)))
    # between full overlap (max) and none (sum)
    t = np.logspace(-8, -3, 11)
    c = np.asarray(floor_combine(jnp.asarray(t), 2e-6))
    assert np.all(c >= np.maximum(t, 2e-6) * (1 - 1e-6)) and np.all(c <= t + 2e-6)
    g = jax.grad(lambda x: floor_combine(x, x))(0.0)
    assert np.isfinite(float(g))
    g = jax.grad(lambda f: floor_combine(jnp.inf, f))(1e-6)    # infeasible: no NaN leaks
    assert float(g) == 0.0


def test_floor_is_a_floor_not_an_addend(a100):
    d = _toy(a100)
    n = jnp.logspace(1, 9, 9)
    t = np.asarray(jm.add_latency(d, n))
    assert np.all(t >= 2e-6 - 1e-15)
    assert np.all(np.diff(t) >= 0)
    big = float(jm.add_latency(d, 1e9))
    assert big == pytest.approx(float(jm.add_latency(d, 1e9, overhead=False)))


def test_invalid_sizes_are_inf(a100):
    assert np.isinf(float(jm.rmsnorm_latency(a100, 0.0, 4096.0)))
    assert np.isinf(float(jm.rope_latency(a100, 16.0, 0.0, 8.0, 128.0)))
    assert np.isinf(float(jm.silu_mul_latency(a100, -1.0)))


def test_vmap_matches_loop_and_jit_matches_eager(a100):
    rows = jnp.array([1.0, 64.0, 4096.0, 16384.0])
    batched = np.asarray(jm.rmsnorm_latency(a100, rows, 8192.0))
    loop = [float(jm.rmsnorm_latency.single(a100, r, 8192.0)) for r in rows]
    np.testing.assert_allclose(batched, loop, rtol=1e-6)
    f = jax.jit(lambda r: jm.silu_mul_latency.single(a100, r))
    assert float(f(1e7)) == pytest.approx(float(jm.silu_mul_latency.single(a100, 1e7)),
                                          rel=1e-6)


def test_gradient_matches_finite_difference(a100):
    d = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float64), _toy(a100))

    def f(bw):
        return jm.rmsnorm_latency.single(dataclasses.replace(d, mem_bw=bw), 8192.0, 8192.0)

    g = float(jax.grad(f)(2e12))
    h = 1e6
    fd = (float(f(2e12 + h)) - float(f(2e12 - h))) / (2 * h)
    assert g == pytest.approx(fd, rel=1e-5)
    assert g < 0


def test_float32_finite(a100, float32):
    t = jm.rope_latency(a100, 8192.0, 64.0, 8.0, 128.0)
    assert t.dtype == jnp.float32 and np.isfinite(float(t))


def test_layer_uses_rmsnorm_rope_silu_for_llama_only():
    import hw_db
    system = hw_db.system("dgx_a100")
    par = jm.Parallelism(tp=1)
    dev = system.device
    llama = hw_db.model("llama2-7b")
    t = jm.layer_breakdown(system, llama, par, 1, 2048)
    rms = float(jm.rmsnorm_latency(dev, 2048.0, 4096.0))
    assert float(t["layernorm_mha"]) == pytest.approx(rms, rel=1e-5)
    assert float(t["act"]) == pytest.approx(
        float(jm.silu_mul_latency(dev, 2048.0 * llama.d_ff, rows=2048.0)), rel=1e-5)
    rope = float(jm.rope_latency(dev, 2048.0, 32.0, 32.0, 128.0))
    q = float(jm.gemm_latency(dev, 2048, 4096, 4096))
    assert float(t["qkv"]) == pytest.approx(3 * q + rope, rel=1e-4)
    gpt = hw_db.model("gpt3-13b")
    tg = jm.layer_breakdown(system, gpt, par, 1, 2048)
    assert float(tg["layernorm_mha"]) == pytest.approx(
        float(jm.layernorm_latency(dev, 2048.0, gpt.d_model)), rel=1e-5)
