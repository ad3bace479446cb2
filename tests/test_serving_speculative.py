"""Speculative decoding (jaxmodel.speculative): Leviathan et al. 2023 eq. 1 against hand
values, argument errors, and the serving iteration model with drafts on a synthetic cost
table against hand-derived values (no inference graph is compiled in the fast tests)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import serving as srv
from jaxmodel.serving import ServingOptions as Opts
from jaxmodel import speculative as spec

from tests.test_serving import ISL, OSL, table


def test_expected_tokens_hand_values():
    # (1 − 0.8⁴)/(1 − 0.8) = 0.5904/0.2 = 2.952; α = 0.85, k = 1 (DeepSeek-V3 §5.4.3): 1.85
    assert float(jm.expected_tokens(0.8, 3.0)) == pytest.approx(2.952, rel=1e-12)
    assert float(jm.expected_tokens(0.85, 1.0)) == pytest.approx(1.85, rel=1e-12)
    assert float(jm.expected_tokens(0.0, 4.0)) == pytest.approx(1.0)
    assert float(jm.expected_tokens(1.0, 4.0)) == pytest.approx(5.0)
    assert float(jm.expected_tokens(0.7, 0.0)) == pytest.approx(1.0)
    # "none" drafts nothing whatever k says
    assert float(spec.tokens_per_step(jm.Speculative("none", k=4, accept=0.9))) == 1.0
    # batched acceptance rates; d/dα at α = 0.5, k = 2 is 1 + 2α = 2; finite at α = 1
    e = jm.expected_tokens(jnp.asarray([0.0, 0.5, 1.0]), 2.0)
    assert np.allclose(e, [1.0, 1.75, 3.0])
    g = jax.grad(lambda a: jnp.sum(jm.expected_tokens(a, 2.0)))(jnp.asarray([0.5, 1.0]))
    assert float(g[0]) == pytest.approx(2.0, rel=1e-6) and np.isfinite(float(g[1]))


@pytest.mark.parametrize("kw,msg", [
    (dict(method="medusa"), "method"),
    (dict(k=-1.0), "k="),
    (dict(k=2.5), "k="),
    (dict(accept=1.2), "accept="),
    (dict(method="draft_model"), "draft"),
])
def test_bad_arguments_name_the_field(kw, msg):
    with pytest.raises(ValueError, match=msg):
        spec.validate_speculative(jm.Speculative(**kw))


def spec_table(k=3.0, e=2.5, **kw):
    """The synthetic table of tests/test_serving.py with drafts: the prompt attention per
    slot of 1 + k tokens equals a decode slot's, so the chunk correction δ is 0."""
    return dataclasses.replace(table(pre_attn=0.05 / (1.0 + k), **kw), spec_k=jnp.asarray(k),
                               spec_tokens=jnp.asarray(e))


def test_without_drafts_the_table_gives_the_plain_offline_value():
    # k = 0, E = 1: test_serving.py's test_offline_hand_derived, 2200/(1100·0.23) requests/s
    none = srv.offline_from_costs(spec_table(0.0, 1.0), ISL, OSL,
                                  Opts(max_batch=200.0, max_tokens=1e6))
    assert float(none.requests_per_s) == pytest.approx(2200.0 / (1100.0 * 0.23))


def test_offline_with_drafts_hand_derived():
    # k = 3, E = 2.5: a request is isl/4 = 250 prompt slots and osl/E = 40 iterations;
    # a KV peak of 1103 tokens is still 69 blocks (498 requests); batch cap 200:
    # m = 200·290/40 = 1450 slots, T = 0.01 + 0.145 = 0.155 s, requests/s 1450/(290·0.155)
    r = srv.offline_from_costs(spec_table(), ISL, OSL, Opts(max_batch=200.0, max_tokens=1e6),
                               n_gpus=4.0)
    assert bool(r.feasible)
    assert float(r.tokens_per_iteration) == pytest.approx(1450.0)
    assert float(r.iteration_s) == pytest.approx(0.155)
    assert float(r.requests_per_s) == pytest.approx(1450.0 / (290.0 * 0.155))
    assert float(r.throughput_per_gpu) == pytest.approx(1450.0 / (290.0 * 0.155) * 25.0)
    assert float(r.batch) == pytest.approx(200.0)
    assert float(r.tpot_s) == pytest.approx(0.155 / 2.5)
    # the token budget counts 1 + k tokens per slot: 4400 tokens = 1100 slots
    r = srv.offline_from_costs(spec_table(), ISL, OSL, Opts(max_batch=200.0, max_tokens=4400.0))
    assert float(r.tokens_per_iteration) == pytest.approx(1100.0)
    # the k draft positions enter the KV peak: 1000 + 100 + 8 = 1108 tokens = 70 blocks
    r = srv.offline_from_costs(spec_table(k=8.0), ISL, OSL, Opts(max_batch=4096.0, max_tokens=1e6))
    assert float(r.kv_capacity_seqs) == float(np.floor(34375 / 70))


def test_continuous_batching_with_drafts_hand_derived():
    # λ = 5/s, ρ = 0.25; iterations per request osl/E = 40: r = 5·40/0.75 = 266.67/s;
    # B = r·a/(1 − r·k) = 2.6667/0.973333 = 2.739726; T = 0.010273973 s; TPOT = T/(0.75·2.5)
    r = srv.continuous_batching_from_costs(spec_table(), ISL, OSL, 5.0, Opts(max_batch=256.0))
    assert bool(r.feasible)
    assert float(r.batch) == pytest.approx(2.739726027, rel=1e-8)
    assert float(r.iteration_s) == pytest.approx(0.01 + 1e-4 * 2.739726027, rel=1e-8)
    assert float(r.tpot_s) == pytest.approx((0.01 + 1e-4 * 2.739726027) / 1.875, rel=1e-8)
    # Little's law in sequences: B = λ·osl·TPOT
    assert float(r.batch) == pytest.approx(5.0 * OSL * float(r.tpot_s), rel=1e-9)
    assert float(r.throughput_per_gpu) == pytest.approx(500.0)
    # chunked: Little's law holds too
    rc = srv.continuous_batching_from_costs(spec_table(), ISL, OSL, 5.0,
                                            Opts(max_batch=256.0, chunk=512.0))
    assert bool(rc.feasible)
    assert float(rc.batch) == pytest.approx(5.0 * OSL * float(rc.tpot_s), rel=1e-9)


@pytest.mark.slow
def test_inference_with_mtp_and_draft_model():
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("llama3.2-1b")
    par = jm.Parallelism(dp=4)
    base = jm.inference(system, model, par, 8, 512, 128, runtime="trtllm")
    none = jm.inference(system, model, par, 8, 512, 128, runtime="trtllm",
                        speculative=jm.Speculative("none", k=0, accept=0.0))
    assert float(none.tpot_s) == pytest.approx(float(base.tpot_s), rel=1e-9)
    assert float(none.ttft_s) == pytest.approx(float(base.ttft_s), rel=1e-9)
    s = jm.Speculative("eagle", k=3, accept=0.8)
    r = jm.inference(system, model, par, 8, 512, 128, runtime="trtllm", speculative=s)
    br = r.breakdown
    e = 2.952
    assert float(br["spec.tokens_per_step"]) == pytest.approx(e)
    assert float(r.tpot_s) == pytest.approx(float(br["spec.step"]) / e, rel=1e-9)
    # the step is a verification over 4 tokens plus 3 draft-head steps: dearer than a plain
    # step, cheaper than 4 of them (memory-bound decode at batch 2 per replica)
    assert float(base.tpot_s) < float(br["spec.step"]) < 4 * float(base.tpot_s)
    assert float(r.tpot_s) < float(base.tpot_s)
    assert float(r.ttft_s) > float(base.ttft_s)
    assert float(r.memory_bytes) > float(base.memory_bytes)
    d = jm.Speculative("draft_model", k=3, accept=0.8, draft=hw_db.model("gemma3-1b"))
    rd = jm.inference(system, model, par, 8, 512, 128, runtime="trtllm", speculative=d)
    assert bool(rd.feasible)
    assert float(rd.breakdown["spec.draft_step"]) > float(br["spec.draft_step"])


@pytest.mark.parametrize("argv, msg", [
    (["--draft-model", "llama3.2-1b"], "--draft-model"),
    (["--speculative", "draft_model"], "--draft-model"),
    (["--speculative", "mtp", "--accept", "1.5"], "accept="),
    (["--speculative", "eagle", "--draft-k", "-2"], "k=")])
def test_serve_cli_speculative_errors(argv, msg, capsys):
    from jaxmodel import cli
    assert cli.main(["serve", "offline", "--system", "hgx_a100_4gpu"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxmodel: error:") and msg in err and "Traceback" not in err
