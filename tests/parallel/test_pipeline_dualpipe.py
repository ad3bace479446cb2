"""DualPipe and DeepSeek-V3's recomputation in the training step (DeepSeek-AI, "DeepSeek-V3
Technical Report", 2024, §3.2; deepseek-ai/DualPipe): hand-derived memory terms on a tiny
MLA + MoE model, and DeepSeek-V3's own recipe on its 2,048 H800 against the reported
throughput. Both compile training graphs: slow."""

import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
import hw_db

#: DeepSeek-V3 Technical Report, Table 1: 2,664 K H800 GPU hours for 14.8 T tokens.
REPORTED_TOKENS_PER_S_PER_GPU = 14.8e12 / (2.664e6 * 3600.0)


def _tiny():
    return jm.Model(n_layers=4, d_model=256, n_heads=4, n_kv_heads=4, head_dim=64, d_ff=512,
                    vocab_size=1024, activation="swiglu", n_experts=8.0, top_k=2.0,
                    attention="mla", q_lora_rank=64.0, kv_lora_rank=32.0,
                    qk_nope_head_dim=32.0, qk_rope_head_dim=16.0, v_head_dim=32.0,
                    moe_d_ff=128.0, n_group=4.0, topk_group=2.0)


@pytest.mark.slow
def test_dualpipe_and_norm_upproj_on_a_tiny_moe_by_hand():
    """1F1B vs DualPipe (pp 4, m 8, ZeRO-1), one batched step: DualPipe holds two stage
    copies — weights and gradients 2×, optimizer states 1× (sharded over both copies'
    2·dp ranks) — and PP + 1 = 5 micro-batch-stages of activations against 1F1B's 4; the
    recomputations order none (with FlashAttention) < norm_upproj < full, and norm_upproj's
    activations are its own inventory (:func:`jaxmodel.workload.moe.
    norm_upproj_activation_bytes`) times the stage's layers and in-flight micro-batches."""
    from jaxmodel.workload.moe import norm_upproj_activation_bytes
    model, system = _tiny(), hw_db.system("dgx_h800", nodes=2)
    sched = ["1f1b", "dualpipe", "1f1b", "1f1b"]
    rc = ["none", "none", "norm_upproj", "full"]
    from jaxmodel.types import RECOMPUTE, SCHEDULES
    par = jm.Parallelism(dp=4, pp=4, ep=4, zero=1, flash_attention=True,
                         schedule=jnp.array([SCHEDULES.index(x) * 1.0 for x in sched]),
                         recompute=jnp.array([RECOMPUTE.index(x) * 1.0 for x in rc]))
    r = jm.train_step(system, model, par, 32, 512, dropout=0.0)
    assert np.asarray(r.feasible).all()
    mem = {k: np.asarray(v) for k, v in r.memory.items()}
    # the most loaded stage: 1F1B's first (4 micro-batches in flight), DualPipe's last (all
    # stages hold 5; the last adds the final norm's 256 weights): equal up to those
    assert mem["weights"][1] == pytest.approx(2.0 * mem["weights"][0], rel=2e-3)
    assert mem["gradients"][1] == pytest.approx(2.0 * mem["gradients"][0], rel=2e-3)
    assert mem["optimizer"][1] == pytest.approx(mem["optimizer"][0], rel=2e-3)
    assert mem["weights"][1] != pytest.approx(mem["weights"][0], rel=0.5)
    assert mem["activations"][1] == pytest.approx(5.0 / 4.0 * mem["activations"][0], rel=1e-6)
    # 1 layer per stage, 4 micro-batches in flight on the first stage (1F1B), bf16
    want = 4.0 * float(norm_upproj_activation_bytes(model, 512.0, 1.0, 2.0, 2.0, 2.0))
    assert mem["activations"][2] == pytest.approx(want, rel=1e-6)
    rcs = np.asarray(r.breakdown["recompute"])
    assert rcs[0] == 0.0 and 0.0 < rcs[2] < rcs[3]
    assert np.isfinite(np.asarray(r.step_time_s)).all()


@pytest.mark.slow
def test_deepseek_v3_recipe_feasible_within_20_percent():
    """DeepSeek-V3 §3.2–3.4 on 2,048 H800: PP 16, EP 64 on 8 nodes (Megatron-core's rank
    order), ZeRO-1, no TP, FP8, DualPipe, RMSNorm + MLA up-projection recomputation,
    node-limited routing: feasible, and within 20 % of 1,543 tokens/s per GPU."""
    model, system = hw_db.model("deepseek-v3"), hw_db.system("dgx_h800", nodes=256)
    par = jm.Parallelism(dp=128, pp=16, ep=64, zero=1, schedule="dualpipe",
                         recompute="norm_upproj", order="tp-cp-ep-dp-pp",
                         flash_attention=True)
    r = jm.train_step(system, model, par, 15360, 4096, precision="fp8", dropout=0.0)
    assert bool(r.feasible), jm.reason_name(r.reason)
    per_gpu = float(r.tokens_per_s) / 2048.0
    assert abs(per_gpu / REPORTED_TOKENS_PER_S_PER_GPU - 1.0) < 0.20
    assert float(r.memory_bytes) < float(system.device.mem_capacity)
