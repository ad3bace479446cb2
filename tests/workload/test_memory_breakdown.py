"""Training memory by term (``memory_breakdown``): the terms sum to the total, hand-derived
values of one small plan, Transformer Engine's FP8 weight caches and FP8-stored GEMM inputs,
gradients of the new terms, and the terms of a ``train_step`` result (slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.workload.memory import (TRAIN_MEMORY_TERMS, activation_bytes_per_layer,
                                      memory_breakdown, quantised_input_delta,
                                      loss_logits_bytes, stored_gemm_input_bytes,
                                      tp_comm_buffer_bytes, training_memory,
                                      weight_cache_bytes)

GIB = 2.0 ** 30
# a small GPT-style model: h = 1024, a = 16 heads (MHA), d_ff = 4h, 8 layers, V = 32000
SMALL = jm.Model(n_layers=8.0, d_model=1024.0, n_heads=16.0, n_kv_heads=16.0, head_dim=64.0,
                 d_ff=4096.0, vocab_size=32000.0, tied_embeddings=1.0)


def _states(par):
    """Parameters of the (single) stage per device (:func:`jaxmodel.workload.params.
    stage_params`, tested on its own)."""
    from jaxmodel.workload.params import stage_params
    return float(stage_params(SMALL, par)[0])


def test_terms_sum_to_total_and_hand_values_bf16_fp8():
    """One plan by hand: TP 2, SP, selective recompute, no flash attention, ZeRO-1 over 4,
    micro-batch 2, s = 512, 3 micro-batches in flight.

    bf16 (Megatron mixed precision): weights 2 B, gradients 4 B, optimizer 12 B / dp;
    activations per layer (Korthikanti §4.2.2 with SP + selective): sbh·34/t.
    fp8 (Transformer Engine): + the FP8 weight cache 2 B (data + transpose); the four GEMM
    inputs (QKV and FFN inputs sbh each, W_o input sbh, W2 input 4·sbh) stored in 1 B:
    sbh·(34 − 1 − 1 − 1 − 4)/t = sbh·27/t per layer."""
    par = jm.Parallelism(tp=2, dp=4, sp=True, recompute="selective", zero=1,
                         flash_attention=False, micro_batch=2)
    n = _states(par)
    s, b, h, t, flight = 512.0, 2.0, 1024.0, 2.0, 3.0
    sbh = s * b * h
    bf = training_memory.single(SMALL, par, s, flight, precision=jm.precision("bf16"))
    f8 = training_memory.single(SMALL, par, s, flight, precision=jm.precision("fp8"))
    for mem in (bf, f8):
        assert set(TRAIN_MEMORY_TERMS) | {"total"} == set(mem)
        assert float(mem["total"]) == pytest.approx(
            sum(float(mem[k]) for k in TRAIN_MEMORY_TERMS), rel=1e-12)
    assert float(bf["weights"]) == pytest.approx(2.0 * n, rel=1e-9)
    assert float(bf["fp8_weight_cache"]) == 0.0
    assert float(bf["gradients"]) == pytest.approx(4.0 * n, rel=1e-9)
    assert float(bf["optimizer"]) == pytest.approx(12.0 * n / 4.0, rel=1e-9)
    assert float(bf["activations"]) == pytest.approx(flight * 8 * sbh * 34 / t, rel=1e-9)
    assert float(f8["weights"]) == pytest.approx(2.0 * n, rel=1e-9)
    assert float(f8["fp8_weight_cache"]) == pytest.approx(2.0 * n, rel=1e-9)
    assert float(f8["activations"]) == pytest.approx(flight * 8 * sbh * 27 / t, rel=1e-9)
    # the breakdown in GiB, in the order of the terms, and its total
    gib = memory_breakdown(f8)
    assert list(gib) == list(TRAIN_MEMORY_TERMS) + ["total"]
    assert float(gib["total"]) == pytest.approx(float(f8["total"]) / GIB, rel=1e-12)
    with pytest.raises(ValueError, match="memory_breakdown"):
        memory_breakdown({"weights": 1.0})


def test_fp8_primary_weights_keep_only_the_transpose():
    """FP8 primary weights (``fp8_model_init`` / NeMo ``fp8_params``): weights 1 B + cached
    transpose 1 B = the bf16 weights' 2 B, so the FP8 step stores less than the bf16 one
    (its GEMM inputs in FP8); with a 16-bit weight copy the cache adds 2 B per parameter."""
    par = jm.Parallelism(tp=4, pp=1, sp=True, recompute="selective", flash_attention="fa2",
                         micro_batch=1)
    p8 = jm.precision("fp8", weight_bytes=1.0)
    assert float(weight_cache_bytes(jm.precision("fp8"))) == 2.0
    assert float(weight_cache_bytes(p8)) == 1.0
    assert float(weight_cache_bytes(jm.precision("bf16"))) == 0.0
    assert float(weight_cache_bytes(jm.precision("fp4"))) == pytest.approx(2 * (0.5 + 1 / 16))
    m = hw_db.model("llama2-7b")
    bf = training_memory.single(m, par, 4096.0, 1.0, precision=jm.precision("bf16"))
    f8 = training_memory.single(m, par, 4096.0, 1.0, precision=p8)
    assert float(f8["weights"] + f8["fp8_weight_cache"]) == pytest.approx(
        float(bf["weights"]), rel=1e-9)
    assert float(f8["activations"]) < float(bf["activations"])
    assert float(f8["total"]) < float(bf["total"])


def test_fp8_wo_input_stored_twice_without_recompute():
    """Without recomputation FlashAttention keeps its 16-bit output O for its own backward
    while the FP8 W_o GEMM saves the FP8 cast: W_o input 2 + 1 B per element instead of 2;
    the other three GEMM inputs halve. Per layer (GQA, SwiGLU, TP 1, no SP):
    Δ = −sbd (QKV input) − sbd (FFN input) + sb·d_attn (W_o) − sb·d_ff (W2 input)."""
    m = hw_db.model("llama2-7b")
    s, b = 1024.0, 1.0
    par = jm.Parallelism(tp=1, recompute="none", flash_attention="fa2", micro_batch=1)
    d, d_attn, d_ff = float(m.d_model), float(m.n_heads * m.head_dim), float(m.d_ff)
    got = float(quantised_input_delta(m, par, b, s, jm.precision("fp8")))
    assert got == pytest.approx(s * b * (-2.0 * d + d_attn - d_ff), rel=1e-9)
    sel = jm.Parallelism(tp=1, recompute="selective", flash_attention="fa2", micro_batch=1)
    got = float(quantised_input_delta(m, sel, b, s, jm.precision("fp8")))
    assert got == pytest.approx(s * b * (-2.0 * d - d_attn - d_ff), rel=1e-9)
    # 16-bit recipes: nothing changes; full recomputation keeps only the layer input
    assert float(quantised_input_delta(m, par, b, s, jm.precision("bf16"))) == 0.0
    full = jm.Parallelism(tp=1, recompute="full", micro_batch=1)
    assert float(quantised_input_delta(m, full, b, s, jm.precision("fp8"))) == 0.0
    assert float(stored_gemm_input_bytes(jm.precision("fp8"))) == 1.0
    assert float(stored_gemm_input_bytes(jm.precision("w4a16"))) == 2.0   # weights only


def test_loss_logits_on_the_last_stage_only():
    """The loss's 16-bit logits and their fp32 copy, ``(2 + 4)·tokens·V/t`` (hand value), are
    added to the last stage's activations: with one stage they raise the total by exactly
    that; with four under 1F1B (the first stage holds 4 micro-batches, the last one) the
    first stage stays the peak."""
    par = jm.Parallelism(tp=2, pp=1, sp=True, micro_batch=1)
    extra = float(loss_logits_bytes(SMALL, par, 2048.0))
    assert extra == 6.0 * 2048 * 16000
    mem = training_memory.single
    a = mem(SMALL, par, 2048.0, 1.0)
    b = mem(SMALL, par, 2048.0, 1.0, last_stage_extra=extra)
    assert float(b["activations"] - a["activations"]) == pytest.approx(extra, rel=1e-6)
    assert float(b["total"] - a["total"]) == pytest.approx(extra, rel=1e-6)
    p4 = jm.Parallelism(tp=2, pp=4, sp=True, micro_batch=1)
    c = mem(SMALL, p4, 2048.0, (4.0, 3.0, 1.0))
    d = mem(SMALL, p4, 2048.0, (4.0, 3.0, 1.0), last_stage_extra=extra)
    assert float(d["total"]) == float(c["total"])


def test_activation_gradient_and_vmap_over_gemm_input_bytes():
    """The FP8 inventory is differentiable in the stored word and vmaps like a loop."""
    m = hw_db.model("llama2-7b")
    par = jm.Parallelism(tp=2, sp=True, recompute="selective", flash_attention="fa2")
    f = jax.jit(lambda g: activation_bytes_per_layer.single(m, par, 1.0, 2048.0, 2.0, g))
    gs = jnp.array([1.0, 1.5, 2.0])
    np.testing.assert_allclose(jax.vmap(f)(gs), [float(f(g)) for g in gs], rtol=1e-12)
    # d/dg: the four GEMM inputs, sb·(2d/t·... ) > 0 and finite
    grad = float(jax.grad(f)(1.0))
    assert np.isfinite(grad) and grad > 0


@pytest.mark.slow
def test_train_step_memory_terms_sum_to_total():
    """A ``train_step`` result carries every term; they sum to ``memory_bytes``. ZeRO-1: the
    2 B FP8 cache equals the 2 B weights; ZeRO-3 (FSDP2): the gathered units (2 live) carry
    their 2 B caches, the shard its cache only (the fp32 shard is the master)."""
    from jaxmodel.workload.params import params_per_device
    system = hw_db.system("dgx_h100", nodes=1)
    m = hw_db.model("llama2-7b")
    par = jm.Parallelism(dp=jnp.asarray([8.0, 8.0]), tp=1, zero=jnp.asarray([1.0, 3.0]),
                         recompute="selective", flash_attention="fa2")
    r = jm.train_step(system, m, par, 64, 4096, precision="fp8")
    gib = jm.memory_breakdown(r)
    np.testing.assert_allclose(gib["total"], np.asarray(r.memory_bytes) / GIB, rtol=1e-9)
    mem = {k: np.asarray(v) for k, v in r.memory.items()}
    assert mem["fp8_weight_cache"][0] == pytest.approx(mem["weights"][0], rel=1e-9)
    n = float(params_per_device(m, jm.Parallelism(tp=1)))
    unit = n / float(m.n_layers)
    assert mem["weights"][1] == pytest.approx(2.0 * 2 * unit, rel=1e-9)
    assert mem["fp8_weight_cache"][1] == pytest.approx(2.0 * (n / 8 + 2 * unit), rel=1e-9)


def test_predict_prints_the_memory_table(capsys):
    """``jaxmodel predict train`` prints the terms (GiB) and their total on stderr; a result
    without the terms prints nothing."""
    from jaxmodel import cli
    mem = {k: float(i + 1) * GIB for i, k in enumerate(TRAIN_MEMORY_TERMS)}
    total = sum(mem.values()) / GIB          # 1 + 2 + … + len(TRAIN_MEMORY_TERMS)
    cli._print_memory_table({"memory": {**mem, "total": total * GIB},
                             "memory_capacity_bytes": 80.0 * GIB})
    err = capsys.readouterr().err
    for k in TRAIN_MEMORY_TERMS:
        assert k in err
    assert "total" in err and f"{total:.2f}" in err and "80.00" in err
    cli._print_memory_table({"memory": {"weights": 1.0}})
    assert capsys.readouterr().err == ""


def test_tp_comm_buffers_hand_count():
    """Transformer Engine's ten userbuffers of ``[b·s/cp, h]``: six all-gather ones at the
    FP8 input width, four reduce-scatter ones at 2 B (14 B per element in FP8, 20 B in
    bf16)."""
    model = hw_db.model("gpt3-175b")
    tokens = 2 * 2048 / 2
    fp8 = tp_comm_buffer_bytes(model, tokens, jm.precision("fp8"))
    bf16 = tp_comm_buffer_bytes(model, tokens, jm.precision("bf16"))
    assert float(fp8) == pytest.approx(14.0 * tokens * 12288, rel=1e-12)
    assert float(bf16) == pytest.approx(20.0 * tokens * 12288, rel=1e-12)


@pytest.mark.slow
def test_train_step_holds_tp_comm_buffers_only_with_the_tp_overlap():
    """The step's ``tp_comm_buffers`` term: the hand count with ``tp_overlap``, 0 without."""
    model = hw_db.model("gpt3-175b")
    fp8 = tp_comm_buffer_bytes(model, 2 * 2048 / 2, jm.precision("fp8"))
    system = hw_db.system("dgx_h100", nodes=8)
    par = jm.Parallelism(dp=1, tp=8, pp=4, sp=True, micro_batch=2, cp=2)
    on = jm.train_step(system, model, par, 64, 2048, precision="fp8", tp_overlap=1.0)
    off = jm.train_step(system, model, par, 64, 2048, precision="fp8", tp_overlap=0.0)
    assert float(on.memory["tp_comm_buffers"]) == pytest.approx(float(fp8), rel=1e-9)
    assert float(off.memory["tp_comm_buffers"]) == 0.0
    assert float(on.memory["total"] - off.memory["total"]) == pytest.approx(float(fp8),
                                                                             rel=1e-6)
