"""The main job (`make demo`): predictions, a large hardware sweep, a parallelism search and a
co-design run on the built-in hardware database; CSV + PNG into an output folder.

Sections (each prints its wall time):
  1. training step of GPT-3 175B and Llama-3-70B on 1024 A100 / H100 / B200 (one batched call);
  2. inference (prefill + decode) of both models on one 8-GPU node of each kind (one call);
  3. a ≥ 100,000-point hardware sweep of a GPT-3 175B layer (prefill + decode) over memory
     bandwidth, global/local buffer, cores and clock, priced with the device cost model, with
     its Pareto front (latency vs cost);
  4. a parallelism search for GPT-3 175B on 1536 A100s;
  5. a gradient co-design of an A100-like device (throughput per dollar).

Usage: ``python -m jaxmodel.demo --out demo_out [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm
import hw_db
from jaxmodel import plots

SYSTEMS = {"A100": "dgx_a100", "H100": "dgx_h100", "B200": "dgx_b200"}
MODELS = {"GPT-3 175B": "gpt3-175b", "Llama-3-70B": "llama3-70b"}


def _stack(trees):
    """Stack same-structure config pytrees into one batch (names unified: they are static)."""
    def unname(t):
        if dataclasses.is_dataclass(t) and hasattr(t, "name"):
            t = dataclasses.replace(t, name="batch")
        return t

    def fix(t):
        if isinstance(t, jm.System):
            return dataclasses.replace(t, device=unname(t.device), name="batch")
        return unname(t)

    trees = [fix(t) for t in trees]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x, float) for x in xs]),
                                  *trees)


def _section(title):
    print(f"\n== {title}", flush=True)
    return time.perf_counter()


def _done(t0):
    print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)


def training(out: Path) -> pd.DataFrame:
    t0 = _section("1. Training step: 1024 GPUs, global batch 1536, seq 2048")
    plans = {"gpt3-175b": jm.Parallelism(dp=16, tp=8, pp=8, sp=True, micro_batch=1,
                                         schedule="interleaved", interleave=3,
                                         recompute="selective", zero=1),
             "llama3-70b": jm.Parallelism(dp=32, tp=8, pp=4, sp=True, micro_batch=1,
                                          schedule="interleaved", interleave=5,
                                          recompute="selective", zero=1)}
    rows, systems, models, pars = [], [], [], []
    for hw, sname in SYSTEMS.items():
        sys_ = hw_db.system(sname, nodes=128)
        for mlabel, mname in MODELS.items():
            rows.append((hw, mlabel))
            systems.append(sys_)
            models.append(hw_db.model(mname))
            pars.append(plans[mname])
    r = jm.train_step(_stack(systems), _stack(models), _stack(pars), 1536, 2048)
    df = pd.DataFrame({"hardware": [a for a, _ in rows], "model": [b for _, b in rows],
                       "step_time_s": np.asarray(r.step_time_s), "mfu": np.asarray(r.mfu),
                       "tokens_per_s": np.asarray(r.tokens_per_s),
                       "memory_GB": np.asarray(r.memory_bytes) / 1e9,
                       "feasible": np.asarray(r.feasible)})
    for k, v in r.breakdown.items():
        df[f"{k}_s"] = np.asarray(v)
    df.to_csv(out / "training.csv", index=False)
    plots.breakdown_plot({f"{a} {b}": {k: float(df.loc[i, f"{k}_s"]) for k in r.breakdown}
                          for i, (a, b) in enumerate(rows)}, unit="s",
                         title="Training step breakdown (1024 GPUs)",
                         path=out / "training_breakdown.png")
    print(df[["hardware", "model", "step_time_s", "mfu", "memory_GB", "feasible"]]
          .to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    _done(t0)
    return df


def serving(out: Path) -> pd.DataFrame:
    t0 = _section("2. Inference: one 8-GPU node, TP 8, batch 16, prompt 2048, 256 new tokens")
    rows, systems, models = [], [], []
    for hw, sname in SYSTEMS.items():
        sys_ = hw_db.system(sname, nodes=1)
        for mlabel, mname in MODELS.items():
            rows.append((hw, mlabel))
            systems.append(sys_)
            models.append(hw_db.model(mname))
    r = jm.inference(_stack(systems), _stack(models), jm.Parallelism(tp=8), 16, 2048, 256)
    df = pd.DataFrame({"hardware": [a for a, _ in rows], "model": [b for _, b in rows],
                       "ttft_s": np.asarray(r.ttft_s), "tpot_s": np.asarray(r.tpot_s),
                       "total_s": np.asarray(r.total_s),
                       "tokens_per_s": np.asarray(r.tokens_per_s),
                       "memory_GB": np.asarray(r.memory_bytes) / 1e9,
                       "feasible": np.asarray(r.feasible)})
    df.to_csv(out / "inference.csv", index=False)
    print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    _done(t0)
    return df


def _layer_and_cost(dev, system, model, par):
    """Single-config objective of the sweep: GPT-3 layer prefill + decode latency and cost."""
    sys_ = dataclasses.replace(system, device=dev)
    pre = jm.layer_breakdown.single(sys_, model, par, 8.0, 2048.0, "prefill", 0.0)
    dec = jm.layer_breakdown.single(sys_, model, par, 8.0, 1.0, "decode", 3072.0)
    return {"prefill_s": pre["total"], "decode_s": dec["total"],
            "device_usd": jm.device_cost.single(dev).total_usd}


def hardware_sweep(out: Path, quick: bool) -> pd.DataFrame:
    n_bw = 8 if quick else 25
    grid = {"dev.mem_bw": np.linspace(0.8e12, 4.0e12, n_bw),
            "dev.global_buffer_bytes": np.array([10, 20, 40, 60, 80]) * 2**20,
            "dev.local_buffer_bytes": np.array([64, 128, 192, 256, 512]) * 2**10,
            "dev.core_count": np.array([64, 96, 108, 128, 160]) if quick else
            np.array([48, 64, 80, 96, 108, 128, 144, 160]),
            "dev.freq_hz": np.linspace(1.0e9, 2.0e9, 2 if quick else 5),
            "dev.mem_channels": np.array([4, 5, 6, 8]) if not quick else np.array([5])}
    n = int(np.prod([len(v) for v in grid.values()]))
    t0 = _section(f"3. Hardware sweep: {n:,} A100-like designs, GPT-3 175B layer "
                  "(prefill b=8 s=2048 + decode kv=3072, TP 4), priced")
    system = hw_db.system("hgx_a100_4gpu")
    dev = dataclasses.replace(system.device, name="sweep")
    df = jm.sweep(_layer_and_cost, dev, system, hw_db.model("gpt3-175b"), jm.Parallelism(tp=4),
                  grid=grid, progress=True)
    ok = np.isfinite(df["prefill_s"]) & np.isfinite(df["decode_s"])
    df["layer_s"] = df["prefill_s"] + df["decode_s"]
    df.to_csv(out / "hardware_sweep.csv", index=False)
    plots.pareto_plot(df[ok], x="device_usd", y="layer_s", maximize=False,
                      title="GPT-3 layer latency vs device cost (Pareto front)",
                      path=out / "hardware_sweep_pareto.png")
    best = df[ok].sort_values("layer_s").iloc[0]
    print(f"   {n:,} points in {df.attrs.get('wall_s', float('nan')):.1f} s "
          f"({n / max(df.attrs.get('wall_s', 1e-9), 1e-9):,.0f} points/s); "
          f"{int((~ok).sum())} infeasible; fastest: {best['layer_s'] * 1e3:.1f} ms "
          f"at ${best['device_usd']:.0f}")
    _done(t0)
    return df


def parallelism_search(out: Path, quick: bool) -> pd.DataFrame:
    n_dev = 1536
    t0 = _section(f"4. Parallelism search: GPT-3 175B on {n_dev} A100-80GB, batch 1536, seq 2048")
    # The demo restricts the options (ZeRO 0/1, SP on, no FlashAttention) to stay quick;
    # experiments/bench_search.py runs the full enumeration.
    df = jm.search_parallelism(hw_db.system("dgx_a100", nodes=n_dev // 8),
                               hw_db.model("gpt3-175b"), n_dev, 1536, 2048,
                               zero=(0, 1), sp=(True,), flash_attention=(False,))
    df.head(1000).to_csv(out / "parallelism_search_top1000.csv", index=False)
    best = df.iloc[0]
    print(f"   evaluated {df.attrs.get('n_evaluated', len(df)):,} plans in "
          f"{df.attrs.get('wall_s', float('nan')):.1f} s; best: dp={best['dp']:.0f} "
          f"tp={best['tp']:.0f} pp={best['pp']:.0f} mb={best['micro_batch']:.0f} "
          f"schedule={best['schedule']} recompute={best['recompute']} -> "
          f"{best['step_time_s']:.2f} s/step, MFU {best['mfu']:.3f}")
    _done(t0)
    return df


def codesign_run(out: Path, quick: bool):
    t0 = _section("5. Co-design: decode throughput per dollar of an A100-like device "
                  "(mem_bw, global buffer, cores; Adam in log space)")
    system = hw_db.system("hgx_a100_4gpu")
    base = dataclasses.replace(system.device, name="codesign")
    model = hw_db.model("gpt3-175b")
    par = jm.Parallelism(tp=4)

    def objective(p):
        dev = dataclasses.replace(base, mem_bw=p["mem_bw"], global_buffer_bytes=p["l2"],
                                  core_count=p["cores"])
        sys_ = dataclasses.replace(system, device=dev)
        decode = jm.layer_breakdown.single(sys_, model, par, 8.0, 1.0, "decode", 3072.0)
        # USD · seconds per decode step: lower is better (throughput per dollar).
        return decode["total"] * jm.device_cost.single(dev).total_usd

    res = jm.codesign(objective, init={"mem_bw": 2.0e12, "l2": 40 * 2**20, "cores": 108},
                      bounds={"mem_bw": (0.8e12, 4.0e12), "l2": (10 * 2**20, 80 * 2**20),
                              "cores": (48, 160)},
                      steps=20 if quick else 60, integer=["cores"])
    summary = {"best_params": {k: float(v) for k, v in res.params.items()},
               "objective": float(res.value), "n_evals": int(res.n_evals),
               "start_objective": float(objective({"mem_bw": jnp.float32(2.0e12),
                                                   "l2": jnp.float32(40 * 2**20),
                                                   "cores": jnp.float32(108)}))}
    (out / "codesign.json").write_text(json.dumps(summary, indent=2))
    print(f"   {json.dumps(summary)}")
    _done(t0)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m jaxmodel.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    ap.add_argument("--quick", action="store_true", help="smaller sweep and fewer steps")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    print(f"jaxmodel demo -> {out}/  (JAX {jax.__version__}, devices: {jax.devices()})")
    training(out)
    serving(out)
    hardware_sweep(out, args.quick)
    parallelism_search(out, args.quick)
    codesign_run(out, args.quick)
    files = sorted(p.name for p in out.iterdir())
    print(f"\nDone in {time.perf_counter() - t_all:.0f} s; wrote {len(files)} files: "
          + ", ".join(files))


if __name__ == "__main__":
    main()
