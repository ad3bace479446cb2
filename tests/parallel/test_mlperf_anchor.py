"""GPT-3 175B MLPerf Training v3.0 on 512-3,584 H100 (FP8, published TP4 PP8 VP12 plans):
predicted against measured tokens/s. Same code as experiments/validate_mlperf.py; nothing is
fitted to these rows (the H100 constants come from its microbenchmarks). Target from the
task: MAPE <= 8 % with precision="fp8"."""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import hw_db
from jaxmodel.parallel.overlap import (forward_only_p2p_exposed, te_amax_sync_exposed,
                                       te_weight_cast_time)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))

import validate_mlperf  # noqa: E402


@pytest.mark.slow
def test_mlperf_fp8_tokens_per_s_within_target(tmp_path):
    """MAPE <= 5 % under the v3.0 configuration, with v3.0's blocking amax reductions over
    tp·dp, the weight casts of each step's first micro-batch and the evaluations'
    forward-only transfers and per-micro-batch weight re-casts (4.4 %; 8.0 % without the
    last three, 9.9 % without the amax reductions). Still +1.6 … +9.9 %, the largest scale
    fastest."""
    df = validate_mlperf.main(out=tmp_path)
    assert len(df) == 5 and df.fp8_feasible.all()
    assert np.all(np.isfinite(df.fp8_tokens_per_s))
    assert float(np.mean(np.abs(df.fp8_err_pct))) <= 5.0, df.to_string()


import validate_mlperf_scale  # noqa: E402


def test_mlperf_scale_rows_carry_their_published_plan():
    """The v3.1/v4.0 rows: only the plan-less row is left out, the v4.0 plans keep their
    published VP, v3.1's unlisted VP is its conf/custom.yaml default 12 (flagged); only v4.0
    runs FP8 parameters (FP8_PARAMS=True)."""
    rows = validate_mlperf_scale.load()
    assert len(rows) == 11 and not (rows.system_dir == "64xSMC-H100-SXM-80GB").any()
    v40 = rows[rows.mlperf_round == "v4.0"]
    assert not v40.vp_from_yaml.any() and set(v40.vp) == {8.0, 4.0}
    v31 = rows[rows.mlperf_round == "v3.1"]
    assert v31.vp_from_yaml.all() and set(v31.vp) == {12.0}
    assert all(float(validate_mlperf.round_precision(r).weight_bytes) == 1.0
               for _, r in v40.iterrows())
    assert all(validate_mlperf.round_precision(r) is None for _, r in v31.iterrows())


@pytest.mark.slow
def test_mlperf_scale_fp8_tokens_per_s(tmp_path):
    """MAPE <= 10 % over the v3.1/v4.0 rows, every row within 15 % at >= 10,000 GPUs,
    every row feasible (these plans ran)."""
    df = validate_mlperf_scale.main(out=tmp_path)
    assert len(df) == 11 and df.fp8_feasible.all(), df.to_string()
    assert np.all(np.isfinite(df.fp8_tokens_per_s))
    assert float(np.mean(np.abs(df.fp8_err_pct))) <= 10.0, df.to_string()
    assert float(np.max(np.abs(df[df.gpus >= 10_000].fp8_err_pct))) <= 15.0, df.to_string()


def test_mlperf_evaluation_overhead_hand_values():
    """⌈5662/GBS⌉ forward-only batches every ⌈24576/GBS⌉ steps (config_common.sh): at GBS
    1536, 4 batches every 16 steps; at 2688, 3 every 10 (10 × 2688 = 26,880 sequences)."""
    assert validate_mlperf.evaluation_overhead(1536, 1 / 3) == pytest.approx(4 / 16 / 3)
    assert validate_mlperf.evaluation_overhead(2688, 0.3) == pytest.approx(3 * 0.3 / 10)
    assert validate_mlperf.evaluation_overhead(24576, 0.5) == pytest.approx(0.5)


def test_te_amax_sync_exposed_hand_values_and_gradient():
    """(m·v + p − 1) blocking reductions of a chunk's forward and backward amaxes per step:
    128 micro-batches × 12 chunks + 7 bubble chunks at 50 + 40 µs = 0.13887 s; no
    interleaving, 1 micro-batch, 1 stage: one pair; d/dt_fwd = m·v + p − 1."""
    assert float(te_amax_sync_exposed(50e-6, 40e-6, 128, 12, 8)) == pytest.approx(0.13887)
    assert float(te_amax_sync_exposed(1.0, 0.0, 1, 1, 1)) == pytest.approx(1.0)
    assert float(te_amax_sync_exposed(0.0, 0.0, 128, 12, 8)) == 0.0
    g = jax.grad(te_amax_sync_exposed)(60e-6, 40e-6, 24.0, 12.0, 8.0)
    assert float(g) == pytest.approx(24 * 12 + 7)


def test_amax_sync_only_for_the_blocking_round():
    """v3.0 (TE release_v0.8 defaults: blocking, over tp·dp) and v4.0 (TE v1.6rc1, which
    no longer reads the variables) pay the reductions; a v3.1 row of the same plan
    (NVTE_DP_AMAX_REDUCE_INTERVAL=0, NVTE_ASYNC_AMAX_REDUCTION=1) does not."""
    row = {"n_accelerators": 512, "tp": 4, "pp": 8, "vp": 12, "micro_batch": 1}
    model = hw_db.model("gpt3-175b")
    system, par, _ = validate_mlperf.plan({**row, "mlperf_round": "v3.0"})
    t30 = validate_mlperf.amax_sync_s(system, model, par, 2048, {"mlperf_round": "v3.0"})
    t31 = validate_mlperf.amax_sync_s(system, model, par, 2048, {"mlperf_round": "v3.1"})
    t40 = validate_mlperf.amax_sync_s(system, model, par, 2048, {"mlperf_round": "v4.0"})
    assert t31 == 0.0 and t40 == t30
    # 128 × 12 + 7 pairs of small all-reduces over 64 ranks on 8 nodes: 10 … 200 µs each
    assert (128 * 12 + 7) * 2 * 10e-6 < t30 < (128 * 12 + 7) * 2 * 200e-6


def test_forward_only_p2p_exposed_hand_values_and_gradient():
    """One hop after each of the m·v + p − 1 chunk forwards of an evaluation batch: 128 × 12
    + 7 hops of 0.4 ms = 0.6172 s; none without pipeline stages; d/dt_hop = m·v + p − 1;
    vmap over hops equals the loop."""
    assert float(forward_only_p2p_exposed(0.4e-3, 128, 12, 8)) == pytest.approx(0.6172)
    assert float(forward_only_p2p_exposed(1.0, 16, 1, 1)) == 0.0
    assert float(forward_only_p2p_exposed(1.0, 4, 1, 2)) == pytest.approx(5.0)
    g = jax.grad(forward_only_p2p_exposed)(0.4e-3, 24.0, 12.0, 8.0)
    assert float(g) == pytest.approx(24 * 12 + 7)
    hops = np.array([0.1e-3, 0.4e-3, 1e-3])
    batched = jax.vmap(lambda t: forward_only_p2p_exposed(t, 8.0, 12.0, 8.0))(hops)
    assert np.allclose(batched, [float(forward_only_p2p_exposed(t, 8.0, 12.0, 8.0))
                                 for t in hops])


def test_te_weight_cast_time_hand_value():
    """k memory-bound kernels over n weights: k · (n/k · bytes / achievable HBM bandwidth +
    the kernel floor); 48 cast-transposes (4 B per weight) of a GPT-3 175B TP4 PP8 device's
    5.44 G weights on an H100 take 7–12 ms; the re-cast (3 B) of one layer ~0.5 ms."""
    dev = hw_db.device("h100_sxm")
    n, k = 5.436e9, 48.0
    want = k * (n / k * 4.0 / float(dev.achievable_mem_bw) + float(dev.gelu_overhead_s))
    got = float(te_weight_cast_time(dev, n, 4.0, k))
    assert got == pytest.approx(want, rel=1e-5) and 7e-3 < got < 12e-3
    assert 0.3e-3 < float(te_weight_cast_time(dev, n / 12, 3.0, 4.0)) < 0.8e-3


def test_evaluation_extras_follow_the_round():
    """v3.0's NeMo 1.17 re-casts every weight at each evaluation micro-batch, v3.1's NeMo
    1.20 does not (nor does a caller without a row); both pay the forward-only transfers;
    the first-micro-batch casts are charged to 16-bit parameters only."""
    row = {"n_accelerators": 512, "tp": 4, "pp": 8, "vp": 12, "micro_batch": 1}
    model = hw_db.model("gpt3-175b")
    system, par, _ = validate_mlperf.plan({**row, "mlperf_round": "v3.0"})
    e30, e31, e_none = (validate_mlperf.eval_extra_s(system, model, par, 2048, 2048, r)
                        for r in ({"mlperf_round": "v3.0"}, {"mlperf_round": "v3.1"}, None))
    n, k = validate_mlperf._device_weights(model, par)
    recast = 128 * float(te_weight_cast_time(system.device, n, 3.0, k))
    assert e31 == e_none and e30 == pytest.approx(e31 + recast, rel=1e-6)
    assert (128 * 12 + 7) * 0.1e-3 < e31 < (128 * 12 + 7) * 2e-3
    assert validate_mlperf.eval_extra_s(system, model, par, 2048, 2048,
                                        {"mlperf_round": "v3.0"}, fp8=False) == e31
    assert validate_mlperf.weight_cast_s(system, model, par) > 0.0
    assert validate_mlperf.weight_cast_s(
        system, model, par, validate_mlperf.round_precision({"mlperf_round": "v4.0"})) == 0.0
