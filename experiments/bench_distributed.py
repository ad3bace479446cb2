"""Configurations per second of a sweep run as a local ``jax.distributed`` job of 1, 2 and 4
processes, and the plan of a 10⁸-configuration co-search on N hosts.

Each job (:func:`jaxmodel.distributed.launch_local`: P Python processes on 127.0.0.1, one
CPU device each, gloo collectives) runs the same :func:`jaxmodel.sweep` twice: the first call
includes tracing and the XLA compilation (every process compiles the same graph), the second
is warm (evaluation, the gather of the rows and the input check only; the fastest of
``--reps`` warm calls counts). Workloads:

- ``gemm`` (the scaling measurement at 1, 2, 4 processes): :func:`jaxmodel.gemm_latency`
  (LLMCompass's tile search over its candidate grid) over a device grid (HBM bandwidth ×
  cores × global buffer);
- ``search`` (one process, ``--probe``): :func:`jaxmodel.search_parallelism` of GPT-3 13B
  on 64 A100 (8 DGX nodes) — every plan of one hardware point, the co-search's unit of
  work, whose per-process warm rate feeds the plan.

Every job's DataFrame is compared with the single-process one (exactly). The table goes to
``experiments/out/bench_distributed.csv`` and the scaling plan of a 10⁸-row co-search (from
the measured per-process warm rate of ``search``, its measured compile and start-up times
and the stated assumptions) is printed.

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
    return lambda: jm.search_parallelism(hw_db.system("dgx_a100", nodes=8),
                                         hw_db.model("gpt3-13b"), 64, 512, 2048,
                                         progress=False)


def worker(out: str, names: list[str], scale: float, reps: int = 3) -> None:
    """One process of a job: each workload once cold, then ``reps`` times warm (the fastest
    counts); process 0 writes the times and a digest of the DataFrame."""
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
        warm = []
        for _ in range(reps):              # the fastest warm call: least disturbed by load
            t = time.perf_counter()
            df = run()
            warm.append((time.perf_counter() - t, df.attrs))
        (warm_s, attrs) = min(warm, key=lambda w: w[0])
        t2 = t1 + warm_s
        digest = hashlib.sha256(df.to_csv(index=False).encode()).hexdigest()
        res[name] = dict(n=len(df), cold_s=t1 - t0, warm_s=t2 - t1, digest=digest,
                         sync_s=attrs.get("sync_s", float("nan")),
                         evaluate_s=attrs.get("timings", {}).get("evaluate_s", t2 - t1),
                         call_s=attrs.get("wall_s", t2 - t1))
    if jm.distributed.is_main():
        Path(out).write_text(json.dumps(res))


def plan(rate: float, compile_s: float, start_s: float, sync_s: float, host_s: float) -> str:
    """The written plan of a 10⁸-configuration co-search (hardware grid × parallelism plans)
    on N hosts × c processes, from measured per-process figures, in two forms."""
    hw, plans = 1e4, 1e4
    lines = [
        "Plan: 10^8-configuration co-search = 10^4 hardware points x 10^4 parallelism plans "
        "(one jm.search_parallelism per hardware point) in a --distributed job of N hosts x "
        "c processes",
        f"  measured here: {rate:,.0f} plan evaluations/s per process (the batched "
        f"train_step of a warm search, one process on 2 shared cores), {host_s:.2f} s of "
        f"host work per search call (plan enumeration, the table), compile "
        f"{compile_s:.0f} s, start-up and join {start_s:.0f} s, input check + gather of a "
        f"warm 2-process sweep {sync_s * 1e3:.0f} ms per call",
        "  A (shared calls): every call splits its 10^4 plans over all processes and gathers "
        "them: per call host work (repeated on every process) + synchronisation + "
        "10^4 / (N c rate)",
        "  B (process-local calls): each process takes its share of the hardware points "
        "(distributed.process_slice), searches each whole inside distributed.local(), and "
        "the best plan of every point is gathered once: ceil(10^4 / (N c)) x (host work "
        "+ 10^4 / rate)",
        "  assumptions: each process at the measured rate (c = one process per core; CPU "
        "hosts; GPU hosts not measured here); every process compiles once, concurrently (or "
        "loads the executable from a shared persistent compilation cache: the plan table keeps "
        "its shape, so one executable serves every call); network latency per collective "
        "of a datacentre ~ the local figure; in A a share of a few plans de-duplicates less "
        "than the measured one (slower than shown)",
        f"  {'hosts':>6} {'c':>4} {'A_total_s':>10} {'B_total_s':>10}",
    ]
    import math
    fixed = compile_s + start_s
    for hosts in (1, 8, 64, 256):
        for c in (32, 128):
            procs = hosts * c
            a = hw * (host_s + sync_s + plans / (procs * rate)) + fixed
            b = math.ceil(hw / procs) * (host_s + plans / rate) + fixed + sync_s
            lines.append(f"  {hosts:>6} {c:>4} {a:>10,.0f} {b:>10,.0f}")
    lines.append("  B scales until one hardware point per process (10^4 processes); A is bound "
                 "by its 10^4 calls' fixed costs from a few hosts on.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--scale", type=float, default=1.0, help="grid size factor")
    ap.add_argument("--workloads", default="gemm")
    ap.add_argument("--reps", type=int, default=3, help="warm calls (the fastest counts)")
    ap.add_argument("--probe", action="store_true",
                    help="also time one single-process parallelism search for the plan")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--plan-only", action="store_true", dest="plan_only",
                    help="print the plan from experiments/out/bench_distributed.csv")
    a = ap.parse_args()
    names = a.workloads.split(",")
    if a.plan_only:
        import pandas as pd
        _print_plan(pd.read_csv(ROOT / "experiments" / "out" / "bench_distributed.csv"))
        return
    if a.worker:
        worker(a.worker, names, a.scale, a.reps)
        return
    import pandas as pd

    from jaxmodel import distributed
    out_dir = ROOT / "experiments" / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, ref = [], {}
    env = {**os.environ, "JAXMODEL_NO_CACHE": "1", "JAXMODEL_QUIET": "1"}
    jobs = [(int(x), a.workloads) for x in a.procs.split(",")]
    if a.probe:
        jobs.append((1, "search"))
        names = names + ["search"]
    for p, wl in jobs:
        tmp = out_dir / f".bench_distributed_{p}.json"
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        procs = distributed.launch_local([__file__, "--worker", tmp, "--scale", a.scale,
                                          "--workloads", wl, "--reps", a.reps], p, env=env,
                                         timeout=3600)
        wall = time.perf_counter() - t0
        for i, pr in enumerate(procs):
            if pr.returncode:
                raise SystemExit(f"process {i} of {p} failed:\n{pr.stderr[-3000:]}")
        res = json.loads(tmp.read_text())
        tmp.unlink()
        load = (load0 + os.getloadavg()[0]) / 2
        for name in wl.split(","):
            r = res[name]
            ref.setdefault(name, r["digest"])
            rows.append(dict(workload=name, processes=p, configs=r["n"],
                             cold_s=round(r["cold_s"], 2), warm_s=round(r["warm_s"], 3),
                             configs_per_s=round(r["n"] / r["warm_s"], 1),
                             sync_s=round(r["sync_s"], 3),
                             evaluate_s=round(r["evaluate_s"], 3),
                             host_s=round(r["call_s"] - r["evaluate_s"], 3),
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
    _print_plan(df)


def _print_plan(df) -> None:
    search = df[df["workload"] == "search"]
    if not len(search):
        return
    one = search.iloc[0]
    start = float(one["job_wall_s"] - one["cold_s"] - one["warm_s"])
    two = df[(df["workload"] != "search") & (df["processes"] == 2)]
    sync = float(two["sync_s"].iloc[0]) if len(two) else 0.05
    print(plan(float(one["configs"] / one["evaluate_s"]), float(one["cold_s"] - one["warm_s"]),
               max(start, 0.0), sync, float(one["host_s"])))


if __name__ == "__main__":
    main()
