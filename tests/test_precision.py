"""Numeric precision as a dimension: presets, device rates, memory per tensor class, feasibility.

Hand-derived expectations (bytes per parameter / element) are written out in each test.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: I001
import hw_db
from jaxmodel import numerics as nx
from jaxmodel.parallel.inference_step import inference_single
from jaxmodel.precisions import gemm_word
from jaxmodel.workload.memory import inference_memory, kv_cache_bytes, training_memory
from jaxmodel.workload.params import params_per_device

NEW_DEVICES = ("l40s", "h800", "gb200", "mi325x", "gaudi2", "gaudi3", "tpuv5e", "tpuv5p")
GIB = 2 ** 30


def flop_gemm(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    """Compute-bound GEMM hook: FLOPs at the (precision-scaled) systolic peak, s."""
    return 2.0 * batch * m * n * k / dev.peak_matrix_flops


# ------------------------------------------------------------------------------------------
# presets and conversion
# ------------------------------------------------------------------------------------------
def test_preset_byte_counts():
    bf16, fp8, fp4, w4 = (jm.precision(n) for n in ("bf16", "fp8", "fp4", "w4a16"))
    # mixed precision (Megatron): 2 B weights, 4 B fp32 main grads, 4 B master + 8 B Adam
    assert [float(getattr(bf16, f)) for f in ("weight_bytes", "grad_bytes", "master_bytes",
                                              "optim_bytes", "act_bytes", "kv_bytes")] == \
        [2, 4, 4, 8, 2, 2]
    # Transformer Engine FP8: 1 B GEMM operands, BF16 weights + cached FP8 copy, FP8 KV cache
    assert float(gemm_word(fp8)) == 1.0
    assert float(fp8.weight_copy_bytes) == 1.0 and float(fp8.kv_bytes) == 1.0
    assert int(fp8.gemm_dtype) == jm.DTYPES.index("fp8")
    assert int(fp8.attn_dtype) == jm.DTYPES.index("bf16")
    gw = gemm_word
    assert float(gw(fp4)) == pytest.approx(0.5 + 1.0 / 16)      # NVFP4: E4M3 scale per 16
    assert float(gw(w4)) == pytest.approx(0.5 + 2.0 / 128)      # INT4 + FP16 scale per 128
    assert float(gw(bf16)) == 2.0


def test_precision_conversion_and_errors():
    p = jm.precision("FP8")
    assert p.name == "fp8"
    assert jm.precision(p) is p
    assert jm.precision(None).name == "bf16"
    assert float(jm.precision("nvfp4").gemm_bytes) == 0.5
    assert float(jm.precision("fp8", kv_bytes=2.0).kv_bytes) == 2.0
    assert int(jm.Precision(gemm_dtype="int8").gemm_dtype) == jm.DTYPES.index("int8")
    with pytest.raises(ValueError, match="not one of"):
        jm.precision("fp6")
    with pytest.raises(ValueError, match="unknown field"):
        jm.precision({"gemm_bits": 8})
    with pytest.raises(ValueError, match="gemm_dtype"):
        jm.validate_precision(jm.Precision(gemm_dtype=9.0))
    for name in jm.PRESETS:
        jm.validate_precision(jm.precision(name))


# ------------------------------------------------------------------------------------------
# devices: capacities, rates, new entries
# ------------------------------------------------------------------------------------------
def test_capacities_are_exact_bytes():
    assert hw_db.device("h100_sxm").mem_capacity == 80 * GIB
    assert hw_db.device("a100_80gb").mem_capacity == 80 * GIB
    assert hw_db.device("a100_40gb").mem_capacity == 40 * GIB
    assert hw_db.device("mi300x").mem_capacity == 192 * GIB


def test_dtype_rates_from_datasheets():
    h100 = hw_db.device("h100_sxm")
    assert float(h100.peak_matrix_flops_of("fp8")) == pytest.approx(1978.9e12, rel=1e-3)
    assert float(h100.peak_matrix_flops_of("bf16")) == pytest.approx(989.4e12, rel=1e-3)
    assert float(hw_db.device("a100_80gb").peak_matrix_flops_of("fp8")) == 0.0
    assert float(hw_db.device("b200").peak_matrix_flops_of("fp4")) == pytest.approx(9e15,
                                                                                    rel=1e-3)
    # Gaudi 3 runs FP8 at the BF16 rate (Intel Gaudi 3 white paper)
    g3 = hw_db.device("gaudi3")
    assert float(g3.peak_matrix_flops_of("fp8")) == float(g3.peak_matrix_flops_of("bf16"))


def _stacked(names, label="same"):
    """Devices of ``names`` as one batch (leading axis), every name set to ``label``."""
    devs = [dataclasses.replace(hw_db.device(n), name=label) for n in names]
    return jax.tree_util.tree_map(lambda *x: jnp.asarray(x), *devs)


def test_new_devices_load_and_give_finite_gemm_times():
    dev = _stacked(NEW_DEVICES)
    t16 = np.asarray(jm.gemm_latency(dev, 4096, 4096, 4096))
    assert np.all(np.isfinite(t16)) and np.all(t16 > 0)
    # compute-bound: at least the FLOPs at the datasheet peak
    assert np.all(t16 >= 2 * 4096 ** 3 / np.asarray(dev.peak_matrix_flops) * (1 - 1e-6))
    r8 = np.asarray(dev.matrix_ratio_fp8)
    t8 = np.asarray(jm.gemm_latency(jm.ops.with_matrix_rate(dev, jnp.where(r8 > 0, r8, 1.0)),
                                    4096, 4096, 4096, dtype_bytes=1))
    assert np.all(np.isfinite(t8)) and np.all(t8[r8 > 0] <= t16[r8 > 0])
    assert np.all(t8[r8 >= 2] < 0.75 * t16[r8 >= 2])


def test_no_device_result_depends_on_its_name():
    names = hw_db.names("device")
    for kw in ({}, {"dtype_bytes": 1.0}):
        a = np.asarray(jm.gemm_latency(_stacked(names, "a"), 2048, 1024, 512, **kw))
        b = np.asarray(jm.gemm_latency(_stacked(names, "b"), 2048, 1024, 512, **kw))
        np.testing.assert_array_equal(a, b)
        assert np.all(np.isfinite(a))


def test_new_systems_load():
    h800 = hw_db.system("dgx_h800", nodes=2)
    assert float(h800.levels[0].bw_per_device) == 200e9       # 400 GB/s bidirectional
    assert float(h800.n_devices) == 16
    nvl = hw_db.system("gb200_nvl72")
    assert float(nvl.levels[0].size * nvl.levels[1].size) == 72    # 18 hosts x 4 GPUs
    assert nvl.device.name == "gb200"


def test_rate_scale_equals_a_faster_systolic_array():
    dev = hw_db.device("h100_sxm")
    fast = dataclasses.replace(dev, sa_mac_per_cycle=2.0 * dev.sa_mac_per_cycle)
    t8 = float(jm.gemm_latency(jm.ops.with_matrix_rate(dev, 2.0), 4096, 8192, 1024,
                               dtype_bytes=1))
    assert t8 == float(jm.gemm_latency(fast, 4096, 8192, 1024, dtype_bytes=1))
    # the precision module's dtype-code route: H100's FP8 tensor cores run at twice 16 bits
    fp8 = jm.precisions.DTYPES.index("fp8")
    assert t8 == float(jm.gemm_latency(jm.precisions.scaled_device(dev, fp8), 4096, 8192,
                                       1024, dtype_bytes=1))
    # no tensor-core rate: a concrete device is rejected by name, a traced one gives +inf
    with pytest.raises(ValueError, match="sa_mac_per_cycle"):
        jm.gemm_latency(jm.ops.with_matrix_rate(dev, 0.0), 64, 64, 64)
    traced = jax.jit(lambda r: jm.gemm_latency.single(jm.ops.with_matrix_rate(dev, r), 64.0,
                                                      64.0, 64.0))
    assert np.isinf(float(traced(0.0)))


# ------------------------------------------------------------------------------------------
# memory per tensor class
# ------------------------------------------------------------------------------------------
def test_fp8_serving_memory_below_bf16_by_one_byte_per_parameter_and_half_the_kv():
    m, par = hw_db.model("llama2-13b"), jm.Parallelism(tp=2)
    b, s, g = 8.0, 1024.0, 512.0
    bf = inference_memory(m, par, b, s, g, precision="bf16")
    f8 = inference_memory(m, par, b, s, g, precision="fp8")
    p = float(params_per_device(m, par))
    # weights: 2 B -> 1 B per parameter; KV cache: 2 B -> 1 B per element
    assert float(bf["weights"] - f8["weights"]) == pytest.approx(1.0 * p, rel=1e-9)
    kv16 = float(kv_cache_bytes(m, par, b, s + g, 2.0))
    assert float(bf["kv_cache"]) == pytest.approx(kv16, rel=1e-9)
    assert float(f8["kv_cache"]) == pytest.approx(kv16 / 2, rel=1e-9)
    assert float(bf["total"] - f8["total"]) == pytest.approx(p + kv16 / 2, rel=1e-9)
    # 4-bit weights with FP16 group scales: 0.5 + 2/128 B per parameter, 16-bit KV
    w4 = inference_memory(m, par, b, s, g, precision="w4a16")
    assert float(w4["weights"]) == pytest.approx(p * (0.5 + 2 / 128), rel=1e-9)
    # legacy keyword: 1-byte everything
    legacy = inference_memory(m, par, b, s, g, dtype_bytes=1.0)
    assert float(legacy["weights"]) == pytest.approx(p, rel=1e-9)


def test_training_memory_bytes_per_parameter():
    """bf16: 2 + 4 + (4 + 8) = 18 B/param; fp8 adds Transformer Engine's cached FP8 weight
    copy and its transpose (20 B); NVFP4 adds 2·(0.5 + 1/16) B; fp32: 4 + 4 + (0 + 8) = 16 B."""
    m = hw_db.model("gpt3-13b")
    par = jm.Parallelism(tp=8, pp=1, sp=True, recompute="selective")
    p = float(params_per_device(m, par))
    states = {}
    for name in ("bf16", "fp8", "fp4", "fp32"):
        mem = training_memory(m, par, 2048.0, 1.0, precision=name)
        states[name] = float(mem["weights"] + mem["fp8_weight_cache"] + mem["gradients"]
                             + mem["optimizer"])
    assert states["bf16"] == pytest.approx(18 * p, rel=1e-9)
    assert states["fp8"] == pytest.approx(20 * p, rel=1e-9)
    assert states["fp4"] == pytest.approx((18 + 2 * (0.5 + 1 / 16)) * p, rel=1e-9)
    assert states["fp32"] == pytest.approx(16 * p, rel=1e-9)
    # activations follow act_bytes: fp32 stores 4-byte activations (masks stay 1 byte)
    a16 = float(training_memory(m, par, 2048.0, 1.0, precision="bf16")["activations"])
    a32 = float(training_memory(m, par, 2048.0, 1.0, precision="fp32")["activations"])
    assert 1.8 * a16 < a32 < 2.0 * a16


# ------------------------------------------------------------------------------------------
# layer, training and inference
# ------------------------------------------------------------------------------------------
H100_NODE = hw_db.system("dgx_h100")
GPT = hw_db.model("gpt3-13b")


def one_device(name):
    """A single-device system (small compiled graphs: no collectives are traced)."""
    return jm.System(device=hw_db.device(name), levels=[jm.NetLevel(
        size=1, topology="switch", bw_per_device=100e9, link_latency=1e-6)])


def test_layer_fp8_halves_weight_gemms_keeps_attention():
    par = jm.Parallelism(tp=8)
    bf = jm.layer_breakdown(H100_NODE, GPT, par, 4, 1024, gemm=flop_gemm)
    f8 = jm.layer_breakdown(H100_NODE, GPT, par, 4, 1024, gemm=flop_gemm, precision="fp8")
    for row in ("qkv", "wo", "w1", "w2"):      # FP8 tensor cores: twice the BF16 rate
        assert float(f8[row]) == pytest.approx(float(bf[row]) / 2, rel=1e-6)
    for row in ("qk", "av"):                   # attention stays in BF16 (Transformer Engine)
        assert float(f8[row]) == pytest.approx(float(bf[row]), rel=1e-9)
    assert float(f8["quantize"]) > 0           # the W_o input cast kernel
    assert "quantize" not in bf or float(bf["quantize"]) == 0.0
    assert float(f8["total"]) < float(bf["total"])


def test_fp8_backward_transposes_the_saved_weight_gemm_inputs():
    """Per-tensor FP8 (Transformer Engine 1.x) transposes each weight GEMM's saved FP8 input
    ``[m, k]`` for its weight gradient: read + write 1 B per element, one elementwise kernel;
    block-scaled recipes do not (hand difference of the two backward quantise times)."""
    from jaxmodel.ops import elementwise_latency
    from jaxmodel.workload.layer import Gemm, quantize_times
    dev = hw_db.device("h100_sxm")
    rows = {"w2": [(Gemm(4096.0, 1024.0, 2048.0), 1.0)]}
    f8 = jm.precision("fp8")
    blocked = jm.precision("fp8", scale_block=32.0, scale_bytes=1.0)

    @jax.jit
    def run(dev):
        return (quantize_times(dev, rows, f8, True)[1]
                - quantize_times(dev, rows, blocked, True)[1],
                elementwise_latency.single(dev, 4096.0 * 2048.0, 2.0, 0.0, overhead=True),
                quantize_times(dev, rows, jm.precision("bf16"), True)[1])
    diff, hand, bf16 = run(dev)
    assert float(diff) == pytest.approx(float(hand), rel=1e-6)
    assert float(bf16) == 0.0


@pytest.mark.slow
def test_unsupported_precision_is_infeasible_with_its_reason():
    a100 = one_device("a100_80gb")
    par = jm.Parallelism()
    m = hw_db.model("gpt2-small")
    r = jm.train_step(a100, m, par, 8, 1024, gemm=flop_gemm, precision="fp8")
    assert not bool(r.feasible)
    assert jm.reason_name(r.reason) == "precision_unsupported"
    assert np.isinf(float(r.step_time_s))
    ok = jm.train_step(a100, m, par, 8, 1024, gemm=flop_gemm, precision="bf16")
    assert bool(ok.feasible)
    assert nx.REASONS[15] == "precision_unsupported"


@pytest.mark.slow
def test_unsupported_precision_in_serving_and_layer():
    a100 = one_device("a100_80gb")
    par = jm.Parallelism()
    m = hw_db.model("gpt2-small")
    inf = jm.inference(a100, m, par, 4, 128, 16, gemm=flop_gemm, precision="fp4")
    assert not bool(inf.feasible)
    assert jm.reason_name(inf.reason) == "precision_unsupported"
    layer = jm.layer_breakdown(a100, m, par, 4, 128, gemm=flop_gemm, precision="fp8")
    assert np.isinf(float(layer["total"]))


@pytest.mark.slow
def test_train_step_precision_batch_matches_a_loop_and_legacy_keyword():
    h100 = one_device("h100_sxm")
    par = jm.Parallelism()
    m = hw_db.model("gpt2-small")
    names = ["bf16", "fp8"]
    batch = jm.train_step(h100, m, par, 4, 1024, gemm=flop_gemm,
                          precision=jm.stack_precisions(names))
    loop = [jm.train_step(h100, m, par, 4, 1024, gemm=flop_gemm, precision=n)
            for n in names]
    np.testing.assert_allclose(np.asarray(batch.step_time_s),
                               [float(r.step_time_s) for r in loop], rtol=1e-6)
    # a small model: FP8 halves the GEMMs, but its cast kernels (launch-bound) may cost more
    # than that saves; the step changes either way
    assert float(loop[1].breakdown["compute"]) != float(loop[0].breakdown["compute"])
    legacy = jm.train_step(h100, m, par, 4, 1024, gemm=flop_gemm, dtype_bytes=2.0)
    assert float(legacy.step_time_s) == pytest.approx(float(loop[0].step_time_s), rel=1e-9)


@pytest.mark.slow
def test_inference_fp8_jit_matches_eager_and_gradient_is_finite():
    m = hw_db.model("gpt2-medium")
    par = jm.Parallelism(tp=8)
    prec = jm.precision("fp8")
    f = lambda bw: inference_single(  # noqa: E731
        dataclasses.replace(H100_NODE, device=dataclasses.replace(H100_NODE.device,
                                                                  mem_bw=bw)),
        m, par, 8.0, 256.0, 32.0, gemm=flop_gemm, precision=prec).total_s
    bw = jnp.asarray(3.35e12)
    assert float(jax.jit(f)(bw)) == pytest.approx(float(f(bw)), rel=1e-5)
    g = float(jax.grad(f)(bw))
    assert np.isfinite(g) and g < 0


@pytest.mark.slow
def test_search_over_precisions():
    system = hw_db.system("dgx_h100")
    df = jm.search_parallelism(system, hw_db.model("gpt2-medium"), 8, 16, 1024,
                               progress=False, precision=["bf16", "fp8"], max_tp=8,
                               schedules=["1f1b"], recompute=["none"], zero=[0], sp=[False],
                               flash_attention=[False])
    assert set(df["precision"]) == {"bf16", "fp8"}
    assert df.attrs["n_feasible"] == len(df)
    # every plan appears once per precision, with different step times (the rates differ)
    plan_cols = ["dp", "tp", "pp", "micro_batch"]
    for _, grp in df.groupby(plan_cols):
        assert sorted(grp["precision"]) == ["bf16", "fp8"]
        assert grp["step_time_s"].nunique() == 2


def test_matrix_ratio_constant_code_matches_traced():
    """A constant dtype code picks the device's field directly; a traced one selects it: the
    same ratio for every code (0 outside the table)."""
    from jaxmodel.precisions import DTYPES, matrix_ratio
    dev = hw_db.device("h100_sxm")
    for code in [*range(len(DTYPES)), -1.0, len(DTYPES) + 0.0, 1.2]:
        const = matrix_ratio(dev, float(code))
        traced = jax.jit(lambda c: matrix_ratio(dev, c))(float(code))
        assert float(const) == float(traced), code
