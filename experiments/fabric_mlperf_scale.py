"""The 10k-GPU MLPerf GPT-3 rows on a multi-tier fat tree, with and without SHARP.

``validate_mlperf_scale.py`` runs every MLPerf Training v3.1 / v4.0 GPT-3 175B row on
``dgx_h100``, whose InfiniBand tier is one non-blocking switch. Here the rows with at least
10,000 GPUs also run on ``dgx_h100_superpod``: the same nodes on a rail-optimised three-tier
NDR fat tree (leaf per rail inside a 32-node scalable unit, spine and core tiers above it; NVIDIA
DGX SuperPOD H100 reference architecture), once as the runs used it (SHARP off: the MLPerf
configs keep it off) and once with SHARP in-network reduction on both InfiniBand tiers (NCCL
CollNet, ``jaxmodel.comm.algorithms.in_network_protocols``), a what-if. A row whose node
count is not whole scalable units is left out there; a row whose groups do not tile the tiers
(``jaxmodel.comm.topology.group_tiers`` needs regular groups: e.g. the gradient group of
``dp·cp`` members at stride ``tp``, ``jaxmodel.parallel.plan.placement``, spanning a fraction
of a unit) is reported infeasible with its reason.

Nothing is fitted. Prints predicted vs measured tokens/s per row and system; writes
``experiments/out/fabric_mlperf_scale.csv``.

Usage: ``python experiments/fabric_mlperf_scale.py``
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import jaxmodel as jm  # noqa: E402,I001  (imported before hw_db: the package wires hw_db up)
import hw_db  # noqa: E402
import validate_mlperf as v30  # noqa: E402
import validate_mlperf_scale as scale  # noqa: E402

from common import OUT  # noqa: E402
from jaxmodel.numerics import REASONS  # noqa: E402

SU_NODES = 32      # dgx_h100_superpod: nodes per scalable unit (its ib_ndr_leaf_rail size)


def with_sharp(system):
    """``system`` with in-network reduction on every InfiniBand (NCCL network) tier."""
    return dataclasses.replace(system, levels=tuple(
        dataclasses.replace(lv, in_network_reduction=1.0) if float(lv.nccl_link) > 1.5 else lv
        for lv in system.levels))


def main(out: Path = OUT) -> pd.DataFrame:
    rows = scale.load()
    rows = rows[rows["n_accelerators"] >= 10_000].reset_index(drop=True)
    model = hw_db.model("gpt3-175b")
    records = []
    for _, row in rows.iterrows():
        one, par, kw = v30.plan(row)
        gb, seq = float(row["global_batch_size_seqs"]), float(row["seq_len"])
        rec = {"round": row["mlperf_round"], "gpus": int(row["n_accelerators"]),
               "tp": int(row["tp"]), "pp": int(row["pp"]), "vp": int(row["vp"]),
               "measured_tokens_per_s": float(row["mean_tokens_per_sec"])}
        systems = {"one_switch": one}
        if (int(row["n_accelerators"]) // 8) % SU_NODES == 0:
            tree = hw_db.system("dgx_h100_superpod", nodes=int(row["n_accelerators"]) // 8
                                // SU_NODES)
            systems.update(fat_tree=tree, fat_tree_sharp=with_sharp(tree))
        for name, system in systems.items():
            try:
                r = jm.train_step(system, model, par, gb, seq, precision="fp8", **kw)
            except ValueError as e:        # a concrete plan whose groups do not fit
                rec[f"{name}_reason"] = str(e).split(":")[1].strip()
                continue
            rec[f"{name}_tokens_per_s"] = float(r.tokens_per_s)
            rec[f"{name}_err_pct"] = 100 * (float(r.tokens_per_s) / rec["measured_tokens_per_s"]
                                            - 1)
            rec[f"{name}_dp_comm_s"] = float(r.breakdown["dp_comm"])
            rec[f"{name}_step_s"] = float(r.step_time_s)
            rec[f"{name}_reason"] = REASONS[int(r.reason)]
        records.append(rec)
    df = pd.DataFrame(records)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "fabric_mlperf_scale.csv", index=False)
    print(df.to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
    return df


if __name__ == "__main__":
    main()
