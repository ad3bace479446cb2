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

Modules: :mod:`~jaxmodel.cli.common` (output, specs, shared options, help examples), one per
group of subcommands (:mod:`~jaxmodel.cli.predict`, :mod:`~jaxmodel.cli.search`,
:mod:`~jaxmodel.cli.serve`, :mod:`~jaxmodel.cli.launch`, :mod:`~jaxmodel.cli.explain`), and
here the parser and :func:`main`; ``python -m jaxmodel.cli`` runs it. The helpers the
explorer shares live one layer down, in :mod:`jaxmodel.plan_io`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping, Sequence

# every name the single-module command had stays importable from jaxmodel.cli
from jaxmodel import batching
from jaxmodel.process import cli_process
from jaxmodel.plan_io import (DEFAULT_MODEL, DEFAULT_SYSTEM, HINTS,  # noqa: F401
                              PAR_CHOICES, build_parallelism, explain_infeasible, to_jsonable)
from jaxmodel.plan_io import PAR_FIELDS as _PAR_FIELDS  # noqa: F401
from jaxmodel.plan_io import default_tp as _default_tp  # noqa: F401
from jaxmodel.plan_io import load_system as _load_system  # noqa: F401
from jaxmodel.plan_io import reason_label as _reason_name
from jaxmodel.cli.common import (EXAMPLES, _emit, _flatten, _hardware_args,  # noqa: F401
                                 _is_frame, _number, _par_args, _public_fn, _spec_from_args,
                                 build_call, check_out_path, load_spec)
from jaxmodel.cli.explain import _cmd_explain, _explain_parser, _explain_text  # noqa: F401
from jaxmodel.cli.launch import (_export_parser, _launch_result, _search_export,  # noqa: F401
                                 _search_export_option, _write_launch, cmd_export)
from jaxmodel.cli.predict import (_energy_lines, _predict, _print_memory_table,  # noqa: F401
                                  cmd_cost, cmd_list, cmd_predict)
from jaxmodel.cli.search import (CODESIGN_KEYS, CODESIGN_OPTIONS,  # noqa: F401
                                 DISTRIBUTED_COMMANDS, SWEEP_KEYS, _cmd_distributed,
                                 _distributed_parser, _serve_search_parser, _step_options,
                                 check_codesign_spec, cmd_codesign, cmd_search,
                                 cmd_serve_search, cmd_sweep)
from jaxmodel.cli.serve import _serve_parser, cmd_serve  # noqa: F401


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
    if argv is None and a.command in QUICK_EXIT_COMMANDS and cli_process():
        _exit_without_teardown(status, stdout)
    return status


#: One-answer commands whose console-script process ends without the interpreter's teardown.
QUICK_EXIT_COMMANDS = ("predict", "explain", "list", "cost")


def _exit_without_teardown(status: int, stdout) -> None:
    """End the console script once its answer is written: destroying the loaded executables
    and JAX's backend at interpreter exit costs 0.1-0.3 s of a one-second answer. Every
    background load or store of the export cache finishes first and the streams are
    flushed; nothing else of this process needs its exit handlers (no distributed run, no
    open files of ours)."""
    batching.finish_background()
    for stream in (stdout, sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)
