"""numerics helpers and the batching edge: hand values, NaN-free gradients, vmap vs loop."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
from jaxmodel import numerics as nm
from jaxmodel.batching import batched, batch_shape


def test_safe_div_and_grad_are_finite():
    assert float(nm.safe_div(6.0, 3.0)) == 2.0
    assert float(nm.safe_div(6.0, 0.0, fill=jnp.inf)) == jnp.inf
    g = jax.grad(lambda b: nm.safe_div(1.0, b, fill=0.0))(0.0)
    assert jnp.isfinite(g)


def test_masked_min_and_soft_min():
    v = jnp.array([3.0, 1.0, 2.0])
    assert float(nm.masked_min(v, jnp.array([True, False, True]))) == 2.0
    assert float(nm.masked_min(v, jnp.array([False, False, False]))) == jnp.inf
    s = nm.soft_min(v, jnp.array([True, True, True]), 1e-3)
    assert float(s) == pytest.approx(1.0, abs=1e-2)
    s_none = nm.soft_min(v, jnp.array([False, False, False]), 0.1)
    assert float(s_none) == jnp.inf
    g = jax.grad(lambda x: nm.soft_min(x, jnp.array([True, False, True]), 0.5))(v)
    assert bool(jnp.all(jnp.isfinite(g))) and float(g[1]) == 0.0


def test_smooth_ceil_div_value_and_gradient():
    assert float(nm.smooth_ceil_div(7.0, 2.0)) == 4.0
    assert float(jax.grad(lambda a: nm.smooth_ceil_div(a, 2.0))(7.0)) == pytest.approx(0.5)


def test_first_reason_picks_first_failure():
    ok, why = nm.first_reason([(jnp.array([True, False, False]), "out_of_memory"),
                               (jnp.array([True, True, False]), "heads_not_divisible")])
    assert ok.tolist() == [True, False, False]
    assert [nm.reason_name(c) for c in why] == ["ok", "out_of_memory", "out_of_memory"]
    ok, why = nm.first_reason([(jnp.array(True), "out_of_memory"),
                               (jnp.array(False), "heads_not_divisible")])
    assert nm.reason_name(why) == "heads_not_divisible"


def test_first_reason_matches_the_check_by_check_rule_for_mixed_shapes():
    rng = np.random.default_rng(3)
    names = ["out_of_memory", "heads_not_divisible", "topology_mismatch", "invalid_workload"]
    for _ in range(5):
        oks = [rng.random(4) > 0.3, bool(rng.random() > 0.2), rng.random(4) > 0.3,
               rng.random(4) > 0.2]
        ok, why = nm.first_reason(list(zip(oks, names)))
        for i in range(4):
            row = [bool(np.broadcast_to(o, (4,))[i]) for o in oks]
            bad = [n for r, n in zip(row, names) if not r]
            assert bool(ok[i]) == (not bad)
            assert nm.reason_name(why[i]) == (bad[0] if bad else "ok")
    assert why.dtype == jnp.int32 and ok.dtype == jnp.bool_
    ok, why = nm.first_reason([])
    assert bool(ok) and int(why) == 0


def test_divides():
    assert nm.divides(jnp.array([2.0, 3.0, 0.0]), jnp.array([8.0, 8.0, 8.0])).tolist() == [
        True, False, False]


@batched
def _toy(dev, m, mode="sum"):
    cand = jnp.array([1.0, 2.0, 4.0])
    t = m / (dev.mem_bw * cand) + cand / dev.freq_hz
    return jnp.min(t) if mode == "sum" else jnp.max(t)


def test_batched_vmap_matches_loop_and_jit_matches_eager():
    dev = hw_db.device("a100_80gb")
    bws = np.array([1e12, 2e12, 3e12])
    batch = dataclasses.replace(dev, mem_bw=jnp.asarray(bws))
    got = _toy(batch, 1e9)
    loop = [_toy(dataclasses.replace(dev, mem_bw=float(b)), 1e9) for b in bws]
    np.testing.assert_allclose(got, loop, rtol=1e-12)
    eager = _toy.single(dataclasses.replace(dev, mem_bw=2e12), 1e9)
    np.testing.assert_allclose(got[1], eager, rtol=1e-12)
    assert _toy(batch, 1e9, mode="max").shape == (3,)


def test_batched_broadcasts_and_chunks():
    dev = hw_db.device("a100_80gb")
    batch = dataclasses.replace(dev, mem_bw=jnp.linspace(1e12, 2e12, 5000))
    assert batch_shape(batch) == (5000,)
    out = _toy(batch, jnp.full((5000,), 1e9))
    ref = _toy(dataclasses.replace(dev, mem_bw=jnp.linspace(1e12, 2e12, 5000)[4321]), 1e9)
    assert out.shape == (5000,) and float(out[4321]) == pytest.approx(float(ref))
    grid = _toy(dataclasses.replace(dev, mem_bw=jnp.array([[1e12], [2e12]])),
                jnp.array([1e8, 1e9, 1e10]))
    assert grid.shape == (2, 3)


def test_batched_grad():
    dev = hw_db.device("a100_80gb")
    g = jax.grad(lambda bw: _toy(dataclasses.replace(dev, mem_bw=bw), 1e9))(2e12)
    h = 1e6
    fd = (_toy(dataclasses.replace(dev, mem_bw=2e12 + h), 1e9)
          - _toy(dataclasses.replace(dev, mem_bw=2e12 - h), 1e9)) / (2 * h)
    assert float(g) == pytest.approx(float(fd), rel=1e-5)


def test_chunked_path_pads_to_whole_chunks_and_matches_vmap():
    from jaxmodel.batching import call_batched, pad_to_multiple
    padded = pad_to_multiple([jnp.arange(7.0), jnp.ones((7, 2))], 3)
    assert padded[0].shape == (9,) and padded[1].shape == (9, 2)
    np.testing.assert_array_equal(padded[0][7:], [6.0, 6.0])
    dev = hw_db.device("a100_80gb")
    bws = jnp.linspace(1e12, 2e12, 7)
    batch = dataclasses.replace(dev, mem_bw=bws)
    whole = _toy(batch, 1e9)                           # 7 <= chunk: one vmap
    chunked = call_batched(_toy.single, batch, 1e9, chunk=3)   # 3 chunks, last one padded
    assert chunked.shape == (7,)
    np.testing.assert_allclose(chunked, whole, rtol=1e-12)


# --- the one batching mechanism: map_points, map_blocks, dedup_map, sharding, progress ------

def _point(x):
    """A single-point function with a candidate axis and a masked min (as the tile search)."""
    cand = jnp.array([1.0, 2.0, 3.0, 5.0])
    t = x["a"] / cand + cand * x["b"]
    return {"t": jnp.min(jnp.where(cand <= x["b"] * 10.0, t, jnp.inf)), "s": x["a"] * 2.0}


def _rows(n):
    rng = np.random.default_rng(0)
    return {"a": jnp.asarray(rng.uniform(1, 10, n)), "b": jnp.asarray(rng.uniform(0.1, 1, n))}


@pytest.mark.parametrize("n,chunk", [(1, 4), (7, 3), (12, 4), (13, 4), (100, 128)])
def test_map_points_chunked_equals_unchunked_equals_loop(n, chunk):
    from jaxmodel.batching import map_points
    xs = _rows(n)
    chunked = jax.jit(lambda x: map_points(_point, x, chunk=chunk))(xs)
    whole = jax.jit(jax.vmap(_point))(xs)
    loop = [jax.jit(_point)({k: v[i] for k, v in xs.items()}) for i in range(n)]
    # equal up to the last bit or two: XLA may vectorise a chunk of 3 and one of 7 rows
    # differently (fused multiply-adds), the formulas are the same
    for key in ("t", "s"):
        assert chunked[key].shape == (n,)
        np.testing.assert_allclose(chunked[key], whole[key], rtol=1e-15, atol=0)
        np.testing.assert_allclose(chunked[key], [r[key] for r in loop], rtol=1e-15, atol=0)


def test_map_points_outputs_packed_by_dtype_come_back_as_returned():
    """map_points writes a point's outputs as one array per dtype (numerics.packed_by_dtype):
    the pytree, shapes, dtypes, weak types and values are those of the plain vmap."""
    from jaxmodel.batching import map_points

    def point(x):
        return {"t": _point(x)["t"], "ok": x["a"] > 5.0, "code": (x["a"] > 3.0).astype(jnp.int32),
                "v": jnp.stack([x["a"], x["b"]]), "weak": 2.0 * x["b"].astype(jnp.int32),
                "python": 0.0}                      # a Python scalar leaf, as vmap allows
    xs = _rows(13)
    want = jax.jit(jax.vmap(point))(xs)
    for chunk in (4, 64):                           # lax.map and plain vmap paths
        got = jax.jit(lambda x: map_points(point, x, chunk=chunk))(xs)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            assert (g.shape, g.dtype, g.weak_type) == (w.shape, w.dtype, w.weak_type)
            np.testing.assert_array_equal(g, w)


def test_map_points_empty_batch():
    from jaxmodel.batching import map_points
    out = jax.jit(lambda x: map_points(_point, x, chunk=4))(_rows(0))
    assert out["t"].shape == (0,)


def test_pad_to_multiple_repeats_last_row_exactly():
    from jaxmodel.batching import pad_to_multiple
    x = np.arange(10.0).reshape(5, 2)
    p = pad_to_multiple({"x": x, "y": jnp.arange(5.0)}, 4)
    assert isinstance(p["x"], np.ndarray) and p["x"].shape == (8, 2)
    np.testing.assert_array_equal(p["x"][:5], x)
    np.testing.assert_array_equal(p["x"][5:], np.repeat(x[-1:], 3, axis=0))
    np.testing.assert_array_equal(p["y"], [0, 1, 2, 3, 4, 4, 4, 4])
    assert pad_to_multiple({"x": x}, 5)["x"] is x        # already whole: untouched


def test_map_blocks_fixed_width_compiles_once():
    from jaxmodel.batching import map_blocks
    traces = []

    @jax.jit
    def batch_fn(x):
        traces.append(x["a"].shape)
        return jax.vmap(_point)(x)

    for n in (23, 5, 8):
        out = map_blocks(batch_fn, _rows(n), width=8, progress=False)
        ref = jax.jit(jax.vmap(_point))(_rows(n))
        assert out["t"].shape == (n,) and isinstance(out["t"], np.ndarray)
        np.testing.assert_allclose(out["t"], ref["t"], rtol=1e-15, atol=0)
    assert traces == [(8,)]                               # one shape, one compilation


def test_map_blocks_trims_row_multiples():
    from jaxmodel.batching import map_blocks
    out = map_blocks(lambda s: jnp.arange(6) + 6 * s[0], np.arange(3), width=1,
                     progress=False)
    np.testing.assert_array_equal(out, np.arange(18))


def test_dedup_map_equals_evaluating_every_row():
    from jaxmodel.batching import call_batched, dedup_map
    dev = hw_db.device("a100_80gb")
    bws = jnp.asarray([1e12, 2e12, 1e12, 3e12, 2e12, 1e12])
    ms = jnp.asarray([[1e9], [1e8]])                       # broadcasts to (2, 6)
    batch = dataclasses.replace(dev, mem_bw=bws)
    calls = []

    def counted(d, m, mode="sum"):
        calls.append(jnp.shape(d.mem_bw))
        return {"t": _toy.single(d, m, mode=mode), "pair": jnp.stack([d.mem_bw, m])}

    got = dedup_map(counted, (batch, ms), mode="max")
    full = call_batched(counted, batch, ms, mode="max")
    assert calls[0] == ()                                  # traced per point
    assert got["t"].shape == (2, 6) and got["pair"].shape == (2, 6, 2)
    # call_batched evaluates an outer-product batch as an inner vmap per point: XLA may
    # fuse the arithmetic differently, so the two agree to rounding, not bit for bit
    np.testing.assert_allclose(got["t"], full["t"], rtol=1e-12)
    np.testing.assert_array_equal(got["pair"], full["pair"])
    # constant inputs: one evaluation, broadcast back
    one = dedup_map(counted, (dev, 1e9), shape=(3,))
    np.testing.assert_array_equal(one["t"], np.full(3, float(_toy(dev, 1e9, mode="sum"))))


def test_dedup_map_reduces_to_unique_rows():
    from jaxmodel import batching
    seen = []
    orig = batching.call_batched

    def spy(fn, *args, **kwargs):
        seen.append(batch_shape(*args))
        return orig(fn, *args, **kwargs)

    batching.call_batched = spy
    try:
        batching.dedup_map(lambda a, b: a * b, (jnp.asarray([1., 2., 1., 2.]),
                                                jnp.asarray([5., 5., 5., 6.])))
    finally:
        batching.call_batched = orig
    assert seen == [(3,)]                                  # rows (1,5), (2,5), (2,6)


def test_call_batched_many_equals_the_calls_one_by_one():
    """Graphs compiled in the background while the next traces: the same numbers, and no
    compilation left pending once the calls return."""
    from jaxmodel import batching
    dev = hw_db.device("a100_80gb")
    ms = jnp.asarray([1e8, 1e9, 3e9])

    def part_a(d, m):
        return {"t": _toy.single(d, m, mode="sum")}

    def part_b(d, m):
        return {"u": _toy.single(d, 2.0 * m, mode="max")}

    a, b = batching.call_batched_many([(part_a, (dev, ms), {}), (part_b, (dev, ms), {})])
    assert not batching._COMPILING
    np.testing.assert_array_equal(a["t"], batching.call_batched(part_a, dev, ms)["t"])
    np.testing.assert_array_equal(b["u"], batching.call_batched(part_b, dev, ms)["u"])
    def either(d, m, which="a"):
        return part_a(d, m) if which == "a" else part_b(d, m)

    both = batching.dedup_map(either, (dev, jnp.concatenate([ms, ms])),
                              parts=({"which": "a"}, {"which": "b"}))
    np.testing.assert_array_equal(both[1]["u"], np.tile(np.asarray(b["u"]), 2))


@pytest.mark.slow   # two subprocesses; the default suite shards in tests/test_export_cache.py
def test_multi_device_sharding_matches_one_device():
    """Four host devices: map_points shards over them (shard_map in the jaxpr), and
    call_batched and sweep give the same numbers as a single device."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = r'''
import dataclasses, json
import jax, jax.numpy as jnp, numpy as np
import hw_db, jaxmodel as jm
from jaxmodel.batching import call_batched, map_points
assert jax.device_count() == 4, jax.devices()
f = lambda x: jnp.sin(x) * x
jaxpr = str(jax.make_jaxpr(lambda x: map_points(f, x, chunk=4))(jnp.arange(10.0)))
dev = hw_db.device("a100_80gb")
batch = dataclasses.replace(dev, mem_bw=jnp.linspace(1e12, 3e12, 37))
t = call_batched(jm.ops.gemm.gemm_latency.single, batch, 512.0, 1024.0, 2048.0, chunk=8)
df = jm.sweep(jm.gemm_latency, dev, 1024, 1024, 1024, chunk=4, progress=False,
              grid={"dev.mem_bw": [1e12, 2e12, 3e12], "dev.core_count": [54, 108, 132]})
print(json.dumps({"shard": "shard_map" in jaxpr, "t": np.asarray(t).tolist(),
                  "sweep": df["gemm_latency"].tolist(), "n_devices": df.attrs["n_devices"]}))
'''
    root = Path(__file__).resolve().parents[1]

    def run(n_dev):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n_dev}",
                   JAX_PLATFORMS="cpu", JAXMODEL_NO_CACHE="1", PYTHONPATH=str(root))
        r = subprocess.run([sys.executable, "-c", code.replace("== 4", f"== {n_dev}")],
                           cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        import json
        return json.loads(r.stdout.strip().splitlines()[-1])

    four, one = run(4), run(1)
    assert four["shard"] and not one["shard"]
    assert four["n_devices"] == 4 and one["n_devices"] == 1
    np.testing.assert_array_equal(four["t"], one["t"])
    np.testing.assert_array_equal(four["sweep"], one["sweep"])


def test_progress_is_quiet_on_request(capsys, monkeypatch):
    from jaxmodel import process
    process.set_quiet(None)
    monkeypatch.delenv("JAXMODEL_QUIET", raising=False)
    with process.stage("toy stage", show_after=0.0):
        pass
    with process.progress_bar(3, "toy loop", show_after=0.0) as bar:
        for _ in range(3):
            bar.update(1)
    err = capsys.readouterr().err
    assert "[jaxmodel] toy stage:" in err and "compile" in err and "toy loop" in err
    monkeypatch.setenv("JAXMODEL_QUIET", "1")
    with process.stage("toy stage", show_after=0.0):
        pass
    with process.progress_bar(3, "toy loop", show_after=0.0) as bar:
        bar.update(3)
    process.set_quiet(True)
    monkeypatch.delenv("JAXMODEL_QUIET")
    with process.stage("toy stage", show_after=0.0):
        pass
    process.set_quiet(None)
    assert capsys.readouterr().err == ""


def test_stage_separates_compile_time():
    from jaxmodel import process
    process.compile_seconds()

    @jax.jit
    def f(x):
        return jnp.sum(jnp.sin(x) ** 2)

    with process.stage("compile", show_after=1e9) as info:
        f(jnp.arange(17.0)).block_until_ready()
    assert 0.0 < info["compile_s"] <= info["wall_s"]
    y = (jnp.arange(17.0) + 1.0).block_until_ready()
    with process.stage("cached", show_after=1e9) as info:
        f(y).block_until_ready()
    assert info["compile_s"] == 0.0


def test_compilation_cache_configuration(tmp_path):
    """import jaxmodel turns JAX's persistent cache on in JAXMODEL_CACHE_DIR (per host type),
    leaves a user's own JAX cache setting alone, and JAXMODEL_NO_CACHE=1 turns it off."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    code = ("import jax, jaxmodel; print(jax.config.jax_compilation_cache_dir, "
            "jax.config.jax_persistent_cache_min_compile_time_secs)")

    def run(**env):
        e = {k: v for k, v in os.environ.items()
             if k not in ("JAXMODEL_CACHE_DIR", "JAXMODEL_NO_CACHE", "JAX_COMPILATION_CACHE_DIR")}
        e.update(env, PYTHONPATH=str(root))
        r = subprocess.run([sys.executable, "-c", code], cwd=root, env=e, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.split()

    path, min_s = run(JAXMODEL_CACHE_DIR=str(tmp_path / "c"))
    assert Path(path).parent == tmp_path / "c" and Path(path).name.startswith("host-")
    assert Path(path).is_dir() and float(min_s) > 0
    assert run(JAXMODEL_CACHE_DIR=str(tmp_path / "c"), JAXMODEL_NO_CACHE="1")[0] == "None"
    assert run(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"))[0] == str(tmp_path / "mine")


@pytest.mark.parametrize("x64", [False, True])
def test_ceil_div_exact_at_integers(x64):
    """ceil(k·b / b) = k for every b in 1..1999 and k in 1..7, in float32 and float64, jitted
    with a broadcast scalar divisor (which XLA compiles as a multiplication by 1/b)."""
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", x64)
    try:
        b = jnp.arange(1.0, 2000.0)
        for k in range(1, 8):
            got = jax.jit(nm.ceil_div)(k * b, b)
            assert bool(jnp.all(got == k)), (k, int(jnp.sum(got != k)))
            # one more element needs one more tile
            assert bool(jnp.all(jax.jit(nm.ceil_div)(k * b + 1.0, b) == k + 1))
        cores = jnp.asarray(104.0)
        tiles = jnp.array([1456.0, 728.0, 364.0, 105.0, 1.0, 0.0])
        got = jax.jit(lambda t, c: nm.ceil_div(t, c))(tiles, cores)
        assert got.tolist() == [14.0, 7.0, 4.0, 2.0, 1.0, 0.0]
        assert float(nm.ceil_div(5.0, 0.0)) == 0.0 and float(nm.ceil_div(5.0, -2.0)) == 0.0
        assert float(jax.grad(nm.ceil_div)(7.0, 2.0)) == 0.0
    finally:
        jax.config.update("jax_enable_x64", prev)


def test_finalize_no_nan_no_silent_inf():
    value = jnp.array([1.0, jnp.inf, jnp.nan, 2.0, jnp.nan])
    feasible = jnp.array([True, True, True, False, False])
    reason = jnp.array([0, 0, 0, nm.reason_code("out_of_memory"),
                        nm.reason_code("invalid_device")], dtype=jnp.int32)
    v, ok, why = nm.finalize(value, feasible, reason)
    assert v.tolist() == [1.0, jnp.inf, jnp.inf, jnp.inf, jnp.inf]
    assert ok.tolist() == [True, False, False, False, False]
    assert [nm.reason_name(c) for c in why] == ["ok", "out_of_range", "out_of_range",
                                                "out_of_memory", "invalid_device"]
    # reason codes are append-only: the established ones keep their numbers
    assert nm.REASONS[:3] == ("ok", "invalid_device", "buffer_too_small")
    assert nm.reason_code("invalid_workload") == 14 and nm.reason_code("out_of_range") == 16


def test_operators_float32_match_float64():
    """The operator models agree between float32 and float64 to 1e-5 on 100 random shapes
    on each of A100, MI210 and TPUv3 (tile counts are exact in both precisions)."""
    import jaxmodel as jm
    rng = np.random.default_rng(0)
    rows = np.round(2 ** rng.uniform(0, 16, 300))
    cols = np.round(2 ** rng.uniform(0, 16, 300))
    ks = np.round(2 ** rng.uniform(0, 14, 300))
    names = ("a100_80gb", "mi210", "tpuv3")
    devs = [hw_db.device(n) for n in names]
    # one batched device (100 shapes each): one compilation per operator and precision
    fields = {f.name: np.repeat([float(getattr(d, f.name)) for d in devs], 100)
              for f in dataclasses.fields(devs[0]) if f.name != "name"}
    prev = jax.config.jax_enable_x64
    out = {}
    try:
        for x64 in (False, True):
            jax.config.update("jax_enable_x64", x64)
            dev = dataclasses.replace(devs[0], **{k: jnp.asarray(v) for k, v in fields.items()})
            out[x64] = [np.asarray(f, dtype=np.float64) for f in (
                jm.softmax_latency(dev, rows, cols), jm.layernorm_latency(dev, rows, cols),
                jm.gelu_latency(dev, rows * cols), jm.gemm_latency(dev, rows, cols, ks))]
    finally:
        jax.config.update("jax_enable_x64", prev)
    for a, b in zip(out[False], out[True]):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_weighted_zero_times_inf_and_finite_gradients():
    w = jnp.array([0.0, 2.0, 2.0, -1.0])
    t = jnp.array([jnp.inf, jnp.inf, 3.0, jnp.inf])
    assert nm.weighted(w, t).tolist() == [0.0, jnp.inf, 6.0, 0.0]
    gw, gt = jax.vmap(jax.grad(nm.weighted, argnums=(0, 1)))(w, t)
    assert bool(jnp.all(jnp.isfinite(gw))) and bool(jnp.all(jnp.isfinite(gt)))
    assert gw.tolist() == [0.0, 0.0, 3.0, 0.0] and gt.tolist() == [0.0, 0.0, 2.0, 0.0]


def test_split_and_join_leaves_round_trip():
    from jaxmodel.batching import join_leaves, split_leaves
    dev = hw_db.device("a100_80gb")
    args, kwargs = (dev, 3, "prefill"), {"flag": True, "x": np.arange(3.0)}
    dynamic, treedef, static = split_leaves(args, kwargs)
    hash((treedef, static))                     # keys a compilation
    assert "prefill" in static and True in static
    assert all(np.asarray(x).dtype == jnp.result_type(float) for x in dynamic)
    a2, k2 = join_leaves(dynamic, treedef, static)
    assert a2[1:] == (3.0, "prefill") and k2["flag"] is True
    np.testing.assert_array_equal(k2["x"], np.arange(3.0))
    assert float(a2[0].freq_hz) == float(dev.freq_hz)
    # shapes pass through (ahead-of-time compilation), re-typed to the float dtype
    s = jax.ShapeDtypeStruct((4,), np.int32)
    (d,), _, _ = split_leaves((s,))
    assert d.shape == (4,) and d.dtype == jnp.result_type(float)
    (d,), _, _ = split_leaves((s,), cast=False)
    assert d is s


def test_inlined_jits_same_graph_values_and_chunked_map_stays_a_loop():
    """jit_leaves(inline=True): no pjit equations left by the jitted jnp helpers, the same
    numbers as the plain trace (nested vmaps), and map_points' chunked lax.map stays one
    scan (inlined_jits must not unroll it) with its body inlined."""
    from jaxmodel.batching import inlined_jits, jit_leaves, map_points

    def body(x):
        def inner(y):
            return jnp.where(y > 2.0, jnp.clip(y, 0.0, 5.0) * x["a"], jnp.maximum(y, x["b"]))
        return {"t": jnp.sum(jax.vmap(inner)(jnp.arange(4.0) + x["b"]))}

    xs = _rows(13)
    for chunk in (4, 64):
        def outer(x, chunk=chunk):
            return map_points(body, x, chunk=chunk)
        plain = jit_leaves(outer)(xs)
        inline = jit_leaves(outer, inline=True)(xs)
        np.testing.assert_array_equal(np.asarray(inline["t"]), np.asarray(plain["t"]))

        def traced(x):
            with inlined_jits():
                return outer(x)
        jaxpr = str(jax.make_jaxpr(traced)(xs))
        assert "pjit" not in jaxpr
        assert jaxpr.count("scan[") == (1 if chunk == 4 else 0)


def test_computed_once_and_materialized_change_no_value_nor_gradient():
    """Both only decide where XLA keeps a value: values, gradients (through the cond) and
    vmap are those of the identity; the compiled graph holds the shared chain once."""
    flags = jnp.array([True, False, True])
    assert nm.computed_once(flags).tolist() == [True, False, True]
    tree = {"a": jnp.array([0.0, -0.0, 1.5, jnp.inf]), "b": jnp.float32(2.0)}
    out = nm.materialized(tree)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(tree[k]))
    assert np.signbit(np.asarray(out["a"])[1])            # -0.0 kept
    mixed = {"flag": jnp.array([True, False]), "n": jnp.int32(3), "x": jnp.float32(1.5)}
    out = nm.materialized(mixed)                          # leaves keep their dtypes
    for k in mixed:
        assert out[k].dtype == mixed[k].dtype
        np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(mixed[k]))

    def chain(x):
        for _ in range(30):
            x = jnp.where(x > 1.0, 0.5 * x + 1.0, 1.5 * x)
        return x

    def f(x, once):
        y = nm.materialized(chain(x)) if once else chain(x)
        return y * 2.0 + (y - 1.0) * 3.0 + jnp.where(y > 0, y, 1.0)
    g = jax.grad(lambda x: f(x, True))(1.25)
    assert g == pytest.approx(float(jax.grad(lambda x: f(x, False))(1.25)))
    xs = jnp.linspace(0.5, 3.0, 5)
    np.testing.assert_array_equal(jax.vmap(lambda x: f(x, True))(xs),
                                  jax.vmap(lambda x: f(x, False))(xs))

    def outputs(x, once):                 # several results reading the same chain
        y = nm.materialized(chain(x)) if once else chain(x)
        return y * 2.0, y + 1.0, jnp.where(y > 0, y, 3.0), y * y, y - x
    size = [len(jax.jit(lambda x, o=o: outputs(x, o)).lower(1.25).compile().as_text())
            for o in (True, False)]
    assert size[0] < 0.5 * size[1]


def test_small_device_arrays_are_retyped_on_the_host_large_ones_on_the_device():
    from jaxmodel import jitting
    small = [jnp.array([True, False]), jnp.array(2**24 + 1, dtype=jnp.int32)]
    for x in small:
        got = jitting._as_float(x, np.float32)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, np.asarray(x.astype(jnp.float32)))
    big = jnp.arange(jitting.HOST_CAST_MAX_SIZE + 1, dtype=jnp.int32)
    got = jitting._as_float(big, np.float32)
    assert isinstance(got, jax.Array) and got.dtype == jnp.float32
    same = jnp.ones(3, dtype=jnp.float32)
    assert jitting._as_float(same, np.float32) is same
