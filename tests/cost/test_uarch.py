"""DeepFlow micro-architecture engine against the V100-like configuration."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
from jaxmodel.cost.microarch import _uarch_single


@pytest.fixture(scope="module")
def v100(anchors):
    return jm.load_deepflow_config(anchors / "deepflow_configs" / "2025_current" /
                                   "waferscale_20v100_80hbm.yaml")


def test_v100_like_configuration(v100):
    dev, info = jm.uarch(*v100, details=True)
    assert float(info["n_mcu"]) == 643
    assert float(info["freq_hz"]) == pytest.approx(1.52e9, rel=0.02)
    assert float(dev.peak_matrix_flops) == pytest.approx(125e12, rel=0.02)
    assert float(info["dram_stacks"]) == 4
    assert float(info["dram_bw"]) / 2 ** 30 == pytest.approx(925, rel=0.02)
    assert float(info["l2_bytes"]) == 6 * 2 ** 20
    assert float(info["l2_bw"]) / 2 ** 30 == pytest.approx(967, rel=0.02)


def test_dvfs_hand_value():
    # nominal power ratio 1 gives the nominal voltage and frequency
    f, v = jm.dvfs(1.0, 0.8, 0.2, 0.35, 1.33e9)
    assert float(v) == pytest.approx(0.8, rel=1e-9) and float(f) == pytest.approx(1.33e9)
    # V(V-Vt)^2 = r·Vn(Vn-Vt)^2 holds at the solution
    f, v = jm.dvfs(1.3441, 0.8, 0.2, 0.35, 1.33e9)
    assert float(v * (v - 0.2) ** 2) == pytest.approx(1.3441 * 0.8 * 0.36, rel=1e-9)


def test_gradients_flow_budget_to_performance(v100):
    tech, b = v100

    def peak(p_core, a_core):
        bb = dataclasses.replace(b, core_power=p_core, core_area=a_core)
        return _uarch_single(tech, bb, discrete=False)[0].peak_matrix_flops

    g = jax.jit(jax.grad(peak, argnums=(0, 1)))(112.35, 244.5)
    peak = jax.jit(peak)
    fd0 = (peak(112.35 + 1e-4, 244.5) - peak(112.35 - 1e-4, 244.5)) / 2e-4
    fd1 = (peak(112.35, 244.5 + 1e-4) - peak(112.35, 244.5 - 1e-4)) / 2e-4
    assert float(g[0]) == pytest.approx(float(fd0), rel=1e-5)
    assert float(g[1]) == pytest.approx(float(fd1), rel=1e-5)
    # discrete mode: straight-through gradients stay finite
    gd = jax.jit(jax.grad(lambda p: jm.uarch.single(tech, dataclasses.replace(
        b, dram_power=p))[0].mem_bw))(48.0)
    assert np.isfinite(float(gd)) and float(gd) > 0


def test_batched_budgets_match_loop(v100):
    tech, b = v100
    powers = jnp.array([80.0, 112.35, 150.0])
    dev = jm.uarch(tech, dataclasses.replace(b, core_power=powers))
    for i, p in enumerate(powers):
        one = jm.uarch(tech, dataclasses.replace(b, core_power=float(p)))
        assert float(one.freq_hz) == pytest.approx(float(dev.freq_hz[i]), rel=1e-12)


def test_bad_config_names_field(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("tech_param:\n    core:\n        nominal_power_per_mcu: lots\n")
    with pytest.raises(ValueError, match="bad.yaml"):
        jm.load_deepflow_config(p)
