"""Guo et al. Fig. 7: cost vs time of A100 variants (HBM stacks, halved logic die), GPT-3 175B.

Variants (Guo et al. §V-D): the A100 logic die with 4, 5 (A100), 6 and 8 HBM stacks, and a halved
logic die ("HA100") with 3, 4 and 6 stacks; 1024 GPUs in 128 DGX-A100-like nodes.

* Cost: the CATCH chiplet model (``jm.chiplet_cost``) of one package — the A100-like system of
  ``reference_outputs/a100like`` (800 mm² 7 nm GPU die, HBM dies on a silicon interposer) with the
  stack count changed and a 400 mm² die for HA100. The 7 nm defect density is set to 0.001/mm²
  (0.1/cm², the mature-N7 variant of the reference outputs; the library default 0.005 is "set
  arbitrarily") and each HBM stack is a black-box known-good part priced at 16 GB × $7/GB
  (``hw_db/tech/memory.toml``) instead of CATCH's 100 mm² DRAM-priced proxy die. Cluster
  cost = 1024 × package cost (hosts and network are the same for all variants and left out).
* Performance: ``jm.train_step`` (training, seed Table I: batch 256, DP 16, TP 8, PP 8, SP, 2048
  tokens; one epoch = 300 B tokens) and ``jm.inference`` (one node, TP 8, batch 32, prompt 512,
  128 generated tokens — the seed does not give the lengths; longer ones do not fit the KV cache
  of batch 32 next to 350 GB of weights on 8 × 64 GB; time to serve 1e9 requests with all 128
  nodes). A stack adds
  2.039/5 TB/s and 16 GB; HA100 halves the SMs and the L2.
* Fig. 7(c): 0.5 · normalised training time + 0.5 · normalised inference time.

The dashed iso-product line passes through the A100 point (cost × time constant).
Writes ``experiments/out/cost_fig7.csv`` / ``.png`` and prints the table.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import hw_db
import jaxmodel as jm
from jaxmodel.cost import tech

from common import ANCHORS, OUT  # noqa: E402

LIB = ANCHORS / "chiplet_cost_library"
A100LIKE = LIB / "reference_outputs" / "a100like"
VARIANTS = [("A100-4HBMs", 1.0, 4), ("A100", 1.0, 5), ("A100-6HBMs", 1.0, 6),
            ("A100-8HBMs", 1.0, 8), ("HA100-3HBMs", 0.5, 3), ("HA100-4HBMs", 0.5, 4),
            ("HA100-6HBMs", 0.5, 6)]
STACK_GB = 16.0
EPOCH_TOKENS = 300e9
REQUESTS = 1e9


def package_xml(logic_scale: float, stacks: int, folder: Path):
    """Write a CATCH system + netlist with ``stacks`` HBM parts and a scaled logic die."""
    tree = ET.parse(A100LIKE / "a100like_7nm_def.xml")
    root = tree.getroot()
    hbm = [c for c in root if c.get("name", "").startswith("HBM_")]
    template = hbm[0]
    for c in hbm:
        root.remove(c)
    price = STACK_GB * tech.table("memory")["usd_per_gb"]["hbm2e"]
    for i in range(stacks):
        c = copy.deepcopy(template)
        c.set("name", f"HBM_{i}")
        c.set("bb_cost", f"{price}")
        root.append(c)
    gpu = next(c for c in root if c.get("name") == "GPU")
    gpu.set("core_area", f"{800.0 * logic_scale}")
    sys_path = folder / f"sys_{logic_scale}_{stacks}.xml"
    tree.write(sys_path)
    net = ET.Element("netlist")
    for i in range(stacks):
        ET.SubElement(net, "net", type="UCIe_advanced", block0="GPU", block1=f"HBM_{i}",
                      bb_count="", bandwidth="3277", average_bandwidth_utilization="0.5")
    ET.SubElement(net, "net", type="UCIe_standard", block0="GPU", block1="external",
                  bb_count="", bandwidth="4800", average_bandwidth_utilization="0.5")
    net_path = folder / f"net_{logic_scale}_{stacks}.xml"
    ET.ElementTree(net).write(net_path)
    return sys_path, net_path


def package_costs():
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, scale, stacks in VARIANTS:
            s, n = package_xml(scale, stacks, Path(tmp))
            sysc = jm.load_chiplet_system(s, n, LIB).with_layer_values("combined_7nm",
                                                                        defect_density=0.001)
            r = jm.chiplet_system_cost(sysc)
            out.append(float(r.total_usd))
    return np.array(out)


def stacked_devices():
    a100 = hw_db.device("a100_80gb")
    per_bw, rows = a100.mem_bw / 5.0, []
    for _, scale, stacks in VARIANTS:
        rows.append(dict(core_count=a100.core_count * scale,
                         physical_core_count=a100.physical_core_count * scale,
                         global_buffer_bytes=a100.global_buffer_bytes * scale,
                         global_buffer_bytes_per_cycle=a100.global_buffer_bytes_per_cycle * scale,
                         mem_bw=per_bw * stacks, mem_capacity=STACK_GB * 1e9 * stacks,
                         mem_channels=float(stacks)))
    fields = {k: jnp.asarray([r[k] for r in rows], jnp.float32) for k in rows[0]}
    return dataclasses.replace(a100, **fields)


def main():
    t0 = time.time()
    cost_pkg = package_costs()
    cluster_cost = 1024 * cost_pkg
    dev = stacked_devices()
    gpt3 = hw_db.model("gpt3-175b")

    train_sys = hw_db.system("dgx_a100", nodes=128)
    train_sys = dataclasses.replace(train_sys, device=dev)
    par_t = jm.Parallelism(dp=16, tp=8, pp=8, sp=True, micro_batch=1, schedule="1f1b",
                           recompute="selective")
    tr = jm.train_step(train_sys, gpt3, par_t, 256, 2048)
    train_time = EPOCH_TOKENS / np.asarray(tr.tokens_per_s)
    train_time = np.where(np.asarray(tr.feasible), train_time, np.inf)

    inf_sys = dataclasses.replace(hw_db.system("dgx_a100", nodes=1), device=dev)
    par_i = jm.Parallelism(dp=1, tp=8, pp=1)
    ir = jm.inference(inf_sys, gpt3, par_i, 32, 512, 128)
    req_per_s = 128 * 32 / np.asarray(ir.total_s)
    infer_time = np.where(np.asarray(ir.feasible), REQUESTS / req_per_s, np.inf)

    names = [v[0] for v in VARIANTS]
    a = names.index("A100")
    combined = 0.5 * train_time / train_time[a] + 0.5 * infer_time / infer_time[a]
    import pandas as pd
    df = pd.DataFrame(dict(variant=names, logic_scale=[v[1] for v in VARIANTS],
                           hbm_stacks=[v[2] for v in VARIANTS], package_usd=cost_pkg,
                           cluster_usd=cluster_cost, train_epoch_days=train_time / 86400,
                           train_feasible=np.asarray(tr.feasible),
                           train_mfu=np.asarray(tr.mfu),
                           infer_1b_requests_days=infer_time / 86400,
                           infer_feasible=np.asarray(ir.feasible),
                           combined_norm_time=combined))
    for col, t in (("train", train_time), ("infer", infer_time), ("combined", combined)):
        # cost·time relative to the A100 (< 1: better than the iso-product line)
        df[f"{col}_cost_time_vs_a100"] = (cluster_cost * t) / (cluster_cost[a] * t[a])
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT / "cost_fig7.csv", index=False)
    import pandas as pd  # noqa: F811
    pd.set_option("display.width", 220)
    print(df.round(4).to_string(index=False))
    for col in ("train", "infer", "combined"):
        v = df[f"{col}_cost_time_vs_a100"].replace([np.inf], np.nan)
        best = df.loc[v.idxmin(), "variant"] if v.notna().any() else "none feasible"
        print(f"best cost x time for {col}: {best} (infeasible: "
              f"{', '.join(df.variant[v.isna()]) or 'none'})")
    print(f"{time.time() - t0:.0f} s")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (t, label) in zip(axes, [(train_time / 86400, "training time, 1 epoch (days)"),
                                     (infer_time / 86400, "inference, 1e9 requests (days)"),
                                     (combined, "combined normalised time")]):
        ok = np.isfinite(t)
        ax.scatter(t[ok], cluster_cost[ok] / 1e6)
        for i in np.flatnonzero(ok):
            ax.annotate(names[i], (t[i], cluster_cost[i] / 1e6), fontsize=7)
        if np.isfinite(t[a]):
            xs = np.linspace(np.nanmin(t[ok]) * 0.9, np.nanmax(t[ok]) * 1.1, 50)
            ax.plot(xs, cluster_cost[a] * t[a] / xs / 1e6, "r--", lw=1, label="iso-product")
        ax.set_xlabel(label)
        ax.set_ylabel("cluster cost (M USD)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "cost_fig7.png", dpi=120)
    return df


if __name__ == "__main__":
    main()
