"""train_step under context parallelism (``Parallelism.cp``): cp = 1 is the plain layer,
stored activations ÷ cp, model states sharded over dp·cp, the s/cp stage-boundary transfer
by hand, the devices rule, and (slow) Llama-3-70B long-context plans on H100 systems.

One batch of plans is evaluated once (``batch`` fixture); the GEMM hook is the roofline.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: I001
import hw_db
from jaxmodel import comm
from jaxmodel.parallel import context as cx
from jaxmodel.parallel import pipeline as pl
from jaxmodel.parallel import train as tr
from jaxmodel.workload import layer as _layer
from jaxmodel.workload import memory as wmemory

B, S = 32.0, 512.0
MODEL = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=32000.0, activation="gelu", tied_embeddings=1.0)
TWO_TIER = hw_db.system("dgx_a100", nodes=2)
ONE_TIER = dataclasses.replace(
    TWO_TIER, levels=(dataclasses.replace(TWO_TIER.levels[0], size=16.0),))
FIELDS = ("dp", "tp", "pp", "cp", "sp", "micro_batch", "schedule", "recompute", "zero",
          "flash_attention")
PLANS = {
    "cp1": (4, 2, 2, 1, 1, 1, 1, 0, 1, 1),
    "cp4": (1, 2, 2, 4, 1, 1, 1, 0, 1, 1),
    "cp2_full": (2, 2, 2, 2, 1, 1, 1, 2, 1, 1),
    "bad_seq": (1, 2, 1, 8, 1, 1, 1, 0, 1, 1),      # 2·cp = 16 ∤ S/… (tp·cp = 16 devices)
}
NAMES = list(PLANS)


def roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return jm.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


def plan(name):
    return jm.Parallelism(**dict(zip(FIELDS, (float(x) for x in PLANS[name]))))


def coll(op, nbytes, group, stride=1):
    return float(comm.collective_latency(ONE_TIER, op, nbytes, group, stride=stride))


@pytest.fixture(scope="module")
def batch():
    cols = np.asarray([PLANS[n] for n in NAMES], dtype=np.float64).T
    par = jm.Parallelism(**{f: jnp.asarray(c) for f, c in zip(FIELDS, cols)})
    seq = jnp.asarray([S, S, S, 520.0])             # 520 = 8·65: not 16 chunks
    res = jm.train_step(ONE_TIER, MODEL, par, B, seq, gemm=roofline)
    jax.block_until_ready(res)
    return {n: jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i], res)
            for i, n in enumerate(NAMES)}


def test_feasibility_and_devices(batch):
    for n in ("cp1", "cp4", "cp2_full"):
        assert bool(batch[n].feasible), (n, jm.reason_name(int(batch[n].reason)))
        total = sum(float(batch[n].breakdown[k]) for k in tr.BREAKDOWN_KEYS)
        assert total == pytest.approx(float(batch[n].step_time_s), rel=1e-9)
    assert jm.reason_name(int(batch["bad_seq"].reason)) == "sequence_not_divisible"
    assert float(plan("cp4").n_devices) == 16.0
    with pytest.raises(ValueError, match="dp·tp·pp·cp = 2·2·2·4 = 32"):
        jm.train_step(ONE_TIER, MODEL, jm.Parallelism(dp=2, tp=2, pp=2, cp=4), B, S)
    with pytest.raises(ValueError, match="must split into 2·cp"):
        jm.train_step(ONE_TIER, MODEL, jm.Parallelism(dp=1, tp=2, pp=1, cp=8), B, 520.0)


def test_cp_memory_divided_by_cp(batch):
    """Activations (FlashAttention: every term linear in s) ÷ cp plus the ring's two KV
    chunks in flight; model states sharded over dp·cp (ZeRO-1: equal at dp·cp = 4)."""
    a, c = batch["cp1"].memory, batch["cp4"].memory
    layers = 4.0                  # 1F1B, 2 stages: the first holds 2 micro-batches, the last 1
    kv = 2.0 * 1.0 * (S / 4) * (16.0 / 2) * 64.0 * 2.0   # K and V, s/cp tokens, heads/tp
    # the last stage also holds the loss's logits of its s/cp tokens (loss_logits_bytes);
    # x = one layer's activations at cp = 1, from whichever stage is the peak
    l1 = float(wmemory.loss_logits_bytes(MODEL, plan("cp1"), S))
    l4 = float(wmemory.loss_logits_bytes(MODEL, plan("cp4"), S / 4))
    act = float(a["activations"])
    x = act / (2 * layers) if act / (2 * layers) >= l1 / layers else (act - l1) / layers
    expect = max(2 * layers * x / 4 + 2 * layers * 2.0 * kv,
                 layers * x / 4 + layers * 2.0 * kv + l4)
    assert float(c["activations"]) == pytest.approx(expect, rel=1e-9)
    for k in ("weights", "gradients", "optimizer"):
        assert float(c[k]) == pytest.approx(float(a[k]), rel=1e-9)


def test_cp_stage_boundary_transfer_by_hand(batch):
    """pp_comm = m + 1 p2p (two 1F1B stages: one exchange per micro-batch plus the first
    hop) of b·(s/cp)·h·2/t bytes (SP: no re-gather) across the hop
    of the tp·cp·pp = 16-device pipeline (stride tp·cp = 8) + the tied-embedding gradient
    all-reduce between the first and the last stage."""
    r = batch["cp4"]
    m = B / 1.0
    act = 1.0 * (S / 4.0) * 1024.0 * 2.0 / 2.0
    send = coll("p2p", act, 2, stride=8)
    emb = coll("all_reduce", tr.CONSTANTS["main_grad_bytes"] * 32000.0 * 1024.0 / 2, 2, 8)
    n = float(pl.p2p_transfers_on_critical_path(1.0, 2.0, m, 1.0))
    assert n == m + 1.0
    assert float(r.breakdown["pp_comm"]) == pytest.approx(n * send + emb, rel=1e-6)


def test_cp1_equals_the_plain_layer_and_cp_layer_composes():
    """cp = 1: the stage times are the workload's training layer (Korthikanti et al. 2023;
    :func:`jaxmodel.workload.layer.training_layer_times`) — the same as before context
    parallelism; cp = 4: the context module's layer on s/cp tokens."""
    sys_t = dataclasses.replace(ONE_TIER, device=tr.sustained_device(ONE_TIER.device))
    for name, cp in (("cp1", 1.0), ("cp4", 4.0)):
        par = plan(name)
        st = tr.stage_times_single(sys_t, MODEL, par, tr.TrainOptions(None, S),
                                   statics=tr.TrainStatics(gemm=roofline))
        if cp == 1.0:
            ref = _layer.training_layer_times.single(sys_t, MODEL, par, 1.0, S, gemm=roofline)
        else:
            ref = cx.cp_layer_times(sys_t, MODEL, par, 1.0, S, cp, gemm=roofline)
        for k in ("fwd", "bwd", "recompute", "tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd"):
            assert float(st[k]) == pytest.approx(float(ref[k]), rel=1e-6, abs=1e-15), (name, k)
    # cp = 4 runs the token-wise work on a quarter of the tokens: faster than cp = 1
    opts, roof = tr.TrainOptions(None, S), tr.TrainStatics(gemm=roofline)
    one = tr.stage_times_single(sys_t, MODEL, plan("cp1"), opts, statics=roof)
    four = tr.stage_times_single(sys_t, MODEL, plan("cp4"), opts, statics=roof)
    assert float(four["tp_comm_fwd"]) < float(one["tp_comm_fwd"])
    assert float(four["embed_fwd"]) < float(one["embed_fwd"])


@pytest.mark.slow
@pytest.mark.parametrize("seq, nodes", [(8192, 8), (32768, 16), (131072, 64)])
def test_llama3_70b_long_context_plans_are_feasible_on_h100(seq, nodes):
    """Llama-3-70B at 8k, 32k and 128k tokens on 64–512 H100 (DGX H100): the search, with
    context parallelism enumerated, finds feasible plans; at 128k the fastest splits the
    sequence (cp > 1: the attention's s² work does not shrink with pipeline stages)."""
    system = hw_db.system("dgx_h100", nodes=nodes)
    model = hw_db.model("llama3-70b")
    n = nodes * 8
    df = jm.search_parallelism(system, model, n, n // 8, seq, progress=False,
                               schedules=("1f1b",), recompute=("full",), zero=(1,),
                               sp=(True,), flash_attention=(True,), micro_batches=(1,),
                               max_tp=8)
    ok = df[np.isfinite(df.step_time_s)]
    assert len(ok) > 0
    best = ok.iloc[0]
    assert 0.0 < best.mfu < 1.0
    if seq == 131072:
        assert best.cp > 1
