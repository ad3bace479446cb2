"""Serving runtime profiles: presets, eager default unchanged, kernel floors, fusions, CUDA-graph
decode, GQA decode attention, step overhead, per-layer request set-up; vmap / jit / grad,
float32.

GEMMs are timed by the roofline + per-kernel overhead hook (fast compiles); the per-kernel
overhead it adds is the device field the runtime swaps.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import serving_runtime as rtp
from jaxmodel.ops.attention import (AttentionKernel, AttentionShape, flash_attention_latency,
                                    flash_attention_rows)
from jaxmodel.workload.layer import LayerOptions, Work, layer_times
from testkit import roofline_gemm, small_model

SYSTEM = hw_db.system("hgx_a100_4gpu")
DEV = SYSTEM.device


def model(**kw):
    return small_model(dict(n_layers=4, d_model=2048, n_heads=16, n_kv_heads=16, head_dim=128,
                            d_ff=8192, vocab_size=32000, activation="gelu"), **kw)


GPT = model()
LLAMA = model(n_kv_heads=4, d_ff=5632, activation="swiglu")
TP1 = jm.Parallelism(tp=1)


def layer(m, rt, phase="decode", s=1.0, kv=512.0, b=8.0, par=TP1):
    return layer_times(SYSTEM, m, par, Work(b, s, phase, kv), LayerOptions(roofline_gemm, runtime=rt))


def test_presets_and_names():
    assert rtp.runtime(None).name == "pytorch" and rtp.is_eager(rtp.runtime("pytorch"))
    trt = jm.runtime_of("TensorRT-LLM")
    assert trt.name == "trtllm" and float(trt.kernel_floor) == 1.0
    assert jm.runtime_of("fastertransformer").name == "trtllm_v06"
    assert float(jm.runtime_of("trtllm_v06").attention) == 2.0
    assert rtp.runtime_arg("pytorch") is None and rtp.runtime_arg("vllm") is not None
    with pytest.raises(ValueError, match="not one of"):
        jm.runtime_of("tgi")
    with pytest.raises(ValueError, match="unknown field"):
        jm.runtime_of("trtllm", graphs=1.0)
    with pytest.raises(ValueError, match="kernel_floor"):
        rtp.validate_runtime(jm.Runtime(kernel_floor=0.5))
    with pytest.raises(ValueError, match="context_layer_overhead_s"):
        rtp.validate_runtime(jm.Runtime(context_layer_overhead_s=-1e-6))
    # calibrated fields come from hw_db/tech/runtime.toml
    cal = rtp.calibration()["tensorrt_llm"]
    assert float(trt.context_layer_overhead_s) == cal["context_layer_overhead_s"] > 0.0
    assert float(trt.step_overhead_s) == cal["step_overhead_s"]
    assert jm.RUNTIMES["trtllm_v06"]["context_layer_overhead_s"] == cal["context_layer_overhead_s"]
    assert float(jm.runtime_of("vllm").context_layer_overhead_s) == 0.0
    leaves = jax.tree_util.tree_leaves(trt)
    assert len(leaves) == 11       # name is static metadata
    # today's runtimes: TensorRT-LLM v1.0 (PyTorch backend), vLLM V1, SGLang
    v1 = jm.runtime_of("trtllm_v1")
    assert v1.name == "trtllm_v1" and float(v1.kernel_floor) == 1.0
    assert float(v1.fuse_act) == 0.0 and float(v1.attention) == 1.0
    assert float(v1.chunked_attention) == 1.0            # MMHA on chunked layers (Hopper)
    assert all(float(jm.runtime_of(n).chunked_attention) == 0.0
               for n in ("trtllm", "vllm", "vllm_v1", "sglang", "pytorch"))
    with pytest.raises(ValueError, match="chunked_attention"):
        rtp.validate_runtime(jm.Runtime(chunked_attention=2.0))
    assert float(v1.step_overhead_s) == rtp.calibration()["tensorrt_llm_v1"]["step_overhead_s"]
    for name in ("vllm_v1", "sglang"):
        rt = rtp.validate_runtime(jm.runtime_of(name))
        assert float(rt.step_overhead_s) == float(v1.step_overhead_s)   # transferred
    assert jm.runtime_of("vLLM-V1").name == "vllm_v1"
    # the Llama-4 vision tower in float32 on every rank under TensorRT-LLM v1.0 only
    assert float(v1.encoder_bytes) == 4.0 and all(
        float(jm.runtime_of(n).encoder_bytes) == 0.0
        for n in ("trtllm", "vllm", "vllm_v1", "sglang", "pytorch"))
    with pytest.raises(ValueError, match="encoder_bytes"):
        rtp.validate_runtime(jm.Runtime(encoder_bytes=-1.0))


def test_calibration_file_needs_a_source_and_a_finite_value(tmp_path, monkeypatch):
    for body in ('[t]\nx = { value = 1e-6 }\n', '[t]\nx = { value = "a", source = "s" }\n',
                 '[t]\nx = { value = nan, source = "s" }\n'):
        bad = tmp_path / "runtime.toml"
        bad.write_text(body)
        monkeypatch.setattr(rtp, "CALIBRATION_FILE", bad)
        rtp.calibration.cache_clear()
        with pytest.raises(ValueError, match="t.x"):
            rtp.calibration()
    monkeypatch.undo()
    rtp.calibration.cache_clear()
    assert rtp.calibration()["tensorrt_llm"]["context_layer_overhead_s"] > 0.0


_SLOW = pytest.mark.slow       # the other two combinations: each model and phase still runs


@pytest.mark.parametrize("m,phase,s,kv", [
    pytest.param(GPT, "prefill", 256.0, 0.0, id="prefill-gpt"),
    pytest.param(LLAMA, "decode", 1.0, 700.0, id="decode-llama"),
    pytest.param(GPT, "decode", 1.0, 700.0, id="decode-gpt", marks=_SLOW),
    pytest.param(LLAMA, "prefill", 256.0, 0.0, id="prefill-llama", marks=_SLOW)])
def test_eager_runtime_branch_is_bit_identical_to_no_runtime(m, phase, s, kv):
    """The runtime branch evaluated with the eager (all-zero) profile as traced leaves gives
    exactly the results of the eager graph (``runtime=None``, the code path of "pytorch")."""
    ref = jax.jit(lambda: layer(m, None, phase, s, kv))()
    got = jax.jit(lambda rt: layer(m, rt, phase, s, kv))(jm.Runtime())
    for k in ref:
        assert float(got[k]) == float(ref[k]), k
    # and the public call with "pytorch" is the call without a runtime
    a = jm.layer_breakdown(SYSTEM, m, TP1, 8, s, phase, kv, gemm=roofline_gemm)
    b = jm.layer_breakdown(SYSTEM, m, TP1, 8, s, phase, kv, gemm=roofline_gemm,
                           runtime="pytorch")
    assert all(float(a[k]) == float(b[k]) for k in a)


def test_kernel_floors_remove_the_eager_overheads_hand_derived():
    """GELU MHA decode layer, t = 1: 8 GEMM kernels (Q, K, V, QKᵀ, AV, W_o, W1, W2), one
    softmax, two LayerNorms, one GELU; the floors replace each eager per-call overhead."""
    eager = layer(GPT, None)
    floor = layer(GPT, jm.Runtime(kernel_floor=1.0))
    d_gemm = float(DEV.matmul_overhead_s - DEV.matmul_kernel_overhead_s)
    d_ln = float(DEV.layernorm_overhead_s - DEV.rmsnorm_overhead_s)
    d_sm = float(DEV.softmax_overhead_s - DEV.rmsnorm_overhead_s)
    d_act = float(DEV.gelu_overhead_s - DEV.silu_mul_overhead_s)
    want = 8 * d_gemm + 2 * d_ln + d_sm + d_act
    assert want > 150e-6
    assert float(eager["total"] - floor["total"]) == pytest.approx(want, rel=1e-9)
    assert float(eager["qkv"] - floor["qkv"]) == pytest.approx(3 * d_gemm, rel=1e-9)
    # CUDA graphs alone: decode at the floors, prefill unchanged
    graph = jm.Runtime(cuda_graph=1.0)
    assert float(layer(GPT, graph)["total"]) == pytest.approx(float(floor["total"]), rel=1e-12)
    pre_e = layer(GPT, None, "prefill", 128.0, 0.0)
    pre_g = layer(GPT, graph, "prefill", 128.0, 0.0)
    assert float(pre_g["total"]) == float(pre_e["total"])


def test_fusions_drop_their_kernels():
    base = layer(LLAMA, jm.Runtime(kernel_floor=1.0))
    act = layer(LLAMA, jm.Runtime(kernel_floor=1.0, fuse_act=1.0))
    assert float(base["act"]) > 0 and float(act["act"]) == 0.0
    rope = layer(LLAMA, jm.Runtime(kernel_floor=1.0, fuse_rope=1.0))
    want = float(jm.rope_latency(DEV, 8.0, 16.0, 4.0, 128.0))
    assert float(base["qkv"] - rope["qkv"]) == pytest.approx(want, rel=1e-9)
    # fused add + norm on a GELU model: the streaming RMSNorm-family kernel
    norm = layer(GPT, jm.Runtime(kernel_floor=1.0, fuse_norm=1.0))
    assert float(norm["layernorm_mha"]) == pytest.approx(
        float(jm.rmsnorm_latency(DEV, 8.0, 2048.0)), rel=1e-9)


def test_gqa_decode_attention_loads_kv_once_per_kv_head_hand_derived():
    b, h, hk, kv, d, w = 8.0, 16.0, 4.0, 1024.0, 128.0, 2.0
    g = h / hk
    fa2 = flash_attention_latency(DEV, b, h, 1.0, kv, d, hk, AttentionKernel(version=2.0))
    # FA-2 decode unit = (sequence, KV head): Q and O of its g rows, K and V once, fp32 LSE
    want = b * hk * (2.0 * g * d * w + 2.0 * kv * d * w + g * 4.0)
    assert float(fa2["hbm_bytes"]) == pytest.approx(want, rel=1e-12)
    fa1 = flash_attention_latency(DEV, b, h, 1.0, kv, d, hk, AttentionKernel(version=1.0))
    assert float(fa1["hbm_bytes"]) > g * 0.9 * want     # K, V once per query head
    # decoding through the layer rows runs the shared-K/V kernel whatever the version ...
    rows = flash_attention_rows(DEV, AttentionShape(b, h, 1.0, kv, d, hk),
                                AttentionKernel(version=1.0))
    assert sum(float(f) for f, _ in rows.values()) == pytest.approx(float(fa2["fwd"]),
                                                                   rel=1e-12)
    # ... unless the runtime asks for the per-query-head kernel
    rows1 = flash_attention_rows(DEV, AttentionShape(b, h, 1.0, kv, d, hk),
                                 AttentionKernel(version=1.0), share_kv=False)
    assert sum(float(f) for f, _ in rows1.values()) == pytest.approx(float(fa1["fwd"]),
                                                                    rel=1e-12)
    # the FlashAttention-2 path the serving runtimes take: the per-query-head kernel is the
    # split-KV kernel with one unit per query head, K and V read g times
    rows2 = flash_attention_rows(DEV, AttentionShape(b, h, 1.0, kv, d, hk),
                                 AttentionKernel(version=2.0), share_kv=False)
    fa2h = flash_attention_latency(DEV, b, h, 1.0, kv, d, h, AttentionKernel(version=2.0))
    assert sum(float(f) for f, _ in rows2.values()) == pytest.approx(float(fa2h["fwd"]),
                                                                    rel=1e-12)
    assert float(fa2h["hbm_bytes"]) == pytest.approx(
        b * h * (2.0 * d * w + 2.0 * kv * d * w + 4.0), rel=1e-12)
    assert float(fa2h["hbm_bytes"]) > 0.9 * g * want
    # prefill keeps the version asked for
    pre = flash_attention_rows(DEV, AttentionShape(b, h, 256.0, 256.0, d, hk),
                               AttentionKernel(version=1.0))
    fa1p = flash_attention_latency(DEV, b, h, 256.0, 256.0, d, hk,
                                   AttentionKernel(version=1.0))
    assert sum(float(f) for f, _ in pre.values()) == pytest.approx(float(fa1p["fwd"]),
                                                                  rel=1e-12)
    # the layer: fused attention decode is bandwidth-bound on the shared K/V bytes
    par = jm.Parallelism(tp=1, flash_attention=1.0)
    lay = layer(LLAMA, None, "decode", 1.0, kv - 1.0, b, par)
    att = float(lay["qk"] + lay["softmax"] + lay["av"])
    assert att < 3.0 * want / float(DEV.mem_bw) + 2.0 * float(DEV.matmul_overhead_s)


@pytest.mark.slow
def test_inference_runtime_step_overhead_vmap_jit_grad():
    sysm = SYSTEM
    par = jm.Parallelism(tp=4)
    kw = dict(gemm=roofline_gemm)
    r0 = jm.inference(sysm, LLAMA, par, 8, 256, 32, runtime=jm.runtime_of("trtllm",
                                                                          step_overhead_s=0.0),
                      **kw)
    step = 50e-6
    r1 = jm.inference(sysm, LLAMA, par, 8, 256, 32,
                      runtime=jm.runtime_of("trtllm", step_overhead_s=step), **kw)
    assert float(r1.ttft_s - r0.ttft_s) == pytest.approx(step, rel=1e-6)
    assert float(r1.tpot_s - r0.tpot_s) == pytest.approx(step, rel=1e-6)
    pt = jm.inference(sysm, LLAMA, par, 8, 256, 32, **kw)
    assert float(r0.tpot_s) < float(pt.tpot_s) and float(r0.ttft_s) < float(pt.ttft_s)
    assert bool(r1.feasible)
    # vmap over a batch of runtimes == a loop
    stack = rtp.stack_runtimes(["pytorch", "trtllm", "vllm"])
    rs = jm.inference(sysm, LLAMA, par, 8, 256, 32, runtime=stack, **kw)
    for i, name in enumerate(["pytorch", "trtllm", "vllm"]):
        one = jm.inference(sysm, LLAMA, par, 8, 256, 32, runtime=name, **kw)
        assert float(rs.tpot_s[i]) == pytest.approx(float(one.tpot_s), rel=1e-9), name
        assert float(rs.ttft_s[i]) == pytest.approx(float(one.ttft_s), rel=1e-9), name

    # d total / d step = gen_len (one prefill step + gen_len − 1 decode steps)
    def total(s):
        rt = jm.runtime_of("trtllm", step_overhead_s=s)
        return jm.inference.single(sysm, LLAMA, par, 8.0, 256.0, 32.0, roofline_gemm,
                                   runtime=rt).total_s
    gr = jax.jit(jax.grad(total))(jnp.asarray(40e-6))
    assert float(gr) == pytest.approx(32.0, rel=1e-9)


@pytest.mark.slow
def test_context_layer_overhead_adds_layers_per_stage_to_ttft_only():
    """``ttft += (n_layers / pp)·c`` (every rank sets up its own layers, in parallel), the
    decode step unchanged; vmapped over a batch of runtimes and differentiated in c."""
    par = jm.Parallelism(tp=2, pp=2)
    c = 100e-6
    rts = rtp.stack_runtimes([jm.runtime_of("trtllm", context_layer_overhead_s=0.0),
                     jm.runtime_of("trtllm", context_layer_overhead_s=c)])
    r = jm.inference(SYSTEM, LLAMA, par, 4, 128, 8, gemm=roofline_gemm, runtime=rts)
    want = float(LLAMA.n_layers) / 2.0 * c                       # 4 layers / pp 2 = 2 layers
    assert float(r.ttft_s[1] - r.ttft_s[0]) == pytest.approx(want, rel=1e-6)
    assert float(r.tpot_s[1]) == float(r.tpot_s[0])
    assert float(r.breakdown["request_setup"][1]) == pytest.approx(want, rel=1e-9)
    assert float(r.breakdown["request_setup"][0]) == 0.0
    assert float(r.total_s[1] - r.total_s[0]) == pytest.approx(want, rel=1e-6)

    def ttft(x):
        rt = jm.runtime_of("trtllm", context_layer_overhead_s=x)
        return jm.inference.single(SYSTEM, LLAMA, par, 4.0, 128.0, 8.0, roofline_gemm,
                                   runtime=rt).ttft_s
    assert float(jax.grad(ttft)(jnp.asarray(c))) == pytest.approx(2.0, rel=1e-9)


@pytest.mark.slow
def test_float32(float32):
    r = jm.inference(SYSTEM, LLAMA, jm.Parallelism(tp=4), 8, 256, 32, gemm=roofline_gemm,
                     runtime="trtllm")
    assert r.tpot_s.dtype == jnp.float32
    assert np.isfinite(float(r.tpot_s)) and bool(r.feasible)


def test_chunked_layers_decode_by_the_per_query_head_kernel_under_trtllm_v1():
    """Llama-4 Scout (36 chunked layers of 48, attention_chunk 8192) under ``trtllm_v1``: the
    average decode layer's attention is 1/4 the GQA-packed kernel (global NoPE layers, XQA)
    and 3/4 the per-query-head kernel (chunked layers, MMHA), below the chunk where chunk and
    full attention attend the same keys; a model without chunks keeps the packed kernel;
    the per-query-head kernel reads the cache of each of the 5 query heads of a KV head."""
    scout = hw_db.model("llama4-scout")
    flat = dataclasses.replace(scout, attention_chunk=0.0)       # same layers, no chunks
    v1 = jm.runtime_of("trtllm_v1")
    packed = jm.runtime_of("trtllm_v1", chunked_attention=0.0)
    per_head = jm.runtime_of("trtllm_v1", chunked_attention=0.0, attention=2.0)
    par = jm.Parallelism(tp=4)

    def attn(m, rt):
        t = layer_times(SYSTEM, m, par, Work(64.0, 1.0, "decode", 2047.0),
                        LayerOptions(roofline_gemm, runtime=rt))
        return float(t["qk"] + t["av"] + t["softmax"])

    a_v1, a_packed, a_head = attn(scout, v1), attn(scout, packed), attn(scout, per_head)
    assert a_v1 == pytest.approx(0.25 * a_packed + 0.75 * a_head, rel=1e-6)
    assert a_head > 3.0 * a_packed                 # K and V read 5 times instead of once
    assert attn(flat, v1) == pytest.approx(a_packed, rel=1e-6)



def test_llama4_encoder_params_hand_count():
    """The shipped Llama-4 ``encoder_params``: the vision tower and projector of both
    config.json files (``vision_config``), hand-counted with biases, norms, the class and
    577 positional embeddings."""
    vision = (34 * (4 * 1408 * 1409 + 1408 * 5632 + 5632 + 5632 * 1408 + 1408 + 4 * 1408)
              + 588 * 1408 + 1408 + 577 * 1408 + 4 * 1408
              + 5632 * 4096 + 4096 * 4096 + 4096 * 5120)
    for name in ("llama4-scout", "llama4-maverick"):
        assert float(hw_db.model(name).encoder_params) == vision


@pytest.mark.slow
def test_encoder_weights_held_on_every_device_under_trtllm_v1_hand_derived():
    """A runtime that loads the checkpoint's modality encoder on every rank (``trtllm_v1``:
    ``encoder_bytes`` 4, the float32 Llama-4 vision tower) adds ``encoder_params · 4`` bytes
    to each device's weights whatever the TP degree; ``encoder_bytes`` 0 and the eager
    default add nothing."""
    m = dataclasses.replace(LLAMA, encoder_params=1e9)

    def weights(rt, tp=4):
        r = jm.inference(SYSTEM, m, jm.Parallelism(tp=tp, dp=4 / tp), 8, 256, 32,
                         gemm=roofline_gemm, runtime=rt)
        return float(r.breakdown["memory.weights"])

    held = jm.runtime_of("trtllm_v1", encoder_bytes=0.0)
    assert weights("trtllm_v1") - weights(held) == pytest.approx(4e9, rel=1e-6)
    assert weights("trtllm_v1", tp=1) - weights(held, tp=1) == pytest.approx(4e9, rel=1e-6)
    assert weights(held) == pytest.approx(weights(None), rel=1e-9)


def test_trtllm_bench_settings_hand_derived():
    """trtllm-bench's settings for a Qwen3-235B-like FP8 checkpoint on 8 devices of 80 GiB at
    128/2048 (``calc_engine_setting`` / ``finetune_setting`` / ``get_settings``), by hand:
    KV per token 2·94·max(8, 4)·128·1 B = 192,512 B; engine 235e9 B = 218.86 GiB; requests
    0.9·(640 − 218.86) GiB / (192,512 B · 2176) = 971.5 -> max_batch 128·⌈971.5/128⌉ = 1024;
    tokens 971.5·(1 + 128/2048) = 1032 -> 2048 (the floor), ≥ 128 + 1024; graphs up to 1024."""
    ck = dict(param_count=235e9, weight_bytes=1.0, kv_bytes=1.0, attention_layers=94,
              n_kv_heads=4, head_dim=128)
    s = rtp.trtllm_bench_settings(ck, 8, 1, 128, 2048, 80 * 2**30)
    assert s["kv_requests"] == pytest.approx(971.52, rel=1e-4)
    assert (s["max_batch"], s["max_tokens"]) == (1024.0, 2048.0)
    assert s["graph_batches"][-2:] == (512.0, 1024.0)
    # a bound between two listed sizes is captured itself (padding on): 1280 sequences
    s = rtp.trtllm_bench_settings(dict(ck, param_count=180e9), 8, 1, 128, 2048, 80 * 2**30)
    assert s["max_batch"] == 1280.0 and s["graph_batches"][-2:] == (1024.0, 1280.0)
    assert rtp.graph_padded_batch(1036.0, s["graph_batches"]) == 1280.0
    assert rtp.graph_padded_batch(3.0, s["graph_batches"]) == 4.0
    assert rtp.graph_padded_batch(1300.0, s["graph_batches"]) == 1300.0   # eager above
    with pytest.raises(ValueError, match="tp=0"):
        rtp.trtllm_bench_settings(ck, 0, 1, 128, 2048, 80 * 2**30)
    with pytest.raises(ValueError, match="head_dim"):
        rtp.trtllm_bench_settings({k: v for k, v in ck.items() if k != "head_dim"}, 8, 1,
                                  128, 2048, 80 * 2**30)
