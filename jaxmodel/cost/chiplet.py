"""Chiplet system cost after Graening, Pal & Gupta (DAC'23) / CATCH, in JAX.

The XML library (IO types, process layers, wafer processes, assembly processes, test processes)
and the system + netlist XML files are parsed in Python (:func:`load_chiplet_system`) into a
:class:`ChipletSystem`: a pytree of per-chip and per-layer numeric arrays plus the static tree
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
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel.anchors import ANCHORS
from jaxmodel.batching import map_points
from jaxmodel.cost import wafer
from jaxmodel.numerics import safe_div
from jaxmodel.types import _register

SECONDS_PER_YEAR = 365.0 * 24.0 * 3600.0
LIBRARY_FILES = {
    "io": ("io_definitions.xml", "io", "type"),
    "layer": ("layer_definitions.xml", "layer", "name"),
    "wafer_process": ("wafer_process_definitions.xml", "wafer_process", "name"),
    "assembly": ("assembly_process_definitions.xml", "assembly", "name"),
    "test": ("test_definitions.xml", "test_process", "name"),
}
_DEFAULT_LIBRARY = ANCHORS / "chiplet_cost_library"

# Numeric attributes read from each library element (all required by CATCH's readers).
_IO_KEYS = ("tx_area", "rx_area", "bandwidth", "wire_count", "energy_per_bit", "reach")
_LAYER_KEYS = ("cost_per_mm2", "defect_density", "critical_area_ratio", "clustering_factor",
               "transistor_density", "litho_percent", "nre_mask_cost", "stitching_yield")
_WAFER_KEYS = ("wafer_diameter", "edge_exclusion", "wafer_process_yield", "dicing_distance",
               "reticle_x", "reticle_y", "nre_front_end_cost_per_mm2_memory",
               "nre_back_end_cost_per_mm2_memory", "nre_front_end_cost_per_mm2_logic",
               "nre_back_end_cost_per_mm2_logic", "nre_front_end_cost_per_mm2_analog",
               "nre_back_end_cost_per_mm2_analog")
_ASM_KEYS = ("materials_cost_per_mm2", "picknplace_machine_cost", "picknplace_machine_lifetime",
             "picknplace_machine_uptime", "picknplace_technician_yearly_cost", "picknplace_time",
             "picknplace_group", "bonding_machine_cost", "bonding_machine_lifetime",
             "bonding_machine_uptime", "bonding_technician_yearly_cost", "bonding_time",
             "bonding_group", "die_separation", "edge_exclusion", "max_pad_current_density",
             "bonding_pitch", "alignment_yield", "bonding_yield", "dielectric_bond_defect_density",
             "tsv_area", "tsv_yield", "tsv_pitch")
_TEST_KEYS = ("time_per_test_cycle", "samples_per_input", "cost_per_second",
              "self_defect_coverage", "self_num_scan_chains", "self_num_io_per_scan_chain",
              "self_num_test_io_offset", "assembly_defect_coverage", "assembly_num_scan_chains",
              "assembly_num_io_per_scan_chain", "assembly_num_test_io_offset")
_CHIP_KEYS = ("core_area", "fraction_memory", "fraction_logic", "fraction_analog",
              "reticle_share", "core_voltage", "power", "quantity")


# --------------------------------------------------------------------------------------------
# XML parsing (concrete Python; every error names the file and the element)
# --------------------------------------------------------------------------------------------
def _parse_xml(path: Path) -> ET.Element:
    if not Path(path).exists():
        raise ValueError(f"{path}: file not found")
    try:
        return ET.parse(path).getroot()
    except ET.ParseError as e:
        raise ValueError(f"{path}: malformed XML: {e}") from None


def _describe(elem: ET.Element) -> str:
    key = elem.get("name") or elem.get("type")
    return f"<{elem.tag} {'name' if elem.get('name') else 'type'}={key!r}>" if key else \
        f"<{elem.tag}>"


def _attr_text(path, elem, key, default):
    """The attribute's text; ``None`` when it is absent or empty and ``default`` is given
    (else ``ValueError`` naming the file, element and attribute)."""
    raw = elem.get(key)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ValueError(f"{path}: element {_describe(elem)} is missing attribute '{key}'")
        return None
    return raw


def _attr_float(path, elem, key, default=None):
    raw = _attr_text(path, elem, key, default)
    if raw is None:
        return float(default)
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{path}: element {_describe(elem)} attribute '{key}' must be a "
                         f"number, got {raw!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{path}: element {_describe(elem)} attribute '{key}' must be finite, "
                         f"got {raw!r}")
    return v


def _attr_bool(path, elem, key, default=None):
    raw = _attr_text(path, elem, key, default)
    if raw is None:
        return bool(default)
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{path}: element {_describe(elem)} attribute '{key}' must be True/False, "
                     f"got {raw!r}")


def _attr_optional(path, elem, key):
    """A black-box / optional number: None when empty."""
    raw = elem.get(key)
    if raw is None or raw.strip() == "":
        return None
    return _attr_float(path, elem, key)


@functools.lru_cache(maxsize=8)
def load_library(library_dir: str | Path | None = None) -> dict:
    """Read the five CATCH library XMLs of ``library_dir`` into plain dicts (cached).

    Returns ``{"io"|"layer"|"wafer_process"|"assembly"|"test": {name: {attr: value}}}``.

    Raises:
        ValueError: missing file, malformed XML, a missing or non-numeric attribute (the message
            names the file, the element and the attribute).
    """
    lib = Path(library_dir) if library_dir is not None else _DEFAULT_LIBRARY
    out = {}
    for kind, (fname, tag, key) in LIBRARY_FILES.items():
        path = lib / fname
        root = _parse_xml(path)
        entries = {}
        for elem in root.iter(tag):
            name = elem.get(key)
            if not name:
                raise ValueError(f"{path}: a <{tag}> element has no '{key}' attribute")
            d = {"_file": str(path)}
            if kind == "io":
                d.update({k: _attr_float(path, elem, k) for k in _IO_KEYS})
                d["bidirectional"] = _attr_bool(path, elem, "bidirectional")
            elif kind == "layer":
                d.update({k: _attr_float(path, elem, k) for k in _LAYER_KEYS})
                d["active"] = _attr_bool(path, elem, "active")
            elif kind == "wafer_process":
                d.update({k: _attr_float(path, elem, k) for k in _WAFER_KEYS})
            elif kind == "assembly":
                d.update({k: _attr_float(path, elem, k) for k in _ASM_KEYS})
                d["bb_cost_per_second"] = _attr_optional(path, elem, "bb_cost_per_second")
            else:
                d.update({k: _attr_float(path, elem, k) for k in _TEST_KEYS})
                for side in ("self", "assembly"):
                    d[f"test_{side}"] = _attr_bool(path, elem, f"test_{side}")
                    d[f"bb_{side}_pattern_count"] = _attr_optional(
                        path, elem, f"bb_{side}_pattern_count")
                    d[f"bb_{side}_scan_chain_length"] = _attr_optional(
                        path, elem, f"bb_{side}_scan_chain_length")
            entries[name] = d
        if not entries:
            raise ValueError(f"{path}: no <{tag}> elements found")
        out[kind] = entries
    return out


def _lookup(table: Mapping, name: str, kind: str, path, elem, attr) -> dict:
    if name not in table:
        raise ValueError(f"{path}: element {_describe(elem)} attribute '{attr}' references "
                         f"unknown {kind} {name!r} (not in the library; known: "
                         f"{sorted(table)[:12]}{' ...' if len(table) > 12 else ''})")
    return table[name]


def _parse_stackup(path, elem, text: str, layers: Mapping) -> list:
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        if ":" not in item:
            raise ValueError(f"{path}: element {_describe(elem)} attribute 'stackup' entry "
                             f"{item!r} must be 'count:layer_name'")
        cnt, name = item.split(":", 1)
        try:
            n = float(cnt)
        except ValueError:
            raise ValueError(f"{path}: element {_describe(elem)} attribute 'stackup' count "
                             f"{cnt!r} is not a number") from None
        out.append((n, _lookup(layers, name.strip(), "layer", path, elem, "stackup")))
    if not out:
        raise ValueError(f"{path}: element {_describe(elem)} has an empty 'stackup'")
    return out


# --------------------------------------------------------------------------------------------
# The pytree
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ChipletSystem:
    """A chiplet system ready to price: numeric leaves + static tree structure.

    Attributes:
        chip: dict field → array ``[..., n_chips]`` (USD, mm², W, V, counts, yields; see
            :func:`load_chiplet_system` for the field list). Leading axes are batch axes.
        layer: dict field → array ``[..., n_chips, n_layers]`` (stackup layers, padded with
            ``count = 0``).
        names: chip names in depth-first pre-order (static).
        parent: parent index of each chip, -1 for the root (static).
        layer_names: stackup layer names per chip (static, for lookups).
    """

    chip: dict
    layer: dict
    names: tuple = ()
    parent: tuple = ()
    layer_names: tuple = ()

    @property
    def n_chips(self) -> int:
        return len(self.names)

    def index(self, name: str) -> int:
        if name not in self.names:
            raise ValueError(f"unknown chip {name!r}; chips: {list(self.names)}")
        return self.names.index(name)

    def with_chip_values(self, name: str | None = None, **fields) -> "ChipletSystem":
        """Set per-chip fields of chip ``name`` (all chips when None); values may be batched.

        A batched value ``v`` of shape ``B`` turns the field into shape ``B + (n_chips,)``.
        """
        if name is None:
            def put(old, val):
                return jnp.broadcast_to(val[..., None], old.shape) * jnp.ones_like(old)
        else:
            def put(old, val):
                return old.at[..., self.index(name)].set(
                    jnp.broadcast_to(val, old.shape[:-1]))
        return dataclasses.replace(self, chip=_with_values(self.chip, fields, "chip", 1, put))

    def with_layer_values(self, layer_name: str, **fields) -> "ChipletSystem":
        """Set fields (e.g. ``defect_density``) of every stackup use of library layer
        ``layer_name``; values may be batched."""
        mask = np.array([[ln == layer_name for ln in row] for row in self.layer_names], bool)
        if not mask.any():
            raise ValueError(f"layer {layer_name!r} is not used by this system; used: "
                             f"{sorted({l for row in self.layer_names for l in row if l})}")

        def put(old, val):
            return jnp.where(jnp.asarray(mask), val[..., None, None], old)
        return dataclasses.replace(self, layer=_with_values(self.layer, fields, "layer", 2,
                                                            put))


def _with_values(table: dict, fields: dict, kind: str, axes: int, put) -> dict:
    """A copy of a per-chip or per-layer field table with ``fields`` set.

    Each new value ``v`` (shape ``B``, batched or scalar) and the old field (``axes``
    trailing per-chip / per-layer axes) are broadcast to ``B + old trailing shape``; then
    ``put(old_broadcast, v)`` returns the new field. Unknown keys raise ``ValueError``.
    """
    out = dict(table)
    for key, val in fields.items():
        if key not in out:
            raise ValueError(f"unknown {kind} field {key!r}; known: {sorted(out)}")
        val = jnp.asarray(val)
        old = jnp.asarray(out[key])
        shape = jnp.broadcast_shapes(old.shape[:-axes], val.shape)
        out[key] = put(jnp.broadcast_to(old, shape + old.shape[-axes:]), val)
    return out


_register(ChipletSystem, meta=("names", "parent", "layer_names"))


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
# Loader: XML -> ChipletSystem
# --------------------------------------------------------------------------------------------
def _machine_cost_per_s(asm: Mapping, kind: str) -> float:
    """CATCH machine $/s: (machine/lifetime + technician)/year·uptime (quirk 5: × uptime)."""
    if asm.get("bb_cost_per_second") is not None:
        return asm["bb_cost_per_second"]
    return ((asm[f"{kind}_machine_cost"] / asm[f"{kind}_machine_lifetime"]
             + asm[f"{kind}_technician_yearly_cost"]) / SECONDS_PER_YEAR
            * asm[f"{kind}_machine_uptime"])


def load_chiplet_system(system_xml: str | Path, netlist_xml: str | Path,
                        library_dir: str | Path | None = None) -> ChipletSystem:
    """Parse a CATCH system definition + netlist against a library into a :class:`ChipletSystem`.

    Args:
        system_xml: the ``<chip>`` tree (root = substrate/interposer; nested chips are stacked).
        netlist_xml: ``<netlist><net type block0 block1 bb_count bandwidth
            average_bandwidth_utilization/>``; ``external`` means off-package.
        library_dir: folder holding the five library XMLs (default: the shipped CATCH library
            in ``validation/anchors/chiplet_cost_library``).

    Raises:
        ValueError: malformed XML, missing attributes, unknown references (IO type, layer,
            process, block) — the message names the file and the element.
    """
    lib = load_library(str(library_dir) if library_dir is not None else None)
    system_xml, netlist_xml = Path(system_xml), Path(netlist_xml)
    root = _parse_xml(system_xml)
    if root.tag != "chip":
        raise ValueError(f"{system_xml}: root element must be <chip>, got <{root.tag}>")

    chips, parent = [], []

    def visit(elem, par):
        name = elem.get("name")
        if not name:
            raise ValueError(f"{system_xml}: a <chip> element has no 'name'")
        if any(c["name"] == name for c in chips):
            raise ValueError(f"{system_xml}: duplicate chip name {name!r}")
        d = {"name": name, "elem": elem}
        for k in _CHIP_KEYS:
            d[k] = _attr_float(system_xml, elem, k)
        d["aspect_ratio"] = _attr_float(system_xml, elem, "aspect_ratio", default=1.0)
        d["gate_flop_ratio"] = _attr_float(system_xml, elem, "gate_flop_ratio", default=1.0)
        for k in ("bb_area", "bb_cost", "bb_quality", "bb_power"):
            d[k] = _attr_optional(system_xml, elem, k)
        d["buried"] = _attr_bool(system_xml, elem, "buried", default=False)
        d["face_up"] = (elem.get("orientation") or "face-down").strip().lower() == "face-up"
        d["back"] = (elem.get("stack_side") or "face").strip().lower() == "back"
        d["asm"] = _lookup(lib["assembly"], elem.get("assembly_process", ""), "assembly process",
                           system_xml, elem, "assembly_process")
        d["test"] = _lookup(lib["test"], elem.get("test_process", ""), "test process",
                            system_xml, elem, "test_process")
        d["wafer"] = _lookup(lib["wafer_process"], elem.get("wafer_process", ""),
                             "wafer process", system_xml, elem, "wafer_process")
        d["stackup"] = _parse_stackup(system_xml, elem, elem.get("stackup", ""), lib["layer"])
        d["stackup_names"] = [s.split(":", 1)[1].strip() for s in elem.get("stackup").split(",")
                              if s.strip()]
        if d["quantity"] <= 0:
            raise ValueError(f"{system_xml}: element {_describe(elem)} attribute 'quantity' "
                             f"must be > 0, got {d['quantity']}")
        idx = len(chips)
        chips.append(d)
        parent.append(par)
        for child in elem:
            if child.tag == "chip":
                visit(child, idx)

    visit(root, -1)
    n = len(chips)
    names = [c["name"] for c in chips]

    # Netlist -> per-IO-type instance counts between blocks (index n = "external").
    nroot = _parse_xml(netlist_xml)
    if nroot.tag != "netlist":
        raise ValueError(f"{netlist_xml}: root element must be <netlist>, got <{nroot.tag}>")
    ext = n
    # Blocks named in the netlist but absent from the system sit outside every stack (CATCH
    # accepts them silently; the generated 2-chiplet grid netlist names a 'chiplet_2').
    others: list[str] = []
    for net in nroot.iter("net"):
        for key in ("block0", "block1"):
            b = (net.get(key) or "").strip()
            if not b:
                raise ValueError(f"{netlist_xml}: element {_describe(net)} is missing "
                                 f"attribute '{key}'")
            if b != "external" and b not in names and b not in others:
                warnings.warn(f"{netlist_xml}: element {_describe(net)} attribute '{key}' "
                              f"names block {b!r}, which is not a chip of {system_xml.name}; "
                              f"treated as a block outside the system", stacklevel=2)
                others.append(b)
    nb = n + 1 + len(others)
    counts: dict[str, np.ndarray] = {}
    util: dict[str, np.ndarray] = {}
    for net in nroot.iter("net"):
        io = _lookup(lib["io"], net.get("type", ""), "IO type", netlist_xml, net, "type")
        ends = []
        for key in ("block0", "block1"):
            b = (net.get(key) or "").strip()
            ends.append(ext if b == "external" else names.index(b) if b in names
                        else n + 1 + others.index(b))
        bb = _attr_optional(netlist_xml, net, "bb_count")
        if bb is None:
            bw = _attr_float(netlist_xml, net, "bandwidth")
            cnt = math.ceil(bw / io["bandwidth"] - 1e-12)
        else:
            cnt = bb
        u = _attr_float(netlist_xml, net, "average_bandwidth_utilization", default=0.0)
        t = net.get("type")
        counts.setdefault(t, np.zeros((nb, nb)))
        util.setdefault(t, np.zeros((nb, nb)))
        a, b = ends
        counts[t][a, b] += cnt
        util[t][a, b] += cnt * u
        if io["bidirectional"]:
            counts[t][b, a] += cnt
            util[t][b, a] += cnt * u

    io_area = np.zeros(n)
    io_power = np.zeros(n)
    pins = np.zeros((nb, nb))  # directed signal wires a -> b
    for t, m in counts.items():
        io = lib["io"][t]
        half = 0.5 if io["bidirectional"] else 1.0
        io_area += io["tx_area"] * m[:n].sum(1) + io["rx_area"] * m[:, :n].sum(0)
        uu = util[t]
        io_power += ((uu[:n].sum(1) + uu[:, :n].sum(0)) * half * io["bandwidth"]
                     * io["energy_per_bit"] * 1e-3)
        pins += m * io["wire_count"] * half
    sym = pins + pins.T

    subtree = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j != -1:
            subtree[j, i] = True
            j = parent[j]
    signal_pins = np.zeros(n)
    bond_pins = np.zeros(n)
    for c in range(n):
        inside = np.concatenate([subtree[c], np.zeros(nb - n, bool)])
        outside = ~inside
        signal_pins[c] = sym[np.ix_(inside, outside)].sum()
        outside_chips = outside.copy()
        outside_chips[ext] = False
        for k in range(n):
            if parent[k] == c:
                ins_k = np.concatenate([subtree[k], np.zeros(nb - n, bool)])
                bond_pins[c] += sym[np.ix_(ins_k, outside_chips)].sum()

    def test_pins(t):
        p = 0.0
        if t["test_self"]:
            p += t["self_num_scan_chains"] * t["self_num_io_per_scan_chain"] + \
                t["self_num_test_io_offset"]
        if t["test_assembly"]:
            p += t["assembly_num_scan_chains"] * t["assembly_num_io_per_scan_chain"] + \
                t["assembly_num_test_io_offset"]
        return p

    def opt(v, default=-1.0):
        return default if v is None else v

    col = {
        "core_area": [c["core_area"] for c in chips],
        "aspect_ratio": [c["aspect_ratio"] if c["aspect_ratio"] > 0 else 1.0 for c in chips],
        "power": [c["bb_power"] if c["bb_power"] is not None else c["power"] for c in chips],
        "core_voltage": [c["core_voltage"] for c in chips],
        "quantity": [c["quantity"] for c in chips],
        "reticle_share": [c["reticle_share"] for c in chips],
        "fraction_memory": [c["fraction_memory"] for c in chips],
        "fraction_logic": [c["fraction_logic"] for c in chips],
        "fraction_analog": [c["fraction_analog"] for c in chips],
        "gate_flop_ratio": [c["gate_flop_ratio"] for c in chips],
        "face_up": [float(c["face_up"]) for c in chips],
        "back": [float(c["back"]) for c in chips],
        "buried": [float(c["buried"]) for c in chips],
        "bb_area": [opt(c["bb_area"]) for c in chips],
        "bb_cost": [opt(c["bb_cost"]) for c in chips],
        "bb_quality": [opt(c["bb_quality"]) for c in chips],
        "io_area": io_area, "io_power": io_power, "signal_pins": signal_pins,
        "bond_pins": bond_pins,
        "test_pins": [test_pins(c["test"]) for c in chips],
    }
    for k in _WAFER_KEYS:
        col[f"wafer_{k}"] = [c["wafer"][k] for c in chips]
    for k in ("materials_cost_per_mm2", "picknplace_time", "picknplace_group", "bonding_time",
              "bonding_group", "die_separation", "edge_exclusion", "max_pad_current_density",
              "bonding_pitch", "alignment_yield", "bonding_yield",
              "dielectric_bond_defect_density", "tsv_area", "tsv_yield", "tsv_pitch"):
        col[f"asm_{k}"] = [c["asm"][k] for c in chips]
    col["asm_picknplace_cost_per_s"] = [_machine_cost_per_s(c["asm"], "picknplace") for c in chips]
    col["asm_bonding_cost_per_s"] = [_machine_cost_per_s(c["asm"], "bonding") for c in chips]
    for k in _TEST_KEYS:
        col[f"test_{k}"] = [c["test"][k] for c in chips]
    for side in ("self", "assembly"):
        col[f"test_{side}"] = [float(c["test"][f"test_{side}"]) for c in chips]
        col[f"test_bb_{side}_pattern_count"] = [opt(c["test"][f"bb_{side}_pattern_count"])
                                               for c in chips]
        col[f"test_bb_{side}_scan_chain_length"] = [
            opt(c["test"][f"bb_{side}_scan_chain_length"]) for c in chips]

    n_layers = max(len(c["stackup"]) for c in chips)
    lay = {k: np.zeros((n, n_layers)) for k in ("count", *_LAYER_KEYS, "active")}
    lay["clustering_factor"][:] = 1.0
    lay_names = []
    for i, c in enumerate(chips):
        row = []
        for j, (cnt, ld) in enumerate(c["stackup"]):
            lay["count"][i, j] = cnt
            for k in _LAYER_KEYS:
                lay[k][i, j] = ld[k]
            lay["active"][i, j] = float(ld["active"])
        row = tuple(c["stackup_names"]) + ("",) * (n_layers - len(c["stackup"]))
        lay_names.append(row)
    to_arr = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return ChipletSystem(chip={k: to_arr(v) for k, v in col.items()},
                         layer={k: to_arr(v) for k, v in lay.items()},
                         names=tuple(names), parent=tuple(parent),
                         layer_names=tuple(lay_names))


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


def _chiplet_cost_single(system: ChipletSystem, dpw_mode: str, k_max: int, rows: int):
    """Price one configuration (leaves without batch axes). Formulas: module docstring."""
    c = system.chip
    lay = system.layer
    children, subtree, par, has_parent, depth = _structure(system.parent)
    children = jnp.asarray(children)
    subtree = jnp.asarray(subtree)
    has_parent = jnp.asarray(has_parent)
    ones = jnp.ones_like(c["core_area"])
    back = c["back"]
    notburied = 1.0 - c["buried"]
    child_face = children * ((1.0 - back) * notburied)[None, :]
    child_back = children * (back * notburied)[None, :]

    core = c["core_area"]
    io = c["io_area"]
    aspect = jnp.maximum(c["aspect_ratio"], 1e-6)

    # Pads: power pads from the whole stack's power, signal pins, test pins (CATCH §2.5).
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
    base = core + io + tsv_count * c["asm_tsv_area"]

    has_bb_area = c["bb_area"] >= 0
    area = jnp.where(has_bb_area, c["bb_area"], jnp.maximum(base, pad_area))
    sep = c["asm_die_separation"][par] * has_parent
    edge = c["asm_edge_exclusion"]
    footprint = jnp.zeros_like(area)
    for _ in range(depth):  # children before parents: one pass per tree level
        x = jnp.sqrt(area * aspect)
        y = jnp.sqrt(area / aspect)
        grown = (x + sep) * (y + sep)
        fp = jnp.maximum(child_face @ grown, child_back @ grown)
        has_kids = fp > 0
        footprint = jnp.where(has_kids, (jnp.sqrt(jnp.where(has_kids, fp, 1.0)) + 2 * edge) ** 2,
                              0.0)
        area = jnp.where(has_bb_area, c["bb_area"], jnp.maximum(jnp.maximum(base, pad_area),
                                                                footprint))

    # Wafer: dies per wafer and layer cost with the reticle (litho) penalty (§2.1-2.2).
    x = jnp.sqrt(area * aspect)
    y = jnp.sqrt(area / aspect)
    diam = c["wafer_wafer_diameter"]
    dpw_fn = lambda xx, yy, d, e, s: wafer.dies_per_wafer(xx, yy, d, e, s, dpw_mode,  # noqa
                                                          k_max, rows)
    dpw = jax.vmap(dpw_fn)(x, y, diam, c["wafer_edge_exclusion"], c["wafer_dicing_distance"])
    feasible_die = dpw >= 1.0
    safe_dpw = jnp.where(feasible_die, dpw, 1.0)
    wafer_cost = wafer.wafer_cost_from_per_mm2(lay["cost_per_mm2"], diam[:, None])
    litho = jax.vmap(jax.vmap(wafer.litho_factor, in_axes=(None, None, None, 0)))(
        area, c["wafer_reticle_x"], c["wafer_reticle_y"], lay["litho_percent"])
    layer_cost = jnp.sum(lay["count"] * wafer_cost / safe_dpw[:, None] * litho, axis=1)

    # Defect yield on the critical area (§2.3).
    crit = lay["critical_area_ratio"] * (core + io)[:, None]
    y_layer = wafer.negative_binomial_yield(crit, lay["defect_density"], lay["clustering_factor"])
    self_yield = jnp.exp(jnp.sum(lay["count"] * jnp.log(jnp.maximum(y_layer, 1e-30)), axis=1))

    # Test (§2.4).
    gates_per_mm2 = jnp.sum(lay["count"] * lay["active"] * lay["transistor_density"] * 1e6 / 4,
                            axis=1)
    gfr = jnp.maximum(c["gate_flop_ratio"], 1e-9)

    def scan_cost(area_tested, side, chains):
        bb_pat = c[f"test_bb_{side}_pattern_count"]
        bb_len = c[f"test_bb_{side}_scan_chain_length"]
        patterns = jnp.where(bb_pat >= 0, bb_pat, 2.0 ** (1.5 * gfr))
        chain = jnp.where(bb_len >= 0, bb_len,
                          safe_div(gates_per_mm2 / gfr, jnp.maximum(chains, 1.0)))
        return (c[f"test_{side}"] * area_tested * c["test_time_per_test_cycle"]
                * c["test_cost_per_second"] * (patterns + c["test_samples_per_input"]) * chain)

    test_yield = jnp.where(c["test_self"] > 0,
                           1.0 - (1.0 - self_yield) * c["test_self_defect_coverage"], 1.0)
    quality = safe_div(self_yield, test_yield, 1.0)
    quality = jnp.where(c["bb_quality"] >= 0, c["bb_quality"], quality)
    self_test_cost = scan_cost(core, "self", c["test_self_num_scan_chains"])
    self_cost = safe_div(layer_cost + self_test_cost, test_yield, jnp.inf)

    # Assembly (§2.6).
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
    chip_yield = quality * kids_quality * asm_yield * c["wafer_wafer_process_yield"]
    chip_test_yield = jnp.where(c["test_assembly"] > 0,
                                1.0 - (1.0 - chip_yield) * c["test_assembly_defect_coverage"],
                                1.0)
    asm_test_cost = scan_cost(core + children @ core, "assembly",
                              c["test_assembly_num_scan_chains"])

    own = self_cost + asm_cost + asm_test_cost
    has_bb_cost = c["bb_cost"] >= 0  # a black-box part (e.g. a bought HBM stack) costs bb_cost
    cost = jnp.where(has_bb_cost, c["bb_cost"], safe_div(own, chip_test_yield, jnp.inf))
    for _ in range(depth):
        cost = jnp.where(has_bb_cost, c["bb_cost"],
                         safe_div(own + children @ cost, chip_test_yield, jnp.inf))

    # NRE amortised over the quantity (§2.7).
    design = core * (c["fraction_memory"] * (c["wafer_nre_front_end_cost_per_mm2_memory"]
                                             + c["wafer_nre_back_end_cost_per_mm2_memory"])
                     + c["fraction_logic"] * (c["wafer_nre_front_end_cost_per_mm2_logic"]
                                              + c["wafer_nre_back_end_cost_per_mm2_logic"])
                     + c["fraction_analog"] * (c["wafer_nre_front_end_cost_per_mm2_analog"]
                                               + c["wafer_nre_back_end_cost_per_mm2_analog"]))
    masks = c["reticle_share"] * jnp.sum(lay["count"] * lay["nre_mask_cost"], axis=1)
    nre_own = safe_div(design + masks, c["quantity"])
    nre = subtree @ nre_own

    feasible = jnp.all(feasible_die | has_bb_area)
    total_chip = cost + nre
    root_cost = jnp.where(feasible, cost[0], jnp.inf)
    root_total = jnp.where(feasible, total_chip[0], jnp.inf)
    breakdown = {
        "area": area, "core_area": core, "io_area": io, "pad_area": pad_area, "pads": pads,
        "tsv_count": tsv_count, "footprint": footprint, "dies_per_wafer": dpw,
        "layer_cost": layer_cost, "self_yield": self_yield, "test_yield": test_yield,
        "self_test_cost": self_test_cost, "self_cost": self_cost, "assembly_cost": asm_cost,
        "assembly_yield": asm_yield, "chip_yield": chip_yield,
        "chip_test_yield": chip_test_yield, "cost": cost, "nre": nre, "total": total_chip,
        "power": p_total,
    }
    del ones
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
