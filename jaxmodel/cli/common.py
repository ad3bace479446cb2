"""Parts every subcommand of the ``jaxmodel`` command shares: writing answers (JSON, CSV,
Parquet; :func:`check_out_path` before computing), building a public function's arguments from
a spec (:func:`build_call`), the hardware and parallelism options, and the help examples."""

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

from jaxmodel.plan_io import (DEFAULT_MODEL, DEFAULT_SYSTEM, PAR_CHOICES, build_parallelism,
                              to_jsonable)
from jaxmodel.plan_io import PAR_FIELDS as _PAR_FIELDS
from jaxmodel.plan_io import default_tp as _default_tp
from jaxmodel.plan_io import load_system as _load_system
from jaxmodel.plan_io import reason_label as _reason_name


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
    "export": "jaxmodel export train --system dgx_h100 --nodes 64 --model llama3.1-405b --tp 8 "
              "--pp 8 --interleave 8 --schedule interleaved --sp --global-batch 2048 "
              "--seq-len 8192 --precision fp8 --framework megatron",
    "explain": "jaxmodel explain predict train --system dgx_h100 --nodes 8 --model llama3-70b "
               "--tp 8 --pp 4 --global-batch 256 --seq-len 4096 --plot explain.png",
}
