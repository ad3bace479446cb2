"""Admissible ranges of the configuration fields and the checks of concrete values.

One :class:`Rule` per field of each configuration class (:data:`RANGES`, keyed by the class
name; fields not listed follow :func:`default_rule`'s SI-suffix conventions), checked by
:func:`check_value` on concrete values only: in the loaders (``hw_db``) and the public
functions at the API edge, never under tracing (inside a batch an infeasible configuration
gives ``feasible=False`` instead). Every error names the place, the field and the value.

Units: SI (Hz, B, B/s, s, W, nm).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

from jaxmodel.codes import (ACTIVATIONS, ATTENTIONS, PLACEMENTS, RECOMPUTE, SCHEDULES,
                            TOPOLOGIES, ZERO3_IMPLS)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Admissible values of one field: ``lo <= v <= hi`` (``lo`` excluded when
    ``lo_open``), integral when ``integer``, and ``special`` values accepted as sentinels.

    ``dim`` is the physical dimension (``"Hz"``, ``"B"``, ``"B/s"``, ``"s"``, ``"W"``,
    ``"nm"`` or ``""``) a loader may convert an explicit ``unit`` from.
    """

    lo: float = 0.0
    hi: float = math.inf
    lo_open: bool = False
    integer: bool = False
    dim: str = ""
    special: tuple = ()
    what: str = ""

    def check(self, v: float) -> str | None:
        """``None`` when ``v`` is admissible, else the reason (a phrase)."""
        if not math.isfinite(v):
            return "must be a finite number"
        if v in self.special:
            return None
        extra = f" (or {', '.join(f'{s:g}' for s in self.special)})" if self.special else ""
        if v < self.lo or (self.lo_open and v == self.lo):
            op = ">" if self.lo_open else ">="
            return f"is too small: must be {op} {_fmt_bound(self.lo, self.dim)}{extra}"
        if v > self.hi:
            return f"is too large: must be <= {_fmt_bound(self.hi, self.dim)}{extra}"
        if self.integer and v != round(v):
            return f"must be an integer{extra}"
        return None


def _fmt_bound(x: float, dim: str) -> str:
    return f"{x:g} {dim}".rstrip()


def _real(lo, hi, dim="", lo_open=False, **kw):
    return Rule(lo=lo, hi=hi, lo_open=lo_open, dim=dim, **kw)


def _count(lo=1, hi=1e7, **kw):
    return Rule(lo=lo, hi=hi, integer=True, **kw)


def _code(names_or_n):
    n = names_or_n if isinstance(names_or_n, int) else len(names_or_n)
    return Rule(lo=0, hi=n - 1, integer=True, what="code")


FRACTION = _real(0.0, 1.0, lo_open=True)             # efficiencies: (0, 1]
SHARE = _real(0.0, 1.0)                              # overlaps: [0, 1]
FLAG = Rule(lo=0, hi=1, integer=True, what="flag")   # 0/1 (bools accepted)
LATENCY = _real(0.0, 1.0, "s")                       # 0 .. 1 s
CLOCK = _real(1e7, 1e10, "Hz")                       # 10 MHz .. 10 GHz
BANDWIDTH = _real(1e6, 1e15, "B/s")                  # 1 MB/s .. 1 PB/s
BUFFER = _real(1024.0, 2.0 ** 50, "B")               # >= 1 KiB
AREA_SENTINEL = (-1.0,)                              # -1 = "look up device_area.toml"

# One table of admissible ranges per config class and field. Fields not listed follow
# :func:`default_rule` (name-suffix conventions), so fields added later are still checked.
RANGES: dict[str, dict[str, Rule]] = {
    "Device": {
        "freq_hz": CLOCK,
        "core_count": _count(1, 1e6),
        "lanes_per_core": _count(1, 1024),
        "vector_width": _count(1, 65536),
        "vector_flops_per_cycle": _real(0, 1024, lo_open=True),
        "exp_flops": _real(0, 1e4, lo_open=True),
        "sa_rows": _count(1, 65536),
        "sa_cols": _count(1, 65536),
        "sa_mac_per_cycle": _real(0, 1024, lo_open=True),
        "local_buffer_bytes": BUFFER,
        "global_buffer_bytes": BUFFER,
        "global_buffer_bytes_per_cycle": _real(0, 1e7, "B", lo_open=True),
        "global_buffer_reuse_fraction": SHARE,
        "mem_bw": BANDWIDTH,
        "mem_capacity": _real(2.0 ** 20, 1e16, "B"),
        "mem_bw_efficiency": _real(0.01, 1.0),        # shipped 0.58 .. 1; < 1 % is no memory
        "matmul_overhead_s": LATENCY,
        "softmax_overhead_s": LATENCY,
        "layernorm_overhead_s": LATENCY,
        "gelu_overhead_s": LATENCY,
        "vector_dtype_bytes": _real(0.5, 8, "B"),      # an element word: fp4 (0.5 B) .. fp64
        "process_node_nm": _real(0.1, 1000, "nm"),
        "physical_core_count": _count(0, 1e6),      # 0 = core_count
        "mem_channels": _count(1, 1e4),               # a device with memory has a channel
        "device_links": _count(0, 1e4),
        "tdp_w": _real(1.0, 1e6, "W"),                # a powered chip draws >= 1 W
        "physical_global_buffer_bytes": _real(1024.0, 2.0 ** 50, "B", special=AREA_SENTINEL),
        "physical_local_buffer_bytes": _real(1024.0, 2.0 ** 50, "B", special=AREA_SENTINEL),
        "physical_mem_channels": _count(0, 1e4, special=AREA_SENTINEL),
        "physical_device_links": _count(0, 1e4, special=AREA_SENTINEL),
        "regfile_bytes_per_lane": _real(0, 2.0 ** 40, "B", special=AREA_SENTINEL),
        "regfile_ports": _count(0, 1024, special=AREA_SENTINEL),
        "lane_int32_units": _count(0, 1e5, special=AREA_SENTINEL),
        "lane_fp16_units": _count(0, 1e5, special=AREA_SENTINEL),
        "lane_fp32_units": _count(0, 1e5, special=AREA_SENTINEL),
        "lane_fp64_units": _count(0, 1e5, special=AREA_SENTINEL),
        "sa_mantissa_bits": _count(1, 64, special=AREA_SENTINEL),
        "mem_protocol": Rule(0, 3, integer=True, special=AREA_SENTINEL, what="code"),
        "link_protocol": Rule(0, 4, integer=True, special=AREA_SENTINEL, what="code"),
        "runtime_reserved_bytes": _real(0, 2.0 ** 50, "B"),
        "idle_power_w": _real(0.0, 1e6, "W", special=(-1.0,)),   # -1 = share of TDP
        "mem_energy_per_byte": _real(0.0, 1e-8),               # J/B: 0 .. 1.25 nJ/bit
        "link_energy_per_byte": _real(0.0, 1e-8),              # J/B
        # dense tensor rate of a format over the FP16 rate: 0 = no tensor-core path; shipped
        # 0 .. 4 (B200 FP4 dense = 4 x FP16 dense, NVIDIA Blackwell datasheet); 64 = six
        # halvings of the word below FP16, more than any format has
        **{f"matrix_ratio_{t}": _real(0.0, 64.0) for t in ("fp32", "tf32", "bf16", "fp16",
                                                             "fp8", "fp4", "int8")},
        "matmul_efficiency": _real(0.01, 1.0),        # shipped 0.91; < 1 % is no tensor core
        "matmul_bw_efficiency": _real(0.01, 1.0, special=(0.0,)),   # 0 = mem_bw_efficiency
        # the sustained clock is at least the idle clock: A100 210 of 1410 MHz (0.15), H100
        # 345 of 1980 MHz (nvidia-smi -q -d SUPPORTED_CLOCKS); shipped 0.65 .. 1
        "sustained_clock_fraction": _real(0.1, 1.0),
        "dynamic_power_w": _real(0.0, 1e6, "W", special=(-1.0,)),  # -1 = from TDP
    },
    "NetLevel": {
        "size": _count(1, 1e7),
        "topology": _code(TOPOLOGIES),
        "bw_per_device": BANDWIDTH,
        "link_latency": LATENCY,
        "switch_latency": LATENCY,
        "efficiency": _real(0.01, 1.0),               # shipped 0.82 .. 1; < 1 % is no link
        "base_latency": LATENCY,
        "flit_bytes": _real(0, 65536, "B", lo_open=True),
        "header_bytes": _real(0, 65536, "B"),
        "max_payload_bytes": _real(1, 2.0 ** 50, "B"),       # huge = no packetisation
        "in_network_reduction": FLAG,
        "chunk_latency": LATENCY,
        "bw_per_node": _real(1e6, 1e15, "B/s", special=(0.0,)),   # 0 = no shared limit
        "ll128_efficiency": FRACTION,
        "channel_copy_bw": _real(1e6, 1e15, "B/s", special=(0.0,)),   # 0 = no bound
        "nccl_bw": _real(1e6, 1e15, "B/s", special=(0.0,)),   # 0 = the executed bandwidth
        "nvls_bw": _real(1e6, 1e15, "B/s", special=(0.0,)),   # 0 = NVLS at the ring's
        "nvls_chunk_latency": LATENCY,
        "nccl_nvls_latency": _real(0.0, 1.0, "s", special=(-1.0,)),   # -1 = NCCL 2.30.7's
        "nccl_link": Rule(0, 2, integer=True, special=(-1.0,), what="code"),  # -1 = not NCCL
        "nvls_efficiency": _real(0.01, 1.0),          # shipped 0.74 .. 0.85
        "nccl_channels": _count(0, 1024),             # 0 = all; NCCL's MAXCHANNELS is 32/64
        "launch_floor": LATENCY,
    },
    "Model": {
        "n_layers": _count(1, 1e5),
        "d_model": _count(1, 1e7),
        "n_heads": _count(1, 1e5),
        "n_kv_heads": _count(1, 1e5),
        "head_dim": _real(0, 1e5, lo_open=True),      # d_model / n_heads by hand: may be fractional
        "d_ff": _count(1, 1e8),
        "vocab_size": _count(1, 1e8),
        "activation": _code(ACTIVATIONS),
        "n_experts": _count(1, 1e5),
        "top_k": _count(1, 1e5),
        "moe_every": _count(1, 1e5),
        "capacity_factor": _real(0, 1e3, lo_open=True),
        "tied_embeddings": FLAG,
        "attention": _code(ATTENTIONS),
        "q_lora_rank": _count(0, 1e7),
        "kv_lora_rank": _count(0, 1e7),
        "qk_nope_head_dim": _count(0, 1e5),
        "qk_rope_head_dim": _count(0, 1e5),
        "v_head_dim": _count(0, 1e5),
        "sliding_window": _count(0, 1e9),
        "global_every": _count(0, 1e5),
        "qkv_bias": FLAG,
        "parallel_block": FLAG,
        "n_shared_experts": _count(0, 1e5),
        "moe_d_ff": _count(0, 1e8),
        "first_k_dense": _count(0, 1e5),
        "n_mtp_layers": _count(0, 1e3),
        "n_group": _count(0, 1e5),
        "topk_group": _count(0, 1e5),
        "attention_chunk": _count(0, 1e9),
        "encoder_params": _count(0, 1e13),
    },
    "Parallelism": {
        "dp": _count(), "tp": _count(), "pp": _count(), "ep": _count(), "cp": _count(),
        "micro_batch": _count(), "interleave": _count(1, 1e4),
        "sp": FLAG, "flash_attention": Rule(0, 2, integer=True, what="code"),  # FA_VERSIONS
        "schedule": _code(SCHEDULES), "recompute": _code(RECOMPUTE), "zero": _code(4),
        "zero3_impl": _code(ZERO3_IMPLS), "order": _code(PLACEMENTS),
    },
    # keyword knobs of train_step / inference / layer_breakdown (scalars)
    "knobs": {
        "global_batch": _count(1, 1e9), "seq_len": _count(1, 1e8), "batch": _count(1, 1e9),
        "prompt_len": _count(1, 1e8), "gen_len": _count(1, 1e8), "kv_len": _count(0, 1e8),
        "dp_overlap": SHARE, "tp_overlap": SHARE, "pp_overlap": SHARE, "grad_bytes": _real(0, 16, "B", lo_open=True),
        "dtype_bytes": _real(0, 16, "B", lo_open=True),
        "adam_bytes_per_param": _real(0, 1e3, "B", lo_open=True),
        "clock_fraction": FRACTION,
        # 0 none, 1 Megatron GPT, 2 Megatron GPT on the Megatron-LM 2021 stack (train_step)
        "dropout": Rule(lo=0, hi=2, integer=True, what="code"),
    },
}


def default_rule(field: str, default: Any = None) -> Rule:
    """Range of a field the tables do not list, from SI-suffix conventions: ``*_hz`` a clock,
    ``*_s``/``*latency`` 0–1 s, ``*_bw``/``bw_*`` a bandwidth (0 = none), ``*_bytes`` ≥ 0,
    ``*efficiency``/``*fraction`` in (0, 1], otherwise any finite number ≥ 0. The field's
    own default value is always accepted (sentinels such as -1)."""
    special = ()
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        special = (float(default),)
    if field.endswith("_hz"):
        return dataclasses.replace(CLOCK, special=special)
    if field.endswith("_s") or field.endswith("latency"):
        return dataclasses.replace(LATENCY, special=special)
    if field.endswith("_bw") or field.startswith("bw_"):
        return dataclasses.replace(BANDWIDTH, special=special + (0.0,))
    if field.endswith("efficiency") or field.endswith("fraction"):
        return dataclasses.replace(FRACTION, special=special)
    if field.endswith("_bytes"):
        return _real(0, 2.0 ** 60, "B", special=special)
    return _real(0, math.inf, special=special)


def rule_of(cls_or_name: Any, field: str) -> Rule:
    """The :class:`Rule` of ``field`` of a config class (table entry or :func:`default_rule`)."""
    name = cls_or_name if isinstance(cls_or_name, str) else cls_or_name.__name__
    table = RANGES.get(name, {})
    if field in table:
        return table[field]
    default = None
    if not isinstance(cls_or_name, str) and dataclasses.is_dataclass(cls_or_name):
        f = {f.name: f for f in dataclasses.fields(cls_or_name)}.get(field)
        if f is not None and f.default is not dataclasses.MISSING:
            default = f.default
    return default_rule(field, default)


def check_value(where: str, field: str, value: Any, rule: Rule) -> None:
    """Raise ``ValueError`` naming ``where``, ``field`` and ``value`` unless every element of
    a concrete ``value`` satisfies ``rule``; traced values pass unchecked."""
    if isinstance(value, jax.core.Tracer):
        return
    if isinstance(value, str):
        kind = "a flag (0/1 or true/false)" if rule is FLAG else "a number"
        raise ValueError(f"{where}: field '{field}' must be {kind}, got the string {value!r}")
    if isinstance(value, bool):
        if rule is FLAG:
            return
        if rule.what == "code":
            raise ValueError(f"{where}: field '{field}' is a code, got the boolean {value!r}")
        raise ValueError(f"{where}: field '{field}' must be a number, got the boolean "
                         f"{value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: field '{field}' must be a number, got {value!r}") from None
    for x in arr.ravel():
        why = rule.check(float(x))
        if why:
            shown = value if arr.ndim == 0 else float(x)
            raise ValueError(f"{where}: field '{field}' = {shown!r} {why}")


def validate_fields(obj: Any, where: str) -> Any:
    """Check every numeric field of a config dataclass against :data:`RANGES`."""
    cls = type(obj)
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if (f.name == "name" or isinstance(f.default, str)          # static string metadata
                or isinstance(v, (tuple, list)) or dataclasses.is_dataclass(v)):
            continue
        check_value(where, f.name, v, rule_of(cls, f.name))
    return obj
