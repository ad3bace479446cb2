"""jm.codesign on toy objectives with known optima."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm

BOUNDS = {"bw": (1e11, 1e13), "cores": (8.0, 256.0), "buf": (1e3, 1e6)}


def convex(p):
    """Convex in log space; optimum bw = 2e12, cores = 100.4, buf at its lower bound."""
    return ((jnp.log(p["bw"] / 2e12)) ** 2 + (jnp.log(p["cores"] / 100.4)) ** 2
            + 0.1 * jnp.log(p["buf"] / 1e3))


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_convex_objective_reaches_optimum(optimizer):
    res = jm.codesign(convex, {"bw": 1.5e11, "cores": 10, "buf": 5e5}, BOUNDS, steps=150,
                      options=jm.CodesignOptions(optimizer=optimizer))
    c = res.continuous_params
    assert c["bw"] == pytest.approx(2e12, rel=1e-3)
    assert c["cores"] == pytest.approx(100.4, rel=1e-3)
    assert c["buf"] == pytest.approx(1e3, rel=1e-3)          # active box constraint
    assert res.continuous_value == pytest.approx(0.0, abs=1e-5)
    assert res.n_grad_evals == 150
    assert res.history.shape == (150, 1)
    assert np.all(np.diff(res.best_history) <= 0)


def test_integer_rounding_reevaluates_exactly():
    exact_calls = []

    def exact(p):
        exact_calls.append(1)
        return convex(p)

    res = jm.codesign(convex, {"bw": 1e12, "cores": 64}, BOUNDS, steps=200,
                      integer=("cores",), exact=exact, options=jm.CodesignOptions(n_starts=3))
    assert res.params["cores"] == 100.0
    assert res.value == pytest.approx(float(convex({k: jnp.asarray(v) for k, v in
                                                    res.params.items()})), rel=1e-6)
    assert exact_calls  # traced once for the vmapped re-evaluation
    # at most 2 rounding candidates per start, plus one final evaluation per start
    assert res.n_grad_evals == 600
    assert 600 < res.n_evals <= 600 + 3 + 1 + 3 * 2   # + final iterates, init, rounding
    # the init is evaluated at its exact value (no log-space round trip: 64 cores, not 63.99)
    at_init = {"bw": 1e12, "cores": 64.0, "buf": (1e3 * 1e6) ** 0.5}   # buf: geometric middle
    assert res.init_value == pytest.approx(float(convex(
        {k: jnp.asarray(v) for k, v in at_init.items()})), rel=1e-6)


def test_multistart_escapes_a_bad_basin():
    # two basins in log(x): a shallow one at x = 10 and the global one at x = 1000.
    def f(p):
        z = jnp.log10(p["x"])
        return jnp.minimum((z - 1.0) ** 2 + 0.5, 4.0 * (z - 3.0) ** 2)

    one = jm.codesign(f, {"x": 5.0}, {"x": (1.0, 1e4)}, steps=100)
    many = jm.codesign(f, {"x": 5.0}, {"x": (1.0, 1e4)}, steps=100,
                       options=jm.CodesignOptions(n_starts=8, seed=1))
    assert one.continuous_params["x"] == pytest.approx(10.0, rel=1e-2)
    assert many.continuous_params["x"] == pytest.approx(1000.0, rel=1e-2)
    assert many.value < one.value


def test_infeasible_region_gives_finite_iterates():
    # +inf (infeasible) above x = 100: the optimiser must stay finite and feasible.
    def f(p):
        return jnp.where(p["x"] < 100.0, -jnp.log(p["x"]), jnp.inf)

    res = jm.codesign(f, {"x": 2.0}, {"x": (1.0, 1e3)}, steps=100)
    assert math.isfinite(res.value)
    assert res.params["x"] < 100.0
    assert np.all(np.isfinite(res.final_params["x"]))


@pytest.mark.parametrize("bounds, init, kw, match", [
    ({"x": (0.0, 1.0)}, {}, {}, "x"),
    ({"x": (2.0, 1.0)}, {}, {}, "x"),
    ({"x": (1.0, 2.0)}, {"y": 1.0}, {}, "y"),
    ({"x": (1.0, 2.0)}, {"x": -1.0}, {}, "x"),
    ({"x": (1.0, 2.0)}, {}, {"integer": ("z",)}, "z"),
    ({"x": (1.0, 2.0)}, {}, {"options": jm.CodesignOptions(optimizer="sgd")}, "sgd"),
])
def test_bad_arguments(bounds, init, kw, match):
    with pytest.raises(ValueError, match=match):
        jm.codesign(lambda p: p["x"], init, bounds, steps=2, **kw)


def test_polish_refines_a_flat_gradient_knob():
    # x has no gradient (a staircase); the pattern search still finds its best step
    def f(p):
        stair = jnp.floor(jnp.log2(p["x"]))
        return (stair - 5.0) ** 2 + (jnp.log(p["y"] / 3.0)) ** 2

    plain = jm.codesign(f, {"x": 2.0, "y": 1.0}, {"x": (1.0, 1e3), "y": (0.1, 100.0)},
                        steps=50)
    polished = jm.codesign(f, {"x": 2.0, "y": 1.0}, {"x": (1.0, 1e3), "y": (0.1, 100.0)},
                           steps=50, options=jm.CodesignOptions(polish=60))
    assert plain.params["x"] == pytest.approx(2.0)       # gradient 0: x never moves
    assert 32.0 <= polished.params["x"] < 64.0
    assert polished.value < plain.value
    assert polished.n_evals <= plain.n_evals + 60
