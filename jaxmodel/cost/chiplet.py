"""Chiplet system cost after Graening, Pal & Gupta (DAC'23) / CATCH, in JAX.

The XML library (IO types, process layers, wafer processes, assembly processes, test processes)
and the system + netlist XML files are parsed in Python (:func:`load_chiplet_system`,
:mod:`jaxmodel.cost.chiplet_system`) into a :class:`ChipletSystem`: a pytree of per-chip and per-layer numeric arrays plus the static tree
structure. :func:`chiplet_system_cost` then prices it in JAX, so a batch of variants (die areas,
defect densities, quantities, wafer prices, ...) is one jitted ``vmap`` call and ``jax.grad``
works on every continuous input.

Formulas (CATCH ``design.py`` @ d60dafb):

* IO cell area (§2.5): Σ_types tx_area·(instances out) + rx_area·(instances in); a bidirectional
  net counts its instances in both directions (each end pays tx + rx, CATCH quirk 2).
* Pads (§2.5): power pads ``2·⌈P_stack / (J_max·π(p/4)²·V)⌉`` + signal pins leaving the chip's
  stack (wire_count, halved for bidirectional IO) + test pins; pad area = a square grid of pads at
  pitch ``p = max(own, parent[, parent TSV])``. The reach-band ring placement of CATCH is not
  modelled (it only matters for pad-limited dies wider than twice the IO reach).
* TSVs: all pads of a face-up die, else the pads of its back-stacked children.
* Area: ``max(core + IO + TSV, pad area, stacked-children footprint)``; the footprint grows each
  non-buried child by the parent's die separation and the sum by the parent's edge exclusion.
* Layer cost (§2.1–2.2): ``wafer_cost/DPW · ((1−p_litho) + p_litho/u_reticle)`` per stackup layer.
* Yield (§2.3): negative binomial on ``critical_ratio·(core + IO)``; passive interposers yield 1.
* Test (§2.4): ``Y_test = 1 − (1 − Y)·coverage``, quality ``Y/Y_test``; scan-test cost
  ``area·t_cycle·$/s·(patterns + samples)·chain_length``.
* Assembly (§2.6): machine time ``$/s·t·⌈n/group⌉`` (pick-and-place + bonding) + materials·footprint;
  yield ``align^n · bond^pins · tsv^TSVs / (1 + D_dielectric·footprint)``; an assembled stack's
  yield multiplies its own quality, its children's self quality and the assembly yield.
* Roll-up (§2.7): ``cost = (self + Σ children + assembly + assembly test)/Y_assembly_test``;
  NRE ``= [core·Σ frac·(FE + BE $/mm²) + reticle_share·Σ masks]/quantity`` summed over the tree.

Example:
    (skipped as a doctest: the CATCH library lives in the repository's ``validation/anchors``)

    >>> lib = "validation/anchors/chiplet_cost_library"
    >>> sip, netlist = f"{lib}/examples/sip.xml", f"{lib}/examples/netlist.xml"
    >>> r = chiplet_cost(sip, netlist, lib)      # doctest: +SKIP
    >>> float(r.total_usd)                       # doctest: +SKIP
    66.2
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel.batching import map_points
from jaxmodel.cost import wafer
from jaxmodel.cost.chiplet_system import (ChipletSystem, load_chiplet_system,  # noqa: F401
                                          load_library)
from jaxmodel.numerics import safe_div
from jaxmodel.types import _register


@dataclasses.dataclass(frozen=True)
class ChipletCost:
    """Result of :func:`chiplet_system_cost` (arrays carry the batch shape in front).

    Attributes:
        total_usd: cost per unit including amortised NRE, USD.
        cost_usd: recurring cost per unit (without NRE), USD.
        nre_usd: NRE per unit, USD.
        feasible: False where a die does not fit on the wafer (then costs are +inf).
        breakdown: dict field → per-chip array ``[..., n_chips]`` (``area``, ``io_area``,
            ``pad_area``, ``dies_per_wafer``, ``layer_cost``, ``self_yield``, ``test_yield``,
            ``chip_yield``, ``chip_test_yield``, ``self_cost``, ``assembly_cost``,
            ``assembly_yield``, ``cost``, ``nre``, ``total``).
        names: chip names, in the order of the last axis of ``breakdown``.
    """

    total_usd: Any
    cost_usd: Any
    nre_usd: Any
    feasible: Any
    breakdown: dict
    names: tuple = ()

    def table(self):
        """Per-chip breakdown of an unbatched result as a pandas DataFrame."""
        import pandas as pd
        return pd.DataFrame({k: np.asarray(v) for k, v in self.breakdown.items()},
                            index=list(self.names))


_register(ChipletCost, meta=("names",))


# --------------------------------------------------------------------------------------------
# The model (one configuration: chip leaves [n], layer leaves [n, L])
# --------------------------------------------------------------------------------------------
def _structure(parent: tuple):
    n = len(parent)
    children = np.zeros((n, n))
    subtree = np.zeros((n, n))
    depth = np.zeros(n, int)
    for i, p in enumerate(parent):
        if p >= 0:
            children[p, i] = 1.0
            depth[i] = depth[p] + 1
        j = i
        while j != -1:
            subtree[j, i] = 1.0
            j = parent[j]
    par = np.array([max(p, 0) for p in parent])
    has_parent = np.array([p >= 0 for p in parent], float)
    return children, subtree, par, has_parent, int(depth.max()) + 1


def _areas(c: dict, tree: dict) -> dict:
    """Pads, TSVs, die area and stacked footprint per chip (CATCH §2.5), mm² and counts.

    Power pads from the whole stack's power, signal pins, test pins; the pad field rounded up
    to a full grid of the die's aspect ratio; the area the largest of core + IO + TSVs, the
    pad field and the stacked children's footprint (one pass per tree level, children before
    parents)."""
    children, subtree, par, has_parent = (tree[k] for k in ("children", "subtree", "par",
                                                            "has_parent"))
    back = c["back"]
    notburied = 1.0 - c["buried"]
    child_face = children * ((1.0 - back) * notburied)[None, :]
    child_back = children * (back * notburied)[None, :]
    core = c["core_area"]
    aspect = jnp.maximum(c["aspect_ratio"], 1e-6)

    p_total = subtree @ (c["power"] + c["io_power"])
    own_pitch = c["asm_bonding_pitch"]
    pitch = jnp.maximum(own_pitch, jnp.where(has_parent > 0, own_pitch[par], 0.0))
    tsv_side = (has_parent > 0) & ((back > 0) | (c["face_up"] > 0))
    pitch = jnp.where(tsv_side, jnp.maximum(pitch, c["asm_tsv_pitch"][par]), pitch)
    pad_amps = c["asm_max_pad_current_density"] * jnp.pi * (pitch / 4.0) ** 2 * c["core_voltage"]
    power_pads = 2.0 * jnp.ceil(safe_div(p_total, pad_amps) - 1e-9)
    pads = power_pads + c["signal_pins"] + c["test_pins"]
    # CATCH rounds the pad field up to a full grid of the die's aspect ratio (square for r = 1).
    grid_y = jnp.ceil(jnp.sqrt(jnp.maximum(pads / aspect, 0.0)) - 1e-9)
    grid_x = jnp.ceil(grid_y * aspect - 1e-9)
    grid_x = jnp.where(grid_x * grid_y < pads, grid_x + 1.0, grid_x)
    pad_area = grid_x * grid_y * pitch ** 2
    tsv_count = jnp.where(c["face_up"] > 0, pads, child_back @ pads)
    base = core + c["io_area"] + tsv_count * c["asm_tsv_area"]

    has_bb_area = c["bb_area"] >= 0
    area = jnp.where(has_bb_area, c["bb_area"], jnp.maximum(base, pad_area))
    sep = c["asm_die_separation"][par] * has_parent
    edge = c["asm_edge_exclusion"]
    footprint = jnp.zeros_like(area)
    for _ in range(tree["depth"]):  # children before parents: one pass per tree level
        x = jnp.sqrt(area * aspect)
        y = jnp.sqrt(area / aspect)
        grown = (x + sep) * (y + sep)
        fp = jnp.maximum(child_face @ grown, child_back @ grown)
        has_kids = fp > 0
        footprint = jnp.where(has_kids, (jnp.sqrt(jnp.where(has_kids, fp, 1.0)) + 2 * edge) ** 2,
                              0.0)
        area = jnp.where(has_bb_area, c["bb_area"], jnp.maximum(jnp.maximum(base, pad_area),
                                                                footprint))
    return {"area": area, "pad_area": pad_area, "pads": pads, "tsv_count": tsv_count,
            "footprint": footprint, "power": p_total, "aspect": aspect}


def _layer_costs(c: dict, lay: dict, area, aspect, dpw_mode: str, k_max: int, rows: int):
    """``(dies_per_wafer, layer_cost_usd, self_yield)`` per chip: dies per wafer, the cost of
    the stackup's layers with the reticle (litho) penalty (§2.1–2.2) and the negative
    binomial defect yield on the critical area (§2.3)."""
    x = jnp.sqrt(area * aspect)
    y = jnp.sqrt(area / aspect)
    diam = c["wafer_wafer_diameter"]
    dpw_fn = lambda xx, yy, d, e, s: wafer.dies_per_wafer(xx, yy, d, e, s, dpw_mode,  # noqa
                                                          k_max, rows)
    dpw = jax.vmap(dpw_fn)(x, y, diam, c["wafer_edge_exclusion"], c["wafer_dicing_distance"])
    safe_dpw = jnp.where(dpw >= 1.0, dpw, 1.0)
    wafer_cost = wafer.wafer_cost_from_per_mm2(lay["cost_per_mm2"], diam[:, None])
    litho = jax.vmap(jax.vmap(wafer.litho_factor, in_axes=(None, None, None, 0)))(
        area, c["wafer_reticle_x"], c["wafer_reticle_y"], lay["litho_percent"])
    layer_cost = jnp.sum(lay["count"] * wafer_cost / safe_dpw[:, None] * litho, axis=1)
    crit = lay["critical_area_ratio"] * (c["core_area"] + c["io_area"])[:, None]
    y_layer = wafer.negative_binomial_yield(crit, lay["defect_density"], lay["clustering_factor"])
    self_yield = jnp.exp(jnp.sum(lay["count"] * jnp.log(jnp.maximum(y_layer, 1e-30)), axis=1))
    return dpw, layer_cost, self_yield


def _scan_test_cost(c: dict, lay: dict, area_tested, side: str, chains):
    """Scan-test cost of ``area_tested`` mm² in test ``side`` (``"self"`` or ``"assembly"``),
    USD (§2.4): ``area·t_cycle·$/s·(patterns + samples)·chain_length``; patterns
    ``2^(1.5·gate_flop_ratio)`` and the chain length from the gate density unless the test
    process gives them."""
    gates_per_mm2 = jnp.sum(lay["count"] * lay["active"] * lay["transistor_density"] * 1e6 / 4,
                            axis=1)
    gfr = jnp.maximum(c["gate_flop_ratio"], 1e-9)
    bb_pat = c[f"test_bb_{side}_pattern_count"]
    bb_len = c[f"test_bb_{side}_scan_chain_length"]
    patterns = jnp.where(bb_pat >= 0, bb_pat, 2.0 ** (1.5 * gfr))
    chain = jnp.where(bb_len >= 0, bb_len,
                      safe_div(gates_per_mm2 / gfr, jnp.maximum(chains, 1.0)))
    return (c[f"test_{side}"] * area_tested * c["test_time_per_test_cycle"]
            * c["test_cost_per_second"] * (patterns + c["test_samples_per_input"]) * chain)


def _assembly(c: dict, children, footprint, tsv_count, quality):
    """``(assembly_cost_usd, assembly_yield, kids_quality)`` per chip (§2.6): machine time
    ``$/s·t·⌈n/group⌉`` (pick-and-place + bonding) + materials·footprint; yield
    ``align^n · bond^pins · tsv^TSVs / (1 + D_dielectric·footprint)``; the product of the
    children's qualities."""
    n_kids = jnp.sum(children, axis=1)
    asm_cost = (c["asm_picknplace_cost_per_s"] * c["asm_picknplace_time"]
                * jnp.ceil(safe_div(n_kids, c["asm_picknplace_group"]) - 1e-9)
                + c["asm_bonding_cost_per_s"] * c["asm_bonding_time"]
                * jnp.ceil(safe_div(n_kids, c["asm_bonding_group"]) - 1e-9)
                + c["asm_materials_cost_per_mm2"] * footprint)
    asm_yield = (c["asm_alignment_yield"] ** n_kids * c["asm_bonding_yield"] ** c["bond_pins"]
                 * c["asm_tsv_yield"] ** tsv_count
                 / (1.0 + c["asm_dielectric_bond_defect_density"] * footprint))
    kids_quality = jnp.exp(children @ jnp.log(jnp.maximum(quality, 1e-30)))
    return asm_cost, asm_yield, kids_quality


def _nre_per_unit(c: dict, lay: dict):
    """Each chip's own NRE per unit, USD (§2.7): ``[core·Σ frac·(FE + BE $/mm²) +
    reticle_share·Σ masks]/quantity``."""
    core = c["core_area"]
    design = core * sum(c[f"fraction_{k}"] * (c[f"wafer_nre_front_end_cost_per_mm2_{k}"]
                                              + c[f"wafer_nre_back_end_cost_per_mm2_{k}"])
                        for k in ("memory", "logic", "analog"))
    masks = c["reticle_share"] * jnp.sum(lay["count"] * lay["nre_mask_cost"], axis=1)
    return safe_div(design + masks, c["quantity"])


def _chiplet_cost_single(system: ChipletSystem, dpw_mode: str, k_max: int, rows: int):
    """Price one configuration (leaves without batch axes). Formulas: module docstring."""
    c = system.chip
    lay = system.layer
    children, subtree, par, has_parent, depth = _structure(system.parent)
    children = jnp.asarray(children)
    subtree = jnp.asarray(subtree)
    tree = {"children": children, "subtree": subtree, "par": par,
            "has_parent": jnp.asarray(has_parent), "depth": depth}
    core = c["core_area"]
    geo = _areas(c, tree)
    area, footprint = geo["area"], geo["footprint"]
    dpw, layer_cost, self_yield = _layer_costs(c, lay, area, geo["aspect"], dpw_mode, k_max,
                                               rows)

    # Test (§2.4) of the bare die.
    test_yield = jnp.where(c["test_self"] > 0,
                           1.0 - (1.0 - self_yield) * c["test_self_defect_coverage"], 1.0)
    quality = safe_div(self_yield, test_yield, 1.0)
    quality = jnp.where(c["bb_quality"] >= 0, c["bb_quality"], quality)
    self_test_cost = _scan_test_cost(c, lay, core, "self", c["test_self_num_scan_chains"])
    self_cost = safe_div(layer_cost + self_test_cost, test_yield, jnp.inf)

    # Assembly (§2.6) and the assembled stack's test.
    asm_cost, asm_yield, kids_quality = _assembly(c, children, footprint, geo["tsv_count"],
                                                  quality)
    chip_yield = quality * kids_quality * asm_yield * c["wafer_wafer_process_yield"]
    chip_test_yield = jnp.where(c["test_assembly"] > 0,
                                1.0 - (1.0 - chip_yield) * c["test_assembly_defect_coverage"],
                                1.0)
    asm_test_cost = _scan_test_cost(c, lay, core + children @ core, "assembly",
                                    c["test_assembly_num_scan_chains"])

    # Roll-up (§2.7).
    own = self_cost + asm_cost + asm_test_cost
    has_bb_cost = c["bb_cost"] >= 0  # a black-box part (e.g. a bought HBM stack) costs bb_cost
    cost = jnp.where(has_bb_cost, c["bb_cost"], safe_div(own, chip_test_yield, jnp.inf))
    for _ in range(depth):
        cost = jnp.where(has_bb_cost, c["bb_cost"],
                         safe_div(own + children @ cost, chip_test_yield, jnp.inf))
    nre = subtree @ _nre_per_unit(c, lay)

    feasible = jnp.all((dpw >= 1.0) | (c["bb_area"] >= 0))
    total_chip = cost + nre
    root_cost = jnp.where(feasible, cost[0], jnp.inf)
    root_total = jnp.where(feasible, total_chip[0], jnp.inf)
    breakdown = {
        "area": area, "core_area": core, "io_area": c["io_area"], "pad_area": geo["pad_area"],
        "pads": geo["pads"], "tsv_count": geo["tsv_count"], "footprint": footprint,
        "dies_per_wafer": dpw, "layer_cost": layer_cost, "self_yield": self_yield,
        "test_yield": test_yield, "self_test_cost": self_test_cost, "self_cost": self_cost,
        "assembly_cost": asm_cost, "assembly_yield": asm_yield, "chip_yield": chip_yield,
        "chip_test_yield": chip_test_yield, "cost": cost, "nre": nre, "total": total_chip,
        "power": geo["power"],
    }
    return ChipletCost(total_usd=root_total, cost_usd=root_cost, nre_usd=nre[0],
                       feasible=feasible, breakdown=breakdown, names=system.names)


def _auto_rows(system: ChipletSystem, rows: int | None) -> int:
    """Outer rows the exact grid DPW needs for the smallest die of a concrete system."""
    if rows is not None:
        return int(rows)
    try:
        c = {k: np.asarray(v) for k, v in system.chip.items()}
    except (TypeError, jax.errors.TracerArrayConversionError):
        return wafer.DEFAULT_ROWS
    sizes = c["core_area"] + c["io_area"]
    sizes = np.where(c["bb_area"] >= 0, c["bb_area"], sizes)
    sizes = sizes[sizes > 0]
    if sizes.size == 0:
        return 8
    radius = float(np.max(c["wafer_wafer_diameter"])) / 2.0
    side = math.sqrt(float(np.min(sizes))) + float(np.min(c["wafer_dicing_distance"]))
    need = math.ceil(radius / side) + 1
    return int(min(max(8 * math.ceil(need / 8), 8), 1024))  # multiples of 8: few compiles


@functools.partial(jax.jit, static_argnames=("dpw_mode", "k_max", "rows", "chunk"))
def _run(system: ChipletSystem, *, dpw_mode, k_max, rows, chunk):
    chip_batch = [jnp.shape(v)[:-1] for v in system.chip.values()]
    layer_batch = [jnp.shape(v)[:-2] for v in system.layer.values()]
    shape = jnp.broadcast_shapes(*chip_batch, *layer_batch)
    n, nl = len(system.names), jnp.shape(next(iter(system.layer.values())))[-1]
    size = math.prod(shape)
    fn = functools.partial(_chiplet_cost_single, dpw_mode=dpw_mode, k_max=k_max, rows=rows)
    if shape == ():
        return fn(system)
    flat = dataclasses.replace(
        system,
        chip={k: jnp.broadcast_to(v, shape + (n,)).reshape(size, n)
              for k, v in system.chip.items()},
        layer={k: jnp.broadcast_to(v, shape + (n, nl)).reshape(size, n, nl)
               for k, v in system.layer.items()})
    out = map_points(fn, flat, chunk=chunk)
    return jax.tree_util.tree_map(lambda y: y.reshape(shape + y.shape[1:]), out)


def chiplet_system_cost(system: ChipletSystem, *, dpw: str = "exact", k_max: int = wafer.DEFAULT_K,
                        rows: int | None = None, chunk: int = 4096) -> ChipletCost:
    """Price a :class:`ChipletSystem` (batched over leading axes of its leaves).

    Args:
        system: from :func:`load_chiplet_system`; leaves may carry leading batch axes
            (see :meth:`ChipletSystem.with_chip_values`, :meth:`~ChipletSystem.with_layer_values`).
        dpw: ``"exact"`` (CATCH grid count; straight-through gradient of the closed form) or
            ``"smooth"`` (closed form value and gradient).
        k_max, rows: static sizes of the exact grid search (see
            :func:`jaxmodel.cost.wafer.dies_per_wafer_grid`); ``rows=None`` sizes it for the
            smallest die of a concrete system.
        chunk: batch size of ``lax.map`` chunks for big batches.

    Returns:
        :class:`ChipletCost`, USD per unit.
    """
    as_float = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.result_type(float)),
                                      system)
    return _run(as_float, dpw_mode=dpw, k_max=int(k_max), rows=_auto_rows(system, rows),
                chunk=int(chunk))


def chiplet_cost(system_xml: str | Path, netlist_xml: str | Path,
                 library_dir: str | Path | None = None, *, dpw: str = "exact") -> ChipletCost:
    """Total cost per unit of a CATCH system definition (XML in, USD out).

    Parses the XML files (:func:`load_chiplet_system`) and prices them
    (:func:`chiplet_system_cost`). ``.total_usd`` includes NRE per unit, ``.breakdown`` holds
    per-chip areas, yields and costs.

    Example:
        (skipped as a doctest: the XML files are not shipped with the package)

        >>> r = jm.chiplet_cost("sip.xml", "netlist.xml", "chiplet_cost_library")  # doctest: +SKIP
        >>> r.table()                   # doctest: +SKIP
    """
    return chiplet_system_cost(load_chiplet_system(system_xml, netlist_xml, library_dir), dpw=dpw)
