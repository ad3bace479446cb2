"""jm.sweep: grid indexing, batched arguments, bad specs, sharding, export."""

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import hw_db
import jaxmodel as jm
from jaxmodel.batching import batched
from jaxmodel.search.grid import Grid, expand_values

ROOT = Path(__file__).resolve().parents[2]


@batched
def roofline(dev, m, n, k, par):
    """Toy single-config formula: GEMM roofline time per TP shard, s."""
    flops = 2.0 * m * n * k / par.tp
    nbytes = 2.0 * (m * k + k * n / par.tp + m * n / par.tp)
    t = jnp.maximum(flops / dev.peak_matrix_flops, nbytes / dev.mem_bw)
    return {"time_s": t, "bound": jnp.where(flops / dev.peak_matrix_flops > nbytes / dev.mem_bw,
                                            1, 0), "pair": (t * 2.0, jnp.stack([t, -t]))}


@pytest.fixture(scope="module")
def dev():
    return hw_db.device("a100_80gb")


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
@settings(max_examples=30, deadline=None)
def test_grid_indexing_matches_itertools_product(sizes):
    spec = {f"k{i}": [float(10 * i + j) for j in range(n)] for i, n in enumerate(sizes)}
    g = Grid.from_spec(spec)
    got = g.values_at(np.arange(g.size))
    want = list(itertools.product(*spec.values()))
    assert g.size == len(want)
    for j, key in enumerate(spec):
        assert got[key].tolist() == [w[j] for w in want]


def test_expand_values_forms():
    assert expand_values("x", {"logspace": [1, 100, 3]}).tolist() == pytest.approx([1, 10, 100])
    assert expand_values("x", {"linspace": [0, 1, 3]}).tolist() == [0, 0.5, 1]
    assert expand_values("x", {"range": [1, 7, 2]}).tolist() == [1, 3, 5]
    assert expand_values("par.schedule", ["gpipe", "interleaved"]).tolist() == [0, 2]
    assert expand_values("x", 3).tolist() == [3]


def test_sweep_matches_python_loop(dev):
    spec = {"dev.mem_bw": [1e12, 2e12, 3e12], "par.tp": [1, 2, 8], "m": [16, 4096]}
    par = jm.Parallelism()
    df = jm.sweep(roofline, dev, 1024, 12288, 12288, par, grid=spec, chunk=4, progress=False)
    assert len(df) == 18 and df.attrs["n_evaluated"] == 18
    for i, (bw, tp, m) in enumerate(itertools.product(*spec.values())):
        if i % 5:  # a Python loop over a few points (each call compiles nothing new)
            continue
        ref = roofline(dataclasses.replace(dev, mem_bw=bw), m, 12288, 12288,
                       jm.Parallelism(tp=tp))
        assert (df["dev.mem_bw"][i], df["par.tp"][i], df["m"][i]) == (bw, tp, m)
        assert df["time_s"][i] == pytest.approx(float(ref["time_s"]), rel=1e-12)
    # column-wise comparison against the batched edge on the materialised grid
    bw, tp, m = (np.array(c, dtype=float) for c in zip(*itertools.product(*spec.values())))
    ref = roofline(dataclasses.replace(dev, mem_bw=bw), m, 12288.0, 12288.0,
                   jm.Parallelism(tp=tp))
    np.testing.assert_allclose(df["time_s"], ref["time_s"], rtol=1e-12)
    np.testing.assert_array_equal(df["bound"], ref["bound"])
    np.testing.assert_allclose(df["pair.0"], 2 * ref["time_s"], rtol=1e-12)
    np.testing.assert_allclose(df["pair.1[1]"], -ref["time_s"], rtol=1e-12)


def test_sweep_batched_args_times_grid(dev):
    bws = jnp.array([1e12, 2e12])
    df = jm.sweep(roofline, dataclasses.replace(dev, mem_bw=bws), 64.0, 4096, 4096,
                  jm.Parallelism(), grid={"k": [128, 256, 512]}, progress=False)
    assert list(df["dev.mem_bw"]) == [1e12] * 3 + [2e12] * 3
    assert list(df["k"]) == [128, 256, 512] * 2
    ref = roofline(dataclasses.replace(dev, mem_bw=jnp.repeat(bws, 3)), 64.0, 4096.0,
                   jnp.tile(jnp.array([128.0, 256, 512]), 2), jm.Parallelism())
    np.testing.assert_allclose(df["time_s"], ref["time_s"], rtol=1e-12)


def test_sweep_system_device_alias_and_code_names():
    system = hw_db.system("hgx_a100_4gpu")

    def f(system, par):
        return system.device.mem_bw * system.levels[0].bw_per_device * (1 + par.schedule)

    df = jm.sweep(f, system, jm.Parallelism(), progress=False,
                  grid={"device.mem_bw": [1.0, 2.0], "system.levels[0].bw_per_device": [3.0],
                        "par.schedule": ["gpipe", "interleaved"]})
    assert df["f"].tolist() == [3.0, 9.0, 6.0, 18.0]
    assert df["par.schedule"].tolist() == ["gpipe", "interleaved"] * 2


@pytest.mark.parametrize("spec, match", [
    ({"dev.no_such_field": [1.0]}, "no_such_field"),
    ({"dev.mem_bw": []}, "dev.mem_bw"),
    ({"dev.mem_bw": ["fast"]}, "dev.mem_bw"),
    ({"dev.mem_bw": [1.0, float("nan")]}, "dev.mem_bw"),
    ({"par.schedule": ["zigzag"]}, "par.schedule"),
    ({"dev.mem_bw": {"logspace": [0, 1, 3]}}, "dev.mem_bw"),
    ({"nonexistent": [1]}, "nonexistent"),
])
def test_bad_specs_raise_naming_the_key(dev, spec, match):
    with pytest.raises(ValueError, match=match):
        jm.sweep(roofline, dev, 1.0, 1.0, 1.0, jm.Parallelism(), grid=spec, progress=False)


def test_knob_already_batched_is_rejected(dev):
    with pytest.raises(ValueError, match="dev.mem_bw"):
        jm.sweep(roofline, dataclasses.replace(dev, mem_bw=jnp.array([1e12, 2e12])), 1.0, 1.0,
                 1.0, jm.Parallelism(), grid={"dev.mem_bw": [3e12]}, progress=False)


def test_sweep_blocks_and_padding(dev):
    # 7·5·3 = 105 points in blocks of 8 (last block padded): same as one block.
    spec = {"dev.mem_bw": np.linspace(1e11, 3e12, 7), "par.tp": [1, 2, 4, 8, 16],
            "m": [1, 64, 4096]}
    a = jm.sweep(roofline, dev, 1.0, 8192, 8192, jm.Parallelism(), grid=spec, chunk=4,
                 sweep_options=jm.SweepOptions(block=8), progress=False)
    b = jm.sweep(roofline, dev, 1.0, 8192, 8192, jm.Parallelism(), grid=spec, progress=False)
    assert a.attrs["n_blocks"] == 14 and b.attrs["n_blocks"] == 1
    pd.testing.assert_frame_equal(a, b)


def test_sweep_progress_bar_and_quiet(dev, capsys, monkeypatch):
    """Several blocks: a progress bar on stderr once the loop runs longer than the threshold
    (0 s here); JAXMODEL_QUIET=1 or progress=False silence it; the numbers do not change."""
    from jaxmodel import process
    monkeypatch.setattr(process, "SHOW_AFTER_S", 0.0)
    monkeypatch.delenv("JAXMODEL_QUIET", raising=False)
    process.set_quiet(None)
    spec = {"dev.mem_bw": np.linspace(1e11, 3e12, 7), "par.tp": [1, 2, 4, 8, 16]}
    args = (roofline, dev, 64.0, 8192, 8192, jm.Parallelism())
    shown = jm.sweep(*args, grid=spec, chunk=4, sweep_options=jm.SweepOptions(block=8))
    err = capsys.readouterr().err
    assert "sweep roofline" in err and re.search(r"35(\.0)?/35(\.0)? ", err)
    monkeypatch.setenv("JAXMODEL_QUIET", "1")
    quiet = jm.sweep(*args, grid=spec, chunk=4, sweep_options=jm.SweepOptions(block=8))
    monkeypatch.delenv("JAXMODEL_QUIET")
    off = jm.sweep(*args, grid=spec, chunk=4, sweep_options=jm.SweepOptions(block=8),
                   progress=False)
    assert capsys.readouterr().err == ""
    pd.testing.assert_frame_equal(shown, quiet)
    pd.testing.assert_frame_equal(shown, off)


_SHARDED = textwrap.dedent("""
    import os, sys, jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np, hw_db, jaxmodel as jm
    sys.path.insert(0, {here!r})
    from test_sweep import roofline
    assert len(jax.devices()) == 4, jax.devices()
    spec = {{"dev.mem_bw": np.linspace(1e11, 3e12, 7), "par.tp": [1, 2, 4, 8, 16],
            "m": [1, 64, 4096]}}
    df = jm.sweep(roofline, hw_db.device("a100_80gb"), 1.0, 8192, 8192, jm.Parallelism(),
                  grid=spec, chunk=4, sweep_options=jm.SweepOptions(block=8),
                  progress=False)
    df.to_pickle(sys.argv[1])
""")


def test_sharded_over_4_cpu_devices_equals_single_device(dev, tmp_path):
    out = tmp_path / "sharded.pkl"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    script = tmp_path / "run.py"
    script.write_text(_SHARDED.format(here=str(Path(__file__).parent)))
    subprocess.run([sys.executable, str(script), str(out)], check=True, env=env, cwd=ROOT,
                   timeout=120)
    sharded = pd.read_pickle(out)
    assert sharded.attrs["n_devices"] == 4
    single = jm.sweep(roofline, dev, 1.0, 8192, 8192, jm.Parallelism(), progress=False,
                      grid={"dev.mem_bw": np.linspace(1e11, 3e12, 7),
                            "par.tp": [1, 2, 4, 8, 16], "m": [1, 64, 4096]})
    assert single.attrs["n_devices"] == 1
    pd.testing.assert_frame_equal(sharded, single)


def test_save_csv_and_parquet(tmp_path, dev):
    df = jm.sweep(roofline, dev, 1.0, 64, 64, jm.Parallelism(), grid={"m": [1, 2]},
                  progress=False)
    p = jm.save(df, tmp_path / "x.csv")
    assert pd.read_csv(p)["m"].tolist() == [1, 2]
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pyarrow"):
            jm.save(df, tmp_path / "x.parquet")
    else:
        assert len(pd.read_parquet(jm.save(df, tmp_path / "x.parquet"))) == 2
    with pytest.raises(ValueError, match="xlsx"):
        jm.save(df, tmp_path / "x.xlsx")
