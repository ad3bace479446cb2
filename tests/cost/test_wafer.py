"""Wafer primitives: dies per wafer (exact grid vs CATCH, closed form), reticle, yield."""

import csv
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
from jaxmodel.cost import wafer


def _dpw_ref(anchors):
    path = anchors / "chiplet_cost_library" / "reference_outputs" / \
        "catch_dies_per_wafer_reference.csv"
    return [(float(r["area_mm2"]), int(r["dpw_grid"]), float(r["dpw_simple_formula"]))
            for r in csv.DictReader(open(path))]


def test_grid_dpw_matches_catch(anchors):
    rows = _dpw_ref(anchors)
    areas = jnp.array([a for a, _, _ in rows])
    side = jnp.sqrt(areas)
    got = np.asarray(jax.vmap(lambda s: wafer.dies_per_wafer_grid(s, s, 300.0, 0.1, 0.13,
                                                                  k_max=16, rows=300))(side))
    ref = np.array([g for _, g, _ in rows])
    exact = np.sum(got == ref)
    assert exact >= 15, (got, ref)                   # 15 of 21 sizes identical
    rel = np.abs(got / ref - 1)
    assert np.all(rel[areas >= 20] <= 0.016)         # 858 mm²: 63 vs 64
    assert np.all(rel[areas < 20] <= 0.001)          # small dies within 0.1 %
    big = np.asarray(areas) >= 50
    assert np.all(got[big & (np.asarray(areas) != 858)] == ref[big & (np.asarray(areas) != 858)])


def test_smooth_dpw_is_catch_closed_form(anchors):
    for area, _, simple in _dpw_ref(anchors):
        s = math.sqrt(area)
        assert float(wafer.dies_per_wafer_smooth(s, s, 300.0, 0.1, 0.13)) == pytest.approx(
            simple, rel=1e-6, abs=0.01)


def test_ttm_dpw_hand_value():
    # π·150²/826 − π·300/√(2·826) = 85.575 − 23.187 = 62.39 (ttm-cas closed form)
    assert float(jm.dies_per_wafer_ttm(826.0)) == pytest.approx(
        math.pi * 22500 / 826 - math.pi * 300 / math.sqrt(1652), rel=1e-12)
    assert float(jm.dies_per_wafer_ttm(826.0)) == pytest.approx(62.39, abs=0.01)


def test_yield_and_reticle_hand_values():
    # (1 + 0.6·11.1237·0.005/2)^-2 = 0.96745 (CATCH heterogeneous compute die)
    y = wafer.negative_binomial_yield(0.6 * 11.123666, 0.005, 2.0)
    assert float(y) == pytest.approx((1 + 0.6 * 11.123666 * 0.005 / 2) ** -2, rel=1e-12)
    assert float(y) == pytest.approx(0.96745, abs=1e-5)
    # 500 mm² in a 26×33 reticle: one die per field, u = 500/858
    assert float(wafer.reticle_utilization(500.0, 26.0, 33.0)) == pytest.approx(500 / 858)
    # 300 mm²: two dies per field
    assert float(wafer.reticle_utilization(300.0, 26.0, 33.0)) == pytest.approx(600 / 858)
    # 1000 mm² needs two fields holding one die: u = 1000/1716
    assert float(wafer.reticle_utilization(1000.0, 26.0, 33.0)) == pytest.approx(1000 / 1716)


def test_exact_dpw_gradient_is_straight_through_and_finite():
    g = jax.grad(lambda s: wafer.dies_per_wafer(s, s, 300.0, 0.1, 0.13))(20.0)
    gs = jax.grad(lambda s: wafer.dies_per_wafer_smooth(s, s, 300.0, 0.1, 0.13))(20.0)
    assert np.isfinite(g) and g == pytest.approx(gs)
    big = wafer.dies_per_wafer(400.0, 400.0, 300.0, 0.1, 0.13)  # no die fits: 0, no NaN
    assert float(big) == 0.0 and np.isfinite(jax.grad(lambda s: wafer.dies_per_wafer(s, s, 300., .1, .13))(400.0))
