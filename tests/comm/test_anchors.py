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


def clean(ds, min_bytes=2.0**20):
    """Rows >= 1 MiB: below, kernel times are dominated by the profiling loop (rank 0 waits
    for the peers' launches, see experiments/calibrate_collectives.py)."""
    keep = ds["nbytes"] >= min_bytes
    return {k: (v[keep] if isinstance(v, np.ndarray) and v.shape == keep.shape else v)
            for k, v in ds.items()}


@pytest.mark.slow
@pytest.mark.parametrize("loader", [lambda a: A.vidur(a, "single_node"), A.vidur_h100])
def test_kernel_times_from_1mib_within_10_percent(anchors, loader):
    assert mape(clean(loader(anchors))) <= 10.0


@pytest.mark.slow
def test_kernel_times_all_rows_regression(anchors):
    # all rows, including the sub-MiB ones dominated by the profiling loop (launch floor):
    # 17.2 % (A100: its 2 KiB rows take 10 us on 2 GPUs, 61 us on 4 and 8) and 10.2 % (H100)
    assert mape(A.vidur(anchors, "single_node")) <= 17.5
    assert mape(A.vidur_h100(anchors)) <= 10.5


@pytest.mark.slow
def test_vidur_two_node_16_regression(anchors):
    # a documented comparison, not a target (undocumented fabric; the profile is 2x slower
    # per byte below 32 MiB than above): 45.7 %; guard against regressions
    assert mape(A.vidur(anchors, "two_node_16")) <= 48.0
