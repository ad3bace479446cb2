"""MLPerf Training v3.1 / v4.0 GPT-3 175B on 512–11,616 H100: predicted vs measured tokens/s.

Data: ``shared/anchors/training/mlperf_v31_v40_gpt3_175b_h100.csv`` (MLCommons
``training_results_v3.1`` / ``v4.0`` result logs; tokens/s = training tokens of a run / its
MLLOG run_start..run_stop time, mean over the runs). Each row runs its published plan: TP, PP,
virtual pipeline, micro-batch and global batch from the CSV (the submitters'
``config_*.sh``), everything else as the submissions' configs set it
(``jm.recipe("mlperf-gpt3")``, :func:`validate_mlperf.plan`: FP8 Transformer Engine GEMMs,
sequence parallelism, no recomputation, distributed Adam with overlapped gradient
reduce-scatter and parameter all-gather in bf16, TP communication and the interleaved
schedule's p2p overlapped), on ``dgx_h100`` with ``nodes = GPUs / 8``; the run time holds the
benchmark's evaluations as :func:`validate_mlperf.evaluation_overhead` counts them (the v3.1
``conf/custom.yaml`` keeps v3.0's interval of 24,576 sequences and the whole validation
set), each evaluation batch with its forward-only stage transfers
(:func:`validate_mlperf.eval_extra_s`; NeMo 1.20 and later cache the FP8 weights at the
first evaluation micro-batch, so no re-casts), and each training step of the v3.1 rows (bf16
parameters) with Transformer Engine's weight casts at its first micro-batch
(:func:`validate_mlperf.weight_cast_s`; v4.0's FP8 parameters: none).

The v3.1 rows name TP 4 / PP 8 but no virtual-pipeline size: their ``config_*.sh`` never
export ``INTERLEAVED_PIPELINE``, so ``conf/custom.yaml``'s default applies
(``virtual_pipeline_model_parallel_size: ${oc.decode:${oc.env:INTERLEAVED_PIPELINE,12}}``,
NVIDIA and Azure+NVIDIA alike): VP 12, 96 layers = 8 stages × 12 chunks of one layer (column
``vp_from_yaml``). The v4.0 rows carry their configs' ``INTERLEAVED_PIPELINE`` (8 for
``config_DGXH100_1344x8x6x4x6_mbs1_cg.sh`` / ``1452x8x6x4x6``, 4 for ``64x8x128x4x8_mbs2``).
The one row without any plan (the 512-GPU smc submission) is left out.

v3.1 reduces the FP8 amaxes over the TP group only and asynchronously (``config_common.sh``:
``NVTE_DP_AMAX_REDUCE_INTERVAL=0``, ``NVTE_ASYNC_AMAX_REDUCTION=1``):
:func:`validate_mlperf.amax_sync_s` is 0 for it. v4.0's config exports the same variables,
but its Transformer Engine (v1.6rc1) no longer reads them and reduces over ``tp·dp``,
blocking, as v3.0 did (:data:`validate_mlperf.BLOCKING_DP_AMAX_ROUNDS`).
v4.0's ``config_common.sh`` sets ``FP8_PARAMS=True`` (``conf/custom.yaml`` ``fp8_params``:
Transformer Engine's FP8 model parameters, so the distributed optimizer all-gathers 1-byte
parameters and keeps its fp32 shard): those rows run ``precision("fp8", weight_bytes=1)``
(:func:`validate_mlperf.round_precision`). Configuration differences the model has no
switch for, left as they are: v4.0's 200 MB gradient buckets and
per-layer CUDA graphs (``LAYER_CUDA_GRAPH=1``) at 10,752 / 11,616 GPUs; both rounds'
per-communicator NCCL CTA limits and 2 MB p2p chunks; v3.1's fc2 ``pipeline``
reduce-scatter on 4 SMs (v4.0: ``ring_exchange``) with FP8 atomic GEMMs
(``NVTE_UB_ATOMIC_GEMM_RS=1``).

Nothing is fitted to these rows. Prints predicted vs measured tokens/s per row, the MAPE
over all rows and the worst error at ≥ 10,000 GPUs; writes
``experiments/out/validate_mlperf_scale.csv``.

Usage: ``python experiments/validate_mlperf_scale.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "experiments"))

import jaxmodel as jm  # noqa: E402,I001  (imported before hw_db: the package wires hw_db up)
import hw_db  # noqa: E402
import validate_mlperf as v30  # noqa: E402

from common import OUT, anchor_dir  # noqa: E402

ANCHOR = anchor_dir("training") / "mlperf_v31_v40_gpt3_175b_h100.csv"
#: v3.1 ``conf/custom.yaml``: ``INTERLEAVED_PIPELINE`` unset → virtual pipeline 12
V31_YAML_VP = 12


def load(path: Path = ANCHOR) -> pd.DataFrame:
    """The anchor rows that name a plan, the v3.1 rows' virtual pipeline from their
    ``conf/custom.yaml`` default (``vp_from_yaml`` = True where it was filled)."""
    rows = pd.read_csv(path)
    rows = rows[rows["tp"].notna() & rows["pp"].notna()].copy()
    rows["vp_from_yaml"] = rows["vp"].isna()
    bad = rows["vp_from_yaml"] & (rows["mlperf_round"] != "v3.1")
    if bad.any():
        raise ValueError(f"validate_mlperf_scale: no published virtual pipeline for rows "
                         f"{rows.loc[bad, 'system_dir'].tolist()}")
    rows["vp"] = rows["vp"].fillna(V31_YAML_VP)
    return rows.reset_index(drop=True)


def main(out: Path = OUT) -> pd.DataFrame:
    rows = load()
    model = hw_db.model("gpt3-175b")
    records = []
    for _, row in rows.iterrows():
        system, par, kw = v30.plan(row)
        gb, seq = float(row["global_batch_size_seqs"]), float(row["seq_len"])
        rec = {"round": row["mlperf_round"], "system_dir": row["system_dir"],
               "gpus": int(row["n_accelerators"]), "tp": int(row["tp"]), "pp": int(row["pp"]),
               "vp": int(row["vp"]), "vp_from_yaml": bool(row["vp_from_yaml"]),
               "micro_batch": int(row["micro_batch"]), "global_batch": int(gb),
               "measured_tokens_per_s": float(row["mean_tokens_per_sec"])}
        prec = v30.round_precision(row)
        rec.update(v30.predict(system, model, par, gb, seq, "fp8", kw, breakdown=True,
                               amax_s=v30.amax_sync_s(system, model, par, gb, row),
                               precision=prec, row=row)[0])
        records.append(rec)
        print(f"{rec['round']} {rec['gpus']:6d} GPUs  measured "
              f"{rec['measured_tokens_per_s']:>11,.0f} tok/s  fp8 {rec['fp8_tokens_per_s']:>11,.0f}",
              file=sys.stderr)
    df = pd.DataFrame(records)
    df["fp8_err_pct"] = 100 * (df["fp8_tokens_per_s"] / df["measured_tokens_per_s"] - 1)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "validate_mlperf_scale.csv", index=False)
    print(df[["round", "gpus", "tp", "pp", "vp", "vp_from_yaml", "global_batch",
              "measured_tokens_per_s", "fp8_train_tokens_per_s", "fp8_eval_overhead",
              "fp8_tokens_per_s", "fp8_err_pct", "fp8_dp_comm_s",
              "fp8_step_s", "fp8_feasible"]]
          .to_string(index=False, float_format=lambda x: f"{x:,.3f}"))
    mape = float(np.mean(np.abs(df["fp8_err_pct"])))
    big = df[df["gpus"] >= 10_000]
    worst = float(np.max(np.abs(big["fp8_err_pct"]))) if len(big) else float("nan")
    print(f"MAPE fp8 {mape:.1f} % over {len(df)} rows; worst at >= 10,000 GPUs "
          f"{worst:.1f} %; all feasible: {bool(df['fp8_feasible'].all())}")
    return df


if __name__ == "__main__":
    main()
