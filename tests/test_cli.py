"""The ``jaxmodel`` command, run in-process."""

import io
import json

import pandas as pd
import pytest

from jaxmodel import cli

SUBCOMMANDS = ("list", "predict", "sweep", "search", "serve", "serve-search", "codesign", "cost")


def run(*argv):
    out = io.StringIO()
    code = cli.main(list(argv), stdout=out)
    return code, out.getvalue()


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for cmd in SUBCOMMANDS:
        assert cmd in text


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_each_subcommand_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([cmd, "--help"])
    assert e.value.code == 0
    assert "--format" in capsys.readouterr().out


def test_list_json_and_csv():
    code, text = run("list", "models")
    assert code == 0
    assert "gpt3-175b" in json.loads(text)["models"]
    code, text = run("list", "devices", "--format", "csv")
    assert code == 0 and "a100_80gb" in text


def test_predict_prefill_returns_json():
    code, text = run("predict", "prefill", "--system", "hgx_a100_4gpu", "--model",
                     "gpt2-small", "--tp", "4", "--batch", "4", "--prompt-len", "128",
                     "--gen-len", "8")
    assert code == 0
    out = json.loads(text)
    assert out["phase"] == "prefill" and out["parallelism"]["tp"] == 4.0
    assert out["parallelism"]["dp"] == 1.0          # derived: 4 devices / (tp 4 · pp 1)
    assert out["feasible"] is True
    assert 0 < out["latency_s"] == out["ttft_s"] < out["total_s"]


@pytest.mark.slow
def test_predict_train_returns_json():
    code, text = run("predict", "train", "--system", "hgx_a100_4gpu", "--model", "gpt2-small",
                     "--tp", "2", "--global-batch", "16", "--seq-len", "256")
    assert code == 0
    out = json.loads(text)
    assert out["parallelism"]["dp"] == 2.0
    assert out["step_time_s"] > 0 and 0 < out["mfu"] < 1


def test_bad_arguments_give_exit_code_2(capsys):
    code, _ = run("predict", "prefill", "--system", "no_such_system")
    assert code == 2
    assert "no_such_system" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["predict", "train", "--tp", "0"], "tp"),
    (["predict", "train", "--tp", "3"], "tp"),                      # 8 devices / 3
    (["predict", "train", "--system", "dgx_a100", "--device", "a100_80gb"], "--device"),
    (["predict", "train", "--nodes", "0"], "nodes"),
    (["predict", "inference", "--device", "a100_80gb", "--nodes", "4"], "nodes"),
    (["predict", "train", "--zero", "7"], "zero"),
    (["predict", "train", "--micro-batch", "0.5"], "micro_batch"),
    (["predict", "prefill", "--model", "no_such_model"], "no_such_model"),
    (["predict", "train", "--out", "/etc/passwd/res.json"], "passwd"),
    (["predict", "train", "--out", "res.xlsx"], "xlsx"),
    (["sweep", "no_such_spec.toml"], "no_such_spec"),
    (["search", "--step-option", "tp_overlap=-1"], "tp_overlap"),
    (["cost", "--nodes", "2"], "--nodes"),
])
def test_user_errors_exit_2_without_traceback(argv, needle, capsys):
    code, out = run(*argv)
    err = capsys.readouterr().err
    assert code == 2 and out == ""
    assert err.startswith("jaxmodel: error: ") and needle in err
    assert "Traceback" not in err


def test_unwritable_out_is_checked_before_computing(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    called = []
    monkeypatch.setattr(cli, "cmd_sweep", lambda a: called.append(a))   # parser() reads it
    code, _ = run("sweep", "examples/sweep_gemm.toml", "--out", str(blocker / "res.csv"))
    assert code == 2 and not called
    assert "not a directory" in capsys.readouterr().err


def _spec(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text,needle", [
    ('function = "gemm_latency"\ndevice = "a100_80gb"\nsytem = "x"\n', "system"),
    ('function = "gemm_latency"\ndevice = 7\n', "device"),
    ('function = "no_fn"\ndevice = "a100_80gb"\n', "no_fn"),
    ('function = "inference"\nsystem = "dgx_a100"\ndevice = "a100_80gb"\n', "either"),
    ('function = "gemm_latency"\ndevice = "a100_80gb"\nchunk = 0\n[args]\nm = 1\nn = 1\n'
     'k = 1\n', "chunk"),
    ('function = "gemm_latency"\ndevice = "a100_80gb"\nnodes = "two"\n', "nodes"),
    ('function = "gemm_latency"\ndevice = "a100_80gb"\n[args]\nm = 1\n', "missing"),
])
def test_bad_sweep_specs_exit_2(tmp_path, text, needle, capsys):
    code, _ = run("sweep", _spec(tmp_path, text), "--quiet")
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("text,needle", [
    ('system = "dgx_a100"\n[bounds]\ncore_count = ["16", 256]\n', "core_count"),
    ('system = "dgx_a100"\n[bounds]\ncore_count = [256, 16]\n', "lo < hi"),
    ('system = "dgx_a100"\n[bounds]\ncore_count = 16\n', "core_count"),
    ('system = "dgx_a100"\n[codesign]\nstep = 5\n[bounds]\ncore_count = [16, 256]\n',
     "steps"),
    ('system = "dgx_a100"\n[codesign]\nsteps = "5"\n[bounds]\ncore_count = [16, 256]\n',
     "steps"),
    ('system = "dgx_a100"\n[workload]\nbatch = 0.5\n[bounds]\ncore_count = [16, 256]\n',
     "batch"),
    ('system = "dgx_a100"\n[init]\ncore_count = "x"\n[bounds]\ncore_count = [16, 256]\n',
     "core_count"),
    ('system = "dgx_a100"\n[bound]\ncore_count = [16, 256]\n', "bounds"),
])
def test_bad_codesign_specs_exit_2(tmp_path, text, needle, capsys):
    code, _ = run("codesign", _spec(tmp_path, text))
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err


def test_infeasible_prediction_exits_1_with_reason_and_hint(capsys):
    # the plan of test_predict_prefill_returns_json (same compiled graph), with a KV cache
    # of 16384 sequences × 1032 tokens (~150 GB per device) that cannot fit
    code, text = run("predict", "prefill", "--system", "hgx_a100_4gpu", "--model",
                     "gpt2-small", "--tp", "4", "--batch", "16384", "--prompt-len", "1024",
                     "--gen-len", "8")
    err = capsys.readouterr().err
    assert code == 1
    out = json.loads(text)
    assert out["feasible"] is False and out["reason"] == "out_of_memory"
    assert "out_of_memory" in err and "--tp" in err and "GiB" in err


def test_examples_in_help_are_the_tested_ones(capsys):
    for cmd in SUBCOMMANDS:
        with pytest.raises(SystemExit):
            cli.main([cmd, "--help"])
        text = capsys.readouterr().out
        assert text.rstrip().endswith(cli.EXAMPLES[cmd]), cmd


@pytest.mark.parametrize("cmd", ["list", "sweep_gemm", "cost"])
def test_help_examples_run(cmd, monkeypatch, tmp_path):
    """The fast examples of ``--help`` (and the shipped gemm sweep) answer with status 0."""
    from pathlib import Path
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    if cmd == "sweep_gemm":
        argv = ["sweep", "examples/sweep_gemm.toml", "--quiet", "--out",
                str(tmp_path / "g.csv")]
    else:
        argv = cli.EXAMPLES[cmd].split()[1:]
    code, _ = run(*argv)
    assert code == 0
    if cmd == "sweep_gemm":
        df = pd.read_csv(tmp_path / "g.csv")
        assert len(df) == 9 and (df["gemm_latency"] > 0).all()
        assert df["gemm_latency"].notna().all()


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["predict", "sweep", "search", "codesign"])
def test_slow_help_examples_run(cmd, monkeypatch, tmp_path):
    """The remaining ``--help`` examples (``examples/*.toml``) answer: finite, feasible."""
    from pathlib import Path
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    argv = [x if x != "sweep.csv" else str(tmp_path / "s.csv")
            for x in cli.EXAMPLES[cmd].split()[1:]]
    code, text = run(*argv)
    assert code == 0
    if cmd == "sweep":
        df = pd.read_csv(tmp_path / "s.csv")
        assert len(df) == 32 and df["feasible"].all()
        assert (df["ttft_s"] > 0).all() and df["ttft_s"].notna().all()
    elif cmd == "search":
        df = pd.read_csv(io.StringIO(text))
        assert len(df) == 5 and df["feasible"].all()
    else:
        out = json.loads(text)
        assert out["value" if cmd == "codesign" else "ttft_s"] not in ("inf", None)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["train", "inference"])
def test_defaults_are_feasible(phase):
    code, text = run("predict", phase)
    out = json.loads(text)
    assert code == 0 and out["feasible"] is True and out["reason"] == "ok"
    assert out["step_time_s" if phase == "train" else "ttft_s"] not in ("inf", None)


def test_sweep_from_toml(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('function = "gemm_latency"\ndevice = "a100_80gb"\n'
                    '[args]\nm = 256\nn = 1024\nk = 1024\n'
                    '[grid]\n"dev.mem_bw" = [1e12, 2e12]\n"dev.core_count" = [32, 108]\n')
    out = tmp_path / "res.csv"
    code, _ = run("sweep", str(spec), "--quiet", "--out", str(out))
    assert code == 0
    df = pd.read_csv(out)
    assert len(df) == 4 and list(df.columns) == ["dev.mem_bw", "dev.core_count",
                                                  "gemm_latency"]
    assert (df["gemm_latency"] > 0).all()
    spec.write_text('function = "gemm_latency"\ndevice = "a100_80gb"\n[args]\nm = 1\nn = 1\n'
                    'k = 1\n[grid]\n"dev.bogus" = [1]\n')
    code, _ = run("sweep", str(spec), "--quiet")
    assert code == 2


def test_cost_json():
    code, text = run("cost", "--device", "a100_80gb", "--system", "dgx_a100")
    assert code == 0
    out = json.loads(text)
    assert 600 < out["die_area_mm2"]["total"] < 1000
    assert out["device_cost"]["total_usd"] > out["device_cost"]["memory_usd"] > 0
    assert out["system_cost"]["n_devices"] == 8.0


@pytest.mark.slow
def test_codesign_from_toml(tmp_path):
    spec = tmp_path / "cd.toml"
    spec.write_text('system = "dgx_a100"\nmodel = "llama3-8b"\n[parallelism]\ntp = 8\n'
                    '[workload]\nbatch = 8\nprompt_len = 512\ngen_len = 128\n'
                    '[codesign]\nsteps = 5\nn_starts = 2\ninteger = ["core_count"]\n'
                    '[bounds]\ncore_count = [16, 256]\nhbm_stacks = [1, 8]\n')
    code, text = run("codesign", str(spec))
    assert code == 0
    out = json.loads(text)
    assert out["params"]["core_count"] == round(out["params"]["core_count"])
    assert out["value"] <= out["best_history"][0] * 1.01
    spec.write_text('system = "dgx_a100"\n[bounds]\nbogus = [1, 2]\n')
    assert run("codesign", str(spec))[0] == 2


@pytest.mark.slow
def test_search_csv():
    code, text = run("search", "--system", "hgx_a100_4gpu", "--model", "gpt2-small",
                     "--global-batch", "8", "--seq-len", "256", "--top", "5", "--quiet",
                     "--step-option", "tp_overlap=0,1")
    assert code == 0
    df = pd.read_csv(io.StringIO(text))
    assert len(df) == 5 and df["step_time_s"].is_monotonic_increasing
    assert set(df["tp_overlap"]) <= {0.0, 1.0}
    from jaxmodel.cli import _step_options
    assert _step_options(["dp_overlap=0, 1", "grad_bytes=2"]) == {"dp_overlap": [0.0, 1.0],
                                                                   "grad_bytes": [2.0]}
    with pytest.raises(ValueError, match="tp_overlap=x"):
        _step_options(["tp_overlap=x"])


@pytest.mark.slow
def test_predict_notes_its_executables_and_prefetches_them(tmp_path, monkeypatch):
    """With the export cache on (the console script's default), predict notes which stored
    executables the command line used; the same command, or the same with other workload
    sizes, later starts loading them at once (and answers as before); another plan does not."""
    from jaxmodel import batching, process
    monkeypatch.setattr(process, "_export_dir", tmp_path / "exports")
    monkeypatch.setattr(batching, "_EXECUTABLES", {})
    argv = ("predict", "prefill", "--system", "hgx_a100_4gpu", "--model", "gpt2-small",
            "--tp", "4", "--batch", "4", "--prompt-len", "128", "--gen-len", "8")
    code, first = run(*argv)
    assert code == 0
    notes = list((tmp_path / "exports" / "questions").glob("*.txt"))
    assert len(notes) == 1
    paths = notes[0].read_text().split("\n")
    assert paths and all(p.endswith(".xla") and (tmp_path / "exports" / p).is_file()
                         for p in paths)
    monkeypatch.setattr(batching, "_EXECUTABLES", {})      # as in a fresh process
    asked = []
    real = batching.prefetch_executables
    monkeypatch.setattr(batching, "prefetch_executables",
                        lambda ps: asked.extend(ps) or real(ps))
    code, second = run(*argv)
    assert code == 0 and second == first and asked == paths
    asked.clear()
    monkeypatch.setattr(batching, "_EXECUTABLES", {})
    code, other = run(*argv[:-1], "16")                     # other sizes: the same note
    assert code == 0 and other != first and asked == paths
    assert len(list((tmp_path / "exports" / "questions").glob("*.txt"))) == 1
    run(*argv[:7], "2", *argv[8:])                          # another plan (tp): its own note
    assert len(list((tmp_path / "exports" / "questions").glob("*.txt"))) == 2


def test_serve_search_parses_expert_parallel_and_speculative_options():
    from jaxmodel.cli import search as cs
    assert cs._int_list("1,8", "--ep") == [1, 8]
    specs = cs._speculative_list("eagle:3:0.7,mtp:1:0.8")
    assert [(float(s.method), float(s.k), float(s.accept)) for s in specs] == [
        (3.0, 3.0, 0.7), (2.0, 1.0, 0.8)]
    assert cs._speculative_list("") == []
    for bad, flag in (("0", "--ep"), ("x", "--ep")):
        with pytest.raises(ValueError, match=flag):
            cs._int_list(bad, flag)
    for bad in ("eagle:3", "draft_model:1:0.5", "eagle:k:0.7"):
        with pytest.raises(ValueError, match="--speculative"):
            cs._speculative_list(bad)
