"""The co-design objectives time serving with jm.inference's own single-configuration body."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.cost.area import area_fields
from jaxmodel.search.objectives import apply_knobs, make_objective, run_spec

MODEL = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=4.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=32000.0, activation="swiglu")
SYSTEM = hw_db.system("dgx_a100")                       # 8 devices
WORK = dict(batch=8.0, prompt_len=256.0, gen_len=32.0)


def _random_plans(n, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(1, 8, 1), (2, 4, 1), (1, 4, 2), (2, 2, 2), (4, 2, 1), (8, 1, 1), (1, 2, 4)]
    pick = np.asarray([shapes[i] for i in rng.integers(0, len(shapes), n)], dtype=float)
    par = jm.Parallelism(dp=jnp.asarray(pick[:, 0]), tp=jnp.asarray(pick[:, 1]),
                         pp=jnp.asarray(pick[:, 2]),
                         sp=jnp.asarray((rng.random(n) < 0.5) & (pick[:, 1] > 1), float),
                         flash_attention=jnp.asarray(rng.random(n) < 0.5, float))
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(jnp.asarray(x, float), (n,)),
                                  par)


@pytest.mark.slow
def test_serving_objective_equals_inference_on_random_plans():
    """float64: the latency objective (no cost cap binding, memory fits) is jm.inference's
    total_s, and usd_per_mtok prices jm.inference's tokens/s."""
    pars = _random_plans(6)
    params = {"core_count": 96.0, "hbm_stacks": 4.0, "link_bw": 2.0e11}

    def objectives(par):
        lat = make_objective(SYSTEM, MODEL, par, kind="latency_cost_cap",
                             cost_cap_usd=1e30, **WORK)(params)
        usd = make_objective(SYSTEM, MODEL, par, **WORK)(params)
        return lat, usd

    lat, usd = jax.jit(jax.vmap(objectives))(pars)
    system = apply_knobs(dataclasses.replace(SYSTEM, device=area_fields(SYSTEM.device)),
                         {k: jnp.asarray(v) for k, v in params.items()})
    ref = jm.inference(system, MODEL, pars, WORK["batch"], WORK["prompt_len"],
                       WORK["gen_len"])
    assert np.all(np.asarray(ref.feasible))
    np.testing.assert_allclose(np.asarray(lat), np.asarray(ref.total_s), rtol=1e-6)
    price = jm.tco(system, ref.tokens_per_s).usd_per_million_tokens
    np.testing.assert_allclose(np.asarray(usd), np.asarray(price), rtol=1e-6)
    # the plans differ, so the comparison is not between equal numbers
    assert np.ptp(np.asarray(lat)) > 0


@pytest.mark.slow
def test_run_spec_needs_no_cli():
    import sys
    spec = {"system": "dgx_a100", "model": "gpt2-small", "parallelism": {"tp": 4},
            "workload": {"batch": 4.0, "prompt_len": 128.0, "gen_len": 8.0},
            "bounds": {"core_count": [64.0, 128.0]},
            "codesign": {"steps": 1, "n_starts": 1, "objective": "usd_seconds"}}
    sys.modules.pop("jaxmodel.cli", None)
    out = run_spec(spec)
    assert "jaxmodel.cli" not in sys.modules
    assert np.isfinite(out["value"]) and out["design"]["time_s"] > 0
