"""Device / system cost and TCO."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.cost import device as device_mod
from jaxmodel.cost.area import area_fields


def test_table4_die_and_memory_cost():
    """LLMCompass Table IV prices GA100 at $151 die (wafer/DPW, no yield) + $560 HBM."""
    c = jm.device_cost(hw_db.device("a100_80gb"), include_yield=False)
    assert float(c.die_usd) == pytest.approx(151.0, rel=0.02)
    assert float(c.memory_usd) == pytest.approx(560.0)
    a = float(c.die_area_mm2)
    dpw = math.pi * 150 ** 2 / a - math.pi * 300 / math.sqrt(2 * a)
    assert float(c.die_usd) == pytest.approx(9346.0 / dpw, rel=1e-9)


def test_yielded_die_cost_hand_value():
    c = jm.device_cost(hw_db.device("a100_80gb"))
    a = float(c.die_area_mm2)
    y = (1 + a * 0.0015 / 3) ** -3
    assert float(c.die_yield) == pytest.approx(y, rel=1e-9)
    assert float(c.die_usd) == pytest.approx(9346.0 / float(c.dies_per_wafer) / y, rel=1e-9)
    assert float(c.total_usd) == pytest.approx(float(c.die_usd) + 560.0 + 21.0, rel=1e-12)


def test_die_cost_gradient_and_hbm_throughput_per_dollar():
    g = jax.grad(lambda a: device_mod._die_cost_single(a, 7.0)[0])(800.0)
    fd = (device_mod._die_cost_single(800.0 + 1e-3, 7.0)[0]
          - device_mod._die_cost_single(800.0 - 1e-3, 7.0)[0]) / 2e-3
    assert np.isfinite(float(g)) and float(g) == pytest.approx(float(fd), rel=1e-5)

    dev = area_fields(hw_db.device("a100_80gb"))
    per_stack_bw, per_stack_bytes = dev.mem_bw / 5, dev.mem_capacity / 5

    def tokens_per_dollar(stacks):
        d = dataclasses.replace(dev, mem_channels=stacks, physical_mem_channels=stacks + 1.0,
                                mem_bw=stacks * per_stack_bw,
                                mem_capacity=stacks * per_stack_bytes)
        # decode proxy (memory bound): stream GPT-3's 350 GB of fp16 weights once per token
        t = 350e9 / d.mem_bw
        return (1.0 / t) / device_mod._device_cost_single(d).total_usd

    g = jax.grad(tokens_per_dollar)(5.0)
    assert np.isfinite(float(g))


def test_system_cost_and_tco():
    s = hw_db.system("dgx_a100", nodes=2)
    sc = jm.system_cost(s)
    dev = float(jm.device_cost(s.device).total_usd)
    assert float(sc.devices_usd) == pytest.approx(16 * dev)
    assert float(sc.total_usd) == pytest.approx(float(sc.devices_usd + sc.hosts_usd
                                                      + sc.network_usd))
    assert all(float(x) > 0 for x in sc.network_by_level)
    t = jm.tco(s, tokens_per_s=1000.0, run_time_s=7200.0)
    life_h = 4 * 8760
    power = 16 * (400 + 150)
    assert float(t.power_w) == pytest.approx(power)
    assert float(t.usd_per_hour) == pytest.approx(float(sc.total_usd) / life_h
                                                  + power / 1000 * 1.58 * 0.08, rel=1e-9)
    assert float(t.usd_per_million_tokens) == pytest.approx(
        float(t.usd_per_hour) / 3.6, rel=1e-9)
    assert float(t.usd_per_run) == pytest.approx(2 * float(t.usd_per_hour), rel=1e-12)
    # batched: a price override per row
    tb = jm.tco(s, 1000.0, capex_usd=jnp.array([1e5, 2e5]))
    assert tb.usd_per_hour.shape == (2,)
    assert float(tb.usd_per_hour[1] - tb.usd_per_hour[0]) == pytest.approx(1e5 / life_h)
    assert float(jm.tco(s).usd_per_million_tokens) == math.inf
