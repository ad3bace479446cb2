"""LLMCompass Table IV: latency- and throughput-oriented designs vs a full GA100.

LLMCompass §V, Table IV. Three designs built from ``hw_db.device("a100_80gb")`` with the Table IV
changes (everything else as the GA100: clock, lanes, vector width, register file, links,
overheads):

* GA100 (full): 128 cores, 48 MiB global buffer (5120 B/clk), HBM2e 2 TB/s, 80 GB;
* latency design: 64 cores, 24 MiB global buffer, 2560 B/clk;
* throughput design: 64 cores, 32×32 systolic arrays, 768 KiB local buffer, 1 TB/s of
  PCIe5/CXL memory (256 lanes × 32 Gb/s), 512 GB.

Area: ``jm.die_area``. Die cost: wafer/DPW at 7 nm without yield (``include_yield=False``, the
Table IV convention, see ``jaxmodel.cost.device``); memory cost: capacity × $/GB. Performance:
``jm.inference`` — latency design: GPT-3 with 48 layers (half), TP 4 on a
4-device NVLink node, batch 16, performance = 1/latency (seed Fig. 10); throughput design: GPT-3
96 layers, PP 8 (12 layers per device), the largest power-of-two batch that fits in memory,
performance = tokens/s (seed Fig. 12). Both are averaged (geometric mean of the ratio to GA100)
over prompt lengths {256, 512, 1024, 2048} × output lengths {256, 512, 1024}, where feasible.
Everything is one batched ``jm.inference`` call.

Writes ``experiments/out/llmcompass_table4.csv`` / ``.png`` and prints the table next to the
paper's values.
"""

from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np

import hw_db
import jaxmodel as jm

from common import OUT  # noqa: E402
MIB = 2.0 ** 20
PAPER = {  # Table IV: area mm², normalised performance, die $, memory $, total $, perf/cost
    "latency": (478, 0.95, 80, 560, 640, 1.06),
    "ga100": (826, 1.00, 151, 560, 711, 1.00),
    "throughput": (787, 1.41, 142, 154, 296, 3.41),
}
PROMPTS = [256.0, 512.0, 1024.0, 2048.0]
GENS = [256.0, 512.0, 1024.0]
BATCHES = [2.0 ** i for i in range(0, 12)]


def designs():
    a100 = hw_db.device("a100_80gb")
    ga100 = dataclasses.replace(a100, core_count=128.0, physical_core_count=128.0,
                                global_buffer_bytes=48 * MIB,
                                physical_global_buffer_bytes=48 * MIB, mem_bw=2.048e12)
    lat = dataclasses.replace(ga100, core_count=64.0, physical_core_count=64.0,
                              global_buffer_bytes=24 * MIB,
                              physical_global_buffer_bytes=24 * MIB,
                              global_buffer_bytes_per_cycle=2560.0)
    thr = dataclasses.replace(ga100, core_count=64.0, physical_core_count=64.0, sa_rows=32.0,
                              sa_cols=32.0, local_buffer_bytes=768 * 1024.0, mem_bw=1.024e12,
                              mem_capacity=512e9, mem_protocol=2.0, mem_channels=256.0,
                              physical_mem_channels=256.0)
    return {"latency": lat, "ga100": ga100, "throughput": thr}


def stack(devs):
    """One Device whose leaves carry a leading design axis."""
    leaves = [dataclasses.asdict(d) for d in devs]
    fields = {f.name: jnp.asarray([l[f.name] for l in leaves], dtype=jnp.float32)
              for f in dataclasses.fields(jm.Device) if f.name != "name"}
    return jm.Device(name=devs[0].name, **fields)


def main():
    t0 = time.time()
    d = designs()
    names = list(d)
    dev = stack([d[n] for n in names])                       # (3,)
    area = np.asarray(jm.die_area(dev)["total"])
    cost = jm.device_cost(dev, include_yield=False)
    die_usd, mem_usd = np.asarray(cost.die_usd), np.asarray(cost.memory_usd)
    yielded = np.asarray(jm.device_cost(dev).die_usd)

    # Performance: axes (design 3, scenario 2, prompt 4, gen 3, batch 12) in one call.
    base = hw_db.system("hgx_a100_4gpu")
    lvl = base.levels[0]
    sc_size = jnp.array([4.0, 8.0])
    e = lambda x, ax, nd=5: jnp.reshape(x, [-1 if i == ax else 1 for i in range(nd)])  # noqa
    bdev = jax_tree_expand(dev, 0)
    system = jm.System(device=bdev, levels=(dataclasses.replace(lvl, size=e(sc_size, 1)),))
    gpt3 = hw_db.model("gpt3-175b")
    model = dataclasses.replace(gpt3, n_layers=e(jnp.array([48.0, 96.0]), 1))
    par = jm.Parallelism(tp=e(jnp.array([4.0, 1.0]), 1), pp=e(jnp.array([1.0, 8.0]), 1))
    batch = jnp.where(e(jnp.array([True, False]), 1), 16.0, e(jnp.array(BATCHES), 4))
    r = jm.inference(system, model, par, batch, e(jnp.array(PROMPTS), 2),
                     e(jnp.array(GENS), 3))
    total = np.asarray(r.total_s)
    tps = np.asarray(r.tokens_per_s)
    feas = np.asarray(r.feasible)
    shape = np.broadcast_shapes(total.shape, (3, 2, len(PROMPTS), len(GENS), len(BATCHES)))
    total, tps, feas = (np.broadcast_to(x, shape) for x in (total, tps, feas))

    # latency scenario: batch 16 (batch axis constant), perf = 1/latency
    lat_perf = np.where(feas[:, 0, :, :, 0], 1.0 / total[:, 0, :, :, 0], np.nan)
    # throughput scenario: best feasible batch, perf = tokens/s
    thr_perf = np.where(feas[:, 1], tps[:, 1], -np.inf).max(axis=-1)
    thr_perf = np.where(np.isfinite(thr_perf) & (thr_perf > 0), thr_perf, np.nan)
    best_batch = np.array(BATCHES)[np.where(feas[:, 1], tps[:, 1], -np.inf).argmax(axis=-1)]
    g = names.index("ga100")

    def geo_ratio(perf, i):
        ratio = perf[i] / perf[g]
        ok = np.isfinite(ratio)
        return float(np.exp(np.mean(np.log(ratio[ok])))) if ok.any() else float("nan"), int(
            ok.sum())

    rows = []
    for i, n in enumerate(names):
        perf_lat, n_lat = geo_ratio(lat_perf, i)
        perf_thr, n_thr = geo_ratio(thr_perf, i)
        perf = perf_thr if n == "throughput" else perf_lat
        tot = die_usd[i] + mem_usd[i]
        rows.append(dict(design=n, die_area_mm2=area[i], paper_area_mm2=PAPER[n][0],
                         norm_perf=perf, paper_norm_perf=PAPER[n][1],
                         norm_perf_latency_scenario=perf_lat,
                         norm_perf_throughput_scenario=perf_thr,
                         points_latency=n_lat, points_throughput=n_thr,
                         die_usd=die_usd[i], paper_die_usd=PAPER[n][2],
                         die_usd_with_yield=yielded[i],
                         memory_usd=mem_usd[i], paper_memory_usd=PAPER[n][3],
                         total_usd=tot, paper_total_usd=PAPER[n][4],
                         max_batch_median=float(np.median(best_batch[i]))))
    import pandas as pd
    df = pd.DataFrame(rows)
    gtot = df.loc[df.design == "ga100", "total_usd"].item()
    df["norm_perf_per_cost"] = df.norm_perf / (df.total_usd / gtot)
    df["paper_norm_perf_per_cost"] = [PAPER[n][5] for n in df.design]
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "llmcompass_table4.csv", index=False)
    pd.set_option("display.width", 200)
    show = ["design", "die_area_mm2", "paper_area_mm2", "norm_perf", "paper_norm_perf",
            "die_usd", "paper_die_usd", "memory_usd", "paper_memory_usd", "total_usd",
            "paper_total_usd", "norm_perf_per_cost", "paper_norm_perf_per_cost"]
    print(df[show].round(3).to_string(index=False))
    for _, row in df.iterrows():
        print(f"{row.design:10s} area err {100 * (row.die_area_mm2 / row.paper_area_mm2 - 1):+.1f} %"
              f", die $ err {100 * (row.die_usd / row.paper_die_usd - 1):+.1f} %"
              f", perf/cost {row.norm_perf_per_cost:.2f} (paper {row.paper_norm_perf_per_cost})")
    print(f"performance from jm.inference over {len(PROMPTS)}x{len(GENS)} length pairs "
          f"(feasible points per design: latency {list(df.points_latency)}, throughput "
          f"{list(df.points_throughput)}); {time.time() - t0:.0f} s")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    x = np.arange(len(df))
    for ax, (ours, paper, title) in zip(axes, [
            ("die_area_mm2", "paper_area_mm2", "die area (mm²)"),
            ("total_usd", "paper_total_usd", "die + memory cost (USD)"),
            ("norm_perf_per_cost", "paper_norm_perf_per_cost", "perf / cost (norm. GA100)")]):
        ax.bar(x - 0.2, df[ours], 0.4, label="jaxmodel")
        ax.bar(x + 0.2, df[paper], 0.4, label="LLMCompass Table IV")
        ax.set_xticks(x, df.design)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "llmcompass_table4.png", dpi=120)
    return df


def jax_tree_expand(dev, axis_len_first):
    """Reshape the design axis of every leaf to (3, 1, 1, 1, 1) for 5-D broadcasting."""
    import jax
    return jax.tree_util.tree_map(lambda v: jnp.reshape(v, (-1, 1, 1, 1, 1)), dev)


if __name__ == "__main__":
    main()
