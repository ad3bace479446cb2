"""LLMCompass §IV–V design-space sweeps, reproduced with ``jm.sweep``.

§IV-A setup: every unmentioned specification is an NVIDIA A100's; 4-way tensor parallelism on
the 4-GPU NVLink node (``hw_db.system("hgx_a100_4gpu")``); one GPT-3 175B layer; prefill of
batch 8 × 2048 tokens; decoding = generating the 1024th output token (batch 8, 2048 + 1023
cached tokens); FP16. Latencies are ``jm.layer_breakdown`` (LLMCompass layer on
the ops and the all-reduce model), areas ``jm.die_area``.

- Fig. 7: compute designs A–E of Table III (cores × lanes × vector width × systolic array ×
  local buffer; the register file scales with the vector width; physical = active cores);
- Fig. 8: main-memory bandwidth 400 … 3200 GB/s;
- Fig. 9: local buffer 64 KiB … 1 MiB per core (with die area);
- §IV-D: global buffer 10 … 80 MB (with die area);
- Figs. 10–12: the latency- and throughput-oriented designs of Table IV (built in
  ``experiments/llmcompass_table4.py``) against GA100: Fig. 10 normalised 1/latency (batch 16,
  TP 4, 48 layers) per input/output length; Fig. 11 decode latency per layer by operator;
  Fig. 12 tokens/s of the throughput design (PP 8, 12 layers per device, 8 micro-batches of
  the largest batch that fits) normalised to 8 GA100s (:func:`fig12`).

Prints each figure's headline numbers next to the paper's text, writes
``experiments/out/llmcompass_sweeps.csv`` (long format) and ``llmcompass_sweeps.png``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001
import hw_db
from jaxmodel.workload.layer import LAYER_OPS, Work

from common import OUT  # noqa: E402
KIB, MIB = 1024.0, 2.0 ** 20
GPT3 = "gpt3-175b"
PREFILL = dict(batch=8.0, seq_len=2048.0, phase="prefill", kv_len=0.0)
DECODE = dict(batch=8.0, seq_len=1.0, phase="decode", kv_len=2048.0 + 1023.0)
OPS = [op for op in LAYER_OPS if not op.startswith("moe")]

# Table III: cores, lanes, vector width, systolic array, local buffer (KiB)
TABLE3 = {"A": (128, 4, 8, 8, 192), "B": (128, 4, 32, 16, 192), "C": (128, 1, 128, 32, 192),
          "D": (32, 1, 512, 64, 768), "E": (8, 1, 2048, 128, 3072)}


def _table4_designs():
    path = Path(__file__).resolve().parent / "llmcompass_table4.py"
    spec = importlib.util.spec_from_file_location("llmcompass_table4", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.designs(), mod.stack


def layer(system, model, par, batch, seq_len, phase, kv_len):
    """One layer's op latencies (single config; ``jm.sweep`` batches it)."""
    return jm.layer_breakdown.single(system, model, par, Work(batch, seq_len, phase, kv_len))


def sweep_layer(system, model, par, grid=None):
    """Prefill and decode breakdowns of a (batched) system over a grid: two DataFrames."""
    return [jm.sweep(layer, system, model, par, progress=False, grid=grid, **w)
            for w in (PREFILL, DECODE)]


def with_device(system, **fields):
    return dataclasses.replace(system, device=dataclasses.replace(system.device, **fields))


def fig7(base, model, par):
    dev = base.device
    rf = 65536.0  # GA100 register file per lane (hw_db/tech/device_area.toml [generic])
    cols = {k: [] for k in ("core_count", "physical_core_count", "lanes_per_core",
                            "vector_width", "sa_rows", "sa_cols", "local_buffer_bytes",
                            "physical_local_buffer_bytes", "regfile_bytes_per_lane")}
    for cores, lanes, vw, sa, lb in TABLE3.values():
        for k, v in zip(cols, (cores, cores, lanes, vw, sa, sa, lb * KIB, lb * KIB,
                               rf * vw / 32.0)):
            cols[k].append(float(v))
    devs = dataclasses.replace(dev, **{k: jnp.asarray(v) for k, v in cols.items()})
    pre, dec = sweep_layer(dataclasses.replace(base, device=devs), model, par)
    area = np.asarray(jm.die_area(devs)["total"])
    return pre, dec, area


def headline(name, ours, paper):
    print(f"  {name:58s} jaxmodel {ours:>9s}   paper {paper}")


#: Pipeline depth and micro-batches of Fig. 12 (8 stages of 12 GPT-3 layers, one micro-batch
#: in flight per stage).
PP12 = 8.0
#: Candidate batch sizes (sequences) for "the largest batch within memory capacity".
BATCH_GRID = np.arange(1.0, 4097.0)


def _largest(mem, cap):
    """Largest ``BATCH_GRID`` entry whose memory (last axis) fits ``cap`` (0 if none)."""
    return np.where(mem <= cap, BATCH_GRID, 0.0).max(axis=-1)


def fig12(base, model, devs, prompts, gens):
    """LLMCompass Fig. 12: the throughput design against GA100, 8-way pipelined inference.

    The paper (§V-B, Fig. 12; its artifact ``ae/figure12``) runs each device's 12 layers on
    the largest batch whose KV cache fits the device and counts throughput as that batch's
    tokens over one stage's time: the pipeline is full, one micro-batch per stage. Here that is
    ``jm.inference(..., micro_batches=8)`` on 8 micro-batches of that size (the paper's
    memory accounting: one micro-batch's KV cache resident per stage, ``memory_rule`` off for
    the other seven). Beside it, the same schedule when every micro-batch's KV cache must be
    resident (the largest total batch that fits, split in 8).

    Returns ``(ratio [prompt, gen], rows)``.
    """
    node8 = dataclasses.replace(base, levels=(dataclasses.replace(base.levels[0], size=PP12),))
    par = jm.Parallelism(pp=PP12)
    P, G = np.meshgrid(prompts, gens, indexing="ij")
    p, g = P.reshape(-1), G.reshape(-1)
    cap = np.asarray(devs.mem_capacity)[:, None]                          # (design, 1)
    mem = jm.workload.inference_memory(model, par, BATCH_GRID[None, :], p[:, None],
                                       g[:, None])                         # (case, batch)
    one = _largest(np.asarray(mem["total"])[None], cap[..., None])         # paper: 1 resident
    acts = np.asarray(mem["activations"]) * (1.0 - 1.0 / PP12)             # one mb's working set
    allmb = _largest(np.asarray(mem["total"] - acts)[None], cap[..., None])  # all resident
    n_dev = one.shape[0]
    batch = np.stack([PP12 * one, allmb])                                  # (acct, design, case)

    def run(dev, b, pl, gl):
        s = dataclasses.replace(node8, device=dev)
        return jm.inference.single(s, model, par, b, pl, gl, memory_rule=False,
                                   micro_batches=PP12)

    dev_b = jax.tree.map(lambda x: jnp.broadcast_to(
        jnp.asarray(x)[None, :, None], (2, n_dev, len(p))).reshape(-1), devs)
    pb = np.broadcast_to(p, batch.shape).reshape(-1)
    gb = np.broadcast_to(g, batch.shape).reshape(-1)
    ok = batch.reshape(-1) >= PP12
    r = jax.jit(jax.vmap(run))(dev_b, jnp.asarray(np.where(ok, batch.reshape(-1), PP12)),
                               jnp.asarray(pb), jnp.asarray(gb))
    tps = np.where(ok & np.asarray(r.feasible), np.asarray(r.tokens_per_s), np.nan)
    tps = tps.reshape(2, n_dev, len(prompts), len(gens))
    lat = np.asarray(r.total_s).reshape(tps.shape)
    ratio = tps[:, 1] / tps[:, 0]
    rows = []
    for a, acct in enumerate(("paper", "all_resident")):
        for i, pl in enumerate(prompts):
            for j, gl in enumerate(gens):
                for k, n in enumerate(("ga100", "throughput")):
                    rows.append(dict(figure="fig12", knob=f"prompt_gen_{acct}",
                                     value=f"{pl:.0f}/{gl:.0f}", phase="end_to_end",
                                     op=f"tokens_per_s_{n}", seconds=float(tps[a, k, i, j]),
                                     die_area_mm2=np.nan))
    print("Fig. 12 — throughput design vs 8 GA100 (PP 8, 8 micro-batches, largest batch "
          "that fits)")
    geo = [np.exp(np.nanmean(np.log(x))) for x in ratio]
    headline("mean throughput ratio (paper: one micro-batch's KV resident)",
             f"{geo[0]:.2f}x", "1.42x")
    headline("mean latency ratio at those batches",
             f"{np.exp(np.nanmean(np.log(lat[0, 1] / lat[0, 0]))):.2f}x", "9.21x")
    headline("mean throughput ratio, every micro-batch's KV resident", f"{geo[1]:.2f}x", "—")
    print(f"  micro-batch sizes (paper accounting), GA100: {one[0].astype(int).tolist()}, "
          f"throughput design: {one[1].astype(int).tolist()}")
    return ratio[0], rows


def main():
    t0 = time.time()
    base = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model(GPT3)
    par = jm.Parallelism(tp=4)
    rows = []

    def record(fig, x_name, xs, pre, dec, area=None):
        for phase, df in (("prefill", pre), ("decode", dec)):
            for i, x in enumerate(xs):
                for op in OPS + ["total"]:
                    rows.append(dict(figure=fig, knob=x_name, value=x, phase=phase, op=op,
                                     seconds=float(df[op].iloc[i]),
                                     die_area_mm2=(float(area[i]) if area is not None
                                                   else np.nan)))

    # ---- Fig. 7 ---------------------------------------------------------------------------
    pre, dec, area = fig7(base, model, par)
    record("fig7", "design", list(TABLE3), pre, dec, area)
    tp, td = pre["total"].to_numpy(), dec["total"].to_numpy()
    print("Fig. 7 — compute designs A–E (Table III), GPT-3 layer, TP 4")
    for i, d in enumerate(TABLE3):
        print(f"  {d}: prefill {tp[i] * 1e3:7.2f} ms  decode {td[i] * 1e6:7.1f} us  "
              f"area {area[i]:6.0f} mm²")
    headline("A vs B: prefill latency ratio", f"{tp[0] / tp[1]:.2f}x", "3.25x")
    headline("A vs B: decode latency change", f"{100 * (td[0] / td[1] - 1):+.1f} %", "+0.1 %")
    headline("A vs B: area ratio", f"{100 * area[0] / area[1]:.1f} %", "57.8 %")
    headline("E vs B: prefill latency change", f"{100 * (tp[4] / tp[1] - 1):+.1f} %", "+12.4 %")
    headline("E vs B: decode latency change", f"{100 * (td[4] / td[1] - 1):+.1f} %", "+30.8 %")
    headline("E vs B: area change", f"{100 * (area[4] / area[1] - 1):+.1f} %", "-7.7 %")

    # ---- Fig. 8 ---------------------------------------------------------------------------
    bws = [400e9 * i for i in range(1, 9)]
    pre, dec = sweep_layer(base, model, par, grid={"system.device.mem_bw": bws})
    record("fig8", "mem_bw", bws, pre, dec)
    tp, td = pre["total"].to_numpy(), dec["total"].to_numpy()
    i800, i2000, i3200 = 1, 4, 7
    print("Fig. 8 — memory bandwidth 400 … 3200 GB/s")
    headline("prefill 800→2000 GB/s latency change", f"{100 * (tp[i2000] / tp[i800] - 1):+.1f} %",
             "-14.3 %")
    headline("prefill 2000→3200 GB/s latency change",
             f"{100 * (tp[i3200] / tp[i2000] - 1):+.1f} %", "-3.5 %")
    headline("decode 800→2000 GB/s speed-up", f"{td[i800] / td[i2000]:.2f}x", "1.88x")
    headline("decode 2000→3200 GB/s gain", f"{100 * (td[i2000] / td[i3200] - 1):+.1f} %",
             "+26 %")

    def buffer_sweep(fig, field, col, values, unit):
        """Layer times and die area with ``field`` (and its physical twin) swept."""
        arr = jnp.asarray([x * unit for x in values])
        s = with_device(base, **{field: arr, f"physical_{field}": arr})
        pre, dec = sweep_layer(s, model, par)
        area = np.asarray(jm.die_area(s.device)["total"])
        record(fig, col, values, pre, dec, area)
        return pre["total"].to_numpy(), dec["total"].to_numpy(), area

    # ---- Fig. 9: local buffer -------------------------------------------------------------
    lbs = [64, 128, 192, 256, 384, 512, 768, 1024]
    tp, td, area = buffer_sweep("fig9", "local_buffer_bytes", "local_buffer_kib", lbs, KIB)
    print("Fig. 9 — local buffer 64 KiB … 1 MiB per core")
    headline("prefill 64→192 KiB performance gain", f"{100 * (tp[0] / tp[2] - 1):+.1f} %",
             "+18.0 %")
    headline("area 64→192 KiB", f"{100 * (area[2] / area[0] - 1):+.1f} %", "+5.8 %")
    headline("prefill 192→1024 KiB performance gain", f"{100 * (tp[2] / tp[7] - 1):+.1f} %",
             "+0.2 %")
    headline("area 192→1024 KiB", f"{100 * (area[7] / area[2] - 1):+.1f} %", "+28.8 %")
    headline("decode 64→1024 KiB performance gain", f"{100 * (td[0] / td[7] - 1):+.1f} %",
             "+0.5 %")

    # ---- §IV-D: global buffer -------------------------------------------------------------
    gbs = [10, 20, 30, 40, 50, 60, 70, 80]
    tp, td, area = buffer_sweep("global_buffer", "global_buffer_bytes", "global_buffer_mb",
                                gbs, 1e6)
    print("§IV-D — global buffer 10 … 80 MB")
    headline("prefill 10→40 MB speed-up", f"{100 * (tp[0] / tp[3] - 1):+.1f} %", "+11.8 %")
    headline("area 10→40 MB", f"{100 * (area[3] / area[0] - 1):+.1f} %", "+9.6 %")
    headline("prefill 40→80 MB speed-up", f"{100 * (tp[3] / tp[7] - 1):+.2f} %", "+0.01 %")
    headline("area 40→80 MB", f"{100 * (area[7] / area[3] - 1):+.1f} %", "+11.7 %")
    headline("decode 10→80 MB speed-up", f"{100 * (td[0] / td[7] - 1):+.1f} %", "+0.7 %")

    # ---- Figs. 10–12: Table IV designs ------------------------------------------------------
    designs, stack = _table4_designs()
    names = ["ga100", "latency", "throughput"]
    devs = stack([designs[n] for n in names])
    prompts, gens = [256.0, 512.0, 1024.0, 2048.0], [256.0, 512.0, 1024.0, 2048.0]
    P, G = np.meshgrid(prompts, gens, indexing="ij")
    lat_model = dataclasses.replace(model, n_layers=48.0)
    sys_lat = dataclasses.replace(base, device=jm.Device(**{
        f.name: (getattr(devs, f.name)[:2, None] if f.name != "name" else devs.name)
        for f in dataclasses.fields(jm.Device)}))
    r = jm.inference(sys_lat, lat_model, par, 16.0, jnp.asarray(P.reshape(-1)),
                     jnp.asarray(G.reshape(-1)))
    total = np.asarray(r.total_s).reshape(2, len(prompts), len(gens))
    feasible = np.isfinite(total[0]) & np.isfinite(total[1])   # 2048/2048 exceeds memory
    norm = np.where(feasible, total[0] / np.where(feasible, total[1], 1.0), np.nan)
    for (i, p), (j, g) in [((a, prompts[a]), (b, gens[b])) for a in range(len(prompts))
                           for b in range(len(gens))]:
        rows.append(dict(figure="fig10", knob="prompt_gen", value=f"{p:.0f}/{g:.0f}",
                         phase="end_to_end", op="norm_perf_latency_design",
                         seconds=float(norm[i, j]), die_area_mm2=np.nan))
    print("Fig. 10 — latency design vs GA100 (batch 16, TP 4, 48 layers): 1/latency ratio")
    headline(f"geo. mean over the {feasible.sum()} feasible input × output lengths",
             f"{np.exp(np.log(norm[feasible]).mean()):.3f}", "0.953")
    headline("input 2048, output 256", f"{norm[3, 0]:.2f}", "0.80")
    headline("input 256, output 2048", f"{norm[0, 3]:.2f}", "0.99")

    ld = [jm.layer_breakdown(dataclasses.replace(base, device=designs[n]), model, par, 16.0,
                             1.0, "decode", kv_len=2048.0 + 1023.0) for n in names[:2]]
    for n, d in zip(names[:2], ld):
        for op in OPS + ["total"]:
            rows.append(dict(figure="fig11", knob="design", value=n, phase="decode", op=op,
                             seconds=float(d[op]), die_area_mm2=np.nan))
    headline("Fig. 11 decode latency per layer, latency design / GA100",
             f"{float(ld[1]['total'] / ld[0]['total']):.3f}", "≈1.00 (identical)")

    # Fig. 12: PP 8 on one 8-device node, 12 layers per device, micro-batched
    ratio, fig12_rows = fig12(base, model, jax.tree.map(lambda x: x[jnp.asarray([0, 2])],
                                                        devs), prompts, gens)
    rows += fig12_rows

    df = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "llmcompass_sweeps.csv", index=False)
    _plot(df, prompts, gens, norm, ratio)
    print(f"wrote {OUT / 'llmcompass_sweeps.csv'} ({len(df)} rows) and .png; "
          f"{time.time() - t0:.0f} s")
    return df


def _plot(df, prompts, gens, norm, ratio):
    from jaxmodel.plots import figure, save
    fig = figure((15, 8))
    axes = fig.subplots(2, 4)
    specs = [("fig7", "design"), ("fig8", "mem_bw"), ("fig9", "local_buffer_kib"),
             ("global_buffer", "global_buffer_mb")]
    cmap = __import__("matplotlib").colormaps["tab20"]
    for col, (fig_id, knob) in enumerate(specs):
        for row, phase in enumerate(("prefill", "decode")):
            ax = axes[row, col]
            sub = df[(df.figure == fig_id) & (df.phase == phase) & (df.op != "total")]
            xs = list(dict.fromkeys(sub.value))
            base = np.zeros(len(xs))
            scale = 1e3 if phase == "prefill" else 1e6
            for k, op in enumerate(OPS):
                v = np.array([sub[(sub.value == x) & (sub.op == op)].seconds.sum()
                              for x in xs]) * scale
                ax.bar(range(len(xs)), v, bottom=base, color=cmap(k), label=op)
                base += v
            labels = [f"{x / 1e9:.0f}" if knob == "mem_bw" else str(x) for x in xs]
            ax.set_xticks(range(len(xs)), labels, fontsize=7, rotation=45)
            ax.set_ylabel(f"{phase} ({'ms' if phase == 'prefill' else 'µs'})", fontsize=8)
            ax.set_title(f"{fig_id}: {knob}", fontsize=9)
    axes[0, 0].legend(fontsize=5, ncols=2)
    save(fig, OUT / "llmcompass_sweeps.png")
    fig2 = figure((9, 3.5))
    a, b = fig2.subplots(1, 2)
    for ax, mat, title in ((a, norm, "Fig. 10: latency design / GA100 (1/latency)"),
                           (b, ratio, "Fig. 12: throughput design / GA100 (tokens/s)")):
        im = ax.imshow(mat, origin="lower", cmap="viridis")
        ax.set_xticks(range(len(gens)), [f"{g:.0f}" for g in gens])
        ax.set_yticks(range(len(prompts)), [f"{p:.0f}" for p in prompts])
        ax.set_xlabel("output length")
        ax.set_ylabel("input length")
        ax.set_title(title, fontsize=9)
        for (i, j), v in np.ndenumerate(mat):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w")
        fig2.colorbar(im, ax=ax)
    save(fig2, OUT / "llmcompass_sweeps_designs.png")


if __name__ == "__main__":
    main()
