"""Config pytrees: leaves, codes, validation, derived peaks (hand-derived)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel.types import code_of


def test_device_peaks_match_datasheets():
    a100 = hw_db.device("a100_80gb")
    # 108 SM x 4 lanes x 16x16 PEs x 1 MAC x 2 FLOP x 1.41 GHz (LLMCompass: 311.9 TFLOP/s)
    assert float(a100.peak_matrix_flops) == pytest.approx(108 * 4 * 256 * 2 * 1.41e9)
    assert float(a100.peak_matrix_flops) == pytest.approx(311.9e12, rel=1e-3)
    # 108 x 4 lanes x 32 wide x 4 flop x 1.41 GHz = 78 TFLOP/s (notes §1)
    assert float(a100.peak_vector_flops) == pytest.approx(77.97e12, rel=1e-3)
    assert float(hw_db.device("h100_sxm").peak_matrix_flops) == pytest.approx(989.4e12, rel=1e-3)
    assert float(hw_db.device("mi300x").peak_matrix_flops) == pytest.approx(1307.4e12, rel=1e-3)


def test_every_numeric_field_is_a_leaf():
    dev = hw_db.device("a100_80gb")
    n_numeric = len([f for f in dataclasses.fields(jm.Device) if f.name != "name"])
    assert len(jax.tree_util.tree_leaves(dev)) == n_numeric
    par = jm.Parallelism(dp=2, tp=8, pp=4, sp=True, schedule="interleaved", recompute="full")
    assert len(jax.tree_util.tree_leaves(par)) == len(dataclasses.fields(jm.Parallelism))
    assert par.schedule == 2.0 and par.recompute == 2.0 and par.sp == 1.0


def test_codes_follow_contract_order():
    assert jm.TOPOLOGIES == ("ring", "switch", "fully_connected", "mesh2d", "torus2d")
    # the contract's codes keep their numbers; DeepSeek-V3's schedule and recomputation follow
    assert jm.SCHEDULES == ("gpipe", "1f1b", "interleaved", "dualpipe")
    assert jm.RECOMPUTE == ("none", "selective", "full", "norm_upproj")
    lvl = jm.NetLevel(size=8, topology="torus2d", bw_per_device=1e11, link_latency=1e-6)
    assert lvl.topology == 4.0
    assert code_of(3.0, jm.TOPOLOGIES, "topology") == 3.0


def test_bad_code_names_the_field():
    with pytest.raises(ValueError, match="schedule"):
        jm.Parallelism(schedule="zigzag")
    with pytest.raises(ValueError, match="topology"):
        jm.NetLevel(size=4, topology="hypercube", bw_per_device=1.0, link_latency=0.0)


def test_post_init_is_trace_safe():
    dev = hw_db.device("a100_80gb")
    batch = dataclasses.replace(dev, mem_bw=jnp.array([1e12, 2e12]))
    axes = jax.tree_util.tree_map(lambda x: 0 if jnp.ndim(x) else None, batch)
    out = jax.vmap(lambda d: d.achievable_mem_bw, in_axes=(axes,))(batch)
    assert out.shape == (2,)
    par = jm.Parallelism(tp=jnp.array([1.0, 2.0]))
    assert jax.jit(lambda p: p.n_devices)(par).shape == (2,)


@pytest.mark.parametrize("field,value", [("mem_bw", 0.0), ("core_count", -4.0),
                                         ("freq_hz", float("nan")), ("local_buffer_bytes", 0)])
def test_validate_device_names_field_and_value(field, value):
    dev = dataclasses.replace(hw_db.device("a100_80gb"), **{field: value})
    with pytest.raises(ValueError, match=field):
        jm.validate_device(dev)


def test_validate_parallelism():
    with pytest.raises(ValueError, match="zero"):
        jm.validate_parallelism(jm.Parallelism(zero=5))
    with pytest.raises(ValueError, match="tp"):
        jm.validate_parallelism(jm.Parallelism(tp=0))


def test_system_levels_and_device_count():
    sys_ = jm.System(device=hw_db.device("a100_80gb"),
                     levels=[jm.NetLevel(size=8, topology="switch", bw_per_device=300e9,
                                         link_latency=1e-6),
                             jm.NetLevel(size=4, topology="switch", bw_per_device=100e9,
                                         link_latency=5e-6)])
    assert isinstance(sys_.levels, tuple)
    assert float(sys_.n_devices) == 32.0
    leaves = jax.tree_util.tree_leaves(sys_)
    assert all(jnp.isfinite(jnp.asarray(x)) for x in leaves)


# ---- the range table: magnitudes, counts, codes, flags, bools and strings -----------------
@pytest.mark.parametrize("field,value,needle", [
    ("freq_hz", 1410.0, "too small"),               # MHz number read as Hz
    ("freq_hz", 5e10, "too large"),
    ("core_count", 0.5, "core_count"),
    ("core_count", 107.5, "integer"),
    ("mem_bw", -1.0, "too small"),
    ("mem_bw", 5e15, "too large"),
    ("mem_bw_efficiency", 5.0, "too large"),
    ("mem_bw_efficiency", 0.0, "too small"),
    ("local_buffer_bytes", 100.0, "too small"),
    ("matmul_overhead_s", 2.0, "too large"),
    ("mem_protocol", 7.0, "mem_protocol"),
    ("sa_rows", "16", "string"),
    ("tdp_w", True, "boolean"),
])
def test_device_ranges_name_field_and_value(field, value, needle):
    dev = dataclasses.replace(hw_db.device("a100_80gb"), **{field: value})
    with pytest.raises(ValueError, match=field) as e:
        jm.validate_device(dev)
    assert needle in str(e.value) and repr(value)[:4] in str(e.value)


def test_area_sentinels_and_defaults_pass():
    dev = hw_db.device("a100_80gb")
    assert float(dev.mem_protocol) == -1.0        # -1 = look up device_area.toml
    jm.validate_device(dataclasses.replace(dev, mem_protocol=2.0, physical_mem_channels=6.0))


def test_default_rule_covers_unlisted_fields():
    from jaxmodel.types import default_rule, rule_of
    assert rule_of(jm.Device, "freq_hz").lo == 1e7
    assert default_rule("launch_latency").check(2.0)          # > 1 s
    assert default_rule("fp8_mem_bw").check(1.0)              # < 1 MB/s
    assert default_rule("fp8_mem_bw").check(0.0) is None      # 0 = none
    assert default_rule("some_efficiency").check(1.5)
    assert default_rule("new_count").check(-1.0)
    assert default_rule("new_count", default=-1.0).check(-1.0) is None   # its own default
    assert default_rule("new_count").check(float("nan"))


@pytest.mark.parametrize("kw,field", [
    (dict(sp=0.5), "sp"), (dict(flash_attention=7), "flash_attention"),
    (dict(tp=0), "tp"), (dict(pp=2.5), "pp"), (dict(zero=4), "zero"),
    (dict(schedule=4.0), "schedule"), (dict(sp="yes"), "sp"), (dict(micro_batch=-1), "micro_batch"),
    (dict(zero3_impl=2.0), "zero3_impl"), (dict(zero3_impl=0.5), "zero3_impl"),
])
def test_parallelism_ranges(kw, field):
    with pytest.raises(ValueError, match=field):
        jm.validate_parallelism(jm.Parallelism(**kw))


def test_bools_are_flags_not_codes():
    par = jm.Parallelism(sp=True, flash_attention=True)
    assert par.sp == 1.0 and par.flash_attention == 1.0
    jm.validate_parallelism(par)
    with pytest.raises(ValueError, match=r"recompute=True.*'none', 'selective', 'full'"):
        jm.Parallelism(recompute=True)
    with pytest.raises(ValueError, match="schedule"):
        jm.Parallelism(schedule=False)
    with pytest.raises(ValueError, match="zero3_impl"):
        jm.Parallelism(zero3_impl=True)


def test_zero3_impl_codes():
    from jaxmodel.types import ZERO3_IMPLS
    assert ZERO3_IMPLS == ("fsdp", "deepspeed")
    assert jm.Parallelism().zero3_impl == 0.0
    assert jm.Parallelism(zero3_impl="deepspeed").zero3_impl == 1.0
    with pytest.raises(ValueError, match="zero3_impl"):
        jm.Parallelism(zero3_impl="megatron")
    jm.validate_parallelism(jm.Parallelism(zero=3, zero3_impl="deepspeed"))


def test_activation_aliases_are_true_synonyms_only():
    assert code_of("gelu_new", jm.ACTIVATIONS, "activation") == 0.0
    assert code_of("relu", jm.ACTIVATIONS, "activation") == 3.0       # a kind of its own
    assert code_of("squared_relu", jm.ACTIVATIONS, "activation") == 4.0
    for act in ("silu", "swish"):      # gated or not depends on the architecture
        with pytest.raises(ValueError, match="activation"):
            code_of(act, jm.ACTIVATIONS, "activation")
    with pytest.raises(ValueError, match="did you mean 'switch'"):
        code_of("swich", jm.TOPOLOGIES, "topology")


@pytest.mark.parametrize("kw,field", [
    (dict(efficiency=2.0), "efficiency"), (dict(topology=7.0), "topology"),
    (dict(size=0.5), "size"), (dict(link_latency=-1e-6), "link_latency"),
    (dict(bw_per_device=3e20), "bw_per_device"), (dict(in_network_reduction=2.0),
                                                   "in_network_reduction"),
])
def test_netlevel_ranges(kw, field):
    base = dict(size=8, topology="switch", bw_per_device=300e9, link_latency=1e-6)
    sys_ = jm.System(device=hw_db.device("a100_80gb"), levels=[jm.NetLevel(**{**base, **kw})])
    with pytest.raises(ValueError, match=rf"levels\[0\].*{field}"):
        jm.validate_system(sys_)


def test_model_cross_field_rules():
    m = hw_db.model("llama3-8b")
    with pytest.raises(ValueError, match="n_kv_heads"):
        jm.validate_model(dataclasses.replace(m, n_kv_heads=3.0))
    with pytest.raises(ValueError, match="top_k"):
        jm.validate_model(dataclasses.replace(m, top_k=2.0))
    with pytest.raises(ValueError, match="n_layers"):
        jm.validate_model(dataclasses.replace(m, n_layers=0.0))


def test_validate_knobs():
    from jaxmodel.types import validate_knobs
    validate_knobs("f", dp_overlap=0.5, tp_overlap=1, grad_bytes=2, seq_len=2048, batch=8,
                   clock_fraction=None)
    for kw, field in ((dict(tp_overlap=-1), "tp_overlap"), (dict(dp_overlap=5), "dp_overlap"),
                      (dict(grad_bytes=0), "grad_bytes"), (dict(seq_len=0), "seq_len"),
                      (dict(batch=2.5), "batch"), (dict(gen_len=float("nan")), "gen_len")):
        with pytest.raises(ValueError, match=f"f: field '{field}'"):
            validate_knobs("f", **kw)
    validate_knobs("f", dp_overlap=jnp.array([0.0, 5.0]))     # batches report, not raise


def test_validation_skips_batches_and_tracers():
    from jaxmodel.types import validate_args
    dev = hw_db.device("a100_80gb")
    validate_args(dataclasses.replace(dev, mem_bw=jnp.array([-1.0, 2e12])))   # a batch
    jax.jit(lambda bw: validate_args(dataclasses.replace(dev, mem_bw=bw)) or bw)(-1.0)
    with pytest.raises(ValueError, match="gemm_latency: Device: field 'mem_bw' = -1"):
        validate_args(dataclasses.replace(dev, mem_bw=-1.0), where="gemm_latency")


def test_public_functions_reject_hand_built_configs_before_computing():
    dev = hw_db.device("a100_80gb")
    with pytest.raises(ValueError, match="mem_bw"):
        jm.gemm_latency(dataclasses.replace(dev, mem_bw=-1.0), 128, 128, 128)
    sys_ = hw_db.system("hgx_a100_4gpu")
    bad = dataclasses.replace(sys_, levels=(dataclasses.replace(sys_.levels[0],
                                                                efficiency=2.0),))
    with pytest.raises(ValueError, match="efficiency"):
        jm.collective_latency(bad, "all_reduce", 2**20, 4)
    m = hw_db.model("gpt2-small")
    for kw, field in ((dict(tp_overlap=-1), "tp_overlap"), (dict(dp_overlap=5), "dp_overlap"),
                      (dict(grad_bytes=0), "grad_bytes")):
        with pytest.raises(ValueError, match=field):
            jm.train_step(sys_, m, jm.Parallelism(dp=4), 8, 256, **kw)
    with pytest.raises(ValueError, match="seq_len"):
        jm.train_step(sys_, m, jm.Parallelism(dp=4), 8, 0)
    with pytest.raises(ValueError, match="sp"):
        jm.train_step(sys_, m, jm.Parallelism(dp=4, sp=0.5), 8, 256)
    with pytest.raises(ValueError, match="batch"):
        jm.inference(sys_, m, jm.Parallelism(tp=4), batch=0, prompt_len=128, gen_len=8)
    with pytest.raises(ValueError, match="flash_attention"):
        jm.inference(sys_, m, jm.Parallelism(tp=4, flash_attention=7), 8, 128, 8)


def test_dropout_knob_is_a_code():
    """train_step's ``dropout``: 0 none, 1 Megatron GPT, 2 the Megatron-LM 2021 stack."""
    from jaxmodel.types import validate_knobs
    for ok in (0, 1, 2, 2.0):
        validate_knobs("f", dropout=ok)
    for bad in (3, 1.5, -1):
        with pytest.raises(ValueError, match="dropout"):
            validate_knobs("f", dropout=bad)


# Malformed device/system values: physically meaningless values a rule-derived generator cannot
# know (zero channels, a sub-nibble word, a 0 W chip, a 1e-9 memory efficiency, fewer cores
# on the die than enabled) plus, for every field of RANGES["Device"] / RANGES["NetLevel"],
# non-finite, wrong-type, negative, above-range and non-integral values.
_MALFORMED_EXPLICIT = [
    ("Device", "mem_channels", 0), ("Device", "vector_dtype_bytes", 0.1),
    ("Device", "tdp_w", 0.0), ("Device", "mem_bw_efficiency", 1e-9),
    ("Device", "physical_core_count", 64.0), ("Device", "mem_capacity", 0.0),
    ("Device", "freq_hz", 0.0), ("Device", "core_count", 0.0), ("Device", "mem_bw", 0.0),
    ("NetLevel", "efficiency", 0.0), ("NetLevel", "bw_per_device", 0.0),
    ("NetLevel", "size", 0.0)]


def _malformed_cases():
    import math

    from jaxmodel.types import RANGES
    out = list(_MALFORMED_EXPLICIT)
    for cls in ("Device", "NetLevel"):
        for field, rule in RANGES[cls].items():
            out += [(cls, field, v) for v in (math.nan, math.inf, -math.inf, "x", -2.0)]
            if rule.hi != math.inf:
                out.append((cls, field, rule.hi * 2 + 1))
            if rule.integer:
                out.append((cls, field, max(rule.lo, 1) + 0.5))
    return out


def _names_field_and_value(cls, field, value, system):
    """True when the malformed value raises ValueError naming the field and the value."""
    from jaxmodel.types import validate_system
    try:
        if cls == "Device":
            dev = dataclasses.replace(system.device, **{field: value})
            bad = dataclasses.replace(system, device=dev)
        else:
            levels = list(system.levels)
            levels[0] = dataclasses.replace(levels[0], **{field: value})
            bad = dataclasses.replace(system, levels=tuple(levels))
        validate_system(bad)
    except ValueError as e:
        msg = str(e)
        return field in msg and (repr(value) in msg or str(value) in msg)
    return False


def test_malformed_device_and_system_values_name_the_field_and_value():
    system = hw_db.system("dgx_a100")
    cases = _malformed_cases()
    missed = [c for c in cases if not _names_field_and_value(*c, system)]
    assert 1 - len(missed) / len(cases) >= 0.95, missed
    assert not [c for c in missed if c in _MALFORMED_EXPLICIT], missed


def test_physical_core_count_zero_or_at_least_core_count():
    dev = hw_db.device("a100_80gb")
    for ok in (0.0, dev.core_count, 128.0):
        jm.types.validate_device(dataclasses.replace(dev, physical_core_count=ok))
    with pytest.raises(ValueError, match=r"physical_core_count' = 100\.0"):
        jm.types.validate_device(dataclasses.replace(dev, physical_core_count=100.0))
