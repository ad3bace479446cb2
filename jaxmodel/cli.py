"""The ``jaxmodel`` command: predictions, sweeps, searches, co-design and costs from a shell.

Subcommands (``jaxmodel <cmd> --help`` for each)::

    jaxmodel list [devices|systems|models]
    jaxmodel predict {train,prefill,decode,inference} --system dgx_a100 --nodes 2 \\
        --model gpt3-13b --tp 8 ...
    jaxmodel sweep spec.toml [--out results.csv]
    jaxmodel search --system dgx_a100 --nodes 192 --model gpt3-175b --global-batch 1536 \\
        --seq-len 2048 [--top 10]
    jaxmodel codesign spec.toml
    jaxmodel cost --device a100_80gb | --system dgx_a100
    jaxmodel serve {offline,slo} --system dgx_h100 --model llama3-70b --tp 2 --isl 1000 \\
        --osl 1000 --precision fp8 [--runtime trtllm_v1] [--ttft-p99 1 --tpot-p99 0.05]
    jaxmodel serve-search --system dgx_h100 --model llama3-8b --isl 1024 --osl 256 \\
        --ttft-slo 1.0 --tpot-slo 0.05

Hardware and models are hw_db names or file paths (a device/system TOML, a HF config.json).
Output is JSON (default for single results) or CSV (default for tables); ``--format`` picks.

A sweep spec (TOML) names a public jaxmodel function and its arguments; the function's
parameter names decide how each argument is built (``system``, ``dev``/``device``, ``model``,
``par``; every other parameter comes from ``[args]``)::

    function = "inference"
    system = "hgx_a100_4gpu"     # or device = "a100_80gb" for device-level functions
    model = "llama2-13b"
    [parallelism]
    tp = 4
    [args]
    batch = 8
    prompt_len = 2048
    gen_len = 256
    [grid]
    "system.device.mem_bw" = { logspace = [4e11, 3.2e12, 8] }
    "system.device.global_buffer_bytes" = [10e6, 20e6, 40e6, 80e6]

A co-design spec adds ``[codesign]`` with ``objective`` (a name from
:data:`jaxmodel.search.objectives.OBJECTIVES`), ``steps``, ``n_starts``, and ``[bounds]``.
Both kinds ship in ``examples/`` (``sweep_inference.toml``, ``codesign.toml``).

Errors in the arguments or the files print ``jaxmodel: error: ...`` and exit with status 2
(no traceback); a prediction that is infeasible (e.g. out of memory) is printed, explained on
stderr with the option to change, and exits with status 1.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxmodel.plan_io import (DEFAULT_MODEL, DEFAULT_SYSTEM, HINTS, PAR_CHOICES,  # noqa: F401
                              build_parallelism, explain_infeasible, to_jsonable)
from jaxmodel.plan_io import PAR_FIELDS as _PAR_FIELDS
from jaxmodel.plan_io import default_tp as _default_tp
from jaxmodel.plan_io import load_system as _load_system
from jaxmodel.plan_io import reason_label as _reason_name


# --------------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------------
def _is_frame(data) -> bool:
    """True for a pandas DataFrame, without importing pandas (a command that returns a frame
    has imported it)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(data, pd.DataFrame)


def _emit(data: Any, fmt: str, out: str | None, stream) -> None:
    if _is_frame(data):
        import pandas as pd
        if "reason" in data.columns and pd.api.types.is_numeric_dtype(data["reason"]):
            data = data.assign(reason_code=data["reason"].astype(int),
                               reason=[_reason_name(r) for r in data["reason"]])
        if out:
            from jaxmodel.search.explore import save
            save(data, out)
            print(f"wrote {len(data)} rows to {out}", file=sys.stderr)
            return
        if fmt == "json":
            stream.write(data.to_json(orient="records") + "\n")
        else:
            data.to_csv(stream, index=False)
        return
    data = to_jsonable(data)
    if fmt == "csv":
        flat = _flatten(data)
        buf = io.StringIO()
        buf.write(",".join(flat) + "\n")
        buf.write(",".join(str(v) for v in flat.values()) + "\n")
        text = buf.getvalue()
    else:
        text = json.dumps(data, indent=2) + "\n"
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        stream.write(text)


def _flatten(d: Any, prefix: str = "") -> dict:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def check_out_path(out: str | None, table: bool) -> None:
    """Fail before computing when ``--out`` cannot be written (type, directory, permission)."""
    if not out:
        return
    p = Path(out)
    suffix = p.suffix.lower()
    allowed = (".csv", ".parquet", ".pq") if table else (".json", ".csv")
    if suffix not in allowed:
        raise ValueError(f"--out {out!r}: unknown file type {suffix or '(none)'!r}; use one of "
                         f"{list(allowed)}")
    if suffix in (".parquet", ".pq"):
        import importlib.util
        if importlib.util.find_spec("pyarrow") is None:
            raise ValueError(f"--out {out!r}: Parquet needs pyarrow (pip install pyarrow); "
                             "use .csv")
    if p.exists() and p.is_dir():
        raise ValueError(f"--out {out!r} is a directory")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"--out {out!r} is not writable")
    parent = p.parent if str(p.parent) else Path(".")
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"--out {out!r}: {str(parent)!r} is not a directory")
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out!r}: directory {str(parent)!r} is not writable")


# --------------------------------------------------------------------------------------------
# Building arguments
# --------------------------------------------------------------------------------------------
def build_call(fn, spec: Mapping) -> tuple[tuple, dict]:
    """Positional/keyword arguments for ``fn`` from a sweep/predict spec (see module doc)."""
    import hw_db
    params = inspect.signature(fn).parameters
    extra = spec.get("args", {})
    if not isinstance(extra, Mapping):
        raise ValueError(f"spec: [args] must be a table, got {extra!r}")
    extra = dict(extra)
    if "system" in spec and "device" in spec:
        raise ValueError(f"spec: give either system ({spec['system']!r}) or device "
                         f"({spec['device']!r}), not both")
    for key in ("system", "device", "model", "function"):
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"spec: '{key}' must be a name or a path (a string), got "
                             f"{spec[key]!r}")
    system = None
    if "device" not in spec:
        system = _load_system(spec.get("system"), spec.get("nodes"), None)
    elif spec.get("nodes") not in (None, 1):
        raise ValueError(f"spec: nodes={spec['nodes']!r} needs a system, not a single device")
    device = hw_db.device(spec["device"]) if "device" in spec else system.device
    model = hw_db.model(spec.get("model", DEFAULT_MODEL)) if "model" in params else None
    par_spec = spec.get("parallelism", spec.get("par", {}))
    if not isinstance(par_spec, Mapping):
        raise ValueError(f"spec: [parallelism] must be a table, got {par_spec!r}")
    args, kwargs = [], {}
    skipped = False           # after a defaulted parameter is left out, pass by keyword
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in ("system",):
            val = system if system is not None else _load_system(None, None, spec["device"])
        elif name in ("dev", "device"):
            val = device
        elif name == "model":
            val = model
        elif name in ("par", "parallelism"):
            sys_ = system if system is not None else _load_system(None, None, spec["device"])
            ps = _default_tp(sys_, model, par_spec) if model is not None else dict(par_spec)
            val = build_parallelism(ps, float(sys_.n_devices))
        elif name in extra:
            val = extra.pop(name)
        elif p.default is not p.empty:
            skipped = True
            continue
        else:
            raise ValueError(f"spec: missing argument {name!r} of {fn.__name__} in [args]")
        if p.kind == p.KEYWORD_ONLY or skipped:
            kwargs[name] = val
        else:
            args.append(val)
    if extra:
        unknown = sorted(k for k in extra if k not in params)
        if unknown:
            raise ValueError(f"spec: [args] has {unknown}, not parameters of {fn.__name__} "
                             f"({list(params)})")
        kwargs.update(extra)
    return tuple(args), kwargs


def _public_fn(name: str):
    import jaxmodel as jm
    fn = getattr(jm, name, None) if isinstance(name, str) else None
    if fn is None or not callable(fn) or name.startswith("_") or isinstance(fn, type):
        raise ValueError(f"spec: function={name!r} is not a public jaxmodel function")
    return fn


# --------------------------------------------------------------------------------------------
# Subcommands
# --------------------------------------------------------------------------------------------
def cmd_list(a) -> Any:
    import hw_db
    kinds = {"devices": "device", "systems": "system", "models": "model"}
    chosen = [a.kind] if a.kind != "all" else list(kinds)
    out = {k: hw_db.names(kinds[k]) for k in chosen}
    if "models" in out:
        from jaxmodel.workload.params import param_count
        # total and per-token (active) parameters, billions (jaxmodel.param_count)
        out["models"] = {n: {"params_b": round(float(param_count.single(m)) / 1e9, 3),
                             "active_params_b": round(float(param_count.single(m, True)) / 1e9,
                                                      3)}
                         for n, m in ((n, hw_db.model(n)) for n in out["models"])}
    return out


def _hardware_args(p: argparse.ArgumentParser):
    p.add_argument("--system", help=f"hw_db system name or TOML path (default {DEFAULT_SYSTEM})")
    p.add_argument("--nodes", type=int, help="nodes of the system (scales the outer level)")
    p.add_argument("--device", help="a single device (hw_db name or TOML) instead of a system")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"hw_db model name or config.json path (default {DEFAULT_MODEL})")


def _par_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("parallelism (default: tp = GPUs per node when it divides the "
                             "heads, pp = 1, dp = the devices left)")
    for f in ("dp", "tp", "pp", "ep", "micro_batch", "interleave", "zero"):
        g.add_argument(f"--{f.replace('_', '-')}", type=float, dest=f, default=None)
    g.add_argument("--cp", type=float, dest="cp", default=None,
                   help="context parallelism (training): the sequence split over cp devices, "
                        "ring attention")
    g.add_argument("--sp", action="store_true", default=None, help="sequence parallelism")
    g.add_argument("--flash-attention", nargs="?", const="fa1", default=None,
                   choices=list(PAR_CHOICES["flash_attention"]), dest="flash_attention",
                   help="attention kernel (alone: fa1, FlashAttention-1)")
    g.add_argument("--schedule", choices=list(PAR_CHOICES["schedule"]))
    g.add_argument("--recompute", choices=list(PAR_CHOICES["recompute"]))
    g.add_argument("--zero3-impl", choices=list(PAR_CHOICES["zero3_impl"]), dest="zero3_impl",
                   help="how ZeRO-3 runs: fsdp (prefetched units, default) or deepspeed "
                        "(DeepSpeed 2021: serial per-tensor collectives)")


def _spec_from_args(a) -> dict:
    spec = {"model": a.model}
    for k in ("system", "nodes", "device"):
        if getattr(a, k, None) is not None:
            spec[k] = getattr(a, k)
    spec["parallelism"] = {f: getattr(a, f) for f in _PAR_FIELDS
                           if getattr(a, f, None) is not None}
    return spec


# workload sizes: scalar inputs of the compiled functions, never a static switch, so a
# question differing only in them uses the same executables
_WORKLOAD_OPTIONS = ("--global-batch", "--seq-len", "--batch", "--prompt-len", "--gen-len")


def _question_file(a) -> Path | None:
    """Where the export cache notes which stored executables this command line used (None
    without an export cache); the workload sizes are left out of the name, so a later
    process asking the same question, or the same one with other sizes, starts loading them
    at once, in the background (:func:`jaxmodel.batching.prefetch_executables`)."""
    from jaxmodel.process import export_cache_dir
    d = export_cache_dir()
    argv = getattr(a, "argv", None)
    if d is None or argv is None:
        return None
    shape, skip = [], False
    for tok in argv:
        name = tok.split("=")[0]
        shape.append("#" if skip else name + "=#" if "=" in tok and name in _WORKLOAD_OPTIONS
                     else tok)
        skip = tok in _WORKLOAD_OPTIONS
    import hashlib
    return d / "questions" / f"{hashlib.sha1(repr(shape).encode()).hexdigest()}.txt"


def _predict_xla_flags() -> None:
    """Add :data:`jaxmodel.batching.ONE_SHOT_COMPILE_OPTIONS` to ``XLA_FLAGS`` where they
    can still act (JAX's backend not started; XLA reads the variable then) and the user set
    none of them: a one-configuration question compiles in about half the CPU time (24 ->
    16 s of CPU for a Llama-2-13B training step on an empty cache with the elemental
    emitters, and LLVM at -O0 another 1.6 s per big graph) with the same numbers
    (experiments/bench_predict.py compares them with the library's). The compilation caches
    key on ``XLA_FLAGS``, so these executables are kept apart."""
    from jaxmodel.batching import ONE_SHOT_COMPILE_OPTIONS, add_xla_flags
    from jaxmodel.process import _cli_process
    if _cli_process():         # in-process use: leave the host program's compiler alone
        add_xla_flags(ONE_SHOT_COMPILE_OPTIONS)


def cmd_predict(a) -> Any:
    from jaxmodel import batching
    _predict_xla_flags()
    question = _question_file(a)
    if question is not None and question.is_file():
        batching.prefetch_executables(question.read_text().split("\n"))
    with batching.recording_executables() as paths:
        result = _predict(a)
    if question is not None:
        used = "\n".join(str(p) for p in paths)
        if not question.is_file() or question.read_text() != used:
            batching.atomic_write(question, used.encode())
    return result


def _predict(a) -> Any:
    import jaxmodel as jm
    spec = _spec_from_args(a)
    if a.phase == "train":
        spec["args"] = {"global_batch": a.global_batch, "seq_len": a.seq_len}
        fn = jm.train_step
        if a.global_batch is None:               # 8 sequences per data-parallel replica
            spec["args"]["global_batch"] = 1.0
            args, _ = build_call(fn, spec)
            spec["args"]["global_batch"] = 8.0 * float(args[2].dp) * float(
                args[2].micro_batch)
    else:
        spec["args"] = {"batch": a.batch, "prompt_len": a.prompt_len, "gen_len": a.gen_len}
        fn = jm.inference
    if a.precision:
        spec["args"]["precision"] = a.precision
    if getattr(a, "runtime", None):
        if a.phase == "train":
            raise ValueError("--runtime applies to serving (prefill, decode, inference)")
        spec["args"]["runtime"] = a.runtime
    args, kwargs = build_call(fn, spec)
    lora = getattr(a, "lora_rank", None)
    if lora is not None or getattr(a, "lora_base", None):
        if a.phase != "train":
            raise ValueError("--lora-rank/--lora-base apply to training (predict train)")
        kwargs["finetune"] = jm.lora(16.0 if lora is None else lora, a.lora_modules,
                                     a.lora_base)
    raw = fn(*args, **kwargs)
    res = to_jsonable(raw)
    res.update(_energy_lines(a, args, kwargs, raw, spec))
    head = {"phase": a.phase, "system": args[0].name, "model": args[1].name,
            "parallelism": to_jsonable(args[2])}
    if a.phase == "train":
        head["global_batch"] = float(spec["args"]["global_batch"])
    if a.phase == "prefill":
        head["latency_s"] = res.get("ttft_s")
    elif a.phase == "decode":
        head["latency_s"] = res.get("tpot_s")
    res["memory_capacity_bytes"] = float(args[0].device.mem_capacity)
    if a.phase == "train":
        _print_memory_table(res)
    return {**head, **res}


def _print_memory_table(res: Mapping) -> None:
    """The training memory per device by term (GiB, :func:`jaxmodel.memory_breakdown`) as a
    small table on stderr; the JSON on stdout carries the same bytes under ``memory``."""
    import jaxmodel as jm
    mem = res.get("memory")
    if not isinstance(mem, Mapping) or any(k not in mem for k in jm.TRAIN_MEMORY_TERMS):
        return
    gib = jm.memory_breakdown({k: float(mem[k]) for k in jm.TRAIN_MEMORY_TERMS})
    cap = float(res.get("memory_capacity_bytes", 0.0)) / 2**30
    lines = ["memory per device (GiB):"]
    lines += [f"  {k:<18s}{float(v):9.2f}" for k, v in gib.items()]
    if cap > 0:
        lines.append(f"  {'capacity':<18s}{cap:9.2f}")
    print("\n".join(lines), file=sys.stderr)


def _energy_lines(a, args, kwargs, raw, spec) -> dict:
    """``joules_per_token`` (per trained / generated token, board energy of all devices) and
    ``power_w_per_gpu`` of a prediction (:mod:`jaxmodel.energy`); none for LoRA steps."""
    import jaxmodel as jm
    if kwargs.get("finetune") is not None:
        return {}
    system, model, par = args[:3]
    prec = kwargs.get("precision")
    if a.phase == "train":
        e = jm.train_energy(system, model, par, raw, prec)
    else:
        w = spec["args"]
        e = jm.inference_energy(system, model, par, raw, float(w["batch"]),
                                float(w["prompt_len"]), float(w["gen_len"]), prec,
                                kwargs.get("runtime"))
    return to_jsonable({"joules_per_token": e.joules_per_token, "power_w_per_gpu": e.power_w,
                        "power_limited": e.power_limited})


SWEEP_KEYS = ("function", "system", "nodes", "device", "model", "parallelism", "par", "args",
              "grid", "chunk")
CODESIGN_KEYS = ("system", "nodes", "device", "model", "parallelism", "workload", "codesign",
                 "bounds", "init")
CODESIGN_OPTIONS = {"objective": str, "steps": int, "n_starts": int, "learning_rate": float,
                    "integer": list, "cost_cap_usd": float, "soft": float, "seed": int}


def load_spec(path: str, known: Sequence[str] = ()) -> dict:
    """Read a TOML spec; with ``known``, unknown top-level keys are rejected (closest named)."""
    import hw_db
    p = Path(path)
    if not p.exists():
        raise ValueError(f"spec file {path!r} does not exist")
    if p.is_dir():
        raise ValueError(f"spec file {path!r} is a directory")
    spec = hw_db.load_toml(p)
    if known:
        import difflib
        for k in spec:
            if k not in known:
                close = difflib.get_close_matches(k, known, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ValueError(f"{path}: unknown key '{k}'{hint}; known: {list(known)}")
    if "nodes" in spec and (isinstance(spec["nodes"], bool) or not isinstance(spec["nodes"],
                                                                              int)):
        raise ValueError(f"{path}: 'nodes' must be an integer >= 1, got {spec['nodes']!r}")
    return spec


def _number(where: str, v, integer: bool = False, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{where} must be a finite number, got {v!r}")
    if integer and v != round(v):
        raise ValueError(f"{where} must be an integer, got {v!r}")
    if positive and v <= 0:
        raise ValueError(f"{where} must be > 0, got {v!r}")
    return float(v)


def check_codesign_spec(spec: Mapping, path: str) -> None:
    """Types and shapes of a co-design spec's tables (ranges are checked by the loaders)."""
    for table in ("codesign", "bounds", "init", "workload", "parallelism"):
        if table in spec and not isinstance(spec[table], Mapping):
            raise ValueError(f"{path}: [{table}] must be a table, got {spec[table]!r}")
    for k, v in dict(spec.get("codesign", {})).items():
        if k not in CODESIGN_OPTIONS:
            import difflib
            close = difflib.get_close_matches(k, list(CODESIGN_OPTIONS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"{path}: unknown [codesign] key '{k}'{hint}; known: "
                             f"{list(CODESIGN_OPTIONS)}")
        kind = CODESIGN_OPTIONS[k]
        if kind is str and not isinstance(v, str):
            raise ValueError(f"{path}: [codesign] {k} must be a string, got {v!r}")
        if kind is list and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise ValueError(f"{path}: [codesign] {k} must be a list of knob names, got {v!r}")
        if kind in (int, float):
            _number(f"{path}: [codesign] {k}", v, integer=kind is int, positive=k != "seed")
    for k, v in dict(spec.get("bounds", {})).items():
        if not isinstance(v, list) or len(v) != 2:
            raise ValueError(f"{path}: [bounds] {k} must be [lo, hi], got {v!r}")
        lo = _number(f"{path}: [bounds] {k} lower bound", v[0], positive=True)
        hi = _number(f"{path}: [bounds] {k} upper bound", v[1], positive=True)
        if lo >= hi:
            raise ValueError(f"{path}: [bounds] {k} = {v!r} needs lo < hi")
    for k, v in dict(spec.get("init", {})).items():
        _number(f"{path}: [init] {k}", v, positive=True)
    for k, v in dict(spec.get("workload", {})).items():
        _number(f"{path}: [workload] {k}", v, integer=True, positive=True)


def cmd_sweep(a) -> Any:
    import jaxmodel as jm
    spec = load_spec(a.spec, SWEEP_KEYS)
    if "function" not in spec:
        raise ValueError(f"{a.spec}: missing 'function' (e.g. function = \"inference\")")
    fn = _public_fn(spec["function"])
    args, kwargs = build_call(fn, spec)
    chunk = _number(f"{a.spec}: chunk", spec.get("chunk", 4096), integer=True, positive=True)
    grid = spec.get("grid")
    if grid is not None and not isinstance(grid, Mapping):
        raise ValueError(f"{a.spec}: [grid] must be a table, got {grid!r}")
    return jm.sweep(fn, *args, grid=grid, chunk=int(chunk), progress=not a.quiet, **kwargs)


def _step_options(items) -> dict:
    """``["dp_overlap=0,1", "tp_overlap=0,1"]`` → ``{"dp_overlap": [0.0, 1.0], ...}``."""
    from jaxmodel.types import validate_knobs
    out = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        try:
            vals = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            vals = []
        if not sep or not name.strip() or not vals:
            raise ValueError(f"--step-option {item!r}: expected NAME=V1,V2,... with numbers")
        for v in vals:
            validate_knobs("--step-option", **{name.strip(): v})
        out[name.strip()] = vals
    return out


def cmd_search(a) -> Any:
    import hw_db
    import jaxmodel as jm
    system = _load_system(a.system, a.nodes, a.device)
    model = hw_db.model(a.model)
    n = int(a.n_devices or round(float(system.n_devices)))
    if n < 1:
        raise ValueError(f"--n-devices must be >= 1, got {n}")
    df = jm.search_parallelism(system, model, n, a.global_batch, a.seq_len,
                               progress=not a.quiet,
                               step_options=_step_options(a.step_option) or None,
                               precision=a.precision.split(",") if a.precision else None)
    n_eval = df.attrs.get("n_evaluated")
    if not a.quiet:
        print(f"evaluated {n_eval:,} configurations in {df.attrs.get('wall_s', 0):.1f} s",
              file=sys.stderr)
    if getattr(a, "export", None):
        return _search_export(a, df, system, model)
    return df.head(a.top) if a.top else df


# --------------------------------------------------------------------------------------------
# serve-search: serving deployments under TTFT / TPOT limits
# --------------------------------------------------------------------------------------------
def _serve_search_parser(add) -> None:
    p = add("serve-search", "search serving deployments (continuous batching, chunked prefill, "
            "disaggregated prefill/decode) under TTFT/TPOT limits; prints the Pareto front",
            "csv")
    _hardware_args(p)
    p.add_argument("--n-devices", type=int, dest="n_devices",
                   help="devices (default: the system's)")
    p.add_argument("--isl", type=float, default=1024, help="mean prompt tokens per request")
    p.add_argument("--osl", type=float, default=256, help="mean output tokens per request")
    p.add_argument("--ttft-slo", type=float, default=float("inf"), dest="ttft_slo",
                   help="limit on the mean time to first token, s")
    p.add_argument("--tpot-slo", type=float, default=float("inf"), dest="tpot_slo",
                   help="limit on the mean time per output token, s")
    p.add_argument("--precision", default="bf16,fp8",
                   help="comma-separated precision presets to search (default bf16,fp8)")
    p.add_argument("--runtime", default="pytorch,trtllm,vllm",
                   help="comma-separated runtime presets to search (default all three)")
    p.add_argument("--p99", action="store_true",
                   help="the limits bound the 99th percentiles instead of the means")
    p.add_argument("--no-disagg", action="store_true", dest="no_disagg",
                   help="aggregated serving only")
    p.add_argument("--all", action="store_true", dest="all_rows",
                   help="every evaluated configuration (with a 'pareto' column)")
    p.add_argument("--plot", help="write a PNG of the front here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_serve_search, table=True)


def cmd_serve_search(a) -> Any:
    import hw_db
    import jaxmodel as jm
    if a.device:
        raise ValueError("serve-search needs --system (a device alone has no network)")
    for name in ("isl", "osl"):
        v = getattr(a, name)
        if not (v >= 1 and v == int(v)):
            raise ValueError(f"--{name} must be an integer >= 1, got {v:g}")
    for name in ("ttft_slo", "tpot_slo"):
        if not getattr(a, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds, got "
                             f"{getattr(a, name):g}")
    system = _load_system(a.system, a.nodes, None)
    model = hw_db.model(a.model)
    df = jm.search_serving(system, model, a.n_devices, a.isl, a.osl,
                           ttft_slo_s=a.ttft_slo, tpot_slo_s=a.tpot_slo,
                           precision=[x for x in a.precision.split(",") if x],
                           runtime=[x for x in a.runtime.split(",") if x],
                           disaggregated=not a.no_disagg, full=a.all_rows or bool(a.plot),
                           progress=not a.quiet, tail=a.p99)
    if a.plot:
        from jaxmodel.plots import serving_plot
        serving_plot(df, path=a.plot, title=f"{model.name} on {df.attrs['n_devices']} × "
                                            f"{system.device.name}")
        if not a.all_rows:
            attrs = df.attrs
            df = df[df["pareto"]].sort_values("tokens_per_s_per_user",
                                              kind="stable").reset_index(drop=True)
            df.attrs.update(attrs)
    if not a.quiet:
        print(f"evaluated {df.attrs['n_evaluated']:,} configurations in "
              f"{df.attrs['wall_s']:.1f} s; {df.attrs['n_meeting_slo']:,} meet the limits",
              file=sys.stderr)
    return df


# --------------------------------------------------------------------------------------------
# serve: offline or SLO-bounded throughput of one deployment
# --------------------------------------------------------------------------------------------
def _serve_parser(add) -> None:
    p = add("serve", "throughput of one serving deployment: offline (every request queued, "
            "trtllm-bench / MLPerf Offline) or the highest Poisson rate meeting p99 TTFT/TPOT "
            "limits")
    p.add_argument("mode", choices=["offline", "slo"])
    _hardware_args(p)
    g = p.add_argument_group("parallelism (default: tp = GPUs per node when it divides the "
                             "heads, pp = 1, dp = the devices left)")
    for f in ("dp", "tp", "pp", "ep"):
        g.add_argument(f"--{f}", type=float, dest=f, default=None)
    p.add_argument("--isl", type=float, default=1024, help="prompt tokens per request")
    p.add_argument("--osl", type=float, default=256, help="output tokens per request")
    p.add_argument("--precision", help="precision preset (default bf16)")
    p.add_argument("--runtime", default="trtllm_v1",
                   help="runtime preset: trtllm_v1 (default), vllm_v1, sglang, trtllm, vllm "
                        "(its scheduler defaults fill the settings not given)")
    p.add_argument("--max-batch", type=float, dest="max_batch",
                   help="sequences per replica (max_batch_size / max_num_seqs)")
    p.add_argument("--max-tokens", type=float, dest="max_tokens",
                   help="offline: tokens per iteration (max_num_tokens)")
    p.add_argument("--chunk", type=float, help="slo: chunked-prefill tokens (0 = off)")
    p.add_argument("--ttft-p99", type=float, dest="ttft_p99", help="slo: p99 TTFT limit, s")
    p.add_argument("--tpot-p99", type=float, dest="tpot_p99", help="slo: p99 TPOT limit, s")
    s = p.add_argument_group("speculative decoding (jaxmodel.speculative)")
    s.add_argument("--speculative", choices=["mtp", "eagle", "draft_model"],
                   help="proposer of draft tokens (default: none)")
    s.add_argument("--draft-k", type=float, dest="draft_k", default=1.0,
                   help="draft tokens per verification step (default 1)")
    s.add_argument("--accept", type=float, default=0.8,
                   help="per-token acceptance rate in [0, 1] (default 0.8)")
    s.add_argument("--draft-model", dest="draft_model",
                   help="hw_db model of the draft (--speculative draft_model)")
    p.set_defaults(func=cmd_serve, table=False)


def cmd_serve(a) -> Any:
    import jaxmodel as jm
    for name in ("isl", "osl"):
        v = getattr(a, name)
        if not (v >= 1 and v == int(v)):
            raise ValueError(f"--{name} must be an integer >= 1, got {v:g}")
    spec = {"model": a.model, "parallelism": {f: getattr(a, f) for f in ("dp", "tp", "pp",
                                                                          "ep")
                                              if getattr(a, f, None) is not None}}
    for k in ("system", "nodes", "device"):
        if getattr(a, k, None) is not None:
            spec[k] = getattr(a, k)
    kw = dict(precision=a.precision, runtime=a.runtime, max_batch=a.max_batch)
    if (getattr(a, "speculative", None) == "draft_model") != (
            getattr(a, "draft_model", None) is not None):
        raise ValueError("--draft-model goes with --speculative draft_model (and only with it)")
    if getattr(a, "speculative", None):
        import hw_db
        kw["speculative"] = jm.Speculative(
            a.speculative, k=a.draft_k, accept=a.accept,
            draft=hw_db.model(a.draft_model) if a.draft_model else None)
    if a.mode == "offline":
        if a.ttft_p99 is not None or a.tpot_p99 is not None or a.chunk is not None:
            raise ValueError("--ttft-p99/--tpot-p99/--chunk apply to 'serve slo'")
        fn = jm.offline_throughput
        kw["max_tokens"] = a.max_tokens
    else:
        if a.ttft_p99 is None or a.tpot_p99 is None:
            raise ValueError("'serve slo' needs --ttft-p99 and --tpot-p99 (seconds)")
        if a.max_tokens is not None:
            raise ValueError("--max-tokens applies to 'serve offline'")
        fn = jm.slo_throughput
        kw.update(ttft_p99_s=a.ttft_p99, tpot_p99_s=a.tpot_p99, chunk=a.chunk)
    spec["args"] = {"isl": a.isl, "osl": a.osl}
    args, _ = build_call(fn, spec)
    res = to_jsonable(fn(*args, **kw))
    out = {"mode": a.mode, "system": args[0].name, "model": args[1].name,
           "parallelism": to_jsonable(args[2]), "isl": a.isl, "osl": a.osl,
           "runtime": a.runtime, **res}
    if "speculative" in kw:
        from jaxmodel.speculative import tokens_per_step
        out["speculative"] = {"method": a.speculative, "k": a.draft_k, "accept": a.accept,
                              "tokens_per_step": float(tokens_per_step(kw["speculative"]))}
    return out


def cmd_codesign(a) -> Any:
    from jaxmodel.search import objectives
    spec = load_spec(a.spec, CODESIGN_KEYS)
    check_codesign_spec(spec, a.spec)
    if "system" in spec and "device" in spec:
        raise ValueError(f"{a.spec}: give either system or device, not both")
    return objectives.run_spec(spec, steps=a.steps)


def cmd_cost(a) -> Any:
    import hw_db
    import jaxmodel as jm
    out: dict = {}
    if a.nodes is not None and not a.system:
        raise ValueError("--nodes needs --system")
    if a.device or not a.system:
        dev = hw_db.device(a.device or "a100_80gb")
        out["device"] = dev.name
        out["die_area_mm2"] = to_jsonable(jm.die_area(dev))
        for name in ("die_cost", "device_cost"):
            if hasattr(jm, name):
                out[name] = to_jsonable(getattr(jm, name)(dev))
    if a.system:
        system = hw_db.system(a.system, nodes=a.nodes)
        out["system"] = system.name
        for name in ("system_cost", "tco"):
            if hasattr(jm, name):
                out[name] = to_jsonable(getattr(jm, name)(system))
    return out


# --------------------------------------------------------------------------------------------
# --distributed: sweep / search / serve-search / codesign as one multi-process jax.distributed
# job (jaxmodel.distributed); the answer is written by process 0 only
# --------------------------------------------------------------------------------------------
DISTRIBUTED_COMMANDS = ("sweep", "search", "serve-search", "codesign")


def _cmd_distributed(func):
    """``func`` (a command) run inside a ``jax.distributed`` job when ``--distributed`` is
    given: the job is joined first (flags, else ``JAX_COORDINATOR_ADDRESS`` /
    ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``, else SLURM / Open MPI / Kubernetes as JAX
    detects them); processes other than 0 compute their share quietly and write nothing."""
    def run(a):
        if not a.distributed:
            return func(a)
        from jaxmodel import distributed
        distributed.initialize(a.coordinator, a.num_processes, a.process_id)
        if not distributed.is_main():
            a.emit = False
            if hasattr(a, "quiet"):
                a.quiet = True
        return func(a)
    run.__name__ = getattr(func, "__name__", "run")
    return run


def _distributed_parser(sub) -> None:
    for name in DISTRIBUTED_COMMANDS:
        p = sub.choices[name]
        g = p.add_argument_group(
            "multi-process run", "split the design space over the processes of a "
            "jax.distributed job (start the same command on every process); results are "
            "gathered and written by process 0")
        g.add_argument("--distributed", action="store_true",
                       help="join a jax.distributed job (coordinator, count and id from the "
                            "flags below, JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / "
                            "JAX_PROCESS_ID, or SLURM / Open MPI / Kubernetes)")
        g.add_argument("--coordinator", help="coordinator address host:port (process 0's)")
        g.add_argument("--num-processes", type=int, dest="num_processes",
                       help="processes in the job")
        g.add_argument("--process-id", type=int, dest="process_id",
                       help="this process's index, 0 .. num-processes - 1")
        p.set_defaults(func=_cmd_distributed(p.get_default("func")))


# --------------------------------------------------------------------------------------------
# ui: the browser explorer
# --------------------------------------------------------------------------------------------
def _cmd_ui(a) -> Any:
    """Serve the explorer (jaxmodel.ui) on 127.0.0.1 until Ctrl-C."""
    from jaxmodel.ui import serve
    if not 0 <= a.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {a.port}")
    serve(a.host, a.port, open_browser=a.open, quiet=not a.verbose)
    return {"ui": "stopped"}


def _ui_parser(add) -> None:
    p = add("ui", "the browser explorer: Predict, What-if sliders, Search fronts, Compare "
            "(a local web app)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free)")
    p.add_argument("--open", action="store_true", help="open it in the default browser")
    p.add_argument("--verbose", action="store_true", help="log every request")
    p.set_defaults(func=_cmd_ui, table=False)


EXAMPLES = {
    "list": "jaxmodel list models",
    "predict": "jaxmodel predict prefill --system hgx_a100_4gpu --model llama2-13b --tp 4 "
               "--batch 8 --prompt-len 512 --gen-len 64",
    "sweep": "jaxmodel sweep examples/sweep_inference.toml --quiet --out sweep.csv",
    "search": "jaxmodel search --system hgx_a100_4gpu --model gpt2-medium --global-batch 64 "
              "--seq-len 1024 --top 5 --quiet",
    "codesign": "jaxmodel codesign examples/codesign.toml --steps 10",
    "cost": "jaxmodel cost --device a100_80gb --system dgx_a100",
    "serve": "jaxmodel serve offline --system dgx_h100 --model llama3-70b --tp 2 --isl 1000 "
             "--osl 1000 --precision fp8 --runtime trtllm_v1",
    "serve-search": "jaxmodel serve-search --system dgx_h100 --model llama3-8b --isl 1024 "
                    "--osl 256 --ttft-slo 1.0 --tpot-slo 0.05 --runtime trtllm,vllm --quiet",
    "ui": "jaxmodel ui --port 8765 --open",
}


# --------------------------------------------------------------------------------------------
# export: the launch command of a plan (jaxmodel.export_plan)
# --------------------------------------------------------------------------------------------
EXAMPLES["export"] = ("jaxmodel export train --system dgx_h100 --nodes 64 --model "
                      "llama3.1-405b --tp 8 --pp 8 --interleave 8 --schedule interleaved --sp "
                      "--global-batch 2048 --seq-len 8192 --precision fp8 --framework megatron")


def _export_parser(add) -> None:
    p = add("export", "the launch command of a plan: Megatron-LM / TorchTitan arguments for "
            "training, vllm / sglang / trtllm-serve command lines for serving "
            "(jaxmodel.export_plan; every flag checked against a named framework release)")
    p.add_argument("kind", choices=["train", "serve"])
    _hardware_args(p)
    _par_args(p)
    p.add_argument("--framework", help="train: megatron (default), torchtitan; serve: vllm "
                   "(default), sglang, trtllm")
    p.add_argument("--precision", help="precision preset (default bf16)")
    t = p.add_argument_group("train (as predict train)")
    t.add_argument("--global-batch", type=float, default=None, dest="global_batch",
                   help="sequences per step (default 8·dp·micro_batch)")
    t.add_argument("--seq-len", type=float, default=2048, dest="seq_len")
    t.add_argument("--dp-overlap", type=float, dest="dp_overlap",
                   help="1 (default) overlapped DP collectives, 0 serial")
    t.add_argument("--tp-overlap", type=float, dest="tp_overlap",
                   help="1 = --tp-comm-overlap, 0 (default) serial")
    t.add_argument("--recipe", help="a jaxmodel recipe name (jaxmodel.RECIPES)")
    s = p.add_argument_group("serve (as serve)")
    s.add_argument("--runtime", help="runtime preset whose scheduler defaults fill the "
                   "settings not given (default: the framework's)")
    s.add_argument("--max-batch", type=float, dest="max_batch",
                   help="sequences per replica")
    s.add_argument("--max-tokens", type=float, dest="max_tokens",
                   help="tokens per iteration")
    s.add_argument("--chunk", type=float, help="chunked-prefill tokens (0 = off)")
    s.add_argument("--kv-dtype", dest="kv_dtype", choices=["fp8", "bf16", "fp16", "auto"],
                   help="KV-cache type (default: the precision's)")
    p.add_argument("--write", metavar="DIR", help="also write the command (launch.sh) and its "
                   "files into DIR")
    p.set_defaults(func=cmd_export, table=False)


def _write_launch(cfg, directory: str) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in cfg.files.items():
        (d / name).write_text(text)
    (d / "launch.sh").write_text("#!/bin/sh\n" + "".join(f"# {n}\n" for n in cfg.notes)
                                 + cfg.command + "\n")
    print(f"wrote {d / 'launch.sh'}" + "".join(f", {d / n}" for n in cfg.files),
          file=sys.stderr)


def _launch_result(cfg) -> dict:
    return {"framework": cfg.framework, "version": cfg.version, "command": cfg.command,
            "files": dict(cfg.files), "notes": list(cfg.notes),
            "flags": {k: (list(v) if isinstance(v, tuple) else v)
                      for k, v in cfg.flags.items()}}


def cmd_export(a) -> Any:
    import hw_db
    import jaxmodel as jm
    from jaxmodel.export import SERVE_FRAMEWORKS, TRAIN_FRAMEWORKS, framework_name
    fw = framework_name(a.framework or ("megatron" if a.kind == "train" else "vllm"))
    allowed = TRAIN_FRAMEWORKS if a.kind == "train" else SERVE_FRAMEWORKS
    if fw not in allowed:
        raise ValueError(f"--framework {a.framework}: 'export {a.kind}' takes one of "
                         f"{list(allowed)}")
    given = {k for k in ("global_batch", "dp_overlap", "tp_overlap", "recipe", "runtime",
                         "max_batch", "max_tokens", "chunk", "kv_dtype")
             if getattr(a, k, None) is not None}
    wrong = given & ({"runtime", "max_batch", "max_tokens", "chunk", "kv_dtype"}
                     if a.kind == "train" else {"global_batch", "dp_overlap", "tp_overlap",
                                                "recipe"})
    if wrong:
        raise ValueError(f"{sorted('--' + w.replace('_', '-') for w in wrong)} do not apply "
                         f"to 'export {a.kind}'")
    system = _load_system(a.system, a.nodes, a.device)
    model = hw_db.model(a.model)
    spec = _spec_from_args(a)["parallelism"]
    par = build_parallelism(_default_tp(system, model, spec), float(system.n_devices))
    if a.kind == "train":
        gb = a.global_batch
        if gb is None:                           # 8 sequences per data-parallel replica
            gb = 8.0 * float(par.dp) * float(par.micro_batch)
        cfg = jm.export_plan(par, framework=fw, model=model, global_batch=gb,
                             seq_len=a.seq_len, precision=a.precision,
                             dp_overlap=a.dp_overlap, tp_overlap=a.tp_overlap,
                             recipe=a.recipe, system=system)
    else:
        cfg = jm.export_plan(par, framework=fw, model=model, precision=a.precision,
                             max_batch=a.max_batch, max_tokens=a.max_tokens, chunk=a.chunk,
                             kv_dtype=a.kv_dtype, runtime=a.runtime)
    if a.write:
        _write_launch(cfg, a.write)
    return _launch_result(cfg)


def _search_export_option(p) -> None:
    p.add_argument("--export", metavar="FRAMEWORK", help="print the launch command of the "
                   "best feasible plan instead of the table (megatron or torchtitan)")


def _search_export(a, df, system, model) -> Any:
    """The launch command of the fastest feasible row of a parallelism search."""
    import jaxmodel as jm
    ok = df[np.isfinite(df["step_time_s"].to_numpy(float))] if len(df) else df
    if not len(ok):
        raise ValueError("search --export: no feasible plan to export")
    cfg = jm.export_plan(ok.iloc[0], framework=a.export, model=model,
                         global_batch=a.global_batch, seq_len=a.seq_len, system=system)
    if not any(str(t).startswith("--format") for t in getattr(a, "argv", ()) or ()):
        a.format = "json"                        # one result, not a table
    return {"step_time_s": float(ok.iloc[0]["step_time_s"]), **_launch_result(cfg)}


# ---- explain: elasticities and the bottleneck view of one prediction ------------------------
EXAMPLES.setdefault("explain", "jaxmodel explain predict train --system dgx_h100 --nodes 8 "
                    "--model llama3-70b --tp 8 --pp 4 --global-batch 256 --seq-len 4096 "
                    "--plot explain.png")


def _explain_parser(add) -> None:
    p = add("explain", "why and what if: elasticities of one prediction with respect to every "
            "hardware knob, and its bottleneck view", "csv")
    p.add_argument("what", choices=["predict", "serve"],
                   help="predict: a training step or a request batch (as jaxmodel predict); "
                        "serve: a request batch (predict inference)")
    p.add_argument("phase", nargs="?", default=None,
                   choices=["train", "prefill", "decode", "inference"],
                   help="predict's phase (default train; serve: inference)")
    _hardware_args(p)
    _par_args(p)
    p.add_argument("--global-batch", type=float, default=None, dest="global_batch")
    p.add_argument("--seq-len", type=float, default=2048, dest="seq_len")
    p.add_argument("--batch", type=float, default=8)
    p.add_argument("--prompt-len", type=float, default=2048, dest="prompt_len")
    p.add_argument("--gen-len", type=float, default=1024, dest="gen_len")
    p.add_argument("--precision")
    p.add_argument("--runtime")
    p.add_argument("--top", type=int, default=8, help="knobs per metric (0 = all)")
    p.add_argument("--plot", help="bar chart of the elasticities (PNG)")
    p.set_defaults(func=_cmd_explain, table=True)


def _explain_text(x, top: int) -> str:
    lines = []
    for m, v in x.metrics.items():
        lines.append(f"{m} = {v:.4g}   (elasticity d ln {m} / d ln knob)")
        sub = x.table[x.table.metric == m]
        for _, r in (sub if top == 0 else sub.head(top)).iterrows():
            flag = "  kink: one-sided {:+.3f} / {:+.3f}".format(
                r.fd_backward, r.fd_forward) if r.kink else ""
            lines.append(f"  {r.knob:<42s} {r.elasticity:+8.3f}   (value {r.value:.4g}){flag}")
    views = x.bottleneck if "prefill" in x.bottleneck else {"step": x.bottleneck}
    for ph, g in views.items():
        tot = sum(g.values()) or 1.0
        parts = ", ".join(f"{k} {v:.4g} s ({100 * v / tot:.0f} %)" for k, v in g.items() if v)
        lines.append(f"bottleneck ({ph}): {parts}")
    lines.append(f"power {x.power_w:.0f} W per GPU" + (" (power-limited)" if x.power_limited
                                                       else ""))
    if not x.feasible:
        from jaxmodel.numerics import reason_name
        lines.append(f"infeasible: {reason_name(x.reason)} (elasticities are 0)")
    return "\n".join(lines) + "\n"


def _cmd_explain(a) -> Any:
    _predict_xla_flags()
    import jaxmodel as jm
    phase = a.phase or ("train" if a.what == "predict" else "inference")
    if a.what == "serve" and phase == "train":
        raise ValueError("explain serve: phase must be prefill, decode or inference")
    spec = _spec_from_args(a)
    if phase == "train":
        if a.runtime:
            raise ValueError("--runtime applies to serving (prefill, decode, inference)")
        spec["args"] = {"global_batch": a.global_batch or 1.0, "seq_len": a.seq_len}
        args, _ = build_call(jm.train_step, spec)
        gb = a.global_batch or 8.0 * float(args[2].dp) * float(args[2].micro_batch)
        x = jm.explain_train(*args[:3], gb, a.seq_len, precision=a.precision)
    else:
        spec["args"] = {"batch": a.batch, "prompt_len": a.prompt_len, "gen_len": a.gen_len}
        args, _ = build_call(jm.inference, spec)
        x = jm.explain_serve(*args[:3], a.batch, a.prompt_len, a.gen_len,
                             precision=a.precision, runtime=a.runtime)
    sys.stderr.write(_explain_text(x, a.top))
    if a.plot:
        from jaxmodel.plots import sensitivity_plot
        sensitivity_plot(x.table, top=a.top or 10, path=a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    tab = x.table if a.top == 0 else x.table.groupby("metric", sort=False).head(a.top)
    return tab.reset_index(drop=True)


def parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    top = argparse.ArgumentParser(
        prog="jaxmodel", description="Vectorised, differentiable performance and cost model "
        "of LLM training and inference on accelerator systems.",
        epilog="example:\n  " + EXAMPLES["predict"],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help, fmt="json"):
        p = sub.add_parser(name, help=help, epilog=f"example:\n  {EXAMPLES[name]}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--format", choices=["json", "csv"], default=fmt)
        p.add_argument("--out", help="write to this file (.json/.csv/.parquet) instead of "
                                     "stdout")
        return p

    p = add("list", "list hw_db devices, systems and models (with total and active parameters)")
    p.add_argument("kind", nargs="?", default="all",
                   choices=["all", "devices", "systems", "models"])
    p.set_defaults(func=cmd_list, table=False)

    p = add("predict", "predict one training step or inference run")
    p.add_argument("phase", choices=["train", "prefill", "decode", "inference"])
    _hardware_args(p)
    _par_args(p)
    p.add_argument("--global-batch", type=float, default=None, dest="global_batch",
                   help="sequences per step (train; default 8·dp·micro_batch)")
    p.add_argument("--seq-len", type=float, default=2048, dest="seq_len")
    p.add_argument("--batch", type=float, default=8, help="sequences (inference)")
    p.add_argument("--prompt-len", type=float, default=2048, dest="prompt_len")
    p.add_argument("--gen-len", type=float, default=1024, dest="gen_len")
    p.add_argument("--precision", help="numeric precision preset: bf16 (default), fp8, ... "
                   "(jaxmodel.precisions.PRESETS)")
    p.add_argument("--runtime", help="serving runtime: pytorch (default, eager), trtllm, "
                   "trtllm_v06, vllm (jaxmodel.serving_runtime.PRESETS)")
    p.add_argument("--lora-rank", type=float, dest="lora_rank",
                   help="train: LoRA fine-tuning with adapters of this rank (frozen base)")
    p.add_argument("--lora-modules", default="all", dest="lora_modules",
                   help="train: adapted modules, comma-separated from q,k,v,o,gate,up,down "
                        "(default all)")
    p.add_argument("--lora-base", dest="lora_base",
                   help="train: storage of the frozen base, a precision preset (w4a16 = "
                        "QLoRA's 4-bit base; default the training precision)")
    p.set_defaults(func=cmd_predict, table=False)

    p = add("sweep", "sweep a design space from a TOML spec", "csv")
    p.add_argument("spec", help="TOML spec (function, hardware, model, [args], [grid])")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep, table=True)

    p = add("search", "search the best parallelism plan", "csv")
    _hardware_args(p)
    p.add_argument("--n-devices", type=int, dest="n_devices",
                   help="devices (default: the system's)")
    p.add_argument("--global-batch", type=float, default=1536, dest="global_batch")
    p.add_argument("--seq-len", type=float, default=2048, dest="seq_len")
    p.add_argument("--top", type=int, default=20, help="rows to print (0 = all)")
    p.add_argument("--precision", help="precision preset, or a comma-separated list to "
                   "search, e.g. bf16,fp8 (jaxmodel.precisions.PRESETS)")
    p.add_argument("--step-option", action="append", default=[], dest="step_option",
                   metavar="NAME=V1,V2",
                   help="also search a train_step option, e.g. dp_overlap=0,1 grad_bytes=2,4 "
                        "tp_overlap=0,1 (repeatable)")
    p.add_argument("--quiet", action="store_true")
    _search_export_option(p)
    p.set_defaults(func=cmd_search, table=True)

    p = add("codesign", "gradient co-design from a TOML spec")
    p.add_argument("spec", help="TOML spec with [codesign] and [bounds]")
    p.add_argument("--steps", type=int, help="override the spec's steps")
    p.set_defaults(func=cmd_codesign, table=False)

    p = add("cost", "die area, device and system cost")
    p.add_argument("--device", help="hw_db device name or TOML path")
    p.add_argument("--system", help="hw_db system name or TOML path")
    p.add_argument("--nodes", type=int)
    p.set_defaults(func=cmd_cost, table=False)

    _serve_parser(add)
    _serve_search_parser(add)
    _export_parser(add)
    _explain_parser(add)
    _ui_parser(add)
    _distributed_parser(sub)
    return top


def _check_args(a) -> None:
    """Argument combinations and paths, before any computation."""
    if a.command in ("predict", "search") and a.system and a.device:
        raise ValueError("--device and --system exclude each other (a system names its "
                         "device)")
    if getattr(a, "nodes", None) is not None and a.nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {a.nodes}")
    if a.command == "codesign" and a.steps is not None and a.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {a.steps}")
    if a.command == "search" and a.top is not None and a.top < 0:
        raise ValueError(f"--top must be >= 0, got {a.top}")
    check_out_path(a.out, a.table)


def _status(a, result) -> int:
    """1 (with the reason on stderr) when the requested answer is infeasible, else 0."""
    if _is_frame(result):
        if "feasible" in result.columns and len(result) and not result["feasible"].any():
            reasons = result["reason"].map(_reason_name).value_counts().to_dict() \
                if "reason" in result.columns else {}
            print(f"jaxmodel {a.command}: no feasible row ({len(result)} rows; reasons "
                  f"{reasons})", file=sys.stderr)
            return 1
        if a.command == "serve-search" and len(result) == 0:
            print("jaxmodel serve-search: no configuration meets the limits; relax "
                  "--ttft-slo / --tpot-slo or add devices", file=sys.stderr)
            return 1
        if a.command == "search" and len(result) == 0:
            print("jaxmodel search: no consistent plan for these devices and this model",
                  file=sys.stderr)
            return 1
        return 0
    if isinstance(result, Mapping):
        msg = explain_infeasible(result)
        if msg is None and a.command == "codesign" and result.get("value") == "inf":
            msg = "infeasible: no design within the bounds is feasible; widen [bounds]"
        if msg:
            print(f"jaxmodel {a.command}: {msg}", file=sys.stderr)
            return 1
    return 0


def main(argv: Sequence[str] | None = None, stdout=None) -> int:
    """Entry point of the ``jaxmodel`` console script; returns the exit status.

    0: answered; 1: answered, but the requested prediction is infeasible (reason on
    stderr); 2: an error in the arguments or input files (``jaxmodel: error: ...``).
    """
    stdout = stdout or sys.stdout
    a = parser().parse_args(argv)
    a.argv = tuple(sys.argv[1:] if argv is None else argv)
    try:
        _check_args(a)
        result = a.func(a)
        status = _status(a, result)
        if getattr(a, "emit", True):
            _emit(result, a.format, a.out, stdout)
    except ValueError as e:
        print(f"jaxmodel: error: {e}", file=sys.stderr)
        return 2
    except (TypeError, KeyError, IndexError, OSError, ImportError) as e:
        print(f"jaxmodel: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
