"""Device-level feasibility for the operator models and the concrete validator."""

import dataclasses
import types

import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.batching import call_batched
from jaxmodel.ops import gemm


@pytest.mark.parametrize("name", hw_db.names("device"))
def test_every_hw_db_device_is_usable(name):
    dev = hw_db.device(name)
    jm.validate_device_for_ops(dev)
    ok, why = jm.ops_feasible(dev)
    assert bool(ok) and int(why) == 0


def test_validator_names_field_and_value():
    with pytest.raises(ValueError, match="local_buffer_bytes"):
        jm.validate_device_for_ops(hw_db.device("a100_80gb", local_buffer_bytes=512.0))
    with pytest.raises(ValueError, match="global_buffer_bytes"):
        jm.validate_device_for_ops(hw_db.device("a100_80gb", global_buffer_bytes=1000.0))
    with pytest.raises(ValueError, match="mem_bw"):
        jm.validate_device_for_ops(hw_db.device("a100_80gb").__class__(
            **{**hw_db.device("a100_80gb").__dict__, "mem_bw": 0.0}))


def test_numpy_tile_fits_matches_jax_and_the_search_mask():
    """The concrete check (:func:`tile_fits` over numpy) agrees with the batched one (jnp,
    jitted) and with the GEMM search's own mask, around the buffer thresholds."""
    base = hw_db.device("a100_80gb")
    need_l = float(gemm.min_local_bytes(float(base.sa_rows), float(base.sa_cols)))
    need_g = gemm.min_global_bytes()
    local = np.array([0.5, 0.999, 1.0, 1.001, 4.0, np.inf])[:, None] * need_l
    glob = np.array([0.5, 0.999, 1.0, 1.001, 4.0])[None, :] * need_g
    local, glob = np.broadcast_arrays(local, glob)
    dev = dataclasses.replace(base, local_buffer_bytes=local, global_buffer_bytes=glob)
    fields = {f.name: np.asarray(getattr(dev, f.name), dtype=jnp.result_type(float))[..., None]
              for f in dataclasses.fields(dev) if f.name != "name"}
    fits_np = gemm.tile_fits(types.SimpleNamespace(**fields), xp=np)
    fits_jnp = np.asarray(call_batched(gemm.tile_fits, dev))
    big = gemm._UNCLIPPED

    def search_any(d):
        return jnp.any(gemm._candidate_cycles(d, big, big, big, 2.0)[1])
    fits_search = np.asarray(call_batched(search_any, dev))
    assert fits_np.shape == local.shape
    np.testing.assert_array_equal(fits_np, fits_jnp)
    np.testing.assert_array_equal(fits_np, fits_search)
    assert fits_np.any() and not fits_np.all()


def test_validator_on_a_batch_of_devices():
    dev = hw_db.device("a100_80gb")
    ok = dataclasses.replace(dev, local_buffer_bytes=np.array([dev.local_buffer_bytes, 2e6]))
    assert jm.validate_device_for_ops(ok) is ok
    with pytest.raises(ValueError, match="local_buffer_bytes"):
        jm.validate_device_for_ops(dataclasses.replace(
            dev, local_buffer_bytes=np.array([2e6, 512.0])))


def test_tile_fits_front_equals_the_whole_grid():
    # tile_fits reads only the mappings not dominated in (L2 working set, L1 tile, L1
    # k-tile); on random devices (array edges, buffers, word sizes) it agrees with `any`
    # over every mapping of the grid
    rng = np.random.default_rng(5)
    n = 4000
    base = hw_db.device("a100_80gb")
    edge = rng.choice([1.0, 4.0, 8.0, 16.0, 32.0, 128.0], n)
    fields = {f.name: np.asarray(getattr(base, f.name), float)[None].repeat(n)[:, None]
              for f in dataclasses.fields(base) if f.name != "name"}
    fields.update(sa_rows=edge[:, None], sa_cols=rng.permutation(edge)[:, None],
                  local_buffer_bytes=np.exp(rng.uniform(np.log(256), np.log(2**22), n))[:, None],
                  global_buffer_bytes=np.exp(rng.uniform(np.log(2**14), np.log(2**28), n))[:, None])
    dev = types.SimpleNamespace(**fields)
    word = rng.choice([0.5, 1.0, 2.0, 4.0], n)[:, None]
    assert gemm._fit_front(gemm.GRID).shape[1] < gemm.N_CANDIDATES // 20
    big = gemm._UNCLIPPED
    whole = np.any(gemm._tiles(np, dev, big, big, big, word, gemm.GRID)[-1], axis=-1)
    front = gemm.tile_fits(dev, word, xp=np)
    np.testing.assert_array_equal(front, whole)
    assert 0.1 < whole.mean() < 0.9


def test_device_feasible_built_once_per_trace():
    """Traced, repeated checks of one device share one copy in the graph; a check inside a
    nested trace (here a vmapped closure) gets its own, and the outer trace goes on using
    its copy after the inner trace is gone (no escaped tracer)."""
    import jax
    dev = hw_db.device("a100_80gb")
    small = dataclasses.replace(dev, local_buffer_bytes=512.0)

    def one(d):
        return gemm.device_feasible(d)

    def three(d):
        a = gemm.device_feasible(d)
        inner = jax.vmap(lambda x: gemm.device_feasible(d) & (x > 0))(jnp.arange(2.0))
        return a & gemm.device_feasible(d) & inner.any() & gemm.device_feasible(d)

    n_one = len(jax.make_jaxpr(one)(dev).eqns)
    n_three = len(jax.make_jaxpr(three)(dev).eqns)
    assert n_three < 2 * n_one + 10            # the outer copy once, the vmapped one once
    for d, want in ((dev, True), (small, False)):
        assert bool(jax.jit(three)(d)) is want
        assert bool(gemm.device_feasible(d)) is want


def test_device_feasible_keeps_no_tracer_after_its_trace():
    """The shared check holds its trace's values weakly: no leaked tracer once the trace is
    done (JAX's leak checker passes), no finished graph kept alive, and the next trace
    builds its own copy."""
    import gc

    import jax
    dev = hw_db.device("a100_80gb")

    def twice(d):
        return gemm.device_feasible(d) & gemm.device_feasible(d)

    with jax.checking_leaks():
        assert bool(jax.jit(twice)(dev))
    gc.collect()
    assert all(ref() is None for _, _, ref in gemm._FEASIBLE)
    small = dataclasses.replace(dev, local_buffer_bytes=512.0)
    assert not bool(jax.jit(twice)(small))


def test_device_feasible_keeps_nothing_when_no_checked_field_is_traced():
    """A trace whose tracers are in fields the check does not read (a sweep over
    ``matmul_efficiency`` under an eager ``vmap``) gets a constant: nothing is kept for it (such an entry would
    outlive its trace, held strongly, and never match again)."""
    import gc

    import jax
    dev = hw_db.device("a100_80gb")
    n = len(gemm._FEASIBLE)
    f = jax.vmap(lambda e: gemm.device_feasible(dataclasses.replace(dev, matmul_efficiency=e)))
    assert bool(f(jnp.asarray([0.8, 0.9])).all())   # eager vmap: the check runs on constants
    assert len(gemm._FEASIBLE) <= n
    gc.collect()
    assert all(ref() is None for _, _, ref in gemm._FEASIBLE)


def test_device_feasible_without_trace_state_shares_nothing(monkeypatch):
    """A JAX without the opaque trace state: nothing is kept, the values are the same."""
    import jax
    dev = hw_db.device("a100_80gb")

    def three(d):
        return gemm.device_feasible(d) & gemm.device_feasible(d) & gemm.device_feasible(d)

    monkeypatch.setattr(gemm, "_trace_state", lambda: None)
    monkeypatch.setattr(gemm, "_FEASIBLE", [])
    for d, want in ((dev, True), (dataclasses.replace(dev, local_buffer_bytes=512.0), False)):
        assert bool(jax.jit(three)(d)) is want
        assert bool(jax.vmap(three)(jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), d))
                    .all()) is want
    assert gemm._FEASIBLE == []
