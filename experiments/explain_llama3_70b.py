"""Why and what if for Llama-3-70B: the five hardware knobs that matter most for its training
on 64 H100 and its serving on 8 H100, and how they change on B200.

Training: 8 × DGX H100 (64 GPUs), TP 8 × PP 4 × DP 2, sequence parallelism, selective
recomputation, FlashAttention, 256 sequences of 4096 tokens, BF16. Serving: one DGX H100,
TP 8, TensorRT-LLM, 64 requests of 1024 prompt + 256 generated tokens, BF16. The same plans
on DGX B200. Each answer is one :func:`jaxmodel.explain_train` / :func:`jaxmodel.explain_serve`
call: elasticities d ln metric / d ln knob of every continuous Device and NetLevel field from
one ``jax.jacrev``, checked against one-sided finite differences (``kink``), plus the
bottleneck view and the modelled board power (:mod:`jaxmodel.energy`).

Writes ``experiments/out/explain_llama3_70b.csv`` (all elasticities) and ``.png`` (bars of
the H100 answers); prints the top five knobs per metric and the bottleneck views.
Run: ``.venv/bin/python experiments/explain_llama3_70b.py``.
"""

from __future__ import annotations

import time

from jaxmodel.batching import ONE_SHOT_COMPILE_OPTIONS, add_xla_flags

add_xla_flags(ONE_SHOT_COMPILE_OPTIONS)   # before JAX starts: one-shot graphs compile faster

import pandas as pd  # noqa: E402

import hw_db  # noqa: E402
import jaxmodel as jm  # noqa: E402
from jaxmodel.plots import sensitivity_plot  # noqa: E402

from common import OUT  # noqa: E402

MODEL = hw_db.model("llama3-70b")
TRAIN_PAR = jm.Parallelism(dp=2, tp=8, pp=4, sp=True, recompute="selective",
                           flash_attention=True)
SERVE_PAR = jm.Parallelism(tp=8)
TOP = 5


def _print(label, x):
    print(f"\n== {label}: " + ", ".join(f"{k} {v:.4g}" for k, v in x.metrics.items())
          + f"; power {x.power_w:.0f} W/GPU" + (" (power-limited)" if x.power_limited else ""))
    for m in x.metrics:
        sub = x.table[x.table.metric == m].head(TOP)
        knobs = ", ".join(f"{r.knob} {r.elasticity:+.2f}{'*' if r.kink else ''}"
                          for r in sub.itertuples())
        print(f"  {m}: {knobs}")
    views = x.bottleneck if "prefill" in x.bottleneck else {"step": x.bottleneck}
    for ph, g in views.items():
        tot = sum(g.values()) or 1.0
        print(f"  bottleneck ({ph}): " + ", ".join(f"{k} {100 * v / tot:.0f} %"
                                                   for k, v in g.items() if v > 0))


def main():
    rows = []
    for dev, sysname in (("H100", "dgx_h100"), ("B200", "dgx_b200")):
        t0 = time.perf_counter()
        x = jm.explain_train(hw_db.system(sysname, nodes=8), MODEL, TRAIN_PAR, 256, 4096)
        _print(f"{dev} training (64 GPUs) [{time.perf_counter() - t0:.0f} s]", x)
        rows.append(x.table.assign(device=dev, workload="train"))
        if dev == "H100":
            sensitivity_plot(x.table, top=TOP, title="Llama-3-70B training, 64 H100",
                             path=OUT / "explain_llama3_70b_train.png")
        t0 = time.perf_counter()
        x = jm.explain_serve(hw_db.system(sysname), MODEL, SERVE_PAR,
                             jm.InferenceOptions(64, 1024, 256),
                             runtime="trtllm")
        _print(f"{dev} serving (8 GPUs) [{time.perf_counter() - t0:.0f} s]", x)
        rows.append(x.table.assign(device=dev, workload="serve"))
        if dev == "H100":
            sensitivity_plot(x.table, top=TOP, title="Llama-3-70B serving, 8 H100",
                             path=OUT / "explain_llama3_70b_serve.png")
    pd.concat(rows).to_csv(OUT / "explain_llama3_70b.csv", index=False)
    print("\n(* = at a kink: the one-sided finite differences disagree)")


if __name__ == "__main__":
    main()
