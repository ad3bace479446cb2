"""train_step: composition, ZeRO sharding, schedules, inconsistent plans, batching, gradients.

Compiling a whole training step is the expensive part (the collective and layer models are
large graphs), so the fast tests evaluate ONE batch of plans once (``batch`` fixture) — plans,
memory capacities and the DP-overlap knob all vary along the batch axis — and read every check
from it. Single-configuration calls, eager evaluation, gradients and the tile-search path
compile again and are marked ``slow``. The GEMM hook is the roofline
(``ops.gemm_roofline``): the composition under test does not depend on the GEMM model.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: I001
import hw_db
from jaxmodel import comm, ops
from jaxmodel.numerics import reason_code
from jaxmodel.parallel import pipeline as pl
from jaxmodel.parallel import plan as pplan
from jaxmodel.parallel import train as tr
from jaxmodel.parallel.train_dp import blend
from jaxmodel.workload import layer as wl
from jaxmodel.workload import memory as wmemory
from jaxmodel.workload import params as wparams

B, S = 32.0, 512.0
CAP = 80e9


def roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return ops.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


MODEL = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=32000.0, activation="gelu", tied_embeddings=1.0)
ROOF = tr.TrainStatics(gemm=roofline)
LEGACY = tr.TrainOptions(None, S, dropout=1.0, megatron2021_stack=1.0)   # dropout=2
TWO_TIER = hw_db.system("dgx_a100", nodes=2)                    # 2 nodes of 8, InfiniBand
ONE_TIER = dataclasses.replace(                                  # one 16-device NVSwitch
    TWO_TIER, levels=(dataclasses.replace(TWO_TIER.levels[0], size=16.0),))

FIELDS = ("dp", "tp", "pp", "sp", "micro_batch", "interleave", "schedule", "recompute", "zero")
# name: plan fields, memory capacity, dp_overlap
PLANS = {
    "base": ((2, 2, 4, 0, 1, 1, 1, 0, 0), CAP, 1.0),
    "gpipe": ((2, 2, 4, 0, 1, 1, 0, 0, 0), CAP, 1.0),
    "inter2": ((2, 2, 4, 0, 1, 2, 2, 0, 0), CAP, 1.0),
    "z0": ((4, 2, 2, 1, 2, 1, 1, 1, 0), CAP, 1.0),
    "z1": ((4, 2, 2, 1, 2, 1, 1, 1, 1), CAP, 1.0),
    "z2": ((4, 2, 2, 1, 2, 1, 1, 1, 2), CAP, 1.0),
    "z3": ((4, 2, 2, 1, 2, 1, 1, 1, 3), CAP, 1.0),
    "full_rc": ((4, 2, 2, 1, 2, 1, 1, 2, 0), CAP, 1.0),
    "dp16": ((16, 1, 1, 0, 1, 1, 1, 0, 0), CAP, 1.0),
    "dp16_serial": ((16, 1, 1, 0, 1, 1, 1, 0, 0), CAP, 0.0),
    "tp8pp2": ((1, 8, 2, 1, 4, 1, 1, 1, 0), CAP, 1.0),
    "tp8pp2_ov": ((1, 8, 2, 1, 4, 1, 1, 1, 0), CAP, 1.0),     # + TP comm overlap
    "oom": ((16, 1, 1, 0, 1, 1, 1, 0, 0), 1e9, 1.0),
    # inconsistent plans
    "bad_devices": ((2, 2, 2, 0, 1, 1, 1, 0, 0), CAP, 1.0),
    "bad_layers": ((1, 1, 16, 0, 1, 1, 1, 0, 0), CAP, 1.0),
    "bad_batch": ((16, 1, 1, 0, 4, 1, 1, 0, 0), CAP, 1.0),     # 32 / (16·4)
    "bad_interleave": ((2, 2, 4, 0, 1, 2, 1, 0, 0), CAP, 1.0),  # v = 2 without the schedule
    "bad_inter_m": ((2, 2, 4, 0, 8, 2, 2, 0, 0), CAP, 1.0),     # m = 2 not a multiple of pp
    "bad_zero": ((2, 2, 4, 0, 1, 1, 1, 0, 5), CAP, 1.0),
}
EXPECTED = {"oom": "out_of_memory", "bad_devices": "devices_mismatch",
            "bad_layers": "layers_not_divisible", "bad_batch": "batch_not_divisible",
            "bad_interleave": "invalid_parallelism", "bad_inter_m": "batch_not_divisible",
            "bad_zero": "invalid_parallelism"}
NAMES = list(PLANS)
TP_OVERLAP = {"tp8pp2_ov": 1.0}


def plan(name, **over):
    p = dict(zip(FIELDS, (float(x) for x in PLANS[name][0])))
    p.update(over)
    return jm.Parallelism(**p)


@pytest.fixture(scope="module")
def batch():
    cols = np.asarray([PLANS[n][0] for n in NAMES], dtype=np.float64).T
    par = jm.Parallelism(**{f: jnp.asarray(c) for f, c in zip(FIELDS, cols)})
    cap = jnp.asarray([PLANS[n][1] for n in NAMES])
    system = dataclasses.replace(ONE_TIER, device=dataclasses.replace(ONE_TIER.device,
                                                                      mem_capacity=cap))
    overlap = jnp.asarray([PLANS[n][2] for n in NAMES])
    tp_ov = jnp.asarray([TP_OVERLAP.get(n, 0.0) for n in NAMES])
    # the de-duplicated path (stage times once per distinct stage input, then composed);
    # the slow tests compare it with single-configuration calls (the direct path)
    res = jm.train_step(system, MODEL, par, B, S, gemm=roofline, dp_overlap=overlap,
                        tp_overlap=tp_ov, dedup=True)
    jax.block_until_ready(res)
    return {n: jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i], res)
            for i, n in enumerate(NAMES)}


def coll(op, nbytes, group, stride=1, system=ONE_TIER):
    return float(comm.collective_latency(system, op, nbytes, group, stride=stride))


def test_no_nan_and_reasons(batch):
    for name, r in batch.items():
        for leaf in jax.tree_util.tree_leaves(r):
            assert not np.isnan(leaf).any(), name
        if name in EXPECTED:
            assert not r.feasible, name
            assert int(r.reason) == reason_code(EXPECTED[name]), (name, jm.reason_name(r.reason))
            assert np.isinf(r.step_time_s) and r.mfu == 0.0 and r.tokens_per_s == 0.0
        else:
            assert r.feasible, (name, jm.reason_name(r.reason))
            assert np.isfinite(r.step_time_s) and r.step_time_s > 0
            assert 0 < r.mfu < 1


def test_out_of_memory_reports_memory(batch):
    r = batch["oom"]
    assert 1e9 < float(r.memory_bytes) < np.inf
    assert float(r.memory_bytes) == pytest.approx(float(batch["dp16"].memory_bytes))


def test_breakdown_sums_to_step(batch):
    for name, r in batch.items():
        if r.feasible:
            total = sum(float(r.breakdown[k]) for k in tr.BREAKDOWN_KEYS)
            assert total == pytest.approx(float(r.step_time_s), rel=1e-9), name
            assert all(float(r.breakdown[k]) >= 0 for k in tr.BREAKDOWN_KEYS)


def test_throughput_and_mfu_definitions(batch):
    """MFU counts model FLOPs (PaLM); HFU adds the plan's recomputation: none (base),
    selective (z0: the attention scores, 4·s²·h per layer) or full (Megatron eq. 3)."""
    peak = float(ONE_TIER.device.peak_matrix_flops)
    model_flops = float(wparams.model_flops_per_token(MODEL, S)) * B * S
    eq3 = float(wparams.model_flops_per_token(MODEL, S, include_recompute=True)) * B * S
    selective = model_flops + 4.0 * S * 1024.0 * 8.0 * B * S
    for name, hw_flops in (("base", model_flops), ("z0", selective), ("full_rc", eq3)):
        r = batch[name]
        t = float(r.step_time_s)
        assert float(r.tokens_per_s) == pytest.approx(B * S / t)
        assert float(r.flops_per_step) == pytest.approx(model_flops)
        assert float(r.mfu) == pytest.approx(model_flops / (t * 16 * peak))
        assert float(r.achieved_flops_per_device) == pytest.approx(hw_flops / (t * 16))
        assert float(r.hfu) == pytest.approx(hw_flops / (t * 16 * peak))
    assert float(batch["base"].microbatches) == B / 2


def test_zero_memory_sharding(batch):
    """ZeRO-1 shards optimizer states, -2 also gradients, -3 also weights, over dp = 4
    (Rajbhandari et al. SC'20 §5; Zhao et al. VLDB 2023 §3.3 for the gathered units)."""
    m = {z: batch[f"z{z}"].memory for z in range(4)}
    dp = 4.0
    # the last of the 2 stages has the largest total: one micro-batch in flight (the first
    # holds two) but the loss's logits and their fp32 copy (memory.loss_logits_bytes); its
    # layers, the final layernorm and the (tied) output layer
    n_par = float(wparams.stage_params(MODEL, plan("z0"))[2])
    g = tr.CONSTANTS["main_grad_bytes"]
    assert float(m[0]["optimizer"]) == pytest.approx(12.0 * n_par)
    assert float(m[0]["gradients"]) == pytest.approx(g * n_par)
    assert float(m[0]["weights"]) == pytest.approx(2.0 * n_par)
    assert float(m[1]["optimizer"]) == pytest.approx(12.0 * n_par / dp)
    assert float(m[1]["gradients"]) == pytest.approx(g * n_par)
    assert float(m[2]["gradients"]) == pytest.approx(g * n_par / dp)
    assert float(m[2]["weights"]) == pytest.approx(2.0 * n_par)
    # ZeRO-3 as FSDP2 runs it: the fp32 shard is the master (no 16-bit shard), the units
    # (layers, 4 on this stage) alive unsharded — the computing one and the prefetched one —
    # and one unit's reduce-scatter input (g) beside its unsharded gradients (2 B)
    n_par = float(wparams.params_per_device(MODEL, plan("z0")))   # the most loaded stage
    unit = n_par / 4.0
    assert float(m[3]["weights"]) == pytest.approx(2.0 * 2.0 * unit)
    assert float(m[3]["gradients"]) == pytest.approx(g * (n_par / dp + unit) + 2.0 * unit)
    assert float(m[3]["optimizer"]) == pytest.approx(12.0 * n_par / dp)
    for z in range(4):
        assert float(m[z]["activations"]) == pytest.approx(float(m[0]["activations"]))
    totals = [float(m[z]["total"]) for z in range(3)]
    assert totals == sorted(totals, reverse=True)
    # ZeRO-3 gathers parameters every micro-batch: more exposed DP traffic than ZeRO-1
    assert float(batch["z3"].breakdown["dp_comm"]) >= float(batch["z1"].breakdown["dp_comm"])


def test_recompute_modes(batch):
    sel, full = batch["z0"], batch["full_rc"]
    assert 0 < float(sel.breakdown["recompute"]) < float(full.breakdown["recompute"])
    assert float(full.memory["activations"]) < float(sel.memory["activations"])
    assert float(batch["base"].breakdown["recompute"]) == 0.0


def test_schedules(batch):
    base, gpipe, inter = batch["base"], batch["gpipe"], batch["inter2"]
    # GPipe and 1F1B share the bubble (PTD-P §2.2.1); GPipe holds all m micro-batches on
    # every stage, so its last one (with the loss's logits) is the peak
    assert float(gpipe.step_time_s) == pytest.approx(float(base.step_time_s))
    m, p = B / 2, 4.0
    acts_1f1b = float(base.memory["activations"])
    logits = float(wmemory.loss_logits_bytes(MODEL, plan("gpipe"), S))
    assert float(gpipe.memory["activations"]) == pytest.approx(acts_1f1b * m / p + logits)
    # interleaving divides the bubble by v and holds p(1 + (p−1)/(p·v)) micro-batches on
    # every stage (pipeline.stage_in_flight), the last one with the loss's logits too
    assert float(inter.breakdown["bubble"]) == pytest.approx(
        float(base.breakdown["bubble"]) / 2.0)
    assert float(inter.memory["activations"]) == pytest.approx(
        acts_1f1b * (1 + (p - 1) / (p * 2)) + logits)
    # ... at the price of twice the steady-state stage transfers (the tied-embedding
    # gradient all-reduce is once per step in both)
    emb = coll("all_reduce", tr.CONSTANTS["main_grad_bytes"] * 32000.0 * 1024.0 / 2, 2, 2)
    n1 = float(pl.p2p_transfers_on_critical_path(1.0, p, m, 1.0))
    n2 = float(pl.p2p_transfers_on_critical_path(2.0, p, m, 2.0))
    assert float(inter.breakdown["pp_comm"]) - emb == pytest.approx(
        (float(base.breakdown["pp_comm"]) - emb) * n2 / n1)


def test_pipeline_communication_by_hand(batch):
    """pp_comm = n_transfers · (p2p of b·s·h·2/t + the scatter/gather all-gather over tp)
    + the tied-embedding gradient all-reduce between the first and the last stage."""
    r = batch["base"]
    act = 1 * S * 1024.0 * 2.0 / 2.0
    send = coll("p2p", act, 2, stride=2)
    regather = coll("all_gather", act * 2, 2)
    emb = coll("all_reduce", tr.CONSTANTS["main_grad_bytes"] * 32000.0 * 1024.0 / 2, 2, 2)
    n = float(pl.p2p_transfers_on_critical_path(1.0, 4.0, B / 2, 1.0))
    assert float(r.breakdown["pp_comm"]) == pytest.approx(n * (send + regather) + emb,
                                                          rel=1e-6)
    # sequence parallelism: activations are already sharded, no re-gather
    r = batch["tp8pp2"]
    act = 4 * S * 1024.0 * 2.0 / 8.0
    send = coll("p2p", act, 2, stride=8)
    emb = coll("all_reduce", tr.CONSTANTS["main_grad_bytes"] * 32000.0 * 1024.0 / 8, 2, 8)
    n = float(pl.p2p_transfers_on_critical_path(1.0, 2.0, B / 4, 1.0))
    assert float(r.breakdown["pp_comm"]) == pytest.approx(n * send + emb, rel=1e-6)


def test_dp_overlap(batch):
    """dp_overlap = 0 exposes the whole gradient all-reduce (Megatron-LM 2021); with overlap
    only what exceeds the last backward pass is exposed."""
    serial, over = batch["dp16_serial"], batch["dp16"]
    n_par = float(wparams.params_per_device(MODEL, plan("dp16")))
    ar = coll("all_reduce", tr.CONSTANTS["main_grad_bytes"] * n_par, 16)
    assert float(serial.breakdown["dp_comm"]) == pytest.approx(ar, rel=1e-6)
    assert 0.0 <= float(over.breakdown["dp_comm"]) < ar
    assert float(serial.step_time_s) - float(over.step_time_s) == pytest.approx(
        ar - float(over.breakdown["dp_comm"]), rel=1e-6)


def test_dp_overlap_contention_by_hand(batch):
    """The overlapped gradient all-reduce (one stage, one chunk) is the two-stage pipeline of
    Megatron-core's n = ceil(params / 40 M) buckets behind the backward, while its 16 NCCL
    SMs slow the backward to ρ = 1 − 16/108 (Rashidi et al. ISCA 2021): by hand, with
    k = 1 − 1/n, ``exposed = t_c/n + t_m/n + max(k·t_m, k·t_c + (1−ρ)·k·t_m) − t_c`` —
    never below the no-contention rule (ρ = 1), never above the serial all-reduce."""
    serial, over = batch["dp16_serial"], batch["dp16"]
    t = {k: float(np.asarray(v)[0]) for k, v in tr.stage_times(
        ONE_TIER, MODEL, jax.tree_util.tree_map(lambda x: jnp.asarray([x]), plan("dp16")),
        B, S, gemm=roofline).items()}
    tc = 8.0 * (t["bwd"] + t["rd_bwd"] + t["tp_comm_bwd"] + t["ep_comm_bwd"])
    n_par = float(wparams.params_per_device(MODEL, plan("dp16")))
    tm = coll("all_reduce", tr.CONSTANTS["main_grad_bytes"] * n_par, 16)
    n = float(np.ceil(n_par / 40e6))
    k = 1.0 - 1.0 / n
    assert n > 1

    def hand(rho):
        return tc / n + tm / n + max(k * tm, k * tc + (1 - rho) * k * tm) - tc

    got = float(over.breakdown["dp_comm"])
    assert got == pytest.approx(min(hand(1.0 - 16.0 / ONE_TIER.device.core_count), tm),
                                rel=1e-6)
    assert hand(1.0) <= got * (1 + 1e-9) <= float(serial.breakdown["dp_comm"]) * (1 + 1e-9)
    assert float(serial.breakdown["dp_comm"]) == pytest.approx(tm, rel=1e-6)


@pytest.mark.slow
def test_tp_overlap(batch):
    """tp_overlap = 1 overlaps each TP collective with the GEMM that feeds or drains it, as
    Transformer Engine's userbuffers do (jaxmodel.parallel.overlap.te_tp_exposed), by hand:
    hosts' shares from FLOPs (QKV+FC1 host the all-gathers, projection+FC2 the
    reduce-scatters); all-gathers as 8-step ring exchanges holding 1 SM, forward
    reduce-scatters in 4 chunks with the host GEMM on 108 − 16 SMs throughout, backward
    reduce-scatters beside the weight-gradient GEMMs on 16 SMs; each kind at most serial;
    the layer's own memory traffic is not counted, so the SM shares bind. Never below the
    no-contention pipeline, never above serial; nothing else changes. With full recompute
    the recomputed forward's TP collectives are hidden behind the recompute and the
    breakdown still sums to the step."""
    serial, over = batch["tp8pp2"], batch["tp8pp2_ov"]
    t = {k: float(np.asarray(v)[0]) for k, v in tr.stage_times(
        ONE_TIER, MODEL, jax.tree_util.tree_map(lambda x: jnp.asarray([x]), plan("tp8pp2")),
        B, S, gemm=roofline).items()}
    m, layers, sms = B / 4.0, 8.0 / 2.0, ONE_TIER.device.core_count
    h, ff = 1024.0, 4096.0
    qkv, wo, w1, w2, attn = 2 * h * 3 * h, 2 * h * h, 2 * h * ff, 2 * ff * h, 4 * S * h
    tot = qkv + wo + w1 + w2 + attn
    f_ag, f_rs = (qkv + w1) / tot, (wo + w2) / tot

    def pipe(tc, tm, n, share):
        k = 1.0 - 1.0 / n
        return tc / n + tm / n + max(k * tm, k * tc + share * k * tm)

    def passes(share_ring, share_sm):
        def ring(host, c):
            return min(pipe(host, c, 8.0, share_ring) - host, c)

        def rs_pipe(host, c):
            return min(pipe(host / (1 - share_sm), c, 4.0, 0.0) - host, c)

        def bulk(host, c):
            return min(max(c, host + share_sm * c) - host, c)

        cf, cb = t["tp_comm_fwd"] / 2, t["tp_comm_bwd"] / 2
        return (ring(f_ag * t["fwd"], cf) + rs_pipe(f_rs * t["fwd"], cf)
                + ring(0.5 * f_rs * t["bwd"], cb) + bulk(0.5 * f_ag * t["bwd"], cb))

    exposed = m * layers * passes(1.0 / sms, 16.0 / sms)
    ideal = m * layers * passes(0.0, 0.0)
    assert float(serial.breakdown["tp_comm"]) == pytest.approx(
        m * layers * (t["tp_comm_fwd"] + t["tp_comm_bwd"]), rel=1e-6)
    assert float(over.breakdown["tp_comm"]) == pytest.approx(exposed, rel=1e-6, abs=1e-12)
    assert ideal <= float(over.breakdown["tp_comm"]) * (1 + 1e-9) <= float(
        serial.breakdown["tp_comm"]) * (1 + 1e-9)
    assert float(over.step_time_s) < float(serial.step_time_s)
    for k in ("compute", "recompute", "embedding", "optimizer", "pp_comm"):
        assert float(over.breakdown[k]) == pytest.approx(float(serial.breakdown[k]), rel=1e-9)
    full = jm.train_step(ONE_TIER, MODEL, jax.tree_util.tree_map(
        lambda x: jnp.asarray([x, x]), plan("tp8pp2", recompute=2.0)), B, S, gemm=roofline,
        tp_overlap=jnp.asarray([0.0, 1.0]))
    rc = np.asarray(full.breakdown["recompute"])
    assert rc[1] < rc[0] and np.asarray(full.step_time_s)[1] < np.asarray(full.step_time_s)[0]
    total = sum(np.asarray(full.breakdown[k]) for k in tr.BREAKDOWN_KEYS)
    np.testing.assert_allclose(total, np.asarray(full.step_time_s), rtol=1e-9)


def test_cross_stride_places_stage_pairs_across_the_outer_tier():
    assert float(pplan.cross_stride(TWO_TIER, 4.0)) == 1.0      # a pipeline inside one node
    assert float(pplan.cross_stride(TWO_TIER, 16.0)) == 8.0     # spans both nodes
    assert float(pplan.cross_stride(ONE_TIER, 16.0)) == 1.0


def test_residual_dropout_kernels():
    """Bias-dropout-add and attention dropout: bytes per element as documented."""
    dev = ONE_TIER.device
    p = plan("base")
    f_on, b_on, sel_on = (float(x) for x in tr.residual_dropout_times(dev, MODEL, p, 1.0, S))
    f_off, b_off, sel_off = (float(x) for x in tr.residual_dropout_times(
        dev, MODEL, p, 1.0, S, tr.TrainOptions(None, S, dropout=0.0)))
    e, probs = S * 1024.0, 1.0 * 8.0 * S * S
    k = lambda n, nb, fl: float(ops.elementwise_latency(dev, n, nb, fl))  # noqa: E731
    assert f_on == pytest.approx(2 * k(e, 7.0, 3.0) + k(probs, 5.0, 1.0))
    assert f_off == pytest.approx(2 * k(e, 6.0, 3.0)) and sel_off == 0.0
    assert b_on > b_off > 0 and sel_on == pytest.approx(k(probs, 5.0, 1.0))


@pytest.mark.parametrize("name,over,match", [
    ("bad_devices", {}, "devices"),
    ("bad_layers", {}, "n_layers"),
    ("bad_batch", {}, "global_batch"),
    ("bad_interleave", {}, "interleave"),
    ("bad_inter_m", {}, "multiple of pp"),
    ("base", {"tp": 3.0, "dp": 1.0, "pp": 16.0 / 3.0}, "integer"),
    ("base", {"zero": 4.0}, "zero"),
])
def test_inconsistent_single_plan_raises(name, over, match):
    with pytest.raises(ValueError, match=match):
        jm.train_step(ONE_TIER, MODEL, plan(name, **over), B, S, gemm=roofline)


def test_heads_and_sequence_checks_raise():
    m12 = dataclasses.replace(MODEL, n_heads=12.0, n_kv_heads=12.0, head_dim=1024.0 / 12)
    with pytest.raises(ValueError, match="n_heads"):
        jm.train_step(ONE_TIER, m12, plan("tp8pp2"), B, S, gemm=roofline)
    with pytest.raises(ValueError, match="seq_len"):
        jm.train_step(ONE_TIER, MODEL, plan("tp8pp2"), B, 500.0, gemm=roofline)


def test_stage_times_part_is_checked():
    with pytest.raises(ValueError, match="part='embedding'"):
        tr.stage_times_single(ONE_TIER, MODEL, plan("base"), tr.TrainOptions(None, S),
                              statics=tr.TrainStatics(gemm=roofline), part="embedding")


# ------------------------------------------------------------------------------------------
# slow: extra compilations
# ------------------------------------------------------------------------------------------
def test_dedup_evaluates_distinct_stage_inputs_once():
    cols = np.asarray([PLANS[n][0] for n in NAMES], dtype=np.float64).T
    par = jm.Parallelism(**{f: jnp.asarray(c) for f, c in zip(FIELDS, cols)})
    inputs = jm.batching.call_batched(tr._stage_inputs, ONE_TIER, MODEL, par,
                                      tr.TrainOptions(B, S))
    rows = np.stack([np.asarray(x) for x in jax.tree_util.tree_leaves(inputs)], axis=1)
    # z0..z3 share their stage inputs (ZeRO does not enter a layer), as do base/gpipe/inter2
    assert len(np.unique(rows, axis=0)) < len(NAMES) - 5


def test_outer_product_batch_matches_flat():
    """An outer-product batch (leaves along the leading axis × knobs along the last) is
    evaluated point by point with an inner vmap; the values are the flat batch's."""
    serial = np.linspace(1.0, 2.0, 5).reshape(5, 1)
    overlapped = np.linspace(0.2, 0.9, 5).reshape(5, 1)
    knob = np.array([[0.0, 0.25, 1.0]])
    got = jm.batching.call_batched(blend, serial, overlapped, knob, chunk=4)
    flat = jm.batching.call_batched(blend, *(np.broadcast_to(x, (5, 3)).copy()
                                                 for x in (serial, overlapped, knob)), chunk=4)
    assert got.shape == (5, 3)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(flat))
    np.testing.assert_allclose(np.asarray(got), serial + knob * (overlapped - serial),
                               rtol=1e-12)


@pytest.mark.slow
def test_static_switches_keep_the_numbers():
    """Plans without ZeRO and without context parallelism compile without those branches
    (static switches); the numbers equal the graph that keeps them."""
    par = plan("tp8pp2")
    fast = jm.train_step(ONE_TIER, MODEL, par, B, S, gemm=roofline, dedup=True)
    times = tr.stage_times(ONE_TIER, MODEL, par, B, S, gemm=roofline)
    full = jm.batching.call_batched(
        tr._compose_row, ONE_TIER, MODEL, par, tr.TrainOptions(B, S), times,
        statics=tr.TrainStatics(variant=wl.ANY._replace(net=comm.net_variant_of(ONE_TIER))))
    for f in ("step_time_s", "memory_bytes", "mfu"):
        assert float(getattr(fast, f)) == pytest.approx(float(getattr(full, f)), rel=1e-12)
    keep = jm.batching.call_batched(tr._stage_times_row, *jm.batching.call_batched(
        tr._stage_inputs, ONE_TIER, MODEL, par, tr.TrainOptions(B, S)),
        statics=tr.TrainStatics(gemm=roofline))
    for k, v in keep.items():
        assert float(v) == float(times[k]), k


@pytest.mark.slow
def test_vmap_matches_loop_and_jit_matches_eager(batch):
    """Single calls (the direct, non-de-duplicated path) equal the batch entries."""
    for name in ("base", "z2", "tp8pp2", "dp16"):
        r = jm.train_step(ONE_TIER, MODEL, plan(name), B, S, gemm=roofline, dedup=False)
        assert float(r.step_time_s) == pytest.approx(float(batch[name].step_time_s),
                                                     rel=1e-12)
        assert float(r.memory_bytes) == pytest.approx(float(batch[name].memory_bytes),
                                                      rel=1e-12)
    with jax.disable_jit():
        e = tr.train_step_single(ONE_TIER, MODEL, plan("z1"), B, S, gemm=roofline)
    assert float(e.step_time_s) == pytest.approx(float(batch["z1"].step_time_s), rel=1e-9)


@pytest.mark.slow
def test_grad_matches_finite_differences():
    """d step / d (InfiniBand bandwidth) and d step / d mem_bw on two nodes (float64)."""
    p = plan("tp8pp2")                     # the stage boundary crosses InfiniBand

    def system_at(ib_bw, mem_bw):
        lv = list(TWO_TIER.levels)
        lv[1] = dataclasses.replace(lv[1], bw_per_device=ib_bw)
        dev = dataclasses.replace(TWO_TIER.device, mem_bw=mem_bw)
        return dataclasses.replace(TWO_TIER, device=dev, levels=tuple(lv))

    def step(ib_bw, mem_bw):
        return tr.train_step_single(system_at(ib_bw, mem_bw), MODEL, p, B, S,
                                    gemm=roofline).step_time_s

    x0 = (float(TWO_TIER.levels[1].bw_per_device), float(TWO_TIER.device.mem_bw))
    g = jax.jit(jax.grad(step, argnums=(0, 1)))(*x0)
    assert all(np.isfinite(float(v)) for v in g)
    for i, gi in enumerate(g):
        h = x0[i] * 1e-4
        xp, xm = list(x0), list(x0)
        xp[i] += h
        xm[i] -= h
        fp = float(jm.train_step(system_at(*xp), MODEL, p, B, S, gemm=roofline).step_time_s)
        fm = float(jm.train_step(system_at(*xm), MODEL, p, B, S, gemm=roofline).step_time_s)
        fd = (fp - fm) / (2 * h)
        assert float(gi) < 0.0                      # more bandwidth -> faster
        assert float(gi) == pytest.approx(fd, rel=2e-3), i


@pytest.mark.slow
def test_gemm_table_matches_tile_search():
    """The GEMM de-dup path (record shapes, one tile search, lookup) reproduces the default
    tile-search step times on a batch of plans."""
    from jaxmodel.parallel.gemm_table import GemmTable
    names = ["base", "z2", "tp8pp2", "dp16"]
    cols = np.asarray([PLANS[n][0] for n in names], dtype=np.float64).T
    par = jm.Parallelism(**{f: jnp.asarray(c) for f, c in zip(FIELDS, cols)})
    table = GemmTable.for_train_step(ONE_TIER, MODEL, par, B, S)
    direct = jm.train_step(ONE_TIER, MODEL, par, B, S)
    looked = jm.train_step(ONE_TIER, MODEL, par, B, S, gemm=table.lookup)
    np.testing.assert_allclose(np.asarray(looked.step_time_s),
                               np.asarray(direct.step_time_s), rtol=1e-9)


@pytest.mark.slow
def test_megatron2021_stack():
    """``dropout=2`` (``megatron2021_stack=1``): the eager kernels join the layer's forward (repeated by a full
    recompute) and backward, the cross entropy runs on fp32 logits, and the ``param.grad``
    accumulation is charged on ``m − 1`` of ``m`` micro-batches (none when m = 1)."""
    dev = ONE_TIER.device
    p = plan("base")
    f1, b1, s1 = (float(x) for x in tr.residual_dropout_times(dev, MODEL, p, 1.0, S))
    f2, b2, s2 = (float(x) for x in tr.residual_dropout_times(dev, MODEL, p, 1.0, S, LEGACY))
    kf, kb = (float(x) for x in wl.megatron2021_kernels(dev, MODEL, p, 1.0, S))
    assert f2 == pytest.approx(f1 + kf) and b2 == pytest.approx(b1 + kb) and s2 == s1
    t1 = tr.stage_times_single(ONE_TIER, MODEL, p, tr.TrainOptions(None, S), statics=ROOF)
    t2 = tr.stage_times_single(ONE_TIER, MODEL, p, LEGACY, statics=ROOF)
    ce = wl.fp32_cross_entropy(dev, S, MODEL.vocab_size / 2.0)
    assert float(t2["loss_fwd"]) == pytest.approx(float(ce[0]))
    assert float(t2["loss_bwd"]) == pytest.approx(float(ce[1]))
    assert float(t1["grad_accum"]) == 0.0
    assert float(t2["grad_accum"]) == pytest.approx(float(wl.grad_accumulation(dev, MODEL, p)))

    def step(dropout, gb):
        par = plan("dp16", recompute=2.0)
        return jm.train_step(ONE_TIER, MODEL, par, gb, S, gemm=roofline, dropout=dropout,
                             dp_overlap=0.0)

    # dp16, micro-batch 1: m = 1 (no accumulation) and m = 4; a pure data-parallel step
    # grows by exactly its layers' extra kernels (+ the accumulation on 3 of 4) and the loss,
    # timed at the sustained clock train_step runs at
    sus = dataclasses.replace(ONE_TIER, device=tr.sustained_device(ONE_TIER.device))
    q = plan("dp16")
    t1 = tr.stage_times_single(sus, MODEL, q, tr.TrainOptions(None, S), statics=ROOF)
    t2 = tr.stage_times_single(sus, MODEL, q, LEGACY, statics=ROOF)
    kf, kb = (float(x) for x in wl.megatron2021_kernels(sus.device, MODEL, q, 1.0, S))
    d_loss = float(t2["loss_fwd"] + t2["loss_bwd"] - t1["loss_fwd"] - t1["loss_bwd"])
    for gb, share in ((16.0, 0.0), (64.0, 0.75)):
        r1, r2 = step(1.0, gb), step(2.0, gb)
        m = gb / 16.0
        expect = m * (8.0 * (2.0 * kf + kb + share * float(t2["grad_accum"])) + d_loss)
        assert float(r2.step_time_s - r1.step_time_s) == pytest.approx(expect, rel=1e-6)


@pytest.mark.slow
def test_dropout_by_name():
    """``dropout`` takes the names of ``types.DROPOUT_MODES``."""
    par = plan("dp16")
    by_code = jm.train_step(ONE_TIER, MODEL, par, 16.0, S, gemm=roofline, dropout=2.0)
    by_name = jm.train_step(ONE_TIER, MODEL, par, 16.0, S, gemm=roofline,
                            dropout="megatron2021")
    assert float(by_name.step_time_s) == float(by_code.step_time_s)


def test_dropout_wrong_name_says_which():
    with pytest.raises(ValueError, match="dropout"):
        jm.train_step(ONE_TIER, MODEL, plan("dp16"), 16.0, S, gemm=roofline,
                      dropout="megatron2020")
