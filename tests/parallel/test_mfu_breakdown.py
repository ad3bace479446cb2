"""experiments/mfu_breakdown.py: rows timed as train_step times them, and its anchors."""

import sys
from pathlib import Path

import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.parallel.train import sustained_device

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

import mfu_breakdown  # noqa: E402


def test_layer_rows_run_at_the_sustained_clock():
    """A compute-bound GEMM row takes ``1 / sustained_clock_fraction`` times its full-clock
    time once the fixed per-call overhead is taken off (hand derivation: the library
    bound's main loop scales with 1/f; its wave latency, 1.25 us per wave, is < 0.5 % of
    this GEMM). The rows must be the sustained ones, as train_step uses them."""
    system = hw_db.system("dgx_a100", nodes=8)
    model = hw_db.model("gpt3-175b")
    par = jm.Parallelism(dp=1, tp=8, pp=8, sp=True, micro_batch=1, schedule="1f1b",
                         recompute="selective", zero=1, flash_attention=2)
    rows = mfu_breakdown.layer_rows(system, model, par, 2048.0)
    dev = system.device
    ov = float(dev.matmul_overhead_s)
    frac = float(dev.sustained_clock_fraction)
    # FC1 forward: 2048 tokens x (4h/8 = 6144) x h
    full = float(jm.gemm_latency(dev, 2048.0, 6144.0, 12288.0)) - ov
    sus = float(jm.gemm_latency(sustained_device(dev), 2048.0, 6144.0, 12288.0)) - ov
    assert sus / full == pytest.approx(1.0 / frac, rel=5e-3)
    assert rows["w1"][0] == pytest.approx(sus + ov, rel=1e-5)


def test_gemm_anchor_reproduces_the_derivation_shapes(anchors, monkeypatch):
    """The three largest sustained cuBLASLt shapes are the ones sustained_clock_fraction is
    derived on (mean ratio): each within 2 % on the sustained device."""
    monkeypatch.setattr(mfu_breakdown, "ANCHORS", anchors)
    g = mfu_breakdown.gemm_anchor()
    assert int(g.in_sample.sum()) == 3
    assert np.all(np.isfinite(g.model))
    inside = g[g.in_sample]
    assert inside.error_pct.abs().max() <= 2.0, g.to_string()
    assert abs(inside.error_pct.mean()) <= 1.0, g.to_string()


@pytest.mark.slow
def test_korthikanti_end_to_end_mfu():
    """Korthikanti et al. (MLSys 2023) runs, sequence parallelism + selective recompute,
    dp = 1: the predicted MFU within 5 % of each measured one (41.5 / 51.4 / 56.0 / 56.3 %)."""
    k = mfu_breakdown.korthikanti()
    assert len(k) == 4
    assert np.all(np.isfinite(k.predicted))
    assert k.error_pct.abs().max() <= 5.0, k.to_string()
