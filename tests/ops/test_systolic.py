"""Systolic-array cycle count: SCALE-Sim closed form on small tiles, LLMCompass utilisation on big ones."""

import jax.numpy as jnp
import pytest

from jaxmodel.ops import systolic_cycles


@pytest.mark.parametrize("m,n,k,want", [
    (16, 16, 16, 1 * 1 * (16 + 30) - 1),          # one fold
    (32, 16, 10, 2 * 1 * (10 + 30) - 1),          # two folds along m
    (17, 33, 8, 2 * 3 * (8 + 30) - 1),            # padded edge folds
    (1, 1, 1, 1 * 1 * (1 + 30) - 1),
])
def test_closed_form_small_tiles(m, n, k, want):
    assert float(systolic_cycles(m, n, k, 16, 16)) == want


def test_large_tiles_use_pipelined_utilisation():
    # ratio = 128·128·256 / (16·16·16) = 1024 >= 128: folds·K / 0.99
    assert float(systolic_cycles(128, 128, 256, 16, 16)) == pytest.approx(8 * 8 * 256 / 0.99)
    # 64 <= ratio < 128: / 0.98
    assert float(systolic_cycles(64, 64, 64, 16, 16)) == pytest.approx(4 * 4 * 64 / 0.98)


def test_mac_per_cycle_divides_and_arrays_broadcast():
    c = systolic_cycles(jnp.array([16.0, 32.0]), 16.0, 16.0, 16.0, 16.0, 0.5)
    assert c.shape == (2,)
    assert float(c[0]) == 2 * 45


@pytest.mark.parametrize("m,n,k,rows,cols", [(1, 1, 7, 1, 1), (5, 3, 9, 1, 1), (16, 16, 1, 16, 16),
                                             (40, 8, 64, 4, 4), (128, 128, 256, 16, 16)])
def test_never_below_macs_over_array_size(m, n, k, rows, cols):
    assert float(systolic_cycles(m, n, k, rows, cols)) >= m * n * k / (rows * cols)


def test_one_by_one_array_does_one_mac_per_cycle():
    assert float(systolic_cycles(1, 1, 7, 1, 1)) == 7.0
