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
    return A.subset(ds, ds["nbytes"] >= min_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("loader", [lambda a: A.vidur(a, "single_node"), A.vidur_h100])
def test_kernel_times_from_1mib_within_10_percent(anchors, loader):
    assert mape(clean(loader(anchors))) <= 10.0


def without_mixed(ds):
    """Rows whose median does not mix the profiling loop's two launch modes
    (:func:`jaxmodel.comm.anchors.mixed_modes`)."""
    return A.subset(ds, ~A.mixed_modes(ds))


@pytest.mark.slow
@pytest.mark.parametrize("loader", [lambda a: A.vidur(a, "single_node"), A.vidur_h100])
def test_kernel_times_without_mixed_modes_within_10_percent(anchors, loader):
    assert mape(without_mixed(loader(anchors))) <= 10.0


@pytest.mark.slow
def test_kernel_times_all_rows_regression(anchors):
    # all rows, the mixed-mode ones included: A100 25.7 % (its 2-GPU 2 KiB row, repetitions
    # 10/10/59 us, is predicted at the launch floor of ~62 us: +520 %), H100 10.5 %
    assert mape(A.vidur(anchors, "single_node")) <= 26.0
    assert mape(A.vidur_h100(anchors)) <= 11.0


@pytest.mark.slow
def test_vidur_two_node_16_regression(anchors):
    # a documented comparison, not a target (undocumented fabric; the profile is 2x slower
    # per byte below 32 MiB than above): 45.7 %; guard against regressions
    assert mape(A.vidur(anchors, "two_node_16")) <= 48.0


def test_mixed_modes_flags_repetitions_and_outliers():
    """Model-free flag of rows that mix the profiling loop's launch modes: repetitions more
    than 2x apart, or a median 2x away from the same group's rows within 25 % in size."""
    ds = {"nbytes": np.array([2048.0, 2**20, 2**20 * 1.1, 2**20 * 1.2, 2**20 * 1.15, 2**20]),
          "group": np.array([2.0, 2.0, 2.0, 2.0, 2.0, 4.0]),
          "seconds": np.array([10e-6, 40e-6, 41e-6, 8e-6, 42e-6, 9e-6]),
          "seconds_min": np.array([10e-6, 39e-6, 40e-6, 8e-6, 41e-6, 9e-6]),
          "seconds_max": np.array([59e-6, 41e-6, 42e-6, 9e-6, 43e-6, 9e-6])}
    got = A.mixed_modes(ds)
    # row 0: 10/10/59 us repetitions; row 3: 8 us among 40-42 us neighbours; row 5 has no
    # neighbours in its group (4 GPUs) and consistent repetitions
    assert got.tolist() == [True, False, False, True, False, False]


def test_mixed_modes_on_the_anchors(anchors):
    """The A100 2-GPU 2 KiB row (repetitions 10, 10, 59 us) is the only flagged A100 row."""
    ds = A.vidur(anchors, "single_node")
    flag = A.mixed_modes(ds)
    assert flag.sum() == 1
    i = int(np.argmax(flag))
    assert ds["group"][i] == 2 and ds["nbytes"][i] == 2048
