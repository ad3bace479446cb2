"""``numerics.min_of`` / ``max_of``: the minimum (maximum) over an axis of candidates with
``jnp.min``'s (``jnp.max``'s) value and the winner's derivative, no count and no division; and
that no other reduction over candidates remains in the package."""

import ast
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmodel import numerics as nm

_PKG = pathlib.Path(nm.__file__).resolve().parent


def _cands(dtype):
    rng = np.random.default_rng(7)
    v = rng.uniform(1.0, 2.0, size=(4, 5)).astype(dtype)
    v[1, 2] = np.inf
    v[2, :] = np.inf                       # a row with no finite candidate
    v[3, 1] = v[3, 4] = v[3].min() - 0.5   # a tie (argmin: the first)
    return jnp.asarray(v)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float64", marks=pytest.mark.float64)])
def test_value_is_jnp_min_and_max_bit_for_bit(dtype):
    v = _cands(dtype)
    for axis in (0, 1, -1, None):
        np.testing.assert_array_equal(nm.min_of(v, axis), jnp.min(v, axis=axis))
        np.testing.assert_array_equal(nm.max_of(v, axis), jnp.max(v, axis=axis))
        assert nm.min_of(v, axis).dtype == v.dtype
    # compiled too (the value comes from the same reduction)
    both = jax.jit(lambda x: (nm.min_of(x, 1), nm.max_of(x, 0), jnp.min(x, 1), jnp.max(x, 0)))
    lo, hi, lo_ref, hi_ref = both(v)
    np.testing.assert_array_equal(lo, lo_ref)
    np.testing.assert_array_equal(hi, hi_ref)


@pytest.mark.parametrize("dtype,h,tol", [
    ("float32", 1e-2, 1e-3), pytest.param("float64", 1e-6, 1e-8, marks=pytest.mark.float64)])
def test_gradient_is_the_winners_and_matches_finite_differences(dtype, h, tol):
    """f(x) = min_j (x·a_j + b_j) over 3 affine candidates: where one wins strictly,
    df/dx = a of the winner (central differences agree, reverse and forward mode); the same
    for the maximum."""
    a = jnp.asarray([2.0, -1.0, 0.5], dtype=dtype)
    b = jnp.asarray([0.0, 3.0, 1.0], dtype=dtype)
    x0 = jnp.asarray([0.2, 2.5, 0.8], dtype=dtype)
    for fn, win in ((nm.min_of, [0, 1, 2]), (nm.max_of, [1, 0, 1])):
        f = lambda x: fn(x * a + b)  # noqa: E731

        @jax.jit
        def derivs(x):
            return (jax.vmap(jax.grad(f))(x),
                    jax.vmap(lambda y: jax.jvp(f, (y,), (jnp.ones_like(y),))[1])(x),
                    (jax.vmap(f)(x + h) - jax.vmap(f)(x - h)) / (2 * h))

        g, t, fd = derivs(x0)
        np.testing.assert_array_equal(g, a[np.asarray(win)])
        np.testing.assert_array_equal(t, a[np.asarray(win)])
        np.testing.assert_allclose(g, fd, atol=tol)


def test_gradient_goes_to_one_entry_and_is_finite_everywhere():
    v = _cands("float32")
    g, gm = jax.jit(lambda x: (
        jax.grad(lambda y: jnp.sum(jnp.where(jnp.isfinite(nm.min_of(y, 1)),
                                             nm.min_of(y, 1), 0.0)))(x),
        jax.grad(lambda y: nm.max_of(jnp.where(jnp.isfinite(y), y, 0.0), None))(x)))(v)
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(np.asarray(g).sum(axis=1), [1.0, 1.0, 0.0, 1.0])
    assert float(g[3, 1]) == 1.0 and float(g[3, 4]) == 0.0   # the first of tied entries
    assert np.all(np.isfinite(gm)) and float(np.asarray(gm).sum()) == 1.0


def test_vmap_equals_loop():
    v = _cands("float32")
    f = jax.jit(jax.value_and_grad(
        lambda x: nm.min_of(jnp.where(jnp.isfinite(x), x * x, 9.0))))
    val, grad = jax.jit(jax.vmap(f))(v)
    for i in range(v.shape[0]):
        vi, gi = f(v[i])
        assert float(val[i]) == float(vi)
        np.testing.assert_array_equal(grad[i], gi)


def test_no_division_in_the_derivative():
    """``jnp.min``'s rule divides by the count of entries equal to the minimum (0/0 = NaN
    where a compiled graph recomputes them with other rounding); ``min_of``'s gathers."""
    v = jnp.asarray([3.0, 1.0, 2.0])

    def prims(fn):
        return set(re.findall(r"\b[a-z_]+\b", str(jax.make_jaxpr(jax.grad(fn))(v))))

    assert "div" in prims(lambda x: jnp.min(x))      # the rule this replaces
    for fn in (nm.min_of, nm.max_of):
        assert "div" not in prims(lambda x: fn(x))
        fwd = jax.make_jaxpr(lambda x, t: jax.jvp(fn, (x,), (t,)))(v, v)
        assert "div" not in str(fwd)


#: ``jnp``-level reductions that choose an entry (their derivative rule divides by a count).
_CHOOSERS = {"min", "max", "amin", "amax", "nanmin", "nanmax"}


def test_no_other_reduction_over_candidates_in_the_package():
    """Every ``jnp.min``/``jnp.max``/``jnp.amin``/... of the package goes through
    ``min_of``/``max_of`` (numpy's, on concrete values, are fine; array methods ``x.min()``
    are not seen here: the package writes ``jnp.min`` for traced values)."""
    found = []
    for path in sorted(_PKG.rglob("*.py")):
        if path.name == "numerics.py":
            continue
        text = path.read_text()
        if not re.search(r"jnp\.(nan|a)?m(in|ax)\(", text):
            continue
        tree = ast.parse(text, str(path))
        concrete = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name) and n.func.id in ("float", "int", "bool")
                    for a in n.args}   # float(jnp.min(...)): a concrete value, no derivative
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            f = node.func
            if f.attr not in _CHOOSERS:
                continue
            base = f.value
            if isinstance(base, ast.Name) and base.id == "jnp" and id(node) not in concrete:
                found.append(f"{path.relative_to(_PKG)}:{node.lineno}")
    assert not found, f"reductions over candidates outside numerics.min_of/max_of: {found}"



@pytest.mark.slow
@pytest.mark.float64
def test_layer_gradient_takes_no_count_dividing_rule():
    """d(decode layer total)/d(mem_bw) on the static-shape path (the library GEMM's minimum
    over CTA tiles: a NaN under the suite's XLA options through ``jnp.min``'s rule) and
    through ``jm.inference``: no ``reduce_min``/``reduce_max`` derivative rule of lax is
    traced (their rule divides by the count of entries equal to the extremum)."""
    import dataclasses

    from jax._src.interpreters import ad
    from jax._src.lax import lax as _lax

    import hw_db
    import jaxmodel as jm
    from jaxmodel.workload import layer as L

    used = []
    saved = {p: ad.primitive_jvps[p] for p in (_lax.reduce_min_p, _lax.reduce_max_p)}

    def spy(p):
        def rule(*args, **kw):
            used.append(p.name)
            return saved[p](*args, **kw)
        return rule

    system = hw_db.system("hgx_a100_4gpu")
    model, par = hw_db.model("gpt3-175b"), jm.Parallelism(tp=4)

    def total(bw):
        s = dataclasses.replace(system, device=dataclasses.replace(system.device, mem_bw=bw))
        prec, variant = L._prec.resolve(None, None), L.variant_of(model, par, s)
        work = L.Work(8.0, 1.0, "decode", 3072.0)
        shapes = L.static_gemm_shapes(s, model, par, work, variant, prec, None)
        return L._layer_breakdown(s, model, par, work,
                                  L.LayerOptions(None, prec, variant, None, shapes))["total"]

    try:
        for p in saved:
            ad.primitive_jvps[p] = spy(p)
        jax.make_jaxpr(jax.grad(total))(2.0e12)
        jax.make_jaxpr(jax.grad(lambda bw: jm.inference(dataclasses.replace(
            system, device=dataclasses.replace(system.device, mem_bw=bw)), model, par,
            8, 512, 16).total_s))(2.0e12)
    finally:
        ad.primitive_jvps.update(saved)
    assert used == []
