"""The device power model (jaxmodel.energy) against hand-derived values, the TDP cap, the
TCO's use of it, and energy per token against published measurements."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import energy as en


@pytest.fixture(scope="module")
def h100():
    return hw_db.device("h100_sxm")


def test_idle_and_power_limited_gemm_hand_derived(h100):
    # nothing running: the idle power
    p = en.device_power(h100, 0.0, 0.0, 0.0)
    assert float(p["power_w"]) == pytest.approx(80.0)
    # full tensor duty at the sustained clock, no traffic: exactly the board limit
    # (P_c1·φ_s³ = TDP − idle by construction)
    phi = float(h100.sustained_clock_fraction)
    p = en.device_power(h100, 1.0, 0.0, 0.0, clock=phi)
    assert float(p["uncapped_w"]) == pytest.approx(700.0, rel=1e-6)
    # at full clock the same duty asks for (TDP − idle)/φ_s³ + idle, and the power limit
    # brings the clock back to φ_s
    p = en.device_power(h100, 1.0, 0.0, 0.0, clock=1.0)
    assert float(p["uncapped_w"]) == pytest.approx(80.0 + 620.0 / phi ** 3, rel=1e-6)
    assert bool(p["power_limited"]) and float(p["power_w"]) == 700.0
    assert float(p["clock_fraction"]) == pytest.approx(phi, rel=1e-5)
    # 1 TB/s of HBM traffic at 3.9 pJ/bit = 31.2 W; 100 GB/s of link traffic at 6.5 pJ/bit
    p = en.device_power(h100, 0.0, 1e12, 1e11)
    assert float(p["memory"]) == pytest.approx(31.2, rel=1e-6)
    assert float(p["link"]) == pytest.approx(5.2, rel=1e-6)
    assert float(p["power_w"]) == pytest.approx(80.0 + 31.2 + 5.2, rel=1e-6)


def test_power_never_exceeds_tdp_on_random_points():
    rng = np.random.default_rng(3)
    n = 500
    power = jax.jit(en.device_power)       # one compile: the devices differ in values only
    for name in ("a100_80gb", "h100_sxm", "b200", "mi300x", "v100"):
        dev = dataclasses.replace(hw_db.device(name), name="custom")
        p = power(dev, jnp.asarray(rng.uniform(0, 1.2, n)),
                            jnp.asarray(rng.uniform(0, 2, n) * float(dev.mem_bw)),
                            jnp.asarray(rng.uniform(0, 2e12, n)),
                            clock=jnp.asarray(rng.uniform(0.3, 1.0, n)))
        pw = np.asarray(p["power_w"])
        assert np.isfinite(pw).all() and (pw <= float(dev.tdp_w) + 1e-9).all()
        assert (pw >= float(en.idle_power(dev)) - 1e-9).all()
        cf = np.asarray(p["clock_fraction"])
        assert np.isfinite(cf).all() and (cf <= 1.0).all() and (cf >= 0.0).all()


def test_unknown_idle_power_is_a_share_of_tdp():
    dev = hw_db.device("mi300x")
    assert float(dev.idle_power_w) == -1.0
    assert float(en.idle_power(dev)) == pytest.approx(en.IDLE_TDP_SHARE * 750.0)
    for name in hw_db.names("device"):
        d = hw_db.device(name)
        assert 0.0 < float(en.idle_power(d)) < float(d.tdp_w)


def test_tco_uses_the_modelled_power():
    sy = hw_db.system("dgx_h100")
    base = jm.tco(sy, tokens_per_s=1e4)
    t = jm.tco(sy, tokens_per_s=1e4, power_w_per_device=350.0)
    # energy per hour ∝ (board + host) power; the default is TDP·utilization = 700 W
    host = 150.0
    assert float(t.energy_per_hour) == pytest.approx(
        float(base.energy_per_hour) * (350.0 + host) / (700.0 + host), rel=1e-6)
    assert float(t.capex_per_hour) == pytest.approx(float(base.capex_per_hour))


@pytest.mark.slow
def test_llama3_70b_serving_energy_within_published_range():
    """Llama-3-70B, 8×H100 (TP 8, TensorRT-LLM), 64 requests of 1024 + 256 tokens.

    Published: Samsi et al., "From Words to Watts: Benchmarking the Energy Costs of Large
    Language Model Inference" (HPEC 2023): LLaMA-65B on A100/V100, about 3–4 J per output
    token with small batches and an unoptimised runtime (the upper end); the ML.ENERGY
    Benchmark (Chung et al., 2025) reports Llama-3.1-70B on H100 with vLLM at large batches
    below 1 J per token (the lower end, 0.2 J taken as the floor). GPU board energy only."""
    sy, m, par = hw_db.system("dgx_h100"), hw_db.model("llama3-70b"), jm.Parallelism(tp=8)
    r = jm.inference(sy, m, par, 64, 1024, 256, runtime="trtllm")
    e = jm.inference_energy(sy, m, par, r, jm.InferenceOptions(64, 1024, 256), runtime="trtllm")
    assert 0.2 <= float(e.joules_per_token) <= 4.0
    assert 80.0 < float(e.power_w) <= 700.0
    # a single request is idle- and weight-streaming-bound: more energy per token
    r1 = jm.inference(sy, m, par, 1, 1024, 256, runtime="trtllm")
    e1 = jm.inference_energy(sy, m, par, r1, jm.InferenceOptions(1, 1024, 256),
                             runtime="trtllm")
    assert float(e1.joules_per_token) > 3.0 * float(e.joules_per_token)
    assert float(e1.power_w) < float(e.power_w)


@pytest.mark.slow
def test_gpt3_training_energy_within_published_range():
    """GPT-3 175B on 1,024 A100-80GB (PTD-P, TP 8 × PP 8 × DP 16, batch 1536 × 2048).

    Range: the datasheet floor — 6·N FLOP per token at the dense peak (312 TFLOP/s) drawing
    the 400 W TDP, 1.35 J/token — and the measured BLOOM-176B training on A100-80GB:
    433 MWh for 366 B tokens = 4.3 J/token including node overheads (Luccioni et al.,
    "Estimating the Carbon Footprint of BLOOM, a 176B Parameter Language Model", JMLR 2023,
    Table 2/§4). Patterson et al., "Carbon Emissions and Large Neural Network Training"
    (2021), give 1,287 MWh for GPT-3's 300 B tokens on V100: 15 J/token, a bound for
    the older GPU."""
    sy, m = hw_db.system("dgx_a100", nodes=128), hw_db.model("gpt3-175b")
    par = jm.Parallelism(dp=16, tp=8, pp=8, sp=True, recompute="selective",
                         flash_attention=True)
    r = jm.train_step(sy, m, par, 1536, 2048)
    assert bool(r.feasible)
    e = jm.train_energy(sy, m, par, r)
    floor = 6 * jm.param_count(m) / 312e12 * 400.0
    assert floor == pytest.approx(1.35, rel=0.02)
    assert floor <= float(e.joules_per_token) <= 4.3
    # below TDP, above idle (the model's mean: 262 W; its tensor-core duty at ~50 % MFU)
    assert 60.0 < float(e.power_w) <= 400.0
    print(f"GPT-3 175B on 1024 A100: {float(e.joules_per_token):.3f} J/token, "
          f"{float(e.power_w):.0f} W per GPU")


def test_tdp_caps_the_power_but_never_raises_it(h100):
    """The silicon's dynamic power is the device's, not TDP's: at a fixed clock and activity,
    raising tdp_w leaves the power unchanged (derivative 0) and lowering it below the demand
    caps the power at TDP; the on-chip memories switch with the busy share (DeepFlow split)."""
    phi = float(h100.sustained_clock_fraction)
    pd1 = float(en.dynamic_power(h100))
    assert pd1 == pytest.approx(620.0 / phi ** 3, rel=1e-5)
    # hand-derived: 40 % tensor duty, 90 % busy at the sustained clock, 1 TB/s HBM
    p = en.device_power(h100, 0.4, 1e12, 0.0, clock=phi, busy=0.9)
    act = en.MAC_SHARE * 0.4 + en.SRAM_SHARE * 0.9
    assert en.MAC_SHARE == pytest.approx(0.3745 / 0.7888, rel=1e-6)
    assert float(p["uncapped_w"]) == pytest.approx(80.0 + pd1 * phi ** 3 * act + 31.2, rel=1e-6)

    def watts(tdp):
        return en.device_power(dataclasses.replace(h100, tdp_w=tdp), 0.4, 1e12, 0.0,
                               clock=phi, busy=0.9)["power_w"]
    for tdp in (700.0, 900.0):
        assert float(watts(tdp)) == pytest.approx(float(p["uncapped_w"]), rel=1e-9)
        assert float(jax.grad(watts)(tdp)) == 0.0
    assert float(watts(300.0)) == 300.0 and float(jax.grad(watts)(300.0)) == 1.0
    # a device that gives none derives it from its TDP and sustained clock
    custom = dataclasses.replace(h100, dynamic_power_w=-1.0)
    assert float(en.dynamic_power(custom)) == pytest.approx(pd1, rel=1e-5)
