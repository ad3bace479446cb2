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
    assert [jm.reason_name(c) for c in np.asarray(why)] == ["ok", "experts_not_divisible",
                                                             "experts_not_divisible"]


@pytest.fixture(scope="module")
def mixtral_decode():
    """One Mixtral-8x7B decode step (8 sequences, 3072 cached tokens) on 8 A100: TP 8 (every
    device holds a slice of all experts) vs DP 2 × TP 4 with EP 2 (each replica holds 4
    experts) vs an infeasible EP 8; one batched call."""
    par = jm.Parallelism(dp=jnp.array([1.0, 2.0, 2.0]), tp=jnp.array([8.0, 4.0, 4.0]),
                         ep=jnp.array([1.0, 2.0, 8.0]))
    return par, jm.layer_breakdown(NODE, MIXTRAL, par, jnp.array([8.0, 4.0, 4.0]), 1,
                                   phase="decode", kv_len=3072, gemm=flop_gemm)


def test_mixtral_serving_with_ep_or_tp(mixtral_decode):
    par, r = mixtral_decode
    a2a = np.asarray(r["moe_alltoall"])
    assert a2a[0] == 0.0 and a2a[1] > 0.0 and np.isinf(a2a[2])
    assert (np.asarray(r["moe_router"])[:2] > 0).all()
    # TP 8: 8 tokens, top-2 of 8 experts; W2 of every active expert, [m × d_ff/8]×[d_ff/8 × d]
    p = 1 - 0.75 ** 8
    d, dff = 4096.0, 14336.0 / 8
    w2 = 8 * p * 2 * (2 * 8 / (8 * p)) * dff * d      # experts × 2·m·k·n
    assert np.asarray(r["w2"])[0] * RATE == pytest.approx(w2, rel=1e-9)
    # EP 2: 4 tokens per replica, 8 in the EP group, 4 local experts, d_ff/4 per TP rank
    p2 = 1 - 0.75 ** 8
    w2_ep = 4 * p2 * 2 * (2 * 8 / (8 * p2)) * (14336.0 / 4) * d
    assert np.asarray(r["w2"])[1] * RATE == pytest.approx(w2_ep, rel=1e-9)
    for v in r.values():
        assert not np.isnan(np.asarray(v)).any()
    # weights per device: 8 experts / TP 8 vs 4 experts / TP 4 (same expert share per device)
    mem = jm.inference_memory(MIXTRAL, par, 8.0, 512.0, 64.0)["weights"]
    assert float(mem[1]) > float(mem[0])
    with pytest.raises(ValueError, match="experts_not_divisible"):
        jm.inference(NODE, MIXTRAL, jm.Parallelism(dp=2, tp=4, ep=8), 8, 512, 64,
                     gemm=flop_gemm)


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
