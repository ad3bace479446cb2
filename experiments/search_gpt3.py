"""The parallelism search's best plan for GPT-3 175B on 1,536 A100, with a breakdown a
reviewer can follow.

Problem (Narayanan et al., SC'21, the GPT-3 175B run): 192 DGX A100 nodes (1,536 GPUs of
Selene, ``hw_db.system("dgx_a100", nodes=192)``), global batch 1,536, sequence 2,048.
``jm.search_parallelism`` enumerates every consistent plan crossed with the execution options
(data-parallel gradient reduction overlapped with the backward or not; bf16 or fp32 gradient
reduction; TP collectives pipelined with their GEMMs or not) and ranks them by step time.

For the best plan (and the best plan without TP overlap, without ZeRO-3 when the best uses
it, and with Megatron-LM's TP 8 × PP 12 degrees) the script prints:

- the step's parts (:attr:`jaxmodel.TrainResult.breakdown`, they sum to the step time) in
  seconds and in per cent of the step;
- each communication's standalone time (the same plan with that overlap option off) next to
  its exposed part, and the compute slowdown that overlap costs (SMs and memory bandwidth
  the collectives take, :mod:`jaxmodel.parallel.overlap`);
- the sustained GEMM efficiency of the compute part (model FLOPs per device / compute
  seconds / peak) and the MFU, beside published A100 MFUs for comparison: Korthikanti et
  al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023, Table 5:
  GPT-3 175B with sequence parallelism and selective recomputation, 51.4 % MFU;
  530B 56.0 %; 1T 56.3 %).

Writes ``experiments/out/search_gpt3.csv`` (the top 50 plans).

Run: ``.venv/bin/python experiments/search_gpt3.py [--small]`` (``--small``: 128 GPUs).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db

OUT = Path(__file__).resolve().parent / "out"
PLAN = ("dp", "tp", "pp", "sp", "micro_batch", "interleave", "schedule", "recompute", "zero",
        "flash_attention")
OPTS = ("dp_overlap", "grad_bytes", "tp_overlap")
PUBLISHED_MFU = {"Korthikanti et al. 2023, GPT-3 175B": 0.514,
                 "Korthikanti et al. 2023, 530B": 0.560,
                 "Korthikanti et al. 2023, 1T": 0.563}


def step(system, model, row, gb, seq, **over):
    """:func:`jaxmodel.train_step` of a search row, with execution options overridden."""
    par = jm.Parallelism(**{k: row[k] for k in PLAN})
    opts = {k: float(row[k]) for k in OPTS}
    opts.update(over)
    return jm.train_step(system, model, par, gb, seq, **opts)


def explain(system, model, row, gb, seq, title):
    """Print the breakdown of one plan (module docstring)."""
    r = step(system, model, row, gb, seq)
    t = float(r.step_time_s)
    plan = ", ".join(f"{k}={row[k]}" if isinstance(row[k], str) else f"{k}={float(row[k]):g}"
                     for k in PLAN + OPTS)
    print(f"\n== {title}\n   {plan}")
    print(f"   step {t:.3f} s, MFU {float(r.mfu):.3f}, HFU {float(r.hfu):.3f}, memory "
          f"{float(r.memory_bytes) / 2**30:.1f} GiB, {float(r.microbatches):g} micro-batches")
    parts = {k: float(v) for k, v in r.breakdown.items()}
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        if v > 0:
            print(f"   {k:>10s} {v:8.3f} s  {100 * v / t:5.1f} %")
    dev = system.device
    n = float(row.dp * row.tp * row.pp)
    flops_dev = float(r.flops_per_step) / n
    peak = float(dev.peak_matrix_flops)
    print(f"   model FLOPs per device {flops_dev:.3e} = {flops_dev / peak:.3f} s at peak; the "
          f"compute part runs at {flops_dev / parts['compute'] / peak:.3f} of peak (GEMM "
          f"shapes, vector kernels, launches, the slowdown under overlapped collectives)")
    # what each overlap hides and costs: the same plan with the option off
    for opt, key in (("tp_overlap", "tp_comm"), ("dp_overlap", "dp_comm")):
        if float(row[opt]) > 0:
            off = step(system, model, row, gb, seq, **{opt: 0.0})
            serial = float(off.breakdown[key])
            print(f"   {key}: standalone {serial:.3f} s, exposed {parts[key]:.3f} s with "
                  f"{opt}=1 (step {float(off.step_time_s):.3f} s with {opt}=0: overlap "
                  f"saves {float(off.step_time_s) - t:.3f} s)")
    return r


def main(small=False):
    nodes, n, gb = (16, 128, 128) if small else (192, 1536, 1536)
    seq = 2048.0
    system = hw_db.system("dgx_a100", nodes=nodes)
    model = hw_db.model("gpt3-175b")
    t0 = time.perf_counter()
    df = jm.search_parallelism(system, model, n, gb, seq, progress=False,
                               step_options={"dp_overlap": [0.0, 1.0],
                                             "grad_bytes": [2.0, 4.0],
                                             "tp_overlap": [0.0, 1.0]})
    wall = time.perf_counter() - t0
    print(f"GPT-3 175B on {n} A100, batch {gb}, seq {seq:g}: {df.attrs['n_evaluated']:,} "
          f"plans, {df.attrs['n_feasible']:,} feasible, {wall:.0f} s (load "
          f"{os.getloadavg()[0]:.1f})")
    OUT.mkdir(parents=True, exist_ok=True)
    df.head(50).to_csv(OUT / "search_gpt3.csv", index=False)
    cols = [c for c in PLAN + OPTS + ("step_time_s", "mfu", "memory_bytes") if c in df]
    pd.set_option("display.width", 250)
    print(df[cols].head(10).to_string(index=False))
    explain(system, model, df.iloc[0], gb, seq, "best plan")
    no_tp = df[df.tp_overlap == 0]
    if len(no_tp):
        explain(system, model, no_tp.iloc[0], gb, seq, "best plan without TP overlap")
    no_z3 = df[df.zero < 2.5]
    if len(no_z3) and float(df.iloc[0].zero) > 2.5:
        explain(system, model, no_z3.iloc[0], gb, seq, "best plan without ZeRO-3")
    meg = df[(df.tp == 8) & (df.pp == 12)]
    if len(meg):
        explain(system, model, meg.iloc[0], gb, seq, "best plan with Megatron-LM's TP 8 x PP 12")
    print("\npublished A100 MFU for comparison: "
          + "; ".join(f"{k} {v:.3f}" for k, v in PUBLISHED_MFU.items()))
    return df


if __name__ == "__main__":
    main(small="--small" in sys.argv)
