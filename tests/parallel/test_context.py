"""Context parallelism (jaxmodel.parallel.context) against hand-derived values and limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.parallel import context as cx
from jaxmodel.workload import layer as _layer


@pytest.fixture(scope="module")
def sys2():
    return hw_db.system("dgx_a100", nodes=2)


@pytest.fixture(scope="module")
def model():
    return hw_db.model("llama3-8b")


def _par(fa=1.0, tp=4.0):
    return jm.Parallelism(dp=1.0, tp=tp, pp=1.0, sp=True, flash_attention=fa,
                          recompute="selective")


def test_checks_and_helpers(model):
    assert [bool(ok) for ok, _ in cx.cp_checks(8192.0, 4.0)] == [True, True]
    assert not bool(cx.cp_checks(8192.0, 3.0)[1][0])        # 8192 not divisible by 6
    assert not bool(cx.cp_checks(8192.0, 2.5)[0][0])
    assert float(cx.causal_imbalance(4.0, 1.0)) == 1.0
    assert float(cx.causal_imbalance(4.0, 0.0)) == pytest.approx(7 / 4)
    # K and V of 8192/4 tokens, 8 KV heads / tp 4 = 2, head 128, 2 bytes
    assert float(cx.kv_chunk_bytes(model, _par(), 1.0, 8192.0, 4.0)) == pytest.approx(
        2 * 2048 * 2 * 128 * 2)
    assert cx.mode_code("allgather") == 1.0 and cx.mode_code("ring") == 0.0
    with pytest.raises(ValueError, match="mode"):
        cx.mode_code("tree")


@pytest.mark.slow
def test_cp1_reproduces_training_layer_times(sys2, model):
    par = _par(fa=0.0)
    ref = _layer.training_layer_times.single(sys2, model, par, 1.0, 4096.0)
    got = cx.cp_layer_times(sys2, model, par, 1.0, 4096.0, 1.0)
    for k in ("fwd", "bwd", "recompute", "tp_comm_fwd", "tp_comm_bwd"):
        assert float(got[k]) == pytest.approx(float(ref[k]), rel=1e-12)
    assert float(got["cp_comm_fwd"]) == 0.0


def test_ring_attention_hand_value(sys2):
    # cp = 4 blocks of 1 ms forward; p2p 0.3 ms hidden; no contention (0 channels):
    # fwd = 3·max(1, 0.3) + 1 = 4 ms → attention unchanged, no exposed comm
    kv = 1e6
    # tp 4 × cp 4 = 16 devices span both nodes: the ring's worst hop crosses them
    t_p2p = float(jm.collective_latency(sys2, "p2p", kv, 2, stride=8.0))
    r = cx.cp_attention_time(sys2, 4e-3, 8e-3, kv, 4.0, tp=4.0, mode=cx.RING, channels=0.0)
    assert float(r["fwd"]) == pytest.approx(3 * max(1e-3, t_p2p) + 1e-3)
    t_p2p2 = float(jm.collective_latency(sys2, "p2p", 2 * kv, 2, stride=8.0))
    assert float(r["bwd"]) == pytest.approx(3 * max(2e-3, t_p2p2) + 2e-3 + t_p2p)
    # comm-bound ring: blocks of 1 µs
    r = cx.cp_attention_time(sys2, 4e-6, 8e-6, 1e8, 4.0, tp=4.0, mode=cx.RING, channels=0.0)
    t = float(jm.collective_latency(sys2, "p2p", 1e8, 2, stride=8.0))
    assert float(r["fwd"]) == pytest.approx(3 * t + 1e-6)
    assert float(r["comm_fwd"]) == pytest.approx(3 * t + 1e-6 - 4e-6)


def test_allgather_hand_value(sys2):
    kv = 1e6
    ag = float(jm.collective_latency(sys2, "all_gather", 4 * kv, 4, stride=4.0))
    rs = float(jm.collective_latency(sys2, "reduce_scatter", 4 * kv, 4, stride=4.0))
    r = cx.cp_attention_time(sys2, 4e-3, 8e-3, kv, 4.0, tp=4.0, mode=cx.ALLGATHER)
    assert float(r["fwd"]) == pytest.approx(ag + 4e-3)
    assert float(r["bwd"]) == pytest.approx(8e-3 + rs)


def test_group_must_fit(sys2):
    # tp 8 × cp 4 = 32 devices on a 16-device system
    r = cx.cp_attention_time(sys2, 1e-3, 2e-3, 1e6, 4.0, tp=8.0, mode=cx.RING)
    assert not bool(r["feasible"]) and np.isinf(float(r["fwd"]))


@pytest.mark.slow
def test_layer_time_falls_with_cp_and_balancing_helps(sys2, model):
    par = _par()
    one = cx.cp_layer_times(sys2, model, par, 1.0, 16384.0, 1.0)
    bal = cx.cp_layer_times(sys2, model, par, 1.0, 16384.0, 4.0, balanced=1.0)
    unb = cx.cp_layer_times(sys2, model, par, 1.0, 16384.0, 4.0, balanced=0.0)
    assert float(one["fwd"]) > float(unb["fwd"]) > float(bal["fwd"])
    assert float(one["bwd"]) > float(unb["bwd"]) > float(bal["bwd"])


def test_activation_memory_divided_by_cp(model):
    par = jm.Parallelism(dp=1.0, tp=4.0, pp=1.0, sp=True, flash_attention=1.0,
                         recompute="selective")
    a1 = float(cx.cp_activation_bytes(model, par, 1.0, 16384.0, 1.0))
    a4 = float(cx.cp_activation_bytes(model, par, 1.0, 16384.0, 4.0))
    kv = float(cx.kv_chunk_bytes(model, par, 1.0, 16384.0, 4.0))
    assert a4 == pytest.approx(a1 / 4 + 2 * kv, rel=1e-9)
    a4g = float(cx.cp_activation_bytes(model, par, 1.0, 16384.0, 4.0, mode=cx.ALLGATHER))
    assert a4g == pytest.approx(a1 / 4 + 4 * kv, rel=1e-9)


@pytest.mark.slow
def test_vmap_jit_grad_float64(sys2):
    def f(attn, kv):
        return cx.cp_attention_time(sys2, attn, 2 * attn, kv, 4.0, tp=4.0)["fwd"]
    attns = jnp.array([1e-4, 1e-3, 1e-2])
    kvs = jnp.array([1e8, 1e6, 1e7])
    fj = jax.jit(f)
    loop = [float(fj(a, k)) for a, k in zip(attns, kvs)]
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(attns, kvs)), loop, rtol=1e-10)
    assert float(f(attns[1], kvs[1])) == pytest.approx(loop[1], rel=1e-12)
    grad = jax.jit(jax.grad(f, argnums=(0, 1)))
    for a, k in ((1e-4, 1e8), (1e-2, 1e6)):
        ga, gk = grad(a, k)
        fd_a = (fj(a * (1 + 1e-6), k) - fj(a * (1 - 1e-6), k)) / (2e-6 * a)
        fd_k = (fj(a, k * (1 + 1e-6)) - fj(a, k * (1 - 1e-6))) / (2e-6 * k)
        assert float(ga) == pytest.approx(float(fd_a), rel=1e-4)
        # the link model counts whole packets: the size derivative is piecewise
        assert float(gk) == pytest.approx(float(fd_k), rel=2e-2, abs=1e-20)


def test_float32(float32, sys2):
    r = cx.cp_attention_time(sys2, jnp.float32(4e-3), jnp.float32(8e-3), 1e6, 4.0, tp=4.0)
    assert r["fwd"].dtype == jnp.float32 and np.isfinite(float(r["fwd"]))


@pytest.mark.slow
def test_attention_core_splits_as_the_ring_runs_it(model):
    """The attention of s/cp local queries is cp causal FlashAttention calls of s/cp × s/cp
    (1/cp of the causal work), not one s/cp × s call (the short-query shape of a KV-cache
    decode kernel): with FA-2 at 64k tokens the cp = 8 share costs between 1/8 of the unsplit
    attention and 1.5× that (smaller calls waste more on diagonal blocks and launches), and
    the layer's forward holds exactly cp square calls plus the exposed exchange."""
    system = hw_db.system("dgx_h100", nodes=8)
    par = _par(fa=2.0, tp=8.0)
    s, c = 65536.0, 8.0
    dev = system.device

    def attn(q, kv):
        g, v = _layer.layer_graph(dev, model, par, 1.0, q, kv, training=True)
        rows = _layer.evaluate(_layer.default_gemm, dev, g, v, backward=True)
        return sum(float(rows[k][0]) for k in ("qk", "softmax", "av"))

    whole, square = attn(s, s), attn(s / c, s / c)
    assert whole / c <= c * square <= 1.5 * whole / c
    got = cx.cp_layer_times(system, model, par, 1.0, s, c)
    one = cx.cp_layer_times(system, model, par, 1.0, s / c, 1.0)     # same token-wise work
    # fwd = token-wise rows + the ring attention (cp blocks of `square`, exchange hidden or not)
    assert float(got["fwd"]) - float(one["fwd"]) + square == pytest.approx(
        c * square + float(got["cp_comm_fwd"]), rel=1e-5)


def test_layer_breakdown_rejects_cp(sys2, model):
    par = jm.Parallelism(dp=1.0, tp=4.0, pp=1.0, cp=2.0, sp=True)
    with pytest.raises(ValueError, match="cp=2"):
        jm.layer_breakdown(sys2, model, par, 1, 4096)
