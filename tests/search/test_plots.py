"""jaxmodel.plots: Pareto mask against brute force, and every figure renders to PNG."""

import numpy as np
import pandas as pd
from hypothesis import given, settings, strategies as st

from jaxmodel import plots


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_pareto_mask_matches_brute_force(points):
    cost, perf = (np.array(c, dtype=float) for c in zip(*points))
    got = plots.pareto_mask(cost, perf)
    for i in range(len(cost)):
        dominated = any((cost[j] <= cost[i] and perf[j] >= perf[i]
                         and (cost[j] < cost[i] or perf[j] > perf[i]))
                        for j in range(len(cost)))
        # among identical points only the first one is kept on the front
        duplicate_before = any(cost[j] == cost[i] and perf[j] == perf[i] for j in range(i))
        assert got[i] == (not dominated and not duplicate_before)


def test_pareto_mask_minimize_and_nonfinite():
    m = plots.pareto_mask([1, 2, 3, 4], [5.0, 4.0, np.inf, 4.5], maximize=False)
    assert m.tolist() == [True, True, False, False]


def test_figures_render(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"cost": rng.uniform(1, 10, 200), "perf": rng.uniform(0, 1, 200),
                       "bw": np.repeat(np.arange(20.0), 10), "cores": np.tile(np.arange(10.0),
                                                                              20)})
    df.loc[3, "perf"] = np.inf
    plots.pareto_plot(df, "cost", "perf", color="bw", label_front="cores",
                      path=tmp_path / "p.png")
    plots.breakdown_plot({"a": {"gemm": 1e-3, "comm": 2e-3}, "b": {"gemm": 3e-3}},
                         path=tmp_path / "b.png")
    plots.roofline_plot(312e12, 2.0e12, [{"name": "qkv", "flops": 1e12, "bytes": 1e9,
                                           "time_s": 5e-3},
                                          {"name": "gemv", "flops": 1e9, "bytes": 1e9}],
                        extra_roofs={"L2": 7e12}, path=tmp_path / "r.png")
    plots.heatmap_plot(df, "bw", "cores", "perf", path=tmp_path / "h.png")
    for name in "pbrh":
        assert (tmp_path / f"{name}.png").stat().st_size > 5000
