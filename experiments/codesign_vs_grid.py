"""Gradient co-design vs exhaustive grid on one hardware design problem.

Problem (LLMCompass §V: design a device for efficient inference): GPT-3 175B served by one
DGX-A100-like node, 8 devices with 8-way tensor parallelism; batch 8, prompt 2048, 1024
generated tokens (LLMCompass §IV-A workload, whole model). Knobs of the device (all others as
an A100): core count (8 … 256, integer), HBM stacks (1 … 8, integer; each adds the A100's
per-stack 408 GB/s and 16 GB), global buffer (8 … 128 MiB) and local buffer per core
(64 KiB … 1 MiB). Objective (lower is better): total cost of ownership per million generated
tokens (``jm.tco``: system capital — dies from the area model, HBM, package, hosts, network —
amortised, plus energy), with a penalty when weights + KV cache exceed the memory
(:func:`jaxmodel.search.objectives.make_objective`, kind ``usd_per_mtok``).

- grid: every combination of 32 core counts × 8 stack counts × 13 global × 13 local buffer
  sizes (geometric) — 43,264 designs — evaluated with ``jm.sweep``;
- gradient: ``jm.codesign`` (projected Adam in normalised log space, 6 vmapped starts × 50
  steps, rounding of the integer knobs with exact re-evaluation, then a 96-evaluation pattern
  search: the buffer sizes get no useful gradient — the tile search only changes at
  feasibility cliffs and the SRAM area model is piecewise).

Prints ONE JSON line ``{"grid_best", "grad_best", "grid_evals", "grad_evals", ...}`` and
writes ``experiments/out/codesign_vs_grid.csv`` (the grid) and ``.png`` (the gradient runs'
best-so-far against the grid optimum).
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import jaxmodel as jm
import hw_db
from jaxmodel.search.objectives import evaluate_design, make_objective

from common import OUT  # noqa: E402

BOUNDS = {"core_count": (8.0, 256.0), "hbm_stacks": (1.0, 8.0),
          "global_buffer_bytes": (8 * 2 ** 20, 128 * 2 ** 20),
          "local_buffer_bytes": (64 * 2 ** 10, 2 ** 20)}
GRID = {"core_count": np.round(np.geomspace(8, 256, 32)),
        "hbm_stacks": np.arange(1.0, 9.0),
        "global_buffer_bytes": np.geomspace(*BOUNDS["global_buffer_bytes"], 13),
        "local_buffer_bytes": np.geomspace(*BOUNDS["local_buffer_bytes"], 13)}


def main(quick: bool = False) -> dict:
    system = hw_db.system("dgx_a100")
    model = hw_db.model("gpt3-175b")
    par = jm.Parallelism(tp=8)
    workload = dict(batch=8.0, prompt_len=2048.0, gen_len=1024.0)
    objective = make_objective(system, model, par, **workload)

    # ---- exhaustive grid --------------------------------------------------------------------
    grid = {k: (v[::3] if quick else v) for k, v in GRID.items()}
    t0 = time.perf_counter()
    df = jm.sweep(lambda p: objective(p), {k: 1.0 for k in grid},
                  grid={f"p.{k}": v for k, v in grid.items()}, chunk=512, progress=True)
    t_grid = time.perf_counter() - t0
    df = df.rename(columns={"<lambda>": "usd_per_mtok"})
    df.columns = [c[2:] if c.startswith("p.") else c for c in df.columns]
    grid_evals = len(df)
    best = df.loc[df["usd_per_mtok"].idxmin()]
    grid_best = float(best["usd_per_mtok"])

    # ---- gradient co-design -------------------------------------------------------------------
    init = {"core_count": 108.0, "hbm_stacks": 5.0, "global_buffer_bytes": 40 * 2 ** 20,
            "local_buffer_bytes": 192 * 2 ** 10}
    t0 = time.perf_counter()
    res = jm.codesign(objective, init, BOUNDS, steps=30 if quick else 50,
                      integer=("core_count", "hbm_stacks"),
                      options=jm.CodesignOptions(n_starts=4 if quick else 6, learning_rate=0.06,
                                                 seed=0, polish=48 if quick else 96))
    t_grad = time.perf_counter() - t0
    gap = (res.value - grid_best) / grid_best

    OUT.mkdir(parents=True, exist_ok=True)
    jm.save(df, OUT / "codesign_vs_grid.csv")
    from jaxmodel.plots import figure, save
    fig = figure()
    ax = fig.add_subplot()
    ax.plot(np.arange(1, len(res.best_history) + 1) * res.history.shape[1],
            res.best_history, label="gradient: best so far (relaxed)")
    ax.axhline(grid_best, color="k", ls="--", label=f"grid optimum ({grid_evals:,} evals)")
    ax.axhline(res.value, color="crimson", ls=":", label="gradient, rounded + exact")
    ax.set_xlabel("objective evaluations (value + gradient)")
    ax.set_ylabel("USD per million tokens (lower is better)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("co-design: gradient vs exhaustive grid")
    save(fig, OUT / "codesign_vs_grid.png")

    out = {"grid_best": grid_best, "grad_best": float(res.value), "grid_evals": int(grid_evals),
           "grad_evals": int(res.n_evals), "gap_rel": float(gap),
           "eval_ratio": res.n_evals / grid_evals, "grid_s": round(t_grid, 1),
           "grad_s": round(t_grad, 1),
           "grid_design": {k: float(best[k]) for k in grid},
           "grad_design": res.params,
           "grad_design_metrics": evaluate_design(system, model, par, res.params, **workload)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
