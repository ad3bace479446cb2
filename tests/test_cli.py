"""The ``jaxmodel`` command, run in-process."""

import io
import json

import pandas as pd
import pytest

from jaxmodel import cli

SUBCOMMANDS = ("list", "predict", "sweep", "search", "codesign", "cost")


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
