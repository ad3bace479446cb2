"""Steady-state serving models (jaxmodel.serving): formulas against hand-derived values on a
synthetic cost table, vmap vs loop, jit vs eager, gradients vs finite differences, float32 and
float64, infeasible configurations; and the cost table against jm.inference."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import serving as srv
from jaxmodel.serving import Pools, ServingOptions as Opts
from jaxmodel.numerics import reason_name

GRID = np.asarray(srv.TOKEN_GRID)
ISL, OSL = 1000.0, 100.0


def table(a=0.01, k=1e-4, t_p=0.05, attn_slope=5e-5, pre_attn=0.05, weights=16e9,
          kv_tok=1e5, act=1e9, mem=80e9):
    """Affine decode iteration T(m) = a + k·m (the interpolation is then exact)."""
    f = jnp.result_type(float)
    return srv.ServingCosts(
        step_s=jnp.asarray(a + k * GRID, f), attn_s=jnp.asarray(attn_slope * GRID, f),
        prefill_s=jnp.asarray(t_p, f), prefill_attn_s=jnp.asarray(pre_attn, f),
        weights_bytes=jnp.asarray(weights, f), kv_bytes_per_token=jnp.asarray(kv_tok, f),
        act_bytes=jnp.asarray(act, f), mem_capacity=jnp.asarray(mem, f),
        feasible=jnp.asarray(True), reason=jnp.asarray(0, jnp.int32))


def test_kv_capacity_hand_derived():
    # free = 0.9·80e9 − 16e9 − 1e9 = 55e9 B; blocks of 16·1e5 B: 34375; a request's peak
    # 1100 tokens = ceil(68.75) = 69 blocks → floor(34375/69) = 498 requests
    assert float(srv.kv_capacity_seqs(table(), ISL, OSL)) == 498.0
    # a chunk of 250 tokens reserves a quarter of the prompt's working set: 55.75e9 B free,
    # 34843 blocks → 504 requests
    assert float(srv.kv_capacity_seqs(table(), ISL, OSL, prefill_tokens=250.0)) == 504.0


def test_step_time_interpolates_and_extends():
    c = table()
    for m in (1.0, 3.0, 100.0, 5000.0, 20000.0):
        assert float(srv.step_time(c, m)) == pytest.approx(0.01 + 1e-4 * m, rel=1e-12)
    assert float(srv.step_time(c, 0.3)) == pytest.approx(0.01 + 1e-4, rel=1e-12)  # flat < 1


def test_continuous_batching_hand_derived():
    # λ = 5/s, t_p = 0.05 s: ρ = 0.25; r = λ·osl/(1 − ρ) = 666.67/s;
    # B = r·a/(1 − r·k) = 6.6667/0.93333 = 7.142857; T = a + k·B = 0.0107142857 s;
    # TPOT = T/(1 − ρ) = 0.0142857143 s; TTFT = t_p + ρ·t_p/(2(1 − ρ)) + (1 − ρ)·T/2
    #      = 0.05 + 0.0083333 + 0.0040178571 = 0.0623511905 s
    r = srv.continuous_batching_from_costs(table(), ISL, OSL, 5.0, Opts(max_batch=256.0))
    assert bool(r.feasible) and int(r.reason) == 0
    assert float(r.batch) == pytest.approx(7.142857142857, rel=1e-9)
    assert float(r.iteration_s) == pytest.approx(0.0107142857143, rel=1e-9)
    assert float(r.tpot_s) == pytest.approx(0.0142857142857, rel=1e-9)
    assert float(r.ttft_s) == pytest.approx(0.0623511904762, rel=1e-9)
    assert float(r.throughput_per_gpu) == pytest.approx(500.0)
    assert float(r.tokens_per_s_per_user) == pytest.approx(70.0, rel=1e-9)
    # Little's law: B = λ·osl·TPOT
    assert float(r.batch) == pytest.approx(5.0 * OSL * float(r.tpot_s), rel=1e-9)
    # capacity: B_max = 256 → λ = 256/(100·(0.01 + 0.0256) + 256·0.05) = 15.647921760
    assert float(r.capacity_rps) == pytest.approx(15.647921760, rel=1e-9)
    # dp replicas share the rate; pp micro-batches halve the per-micro-batch tokens
    r2 = srv.continuous_batching_from_costs(table(), ISL, OSL, 10.0, Opts(max_batch=256.0), dp=2.0,
                                            n_gpus=2.0)
    assert float(r2.tpot_s) == pytest.approx(float(r.tpot_s), rel=1e-12)
    assert float(r2.capacity_rps) == pytest.approx(2 * float(r.capacity_rps), rel=1e-12)


def test_chunked_prefill_hand_derived():
    # δ = 0.05/1000 − 5e-5 = 0 (a chunk token costs a decode sequence's attention);
    # m = λ(osl + isl)·T(m): r = 5500/s, m = 55/0.45 = 122.2222; T_it = 0.0222222 s;
    # c̄ = λ·isl·T_it = 111.111 < C = 256; T_full = T(m − c̄ + C) = 0.01 + 0.0267111;
    # D = ceil(1000/256)·T_full = 4·0.0367111 = 0.1468444 s, ρ = λD = 0.7342222;
    # TTFT = ρD/(2(1 − ρ)) + D + T_it/2 = 0.2028287 + 0.1468444 + 0.0111111 = 0.3607843 s
    r = srv.continuous_batching_from_costs(table(), ISL, OSL, 5.0,
                                           Opts(max_batch=256.0, chunk=256.0))
    assert bool(r.feasible)
    assert float(r.tpot_s) == pytest.approx(0.0222222222, rel=1e-8)
    assert float(r.batch) == pytest.approx(5.0 * OSL * 0.0222222222, rel=1e-8)
    d = 4 * (0.01 + 1e-4 * (122.2222222 - 111.1111111 + 256.0))
    rho = 5.0 * d
    assert float(r.ttft_s) == pytest.approx(rho * d / (2 * (1 - rho)) + d + 0.0111111111,
                                            rel=1e-7)
    # the Sarathi-Serve trade at a high rate: no generation stalls (prefill takes ρ = 0.6
    # of the time without chunks), a longer first token
    c = table(k=2e-5)
    plain = srv.continuous_batching_from_costs(c, ISL, OSL, 12.0, Opts(max_batch=256.0))
    chunk = srv.continuous_batching_from_costs(c, ISL, OSL, 12.0,
                                               Opts(max_batch=256.0, chunk=512.0))
    assert bool(plain.feasible) and bool(chunk.feasible)
    assert float(chunk.tpot_s) < 0.6 * float(plain.tpot_s)
    assert float(chunk.ttft_s) > float(plain.ttft_s) - 0.05


def test_disaggregated_hand_derived():
    system = hw_db.system("dgx_h100")
    lvl = system.levels[0]
    # prefill pool 2×1 GPU: λ_p = 5, ρ = 0.25: 0.05 + 0.25·0.05/1.5 = 0.0583333 s, plus the
    # KV shard (1000 tokens × 1e5 B) over NVLink (the pools fit in one node)
    t_kv = float(lvl.link_latency) + 1e8 / (float(lvl.bw_per_device) * float(lvl.efficiency))
    # decode pool 6×1 GPU: λ_d = 10/6, r = 166.667, B = 1.66667/0.983333 = 1.6949153,
    # TPOT = 0.01 + 1e-4·B
    r = srv.disaggregated_from_costs(table(), table(), system, ISL, OSL, 10.0,
                                     Opts(max_batch=256.0), Pools(dp_prefill=2.0, dp_decode=6.0))
    assert bool(r.feasible)
    assert float(r.ttft_s) == pytest.approx(0.05 + 0.25 * 0.05 / 1.5 + t_kv, rel=1e-9)
    assert float(r.batch) == pytest.approx(1.6949152542, rel=1e-9)
    assert float(r.tpot_s) == pytest.approx(0.01 + 1e-4 * 1.6949152542, rel=1e-9)
    assert float(r.throughput_per_gpu) == pytest.approx(10.0 * OSL / 8.0)
    # capacity: min(2/0.05, 6·256/(100·(0.01 + 0.0256))) = min(40, 431.46) = 40
    assert float(r.capacity_rps) == pytest.approx(40.0, rel=1e-9)
    # pools larger than the system
    bad = srv.disaggregated_from_costs(table(), table(), system, ISL, OSL, 10.0,
                                       Opts(max_batch=256.0), Pools(dp_prefill=4.0, dp_decode=6.0))
    assert reason_name(bad.reason) == "devices_mismatch"


def test_infeasible_rate_and_memory_finite_gradients():
    c = table()
    r = srv.continuous_batching_from_costs(c, ISL, OSL, 20.0,
                                           Opts(max_batch=256.0))   # above 15.65/s
    assert not bool(r.feasible) and reason_name(r.reason) == "rate_above_capacity"
    assert math.isinf(float(r.ttft_s)) and math.isinf(float(r.tpot_s))
    assert float(r.throughput_per_gpu) == 0.0 and not bool(r.meets_slo)
    full = srv.continuous_batching_from_costs(table(weights=80e9), ISL, OSL, 1.0,
                                              Opts(max_batch=256.0))
    assert reason_name(full.reason) == "out_of_memory"

    def f(rate, a):
        res = srv.continuous_batching_from_costs(table(a=a), ISL, OSL, rate,
                                                 Opts(max_batch=256.0, chunk=256.0))
        return res.ttft_s + res.tpot_s + res.goodput_per_gpu
    for rate in (20.0, 1e6):
        g = jax.grad(f, argnums=(0, 1))(rate, 0.01)
        assert all(np.isfinite(np.asarray(x)) for x in g)
    # a runtime too slow to reach a fixed point even with an empty batch
    r = srv.continuous_batching_from_costs(table(a=1.0, k=1.0), ISL, OSL, 5.0,
                                           Opts(max_batch=256.0))
    assert reason_name(r.reason) == "rate_above_capacity"


def test_slo_and_goodput():
    r = srv.continuous_batching_from_costs(table(), ISL, OSL, 5.0,
                                           Opts(max_batch=256.0, ttft_slo_s=0.07, tpot_slo_s=0.015))
    assert bool(r.meets_slo) and float(r.goodput_per_gpu) == float(r.throughput_per_gpu)
    r = srv.continuous_batching_from_costs(table(), ISL, OSL, 5.0,
                                           Opts(max_batch=256.0, tpot_slo_s=0.014))
    assert not bool(r.meets_slo) and float(r.goodput_per_gpu) == 0.0


def _point(rate, chunk):
    return srv.continuous_batching_from_costs(table(), ISL, OSL, rate,
                                              Opts(max_batch=256.0, chunk=chunk))


def test_vmap_matches_loop_and_jit_matches_eager():
    rates = jnp.asarray([0.5, 2.0, 5.0, 12.0, 15.0, 30.0])
    for chunk in (0.0, 512.0):
        batch = jax.vmap(lambda x: _point(x, chunk))(rates)
        jitted = jax.jit(lambda x: _point(x, chunk))
        for i, x in enumerate(rates):
            one = _point(x, chunk)
            jone = jitted(x)
            for name in ("ttft_s", "tpot_s", "batch", "capacity_rps", "feasible", "reason"):
                v = np.asarray(getattr(one, name))
                np.testing.assert_allclose(np.asarray(getattr(batch, name))[i], v, rtol=1e-12)
                np.testing.assert_allclose(np.asarray(getattr(jone, name)), v, rtol=1e-12)


@pytest.mark.parametrize("chunk", [0.0, 512.0])
def test_gradient_matches_finite_differences(chunk):
    def f(x):
        rate, a, k = x[0], x[1], x[2]
        c = dataclasses.replace(table(), step_s=a + k * jnp.asarray(GRID))
        r = srv.continuous_batching_from_costs(c, ISL, OSL, rate,
                                               Opts(max_batch=256.0, chunk=chunk))
        return r.ttft_s + 3.0 * r.tpot_s
    x0 = jnp.asarray([5.0, 0.01, 1e-4])
    g = np.asarray(jax.grad(f)(x0))
    for i in range(3):
        h = 1e-6 * float(x0[i])
        e = jnp.zeros(3).at[i].set(h)
        fd = (float(f(x0 + e)) - float(f(x0 - e))) / (2 * h)
        assert g[i] == pytest.approx(fd, rel=1e-5)
    assert np.all(g > 0)        # more load or slower iterations: longer latencies


def test_disaggregated_gradient_matches_finite_differences():
    system = hw_db.system("dgx_h100")

    def f(bw):
        lv = dataclasses.replace(system.levels[0], bw_per_device=bw)
        sys2 = dataclasses.replace(system, levels=(lv,) + tuple(system.levels[1:]))
        r = srv.disaggregated_from_costs(table(), table(), sys2, ISL, OSL, 10.0,
                                         Opts(max_batch=256.0),
                                         Pools(dp_prefill=2.0, dp_decode=6.0))
        return r.ttft_s
    bw = float(system.levels[0].bw_per_device)
    g = float(jax.grad(f)(bw))
    fd = (float(f(bw * (1 + 1e-4))) - float(f(bw * (1 - 1e-4)))) / (2e-4 * bw)
    assert g == pytest.approx(fd, rel=1e-5) and g < 0


def test_float32(float32):
    r = srv.continuous_batching_from_costs(table(), ISL, OSL, 5.0, Opts(max_batch=256.0))
    assert r.ttft_s.dtype == jnp.float32
    assert float(r.tpot_s) == pytest.approx(0.0142857142857, rel=1e-5)
    assert float(r.ttft_s) == pytest.approx(0.0623511904762, rel=1e-5)
    bad = srv.continuous_batching_from_costs(table(), ISL, OSL, 20.0, Opts(max_batch=256.0))
    assert not bool(bad.feasible) and math.isinf(float(bad.ttft_s))


# ---- the cost table from jm.inference (compiles the inference model) ----------------------
@pytest.fixture(scope="module")
def small():
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("llama3.2-1b")
    return system, model, jm.Parallelism(dp=2, tp=2)


@pytest.mark.slow
def test_costs_are_the_inference_model(small):
    system, model, par = small
    c = jm.serving_costs(system, model, par, 512, 128, runtime="trtllm")
    assert c.step_s.shape == (len(srv.TOKEN_GRID),) and bool(c.feasible)
    # the grid point N is jm.inference at batch N·dp (its decode step and its prefill)
    n = 16.0
    ref = jm.inference(system, model, par, n * 2, 512, 128, runtime="trtllm")
    i = srv.TOKEN_GRID.index(n)
    assert float(c.step_s[i]) == pytest.approx(float(ref.tpot_s), rel=1e-6)
    one = jm.inference(system, model, par, 2, 512, 128, runtime="trtllm")
    # less the static session's per-request engine set-up, L layers × its per-layer host time
    setup = model.n_layers * float(jm.runtime_of("trtllm").context_layer_overhead_s)
    assert setup > 0
    assert float(c.prefill_s) == pytest.approx(float(one.ttft_s) - setup, rel=1e-6)
    assert float(c.weights_bytes) == pytest.approx(float(one.breakdown["memory.weights"]))
    assert np.all(np.diff(np.asarray(c.step_s)) > 0)


@pytest.mark.slow
def test_public_functions_end_to_end(small):
    system, model, par = small
    r = jm.continuous_batching(system, model, par, 512, 128, rate=jnp.asarray([5.0, 1e5]),
                               chunk=256, runtime="trtllm")
    assert bool(r.feasible[0]) and not bool(r.feasible[1])
    assert reason_name(r.reason[1]) == "rate_above_capacity"
    c = jm.serving_costs(system, model, par, 512, 128, runtime="trtllm")
    direct = srv.continuous_batching_from_costs(c, 512.0, 128.0, 5.0,
                                                Opts(max_batch=256.0, chunk=256.0), dp=2.0,
                                                n_gpus=4.0)
    assert float(r.tpot_s[0]) == pytest.approx(float(direct.tpot_s), rel=1e-6)
    d = jm.disaggregated(system, model, jm.Parallelism(dp=1, tp=2), jm.Parallelism(dp=1, tp=2),
                         512, 128, rate=5.0, runtime="trtllm")
    assert bool(d.feasible) and float(d.ttft_s) > float(c.prefill_s)


# ---- the serve-search command: argument errors without a traceback ------------------------
@pytest.mark.parametrize("argv, msg", [
    (["--isl", "0"], "--isl"), (["--tpot-slo", "-1"], "--tpot-slo"),
    (["--device", "a100_80gb"], "--system"), (["--precision", "fp7"], "fp7")])
def test_serve_search_cli_errors(argv, msg, capsys):
    from jaxmodel import cli
    assert cli.main(["serve-search", "--system", "hgx_a100_4gpu", "--quiet"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxmodel: error:") and msg in err and "Traceback" not in err


def test_serve_search_help_ends_with_an_example():
    from jaxmodel import cli
    text = cli.parser()._subparsers._group_actions[0].choices["serve-search"].format_help()
    assert text.rstrip().endswith(cli.EXAMPLES["serve-search"])


@pytest.mark.slow
def test_serve_search_help_example_runs(capsys):
    import io

    import pandas as pd

    from jaxmodel import cli
    assert cli.main(cli.EXAMPLES["serve-search"].split()[1:]) == 0
    df = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(df) >= 1 and df["meets_slo"].all()
    assert (df["ttft_s"] <= 1.0).all() and (df["tpot_s"] <= 0.05).all()
    assert set(df["runtime"]) <= {"trtllm", "vllm"}


def test_serving_plot_draws_one_front_per_mode(tmp_path):
    import pandas as pd

    from jaxmodel.plots import serving_plot
    df = pd.DataFrame({"mode": ["aggregated"] * 3 + ["disaggregated"] * 3,
                       "tokens_per_s_per_user": [10.0, 50.0, 20.0, 80.0, 30.0, 5.0],
                       "throughput_per_gpu": [900.0, 300.0, 400.0, 200.0, 700.0, np.inf],
                       "meets_slo": [True, True, False, True, True, True]})
    fig = serving_plot(df, path=tmp_path / "front.png")
    assert (tmp_path / "front.png").stat().st_size > 0
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["aggregated: 2 meet the limits, front of 2",
                      "disaggregated: 2 meet the limits, front of 2"]


# ---- offline (all requests queued) and SLO-bounded throughput ------------------------------
def test_offline_hand_derived():
    c = table()                      # T(m) = 0.01 + 1e-4·m; δ = 0.05/1000 − 5e-5 = 0
    # KV capacity 498 (test_kv_capacity_hand_derived, the whole prompt's working set);
    # batch cap 200 < 498: m = 200·1100/100 = 2200 tokens, T = 0.23 s, requests/s
    # 2200/(1100·0.23), output tokens/s per GPU ·100/4
    r = srv.offline_from_costs(c, ISL, OSL, Opts(max_batch=200.0, max_tokens=1e6), n_gpus=4.0)
    assert bool(r.feasible)
    assert float(r.tokens_per_iteration) == pytest.approx(2200.0)
    assert float(r.iteration_s) == pytest.approx(0.23)
    assert float(r.requests_per_s) == pytest.approx(2200.0 / (1100.0 * 0.23))
    assert float(r.throughput_per_gpu) == pytest.approx(2200.0 / (1100.0 * 0.23) * 100.0 / 4.0)
    assert float(r.batch) == pytest.approx(200.0)
    # the token budget binds: 1100 tokens per iteration, a decode batch of 100
    r = srv.offline_from_costs(c, ISL, OSL, Opts(max_batch=200.0, max_tokens=1100.0))
    assert float(r.batch) == pytest.approx(100.0)
    assert float(r.iteration_s) == pytest.approx(0.01 + 0.11)
    # KV bound: 498 requests (max_tokens above the prompt: its whole working set)
    r = srv.offline_from_costs(c, ISL, OSL, Opts(max_batch=4096.0, max_tokens=1e6))
    assert float(r.batch) == pytest.approx(498.0)
    # TensorRT-LLM's pool: 0.9 of (80e9 − 16e9 − 1e9) = 56.7e9 B, blocks of 32 tokens
    # (3.2e6 B): 17718 blocks; a request 35 blocks → 506 requests
    r = srv.offline_from_costs(c, ISL, OSL, Opts(max_batch=4096.0, max_tokens=1e6,
                                                 block_tokens=32.0, kv_of_free=1.0))
    assert float(r.kv_capacity_seqs) == 506.0


def test_offline_infeasible_finite_gradients_and_vmap():
    def tput(w):
        return srv.offline_from_costs(table(weights=w), ISL, OSL, Opts(
            max_batch=256.0, max_tokens=8192.0)).throughput_per_gpu
    r = srv.offline_from_costs(table(weights=90e9), ISL, OSL,
                               Opts(max_batch=256.0, max_tokens=8192.0))
    assert not bool(r.feasible) and reason_name(r.reason) == "out_of_memory"
    assert float(r.throughput_per_gpu) == 0.0 and math.isinf(float(r.iteration_s))
    g = jax.grad(tput)(90e9)
    assert np.isfinite(float(g))
    # gradient in the step time (a slower iteration: fewer tokens/s), against a difference
    f = lambda a: srv.offline_from_costs(table(a=a), ISL, OSL, Opts(  # noqa: E731
        max_batch=200.0, max_tokens=1e6)).throughput_per_gpu
    g = float(jax.grad(f)(0.01))
    fd = (float(f(0.0101)) - float(f(0.0099))) / 2e-4
    assert g < 0 and g == pytest.approx(fd, rel=1e-3)
    mbs = jnp.asarray([50.0, 200.0, 400.0])
    v = jax.vmap(lambda m: srv.offline_from_costs(table(), ISL, OSL, Opts(
        max_batch=m, max_tokens=1e6)).throughput_per_gpu)(mbs)
    loop = [float(srv.offline_from_costs(table(), ISL, OSL, Opts(
        max_batch=m, max_tokens=1e6)).throughput_per_gpu) for m in mbs]
    assert np.allclose(np.asarray(v), loop, rtol=1e-6)


def test_wait_quantile_is_mm1_exact():
    # M/M/1, λ = 8, μ = 10: W̄ = ρ/(μ − λ) = 0.4 s, P(W > t) = ρ·exp(−(μ − λ)t)
    q = float(srv.wait_quantile(0.4, 0.8))
    assert q == pytest.approx(math.log(0.8 / 0.01) / 2.0)
    assert 0.8 * math.exp(-2.0 * q) == pytest.approx(0.01)
    assert float(srv.wait_quantile(0.001, 0.005)) == 0.0       # 99 % find the server idle
    assert math.isinf(float(srv.wait_quantile(float("inf"), 1.2)))
    assert np.isfinite(float(jax.grad(lambda w: srv.wait_quantile(w, 1.2))(float("inf"))))


@pytest.mark.parametrize("chunk", [0.0, 250.0])
def test_slo_throughput_is_the_highest_rate_meeting_the_tails(chunk):
    c = table()
    kw = dict(dp=2.0, n_gpus=4.0)
    r = srv.slo_throughput_from_costs(c, ISL, OSL, Opts(max_batch=256.0, chunk=chunk,
                                                        ttft_p99_s=0.5, tpot_p99_s=0.03), **kw)
    assert bool(r.feasible) and bool(r.meets_slo)
    assert float(r.ttft_p99_s) <= 0.5 and float(r.tpot_p99_s) <= 0.03
    assert float(r.ttft_p99_s) >= float(r.ttft_s) and float(r.tpot_p99_s) >= float(r.tpot_s)
    rate = float(r.throughput_per_gpu) * 4.0 / OSL
    above = srv.continuous_batching_from_costs(c, ISL, OSL, rate * 1.01,
                                               Opts(max_batch=256.0, chunk=chunk), **kw)
    assert (not bool(above.feasible) or float(above.ttft_p99_s) > 0.5
            or float(above.tpot_p99_s) > 0.03)
    none = srv.slo_throughput_from_costs(c, ISL, OSL, Opts(max_batch=256.0, chunk=chunk,
                                                           ttft_p99_s=1e-3, tpot_p99_s=0.03),
                                         **kw)
    assert not bool(none.feasible) and reason_name(none.reason) == "slo_unmet"
    assert float(none.throughput_per_gpu) == 0.0


def test_scheduler_defaults_of_the_runtimes():
    from jaxmodel.serving_runtime import scheduler_defaults
    assert scheduler_defaults("trtllm_v1")["max_tokens"] == 32768.0
    assert scheduler_defaults("trtllm_v1")["kv_of_free"] == 1.0
    assert scheduler_defaults("vllm_v1")["max_batch"] == 1024.0
    assert scheduler_defaults("pytorch") == scheduler_defaults("default")
    with pytest.raises(ValueError, match="max_batch"):
        srv._scheduler_args("trtllm_v1", max_batch=0.0)
    with pytest.raises(ValueError, match="ttft_p99_s"):
        jm.slo_throughput(None, None, None, 1, 1, ttft_p99_s=0.0, tpot_p99_s=1.0)


@pytest.mark.slow
def test_offline_and_slo_public_functions(small):
    system, model, par = small
    r = jm.offline_throughput(system, model, par, jnp.asarray([512.0, 128.0]), 128.0,
                              runtime="trtllm_v1")
    assert r.throughput_per_gpu.shape == (2,) and bool(np.all(r.feasible))
    c = jm.serving_costs(system, model, par, 512, 128, runtime="trtllm_v1")
    direct = srv.offline_from_costs(c, 512.0, 128.0, Opts(
        max_batch=4096.0, max_tokens=32768.0, block_tokens=32.0, kv_of_free=1.0), dp=2.0,
        n_gpus=4.0)
    assert float(r.throughput_per_gpu[0]) == pytest.approx(float(direct.throughput_per_gpu),
                                                           rel=1e-5)
    s = jm.slo_throughput(system, model, par, 512, 128, ttft_p99_s=0.5, tpot_p99_s=0.05,
                          runtime="vllm_v1")
    assert bool(s.feasible) and float(s.tpot_p99_s) <= 0.05


@pytest.mark.parametrize("argv, msg", [
    (["slo"], "--ttft-p99"), (["offline", "--ttft-p99", "1"], "slo"),
    (["offline", "--isl", "0"], "--isl"), (["slo", "--max-tokens", "8", "--ttft-p99", "1",
                                             "--tpot-p99", "1"], "offline")])
def test_serve_cli_errors(argv, msg, capsys):
    from jaxmodel import cli
    assert cli.main(["serve"] + argv + ["--system", "hgx_a100_4gpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxmodel: error:") and msg in err and "Traceback" not in err


def test_options_object_batches_like_the_loop():
    """The scheduler settings travel as one pytree (``Opts``, :class:`srv.ServingOptions`): a
    vmap over its leaves (batch caps, chunks, the mean limits) equals the loop, and the
    older names of the bodies are the same functions."""
    c = table()
    kw = dict(dp=2.0, pp=1.0, n_gpus=2.0)
    opts = Opts(max_batch=jnp.asarray([4.0, 64.0, 256.0]),
                chunk=jnp.asarray([0.0, 512.0, 256.0]), block_tokens=32.0,
                mem_fraction=0.85, ttft_slo_s=jnp.asarray([0.1, 0.2, 1.0]), tpot_slo_s=0.02)
    axes = Opts(max_batch=0, chunk=0, block_tokens=None, mem_fraction=None, kv_of_free=None,
                max_tokens=None, ttft_slo_s=0, tpot_slo_s=None, ttft_p99_s=None,
                tpot_p99_s=None)
    batch = jax.vmap(lambda o: srv.continuous_batching_from_costs(c, ISL, OSL, 8.0, o, **kw),
                     in_axes=(axes,))(opts)
    for i in range(3):
        one = srv.continuous_batching_from_costs(c, ISL, OSL, 8.0, Opts(
            max_batch=float(opts.max_batch[i]), chunk=float(opts.chunk[i]), block_tokens=32.0,
            mem_fraction=0.85, ttft_slo_s=float(opts.ttft_slo_s[i]), tpot_slo_s=0.02), **kw)
        for name in ("ttft_s", "tpot_s", "batch", "meets_slo", "feasible", "reason"):
            np.testing.assert_allclose(np.asarray(getattr(batch, name))[i],
                                       np.asarray(getattr(one, name)), rtol=1e-12)
    assert srv.steady_state is srv.continuous_batching_from_costs
    assert srv.offline_state is srv.offline_from_costs
    assert srv.slo_state is srv.slo_throughput_from_costs
    assert srv.disaggregated_state is srv.disaggregated_from_costs


def test_search_offline_column_is_offline_from_costs_per_table():
    """search_serving's ``offline_throughput_per_gpu``: every cost table under its runtime's
    scheduler defaults, vmapped over the tables with the settings as one options pytree,
    equals offline_from_costs called per table."""
    from jaxmodel.search import serving as search_srv
    from jaxmodel.serving_runtime import runtime, scheduler_defaults
    c = table()
    tables = jax.tree_util.tree_map(lambda x: jnp.stack([x, x, x]), c)
    par = jm.Parallelism(dp=jnp.asarray([1.0, 2.0, 4.0]), tp=jnp.asarray([4.0, 2.0, 1.0]),
                         pp=jnp.asarray([1.0, 1.0, 1.0]))
    rts = [runtime(r) for r in ("trtllm", "vllm", "pytorch")]
    got = search_srv._offline_per_table(tables, par, rts, ISL, OSL)
    for k, r in enumerate(rts):
        s = scheduler_defaults(r.name)
        d, t = float(par.dp[k]), float(par.tp[k])
        want = srv.offline_from_costs(c, ISL, OSL, Opts(**{
            n: s[n] for n in ("max_batch", "max_tokens", "block_tokens", "mem_fraction",
                              "kv_of_free")}), dp=d, n_gpus=d * t)
        assert float(got[k]) == pytest.approx(float(want.throughput_per_gpu), rel=1e-12)
