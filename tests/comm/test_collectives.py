"""Collective model: hand-derived values, ranking, batching, jit, gradients, feasibility."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.comm import collectives as coll
from jaxmodel.comm import topology as topo
from jaxmodel.comm.link import wire_bytes

B, L, DR = 100e9, 1e-6, 0.5e-6
N = 8 * 2.0**20


def level(topology, size, **kw):
    base = dict(size=float(size), topology=topology, bw_per_device=B, link_latency=L,
                switch_latency=DR, flit_bytes=1.0, header_bytes=0.0, max_payload_bytes=1e12)
    base.update(kw)
    return jm.NetLevel(**base)


def system(*levels):
    return jm.System(device=hw_db.device("a100_80gb"), levels=tuple(levels))


def times(lvl, m, n=N, op="all_reduce"):
    t, app, ok = coll.level_algorithm_times(lvl, float(m), n, ops=(op,))
    return dict(zip(coll.ALGORITHMS, np.asarray(t[op][0]))), bool(ok)


# ------------------------------------------------------------------ hand-derived values
def test_ring_closed_ring():
    t, _ = times(level("ring", 8), 8)
    # two counter-rotating rings on B/2 links: 2(p-1) steps of one hop, 2(p-1)/p n / B
    assert t["ring"] == pytest.approx(2 * 7 * L + 2 * 7 / 8 * N / B, rel=1e-6)


def test_ring_subgroup_is_a_line():
    t, _ = times(level("ring", 8), 4)
    # a line: one ring on B/2 links, the wrap-around crosses 3 hops every step
    assert t["ring"] == pytest.approx(2 * (3 * 3 * L + 3 / 4 * N / (B / 2)), rel=1e-6)


def test_switch_rabenseifner_power_of_two_and_not():
    sw = 2 * L + DR
    t, _ = times(level("switch", 8), 8)
    assert t["halving_doubling"] == pytest.approx(2 * (3 * sw + 7 / 8 * N / B), rel=1e-6)
    t6, _ = times(level("switch", 8), 6)
    # p' = 4 core (2 steps, 3/4 n) + one extra step of n/2 per phase (Thakur et al. §4)
    assert t6["halving_doubling"] == pytest.approx(2 * (3 * sw + 3 / 4 * N / B + N / 2 / B),
                                                   rel=1e-6)


def test_fully_connected_direct():
    t, _ = times(level("fully_connected", 4), 4)
    # 3 links of B/3 each; n/4 to every peer at once, one hop, per phase
    assert t["direct"] == pytest.approx(2 * (L + (N / 4) / (B / 3)), rel=1e-6)
    t2, _ = times(level("fully_connected", 4), 2)     # uses a single B/3 link
    assert t2["direct"] == pytest.approx(2 * (L + (N / 2) / (B / 3)), rel=1e-6)


def test_2d_torus_and_mesh():
    tt, ok = times(level("torus2d", 16), 16)
    assert ok
    load_x = 3 / 4 * (N / 2 + N / 8)                 # 15 n / 32 on each dimension
    assert tt["2d"] == pytest.approx(2 * (6 * L + load_x / (B / 2)), rel=1e-6)
    tm, _ = times(level("mesh2d", 16), 16)
    # lines: bandwidth B/4 per dimension, the wrap-around crosses 3 hops on every step
    assert tm["2d"] == pytest.approx(2 * ((9 + 9) * L + load_x / (B / 4)), rel=1e-6)


def test_tree_in_network_p2p_all_to_all():
    sw = 2 * L + DR
    t, _ = times(level("switch", 8, in_network_reduction=1.0), 8)
    assert t["tree"] == pytest.approx(2 * 3 * sw + 2 * N / B, rel=1e-6)
    # each device sends and receives its (m-1)/m share once (NCCL NVLS bandwidth model)
    assert t["in_network"] == pytest.approx(2 * sw + 7 / 8 * N / B, rel=1e-6)
    p2p, _ = times(level("switch", 8), 2, op="p2p")
    assert p2p["ring"] == pytest.approx(sw + N / B, rel=1e-6)
    a2a, _ = times(level("fully_connected", 4), 4, op="all_to_all")
    assert a2a["direct"] == pytest.approx(L + (N / 4) / (B / 3), rel=1e-6)
    assert math.isinf(a2a["ring"])
    no_inr, _ = times(level("switch", 8), 8)
    assert math.isinf(no_inr["in_network"])


def test_packet_overhead_eq2():
    lvl = level("switch", 8, header_bytes=16.0, max_payload_bytes=256.0, flit_bytes=16.0)
    assert float(wire_bytes(lvl, 1024.0)) == pytest.approx(1024 + 4 * 16)
    assert float(wire_bytes(lvl, 1.0)) == pytest.approx(32.0)      # 1 + 16 -> 2 flits


def test_pipelined_chunk_term():
    c = 3e-6
    t0, _ = times(level("ring", 8), 8, op="reduce_scatter")
    t1, _ = times(level("ring", 8, chunk_latency=c), 8, op="reduce_scatter")
    bwt = 7 / 8 * N / B
    steps = 7
    assert t1["ring"] == pytest.approx(t0["ring"] + steps * c + 2 * math.sqrt(steps * c * bwt),
                                       rel=1e-6)


def test_hierarchical_composition_and_stride():
    inner, outer = level("switch", 8), level("switch", 4, bw_per_device=10e9)
    sys2 = system(inner, outer)
    t = float(jm.collective_latency(sys2, "all_reduce", N, 32))
    rs = times(inner, 8, N, "reduce_scatter")[0]["halving_doubling"]
    ar = times(outer, 4, N / 8)[0]["halving_doubling"]
    assert t == pytest.approx(2 * rs + ar, rel=1e-6)
    # a DP group with one member per node only uses the outer tier, on the full buffer
    t_dp = float(jm.collective_latency(sys2, "all_reduce", N, 4, stride=8))
    assert t_dp == pytest.approx(times(outer, 4, N)[0]["halving_doubling"], rel=1e-6)


def test_node_uplink_is_shared():
    outer = level("switch", 2, bw_per_device=10e9, bw_per_node=20e9)
    sys2 = system(level("switch", 8), outer)
    alone = float(jm.collective_latency(sys2, "all_reduce", N, 2, stride=8))
    assert alone == pytest.approx(times(outer, 2, N)[0]["halving_doubling"], rel=1e-6)
    # 8 members per node share 20 GB/s: 2.5 GB/s each on the inter-node step
    shared = dataclasses.replace(outer, bw_per_device=2.5e9, bw_per_node=0.0)
    full = float(jm.collective_latency(sys2, "all_reduce", N, 16))
    ref = float(jm.collective_latency(system(level("switch", 8), shared), "all_reduce", N, 16))
    assert full == pytest.approx(ref, rel=1e-6)


def test_placement():
    sys4 = hw_db.system("dgx_a100", nodes=4)
    m, sp, ok = topo.group_tiers(sys4, 16.0, 1.0)
    assert [float(x) for x in m] == [8, 2] and bool(ok)
    m, sp, ok = topo.group_tiers(sys4, 4.0, 8.0)
    assert [float(x) for x in m] == [1, 4] and bool(ok)
    m, sp, ok = topo.group_tiers(sys4, 4.0, 2.0)
    assert [float(x) for x in m] == [4, 1] and float(sp[0]) == 2 and bool(ok)
    assert not bool(topo.group_tiers(sys4, 12.0, 1.0)[2])     # 8 + 4 does not tile
    assert not bool(topo.group_tiers(sys4, 64.0, 1.0)[2])     # larger than the system
    assert not bool(topo.group_tiers(sys4, 4.0, 3.0)[2])      # stride does not tile a node


# ------------------------------------------------------------------ ranking (Guo et al. §V-C)
def test_topology_ranking_equal_bandwidth():
    codes = jnp.arange(5.0)           # ring, switch, fully_connected, mesh2d, torus2d
    lvl = jm.NetLevel(size=16.0, topology=codes, bw_per_device=300e9, link_latency=1e-6)
    sys16 = system(lvl)
    sizes = jnp.array([[2.0**20], [2.0**26]])
    t = np.asarray(jm.collective_latency(sys16, "all_reduce", sizes, 16.0))
    assert t.shape == (2, 5) and np.all(np.isfinite(t))
    ring, switch, fc, mesh, torus = t.T
    assert np.all(fc < switch) and np.all(switch < ring) and np.all(ring < mesh)
    assert np.all(torus < mesh)


# ------------------------------------------------------------------ batching, jit, grads
def test_batch_mixing_topologies_and_algorithms_no_nan():
    topo_codes = jnp.repeat(jnp.arange(5.0), 8)
    alg_codes = jnp.tile(jnp.arange(8.0), 5)
    lvl = jm.NetLevel(size=16.0, topology=topo_codes, bw_per_device=200e9, link_latency=1e-6,
                      in_network_reduction=1.0, chunk_latency=1e-6)
    for op in ("all_reduce", "all_to_all"):
        t, ok, why = jm.collective_time(system(lvl), op, 2.0**22, 16.0, algorithm=alg_codes)
        t, ok = np.asarray(t), np.asarray(ok)
        assert t.shape == (40,) and not np.any(np.isnan(t))
        assert np.all(np.isfinite(t[ok])) and np.all(np.isinf(t[~ok]))
        # auto and best always apply
        assert np.all(ok[np.asarray(alg_codes) < 1.5])
        best = t[np.asarray(alg_codes) == 1]
        assert np.all(best <= t.reshape(5, 8).min(axis=1) * (1 + 1e-6))


def test_vmap_matches_loop_and_jit_matches_eager():
    sys2 = hw_db.system("dgx_h100", nodes=2)
    sizes = np.array([2.0**12, 2.0**20, 2.0**28])
    groups = np.array([2.0, 8.0, 16.0])
    batched = np.asarray(jm.collective_latency(sys2, "all_reduce", sizes, groups))
    loop = [float(jm.collective_latency(sys2, "all_reduce", s, g)) for s, g in zip(sizes, groups)]
    np.testing.assert_allclose(batched, loop, rtol=1e-6)
    with jax.disable_jit():
        eager = float(coll.collective_latency.single(sys2, "all_reduce", sizes[2], groups[2]))
    assert batched[2] == pytest.approx(eager, rel=1e-5)


@pytest.mark.parametrize("topology,algorithm", [("ring", "auto"), ("switch", "auto"),
                                                ("fully_connected", "best"),
                                                ("torus2d", "auto"), ("mesh2d", "ring")])
def test_grad_matches_finite_differences(topology, algorithm):
    def f(x):
        bw, lat = x
        lvl = jm.NetLevel(size=16.0, topology=topology, bw_per_device=bw, link_latency=lat,
                          chunk_latency=2e-6, base_latency=5e-6, header_bytes=16.0)
        return coll.collective_latency.single(system(lvl), "all_reduce", 2.0**24, 16.0,
                                              algorithm)

    x = jnp.array([150e9, 2e-6], dtype=jnp.float64)
    g = np.asarray(jax.grad(f)(x))
    assert np.all(np.isfinite(g)) and g[0] < 0 and g[1] > 0
    for i in range(2):
        h = x[i] * 1e-5
        fd = (f(x.at[i].add(h)) - f(x.at[i].add(-h))) / (2 * h)
        assert g[i] == pytest.approx(float(fd), rel=1e-4)


def test_grad_finite_at_zero_chunk_and_infeasible():
    def f(bw, group):
        lvl = jm.NetLevel(size=7.0, topology="mesh2d", bw_per_device=bw, link_latency=1e-6)
        return coll.collective_latency.single(system(lvl), "all_reduce", 2.0**20, group)

    g = jax.grad(f)(jnp.float64(100e9), 7.0)                 # prime mesh: +inf, gradient 0
    assert float(f(100e9, 7.0)) == math.inf and np.isfinite(float(g))
    g1 = jax.grad(lambda b: coll.collective_latency.single(
        system(level("ring", 8, bw_per_device=b)), "all_reduce", 2.0**20, 8.0))(
        jnp.float64(1e11))
    assert np.isfinite(float(g1)) and float(g1) < 0


# ------------------------------------------------------------------ infeasible groups
def test_infeasible_concrete_raises_and_batch_gives_inf():
    prime_mesh = system(level("mesh2d", 7))
    with pytest.raises(ValueError, match="topology_mismatch"):
        jm.collective_latency(prime_mesh, "all_reduce", 1e6, 7)
    with pytest.raises(ValueError, match="in_network"):
        jm.collective_latency(hw_db.system("hgx_a100_4gpu"), "all_reduce", 1e6, 4,
                              algorithm="in_network")
    with pytest.raises(ValueError, match="op="):
        jm.collective_latency(hw_db.system("hgx_a100_4gpu"), "allreduce", 1e6, 4)
    with pytest.raises(ValueError, match="algorithm="):
        jm.collective_latency(hw_db.system("hgx_a100_4gpu"), "all_reduce", 1e6, 4, "magic")
    t, ok, why = jm.collective_time(hw_db.system("hgx_a100_4gpu"), "all_reduce", 1e6,
                                    jnp.array([1.0, 2.0, 3.0, 4.0, 5.0, 2.5]))
    assert np.asarray(ok).tolist() == [True, True, True, True, False, False]
    assert np.asarray(t)[0] == 0.0 and np.all(np.isinf(np.asarray(t)[4:]))
    assert {jm.reason_name(r) for r in np.asarray(why)[4:]} == {"topology_mismatch"}
    bad = system(level("switch", 8, bw_per_device=jnp.array([100e9, 0.0])))
    t, ok, why = jm.collective_time(bad, "all_reduce", 1e6, 8.0)
    assert np.asarray(ok).tolist() == [True, False] and float(t[1]) == math.inf
    assert jm.reason_name(why[1]) == "invalid_network"


def test_all_ops_and_systems_finite():
    # every op through a three-tier hierarchy (Summit), one compilation
    s = hw_db.system("summit", nodes=2)
    t = jax.jit(lambda s: jnp.stack([coll.collective_latency.single(
        s, op, 2.0**24, 12.0 if op != "p2p" else 2.0) for op in jm.OPS]))(s)
    assert np.all(np.isfinite(t)) and np.all((t > 0) & (t < 1.0)), t
    for name in hw_db.names("system"):                  # every system loads
        assert float(hw_db.system(name).n_devices) >= 4


# ------------------------------------------------------------------ static topology switch
def _static_vs_traced(systems, choices, sizes, groups, strides):
    grid = np.meshgrid(sizes, groups, strides)
    sizes, groups, strides = (jnp.asarray(g.reshape(-1)) for g in grid)

    def run(sys_, net):
        out = {}
        for op in coll.OPS:
            for alg in (choices if op in ("all_reduce", "broadcast") else choices[:2]):
                out[op, alg] = jax.vmap(lambda n, g, s: coll._cost(sys_, op, n, g, alg, s, net)
                                        )(sizes, groups, strides)
        return out

    for sys_ in systems:
        net = coll.net_variant_of(sys_)
        assert None not in net.topologies and len(net.topologies) == len(sys_.levels)
        fast = jax.jit(lambda s: run(s, net))(sys_)
        slow = jax.jit(lambda s: run(s, coll.ANY_NET))(sys_)
        for key in slow:
            for a, b in zip(fast[key], slow[key]):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12,
                                           err_msg=str(key))


@pytest.mark.slow
def test_static_net_variant_prunes_the_graph_without_changing_results():
    """``net_variant_of`` (static topologies) gives the same numbers as the traced-topology
    graph for every op, ``auto`` and ``best``, with every topology as some tier."""
    systems = [system(level("switch", 4, in_network_reduction=1.0), level("ring", 4),
                      level("fully_connected", 2), level("torus2d", 4))]
    _static_vs_traced(systems, ("auto", "best"), [0.0, 2.0**11, 2.0**27], [2.0, 8.0, 32.0],
                      [1.0, 4.0])
    mixed = dataclasses.replace(systems[0], levels=(level(jnp.asarray([0.0, 1.0]), 16),))
    assert coll.net_variant_of(mixed).topologies == (None,)


@pytest.mark.slow
def test_static_net_variant_every_algorithm_every_topology():
    systems = [system(level(t, 16, in_network_reduction=1.0)) for t in
               ("ring", "switch", "fully_connected", "mesh2d", "torus2d")]
    systems.append(system(level("switch", 8, in_network_reduction=1.0), level("ring", 4)))
    systems.append(system(level("fully_connected", 4), level("torus2d", 8)))
    _static_vs_traced(systems, ("auto", "best", "ring", "halving_doubling", "tree",
                                "in_network", "2d"),
                      [0.0, 2.0**11, 2.0**20, 2.0**27], [2.0, 4.0, 8.0, 16.0], [1.0, 2.0])


def test_all_gather_across_nccl_tiers_is_one_flat_ring():
    """NCCL 2.30.7 tuning.cc: all-gather / reduce-scatter over several nodes is one ring of
    g − 1 steps, nNodes − 1 of them at the network's per-step latency; with no bytes the
    tuner picks LL: baseLat + (g − nodes)·max(hwLat[NVLink], netOverhead) + (nodes − 1)·
    hwLat[NET] (µs: 6.6, 0.6 vs 1.0, 2.7)."""
    s = hw_db.system("dgx_a100", nodes=8)
    t = {g: float(jm.collective_latency(s, "all_gather", 0.0, g)) for g in (16, 32, 64)}
    step = lambda g: ((g - g // 8) * 1.0 + (g // 8 - 1) * 2.7) * 1e-6  # noqa: E731
    assert t[32] - t[16] == pytest.approx(step(32) - step(16), rel=1e-6)
    assert t[64] - t[32] == pytest.approx(step(64) - step(32), rel=1e-6)
    rs = float(jm.collective_latency(s, "reduce_scatter", 0.0, 64))
    assert rs == pytest.approx(t[64], rel=1e-9)
    # large buffers: bandwidth of the slowest hop, not the sum of the tiers' times
    big = 2.0**30
    flat = float(jm.collective_latency(s, "all_gather", big, 64, algorithm="ring"))
    hier = float(jm.collective_latency(s, "all_gather", big, 64, algorithm="halving_doubling"))
    best = float(jm.collective_latency(s, "all_gather", big, 64, algorithm="best"))
    assert best <= min(flat, hier) * (1 + 1e-9)
    nic = s.levels[1]
    bw_t = 63 / 64 * big / (8 * float(nic.bw_per_device) * float(nic.efficiency))
    assert flat >= bw_t
    # one node only: the single-tier model, unchanged
    one = float(jm.collective_latency(s, "all_gather", big, 8, algorithm="ring"))
    assert one < flat
