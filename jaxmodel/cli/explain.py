"""``jaxmodel explain``: elasticities of one prediction with respect to every hardware knob
and its bottleneck view (:func:`jaxmodel.explain_train`, :func:`jaxmodel.explain_serve`)."""

from __future__ import annotations

import sys
from typing import Any

from jaxmodel.cli.common import _hardware_args, _par_args, _spec_from_args, build_call
from jaxmodel.batching import one_shot_xla_flags


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
    one_shot_xla_flags()
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
        x = jm.explain_serve(*args[:3], jm.InferenceOptions(a.batch, a.prompt_len, a.gen_len),
                             precision=a.precision, runtime=a.runtime)
    sys.stderr.write(_explain_text(x, a.top))
    if a.plot:
        from jaxmodel.plots import sensitivity_plot
        sensitivity_plot(x.table, top=a.top or 10, path=a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    tab = x.table if a.top == 0 else x.table.groupby("metric", sort=False).head(a.top)
    return tab.reset_index(drop=True)
