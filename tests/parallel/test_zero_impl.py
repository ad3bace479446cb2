"""``Parallelism.zero3_impl`` through ``jm.train_step``: ZeRO-3 as FSDP runs it (the default)
and as DeepSpeed ran it in 2021, against compositions of ``jaxmodel.parallel.zero``."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.parallel import train as tr
from jaxmodel.parallel import zero
from jaxmodel.workload import params
from testkit import roofline_gemm

SYS = hw_db.system("dgx_a100", nodes=2)              # 16 A100, the DP ring crosses InfiniBand
MODEL = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=51200.0, name="gpt-small")
B, S, DP, MB = 64.0, 512.0, 16.0, 2.0
M = B / (DP * MB)                                    # micro-batches per step


def par(impl=None, recompute="full"):
    kw = {} if impl is None else {"zero3_impl": impl}
    return jm.Parallelism(dp=DP, micro_batch=MB, recompute=recompute, zero=3, **kw)


def step(p, system=SYS, **kw):
    return jm.train_step(system, MODEL, p, B, S, gemm=roofline_gemm, grad_bytes=2.0, **kw)


@pytest.fixture(scope="module")
def batch():
    """One call: implementations × recomputation, as codes in the vmapped graph."""
    codes = jnp.asarray([0.0, 1.0, 0.0, 1.0])
    rcs = jnp.asarray([2.0, 2.0, 1.0, 1.0])
    p = dataclasses.replace(par(), zero3_impl=codes, recompute=rcs)
    return step(p)


def _coll(op, nbytes):
    return float(jm.collective_latency(SYS, op, nbytes, DP))


def test_names_and_default():
    assert par().zero3_impl == 0.0 and par("fsdp").zero3_impl == 0.0
    assert par("deepspeed").zero3_impl == 1.0 and par("DeepSpeed").zero3_impl == 1.0
    with pytest.raises(ValueError, match="zero3_impl"):
        par("megatron")


@pytest.mark.slow
def test_fsdp_is_the_zero3_step_composition(batch):
    """Default (FSDP), serial blend (dp_overlap = 0): the ZeRO part is the standalone
    collectives of :func:`zero.zero3_step` — per micro-batch and unit two gathers and one
    reduce-scatter of the unit's flat parameters — plus FSDP2's copy-out / copy-in kernels
    (:func:`zero.impl_costs`: 2·2 B and 2 + 2 B per unit parameter here), and the batch
    entry equals it."""
    n_par = float(params.params_per_device(MODEL, par()))
    units = float(MODEL.n_layers)
    g = _coll("all_gather", 2.0 * n_par / units)
    r = _coll("reduce_scatter", 2.0 * n_par / units)
    costs = zero.impl_costs(0.0, 2.0, 2.0)
    z = zero.zero3_step(SYS, n_par, units, 1.0, 1.0, DP, M, collective_times=(g, r, 0.0),
                        copy_out_bytes=costs["copy_out_bytes"],
                        copy_in_bytes=costs["copy_in_bytes"])
    t_o = t_i = float(jm.elementwise_latency(SYS.device, n_par / units, 4.0, 0.0))
    assert float(z["copies"]) == pytest.approx(M * units * (2 * t_o + t_i), rel=1e-9)
    serial = step(par(), dp_overlap=0.0).breakdown["dp_comm"]
    assert float(serial) == pytest.approx(
        float(z["gather"] + z["reduce_scatter"] + z["copies"]), rel=1e-9)
    assert float(z["gather"] + z["reduce_scatter"]) == pytest.approx(
        M * units * (2 * g + r), rel=1e-12)
    default = step(par())
    assert float(batch.step_time_s[0]) == pytest.approx(float(default.step_time_s), rel=1e-12)
    assert float(step(par("fsdp")).step_time_s) == float(default.step_time_s)


def test_deepspeed_hand_value(batch):
    """DeepSpeed 2021: serial, so whatever dp_overlap the ZeRO part is M·n·(3·g + r) under
    full recomputation (2·g + r under selective), g and r the per-tensor calls of one layer
    (4 matrices gathered; 12 tensors reduce-scattered) at the calibrated ring efficiency."""
    el, cnt = zero.layer_tensors(MODEL)
    g, ok_g = zero.per_tensor_collectives(SYS, "all_gather", el, DP, counts=cnt)
    r, ok_r = zero.per_tensor_collectives(SYS, "reduce_scatter", el, DP, counts=cnt)
    assert bool(ok_g & ok_r)
    n = float(MODEL.n_layers)
    nccl_only = sum(_coll("all_gather", 2 * float(x)) for x in el[:4])
    assert float(g) > nccl_only / zero.FLAT_RING_EFFICIENCY      # + the list API's copies
    full, sel = (float(batch.breakdown["dp_comm"][i]) for i in (1, 3))
    assert full == pytest.approx(M * n * (3 * float(g) + float(r)), rel=1e-9)
    assert sel == pytest.approx(M * n * (2 * float(g) + float(r)), rel=1e-9)
    # the rest of the step is the implementation's business only through memory
    for k in tr.BREAKDOWN_KEYS:
        if k != "dp_comm":
            assert float(batch.breakdown[k][1]) == pytest.approx(
                float(batch.breakdown[k][0]), rel=1e-12), k
    # DeepSpeed: no prefetched unit alive (one unit's weights fewer) but its 16-bit shard
    # beside the fp32 master, which FSDP2 does not keep (zero.impl_costs)
    n_par = float(params.params_per_device(MODEL, par()))
    assert float(batch.memory["weights"][0] - batch.memory["weights"][1]) == pytest.approx(
        2.0 * n_par / n - 2.0 * n_par / DP, rel=1e-9)
    # serial per-tensor calls cost more than FSDP's overlapped flat units
    assert float(batch.step_time_s[1]) > float(batch.step_time_s[0])


@pytest.mark.slow
def test_deepspeed_is_serial_whatever_dp_overlap(batch):
    """DeepSpeed 2021's ZeRO-3 part is serial: dp_overlap = 0 gives the overlapped batch's
    value (one more compile of a scalar plan, hence slow)."""
    full = float(batch.breakdown["dp_comm"][1])
    assert float(step(par("deepspeed"), dp_overlap=0.0).breakdown["dp_comm"]) == (
        pytest.approx(full, rel=1e-12))


@pytest.mark.slow
def test_vmap_matches_loop(batch):
    for i, (impl, rc) in enumerate((("fsdp", "full"), ("deepspeed", "full"),
                                    ("fsdp", "selective"), ("deepspeed", "selective"))):
        r = step(par(impl, rc))
        assert float(r.step_time_s) == pytest.approx(float(batch.step_time_s[i]), rel=1e-12)
        assert float(r.memory_bytes) == pytest.approx(float(batch.memory_bytes[i]), rel=1e-12)


@pytest.mark.slow
def test_without_zero3_the_option_changes_nothing():
    p = jm.Parallelism(dp=DP, micro_batch=MB, recompute="full", zero=1)
    a, b = step(p), step(dataclasses.replace(p, zero3_impl=1.0))
    assert float(a.step_time_s) == float(b.step_time_s)


@pytest.mark.slow
def test_grad_and_jit_vs_eager():
    """d step / d (InfiniBand bandwidth) of the DeepSpeed plan: finite, negative and the
    finite difference (float64); the eager single call equals the jitted one."""
    p = par("deepspeed")

    def system_at(ib_bw):
        lv = list(SYS.levels)
        lv[1] = dataclasses.replace(lv[1], bw_per_device=ib_bw)
        return dataclasses.replace(SYS, levels=tuple(lv))

    def t(ib_bw):
        return tr.train_step_single(system_at(ib_bw), MODEL, p, B, S, gemm=roofline_gemm,
                                    grad_bytes=2.0).step_time_s

    x0 = float(SYS.levels[1].bw_per_device)
    d = float(jax.jit(jax.grad(t))(x0))
    h = x0 * 1e-4
    fd = (float(t(x0 + h)) - float(t(x0 - h))) / (2 * h)
    assert np.isfinite(d) and d < 0
    assert d == pytest.approx(fd, rel=1e-3)
    with jax.disable_jit():
        e = float(t(x0))
    assert e == pytest.approx(float(step(p).step_time_s), rel=1e-9)


@pytest.mark.slow
def test_float32(float32):
    r = step(par("deepspeed"))
    assert r.step_time_s.dtype == jnp.float32 and np.isfinite(float(r.step_time_s))
    ref = float(jnp.asarray(r.breakdown["dp_comm"]))
    el, cnt = zero.layer_tensors(MODEL)
    g = zero.per_tensor_collectives(SYS, "all_gather", el, DP, counts=cnt)[0]
    rs = zero.per_tensor_collectives(SYS, "reduce_scatter", el, DP, counts=cnt)[0]
    assert ref == pytest.approx(M * float(MODEL.n_layers) * (3 * float(g) + float(rs)),
                                rel=1e-4)


def test_search_keeps_the_default_and_cli_has_the_flag():
    from jaxmodel import cli
    from jaxmodel.search import parallelism as sp
    plans = sp.enumerate_plans(MODEL, 16, 64)
    assert len(plans["zero3_impl"]) > 0 and not np.any(plans["zero3_impl"])
    a = cli.parser().parse_args(["predict", "train", "--zero", "3", "--zero3-impl",
                                 "deepspeed"])
    assert cli._spec_from_args(a)["parallelism"]["zero3_impl"] == "deepspeed"
