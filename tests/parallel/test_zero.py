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
    t, _ = zero.per_tensor_collectives(sys2, "all_gather", (jnp.float32(3e8), 1e8), 16.0,
                                       ring_efficiency=jnp.float32(0.35))
    assert t.dtype == jnp.float32 and np.isfinite(float(t)) and float(t) > 0
    t, _ = zero.per_tensor_collectives(sys2, "reduce_scatter", (jnp.float32(3e8), 1e3), 16.0)
    assert t.dtype == jnp.float32 and np.isfinite(float(t)) and float(t) > 0


def test_per_tensor_collectives_hand_value():
    """One NCCL collective per tensor (the comm model's time over the ring efficiency), g copy
    kernels of the list API per call and the call path's memory traffic: 3 bytes moved per
    gathered byte (zero-fill, copy out), 4 per reduce-scattered byte (pre-division, copy in);
    tensors below the persistence threshold are reduce-scattered but never gathered."""
    s = hw_db.system("dgx_a100", nodes=48)
    dev = s.device
    h = 12288.0
    el = (3 * h * h, h * h, 4 * h)                   # 4h = 49,152 < 10^5: persistent
    mem = float(dev.mem_bw * dev.add_bw_efficiency)
    copy = 384 * float(dev.add_overhead_s)
    for op, hbm, kept in (("all_gather", 3.0, 2), ("reduce_scatter", 4.0, 3)):
        nbytes = [2 * x for x in el[:kept]]
        nccl = [_coll(s, op, b, 384.0) for b in nbytes]
        t, ok = zero.per_tensor_collectives(s, op, el, 384.0, ring_efficiency=1.0)
        assert bool(ok)
        assert float(t) == pytest.approx(sum(nccl) + kept * copy + hbm * sum(nbytes) / mem,
                                         rel=1e-6)
        flat, _ = zero.per_tensor_collectives(s, op, el, 384.0, list_api=0.0,
                                              ring_efficiency=1.0)
        assert float(flat) == pytest.approx(sum(nccl), rel=1e-6)
        slow, _ = zero.per_tensor_collectives(s, op, el, 384.0, list_api=0.0,
                                              ring_efficiency=0.25)
        assert float(slow) == pytest.approx(4 * sum(nccl), rel=1e-6)
        # default: the calibrated efficiency (this ring crosses InfiniBand); counts multiply
        cal, _ = zero.per_tensor_collectives(s, op, el, 384.0, list_api=0.0)
        assert float(cal) == pytest.approx(sum(nccl) / zero.FLAT_RING_EFFICIENCY, rel=1e-6)
        two, _ = zero.per_tensor_collectives(s, op, el, 384.0, counts=(2.0, 2.0, 2.0))
        assert float(two) == pytest.approx(2 * float(zero.per_tensor_collectives(
            s, op, el, 384.0)[0]), rel=1e-6)
    # a group of one costs nothing; the cost grows with the ranks at fixed bytes
    assert float(zero.per_tensor_collectives(s, "all_gather", el, 1.0)[0]) == 0.0
    big = hw_db.system("dgx_a100", nodes=192)
    assert float(zero.per_tensor_collectives(big, "all_gather", el, 1536.0)[0]) > float(
        zero.per_tensor_collectives(s, "all_gather", el, 384.0)[0])


@pytest.mark.slow     # compile-heavy; `make test-all`
def test_per_tensor_collectives_jit_vmap_grad():
    s = hw_db.system("dgx_a100", nodes=48)

    def f(g, eff):
        return zero.per_tensor_collectives(s, "reduce_scatter", (0.5e8, 1.5e8), g,
                                           ring_efficiency=eff)[0]
    gs = jnp.asarray([16.0, 64.0, 384.0])
    effs = jnp.asarray([1.0, 0.5, 0.35])
    loop = [float(f(g, e)) for g, e in zip(gs, effs)]                  # eager
    np.testing.assert_allclose(np.asarray(jax.vmap(jax.jit(f))(gs, effs)), loop, rtol=1e-6)
    d = jax.grad(f, argnums=1)(384.0, 0.5)
    assert np.isfinite(float(d)) and float(d) < 0          # a faster ring → less time
    nccl = sum(_coll(s, "reduce_scatter", b, 384.0) for b in (1e8, 3e8))
    assert float(d) == pytest.approx(-nccl / 0.25, rel=1e-5)             # d/de (T/e)


def test_ring_efficiency_applies_where_the_ring_crosses_infiniband():
    s = hw_db.system("dgx_a100", nodes=4)
    net = hw_db.load_toml(hw_db.ROOT / "tech" / "network.toml")["infiniband"]
    assert zero.FLAT_RING_EFFICIENCY == net["flat_ring_efficiency"]["value"]
    assert float(zero.ring_efficiency_of(s, 8.0)) == 1.0          # NVSwitch only
    assert float(zero.ring_efficiency_of(s, 2.0, stride=4.0)) == 1.0
    for g, stride in ((16.0, 1.0), (4.0, 8.0), (32.0, 1.0)):
        assert float(zero.ring_efficiency_of(s, g, stride)) == pytest.approx(
            zero.FLAT_RING_EFFICIENCY)
    assert float(zero.ring_efficiency_of(s, 16.0, efficiency=0.5)) == 0.5
    assert float(zero.ring_efficiency_of(s, 1.0)) == 1.0


def test_layer_tensors_of_a_megatron_gpt_layer():
    """QKV, output, FC1, FC2 matrices; QKV and FC1 biases; six d_model vectors (output and
    FC2 biases, two LayerNorms' scale and shift); column/row-parallel ones split over TP."""
    h = 12288.0
    gpt = jm.Model(n_layers=96.0, d_model=h, n_heads=96.0, n_kv_heads=96.0, head_dim=128.0,
                   d_ff=4 * h, vocab_size=51200.0)
    el, cnt = zero.layer_tensors(gpt)
    assert [float(x) for x in el] == [3 * h * h, h * h, 4 * h * h, 4 * h * h, 3 * h, 4 * h, h]
    assert [float(c) for c in cnt] == [1, 1, 1, 1, 1, 1, 6]
    el8, _ = zero.layer_tensors(gpt, tp=8.0)
    assert [float(x) for x in el8] == [3 * h * h / 8, h * h / 8, h * h / 2, h * h / 2,
                                       3 * h / 8, h / 2, h]
    # the matrices hold the layer's parameters (params.layer_params without the vectors)
    from jaxmodel.workload import params
    assert sum(float(x) for x in el[:4]) == pytest.approx(
        float(params.layer_params(gpt)) - 4 * h, rel=1e-12)
    llama = hw_db.model("llama2-7b")                 # GQA-free 7B, gated SwiGLU
    el, _ = zero.layer_tensors(llama)
    d, f = float(llama.d_model), float(llama.d_ff)
    assert [float(x) for x in el[:4]] == [3 * d * d, d * d, 2 * d * f, d * f]
    moe = hw_db.model("mixtral-8x7b")                # routed experts only: no dense FFN
    el, cnt = zero.layer_tensors(moe)
    assert float(el[2]) == 0.0 and float(cnt[2]) == 0.0 and float(cnt[5]) == 0.0


def test_impl_args():
    for impl, rc, want in ((0, 2, (1.0, 0.0, False)), (1, 2, (0.0, 1.0, True)),
                           (1, 1, (0.0, 0.0, True)), (1, 0, (0.0, 0.0, True))):
        got = zero.impl_args(float(impl), float(rc))
        assert (float(got[0]), float(got[1]), bool(got[2])) == want


def test_recompute_regathers_every_unit(sys2):
    """DeepSpeed with activation checkpointing: forward, re-forward and backward each gather
    a unit. Serial (no prefetch): N·(g + c_f) + N·(2g + c_b + r); pipelined: the backward's
    communication per unit is 2g + r."""
    g = _coll(sys2, "all_gather", PSI / N * 2, 16)
    r = _coll(sys2, "reduce_scatter", PSI / N * 2, 16)
    z = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, prefetch=0.0, recompute_gathers=1.0)
    assert float(z["total"]) == pytest.approx(N * (g + CF) + N * (2 * g + CB + r), rel=1e-6)
    assert float(z["gather"]) == pytest.approx(3 * N * g, rel=1e-6)
    p = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, channels=0.0, recompute_gathers=1.0)
    fwd = g + (N - 1) * max(CF, g) + CF
    bwd = 2 * g + (N - 1) * max(CB, 2 * g + r) + CB + r
    assert float(p["total"]) == pytest.approx(fwd + bwd, rel=1e-6)
    # given collective times, two micro-batches: every micro-batch gathers three times
    m2 = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 2.0, prefetch=0.0, recompute_gathers=1.0,
                         collective_times=(0.01, 0.02, 0.0))
    assert float(m2["total"]) == pytest.approx(2 * N * (3 * 0.01 + 0.02 + CF + CB), rel=1e-9)
    jit = jax.jit(lambda c: zero.zero3_step(sys2, PSI, N, c, CB, 16.0, 1.0, prefetch=0.0,
                                            recompute_gathers=1.0)["total"])
    assert float(jit(CF)) == pytest.approx(float(z["total"]), rel=1e-9)
    assert float(jax.grad(lambda c: zero.zero3_step(
        sys2, PSI, N, c, CB, 16.0, 1.0, prefetch=0.0, recompute_gathers=1.0)["total"])(CF)
    ) == pytest.approx(N, rel=1e-9)


def test_impl_costs_hand_values():
    """FSDP2: copy-out 2·w, copy-in w + g, no 16-bit shard beside an fp32 master, unsharded
    gradients in w; DeepSpeed 2021: none of these, its 16-bit shard kept."""
    c = zero.impl_costs(jnp.asarray([0.0, 1.0]), 2.0, 4.0, 4.0)
    np.testing.assert_allclose(c["copy_out_bytes"], [4.0, 0.0])
    np.testing.assert_allclose(c["copy_in_bytes"], [6.0, 0.0])
    np.testing.assert_allclose(c["shard_weight_bytes"], [0.0, 2.0])
    np.testing.assert_allclose(c["unsharded_grad_bytes"], [2.0, 0.0])
    # fp32 training (no separate master): FSDP keeps the fp32 shard as the weights
    assert float(zero.impl_costs(0.0, 4.0, 4.0, 0.0)["shard_weight_bytes"]) == 4.0


def test_copy_kernels_lengthen_the_unit_compute(sys2):
    """FSDP2's copy-out (after every gather) and copy-in (before every reduce-scatter) run
    on the compute stream: given collective times, no contention, one micro-batch,
    T_f = g + (N−1)·max(c_f + t_o, g) + c_f + t_o and
    T_b = g + (N−1)·max(c_b + t_o + t_i, g + r) + c_b + t_o + t_i + r, with
    t the memory-bound elementwise kernel of Ψ/N elements (jm.elementwise_latency)."""
    dev = sys2.device
    g, r = 0.004, 0.008
    t_o = float(jm.elementwise_latency(dev, PSI / N, 4.0, 0.0))
    t_i = float(jm.elementwise_latency(dev, PSI / N, 6.0, 0.0))
    assert 0.0 < t_o < t_i < 0.1
    z = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, channels=0.0,
                        collective_times=(g, r, 0.0), copy_out_bytes=4.0, copy_in_bytes=6.0)
    fwd = g + (N - 1) * max(CF + t_o, g) + CF + t_o
    bwd = g + (N - 1) * max(CB + t_o + t_i, g + r) + CB + t_o + t_i + r
    assert float(z["total"]) == pytest.approx(fwd + bwd, rel=1e-9)
    assert float(z["copies"]) == pytest.approx(N * (2 * t_o + t_i), rel=1e-9)
    assert float(z["compute"]) == pytest.approx(N * (CF + CB))      # the copies are not compute
    plain = zero.zero3_step(sys2, PSI, N, CF, CB, 16.0, 1.0, channels=0.0,
                            collective_times=(g, r, 0.0))
    assert float(plain["copies"]) == 0.0
    assert float(z["exposed_comm"]) > float(plain["exposed_comm"])


def test_fsdp2_memory_hand_values():
    """FSDP2 (shard_weight_bytes 0, unsharded gradients 2 B): weights are the gathered units
    only, 2·(1 + 1)·1e8; gradients 4·1e7 (fp32 shard) + (4 + 2)·1e8 (reduce-scatter input and
    the unsharded gradients of one unit); the optimizer's 12 B include the fp32 master."""
    m = zero.zero3_memory(1e9, 10.0, 100.0, prefetch=1.0, shard_weight_bytes=0.0,
                          unsharded_grad_bytes=2.0)
    assert float(m["weights"]) == pytest.approx(2 * 2e8)
    assert float(m["gradients"]) == pytest.approx(4e7 + 6e8)
    assert float(m["optimizer"]) == pytest.approx(1.2e8)
    assert float(m["total"]) == pytest.approx(4e8 + 6.4e8 + 1.2e8)
