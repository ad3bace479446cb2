"""search_serving: enumeration counts, limits respected by the front, the front
non-dominated, rows reproduced by the single-configuration models, argument errors."""

import inspect

import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.search import serving as ss

OPTS = dict(tp=(1, 2, 4), pp=(1, 2), max_batch=(8, 64), chunk=(0, 256), precision=("bf16",),
            runtime=("trtllm",), loads=(0.3, 0.9), progress=False)
TTFT, TPOT = 0.5, 0.02


def test_plans_divide_the_devices():
    assert ss._plans(4, (1, 2, 4), (1, 2)) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
    assert ss._plans(6, (1, 2, 4), (1, 3)) == [(1, 1), (1, 3), (2, 1), (2, 3)]


@pytest.mark.parametrize("kw, msg", [
    (dict(loads=(0.5, 1.2)), "loads"), (dict(chunk=(-1,)), "chunk"),
    (dict(precision=()), "precision"), (dict(precision=("fp7",)), "fp7"),
    (dict(tp=(3,), pp=(1,)), "tp/pp")])
def test_bad_options_raise_before_computing(kw, msg):
    with pytest.raises(ValueError, match=msg):
        jm.search_serving(hw_db.system("hgx_a100_4gpu"), hw_db.model("llama3.2-1b"), 4, 512,
                          128, **{**OPTS, **kw})


def test_keywords_are_the_search_space_fields():
    """Every keyword after the limits is a field of ``SearchSpace`` with its default; an
    unknown one is a ``TypeError`` naming it, before anything is computed."""
    assert ss.SearchSpace().loads == ss.LOADS and ss.SearchSpace().tp is None
    shown = inspect.signature(jm.search_serving).parameters
    assert shown["ep"].default == (1,) and shown["ep"].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="max_batches"):
        jm.search_serving(hw_db.system("hgx_a100_4gpu"), hw_db.model("llama3.2-1b"), 4, 512,
                          128, max_batches=(8,))


@pytest.fixture(scope="module")
def result():
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("llama3.2-1b")
    df = jm.search_serving(system, model, 4, 512, 128, ttft_slo_s=TTFT, tpot_slo_s=TPOT,
                           full=True, **OPTS)
    return system, model, df


@pytest.mark.slow
def test_counts_and_limits(result):
    _, _, df = result
    plans = ss._plans(4, OPTS["tp"], OPTS["pp"])
    n_agg = len(plans) * 2 * 2 * 2
    n_dis = sum(1 for a, b in plans for c, d in plans for n_p in range(a * b, 4, a * b)
                if (4 - n_p) % (c * d) == 0) * 2 * 2
    assert df.attrs["n_evaluated"] == len(df) == n_agg + n_dis
    assert (df["mode"] == "aggregated").sum() == n_agg
    front = df[df["pareto"]]
    assert len(front) >= 1 and front["meets_slo"].all()
    assert (front["ttft_s"] <= TTFT).all() and (front["tpot_s"] <= TPOT).all()
    # no row meeting the limits dominates a front row
    ok = df[df["meets_slo"]]
    for _, r in front.iterrows():
        dom = ((ok["tokens_per_s_per_user"] >= r["tokens_per_s_per_user"])
               & (ok["throughput_per_gpu"] >= r["throughput_per_gpu"])
               & ((ok["tokens_per_s_per_user"] > r["tokens_per_s_per_user"])
                  | (ok["throughput_per_gpu"] > r["throughput_per_gpu"])))
        assert not dom.any()
    # infeasible rows say why and carry no NaN
    assert not df[["ttft_s", "tpot_s", "throughput_per_gpu"]].isna().any().any()
    assert set(df.loc[~df["feasible"], "reason_name"]) <= {"rate_above_capacity",
                                                           "out_of_memory",
                                                           "heads_not_divisible",
                                                           "layers_not_divisible"}


@pytest.mark.slow
def test_rows_match_the_single_configuration_models(result):
    system, model, df = result
    ok = df[df["feasible"]]
    a = ok[(ok["mode"] == "aggregated") & (ok["chunk"] > 0)].iloc[0]
    r = jm.continuous_batching(system, model, jm.Parallelism(dp=a.dp, tp=a.tp, pp=a.pp), 512,
                               128, a.rate_rps, a.max_batch, a.chunk, runtime="trtllm")
    assert float(r.tpot_s) == pytest.approx(a.tpot_s, rel=1e-5)
    assert float(r.ttft_s) == pytest.approx(a.ttft_s, rel=1e-5)
    d = ok[ok["mode"] == "disaggregated"].iloc[-1]
    r = jm.disaggregated(system, model,
                         jm.Parallelism(dp=d.prefill_dp, tp=d.prefill_tp, pp=d.prefill_pp),
                         jm.Parallelism(dp=d.dp, tp=d.tp, pp=d.pp), 512, 128, d.rate_rps,
                         d.max_batch, runtime="trtllm")
    assert float(r.tpot_s) == pytest.approx(d.tpot_s, rel=1e-5)
    assert float(r.ttft_s) == pytest.approx(d.ttft_s, rel=1e-5)
    assert np.isfinite(df.attrs["configs_per_s"])


@pytest.mark.slow
def test_offline_column_and_tail_limits(result):
    system, model, df = result
    # the offline throughput of each aggregated row is that of its (tp, pp) deployment with
    # every request queued under the runtime's scheduler defaults
    a = df[(df["mode"] == "aggregated") & df["feasible"]].iloc[0]
    r = jm.offline_throughput(system, model, jm.Parallelism(dp=a.dp, tp=a.tp, pp=a.pp), 512,
                              128, precision="bf16", runtime="trtllm")
    assert a.offline_throughput_per_gpu == pytest.approx(float(r.throughput_per_gpu), rel=1e-5)
    assert (df.loc[df["mode"] == "disaggregated", "offline_throughput_per_gpu"] == 0).all()
    assert (df["ttft_p99_s"] >= df["ttft_s"] * (1 - 1e-6)).all()
    # tail=True: the limits bind the 99th percentiles, a subset of the mean-limited rows
    tail = jm.search_serving(system, model, 4, 512, 128, ttft_slo_s=TTFT, tpot_slo_s=TPOT,
                             full=True, tail=True, **OPTS)
    ok = tail[tail["meets_slo"]]
    assert len(ok) >= 1 and (ok["ttft_p99_s"] <= TTFT).all() and (ok["tpot_p99_s"] <= TPOT).all()
    assert tail["meets_slo"].sum() <= df["meets_slo"].sum()


def test_expert_parallel_degrees_fit_the_experts_and_the_stage():
    moe, dense = hw_db.model("mixtral-8x7b"), hw_db.model("llama3.2-1b")
    assert ss._ep_degrees(moe, 8, 8, 1, (1, 2, 8, 16)) == [1, 2, 8]   # 16 > 8 experts
    assert ss._ep_degrees(moe, 8, 2, 2, (4, 8)) == [1, 4]             # stage of 4 devices
    assert ss._ep_degrees(dense, 8, 8, 1, (8,)) == [1]                # no experts
    with pytest.raises(ValueError, match="expert-parallel degree 0"):
        ss._ep_degrees(moe, 8, 8, 1, (0,))


def test_speculative_options_are_validated_and_stacked_per_table():
    eagle = jm.Speculative(method="eagle", k=3.0, accept=0.7)
    specs = ss._speculative_options((None, eagle))
    assert ss._stacked_speculative([None], [(1, 1, 0, 0, 1, 0)]) is None
    keys = [(1, 1, 0, 0, 1, 0), (1, 1, 0, 0, 1, 1), (2, 1, 0, 0, 1, 1)]
    st = ss._stacked_speculative(specs, keys)
    np.testing.assert_array_equal(np.asarray(st.k), [0.0, 3.0, 3.0])
    np.testing.assert_array_equal(np.asarray(st.method), [0.0, 3.0, 3.0])
    with pytest.raises(ValueError, match="accept"):
        ss._speculative_options((jm.Speculative(method="eagle", k=3.0, accept=1.5),))
    with pytest.raises(ValueError, match="speculative"):
        ss._speculative_options(())


@pytest.mark.slow
def test_search_offers_expert_parallelism_speculation_and_fp4():
    """Mixtral 8×7B on a DGX B200: experts over the TP ranks (EP 8 = attention TP 8 × EP 8),
    EAGLE speculation and NVFP4 are cost-table axes; the option "none" reproduces the search
    without speculation, and speculation raises tokens/s per user at a small batch."""
    system, model = hw_db.system("dgx_b200"), hw_db.model("mixtral-8x7b")
    kw = dict(tp=(8,), pp=(1,), max_batch=(4, 64), chunk=(0,), precision=("fp8", "nvfp4"),
              runtime=("trtllm",), loads=(0.5,), disaggregated=False, full=True,
              progress=False)
    eagle = jm.Speculative(method="eagle", k=3.0, accept=0.7)
    df = jm.search_serving(system, model, 8, 1024, 256, speculative=(None, eagle),
                           ep=(1, 8), **kw)
    assert len(df) == 2 * 2 * 2 * 2                     # precision × ep × spec × batch cap
    assert set(df.ep) == {1.0, 8.0} and set(df.speculative) == {"none", "eagle"}
    assert set(df.precision) == {"fp8", "nvfp4"} and df.feasible.all()
    base = jm.search_serving(system, model, 8, 1024, 256, **kw)
    cols = ["precision", "max_batch", "tpot_s", "ttft_s", "throughput_per_gpu"]
    plain = df[(df.speculative == "none") & (df.ep == 1.0)][cols].reset_index(drop=True)
    np.testing.assert_allclose(plain[cols[2:]].to_numpy(),
                               base[cols[2:]].to_numpy(), rtol=1e-6)
    small = df[(df.max_batch == 4) & (df.ep == 1.0) & (df.precision == "fp8")]
    fast = small.set_index("speculative").tokens_per_s_per_user
    assert fast["eagle"] > fast["none"]
