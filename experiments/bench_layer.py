"""Benchmark: GPT-3 175B layer design points per second over a batch of hardware variants.

One design point = the full LLMCompass-style layer model of one hardware variant: the GPT-3
175B layer (TP = 4 on the 4×A100 node) in prefill (batch 8, 2048 tokens) AND decode (batch 8,
KV 3072), every GEMM with the full tile search (``jaxmodel.ops.gemm_latency``), softmax /
layernorm / GELU kernels and the TP all-reduces. The hardware batch varies main-memory
bandwidth, global and local buffer sizes, global-buffer bandwidth, core count and clock
(log-uniform / uniform random, fixed seed).

Measures: ``import jaxmodel`` time, compile time (first call), steady-state points per second
(best of ``REPEATS`` timed calls after the compile), the first answer for a single point (fresh
configuration shape: trace + compile + run; with a warm persistent compilation cache the
compile is a cache read) and the second answer (same point again), and checks the batch for
NaN / inf. Target: >= 60,000 points/s on 2 CPU cores (the CPU-time figure: the machine may be
shared), no NaN/inf. For scale: LLMCompass needs ~1,000 s for one prefill + decode point.

The batch is one concrete workload on many devices, so ``layer_breakdown`` passes the GEMM
shapes to the tile search as static numbers (``jaxmodel.workload.layer.static_gemm_shapes``):
each distinct GEMM is searched once, over the mappings that stay distinct at its shape, with
one tile class per dimension its tiles divide; GEMVs take their path alone. Same times as the
traced shapes (tests/ops/test_gemm.py, tests/workload/test_layer.py).

Run: ``.venv/bin/python experiments/bench_layer.py [n_points]`` → prints the figures and writes
``experiments/out/bench_layer.csv``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _bench import import_jaxmodel  # noqa: E402

jm, IMPORT_S, CACHE = import_jaxmodel()   # first: its import time is measured

import numpy as np  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pandas as pd  # noqa: E402

import hw_db  # noqa: E402

OUT = ROOT / "experiments" / "out"
N_POINTS = 20_480
REPEATS = 3
CHUNK = jm.workload.layer.LAYER_CHUNK   # points per chunk of the batched call (in the CSV)


def variants(n: int, seed: int = 0) -> jm.System:
    """``n`` hardware variants of the 4×A100 node (device leaves carry the batch axis)."""
    rng = np.random.default_rng(seed)
    system = hw_db.system("hgx_a100_4gpu")
    dev = system.device

    def logu(lo, hi):
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n))

    batch_dev = dataclasses.replace(
        dev,
        mem_bw=jnp.asarray(logu(0.4e12, 3.2e12)),
        global_buffer_bytes=jnp.asarray(logu(10 * 2**20, 80 * 2**20)),
        local_buffer_bytes=jnp.asarray(logu(64 * 2**10, 1024 * 2**10)),
        global_buffer_bytes_per_cycle=jnp.asarray(logu(1024, 8192)),
        core_count=jnp.asarray(rng.integers(32, 161, n).astype(float)),
        freq_hz=jnp.asarray(rng.uniform(0.9e9, 2.0e9, n)),
    )
    return dataclasses.replace(system, device=batch_dev)


def design_points(system, model, par):
    """Prefill + decode layer totals for every variant: two batched calls."""
    pre = jm.layer_breakdown(system, model, par, 8, 2048)
    dec = jm.layer_breakdown(system, model, par, 8, 1, phase="decode", kv_len=3072)
    return pre, dec


def main(n: int = N_POINTS):
    model = hw_db.model("gpt3-175b")
    par = jm.Parallelism(tp=4)
    system = variants(n)
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, "
          f"{os.cpu_count()} CPUs visible, float64={jax.config.jax_enable_x64}, "
          f"load average {os.getloadavg()[0]:.1f}")

    t0 = time.perf_counter()
    pre, dec = design_points(system, model, par)
    jax.block_until_ready((pre, dec))
    first = time.perf_counter() - t0

    times, cpu = [], []
    for _ in range(REPEATS):
        t0, c0 = time.perf_counter(), time.process_time()
        pre, dec = design_points(system, model, par)
        jax.block_until_ready((pre, dec))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    best = min(times)
    cpu_per_point = min(cpu) / n
    load = os.getloadavg()[0]
    compile_s = first - best

    # Cold start of one point: a configuration shape never seen before (unbatched, new model
    # name so nothing is cached): trace + compile + run of prefill and decode.
    single = hw_db.system("hgx_a100_4gpu")
    cold_model = dataclasses.replace(model, name="gpt3-175b-cold")
    t0 = time.perf_counter()
    p1, d1 = design_points(single, cold_model, par)
    jax.block_until_ready((p1, d1))
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    p1, d1 = design_points(single, cold_model, par)
    jax.block_until_ready((p1, d1))
    warm_single = time.perf_counter() - t0

    tot = np.concatenate([np.asarray(pre["total"]), np.asarray(dec["total"])])
    rows_all = np.stack([np.asarray(v) for d in (pre, dec) for v in d.values()])
    n_bad = int(np.sum(~np.isfinite(rows_all)))
    pps = n / best
    res = {
        "n_points": n, "chunk": CHUNK, "compile_plus_first_run_s": first,
        "compile_s_estimate": compile_s, "best_run_s": best, "points_per_s": pps,
        "cold_start_single_point_s": cold, "warm_single_point_s": warm_single,
        "nan_or_inf_values": n_bad, "cpu_s_per_point": cpu_per_point,
        "points_per_s_on_2_free_cores": 2.0 / cpu_per_point, "load_average": load,
        "prefill_ms_min": float(np.min(pre["total"]) * 1e3),
        "prefill_ms_max": float(np.max(pre["total"]) * 1e3),
        "decode_ms_min": float(np.min(dec["total"]) * 1e3),
        "decode_ms_max": float(np.max(dec["total"]) * 1e3),
        "a100_prefill_ms": float(p1["total"]) * 1e3, "a100_decode_ms": float(d1["total"]) * 1e3,
        "import_s": IMPORT_S, "compilation_cache": CACHE,
    }
    print(f"{n} hardware variants × (prefill + decode GPT-3 layer, full tile search)")
    print(f"  compile + first run: {first:8.2f} s   (compile ≈ {compile_s:.2f} s)")
    print(f"  steady state:        {best:8.3f} s   → {pps:,.0f} design points/s "
          f"(target ≥ 60,000; runs {', '.join(f'{t:.3f}' for t in times)})")
    print(f"  CPU time {cpu_per_point * 1e6:.0f} µs per point → {2.0 / cpu_per_point:,.0f} "
          f"points/s if 2 cores were free (machine load average {load:.1f} on "
          f"{os.cpu_count()} cores during the run)")
    print(f"  first answer (one new point: trace + compile + run): {cold:.2f} s; "
          f"second answer: {warm_single * 1e3:.1f} ms")
    print(f"  NaN/inf values in the batch: {n_bad} (of {rows_all.size})")
    print(f"  prefill {res['prefill_ms_min']:.1f}–{res['prefill_ms_max']:.1f} ms, "
          f"decode {res['decode_ms_min']:.3f}–{res['decode_ms_max']:.3f} ms per layer")
    print(f"  LLMCompass: ~1,000 s per prefill + decode point → speed-up ≈ {1000 * pps:,.0f}×")
    OUT.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([res]).to_csv(OUT / "bench_layer.csv", index=False)
    return res


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else N_POINTS)
