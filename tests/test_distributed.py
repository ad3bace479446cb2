"""jaxmodel.distributed: shares of the design space, input checks, gathers; and sweeps and
searches run as a local multi-process ``jax.distributed`` job (CPU, gloo collectives) that
must return exactly the single-process DataFrame (same rows, same order).

The multi-process tests start 2 or 4 Python processes on 127.0.0.1
(:func:`jaxmodel.distributed.launch_local` running ``tests/distributed_worker.py``); one
2-process run is in the default suite, the searches and the 4-process runs are ``slow``.
"""

import pickle
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import jaxmodel as jm
from jaxmodel import distributed as D

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import distributed_worker as W  # noqa: E402


# ---- single-process helpers (no job: everything is local) --------------------------------

@pytest.mark.parametrize("n, count", [(0, 3), (1, 4), (7, 1), (7, 2), (210, 4), (5, 5)])
def test_process_slices_tile_the_range_in_order(n, count):
    shares = [D.process_slice(n, i, count) for i in range(count)]
    assert shares[0][0] == 0 and shares[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    sizes = [hi - lo for lo, hi in shares]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_process_slice_rejects_bad_arguments():
    with pytest.raises(ValueError, match="index=2"):
        D.process_slice(5, 2, 2)


def test_single_process_is_a_no_op():
    assert not D.is_distributed() and D.process_count() == 1 and D.is_main()
    assert D.local_rows(5) == (slice(0, 5), 5)
    tree = {"a": np.arange(3.0)}
    assert D.gather_rows(tree) is tree and D.gather(1) == [1]
    D.check_same("here", {"x": np.arange(3)})        # nothing to compare with


def test_fingerprint_names_leaves_and_sees_values_and_dtypes():
    a = {"bw": np.float64(2e12), "f": np.sum, "name": "x"}
    d0, s0, leaves = D.fingerprint(a)
    assert [p for p, _ in leaves] == ["['bw']", "['f']", "['name']"]
    assert D.fingerprint(dict(a))[0] == d0
    assert D.fingerprint({**a, "bw": np.float64(2.5e12)})[0] != d0
    assert D.fingerprint({**a, "bw": np.float32(2e12)})[0] != d0
    assert D.fingerprint({**a, "name": "y"})[1] == s0


@pytest.mark.parametrize("kw, msg", [
    (dict(num_processes="two"), "num_processes must be an integer, got 'two'"),
    (dict(num_processes=2, process_id=-1), "process_id must be >= 0"),
    (dict(num_processes=2, process_id=2), "process_id=2 is not below num_processes=2")])
def test_initialize_names_the_bad_argument(kw, msg):
    with pytest.raises(ValueError, match=msg):
        D.initialize("127.0.0.1:1", **kw)


# ---- local multi-process jobs -----------------------------------------------------------

def _run(tmp_path, n, scenarios):
    procs = D.launch_local([HERE / "distributed_worker.py", tmp_path, ",".join(scenarios)], n,
                           timeout=600)
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{p.stderr[-4000:]}"
    return [pickle.loads((tmp_path / f"p{i}.pkl").read_bytes()) for i in range(n)]


def _same_frame(got, want):
    # the same plans, reasons and ranking; float32 values equal to rounding: each process
    # compiles its share at another batch width, and XLA:CPU's loops of another width may
    # round a few operations differently (seen: <= 1.2e-6 relative, e.g. breakdown.bubble)
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=5e-6, atol=0.0)
    assert got.attrs["n_evaluated"] == want.attrs["n_evaluated"]


def _joined(outs, name):
    """The per-process shares of ``name`` (``gather=False``), in process order."""
    parts = [out[name] for out in outs]
    assert [len(p) for p in parts] == sorted((len(p) for p in parts), reverse=True)
    return pd.concat(parts).reset_index(drop=True)


def test_two_processes_sweep_equals_one_and_mismatch_is_named(tmp_path):
    outs = _run(tmp_path, 2, ["sweep", "sweep_parts", "mismatch", "local"])
    want = W.SCENARIOS["sweep"]()
    tiny = W.SCENARIOS["sweep_tiny"]()
    for out in outs:            # inside distributed.local(): whole, unsplit, unchecked
        pd.testing.assert_frame_equal(out["local"], tiny, check_exact=True)
        assert out["local"].attrs["n_processes"] == 1
        assert out["local"].attrs["gathered"] == [0, 1]
    assert outs[1]["sweep_parts"].index[0] == len(outs[0]["sweep_parts"]) == 105
    pd.testing.assert_frame_equal(_joined(outs, "sweep_parts"), want, check_exact=True)
    for rank, out in enumerate(outs):
        _same_frame(out["sweep"], want)
        assert out["sweep"].attrs["n_processes"] == 2
        msg = out["mismatch"]
        assert "grid['dev.mem_bw'] on process(es) [1]" in msg and msg.startswith(
            "ValueError: sweep:"), (rank, msg)


@pytest.mark.slow
def test_two_processes_searches_equal_one(tmp_path):
    outs = _run(tmp_path, 2, ["parallelism", "serving", "codesign"])
    for name in ("parallelism", "serving"):
        want = W.SCENARIOS[name]()
        for out in outs:
            _same_frame(out[name], want)
    want = W.SCENARIOS["codesign"]()
    for out in outs:
        got = out["codesign"]
        assert got.params == want.params and got.value == want.value
        # each process vmaps its own share of the starts: XLA:CPU vectorises a loop of
        # another width with other rounding (~1e-7 per operation), which 30 optimizer steps
        # carry to ~1e-5 in the objective's history; the answer itself is equal
        np.testing.assert_allclose(got.history, want.history, rtol=1e-4, atol=0)
        assert got.n_evals == want.n_evals


@pytest.mark.slow
def test_four_processes_sweep_equals_one_also_with_idle_processes(tmp_path):
    outs = _run(tmp_path, 4, ["sweep", "sweep_tiny", "sweep_tiny_parts"])
    for name in ("sweep", "sweep_tiny"):
        want = W.SCENARIOS[name]()
        for out in outs:
            _same_frame(out[name], want)
        if name == "sweep_tiny":
            assert [len(out["sweep_tiny_parts"]) for out in outs] == [1, 1, 1, 0]
            pd.testing.assert_frame_equal(_joined(outs, "sweep_tiny_parts"), want,
                                          check_exact=True)


@pytest.mark.slow
def test_cli_sweep_distributed_writes_the_single_process_table_once(tmp_path):
    import subprocess
    root = HERE.parent
    cmd = ["-m", "jaxmodel.cli", "sweep", "examples/sweep_gemm.toml", "--quiet"]
    single = subprocess.run([sys.executable, *cmd, "--out", str(tmp_path / "one.csv")],
                            cwd=root, capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr
    procs = D.launch_local([*cmd, "--distributed", "--out", tmp_path / "two.csv"], 2,
                           cwd=root, timeout=600)
    assert [p.returncode for p in procs] == [0, 0], procs[0].stderr + procs[1].stderr
    assert (tmp_path / "two.csv").read_text() == (tmp_path / "one.csv").read_text()
    bad = subprocess.run([sys.executable, *cmd, "--distributed", "--num-processes", "2",
                          "--process-id", "5"], cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "process_id=5 is not below num_processes=2" in bad.stderr
