"""The collective-algorithm registry: public codes fixed, a new algorithm is one function and
one registry line (registered here, in the test only, and removed again)."""

import contextlib

import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.comm import algorithms as algs
from jaxmodel.comm import collectives as coll

B, L, DR = 100e9, 1e-6, 0.5e-6
N = 8 * 2.0**20


def test_public_codes_unchanged():
    assert coll.ALGORITHM_CODES == ("auto", "best", "ring", "halving_doubling", "direct", "2d",
                                    "tree", "in_network")
    assert coll.ALGORITHMS == tuple(coll.ALGORITHM_REGISTRY) == coll.ALGORITHM_CODES[2:]
    assert [jm.algorithm_code(a) for a in ("auto", "best", "ring", "rabenseifner", "direct",
                                           "torus", "double_binary_tree", "nvls")] == \
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert jm.algorithm_code("hierarchical") == 0.0
    assert coll.AUTO_ALGORITHM == {"ring": "ring", "switch": "halving_doubling",
                                   "fully_connected": "direct", "mesh2d": "2d",
                                   "torus2d": "2d"}


def test_register_rejects_taken_or_reserved_names():
    with pytest.raises(ValueError, match="ring"):
        coll.register_algorithm(coll.ALGORITHM_REGISTRY["ring"])
    with pytest.raises(ValueError, match="best"):
        coll.register_algorithm(coll.ALGORITHM_REGISTRY["ring"]._replace(name="best"))
    with pytest.raises(ValueError, match="switch"):
        coll.register_algorithm(coll.ALGORITHM_REGISTRY["ring"]._replace(
            name="other", auto_for=("switch",)))


# A toy algorithm: one step through the switch, the buffer at 10x the tier bandwidth.
def _toy_phase(t, op):
    return (t.sw_hop, t.n / (10.0 * t.B), t.one)


TOY = coll.AlgorithmSpec("toy", _toy_phase, lambda t, op: True, lambda op, topo, inr: True)


@contextlib.contextmanager
def _registered(spec):
    coll.register_algorithm(spec)
    try:
        yield
    finally:
        coll.ALGORITHM_REGISTRY.pop(spec.name)


def test_toy_algorithm_through_the_registry():
    lvl = jm.NetLevel(size=8.0, topology="switch", bw_per_device=B, link_latency=L,
                      switch_latency=DR, flit_bytes=1.0, header_bytes=0.0,
                      max_payload_bytes=1e12)
    with _registered(TOY):
        assert jm.algorithm_code("toy") == 8.0
        assert coll.ALGORITHMS == coll.ALGORITHM_CODES[2:]      # the import-time names stay
        # static topology, no in-network reduction, not an NCCL tier: less to trace eagerly
        t, app, ok = coll.level_algorithm_times(lvl, 8.0, N, ops=("all_reduce",),
                                                static=coll.TierStatic("switch", False, -1.0))
        t, app = t["all_reduce"], app["all_reduce"]
        assert t.shape == (4, 7) and bool(app[6])
        want = 2 * L + DR + N / (10 * B)                         # lat + bwt (no chunk latency)
        assert float(t[0, 6]) == pytest.approx(want, rel=1e-6)
        # "best" selects it (the fastest), the name evaluates it, auto keeps Rabenseifner
        best, used = coll._choose(t, app, lvl, "best", "switch", False)
        named, _ = coll._choose(t, app, lvl, "toy", "switch", False)
        by_code, _ = coll._choose(t, app, lvl, jnp.asarray(8.0), "switch", False)
        auto, _ = coll._choose(t, app, lvl, "auto", "switch", False)
        assert float(best) == float(named) == float(by_code) == pytest.approx(want, rel=1e-6)
        assert float(auto) == float(t[0, coll.ALGORITHMS.index("halving_doubling")]) > want
        assert coll._needed_algorithms("all_reduce", "best", "switch", False) == (0, 1, 2, 4, 6)
    assert "toy" not in coll.ALGORITHM_REGISTRY
    with pytest.raises(ValueError, match="toy"):
        jm.algorithm_code("toy")


@pytest.mark.slow
def test_toy_algorithm_end_to_end():
    lvl = jm.NetLevel(size=8.0, topology="switch", bw_per_device=B, link_latency=L,
                      switch_latency=DR, flit_bytes=1.0, header_bytes=0.0,
                      max_payload_bytes=1e12)
    sys1 = jm.System(device=hw_db.device("a100_80gb"), levels=(lvl,))
    with _registered(TOY):
        # a name new to the compiled graphs' static arguments, so a fresh trace sees the toy
        sec = jm.collective_latency(sys1, "all_reduce", np.asarray([N, 2 * N]), 8.0, "toy")
        want = 2 * L + DR + np.asarray([N, 2 * N]) / (10 * B)
        np.testing.assert_allclose(np.asarray(sec), want, rtol=1e-6)


def test_registry_order_gives_the_table_columns():
    lvl = jm.NetLevel(size=4.0, topology="ring", bw_per_device=B, link_latency=L,
                      switch_latency=DR, flit_bytes=1.0, header_bytes=0.0,
                      max_payload_bytes=1e12)
    t, app, _ = algs.level_algorithm_times(lvl, 4.0, N, ops=("reduce_scatter",),
                                           static=algs.TierStatic("ring", nccl_tier=-1.0))
    names = algs.algorithm_names()
    a = dict(zip(names, np.asarray(app["reduce_scatter"])))
    assert a == {"ring": True, "halving_doubling": True, "direct": True, "2d": False,
                 "tree": False, "in_network": False}
    # ring on a closed ring of 4: 3 steps of one hop, 3/4 n over two counter-rotating rings
    ring = float(t["reduce_scatter"][0, names.index("ring")])
    assert ring == pytest.approx(3 * L + 3 / 4 * N / B, rel=1e-6)
