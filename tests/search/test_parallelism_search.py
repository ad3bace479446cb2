"""Parallelism-plan enumeration (fast) and the ranked search (slow: compiles a train step)."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.search.parallelism import PAR_FIELDS, _scaled_system, enumerate_plans
from jaxmodel.types import RECOMPUTE, SCHEDULES


def brute_force(model, n, gb):
    """Every plan by nested loops over all candidate values, filtered by the rules."""
    L, H, Hkv, E = (int(model.n_layers), int(model.n_heads), int(model.n_kv_heads),
                    int(model.n_experts))
    rows = set()
    rng = range(1, n + 1)
    for dp, tp, pp in itertools.product(rng, rng, rng):
        if dp * tp * pp != n or H % tp or not (Hkv % tp == 0 or tp % Hkv == 0) or pp > L:
            continue
        if gb % dp:
            continue
        for mb in range(1, gb // dp + 1):
            if (gb // dp) % mb:
                continue
            m = gb // (dp * mb)
            for sched, v in itertools.product((0, 1, 2), range(1, L + 3)):
                if sched < 2 and v != 1:
                    continue
                # interleaved: pp·v divides L plus 0, 1 or 2 slots (embedding, loss)
                slots_ok = any((L + s) % (pp * v) == 0 for s in (0, 1, 2))
                if sched == 2 and (pp == 1 or v < 2 or not slots_ok or m % pp):
                    continue
                # attention kernels: the search's default, standard and FlashAttention-2
                for sp, ep, rc, z, fa in itertools.product((0, 1), range(1, E + 1), (0, 1, 2),
                                                           (0, 1, 2, 3), (0, 2)):
                    # experts over the data-parallel ranks (ep | dp) or folded over the TP
                    # ranks too (dp | ep, ep/dp | tp); ep | E
                    ep_ok = dp % ep == 0 or (ep % dp == 0 and tp % (ep // dp) == 0)
                    if (sp and tp == 1) or E % ep or not ep_ok or (z and dp == 1):
                        continue
                    rows.add((dp, tp, pp, sp, ep, mb, v, sched, rc, z, fa))
    return rows


@pytest.mark.parametrize("name, n, gb", [("gpt2-small", 8, 16), ("llama3-8b", 12, 24),
                                         ("mixtral-8x7b", 8, 8)])
def test_enumeration_matches_brute_force(name, n, gb):
    model = hw_db.model(name)
    plans = enumerate_plans(model, n, gb)
    got = {tuple(int(plans[f][i]) for f in ("dp", "tp", "pp", "sp", "ep", "micro_batch",
                                             "interleave", "schedule", "recompute", "zero",
                                             "flash_attention"))
           for i in range(len(plans["dp"]))}
    assert len(got) == len(plans["dp"])              # no duplicates
    want = brute_force(model, n, gb)
    # the symmetric difference, not the sets: pytest's diff of thousands of tuples takes minutes
    assert not (got ^ want), sorted(got ^ want)[:10]


def test_enumeration_options_restrict_the_space():
    model = hw_db.model("gpt3-13b")
    full = enumerate_plans(model, 16, 32)
    few = enumerate_plans(model, 16, 32, schedules=("1f1b",), recompute=("full",), zero=(1,),
                          sp=(True,), flash_attention=(False,), max_tp=4)
    assert 0 < len(few["dp"]) < len(full["dp"])
    assert set(few["schedule"]) == {1.0} and set(few["recompute"]) == {2.0}
    assert set(few["tp"]) <= {1.0, 2.0, 4.0}
    assert set(few["zero"]) <= {0.0, 1.0}             # ZeRO only with dp > 1
    n = few["dp"] * few["tp"] * few["pp"]
    assert np.all(n == 16)


@pytest.mark.parametrize("kw, match", [({"n_devices": 0}, "n_devices"),
                                       ({"global_batch": 2.5}, "global_batch"),
                                       ({"schedules": ("zigzag",)}, "zigzag"),
                                       ({"zero": (4,)}, "zero")])
def test_enumeration_bad_arguments(kw, match):
    args = dict(n_devices=8, global_batch=16) | kw
    with pytest.raises(ValueError, match=match):
        enumerate_plans(hw_db.model("gpt2-small"), **args)


def test_scaled_system_resizes_outer_level():
    s = hw_db.system("dgx_a100", nodes=2)
    big = _scaled_system(s, 64)
    assert float(big.n_devices) == 64
    assert float(big.levels[0].size) == float(s.levels[0].size)
    with pytest.raises(ValueError, match="multiple"):
        _scaled_system(s, 12)


@pytest.mark.slow
def test_search_ranks_plans_and_matches_direct_evaluation():
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("gpt2-small")
    df = jm.search_parallelism(system, model, 4, 8, 256, progress=False,
                               step_options={"dp_overlap": [0.0, 1.0]})
    plans = enumerate_plans(model, 4, 8, seq_len=256.0)
    assert df.attrs["n_evaluated"] == len(df) == 2 * len(plans["dp"])
    t = df["step_time_s"].to_numpy()
    assert np.all(np.diff(t[np.isfinite(t)]) >= 0) and np.isfinite(t[0])
    assert not df.select_dtypes("number").isna().any().any()
    best = df.iloc[0]
    par = jm.Parallelism(**{f: (best[f] if f not in ("schedule", "recompute") else best[f])
                            for f in PAR_FIELDS})
    ref = jm.train_step(system, model, par, 8, 256, dp_overlap=float(best["dp_overlap"]))
    assert float(ref.step_time_s) == pytest.approx(best["step_time_s"], rel=1e-5)
    assert math.isfinite(best["mfu"]) and 0 < best["mfu"] < 1


@pytest.mark.slow
def test_search_rows_match_a_flat_evaluation():
    """The (plan, precision) × step-option layout of the search gives every row the value a
    flat batched train_step gives it (rows in their places)."""
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("gpt2-small")
    df = jm.search_parallelism(system, model, 4, 8, 256, progress=False,
                               step_options={"grad_bytes": [2.0, 4.0],
                                             "dp_overlap": [0.0, 1.0]},
                               precision=["bf16", "fp16"])
    idx = {p: i for i, p in enumerate(("bf16", "fp16"))}
    names = {"schedule": SCHEDULES, "recompute": RECOMPUTE}
    par = jm.Parallelism(**{f: (np.asarray([names[f].index(x) for x in df[f]], float)
                                if f in names else df[f].to_numpy()) for f in PAR_FIELDS})
    from jaxmodel import precisions as presets
    prec = presets.stack_precisions([presets.precision(p) for p in ("bf16", "fp16")])
    rows = df["precision"].map(idx).to_numpy()
    prec = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)[rows]), prec)
    ref = jm.train_step(system, model, par, 8.0, 256.0, precision=prec,
                        grad_bytes=df["grad_bytes"].to_numpy(),
                        dp_overlap=df["dp_overlap"].to_numpy())
    for field in ("step_time_s", "memory_bytes"):
        np.testing.assert_allclose(df[field].to_numpy(), np.asarray(getattr(ref, field)),
                                   rtol=1e-5)


def _roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    return jm.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


def _feasible_or_oom(name, n, gb, seq):
    model = hw_db.model(name)
    plans = enumerate_plans(model, n, gb, seq_len=seq)
    par = jm.Parallelism(**{k: jnp.asarray(plans[k]) for k in PAR_FIELDS})
    system = hw_db.system("dgx_a100", nodes=n // 8)
    r = jm.train_step(system, model, par, float(gb), float(seq), gemm=_roofline)
    why = np.asarray(r.reason)
    bad = ~np.isin(why, [0, jm.numerics.reason_code("out_of_memory")])
    assert not bad.any(), (name, n, sorted({jm.reason_name(c) for c in why[bad]}))
    return len(plans["dp"]), int(np.sum(np.asarray(r.feasible)))


@pytest.mark.slow
def test_every_enumerated_mixtral_plan_on_8_devices_is_feasible_or_out_of_memory():
    """The enumeration and train_step read the same rules: nothing the search calls
    consistent comes back infeasible for any reason but memory (Mixtral-8x7B does not fit
    8 A100-80GB for training: every plan is out of memory, none inconsistent)."""
    n_plans, _ = _feasible_or_oom("mixtral-8x7b", 8, 16, 2048)
    assert n_plans > 1000


@pytest.mark.slow
@pytest.mark.parametrize("name, n, gb, seq", [("mixtral-8x7b", 128, 256, 4096),
                                              ("llama3-8b", 16, 32, 2048)])
def test_every_enumerated_plan_is_feasible_or_out_of_memory(name, n, gb, seq):
    n_plans, n_ok = _feasible_or_oom(name, n, gb, seq)
    assert n_plans > 1000 and n_ok > 0


def test_moe_enumeration_keeps_only_ep_over_dp_or_folded_over_tp():
    """EP over the data-parallel ranks (ep | dp) or folded over the TP ranks too (dp | ep
    with ep/dp | tp: expert tensor parallelism tp·dp/ep)."""
    plans = enumerate_plans(hw_db.model("mixtral-8x7b"), 8, 8)
    dp, ep, tp = plans["dp"], plans["ep"], plans["tp"]
    folded = (ep % dp == 0) & (tp % np.maximum(ep // dp, 1.0) == 0)
    assert np.all((dp % ep == 0) | folded) and set(ep) == {1.0, 2.0, 4.0, 8.0}
    assert np.any((ep > dp) & folded)              # e.g. tp 8 with ep 8 over the same GPUs


def test_context_parallel_degrees_are_enumerated_through_the_plan_rules():
    """cp ∈ {1, 2, 4, 8, 16} with dp·tp·pp·cp = n and the sequence split into 2·cp chunks
    (and s/cp divisible by tp under SP); without a sequence length only cp = 1."""
    model = hw_db.model("llama3-8b")
    plans = enumerate_plans(model, 16, 32, seq_len=24.0, schedules=("1f1b",),
                            recompute=("full",), zero=(1,), flash_attention=(True,))
    cp, dp, tp, pp, sp = (plans[k] for k in ("cp", "dp", "tp", "pp", "sp"))
    assert set(cp.tolist()) == {1.0, 2.0, 4.0}         # 2·8 = 16 does not divide 24
    np.testing.assert_array_equal(dp * tp * pp * cp, 16.0)
    assert np.all(24.0 % (2.0 * cp[cp > 1]) == 0)
    assert np.all(((24.0 / cp) % tp == 0) | (sp == 0))
    # the same plans with cp = 1 (dp absorbing cp) are there too
    base = {(int(t), int(p)) for t, p, c in zip(tp, pp, cp) if c == 1}
    assert {(int(t), int(p)) for t, p, c in zip(tp, pp, cp) if c == 4} <= base
    assert set(enumerate_plans(model, 16, 32)["cp"].tolist()) == {1.0}
    only = enumerate_plans(model, 16, 32, seq_len=4096.0, cp=(1,))
    assert set(only["cp"].tolist()) == {1.0}
