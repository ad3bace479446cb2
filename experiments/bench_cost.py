"""Benchmark: design variants priced per second by one batched call.

Three workloads, each a single jitted call over a batch (compile excluded, best of 3):

* ``chiplet``: the A100-like CATCH system (GPU + 6 HBM proxies on a Si interposer,
  ``reference_outputs/a100like``) with the GPU core area, the 7nm defect density and the
  production quantity varied per variant, exact grid dies-per-wafer;
* ``chiplet_smooth``: the same with the closed-form dies per wafer;
* ``device``: ``jm.device_cost`` (LLMCompass die area + ttm-cas die cost + memory) over
  A100 variants (core count, L2, HBM stacks).

Writes ``experiments/out/bench_cost.csv`` and ``.png``; prints variants/s (target ≥ 100,000).
Run: ``.venv/bin/python experiments/bench_cost.py [--n 200000]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from _bench import import_jaxmodel

jm, IMPORT_S, CACHE = import_jaxmodel()   # first: its import time is measured

import jax
import jax.numpy as jnp
import numpy as np

import hw_db

from common import ANCHORS, OUT  # noqa: E402

LIB = ANCHORS / "chiplet_cost_library"


def _time(fn, reps=3):
    out = fn()
    jax.block_until_ready(out)  # compile + first run
    best = np.inf
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best, out


def main(n: int = 200_000, chunk: int = 2048):
    rng = np.random.default_rng(0)
    base = jm.load_chiplet_system(LIB / "reference_outputs/a100like/a100like_7nm_def.xml",
                                  LIB / "reference_outputs/a100like/a100like_7nm_netlist.xml",
                                  LIB)
    areas = jnp.asarray(rng.uniform(300.0, 820.0, n), jnp.float32)
    dens = jnp.asarray(rng.uniform(0.001, 0.005, n), jnp.float32)
    qty = jnp.asarray(10 ** rng.uniform(5, 7, n), jnp.float32)
    batch = base.with_chip_values("GPU", core_area=areas).with_layer_values(
        "combined_7nm", defect_density=dens).with_chip_values(None, quantity=qty)
    rows = []
    for mode in ("exact", "smooth"):
        t, out = _time(lambda: jm.chiplet_system_cost(batch, dpw=mode, chunk=chunk).total_usd)
        rows.append(("chiplet" if mode == "exact" else "chiplet_smooth", n, t, n / t,
                     float(jnp.min(out)), float(jnp.max(out))))

    dev = hw_db.device("a100_80gb")
    stacks = jnp.asarray(rng.integers(3, 9, n), jnp.float32)
    devb = dataclasses.replace(
        dev, physical_core_count=jnp.asarray(rng.integers(32, 160, n), jnp.float32),
        physical_global_buffer_bytes=jnp.asarray(rng.uniform(8, 96, n) * 2 ** 20, jnp.float32),
        physical_mem_channels=stacks + 1.0, mem_channels=stacks,
        mem_capacity=stacks * 16e9)
    t, out = _time(lambda: jm.device_cost(devb).total_usd)
    rows.append(("device", n, t, n / t, float(jnp.min(out)), float(jnp.max(out))))

    import pandas as pd
    df = pd.DataFrame(rows, columns=["workload", "variants", "seconds", "variants_per_s",
                                     "min_usd", "max_usd"])
    df["backend"] = jax.default_backend()
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "bench_cost.csv", index=False)
    print(df.to_string(index=False))
    ok = df["variants_per_s"] >= 1e5
    print("target >= 100,000 variants/s: met by " + (", ".join(df.workload[ok]) or "none")
          + ("; missed by " + ", ".join(df.workload[~ok]) if (~ok).any() else ""))
    import os
    print(f"(CPU cores visible: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f})")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(df.workload, df.variants_per_s)
    ax.axvline(1e5, color="r", ls="--", label="target 1e5/s")
    ax.set_xscale("log")
    ax.set_xlabel(f"variants priced per second ({jax.default_backend()}, batch {n})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "bench_cost.png", dpi=120)
    return df


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--chunk", type=int, default=2048)
    a = p.parse_args()
    main(a.n, a.chunk)
