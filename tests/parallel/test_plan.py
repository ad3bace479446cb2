"""The plan module: one list of rules (numpy = jnp), each failing alone with its reason; the
API edge raises naming the fields; placement (Megatron order); device and network rules in
inference; the inference stage hop crosses nodes like the training one."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel import ops
from jaxmodel.numerics import reason_code
from jaxmodel.parallel import plan

MODEL = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=4.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=32000.0, activation="swiglu", n_experts=8.0,
                 top_k=2.0)
DENSE = dataclasses.replace(MODEL, n_experts=1.0, top_k=1.0)
TWO_NODES = hw_db.system("dgx_a100", nodes=2)                  # 2 × 8 A100, InfiniBand


def roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return ops.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


# a valid training plan on 16 devices: dp 2, tp 2, pp 4, ep 2, interleaved v 2, SP
BASE = dict(n_devices=16.0, n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=4.0,
            head_dim=64.0, d_ff=4096.0, vocab_size=32000.0, n_experts=8.0,
            dp=2.0, tp=2.0, pp=4.0, ep=2.0, cp=1.0, sp=1.0, micro_batch=2.0, interleave=2.0,
            schedule=2.0, recompute=1.0, zero=1.0, flash_attention=0.0,
            batch=16.0, seq_len=512.0, gen_len=1.0, dtype_bytes=2.0)

# each mutation breaks exactly one rule of the training scope
BREAK = [
    ("invalid_model", {"d_ff": 0.0}),
    ("invalid_workload", {"dtype_bytes": 0.0}),
    ("invalid_parallelism", {"sp": 2.0}),                        # degrees and flags
    ("invalid_parallelism", {"zero": 4.0}),                      # execution codes
    ("devices_mismatch", {"n_devices": 32.0}),
    ("heads_not_divisible", {"n_heads": 15.0}),
    ("layers_not_divisible", {"interleave": 4.0, "batch": 32.0}),  # pp·v = 16 ∤ 8
    ("layers_not_divisible", {"n_layers": 9.0}),                  # interleaved: pp·v = 8 ∤ 9
    ("layers_not_divisible", {"n_layers": 3.0, "schedule": 1.0, "interleave": 1.0}),  # pp > L
    ("batch_not_divisible", {"batch": 18.0, "schedule": 1.0, "interleave": 1.0}),
    ("batch_not_divisible", {"batch": 12.0}),                     # m = 3 not a multiple of pp
    ("sequence_not_divisible", {"seq_len": 511.0}),
    ("experts_not_divisible", {"ep": 8.0}),                       # 8 ∤ dp = 2, 8/2 ∤ tp = 2
    ("experts_not_divisible", {"n_experts": 6.0, "ep": 4.0, "dp": 4.0, "pp": 2.0}),  # 4 ∤ 6
]


def _inputs(xp=np, **over):
    vals = {**BASE, **over}
    if xp is jnp:
        vals = {k: jnp.asarray(v) for k, v in vals.items()}
    return plan.PlanInputs(**vals)


def _failing(scope, p, xp):
    return [why for ok, why in plan.structure_checks(scope, p, xp) if not bool(ok)]


def test_base_plan_passes_every_rule():
    for xp in (np, jnp):
        assert _failing("train", _inputs(xp), xp) == []


@pytest.mark.parametrize("reason, over", BREAK)
def test_each_rule_fails_alone_with_its_reason(reason, over):
    for xp in (np, jnp):
        got = _failing("train", _inputs(xp, **over), xp)
        assert got == [reason], (over, got)
        feasible, code = jm.numerics.first_reason(
            plan.structure_checks("train", _inputs(jnp, **over), jnp))
        assert not bool(feasible) and int(code) == reason_code(reason)


def test_numpy_and_jnp_agree_on_random_plans():
    rng = np.random.default_rng(0)
    n = 2000
    cols = {k: np.full(n, v) for k, v in BASE.items()}
    for k, choices in (("dp", [1, 2, 3, 4, 0.5]), ("tp", [1, 2, 3, 4, 8]),
                       ("pp", [1, 2, 3, 4]), ("ep", [1, 2, 4, 8, 3]), ("sp", [0, 1]),
                       ("micro_batch", [1, 2, 3]), ("interleave", [1, 2, 3]),
                       ("schedule", [0, 1, 2]), ("zero", [0, 1, 2, 3, 4]),
                       ("batch", [8, 12, 16, 18]), ("seq_len", [512, 511, 2048]),
                       ("n_devices", [8, 16, 32])):
        cols[k] = rng.choice(np.asarray(choices, dtype=float), n)
    p_np = plan.PlanInputs(**cols)
    p_j = plan.PlanInputs(**{k: jnp.asarray(v) for k, v in cols.items()})
    for scope in plan.SCOPES:
        a = plan.structure_checks(scope, p_np, np)
        b = plan.structure_checks(scope, p_j, jnp)
        assert [r for _, r in a] == [r for _, r in b]
        for (x, _), (y, _) in zip(a, b):
            assert np.array_equal(np.broadcast_to(x, n), np.asarray(y))
    # a mix of valid and invalid plans
    assert 0 < plan.numpy_mask("train", p_np).sum() < n


def test_scopes_differ_only_where_the_physics_does():
    train = {r.reason for r in plan.rules_for("train")}
    infer = {r.reason for r in plan.rules_for("infer")}
    layer = {r.reason for r in plan.rules_for("layer")}
    assert layer < infer <= train
    assert infer == train                       # the same reasons, other formulas (batch)
    only_train = [r for r in plan.RULES if r.scopes == ("train",)]
    # global batch into micro-batches, schedule/interleave/ZeRO codes, the workload fields
    assert {r.reason for r in only_train} == {"invalid_workload", "invalid_parallelism",
                                              "batch_not_divisible"}
    # an inference replica: batch / dp, no micro-batches, one chunk per stage
    p = _inputs(np, batch=6.0, micro_batch=4.0, interleave=3.0, schedule=2.0, gen_len=4.0)
    assert _failing("infer", p, np) == []
    assert "batch_not_divisible" in _failing("train", p, np)


def test_placement_is_megatron_order():
    system = hw_db.system("dgx_a100", nodes=4)              # 32 devices, 8 per node
    par = jm.Parallelism(dp=4, tp=4, pp=2, ep=2)
    where = plan.placement(system, par)
    g = {k: (float(v.size), float(v.stride)) for k, v in where._asdict().items()}
    assert g["tp"] == (4, 1) and g["cp"] == (1, 4) and g["pp"] == (2, 4)
    assert g["dp"] == (4, 8) and g["ep"] == (2, 8) and g["dp_exp"] == (2, 16)
    assert g["stage_hop"] == (2, 4)                         # tp·pp = 8: inside a node
    wide = plan.placement(system, jm.Parallelism(dp=2, tp=8, pp=2))
    assert float(wide.stage_hop.stride) == 8.0              # tp·pp = 16 > 8: across nodes


def test_gradient_group_is_megatrons_data_parallel_group():
    """Megatron's ``initialize_model_parallel`` docstring example: TP 2 × PP 4 on 16 GPUs
    has the data-parallel groups [g0, g2], [g1, g3], … (size 2, stride tp = 2), with or
    without a pipeline; with CP the gradient group spans dp·cp at the same stride."""
    system = hw_db.system("dgx_a100", nodes=2)
    for pp in (4.0, 1.0):
        where = plan.placement(system, jm.Parallelism(dp=16 // int(2 * pp), tp=2, pp=pp))
        assert (float(where.dp_cp.size), float(where.dp_cp.stride)) == (16 / (2 * pp), 2.0)
    cp = plan.placement(system, jm.Parallelism(dp=2, tp=2, cp=2, pp=2))
    assert (float(cp.dp_cp.size), float(cp.dp_cp.stride)) == (4.0, 2.0)


# ------------------------------------------------------------------------------------------
# the API edge
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn, par, kw, match", [
    ("train", {"dp": 2, "tp": 2, "pp": 2}, {}, r"devices_mismatch: dp·tp·pp·cp = 2·2·2·1 = 8"),
    ("train", {"dp": 4, "tp": 4, "ep": 16}, {},
     r"ep=16 must divide n_experts=8 and either divide dp=4"),
    ("train", {"dp": 16, "micro_batch": 3}, {}, r"global_batch=32 .* dp·micro_batch = 16·3"),
    ("train", {"dp": 4, "tp": 4, "sp": True}, {"seq_len": 510.0},
     r"seq_len=510 .* tp=4 must divide"),
    ("infer", {"dp": 2, "tp": 8}, {"batch": 3}, r"batch=3 is not a multiple of dp = 2"),
    ("infer", {"dp": 1, "tp": 16, "ep": 32}, {}, r"experts_not_divisible: ep=32 .* dp=1"),
    ("infer", {"dp": 8, "tp": 2}, {"dtype_bytes": 0.0}, r"dtype_bytes=0"),
    ("layer", {"tp": 3}, {}, r"heads_not_divisible: tp=3 must divide n_heads=16"),
])
def test_concrete_invalid_plans_raise_naming_the_field(fn, par, kw, match):
    system = hw_db.system("dgx_a100", nodes=2)
    p = jm.Parallelism(**par)
    with pytest.raises(ValueError, match=match):
        if fn == "train":
            jm.train_step(system, MODEL, p, 32.0, kw.get("seq_len", 512.0), gemm=roofline)
        elif fn == "infer":
            jm.inference(system, MODEL, p, kw.get("batch", 8), 128, 8, gemm=roofline,
                         dtype_bytes=kw.get("dtype_bytes", 2.0))
        else:
            jm.layer_breakdown(system, MODEL, p, 1, 8, gemm=roofline)


def test_unplaceable_group_raises_with_the_topology_reason():
    """Tiers of 6 and 2 devices: a DP group at stride tp = 4 does not tile the 6-device tier."""
    lv = TWO_NODES.levels
    odd = dataclasses.replace(TWO_NODES, levels=(dataclasses.replace(lv[0], size=6.0),
                                                 dataclasses.replace(lv[1], size=2.0)))
    with pytest.raises(ValueError, match="topology_mismatch: .*dp=3 at stride 4"):
        jm.train_step(odd, DENSE, jm.Parallelism(dp=3, tp=4), 48.0, 512.0, gemm=roofline)


# ------------------------------------------------------------------------------------------
# inference: device and network rules, the stage hop across nodes (one batched call)
# ------------------------------------------------------------------------------------------
CASES = ["ok", "nvlink_bw_0", "ib_bw_nan", "dtype_0", "slow_hbm", "tp_only_ib_0",
         "no_comm_ib_0"]


def _case_batch():
    n = len(CASES)
    dev, lv = TWO_NODES.device, TWO_NODES.levels
    mem_bw = np.full(n, float(dev.mem_bw))
    mem_bw[CASES.index("slow_hbm")] = 1e-30
    bw0 = np.full(n, float(lv[0].bw_per_device))
    bw0[CASES.index("nvlink_bw_0")] = 0.0
    bw1 = np.full(n, float(lv[1].bw_per_device))
    bw1[CASES.index("ib_bw_nan")] = np.nan
    bw1[CASES.index("tp_only_ib_0")] = 0.0
    bw1[CASES.index("no_comm_ib_0")] = 0.0
    system = dataclasses.replace(
        TWO_NODES, device=dataclasses.replace(dev, mem_bw=jnp.asarray(mem_bw)),
        levels=(dataclasses.replace(lv[0], bw_per_device=jnp.asarray(bw0)),
                dataclasses.replace(lv[1], bw_per_device=jnp.asarray(bw1))))
    dp, tp, pp = np.ones(n), np.full(n, 8.0), np.full(n, 2.0)
    i, j = CASES.index("tp_only_ib_0"), CASES.index("no_comm_ib_0")
    dp[i], pp[i] = 2.0, 1.0                      # TP inside a node, replicas across nodes
    dp[j], tp[j], pp[j] = 16.0, 1.0, 1.0          # 16 independent replicas
    par = jm.Parallelism(dp=jnp.asarray(dp), tp=jnp.asarray(tp), pp=jnp.asarray(pp))
    dtype = np.full(n, 2.0)
    dtype[CASES.index("dtype_0")] = 0.0
    return system, par, jnp.asarray(dtype)


@pytest.fixture(scope="module")
def cases():
    system, par, dtype = _case_batch()
    return jm.inference(system, DENSE, par, 16, 256, 16, gemm=roofline, dtype_bytes=dtype)


def test_every_result_is_finite_and_feasible_or_inf_with_the_binding_reason(cases):
    r = cases
    assert float(np.asarray(cases.tokens_per_s)[CASES.index("no_comm_ib_0")]) > 0
    feasible = np.asarray(r.feasible)
    reasons = [jm.reason_name(c) for c in np.asarray(r.reason)]
    # the collective model reads every tier once a group communicates; replicas that never
    # communicate do not care about the network
    expect = {"ok": "ok", "nvlink_bw_0": "invalid_network", "ib_bw_nan": "invalid_network",
              "dtype_0": "invalid_workload", "tp_only_ib_0": "invalid_network",
              "no_comm_ib_0": "ok"}
    for name, why in expect.items():
        assert reasons[CASES.index(name)] == why, name
    for leaf in jax.tree_util.tree_leaves(r):
        assert not np.isnan(np.asarray(leaf, dtype=float)).any()
    for t in (r.ttft_s, r.tpot_s, r.total_s):
        t = np.asarray(t)
        assert np.all(np.isfinite(t[feasible])) and np.all(np.isinf(t[~feasible]))
    # float64: 1e-30 B/s HBM gives finite (astronomical) times; float32 see below
    i = CASES.index("slow_hbm")
    assert (feasible[i] and np.isfinite(np.asarray(r.total_s)[i])) or (
        reasons[i] == "invalid_device")


@pytest.mark.slow     # ~80 s on 2 cores: a whole float32 inference graph
def test_overflowing_device_is_flagged_in_float32(float32):
    dev = dataclasses.replace(TWO_NODES.device, mem_bw=jnp.asarray([2.0e12, 1e-30]))
    system = dataclasses.replace(TWO_NODES, device=dev)
    r = jm.inference(system, DENSE, jm.Parallelism(dp=2, tp=8), 8, 256, 16, gemm=roofline)
    assert np.asarray(r.feasible).tolist() == [True, False]
    assert jm.reason_name(np.asarray(r.reason)[1]) == "invalid_device"
    assert np.isinf(np.asarray(r.total_s)[1]) and np.isfinite(np.asarray(r.total_s)[0])


def test_inference_stage_hop_crosses_nodes(cases):
    """tp·pp = 16 > 8 devices per node: the hop between the two stages is an InfiniBand
    transfer (stride 8), not the NVLink one a stride-tp placement would give."""
    hop = float(np.asarray(cases.breakdown["pp_comm_prefill"])[CASES.index("ok")])
    nbytes = 16 * 256 * 1024 * 2.0                 # b · prompt · d · bytes
    inter = float(jm.collective_latency(TWO_NODES, "p2p", nbytes, 2, stride=8.0))
    intra = float(jm.collective_latency(TWO_NODES, "p2p", nbytes, 2, stride=1.0))
    assert hop == pytest.approx(inter, rel=1e-9)
    assert hop > 2 * intra
    train_hop = float(plan.placement(TWO_NODES, jm.Parallelism(tp=8, pp=2)).stage_hop.stride)
    assert train_hop == 8.0


@pytest.mark.parametrize("n_layers, pp", [(7.0, 4.0), (126.0, 8.0), (126.0, 16.0),
                                          (61.0, 16.0), (4.0, 4.0)])
def test_uneven_stages_pass_without_interleaving(n_layers, pp):
    """Any pp <= n_layers (uneven stages) under GPipe/1F1B, in the rule list, the numpy
    mask the search uses and the API edge alike."""
    n_dev = 2.0 * pp * 2.0
    over = dict(n_layers=n_layers, pp=pp, schedule=1.0, interleave=1.0, n_devices=n_dev,
                batch=4.0 * pp)
    for xp in (np, jnp):
        assert _failing("train", _inputs(xp, **over), xp) == []
        assert _failing("infer", _inputs(xp, **over), xp) == []
    assert bool(plan.numpy_mask("train", _inputs(np, **over)))
    plan.raise_if_invalid("t", "train", _inputs(np, **over))       # no ValueError
    # the interleaved schedule keeps pp·v | L + s, s = 0, 1, 2 (embedding / loss slots)
    inter = dict(over, schedule=2.0, interleave=2.0)
    fits = any((n_layers + s) % (2 * pp) == 0 for s in (0, 1, 2))
    want = [] if fits else ["layers_not_divisible"]
    assert _failing("train", _inputs(np, **inter), np) == want


def test_layer_rule_message_names_the_fields():
    with pytest.raises(ValueError, match=r"layers_not_divisible: n_layers=3 must be at least "
                                         r"pp=4"):
        plan.raise_if_invalid("t", "train", _inputs(np, n_layers=3.0, schedule=1.0,
                                                    interleave=1.0))


def test_search_enumerates_uneven_stages():
    """126 layers on 1024 devices: pp 8 and 16 (neither divides 126) are enumerated; 128
    stages (> 126 layers) are not; interleaving only where pp·v divides the layers plus
    0, 1 or 2 pipeline slots (the embedding and the loss): PP 8 × VP 8 is among them."""
    from jaxmodel.search.parallelism import enumerate_plans
    m = dataclasses.replace(DENSE, n_layers=126.0, n_heads=128.0, n_kv_heads=8.0)
    cols = enumerate_plans(m, 1024, 1024, max_tp=8, recompute=("full",), zero=(1,),
                           sp=(True,), flash_attention=(True,))
    pps = set(cols["pp"].tolist())
    assert {8.0, 16.0} <= pps and 128.0 not in pps
    inter = cols["schedule"] == 2
    pv = cols["pp"][inter] * cols["interleave"][inter]
    assert np.all((126 % pv == 0) | (127 % pv == 0) | (128 % pv == 0))
    assert np.any((cols["pp"] == 8) & (cols["interleave"] == 8) & inter)


def test_embedding_and_loss_as_pipeline_slots():
    """Megatron-core's account_for_embedding/loss_in_pipeline_split: 126 layers on PP 8 × VP 8
    (126 + 2 = 128 slots, 2 per virtual stage) are admitted, with stages of 15 | 16 × 6 | 15
    layers (the first and last give one slot each to the embedding and the loss); 125 layers
    (needs three slots) are not."""
    from jaxmodel.parallel import pipeline
    over = dict(n_layers=126.0, pp=8.0, interleave=8.0, schedule=2.0, dp=1.0, tp=2.0,
                n_devices=16.0, batch=16.0, micro_batch=1.0, ep=1.0, n_experts=1.0)
    for xp in (np, jnp):
        assert _failing("train", _inputs(xp, **over), xp) == []
    assert _failing("train", _inputs(np, **dict(over, n_layers=125.0)), np) == [
        "layers_not_divisible"]
    first, most, last = (float(x) for x in pipeline.stage_layers(126.0, 8.0))
    assert (first, most, last) == (15.0, 16.0, 15.0)
    # 127 layers: the loss's slot alone (127 + 1 = 128); the last stage gives it one layer
    first, most, last = (float(x) for x in pipeline.stage_layers(127.0, 8.0))
    assert (first, most, last) == (16.0, 16.0, 15.0)
    assert _failing("train", _inputs(np, **dict(over, n_layers=127.0)), np) == []


def test_buffer_check_at_the_widest_gemm_word():
    """A device whose local buffer holds the smallest fp16 tile but no fp32 one: feasible
    for a bf16 step, ``buffer_too_small`` for an fp32 one (not a late, misnamed verdict on
    the infinite GEMM times)."""
    from jaxmodel import numerics as nx
    from jaxmodel import precisions as prec
    base = hw_db.device("a100_80gb")
    need = float(ops.gemm.min_local_bytes(float(base.sa_rows), float(base.sa_cols)))
    small = dataclasses.replace(TWO_NODES, device=dataclasses.replace(
        base, local_buffer_bytes=1.2 * need))
    par = jm.Parallelism(dp=16.0)
    words = {p: float(prec.widest_gemm_word(prec.precision(p))) for p in ("bf16", "fp8", "fp32")}
    assert words == {"bf16": 2.0, "fp8": 2.0, "fp32": 4.0}    # fp8: attention stays bf16
    for system, word, want in ((small, 2.0, "ok"), (small, 4.0, "buffer_too_small"),
                               (TWO_NODES, 4.0, "ok")):
        _, why = nx.first_reason(plan.system_checks(plan.TRAIN, system, par, word=word))
        assert jm.reason_name(why) == want, (word, want)


def test_wide_word_rule_with_compute_times_names_infinite_ones_only():
    """Given the step's compute times, the wide-word rule fails only where one is infinite."""
    from jaxmodel import numerics as nx
    base = hw_db.device("a100_80gb")
    need = float(ops.gemm.min_local_bytes(float(base.sa_rows), float(base.sa_cols)))
    small = dataclasses.replace(TWO_NODES, device=dataclasses.replace(
        base, local_buffer_bytes=1.2 * need))
    par = jm.Parallelism(dp=16.0)
    for system, compute, want in ((small, [1e-3, 2e-3], "ok"),
                                  (small, [1e-3, jnp.inf], "buffer_too_small"),
                                  (TWO_NODES, [1e-3, jnp.inf], "ok")):
        _, why = nx.first_reason(plan.system_checks(plan.TRAIN, system, par, word=4.0,
                                                    compute=compute))
        assert jm.reason_name(why) == want, (compute, want)


@pytest.mark.slow
def test_wide_word_rule_spares_steps_whose_gemms_clip_their_tiles():
    """The fp32 buffer rule names the verdict on infinite GEMM times; it does not reject a
    step whose GEMMs are all smaller than the grid's tiles (clipped, they fit the buffer
    that holds no unclipped fp32 tile): a one-token fp32 serving step of a tiny model on
    that device stays feasible and finite, a wide model on a long prompt is
    ``buffer_too_small``."""
    base = hw_db.device("a100_80gb")
    need = float(ops.gemm.min_local_bytes(float(base.sa_rows), float(base.sa_cols)))
    system = hw_db.system("dgx_a100", nodes=1)
    system = dataclasses.replace(system, device=dataclasses.replace(
        base, local_buffer_bytes=1.2 * need))
    d = np.asarray([64.0, 4096.0])
    model = jm.Model(n_layers=2.0, d_model=d, n_heads=4.0, n_kv_heads=4.0, head_dim=d / 4.0,
                     d_ff=2.0 * d, vocab_size=128.0, activation="gelu")
    par = jm.Parallelism(dp=8.0)
    # the attention products read the KV cache's words: a 4-byte cache needs 4-byte tiles
    for p, want in (("bf16", ["ok", "ok"]), ("fp32", ["ok", "buffer_too_small"]),
                    (jm.precision("bf16", kv_bytes=4.0), ["ok", "buffer_too_small"])):
        r = jm.inference(system, model, par, 8.0, np.asarray([1.0, 4096.0]), 4.0, precision=p)
        assert [jm.reason_name(int(w)) for w in np.asarray(r.reason)] == want, p
        assert np.isfinite(np.asarray(r.ttft_s)[0]), p


@pytest.mark.slow     # compiles a whole training step
def test_llama31_405b_pp8_vp8_evaluates():
    """Llama-3.1-405B (126 layers) on 1,024 H100 as NeMo runs it (TP 8, PP 8 × VP 8, CP 2,
    FP8): the embedding and loss slots make the layout valid and the step feasible."""
    par = jm.Parallelism(dp=8, tp=8, pp=8, cp=2, sp=True, micro_batch=1, interleave=8,
                         schedule="interleaved", recompute="selective", zero=1,
                         flash_attention="fa2")
    r = jm.train_step(hw_db.system("dgx_h100", nodes=128), hw_db.model("llama3.1-405b"), par,
                      512, 8192, precision="fp8", dropout=0.0, grad_bytes=2.0, tp_overlap=1.0)
    assert bool(r.feasible), jm.reason_name(r.reason)
    assert np.isfinite(float(r.step_time_s)) and 0.0 < float(r.mfu) < 1.0
