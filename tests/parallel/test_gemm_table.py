"""GEMM de-duplication: shape recording, one batched tile search, exact lookup, misses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: I001
import hw_db
from jaxmodel.batching import batched
from jaxmodel.parallel import gemm_table as gt

DEV = hw_db.device("a100_80gb")


@batched
def _two_gemms(dev, m, gemm=None):
    """A toy model: two GEMMs of a traced size under an inner vmap, like the workload."""
    ms = jnp.stack([m, 2.0 * m])
    t = jax.vmap(lambda x: gemm(dev, x, 256.0, 512.0, 1.0, 2.0))(ms)
    return t.sum() + gemm(dev, m, 64.0, 64.0, 8.0, 2.0)


def test_collect_records_unique_shapes():
    shapes = gt.collect_gemm_shapes(_two_gemms, DEV, jnp.asarray([128.0, 256.0, 128.0]))
    mac = int(DEV.sa_mac_per_cycle)      # the sixth key: the compute dtype's systolic rate
    expected = {(128, 256, 512, 1, 2, mac), (256, 256, 512, 1, 2, mac),
                (512, 256, 512, 1, 2, mac), (128, 64, 64, 8, 2, mac), (256, 64, 64, 8, 2, mac)}
    assert {tuple(int(v) for v in row) for row in shapes} == expected


def test_table_lookup_matches_tile_search_and_misses_are_inf():
    shapes = np.asarray([[128, 256, 512, 1, 2], [256, 256, 512, 1, 2],
                         [128, 64, 64, 8, 2], [4096, 4096, 4096, 1, 2]], dtype=float)
    table = gt.GemmTable.build(DEV, shapes)
    direct = np.asarray(jm.gemm_latency(DEV, jnp.asarray(shapes[:, 0]),
                                        jnp.asarray(shapes[:, 1]), jnp.asarray(shapes[:, 2]),
                                        batch=jnp.asarray(shapes[:, 3])))
    np.testing.assert_allclose(table.times, direct, rtol=1e-12)
    got = jax.jit(jax.vmap(lambda m, n, k, b: table.lookup(DEV, m, n, k, b, 2.0)))(
        *(jnp.asarray(shapes[:, j]) for j in range(4)))
    np.testing.assert_allclose(np.asarray(got), direct, rtol=1e-12)
    miss = table.lookup(DEV, 130.0, 256.0, 512.0, 1.0, 2.0)
    assert np.isinf(float(miss))
    # the sparse fallback gives the same answers
    sparse = gt.GemmTable(table.shapes, table.times)
    sparse.dense = False
    got2 = jax.vmap(lambda m, n, k, b: sparse.lookup(DEV, m, n, k, b, 2.0))(
        *(jnp.asarray(shapes[:, j]) for j in range(4)))
    np.testing.assert_allclose(np.asarray(got2), direct, rtol=1e-12)
    assert np.isinf(float(sparse.lookup(DEV, 130.0, 256.0, 512.0, 1.0, 2.0)))


def test_table_hook_in_a_batched_model():
    m = jnp.asarray([128.0, 256.0])
    shapes = gt.collect_gemm_shapes(_two_gemms, DEV, m)
    table = gt.GemmTable.build(DEV, shapes)
    via_table = np.asarray(_two_gemms(DEV, m, gemm=table.lookup))
    direct = np.asarray(_two_gemms(DEV, m, gemm=lambda d, *a: jm.gemm_latency.single(d, *a)))
    np.testing.assert_allclose(via_table, direct, rtol=1e-9)


def test_build_rejects_batched_device():
    import dataclasses
    dev = dataclasses.replace(DEV, mem_bw=jnp.asarray([1e12, 2e12]))
    with pytest.raises(ValueError, match="single configuration"):
        gt.GemmTable.build(dev, np.asarray([[128, 128, 128, 1, 2]], dtype=float))


def test_table_keys_the_compute_dtype_rate():
    """A table built on FP8-rate GEMMs (sa_mac_per_cycle doubled) answers those, and misses
    the 16-bit ones (never a wrong rate)."""
    import dataclasses
    fast = dataclasses.replace(DEV, sa_mac_per_cycle=2.0 * DEV.sa_mac_per_cycle)
    shapes = gt.collect_gemm_shapes(_two_gemms, fast, jnp.asarray([128.0]))
    table = gt.GemmTable.build(DEV, shapes)
    direct = float(_two_gemms(fast, 128.0, gemm=lambda d, *a: jm.gemm_latency.single(d, *a)))
    assert float(_two_gemms(fast, 128.0, gemm=table.lookup)) == pytest.approx(direct,
                                                                              rel=1e-9)
    assert np.isinf(float(_two_gemms(DEV, 128.0, gemm=table.lookup)))


def _chained(dev, m, gemm):
    """Three GEMMs of a traced size under a vmap (two of one shape), a batched one, and a
    fourth whose size depends on the first one's time (a second level of
    :func:`gemm_table.gemms_batched`)."""
    t = jax.vmap(lambda x: gemm(dev, x, 256.0, 512.0, 1.0, 2.0))(jnp.stack([m, m, 2.0 * m]))
    b = gemm(dev, m, 64.0, 64.0, m / 32.0, 2.0)
    m2 = jnp.where(t[0] > 0, 3.0 * m, m)
    return t, b, gemm(dev, m2, 128.0, 128.0, 1.0, 2.0)


def test_deferred_gemms_equal_the_tile_search():
    ms = jnp.asarray([128.0, 256.0, 128.0, 96.0])
    want = jax.jit(jax.vmap(lambda m: _chained(DEV, m, gt.default_gemm)))(ms)
    fn = gt.gemms_batched(lambda x: jax.vmap(lambda m: _chained(DEV, m, gt.deferred_gemm))(x))
    got = jax.jit(fn)(ms)
    for w, g in zip(want, got):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    assert np.all(np.isfinite(np.asarray(want[2])))
    # one tile-search loop per kind and level: static batch 1, traced batch, then the
    # GEMM that depends on a time — not one search per call site
    eqns = jax.make_jaxpr(fn)(ms).jaxpr.eqns
    assert not any(e.primitive is gt._gemm_p for e in eqns)
    assert sum(e.primitive.name == "scan" for e in eqns) == 3
