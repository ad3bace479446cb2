"""FlashAttention occupancy at long sequences with few heads per device (Llama-3-70B, TP 8).

Dao, "FlashAttention-2", 2023, §3.2: FlashAttention-1 runs one thread block per (sequence,
head), so with ``b·h`` below the number of SMs most of the GPU idles; FlashAttention-2 also
parallelises over the sequence (query blocks forward, key blocks backward). Llama-3-70B under
TP 8 has 64/8 = 8 query heads (1 KV head) per device: at micro-batch 1 FA-1 fills 8 of the
H100's 132 SMs. These tests pin that mechanism (``flash_attention=True`` is code 1, FA-1), and
FA-2's grouped-query backward, parallel over query heads (Dao 2023 §3.1).
"""

import jax.numpy as jnp
import pytest

import jaxmodel as jm  # noqa: F401,I001  (wires hw_db up)
import hw_db
from jaxmodel.ops import flash_attention_latency
from jaxmodel.ops.attention import AttentionKernel

HEADS, KV_HEADS, SEQ, HEAD_DIM = 8.0, 1.0, 8192.0, 128.0   # Llama-3-70B, one of 8 TP ranks


def per_sequence(dev, batch, version, dtype=jnp.float32):
    r = flash_attention_latency(dev, jnp.asarray(batch, dtype), HEADS, SEQ, SEQ, HEAD_DIM,
                                KV_HEADS, AttentionKernel(causal=1.0, version=version))
    return float(r["total"]) / batch


@pytest.mark.parametrize("name", ["h100_sxm", "a100_80gb"])
def test_fa1_time_per_sequence_falls_until_heads_fill_the_cores(name):
    dev = hw_db.device(name)
    cores = float(dev.core_count)
    filled = float(jnp.ceil(cores / HEADS))        # sequences for b·h >= cores
    fa1_one, fa1_full = per_sequence(dev, 1.0, 1.0), per_sequence(dev, filled, 1.0)
    fa2_one, fa2_full = per_sequence(dev, 1.0, 2.0), per_sequence(dev, filled, 2.0)
    # FA-1 at b = 1 uses HEADS of ``cores`` SMs: per sequence it is at least several times
    # slower than with the SMs filled (ideal ratio cores / HEADS; > 16 on both devices)
    assert fa1_one / fa1_full > 0.25 * cores / HEADS
    # FA-2 already fills the SMs with query / key blocks of one sequence (8192 / B_r blocks)
    assert fa2_one / fa2_full < 1.5
    # so at micro-batch 1 FA-2 is faster than FA-1 by more than FA-2's kernel gain alone
    assert fa1_one / fa2_one > 2.0 * fa1_full / fa2_full


def test_training_layer_fa2_faster_than_fa1_for_llama3_70b_tp8():
    system, model = hw_db.system("dgx_h100"), hw_db.model("llama3-70b")
    times = {}
    for fa in (1.0, 2.0):
        par = jm.Parallelism(tp=8, sp=True, flash_attention=fa, recompute="selective")
        t = jm.training_layer_times(system, model, par, 1, 8192)
        times[fa] = float(t["fwd"] + t["bwd"])
    # the FFN and projections are identical: the whole gap is the attention core
    assert times[1.0] > 1.5 * times[2.0]


@pytest.mark.parametrize("dtype", [jnp.float32, pytest.param(jnp.float64,
                                                         marks=pytest.mark.float64)])
def test_fa2_gqa_backward_parallel_per_query_head(dtype):
    """Dao 2023 §3.1: under GQA the backward runs one thread block per (key block, query
    head), so its GEMM time equals multi-head attention's with as many query heads (same
    block pairs, same items); only the dK/dV group sum adds traffic and one launch."""
    dev = hw_db.device("h100_sxm")
    one = jnp.asarray(1.0, dtype)

    def run(kv_heads):
        return flash_attention_latency(dev, one, HEADS, SEQ, SEQ, HEAD_DIM, kv_heads,
                                       AttentionKernel(causal=1.0, version=2.0))
    gqa, mha = run(KV_HEADS), run(HEADS)
    assert float(gqa["gemm_bwd"]) == pytest.approx(float(mha["gemm_bwd"]), rel=1e-6)
    assert float(gqa["flops_bwd"]) == pytest.approx(float(mha["flops_bwd"]), rel=1e-6)
    # the extra launch of the group sum, and never slower than MHA by more than its traffic
    assert float(gqa["overhead_bwd"]) == pytest.approx(4.0 * float(dev.matmul_overhead_s))
    extra = 2.0 * (2.0 * HEADS + 1.0) * SEQ * HEAD_DIM * 2.0 / float(dev.mem_bw)
    assert float(gqa["bwd"]) <= float(mha["bwd"]) + extra + float(dev.matmul_overhead_s)
