"""Fuzz test of convention 4 (docs/architecture.md): no NaN, no silent infinity.

Random devices — log-uniform over eight decades around an A100, with zeros, negative values,
tiny buffers and (in a separate set) magnitudes whose products overflow the float range — and
random workloads (including batch or sequence −1 and 0, GEMM dimensions up to 2**31−1) go
through every public model function in a few batched, jitted calls. Every result must be
NaN-free; where a function reports feasibility, a feasible result must be finite and an
infeasible one ``+inf``; gradients with respect to every device field must be finite
everywhere, infeasible points included.

Sizes: ``N_DEVICES`` devices through the operators and the cost model, ``N_PLANS`` plans
(a dense and an MoE model, standard and flash attention, mixed in one batch so that they
share one compilation) through the layer and inference models. Training, the gradients
through whole layers and jit/vmap/grad of the layer-level API compile the whole model again
and are ``slow``, as is the big variant (10**6 devices, 10**5 plans).
A failure prints the offending count and the first offending index.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import numerics as nx
from jaxmodel.workload.layer import Work

SEED = 20_26_11_24
N_DEVICES = 50_000        # operators and cost model (62,500 with the overflowing quarter)
N_PLANS = 1_000           # layer / inference / training (dense and MoE mixed)
N_GRAD = 1_024            # gradient points of the operators and the cost model
N_GRAD_PLANS = 64         # gradient points through the layer and inference models

# Fields whose absurd values are explored (the rest stay at the A100's). Area-only fields are
# left to the area model's own fallbacks unless listed.
_FIELDS = ("freq_hz", "core_count", "lanes_per_core", "vector_width", "vector_flops_per_cycle",
           "sa_rows", "sa_cols", "sa_mac_per_cycle", "local_buffer_bytes",
           "global_buffer_bytes", "global_buffer_bytes_per_cycle", "mem_bw", "mem_capacity",
           "exp_flops", "mem_bw_efficiency", "matmul_overhead_s", "softmax_overhead_s",
           "layernorm_overhead_s", "gelu_overhead_s", "process_node_nm", "physical_core_count",
           "mem_channels", "device_links", "tdp_w", "regfile_ports", "lane_fp16_units")


def _huge():
    """A field value whose square overflows the float range (1.4e30 in float32, 1e246 in
    float64)."""
    return float(jnp.finfo(jnp.result_type(float)).max) ** 0.8


def _field_values(rng, nominal, n, huge):
    """Log-uniform over ±4 decades around ``nominal``; 4 % zero, 4 % negative, 10 % nominal;
    with ``huge`` another 4 % at :func:`_huge` (products overflow)."""
    mag = abs(float(nominal)) or 1.0
    x = mag * 10.0 ** rng.uniform(-4.0, 4.0, n)
    u = rng.uniform(size=n)
    x = np.where(u < 0.04, 0.0, x)
    x = np.where((u >= 0.04) & (u < 0.08), -x, x)
    x = np.where((u >= 0.08) & (u < 0.18), float(nominal), x)
    if huge:
        x = np.where((u >= 0.18) & (u < 0.22), _huge(), x)
    return x


def random_devices(rng, n, huge=False):
    """``n`` random devices (a batched :class:`jaxmodel.Device`). Half keep the A100's values
    except for clock, core count, bandwidth and the two buffers (tiny buffers included), so
    that feasible points are plentiful; the other half vary every field of ``_FIELDS``."""
    base = hw_db.device("a100_80gb")
    keep = rng.uniform(size=n) < 0.5
    varied = ("freq_hz", "core_count", "mem_bw", "local_buffer_bytes", "global_buffer_bytes")
    kw = {}
    for f in _FIELDS:
        nominal = getattr(base, f)
        if f.endswith("overhead_s"):
            nominal = nominal or 1e-6
        if f in ("physical_core_count", "regfile_ports", "lane_fp16_units"):
            nominal = {"physical_core_count": 128.0, "regfile_ports": 2.0,
                       "lane_fp16_units": 16.0}[f]
        v = _field_values(rng, nominal, n, huge)
        kw[f] = v if f in varied else np.where(keep, float(getattr(base, f)), v)
    # 5 % of the devices get buffers just below / above the smallest tiles (the boundary)
    edge = rng.uniform(size=n) < 0.05
    kw["local_buffer_bytes"] = np.where(edge, 2.0 ** rng.uniform(8, 17, n),
                                        kw["local_buffer_bytes"])
    kw["global_buffer_bytes"] = np.where(edge, 2.0 ** rng.uniform(14, 22, n),
                                         kw["global_buffer_bytes"])
    kw["vector_dtype_bytes"] = rng.choice([-1.0, 0.0, 1.0, 2.0, 4.0], n,
                                          p=[0.02, 0.02, 0.06, 0.6, 0.3])
    return dataclasses.replace(base, **{k: jnp.asarray(v) for k, v in kw.items()})


def _dims(rng, n, hi=16):
    """GEMM / vector dimensions: log-uniform 1..2**hi, 5 % in {−1, 0, 2**31−1, 1e12}."""
    d = np.round(2.0 ** rng.uniform(0, hi, n))
    odd = rng.uniform(size=n) < 0.05
    return np.where(odd, rng.choice([-1.0, 0.0, 2.0 ** 31 - 1, 1e12], n), d)


def _system(dev, rng, n):
    """The 4-GPU LLMCompass node with the random device and random NVLink bandwidth (incl.
    zero and negative) and latency."""
    sysm = hw_db.system("hgx_a100_4gpu")
    lv = sysm.levels[0]
    lv = dataclasses.replace(lv, bw_per_device=jnp.asarray(_field_values(rng, lv.bw_per_device,
                                                                         n, False)),
                             link_latency=jnp.asarray(np.abs(_field_values(
                                 rng, lv.link_latency or 1e-6, n, False))))
    return dataclasses.replace(sysm, device=dev, levels=(lv,))


def mixed_models(rng, n):
    """A batched :class:`jaxmodel.Model`: GPT-3 13B (dense, GELU) or Mixtral 8×7B (MoE,
    SwiGLU, GQA) per point, both divisible by tp = 4."""
    dense, moe = hw_db.model("gpt3-13b"), hw_db.model("mixtral-8x7b")
    pick = rng.uniform(size=n) < 0.5
    kw = {f.name: jnp.asarray(np.where(pick, float(getattr(moe, f.name)),
                                       float(getattr(dense, f.name))))
          for f in dataclasses.fields(jm.Model) if not isinstance(getattr(dense, f.name), str)}
    return dataclasses.replace(dense, **kw), pick


def _fail(msg, bad):
    idx = np.flatnonzero(bad)
    return f"{msg}: {idx.size} points (first index {idx[:5].tolist()})"


def assert_no_nan(name, x):
    x = np.asarray(x, dtype=np.float64)
    assert not np.isnan(x).any(), _fail(f"{name} NaN", np.isnan(x))


def assert_feasible_finite(name, t, feasible):
    t = np.asarray(t, dtype=np.float64)
    feasible = np.broadcast_to(np.asarray(feasible, dtype=bool), t.shape)
    assert_no_nan(name, t)
    assert np.isfinite(t[feasible]).all(), _fail(f"{name} feasible but not finite",
                                                 feasible & ~np.isfinite(t))
    assert np.isposinf(t[~feasible]).all(), _fail(f"{name} infeasible but not +inf",
                                                  ~feasible & ~np.isposinf(t))


# ------------------------------------------------------------------------------------------
# fixtures: one batch of each kind, evaluated once per module, in the suite's precision
# (float32 agreement of the operators: tests/test_numerics_batching.py)
# ------------------------------------------------------------------------------------------
def _ops_results(n, seed, n_huge=0):
    """``n`` devices: the last ``n_huge`` of them with overflowing fields. One batch,
    so each function compiles once."""
    rng = np.random.default_rng(seed)
    wide, huge = random_devices(rng, n - n_huge), random_devices(rng, n_huge, True)
    dev = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([jnp.broadcast_to(
        a, (n - n_huge,)), jnp.broadcast_to(b, (n_huge,))]), wide, huge)
    m, k, c = _dims(rng, n), _dims(rng, n), _dims(rng, n)
    ok, why = jm.ops_feasible(dev)
    sysm = _system(dev, rng, n)
    out = {
        "ok": np.asarray(ok), "why": np.asarray(why), "m": m, "k": k, "c": c,
        "gemm": jm.gemm_latency(dev, m, c, k),
        "softmax": jm.softmax_latency(dev, m, c),
        "layernorm": jm.layernorm_latency(dev, m, c),
        "gelu": jm.gelu_latency(dev, m * c),
        "all_reduce": jm.collective_latency(sysm, "all_reduce", m * c, 4.0),
        "all_to_all": jm.collective_latency(sysm, "all_to_all", m * c, 4.0),
    }
    area = jm.die_area(dev)
    out.update({f"die_area.{key}": v for key, v in area.items()})
    out["device_cost"] = jm.device_cost(dev).total_usd
    out["system_cost"] = jm.system_cost(sysm).total_usd
    rate = np.where(np.random.default_rng(seed + 1).uniform(size=n) < 0.1, 0.0, m * 10.0)
    t = jm.tco(sysm, tokens_per_s=rate, run_time_s=k)
    out.update({"tco.usd_per_hour": t.usd_per_hour,
                "tco.usd_per_million_tokens": t.usd_per_million_tokens,
                "tco.usd_per_run": t.usd_per_run})
    out = {key: np.asarray(v) for key, v in out.items()}
    return ({k: v[:n - n_huge] for k, v in out.items()},
            {k: v[n - n_huge:] for k, v in out.items()})


def _plan_results(n, seed, train=False):
    rng = np.random.default_rng(seed)
    dev = random_devices(rng, n)
    sysm = _system(dev, rng, n)
    model, is_moe = mixed_models(rng, n)
    # standard attention, FlashAttention-1 and -2 in one batch
    par = jm.Parallelism(tp=4, flash_attention=jnp.asarray(rng.choice([0.0, 1.0, 2.0], n)))
    batch = np.where(rng.uniform(size=n) < 0.05, rng.choice([-1.0, 0.0], n),
                     np.round(2.0 ** rng.uniform(0, 4, n)))
    seq = np.where(rng.uniform(size=n) < 0.05, rng.choice([-1.0, 0.0], n),
                   np.round(2.0 ** rng.uniform(0, 11, n)))
    ok, _ = jm.ops_feasible(dev)
    lv = sysm.levels[0]
    net_ok = np.asarray((lv.bw_per_device > 0) & jnp.isfinite(lv.bw_per_device)
                        & (lv.link_latency >= 0) & jnp.isfinite(lv.link_latency))
    out = {"ops_ok": np.asarray(ok), "is_moe": is_moe, "net_ok": net_ok,
           "workload_ok": (batch > 0) & (seq > 0)}
    if train:
        out["train"] = jm.train_step(sysm, model, par, batch * 4.0, seq)
    else:
        out["layer"] = {k: np.asarray(v) for k, v in jm.layer_breakdown(
            sysm, model, par, batch, seq).items()}
        out["inference"] = jm.inference(sysm, model, par, batch * 4.0, seq, 8.0)
    return out


@pytest.fixture(scope="module")
def _ops():
    return _ops_results(N_DEVICES + N_DEVICES // 4, SEED, n_huge=N_DEVICES // 4)


@pytest.fixture(scope="module")
def ops_wide(_ops):
    return _ops[0]


@pytest.fixture(scope="module")
def ops_huge(_ops):
    return _ops[1]


@pytest.fixture(scope="module")
def plans():
    return _plan_results(N_PLANS, SEED + 2)


@pytest.fixture(scope="module")
def train_plans():
    return _plan_results(N_PLANS, SEED + 2, train=True)


# ------------------------------------------------------------------------------------------
# operators
# ------------------------------------------------------------------------------------------
OPS = ("gemm", "softmax", "layernorm", "gelu", "all_reduce", "all_to_all")


@pytest.mark.parametrize("op", OPS)
def test_ops_never_nan(ops_wide, op):
    assert_no_nan(op, ops_wide[op])


def test_ops_counts_cover_both_sides(ops_wide):
    """The sample exercises feasible and infeasible devices for every reason."""
    why = ops_wide["why"]
    for reason in ("ok", "invalid_device", "buffer_too_small"):
        assert np.sum(why == nx.reason_code(reason)) > 0.02 * why.size, reason


def test_ops_feasible_exactly_when_some_tile_fits():
    """``ops_feasible`` ⇔ some unclipped candidate of the GEMM grid has its L1 tile
    (double buffered, ``tk = 1``, fp16) in the local buffer and its L2 working set in the
    global buffer — derived here by hand over the grid, on devices straddling the boundary."""
    from jaxmodel.ops.gemm import GRID
    rng = np.random.default_rng(SEED + 8)
    n = 4000
    base = hw_db.device("a100_80gb")
    sa = rng.choice([4.0, 8.0, 16.0, 32.0, 128.0, 512.0], n)
    local = 2.0 ** rng.uniform(6, 22, n)
    glob = 2.0 ** rng.uniform(12, 26, n)
    dev = dataclasses.replace(base, sa_rows=jnp.asarray(sa), sa_cols=jnp.asarray(sa),
                              local_buffer_bytes=jnp.asarray(local),
                              global_buffer_bytes=jnp.asarray(glob))
    ok, why = jm.ops_feasible(dev)
    g0, g1, g2, g3 = (GRID[i][None, :] for i in range(4))
    t1 = g3 * sa[:, None]
    tm, tn = np.minimum(t1, g0), np.minimum(t1, g1)
    fit1 = 0.5 * local[:, None] / 2.0 - tm * tn >= tm + tn
    fit2 = (g0 * g1 + g1 * g2 + g0 * g2) * 2.0 <= glob[:, None]
    expect = np.any(fit1 & fit2, axis=1)
    assert 0.2 < expect.mean() < 0.8
    np.testing.assert_array_equal(np.asarray(ok), expect)
    assert set(np.asarray(why)[~expect].tolist()) == {nx.reason_code("buffer_too_small")}


@pytest.mark.parametrize("op", ("gemm", "softmax", "layernorm", "gelu"))
def test_ops_finite_exactly_when_device_feasible(ops_wide, op):
    """``ops_feasible`` (some tile fits) and valid dimensions ⇔ a finite latency, for any
    dimension up to 1e12 (every operator gates on ``gemm.device_feasible``; softmax splits
    rows too wide for its grid; the GEMM's library bound never vetoes a fitting tile)."""
    dims_ok = (ops_wide["m"] > 0) & (ops_wide["c"] > 0)
    if op == "gemm":
        dims_ok &= ops_wide["k"] > 0
    if op == "gelu":                                   # gelu of m·c elements
        dims_ok = ops_wide["m"] * ops_wide["c"] > 0
    assert_feasible_finite(op, ops_wide[op], ops_wide["ok"] & dims_ok)


@pytest.mark.parametrize("op", OPS)
def test_ops_never_nan_overflowing_fields(ops_huge, op):
    assert_no_nan(op, ops_huge[op])


def test_gemm_extreme_dimensions(float32):
    """2**31−1 rows (an int32 limit) and 1e12, in float32: finite, never NaN."""
    dev = hw_db.device("a100_80gb")
    t = np.asarray(jm.gemm_latency(dev, jnp.array([2.0 ** 31 - 1, 1e12, 128.0]), 128.0,
                                   128.0))
    assert np.isfinite(t).all()


# ------------------------------------------------------------------------------------------
# cost model
# ------------------------------------------------------------------------------------------
COSTS = ("die_area.total", "die_area.cores", "device_cost", "system_cost", "tco.usd_per_hour",
         "tco.usd_per_million_tokens", "tco.usd_per_run")


@pytest.mark.parametrize("key", COSTS)
def test_cost_never_nan(ops_wide, ops_huge, key):
    assert_no_nan(key, ops_wide[key])
    assert_no_nan(key + " (overflowing fields)", ops_huge[key])


def test_die_area_invalid_fields_are_inf(ops_wide):
    area = ops_wide["die_area.total"]
    assert np.all((area > 0) | np.isposinf(area))
    assert 0 < np.sum(np.isposinf(area)) < area.size


# ------------------------------------------------------------------------------------------
# layer, inference, training (dense and MoE in one batch)
# ------------------------------------------------------------------------------------------
def test_layer_never_nan(plans):
    for key, v in plans["layer"].items():
        assert_no_nan(f"layer.{key}", v)


def test_layer_invalid_workload_is_inf(plans):
    bad = ~plans["workload_ok"]
    assert bad.any() and np.isposinf(plans["layer"]["total"][bad]).all()


def test_inference_never_nan(plans):
    r = plans["inference"]
    for name in ("ttft_s", "tpot_s", "total_s", "tokens_per_s", "memory_bytes"):
        assert_no_nan(f"inference.{name}", getattr(r, name))
    for key, v in r.breakdown.items():
        assert_no_nan(f"inference.breakdown.{key}", v)


def test_inference_feasible_iff_finite(plans):
    r = plans["inference"]
    for name in ("ttft_s", "tpot_s", "total_s"):
        assert_feasible_finite(f"inference.{name}", getattr(r, name), r.feasible)


def test_inference_infeasible_is_inf(plans):
    r = plans["inference"]
    feasible = np.asarray(r.feasible)
    assert (~feasible).any() and feasible.any()
    assert np.isposinf(np.asarray(r.ttft_s)[~feasible]).all()
    assert (np.asarray(r.tokens_per_s)[~feasible] == 0).all()


@pytest.mark.slow
def test_train_feasible_iff_finite(train_plans):
    r = train_plans["train"]
    feasible = np.asarray(r.feasible)
    assert (~feasible).any() and feasible.any()
    assert_feasible_finite("train.step_time_s", r.step_time_s, feasible)
    for name in ("mfu", "tokens_per_s", "hfu"):
        assert_no_nan(f"train.{name}", getattr(r, name))
    for key, v in r.breakdown.items():
        assert_no_nan(f"train.breakdown.{key}", v)


@pytest.mark.slow
def test_train_device_reason_is_binding(train_plans):
    """``invalid_network`` only where the network is invalid; a device on which no tile fits
    is ``buffer_too_small`` (or an earlier structural reason), never a network failure."""
    r = train_plans["train"]
    why = np.asarray(r.reason)
    net = why == nx.reason_code("invalid_network")
    assert not np.any(net & ~train_plans["ops_ok"]), _fail("no tile fits, reported as network",
                                                           net & ~train_plans["ops_ok"])
    if np.any(net & train_plans["net_ok"]):
        pytest.xfail("parallel/train.py: `(times_ok, 'invalid_network')` labels every "
                     "non-finite stage time as a network failure, also when a compute op "
                     "is +inf")


# ------------------------------------------------------------------------------------------
# gradients: finite everywhere, infeasible points included
# ------------------------------------------------------------------------------------------
def _grad_leaves(g):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(g)]



def _assert_finite_grad(name, g, skip=("freq_hz",)):
    """Every gradient leaf finite; ``device.freq_hz`` is checked by its own test."""
    for path, x in jax.tree_util.tree_leaves_with_path(g):
        if any(getattr(k, "name", None) in skip for k in path):
            continue
        x = np.asarray(x)
        assert np.isfinite(x).all(), _fail(
            f"{name} non-finite gradient {jax.tree_util.keystr(path)}",
            ~np.isfinite(x).reshape(x.shape[0], -1).all(1))


@pytest.fixture(scope="module")
def grad_devices():
    from jaxmodel.cost.area import area_fields
    rng = np.random.default_rng(SEED + 3)
    dev = area_fields(random_devices(rng, N_GRAD))
    # every leaf with the batch axis, so that jax.vmap maps the whole pytree
    (dev, sysm), _ = nx.broadcast_batch(dev, _system(dev, rng, N_GRAD))
    return dev, sysm, rng


_OP_GRADS = {
    "gemm": lambda d, s, x: jm.gemm_latency.single(d, x, 4096.0, 1024.0),
    "softmax": lambda d, s, x: jm.softmax_latency.single(d, x, 2048.0),
    "layernorm": lambda d, s, x: jm.layernorm_latency.single(d, x, 4096.0),
    "gelu": lambda d, s, x: jm.gelu_latency.single(d, x * 4096.0),
    "all_reduce": lambda d, s, x: jm.collective_latency.single(s, "all_reduce", x * 1e4, 4.0),
    "die_area": lambda d, s, x: jm.die_area.single(d)["total"],
    "device_cost": lambda d, s, x: jm.device_cost.single(d).total_usd,
    "tco_per_mtok": lambda d, s, x: jm.tco.single(s, x).usd_per_million_tokens,
}


_GRAD_CACHE: dict = {}


def _op_grads(grad_devices, fn):
    if fn not in _GRAD_CACHE:
        _GRAD_CACHE[fn] = _op_grads_uncached(grad_devices, fn)
    return _GRAD_CACHE[fn]


def _op_grads_uncached(grad_devices, fn):
    dev, sysm, rng = grad_devices
    x = np.where(np.random.default_rng(SEED + 4).uniform(size=N_GRAD) < 0.1, 0.0,
                 np.round(2.0 ** np.random.default_rng(SEED + 5).uniform(0, 14, N_GRAD)))
    f = _OP_GRADS[fn]
    grad = jax.jit(jax.vmap(jax.grad(lambda d, s, x: f(d, s, x), argnums=(0, 1, 2))))
    return grad(dev, sysm, jnp.asarray(x))


@pytest.mark.parametrize("fn", sorted(_OP_GRADS))
def test_gradients_finite(grad_devices, fn):
    """d/d(every device and link field) and d/d(size) at 1,024 points, about half
    infeasible (zero/negative fields, tiny buffers, zero rates)."""
    _assert_finite_grad(fn, _op_grads(grad_devices, fn))


@pytest.mark.parametrize("fn", ("gemm", "softmax"))
def test_gradients_finite_wrt_clock(grad_devices, fn):
    d_dev = _op_grads(grad_devices, fn)[0]
    _assert_finite_grad(fn, d_dev.freq_hz, skip=())


@functools.lru_cache(maxsize=None)
def _plan_grads_cached(which):
    return _plan_grads_uncached(_GRAD_DEVICES[0], which)


_GRAD_DEVICES: list = []


def _plan_grads(grad_devices, which):
    if not _GRAD_DEVICES:
        _GRAD_DEVICES.append(grad_devices)
    return _plan_grads_cached(which)


def _plan_grads_uncached(grad_devices, which):
    dev, sysm, rng = grad_devices
    n = N_GRAD_PLANS
    sub = jax.tree_util.tree_map(lambda v: v[:n] if np.ndim(v) else v, sysm)
    model, _ = mixed_models(np.random.default_rng(SEED + 6), n)
    par = jm.Parallelism(tp=4)
    batch = jnp.asarray(np.where(np.random.default_rng(SEED + 7).uniform(size=n) < 0.1, -1.0,
                                 4.0))

    def layer(s, mdl, b):
        return jm.layer_breakdown.single(s, mdl, par, Work(b, 128.0))["total"]

    def ttft(s, mdl, b):
        return jm.inference.single(s, mdl, par, b * 4.0, 128.0, 8.0).ttft_s

    f = {"layer": layer, "inference": ttft}[which]
    return jax.jit(jax.vmap(jax.grad(f, argnums=(0, 1, 2))))(sub, model, batch)


@pytest.mark.slow
@pytest.mark.parametrize("which", ("layer", "inference"))
def test_gradients_finite_layer_and_inference(grad_devices, which):
    """d/d(system) through the whole layer / inference model (dense and MoE, invalid batches
    included); d/dfreq is covered by :func:`test_gradients_finite_wrt_clock`."""
    _assert_finite_grad(which, _plan_grads(grad_devices, which)[0])


@pytest.mark.slow
@pytest.mark.parametrize("which", ("layer", "inference"))
@pytest.mark.xfail(strict=False, reason="ops/gemm.py `single = b * _one_gemm_seconds(...)` and "
                   "ops/vector.py multiply counts by +inf times (d/d(heads, kv_heads, batch) "
                   "= 0*inf = NaN on infeasible devices); parallel/inference_step.py "
                   "`n_layers * pre['total']` likewise; use numerics.weighted")
def test_gradients_finite_wrt_model_and_batch(grad_devices, which):
    _, d_model, d_batch = _plan_grads(grad_devices, which)
    _assert_finite_grad(which, (d_model, d_batch))


# ------------------------------------------------------------------------------------------
# jit / vmap / grad around every public function
# ------------------------------------------------------------------------------------------
_SYS = hw_db.system("hgx_a100_4gpu")
_MODEL = hw_db.model("gpt3-13b")
_PAR = jm.Parallelism(tp=4)


def _with_bw(bw):
    return dataclasses.replace(_SYS, device=dataclasses.replace(_SYS.device, mem_bw=bw))


PUBLIC = {
    "gemm_latency": lambda s: jm.gemm_latency(s.device, 512.0, 1024.0, 256.0),
    "softmax_latency": lambda s: jm.softmax_latency(s.device, 512.0, 1024.0),
    "layernorm_latency": lambda s: jm.layernorm_latency(s.device, 512.0, 1024.0),
    "gelu_latency": lambda s: jm.gelu_latency(s.device, 1e6),
    "collective_latency": lambda s: jm.collective_latency(s, "all_reduce", 1e6, 4.0),
    "layer_breakdown": lambda s: jm.layer_breakdown(s, _MODEL, _PAR, 2.0, 128.0)["total"],
    "inference": lambda s: jm.inference(s, _MODEL, _PAR, 2.0, 128.0, 4.0).ttft_s,
    "train_step": lambda s: jm.train_step(s, _MODEL, _PAR, 4.0, 128.0).step_time_s,
    "die_area": lambda s: jm.die_area(s.device)["total"],
    "device_cost": lambda s: jm.device_cost(s.device).total_usd,
    "system_cost": lambda s: jm.system_cost(s).total_usd,
    "tco": lambda s: jm.tco(s, 1e4).usd_per_million_tokens,
}


_HEAVY = ("layer_breakdown", "inference", "train_step")


def _jit_vmap_grad(name):
    """jit == eager, vmap == loop, grad finite, for a traced device field (bandwidths are
    positive: a concrete invalid single configuration raises at the API edge by design)."""
    f = lambda bw: PUBLIC[name](_with_bw(bw))  # noqa: E731
    bws = jnp.array([1.0e12, 2.0e12])
    eager = np.asarray([float(f(b)) for b in bws])
    jitted = np.asarray([float(jax.jit(f)(b)) for b in bws])
    np.testing.assert_allclose(jitted, eager, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(jax.vmap(f)(bws)), eager, rtol=1e-5)
    g = jax.vmap(jax.grad(f))(bws)
    assert np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("name", sorted(set(PUBLIC) - set(_HEAVY)))
def test_jit_vmap_grad_of_public_functions(name):
    _jit_vmap_grad(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", _HEAVY)
def test_jit_vmap_grad_of_public_functions_heavy(name):
    _jit_vmap_grad(name)


def test_jit_of_layer_breakdown():
    """``jax.jit`` around ``layer_breakdown`` with a traced system (one compile)."""
    f = jax.jit(lambda s: PUBLIC["layer_breakdown"](s))
    assert float(f(_SYS)) == pytest.approx(float(PUBLIC["layer_breakdown"](_SYS)), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ("inference", "train_step"))
def test_jit_of_a_closed_over_concrete_plan(name):
    """``jax.jit`` around a call whose configs are all concrete (closed over)."""
    f = jax.jit(lambda x: x * PUBLIC[name](_SYS))
    assert float(f(1.0)) == pytest.approx(float(PUBLIC[name](_SYS)), rel=1e-5)


# ------------------------------------------------------------------------------------------
# bigger variant
# ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_fuzz_large():
    """10**6 devices through the operators and cost, 10**5 plans through layer, inference and
    training: no NaN, training feasible ⇔ finite."""
    wide, huge = _ops_results(1_000_000, SEED + 10, n_huge=250_000)
    for key in OPS + COSTS:
        assert_no_nan(key, wide[key])
        assert_no_nan(key, huge[key])
    p = _plan_results(100_000, SEED + 11)
    for key, v in p["layer"].items():
        assert_no_nan(f"layer.{key}", v)
    assert_no_nan("inference.ttft_s", p["inference"].ttft_s)
    p = _plan_results(100_000, SEED + 12, train=True)
    assert_feasible_finite("train.step_time_s", p["train"].step_time_s, p["train"].feasible)
