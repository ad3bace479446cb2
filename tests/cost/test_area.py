"""LLMCompass die-area model against the measured GA100 / Aldebaran dies."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.cost import area as area_mod


def _measured(anchors):
    rows = [l.replace("\t", "").split(",") for l in
            (anchors / "llmcompass_measured" / "die_area.csv").read_text().splitlines() if l]
    return np.array([[float(a), float(b)] for a, b in rows])


def test_totals_within_targets(anchors):
    real = _measured(anchors).sum(axis=0)
    assert real[0] == pytest.approx(822.7, abs=0.05) and real[1] == pytest.approx(720.0, abs=0.05)
    ga100 = float(jm.die_area(hw_db.device("a100_80gb"))["total"])
    mi210 = float(jm.die_area(hw_db.device("mi210"))["total"])
    assert abs(ga100 / real[0] - 1) < 0.02
    assert abs(mi210 / real[1] - 1) < 0.05


def test_ga100_components_match_llmcompass_breakdown():
    a = {k: float(v) for k, v in jm.die_area(hw_db.device("a100_80gb")).items()}
    # LLMCompass GA100 breakdown (notes cost_and_uarch.md §6.1)
    for key, ref in [("cores", 525.1), ("interconnect", 58.9), ("global_buffer", 113.7),
                     ("memory_phy", 62.7), ("memory_controller", 34.4), ("link_phy", 22.7),
                     ("link_controller", 9.3)]:
        assert a[key] == pytest.approx(ref, abs=0.3), key
    # hand value: 6 HBM2e PHYs at 10.45 mm², 12 NVLink3 PHYs at 1.888 mm²
    assert a["memory_phy"] == pytest.approx(6 * 10.45)
    assert a["link_phy"] == pytest.approx(12 * 1.888)


def test_sram_hand_values():
    # 192 KiB at 7 nm: one 256 KiB-class unit, η = 0.526: 192·1024·8·0.17e-6/0.526 mm²
    assert float(jm.sram_area(192 * 1024, 0.170)) == pytest.approx(
        192 * 1024 * 8 * 0.17e-6 / 0.526, rel=1e-9)
    # 48 MiB = 96 units of 512 KiB at η = 0.602
    assert float(jm.sram_area(48 * 2 ** 20, 0.170)) == pytest.approx(
        96 * 512 * 1024 * 8 * 0.17e-6 / 0.602, rel=1e-9)


def test_batch_matches_loop_and_grad_matches_fd():
    dev = hw_db.device("a100_80gb")
    cores = jnp.array([64.0, 96.0, 128.0])
    tot = np.asarray(jm.die_area(dataclasses.replace(dev, physical_core_count=cores))["total"])
    for i, c in enumerate(cores):
        one = jm.die_area(dataclasses.replace(dev, physical_core_count=float(c)))["total"]
        assert float(one) == pytest.approx(tot[i], rel=1e-12)
    dev64 = area_mod.area_fields(dev)

    def total(node, gb):
        d = dataclasses.replace(dev64, process_node_nm=node, physical_global_buffer_bytes=gb)
        return area_mod._die_area_single(d)["total"]

    gb = 40.3 * 2 ** 20  # between 512 KiB steps: the remainder unit carries the gradient
    g = jax.jit(jax.grad(total, argnums=(0, 1)))(6.5, gb)
    total = jax.jit(total)
    fd0 = (total(6.5 + 1e-5, gb) - total(6.5 - 1e-5, gb)) / 2e-5
    fd1 = (total(6.5, gb + 1e2) - total(6.5, gb - 1e2)) / 2e2
    assert float(g[0]) == pytest.approx(float(fd0), rel=1e-5)
    assert float(g[1]) == pytest.approx(float(fd1), rel=1e-5)
    assert np.isfinite(float(g[0])) and float(g[0]) > 0   # a coarser node is larger


def test_table4_designs_areas():
    """LLMCompass Table IV: latency design 478 mm², throughput design 787 mm²."""
    ga100 = hw_db.device("a100_80gb")
    lat = dataclasses.replace(ga100, core_count=64.0, physical_core_count=64.0,
                              global_buffer_bytes=24 * 2 ** 20,
                              physical_global_buffer_bytes=24 * 2 ** 20)
    thr = dataclasses.replace(ga100, core_count=64.0, physical_core_count=64.0, sa_rows=32.0,
                              sa_cols=32.0, local_buffer_bytes=768 * 1024.0, mem_protocol=2.0,
                              physical_mem_channels=256.0, mem_channels=256.0)
    assert float(jm.die_area(lat)["total"]) == pytest.approx(478, rel=0.02)
    # the paper's 787 mm² is not reproduced exactly: we get 754 mm² (-4.2 %)
    assert float(jm.die_area(thr)["total"]) == pytest.approx(787, rel=0.05)
