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
