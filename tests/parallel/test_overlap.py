"""Overlap with contention (jaxmodel.parallel.overlap) against hand-derived values and limits."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
from jaxmodel.parallel import overlap as ov


@pytest.fixture(scope="module")
def dev():
    return hw_db.device("a100_80gb")


def test_wire_and_hbm_bytes_hand_values():
    # ring all-gather over 4 of 1 GB: each device sends 3/4 GB; 2 HBM bytes per wire byte
    assert float(ov.ring_send_bytes("all_gather", 1e9, 4.0)) == pytest.approx(0.75e9)
    assert float(ov.ring_send_bytes("all_reduce", 1e9, 4.0)) == pytest.approx(1.5e9)
    assert float(ov.ring_send_bytes("p2p", 1e9, 2.0)) == pytest.approx(1e9)
    assert float(ov.comm_hbm_bytes("all_gather", 1e9, 4.0)) == pytest.approx(1.5e9)
    assert float(ov.comm_hbm_bytes("reduce_scatter", 1e9, 4.0)) == pytest.approx(2.25e9)
    with pytest.raises(ValueError, match="unknown op"):
        ov.ring_send_bytes("gossip", 1.0, 2.0)


def test_sm_share(dev):
    assert float(ov.sm_share(dev, 16.0)) == pytest.approx(16 / 108)
    assert float(ov.sm_share(dev, 1e6)) == pytest.approx(0.95)
    assert float(ov.sm_share(dev, 0.0)) == 0.0


def test_overlapped_time_hand_value_sm_only():
    # t_c = 1, t_m = 0.5, 20 % SMs taken: compute runs at 0.8 for 0.5 s, then alone:
    # total = 1 + (1 − 0.8)·0.5 = 1.1
    total, exposed, slow = ov.overlapped_time(1.0, 0.5, share=0.2)
    assert float(total) == pytest.approx(1.1)
    assert float(exposed) == pytest.approx(0.1)
    assert float(slow) == pytest.approx(0.1)
    # comm longer: t_c = 0.4 at 0.8 speed finishes at 0.5 < t_m = 1 → total = t_m
    total, exposed, slow = ov.overlapped_time(0.4, 1.0, share=0.2)
    assert float(total) == pytest.approx(1.0)
    assert float(slow) == pytest.approx(0.1)


def test_overlapped_time_hbm_contention_hand_value(dev):
    bw = float(dev.mem_bw * dev.mem_bw_efficiency)
    # compute needs half the memory bandwidth; the collective takes 3/4 of it for 1 s:
    # rate = min(1, (bw − 0.75 bw)/(0.5 bw)) = 0.5; total = 1 + 0.5·1 = 1.5 (t_c = 1, t_m = 1)
    total, _, slow = ov.overlapped_time(1.0, 1.0, compute_bytes=0.5 * bw,
                                        comm_bytes=0.75 * bw, share=0.0, dev=dev)
    assert float(total) == pytest.approx(1.5)
    assert float(slow) == pytest.approx(0.5)


def test_limits(dev):
    tc, tm = 0.7, 0.3
    # nothing overlappable → serial sum
    total, exposed, _ = ov.overlapped_time(tc, tm, 1e9, 1e9, 0.1, dev, overlappable=0.0)
    assert float(total) == pytest.approx(tc + tm)
    assert float(exposed) == pytest.approx(tm)
    # infinitely fast network → compute only
    total, exposed, slow = ov.overlapped_time(tc, 0.0, 1e9, 0.0, 0.1, dev)
    assert float(total) == pytest.approx(tc)
    assert float(exposed) == pytest.approx(0.0) and float(slow) == pytest.approx(0.0)
    # no contention → max
    total, _, _ = ov.overlapped_time(tc, tm)
    assert float(total) == pytest.approx(max(tc, tm))
    # one chunk → serial; many chunks, no contention → max (+ vanishing first/last chunk)
    assert float(ov.pipelined_time(tc, tm, 1.0)[0]) == pytest.approx(tc + tm)
    assert float(ov.pipelined_time(tc, tm, 1e6)[0]) == pytest.approx(max(tc, tm), rel=1e-5)


@pytest.mark.parametrize("tc,tm,n", [(1.0, 0.4, 4.0), (0.3, 1.0, 4.0), (1.0, 1.0, 10.0)])
def test_pipelined_two_stage_makespan(tc, tm, n):
    # without contention: exposed = t_m/n + (1 − 1/n)·max(0, t_m − t_c)
    _, exposed, _ = ov.pipelined_time(tc, tm, n)
    assert float(exposed) == pytest.approx(tm / n + (1 - 1 / n) * max(0.0, tm - tc))
    assert float(ov.bucketed_exposed(tc, tm, n)) == pytest.approx(float(exposed))


def test_bounds_and_monotonicity(dev):
    rng = np.random.default_rng(0)
    for _ in range(50):
        tc, tm = rng.uniform(0, 2, size=2)
        cb, mb = rng.uniform(0, 3e12, size=2)
        share = rng.uniform(0, 0.5)
        total, exposed, slow = ov.overlapped_time(tc, tm, cb, mb, share, dev)
        assert max(tc, tm) * (1 - 1e-9) <= float(total) <= (tc + tm) * (1 + 1e-9)
        assert 0 <= float(slow) <= float(exposed) + 1e-12
    tms = jnp.linspace(0.0, 2.0, 21)
    totals = jax.vmap(lambda t: ov.overlapped_time(1.0, t, 1e11, 1e11, 0.15, dev)[0])(tms)
    assert np.all(np.diff(np.asarray(totals)) >= -1e-12)
    shares = jnp.linspace(0.0, 0.9, 10)
    totals = jax.vmap(lambda s: ov.overlapped_time(1.0, 0.8, share=s)[0])(shares)
    assert np.all(np.diff(np.asarray(totals)) >= -1e-12)
    # more chunks never hurt without contention
    ns = jnp.array([1.0, 2.0, 4.0, 8.0, 16.0])
    ex = jax.vmap(lambda n: ov.pipelined_time(1.0, 0.7, n)[1])(ns)
    assert np.all(np.diff(np.asarray(ex)) <= 1e-12)


def test_vmap_matches_loop_and_jit_matches_eager(dev):
    tcs = jnp.array([0.1, 0.5, 1.0, 2.0])
    tms = jnp.array([1.0, 0.5, 0.2, 0.0])
    f = lambda a, b: ov.pipelined_time(a, b, 4.0, 1e10, 3e9, 0.1, dev)[0]  # noqa: E731
    batched = jax.vmap(f)(tcs, tms)
    loop = [float(f(a, b)) for a, b in zip(tcs, tms)]
    np.testing.assert_allclose(np.asarray(batched), loop, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jit(f)(tcs, tms)), loop, rtol=1e-12)


def test_batched_device_leaf(dev):
    d = dataclasses.replace(dev, mem_bw=jnp.array([1e12, 2e12, 4e12]))
    total, _, _ = ov.overlapped_time(1.0, 1.0, 0.5e12, 1e12, 0.0, d)
    assert total.shape == (3,)
    assert np.all(np.diff(np.asarray(total)) <= 0)    # more bandwidth, less contention


def test_gradients_match_finite_differences(dev):
    def f(x):
        tc, tm, bw = x
        d = dataclasses.replace(dev, mem_bw=bw)
        return ov.pipelined_time(tc, tm, 4.0, 0.6e12, 1.5e12, 0.12, d)[0]
    x0 = jnp.array([1.0, 0.9, 2.0e12])
    g = jax.grad(f)(x0)
    assert np.all(np.isfinite(np.asarray(g)))
    for i, h in enumerate((1e-6, 1e-6, 1e3)):
        e = jnp.zeros(3).at[i].set(h)
        fd = (f(x0 + e) - f(x0 - e)) / (2 * h)
        assert float(g[i]) == pytest.approx(float(fd), rel=1e-5, abs=1e-12)


def test_zero_inputs_give_finite_gradients(dev):
    g = jax.grad(lambda t: ov.overlapped_time(t, 0.0, 0.0, 0.0, 0.0, dev)[0])(0.0)
    assert np.isfinite(float(g))
    g = jax.grad(lambda t: ov.pipelined_time(0.0, t, 4.0, 0.0, 0.0, 0.1, dev)[0])(0.0)
    assert np.isfinite(float(g))


def test_float32(float32, dev):
    total, exposed, slow = ov.overlapped_time(jnp.float32(1.0), jnp.float32(0.5), share=0.2)
    assert total.dtype == jnp.float32
    assert float(total) == pytest.approx(1.1, rel=1e-6)
    assert float(ov.mcore_buckets(175e9 / 96, 8.0)) == pytest.approx(np.ceil(175e9 / 96 / 40e6))


def test_mcore_buckets():
    # max(40 M, 1 M · dp) parameters per bucket
    assert float(ov.mcore_buckets(1e9, 8.0)) == 25.0
    assert float(ov.mcore_buckets(1e9, 100.0)) == 10.0
    assert float(ov.mcore_buckets(1e6, 8.0)) == 1.0
    assert float(ov.mcore_buckets(1e9, 8.0, bucket_params=1e8)) == 10.0


def test_chunked_dp_exposed_limits_and_hand_values():
    # v = 1: the bucketed reduction behind one micro-batch's backward
    assert float(ov.chunked_dp_exposed(0.2, 0.5, 8.0, 1.0, 10.0)) == pytest.approx(
        float(ov.bucketed_exposed(0.2, 0.5, 10.0)))
    # v = 4, p = 8, chunk backward 0.05 s, comm 0.8 s (0.2 per chunk), 1 bucket per chunk,
    # no contention: F = max(0.2 − 0.4, 3·(0.2 − 0.4)) = −0.2, F + 0.2 = 0;
    # chunk 0 alone: pipelined(0.05, 0.2, 1) − 0.05 = 0.2 (one bucket: serial) → 0.2
    assert float(ov.chunked_dp_exposed(0.05, 0.8, 8.0, 4.0, 4.0)) == pytest.approx(0.2)
    # comm-bound: comm 8 s → F = max(2 − 0.4, 3·1.6) = 4.8; end = 4.8 + 2 = 6.8
    assert float(ov.chunked_dp_exposed(0.05, 8.0, 8.0, 4.0, 4.0)) == pytest.approx(6.8)
    # interleaving widens the window: less exposed than one micro-batch's backward alone
    one = float(ov.chunked_dp_exposed(0.2, 0.5, 8.0, 1.0, 8.0))
    four = float(ov.chunked_dp_exposed(0.05, 0.5, 8.0, 4.0, 8.0))
    assert four < one
    g = jax.grad(lambda t: ov.chunked_dp_exposed(0.05, t, 8.0, 4.0, 4.0, 1e9, 0.1,
                                                 hw_db.device("a100_80gb")))(0.8)
    assert np.isfinite(float(g))


def _pipe(tc, tm, n, share):
    """Two-stage pipeline of n chunks with SM-only contention, by hand (total time)."""
    k = 1.0 - 1.0 / n
    return tc / n + tm / n + max(k * tm, k * tc + share * k * tm)


@pytest.mark.parametrize("t_fwd,t_bwd,cf,cb,tp", [
    (1.0, 2.0, 0.2, 0.2, 4.0),        # GEMMs longer than their collectives
    (0.1, 0.2, 0.3, 0.3, 8.0),        # collectives longer: each kind capped at serial
    (1.0, 2.0, 0.0, 0.0, 2.0),        # nothing to hide
])
def test_te_tp_exposed_hand_values(dev, t_fwd, t_bwd, cf, cb, tp):
    """Transformer Engine defaults by hand: all-gathers as tp-step ring exchanges (1 SM),
    forward reduce-scatters in 4 chunks with the host GEMM on 108 − 16 SMs throughout,
    backward reduce-scatters beside the weight-gradient GEMMs on 16 SMs; each ≤ serial."""
    f_ag, f_rs = 0.55, 0.35
    s1, s16 = 1.0 / 108.0, 16.0 / 108.0

    def ring(host, c):
        return min(_pipe(host, c, tp, s1) - host, c)

    def rs_pipe(host, c):
        return min(_pipe(host / (1.0 - s16), c, 4.0, 0.0) - host, c)

    def bulk(host, c):
        return min(max(c, host + s16 * c) - host, c)

    want_f = ring(f_ag * t_fwd, cf / 2) + rs_pipe(f_rs * t_fwd, cf / 2)
    want_b = ring(0.5 * f_rs * t_bwd, cb / 2) + bulk(0.5 * f_ag * t_bwd, cb / 2)
    got_f, got_b = ov.te_tp_exposed(t_fwd, t_bwd, cf, cb, (f_ag, f_rs), tp, dev)
    assert float(got_f) == pytest.approx(want_f, rel=1e-6, abs=1e-12)
    assert float(got_b) == pytest.approx(want_b, rel=1e-6, abs=1e-12)
    assert 0.0 <= float(got_f) <= cf * (1 + 1e-9) and 0.0 <= float(got_b) <= cb * (1 + 1e-9)


def test_te_tp_sm_margin_costs_the_whole_host_gemm(dev):
    """A long host GEMM with a short reduce-scatter: reserving 16 SMs for the whole GEMM
    costs more than the collective hides, so the forward reduce-scatter stays serial."""
    # no GEMM hosts the all-gather half (0.1 exposed); the reduce-scatter half stays serial
    got_f, _ = ov.te_tp_exposed(1.0, 0.0, 0.2, 0.0, (0.0, 0.9), 8.0, dev)
    assert float(got_f) == pytest.approx(0.2)
    # a short host: the pipeline wins
    got_f, _ = ov.te_tp_exposed(1.0, 0.0, 0.2, 0.0, (0.0, 0.2), 8.0, dev)
    assert float(got_f) < 0.2


@pytest.mark.parametrize("split", [(0.02, 0.01, 0.03), (0.5, 0.5, 0.5), (-0.01, 0.0, 0.0)])
def test_te_tp_exposed_split_hosts_hand_values(dev, split):
    """The split hosts take host + extra seconds; the overlap of a kind costs the pipelined
    makespan of the split host minus the whole host, at most its serial time."""
    t_fwd, t_bwd, cf, cb, tp = 1.0, 2.0, 0.2, 0.2, 8.0
    f_ag, f_rs = 0.55, 0.35
    s1, s16 = 1.0 / 108.0, 16.0 / 108.0
    e_agf, e_rsf, e_agb = split

    def ring(host, c, e):
        return min(_pipe(host + e, c, tp, s1) - host, c)

    def rs_pipe(host, c, e):
        return min(_pipe((host + e) / (1.0 - s16), c, 4.0, 0.0) - host, c)

    def bulk(host, c):
        return min(max(c, host + s16 * c) - host, c)

    want_f = ring(f_ag * t_fwd, cf / 2, e_agf) + rs_pipe(f_rs * t_fwd, cf / 2, e_rsf)
    want_b = ring(0.5 * f_rs * t_bwd, cb / 2, e_agb) + bulk(0.5 * f_ag * t_bwd, cb / 2)
    got_f, got_b = ov.te_tp_exposed(t_fwd, t_bwd, cf, cb, ov.TPHosts(f_ag, f_rs, *split),
                                    tp, dev)
    assert float(got_f) == pytest.approx(want_f, rel=1e-6, abs=1e-12)
    assert float(got_b) == pytest.approx(want_b, rel=1e-6, abs=1e-12)
    # no extra time: the plain shares give the same numbers
    base = ov.te_tp_exposed(t_fwd, t_bwd, cf, cb, (f_ag, f_rs), tp, dev)
    zero = ov.te_tp_exposed(t_fwd, t_bwd, cf, cb, ov.TPHosts(f_ag, f_rs), tp, dev)
    assert [float(x) for x in base] == [float(x) for x in zero]


def test_te_split_gemms_shapes_by_hand():
    """Transformer Engine's splits for GPT-3 175B at TP 8 on 8,192 tokens: ring exchange in
    8 chunks of 1,024 rows (QKV 4,608 × 12,288, FC1 6,144 × 12,288; backward the output
    projection's and FC2's input gradients 1,536 / 6,144 × 12,288), the pipelined
    reduce-scatter hosts (12,288 × 1,536 and 12,288 × 6,144) in 4 chunks of 2,048 rows."""
    import jaxmodel as jm
    rows = ov.te_split_gemms(hw_db.model("gpt3-175b"), jm.Parallelism(tp=8, sp=True), 8192.0)

    def shapes(row):
        return [(float(g.m), float(g.n), float(g.k), float(c)) for g, c in rows[row]]

    assert shapes("ag_fwd") == [(8192, 4608, 12288, 1), (8192, 6144, 12288, 1)]
    assert shapes("ag_fwd_split") == [(1024, 4608, 12288, 8), (1024, 6144, 12288, 8)]
    assert shapes("rs_fwd") == [(8192, 12288, 1536, 1), (8192, 12288, 6144, 1)]
    assert shapes("rs_fwd_split") == [(2048, 12288, 1536, 4), (2048, 12288, 6144, 4)]
    assert shapes("ag_bwd") == [(8192, 1536, 12288, 1), (8192, 6144, 12288, 1)]
    assert shapes("ag_bwd_split") == [(1024, 1536, 12288, 8), (1024, 6144, 12288, 8)]


@pytest.mark.parametrize("name,tp", [("gpt3-175b", 8), ("llama3-70b", 4), ("mixtral-8x7b", 2)])
def test_te_split_whole_entries_are_the_layers_host_gemms(name, tp):
    """The whole hosts of te_split_gemms are the training layer's GEMMs that
    TE_SPLIT_WHOLE_ENTRIES names (GQA, SwiGLU, MoE layers), so the layer's times serve both."""
    import jaxmodel as jm
    from jaxmodel.workload import layer as _layer
    model, par = hw_db.model(name), jm.Parallelism(tp=tp, sp=True)
    variant = _layer.variant_of(model, par)
    assert variant.mla is False
    # the GEMM shapes only (one small compiled call; the vector kernels' times are not used)
    gemms = jax.jit(lambda d, m, p: _layer.layer_graph(d, m, p, 2.0, 2048.0, 2048.0,
                                                       training=True, variant=variant)[0])(
        hw_db.device("a100_80gb"), model, par)
    rows = ov.te_split_gemms(model, par, 4096.0)
    for key, entries in ov.TE_SPLIT_WHOLE_ENTRIES.items():
        for (row, i, part), (whole, count) in zip(entries, rows[key], strict=True):
            g = gemms[row][i][0]
            got = g if part == 0 else _layer.Gemm(g.m, g.k, g.n, g.batch)   # dX = dY·Wᵀ
            assert g.batch is None and float(count) == 1.0
            assert [float(x) for x in got[:3]] == [float(x) for x in whole[:3]], (key, row)


def test_tp_host_fractions_hand_values():
    m = dataclasses.replace(hw_db.model("gpt3-175b"))
    h, s = 12288.0, 2048.0
    qkv, wo, w1, w2 = 2 * h * 3 * h, 2 * h * h, 2 * h * 4 * h, 2 * 4 * h * h
    for fa, attn in ((0.0, 4 * s * h), (2.0, 2 * s * h)):
        f_ag, f_rs = ov.tp_host_fractions(m, s, fa)
        tot = qkv + wo + w1 + w2 + attn
        assert float(f_ag) == pytest.approx((qkv + w1) / tot, rel=1e-6)
        assert float(f_rs) == pytest.approx((wo + w2) / tot, rel=1e-6)


def test_tp_eligible_needs_sp_and_one_nvlink_domain():
    """Megatron-core overlaps TP communication only with sequence parallelism, Transformer
    Engine only inside one NVLink domain (the innermost tier: 8 GPUs of a DGX A100)."""
    import jaxmodel as jm
    system = hw_db.system("dgx_a100", nodes=4)
    par = jm.Parallelism(dp=1, tp=jnp.asarray([8.0, 8.0, 16.0, 4.0]), pp=1,
                         sp=jnp.asarray([1.0, 0.0, 1.0, 1.0]))
    np.testing.assert_array_equal(np.asarray(ov.tp_eligible(par, system)), [1, 0, 0, 1])


def test_te_tp_exposed_vmap_jit_grad(dev):
    args = (jnp.asarray([1.0, 0.1]), jnp.asarray([2.0, 0.2]), jnp.asarray([0.2, 0.3]),
            jnp.asarray([0.2, 0.3]), (0.55, 0.35), 8.0)
    batched = jax.vmap(lambda a, b, c, d: ov.te_tp_exposed(a, b, c, d, *args[4:], dev))(
        *args[:4])
    for i in range(2):
        one = jax.jit(lambda a, b, c, d: ov.te_tp_exposed(a, b, c, d, *args[4:], dev))(
            *(x[i] for x in args[:4]))
        for j in range(2):
            assert float(batched[j][i]) == pytest.approx(float(one[j]), rel=1e-6)
    g = jax.grad(lambda c: sum(ov.te_tp_exposed(1.0, 2.0, c, c, (0.55, 0.35), 8.0, dev)))(0.2)
    eps = 1e-4
    fd = (sum(ov.te_tp_exposed(1.0, 2.0, 0.2 + eps, 0.2 + eps, (0.55, 0.35), 8.0, dev))
          - sum(ov.te_tp_exposed(1.0, 2.0, 0.2 - eps, 0.2 - eps, (0.55, 0.35), 8.0, dev)))
    assert np.isfinite(float(g))
    assert float(g) == pytest.approx(float(fd) / (2 * eps), rel=1e-3)
    z = jax.grad(lambda c: sum(ov.te_tp_exposed(0.0, 0.0, c, c, (0.55, 0.35), 8.0, dev)))(0.0)
    assert np.isfinite(float(z))


@pytest.mark.slow
def test_train_step_tp_overlap_only_where_megatron_core_runs_it():
    """train_step: the tp_overlap knob changes nothing without sequence parallelism or with
    a TP group spanning two DGX A100 nodes, and lowers the step of an eligible plan."""
    import jaxmodel as jm
    system = hw_db.system("dgx_a100", nodes=2)
    model = jm.Model(n_layers=4.0, d_model=2048.0, n_heads=16.0, n_kv_heads=16.0,
                     head_dim=128.0, d_ff=8192.0, vocab_size=32000.0, activation="gelu")
    par = jm.Parallelism(dp=jnp.asarray([1.0, 2.0, 2.0]), tp=jnp.asarray([16.0, 8.0, 8.0]),
                         pp=1, sp=jnp.asarray([1.0, 0.0, 1.0]), micro_batch=1,
                         recompute="selective")
    serial, over = (jm.train_step(system, model, par, 8, 2048, tp_overlap=x)
                    for x in (0.0, 1.0))
    s, o = np.asarray(serial.step_time_s), np.asarray(over.step_time_s)
    np.testing.assert_allclose(o[:2], s[:2], rtol=1e-9)
    assert o[2] < s[2]
    assert float(np.asarray(over.breakdown["tp_comm"])[2]) < float(
        np.asarray(serial.breakdown["tp_comm"])[2])


@pytest.mark.slow
def test_tp_split_times_are_the_chunks_minus_the_whole_gemms():
    """The stage keys of the split hosts: tp (or 4) chunk GEMMs minus the whole GEMM, each
    at its own shape by the GEMM model; smaller GEMMs run at lower rates on an A100, so
    every split costs time at GPT-3 175B's shapes (TP 8, 8,192 tokens)."""
    import jaxmodel as jm
    from jaxmodel.parallel import train_stage as ts
    dev = ts.sustained_device(hw_db.device("a100_80gb"))
    model, par = hw_db.model("gpt3-175b"), jm.Parallelism(tp=8, sp=True)
    got = ts.tp_split_times(dev, model, par, 8192.0)
    rows = ov.te_split_gemms(model, par, 8192.0)
    g = [g for k in ("ag_fwd", "rs_fwd", "ag_bwd") for s in ("", "_split")
         for g, _ in rows[k + s]]
    t = np.asarray(jm.gemm_latency(dev, jnp.asarray([x.m for x in g]),
                                   jnp.asarray([x.n for x in g]),
                                   jnp.asarray([x.k for x in g])))
    counts = (8, 8, 4, 4, 8, 8)
    for i, k in enumerate(ts.SPLIT_KEYS):
        whole = t[4 * i] + t[4 * i + 1]
        split = counts[2 * i] * t[4 * i + 2] + counts[2 * i + 1] * t[4 * i + 3]
        assert float(got[k]) == pytest.approx(split - whole, rel=1e-5)
        assert 0.0 < float(got[k]) < 0.2 * whole
    # no sequence parallelism in the static variant: nothing split, nothing traced
    zero = ts.tp_split_times(dev, model, par, 8192.0, variant=ts._layer.Variant(sp=False))
    assert all(float(v) == 0.0 for v in zero.values())
    # the training step's stage times: the chunks timed in the layer's GEMM call, the whole
    # hosts taken from the layer's own GEMMs — the same seconds, to the bit
    system = jm.System(device=dev, levels=hw_db.system("dgx_a100").levels)
    opts = ts.TrainOptions(None, 4096.0)
    variant = ts._layer.variant_of(model, par, system)
    layer = ts.stage_times_single(system, model, dataclasses.replace(par, micro_batch=2.0),
                                  opts, statics=ts.TrainStatics(variant=variant), part="layer")
    alone = ts.tp_split_times(dev, model, par, 8192.0, variant=variant)
    for k in ts.SPLIT_KEYS:
        assert float(layer[k]) == float(alone[k]) == float(got[k])


def test_sp_regather_beside_the_input_gradient_gemms_by_hand(dev):
    """Sequence parallelism's backward re-gathers: two all-gathers beside the QKV / FC1
    input-gradient GEMMs (half of their backward) on 16 SMs, at most serial."""
    s16 = 16.0 / 108.0
    t_bwd, ag = 2.0, 0.55
    host = 0.5 * ag * t_bwd
    cs = (0.1, 0.3, 2.0)
    want = [min(max(c, host + s16 * c) - host, c) for c in cs]
    got = ov.sp_regather_exposed(t_bwd, jnp.asarray(cs), ag, dev)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert float(ov.sp_regather_exposed(t_bwd, 0.0, ag, dev)) == 0.0
    g = jax.grad(lambda c: ov.sp_regather_exposed(t_bwd, c, ag, dev))(0.0)
    assert np.isfinite(float(g))
