"""Guo et al. Fig. 3: DeepSpeed-TED strong scaling of a 6.7B-base MoE on Summit V100 nodes.

Setting (Guo et al. §IV-B after Singh et al., ICS 2023): GPT-3 6.7B base (32 layers, hidden
4096, 32 heads, FFN 16384) with an MoE layer (top-1, capacity factor 1) on every other layer,
global batch B = 1024 sequences of 2048 tokens, TP = 4 and DP_MHA = EP growing with the GPUs
(DP_exp = 1: one expert per EP rank, so E = EP and the model grows with the GPU count while
the FLOPs per step stay those of the base model). Time per batch vs GPUs (32 … 256).

System: ``hw_db.system("summit", nodes=N)``'s V100 and tiers. A Summit node has 2 sockets of
3 V100; a TP group of 4 cannot tile a 3-GPU NVLink island, so (as DeepSpeed runs TP = 4 on
Summit) 4 GPUs per node are used — 2 per socket. The tiers are rescaled accordingly from the
``hw_db`` values: NVLink2 to the one peer of a socket (50 GB/s per direction, half of the
2-peer figure), the X-Bus shared by 2 instead of 3 GPUs, the node's dual-rail EDR InfiniBand
(25 GB/s) shared by 4 instead of 6 GPUs.

Training recipe (DeepSpeed-MoE/TED baseline): fp16 with fp16 gradients (``grad_bytes=2``),
full activation checkpointing, ZeRO for the dense and the expert weights over their own
data-parallel groups, the best of micro-batch ∈ {1, 2, 4} × ZeRO ∈ {1, 2} per GPU count. The
V100 has 16 GB; plans that do not fit are reported as such, and the step time ignoring the
memory limit is listed beside (``step_time_nomem_s``) so the scaling trend stays visible.
DeepSpeed-TED's optimisations (duplicate token dropping, communication-aware checkpointing)
and load imbalance are not modelled — the seed expects its prediction near the baseline.

No numeric anchor is available (the published curves are only in the figure). Writes
``experiments/out/moe_fig3.csv`` and ``.png``; prints time per batch vs GPUs and its
breakdown.

Run: ``.venv/bin/python experiments/moe_fig3.py``
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db)
import hw_db

from common import OUT  # noqa: E402
GPUS = (32.0, 64.0, 128.0, 256.0)
TP, BATCH, SEQ = 4.0, 1024.0, 2048.0
PER_NODE = 4.0


def base_67b(experts):
    return jm.Model(n_layers=32.0, d_model=4096.0, n_heads=32.0, n_kv_heads=32.0,
                    head_dim=128.0, d_ff=16384.0, vocab_size=50257.0, activation="gelu",
                    n_experts=experts, top_k=1.0, moe_every=2.0, capacity_factor=1.0,
                    tied_embeddings=1.0)


def summit_4gpu(nodes, mem_capacity=None):
    """Summit nodes with 4 of their 6 V100 in use (2 per socket); see the module docstring."""
    s = hw_db.system("summit", nodes=1)
    nv, xbus, ib = s.levels
    nv = dataclasses.replace(nv, size=2.0, bw_per_device=nv.bw_per_device / 2.0)
    xbus = dataclasses.replace(xbus, bw_per_device=xbus.bw_per_device * 3.0 / 2.0)
    ib = dataclasses.replace(ib, size=nodes, bw_per_device=ib.bw_per_device * 6.0 / PER_NODE)
    dev = s.device if mem_capacity is None else dataclasses.replace(s.device,
                                                                    mem_capacity=mem_capacity)
    return dataclasses.replace(s, device=dev, levels=(nv, xbus, ib))


def run() -> pd.DataFrame:
    grid = list(itertools.product(GPUS, (1.0, 2.0, 4.0), (1.0, 2.0), (False, True)))
    col = lambda i: jnp.asarray([float(g[i]) for g in grid])  # noqa: E731
    n = col(0)
    ep = n / TP
    dev_mem = float(hw_db.device("v100").mem_capacity)
    mem = jnp.where(col(3) > 0.5, 1e15, dev_mem)
    systems = [summit_4gpu(float(g[0]) / PER_NODE, float(m)) for g, m in zip(grid, mem)]
    system = jax.tree_util.tree_map(lambda *x: jnp.asarray(x), *systems)
    model = base_67b(ep)
    par = jm.Parallelism(dp=ep, tp=TP, ep=ep, micro_batch=col(1), zero=col(2),
                         recompute="full")
    res = jm.train_step(system, model, par, BATCH, SEQ, grad_bytes=2.0)
    df = pd.DataFrame({"gpus": np.asarray(n), "experts": np.asarray(ep),
                       "micro_batch": col(1), "zero": col(2), "no_mem_limit": col(3) > 0.5,
                       "feasible": np.asarray(res.feasible),
                       "reason": [jm.reason_name(c) for c in np.asarray(res.reason)],
                       "step_time_s": np.asarray(res.step_time_s),
                       "memory_gib": np.asarray(res.memory_bytes) / 2 ** 30})
    for k, v in res.breakdown.items():
        df[f"t_{k}"] = np.asarray(v)
    return df


def best(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for n in GPUS:
        real = df[(df.gpus == n) & ~df.no_mem_limit]
        free = df[(df.gpus == n) & df.no_mem_limit]
        r = free.loc[free.step_time_s.idxmin()]
        fit = real[real.feasible]
        row = {"gpus": n, "experts": r.experts, "fits_16gb": len(fit) > 0,
               "step_time_s": fit.step_time_s.min() if len(fit) else np.inf,
               "step_time_nomem_s": r.step_time_s, "micro_batch": r.micro_batch,
               "zero": r.zero, "memory_gib": r.memory_gib,
               "min_memory_gib": real.memory_gib.min()}
        for k in ("compute", "recompute", "tp_comm", "ep_comm", "dp_comm", "optimizer",
                  "embedding"):
            row[f"t_{k}"] = r[f"t_{k}"]
        rows.append(row)
    return pd.DataFrame(rows)


def plot(b: pd.DataFrame, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(b.gpus, b.step_time_nomem_s, "o-", label="model (memory limit ignored)")
    fit = b[b.fits_16gb]
    ax.plot(fit.gpus, fit.step_time_s, "s", label="fits 16 GB")
    ax.set_xscale("log", base=2)
    ax.set_xticks(b.gpus, [str(int(x)) for x in b.gpus])
    ax.set_xlabel("GPUs (TP 4, EP = DP = GPUs/4)")
    ax.set_ylabel("time per batch (s), B = 1024")
    ax.set_title("6.7B-base MoE on Summit V100 (DeepSpeed-TED)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    df = run()
    b = best(df)
    df.to_csv(OUT / "moe_fig3_all.csv", index=False)
    b.to_csv(OUT / "moe_fig3.csv", index=False)
    plot(b, OUT / "moe_fig3.png")
    print("Guo et al. Fig. 3 — DeepSpeed-TED strong scaling, 6.7B base, B = 1024, TP 4")
    print(b.to_string(index=False, float_format="%.3f"))
    t = b.step_time_nomem_s.to_numpy()
    eff = t[0] * b.gpus.to_numpy()[0] / (t * b.gpus.to_numpy())
    print("parallel efficiency vs 32 GPUs: " + ", ".join(
        f"{int(g)}: {100 * e:.0f} %" for g, e in zip(b.gpus, eff)))


if __name__ == "__main__":
    main()
