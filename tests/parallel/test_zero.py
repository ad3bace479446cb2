"""ZeRO-3 / FSDP execution model (jaxmodel.parallel.zero) against hand-derived compositions."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.parallel import zero


@pytest.fixture(scope="module")
def sys2():
    return hw_db.system("dgx_a100", nodes=2)


PSI, N = 1.2e9, 24.0          # parameters, units
CF, CB = 0.010, 0.020         # compute per unit, s


def _coll(system, op, nbytes, g, stride=1.0):
    return float(jm.collective_latency(system, op, nbytes, g, stride=stride))


def test_pipelined_hand_value(sys2):
    g = _coll(sys2, "all_gather", PSI / N * 2, 16)
    r = _coll(sys2, "reduce_scatter", PSI / N * 2, 16)
    z = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, channels=0.0)
    fwd = g + (N - 1) * max(CF, g) + CF
    bwd = g + (N - 1) * max(CB, g + r) + CB + r
    assert float(z["total"]) == pytest.approx(fwd + bwd, rel=1e-6)
    assert float(z["compute"]) == pytest.approx(N * (CF + CB))
    assert float(z["contention"]) == pytest.approx(0.0)
    assert float(z["gather"]) == pytest.approx(2 * N * g, rel=1e-6)
    assert float(z["reduce_scatter"]) == pytest.approx(N * r, rel=1e-6)
    assert bool(z["feasible"])


def test_no_prefetch_is_serial(sys2):
    g = _coll(sys2, "all_gather", PSI / N * 2, 16)
    r = _coll(sys2, "reduce_scatter", PSI / N * 2, 16)
    z = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, prefetch=0.0)
    assert float(z["total"]) == pytest.approx(N * (g + CF) + N * (g + CB + r), rel=1e-6)


def test_microbatches_regather_and_reduce(sys2):
    g = _coll(sys2, "all_gather", PSI / N * 2, 16)
    r = _coll(sys2, "reduce_scatter", PSI / N * 2, 16)
    fwd = g + (N - 1) * max(CF, g) + CF
    bwd_rs = g + (N - 1) * max(CB, g + r) + CB + r
    bwd_nors = g + (N - 1) * max(CB, g) + CB
    ds = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 4.0, channels=0.0)
    assert float(ds["total"]) == pytest.approx(4 * fwd + 4 * bwd_rs, rel=1e-6)
    fsdp = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 4.0, channels=0.0,
                           reduce_every_microbatch=0.0)
    assert float(fsdp["total"]) == pytest.approx(4 * fwd + 3 * bwd_nors + bwd_rs, rel=1e-6)
    assert float(fsdp["reduce_scatter"]) == pytest.approx(N * r, rel=1e-6)


def test_limits(sys2):
    # one device: no communication, compute only
    z = zero.zero3_step(sys2, PSI, N, CF, CB, 1.0, 2.0)
    assert float(z["total"]) == pytest.approx(2 * N * (CF + CB))
    assert float(z["exposed_comm"]) == pytest.approx(0.0, abs=1e-12)
    # "infinite" network → compute only (up to the base latencies)
    fast = dataclasses.replace(sys2, levels=[dataclasses.replace(
        lv, bw_per_device=lv.bw_per_device * 1e9, base_latency=0.0, link_latency=0.0,
        switch_latency=0.0, chunk_latency=0.0, nccl_link=-1.0) for lv in sys2.levels])
    z = zero.zero3_step(fast, PSI, N, CF, CB, 16.0, 1.0)
    assert float(z["total"]) == pytest.approx(N * (CF + CB), rel=1e-4)
    # no compute → communication-bound floor: every gather and reduce-scatter in sequence
    z = zero.zero3_step(sys2, PSI, N, 0.0, 0.0, 16.0, 1.0)
    assert float(z["total"]) == pytest.approx(float(z["gather"] + z["reduce_scatter"]),
                                              rel=1e-6)


def test_comm_bound_throughput_falls_as_one_over_devices():
    """Fixed global batch: compute per device ∝ 1/N, communication per device ~ constant
    (3Ψ): once communication dominates, throughput per device ∝ 1/step/N falls ~1/N."""
    psi, n = 175e9, 96.0
    cf, cb = 0.05, 0.15              # per layer for 384 devices' share of the batch
    tput = []
    for k, nodes in enumerate((48, 96, 192, 384)):
        s = hw_db.system("dgx_a100", nodes=nodes)
        z = zero.zero3_step(s, psi, n, cf / 2 ** k, cb / 2 ** k, 8.0 * nodes, 1.0)
        floor = max(float(z["compute"]), float(z["gather"] + z["reduce_scatter"]))
        assert float(z["total"]) >= floor * (1 - 1e-9)
        tput.append(1.0 / (float(z["total"]) * 8 * nodes))
    ratios = np.array(tput[1:]) / np.array(tput[:-1])
    # deep in the comm-bound regime: ~1/N, a little faster (NCCL's flat ring over all ranks
    # has N − 1 steps, its latency grows with N)
    assert 0.4 < ratios[-1] < 0.55
    assert np.all(ratios < 1.0)


def test_hsdp_shards_inside_the_node(sys2):
    plain = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0)
    hsdp = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, shard_group=8.0)
    g8 = _coll(sys2, "all_gather", PSI / N * 2, 8)
    a2 = _coll(sys2, "all_reduce", PSI / N * 2 / 8, 2, stride=8.0)
    assert float(hsdp["gather"]) == pytest.approx(2 * N * g8, rel=1e-6)
    assert float(hsdp["replica_allreduce"]) == pytest.approx(N * a2, rel=1e-6)
    assert float(plain["replica_allreduce"]) == 0.0
    assert float(hsdp["gather"]) < float(plain["gather"])


def test_contention_slows_compute(sys2):
    base = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, channels=0.0)
    cont = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, channels=16.0,
                           compute_bytes_fwd=1e9, compute_bytes_bwd=2e9)
    assert float(cont["contention"]) > 0
    assert float(cont["total"]) > float(base["total"])
    np.testing.assert_allclose(float(cont["compute"] + cont["contention"]
                                     + cont["exposed_comm"]), float(cont["total"]), rtol=1e-9)


def test_memory_hand_values():
    m = zero.zero3_memory(1e9, 10.0, 100.0, prefetch=1.0)
    # weights 2·(1e9/100 + 2·1e8), grads 4·(1e7 + 1e8), optimizer 12·1e7
    assert float(m["weights"]) == pytest.approx(2 * (1e7 + 2e8))
    assert float(m["gradients"]) == pytest.approx(4 * (1e7 + 1e8))
    assert float(m["optimizer"]) == pytest.approx(1.2e8)
    no_sync = zero.zero3_memory(1e9, 10.0, 100.0, reduce_every_microbatch=0.0)
    assert float(no_sync["gradients"]) == pytest.approx(4e9)
    hsdp = zero.zero3_memory(1e9, 10.0, 100.0, shard_group=10.0)
    assert float(hsdp["optimizer"]) == pytest.approx(1.2e9)


@pytest.mark.slow
def test_vmap_jit_and_gradients(sys2):
    def f(cf, bw):
        lv = list(sys2.levels)
        lv[-1] = dataclasses.replace(lv[-1], bw_per_device=bw)
        s = dataclasses.replace(sys2, levels=lv)
        return zero.zero3_step(s, PSI, N, cf, 2 * cf, 16.0, 2.0,
                               compute_bytes_fwd=1e9, compute_bytes_bwd=2e9)["total"]
    cfs = jnp.array([0.001, 0.005, 0.02, 0.05])
    bws = jnp.array([12.5e9, 25e9, 25e9, 50e9])
    fj = jax.jit(f)
    loop = [float(fj(a, b)) for a, b in zip(cfs, bws)]
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(cfs, bws)), loop, rtol=1e-10)
    assert float(f(cfs[1], bws[1])) == pytest.approx(loop[1], rel=1e-12)    # eager
    grad = jax.jit(jax.grad(f, argnums=(0, 1)))
    for x0 in ((0.002, 25e9), (0.05, 25e9)):      # comm-bound and compute-bound
        gc, gb = grad(*x0)
        assert np.isfinite(float(gc)) and np.isfinite(float(gb))
        h = 1e-7
        fd_c = (fj(x0[0] + h, x0[1]) - fj(x0[0] - h, x0[1])) / (2 * h)
        assert float(gc) == pytest.approx(float(fd_c), rel=1e-4)
        hb = 1e3
        fd_b = (fj(x0[0], x0[1] + hb) - fj(x0[0], x0[1] - hb)) / (2 * hb)
        assert float(gb) == pytest.approx(float(fd_b), rel=1e-3, abs=1e-18)
    # bandwidth matters only when communication-bound
    assert float(grad(0.002, 25e9)[1]) < 0


def test_float32(float32, sys2):
    z = zero.zero3_step(sys2, PSI, N, jnp.float32(CF), jnp.float32(CB), 16.0, 1.0)
    assert z["total"].dtype == jnp.float32
    assert np.isfinite(float(z["total"]))


def test_per_tensor_call_overhead_hand_value():
    """384 ranks on 48 DGX A100 nodes: NCCL flat ring, 336 NVLink steps + 47 network steps.
    Simple: 8.4 + 336·max(3.4, 3·1.0) + 47·14 µs; LL: 6.6 + 336·max(0.6, 1.0) + 47·2.7 µs
    (NCCL's tuning constants and netOverhead of a ring across nodes); list API: one copy
    kernel (add_overhead_s) per rank and call."""
    s = hw_db.system("dgx_a100", nodes=48)
    simple = (8.4 + 336 * 3.4 + 47 * 14.0) * 1e-6
    ll = (6.6 + 336 * 1.0 + 47 * 2.7) * 1e-6
    assert float(zero.call_overhead(s, 384.0, 1.0, 1.0, 0.0, 0.0)) == pytest.approx(simple,
                                                                                    rel=1e-5)
    assert float(zero.call_overhead(s, 384.0, 1.0, 0.0, 1.0, 0.0)) == pytest.approx(ll,
                                                                                    rel=1e-5)
    copies = 12 * 384 * float(s.device.add_overhead_s)
    assert float(zero.call_overhead(s, 384.0, 1.0, 4.0, 8.0, 1.0)) == pytest.approx(
        4 * simple + 8 * ll + copies, rel=1e-5)
    # grows with the ranks; a group of one costs nothing
    big = hw_db.system("dgx_a100", nodes=192)
    assert float(zero.call_overhead(big, 1536.0, 1.0, 4.0, 8.0)) > 3.5 * float(
        zero.call_overhead(s, 384.0, 1.0, 4.0, 8.0))
    assert float(zero.call_overhead(s, 1.0, 1.0, 4.0, 8.0)) == 0.0
    # inside one node only NVLink steps: 8 ranks, Simple = 8.4 + 7·3.4 µs
    assert float(zero.call_overhead(s, 8.0, 1.0, 1.0, 0.0, 0.0)) == pytest.approx(
        (8.4 + 7 * 3.4) * 1e-6, rel=1e-5)
    # vmapped over the group size = the loop; finite gradient
    gs = jnp.asarray([16.0, 64.0, 384.0])
    v = jax.vmap(lambda g: zero.call_overhead(s, g, 1.0, 4.0, 8.0))(gs)
    np.testing.assert_allclose(np.asarray(v), [float(zero.call_overhead(s, g, 1.0, 4.0, 8.0))
                                               for g in gs], rtol=1e-6)
    d = jax.grad(lambda g: zero.call_overhead(s, g, 1.0, 4.0, 8.0))(384.0)
    assert np.isfinite(float(d)) and float(d) > 0
