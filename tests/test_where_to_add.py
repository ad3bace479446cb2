"""The "Where to add X" recipes of docs/architecture.md, followed step by step on toys.

- A model feature: per-head RMSNorm of q and k ("QK-norm", Qwen3 and Gemma 3 configs; HF
  ``modeling_qwen3.py`` ``q_norm`` / ``k_norm``) as a ``Model`` leaf, its range, its vector row
  in the layer graph and the breakdown; the row's time is checked against the operator model
  called by hand, and a batch over the new leaf.
- A serving technique: prefix caching with a hit share ``h`` (vLLM automatic prefix caching:
  the cached blocks of a prompt are not recomputed), as a transformation of the cost table
  feeding the steady-state formulas; the TTFT is checked against the hand formula of
  :func:`jaxmodel.serving.continuous_batching_from_costs` on a flat table.
Both run eagerly with a roofline GEMM (no tile search, no whole-model compile).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import ops as _ops
from jaxmodel import serving as S
from jaxmodel import types as T
from jaxmodel.workload import layer as L


# --------------------------------------------------------------------------------------------
# a model feature
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Model(jm.Model):
    """Step 1: the feature as a leaf whose default switches it off (in the library: a field of
    ``types.Model``; the subclass keeps the class name, so ``RANGES["Model"]`` applies)."""
    qk_norm: float = 0.0


T._register(Model, meta=("name", "quantization", "serving_precision"))


def _roofline(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    """A stand-in GEMM: 1 PFLOP/s plus 5 µs, s."""
    return 2.0 * m * n * k * batch / 1e15 + 5e-6


def _qk_norm_graph(orig):
    """Step 3: the feature's rows in ``layer_graph`` (a vector row ``(fwd_s, bwd_s)``): one
    RMSNorm over the head dimension for every query and key head of every token."""
    def graph(dev, model, par, batch, seq_len, kv_seq, dtype_bytes=None, training=False,
              *args, **kw):
        gemms, vectors = orig(dev, model, par, batch, seq_len, kv_seq, dtype_bytes, training,
                              *args, **kw)
        sh = L.shard(model, par)
        rows = batch * seq_len * (sh.heads + sh.kv_heads)
        t = getattr(model, "qk_norm", 0.0) * _ops.rmsnorm_latency.single(
            dev, rows, sh.head_dim, 2.0, overhead=True)
        return gemms, {**vectors, "qk_norm": (t, t if training else 0.0 * t)}
    return graph


@pytest.fixture
def qk_norm(monkeypatch):
    monkeypatch.setitem(T.RANGES["Model"], "qk_norm", T.FLAG)                  # step 2
    monkeypatch.setattr(L, "layer_graph", _qk_norm_graph(L.layer_graph))       # step 3
    monkeypatch.setattr(L, "LAYER_OPS", L.LAYER_OPS + ("qk_norm",))           # step 4
    base = hw_db.model("qwen3-8b")
    return Model(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                 qk_norm=1.0)


@pytest.mark.slow           # compiles a whole layer graph (about 9 s on two cores)
def test_add_a_model_feature(qk_norm):
    system, par = hw_db.system("dgx_h100"), jm.Parallelism(tp=8)
    with pytest.raises(ValueError, match=r"field 'qk_norm' = 2\.0"):
        jm.validate_model(dataclasses.replace(qk_norm, qk_norm=2.0))
    # one traced call over a batch of the new leaf (Convention 1): feature off and on
    rows = jax.jit(jax.vmap(lambda q: L.layer_times(
        system, dataclasses.replace(qk_norm, qk_norm=q), par, L.Work(4.0, 512.0),
        L.LayerOptions(_roofline))))(
        jnp.array([0.0, 1.0]))
    off, on = ({k: float(v[i]) for k, v in rows.items()} for i in (0, 1))
    heads, kv = float(qk_norm.n_heads) / 8, float(qk_norm.n_kv_heads) / 8
    hand = float(jm.rmsnorm_latency(system.device, 4 * 512 * (heads + kv),
                                    float(qk_norm.head_dim)))
    assert hand > 0 and off["qk_norm"] == 0.0
    assert on["qk_norm"] == pytest.approx(hand, rel=1e-5)
    assert on["total"] - off["total"] == pytest.approx(hand, rel=1e-3)
    assert all(on[k] == pytest.approx(off[k], rel=1e-6) for k in L.LAYER_OPS if k != "qk_norm")


# --------------------------------------------------------------------------------------------
# a serving technique
# --------------------------------------------------------------------------------------------
def _flat_costs(step_s=0.02, prefill_s=0.2):
    """A cost table by hand: a decode iteration of ``step_s`` at any batch, a prompt of
    ``prefill_s`` (s); memory for thousands of sequences."""
    g = len(S.TOKEN_GRID)
    return S.ServingCosts(step_s=jnp.full(g, step_s), attn_s=jnp.zeros(g),
                          prefill_s=jnp.asarray(prefill_s), prefill_attn_s=jnp.asarray(0.0),
                          weights_bytes=jnp.asarray(16e9), kv_bytes_per_token=jnp.asarray(1e5),
                          act_bytes=jnp.asarray(1e8), mem_capacity=jnp.asarray(80e9),
                          feasible=jnp.asarray(True), reason=jnp.asarray(0))


def prefix_cached(costs: S.ServingCosts, hit):
    """The toy technique: a share ``hit`` of every prompt's tokens is found in the KV cache,
    so the prefill computes ``(1 − hit)`` of them (its GEMMs are linear in the new tokens; the
    attention of the new tokens over the cached ones is kept)."""
    pre = costs.prefill_s - costs.prefill_attn_s
    return dataclasses.replace(costs, prefill_s=(1.0 - hit) * pre + costs.prefill_attn_s)


def test_add_a_serving_technique():
    costs, isl, osl, rate = _flat_costs(), 1000.0, 200.0, 2.0

    def ttft(hit):
        r = S.continuous_batching_from_costs(prefix_cached(costs, hit), isl, osl, rate,
                                             S.ServingOptions(max_batch=256.0))
        return r.ttft_s
    hits = (0.0, 0.5, 0.9)
    got = np.asarray(jax.jit(jax.vmap(ttft))(jnp.array(hits)))     # a batch over the knob
    for hit, t in zip(hits, got):
        tp = 0.2 * (1.0 - hit)                        # prefill, s
        rho = rate * tp                               # share of iterations prefilling
        wait = rate * tp ** 2 / (2.0 * (1.0 - rho))   # M/D/1 (Pollaczek–Khinchine)
        hand = tp + wait + (1.0 - rho) * 0.02 / 2.0   # + half an iteration of the batch
        assert float(t) == pytest.approx(hand, rel=1e-5), hit
    d = float(jax.jit(jax.grad(ttft))(0.5))
    assert np.isfinite(d) and d < 0
