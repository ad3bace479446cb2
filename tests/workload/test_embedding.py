"""The embedding / LM head / loss module: one set of formulas for training and serving, the
head at the precision's higher-precision dtype (hand-derived roofline values)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.precisions import gemm_word
from jaxmodel.workload import embedding as E
from testkit import roofline_gemm

SYSTEM = hw_db.system("hgx_a100_4gpu")
MODEL = hw_db.model("llama2-13b")
PAR = jm.Parallelism(tp=4)


@pytest.mark.parametrize("name", ["bf16", "fp8", "nvfp4", "w4a16", "fp32"])
def test_head_precision_is_the_higher_precision_dtype_on_activation_words(name):
    p = jm.precision(name)
    h = E.head_precision(p)
    assert float(h.gemm_dtype) == float(p.attn_dtype)
    assert float(gemm_word(h)) == float(p.act_bytes)         # no block scales
    assert float(h.cast_bytes) == 0.0


def test_serving_head_gemm_runs_at_the_precision_rate():
    """A compute-bound head (4,096 rows): ``2·rows·(V/t)·d / (peak · ratio)`` plus the
    kernel's launch overhead, then the softmax over the logits (roofline GEMM); one traced
    call over a batch of precisions."""
    dev = SYSTEM.device
    rows = 4096.0
    names = ("fp32", "tf32", "bf16")
    heads = jax.jit(jax.vmap(lambda p: E.serving_head(SYSTEM, MODEL, PAR, rows, roofline_gemm,
                                                      p)))(jm.stack_precisions(names))
    vocab = float(MODEL.vocab_size) / 4.0
    flops = 2.0 * rows * vocab * float(MODEL.d_model)
    softmax = float(E.logits_softmax(dev, rows, vocab))
    for i, name in enumerate(names):
        ratio = float(getattr(dev, f"matrix_ratio_{name}"))
        hand = flops / (float(dev.peak_matrix_flops) * ratio) + float(dev.matmul_overhead_s)
        assert float(heads[0][i]) == pytest.approx(hand + softmax, rel=1e-5), name
        assert float(heads[1][i]) > 0.0


@pytest.mark.slow          # compiles the training rows and the serving pieces (~3 s)
def test_training_and_serving_share_the_head_and_lookup():
    """The training rows and the serving pieces are the same formulas: the forward head of
    ``rows`` tokens and the lookup agree to float rounding (bf16 on A100)."""
    prec = jm.precision("bf16")
    rows = 512.0

    @jax.jit
    def both():
        t = E.embedding_times.single(SYSTEM, MODEL, PAR, 1.0, rows, roofline_gemm,
                                     precision=prec)
        return (t, E.serving_head(SYSTEM, MODEL, PAR, rows, roofline_gemm, prec),
                E.serving_embedding(SYSTEM, MODEL, PAR, rows, prec.act_bytes))

    t, (head, _), (lookup, ar) = both()
    assert float(t["lm_head_fwd"] + t["loss_fwd"]) == pytest.approx(float(head), rel=1e-6)
    assert float(t["embed_fwd"]) == pytest.approx(float(lookup), rel=1e-6)
    assert float(ar) > 0.0


@pytest.mark.slow          # three compiles (~3 s)
def test_serving_head_vmap_matches_loop_and_has_finite_gradients():
    prec = jm.precision("fp32")
    bws = jnp.array([1.0e12, 2.0e12, 4.0e12])

    def head(bw, rows):
        system = dataclasses.replace(SYSTEM, device=dataclasses.replace(SYSTEM.device,
                                                                        mem_bw=bw))
        return sum(E.serving_head(system, MODEL, PAR, rows, roofline_gemm, prec))

    batched = jax.jit(jax.vmap(head, in_axes=(0, None)))(bws, 8.0)
    one = jax.jit(head)
    loop = [float(one(b, 8.0)) for b in bws]
    assert [float(x) for x in batched] == pytest.approx(loop, rel=1e-6)
    g = jax.jit(jax.grad(head))(2.0e12, 8.0)
    assert bool(jnp.isfinite(g)) and float(g) < 0.0      # memory-bound: faster with bandwidth


@pytest.mark.slow          # compiles an inference step
def test_inference_head_honours_the_precision():
    """``jm.inference``'s LM head is :func:`serving_head`: at TF32 its prefill head is the
    shared formula's (GEMM at the TF32 rate, the logits' all-gather)."""
    prec = jm.precision("tf32")
    r = jm.inference(SYSTEM, MODEL, PAR, 64, 128, 4, gemm=roofline_gemm, precision=prec)
    head, gather = E.serving_head(SYSTEM, MODEL, PAR, 64.0, roofline_gemm, prec)
    assert float(r.breakdown["head_prefill"]) == pytest.approx(float(head + gather), rel=1e-5)
