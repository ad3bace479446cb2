"""Speculative decoding against a published speed-up: DeepSeek-V3's multi-token prediction.

DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §5.4.3: with one MTP module drafting the
next-next token (k = 1), the second token is accepted 85-90 % of the time across generation
topics, which "enables DeepSeek-V3 to achieve a significantly improved decoding speed,
delivering 1.8 times TPS (Tokens Per Second)". The deployment of §3.4.2 (decoding on 40
nodes with EP 320) is not reproduced; the model here serves DeepSeek-V3 on one DGX H200
(TP 8 × EP 8, FP8, ``"trtllm_v1"`` runtime), decoding at a few batch sizes, and reports the
decode speed-up ``tpot(no MTP) / tpot(MTP)`` at α = 0.85 and 0.90 (Leviathan et al. 2023
eq. 1: E = 1 + α tokens per step). Nothing is fitted.

Run: ``python experiments/validate_speculative.py`` (several minutes on CPU: two inference
graphs of DeepSeek-V3). Prints a table; writes ``experiments/out/validate_speculative.csv``.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import hw_db  # noqa: E402
import jaxmodel as jm  # noqa: E402

from common import OUT  # noqa: E402

BATCHES = (1.0, 16.0, 64.0)
ACCEPT = (0.85, 0.90)
ISL, OSL = 1024.0, 1024.0
PUBLISHED = 1.8


def main():
    os.makedirs(OUT, exist_ok=True)
    system = hw_db.system("dgx_h200")
    model = hw_db.model("deepseek-v3")
    par = jm.Parallelism(tp=8.0, ep=8.0)
    b = np.asarray(BATCHES)
    base = jm.inference(system, model, par, b, ISL, OSL, precision="fp8", runtime="trtllm_v1")
    bb, aa = np.meshgrid(b, np.asarray(ACCEPT), indexing="ij")
    s = jm.Speculative("mtp", k=1.0, accept=aa.ravel())
    r = jm.inference(system, model, par, bb.ravel(), ISL, OSL, precision="fp8",
                     runtime="trtllm_v1", speculative=s)
    rows = []
    for i, (bi, ai) in enumerate(zip(bb.ravel(), aa.ravel())):
        j = int(np.where(b == bi)[0][0])
        t0 = float(np.asarray(base.tpot_s)[j])
        t1 = float(np.asarray(r.tpot_s)[i])
        rows.append(dict(batch=bi, accept=ai, feasible=bool(np.asarray(r.feasible)[i]),
                         tpot_ms=1e3 * t0, tpot_mtp_ms=1e3 * t1,
                         step_mtp_ms=1e3 * float(np.asarray(r.breakdown["spec.step"])[i]),
                         draft_ms=1e3 * float(np.asarray(r.breakdown["spec.draft_step"])[i]),
                         speedup=t0 / t1, published=PUBLISHED))
    t = pd.DataFrame(rows)
    print("DeepSeek-V3, DGX H200 TP8 x EP8, FP8, MTP k = 1 (DeepSeek-V3 report 5.4.3: 1.8x TPS "
          "at 85-90 % acceptance)")
    print(t.round(3).to_string(index=False))
    err = 100.0 * (t["speedup"] / PUBLISHED - 1.0)
    print(f"speed-up error vs 1.8x: mean {err.mean():+.1f} %, range {err.min():+.1f} .. "
          f"{err.max():+.1f} %")
    path = os.path.join(OUT, "validate_speculative.csv")
    t.to_csv(path, index=False)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
