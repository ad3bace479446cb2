"""Operator models against LLMCompass's real-hardware measurements (A100, MI210, TPUv3).

Same code as experiments/validate_llmcompass.py (operator section). Targets from the task:
overall MAPE <= 8 %, every operator family (pooled over devices) <= 12 %.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

import validate_llmcompass as validation  # noqa: E402


def test_operator_mape_targets(anchors):
    df = validation.load_operator_anchors(anchors)
    assert len(df) == 3 * (20 + 22 + 22 + 20) + 2
    df["predicted_s"] = validation.predict(df)
    table = validation.mape_table(df)
    pooled = table[table.device == "all"].set_index("family").mape_pct
    assert pooled["all"] <= 8.0, table.to_string()
    for fam in validation.FAMILIES:
        assert pooled[fam] <= 12.0, table.to_string()
