"""The demo (``make demo``): compile options, the split of its stages over two processes."""

import json
import subprocess
import sys

import pytest

from jaxmodel import demo


def test_compile_options_added_unless_set():
    """XLA_FLAGS after :func:`jaxmodel.demo.use_compile_options`, in a process whose JAX
    backend has not started (it does not start it)."""
    cases = [None, "--xla_dump_to=/tmp/x", "--xla_cpu_use_fusion_emitters=true"]
    code = ("import os, sys, json; from jaxmodel.demo import use_compile_options\n"
            "res = []\n"
            "for v in json.loads(sys.argv[1]):\n"
            "    os.environ.pop('XLA_FLAGS', None)\n"
            "    if v is not None: os.environ['XLA_FLAGS'] = v\n"
            "    use_compile_options(); res.append(os.environ.get('XLA_FLAGS', ''))\n"
            "print(json.dumps(res))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cases)], capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == ["--xla_cpu_use_fusion_emitters=false",
                               "--xla_dump_to=/tmp/x --xla_cpu_use_fusion_emitters=false",
                               "--xla_cpu_use_fusion_emitters=true"]   # the user's value wins


def test_stage_table():
    labels = [label for label, _ in demo.STAGES]
    assert [label.split()[0] for label in labels] == [f"{i}/5" for i in range(1, 6)]
    assert set(demo.SIDE) < set(labels)          # both processes have stages


@pytest.mark.slow
def test_quick_demo_two_processes_equals_serial(tmp_path):
    """``--quick`` end to end, stages split over two processes and in one: same summary."""
    outs = {}
    for mode in ("split", "serial"):
        out = tmp_path / mode
        argv = ["--quick", "--quiet", "--out", str(out)] + (["--serial"] if mode == "serial"
                                                              else [])
        subprocess.run([sys.executable, "-m", "jaxmodel.demo"] + argv, check=True,
                       capture_output=True)
        outs[mode] = json.loads((out / "summary.json").read_text())
        assert len(list(out.glob("*.png"))) == 7
    assert outs["split"] == outs["serial"]
    s = outs["split"]
    assert len(s["predictions"]) == 6 and s["parallelism_search"]["n_plans"] > 0
    assert s["codesign"]["codesign"]["usd_per_mtok"] <= s["codesign"]["a100_design"][
        "usd_per_mtok"]


def test_xla_knows_rejects_unknown_flag():
    assert demo.xla_knows(("--xla_cpu_use_fusion_emitters=false",))
    assert not demo.xla_knows(("--xla_no_such_flag_anywhere=1",))


def test_worker_result_error_and_stop():
    """The second process: its value comes back, its error is raised here with its
    traceback, and :meth:`~jaxmodel.demo.Worker.stop` ends a running one."""
    import operator
    import time
    with demo.Worker(operator.add, 1, 2) as ok, demo.Worker(operator.truediv, 1, 0) as bad, \
            demo.Worker(time.sleep, 60) as slow:
        assert ok.result() == 3
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            bad.result()
        t = time.perf_counter()
        slow.stop()
        # well before the 60 s sleep ends (seconds of slack for a loaded machine)
        assert not slow.process.is_alive() and time.perf_counter() - t < 30
    assert not ok.process.is_alive() and not bad.process.is_alive()


def test_worker_ends_with_its_parent():
    """A parent killed without clean-up (SIGKILL-like ``os._exit``) takes its worker along."""
    import os
    import time
    code = ("import os, sys, time; from jaxmodel import demo\n"
            "w = demo.Worker(time.sleep, 60)\n"
            "time.sleep(2); print(w.process.pid, flush=True); os._exit(0)")
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          text=True) as parent:
        pid = int(parent.stdout.readline())     # (the worker holds the pipe open too)
        assert parent.wait(timeout=30) == 0
    deadline = time.monotonic() + 30.0      # a loaded machine may take seconds to reap it
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, 9)
    except ProcessLookupError:               # ended between the last poll and now
        return
    pytest.fail("worker outlived its parent by 30 s")
