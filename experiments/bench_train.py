"""Benchmark: training-step evaluations per second for one batched call.

GPT-3 175B on 1024 A100-80GB (``hw_db.system("dgx_a100", nodes=128)``), global batch 1536,
sequence 2048: every combination of tp × pp (dp = 1024/(tp·pp)) × micro-batch × interleave ×
schedule × recompute × ZeRO stage × sequence parallelism, in ONE batched ``jm.train_step``
call with the GEMM de-duplication path (:mod:`jaxmodel.parallel.gemm_table`: the unique GEMM
shapes of the batch are timed once by the tile search, then looked up) and the stage-time
de-duplication of :func:`jaxmodel.train_step` (per-layer times once per distinct
``tp, sp, pp, micro_batch, recompute`` combination, then every plan composed from them).

Prints configurations/s (target ≥ 10,000; Calculon ~125/s), compile and set-up times, NaN
checks and the best plan; writes ``experiments/out/bench_train.csv``.

Run: ``.venv/bin/python experiments/bench_train.py``
"""

from __future__ import annotations

import itertools
import json
import sys
import time

from _bench import import_jaxmodel

jm, IMPORT_S, CACHE = import_jaxmodel()   # first: its import time is measured

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import hw_db
from jaxmodel.parallel.gemm_table import GemmTable

from common import OUT  # noqa: E402
N_DEVICES = 1024
GLOBAL_BATCH = 1536
SEQ = 2048


def plan_grid():
    """All plans of the sweep as a dict of numpy columns (one row per plan)."""
    rows = []
    pow2 = (1, 2, 4, 8, 16, 32)
    for tp, pp in itertools.product(pow2, pow2):
        if N_DEVICES % (tp * pp):
            continue
        dp = N_DEVICES // (tp * pp)
        for mb, v, sched, rc, zero, sp in itertools.product(
                (1, 2, 4, 8), (1, 2, 3, 4, 6), (0, 1, 2), (0, 1, 2), (0, 1, 2, 3), (0, 1)):
            rows.append((dp, tp, pp, mb, v, sched, rc, zero, sp))
    cols = np.asarray(rows, dtype=np.float64).T
    names = ("dp", "tp", "pp", "micro_batch", "interleave", "schedule", "recompute", "zero",
             "sp")
    return dict(zip(names, cols))


def main():
    system = hw_db.system("dgx_a100", nodes=N_DEVICES // 8)
    model = hw_db.model("gpt3-175b")
    grid = plan_grid()
    n = len(grid["dp"])
    par = jm.Parallelism(**{k: jnp.asarray(v) for k, v in grid.items()})
    print(f"{n} plans of GPT-3 175B on {N_DEVICES} A100 (batch {GLOBAL_BATCH}, seq {SEQ})")

    t0 = time.perf_counter()
    table = GemmTable.for_train_step(system, model, par, GLOBAL_BATCH, SEQ)
    t_table = time.perf_counter() - t0
    print(f"GEMM de-dup: {len(table)} unique shapes (recording + one tile search "
          f"{t_table:.1f} s incl. compiles)")

    def run():
        r = jm.train_step(system, model, par, GLOBAL_BATCH, SEQ, gemm=table.lookup)
        jax.block_until_ready(r)
        return r

    t0 = time.perf_counter()
    res = run()
    t_first = time.perf_counter() - t0
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = run()
        times.append(time.perf_counter() - t0)
    t_run = min(times)
    rate = n / t_run

    step = np.asarray(res.step_time_s)
    feas = np.asarray(res.feasible)
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(res)]
    any_nan = any(np.isnan(x).any() for x in leaves if x.dtype.kind == "f")
    feas_finite = bool(np.all(np.isfinite(step[feas])))
    reasons = pd.Series(np.asarray(res.reason)).map(jm.reason_name).value_counts()

    df = pd.DataFrame({**grid, "step_time_s": step, "mfu": np.asarray(res.mfu),
                       "memory_GiB": np.asarray(res.memory_bytes) / 2**30, "feasible": feas,
                       "reason": [jm.reason_name(c) for c in np.asarray(res.reason)]})
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "bench_train.csv", index=False)
    best = df[df.feasible].sort_values("step_time_s").head(5)

    print(f"first call (compile + run): {t_first:.1f} s; steady state {t_run:.3f} s "
          f"for {n} plans")
    print(f"throughput: {rate:,.0f} configurations/s (target >= 10,000; Calculon ~125/s)")
    print(f"end to end from a cold start (GEMM table + compiles + first call): "
          f"{t_table + t_first:.1f} s = {n / (t_table + t_first):,.0f} configurations/s")
    print(f"NaN anywhere: {any_nan}; feasible plans: {int(feas.sum())}, all finite: "
          f"{feas_finite}")
    print("reasons:", dict(reasons))
    print("best plans:\n" + best.to_string(index=False))
    print(json.dumps({"configs": n, "configs_per_s": round(rate), "unique_gemms": len(table),
                      "setup_s": round(t_table, 1), "first_call_s": round(t_first, 1),
                      "nan": any_nan,
                      "feasible": int(feas.sum())}))
    return 0 if (not any_nan and feas_finite) else 1


if __name__ == "__main__":
    sys.exit(main())
