"""The export cache of batched calls (jaxmodel.batching._cached_call) and the command line's
cache defaults (jaxmodel.process.configure_compilation_cache with ``cli``)."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import batching, process


@pytest.fixture
def export_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "_export_dir", tmp_path / "export")
    monkeypatch.setattr(batching, "_EXECUTABLES", {})
    return tmp_path / "export"


def _new_process(monkeypatch):
    """Forget the executables this process loaded (what a fresh process starts from)."""
    monkeypatch.setattr(batching, "_EXECUTABLES", {})


def test_cached_call_identical_and_skips_tracing(export_dir, monkeypatch):
    """A stored call is reused for other values of the same shapes without tracing the model,
    and gives the numbers of the plain path bit for bit."""
    dev = hw_db.device("a100_80gb")
    m1, m2 = jnp.array([512.0, 2048.0]), jnp.array([64.0, 8192.0])
    with monkeypatch.context() as mp:
        mp.setattr(process, "_export_dir", None)
        ref1 = np.asarray(jm.gemm_latency(dev, m1, 4096.0, 12288.0))
        ref2 = np.asarray(jm.gemm_latency(dev, m2, 4096.0, 12288.0))
    got1 = np.asarray(jm.gemm_latency(dev, m1, 4096.0, 12288.0))       # traces and stores
    stored = sorted(export_dir.glob("*.xla"))
    assert stored

    def no_trace(*a, **k):
        raise AssertionError("traced although the export cache holds this call")
    monkeypatch.setattr(batching, "_run", no_trace)
    got2 = np.asarray(jm.gemm_latency(dev, m2, 4096.0, 12288.0))       # loads from disk
    assert sorted(export_dir.glob("*.xla")) == stored
    np.testing.assert_array_equal(got1, ref1)
    np.testing.assert_array_equal(got2, ref2)


def test_stored_executable_runs_without_tracing_lowering_or_compiling(export_dir,
                                                                       monkeypatch):
    """A fresh process loads the stored executable: no tracing, no lowering, no XLA
    compilation (not even a persistent-cache lookup), and the plain path's numbers."""
    dev = hw_db.device("a100_80gb")
    m1, m2 = jnp.array([512.0, 2048.0]), jnp.array([64.0, 8192.0])
    with monkeypatch.context() as mp:
        mp.setattr(process, "_export_dir", None)
        ref2 = np.asarray(jm.gemm_latency(dev, m2, 4096.0, 12288.0))
    jm.gemm_latency(dev, m1, 4096.0, 12288.0)                          # compiles and stores
    assert list(export_dir.glob("*.xla"))
    _new_process(monkeypatch)
    events = []

    def listen(event, duration, **_):
        events.append(event)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        got2 = np.asarray(jm.gemm_latency(dev, m2, 4096.0, 12288.0))
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    compile_events = [e for e in events if e.startswith(("/jax/core/compile",
                                                         "/jax/compilation_cache"))]
    assert compile_events == []
    np.testing.assert_array_equal(got2, ref2)


def test_cached_call_rebuilds_damaged_entry(export_dir, monkeypatch):
    dev = hw_db.device("a100_80gb")
    ref = np.asarray(jm.gemm_latency(dev, jnp.array([256.0, 1024.0]), 1024.0, 1024.0))
    paths = sorted(export_dir.glob("*.xla"))
    assert paths
    for p in paths:
        p.write_bytes(b"not a pickle")
    _new_process(monkeypatch)
    got = np.asarray(jm.gemm_latency(dev, jnp.array([256.0, 1024.0]), 1024.0, 1024.0))
    np.testing.assert_array_equal(got, ref)
    assert all(p.read_bytes() != b"not a pickle" for p in paths)   # rebuilt


def test_changed_code_or_flags_recompile(export_dir, monkeypatch):
    """The key covers the package source (code_fingerprint) and XLA_FLAGS: a changed model
    or compiler setting stores new entries instead of reusing the old executable."""
    dev = hw_db.device("a100_80gb")
    jm.gemm_latency(dev, jnp.array([256.0, 1024.0]), 1024.0, 1024.0)
    first = set(export_dir.glob("*.xla"))
    _new_process(monkeypatch)
    monkeypatch.setattr(batching, "code_fingerprint", lambda: "a-changed-model")
    jm.gemm_latency(dev, jnp.array([256.0, 1024.0]), 1024.0, 1024.0)
    second = set(export_dir.glob("*.xla"))
    assert len(second) == 2 * len(first) and first < second
    _new_process(monkeypatch)
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " ")
    jm.gemm_latency(dev, jnp.array([256.0, 1024.0]), 1024.0, 1024.0)
    assert len(set(export_dir.glob("*.xla"))) == 3 * len(first)


def test_cached_call_skips_stateful_static_arguments(export_dir):
    """A closure (state the key cannot see) runs plainly and stores nothing."""
    scale = 3.0

    def f(x, g):
        return g(x)
    out = batching.call_batched(f, jnp.arange(3.0), lambda x: x * scale)
    np.testing.assert_array_equal(np.asarray(out), np.arange(3.0) * 3.0)
    assert not export_dir.exists() or not list(export_dir.glob("*.xla"))
    assert batching._static_key(lambda x: x) is None
    assert batching._static_key(jm.gemm_latency.single) is not None


def test_cli_cache_defaults(tmp_path):
    """The console script turns the compilation cache on in $XDG_CACHE_HOME (CPU included),
    stores every compilation, puts the export cache beside it and hides jaxlib's cache-hit
    ERROR lines; JAXMODEL_NO_CACHE=1 turns all of it off; library imports stay opt-in."""
    root = Path(__file__).resolve().parents[1]
    code = ("import sys; sys.argv[0] = {argv0!r}; import jaxmodel, os, jax; "
            "from jaxmodel import process; print(jax.config.jax_compilation_cache_dir, "
            "jax.config.jax_persistent_cache_min_compile_time_secs, "
            "process.export_cache_dir(), os.environ.get('TF_CPP_MIN_LOG_LEVEL'))")

    def run(argv0, **env):
        e = {k: v for k, v in os.environ.items()
             if k not in ("JAXMODEL_CACHE_DIR", "JAXMODEL_NO_CACHE", "JAX_COMPILATION_CACHE_DIR",
                          "TF_CPP_MIN_LOG_LEVEL", "XDG_CACHE_HOME")}
        e.update(env, PYTHONPATH=str(root), XDG_CACHE_HOME=str(tmp_path))
        r = subprocess.run([sys.executable, "-c", code.format(argv0=argv0)], cwd=root, env=e,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.split()

    jax_dir, min_s, exp_dir, level = run("/usr/bin/jaxmodel")
    assert Path(jax_dir).parent == tmp_path / "jaxmodel" / "jax" and float(min_s) == 0.0
    assert Path(exp_dir) == tmp_path / "jaxmodel" / "jax" / "exports" / Path(jax_dir).name
    if not process._accelerator_plugin_installed():
        assert level == "3"
    off = run("/usr/bin/jaxmodel", JAXMODEL_NO_CACHE="1")
    assert off[0] == "None" and off[2] == "None"
    if not process._accelerator_plugin_installed():
        lib = run("python")
        assert lib[0] == "None" and lib[2] == "None" and lib[3] != "3"


def test_configure_cli_after_library_import(tmp_path):
    """A script that opted in with JAXMODEL_CACHE_DIR can switch to the command line's
    defaults after ``import jaxmodel`` configured the cache (the second call is not mistaken
    for a user's own JAX setting)."""
    root = Path(__file__).resolve().parents[1]
    code = ("import jaxmodel, jax; from jaxmodel import process; "
            "p = process.configure_compilation_cache(cli=True); "
            "print(p, process.export_cache_dir(), "
            "jax.config.jax_persistent_cache_min_compile_time_secs)")
    e = {k: v for k, v in os.environ.items()
         if k not in ("JAXMODEL_NO_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    e.update(PYTHONPATH=str(root), JAXMODEL_CACHE_DIR=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=e, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    path, exe, min_s = r.stdout.split()
    assert Path(path).parent == tmp_path / "c" and float(min_s) == 0.0
    assert Path(exe) == tmp_path / "c" / "exports" / Path(path).name


def test_prefetched_executable_is_used_and_identical(export_dir, monkeypatch):
    """prefetch_executables loads stored executables in the background; the call then takes
    the prefetched one (no load of its own) and gives the same numbers; paths that are not
    there are skipped."""
    dev = hw_db.device("a100_80gb")
    m = jnp.array([512.0, 2048.0])
    with batching.recording_executables() as used:
        ref = np.asarray(jm.gemm_latency(dev, m, 4096.0, 12288.0))
    assert used and all(p.suffix == ".xla" and p.is_file() for p in used)
    _new_process(monkeypatch)
    monkeypatch.setattr(batching, "_PREFETCHING", {})
    batching.prefetch_executables([str(p) for p in used] + [str(export_dir / "absent.xla"),
                                                            ""])
    assert set(batching._PREFETCHING) == set(used)
    loads = []
    real = batching._load_executable
    monkeypatch.setattr(batching, "_load_executable", lambda p: loads.append(p) or real(p))
    got = np.asarray(jm.gemm_latency(dev, m, 4096.0, 12288.0))
    np.testing.assert_array_equal(got, ref)
    assert batching._PREFETCHING == {}
    assert loads == []            # the main thread loaded nothing (the prefetch did)


@pytest.mark.slow                 # two fresh processes on several host devices (≈ 13 s)
def test_sharded_call_stored_and_loaded_on_several_devices(tmp_path):
    """A batch sharded over several devices (shard_map) is stored and, in a second process,
    loaded for the same devices; both give the plain path's numbers."""
    root = Path(__file__).resolve().parents[1]
    code = ("import sys, numpy as np, jax, jax.numpy as jnp, hw_db, jaxmodel as jm; "
            "from jaxmodel import process, batching; "
            "process.set_export_cache_dir(sys.argv[1]); dev = hw_db.device('a100_80gb'); "
            "m = jnp.linspace(64., 8192., 300); "
            "f = lambda: np.asarray(batching.call_batched(jm.gemm_latency.single, dev, m, "
            "4096.0, 1024.0, chunk=64)); got = f(); process.set_export_cache_dir(None); "
            "print(jax.device_count(), np.array_equal(got, f()))")
    e = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXMODEL_NO_CACHE")}
    e.update(PYTHONPATH=str(root), XLA_FLAGS="--xla_force_host_platform_device_count=2",
             TF_CPP_MIN_LOG_LEVEL="3")
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x")], cwd=root, env=e,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == ["2", "True"]
        assert len(list((tmp_path / "x").glob("*.xla"))) == 1
