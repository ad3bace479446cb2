"""The README's Quick start answers: every expression of its Python block is finite and
every result with a ``feasible`` flag is feasible."""

import ast
import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def quick_start_code() -> str:
    text = README.read_text()
    section = text[text.index("## Quick start"):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


def check_answer(value, what: str) -> int:
    """Assert ``value`` is finite (and feasible where it says); return the numbers checked."""
    if hasattr(value, "feasible") and dataclasses.is_dataclass(value):
        assert np.all(np.asarray(value.feasible)), f"{what}: infeasible, reason " \
            f"{np.asarray(getattr(value, 'reason', -1))}"
        return sum(check_answer(getattr(value, f.name), f"{what}.{f.name}")
                   for f in dataclasses.fields(value))
    if isinstance(value, pd.DataFrame):
        return check_answer(value.iloc[0], what)
    if isinstance(value, pd.Series):
        if "feasible" in value.index:
            assert bool(value["feasible"]), f"{what}: infeasible"
        nums = [v for v in value.values if isinstance(v, (int, float, np.number))
                and not isinstance(v, (bool, np.bool_))]
        assert all(math.isfinite(float(v)) for v in nums), f"{what}: {value}"
        return len(nums)
    if isinstance(value, dict):
        return sum(check_answer(v, f"{what}[{k!r}]") for k, v in value.items())
    if isinstance(value, (tuple, list)):
        return sum(check_answer(v, f"{what}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (str, type(None))) or hasattr(value, "__dataclass_fields__"):
        return 0
    arr = np.asarray(value)
    if arr.dtype == bool:
        assert arr.all(), f"{what}: {arr}"
        return arr.size
    assert np.all(np.isfinite(arr.astype(float))), f"{what} is not finite: {arr}"
    return arr.size


def test_quick_start_block_is_found():
    code = quick_start_code()
    assert "jm.train_step" in code and "jm.inference" in code
    ast.parse(code)


@pytest.mark.slow
def test_quick_start_every_answer_is_finite_and_feasible():
    """Runs the block statement by statement (the search over 1536 GPUs takes ~1 min)."""
    tree = ast.parse(quick_start_code())
    ns: dict = {}
    checked = 0
    for node in tree.body:
        if isinstance(node, ast.Expr):
            value = eval(compile(ast.Expression(node.value), "README", "eval"), ns)
            checked += check_answer(value, ast.unparse(node.value)[:60])
        else:
            exec(compile(ast.Module([node], []), "README", "exec"), ns)
    assert checked > 10
    for name in ("r", "inf"):             # the results themselves, every field
        check_answer(ns[name], name)
