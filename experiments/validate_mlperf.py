"""MLPerf Training v3.0 GPT-3 175B on 512–3,584 H100: predicted vs measured tokens/s.

Data: ``shared/anchors/training/mlperf_v30_gpt3_175b_h100.csv`` (NVIDIA NeMo and CoreWeave
submissions; tokens/s = training tokens of a run / its MLLOG run_start..run_stop time, mean
over the runs). The published plan of every row (MLCommons ``training_results_v3.0``,
``NVIDIA/benchmarks/gpt3``: ``config_DGXH100_*.sh``, ``config_tp_h100.sh``,
``conf/megatron_gpt_config.yaml``): TP 4, PP 8, virtual pipeline 12 (interleaved 1F1B),
micro-batch 1, sequence parallelism, selective activation recomputation, no dropout,
distributed Adam (ZeRO-1) with overlapped gradient / parameter sync in bf16, TP
communication overlapped with the GEMMs (Transformer Engine userbuffers), FP8 GEMMs
(Transformer Engine). Global batch and sequence length per row from the CSV. Systems:
``dgx_h100`` with ``nodes = GPUs / 8`` (the CoreWeave HGX H100 nodes have the same 8×NDR
400 Gb/s fabric).

The rows are a validation target: nothing here is fitted to them. The H100's sustained clock
fraction and HBM efficiency come from its cuBLASLt FP8 and STREAM microbenchmarks
(``experiments/calibrate.py``; printed with their provenance), its library-GEMM constants and
launch overheads are the A100's, the NVLink constants are fitted on H100 all-reduce kernel
times, the InfiniBand ones are the A100's / assumed. The measured time includes evaluation and
logging inside run_start..run_stop, which the model does not see, so a small
over-prediction of throughput is expected.

Writes ``experiments/out/validate_mlperf.csv`` and ``.png``; prints predicted vs measured
tokens/s and the MAPE for ``precision="fp8"`` (and, for reference, ``"bf16"``).

Usage: ``python experiments/validate_mlperf.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jaxmodel as jm  # noqa: E402,I001  (imported before hw_db: the package wires hw_db up)
import hw_db  # noqa: E402
from common import OUT, anchor_dir  # noqa: E402

ANCHOR = anchor_dir("training") / "mlperf_v30_gpt3_175b_h100.csv"


def plan(row) -> tuple:
    """System, plan and keyword arguments of one anchor row (its published configuration)."""
    n = int(row["n_accelerators"])
    tp, pp, vp, mb = (int(row[k]) for k in ("tp", "pp", "vp", "micro_batch"))
    system = hw_db.system("dgx_h100", nodes=n // 8)
    par = jm.Parallelism(dp=n // (tp * pp), tp=tp, pp=pp, sp=True, micro_batch=mb,
                         interleave=vp, schedule="interleaved", recompute="selective",
                         zero=1, flash_attention=False)
    kw = dict(dropout=0.0, grad_bytes=2.0, dp_overlap=1.0, tp_overlap=1.0)
    return system, par, kw


def main(out: Path = OUT) -> pd.DataFrame:
    rows = pd.read_csv(ANCHOR)
    model = hw_db.model("gpt3-175b")
    records = []
    for _, row in rows.iterrows():
        system, par, kw = plan(row)
        gb, seq = float(row["global_batch_size_seqs"]), float(row["seq_len"])
        rec = {"system_dir": row["system_dir"], "gpus": int(row["n_accelerators"]),
               "global_batch": int(gb), "measured_tokens_per_s": float(row["mean_tokens_per_sec"])}
        for prec in ("fp8", "bf16"):
            r = jm.train_step(system, model, par, gb, seq, precision=prec, **kw)
            rec[f"{prec}_tokens_per_s"] = float(r.tokens_per_s)
            rec[f"{prec}_step_s"] = float(r.step_time_s)
            rec[f"{prec}_feasible"] = bool(r.feasible)
            rec[f"{prec}_memory_gib"] = float(r.memory_bytes) / 2**30
            if prec == "fp8":
                rec.update({f"fp8_{k}_s": float(v) for k, v in r.breakdown.items()})
                rec["fp8_mfu_vs_bf16_peak"] = float(r.mfu)
        records.append(rec)
        print(f"{rec['gpus']:5d} GPUs  measured {rec['measured_tokens_per_s']:>10,.0f} tok/s  "
              f"fp8 {rec['fp8_tokens_per_s']:>10,.0f}  bf16 {rec['bf16_tokens_per_s']:>10,.0f}",
              file=sys.stderr)
    df = pd.DataFrame(records)
    for prec in ("fp8", "bf16"):
        df[f"{prec}_err_pct"] = 100 * (df[f"{prec}_tokens_per_s"] / df["measured_tokens_per_s"]
                                       - 1)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "validate_mlperf.csv", index=False)
    mape = {p: float(np.mean(np.abs(df[f"{p}_err_pct"]))) for p in ("fp8", "bf16")}
    print(df[["gpus", "global_batch", "measured_tokens_per_s", "fp8_tokens_per_s",
              "fp8_err_pct", "bf16_tokens_per_s", "bf16_err_pct", "fp8_memory_gib"]]
          .to_string(index=False, float_format=lambda x: f"{x:,.1f}"))
    print(f"MAPE fp8 {mape['fp8']:.1f} %  (bf16 for reference {mape['bf16']:.1f} %)")
    dev = hw_db.device("h100_sxm")
    print(f"H100: sustained clock fraction {float(dev.sustained_clock_fraction):.3f} "
          f"({float(dev.freq_hz * dev.sustained_clock_fraction) / 1e9:.2f} GHz), HBM "
          f"efficiency {float(dev.mem_bw_efficiency):.3f}: cuBLASLt FP8 / STREAM "
          f"microbenchmarks (experiments/calibrate.py); matmul efficiency "
          f"{float(dev.matmul_efficiency):.2f} and launch overheads from the A100")
    d = df.sort_values("gpus")
    print("signed error by GPU count (fp8): " + ", ".join(
        f"{g}: {e:+.1f} %" for g, e in zip(d.gpus, d.fp8_err_pct)))
    _plot(df, mape, out / "validate_mlperf.png")
    return df


def _plot(df, mape, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    order = np.argsort(df["gpus"].to_numpy())
    g = df["gpus"].to_numpy()[order]
    ax.plot(g, df["measured_tokens_per_s"].to_numpy()[order] / 1e3, "ko-", label="measured")
    ax.plot(g, df["fp8_tokens_per_s"].to_numpy()[order] / 1e3, "s--", color="tab:red",
            label=f"model fp8 (MAPE {mape['fp8']:.1f} %)")
    ax.plot(g, df["bf16_tokens_per_s"].to_numpy()[order] / 1e3, "^:", color="tab:blue",
            label=f"model bf16 (MAPE {mape['bf16']:.1f} %)")
    ax.set_xlabel("H100 GPUs")
    ax.set_ylabel("training throughput (k tokens/s)")
    ax.set_title("GPT-3 175B, MLPerf Training v3.0 (TP4 PP8 VP12)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
