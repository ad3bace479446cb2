"""Micro-architecture engine: technology parameters + area/power/perimeter budgets → Device.

Re-implements DeepFlow's micro-architecture generator (``hw_component.py``; Ardalani, Pal,
Gupta, arXiv 2211.03309; Guo et al. §III-A "μArch engine"), as re-stated in
, with JAX so gradients flow from budgets to performance:

* die perimeter ``4·√A_chip`` (square die);
* cores: ``n_mcu = ⌊A_core/a_mcu⌋``, nominal power ``p_mcu·n_mcu·(a_op/a_nom)``; the voltage
  solves the DVFS cubic ``V(V−V_t)² = (P_core/P_nom)·V_n(V_n−V_t)²`` and
  ``f = f_n·[(V−V_t)²/V]/[(V_n−V_t)²/V_n]`` (alpha-power law, α = 2); below ``V_t + V_margin``
  the voltage is clamped and ``f`` scaled by ``(V/V_clamp)²``; peak = flop/cycle·n_mcu·f;
* SRAM level k: ``banks = ⌊(1−ovh)·A_k/(bank_area + (1−ovh)·n_sm·ctrl_area)⌋``,
  ``size = banks·bank_bytes``, ``BW = (P_k − P_static)/E_byte`` (× util);
* DRAM: ``stacks = min(⌊(A_device − A_chip)/A_stack⌋, ⌊A_ctrl/a_ctrl⌋)``,
  ``links = min(frac·perimeter·links/mm, 1024·stacks)``, same DVFS on the links,
  ``BW = links·f/8``;
* network: ``links = min(A_net/a_link, frac·perimeter·links/mm)``, DVFS, ``BW = links·f·util/8``.

Floors use a straight-through estimator (value = DeepFlow's integer, gradient = the continuous
ratio) unless ``discrete=False``; the cubic is solved by Newton iterations with an implicit-function
gradient.

Example:
    (skipped as a doctest: the DeepFlow configuration files are not shipped)

    >>> tech, budgets = load_deepflow_config("waferscale_20v100_80hbm.yaml")  # doctest: +SKIP
    >>> dev, info = jm.uarch(tech, budgets, details=True)    # doctest: +SKIP
    >>> float(dev.peak_matrix_flops)          # doctest: +SKIP
    125e12
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.numerics import safe_div
from jaxmodel.types import Device, _register

Array = Any
GIB = 1024.0 ** 3


@dataclasses.dataclass(frozen=True)
class SRAMTech:
    """One SRAM level (DeepFlow ``tech_param.SRAM-*``). Units: J/bit, W/bit, mm²/bit, bytes, mm²."""

    dynamic_energy_per_bit: Array
    static_power_per_bit: Array
    area_per_bit: Array
    bank_bytes: Array
    controller_area_per_link: Array = 0.0
    overhead: Array = 0.2
    util: Array = 1.0


@dataclasses.dataclass(frozen=True)
class LinkTech:
    """A link technology (DeepFlow ``tech_param.network.*``): bit/s, V, J/bit, mm², links/mm."""

    nominal_frequency: Array
    nominal_voltage: Array
    threshold_voltage: Array
    margin_voltage: Array
    energy_per_bit: Array
    area_per_link: Array
    links_per_mm: Array
    util: Array = 1.0
    latency: Array = 0.0


@dataclasses.dataclass(frozen=True)
class UArchTech:
    """Technology parameters of the μArch engine (DeepFlow ``tech_param``), SI-ish units.

    Core: W/MCU, FLOP/cycle/MCU, mm²/MCU, Hz, V; DRAM: J/bit, W/bit, bytes/stack, mm²/stack,
    mm² controller/stack, bit/s per link, V, links/mm, links/stack.
    """

    mcu_power: Array
    mcu_flops_per_cycle: Array
    mcu_area_nominal: Array
    mcu_area: Array
    core_nominal_frequency: Array
    core_nominal_voltage: Array
    core_threshold_voltage: Array
    core_margin_voltage: Array
    mcu_per_core: Array
    fma_d1: Array
    fma_d2: Array
    core_util: Array
    dram_energy_per_bit: Array
    dram_static_power_per_bit: Array
    dram_stack_bytes: Array
    dram_stack_area: Array
    dram_ctrl_area: Array
    dram_nominal_frequency: Array
    dram_nominal_voltage: Array
    dram_threshold_voltage: Array
    dram_margin_voltage: Array
    dram_max_voltage: Array
    dram_links_per_mm: Array
    dram_links_per_stack: Array
    dram_util: Array
    l2: SRAMTech
    l1: SRAMTech
    rf: SRAMTech
    intra: LinkTech
    inter: LinkTech


@dataclasses.dataclass(frozen=True)
class UArchBudgets:
    """Area (mm²), power (W) and perimeter (fraction) budgets (DeepFlow absolute form)."""

    device_area: Array
    chip_area: Array
    core_area: Array
    l2_area: Array
    l1_area: Array
    rf_area: Array
    dram_ctrl_area: Array
    intra_area: Array
    inter_area: Array
    tdp: Array
    core_power: Array
    dram_power: Array
    l2_power: Array
    l1_power: Array
    rf_power: Array
    intra_power: Array
    inter_power: Array
    dram_perimeter: Array
    intra_perimeter: Array
    inter_perimeter: Array


for _c in (SRAMTech, LinkTech, UArchTech, UArchBudgets):
    _register(_c)


def _st_floor(x, discrete: bool):
    """⌊x⌋ with the gradient of x (straight-through), or x itself when not discrete."""
    if not discrete:
        return x
    return x + jax.lax.stop_gradient(jnp.floor(x + 1e-9) - x)


def dvfs(power_ratio, v_nom, v_th, v_margin, f_nom, v_max=jnp.inf, iters: int = 40):
    """Operating frequency for a power budget (DeepFlow DVFS, alpha-power law α = 2).

    Solves ``V(V−V_t)² = r·V_n(V_n−V_t)²`` (Newton from above the root; implicit gradient),
    clamps to ``[V_t + V_margin, V_max]`` and returns ``(f, V)`` with
    ``f = f_n·[(V−V_t)²/V]/[(V_n−V_t)²/V_n]``, scaled by ``(V/V_clamp)²`` below the floor.
    """
    r = jnp.maximum(power_ratio, 0.0)
    k = r * v_nom * (v_nom - v_th) ** 2

    def g(v):
        return v * (v - v_th) ** 2 - k

    def dg(v):
        return (v - v_th) ** 2 + 2.0 * v * (v - v_th)

    v = jax.lax.stop_gradient(v_th + jnp.cbrt(jnp.maximum(k, 0.0)) + 1e-3)
    kk = jax.lax.stop_gradient(k)
    vt = jax.lax.stop_gradient(v_th)

    def newton(_, v):
        return v - (v * (v - vt) ** 2 - kk) / jnp.maximum((v - vt) ** 2 + 2.0 * v * (v - vt),
                                                         1e-12)

    v = jax.lax.stop_gradient(jax.lax.fori_loop(0, iters, newton, v))
    v = v - g(v) / jnp.maximum(dg(v), 1e-12)  # one implicit-function step carries the gradient
    v_floor = v_th + v_margin
    v_c = jnp.clip(v, v_floor, v_max)
    shape = safe_div((v_c - v_th) ** 2, v_c) / safe_div((v_nom - v_th) ** 2, v_nom)
    scale = jnp.where(v < v_floor, (safe_div(v, v_c)) ** 2, 1.0)
    return f_nom * shape * scale, v_c


def _sram(s: SRAMTech, area, power, n_core, discrete):
    bank_area = s.bank_bytes * 8.0 * s.area_per_bit
    banks = _st_floor(safe_div((1.0 - s.overhead) * area,
                               bank_area + (1.0 - s.overhead) * n_core
                               * s.controller_area_per_link), discrete)
    size = jnp.maximum(banks, 0.0) * s.bank_bytes
    p_dyn = jnp.maximum(power - s.static_power_per_bit * size * 8.0, 0.0)
    bw = safe_div(p_dyn, s.dynamic_energy_per_bit * 8.0)
    return size, bw * s.util, bw


def _link(t: LinkTech, area, power, frac, perimeter, degree, discrete):
    n = _st_floor(jnp.minimum(safe_div(area, t.area_per_link),
                              frac * perimeter * t.links_per_mm), discrete)
    p_nom = t.energy_per_bit * n * t.nominal_frequency
    f, _ = dvfs(safe_div(power, p_nom), t.nominal_voltage, t.threshold_voltage,
                t.margin_voltage, t.nominal_frequency)
    return n * f * t.util / (8.0 * degree), n


def _uarch_single(t: UArchTech, b: UArchBudgets, discrete: bool = True):
    perimeter = 4.0 * jnp.sqrt(b.chip_area)
    n_mcu = _st_floor(safe_div(b.core_area, t.mcu_area), discrete)
    n_core = _st_floor(safe_div(n_mcu, t.mcu_per_core), discrete)
    scale = safe_div(t.mcu_area, t.mcu_area_nominal)
    p_nom = t.mcu_power * n_mcu * scale
    freq, v_core = dvfs(safe_div(b.core_power, p_nom), t.core_nominal_voltage,
                        t.core_threshold_voltage, t.core_margin_voltage,
                        t.core_nominal_frequency)
    flops_per_cycle = t.mcu_flops_per_cycle * scale
    peak = flops_per_cycle * n_mcu * freq

    l2_size, l2_bw, l2_bw_raw = _sram(t.l2, b.l2_area, b.l2_power, n_core, discrete)
    l1_size, l1_bw, l1_bw_raw = _sram(t.l1, b.l1_area, b.l1_power, n_core, discrete)
    rf_size, rf_bw, rf_bw_raw = _sram(t.rf, b.rf_area, b.rf_power, n_core, discrete)

    stacks = jnp.minimum(_st_floor(safe_div(b.device_area - b.chip_area, t.dram_stack_area),
                                   discrete),
                         _st_floor(safe_div(b.dram_ctrl_area, t.dram_ctrl_area), discrete))
    stacks = jnp.maximum(stacks, 0.0)
    links = _st_floor(jnp.minimum(b.dram_perimeter * perimeter * t.dram_links_per_mm,
                                  t.dram_links_per_stack * stacks), discrete)
    dram_bytes = stacks * t.dram_stack_bytes
    p_dyn = b.dram_power - t.dram_static_power_per_bit * dram_bytes * 8.0
    p_nom_dram = t.dram_energy_per_bit * links * t.dram_nominal_frequency
    f_dram, v_dram = dvfs(safe_div(p_dyn, p_nom_dram), t.dram_nominal_voltage,
                          t.dram_threshold_voltage, t.dram_margin_voltage,
                          t.dram_nominal_frequency, t.dram_max_voltage)
    dram_bw = links * f_dram / 8.0 * t.dram_util

    intra_bw, intra_links = _link(t.intra, b.intra_area, b.intra_power, b.intra_perimeter,
                                  perimeter, 4.0, discrete)
    inter_bw, inter_links = _link(t.inter, b.inter_area, b.inter_power, b.inter_perimeter,
                                  perimeter, 1.0, discrete)

    # Map to the LLMCompass-style Device: an MCU (tensor core) is a lane with a d1 x d2 array
    # doing d1 MACs per PE per cycle (d1 x d2 x d1 MMA), so 2·d1·d2·mac = FLOP/cycle/MCU.
    mac = safe_div(flops_per_cycle, 2.0 * t.fma_d1 * t.fma_d2)
    dev = Device(freq_hz=freq, core_count=safe_div(n_mcu, t.mcu_per_core),
                 lanes_per_core=t.mcu_per_core, vector_width=t.fma_d2,
                 vector_flops_per_cycle=2.0, sa_rows=t.fma_d1, sa_cols=t.fma_d2,
                 sa_mac_per_cycle=mac, local_buffer_bytes=safe_div(l1_size, n_core),
                 global_buffer_bytes=l2_size,
                 global_buffer_bytes_per_cycle=safe_div(l2_bw, freq),
                 mem_bw=dram_bw, mem_capacity=dram_bytes, mem_channels=stacks,
                 tdp_w=b.tdp)
    info = {
        "n_mcu": n_mcu, "n_core": n_core, "perimeter_mm": perimeter, "core_voltage": v_core,
        "freq_hz": freq, "peak_flops": peak, "effective_flops": peak * t.core_util,
        "l2_bytes": l2_size, "l2_bw": l2_bw, "l2_bw_dynamic": l2_bw_raw,
        "l1_bytes": l1_size, "l1_bw": l1_bw, "l1_bw_dynamic": l1_bw_raw,
        "rf_bytes": rf_size, "rf_bw": rf_bw, "rf_bw_dynamic": rf_bw_raw,
        "dram_stacks": stacks, "dram_links": links, "dram_freq_hz": f_dram,
        "dram_voltage": v_dram, "dram_bw": dram_bw, "dram_bytes": dram_bytes,
        "intra_bw": intra_bw, "intra_links": intra_links,
        "inter_bw": inter_bw, "inter_links": inter_links,
    }
    return dev, info


_uarch_batched = batched(_uarch_single)


def uarch(tech: UArchTech, budgets: UArchBudgets, *, discrete: bool = True,
          details: bool = False):
    """DeepFlow micro-architecture engine: technology + budgets → :class:`jaxmodel.Device`.

    Args:
        tech: :class:`UArchTech` (e.g. from :func:`load_deepflow_config`).
        budgets: :class:`UArchBudgets` (absolute mm² / W / perimeter fractions).
        discrete: integer unit/bank/stack/link counts with straight-through gradients (DeepFlow);
            ``False`` keeps them continuous.
        details: also return a dict of derived quantities (MCUs, voltage, per-level sizes and
            bandwidths, DRAM stacks and links, network bandwidths).

    Returns:
        The device (and the dict when ``details``). Leaves may be batched; differentiable
        w.r.t. every budget and technology parameter.
    """
    dev, info = _uarch_batched(tech, budgets, discrete=discrete)
    return (dev, info) if details else dev


uarch.single = _uarch_single


# --------------------------------------------------------------------------------------------
# DeepFlow YAML configs (a minimal reader: nested 'key: value' mappings, '#' comments)
# --------------------------------------------------------------------------------------------
_UNITS = {"B": 1.0, "KB": 1024.0, "MB": 1024.0 ** 2, "GB": GIB, "TB": 1024.0 ** 4}


def _parse_yaml(path: Path) -> dict:
    root: dict = {}
    stack = [(-1, root)]
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if ":" not in line:
            raise ValueError(f"{path}:{lineno}: expected 'key: value', got {raw.strip()!r}")
        key, val = line.strip().split(":", 1)
        while stack and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        val = val.strip().strip('"').strip("'")
        if val == "":
            parent[key] = {}
            stack.append((indent, parent[key]))
        else:
            parent[key] = val
    return root


def _num(path, d, key, default=None):
    if key not in d:
        if default is not None:
            return float(default)
        raise ValueError(f"{path}: missing field '{key}'")
    v = str(d[key]).strip()
    m = re.fullmatch(r"([-+0-9.eE]+)\s*([KMGT]?B)?", v)
    if not m:
        raise ValueError(f"{path}: field '{key}' must be a number, got {v!r}")
    return float(m.group(1)) * (_UNITS[m.group(2)] if m.group(2) else 1.0)


def load_deepflow_config(path: str | Path) -> tuple[UArchTech, UArchBudgets]:
    """Read a DeepFlow hardware config (YAML) into ``(UArchTech, UArchBudgets)``.

    Absolute budgets (2025 configs) are read as they are; fractional ones (2020/2023 configs:
    every breakdown value ≤ 1) are multiplied by the chip area / TDP. Capacities such as
    ``4 GB`` / ``32 KB`` are binary units, as in DeepFlow.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: file not found")
    y = _parse_yaml(path)
    try:
        tp = y["tech_param"]
        core, dram = tp["core"], tp["DRAM"]
        ab, pb, perim = y["area_breakdown"], y["power_breakdown"], y["perimeter_breakdown"]
    except KeyError as e:
        raise ValueError(f"{path}: missing section {e}") from None

    def sram(name):
        s = tp[name]
        return SRAMTech(dynamic_energy_per_bit=_num(path, s, "dynamic_energy_per_bit"),
                        static_power_per_bit=_num(path, s, "static_power_per_bit"),
                        area_per_bit=_num(path, s, "area_per_bit"),
                        bank_bytes=_num(path, s, "bank_capacity"),
                        controller_area_per_link=_num(path, s, "controller_area_per_link", 0.0),
                        overhead=_num(path, s, "overhead", 0.0), util=_num(path, s, "util", 1.0))

    def link(name):
        s = tp["network"][name]
        return LinkTech(nominal_frequency=_num(path, s, "nominal_frequency"),
                        nominal_voltage=_num(path, s, "nominal_voltage"),
                        threshold_voltage=_num(path, s, "threshold_voltage"),
                        margin_voltage=_num(path, s, "margin_voltage"),
                        energy_per_bit=_num(path, s, "nominal_energy_per_link"),
                        area_per_link=_num(path, s, "nominal_area_per_link"),
                        links_per_mm=_num(path, s, "num_links_per_mm"),
                        util=_num(path, s, "util", 1.0), latency=_num(path, s, "latency", 0.0))

    tech = UArchTech(
        mcu_power=_num(path, core, "nominal_power_per_mcu"),
        mcu_flops_per_cycle=_num(path, core, "nominal_flop_rate_per_mcu"),
        mcu_area_nominal=_num(path, core, "nominal_area_per_mcu"),
        mcu_area=_num(path, core, "operating_area_per_mcu"),
        core_nominal_frequency=_num(path, core, "nominal_frequency"),
        core_nominal_voltage=_num(path, core, "nominal_voltage"),
        core_threshold_voltage=_num(path, core, "threshold_voltage"),
        core_margin_voltage=_num(path, core, "margin_voltage"),
        mcu_per_core=_num(path, core, "num_mcu_per_bundle"),
        fma_d1=_num(path, core, "FMA_d1", 4.0), fma_d2=_num(path, core, "FMA_d2", 4.0),
        core_util=_num(path, core, "util", 1.0),
        dram_energy_per_bit=_num(path, dram, "dynamic_energy_per_bit"),
        dram_static_power_per_bit=_num(path, dram, "static_power_per_bit"),
        dram_stack_bytes=_num(path, dram, "stack_capacity"),
        dram_stack_area=_num(path, dram, "area_per_stack"),
        dram_ctrl_area=_num(path, dram, "mem_ctrl_area"),
        dram_nominal_frequency=_num(path, dram, "nominal_frequency"),
        dram_nominal_voltage=_num(path, dram, "nominal_voltage"),
        dram_threshold_voltage=_num(path, dram, "threshold_voltage"),
        dram_margin_voltage=_num(path, dram, "margin_voltage"),
        dram_max_voltage=_num(path, dram, "max_voltage", 1e9),
        dram_links_per_mm=_num(path, dram, "num_links_per_mm"),
        dram_links_per_stack=_num(path, dram, "num_links_per_stack"),
        dram_util=_num(path, dram, "util", 1.0),
        l2=sram("SRAM-L2"), l1=sram("SRAM-L1"), rf=sram("SRAM-R"),
        intra=link("intra_node"), inter=link("inter_node"))

    chip = _num(path, ab, "proc_chip_area_budget")
    tdp = _num(path, pb, "TDP")
    keys_a = ("core", "L2", "L1", "reg_mem", "DRAM")
    keys_p = ("core", "DRAM", "L2", "L1", "reg_mem")
    fractional = all(_num(path, ab, k) <= 1.0 for k in keys_a) and \
        all(_num(path, pb, k) <= 1.0 for k in keys_p)
    fa = chip if fractional else 1.0
    fp = tdp if fractional else 1.0
    net_a = ab.get("network", {}) if isinstance(ab.get("network"), dict) else {}
    net_p = pb.get("network", {}) if isinstance(pb.get("network"), dict) else {}
    budgets = UArchBudgets(
        device_area=_num(path, ab, "device_area_budget"), chip_area=chip,
        core_area=_num(path, ab, "core") * fa, l2_area=_num(path, ab, "L2") * fa,
        l1_area=_num(path, ab, "L1") * fa, rf_area=_num(path, ab, "reg_mem") * fa,
        dram_ctrl_area=_num(path, ab, "DRAM") * fa,
        intra_area=_num(path, net_a, "intra_node", 0.0) * fa,
        inter_area=_num(path, net_a, "inter_node", 0.0) * fa,
        tdp=tdp, core_power=_num(path, pb, "core") * fp, dram_power=_num(path, pb, "DRAM") * fp,
        l2_power=_num(path, pb, "L2") * fp, l1_power=_num(path, pb, "L1") * fp,
        rf_power=_num(path, pb, "reg_mem") * fp,
        intra_power=_num(path, net_p, "intra_node", 0.0) * fp,
        inter_power=_num(path, net_p, "inter_node", 0.0) * fp,
        dram_perimeter=_num(path, perim, "DRAM", 0.0),
        intra_perimeter=_num(path, perim, "intra_node", 0.0),
        inter_perimeter=_num(path, perim, "inter_node", 0.0))
    return tech, budgets
