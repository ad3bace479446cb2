"""Device and system cost: die (area → wafer share → yield), memory, package, network gear.

Sources:
    * Die cost = wafer cost / (dies per wafer · yield): ttm-cas ``supply_chain_model.py`` (the
      LLMCompass cost submodule, notes ``cost_and_uarch.md`` §6.2): wafer price and defect
      density per node, ``DPW = π(D/2)²/A − πD/√(2A)``, ``Y = (1 + A·D/α)^−α`` with α = 3.
      LLMCompass Table IV prices the die as wafer/DPW only (no yield): ``include_yield=False``
      reproduces it ($150 for the 826.6 mm² GA100 model vs $151 in the table).
    * Memory = capacity × $/GB by protocol (LLMCompass ``cost_model.py``: HBM2e $7, DDR5 $0.30).
    * Package + assembly = $20 + $1 (ttm-cas).
    * System = devices + hosts + network gear per level (NICs, switches, cables; prices in
      ``hw_db/tech/datacenter.toml``). Level 0 is the scale-up fabric (NVLink/NVSwitch board
      share per device); outer levels use NICs sized to ``bw_per_device`` and a leaf-spine fat
      tree of fixed-radix switches when the topology is ``switch``, direct cables otherwise.

All prices in USD, areas in mm², capacities in bytes; memory prices are per DRAM gigabyte,
which is binary (JEDEC JESD100B.01: a "GB" of DRAM is 2**30 bytes; an "80 GB" HBM part holds
80·2**30 bytes).

Example:
    >>> c = jm.device_cost(hw_db.device("a100_80gb"))
    >>> float(c.total_usd), float(c.die_usd), float(c.memory_usd)
    (1e+03, 4.23e+02, 560.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.cost import tech
from jaxmodel.cost.area import _die_area_single, _field, area_fields
from jaxmodel.cost.wafer import negative_binomial_yield
from jaxmodel.numerics import ceil_div
from jaxmodel.types import Device, System, _register


@dataclasses.dataclass(frozen=True)
class DeviceCost:
    """Per-device manufacturing cost (USD) and its parts.

    Attributes:
        total_usd: die + memory + package.
        die_usd: wafer share of one good die (yield included unless ``include_yield=False``).
        memory_usd: main memory (capacity × $/GB of the protocol).
        package_usd: package + assembly.
        die_area_mm2: die area from :func:`jaxmodel.die_area`.
        dies_per_wafer: ttm-cas closed form (continuous).
        die_yield: negative-binomial yield (1 when ``include_yield=False``).
    """

    total_usd: Any
    die_usd: Any
    memory_usd: Any
    package_usd: Any
    die_area_mm2: Any
    dies_per_wafer: Any
    die_yield: Any


_register(DeviceCost)


def dies_per_wafer_ttm(area_mm2, diameter_mm=300.0):
    """ttm-cas closed form ``π(D/2)²/A − πD/√(2A)`` (no edge exclusion, no scribe), dies."""
    a = jnp.maximum(area_mm2, 1e-6)
    return jnp.pi * (diameter_mm / 2.0) ** 2 / a - jnp.pi * diameter_mm / jnp.sqrt(2.0 * a)


def _die_cost_single(area_mm2, node_nm, include_yield: bool = True,
                     defect_density=None):
    """Die cost for a die of ``area_mm2`` at ``node_nm``: wafer/(DPW·Y), USD (ttm-cas)."""
    wafer_usd = tech.node_value("wafer_cost_usd", node_nm)
    d = tech.node_value("defect_density_per_mm2", node_nm) if defect_density is None \
        else defect_density
    alpha = tech.constant("process_nodes", "constants.yield_clustering_alpha")
    diameter = tech.constant("process_nodes", "constants.wafer_diameter_mm")
    # double-where: an infinite (invalid) or non-positive area gives +inf cost and the
    # formulas only see a harmless area, so gradients stay finite
    area_ok = jnp.isfinite(area_mm2) & (area_mm2 > 0)
    area = jnp.where(area_ok, area_mm2, 1.0)
    dpw = jnp.where(area_ok, dies_per_wafer_ttm(area, diameter), 0.0)
    y = negative_binomial_yield(area, d, alpha) if include_yield else jnp.ones_like(dpw)
    y = jnp.where(area_ok, y, 0.0)
    ok = (dpw > 0) & (y > 0)
    cost = jnp.where(ok, wafer_usd / jnp.where(ok, dpw * y, 1.0), jnp.inf)
    return cost, dpw, y


def _device_cost_single(dev: Device, include_yield: bool = True) -> DeviceCost:
    area = _die_area_single(dev)["total"]
    die, dpw, y = _die_cost_single(area, dev.process_node_nm, include_yield)
    mem = tech.table("memory")
    code = jnp.clip(jnp.round(_field(dev, "mem_protocol")), 0, 3).astype(int)
    is_hbm = jnp.asarray(mem["protocol_price"]["code_is_hbm"], dtype=float)[code]
    price = jnp.where(is_hbm > 0, mem["usd_per_gb"]["hbm2e"], mem["usd_per_gb"]["ddr5"])
    memory = dev.mem_capacity / 2.0 ** 30 * price
    pk = tech.table("packaging")["package"]
    package = jnp.asarray(pk["package_usd"] + pk["assembly_usd"]) * jnp.ones_like(memory)
    return DeviceCost(total_usd=die + memory + package, die_usd=die, memory_usd=memory,
                      package_usd=package, die_area_mm2=area, dies_per_wafer=dpw, die_yield=y)


_device_cost_batched = batched(_device_cost_single)


def device_cost(dev: Device, include_yield: bool = True) -> DeviceCost:
    """Manufacturing cost of one device (die + memory + package), USD.

    Args:
        dev: a :class:`jaxmodel.Device` (leaves may be batched; differentiable).
        include_yield: divide the wafer share by the defect yield (default). ``False`` gives
            LLMCompass Table IV's wafer/DPW die cost.

    Returns:
        :class:`DeviceCost`.
    """
    return _device_cost_batched(area_fields(dev), include_yield=include_yield)


device_cost.single = _device_cost_single


@batched
def _die_cost_batched(area_mm2, node_nm, include_yield: bool = True):
    cost, _, _ = _die_cost_single(area_mm2, node_nm, include_yield)
    return cost


def die_cost(dev_or_area, node_nm=None, include_yield: bool = True):
    """Cost of one good die, USD: ``jm.die_cost(dev)`` or ``jm.die_cost(area_mm2, node_nm)``."""
    if isinstance(dev_or_area, Device):
        return device_cost(dev_or_area, include_yield).die_usd
    if node_nm is None:
        raise ValueError("die_cost(area_mm2, node_nm): node_nm is required with an area")
    return _die_cost_batched(dev_or_area, node_nm, include_yield=include_yield)


# --------------------------------------------------------------------------------------------
# System
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SystemCost:
    """Capital cost of a system, USD.

    Attributes:
        total_usd: devices + hosts + network.
        devices_usd: all accelerators (:func:`device_cost` × count).
        hosts_usd: servers hosting the devices.
        network_usd: network gear summed over levels.
        network_by_level: tuple, USD per network level (innermost first).
        n_devices: devices in the system.
    """

    total_usd: Any
    devices_usd: Any
    hosts_usd: Any
    network_usd: Any
    network_by_level: tuple
    n_devices: Any


_register(SystemCost)


def _fat_tree_switches(ports, radix):
    """Switches of a non-blocking fat tree for ``ports`` endpoints (1 switch, 2-tier
    leaf-spine up to radix²/2 endpoints, else 3 tiers); continuous in ``ports``.

    Source: Al-Fares et al., SIGCOMM 2008 (k-ary fat tree): a 2-tier leaf-spine of radix k
    serves k²/2 hosts with 3k/2 switches; a 3-tier tree serves k³/4 hosts with 5k²/4 switches.
    """
    one = ports <= radix
    two = ports <= radix * radix / 2.0
    return jnp.where(one, ceil_div(ports, radix),
                     jnp.where(two, 3.0 * ports / radix, 5.0 * ports / radix))


def _system_cost_single(system: System, include_yield: bool = True) -> SystemCost:
    dc = tech.table("datacenter")
    net, host = dc["network"], dc["host"]
    dev_cost = _device_cost_single(system.device, include_yield).total_usd
    # double-where: an unpriceable device (+inf) makes the devices' share +inf without an
    # infinite factor in any product, so gradients (e.g. d/d level size) stay finite
    dev_ok = jnp.isfinite(dev_cost)
    n = system.n_devices
    devices = jnp.where(dev_ok, n * jnp.where(dev_ok, dev_cost, 0.0), jnp.inf)
    hosts = ceil_div(n, host["devices_per_node"]) * host["node_usd"]
    per_level = []
    group = 1.0
    for i, lvl in enumerate(system.levels):
        group = group * lvl.size
        if i == 0:
            # scale-up fabric inside a node (NVLink / NVSwitch board share)
            cost = n * net["scaleup_usd_per_device"] * jnp.ones_like(lvl.size)
        else:
            nics = n * ceil_div(lvl.bw_per_device, net["nic_bytes_per_s"])
            is_switch = jnp.round(lvl.topology) == 1.0
            switches = jnp.where(is_switch, _fat_tree_switches(nics, net["switch_radix"]), 0.0)
            two_plus = nics > net["switch_radix"]
            cables = jnp.where(is_switch & two_plus, 2.0 * nics, nics)
            cost = nics * net["nic_usd"] + switches * net["switch_usd"] + cables * net["cable_usd"]
        per_level.append(cost)
    network = sum(per_level) if per_level else jnp.zeros_like(devices)
    return SystemCost(total_usd=devices + hosts + network, devices_usd=devices, hosts_usd=hosts,
                      network_usd=network, network_by_level=tuple(per_level),
                      n_devices=n * jnp.ones_like(devices))


_system_cost_batched = batched(_system_cost_single)


def system_cost(system: System, include_yield: bool = True) -> SystemCost:
    """Capital cost of a system: devices, hosts and network gear per level, USD.

    Args:
        system: a :class:`jaxmodel.System` (leaves may be batched).
        include_yield: see :func:`device_cost`.

    Example:
        >>> jm.system_cost(hw_db.system("dgx_a100", nodes=128)).total_usd
        Array(1.12e+07, dtype=...)
    """
    sys_ = dataclasses.replace(system, device=area_fields(system.device))
    return _system_cost_batched(sys_, include_yield=include_yield)


system_cost.single = _system_cost_single
