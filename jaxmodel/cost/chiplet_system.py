"""A CATCH chiplet system read from XML: the library, the loader and the pytree it fills.

Source: Graening, Pal & Gupta, "Chiplets: How Small is Too Small?" (DAC'23) and their CATCH
cost model (``design.py``, ``readDesignFromFile.py`` @ d60dafb): the XML library (IO types,
process layers, wafer processes, assembly processes, test processes), a system definition
(a ``<chip>`` tree: the root is the substrate or interposer, nested chips are stacked on
their parent) and a netlist (``<net>`` elements between blocks). Parsed in Python
(:func:`load_chiplet_system`; every error names the file and the element) into a
:class:`ChipletSystem`: per-chip and per-layer numeric arrays plus the static tree structure,
which :func:`jaxmodel.cost.chiplet.chiplet_system_cost` prices in JAX.

Units: mm², W, V, USD, s, counts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Mapping

import jax.numpy as jnp
import numpy as np

from jaxmodel.anchors import ANCHORS
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


def _read_chip(system_xml: Path, elem: ET.Element, lib: Mapping) -> dict:
    """One ``<chip>`` element's attributes and library references (a dict)."""
    d = {"name": elem.get("name"), "elem": elem}
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
    return d


def _read_chips(system_xml: Path, lib: Mapping) -> tuple[list, list]:
    """The chips of the ``<chip>`` tree in depth-first pre-order and their parent indices
    (-1 for the root)."""
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
        idx = len(chips)
        chips.append(_read_chip(system_xml, elem, lib))
        parent.append(par)
        for child in elem:
            if child.tag == "chip":
                visit(child, idx)

    visit(root, -1)
    return chips, parent


def _read_netlist(netlist_xml: Path, system_xml: Path, lib: Mapping, names: list):
    """``(counts, util, nb)``: per IO type, the instance counts and the utilisation-weighted
    counts between blocks ``[nb, nb]`` (chips first, index ``n`` = ``external``, then the
    blocks the netlist names outside the system)."""
    nroot = _parse_xml(netlist_xml)
    if nroot.tag != "netlist":
        raise ValueError(f"{netlist_xml}: root element must be <netlist>, got <{nroot.tag}>")
    n = len(names)
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
                              f"treated as a block outside the system", stacklevel=3)
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
    return counts, util, nb


def _io_and_pins(lib: Mapping, counts: dict, util: dict, parent: list, nb: int) -> dict:
    """Per chip: IO cell area (mm²) and power (W), signal pins leaving its stack and bond
    pins of its children's stacks (CATCH §2.5, quirk 2: a bidirectional net counts its
    instances both ways)."""
    n = len(parent)
    ext = n
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
    return {"io_area": io_area, "io_power": io_power, "signal_pins": signal_pins,
            "bond_pins": bond_pins}


def _test_pins(t: Mapping) -> float:
    """Test pins of a chip's test process: scan chains × IO per chain + offset, for the self
    and the assembly test it runs."""
    p = 0.0
    if t["test_self"]:
        p += t["self_num_scan_chains"] * t["self_num_io_per_scan_chain"] + \
            t["self_num_test_io_offset"]
    if t["test_assembly"]:
        p += t["assembly_num_scan_chains"] * t["assembly_num_io_per_scan_chain"] + \
            t["assembly_num_test_io_offset"]
    return p


def _opt(v, default=-1.0):
    """An optional attribute's value, ``default`` (the "absent" sentinel) when None."""
    return default if v is None else v


def _chip_columns(chips: list, io: dict) -> dict:
    """The per-chip leaves of :class:`ChipletSystem` (lists or arrays, one entry per chip)."""
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
        "bb_area": [_opt(c["bb_area"]) for c in chips],
        "bb_cost": [_opt(c["bb_cost"]) for c in chips],
        "bb_quality": [_opt(c["bb_quality"]) for c in chips],
        **io,
        "test_pins": [_test_pins(c["test"]) for c in chips],
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
        col[f"test_bb_{side}_pattern_count"] = [_opt(c["test"][f"bb_{side}_pattern_count"])
                                               for c in chips]
        col[f"test_bb_{side}_scan_chain_length"] = [
            _opt(c["test"][f"bb_{side}_scan_chain_length"]) for c in chips]
    return col


def _layer_columns(chips: list) -> tuple[dict, list]:
    """The per-layer leaves ``[n_chips, n_layers]`` (stackups padded with ``count = 0``) and
    each chip's stackup layer names (padded with "")."""
    n = len(chips)
    n_layers = max(len(c["stackup"]) for c in chips)
    lay = {k: np.zeros((n, n_layers)) for k in ("count", *_LAYER_KEYS, "active")}
    lay["clustering_factor"][:] = 1.0
    lay_names = []
    for i, c in enumerate(chips):
        for j, (cnt, ld) in enumerate(c["stackup"]):
            lay["count"][i, j] = cnt
            for k in _LAYER_KEYS:
                lay[k][i, j] = ld[k]
            lay["active"][i, j] = float(ld["active"])
        lay_names.append(tuple(c["stackup_names"]) + ("",) * (n_layers - len(c["stackup"])))
    return lay, lay_names


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
    chips, parent = _read_chips(system_xml, lib)
    names = [c["name"] for c in chips]
    counts, util, nb = _read_netlist(netlist_xml, system_xml, lib, names)
    col = _chip_columns(chips, _io_and_pins(lib, counts, util, parent, nb))
    lay, lay_names = _layer_columns(chips)
    to_arr = lambda v: np.asarray(v, dtype=np.float64)  # noqa: E731
    return ChipletSystem(chip={k: to_arr(v) for k, v in col.items()},
                         layer={k: to_arr(v) for k, v in lay.items()},
                         names=tuple(names), parent=tuple(parent),
                         layer_names=tuple(lay_names))
