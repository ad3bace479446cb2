"""``jaxmodel export`` and ``search --export``: the launch command of a plan
(:func:`jaxmodel.export_plan`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from jaxmodel.plan_io import build_parallelism
from jaxmodel.plan_io import default_tp as _default_tp
from jaxmodel.plan_io import load_system as _load_system
from jaxmodel.cli.common import _hardware_args, _par_args, _spec_from_args


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
                             training=jm.TrainExportOptions(
                                 dp_overlap=a.dp_overlap, tp_overlap=a.tp_overlap,
                                 recipe=a.recipe, system=system))
    else:
        cfg = jm.export_plan(par, framework=fw, model=model, precision=a.precision,
                             serving=jm.ServeExportOptions(
                                 max_batch=a.max_batch, max_tokens=a.max_tokens,
                                 chunk=a.chunk, kv_dtype=a.kv_dtype, runtime=a.runtime))
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
                         global_batch=a.global_batch, seq_len=a.seq_len,
                         training=jm.TrainExportOptions(system=system))
    if not any(str(t).startswith("--format") for t in getattr(a, "argv", ()) or ()):
        a.format = "json"                        # one result, not a table
    return {"step_time_s": float(ok.iloc[0]["step_time_s"]), **_launch_result(cfg)}
