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

Hardware and models are hw_db names or file paths (a device/system TOML, a HF config.json).
Output is JSON (default for single results) or CSV (default for tables); ``--format`` picks.

A sweep spec (TOML) names a public jaxmodel function and its arguments; the function's
parameter names decide how each argument is built (``system``, ``dev``/``device``, ``model``,
``par``; every other parameter comes from ``[args]``)::

    function = "inference"
    system = "hgx_a100_4gpu"     # or device = "a100_80gb" for device-level functions
    model = "gpt3-175b"
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
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

_PAR_FIELDS = ("dp", "tp", "pp", "sp", "ep", "micro_batch", "interleave", "schedule",
               "recompute", "zero", "flash_attention")


# --------------------------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------------------------
def to_jsonable(obj: Any) -> Any:
    """Plain-Python view of a result pytree (dataclasses, NamedTuples, dicts, arrays)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if "reason" in out and isinstance(out["reason"], int):
            from jaxmodel.numerics import REASONS
            out["reason_name"] = REASONS[out["reason"]] if out["reason"] < len(REASONS) else "?"
        return out
    if hasattr(obj, "_asdict"):
        return {k: to_jsonable(v) for k, v in obj._asdict().items()}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (str, type(None))):
        return obj
    arr = np.asarray(obj)
    if arr.dtype == bool:
        return arr.tolist()
    if np.issubdtype(arr.dtype, np.integer):
        return arr.tolist()
    if np.issubdtype(arr.dtype, np.number):
        vals = arr.astype(float)
        if vals.ndim == 0:
            v = float(vals)
            return v if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else None)
        return [to_jsonable(v) for v in vals]
    return str(obj)


def _emit(data: Any, fmt: str, out: str | None, stream) -> None:
    import pandas as pd
    if isinstance(data, pd.DataFrame):
        if "reason" in data.columns and "reason_name" not in data.columns:
            from jaxmodel.numerics import REASONS
            data = data.assign(reason_name=[REASONS[int(r)] if 0 <= int(r) < len(REASONS)
                                            else "?" for r in data["reason"]])
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


# --------------------------------------------------------------------------------------------
# Building arguments
# --------------------------------------------------------------------------------------------
def _load_system(name: str | None, nodes: int | None, device: str | None):
    import hw_db
    from jaxmodel.types import System
    if name:
        return hw_db.system(name, nodes=nodes)
    if device:
        return System(device=hw_db.device(device), levels=(), name=f"1x{device}")
    return hw_db.system("dgx_a100" if "dgx_a100" in hw_db.names("system")
                        else hw_db.names("system")[0], nodes=nodes)


def build_parallelism(values: Mapping, n_devices: float | None = None):
    """A :class:`jaxmodel.Parallelism` from a mapping; ``dp`` defaults to the devices left."""
    import jaxmodel as jm
    unknown = set(values) - set(_PAR_FIELDS)
    if unknown:
        raise ValueError(f"parallelism: unknown field(s) {sorted(unknown)}; known: "
                         f"{list(_PAR_FIELDS)}")
    kw = {k: v for k, v in values.items() if v is not None}
    if "dp" not in kw and n_devices is not None:
        tp, pp = float(kw.get("tp", 1)), float(kw.get("pp", 1))
        kw["dp"] = max(1.0, float(n_devices) / (tp * pp))
    return jm.validate_parallelism(jm.Parallelism(**kw))


def build_call(fn, spec: Mapping) -> tuple[tuple, dict]:
    """Positional/keyword arguments for ``fn`` from a sweep/predict spec (see module doc)."""
    import hw_db
    params = inspect.signature(fn).parameters
    extra = dict(spec.get("args", {}))
    system = None
    if "system" in spec or "device" not in spec:
        system = _load_system(spec.get("system"), spec.get("nodes"), spec.get("device"))
    device = hw_db.device(spec["device"]) if "device" in spec else (
        system.device if system is not None else None)
    par_spec = dict(spec.get("parallelism", spec.get("par", {})))
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
            val = hw_db.model(spec.get("model", "gpt3-175b"))
        elif name in ("par", "parallelism"):
            n = system.n_devices if system is not None else 1
            val = build_parallelism(par_spec, float(n))
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
    fn = getattr(jm, name, None)
    if fn is None or not callable(fn) or name.startswith("_"):
        raise ValueError(f"spec: function={name!r} is not a public jaxmodel function")
    return fn


# --------------------------------------------------------------------------------------------
# Subcommands
# --------------------------------------------------------------------------------------------
def cmd_list(a) -> Any:
    import hw_db
    kinds = {"devices": "device", "systems": "system", "models": "model"}
    chosen = [a.kind] if a.kind != "all" else list(kinds)
    return {k: hw_db.names(kinds[k]) for k in chosen}


def _hardware_args(p: argparse.ArgumentParser):
    p.add_argument("--system", help="hw_db system name or TOML path (default dgx_a100)")
    p.add_argument("--nodes", type=int, help="nodes of the system (scales the outer level)")
    p.add_argument("--device", help="a single device (hw_db name or TOML) instead of a system")
    p.add_argument("--model", default="gpt3-175b", help="hw_db model name or config.json path")


def _par_args(p: argparse.ArgumentParser):
    g = p.add_argument_group("parallelism")
    for f in ("dp", "tp", "pp", "ep", "micro_batch", "interleave", "zero"):
        g.add_argument(f"--{f.replace('_', '-')}", type=float, dest=f, default=None)
    g.add_argument("--sp", action="store_true", default=None, help="sequence parallelism")
    g.add_argument("--flash-attention", action="store_true", default=None,
                   dest="flash_attention")
    g.add_argument("--schedule", choices=["gpipe", "1f1b", "interleaved"])
    g.add_argument("--recompute", choices=["none", "selective", "full"])


def _spec_from_args(a) -> dict:
    spec = {"model": a.model}
    for k in ("system", "nodes", "device"):
        if getattr(a, k, None) is not None:
            spec[k] = getattr(a, k)
    spec["parallelism"] = {f: getattr(a, f) for f in _PAR_FIELDS
                           if getattr(a, f, None) is not None}
    return spec


def cmd_predict(a) -> Any:
    import jaxmodel as jm
    spec = _spec_from_args(a)
    if a.phase == "train":
        spec["args"] = {"global_batch": a.global_batch, "seq_len": a.seq_len}
        fn = jm.train_step
    else:
        spec["args"] = {"batch": a.batch, "prompt_len": a.prompt_len, "gen_len": a.gen_len}
        fn = jm.inference
    if a.precision:
        spec["args"]["precision"] = a.precision
    args, kwargs = build_call(fn, spec)
    res = to_jsonable(fn(*args, **kwargs))
    head = {"phase": a.phase, "system": args[0].name, "model": args[1].name,
            "parallelism": to_jsonable(args[2])}
    if a.phase == "prefill":
        head["latency_s"] = res.get("ttft_s")
    elif a.phase == "decode":
        head["latency_s"] = res.get("tpot_s")
    return {**head, **res}


def load_spec(path: str) -> dict:
    import hw_db
    p = Path(path)
    if not p.exists():
        raise ValueError(f"spec file {path!r} does not exist")
    return hw_db.load_toml(p)


def cmd_sweep(a) -> Any:
    import jaxmodel as jm
    spec = load_spec(a.spec)
    if "function" not in spec:
        raise ValueError(f"{a.spec}: missing 'function' (e.g. function = \"inference\")")
    fn = _public_fn(spec["function"])
    args, kwargs = build_call(fn, spec)
    return jm.sweep(fn, *args, grid=spec.get("grid"), chunk=int(spec.get("chunk", 4096)),
                    progress=not a.quiet, **kwargs)


def _step_options(items) -> dict:
    """``["dp_overlap=0,1", "tp_overlap=0,1"]`` → ``{"dp_overlap": [0.0, 1.0], ...}``."""
    out = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        try:
            vals = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            vals = []
        if not sep or not name.strip() or not vals:
            raise ValueError(f"--step-option {item!r}: expected NAME=V1,V2,... with numbers")
        out[name.strip()] = vals
    return out


def cmd_search(a) -> Any:
    import hw_db
    import jaxmodel as jm
    system = _load_system(a.system, a.nodes, a.device)
    model = hw_db.model(a.model)
    n = int(a.n_devices or round(float(system.n_devices)))
    df = jm.search_parallelism(system, model, n, a.global_batch, a.seq_len,
                               progress=not a.quiet,
                               step_options=_step_options(a.step_option) or None,
                               precision=a.precision.split(",") if a.precision else None)
    n_eval = df.attrs.get("n_evaluated")
    if not a.quiet:
        print(f"evaluated {n_eval:,} configurations in {df.attrs.get('wall_s', 0):.1f} s",
              file=sys.stderr)
    return df.head(a.top) if a.top else df


def cmd_codesign(a) -> Any:
    from jaxmodel.search import objectives
    spec = load_spec(a.spec)
    return objectives.run_spec(spec, steps=a.steps)


def cmd_cost(a) -> Any:
    import hw_db
    import jaxmodel as jm
    out: dict = {}
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


def parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    top = argparse.ArgumentParser(
        prog="jaxmodel", description="Vectorised, differentiable performance and cost model "
        "of LLM training and inference on accelerator systems.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p, fmt="json"):
        p.add_argument("--format", choices=["json", "csv"], default=fmt)
        p.add_argument("--out", help="write to this file (.json/.csv/.parquet) instead of "
                                     "stdout")
        return p

    p = common(sub.add_parser("list", help="list hw_db devices, systems and models"))
    p.add_argument("kind", nargs="?", default="all",
                   choices=["all", "devices", "systems", "models"])
    p.set_defaults(func=cmd_list)

    p = common(sub.add_parser("predict", help="predict one training step or inference run"))
    p.add_argument("phase", choices=["train", "prefill", "decode", "inference"])
    _hardware_args(p)
    _par_args(p)
    p.add_argument("--global-batch", type=float, default=None, dest="global_batch",
                   help="sequences per step (train; default 8·dp)")
    p.add_argument("--seq-len", type=float, default=2048, dest="seq_len")
    p.add_argument("--batch", type=float, default=8, help="sequences (inference)")
    p.add_argument("--prompt-len", type=float, default=2048, dest="prompt_len")
    p.add_argument("--gen-len", type=float, default=1024, dest="gen_len")
    p.add_argument("--precision", help="numeric precision preset: bf16 (default), fp8, ... "
                   "(jaxmodel.precision.PRESETS)")
    p.set_defaults(func=cmd_predict)

    p = common(sub.add_parser("sweep", help="sweep a design space from a TOML spec"), "csv")
    p.add_argument("spec", help="TOML spec (function, hardware, model, [args], [grid])")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = common(sub.add_parser("search", help="search the best parallelism plan"), "csv")
    _hardware_args(p)
    p.add_argument("--n-devices", type=int, dest="n_devices",
                   help="devices (default: the system's)")
    p.add_argument("--global-batch", type=float, default=1536, dest="global_batch")
    p.add_argument("--seq-len", type=float, default=2048, dest="seq_len")
    p.add_argument("--top", type=int, default=20, help="rows to print (0 = all)")
    p.add_argument("--precision", help="precision preset, or a comma-separated list to "
                   "search, e.g. bf16,fp8 (jaxmodel.precision.PRESETS)")
    p.add_argument("--step-option", action="append", default=[], dest="step_option",
                   metavar="NAME=V1,V2",
                   help="also search a train_step option, e.g. dp_overlap=0,1 grad_bytes=2,4 "
                        "tp_overlap=0,1 (repeatable)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_search)

    p = common(sub.add_parser("codesign", help="gradient co-design from a TOML spec"))
    p.add_argument("spec", help="TOML spec with [codesign] and [bounds]")
    p.add_argument("--steps", type=int, help="override the spec's steps")
    p.set_defaults(func=cmd_codesign)

    p = common(sub.add_parser("cost", help="die area, device and system cost"))
    p.add_argument("--device", help="hw_db device name or TOML path")
    p.add_argument("--system", help="hw_db system name or TOML path")
    p.add_argument("--nodes", type=int)
    p.set_defaults(func=cmd_cost)
    return top


def main(argv: Sequence[str] | None = None, stdout=None) -> int:
    """Entry point of the ``jaxmodel`` console script; returns the exit status."""
    stdout = stdout or sys.stdout
    a = parser().parse_args(argv)
    try:
        if a.command == "predict" and a.phase == "train" and a.global_batch is None:
            spec = _spec_from_args(a)
            system = _load_system(spec.get("system"), spec.get("nodes"), spec.get("device"))
            par = build_parallelism(spec["parallelism"], float(system.n_devices))
            a.global_batch = 8.0 * float(par.dp)
        result = a.func(a)
    except ValueError as e:
        print(f"jaxmodel {a.command}: error: {e}", file=sys.stderr)
        return 2
    _emit(result, a.format, a.out, stdout)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
