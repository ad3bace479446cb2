"""Memory footprint: Korthikanti et al. 2022 formulas by hand and against their Figs. 1 and 7,
ZeRO sharding, KV cache with GQA, vmap vs loop and jit vs eager; the runtime reserve in the
training, inference and serving memory rules."""

import csv
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.numerics import reason_code
from jaxmodel.workload.memory import (activation_bytes_per_layer, inference_memory,
                                      kv_cache_bytes, training_memory, usable_memory)
from jaxmodel.workload.params import params_per_device

GIB = 2.0 ** 30

# Korthikanti et al. 2022 Table 3 (seq 2048, vocab 51200 as Megatron; TP 8): heads, hidden,
# layers, pipeline stages, micro-batch.
KORTHIKANTI = {
    "megatron-22B": (64, 6144, 48, 1, 4),
    "gpt3-175B": (96, 12288, 96, 8, 1),
    "turing-530B": (128, 20480, 105, 35, 1),
    "megatron-1T": (160, 25600, 128, 64, 1),
}
SEQ = 2048.0


def gpt(heads, hidden, layers):
    return jm.Model(n_layers=float(layers), d_model=float(hidden), n_heads=float(heads),
                    n_kv_heads=float(heads), head_dim=hidden / heads, d_ff=4.0 * hidden,
                    vocab_size=51200.0, tied_embeddings=1.0)


MODES = {  # Fig. 7 names → (sp, recompute)
    "none": (False, "none"), "seq": (True, "none"), "sel": (False, "selective"),
    "seqsel": (True, "selective"), "full": (False, "full"),
}


def _fig(anchors):
    with open(anchors / "training" / "korthikanti_memory_fig1_fig7.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("mode", list(MODES))
def test_activation_per_layer_matches_korthikanti_closed_forms(mode):
    a, h, L, p, b = KORTHIKANTI["gpt3-175B"]
    m = gpt(a, h, L)
    t = 8.0
    sp, rc = MODES[mode]
    got = float(activation_bytes_per_layer(m, jm.Parallelism(tp=t, sp=sp, recompute=rc),
                                           b, SEQ))
    sbh = SEQ * b * h
    att = 5 * a * SEQ / (h * t)
    want = {"none": sbh * (10 + 24 / t + att),          # §4.2.1 eq. 2
            "seq": sbh * (34 / t + att),                  # §4.2.2
            "sel": sbh * (10 + 24 / t),                   # §5
            "seqsel": sbh * 34 / t,
            "full": 2 * sbh}[mode]                        # Table 2
    assert got == pytest.approx(want, rel=1e-12)
    # without any parallelism: sbh(34 + 5as/h) (§4.1 eq. 1)
    if mode == "none":
        one = float(activation_bytes_per_layer(m, jm.Parallelism(tp=1), b, SEQ))
        assert one == pytest.approx(sbh * (34 + 5 * a * SEQ / h), rel=1e-12)


def test_against_korthikanti_fig7_ratios(anchors):
    """Fig. 7: activation memory of each mode relative to TP only, within 10 %."""
    rows = [r for r in _fig(anchors) if r["figure"] == "fig7"]
    assert len(rows) == 20
    for r in rows:
        a, h, L, p, b = KORTHIKANTI[r["model"]]
        m = gpt(a, h, L)
        sp, rc = MODES[r["mode"]]
        base = activation_bytes_per_layer(m, jm.Parallelism(tp=8), b, SEQ)
        got = activation_bytes_per_layer(m, jm.Parallelism(tp=8, sp=sp, recompute=rc), b, SEQ)
        pct = 100 * float(got / base)
        assert pct == pytest.approx(float(r["value"]), rel=0.10), (r["model"], r["mode"])


def _fig1_memory(model_name, mode, in_flight_interleave=1.0):
    a, h, L, p, b = KORTHIKANTI[model_name]
    sp, rc = {"none": (False, "none"), "seqsel": (True, "selective")}[mode]
    par = jm.Parallelism(tp=8, pp=p, sp=sp, recompute=rc, micro_batch=b)
    # first stage of 1F1B holds p micro-batches; interleaved 1F1B p·(1 + (p−1)/(p·m))
    in_flight = p * (1 + (p - 1) / (p * in_flight_interleave)) if in_flight_interleave > 1 else p
    return training_memory(gpt(a, h, L), par, SEQ, in_flight, grad_bytes=4.0)


@pytest.mark.parametrize("model_name", ["megatron-22B", "megatron-1T"])
def test_against_korthikanti_fig1_absolute(anchors, model_name):
    """Fig. 1 per-GPU memory, within 10 %, for the models whose pipeline schedule does not
    change the first stage's activations (22B: no pipeline; 1T: 1F1B). Weights + gradients +
    optimizer: Megatron's 2 + 4 (fp32 main gradients) + 12 bytes per parameter."""
    rows = {(r["mode"], r["metric"]): float(r["value"]) for r in _fig(anchors)
            if r["figure"] == "fig1" and r["model"] == model_name}
    for mode in ("none", "seqsel"):
        mem = _fig1_memory(model_name, mode)
        acts = float(mem["activations"]) / GIB
        states = float(mem["weights"] + mem["gradients"] + mem["optimizer"]) / GIB
        assert acts == pytest.approx(rows[(mode, "activation_memory_GiB_per_gpu")], rel=0.10)
        assert states == pytest.approx(rows[(mode, "params_and_optimizer_GiB_per_gpu")],
                                       rel=0.10)


@pytest.mark.parametrize("model_name", ["gpt3-175B", "turing-530B"])
def test_against_korthikanti_fig1_interleaved(anchors, model_name):
    """Fig. 1 for 175B and 530B. Their activation values equal the per-layer formula times
    ``n_layers · (1 + (p−1)/(p·m))`` with m = 3 virtual stages (Korthikanti §4.2.3, interleaved
    schedule); the schedule is not in the anchor file, so m = 3 is an assumption stated here."""
    rows = {(r["mode"], r["metric"]): float(r["value"]) for r in _fig(anchors)
            if r["figure"] == "fig1" and r["model"] == model_name}
    for mode in ("none", "seqsel"):
        mem = _fig1_memory(model_name, mode, in_flight_interleave=3.0)
        acts = float(mem["activations"]) / GIB
        assert acts == pytest.approx(rows[(mode, "activation_memory_GiB_per_gpu")], rel=0.10)


def test_zero_stages_shard_over_dp():
    m = gpt(*KORTHIKANTI["megatron-22B"][:3])
    out = {z: training_memory(m, jm.Parallelism(tp=8, dp=4, zero=z), SEQ, 1.0, grad_bytes=2.0)
           for z in range(4)}
    p = float(params_per_device(m, jm.Parallelism(tp=8)))
    assert float(out[0]["weights"]) == pytest.approx(2 * p)
    assert float(out[0]["gradients"]) == pytest.approx(2 * p)
    assert float(out[0]["optimizer"]) == pytest.approx(12 * p)
    assert float(out[1]["optimizer"]) == pytest.approx(3 * p)
    assert float(out[1]["gradients"]) == pytest.approx(2 * p)
    assert float(out[2]["gradients"]) == pytest.approx(0.5 * p)
    assert float(out[2]["weights"]) == pytest.approx(2 * p)
    assert float(out[3]["weights"]) == pytest.approx(0.5 * p)
    for z in range(4):
        parts = sum(float(out[z][k]) for k in ("weights", "gradients", "optimizer",
                                                "activations"))
        assert float(out[z]["total"]) == pytest.approx(parts)


def test_kv_cache_follows_kv_heads():
    m = hw_db.model("llama2-70b")            # 80 layers, 8 KV heads of 128
    per_tok_layer = 2 * 8 * 128 * 2           # K and V, fp16
    full = float(kv_cache_bytes(m, jm.Parallelism(tp=1), 4, 1000))
    assert full == pytest.approx(4 * 1000 * 80 * per_tok_layer)
    assert float(kv_cache_bytes(m, jm.Parallelism(tp=8), 4, 1000)) == pytest.approx(full / 8)
    # tp 16 > 8 KV heads: one replicated head per device
    assert float(kv_cache_bytes(m, jm.Parallelism(tp=16), 4, 1000)) == pytest.approx(full / 8)
    assert float(kv_cache_bytes(m, jm.Parallelism(tp=8, pp=4), 4, 1000)) == pytest.approx(
        full / 32)
    mha = float(kv_cache_bytes(hw_db.model("llama2-13b"), jm.Parallelism(), 4, 1000))
    assert mha == pytest.approx(4 * 1000 * 40 * 2 * 40 * 128 * 2)


def test_inference_memory_parts():
    m = hw_db.model("llama2-13b")
    par = jm.Parallelism(tp=2)
    mem = inference_memory(m, par, 8, 1024, 512)
    assert float(mem["weights"]) == pytest.approx(2 * float(params_per_device(m, par)))
    assert float(mem["kv_cache"]) == pytest.approx(float(kv_cache_bytes(m, par, 8, 1536)))
    assert float(mem["total"]) == pytest.approx(
        float(mem["weights"] + mem["kv_cache"] + mem["activations"]))


def test_vmap_matches_loop_and_jit_matches_eager():
    m = gpt(*KORTHIKANTI["gpt3-175B"][:3])
    tps = [1.0, 2.0, 4.0, 8.0]
    par = jm.Parallelism(tp=jnp.asarray(tps), pp=8, sp=True, recompute="selective")
    batched = training_memory(m, par, SEQ, 8.0)
    for i, t in enumerate(tps):
        one = training_memory(m, jm.Parallelism(tp=t, pp=8, sp=True, recompute="selective"),
                              SEQ, 8.0)
        for k in one:
            assert float(batched[k][i]) == pytest.approx(float(one[k]), rel=1e-12)
    p1 = jm.Parallelism(tp=4.0, pp=8.0, sp=1.0, recompute=1.0)
    with jax.disable_jit():
        eager = training_memory.single(m, p1, SEQ, 8.0)
    jitted = jax.jit(training_memory.single)(m, p1, SEQ, 8.0)
    for k in eager:
        assert float(eager[k]) == pytest.approx(float(jitted[k]), rel=1e-12)
    assert np.all(np.isfinite(np.asarray(batched["total"])))


def test_activation_bytes_follow_the_activation_dtype():
    """4-byte activations (fp32), GPT layer without TP: the 2-byte terms of Korthikanti §4.1
    double, the 1-byte dropout masks do not. Replicated 8·w + 2 (w = act_bytes/2 = 2) = 18,
    split w·24 = 48, scores (4w + 1) = 9: sbh·(66 + 9as/h) instead of sbh·(34 + 5as/h)."""
    a, h, L, p, b = KORTHIKANTI["gpt3-175B"]
    m = gpt(a, h, L)
    par = jm.Parallelism(tp=1)
    sbh = SEQ * b * h
    two = float(activation_bytes_per_layer(m, par, b, SEQ))
    four = float(activation_bytes_per_layer(m, par, b, SEQ, 4.0))
    assert two == pytest.approx(sbh * (34 + 5 * a * SEQ / h), rel=1e-12)
    assert four == pytest.approx(sbh * (66 + 9 * a * SEQ / h), rel=1e-12)


def test_precision_sets_every_tensor_class():
    """Training states per parameter (ZeRO-0): bf16 2 + 4 + (4 + 8) = 18 B; fp8 adds the
    cached 1-byte FP8 weight copy and its 1-byte transpose (20 B). Serving: fp8 weights 1 B
    and a 1-byte KV cache."""
    m = gpt(*KORTHIKANTI["megatron-22B"][:3])
    par = jm.Parallelism(tp=8)
    p = float(params_per_device(m, par))
    for name, per_param in (("bf16", 18.0), ("fp8", 20.0)):
        mem = training_memory(m, par, SEQ, 1.0, precision=name)
        states = mem["weights"] + mem["fp8_weight_cache"] + mem["gradients"] + mem["optimizer"]
        assert float(states) == pytest.approx(per_param * p, rel=1e-12)
    bf = inference_memory(m, par, 4, 1000, 24, precision="bf16")
    f8 = inference_memory(m, par, 4, 1000, 24, precision="fp8")
    assert float(f8["weights"]) == pytest.approx(p, rel=1e-12)
    assert float(f8["kv_cache"]) == pytest.approx(float(kv_cache_bytes(m, par, 4, 1024, 1.0)),
                                                  rel=1e-12)
    assert float(f8["total"]) < float(bf["total"])


def test_uneven_stages_memory_by_hand():
    """7 layers on 4 stages (2 | 2, 2 | 1: one light stage, the last): weights of the most
    loaded stage, the stage with the largest total under 1F1B (first: 4 in flight × 2
    layers + embedding), the KV cache of ⌈L/p⌉ layers."""
    m = jm.Model(n_layers=7.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=32000.0)
    par = jm.Parallelism(pp=4)
    layer = 12 * 1024.0 ** 2 + 4 * 1024.0           # 4d² + 8d² + two layernorms
    emb = 32000.0 * 1024.0
    assert float(params_per_device(m, par)) == pytest.approx(2 * layer + emb)
    act = float(activation_bytes_per_layer(m, par, 1.0, 512.0))
    mem = training_memory(m, par, 512.0, (4.0, 3.0, 1.0))
    assert float(mem["activations"]) == pytest.approx(4.0 * 2.0 * act)
    assert float(mem["weights"]) == pytest.approx(2.0 * (2 * layer + emb))
    assert float(mem["optimizer"]) == pytest.approx(12.0 * (2 * layer + emb))
    # even stages and a scalar in-flight count: the Korthikanti first-stage formula
    even = training_memory(dataclasses.replace(m, n_layers=8.0), par, 512.0, 4.0)
    assert float(even["activations"]) == pytest.approx(4.0 * 2.0 * act)
    kv = float(kv_cache_bytes(m, par, 1.0, 100.0))
    assert kv == pytest.approx(2 * 16 * 64 * 100 * 2.0 * 2)      # ⌈7/4⌉ = 2 layers


# ---- the runtime reserve (Device.runtime_reserved_bytes) in the memory rules -------------------

def _with_device(system, **fields):
    return dataclasses.replace(system, device=dataclasses.replace(system.device, **fields))


def test_usable_memory_by_hand():
    dev = hw_db.device("a100_80gb")
    assert float(dev.runtime_reserved_bytes) == round(1.4 * GIB)        # hw_db value
    assert float(usable_memory(dev.mem_capacity, dev.runtime_reserved_bytes)) == \
        80 * GIB - round(1.4 * GIB)
    # vLLM's rule: 0.9 · 80 GiB − 1.4 GiB = 70.6 GiB
    assert float(usable_memory(dev.mem_capacity, dev.runtime_reserved_bytes, 0.9)) == \
        pytest.approx(70.6 * GIB, rel=1e-9)
    f32 = usable_memory(jnp.float32(80 * GIB), jnp.float32(2.5 * GIB))
    assert f32.dtype == jnp.float32 and float(f32) == 77.5 * GIB


def test_serving_kv_capacity_subtracts_the_reserve():
    from jaxmodel import serving as srv
    f = jnp.result_type(float)
    grid = np.asarray(srv.TOKEN_GRID)
    costs = srv.ServingCosts(
        step_s=jnp.asarray(0.01 + 1e-4 * grid, f), attn_s=jnp.asarray(5e-5 * grid, f),
        prefill_s=jnp.asarray(0.05, f), prefill_attn_s=jnp.asarray(0.05, f),
        weights_bytes=jnp.asarray(16e9, f), kv_bytes_per_token=jnp.asarray(1e5, f),
        act_bytes=jnp.asarray(1e9, f), mem_capacity=jnp.asarray(80e9, f),
        feasible=jnp.asarray(True), reason=jnp.asarray(0, jnp.int32),
        reserved_bytes=jnp.asarray(2e9, f))
    # free = 0.9·80e9 − 2e9 − 16e9 − 1e9 = 53e9 B → 33125 blocks of 16·1e5 B; a request's
    # peak 1100 tokens = 69 blocks → floor(33125/69) = 480 requests (498 without the reserve)
    assert float(srv.kv_capacity_seqs(costs, 1000.0, 100.0)) == 480.0
    none = dataclasses.replace(costs, reserved_bytes=jnp.asarray(0.0, f))
    assert float(srv.kv_capacity_seqs(none, 1000.0, 100.0)) == 498.0


def _small_inference_model():
    return jm.Model(n_layers=8.0, d_model=2048.0, n_heads=16.0, n_kv_heads=4.0,
                    head_dim=128.0, d_ff=5632.0, vocab_size=32000.0, activation="swiglu")


def _edge_inference(dtype, reserves):
    """``jm.inference`` of a small model on 4 A100 at capacity = its memory + 1.25 GiB."""
    from testkit import roofline_gemm
    system = hw_db.system("hgx_a100_4gpu")
    model, par = _small_inference_model(), jm.Parallelism(tp=4)
    need = float(inference_memory(model, par, 8, 512, 64)["total"])
    cap = jnp.asarray(need + 1.25 * GIB, dtype)

    def run(reserve):
        return jm.inference(_with_device(system, mem_capacity=cap,
                                         runtime_reserved_bytes=reserve),
                            model, par, 8, 512, 64, gemm=roofline_gemm)
    return run, run(jnp.asarray(reserves, dtype)), need


@pytest.mark.slow
def test_inference_plan_at_the_edge_flips_to_out_of_memory():
    """Capacity = the plan's memory + half the 2.5 GiB reserve: feasible without the reserve,
    out of memory with it, feasible with a quarter of it; the reserve holds no tensor."""
    r = 2.5 * GIB
    _, res, need = _edge_inference(jnp.float64, [0.0, r, r / 4])
    assert np.asarray(res.memory_bytes) == pytest.approx(need, rel=1e-12)
    assert res.feasible.tolist() == [True, False, True]
    assert int(res.reason[1]) == reason_code("out_of_memory")
    assert np.isinf(float(res.total_s[1])) and np.isfinite(np.asarray(res.total_s)[[0, 2]]).all()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_inference_reserve_vmap_loop_and_gradient(dtype):
    """vmap over the reserve matches a loop, in float32 and float64; the gradient of the
    latency with respect to the reserve is finite (zero: the reserve only gates)."""
    r = 2.5 * GIB
    run, res, _ = _edge_inference(dtype, [0.0, r])
    for i, x in enumerate((0.0, r)):
        one = run(jnp.asarray(x, dtype))
        assert bool(one.feasible) == bool(res.feasible[i])
        assert float(one.total_s) == pytest.approx(float(res.total_s[i]), rel=1e-6)
    g = [float(jax.grad(lambda x: run(x).total_s)(jnp.asarray(x, dtype))) for x in (0.0, r)]
    assert g == [0.0, 0.0]


@pytest.mark.slow
def test_training_plan_at_the_edge_flips_to_out_of_memory():
    """The training rule subtracts exactly the reserve: at capacity = memory + reserve/2 a
    plan is feasible without the reserve and out of memory with it (batched, one compile)."""
    from testkit import roofline_gemm
    system = hw_db.system("dgx_a100", nodes=1)
    model = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0,
                     head_dim=64.0, d_ff=4096.0, vocab_size=32000.0, activation="gelu")
    par = jm.Parallelism(dp=2.0, tp=2.0, pp=2.0, micro_batch=1.0)

    def gemm(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
        return roofline_gemm(dev, m, n, k, batch, dtype_bytes)

    r = 2.5 * GIB

    def run(cap, reserve):
        sysb = _with_device(system, mem_capacity=jnp.asarray(cap),
                            runtime_reserved_bytes=jnp.asarray(reserve))
        return jm.train_step(sysb, model, par, 16.0, 512.0, gemm=gemm)
    first = run([1e15, 1e15, 1e15], [0.0, r, r / 4])
    need = float(first.memory_bytes[0])
    assert np.asarray(first.memory_bytes) == pytest.approx(need)   # the reserve is no tensor
    res = run([need + r / 2] * 3, [0.0, r, r / 4])
    assert res.feasible.tolist() == [True, False, True]
    assert int(res.reason[1]) == reason_code("out_of_memory")
    assert float(res.step_time_s[0]) == float(res.step_time_s[2])
