"""CATCH chiplet cost model: reference systems, 800 mm² sweep, batching, gradients, errors."""

import csv
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
from jaxmodel.cost import chiplet


@pytest.fixture(scope="module")
def lib(anchors):
    return anchors / "chiplet_cost_library"


@pytest.mark.parametrize("system,netlist,ref", [
    ("examples/sip.xml", "examples/netlist.xml", 66.1808),
    ("examples/heterogeneous_testcase.xml", "examples/heterogeneous_testcase_netlist.xml",
     36.7948),
    ("reference_outputs/a100like/a100like_7nm_def.xml",
     "reference_outputs/a100like/a100like_7nm_netlist.xml", 1017.4165),
])
def test_reference_totals_within_1pct(lib, system, netlist, ref):
    r = jm.chiplet_cost(lib / system, lib / netlist, lib)
    assert bool(r.feasible)
    assert float(r.total_usd) == pytest.approx(ref, rel=0.01)


def test_a100like_breakdown_matches_catch(lib):
    r = jm.chiplet_cost(lib / "reference_outputs/a100like/a100like_7nm_def.xml",
                        lib / "reference_outputs/a100like/a100like_7nm_netlist.xml", lib)
    b = {k: np.asarray(v) for k, v in r.breakdown.items()}
    gpu = r.names.index("GPU")
    # catch_example_breakdowns.txt: GPU area 812.410, DPW 69, layer cost 137.5017,
    # yield 0.18906, interposer 1450.288 mm², NRE/unit 84.005
    assert b["area"][gpu] == pytest.approx(812.410, abs=1e-3)
    assert b["dies_per_wafer"][gpu] == 69
    assert b["layer_cost"][gpu] == pytest.approx(137.5017, rel=1e-5)
    assert b["self_yield"][gpu] == pytest.approx(0.18906, abs=1e-5)
    assert b["area"][0] == pytest.approx(1450.288, abs=1e-3)
    assert float(r.nre_usd) == pytest.approx(84.005, rel=1e-6)


def _sweep(lib, configs):
    ref = {}
    path = lib / "reference_outputs" / "catch_sweep_chiplet_size_by_node.csv"
    for row in csv.DictReader(open(path)):
        ref[(row["tech"], row["config"])] = float(row["total_cost"])
    nodes = ["3nm", "5nm", "7nm", "10nm", "12nm", "40nm"]
    layers = jm.load_library(str(lib))["layer"]
    fields = ("cost_per_mm2", "defect_density", "critical_area_ratio", "litho_percent",
              "nre_mask_cost")
    got = {}
    grid = lib / "examples" / "grid_800mm2_generated"
    for cfg in configs:
        with pytest.warns(UserWarning) if cfg == "2_400" else _nullcontext():
            sys_ = jm.load_chiplet_system(grid / f"chiplet_{cfg}_def.xml",
                                          grid / f"chiplet_{cfg}_netlist.xml", lib)
        batch = sys_.with_layer_values(
            "combined_5nm", **{f: jnp.array([layers[f"combined_{n}"][f] for n in nodes])
                               for f in fields})
        tot = np.asarray(jm.chiplet_system_cost(batch).total_usd)
        for n, v in zip(nodes, tot):
            got[(n, cfg)] = v
    worst = max(abs(got[k] / ref[k] - 1) for k in got)
    assert worst < 0.01
    for n in nodes:
        assert min(configs, key=lambda c: got[(n, c)]) == min(configs, key=lambda c: ref[(n, c)])


def test_sweep_800mm2_decisive_pair(lib):
    """9 vs 16 chiplets decide the optimum at every node (full sweep: the slow test)."""
    _sweep(lib, ["9_88", "16_50"])


@pytest.mark.slow
def test_sweep_800mm2_picks_same_split_per_node(lib):
    """One structure per chiplet count; the six nodes are one batched call each."""
    _sweep(lib, ["2_400", "4_200", "9_88", "16_50", "25_32", "36_22", "49_16", "64_12"])


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@pytest.fixture(scope="module")
def a100like(lib):
    return jm.load_chiplet_system(lib / "reference_outputs/a100like/a100like_7nm_def.xml",
                                  lib / "reference_outputs/a100like/a100like_7nm_netlist.xml",
                                  lib)


def test_vmap_matches_loop_and_jit_matches_eager(a100like, lib):
    areas = jnp.array([400.0, 600.0, 800.0])
    dens = jnp.array([0.001, 0.005, 0.003])
    batch = a100like.with_chip_values("GPU", core_area=areas).with_layer_values(
        "combined_7nm", defect_density=dens)
    tot = np.asarray(jm.chiplet_system_cost(batch).total_usd)
    assert tot.shape == (3,)
    for i in range(3):
        one = a100like.with_chip_values("GPU", core_area=float(areas[i])).with_layer_values(
            "combined_7nm", defect_density=float(dens[i]))
        assert float(jm.chiplet_system_cost(one).total_usd) == pytest.approx(tot[i], rel=1e-10)
    # jit vs eager on the 4-chip demo system (op-by-op dispatch is slow on big systems)
    sip = jm.load_chiplet_system(lib / "examples/sip.xml", lib / "examples/netlist.xml", lib)
    with jax.disable_jit():
        eager = chiplet._chiplet_cost_single(
            jax.tree_util.tree_map(jnp.asarray, sip), "smooth", 16, 8).total_usd
    jitted = jm.chiplet_system_cost(sip, dpw="smooth", rows=8).total_usd
    assert float(eager) == pytest.approx(float(jitted), rel=1e-10)
    # a larger quantity amortises NRE: strictly cheaper
    q = a100like.with_chip_values(None, quantity=jnp.array([1e5, 1e7]))
    t = np.asarray(jm.chiplet_system_cost(q).total_usd)
    assert t[0] > t[1]


def test_gradient_matches_finite_differences(a100like):
    sys64 = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float64), a100like)

    def cost(area, d):
        s = sys64.with_chip_values("GPU", core_area=area).with_layer_values(
            "combined_7nm", defect_density=d)
        return chiplet._chiplet_cost_single(s, "smooth", 16, 16).total_usd

    g = jax.jit(jax.grad(cost, argnums=(0, 1)))(700.0, 0.003)
    cost = jax.jit(cost)
    h = 1e-4
    fd_a = (cost(700.0 + h, 0.003) - cost(700.0 - h, 0.003)) / (2 * h)
    fd_d = (cost(700.0, 0.003 + 1e-8) - cost(700.0, 0.003 - 1e-8)) / 2e-8
    assert float(g[0]) == pytest.approx(float(fd_a), rel=1e-5)
    assert float(g[1]) == pytest.approx(float(fd_d), rel=1e-5)
    # exact-DPW mode: straight-through gradient, finite and positive (bigger die costs more)
    ge = jax.jit(jax.grad(lambda a: chiplet._chiplet_cost_single(
        sys64.with_chip_values("GPU", core_area=a), "exact", 16, 16).total_usd))(700.0)
    assert np.isfinite(float(ge)) and float(ge) > 0


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_malformed_and_unknown_references(lib, tmp_path):
    good_sys = (lib / "examples/sip.xml").read_text()
    good_net = (lib / "examples/netlist.xml").read_text()
    bad = _write(tmp_path, "bad.xml", good_sys.replace("</chip>\n</chip>", "</chip>", 1)[:-20])
    with pytest.raises(ValueError, match="bad.xml: malformed XML"):
        jm.chiplet_cost(bad, lib / "examples/netlist.xml", lib)
    net = _write(tmp_path, "net.xml", good_net.replace('type="GPIO"', 'type="NoSuchIO"', 1))
    with pytest.raises(ValueError, match=r"net.xml: element <net type='NoSuchIO'>.*unknown IO"):
        jm.chiplet_cost(lib / "examples/sip.xml", net, lib)
    layer = _write(tmp_path, "layer.xml", good_sys.replace("1:organic_substrate",
                                                           "1:unobtainium", 1))
    with pytest.raises(ValueError, match=r"layer.xml: element <chip name='interposer'>.*"
                                         r"unknown layer 'unobtainium'"):
        jm.chiplet_cost(layer, lib / "examples/netlist.xml", lib)
    num = _write(tmp_path, "num.xml", good_sys.replace('core_area="10.0"', 'core_area="ten"', 1))
    with pytest.raises(ValueError, match=r"num.xml: element <chip name='CPU'> attribute "
                                         r"'core_area' must be a number"):
        jm.chiplet_cost(num, lib / "examples/netlist.xml", lib)
    with pytest.raises(ValueError, match="file not found"):
        jm.chiplet_cost(tmp_path / "missing.xml", lib / "examples/netlist.xml", lib)


def test_black_box_cost_enters_the_parent(a100like):
    """A bought part (bb_cost) replaces the computed cost before the parent's roll-up."""
    base = jm.chiplet_system_cost(a100like)
    bb = jm.chiplet_system_cost(a100like.with_chip_values("HBM_0", bb_cost=100.0))
    i = a100like.index("HBM_0")
    computed = float(base.breakdown["cost"][i])
    y_root = float(base.breakdown["chip_test_yield"][0])
    assert float(bb.cost_usd - base.cost_usd) == pytest.approx((100.0 - computed) / y_root,
                                                               rel=1e-9)
