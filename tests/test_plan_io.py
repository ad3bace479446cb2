"""The applications' shared helpers (jaxmodel.plan_io): one copy, used by the command and the
explorer; the command's choices are the codes' names where the codes are defined."""

import pytest

from jaxmodel import cli, plan_io
from jaxmodel.types import FA_VERSIONS, RECOMPUTE, SCHEDULES, ZERO3_IMPLS
from jaxmodel.ui import compute


def _choices(sub: str, dest: str):
    p = cli.parser()._subparsers._group_actions[0].choices[sub]
    return next(a.choices for a in p._actions if a.dest == dest)


@pytest.mark.parametrize("sub", ["predict", "export", "explain"])
def test_cli_choices_are_the_codes_names(sub):
    assert list(_choices(sub, "schedule")) == list(SCHEDULES)
    assert list(_choices(sub, "recompute")) == list(RECOMPUTE)
    assert list(_choices(sub, "flash_attention")) == list(FA_VERSIONS)
    assert list(_choices(sub, "zero3_impl")) == list(ZERO3_IMPLS)
    assert SCHEDULES.index("dualpipe") == 3 and RECOMPUTE.index("norm_upproj") == 3
    a = cli.parser().parse_args([sub, *(["train"] if sub != "explain" else ["predict"]),
                                 "--schedule", "dualpipe", "--recompute", "norm_upproj"])
    assert (a.schedule, a.recompute) == ("dualpipe", "norm_upproj")


def test_one_copy_of_each_helper():
    assert cli.to_jsonable is plan_io.to_jsonable is compute._plain
    assert cli.build_parallelism is plan_io.build_parallelism
    assert cli.explain_infeasible is plan_io.explain_infeasible
    assert cli._default_tp is plan_io.default_tp
    assert compute.PAR_CHOICE["schedule"] == SCHEDULES


def test_explain_infeasible_by_reason_and_memory():
    res = {"feasible": False, "reason": "out_of_memory", "memory_bytes": 100 * 2.0**30,
           "memory_capacity_bytes": 80 * 2.0**30}
    cmd = plan_io.explain_infeasible(res)
    assert cmd.startswith("infeasible: out_of_memory (needs 100.0 GiB per device of 80.0 GiB)")
    assert "--tp" in cmd and "--micro-batch" in cmd
    ui = plan_io.explain_infeasible(res, options=False)
    assert "--" not in ui and " tp " in ui and "micro_batch" in ui
    assert plan_io.explain_infeasible({"feasible": True}) is None
    assert plan_io.explain_infeasible({"feasible": False, "reason": "x"}).endswith(
        "change the plan")


def test_build_parallelism_names_field_and_value():
    with pytest.raises(ValueError, match="unknown field 'tpp'.*did you mean 'tp'"):
        plan_io.build_parallelism({"tpp": 2}, 8)
    with pytest.raises(ValueError, match=r"tp·pp·cp = 3·1·1 does not divide the 8 devices"):
        plan_io.build_parallelism({"tp": 3}, 8)
    with pytest.raises(ValueError, match="'pp' = 0"):
        plan_io.build_parallelism({"pp": 0}, 8)
    with pytest.raises(compute.FormError) as e:
        compute.parallelism({"tp": 3}, 8.0)
    assert e.value.field == "tp"
    assert plan_io.to_jsonable({"x": float("nan"), "y": -float("inf")}) == {"x": None,
                                                                           "y": "-inf"}
