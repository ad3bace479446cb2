"""Convention 4, second half: a malformed device or network value raises a ``ValueError``
naming the field and the value (docs/architecture.md).

The malformed values are written here per field from what the field means, not read from
:data:`jaxmodel.types.RANGES`: every numeric field gets NaN, ±inf, a negative number, a
string and an absurd magnitude; counts get zero and fractions of a unit, efficiencies zero
and more than one, clocks / bandwidths / capacities / latencies the classic unit slips (MHz,
TB/s, GiB, µs given as SI numbers), plus the cross-field rule (``physical_core_count`` below
``core_count``). The test reports the share rejected with field and value named, and requires
at least 95 % of it; the misses are listed (``-s``). Units: SI, as the fields.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

import jaxmodel as jm
import hw_db
from jaxmodel.types import validate_device, validate_system

NAN, INF = math.nan, math.inf
UNIVERSAL = (NAN, INF, -INF, -7.25, "12", 1e300)

#: Malformed values by meaning (besides :data:`UNIVERSAL`).
COUNTS = (0.0, 0.5, 2.5)                    # a count of cores, lanes, rows, channels
COUNTS0 = (2.5, 0.5)                        # counts where 0 is meaningful (0 = default)
RATES = (0.0,)                              # per-cycle rates of a working unit
EFFICIENCY = (0.0, 1e-9, 1.5)               # an achieved share of a peak
LATENCY_S = (4.5, 2e3)                      # µs or ns given as seconds
DEVICE_BAD = {
    "freq_hz": (0.0, 1410.0, 1.41),          # MHz / GHz given as Hz
    "core_count": COUNTS, "lanes_per_core": COUNTS, "vector_width": COUNTS,
    "sa_rows": COUNTS, "sa_cols": COUNTS, "mem_channels": COUNTS,
    "vector_flops_per_cycle": RATES, "sa_mac_per_cycle": RATES, "exp_flops": RATES,
    "global_buffer_bytes_per_cycle": RATES,
    "local_buffer_bytes": (0.0, 192.0),      # KiB given as bytes
    "global_buffer_bytes": (0.0, 40.0),      # MiB given as bytes
    "mem_bw": (0.0, 2.0, 2039.0),            # TB/s, GB/s given as B/s
    "mem_capacity": (0.0, 80.0, 1e20),       # GiB given as bytes; 100 EB
    "mem_bw_efficiency": EFFICIENCY, "global_buffer_reuse_fraction": (1.5,),
    "matmul_efficiency": EFFICIENCY, "matmul_bw_efficiency": (1e-9, 1.5),   # 0 = default
    "sustained_clock_fraction": EFFICIENCY,
    "matmul_overhead_s": LATENCY_S, "softmax_overhead_s": LATENCY_S,
    "layernorm_overhead_s": LATENCY_S, "gelu_overhead_s": LATENCY_S,
    "matmul_kernel_overhead_s": LATENCY_S, "matmul_wave_latency_s": LATENCY_S,
    "mem_latency_s": LATENCY_S,
    "vector_dtype_bytes": (0.0, 0.1, 64.0),  # bits given as bytes
    "process_node_nm": (0.0, 7e-9),          # metres given as nm
    "physical_core_count": COUNTS0, "device_links": COUNTS0,
    "tdp_w": (0.0, 0.5, 7e8),                # mW given as W
    "idle_power_w": (-2.0, 7e8),
    "mem_energy_per_byte": (1.0, 5.0),       # J per byte (pJ meant)
    "link_energy_per_byte": (1.0, 5.0),
    "mem_protocol": (9.0, 1.5), "link_protocol": (9.0, 1.5),
    "regfile_ports": (2.5,), "lane_fp16_units": (2.5,), "sa_mantissa_bits": (0.0, 2.5, 200.0),
    **{f"matrix_ratio_{t}": (1e6,) for t in ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4",
                                              "int8")},   # a peak, not a ratio
}
NET_BAD = {
    "size": COUNTS, "topology": (7.0, 1.5),
    "bw_per_device": (0.0, 25.0, 300.0),     # Gb/s, GB/s given as B/s
    "link_latency": LATENCY_S, "switch_latency": LATENCY_S, "base_latency": LATENCY_S,
    "efficiency": EFFICIENCY, "flit_bytes": (0.0,), "max_payload_bytes": (0.0,),
    "in_network_reduction": (2.0, 0.5), "chunk_latency": LATENCY_S,
    "nvls_efficiency": EFFICIENCY, "nccl_channels": (2.5,), "nccl_link": (3.0, 0.5),
    "launch_floor": LATENCY_S,
}


def _numeric_fields(obj) -> list[str]:
    return [f.name for f in dataclasses.fields(obj)
            if not isinstance(getattr(obj, f.name), (str, tuple, list))
            and not dataclasses.is_dataclass(getattr(obj, f.name))]


def _cases(obj, bad: dict) -> list[tuple[str, object]]:
    return [(f, v) for f in _numeric_fields(obj) for v in UNIVERSAL + tuple(bad.get(f, ()))]


def _named(check, field: str, value) -> str | None:
    """``None`` when ``check`` raises a ValueError naming ``field`` and ``value``, else why
    not."""
    try:
        check()
    except ValueError as e:
        msg = str(e)
        shown = (repr(value), str(value), f"{value:g}" if isinstance(value, float) else "")
        named = any(s in msg for s in (f"'{field}'", f"{field}=", f".{field} "))
        if named and any(s and s in msg for s in shown):
            return None
        return f"named neither field nor value: {msg}"
    except Exception as e:  # noqa: BLE001  (anything but a ValueError is a miss)
        return f"{type(e).__name__}: {e}"
    return "accepted"


def _rate(cases, check_of) -> tuple[float, list[str]]:
    misses = []
    for field, value in cases:
        why = _named(check_of(field, value), field, value)
        if why:
            misses.append(f"{field}={value!r}: {why}")
    return 1.0 - len(misses) / len(cases), misses


def test_malformed_device_values_are_named():
    dev = hw_db.device("a100_80gb")
    cases = _cases(dev, DEVICE_BAD)
    cases += [("physical_core_count", 100.0)]             # below core_count = 108
    assert float(dev.core_count) == 108.0
    rate, misses = _rate(cases, lambda f, v: lambda: validate_device(
        dataclasses.replace(dev, **{f: v})))
    print(f"\nmalformed device values rejected naming field and value: {rate:.1%} of "
          f"{len(cases)}; misses: {misses}")
    assert len(cases) > 250
    assert rate >= 0.95, misses
    for must in (("mem_channels", 0.0), ("vector_dtype_bytes", 0.1), ("tdp_w", 0.0),
                 ("mem_bw_efficiency", 1e-9), ("physical_core_count", 100.0)):
        assert not any(m.startswith(f"{must[0]}={must[1]!r}:") for m in misses), must


def test_malformed_network_values_are_named():
    system = hw_db.system("dgx_a100", nodes=2)
    lvl = system.levels[0]
    cases = _cases(lvl, NET_BAD)

    def check_of(f, v):
        return lambda: validate_system(dataclasses.replace(
            system, levels=(dataclasses.replace(lvl, **{f: v}), *system.levels[1:])))
    rate, misses = _rate(cases, check_of)
    print(f"\nmalformed network values rejected naming field and value: {rate:.1%} of "
          f"{len(cases)}; misses: {misses}")
    assert rate >= 0.95, misses


def test_public_functions_and_loader_name_the_field(tmp_path):
    """The same check at the API edge (a public function on a concrete device) and in the
    loader (a device TOML)."""
    dev = hw_db.device("a100_80gb")
    with pytest.raises(ValueError, match=r"'mem_channels' = 0\.0"):
        jm.gemm_latency(dataclasses.replace(dev, mem_channels=0.0), 64, 64, 64)
    for op in (jm.softmax_latency, jm.layernorm_latency, jm.rmsnorm_latency):
        with pytest.raises(ValueError, match=rf"{op.__name__}: Device: field 'freq_hz' = 1410"):
            op(dataclasses.replace(dev, freq_hz=1410.0), 64, 64)
    with pytest.raises(ValueError, match=r"'mem_bw_efficiency' = 1e-09"):
        jm.layer_breakdown(hw_db.system("dgx_a100").__class__(
            device=dataclasses.replace(dev, mem_bw_efficiency=1e-9), levels=()),
            hw_db.model("gpt2-small"), jm.Parallelism(), 1, 128)
    src = (Path(hw_db.__file__).parent / "devices" / "a100_80gb.toml").read_text()
    lines = [ln for ln in src.splitlines() if not ln.startswith("vector_dtype_bytes")]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines + ["vector_dtype_bytes = 0.1"]) + "\n")
    with pytest.raises(ValueError, match=r"vector_dtype_bytes.*0\.1"):
        hw_db.device(str(path))


def test_pp_overlap_outside_its_range_is_named():
    import hw_db
    import jaxmodel as jm
    with pytest.raises(ValueError, match="pp_overlap"):
        jm.train_step(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"),
                      jm.Parallelism(dp=8.0), 64, 2048, pp_overlap=1.5)
