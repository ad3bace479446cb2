"""Derive the network calibration constants stored in hw_db/systems/*.toml.

Physical constants only, one set per network tier, never per row (docs/architecture.md, convention 6):
``efficiency`` (achievable fraction of the link bandwidth), ``chunk_latency`` (per-chunk
overhead of the pipelined collective, see ``jaxmodel.comm.collectives._pipelined``) and
``base_latency`` (fixed software/launch overhead per collective). For the vidur cluster,
whose inter-node fabric is undocumented, the inter-node tier's per-GPU and per-node
bandwidths are derived too — from the two-node rows with 1, 2 and 4 GPUs per node only,
so the 16-GPU rows stay held out for validation.

Each fit minimises the mean absolute percentage error (Nelder–Mead on log-parameters, a few
starts) of ``jm.collective_latency(..., "all_reduce", ..., algorithm="auto")`` over one
anchor dataset, and prints the values to copy into hw_db with their derivation.

Run: ``.venv/bin/python experiments/calibrate_collectives.py`` (about a minute on 2 cores).
Writes ``experiments/out/calibrate_collectives.csv``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize

import hw_db
import jaxmodel as jm
from jaxmodel.comm import anchors

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = next(p for p in (ROOT.parent / "shared" / "anchors", ROOT / "shared" / "anchors")
               if p.exists())
OUT = ROOT / "experiments" / "out"


def with_level(system, k, **fields):
    levels = list(system.levels)
    levels[k] = dataclasses.replace(levels[k], **fields)
    return dataclasses.replace(system, levels=tuple(levels))


def predict(system, ds):
    """Model all-reduce latency for every row of an anchor dataset, s."""
    if "per_node" in ds and ds["nodes"] > 1:
        # two-node rows: ``per_node`` GPUs used in each of 2 nodes
        system = with_level(system, 0, size=ds["per_node"])
        system = with_level(system, 1, size=np.full_like(ds["per_node"], 2.0))
    return np.asarray(jm.collective_latency(system, "all_reduce", ds["nbytes"], ds["group"]))


def mape(pred, meas):
    return float(np.mean(np.abs(pred / meas - 1.0)) * 100.0)


def fit(system, level, ds, names, x0s, fixed=None):
    system = with_level(system, level, **(fixed or {}))

    def build(logx):
        return with_level(system, level, **{k: float(np.exp(v)) for k, v in zip(names, logx)})

    def loss(logx):
        p = predict(build(logx), ds)
        return mape(p, ds["seconds"]) if np.all(np.isfinite(p)) else 1e9

    best = None
    for x0 in x0s:
        r = minimize(loss, np.log(np.asarray(x0, dtype=float)), method="Nelder-Mead",
                     options={"xatol": 1e-4, "fatol": 1e-4, "maxiter": 3000})
        if best is None or r.fun < best.fun:
            best = r
    return dict(zip(names, np.exp(best.x))), best.fun, build(best.x)


def main():
    rows = []
    jobs = [
        ("hgx_a100_4gpu", 0, anchors.a100x4(ANCHORS)),
        ("tpuv3_8", 0, anchors.tpuv3(ANCHORS)),
        ("dgx_a100", 0, anchors.nccl_8xa100(ANCHORS)),
        ("a100_dgx_vidur", 0, anchors.vidur(ANCHORS, "single_node")),
    ]
    names = ["efficiency", "chunk_latency", "base_latency"]
    x0s = [[0.8, 2e-6, 10e-6], [0.6, 10e-6, 1e-6], [0.9, 0.5e-6, 50e-6]]
    fitted = {}
    for sys_name, level, ds in jobs:
        system = hw_db.system(sys_name)
        vals, err, best = fit(system, level, ds, names,
                              x0s if sys_name != "tpuv3_8" else
                              [[0.8, 3e-6, 800e-6], [0.7, 20e-6, 500e-6]])
        fitted[sys_name] = best
        print(f"{sys_name:16s} level {level}: " + ", ".join(f"{k}={v:.4g}" for k, v in
                                                           vals.items())
              + f"  -> MAPE {err:.2f} % on {ds['name']} ({len(ds['nbytes'])} rows)")
        rows.append({"system": sys_name, "level": level, "dataset": ds["name"],
                     **vals, "mape_pct": err})

    # vidur inter-node tier: bandwidths + latencies from the 2x1 / 2x2 / 2x4 rows
    ds = anchors.vidur(ANCHORS, "two_node_other")
    base = fitted["a100_dgx_vidur"]
    ib_names = ["bw_per_device", "bw_per_node", "chunk_latency", "base_latency"]
    vals, err, best = fit(base, 1, ds, ib_names,
                          [[6e9, 10e9, 5e-6, 20e-6], [5e9, 20e9, 20e-6, 5e-6],
                           [8e9, 12e9, 1e-6, 40e-6]], fixed={"efficiency": 1.0})
    print(f"{'a100_dgx_vidur':16s} level 1: " + ", ".join(f"{k}={v:.4g}" for k, v in
                                                         vals.items())
          + f"  -> MAPE {err:.2f} % on {ds['name']} ({len(ds['nbytes'])} rows)")
    rows.append({"system": "a100_dgx_vidur", "level": 1, "dataset": ds["name"], **vals,
                 "mape_pct": err})
    held = anchors.vidur(ANCHORS, "two_node_16")
    print(f"  held-out 16-GPU rows with these constants: MAPE "
          f"{mape(predict(best, held), held['seconds']):.2f} %")
    OUT.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(OUT / "calibrate_collectives.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
