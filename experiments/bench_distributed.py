"""Configurations per second of a sweep run as a local ``jax.distributed`` job of 1, 2 and 4
processes, and the plan of a 10⁸-configuration co-search on N hosts.

Each job (:func:`jaxmodel.distributed.launch_local`: P Python processes on 127.0.0.1, one
CPU device each, gloo collectives) runs the same :func:`jaxmodel.sweep` twice: the first call
includes tracing and the XLA compilation (every process compiles the same graph), the second
is warm (evaluation, the gather of the rows and the input check only). Two workloads:

- ``gemm``: :func:`jaxmodel.gemm_latency` (LLMCompass's tile search over its candidate grid)
  over a device grid (HBM bandwidth × cores × global buffer);
- ``train``: :func:`jaxmodel.train_step` of GPT-3 13B on 8 DGX A100 nodes over HBM bandwidth
  × inter-node bandwidth × ``tp`` × ``pp`` × micro-batch — the co-search's unit of work
  (one hardware point × one parallelism plan per row, no de-duplication).

Every job's DataFrame is compared with the single-process one (exactly). The table goes to
``experiments/out/bench_distributed.csv`` and the scaling plan of a 10⁸-row co-search (from
the measured per-process warm rate of ``train``, the measured compile and start-up times and
the stated assumptions) is printed.

Usage: ``python experiments/bench_distributed.py [--procs 1,2,4] [--scale 1.0]``; the
machine's load average is printed beside the figures (on a shared machine they vary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _workload(name: str, scale: float):
    import numpy as np

    import hw_db
    import jaxmodel as jm
    if name == "gemm":
        n_bw = max(2, int(round(32 * scale)))
        grid = {"dev.mem_bw": np.linspace(1e12, 4e12, n_bw),
                "dev.core_count": np.arange(64, 144, 8),
                "dev.global_buffer_bytes": np.linspace(10e6, 80e6, 8)}
        return lambda: jm.sweep(jm.gemm_latency, hw_db.device("a100_80gb"), 2048, 12288, 12288,
                                grid=grid, progress=False)
    system = hw_db.system("dgx_a100", nodes=8)
    n_bw = max(2, int(round(8 * scale)))
    grid = {"system.device.mem_bw": np.linspace(1.0e12, 4.0e12, n_bw),
            "system.levels[1].bw_per_device": [12.5e9, 25e9, 50e9, 100e9],
            "par.tp": [1, 2, 4, 8], "par.pp": [1, 2, 4, 8], "par.micro_batch": [1, 2, 4]}
    par = jm.Parallelism(dp=8, tp=8, pp=1, micro_batch=1)
    return lambda: jm.sweep(jm.train_step, system, hw_db.model("gpt3-13b"), par, 512, 2048,
                            grid=grid, progress=False)


def worker(out: str, names: list[str], scale: float) -> None:
    """One process of a job: each workload twice (cold, warm); process 0 writes the times
    and a digest of the DataFrame."""
    import hashlib

    import jaxmodel as jm
    t_start = time.perf_counter()
    jm.distributed.initialize()
    res = {"init_s": time.perf_counter() - t_start}
    for name in names:
        run = _workload(name, scale)
        t0 = time.perf_counter()
        df = run()
        t1 = time.perf_counter()
        df = run()
        t2 = time.perf_counter()
        digest = hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
        res[name] = dict(n=len(df), cold_s=t1 - t0, warm_s=t2 - t1, digest=digest,
                         sync_s=df.attrs["sync_s"])
    if jm.distributed.is_main():
        Path(out).write_text(json.dumps(res))


def plan(rate_core: float, compile_s: float, start_s: float) -> str:
    """The written plan of a 10⁸-configuration co-search (hardware grid × parallelism plans)
    on N hosts, from measured per-process figures."""
    n = 1e8
    lines = [
        "Plan: 10^8-configuration co-search (hardware grid x parallelism plans), "
        "jm.sweep(jm.train_step, ...) with --distributed, gather=False (each host writes "
        "its share as Parquet; rows are contiguous, so the part files in process order are "
        "the single-process table)",
        f"  measured here: {rate_core:,.0f} train_step configurations/s per process "
        f"(1 CPU core, warm), compile {compile_s:.0f} s, start-up and join {start_s:.0f} s",
        "  assumptions: c processes per host, one per core, each at the measured per-core "
        "rate (the sweep is embarrassingly parallel: no collective until the end); every "
        "process compiles once, concurrently (or loads it from a shared persistent "
        "compilation cache); the output (~30 float32 columns, 120 B/row = 12 GB in all) is "
        "written per host, not gathered; the input check is one all-gather of 36 words per input.",
    ]
    lines.append(f"  {'hosts':>6} {'cores/host':>10} {'eval_s':>10} {'total_s':>10}")
    for hosts in (1, 8, 64, 256):
        for cores in (32, 128):
            ev = n / (hosts * cores * rate_core)
            lines.append(f"  {hosts:>6} {cores:>10} {ev:>10,.0f} "
                         f"{ev + compile_s + start_s:>10,.0f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--scale", type=float, default=1.0, help="grid size factor")
    ap.add_argument("--workloads", default="gemm,train")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    names = a.workloads.split(",")
    if a.worker:
        worker(a.worker, names, a.scale)
        return
    import pandas as pd

    from jaxmodel import distributed
    out_dir = ROOT / "experiments" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, ref = [], {}
    env = {**os.environ, "JAXMODEL_NO_CACHE": "1", "JAXMODEL_QUIET": "1"}
    for p in [int(x) for x in a.procs.split(",")]:
        tmp = out_dir / f".bench_distributed_{p}.json"
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        procs = distributed.launch_local([__file__, "--worker", tmp, "--scale", a.scale,
                                          "--workloads", a.workloads], p, env=env,
                                         timeout=3600)
        wall = time.perf_counter() - t0
        for i, pr in enumerate(procs):
            if pr.returncode:
                raise SystemExit(f"process {i} of {p} failed:\n{pr.stderr[-3000:]}")
        res = json.loads(tmp.read_text())
        tmp.unlink()
        load = (load0 + os.getloadavg()[0]) / 2
        for name in names:
            r = res[name]
            ref.setdefault(name, r["digest"])
            rows.append(dict(workload=name, processes=p, configs=r["n"],
                             cold_s=round(r["cold_s"], 2), warm_s=round(r["warm_s"], 3),
                             configs_per_s=round(r["n"] / r["warm_s"], 1),
                             sync_s=round(r["sync_s"], 3),
                             cold_configs_per_s=round(r["n"] / r["cold_s"], 1),
                             job_wall_s=round(wall, 1), load_avg=round(load, 1),
                             same_as_1=r["digest"] == ref[name]))
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    for name in names:
        sel = df["workload"] == name
        base = df.loc[sel & (df["processes"] == df.loc[sel, "processes"].min()),
                      "configs_per_s"].iloc[0]
        df.loc[sel, "vs_1"] = (df.loc[sel, "configs_per_s"] / base).round(2)
    df.to_csv(out_dir / "bench_distributed.csv", index=False)
    print(df.to_string(index=False))
    if "train" in names:
        one = df[(df["workload"] == "train")].iloc[0]
        start = float(one["job_wall_s"] - one["cold_s"] - one["warm_s"])
        print(plan(float(one["configs_per_s"]), float(one["cold_s"] - one["warm_s"]),
                   max(start, 0.0)))


if __name__ == "__main__":
    main()
