"""numerics helpers and the batching edge: hand values, NaN-free gradients, vmap vs loop."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
from jaxmodel import numerics as nm
from jaxmodel.batching import batched, batch_shape


def test_safe_div_and_grad_are_finite():
    assert float(nm.safe_div(6.0, 3.0)) == 2.0
    assert float(nm.safe_div(6.0, 0.0, fill=jnp.inf)) == jnp.inf
    g = jax.grad(lambda b: nm.safe_div(1.0, b, fill=0.0))(0.0)
    assert jnp.isfinite(g)


def test_masked_min_and_soft_min():
    v = jnp.array([3.0, 1.0, 2.0])
    assert float(nm.masked_min(v, jnp.array([True, False, True]))) == 2.0
    assert float(nm.masked_min(v, jnp.array([False, False, False]))) == jnp.inf
    s = nm.soft_min(v, jnp.array([True, True, True]), 1e-3)
    assert float(s) == pytest.approx(1.0, abs=1e-2)
    s_none = nm.soft_min(v, jnp.array([False, False, False]), 0.1)
    assert float(s_none) == jnp.inf
    g = jax.grad(lambda x: nm.soft_min(x, jnp.array([True, False, True]), 0.5))(v)
    assert bool(jnp.all(jnp.isfinite(g))) and float(g[1]) == 0.0


def test_smooth_ceil_div_value_and_gradient():
    assert float(nm.smooth_ceil_div(7.0, 2.0)) == 4.0
    assert float(jax.grad(lambda a: nm.smooth_ceil_div(a, 2.0))(7.0)) == pytest.approx(0.5)


def test_first_reason_picks_first_failure():
    ok, why = nm.first_reason([(jnp.array([True, False, False]), "out_of_memory"),
                               (jnp.array([True, True, False]), "heads_not_divisible")])
    assert ok.tolist() == [True, False, False]
    assert [nm.reason_name(c) for c in why] == ["ok", "out_of_memory", "out_of_memory"]
    ok, why = nm.first_reason([(jnp.array(True), "out_of_memory"),
                               (jnp.array(False), "heads_not_divisible")])
    assert nm.reason_name(why) == "heads_not_divisible"


def test_divides():
    assert nm.divides(jnp.array([2.0, 3.0, 0.0]), jnp.array([8.0, 8.0, 8.0])).tolist() == [
        True, False, False]


@batched
def _toy(dev, m, mode="sum"):
    cand = jnp.array([1.0, 2.0, 4.0])
    t = m / (dev.mem_bw * cand) + cand / dev.freq_hz
    return jnp.min(t) if mode == "sum" else jnp.max(t)


def test_batched_vmap_matches_loop_and_jit_matches_eager():
    dev = hw_db.device("a100_80gb")
    bws = np.array([1e12, 2e12, 3e12])
    batch = dataclasses.replace(dev, mem_bw=jnp.asarray(bws))
    got = _toy(batch, 1e9)
    loop = [_toy(dataclasses.replace(dev, mem_bw=float(b)), 1e9) for b in bws]
    np.testing.assert_allclose(got, loop, rtol=1e-12)
    eager = _toy.single(dataclasses.replace(dev, mem_bw=2e12), 1e9)
    np.testing.assert_allclose(got[1], eager, rtol=1e-12)
    assert _toy(batch, 1e9, mode="max").shape == (3,)


def test_batched_broadcasts_and_chunks():
    dev = hw_db.device("a100_80gb")
    batch = dataclasses.replace(dev, mem_bw=jnp.linspace(1e12, 2e12, 5000))
    assert batch_shape(batch) == (5000,)
    out = _toy(batch, jnp.full((5000,), 1e9))
    ref = _toy(dataclasses.replace(dev, mem_bw=jnp.linspace(1e12, 2e12, 5000)[4321]), 1e9)
    assert out.shape == (5000,) and float(out[4321]) == pytest.approx(float(ref))
    grid = _toy(dataclasses.replace(dev, mem_bw=jnp.array([[1e12], [2e12]])),
                jnp.array([1e8, 1e9, 1e10]))
    assert grid.shape == (2, 3)


def test_batched_grad():
    dev = hw_db.device("a100_80gb")
    g = jax.grad(lambda bw: _toy(dataclasses.replace(dev, mem_bw=bw), 1e9))(2e12)
    h = 1e6
    fd = (_toy(dataclasses.replace(dev, mem_bw=2e12 + h), 1e9)
          - _toy(dataclasses.replace(dev, mem_bw=2e12 - h), 1e9)) / (2 * h)
    assert float(g) == pytest.approx(float(fd), rel=1e-5)


def test_chunked_path_pads_to_whole_chunks_and_matches_vmap():
    from jaxmodel.batching import call_batched, pad_to_multiple
    padded = pad_to_multiple([jnp.arange(7.0), jnp.ones((7, 2))], 3)
    assert padded[0].shape == (9,) and padded[1].shape == (9, 2)
    np.testing.assert_array_equal(padded[0][7:], [6.0, 6.0])
    dev = hw_db.device("a100_80gb")
    bws = jnp.linspace(1e12, 2e12, 7)
    batch = dataclasses.replace(dev, mem_bw=bws)
    whole = _toy(batch, 1e9)                           # 7 <= chunk: one vmap
    chunked = call_batched(_toy.single, batch, 1e9, chunk=3)   # 3 chunks, last one padded
    assert chunked.shape == (7,)
    np.testing.assert_allclose(chunked, whole, rtol=1e-12)


@pytest.mark.parametrize("x64", [False, True])
def test_ceil_div_exact_at_integers(x64):
    """ceil(k·b / b) = k for every b in 1..1999 and k in 1..7, in float32 and float64, jitted
    with a broadcast scalar divisor (which XLA compiles as a multiplication by 1/b)."""
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", x64)
    try:
        b = jnp.arange(1.0, 2000.0)
        for k in range(1, 8):
            got = jax.jit(nm.ceil_div)(k * b, b)
            assert bool(jnp.all(got == k)), (k, int(jnp.sum(got != k)))
            # one more element needs one more tile
            assert bool(jnp.all(jax.jit(nm.ceil_div)(k * b + 1.0, b) == k + 1))
        cores = jnp.asarray(104.0)
        tiles = jnp.array([1456.0, 728.0, 364.0, 105.0, 1.0, 0.0])
        got = jax.jit(lambda t, c: nm.ceil_div(t, c))(tiles, cores)
        assert got.tolist() == [14.0, 7.0, 4.0, 2.0, 1.0, 0.0]
        assert float(nm.ceil_div(5.0, 0.0)) == 0.0 and float(nm.ceil_div(5.0, -2.0)) == 0.0
        assert float(jax.grad(nm.ceil_div)(7.0, 2.0)) == 0.0
    finally:
        jax.config.update("jax_enable_x64", prev)


def test_finalize_no_nan_no_silent_inf():
    value = jnp.array([1.0, jnp.inf, jnp.nan, 2.0, jnp.nan])
    feasible = jnp.array([True, True, True, False, False])
    reason = jnp.array([0, 0, 0, nm.reason_code("out_of_memory"),
                        nm.reason_code("invalid_device")], dtype=jnp.int32)
    v, ok, why = nm.finalize(value, feasible, reason)
    assert v.tolist() == [1.0, jnp.inf, jnp.inf, jnp.inf, jnp.inf]
    assert ok.tolist() == [True, False, False, False, False]
    assert [nm.reason_name(c) for c in why] == ["ok", "out_of_range", "out_of_range",
                                                "out_of_memory", "invalid_device"]
    # reason codes are append-only: the established ones keep their numbers
    assert nm.REASONS[:3] == ("ok", "invalid_device", "buffer_too_small")
    assert nm.reason_code("invalid_workload") == 14 and nm.reason_code("out_of_range") == 15


def test_operators_float32_match_float64():
    """The operator models agree between float32 and float64 to 1e-5 on 100 random shapes
    on each of A100, MI210 and TPUv3 (tile counts are exact in both precisions)."""
    import jaxmodel as jm
    rng = np.random.default_rng(0)
    rows = np.round(2 ** rng.uniform(0, 16, 300))
    cols = np.round(2 ** rng.uniform(0, 16, 300))
    ks = np.round(2 ** rng.uniform(0, 14, 300))
    names = ("a100_80gb", "mi210", "tpuv3")
    devs = [hw_db.device(n) for n in names]
    # one batched device (100 shapes each): one compilation per operator and precision
    fields = {f.name: np.repeat([float(getattr(d, f.name)) for d in devs], 100)
              for f in dataclasses.fields(devs[0]) if f.name != "name"}
    prev = jax.config.jax_enable_x64
    out = {}
    try:
        for x64 in (False, True):
            jax.config.update("jax_enable_x64", x64)
            dev = dataclasses.replace(devs[0], **{k: jnp.asarray(v) for k, v in fields.items()})
            out[x64] = [np.asarray(f, dtype=np.float64) for f in (
                jm.softmax_latency(dev, rows, cols), jm.layernorm_latency(dev, rows, cols),
                jm.gelu_latency(dev, rows * cols), jm.gemm_latency(dev, rows, cols, ks))]
    finally:
        jax.config.update("jax_enable_x64", prev)
    for a, b in zip(out[False], out[True]):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_weighted_zero_times_inf_and_finite_gradients():
    w = jnp.array([0.0, 2.0, 2.0, -1.0])
    t = jnp.array([jnp.inf, jnp.inf, 3.0, jnp.inf])
    assert nm.weighted(w, t).tolist() == [0.0, jnp.inf, 6.0, 0.0]
    gw, gt = jax.vmap(jax.grad(nm.weighted, argnums=(0, 1)))(w, t)
    assert bool(jnp.all(jnp.isfinite(gw))) and bool(jnp.all(jnp.isfinite(gt)))
    assert gw.tolist() == [0.0, 0.0, 3.0, 0.0] and gt.tolist() == [0.0, 0.0, 2.0, 0.0]
