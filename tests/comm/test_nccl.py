"""NCCL algorithm/protocol model: tuner choices vs hand-derived NCCL times, NVLS on H100,
executed times, vmap/jit/grad/float32."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.comm import collectives as coll
from jaxmodel.comm import nccl

US = 1e-6
B = 200e9          # achieved per-device bandwidth of the synthetic tier, bytes/s


def nvswitch(m=8, inr=0.0, **kw):
    base = dict(size=float(m), topology="switch", bw_per_device=B, link_latency=0.3e-6,
                flit_bytes=1.0, header_bytes=0.0, max_payload_bytes=1e12, nccl_link=0.0,
                ll_max_bw=87.7e9, in_network_reduction=inr, nvls_efficiency=0.85)
    base.update(kw)
    return jm.NetLevel(**base)


def system(*levels):
    return jm.System(device=hw_db.device("a100_80gb"), levels=tuple(levels))


def choice(lvl, m, n, op="all_reduce"):
    t = coll.level_algorithm_times(lvl, float(m), float(n), ops=(op,))[0][op]
    a = int(jnp.argmin(t[2]))
    return coll.ALGORITHMS[a], nccl.PROTOCOLS[int(t[3][a])]


def hand_tuner(m, n, nvls=False):
    """NCCL 2.30.7 ncclTopoTuneModel / ncclTopoGetAlgoTime by hand, NVLink, one node, s."""
    ring_bwt = 2 * (m - 1) / m * n / B
    # treeCorrectionFactor row index log2(n / 64) (NCCL ncclTopoGetAlgoTime)
    i = int(np.floor(np.log2(n / 64)))
    corr = [nccl.TREE_CORRECTION[p][i] if i < 23 else 1.0 for p in range(3)]
    t = {("ring", "ll"): (6.6 + 2 * (m - 1) * 0.6) * US + max(ring_bwt / 0.5,
                                                             ring_bwt * B / 87.7e9),
         ("ring", "ll128"): (14.0 + 2 * (m - 1) * 1.9) * US + ring_bwt / 0.92,
         ("ring", "simple"): (8.4 + 2 * (m - 1) * 3.4) * US + ring_bwt,
         ("tree", "ll"): (6.8 + 2 * (m - 1) * 0.6) * US + max(2 * n / B / (0.92 / 3.8),
                                                             2 * n / 87.7e9) / corr[0],
         ("tree", "ll128"): (14.0 + 2 * (m - 1) * 1.25) * US
         + 2 * n / B / (0.92 * 7 / 9) / corr[1],
         ("tree", "simple"): (8.4 + 2 * (m - 1) * 4.0) * US + 2 * n / B / 0.92 / corr[2]}
    if nvls:   # tuner: bus bandwidth min(2·0.85, 1)·B, algorithm bandwidth ·m/(2(m−1))
        t[("in_network", "simple")] = 25.0 * US + 2 * (m - 1) / m * n / B
    return min(t, key=t.get)


@pytest.mark.parametrize("m", [2, 4, 8])
@pytest.mark.parametrize("n", [2.0**11, 2.0**16, 2.0**20, 2.0**23, 2.0**26, 2.0**30])
@pytest.mark.parametrize("nvls", [False, True])
def test_tuner_choice_matches_hand_derived(m, n, nvls):
    lvl = nvswitch(8, inr=1.0 if nvls else 0.0)
    assert choice(lvl, m, n) == hand_tuner(m, n, nvls)


def test_small_message_ll_large_simple_ring_a100():
    lvl = hw_db.system("dgx_a100").levels[0]
    assert choice(lvl, 8, 2.0**12) == ("ring", "ll")
    assert choice(lvl, 8, 2.0**32) == ("ring", "simple")
    assert choice(lvl, 8, 2.0**26)[0] != "in_network"          # A100: no NVLink SHARP


def nccl_rule_h100_8(n):
    """NCCL 2.30.7's own choice for an all-reduce of ``n`` bytes on one 8x H100 NVSwitch node,
    re-derived by hand from NCCL's sources (not from the model):

    - graphs (``src/graph/search.cc``): 18 NVLink4 x 20.6 GB/s = 370.8 GB/s per GPU; ring and
      tree: 6 channels at sm90 speed 60 GB/s, doubled by ``ncclTopoDupChannels`` to 12 x 30;
      NVLS: 8 channels (one per GPU), speed 50 (8 x 60 > 370.8 · 8/7), ``bwInter = bwIntra``;
    - ``ncclTopoTuneModel`` (``src/graph/tuning.cc``): ring Simple busBw 12·30 = 360, LL
      min(llMaxBw 141, 180), LL128 min(0.92·360, 12·36.7); tree 0.92·360 capped at 12·38.7,
      LL /3.8, LL128 ·7/9; NVLS min(50·0.85·7/8·2, 50)·8 = 400; bus → algorithm bandwidth
      ·8/14 (ring, NVLS) or ·0.5 (tree); latencies baseLat + steps·hwLat (NVLink), NVLS 25 us;
    - ``ncclTopoGetAlgoTime``: tree bandwidth x treeCorrectionFactor.

    Returns ``(best (algorithm, protocol), relative margin to the best of the other family)``,
    the families being NVLS and ring/tree."""
    i = int(np.floor(np.log2(n / 64)))
    corr = [nccl.TREE_CORRECTION[p][i] if 0 <= i < 23 else 1.0 for p in range(3)]
    ring, tree = 360.0, min(0.92 * 360.0, 12 * 38.7)
    bw = {("ring", "ll"): min(141.0, 0.5 * ring) * 8 / 14,
          ("ring", "ll128"): min(0.92 * ring, 12 * 36.7) * 8 / 14,
          ("ring", "simple"): ring * 8 / 14,
          ("tree", "ll"): min(tree / 3.8, 141.0) * 0.5 * corr[0],
          ("tree", "ll128"): min(tree * 7 / 9, 12 * 36.7) * 0.5 * corr[1],
          ("tree", "simple"): tree * 0.5 * corr[2],
          ("in_network", "simple"): min(50 * 0.85 * 7 / 8 * 2, 50.0) * 8 * 8 / 14}
    lat = {("ring", "ll"): 6.6 + 14 * 0.6, ("ring", "ll128"): 14.0 + 14 * 1.9,
           ("ring", "simple"): 8.4 + 14 * 3.4, ("tree", "ll"): 6.8 + 14 * 0.6,
           ("tree", "ll128"): 14.0 + 14 * 1.25, ("tree", "simple"): 8.4 + 14 * 4.0,
           ("in_network", "simple"): 25.0}
    t = {k: lat[k] * US + n / (bw[k] * 1e9) for k in lat}
    best = min(t, key=t.get)
    nv = t[("in_network", "simple")]
    other = min(v for k, v in t.items() if k[0] != "in_network")
    return best, abs(nv - other) / min(nv, other)


def test_auto_picks_nvls_on_h100_where_nccl_does():
    """``auto`` on the dgx_h100 node against NCCL's own rule (:func:`nccl_rule_h100_8`), 2 KiB
    to 4 GiB: NVLS exactly where NCCL picks it (sizes within 5 % of NCCL's tie excluded)."""
    sys_ = hw_db.system("dgx_h100")
    lvl = sys_.levels[0]
    checked = 0
    for k in range(11, 33):
        n = 2.0**k
        want, margin = nccl_rule_h100_8(n)
        if margin < 0.05:
            continue
        checked += 1
        got = choice(lvl, 8, n)
        assert (got[0] == "in_network") == (want[0] == "in_network"), (k, got, want)
        if want[0] != "in_network":
            assert got == ("ring", "ll") and want == ("ring", "ll"), (k, got, want)
    assert checked >= 20
    # NCCL's crossover: ring LL below ~1.2 MB, NVLS above
    assert nccl_rule_h100_8(2.0**20)[0] == ("ring", "ll")
    assert nccl_rule_h100_8(2.0**21)[0] == ("in_network", "simple")
    n = 2.0**26
    auto = jm.collective_latency(sys_, "all_reduce", n, 8)
    assert float(auto) == pytest.approx(float(jm.collective_latency(
        sys_, "all_reduce", n, 8, algorithm="in_network")), rel=1e-12)
    small = jm.collective_latency(sys_, "all_reduce", 2.0**16, 8)
    assert float(small) == pytest.approx(float(jm.collective_latency(
        sys_, "all_reduce", 2.0**16, 8, algorithm="ring")), rel=1e-12)
    # reduce-scatter: NVLS moves the same (m-1)/m n as the ring, at 0.85 of its bandwidth and
    # with a larger latency, so the tuner keeps the ring (as NCCL's own formula does)
    assert choice(lvl, 8, 2.0**28, "reduce_scatter") == ("ring", "simple")


def test_nvls_allreduce_factor():
    """tuning.cc: NVLS all-reduce bus bandwidth min(2·eff, 1)·B (eff ≥ 0.5: the link's), so
    its time is 2/min(2·eff, 1) times the (m−1)/m·n/B traffic time; executed = tuner."""
    assert float(nccl.nvls_allreduce_factor(0.85)) == pytest.approx(2.0)
    assert float(nccl.nvls_allreduce_factor(0.4)) == pytest.approx(2.5)
    lvl = nvswitch(8, inr=1.0)
    n = 2.0**28
    t = float(coll.collective_latency.single(system(lvl), "all_reduce", n, 8.0,
                                             "in_network"))
    assert t == pytest.approx(25e-6 + 2 * 7 / 8 * n / B, rel=1e-9)


def test_channel_factor_hand_derived():
    """enqueue.cc topoGetAlgoInfo: nc = clip(floor(n / (nt · threshold)), 1, nChannels);
    ring LL on 8 ranks: 512 threads x 64 B = 32 KiB per channel."""
    f = lambda a, n, m=8.0, c=24.0: np.asarray(nccl.channel_factor(a, n, m, c))
    np.testing.assert_allclose(f("ring", 2.0**11), [24.0, 24.0, 24.0])        # one channel
    np.testing.assert_allclose(f("ring", 2.0**18), [3.0, 1.0, 3.0])           # 8 of 24
    # just below 3 x 32 KiB: LL/Simple 2 channels; LL128 (640 x 8 B) floor(19.2) = 19
    np.testing.assert_allclose(f("ring", 3 * 2.0**15 - 1), [12.0, 24 / 19, 12.0])
    np.testing.assert_allclose(f("tree", 2.0**15), [3.0, 4.0, 24.0])       # LL: 8 B/thread
    np.testing.assert_allclose(f("ring", 2.0**30), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(f("ring", 2.0**11, c=0.0), [1.0, 1.0, 1.0])    # not set
    g = jax.grad(lambda n: nccl.channel_factor("ring", n, 8.0, 24.0)[2])(2.0**17)
    assert np.isfinite(float(g)) and float(g) < 0


def test_executed_time_with_channels_and_launch_floor():
    """Ring LL, 8 ranks, 64 KiB on 24 channels: 2 channels run, 12x NCCL's bandwidth time;
    the launch floor is a lower bound on the whole collective."""
    lvl = nvswitch(8, nccl_channels=24.0, base_latency=2e-6)
    n = 2.0**16
    t = float(coll.collective_latency.single(system(lvl), "all_reduce", n, 8.0))
    bwt = max(7 / 4 * n / B / 0.5, 7 / 4 * n / 87.7e9) * 12.0
    assert t == pytest.approx(2e-6 + (6.6 + 14 * 0.6) * US + bwt, rel=1e-9)
    floor = dataclasses.replace(lvl, launch_floor=40e-6)
    assert float(coll.collective_latency.single(system(floor), "all_reduce", n, 8.0)) == \
        pytest.approx(40e-6, rel=1e-12)
    big = 2.0**30           # above the floor the floor does nothing
    assert float(coll.collective_latency.single(system(floor), "all_reduce", big, 8.0)) == \
        pytest.approx(float(coll.collective_latency.single(system(lvl), "all_reduce", big,
                                                           8.0)), rel=1e-12)


def test_executed_time_hand_derived():
    """auto = base + NCCL's latency of the chosen (ring, LL) + bandwidth term (no chunks)."""
    lvl = nvswitch(8, base_latency=10e-6)
    n = 2.0**12
    t = float(coll.collective_latency.single(system(lvl), "all_reduce", n, 8.0))
    want = 10e-6 + (6.6 + 14 * 0.6) * US + max(7 / 4 * n / B / 0.5, 7 / 4 * n / 87.7e9)
    assert t == pytest.approx(want, rel=1e-9)
    # Simple pays chunk_latency (pipeline, see _pipelined); LL does not
    lvl_c = dataclasses.replace(lvl, chunk_latency=1e-6)
    assert float(coll.collective_latency.single(system(lvl_c), "all_reduce", n, 8.0)) == \
        pytest.approx(want, rel=1e-9)


@pytest.mark.slow
def test_best_is_at_most_auto_and_named():
    sys_ = hw_db.system("dgx_h100")
    n = jnp.logspace(10, 32, 23, base=2.0)
    auto = jm.collective_latency(sys_, "all_reduce", n, 8)
    best = jm.collective_latency(sys_, "all_reduce", n, 8, algorithm="best")
    assert np.all(np.asarray(best) <= np.asarray(auto) * (1 + 1e-12))
    for a in ("ring", "tree", "in_network"):
        t = jm.collective_latency(sys_, "all_reduce", n, 8, algorithm=a)
        assert np.all(np.asarray(best) <= np.asarray(t) * (1 + 1e-12))


def test_static_variant_equals_traced():
    """Pruned tracing (NetVariant with the NCCL flag) gives the traced-flag numbers."""
    sys_ = hw_db.system("dgx_h100", nodes=2)
    net = coll.net_variant_of(sys_)
    assert net.nccl == ("nvlink", "net")
    for n in (2.0**14, 2.0**22, 2.0**28):
        for g, s in ((8, 1), (16, 1), (2, 8)):
            a = coll._cost(sys_, "all_reduce", n, float(g), "auto", float(s), net)[0]
            b = coll._cost(sys_, "all_reduce", n, float(g), "auto", float(s))[0]
            assert float(a) == pytest.approx(float(b), rel=1e-12)


def test_vmap_matches_loop_and_jit_matches_eager():
    sys_ = hw_db.system("dgx_h100", nodes=2)
    n = jnp.asarray([2.0**12, 2.0**20, 2.0**24, 2.0**28])
    g = jnp.asarray([8.0, 4.0, 16.0, 2.0])
    batch = np.asarray(jm.collective_latency(sys_, "all_reduce", n, g))
    loop = [float(jm.collective_latency(sys_, "all_reduce", float(a), float(b)))
            for a, b in zip(n, g)]
    np.testing.assert_allclose(batch, loop, rtol=1e-12)
    f = jax.jit(lambda x: coll.collective_latency.single(sys_, "all_reduce", x, 8.0))
    for x in n:
        assert float(f(x)) == pytest.approx(float(coll.collective_latency.single(
            sys_, "all_reduce", x, 8.0)), rel=1e-12)


@pytest.mark.parametrize("n", [2.0**14, 2.0**27])
def test_grad_matches_finite_differences(n):
    def f(x):
        bw, cl = x
        lvl = nvswitch(8, inr=1.0, bw_per_device=bw, chunk_latency=cl, base_latency=5e-6,
                       nccl_channels=24.0)
        return coll.collective_latency.single(system(lvl), "all_reduce", n, 8.0)

    x = jnp.array([300e9, 1e-6], dtype=jnp.float64)
    g = np.asarray(jax.grad(f)(x))
    assert np.all(np.isfinite(g))
    for i in range(2):
        h = x[i] * 1e-5
        fd = (f(x.at[i].add(h)) - f(x.at[i].add(-h))) / (2 * h)
        assert g[i] == pytest.approx(float(fd), rel=1e-4, abs=1e-30)


def test_grad_finite_for_infeasible_and_code_batches():
    def f(bw):
        lvl = nvswitch(8, bw_per_device=bw)
        return coll.collective_latency.single(system(lvl), "all_reduce", 2.0**20, 16.0)

    g = jax.grad(f)(jnp.float64(100e9))        # group larger than the tier: inf, grad 0
    assert np.isfinite(float(g))
    codes = jnp.asarray([coll.algorithm_code(a) for a in ("auto", "best", "ring", "tree",
                                                          "in_network")])
    t = jm.collective_latency(hw_db.system("dgx_h100"), "all_reduce", 2.0**26, 8,
                              algorithm=codes)
    assert np.all(np.isfinite(np.asarray(t)))


def test_float32(float32):
    sys_ = hw_db.system("dgx_h100")
    t = jm.collective_latency(sys_, "all_reduce", jnp.logspace(11, 30, 5, base=2.0), 8)
    assert t.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(t)))
    assert choice(sys_.levels[0], 8, 2.0**26) == ("in_network", "simple")


def test_tree_correction_table():
    """NCCL's treeCorrectionFactor: index log2(n/64); 1 below 64 B and from 2^29 B on."""
    c = np.asarray(nccl.tree_correction(64.0 * 2**12))
    np.testing.assert_allclose(c, [.4, .6, .5])       # log2(n / 64) = 12
    np.testing.assert_allclose(np.asarray(nccl.tree_correction(2.0**40)), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(np.asarray(nccl.ring_plateau(2.0)), [1.0, 1.0, 1.4])
    np.testing.assert_allclose(np.asarray(nccl.ring_plateau(0.0)), [1.0, 1.0, 1.0])


def test_collnet_on_a_sharp_fabric():
    """A network tier with in-network reduction (SHARP, NCCL CollNet). Hand, 16 ranks, 4 KiB:
    CollNet 31 us; tree LL 6.8 + 2·log2(16)·5.0 = 46.8 us; ring LL 6.6 + 30·2.7 = 87.6 us."""
    ib = nvswitch(16, inr=1.0, nccl_link=2.0, bw_per_device=25e9, ll_max_bw=20.4e9)
    assert choice(ib, 16, 2.0**12) == ("in_network", "simple")
    assert choice(ib, 16, 2.0**30) == ("in_network", "simple")
    no_sharp = dataclasses.replace(ib, in_network_reduction=0.0)
    assert choice(no_sharp, 16, 2.0**12) == ("tree", "ll")
    lat = nccl.latency("in_network", "all_reduce", 16.0, 2.0)
    np.testing.assert_allclose(np.asarray(lat), [0.0, 0.0, 31e-6])
    tree = nccl.latency("tree", "all_reduce", 16.0, 2.0)
    np.testing.assert_allclose(np.asarray(tree)[0], 46.8e-6)


def test_ll128_executed_efficiency():
    """Ring LL128 on 8 ranks, 8 MiB on 24 channels (all run): the tuner still picks LL128 with
    NCCL's 0.92 whatever ``ll128_efficiency``; the executed bandwidth time is
    ``7/4 · n / (B · ll128_efficiency)``. The default (0.92) is NCCL's factor."""
    n = 2.0**23
    lvl = nvswitch(8, nccl_channels=24.0)
    assert choice(lvl, 8, n) == ("ring", "ll128")
    slow = dataclasses.replace(lvl, ll128_efficiency=0.5)
    assert choice(slow, 8, n) == ("ring", "ll128")
    lat = (14.0 + 14 * 1.9) * US
    for eff, l_ in ((0.92, lvl), (0.5, slow)):
        t = float(coll.collective_latency.single(system(l_), "all_reduce", n, 8.0))
        assert t == pytest.approx(lat + 7 / 4 * n / (B * eff), rel=1e-9)
    # float32 and grad with respect to the efficiency (finite, negative: faster when higher)
    g = jax.grad(lambda e: coll.collective_latency.single(
        system(dataclasses.replace(lvl, ll128_efficiency=e)), "all_reduce", n, 8.0))(0.6)
    assert np.isfinite(float(g)) and float(g) < 0
    t32 = coll.collective_latency.single(system(slow), "all_reduce", jnp.float32(n), 8.0)
    assert float(t32) == pytest.approx(lat + 7 / 4 * n / (B * 0.5), rel=1e-5)


@pytest.mark.slow     # compile-heavy; `make test-all`
def test_ll128_efficiency_zero_gives_finite_times_and_grads():
    """A 0 in a batch is floored (nccl.MIN_LL128_EFFICIENCY): finite time, finite gradient,
    on one tier and on the flat ring across tiers."""
    n = 2.0**23
    lvl = nvswitch(8, nccl_channels=24.0)
    one = lambda e: coll.collective_latency.single(                         # noqa: E731
        system(dataclasses.replace(lvl, ll128_efficiency=e)), "all_reduce", n, 8.0)
    s = hw_db.system("dgx_a100", nodes=2)
    flat = lambda e: coll.collective_latency.single(                        # noqa: E731
        dataclasses.replace(s, levels=(s.levels[0], dataclasses.replace(
            s.levels[1], ll128_efficiency=e))), "all_gather", 2.0**20, 16.0)
    for f in (one, flat):
        t, g = jax.value_and_grad(f)(0.0)
        assert np.isfinite(float(t)) and np.isfinite(float(g))
        batch = jax.vmap(f)(jnp.array([0.0, 0.5, 0.92]))
        assert np.all(np.isfinite(np.asarray(batch)))
    assert float(nccl.ll128_executed(0.0)) == pytest.approx(nccl.MIN_LL128_EFFICIENCY / 0.92)


def test_flat_ring_runs_ll128_at_the_outermost_tier_efficiency():
    """All-gather of 1 MiB over 2 DGX A100 nodes: one flat ring, LL128 by NCCL's tuner
    (0.92 whatever the tiers' efficiencies); executed bandwidth time ∝ 1/ll128_efficiency of
    the outermost active tier (t(e) = L + K/e, so t(¼) − t(½) = 2·(t(½) − t(1))); the inner
    tier's efficiency does not enter."""
    s = hw_db.system("dgx_a100", nodes=2)

    def t(e_out, e_in=0.56):
        lv = (dataclasses.replace(s.levels[0], ll128_efficiency=e_in),
              dataclasses.replace(s.levels[1], ll128_efficiency=e_out))
        return float(jm.collective_latency(dataclasses.replace(s, levels=lv), "all_gather",
                                           2.0**20, 16.0))
    d1, d2 = t(0.25) - t(0.5), t(0.5) - t(1.0)
    assert d2 > 0 and d1 == pytest.approx(2 * d2, rel=1e-9)
    assert t(0.5, e_in=0.1) == t(0.5, e_in=0.9)


def test_copy_bytes_hand_counted():
    """Bytes one rank's channels load and store per buffer byte (NCCL runRing primitives):
    all-reduce 2 + 3(m−2) + 4 + 3(m−2) + 2 chunks of n/m; reduce-scatter 2 + 3(m−2) + 3;
    all-gather in place (directSend) 2 + 3(m−2) + 2; per byte on the link 4 / 3.33 / 3.14
    at 2 / 4 / 8."""
    for m in (2, 4, 8):
        ar = (2 + 3 * (m - 2) + 4 + 3 * (m - 2) + 2) / m
        rs = (2 + 3 * (m - 2) + 3) / m
        ag = (2 + 3 * (m - 2) + 2) / m
        assert float(nccl.copy_bytes("all_reduce", m)) == pytest.approx(ar)
        assert float(nccl.copy_bytes("reduce_scatter", m)) == pytest.approx(rs)
        assert float(nccl.copy_bytes("all_gather", m)) == pytest.approx(ag)
    # broadcast in place: root directSend (2), middle recvCopySend (3), last recv (2): the
    # busiest rank
    assert [float(nccl.copy_bytes("broadcast", m)) for m in (2, 3, 8)] == [2.0, 3.0, 3.0]
    per_link = [float(nccl.copy_bytes("all_reduce", m)) / (2 * (m - 1) / m) for m in (2, 4, 8)]
    np.testing.assert_allclose(per_link, [4.0, 10 / 3, 22 / 7])
    with pytest.raises(ValueError):
        nccl.copy_bytes("all_to_all", 4)


@pytest.mark.parametrize("m", [2, 8])
def test_copy_bound_ring_simple_hand_derived(m):
    """64 MiB ring Simple all-reduce with a copy throughput that binds: executed time =
    NCCL's Simple latency + copy_bytes · n / (24 · channel_copy_bw); the tuner's choice is
    unchanged (NCCL does not see it); without the bound (0) the link time returns; a loose
    bound changes nothing."""
    n = 2.0**26
    lvl = nvswitch(m, nccl_channels=24.0, chunk_latency=0.0)
    cbw = 5e9
    bound = dataclasses.replace(lvl, channel_copy_bw=cbw)
    assert choice(bound, m, n) == choice(lvl, m, n) == ("ring", "simple")
    lat = (8.4 + 2 * (m - 1) * 3.4) * US
    t = float(coll.collective_latency.single(system(bound), "all_reduce", n, float(m)))
    assert t == pytest.approx(lat + (6 * m - 4) / m * n / (24 * cbw), rel=1e-9)
    t0 = float(coll.collective_latency.single(system(lvl), "all_reduce", n, float(m)))
    assert t0 == pytest.approx(lat + 2 * (m - 1) / m * n / B, rel=1e-9)
    loose = dataclasses.replace(lvl, channel_copy_bw=1e12)
    assert float(coll.collective_latency.single(system(loose), "all_reduce", n,
                                                float(m))) == pytest.approx(t0, rel=1e-12)
    # the 2-rank ring loses more bus bandwidth than the 8-rank one (4 vs 3.14 bytes per link
    # byte); gradient finite and negative in the copy throughput, also at 0 (no bound)
    f = lambda c: coll.collective_latency.single(                           # noqa: E731
        system(dataclasses.replace(lvl, channel_copy_bw=c)), "all_reduce", n, float(m))
    g = jax.grad(f)(cbw)
    assert np.isfinite(float(g)) and float(g) < 0
    assert np.isfinite(float(jax.grad(f)(0.0)))
    t32 = f(jnp.float32(cbw))
    assert float(t32) == pytest.approx(t, rel=1e-5)


def test_tuner_uses_nccl_bandwidth():
    """With ``nccl_bw`` set, NCCL's tuner time of the Simple ring is its latency plus
    2(m−1)/m · n / nccl_bw without packet overhead, whatever the executed bandwidth; the
    executed time keeps efficiency × bw_per_device (and the overhead). 0 = executed B."""
    m, n = 8, 2.0**26
    lvl = nvswitch(m, header_bytes=16.0, max_payload_bytes=256.0, flit_bytes=16.0,
                   efficiency=0.5, nccl_bw=240e9)
    t = coll.level_algorithm_times(lvl, float(m), n, ops=("all_reduce",))[0]["all_reduce"]
    ring = coll.ALGORITHMS.index("ring")
    lat = (8.4 + 2 * (m - 1) * 3.4) * US
    assert int(t[3][ring]) == nccl.PROTOCOLS.index("simple")
    assert float(t[2][ring]) == pytest.approx(lat + 2 * (m - 1) / m * n / 240e9, rel=1e-9)
    ovh = (256 + 16) / 256
    assert float(t[0][ring]) == pytest.approx(lat + 2 * (m - 1) / m * n * ovh / (0.5 * B),
                                              rel=1e-6)
    # the choice follows nccl_bw, not the executed bandwidth: at 2 MiB on 8 ranks the ring
    # tuner times are LL 6.6 + 14·0.6 + max(3.5 MiB / (0.5 · bw), 3.5 MiB / 87.7 GB/s
    # (llMaxBw)), LL128 14 + 14·1.9 + 3.5 MiB / (0.92 · bw), Simple 8.4 + 14·3.4 +
    # 3.5 MiB / bw: at the executed bw = 0.5 · 200 GB/s (no nccl_bw) LL 88.4, LL128 80.5,
    # Simple 92.7 us; at nccl_bw = 240 GB/s LL 56.85 < LL128 57.2 us (whatever the executed
    # efficiency); at 400 GB/s LL128 50.6 < LL 56.85 us
    for e in (0.5, 1.0):
        assert choice(nvswitch(m, efficiency=e, nccl_bw=240e9), 8, 2.0**21) == ("ring", "ll")
    assert choice(nvswitch(m, efficiency=0.5), 8, 2.0**21) == ("ring", "ll128")
    assert choice(nvswitch(m, efficiency=0.5, nccl_bw=400e9), 8, 2.0**21) == ("ring", "ll128")


def test_tuner_nccl_bandwidth_on_tree_nvls_and_broadcast():
    """``nccl_bw`` also sets the tuner's tree and NVLS times (2n / (0.92 · nccl_bw) /
    treeCorrection for the Simple tree; 2(m−1)/m · n / nccl_bw for NVLS), and the broadcast
    ring's (n / nccl_bw), each without the packet overhead of its own message (the whole
    buffer for tree and broadcast, n/m for NVLS): a 1 MiB header per 3 MiB payload makes
    the two overheads differ (86/64 vs 11/8 for n/8)."""
    m, n = 8, 2.0**26
    lvl = nvswitch(m, inr=1.0, header_bytes=2.0**20, max_payload_bytes=3 * 2.0**20,
                   flit_bytes=1.0, efficiency=0.5, nccl_bw=300e9)
    t = coll.level_algorithm_times(lvl, float(m), n, ops=("all_reduce", "broadcast"))[0]
    ar, bc = t["all_reduce"], t["broadcast"]
    tree, ring, inr = (coll.ALGORITHMS.index(a) for a in ("tree", "ring", "in_network"))
    simple = nccl.PROTOCOLS.index("simple")
    assert int(ar[3][tree]) == simple
    corr = float(nccl.tree_correction(n)[simple])
    assert float(ar[2][tree]) == pytest.approx(
        (8.4 + 2 * (m - 1) * 4.0) * US + 2 * n / (0.92 * 300e9) / corr, rel=1e-9)
    assert float(ar[2][inr]) == pytest.approx(25.0 * US + 2 * (m - 1) / m * n / 300e9,
                                              rel=1e-9)
    assert int(bc[3][ring]) == simple
    assert float(bc[2][ring]) == pytest.approx((8.4 + (m - 1) * 3.4) * US + n / 300e9,
                                               rel=1e-9)
    # the executed broadcast keeps the whole buffer's packet overhead at 0.5 · B
    assert float(bc[0][ring]) == pytest.approx(
        (8.4 + (m - 1) * 3.4) * US + n * (64 + 22) / 64 / (0.5 * B), rel=1e-6)


@pytest.mark.parametrize("op,m,cb", [("reduce_scatter", 2, 2.5), ("reduce_scatter", 8, 23 / 8),
                                     ("all_gather", 2, 2.0), ("all_gather", 8, 22 / 8),
                                     ("broadcast", 2, 2.0), ("broadcast", 8, 3.0)])
def test_copy_bound_rs_ag_broadcast_hand_derived(op, m, cb):
    """Executed ring Simple time of a copy-bound 64 MiB reduce-scatter / all-gather /
    broadcast = NCCL's Simple ring latency 8.4 + (m−1)·3.4 us + bytes loaded and stored
    (hand-counted per rank: reduce-scatter 2 + 3(m−2) + 3, all-gather in place
    2 + 3(m−2) + 2 chunks of n/m; broadcast 2 at 2 ranks, 3 beyond) / (24 · 5 GB/s); the
    link-bound time without the bound."""
    n, cbw = 2.0**26, 5e9
    lvl = nvswitch(m, nccl_channels=24.0, chunk_latency=0.0)
    lat = (8.4 + (m - 1) * 3.4) * US
    assert choice(lvl, m, n, op) == ("ring", "simple")
    t = float(coll.collective_latency.single(
        system(dataclasses.replace(lvl, channel_copy_bw=cbw)), op, n, float(m)))
    assert t == pytest.approx(lat + cb * n / (24 * cbw), rel=1e-9)
    t0 = float(coll.collective_latency.single(system(lvl), op, n, float(m)))
    link = n if op == "broadcast" else (m - 1) / m * n
    assert t0 == pytest.approx(lat + link / B, rel=1e-9)


def test_batch_over_copy_and_tuner_bandwidth_matches_loop():
    """A batch over ``channel_copy_bw`` and ``nccl_bw`` (leaves of the level) equals the loop
    of single configurations; d/d channel_copy_bw matches finite differences (float64)."""
    base = hw_db.system("a100_dgx_vidur")
    cbw = np.asarray([0.0, 20e9, 29.6e9, 60e9])
    tbw = np.asarray([0.0, 240e9, 120e9, 400e9])
    lvl = dataclasses.replace(base.levels[0], channel_copy_bw=jnp.asarray(cbw),
                              nccl_bw=jnp.asarray(tbw))
    sys_b = dataclasses.replace(base, levels=(lvl,) + base.levels[1:])
    for n, g in ((2.0**21, 8.0), (2.0**25, 2.0)):
        batch = np.asarray(jm.collective_latency(sys_b, "all_reduce", n, g))
        loop = [float(jm.collective_latency(dataclasses.replace(
            base, levels=(dataclasses.replace(base.levels[0], channel_copy_bw=c, nccl_bw=t),)
            + base.levels[1:]), "all_reduce", n, g)) for c, t in zip(cbw, tbw)]
        np.testing.assert_allclose(batch, loop, rtol=1e-12)

    def f(c):
        s = dataclasses.replace(base, levels=(dataclasses.replace(
            base.levels[0], channel_copy_bw=c),) + base.levels[1:])
        return coll.collective_latency.single(s, "all_reduce", 2.0**26, 2.0)

    c0, h = 20e9, 1e6
    fd = (float(f(c0 + h)) - float(f(c0 - h))) / (2 * h)
    assert float(jax.grad(f)(c0)) == pytest.approx(fd, rel=1e-5)


def test_nccl_bw_applies_on_switch_tiers_only():
    """``nccl_bw`` rescales a bandwidth time taken at the switch tier's ``B``; on a fully
    connected tier (ring bandwidth (m−1)·b) it is ignored: tuner and executed times equal
    those without it."""
    m, n = 4, 2.0**24
    fc = nvswitch(m, topology="fully_connected")
    t0 = coll.level_algorithm_times(fc, float(m), n, ops=("all_reduce",))[0]["all_reduce"]
    t1 = coll.level_algorithm_times(dataclasses.replace(fc, nccl_bw=1e9), float(m), n,
                                    ops=("all_reduce",))[0]["all_reduce"]
    np.testing.assert_array_equal(np.asarray(t0), np.asarray(t1))
    sw = coll.level_algorithm_times(dataclasses.replace(nvswitch(m), nccl_bw=1e9), float(m),
                                    n, ops=("all_reduce",))[0]["all_reduce"]
    ring = coll.ALGORITHMS.index("ring")
    assert float(sw[2][ring]) > 10 * float(t0[2][ring])


def test_nvls_own_bandwidth_hand_derived_and_tuner_unchanged():
    """With ``nvls_bw`` the executed NVLS all-reduce moves the whole buffer once each way at
    it (multimem ld_reduce + st): ``25 µs + (√(2c) + √(n/nvls_bw))²``; its bus bandwidth
    can exceed the link's; NCCL's tuner time (what ``auto`` chooses by) is unchanged."""
    n, bw, c = 2.0**28, 300e9, 2e-6
    base = nvswitch(8, inr=1.0)
    lvl = dataclasses.replace(base, nvls_bw=bw, nvls_chunk_latency=c)
    new = coll.level_algorithm_times(lvl, 8.0, n, ops=("all_reduce",))[0]["all_reduce"]
    old = coll.level_algorithm_times(base, 8.0, n, ops=("all_reduce",))[0]["all_reduce"]
    t = float(new[0][coll.ALGORITHMS.index("in_network")])      # executed
    assert t == pytest.approx(25e-6 + (np.sqrt(2 * c) + np.sqrt(n / bw)) ** 2, rel=1e-9)
    assert 2 * 7 / 8 * n / t > B                   # bus bandwidth above the link's
    np.testing.assert_allclose(np.asarray(new[2]), np.asarray(old[2]), rtol=1e-12)


@pytest.mark.slow
def test_nccl_8xh100_every_row_within_target(anchors):
    """nccl-tests all-reduce on one 8xH100 node, 1 MiB - 8 GiB, NCCL 2.18.5: ``auto`` with that
    release's tuner (NVLS at every size, :data:`jaxmodel.comm.anchors.NCCL_8XH100_LEVEL`)
    within 10 % on every row."""
    from jaxmodel.comm import anchors as A
    ds = A.nccl_8xh100(anchors)
    sys_ = A.system_of(ds, hw_db.system("dgx_h100"))
    auto = np.asarray(jm.collective_latency(sys_, "all_reduce", ds["nbytes"], ds["group"]))
    err = auto / ds["seconds"] - 1.0
    assert np.all(np.abs(err) < 0.10), np.round(err * 100, 1)


def test_nccl_218_tuner_runs_nvls_at_1mib():
    """NCCL 2.18's tuner models NVLS without latency (``hwLat`` NVLS = 0): on an 8x H100 node
    it runs NVLS at 1 MiB, where NCCL 2.30.7 (NVLS 25 us) runs ring LL; the executed NVLS
    time is the same either way."""
    lvl = hw_db.system("dgx_h100").levels[0]
    old = dataclasses.replace(lvl, nccl_nvls_latency=nccl.NVLS_TUNER_LATENCY["2.17-2.18"])
    static = dict(ops=("all_reduce",), static=coll.TierStatic("switch", True, 0.0))

    def pick(t):
        a = int(jnp.argmin(t[2]))
        return coll.ALGORITHMS[a], nccl.PROTOCOLS[int(t[3][a])]

    t_new = coll.level_algorithm_times(lvl, 8.0, 2.0**20, **static)[0]["all_reduce"]
    t_old = coll.level_algorithm_times(old, 8.0, 2.0**20, **static)[0]["all_reduce"]
    assert pick(t_new) == ("ring", "ll") and pick(t_old) == ("in_network", "simple")
    inr = coll.ALGORITHMS.index("in_network")
    assert float(t_old[0, inr]) == float(t_new[0, inr])                 # executed: unchanged
    assert float(t_new[2, inr]) - float(t_old[2, inr]) == pytest.approx(25e-6, rel=1e-5)
    # CollNet on a network tier keeps NCCL 2.30.7's latency
    assert float(nccl.nvls_tuner_latency(2.0, 0.0)) == pytest.approx(31e-6)


def test_collnet_bandwidth_hand_derived():
    """SHARP (CollNet) on a network tier: each GPU's share crosses its NIC once each way,
    ``(m−1)/m · n`` at NCCL 2.30.7's CollNetDirect factor (``nvls_efficiency`` there: 0.85 on
    sm90+), so 1 GiB more on 16 ranks costs 15/16 · 2^30 / (0.85 · 25 GB/s) — half the ring's
    ``2(m−1)/m`` traffic; the factor 1 (default) is NCCL's model without the sm90 term."""
    eff = jnp.asarray([[0.85], [1.0]])
    ib = nvswitch(16, inr=1.0, nccl_link=2.0, bw_per_device=25e9, ll_max_bw=20.4e9,
                  nvls_efficiency=eff)
    n = jnp.asarray([2.0**30, 2.0**31])
    t = np.asarray(coll.collective_latency(system(ib), "all_reduce", n, 16.0,
                                           algorithm="in_network"))        # (eff, n)
    np.testing.assert_allclose(t[:, 1] - t[:, 0], 15 / 16 * 2.0**30 / (np.asarray(eff)[:, 0]
                                                                       * 25e9), rtol=1e-4)
    # without in-network reduction the factor touches nothing (NCCL's ring / tree)
    off = dataclasses.replace(ib, in_network_reduction=0.0)
    t_off = np.asarray(coll.collective_latency(system(off), "all_reduce", 2.0**30, 16.0))
    assert t_off[0, 0] == t_off[1, 0] and t_off[0, 0] > 1.5 * t[0, 0]
