"""Pipeline schedule formulas against hand-derived values (PTD-P §2.2, Korthikanti §4.2.3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmodel.parallel import pipeline as pl

GPIPE, F1B1, INTER = 0.0, 1.0, 2.0


def test_microbatches():
    assert float(pl.n_microbatches(1536.0, 8.0, 2.0)) == 96.0
    assert float(pl.n_microbatches(512.0, 32.0, 1.0)) == 16.0
    # degenerate input stays finite (0), the caller flags it
    assert float(pl.n_microbatches(512.0, 0.0, 1.0)) == 0.0


@pytest.mark.parametrize("sched,p,m,v,expected", [
    (F1B1, 8, 64, 1, 7 / 64),
    (GPIPE, 8, 64, 1, 7 / 64),
    (INTER, 8, 64, 4, 7 / 256),
    (F1B1, 8, 64, 4, 7 / 64),           # interleave ignored without the interleaved schedule
    (INTER, 1, 16, 1, 0.0),
])
def test_bubble_fraction(sched, p, m, v, expected):
    # bubble / ideal time for equal stages of t: (p−1)/v · t / (m · t)
    t = 0.25
    got = float(pl.bubble_time(sched, float(p), float(v), t)) / (m * t)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("sched,p,m,v,expected", [
    (GPIPE, 8, 64, 1, 64.0),                 # GPipe keeps every micro-batch
    (F1B1, 8, 64, 1, 8.0),                   # 1F1B: p on the first stage
    (F1B1, 8, 4, 1, 4.0),                    # ... but never more than m
    (INTER, 8, 64, 3, 8 * (1 + 7 / 24)),     # Korthikanti §4.2.3: p·(1 + (p−1)/(p·v))
    (INTER, 1, 8, 1, 1.0),
])
def test_in_flight(sched, p, m, v, expected):
    got = float(pl.in_flight_microbatches(sched, float(p), float(m), float(v)))
    assert got == pytest.approx(expected)


def test_p2p_bytes():
    # b·s·h·2 / t: GPT-3 175B, b = 1, s = 2048, t = 8 -> 6 MiB per rank
    assert float(pl.p2p_bytes(1.0, 2048.0, 12288.0, 8.0)) == 2048 * 12288 * 2 / 8


def test_pipeline_transfers():
    # 2 per micro-batch and chunk in steady state plus 2(p−1) fill/drain
    assert float(pl.p2p_transfers_on_critical_path(F1B1, 4.0, 16.0, 1.0)) == 2 * (16 + 3)
    assert float(pl.p2p_transfers_on_critical_path(INTER, 4.0, 16.0, 2.0)) == 2 * (32 + 3)
    assert float(pl.p2p_transfers_on_critical_path(F1B1, 1.0, 16.0, 1.0)) == 0.0
    # two stages, one chunk each: one exchange per micro-batch plus the first hop, m + 1
    assert float(pl.p2p_transfers_on_critical_path(F1B1, 2.0, 16.0, 1.0)) == 17.0
    # GPipe pairs nothing: m blocking activation sends, then m gradient sends; by hand with
    # forward f, backward b, transfer x: stage 1 ends its forwards at f + m(f + x), stage 0
    # its backwards m(b + x) + b later, (m + 1)(f + b) + 2m·x = m·t + bubble + 2m·x
    assert float(pl.p2p_transfers_on_critical_path(GPIPE, 2.0, 16.0, 1.0)) == 32.0
    assert float(pl.p2p_transfers_on_critical_path(GPIPE, 4.0, 16.0, 1.0)) == 2 * (16 + 3)
    # ... but the interleaved schedule's chunks wrap around: both directions again
    assert float(pl.p2p_transfers_on_critical_path(INTER, 2.0, 16.0, 2.0)) == 2 * (32 + 1)


def test_pipeline_transfers_jit_grad():
    f = lambda m, p: pl.p2p_transfers_on_critical_path(F1B1, p, m, 1.0)  # noqa: E731
    for p in (1.0, 2.0, 3.0):
        assert float(jax.jit(f)(16.0, p)) == float(f(16.0, p))
        g = jax.grad(f)(16.0, p)
        assert np.isfinite(float(g))
        assert float(g) == {1.0: 0.0, 2.0: 1.0, 3.0: 2.0}[p]   # d transfers / d m
    batch = f(jnp.array([8.0, 8.0, 8.0]), jnp.array([1.0, 2.0, 4.0]))
    np.testing.assert_array_equal(np.asarray(batch), [0.0, 9.0, 22.0])


def test_vectorised_codes():
    sched = jnp.array([GPIPE, F1B1, INTER])
    got = pl.in_flight_microbatches(sched, 4.0, 8.0, 2.0)
    np.testing.assert_allclose(np.asarray(got), [8.0, 4.0, 4 * (1 + 3 / 8)])


@pytest.mark.parametrize("L,p,expected", [
    (126, 8, (15, 16, 15)),       # Megatron --decoder-first/last-pipeline-num-layers 15
    (126, 16, (7, 8, 7)),
    (61, 16, (3, 4, 3)),          # 3 | 13 × 4, 3 | 3
    (96, 8, (12, 12, 12)),        # even
    (3, 2, (2, 2, 1)),            # one light stage: the last (LM head) takes it
    (7, 1, (7, 7, 7)),
    (5, 5, (1, 1, 1)),
])
def test_stage_layers(L, p, expected):
    got = tuple(float(x) for x in pl.stage_layers(float(L), float(p)))
    assert got == tuple(float(e) for e in expected)


def test_stage_layers_is_a_layout():
    """For every p <= L: the first and last counts and p − 2 middle stages of ⌊L/p⌋ or
    ⌈L/p⌉ layers hold exactly L layers, the most loaded holds ⌈L/p⌉ (checked by building
    the layout)."""
    for L in range(1, 80):
        for p in range(1, L + 1):
            first, most, last = (int(x) for x in pl.stage_layers(float(L), float(p)))
            q, c = L // p, -(-L // p)
            assert most == c and first in (q, c) and last in (q, c)
            if p == 1:
                assert first == last == L
                continue
            rest = L - first - last                   # over p − 2 middle stages
            assert (p - 2) * q <= rest <= (p - 2) * c, (L, p)
            assert last == q                          # the head's stage is never heavier


def test_stage_in_flight():
    f, s, l = (float(x) for x in pl.stage_in_flight(F1B1, 8.0, 64.0, 1.0))
    assert (f, s, l) == (8.0, 7.0, 1.0)               # 1F1B: p − k on stage k
    assert tuple(float(x) for x in pl.stage_in_flight(GPIPE, 8.0, 64.0, 1.0)) == (64.0,) * 3
    assert tuple(float(x) for x in pl.stage_in_flight(F1B1, 1.0, 4.0, 1.0)) == (1.0,) * 3
    assert tuple(float(x) for x in pl.stage_in_flight(F1B1, 8.0, 4.0, 1.0)) == (4.0, 4.0, 1.0)
    inter = float(pl.in_flight_microbatches(INTER, 4.0, 8.0, 2.0))
    assert tuple(float(x) for x in pl.stage_in_flight(INTER, 4.0, 8.0, 2.0)) == (inter,) * 3


@pytest.mark.slow
def test_train_step_uneven_stages_slowest_stage():
    """7 vs 8 layers on 4 stages (one train_step batch over n_layers): with a large LM head
    the slowest stage of the 7-layer model is the last (1 layer + head: 2 | 2, 2 | 1), of the
    8-layer one the last too (2 layers + head), so the per-step compute of the slowest stage
    halves while the embedding/head part stays; the memory of the first stage (2 layers +
    embedding) is the same; the breakdown sums to the step."""
    import jaxmodel as jm
    import hw_db
    from jaxmodel import ops

    def roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
        return ops.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + \
            dev.matmul_overhead_s

    model = jm.Model(n_layers=jnp.asarray([7.0, 8.0]), d_model=1024.0, n_heads=16.0,
                     n_kv_heads=16.0, head_dim=64.0, d_ff=4096.0, vocab_size=128000.0)
    par = jm.Parallelism(pp=4, schedule="1f1b", recompute="none")
    r = jm.train_step(hw_db.system("hgx_a100_4gpu"), model, par, 8, 512, gemm=roofline)
    assert np.all(np.asarray(r.feasible))
    c = np.asarray(r.breakdown["compute"])
    assert c[0] == pytest.approx(0.5 * c[1], rel=1e-9)
    e = np.asarray(r.breakdown["embedding"])
    assert e[0] == pytest.approx(e[1], rel=1e-9) and e[0] > 0
    step = np.asarray(r.step_time_s)
    total = sum(np.asarray(v) for v in r.breakdown.values())
    np.testing.assert_allclose(total, step, rtol=1e-9)
    assert step[0] < step[1]
    w = np.asarray(r.memory["weights"])
    assert w[0] == pytest.approx(w[1], rel=1e-9)


# --------------------------------------------------------------------------------------------
# DualPipe (DeepSeek-V3 Technical Report §3.2.1, Table 2; deepseek-ai/DualPipe)
# --------------------------------------------------------------------------------------------
DUAL = pl.DUALPIPE


def test_dualpipe_code_is_the_schedule_name():
    from jaxmodel.types import RECOMPUTE, SCHEDULES, code_of
    assert code_of("dualpipe", SCHEDULES, "schedule") == DUAL == 3.0
    assert code_of("norm_upproj", RECOMPUTE, "recompute") == pl.NORM_UPPROJ == 3.0
    full = pl.is_full_recompute(np.array([0.0, 1.0, 2.0, 3.0]))
    assert np.asarray(full).tolist() == [False, False, True, False]


def test_dualpipe_in_flight_and_transfers_by_hand():
    @jax.jit
    def values():
        return jnp.stack([
            # Table 2: PP + 1 micro-batch-stages per device (capped by m); every rank alike
            pl.in_flight_microbatches(DUAL, 16.0, 120.0, 1.0),
            pl.in_flight_microbatches(DUAL, 16.0, 10.0, 1.0),
            *pl.stage_in_flight(DUAL, 16.0, 120.0, 1.0),
            # only the 2·(p − 1) fill/drain hops are exposed; the 2·m steady ones hidden
            pl.p2p_transfers_on_critical_path(DUAL, 16.0, 120.0, 1.0),
            pl.dualpipe_hidden_transfers(16.0, 120.0), pl.dualpipe_hidden_transfers(1.0, 120.0),
            # bubble (p/2 − 1)(F&B + B − 3W): p = 8, F&B = 5, B = 2, W = 1 → 3 · 4 = 12
            pl.dualpipe_bubble(8.0, 5.0, 2.0, 1.0)])

    assert np.asarray(values()).tolist() == [17.0, 10.0, 17.0, 17.0, 17.0, 30.0, 240.0, 0.0,
                                             12.0]


def test_dualpipe_state_factor():
    # ZeRO-1: optimizer states sharded over both copies' 2·dp ranks; weights and
    # gradients held twice (two stages per rank)
    f = [float(pl.dualpipe_state_factor(z, 1.0)) for z in (3.0, 2.0, 1.0)]
    assert f == [2.0, 2.0, 1.0]
    assert float(pl.dualpipe_state_factor(1.0, 0.0)) == 2.0
    assert float(pl.dualpipe_state_factor(3.0, 3.0)) == 1.0


def test_dualpipe_vmap_matches_loop():
    pp = jnp.array([2.0, 4.0, 8.0, 16.0])
    m = jnp.array([4.0, 9.0, 16.0, 120.0])
    fb = jnp.array([1.0, 2.0, 3.0, 0.5])

    def one(p, mm, f):
        return (pl.in_flight_microbatches(DUAL, p, mm, 1.0)
                + pl.p2p_transfers_on_critical_path(DUAL, p, mm, 1.0)
                + pl.dualpipe_bubble(p, f, 0.4 * f, 0.2 * f))

    batched = jax.jit(jax.vmap(one))(pp, m, fb)
    single = jax.jit(one)
    loop = jnp.stack([single(a, b, c) for a, b, c in zip(pp, m, fb)])
    np.testing.assert_allclose(np.asarray(batched), np.asarray(loop), rtol=1e-6)


def test_dualpipe_and_norm_upproj_plan_rules():
    import hw_db
    import jaxmodel as jm
    from jaxmodel.parallel import plan
    ds, llama = hw_db.model("deepseek-v3"), hw_db.model("llama2-7b")

    def failing(model, batch, **kw):
        p = plan.inputs(model, jm.Parallelism(**kw), n_devices=float(
            kw.get("dp", 1) * kw.get("pp", 1)), batch=batch, seq_len=4096.0)
        return [why for ok, why in plan.structure_checks(plan.TRAIN, p, np) if not bool(ok)]

    assert failing(ds, 15360.0, dp=128, pp=16, ep=64, schedule="dualpipe",
                   recompute="norm_upproj") == []
    assert failing(ds, 15360.0, dp=128, pp=15, ep=64,
                   schedule="dualpipe") == ["invalid_parallelism"]            # odd pp
    assert failing(ds, 128.0 * 30, dp=128, pp=16, ep=64,
                   schedule="dualpipe") == ["batch_not_divisible"]            # m = 30 < 32
    assert failing(ds, 128.0 * 33, dp=128, pp=16, ep=64,
                   schedule="dualpipe") == ["batch_not_divisible"]            # m odd
    assert failing(llama, 64.0, dp=8, pp=2,
                   recompute="norm_upproj") == ["invalid_parallelism"]        # no MLA


def test_overlapped_p2p_hand_values():
    """Megatron-core ``overlap_p2p_comm`` (interleaved): of the first stage's warm-up and
    cool-down exchanges (W = 2·(p−1) + (v−1)·p each) all but the 2·(p−1) that pass in the
    bubble stay serial, the steady ones show only their excess over one chunk; other
    schedules, p = 1 and m = p keep the serial count."""
    p, v, m, t = 4.0, 20.0, 32.0, 1e-3
    serial = 2 * (m * v + p - 1) * t
    assert float(pl.overlapped_p2p_time(2.0, p, m, v, t, (5e-3, 1e-2))) == pytest.approx(
        2 * (82 - 3) * t)
    slow = 2e-2       # transfers longer than the chunks: the excess shows
    assert float(pl.overlapped_p2p_time(2.0, p, m, v, slow, (5e-3, 1e-2))) == (
        pytest.approx(2 * 79 * slow + 558 * (slow - 5e-3 + slow - 1e-2)))
    assert float(pl.overlapped_p2p_time(2.0, p, m, v, t, (0.0, 0.0))) <= serial * (1 + 1e-9)
    one = float(pl.p2p_transfers_on_critical_path(1.0, p, m, 1.0)) * t
    assert float(pl.overlapped_p2p_time(1.0, p, m, 1.0, t, (5e-3, 1e-2))) == one
    assert float(pl.overlapped_p2p_time(2.0, 1.0, m, v, t, (5e-3, 1e-2))) == 0.0
    assert float(pl.overlapped_p2p_time(2.0, p, p, v, t, (5e-3, 1e-2))) == pytest.approx(
        2 * (p * v + p - 1) * t)                  # m = p: all warm-up, nothing overlaps
