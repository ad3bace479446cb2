"""Guo et al. Fig. 4 inset: Llama-70B inference on 8 and 16 A100s under four topologies.

Guo et al. §V-C: "a system of 8 and 16 NVIDIA A100 GPUs connected by a variety of topologies.
The total off-GPU bandwidth is divided by the number of links to determine the link bandwidth
in each topology." Expected: fully connected best, then switch, then ring and 2D mesh, the gap
growing with the system size; 2D mesh worst (lower link bandwidth than the ring).

Set-up (the seed does not state the workload; these are our choices): Llama-2-70B, fp16,
tensor parallelism over all devices (TP = 8 and 16), batch 8, 2048-token prompts, 128 generated
tokens. Every system has one tier of ``n`` A100-80GB with 300 GB/s off-device bandwidth per
GPU (A100 NVLink3) and the NVLink per-hop latency and NCCL-calibrated efficiency / chunk /
base latency of ``dgx_a100`` (hw_db) — or, as a second variant, Guo et al.'s eq. 4 alone (full
link bandwidth, link latency only); only the topology differs. One batched ``jm.inference``
call evaluates all 16 systems. Communication = the tensor-parallel all-reduces of every layer
(prefill + all decode steps); compute = the rest of the end-to-end latency.

Run: ``.venv/bin/python experiments/topology_study.py``. Writes
``experiments/out/topology_study.csv`` and ``.png``.
"""

from __future__ import annotations

import sys
import time

import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (import before hw_db)
import hw_db

from common import OUT  # noqa: E402
TOPOLOGIES = ("fully_connected", "switch", "ring", "mesh2d")
SIZES = (8, 16)
BATCH, PROMPT, GEN = 8, 2048, 128
# "calibrated": hw_db constants (NCCL-calibrated efficiency, per-chunk and base latency);
# "seed_eq4": Guo et al.'s eq. 4 alone (full link bandwidth, link latency only).
VARIANTS = ("calibrated", "seed_eq4")


def main():
    ref = hw_db.system("dgx_a100").levels[0]
    codes = [float(jm.TOPOLOGIES.index(t)) for t in TOPOLOGIES]
    grid = [(v, n, c) for v in VARIANTS for n in SIZES for c in codes]
    calibrated = jnp.array([v == "calibrated" for v, _, _ in grid])
    topo = jnp.array([c for _, _, c in grid])
    size = jnp.array([float(n) for _, n, _ in grid])
    level = jm.NetLevel(size=size, topology=topo, bw_per_device=300e9,
                        link_latency=ref.link_latency,
                        efficiency=jnp.where(calibrated, ref.efficiency, 1.0),
                        chunk_latency=jnp.where(calibrated, ref.chunk_latency, 0.0),
                        base_latency=jnp.where(calibrated, ref.base_latency, 0.0),
                        flit_bytes=ref.flit_bytes, header_bytes=ref.header_bytes,
                        max_payload_bytes=ref.max_payload_bytes)
    system = jm.System(device=hw_db.device("a100_80gb"), levels=(level,))
    model = hw_db.model("llama2-70b")
    par = jm.Parallelism(dp=1, tp=size, pp=1)
    t0 = time.perf_counter()
    res = jm.inference(system, model, par, BATCH, PROMPT, GEN)
    elapsed = time.perf_counter() - t0
    bd = res.breakdown
    n_layers = float(model.n_layers)
    comm_pre = n_layers * (np.asarray(bd["prefill.allreduce_mha"])
                           + np.asarray(bd["prefill.allreduce_ffn"]))
    comm_dec = n_layers * (np.asarray(bd["decode.allreduce_mha"])
                           + np.asarray(bd["decode.allreduce_ffn"]))
    total = np.asarray(res.total_s)
    comm = comm_pre + (GEN - 1) * comm_dec
    df = pd.DataFrame({
        "network_model": [v for v, _, _ in grid], "gpus": np.asarray(size).astype(int),
        "topology": [jm.TOPOLOGIES[int(c)] for c in np.asarray(topo)],
        "feasible": np.asarray(res.feasible), "ttft_s": np.asarray(res.ttft_s),
        "tpot_s": np.asarray(res.tpot_s), "total_s": total, "communication_s": comm,
        "compute_s": total - comm, "comm_share": comm / total,
        "tokens_per_s": np.asarray(res.tokens_per_s)})
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "topology_study.csv", index=False)
    pd.set_option("display.width", 160)
    print(f"Llama-2-70B, batch {BATCH}, prompt {PROMPT}, {GEN} generated tokens, TP = #GPUs, "
          f"300 GB/s off-GPU bandwidth per A100 (one batched call, {elapsed:.1f} s)")
    print(df.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for v in VARIANTS:
        for n in SIZES:
            d = df[(df.gpus == n) & (df.network_model == v)].set_index("topology")
            order = " < ".join(d.total_s.sort_values().index)
            print(f"{v:10s} {n:2d} GPUs, end-to-end latency: {order}")
    plot(df, OUT / "topology_study.png")
    print(f"wrote {OUT / 'topology_study.csv'} and .png")
    return 0


def plot(df, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(VARIANTS), figsize=(13, 4.5), sharey=True)
    for ax, v in zip(axes, VARIANTS):
        d = df[df.network_model == v]
        labels = [f"{t}\n{g} GPUs" for g, t in zip(d.gpus, d.topology)]
        x = np.arange(len(d))
        ax.bar(x, d.compute_s, label="compute")
        ax.bar(x, d.communication_s, bottom=d.compute_s,
               label="communication (TP all-reduce)")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("end-to-end latency (s)")
        ax.set_title(f"Llama-2-70B, equal off-GPU bandwidth ({v})", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
