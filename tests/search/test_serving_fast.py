"""search_serving's fast path (its own jits with XLA:CPU compile options, stage 2 compiled on
a second thread from the tables' shapes) against the reference evaluation: the cost tables of
:func:`jaxmodel.serving_costs` and the steady-state formulas of every row under a plain
``jax.vmap``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import serving as srv
from jaxmodel.batching import jit_leaves
from jaxmodel.search import serving as ss

OPTS = dict(tp=(1, 2), pp=(1, 2), max_batch=(8, 64), chunk=(0, 256), precision=("bf16",),
            runtime=("trtllm",), loads=(0.3, 0.9), progress=False)
ISL, OSL, TTFT, TPOT = 512, 128, 0.5, 0.02


class Compiles:
    """Counts XLA compilations (JAX's backend-compile events, a persistent-cache hit
    included) inside the ``with`` block: ``n`` in all, ``by_name`` per compiled function."""

    def __enter__(self):
        self.n, self.by_name = 0, {}

        def on(name, secs, fun_name="", **kw):
            if name == "/jax/core/compile/backend_compile_duration":
                self.n += 1
                self.by_name[fun_name] = self.by_name.get(fun_name, 0) + 1
        self.cb = on
        jax.monitoring.register_event_duration_secs_listener(on)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self.cb)


def test_jit_matches_plain_jit_and_falls_back_on_unknown_options():
    def f(x, flag):
        return jnp.where(flag, jnp.sin(x) * 3.0, x)
    x = jnp.linspace(0.0, 1.0, 7)
    want = jax.jit(f, static_argnames="flag")(x, flag=True)
    fast = jit_leaves(f)
    np.testing.assert_array_equal(fast(x, flag=True), want)
    bogus = jit_leaves(f, compiler_options={"xla_no_such_option_anywhere": True})
    np.testing.assert_array_equal(bogus(x, flag=True), want)
    assert bogus.use_tuned is False
    # ahead-of-time compilation from shapes fills the cache the call then uses
    g = jit_leaves(lambda y: y * 2.0)
    with Compiles() as c:
        g.compile(jax.ShapeDtypeStruct((5,), jnp.result_type(float)))
    assert c.n == 1
    ones = jnp.ones(5)
    with Compiles() as c:
        y = g(ones)
    assert c.n == 0
    np.testing.assert_array_equal(y, 2.0 * np.ones(5))
    # traced here, compiled on a thread: join() waits, the call then compiles nothing
    h = jit_leaves(lambda y: y * 3.0, inline=True)
    with Compiles() as c:
        h.compile_async(jax.ShapeDtypeStruct((5,), jnp.result_type(float))).join()
    assert c.n == 1
    with Compiles() as c:
        y = h(ones)
    assert c.n == 0
    np.testing.assert_array_equal(y, 3.0 * np.ones(5))
    # an option this XLA does not know: join() falls back, the call compiles plainly
    bogus = jit_leaves(f, compiler_options={"xla_no_such_option_anywhere": True})
    bogus.compile_async(x, flag=True).join()
    assert bogus.use_tuned is False
    np.testing.assert_array_equal(bogus(x, flag=True), want)


def test_table_parts_run_side_by_side_and_come_back_in_order(monkeypatch):
    monkeypatch.setattr(ss, "_host_cores", lambda: 3)
    stacked = (jnp.arange(7.0), {"b": jnp.arange(7.0) * 10.0, "s": 2.0}, None)
    parts = ss._table_parts(stacked, 7)
    assert len(parts) == 3 and all(p[0].shape == (3,) for p in parts)
    np.testing.assert_array_equal(parts[2][0], [6.0, 6.0, 6.0])    # padded with the last row
    assert parts[1][1]["s"] == 2.0 and parts[0][2] is None
    f = jax.jit(lambda a, d, _: {"y": a + d["b"] * d["s"]})
    np.testing.assert_array_equal(ss._run_parts(f, parts, 7)["y"], np.arange(7.0) * 21.0)
    monkeypatch.setattr(ss, "_host_cores", lambda: 1)
    assert len(ss._table_parts(stacked, 7)) == 1


@pytest.fixture(scope="module")
def searched():
    system = hw_db.system("hgx_a100_4gpu")
    model = hw_db.model("llama3.2-1b")
    # fresh jits: nothing compiled for them by an earlier search in this process
    saved = ss._tables_jit, ss._evaluate_jit
    ss._tables_jit = jit_leaves(srv._serving_costs, inline=True)
    ss._evaluate_jit = jit_leaves(ss._evaluate, cast=False)
    try:
        with Compiles() as c:
            df = jm.search_serving(system, model, 4, ISL, OSL, ttft_slo_s=TTFT,
                                   tpot_slo_s=TPOT, full=True, **OPTS)
    finally:
        ss._tables_jit, ss._evaluate_jit = saved
    return system, model, df, c.by_name


@pytest.mark.slow
def test_three_executables_per_search(searched):
    *_, by_name = searched
    # one compilation of the cost tables and one of the steady state per job (aggregated,
    # disaggregated): a stage-2 executable compiled from shapes that did not match the real
    # tables would be compiled a second time when called
    assert sum(v for k, v in by_name.items() if "serving_costs" in k) == 1, by_name
    assert sum(v for k, v in by_name.items() if "evaluate" in k) == 2, by_name


@pytest.mark.slow
def test_fast_path_matches_the_reference_evaluation(searched):
    system, model, df, _ = searched
    plans = sorted({(int(t), int(p)) for t, p in zip(df["tp"], df["pp"])})
    par = jm.Parallelism(dp=jnp.asarray([4.0 / (t * p) for t, p in plans]),
                         tp=jnp.asarray([float(t) for t, _ in plans]),
                         pp=jnp.asarray([float(p) for _, p in plans]))
    costs = srv.serving_costs(system, model, par, ISL, OSL, precision="bf16", runtime="trtllm")
    k_of = {tp_pp: i for i, tp_pp in enumerate(plans)}

    def take(k):
        return jax.tree_util.tree_map(lambda x: x[k], costs)

    def agg(k, dp, pp, mb, chunk, load):
        c = take(k)
        cap = dp * srv.aggregated_capacity(c, ISL, OSL, mb, pp, chunk)
        return srv.continuous_batching_from_costs(
            c, ISL, OSL, load * cap, srv.ServingOptions(max_batch=mb, chunk=chunk,
                                                        ttft_slo_s=TTFT, tpot_slo_s=TPOT),
            dp=dp, pp=pp, n_gpus=4.0)

    def dis(kp, kd, tp_p, pp_p, dp_p, tp, pp, dp, mb, load):
        pre, dec = take(kp), take(kd)
        pools = srv.Pools(dp_prefill=dp_p, pp_prefill=pp_p, tp_prefill=tp_p, dp_decode=dp,
                          pp_decode=pp, tp_decode=tp)
        probe = srv.disaggregated_from_costs(pre, dec, system, ISL, OSL, 0.0,
                                             srv.ServingOptions(max_batch=mb), pools)
        return srv.disaggregated_from_costs(pre, dec, system, ISL, OSL,
                                            load * probe.capacity_rps, srv.ServingOptions(
                                                max_batch=mb, ttft_slo_s=TTFT,
                                                tpot_slo_s=TPOT), pools)

    def index(t, p):
        return np.asarray([k_of[(int(a), int(b))] for a, b in zip(t, p)])

    a = df[df["mode"] == "aggregated"]
    d = df[df["mode"] == "disaggregated"]
    assert len(a) and len(d)
    ref_a = jax.vmap(agg)(index(a.tp, a.pp), *(jnp.asarray(a[c].to_numpy(float)) for c in (
        "dp", "pp", "max_batch", "chunk", "load")))
    ref_d = jax.vmap(dis)(index(d.prefill_tp, d.prefill_pp), index(d.tp, d.pp),
                          *(jnp.asarray(d[c].to_numpy(float)) for c in (
                              "prefill_tp", "prefill_pp", "prefill_dp", "tp", "pp", "dp",
                              "max_batch", "load")))
    for rows, ref in ((a, ref_a), (d, ref_d)):
        for name in srv.ServingResult.__dataclass_fields__:
            want = np.asarray(getattr(ref, name))
            got = rows[name].to_numpy().astype(want.dtype)
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=name)
            else:
                np.testing.assert_array_equal(got, want, err_msg=name)
    assert df["feasible"].mean() > 0.5
