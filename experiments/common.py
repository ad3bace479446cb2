"""What every experiment script shares: the repository root, the output folder, the anchor
folder, the MAPE and the figure helpers.

``experiments/`` is on ``sys.path`` when a script runs (Python puts the script's folder first)
and in the tests that import the scripts, so ``from common import ROOT, OUT, ANCHORS`` works
from both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxmodel.anchors import ANCHORS, anchor_dir
from jaxmodel.plots import figure, save

__all__ = ["ROOT", "OUT", "ANCHORS", "anchor_dir", "mape", "figure", "save"]

#: The repository root.
ROOT = Path(__file__).resolve().parent.parent
#: Where the experiments write their CSVs and figures.
OUT = ROOT / "experiments" / "out"


def mape(pred, meas) -> float:
    """Mean absolute percentage error of ``pred`` against ``meas``, in percent:
    ``100 · mean(|pred/meas − 1|)`` over the entries where both are finite."""
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    ok = np.isfinite(pred) & np.isfinite(meas)
    return float(np.mean(np.abs(pred[ok] / meas[ok] - 1.0)) * 100.0) if ok.any() else float("nan")
