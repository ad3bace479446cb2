"""Validate jaxmodel against LLMCompass's real-hardware measurements (LLMCompass Fig. 5).

Data: ``shared/anchors/llmcompass_measured/`` (A100, MI210, TPUv3; see its README).

Sections (each a function ``name(anchor_dir, out_dir) -> dict of summary numbers``, listed in
``SECTIONS``; later sections, e.g. the GPT-3 layer, are appended to that list):

- ``operators``: every matmul / softmax / layernorm / GELU row, predicted with
  ``hw_db.device(...)`` (``a100_80gb``, ``mi210``, ``tpuv3``); writes
  ``experiments/out/validate_llmcompass_ops.csv`` and ``..._ops.png`` and prints the mean
  absolute percentage error per (device, family), per family and overall.
  Target: overall ≤ 8 %, every family ≤ 12 % (LLMCompass itself: 10.4 %).

``--calibrate`` re-derives the per-device calibration constants stored in ``hw_db/devices``
(per-family launch overheads and ``mem_bw_efficiency``) from the same anchors and prints them;
see :func:`calibrate` for the procedure. It does not write the TOMLs
(``experiments/calibrate.py --write`` does, together with the kernel-anchor constants). The reported MAPEs are
therefore in-sample; ``--cv`` fits on half the rows and reports the MAPE on the other half.

Run: ``.venv/bin/python experiments/validate_llmcompass.py [--calibrate] [--cv]``
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jaxmodel as jm  # noqa: E402  (before hw_db: hw_db imports jaxmodel)
import hw_db  # noqa: E402
from common import OUT, anchor_dir  # noqa: E402

DEVICES = {"A100": "a100_80gb", "MI210": "mi210", "TPUv3": "tpuv3"}
FAMILIES = ("matmul", "softmax", "layernorm", "gelu")
OVERHEAD_FIELD = {"matmul": "matmul_overhead_s", "softmax": "softmax_overhead_s",
                  "layernorm": "layernorm_overhead_s", "gelu": "gelu_overhead_s"}


def find_anchors() -> Path:
    """The repository's ``validation/anchors``."""
    return anchor_dir()


def _num(field: str) -> float:
    """A CSV field without its unit suffix ('0.19ms', '101.7Tflops', '303.5us', '0.43G/s')."""
    return float(re.sub(r"[A-Za-z/]+$", "", field.strip()))


_UNIT = {"ms": 1e-3, "us": 1e-6, "s": 1.0}


def _seconds(field: str) -> float:
    unit = re.search(r"[a-z]+$", field.strip()).group(0)
    return _num(field) * _UNIT[unit]


def load_operator_anchors(anchor_dir: Path | None = None) -> pd.DataFrame:
    """All operator rows as a DataFrame.

    Columns: ``device`` (A100/MI210/TPUv3), ``family``, ``M``, ``N``, ``K`` (1 where unused),
    ``elements`` (softmax/layernorm ``M·N``, GELU ``M``), ``measured_s`` and
    ``baseline_s`` (TPUv3's undocumented second time column, else NaN).
    """
    d = Path(anchor_dir or find_anchors()) / "llmcompass_measured"
    rows = []
    for tag in DEVICES:
        for fam in FAMILIES:
            path = d / f"{fam}_{tag}.csv"
            for line in path.read_text().strip().splitlines():
                f = [x.strip() for x in line.split(",")]
                r = dict(device=tag, family=fam, M=_num(f[0]), N=1.0, K=1.0,
                         baseline_s=np.nan)
                if fam == "matmul":
                    r.update(N=_num(f[1]), K=_num(f[2]), measured_s=_seconds(f[3]))
                    if tag == "TPUv3":
                        r["baseline_s"] = _seconds(f[4])
                    r["elements"] = r["M"] * r["N"]
                elif fam in ("softmax", "layernorm"):
                    r["N"] = _num(f[1])
                    r["elements"] = r["M"] * r["N"]
                    if tag == "TPUv3":
                        r["measured_s"] = _seconds(f[2])
                        if fam == "softmax":
                            r["baseline_s"] = _seconds(f[3])
                    else:
                        r["measured_s"] = r["elements"] / (_num(f[2]) * 1e9)
                else:  # gelu
                    r["elements"] = r["M"]
                    r["measured_s"] = (_seconds(f[1]) if tag == "TPUv3"
                                       else r["M"] / (_num(f[1]) * 1e9))
                rows.append(r)
    return pd.DataFrame(rows)


def predict_family(dev, family: str, M, N, K, overhead: bool = True):
    """Predicted seconds of one operator family for arrays of shapes (any batch shape)."""
    if family == "matmul":
        return jm.gemm_latency(dev, M, N, K, overhead=overhead)
    if family == "softmax":
        return jm.softmax_latency(dev, M, N, overhead=overhead)
    if family == "layernorm":
        return jm.layernorm_latency(dev, M, N, overhead=overhead)
    return jm.gelu_latency(dev, M, overhead=overhead)


def predict(df: pd.DataFrame, devices: dict | None = None) -> np.ndarray:
    """Predicted seconds for every row of ``load_operator_anchors()``."""
    devices = devices or {tag: hw_db.device(name) for tag, name in DEVICES.items()}
    out = np.full(len(df), np.nan)
    for (tag, fam), g in df.groupby(["device", "family"], sort=False):
        p = predict_family(devices[tag], fam, jnp.asarray(g.M.values), jnp.asarray(g.N.values),
                           jnp.asarray(g.K.values))
        out[g.index.values] = np.asarray(p)
    return out


def mape_table(df: pd.DataFrame) -> pd.DataFrame:
    """MAPE (%) per (device, family), with per-family and overall rows."""
    ape = (df.predicted_s / df.measured_s - 1.0).abs() * 100
    per = ape.groupby([df.device, df.family]).mean().rename("mape_pct").reset_index()
    fam = ape.groupby(df.family).mean()
    rows = [per]
    rows.append(pd.DataFrame({"device": "all", "family": fam.index, "mape_pct": fam.values}))
    rows.append(pd.DataFrame({"device": ["all"], "family": ["all"], "mape_pct": [ape.mean()]}))
    return pd.concat(rows, ignore_index=True)


def operators(anchor_dir: Path, out_dir: Path) -> dict:
    """Operator section: predict every anchor row, write CSV + plot, print MAPEs."""
    df = load_operator_anchors(anchor_dir)
    df["predicted_s"] = predict(df)
    df["error_pct"] = (df.predicted_s / df.measured_s - 1.0) * 100
    out_dir.mkdir(parents=True, exist_ok=True)
    df.to_csv(out_dir / "validate_llmcompass_ops.csv", index=False)
    table = mape_table(df)
    print("\n== Operators vs LLMCompass real-hardware anchors (MAPE %) ==")
    piv = table[table.device != "all"].pivot(index="family", columns="device",
                                             values="mape_pct").reindex(FAMILIES)
    piv["all devices"] = table[(table.device == "all") & (table.family != "all")] \
        .set_index("family").mape_pct.reindex(FAMILIES)
    print(piv.round(1).to_string())
    overall = float(table[(table.device == "all") & (table.family == "all")].mape_pct.iloc[0])
    print(f"overall operator MAPE: {overall:.1f} %  (target <= 8 %, LLMCompass 10.4 %)")
    _plot_ops(df, out_dir / "validate_llmcompass_ops.png")
    summary = {f"ops_mape_{r.device}_{r.family}": r.mape_pct for r in table.itertuples()}
    summary["ops_mape_overall"] = overall
    return summary


def parity_panel(ax, g: pd.DataFrame, by: str, title: str, style, legend_size: int = 8,
                 markerscale: float = 1.0):
    """Predicted vs measured (ms, log-log) of the rows ``g``, one series per value of column
    ``by`` (``style(value)``: its plot keywords), the ±10 % band, the MAPE in the title."""
    for tag, gg in g.groupby(by):
        ax.loglog(gg.measured_s * 1e3, gg.predicted_s * 1e3, label=tag, **style(tag))
    lo = min(g.measured_s.min(), g.predicted_s.min()) * 1e3 * 0.8
    hi = max(g.measured_s.max(), g.predicted_s.max()) * 1e3 * 1.25
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9")
    ape = (g.predicted_s / g.measured_s - 1).abs().mean() * 100
    ax.set_title(f"{title} (MAPE {ape:.1f} %)")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("jaxmodel (ms)")
    ax.legend(fontsize=legend_size, markerscale=markerscale)


def _plot_ops(df: pd.DataFrame, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(FAMILIES), figsize=(4.2 * len(FAMILIES), 4.2))
    markers = {"A100": "o", "MI210": "s", "TPUv3": "^"}
    for ax, fam in zip(axes, FAMILIES):
        parity_panel(ax, df[df.family == fam], "device", fam,
                     lambda tag: dict(marker=markers[tag], ls="", ms=4, alpha=0.8))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------
# Calibration of the per-device constants stored in hw_db/devices/*.toml
# ------------------------------------------------------------------------------------------
EFFICIENCY_GRID = np.round(np.arange(0.50, 1.0001, 0.02), 2)


def _best_overhead(pred0: np.ndarray, meas: np.ndarray) -> float:
    """Overhead o ≥ 0 minimising Σ|pred0 + o − meas| / meas: a weighted median (closed form)."""
    r = meas - pred0
    w = 1.0 / meas
    order = np.argsort(r)
    r, w = r[order], w[order]
    c = np.cumsum(w)
    return float(max(r[np.searchsorted(c, 0.5 * c[-1])], 0.0))


def calibrate(anchor_dir: Path | None = None, train=None, devices: dict | None = None) -> dict:
    """Fit, per device, ``mem_bw_efficiency`` and the four per-kernel overheads.

    Procedure (one constant per device, or per device and operator family; never per row):
    for every ``mem_bw_efficiency`` on a 0.50…1.00 grid (step 0.02), predict every anchor row
    without the launch overhead; per family the overhead minimising that family's mean
    absolute percentage error is a weighted median of ``measured − predicted`` (weights
    1/measured, closed form); the efficiency minimising the mean of the four family MAPEs wins.

    Args:
        anchor_dir: ``shared/anchors`` (found automatically when ``None``).
        train: optional boolean mask over the rows of :func:`load_operator_anchors`; only
            those rows are fitted (cross-validation).
        devices: optional ``{device_tag: jm.Device}``, the devices to fit (their other
            constants as given); default every device of :data:`DEVICES` from ``hw_db``.

    Returns:
        ``{device_tag: {field: value, ..., "mape": {family: pct}}}``.
    """
    df = load_operator_anchors(anchor_dir)
    if train is not None:
        df = df[np.asarray(train)]
    result = {}
    eff = EFFICIENCY_GRID
    bases = devices or {tag: hw_db.device(name) for tag, name in DEVICES.items()}
    for tag, base in bases.items():
        dev = dataclasses.replace(base, mem_bw_efficiency=jnp.asarray(eff)[:, None])
        pred0 = {}
        for fam in FAMILIES:
            g = df[(df.device == tag) & (df.family == fam)]
            pred0[fam] = (np.asarray(predict_family(
                dev, fam, jnp.asarray(g.M.values)[None, :], jnp.asarray(g.N.values)[None, :],
                jnp.asarray(g.K.values)[None, :], overhead=False)), g.measured_s.values)
        best = None
        for i in range(len(eff)):
            ovh, mape = {}, {}
            for fam, (p, m) in pred0.items():
                ovh[fam] = _best_overhead(p[i], m)
                mape[fam] = float(np.mean(np.abs((p[i] + ovh[fam]) / m - 1.0)) * 100)
            score = float(np.mean(list(mape.values())))
            if best is None or score < best[0]:
                best = (score, i, ovh, mape)
        _, i, ovh, mape = best
        result[tag] = {"mem_bw_efficiency": float(eff[i]),
                       **{OVERHEAD_FIELD[f]: ovh[f] for f in FAMILIES}, "mape": mape}
    return result


def print_calibration(cal: dict):
    print("\n== Calibrated constants (least |%| error over the operator anchors) ==")
    for tag, c in cal.items():
        print(f"[{DEVICES[tag]}]")
        print(f"  mem_bw_efficiency = {c['mem_bw_efficiency']:.2f}")
        for f in FAMILIES:
            print(f"  {OVERHEAD_FIELD[f]} = {c[OVERHEAD_FIELD[f]] * 1e6:.1f}e-6"
                  f"    # family MAPE {c['mape'][f]:.1f} %")


def cross_validate(anchor_dir: Path | None = None, folds: int = 2) -> float:
    """Out-of-sample MAPE of the calibration: fit on all rows but every ``folds``-th (per
    device and family), predict the held-out rows, repeat for each offset; prints and returns
    the pooled held-out MAPE (%)."""
    df = load_operator_anchors(anchor_dir)
    pos = df.groupby(["device", "family"]).cumcount().values
    held = []
    for f in range(folds):
        cal = calibrate(anchor_dir, train=pos % folds != f)
        devices = {tag: dataclasses.replace(
            hw_db.device(name), mem_bw_efficiency=cal[tag]["mem_bw_efficiency"],
            **{OVERHEAD_FIELD[fam]: cal[tag][OVERHEAD_FIELD[fam]] for fam in FAMILIES})
            for tag, name in DEVICES.items()}
        test = df[pos % folds == f].reset_index(drop=True)
        test["predicted_s"] = predict(test, devices)
        held.append(test)
    out = pd.concat(held, ignore_index=True)
    table = mape_table(out)
    pooled = table[table.device == "all"].set_index("family").mape_pct
    print(f"\n== {folds}-fold cross-validated calibration (held-out rows, MAPE %) ==")
    print(" ".join(f"{k}: {v:.1f}" for k, v in pooled.items()))
    return float(pooled["all"])


SECTIONS = [operators]      # the GPT-3 layer section is appended here by its owner


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true",
                    help="re-derive the per-device calibration constants and print them")
    ap.add_argument("--cv", action="store_true",
                    help="2-fold cross-validation of the calibration (held-out MAPE)")
    args = ap.parse_args(argv)
    anchors = find_anchors()
    if args.calibrate:
        print_calibration(calibrate(anchors))
    if args.cv:
        cross_validate(anchors)
    summary = {}
    for section in SECTIONS:
        summary.update(section(anchors, OUT))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
