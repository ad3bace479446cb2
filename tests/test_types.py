"""Config pytrees: leaves, codes, validation, derived peaks (hand-derived)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.types import code_of


def test_device_peaks_match_datasheets():
    a100 = hw_db.device("a100_80gb")
    # 108 SM x 4 lanes x 16x16 PEs x 1 MAC x 2 FLOP x 1.41 GHz (LLMCompass: 311.9 TFLOP/s)
    assert float(a100.peak_matrix_flops) == pytest.approx(108 * 4 * 256 * 2 * 1.41e9)
    assert float(a100.peak_matrix_flops) == pytest.approx(311.9e12, rel=1e-3)
    # 108 x 4 lanes x 32 wide x 4 flop x 1.41 GHz = 78 TFLOP/s (notes §1)
    assert float(a100.peak_vector_flops) == pytest.approx(77.97e12, rel=1e-3)
    assert float(hw_db.device("h100_sxm").peak_matrix_flops) == pytest.approx(989.4e12, rel=1e-3)
    assert float(hw_db.device("mi300x").peak_matrix_flops) == pytest.approx(1307.4e12, rel=1e-3)


def test_every_numeric_field_is_a_leaf():
    dev = hw_db.device("a100_80gb")
    n_numeric = len([f for f in dataclasses.fields(jm.Device) if f.name != "name"])
    assert len(jax.tree_util.tree_leaves(dev)) == n_numeric
    par = jm.Parallelism(dp=2, tp=8, pp=4, sp=True, schedule="interleaved", recompute="full")
    assert len(jax.tree_util.tree_leaves(par)) == len(dataclasses.fields(jm.Parallelism))
    assert par.schedule == 2.0 and par.recompute == 2.0 and par.sp == 1.0


def test_codes_follow_contract_order():
    assert jm.TOPOLOGIES == ("ring", "switch", "fully_connected", "mesh2d", "torus2d")
    assert jm.SCHEDULES == ("gpipe", "1f1b", "interleaved")
    assert jm.RECOMPUTE == ("none", "selective", "full")
    lvl = jm.NetLevel(size=8, topology="torus2d", bw_per_device=1e11, link_latency=1e-6)
    assert lvl.topology == 4.0
    assert code_of(3.0, jm.TOPOLOGIES, "topology") == 3.0


def test_bad_code_names_the_field():
    with pytest.raises(ValueError, match="schedule"):
        jm.Parallelism(schedule="zigzag")
    with pytest.raises(ValueError, match="topology"):
        jm.NetLevel(size=4, topology="hypercube", bw_per_device=1.0, link_latency=0.0)


def test_post_init_is_trace_safe():
    dev = hw_db.device("a100_80gb")
    batch = dataclasses.replace(dev, mem_bw=jnp.array([1e12, 2e12]))
    axes = jax.tree_util.tree_map(lambda x: 0 if jnp.ndim(x) else None, batch)
    out = jax.vmap(lambda d: d.achievable_mem_bw, in_axes=(axes,))(batch)
    assert out.shape == (2,)
    par = jm.Parallelism(tp=jnp.array([1.0, 2.0]))
    assert jax.jit(lambda p: p.n_devices)(par).shape == (2,)


@pytest.mark.parametrize("field,value", [("mem_bw", 0.0), ("core_count", -4.0),
                                         ("freq_hz", float("nan")), ("local_buffer_bytes", 0)])
def test_validate_device_names_field_and_value(field, value):
    dev = dataclasses.replace(hw_db.device("a100_80gb"), **{field: value})
    with pytest.raises(ValueError, match=field):
        jm.validate_device(dev)


def test_validate_parallelism():
    with pytest.raises(ValueError, match="zero"):
        jm.validate_parallelism(jm.Parallelism(zero=5))
    with pytest.raises(ValueError, match="tp"):
        jm.validate_parallelism(jm.Parallelism(tp=0))


def test_system_levels_and_device_count():
    sys_ = jm.System(device=hw_db.device("a100_80gb"),
                     levels=[jm.NetLevel(size=8, topology="switch", bw_per_device=300e9,
                                         link_latency=1e-6),
                             jm.NetLevel(size=4, topology="switch", bw_per_device=100e9,
                                         link_latency=5e-6)])
    assert isinstance(sys_.levels, tuple)
    assert float(sys_.n_devices) == 32.0
    leaves = jax.tree_util.tree_leaves(sys_)
    assert all(jnp.isfinite(jnp.asarray(x)) for x in leaves)
