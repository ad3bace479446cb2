"""Validate the GPT-3 175B layer model against LLMCompass's real-hardware measurements.

Reproduces LLMCompass Fig. 5 (i)-(l): one GPT-3 175B decoder layer (d = 12288,
96 heads), prefill (batch 8, 2048 tokens) and decode (batch 8, one new token against a KV cache
of 3072 = 2048 + 1024), tensor parallel TP = 4 on ``hgx_a100_4gpu`` and TP = 8 on ``tpuv3_8``.
Compares the 12 per-op rows and the totals with
``shared/anchors/llmcompass_measured/transformer{,AR}_{A100,TPUv3}.csv``.

Target: each of the 4 layer totals within 8 %, their mean |error| within 4 %
(LLMCompass reports 4.1 %). The TPUv3 runs use LLMCompass's TPUv3 description in ``hw_db``.

Run: ``.venv/bin/python experiments/validate_llmcompass_layer.py`` → writes
``experiments/out/validate_llmcompass_layer.csv`` and ``.png``; prints per-op and total errors.
``run()`` returns the per-row DataFrame (used by ``experiments/validate_llmcompass.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jaxmodel as jm  # noqa: E402  (before hw_db: avoids an import cycle via jaxmodel.cost)
import hw_db  # noqa: E402
from jaxmodel.workload.layer import LAYER_OPS  # noqa: E402

from common import OUT, anchor_dir  # noqa: E402
CASES = (  # (label, system, tp, phase, anchor file)
    ("A100 prefill", "hgx_a100_4gpu", 4, "prefill", "transformer_A100.csv"),
    ("A100 decode", "hgx_a100_4gpu", 4, "decode", "transformerAR_A100.csv"),
    ("TPUv3 prefill", "tpuv3_8", 8, "prefill", "transformer_TPUv3.csv"),
    ("TPUv3 decode", "tpuv3_8", 8, "decode", "transformerAR_TPUv3.csv"),
)
BATCH, PROMPT, KV = 8, 2048, 3072


def anchors_dir() -> Path:
    """The repository's ``validation/anchors``."""
    return anchor_dir("llmcompass_measured")


def measured(name: str) -> np.ndarray:
    """The 12 per-op seconds of an anchor file (one value per line, LLMCompass's row order)."""
    vals = [float(x) for x in (anchors_dir() / name).read_text().split() if x.strip()]
    if len(vals) != len(LAYER_OPS):
        raise ValueError(f"{name}: expected {len(LAYER_OPS)} values, got {len(vals)}")
    return np.asarray(vals)


def predict(system_name: str, tp: int, phase: str) -> dict:
    """Per-op seconds of the GPT-3 layer for one case."""
    system = hw_db.system(system_name)
    model = hw_db.model("gpt3-175b")
    par = jm.Parallelism(tp=tp)
    if phase == "prefill":
        out = jm.layer_breakdown(system, model, par, BATCH, PROMPT)
    else:
        out = jm.layer_breakdown(system, model, par, BATCH, 1, phase="decode", kv_len=KV)
    return {k: float(v) for k, v in out.items()}


def run(out_dir: Path | None = OUT, plot: bool = True, verbose: bool = True) -> pd.DataFrame:
    """Predict the four cases, compare with the measurements, write CSV (+ PNG).

    Returns:
        DataFrame with one row per (case, op) incl. ``op == "total"``: ``case, device, phase,
        op, predicted_s, measured_s, error`` (``predicted/measured − 1``).
    """
    rows = []
    for label, system_name, tp, phase, fname in CASES:
        pred = predict(system_name, tp, phase)
        meas = measured(fname)
        for op, m in zip(LAYER_OPS, meas):
            rows.append((label, system_name, phase, op, pred[op], m))
        rows.append((label, system_name, phase, "total", pred["total"], float(meas.sum())))
    df = pd.DataFrame(rows, columns=["case", "system", "phase", "op", "predicted_s",
                                     "measured_s"])
    df["error"] = df.predicted_s / df.measured_s - 1.0
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        df.to_csv(out_dir / "validate_llmcompass_layer.csv", index=False)
        if plot:
            _plot(df, out_dir / "validate_llmcompass_layer.png")
    if verbose:
        report(df)
    return df


def summary(df: pd.DataFrame) -> dict:
    """Total errors per case, their mean |error|, and the mean |error| over the op rows."""
    tot = df[df.op == "total"].set_index("case").error
    ops = df[df.op != "total"]
    return {"total_error": tot.to_dict(), "mean_abs_total_error": float(tot.abs().mean()),
            "max_abs_total_error": float(tot.abs().max()),
            "mean_abs_op_error": float(ops.error.abs().mean())}


def report(df: pd.DataFrame) -> None:
    pd.set_option("display.width", 140)
    for case, g in df.groupby("case", sort=False):
        print(f"\n== {case}")
        show = g[["op", "predicted_s", "measured_s", "error"]].copy()
        show["predicted_ms"] = show.pop("predicted_s") * 1e3
        show["measured_ms"] = show.pop("measured_s") * 1e3
        show["error_%"] = show.pop("error") * 100
        print(show.to_string(index=False, float_format=lambda x: f"{x:9.4f}"))
    s = summary(df)
    print("\nlayer totals (predicted/measured - 1):")
    for case, e in s["total_error"].items():
        flag = "ok" if abs(e) <= 0.08 else "MISS (> 8 %)"
        print(f"  {case:14s} {100 * e:+7.2f} %  {flag}")
    print(f"mean |total error| = {100 * s['mean_abs_total_error']:.2f} % "
          f"(target <= 4 %, LLMCompass 4.1 %); max = {100 * s['max_abs_total_error']:.2f} % "
          f"(target <= 8 %)")
    print(f"mean |per-op error| over the 48 rows = {100 * s['mean_abs_op_error']:.1f} %")


def _plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cases = list(dict.fromkeys(df.case))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 4.2))
    for ax, case in zip(axes, cases):
        g = df[(df.case == case) & (df.op != "total")]
        x = np.arange(2)
        bottom_p = bottom_m = 0.0
        colors = plt.cm.tab20(np.linspace(0, 1, len(LAYER_OPS)))
        for (op, p, m), c in zip(g[["op", "predicted_s", "measured_s"]].itertuples(
                index=False), colors):
            ax.bar(x, [m * 1e3, p * 1e3], bottom=[bottom_m, bottom_p], color=c, label=op,
                   width=0.6)
            bottom_m += m * 1e3
            bottom_p += p * 1e3
        err = df[(df.case == case) & (df.op == "total")].error.iloc[0]
        ax.set_xticks(x, ["measured", "jaxmodel"])
        ax.set_title(f"{case}\ntotal error {100 * err:+.1f} %", fontsize=10)
        ax.set_ylabel("ms per layer")
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("GPT-3 175B layer: jaxmodel vs real hardware (LLMCompass Fig. 5 i-l)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    run()
