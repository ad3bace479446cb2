"""MoE and FlashAttention in the training step: all-to-all in forward, backward and full
recomputation; expert gradients reduced over DP_exp = dp/ep only; expert divisibility
(error / reason code); no NaN; FlashAttention speeds the step up and has nothing to recompute
selectively.

One batched ``train_step`` call (``batch`` fixture) serves every check; the GEMM hook is the
roofline so the compiled graph stays small (the composition under test does not depend on it).
Compiling the training step still costs about a minute of CPU, so the tests that need it are
marked ``slow`` (``make test-all``); the plan checks run without compiling.
"""

import dataclasses

import jax
import numpy as np
import pytest

import jaxmodel as jm  # noqa: I001
import hw_db
from jaxmodel import ops
from jaxmodel.workload import moe

SYSTEM = hw_db.system("dgx_a100", nodes=2)        # 16 devices, NVSwitch + InfiniBand
B, S = 64.0, 512.0


def roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return ops.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


def moe_model(experts=8.0):
    return jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0,
                    head_dim=64.0, d_ff=4096.0, vocab_size=32000.0, activation="gelu",
                    n_experts=experts, top_k=2.0, moe_every=2.0, capacity_factor=1.0,
                    tied_embeddings=1.0)


# name: dp, tp, pp, ep, recompute, zero, flash_attention
PLANS = {
    "ep1": (16, 1, 1, 1, 0, 0, 0),
    "ep8": (16, 1, 1, 8, 0, 0, 0),
    "ep8_full": (16, 1, 1, 8, 2, 0, 0),
    "ep8_fa": (16, 1, 1, 8, 0, 0, 1),
    "ep8_fa_sel": (16, 1, 1, 8, 1, 0, 1),
    "ep8_sel": (16, 1, 1, 8, 1, 0, 0),
    "tp2_ep4": (8, 2, 1, 4, 0, 0, 0),
    "tp2_ep2_zero1": (8, 2, 1, 2, 0, 1, 0),
    "ep16_bad": (16, 1, 1, 16, 0, 0, 0),            # 16 does not divide 8 experts
}
NAMES = list(PLANS)


@pytest.fixture(scope="module")
def batch():
    cols = np.asarray([PLANS[n] for n in NAMES], dtype=float).T
    par = jm.Parallelism(dp=cols[0], tp=cols[1], pp=cols[2], ep=cols[3], recompute=cols[4],
                         zero=cols[5], flash_attention=cols[6], micro_batch=1.0)
    res = jm.train_step(SYSTEM, moe_model(), par, B, S, gemm=roofline, dp_overlap=0.0)
    return {n: jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i], res)
            for i, n in enumerate(NAMES)}


def _par(name):
    dp, tp, pp, ep, rc, z, fa = PLANS[name]
    return jm.Parallelism(dp=dp, tp=tp, pp=pp, ep=ep, recompute=rc, zero=z,
                          flash_attention=fa, micro_batch=1.0)


@pytest.mark.slow
def test_no_nan_and_the_indivisible_plan_is_flagged(batch):
    for n in NAMES:
        for x in jax.tree_util.tree_leaves(batch[n]):
            assert not np.isnan(x).any(), n
    bad = batch["ep16_bad"]
    assert not bad.feasible and jm.reason_name(bad.reason) == "experts_not_divisible"
    assert np.isinf(bad.step_time_s)
    for n in NAMES[:-1]:
        assert batch[n].feasible, (n, jm.reason_name(batch[n].reason))


def test_single_indivisible_plan_raises():
    with pytest.raises(ValueError, match="ep=16"):
        jm.train_step(SYSTEM, moe_model(), _par("ep16_bad"), B, S, gemm=roofline)
    with pytest.raises(ValueError, match="ep=3"):
        jm.train_step(SYSTEM, moe_model(6.0), dataclasses.replace(_par("ep8"), ep=3.0), B, S,
                      gemm=roofline)


@pytest.mark.slow
def test_alltoall_forward_backward_and_recompute(batch):
    m = B / 16.0                                   # micro-batches per step
    a2a = float(moe.alltoall_time(SYSTEM, moe_model(), _par("ep8"), S))   # one layer, fwd
    layers = 8.0
    assert batch["ep1"].breakdown["ep_comm"] == 0.0
    # dispatch + combine forward and backward, every layer (share-weighted) and micro-batch
    assert batch["ep8"].breakdown["ep_comm"] == pytest.approx(2 * m * layers * a2a, rel=1e-9)
    assert a2a > 0
    # full recomputation repeats the forward all-to-all
    lt = jm.training_layer_times.single(SYSTEM, moe_model(), _par("ep8_full"), 1.0, S,
                                        gemm=roofline)            # eager, tp = 1: no TP comm
    assert float(lt["ep_comm_fwd"]) == pytest.approx(a2a, rel=1e-12)
    assert float(lt["recompute"]) == pytest.approx(float(lt["fwd"]) + a2a, rel=1e-12)
    # the step's recomputation holds it for every layer and micro-batch (plus any kernels
    # the step adds outside the layer model)
    assert batch["ep8_full"].breakdown["recompute"] >= m * layers * float(lt["recompute"]) * (
        1 - 1e-9)
    # the steps sum their breakdowns (ep_comm included)
    for n in NAMES[:-1]:
        r = batch[n]
        assert r.step_time_s == pytest.approx(sum(r.breakdown.values()), rel=1e-9), n


@pytest.mark.slow
def test_expert_gradients_reduced_over_dp_exp_only(batch):
    model = moe_model()
    for name, dp, tp, ep in (("ep8", 16, 1, 8), ("tp2_ep4", 8, 2, 4)):
        par = _par(name)
        n_par = float(jm.params_per_device(model, par))
        n_exp = float(moe.expert_params_per_device(model, par))
        dense = jm.collective_latency(SYSTEM, "all_reduce", 4.0 * (n_par - n_exp), dp,
                                      stride=tp)
        dpe = dp // ep
        expert = (jm.collective_latency(SYSTEM, "all_reduce", 4.0 * n_exp, dpe,
                                        stride=tp * ep) if dpe > 1 else 0.0)
        # ZeRO-0, no overlap: the all-reduces after the last backward are fully exposed
        assert batch[name].breakdown["dp_comm"] == pytest.approx(
            float(dense) + float(expert), rel=1e-9), name
    # expert optimizer states sharded over dp/ep = 4 (ZeRO-1), the rest over dp = 8
    par = _par("tp2_ep2_zero1")
    n_par = float(jm.params_per_device(model, par))
    n_exp = float(moe.expert_params_per_device(model, par))
    assert batch["tp2_ep2_zero1"].memory["optimizer"] == pytest.approx(
        12.0 * ((n_par - n_exp) / 8 + n_exp / 4), rel=1e-9)


@pytest.mark.slow
def test_flash_attention_in_training(batch):
    std, fa = batch["ep8"], batch["ep8_fa"]
    assert fa.step_time_s < std.step_time_s
    assert fa.breakdown["compute"] < std.breakdown["compute"]
    assert fa.memory["activations"] < std.memory["activations"]    # no s×s scores stored
    # selective recomputation: the attention core without FA, nothing with FA
    assert batch["ep8_sel"].breakdown["recompute"] > 0.0
    assert batch["ep8_fa_sel"].breakdown["recompute"] == 0.0
    # the MoE all-to-all does not depend on the attention kernel
    assert fa.breakdown["ep_comm"] == pytest.approx(std.breakdown["ep_comm"], rel=1e-12)
