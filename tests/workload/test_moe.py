"""Mixture-of-Experts: GShard capacity and all-to-all volume by hand, expert GEMM rows
(capacity and dropless), expert divisibility (errors and reason codes), memory (expert
weights, ZeRO over DP_exp, activations), Mixtral-style inference with EP or TP, finite
gradients and no NaN.

GEMMs are timed by a FLOP-counting stand-in (a row's seconds are its FLOPs / 1e12), through the
public ``gemm`` hook, so the compiled graphs stay small.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.workload import layer as wl
from jaxmodel.workload import moe

RATE = 1e12


def flop_gemm(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return 2.0 * m * n * k * batch / RATE


def gpt_moe(**kw):
    """4 layers, every 2nd an MoE layer of 8 experts, top-2 (f = 1/2)."""
    base = dict(n_layers=4, d_model=1024, n_heads=16, n_kv_heads=16, head_dim=64, d_ff=4096,
                vocab_size=32000, activation="gelu", n_experts=8, top_k=2, moe_every=2,
                capacity_factor=1.0)
    base.update(kw)
    return jm.Model(**{k: (float(v) if not isinstance(v, str) else v) for k, v in base.items()})


def bw_eff(dev):
    """Fraction of ``mem_bw`` a GEMM's operand stream reaches (``matmul_bw_efficiency``, 0 =
    ``mem_bw_efficiency``)."""
    e = float(dev.matmul_bw_efficiency)
    return e if e > 0 else float(dev.mem_bw_efficiency)


MIXTRAL = dataclasses.replace(hw_db.model("mixtral-8x7b"), name="custom")
NODE = hw_db.system("dgx_a100")                  # 8 GPUs, NVSwitch


# --------------------------------------------------------------------------------------------
# capacity, dimensions, all-to-all volume
# --------------------------------------------------------------------------------------------
def test_capacity_by_hand():
    assert float(moe.expert_capacity(MIXTRAL, 4096.0)) == 1024.0        # 1.0 · 2 · 4096 / 8
    m = dataclasses.replace(MIXTRAL, capacity_factor=1.25, top_k=1.0, n_experts=32.0)
    assert float(moe.expert_capacity(m, 1000.0)) == 40.0                # ⌈39.06⌉
    assert float(moe.moe_layer_fraction(gpt_moe())) == 0.5
    assert float(moe.moe_layer_fraction(gpt_moe(n_experts=1))) == 0.0


def test_alltoall_volume_and_time_by_hand():
    par = jm.Parallelism(dp=4, tp=2, ep=4)
    dims = moe.moe_dims(MIXTRAL, par, 4096.0)
    C = 1024.0
    assert float(dims["local_experts"]) == 2.0
    assert float(dims["expert_tokens"]) == 4 * C       # C slots from each of the 4 senders
    assert float(dims["a2a_bytes"]) == 8 * C * 4096 * 2     # E · C · d · bytes
    # dispatch + combine over the EP group, members tp·pp = 2 devices apart (f = 1)
    one = jm.collective_latency.single(NODE, "all_to_all", 8 * C * 4096 * 2, 4.0, "auto", 2.0)
    a2a = moe.alltoall_time(NODE, MIXTRAL, par, 4096.0)
    assert float(a2a) == pytest.approx(2 * float(one), rel=1e-12)
    assert float(moe.alltoall_time(NODE, MIXTRAL, jm.Parallelism(tp=8), 4096.0)) == 0.0
    # EP folded inside the TP group of one replica, no SP: the tokens are on every rank, the
    # TP all-reduce combines (no all-to-all); with SP or a second replica they travel
    folded = jm.Parallelism(dp=1, tp=8, ep=8)
    assert float(moe.alltoall_time(NODE, MIXTRAL, folded, 4096.0)) == 0.0
    for p in (dataclasses.replace(folded, sp=1.0), jm.Parallelism(dp=2, tp=4, ep=8)):
        assert float(moe.alltoall_time(NODE, MIXTRAL, p, 4096.0)) > 0.0
    # per MoE layer (not share-weighted): the same for Mixtral, whose every layer is MoE
    one_layer = moe.moe_layer_times.single(NODE, MIXTRAL, par, 4096.0)
    assert float(one_layer["alltoall"]) == pytest.approx(float(a2a), rel=1e-12)
    assert float(one_layer["capacity"]) == C and float(one_layer["router"]) > 0
    # dropless (serving): the k·T routed copies
    dl = moe.moe_dims(MIXTRAL, par, 4096.0, dropless=True)
    assert float(dl["a2a_bytes"]) == 2 * 4096 * 4096 * 2


def test_dropless_active_experts_by_hand():
    # one token, top-2 of 8: p = 1 − (6/8)^1 → 2 active experts with 1 token each
    d1 = moe.moe_dims(MIXTRAL, jm.Parallelism(tp=8), 1.0, dropless=True)
    assert float(d1["experts"]) == pytest.approx(2.0)
    assert float(d1["expert_tokens"]) == pytest.approx(1.0)
    # 4 tokens per device, ep = 2 (8 tokens in the group): 4 local experts
    d4 = moe.moe_dims(MIXTRAL, jm.Parallelism(dp=2, tp=4, ep=2), 4.0, dropless=True)
    p = 1 - 0.75 ** 8
    assert float(d4["experts"]) == pytest.approx(4 * p)
    assert float(d4["expert_tokens"]) == pytest.approx(2 * 8 / (8 * p))
    # many tokens: every expert active with k·T/E tokens
    dn = moe.moe_dims(MIXTRAL, jm.Parallelism(tp=8), 4096.0, dropless=True)
    assert float(dn["experts"]) == pytest.approx(8.0)
    assert float(dn["expert_tokens"]) == pytest.approx(1024.0)


# --------------------------------------------------------------------------------------------
# expert GEMM rows (eager, FLOP stand-in)
# --------------------------------------------------------------------------------------------
def test_training_ffn_rows_by_hand():
    m = gpt_moe()
    par = jm.Parallelism(dp=4, tp=2, ep=4)
    sh = wl.shard(m, par)
    dev = NODE.device
    T = 128.0                                           # micro-batch 2 × 64 tokens
    gemms, vectors = moe.ffn_rows(dev, m, par, sh, T, backward=True)
    rows = wl.evaluate(flop_gemm, dev, gemms, vectors, backward=True)
    f, d, dff = 0.5, 1024.0, 4096.0 / 2                # MoE share, d_ff per TP rank
    C = np.ceil(1.0 * 2 * T / 8)                        # 32 slots per expert
    dense = 2 * T * d * dff
    experts = 2 * (2 * (4 * C) * d * dff)               # 2 local experts × [4C × d]×[d × dff]
    want = (1 - f) * dense + f * experts
    assert float(rows["w1"][0]) * RATE == pytest.approx(want, rel=1e-12)
    assert float(rows["w2"][0]) * RATE == pytest.approx(want, rel=1e-12)
    assert float(rows["w1"][1]) * RATE == pytest.approx(2 * want, rel=1e-12)  # dX and dW
    # the router row holds the gating GEMM [T × d]×[d × E] (+ its vector kernels), times f
    gate = 2 * T * d * 8
    assert float(rows["moe_router"][0]) * RATE > f * gate
    # a dense model: exactly the dense FFN block, no router
    dense_m = gpt_moe(n_experts=1)
    g2, v2 = moe.ffn_rows(dev, dense_m, jm.Parallelism(tp=2), sh, T, backward=True)
    r2 = wl.evaluate(flop_gemm, dev, g2, v2, backward=True)
    g3, v3 = wl.ffn_block(dev, dense_m, sh, T, backward=True)
    r3 = wl.evaluate(flop_gemm, dev, g3, v3, backward=True)
    for k in ("w1", "w2", "act"):
        assert float(r2[k][0]) == float(r3[k][0]) and float(r2[k][1]) == float(r3[k][1]), k
    assert float(r2["moe_router"][0]) == 0.0 and float(r2["moe_router"][1]) == 0.0


def test_memory_expert_weights_and_zero_over_dp_exp():
    m = gpt_moe()
    par = jm.Parallelism(dp=4, tp=2, ep=4, zero=1)
    # 2 MoE layers × 8/4 experts × (2·1024·4096)/2 per TP rank
    p_exp = 2 * 2 * (2 * 1024 * 4096) / 2
    assert float(moe.expert_params_per_device(m, par)) == p_exp
    total = float(jm.params_per_device(m, par))
    mem = jm.training_memory(m, par, 64.0, 1.0)
    # ZeRO-1: optimizer states of the dense part over dp = 4, of the experts over dp/ep = 1
    assert float(mem["optimizer"]) == pytest.approx(12 * ((total - p_exp) / 4 + p_exp / 1))
    # activations: the 256 dispatched slots (E·C) instead of 128 tokens, plus fp32 gates
    extra = (256 - 128) * (2 * 1024 + 2 * 2 * 4096 / 2) + 4 * 128 * 8
    a_moe = jm.activation_bytes_per_layer(m, dataclasses.replace(par, micro_batch=2.0), 2.0,
                                          64.0)
    a_dense = jm.activation_bytes_per_layer(gpt_moe(n_experts=1),
                                            dataclasses.replace(par, ep=1.0), 2.0, 64.0)
    assert float(a_moe - a_dense) == pytest.approx(0.5 * extra)


# --------------------------------------------------------------------------------------------
# divisibility, inference (Mixtral, EP or TP), batching, gradients
# --------------------------------------------------------------------------------------------
def test_experts_not_divisible_raises_and_flags_batches():
    with pytest.raises(ValueError, match="experts_not_divisible"):
        jm.layer_breakdown(NODE, MIXTRAL, jm.Parallelism(dp=3, ep=3), 1, 8, gemm=flop_gemm)
    with pytest.raises(ValueError, match="experts_not_divisible"):       # ep must divide dp
        jm.layer_breakdown(NODE, MIXTRAL, jm.Parallelism(dp=2, ep=4), 1, 8, gemm=flop_gemm)
    with pytest.raises(ValueError, match="experts_not_divisible"):       # dense: ep = 1
        jm.layer_breakdown(NODE, gpt_moe(n_experts=1), jm.Parallelism(dp=2, ep=2), 1, 8,
                           gemm=flop_gemm)
    ok, why = moe.moe_feasibility(MIXTRAL, jm.Parallelism(dp=6.0, ep=jnp.array([2., 3., 6.])))
    assert np.asarray(ok).tolist() == [True, False, False]
    # EP folded over TP ranks (ep > dp): ep/dp must divide tp
    ok, _ = moe.moe_feasibility(MIXTRAL, jm.Parallelism(dp=2.0, tp=jnp.array([4., 2., 8.]),
                                                        ep=jnp.array([8., 8., 4.])))
    assert np.asarray(ok).tolist() == [True, False, True]
    assert [jm.reason_name(c) for c in np.asarray(why)] == ["ok", "experts_not_divisible",
                                                             "experts_not_divisible"]


@pytest.fixture(scope="module")
def mixtral_decode():
    """One Mixtral-8x7B decode step (8 sequences, 3072 cached tokens) on 8 A100: TP 8 (every
    device holds a slice of all experts) vs DP 2 × TP 4 with EP 2 (each replica holds 4
    experts) vs EP 8 folded over DP 2 × TP 4 (one expert per device, expert TP 1, the
    Megatron-core / vLLM serving layout); one batched call."""
    par = jm.Parallelism(dp=jnp.array([1.0, 2.0, 2.0]), tp=jnp.array([8.0, 4.0, 4.0]),
                         ep=jnp.array([1.0, 2.0, 8.0]))
    return par, jm.layer_breakdown(NODE, MIXTRAL, par, jnp.array([8.0, 4.0, 4.0]), 1,
                                   phase="decode", kv_len=3072, gemm=flop_gemm)


def test_mixtral_serving_with_ep_or_tp(mixtral_decode):
    par, r = mixtral_decode
    a2a = np.asarray(r["moe_alltoall"])
    assert a2a[0] == 0.0 and a2a[1] > 0.0 and np.isfinite(a2a[2]) and a2a[2] > 0.0
    assert (np.asarray(r["moe_router"])[:2] > 0).all()
    # TP 8: 8 tokens, top-2 of 8 experts; W2 of every active expert, [m × d_ff/8]×[d_ff/8 × d]
    p = 1 - 0.75 ** 8
    d, dff = 4096.0, 14336.0 / 8
    w2 = 8 * p * 2 * (2 * 8 / (8 * p)) * dff * d      # experts × 2·m·k·n, one grouped kernel
    # plus the (g − 1)·m·d outputs the K-concatenated stand-in does not write, 2 B each
    out = (8 * p - 1) * (2 * 8 / (8 * p)) * d * 2 / (NODE.device.mem_bw * bw_eff(NODE.device))
    assert np.asarray(r["w2"])[0] == pytest.approx(w2 / RATE + out, rel=1e-9)
    # EP 2: 4 tokens per replica, 8 in the EP group, 4 local experts, d_ff/4 per TP rank
    p2 = 1 - 0.75 ** 8
    w2_ep = 4 * p2 * 2 * (2 * 8 / (8 * p2)) * (14336.0 / 4) * d
    out_ep = (4 * p2 - 1) * (2 * 8 / (8 * p2)) * d * 2 / (NODE.device.mem_bw
                                                        * bw_eff(NODE.device))
    assert np.asarray(r["w2"])[1] == pytest.approx(w2_ep / RATE + out_ep, rel=1e-9)
    for v in r.values():
        assert not np.isnan(np.asarray(v)).any()
    # weights per device: 8 experts / TP 8 vs 4 experts / TP 4 (same expert share per device)
    mem = jm.inference_memory(MIXTRAL, par, 8.0, 512.0, 64.0)["weights"]
    assert float(mem[1]) > float(mem[0])
    # EP 8 over DP 2 × TP 4: each TP rank dispatches 4/4 = 1 token, 8 in the EP group, one
    # local expert of full width d_ff (expert TP = 4·2/8 = 1)
    w2_f = p2 * 2 * (2 * 8 / (8 * p2)) * 14336.0 * d
    assert np.asarray(r["w2"])[2] == pytest.approx(w2_f / RATE, rel=1e-9)
    # same expert weights per device as TP 8 (all 8 experts / 8 devices)
    assert float(moe.expert_params_per_device(MIXTRAL, jm.Parallelism(dp=2, tp=4, ep=8))) == (
        pytest.approx(float(moe.expert_params_per_device(MIXTRAL, jm.Parallelism(tp=8)))))
    with pytest.raises(ValueError, match="experts_not_divisible"):    # ep/dp = 4 ∤ tp = 2
        jm.inference(NODE, MIXTRAL, jm.Parallelism(dp=2, tp=2, pp=2, ep=8), 8, 512, 64,
                     gemm=flop_gemm)


def test_expert_tp_hand_values():
    from jaxmodel.workload.params import expert_tp
    par = jm.Parallelism(dp=jnp.array([4., 1., 2., 1.]), tp=jnp.array([2., 8., 4., 8.]),
                         ep=jnp.array([4., 8., 8., 1.]))
    etp, ept = expert_tp(par)
    assert np.asarray(etp).tolist() == [2.0, 1.0, 1.0, 8.0]
    assert np.asarray(ept).tolist() == [1.0, 8.0, 4.0, 1.0]


def test_gradient_of_alltoall_is_finite_and_matches_finite_differences():
    par = jm.Parallelism(dp=4, tp=2, ep=4)

    def f(bw, ep):
        lvl = dataclasses.replace(NODE.levels[0], bw_per_device=bw)
        sys_ = dataclasses.replace(NODE, levels=(lvl,) + tuple(NODE.levels[1:]))
        return moe.alltoall_time(sys_, MIXTRAL, dataclasses.replace(par, ep=ep), 4096.0)

    bw = 300e9
    g = float(jax.grad(f)(bw, 4.0))
    h = 1e-4 * bw
    fd = float((f(bw + h, 4.0) - f(bw - h, 4.0)) / (2 * h))
    assert g < 0 and g == pytest.approx(fd, rel=1e-5)
    assert float(jax.grad(f)(bw, 1.0)) == 0.0           # no all-to-all, zero gradient


# --------------------------------------------------------------------------------------------
# grouped expert GEMM (one kernel per projection) and the expected number of active experts
# --------------------------------------------------------------------------------------------
LAUNCH, PEAK, BW = 5e-6, 1e12, 1e9


def roof_gemm(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    """A launch plus the roofline of one kernel: its FLOPs and operand bytes."""
    return LAUNCH + jnp.maximum(2.0 * m * n * k / PEAK,
                                (m * k + k * n + m * n) * dtype_bytes / BW)


def test_grouped_gemm_by_hand():
    # 3 experts × [2 × 8]×[8 × 4]: one launch, weights 3·8·4 and inputs 3·2·8 read once
    rows = {"w1": moe.grouped_gemm(3.0, 2.0, 4.0, 8.0)}
    t = float(wl.evaluate(roof_gemm, NODE.device, rows, {})["w1"][0])
    want = LAUNCH + max(2 * 2 * 4 * 24 / PEAK, (2 * 24 + 24 * 4 + 2 * 4) * 2 / BW)
    assert t == pytest.approx(want, rel=1e-12)
    loop = {"w1": moe.grouped_gemm(3.0, 2.0, 4.0, 8.0, grouped=False)}
    t_loop = float(wl.evaluate(roof_gemm, NODE.device, loop, {})["w1"][0])
    assert t_loop == pytest.approx(3 * (LAUNCH + (2 * 8 + 8 * 4 + 2 * 4) * 2 / BW), rel=1e-12)
    # the 2 more [2 × 4] outputs of the grouped kernel, streamed at the GEMM bandwidth
    dev = NODE.device
    assert float(moe.grouped_extra_output(dev, 3.0, 2.0, 4.0, 2.0)) == pytest.approx(
        2 * 2 * 4 * 2 / (float(dev.mem_bw) * bw_eff(dev)), rel=1e-12)
    assert float(moe.grouped_extra_output(dev, 0.5, 2.0, 4.0, 2.0)) == 0.0


def test_serving_rows_grouped_one_launch_training_loop():
    m = gpt_moe()
    par = jm.Parallelism(tp=2)
    sh = wl.shard(m, par)
    dev = NODE.device

    def launches(d, m_, n, k, batch=1.0, dtype_bytes=2.0):
        return jnp.ones_like(m_)          # 1 s per kernel: counts the launches

    T = 64.0                              # every one of the 8 experts active
    g, v = moe.ffn_rows(dev, m, par, sh, T, dispatch=moe.ExpertDispatch(dropless=True))
    gl, vl = moe.ffn_rows(dev, m, par, sh, T,
                          dispatch=moe.ExpertDispatch(dropless=True, grouped=False))
    n_exp = float(moe.moe_dims(m, par, T, dropless=True)["experts"])
    assert n_exp == pytest.approx(8.0)
    rg = wl.evaluate(launches, dev, g, {})
    rl = wl.evaluate(launches, dev, gl, {})
    # dense share 1/2 (one kernel) + MoE share 1/2: one grouped kernel vs one per expert
    assert float(rg["w1"][0]) == pytest.approx(0.5 + 0.5 * 1.0)
    assert float(rl["w1"][0]) == pytest.approx(0.5 + 0.5 * n_exp)
    # the same FLOPs either way
    fg = wl.evaluate(flop_gemm, dev, g, {})
    fl = wl.evaluate(flop_gemm, dev, gl, {})
    assert float(fg["w2"][0]) == pytest.approx(float(fl["w2"][0]), rel=1e-12)
    # training (capacity) keeps the per-expert loop of DeepSpeed-MoE unless asked
    gt, _ = moe.ffn_rows(dev, m, par, sh, T, backward=True)
    assert float(wl.evaluate(launches, dev, gt, {})["w1"][0]) == pytest.approx(0.5 + 0.5 * 8)


def test_grouped_decode_is_bounded_by_the_expert_weight_stream():
    # DeepSeek-V3-like decode layer on an H200: 256 experts of 2048, top-8, 32 tokens, TP 8
    dev = hw_db.system("dgx_h200").device
    E, k, T = 256.0, 8.0, 32.0
    g = E * (1 - (1 - k / E) ** T)                    # ≈ 160 active experts
    m, n, kk = k * T / g, 2 * 2048 / 8, 7168.0
    t = float(wl.evaluate(wl.default_gemm, dev, {"w1": moe.grouped_gemm(g, m, n, kk)},
                          {})["w1"][0])
    t_loop = float(wl.evaluate(wl.default_gemm, dev,
                               {"w1": moe.grouped_gemm(g, m, n, kk, grouped=False)},
                               {})["w1"][0])
    weights = g * kk * n * 2.0
    assert t >= weights / float(dev.mem_bw)           # memory roofline of the active experts
    assert t >= 2 * g * m * n * kk / float(dev.peak_matrix_flops)
    assert t < 0.2 * t_loop                           # one launch instead of ~160


def test_expected_active_experts_matches_monte_carlo():
    rng = np.random.default_rng(0)
    E, k, trials = 16, 4, 4000
    m = gpt_moe(n_experts=E, top_k=k)
    for T in (1, 3, 10, 20):
        # each token picks k distinct experts uniformly (top-k of i.i.d. scores)
        picks = np.argsort(rng.random((trials, T, E)), axis=-1)[..., :k]
        hit = np.zeros((trials, E), bool)
        np.put_along_axis(hit, picks.reshape(trials, T * k), True, axis=1)
        mc = hit.sum(1)
        got = float(moe.moe_dims(m, jm.Parallelism(), float(T), dropless=True)["experts"])
        assert got == pytest.approx(E * (1 - (1 - k / E) ** T), rel=1e-12)
        assert abs(got - mc.mean()) < 4 * mc.std() / np.sqrt(trials) + 1e-3, T


def _grouped_ffn_time(tokens, gemm=roof_gemm):
    m = gpt_moe(moe_every=1)                       # every layer MoE: f = 1
    par = jm.Parallelism(tp=2)
    dev = NODE.device
    g, v = moe.ffn_rows(dev, m, par, wl.shard(m, par), tokens,
                        dispatch=moe.ExpertDispatch(dropless=True))
    r = wl.evaluate(gemm, dev, g, v)
    return r["w1"][0] + r["w2"][0]


def test_grouped_vmap_jit_grad_and_zero_tokens():
    T = jnp.array([0.0, 1.0, 7.0, 64.0, 512.0])
    loop = np.array([float(_grouped_ffn_time(t)) for t in T])
    vm = np.asarray(jax.vmap(_grouped_ffn_time)(T))
    np.testing.assert_allclose(vm, loop, rtol=1e-12)
    jit = np.asarray(jax.jit(jax.vmap(_grouped_ffn_time))(T))
    np.testing.assert_allclose(jit, loop, rtol=1e-12)
    assert np.isfinite(loop).all() and (np.diff(loop) > 0).all()
    assert loop[0] == 0.0       # no tokens: no active expert, no kernel, exactly 0 (no NaN)
    g = jax.grad(_grouped_ffn_time)
    assert all(np.isfinite(float(g(t))) for t in (0.0, 7.0))
    # float64 finite differences on the smooth FLOP stand-in (+ the extra outputs)
    f = lambda t: _grouped_ffn_time(t, flop_gemm)            # noqa: E731
    h = 1e-4
    assert float(jax.grad(f)(7.0)) == pytest.approx(
        float((f(7.0 + h) - f(7.0 - h)) / (2 * h)), rel=1e-6)


def test_grouped_float32(float32):
    T = jnp.array([0.0, 7.0, 512.0], dtype=jnp.float32)
    t32 = np.asarray(jax.jit(jax.vmap(_grouped_ffn_time))(T))
    assert t32.dtype == np.float32 and np.isfinite(t32).all()
    jax.config.update("jax_enable_x64", True)
    t64 = np.asarray(jax.vmap(_grouped_ffn_time)(jnp.asarray(T, jnp.float64)))
    jax.config.update("jax_enable_x64", False)
    np.testing.assert_allclose(t32, t64, rtol=1e-5)


def test_node_limited_alltoall_by_hand():
    """DeepSeek-V3 §3.2.2 on a DGX H800 cluster: 4,096 tokens, d 7168, k 8, at most 4 of 8
    nodes; FP8 dispatch, BF16 combine."""
    from jaxmodel.workload.moe import node_limited_alltoall
    system = hw_db.system("dgx_h800", nodes=8)
    nvl, ib = system.levels
    T, d = 4096.0, 7168.0
    remote = 4.0 * (1.0 - 1.0 / 8.0)                       # 3.5 copies over InfiniBand
    local = 8.0 * (1.0 - 1.0 / 8.0)                        # 7 copies over NVLink
    want = 0.0
    for w in (1.0, 2.0):
        want += max(T * remote * d * w / (float(ib.bw_per_device) * float(ib.efficiency)),
                    T * local * d * w / (float(nvl.bw_per_device) * float(nvl.efficiency)))
    got = float(node_limited_alltoall(system, T, d, 8.0, 4.0, 8.0))
    assert got == pytest.approx(want, rel=1e-5)
    # InfiniBand bound here: 3.5·4096·7168·3 B over 50 GB/s · 0.9 ≈ 6.85 ms
    assert got == pytest.approx(3.5 * T * d * 3.0 / (50e9 * 0.9), rel=1e-5)
    # one node: nothing crosses InfiniBand
    one = float(node_limited_alltoall(system, T, d, 8.0, 4.0, 1.0))
    assert one == pytest.approx(T * 7.0 * d * 3.0 / (float(nvl.bw_per_device)
                                                     * float(nvl.efficiency)), rel=1e-5)


def test_node_limit_by_hand():
    """DeepSeek-V3 §2.1.2: 8 groups, at most 4 per token; the EP group on 8 nodes → 4 nodes,
    on 2 nodes → 2 (never more than the group spans), on 64 nodes (each group 8 nodes) →
    min(4·8, 64, k = 8) = 8 (never more than the routed experts)."""
    ds = hw_db.model("deepseek-v3")
    assert (float(ds.n_group), float(ds.topk_group)) == (8.0, 4.0)
    assert [float(moe.node_limit(ds, n)) for n in (8.0, 2.0, 64.0)] == [4.0, 2.0, 8.0]


@pytest.mark.slow
def test_node_limited_dispatch_replaces_the_capacity_alltoall():
    """The EP group over 2 nodes of a DGX H800 pair (ep 8 at stride 2): the layer's
    all-to-all is :func:`node_limited_alltoall`'s, FP8 dispatch forward, BF16 backward;
    without ``topk_group`` it is the capacity all-to-all."""
    system = hw_db.system("dgx_h800", nodes=2)
    tiny = jm.Model(n_layers=2, d_model=256, n_heads=4, n_kv_heads=4, head_dim=64, d_ff=512,
                    vocab_size=1024, activation="swiglu", n_experts=8.0, top_k=2.0,
                    n_group=4.0, topk_group=2.0)
    par = jm.Parallelism(dp=8, pp=2, ep=8)
    T = 1024.0
    fwd, bwd = moe.alltoall_times(system, tiny, par, T, 2.0, dispatch_bytes=1.0)
    # 8 members 2 apart span 2 nodes; M = min(2·max(2/4, 1), 2, 2) = 2
    want_f = float(moe.node_limited_alltoall(system, T, 256.0, 2.0, 2.0, 2.0, 1.0, 2.0))
    want_b = float(moe.node_limited_alltoall(system, T, 256.0, 2.0, 2.0, 2.0, 2.0, 2.0))
    assert float(fwd) == pytest.approx(want_f, rel=1e-6)
    assert float(bwd) == pytest.approx(want_b, rel=1e-6) and want_b > want_f
    free = dataclasses.replace(tiny, topk_group=0.0)
    f0, b0 = moe.alltoall_times(system, free, par, T, 2.0, dispatch_bytes=1.0)
    assert float(f0) == pytest.approx(float(moe.alltoall_time(system, free, par, T, 2.0)))
    assert float(f0) == float(b0) != pytest.approx(want_f)


def test_dualpipe_overlap_and_bubble_by_hand():
    from jaxmodel.parallel.pipeline import dualpipe_bubble
    from jaxmodel.workload.moe import dualpipe_overlap
    slowed, exposed = dualpipe_overlap(0.030, 0.016, 132.0, 20.0)
    assert float(slowed) == pytest.approx(0.030 * 132.0 / 112.0)
    assert float(exposed) == 0.0
    slowed, exposed = dualpipe_overlap(0.010, 0.016, 132.0, 20.0)
    assert float(exposed) == pytest.approx(0.016 - 0.010 * 132.0 / 112.0)
    # Table 2: (p/2 − 1)(F&B + B − 3W); p = 16, F&B = 3, B = W = 1 -> 7 · 1
    assert float(dualpipe_bubble(16.0, 3.0, 1.0, 1.0)) == pytest.approx(7.0)
    g = jax.grad(lambda c: dualpipe_overlap(c, 0.016, 132.0, 20.0)[1])(0.01)
    assert np.isfinite(float(g))


def test_norm_upproj_activation_bytes_by_hand():
    """DeepSeek-V3's average layer, 4,096 tokens, no TP: per token 2·7168·2 (layer input and
    residual) + (1536 + 512 + 64)·2 (MLA latents) + 128·128·1.5 (E5M6 attention output) +
    128·4 (log-sum-exp) = 57,984 B; an MoE layer (58 of 61) adds 256·4 (router) + 9·(7168 +
    2·2048) (FP8 inputs of 8 routed + 1 shared expert and their SwiGLU inputs) = 102,400 B,
    a dense one (3 of 61) 7168 + 2·18432 = 44,032 B (FP8 input and SwiGLU input)."""
    from jaxmodel.workload.moe import norm_upproj_activation_bytes
    ds = hw_db.model("deepseek-v3")
    attn = 28672 + 4224 + 24576 + 512
    moe, dense = 1024 + 9 * (7168 + 4096), 7168 + 2 * 18432
    assert (attn, moe, dense) == (57984, 102400, 44032)
    per_token = attn + 58 / 61 * moe + 3 / 61 * dense
    got = float(norm_upproj_activation_bytes(ds, 4096.0))
    assert got == pytest.approx(4096.0 * per_token, rel=1e-6)


@pytest.mark.slow
def test_deepseek_v3_serves_with_experts_over_the_tp_ranks():
    """DeepSeek-V3 on one 8×H200 node, attention TP 8 × EP 8 (vLLM --enable-expert-parallel):
    feasible, the same expert weights per device as TP 8 alone, a TPOT within 10 % of it."""
    m, s = hw_db.model("deepseek-v3"), hw_db.system("dgx_h200")
    par = jm.Parallelism(tp=jnp.array([8.0, 8.0]), ep=jnp.array([1.0, 8.0]),
                         flash_attention=True)
    r = jm.inference(s, m, par, 32, 4096, 1024, precision="fp8")
    assert np.asarray(r.feasible).all()
    w = np.asarray(r.breakdown["memory.weights"])
    assert w[1] == pytest.approx(w[0], rel=1e-6)
    tpot = np.asarray(r.tpot_s)
    assert np.isfinite(tpot).all() and tpot[1] == pytest.approx(tpot[0], rel=0.1)
