"""Parameter counts and model FLOPs against published numbers and Megatron's eq. 3."""

import jax.numpy as jnp
import pytest

import jaxmodel as jm  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.workload.params import (model_flops_per_token, param_count, params_per_device)


def test_gpt3_175b_param_count_by_hand():
    h, L, V = 12288.0, 96.0, 50257.0
    want = L * (12 * h * h + 4 * h) + V * h + 2 * h     # tied head, no biases
    assert float(param_count(hw_db.model("gpt3-175b"))) == pytest.approx(want, rel=1e-12)
    assert float(param_count(hw_db.model("gpt3-175b"))) / 1e9 == pytest.approx(174.6, abs=0.1)


@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6_738_415_616),      # HF model card / safetensors index
    ("llama2-70b", 68_976_648_192),
    ("mixtral-8x7b", 46_702_792_704),
])
def test_published_param_counts(name, published):
    # our layernorms count gain + bias; RMSNorm has no bias (≤ 1e-4 relative)
    assert float(param_count(hw_db.model(name))) == pytest.approx(published, rel=1e-4)


def test_megatron_eq3_flops():
    m = hw_db.model("gpt3-175b")
    B, s, l, h, V = 1.0, 2048.0, 96.0, 12288.0, 50257.0
    eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    got = float(model_flops_per_token(m, s, include_recompute=True)) * B * s
    assert got == pytest.approx(eq3, rel=1e-12)
    no_rc = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert float(model_flops_per_token(m, s)) * B * s == pytest.approx(no_rc, rel=1e-12)


def test_params_per_device_tp_pp():
    m = hw_db.model("gpt3-175b")
    h, V = 12288.0, 50257.0
    got = float(params_per_device(m, jm.Parallelism(tp=8, pp=8)))
    assert got == pytest.approx(12 * (12 * h * h / 8 + 4 * h) + V * h / 8 + 2 * h, rel=1e-12)
    # pp = 1, untied (llama): embedding and head both on the one stage
    ll = hw_db.model("llama2-7b")
    one = float(params_per_device(ll, jm.Parallelism(tp=1)))
    assert one == pytest.approx(float(param_count(ll)), rel=1e-12)
    # vmapped over tp equals the loop
    tps = jnp.array([1.0, 2.0, 4.0])
    batched = params_per_device(ll, jm.Parallelism(tp=tps))
    for i, t in enumerate([1.0, 2.0, 4.0]):
        assert float(batched[i]) == pytest.approx(float(params_per_device(
            ll, jm.Parallelism(tp=t))), rel=1e-12)


def test_moe_experts_split_over_ep():
    m = hw_db.model("mixtral-8x7b")
    full = float(params_per_device(m, jm.Parallelism()))
    ep8 = float(params_per_device(m, jm.Parallelism(ep=8)))
    expert_w = 32 * 8 * 3 * 4096 * 14336
    assert full - ep8 == pytest.approx(expert_w * 7 / 8, rel=1e-9)
    # top-2 of 8: forward FLOPs count two experts and the router
    d, L, V = 4096.0, 32.0, 32000.0
    matmul = d * (4096 + 2 * 1024) + 4096 * d + 2 * 3 * d * 14336 + d * 8
    layer = 2 * matmul + 4 * 1.0 * 32 * 128
    want = 3 * L * layer + 3 * 2 * d * V
    assert float(model_flops_per_token(m, 1.0)) == pytest.approx(want, rel=1e-12)
