"""Mutation test of the input edge: malformed copies of the shipped device, system and model
files (and malformed CLI calls) must each give a clear error naming the field — never a
traceback from deep inside, never a NaN, and (almost) never a silent wrong answer.

The malformed inputs are generated from ``hw_db/`` itself: drop a key, a wrong type, a string
for a number or a boolean, a unit key (unknown, wrong dimension), an out-of-range magnitude,
an unknown key with a typo, a negative, NaN/inf, a code out of range, a missing source. Only
loaders and argument checks run (no model evaluation), so the whole file takes seconds.
"""

from __future__ import annotations

import copy
import io
import json
import math
from collections import Counter
from pathlib import Path

import jax
import numpy as np
import pytest

import hw_db
from jaxmodel import cli

DEVICE_FIELDS_TO_MUTATE = ("freq_hz", "core_count", "mem_bw", "mem_bw_efficiency",
                           "local_buffer_bytes", "global_buffer_bytes", "matmul_overhead_s",
                           "sa_rows", "mem_capacity")
LEVEL_FIELDS_TO_MUTATE = ("size", "bw_per_device", "link_latency", "efficiency")
MODEL_KEYS_TO_MUTATE = ("num_hidden_layers", "hidden_size", "num_attention_heads",
                        "vocab_size")


# ------------------------------------------------------------------------------------------
# a minimal TOML writer for the shapes hw_db uses (scalars, inline tables, [table], [[array]])
# ------------------------------------------------------------------------------------------
def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else
                                            "-inf" if v == -math.inf else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_scalar(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TypeError(v)


def dump_toml(data: dict) -> str:
    lines, tables, arrays = [], [], []
    for k, v in data.items():
        if isinstance(v, dict) and not ("value" in v):
            tables.append((k, v))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            lines.append(f"{k} = {_scalar(v)}")
    for k, tbl in tables:
        lines.append(f"\n[{k}]")
        lines += [f"{kk} = {_scalar(vv)}" for kk, vv in tbl.items()]
    for k, arr in arrays:
        for tbl in arr:
            lines.append(f"\n[[{k}]]")
            lines += [f"{kk} = {_scalar(vv)}" for kk, vv in tbl.items()]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# mutations: (label, the field name the error must mention, mutated data)
# ------------------------------------------------------------------------------------------
def _entry_mutations(table: dict, field: str, shown: str):
    """Mutations of one ``{value, source}`` entry of ``table``."""
    v = table[field]["value"]

    def with_entry(**changes):
        t = copy.deepcopy(table)
        t[field] = {**t[field], **changes}
        return t

    def without(key):
        t = copy.deepcopy(table)
        t[field] = {k: x for k, x in t[field].items() if k != key}
        return t

    dropped = {k: x for k, x in copy.deepcopy(table).items() if k != field}
    typo = {(f"{field}x" if k == field else k): x for k, x in copy.deepcopy(table).items()}
    yield "drop key", shown, dropped
    yield "typo key", shown, typo
    yield "string value", shown, with_entry(value="fast")
    yield "string bool", shown, with_entry(value="true")
    yield "bool value", shown, with_entry(value=True)
    yield "negative", shown, with_entry(value=-abs(v) if v else -1.0)
    yield "nan", shown, with_entry(value=float("nan"))
    yield "inf", shown, with_entry(value=float("inf"))
    yield "huge", shown, with_entry(value=abs(v) * 1e30 + 1e30)
    yield "unknown unit", shown, with_entry(unit="furlongs")
    yield "unit typo in key", shown, with_entry(unti="GHz")
    yield "no source", shown, without("source")


def _out_of_range_device(table: dict):
    """Device magnitudes outside the physical ranges, units of the wrong dimension."""
    cases = [("freq_hz", {"value": 1410}), ("freq_hz", {"value": 1410, "unit": "GB"}),
             ("freq_hz", {"value": 1.41, "unit": "MHz"}),
             ("core_count", {"value": 0.5}), ("core_count", {"value": 108.5}),
             ("mem_bw_efficiency", {"value": 5}), ("mem_bw_efficiency", {"value": 0}),
             ("mem_bw", {"value": 2.0}), ("mem_bw", {"value": 2.0, "unit": "TB"}),
             ("mem_bw", {"value": 2039, "unit": "Hz"}),
             ("local_buffer_bytes", {"value": 100}), ("matmul_overhead_s", {"value": 5}),
             ("matmul_overhead_s", {"value": 25.9, "unit": "GHz"}),
             ("sa_rows", {"value": 0}), ("vector_dtype_bytes", {"value": 64}),
             ("core_count", {"value": 108, "unit": "MHz"}),
             ("mem_protocol", {"value": 7}), ("link_protocol", {"value": -3}),
             ("tdp_w", {"value": 400, "unit": "ms"})]
    for field, change in cases:
        t = copy.deepcopy(table)
        t[field] = {"source": "mutated", **change}
        yield f"out of range {change}", field, t


def device_mutations():
    for name in hw_db.names("device"):
        data = hw_db.load_toml(hw_db.ROOT / "devices" / f"{name}.toml")
        for field in DEVICE_FIELDS_TO_MUTATE:
            for label, shown, table in _entry_mutations(data["device"], field, field):
                yield f"device {name} {field}: {label}", shown, {**data, "device": table}
        if name == "a100_80gb":
            for label, shown, table in _out_of_range_device(data["device"]):
                yield f"device {name}: {label}", shown, {**data, "device": table}
            yield "device: unknown top-level key", "devcie", {**data, "devcie": {}}
            yield "device: name a number", "name", {**data, "name": 7}


def system_mutations():
    for name in hw_db.names("system"):
        data = hw_db.load_toml(hw_db.ROOT / "systems" / f"{name}.toml")
        lv = data["levels"]
        for field in LEVEL_FIELDS_TO_MUTATE:
            for label, shown, table in list(_entry_mutations(lv[0], field, field))[:9]:
                levels = [table] + copy.deepcopy(lv[1:])
                yield f"system {name} {field}: {label}", shown, {**data, "levels": levels}

        def level(**changes):
            t = copy.deepcopy(lv)
            t[-1].update(changes)
            return {**data, "levels": t}

        yield f"system {name}: efficiency 2", "efficiency", level(
            efficiency={"value": 2, "source": "x"})
        yield f"system {name}: topology 7", "topology", level(
            topology={"value": 7, "source": "x"})
        yield f"system {name}: topology 1.5", "topology", level(
            topology={"value": 1.5, "source": "x"})
        yield f"system {name}: topology name", "topology", level(
            topology={"value": "hypercube", "source": "x"})
        yield f"system {name}: scales_with_nodes string", "scales_with_nodes", level(
            scales_with_nodes="no")
        yield f"system {name}: link latency in ms out of range", "link_latency", level(
            link_latency={"value": 5000, "unit": "ms", "source": "x"})
        yield f"system {name}: bw unit of time", "bw_per_device", level(
            bw_per_device={"value": 200, "unit": "ns", "source": "x"})
        yield f"system {name}: in_network_reduction 3", "in_network_reduction", level(
            in_network_reduction={"value": 3, "source": "x"})
        yield f"system {name}: device a number", "device", {**data, "device": 7}
        yield f"system {name}: device unknown", "a101", {**data, "device": "a101"}


def model_mutations():
    for name in hw_db.names("model"):
        cfg = json.loads((hw_db.ROOT / "models" / f"{name}.json").read_text())
        keys = [k for k in MODEL_KEYS_TO_MUTATE if k in cfg] or [
            k for k in ("n_layer", "n_embd", "n_head") if k in cfg]
        for key in keys:
            v = cfg[key]

            def mut(val, key=key):
                return {**cfg, key: val}

            yield f"model {name} {key}: drop", key, {k: x for k, x in cfg.items() if k != key}
            yield f"model {name} {key}: string", key, mut(str(v))
            yield f"model {name} {key}: fraction", key, mut(v + 0.5)
            yield f"model {name} {key}: negative", key, mut(-v)
            yield f"model {name} {key}: nan", key, mut(float("nan"))
            yield f"model {name} {key}: typo", key + "s", {
                (key + "s" if k == key else k): x for k, x in cfg.items()}
        yield f"model {name}: tanh", "tanh", {**cfg, "hidden_act": "tanh",
                                             "activation_function": "tanh",
                                             "hidden_activation": "tanh"}
        yield f"model {name}: negative window", "sliding_window", {**cfg,
                                                                   "sliding_window": -4096}
        yield f"model {name}: unknown structural key", "shared_expert_intermediate_size", {
            **cfg, "shared_expert_intermediate_size": 5632}
        yield f"model {name}: tie string", "tie_word_embeddings", {
            **cfg, "tie_word_embeddings": "yes"}


def cli_mutations(tmp: Path):
    bad_sys = tmp / "bad_system.toml"
    data = hw_db.load_toml(hw_db.ROOT / "systems" / "dgx_a100.toml")
    bad_sys.write_text(dump_toml({**data, "device": 7}))
    bad_dev = tmp / "bad_device.toml"
    d = hw_db.load_toml(hw_db.ROOT / "devices" / "a100_80gb.toml")
    bad_dev.write_text(dump_toml({**d, "device": {**d["device"], "freq_hz": {
        "value": 1410, "unit": "MHz", "source": "x"}, "core_count": {
        "value": "many", "source": "x"}}}))
    # (subcommand words, one bad flag and its value, the field the error must name)
    flags = {
        ("predict", "train"): [
            ("--tp", "0", "tp"), ("--tp", "-8", "tp"), ("--tp", "nan", "tp"),
            ("--pp", "0.5", "pp"), ("--tp", "3", "tp"), ("--zero", "4", "zero"),
            ("--micro-batch", "0", "micro_batch"), ("--interleave", "0.5", "interleave"),
            ("--ep", "0", "ep"), ("--dp", "3", "dp"), ("--global-batch", "0", "global_batch"),
            ("--seq-len", "0", "seq_len"), ("--seq-len", "100.5", "seq_len"),
            ("--nodes", "0", "nodes"), ("--nodes", "-2", "nodes"),
            ("--system", "no_such", "no_such"), ("--model", "gpt-42", "gpt-42"),
            ("--system", str(bad_sys), "device"), ("--device", str(bad_dev), "core_count"),
            ("--out", str(tmp / "f.txt" / "x.json"), "x.json"),
            ("--out", str(tmp / "r.xlsx"), "xlsx"), ("--schedule", "zigzag", "schedule")],
        ("predict", "inference"): [
            ("--batch", "0", "batch"), ("--gen-len", "0.5", "gen_len"),
            ("--prompt-len", "nan", "prompt_len")],
        ("search",): [
            ("--step-option", "dp_overlap=5", "dp_overlap"),
            ("--step-option", "grad_bytes=0", "grad_bytes"),
            ("--step-option", "tp_overlap", "tp_overlap")],
        ("cost",): [("--device", str(bad_dev), "core_count")],
    }
    cases = [([*cmd, flag, value], field) for cmd, rows in flags.items()
             for flag, value, field in rows]
    cases += [
        (["predict", "train", "--system", "dgx_a100", "--device", "a100_80gb"], "--device"),
        (["search", "--system", "dgx_a100", "--device", "a100_80gb"], "--device"),
        (["cost", "--system", "dgx_a100", "--nodes", "0"], "nodes"),
        (["sweep", str(tmp / "missing.toml")], "missing.toml"),
        (["codesign", str(tmp / "missing.toml")], "missing.toml"),
    ]
    (tmp / "f.txt").write_text("x")
    return cases


# ------------------------------------------------------------------------------------------
# classification
# ------------------------------------------------------------------------------------------
def _has_nan(tree) -> bool:
    return any(np.isnan(np.asarray(x, dtype=float)).any()
               for x in jax.tree_util.tree_leaves(tree))


def classify(load, needle: str) -> str:
    """``clear`` (ValueError naming the field), ``vague`` (ValueError not naming it),
    ``silent`` (accepted), ``nan`` (accepted with a NaN) or ``traceback`` (another error)."""
    try:
        obj = load()
    except ValueError as e:
        return "clear" if needle in str(e) else "vague"
    except Exception as e:  # noqa: BLE001 — exactly what this test counts
        return f"traceback {type(e).__name__}: {e}"
    return "nan" if _has_nan(obj) else "silent"


def run_file_mutations(tmp: Path) -> list[tuple[str, str]]:
    results = []
    for i, (label, needle, data) in enumerate(device_mutations()):
        p = tmp / f"dev{i}.toml"
        p.write_text(dump_toml(data))
        results.append((label, classify(lambda p=p: hw_db.device(p), needle)))
    for i, (label, needle, data) in enumerate(system_mutations()):
        p = tmp / f"sys{i}.toml"
        p.write_text(dump_toml(data))
        results.append((label, classify(lambda p=p: hw_db.system(p, nodes=None), needle)))
    for i, (label, needle, cfg) in enumerate(model_mutations()):
        p = tmp / f"model{i}.json"
        p.write_text(json.dumps(cfg))
        results.append((label, classify(lambda p=p: hw_db.model(str(p)), needle)))
    return results


def run_cli_mutations(tmp: Path, capsys) -> list[tuple[str, str]]:
    results = []
    for argv, needle in cli_mutations(tmp):
        try:
            code = cli.main(argv, stdout=io.StringIO())
        except SystemExit as e:            # argparse: usage error, exit status 2
            code = e.code
        except Exception as e:  # noqa: BLE001
            results.append((" ".join(argv), f"traceback {type(e).__name__}: {e}"))
            continue
        err = capsys.readouterr().err
        if "Traceback" in err:
            kind = "traceback"
        elif code == 2 and needle in err:
            kind = "clear"
        elif code == 2:
            kind = f"vague: {err.strip()[-200:]}"
        else:
            kind = "silent"
        results.append((" ".join(argv), kind))
    return results


def test_shipped_files_round_trip_through_the_writer(tmp_path):
    """Control: the unmutated files, re-written, load to the same configs."""
    for name in hw_db.names("device"):
        data = hw_db.load_toml(hw_db.ROOT / "devices" / f"{name}.toml")
        p = tmp_path / f"{name}.toml"
        p.write_text(dump_toml(data))
        assert hw_db.device(p) == hw_db.device(name)
    for name in hw_db.names("system"):
        data = hw_db.load_toml(hw_db.ROOT / "systems" / f"{name}.toml")
        p = tmp_path / f"s_{name}.toml"
        p.write_text(dump_toml(data))
        assert hw_db.system(p).levels == hw_db.system(name).levels


def test_explicit_units_are_converted_not_ignored(tmp_path):
    data = hw_db.load_toml(hw_db.ROOT / "devices" / "a100_80gb.toml")
    dev = data["device"]
    dev["freq_hz"] = {"value": 1410, "unit": "MHz", "source": "x"}
    dev["mem_bw"] = {"value": 2.039, "unit": "TB/s", "source": "x"}
    dev["local_buffer_bytes"] = {"value": 192, "unit": "KiB", "source": "x"}
    dev["matmul_overhead_s"] = {"value": dev["matmul_overhead_s"]["value"] * 1e6, "unit": "us",
                                "source": "x"}
    p = tmp_path / "units.toml"
    p.write_text(dump_toml(data))
    ref, got = hw_db.device("a100_80gb"), hw_db.device(p)
    for f in ("freq_hz", "mem_bw", "local_buffer_bytes", "matmul_overhead_s"):
        assert float(getattr(got, f)) == pytest.approx(float(getattr(ref, f)), rel=1e-12), f
    sysd = hw_db.load_toml(hw_db.ROOT / "systems" / "dgx_a100.toml")
    sysd["levels"][1]["bw_per_device"] = {"value": 200, "unit": "Gb/s", "source": "x"}
    sysd["levels"][1]["link_latency"] = {"value": 1000, "unit": "ns", "source": "x"}
    p = tmp_path / "sys_units.toml"
    p.write_text(dump_toml(sysd))
    lvl = hw_db.system(p, nodes=2).levels[1]
    assert float(lvl.bw_per_device) == 25e9 and float(lvl.link_latency) == pytest.approx(1e-6)


def test_malformed_files_and_cli_calls_give_clear_errors(tmp_path, capsys):
    results = run_file_mutations(tmp_path) + run_cli_mutations(tmp_path, capsys)
    kinds = Counter(k.split(":")[0].split(" ")[0] for _, k in results)
    n = len(results)
    bad = [(label, k) for label, k in results if k != "clear"]
    report = "\n".join(f"  {label}: {k}" for label, k in bad[:40])
    assert n >= 200, n
    assert kinds["traceback"] == 0, report
    assert kinds["nan"] == 0, report
    assert kinds["clear"] >= 0.95 * n, f"{dict(kinds)} of {n}\n{report}"
