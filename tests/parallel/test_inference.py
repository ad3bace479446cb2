"""Inference: TTFT / TPOT assembly from the layer model, memory, feasibility, no NaN.

GEMMs are timed by the roofline + per-kernel overhead through the public ``gemm`` hook in the
structural tests (fast compiles); one slow test runs the default tile search end to end.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.batching import is_static
from jaxmodel.numerics import reason_code
from jaxmodel.parallel.inference_step import InferenceResult, inference
from testkit import roofline_gemm, small_model

SYSTEM = hw_db.system("hgx_a100_4gpu")


def model(**kw):
    return small_model(dict(n_layers=8, d_model=2048, n_heads=16, n_kv_heads=4, head_dim=128,
                            d_ff=5632, vocab_size=32000, activation="swiglu"), **kw)


M = model()
TP4 = jm.Parallelism(tp=4)


@pytest.fixture(scope="module")
def result():
    return inference(SYSTEM, M, TP4, 8, 512, 64, gemm=roofline_gemm)


def test_result_is_assembled_from_the_layer_model_memory_and_oom(result):
    r = result
    assert isinstance(r, InferenceResult) and bool(r.feasible) and int(r.reason) == 0
    pre = jm.layer_breakdown(SYSTEM, M, TP4, 8, 512, gemm=roofline_gemm)
    b = r.breakdown
    for op in jm.LAYER_OPS:
        assert float(b[f"prefill.{op}"]) == pytest.approx(float(pre[op]), rel=1e-9), op
    assert float(b["prefill_layers"]) == pytest.approx(8 * float(pre["total"]), rel=1e-9)
    ttft = (b["prefill_layers"] + b["pp_comm_prefill"] + b["embedding_prefill"]
            + b["head_prefill"])
    assert float(r.ttft_s) == pytest.approx(float(ttft), rel=1e-12)
    assert float(b["pp_comm_prefill"]) == 0.0                  # pp = 1
    tpot = b["decode_layers"] + b["pp_comm_decode"] + b["embedding_decode"] + b["head_decode"]
    assert float(r.tpot_s) == pytest.approx(float(tpot), rel=1e-12)
    assert float(r.total_s) == pytest.approx(float(r.ttft_s + 63 * r.tpot_s), rel=1e-12)
    assert float(r.tokens_per_s) == pytest.approx(8 * 64 / float(r.total_s), rel=1e-12)
    # decode average lies between the first and the last decode step
    ends = jm.layer_breakdown(SYSTEM, M, TP4, 8, 1, phase="decode",
                              kv_len=jnp.array([512.0, 512.0 + 62]), gemm=roofline_gemm)
    first, last = np.asarray(ends["total"])
    per_layer = float(b["decode_layers"]) / 8
    assert first * (1 - 1e-9) <= per_layer <= last * (1 + 1e-9) and first < last
    # decode is much cheaper than prefill per token, but not per step
    assert float(r.tpot_s) < float(r.ttft_s)

    # memory: weights + KV cache + working set
    mem = jm.inference_memory(M, TP4, 8, 512, 64)
    assert float(r.memory_bytes) == pytest.approx(float(mem["total"]), rel=1e-12)
    assert float(b["memory.kv_cache"]) == pytest.approx(
        float(jm.kv_cache_bytes(M, TP4, 8, 576)), rel=1e-12)

    # out of memory is not an error. GPT-3 175B dimensions: the same pytree structure as M,
    # so this reuses the compilation above (kept in this test for pytest-xdist's sake)
    gpt3 = model(n_layers=96, d_model=12288, n_heads=96, n_kv_heads=96, head_dim=128,
                 d_ff=49152, vocab_size=50257, activation="gelu")
    r = inference(SYSTEM, gpt3, TP4, 8, 512, 64, gemm=roofline_gemm)
    assert not bool(r.feasible) and r.reason_name == "out_of_memory"
    assert float(r.memory_bytes) > 80e9
    assert np.isinf(float(r.ttft_s)) and float(r.tokens_per_s) == 0.0


def test_inconsistent_single_plans_raise():
    with pytest.raises(ValueError, match="devices_mismatch"):
        inference(SYSTEM, M, jm.Parallelism(tp=2), 8, 512, 64, gemm=roofline_gemm)
    with pytest.raises(ValueError, match="heads_not_divisible"):
        inference(SYSTEM, model(n_heads=6, n_kv_heads=6), TP4, 8, 512, 64, gemm=roofline_gemm)
    with pytest.raises(ValueError, match="layers_not_divisible"):
        inference(SYSTEM, model(n_layers=1), jm.Parallelism(tp=2, pp=2), 8, 512, 64,
                  gemm=roofline_gemm)
    with pytest.raises(ValueError, match="batch_not_divisible"):
        inference(SYSTEM, M, jm.Parallelism(tp=2, dp=2), 7, 512, 64, gemm=roofline_gemm)
    with pytest.raises(ValueError, match="invalid_workload"):
        inference(SYSTEM, M, TP4, 8, 512, 0, gemm=roofline_gemm)


PAR5 = jm.Parallelism(tp=jnp.array([4.0, 3.0, 4.0, 2.0, 4.0]),
                      dp=jnp.array([1.0, 1.0, 2.0, 1.0, 1.0]),
                      pp=jnp.array([1.0, 1.0, 1.0, 2.0, 1.0]))
CAP5 = jnp.array([80e9, 80e9, 80e9, 80e9, 1e8])          # the last device is too small


def _batch_system(bw=2.0e12):
    return dataclasses.replace(SYSTEM, device=dataclasses.replace(
        SYSTEM.device, mem_capacity=CAP5, mem_bw=bw))


@pytest.mark.slow
def test_batch_flags_infeasible_entries_without_nan():
    """tp = 4 ok; tp = 3 (3 ≠ 4 devices: the device rule comes before the heads rule);
    dp·tp·pp = 8 on 4 devices; tp = pp = 2 ok; out of memory."""
    r = inference(_batch_system(), M, PAR5, 8, 512, 64, gemm=roofline_gemm)
    assert r.feasible.tolist() == [True, False, False, True, False]
    assert [int(x) for x in r.reason] == [0, reason_code("devices_mismatch"),
                                          reason_code("devices_mismatch"), 0,
                                          reason_code("out_of_memory")]
    for leaf in jax.tree_util.tree_leaves(r):
        assert not np.isnan(np.asarray(leaf, dtype=float)).any()
    tot = np.asarray(r.total_s)
    assert np.isinf(tot[[1, 2, 4]]).all() and np.isfinite(tot[[0, 3]]).all()
    assert (np.asarray(r.tokens_per_s)[[1, 2, 4]] == 0).all()
    # the pipelined plan pays stage hops, the TP-only plan does not
    assert float(r.breakdown["pp_comm_prefill"][3]) > 0
    assert float(r.breakdown["pp_comm_prefill"][0]) == 0


@pytest.mark.slow
def test_gradient_is_finite_through_infeasible_entries():
    def f(bw):
        r = inference(_batch_system(bw), M, PAR5, 8, 512, 64, gemm=roofline_gemm)
        return jnp.sum(jnp.where(r.feasible, r.total_s, 0.0))

    g = jax.grad(f)(2.0e12)
    assert np.isfinite(float(g)) and float(g) < 0


@pytest.mark.slow
def test_default_tile_search_end_to_end():
    r = inference(SYSTEM, hw_db.model("llama2-13b"), TP4, 8, 2048, 256)
    assert bool(r.feasible)
    pre = jm.layer_breakdown(SYSTEM, hw_db.model("llama2-13b"), TP4, 8, 2048)
    assert float(r.breakdown["prefill_layers"]) == pytest.approx(40 * float(pre["total"]),
                                                                 rel=1e-6)
    assert 0 < float(r.tpot_s) < float(r.ttft_s) < 10.0


def test_pytorch_runtime_is_the_default(result):
    """``runtime="pytorch"`` (eager, LLMCompass) is the call without a runtime, bit for bit,
    and adds no step overhead."""
    r = inference(SYSTEM, M, TP4, 8, 512, 64, gemm=roofline_gemm, runtime="pytorch")
    for f in ("ttft_s", "tpot_s", "total_s", "tokens_per_s", "memory_bytes"):
        assert float(getattr(r, f)) == float(getattr(result, f)), f
    assert float(r.breakdown["step_overhead"]) == 0.0
    with pytest.raises(ValueError, match="not one of"):
        inference(SYSTEM, M, TP4, 8, 512, 64, gemm=roofline_gemm, runtime="tensorflow")


PP2 = jm.Parallelism(tp=2, pp=2)


@pytest.mark.slow
def test_micro_batched_pipeline_matches_hand_derivation():
    """``micro_batches = m``: every time at ``b/m`` sequences; ttft = F + (m − 1)·S and
    tpot = max(F, m·S) with F one micro-batch's pass through both stages and S its slot on the
    busiest stage; KV cache of all sequences, working set of one micro-batch."""
    whole = inference(SYSTEM, M, PP2, 8, 512, 64, gemm=roofline_gemm)
    one = inference(SYSTEM, M, PP2, 8, 512, 64, gemm=roofline_gemm, micro_batches=1)
    for f in ("ttft_s", "tpot_s", "total_s", "tokens_per_s", "memory_bytes"):
        assert float(getattr(one, f)) == float(getattr(whole, f)), f
    ms = jnp.array([2.0, 4.0, 8.0, 16.0])                       # 16 is clipped to 8
    r = inference(SYSTEM, M, PP2, 8, 512, 64, gemm=roofline_gemm, micro_batches=ms)
    small = inference(SYSTEM, M, PP2, jnp.array([4.0, 2.0, 1.0, 1.0]), 512, 64,
                      gemm=roofline_gemm)
    b = small.breakdown
    for ph, name in (("prefill", "ttft_s"), ("decode", "tpot_s")):
        F = np.asarray(getattr(small, name))
        S = (np.asarray(b[f"{ph}_layers"]) / 2
             + np.maximum(np.asarray(b[f"embedding_{ph}"]) + np.asarray(b[f"pp_comm_{ph}"]),
                          np.asarray(b[f"head_{ph}"])))     # pp − 1 = 1 hop
        m = np.array([2.0, 4.0, 8.0, 8.0])
        want = F + (m - 1) * S if ph == "prefill" else np.maximum(F, m * S)
        np.testing.assert_allclose(np.asarray(getattr(r, name)), want, rtol=1e-6)
    assert (np.asarray(r.tpot_s)[2:] > np.asarray(small.tpot_s)[2:]).all()   # m > pp: m·S
    np.testing.assert_allclose(np.asarray(r.tokens_per_s),
                               8 * 64 / np.asarray(r.total_s), rtol=1e-6)
    # pipelining pays: the first micro-batch's token comes sooner and more tokens per second
    assert float(r.ttft_s[0]) < float(whole.ttft_s)
    assert float(r.tokens_per_s[0]) > float(whole.tokens_per_s)
    mem_w = jm.inference_memory(M, PP2, 8, 512, 64)
    np.testing.assert_allclose(np.asarray(r.breakdown["memory.kv_cache"]),
                               float(mem_w["kv_cache"]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(r.breakdown["memory.activations"]),
                               float(mem_w["activations"]) / np.array([2, 4, 8, 8]),
                               rtol=1e-6)
    # one device, no pipeline: the micro-batches run one after the other
    r1 = inference(SYSTEM, M, TP4, 8, 512, 64, gemm=roofline_gemm, micro_batches=2)
    h = inference(SYSTEM, M, TP4, 4, 512, 64, gemm=roofline_gemm)
    assert float(r1.tpot_s) == pytest.approx(2 * float(h.tpot_s), rel=1e-6)
    assert float(r1.ttft_s) == pytest.approx(2 * float(h.ttft_s), rel=1e-6)
    with pytest.raises(ValueError, match="micro_batches"):
        inference(SYSTEM, M, PP2, 8, 512, 64, gemm=roofline_gemm, micro_batches=0.5)


def test_micro_batches_jit_matches_eager_and_vmap_matches_loop():
    f = jax.jit(lambda m: inference(SYSTEM, M, PP2, 8, 512, 64, gemm=roofline_gemm,
                                    micro_batches=m).tokens_per_s)
    ms = jnp.array([1.0, 2.0, 4.0])
    batched = np.asarray(f(ms))
    loop = [float(inference(SYSTEM, M, PP2, 8, 512, 64, gemm=roofline_gemm,
                            micro_batches=float(m)).tokens_per_s) for m in ms]
    np.testing.assert_allclose(batched, loop, rtol=1e-6)
    assert not np.isnan(batched).any()


def test_inference_statics_are_static_and_single_rejects_unknown_keywords():
    # the statics carry no numeric leaf (kv_samples stays a Python int in a batched call);
    # every option is a leaf
    leaves = jax.tree_util.tree_leaves(jm.InferenceStatics(gemm=roofline_gemm, kv_samples=5))
    assert all(is_static(x) for x in leaves) and 5 not in leaves
    assert len(jax.tree_util.tree_leaves(jm.InferenceOptions(8, 512, 64))) == 4
    with pytest.raises(TypeError, match="kv_sample"):
        jm.inference.single(SYSTEM, M, TP4, 8, 512, 64, kv_sample=4)


@pytest.mark.slow
def test_make_inference_step_is_what_inference_batches(result):
    statics = jm.InferenceStatics(gemm=roofline_gemm,
                                  variant=jm.workload.layer.variant_of(M, TP4, SYSTEM))
    step = jm.make_inference_step(SYSTEM, M, TP4, statics=statics)
    one = jax.jit(step)(jm.InferenceOptions(8, 512, 64))
    for f in ("ttft_s", "tpot_s", "total_s", "tokens_per_s", "memory_bytes", "feasible"):
        np.testing.assert_allclose(getattr(one, f), getattr(result, f), rtol=1e-6, err_msg=f)
    # (a traced precision adds a zero "quantize" row to the batched call's breakdown)
    for k in one.breakdown:
        np.testing.assert_allclose(one.breakdown[k], result.breakdown[k], rtol=1e-6, err_msg=k)
    # vmap over the options equals a loop over single configurations
    opts = jm.InferenceOptions(jnp.array([8.0, 16.0]), 512.0, jnp.array([64.0, 32.0]))
    many = jax.vmap(step)(jm.InferenceOptions(*(jnp.broadcast_to(x, (2,)) for x in (
        opts.batch, opts.prompt_len, opts.gen_len, opts.micro_batches))))
    loop = [float(inference(SYSTEM, M, TP4, b, 512, g, gemm=roofline_gemm).tpot_s)
            for b, g in ((8, 64), (16, 32))]
    np.testing.assert_allclose(np.asarray(many.tpot_s), loop, rtol=1e-6)
