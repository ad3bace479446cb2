"""Benchmark: the warm time of one explain answer (target ≤ 2 s).

:func:`jaxmodel.explain_serve` of Llama-3-70B on one DGX H100 (TP 8, TensorRT-LLM, 1024 + 256
tokens): elasticities of TTFT, TPOT, tokens/s per GPU, TCO per million tokens and J/token
with respect to every continuous hardware knob, with the one-sided finite-difference check.
The first call compiles; the timed calls change the batch (a traced argument: no recompile).
Same for :func:`jaxmodel.explain_train` of a GPT-2-medium step on one DGX A100 when
``--train``. Prints cold and warm seconds (best of 3) and writes
``experiments/out/bench_explain.csv``.
Run: ``.venv/bin/python experiments/bench_explain.py [--train]``.
"""

from __future__ import annotations

import argparse
import time

import pandas as pd

import hw_db
import jaxmodel as jm

from common import OUT


def _bench(label, call, sizes):
    t0 = time.perf_counter()
    x = call(sizes[0])
    cold = time.perf_counter() - t0
    warm = []
    for s in sizes[1:]:
        t0 = time.perf_counter()
        call(s)
        warm.append(time.perf_counter() - t0)
    n = x.table.knob.nunique()
    print(f"{label}: {n} knobs x {len(x.metrics)} metrics; cold {cold:.1f} s, warm "
          f"{min(warm):.2f} s (best of {len(warm)}; target <= 2 s)")
    return dict(case=label, knobs=n, metrics=len(x.metrics), cold_s=cold, warm_s=min(warm))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", action="store_true")
    a = ap.parse_args()
    rows = []
    sy, m, par = hw_db.system("dgx_h100"), hw_db.model("llama3-70b"), jm.Parallelism(tp=8)
    rows.append(_bench("serve llama3-70b dgx_h100 tp8",
                       lambda b: jm.explain_serve(sy, m, par, jm.InferenceOptions(b, 1024, 256),
                                                  runtime="trtllm"),
                       [64, 32, 16, 8]))
    if a.train:
        sy2, m2 = hw_db.system("dgx_a100"), hw_db.model("gpt2-medium")
        par2 = jm.Parallelism(dp=8)
        rows.append(_bench("train gpt2-medium dgx_a100 dp8",
                           lambda gb: jm.explain_train(sy2, m2, par2, gb, 1024),
                           [64, 32, 128, 256]))
    pd.DataFrame(rows).to_csv(OUT / "bench_explain.csv", index=False)


if __name__ == "__main__":
    main()
