"""Die area from the hardware description: the LLMCompass area model, in JAX.

Source: LLMCompass §III-D, Table II, Fig. 6; ``cost_model/cost_model.py`` re-stated
in and ``llmcompass_internals.md`` §5. All constants
live in ``hw_db/tech/area_model.toml`` and ``process_nodes.toml`` with their sources.

Die = compute part + IO part (mm²):

* per lane (sublane): control ``vector_width · 996,200`` transistors, vector FPUs (INT32 177,690;
  FPn = FP64 · (mantissa_n/52)²), systolic array (one FPU of its data type per PE) — all divided
  by the node's logic density — plus the register file (LLMCompass/EMPIRE anchor 0.391 mm² for
  16384 × 32 b, 4 ports at 7 nm; linear in bits, Rixner port law, 1/density);
* per core: ``lanes ·`` lane + local buffer (SRAM); per core crossbar 44.3 M transistors;
* SRAM: ``bytes·8·bitcell/η`` with the CACTI efficiency η of the power-of-two unit size
  (4 KiB … 512 KiB units, larger buffers are made of 512 KiB units);
* IO: global buffer (SRAM), memory PHY (fixed mm² per channel) + controller (transistors,
  scaled), device-link PHY + controller.

Physical counts are used (``physical_core_count`` 128 for GA100 whose A100 product enables 108).
Area-only fields the device TOMLs lack are taken from ``hw_db/tech/device_area.toml`` by device
name (:func:`area_fields`).

Example:
    >>> a = jm.die_area(hw_db.device("a100_80gb"))
    >>> float(a["total"])            # ≈ 827 mm² (GA100: 822.7 mm² measured)
    8.27e+02
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.cost import tech
from jaxmodel.types import Device

# Area-only Device fields: -1 = unspecified (device_area.toml by name, then the generic value).
AREA_FIELDS = ("physical_global_buffer_bytes", "physical_local_buffer_bytes",
               "physical_mem_channels", "physical_device_links", "regfile_bytes_per_lane",
               "regfile_ports", "lane_int32_units", "lane_fp16_units", "lane_fp32_units",
               "lane_fp64_units", "sa_mantissa_bits", "mem_protocol", "link_protocol")
_PHYSICAL_OF = {"physical_global_buffer_bytes": "global_buffer_bytes",
                "physical_local_buffer_bytes": "local_buffer_bytes",
                "physical_mem_channels": "mem_channels",
                "physical_device_links": "device_links"}
CATEGORIES = ("cores", "interconnect", "global_buffer", "memory_phy", "memory_controller",
              "link_phy", "link_controller")


def area_fields(dev: Device) -> Device:
    """Fill the area-only fields left at -1 from ``hw_db/tech/device_area.toml``.

    Concrete values only (call at the API edge); a field holding -1 takes the value listed for
    ``dev.name``, else the ``[generic]`` value (GA100 template); ``physical_*`` fields fall back
    to their active counterparts inside :func:`die_area`.
    """
    t = tech.table("device_area")
    own = t.get(dev.name, {})
    gen = t["generic"]
    repl = {}
    for f in AREA_FIELDS:
        v = getattr(dev, f)
        if isinstance(v, (int, float)) or (hasattr(v, "shape") and not _is_tracer(v)):
            arr = np.asarray(v, dtype=float)
            fill = own.get(f, gen.get(f, None))
            if fill is not None and np.any(arr < 0):
                repl[f] = np.where(arr < 0, float(fill), arr) if arr.shape else (
                    float(fill) if arr < 0 else v)
    return dataclasses.replace(dev, **repl) if repl else dev


def _is_tracer(v) -> bool:
    import jax
    return isinstance(v, jax.core.Tracer)


def _field(dev: Device, name: str):
    """Area field with its fallback (physical_* → active value, others → generic template)."""
    v = getattr(dev, name)
    if name in _PHYSICAL_OF:
        fallback = getattr(dev, _PHYSICAL_OF[name])
    else:
        fallback = tech.table("device_area")["generic"][name]
    return jnp.where(v >= 0, v, fallback)


def sram_area(nbytes, bitcell_um2):
    """SRAM macro area, mm² (LLMCompass: CACTI efficiency per ≤ 512 KiB unit).

    Args:
        nbytes: capacity, bytes: ``⌊bytes/512 KiB⌋`` full units + one unit for the remainder
            (e.g. 768 KiB = 512 + 256 KiB); differentiable inside each piece.
        bitcell_um2: bit-cell area, µm².
    """
    s = tech.table("area_model")["sram"]
    eff = jnp.asarray(s["efficiency"])
    unit_max = s["max_unit_bytes"]
    unit_min = s["min_unit_bytes"]
    def unit_area(b):
        unit = jnp.clip(b, unit_min, unit_max)
        idx = jnp.clip(jnp.ceil(jnp.log2(unit / unit_min) - 1e-9), 0, eff.shape[0] - 1
                       ).astype(int)
        return unit * 8.0 * bitcell_um2 * 1e-6 / eff[idx]

    full = jnp.floor(nbytes / unit_max + 1e-9)       # whole 512 KiB units
    rest = nbytes - full * unit_max                  # one smaller unit for the remainder
    area = full * unit_area(jnp.asarray(unit_max, dtype=jnp.result_type(float))) + jnp.where(
        rest > 1e-6 * unit_max, unit_area(jnp.maximum(rest, 1.0)), 0.0)
    return jnp.where(nbytes > 0, area, 0.0)


def _fpu_transistors(mantissa_bits):
    t = tech.table("area_model")["transistors"]
    return t["fpu64"] * (mantissa_bits / t["fpu64_mantissa_bits"]) ** 2


def _die_area_single(dev: Device):
    t = tech.table("area_model")
    tr = t["transistors"]
    rf = t["register_file"]
    # Every count and size the area model multiplies must be finite and >= 0 (the node > 0);
    # otherwise the whole breakdown is +inf (double-where: the formulas below only ever see
    # sanitised values, so neither value nor gradient turns NaN).
    raw = {name: _field(dev, name) for name in AREA_FIELDS}
    raw.update(process_node_nm=dev.process_node_nm, sa_rows=dev.sa_rows, sa_cols=dev.sa_cols,
               vector_width=dev.vector_width, lanes_per_core=dev.lanes_per_core,
               cores=jnp.where(dev.physical_core_count > 0, dev.physical_core_count,
                               dev.core_count))
    ok = dev.process_node_nm > 0
    for v in raw.values():
        ok = ok & jnp.isfinite(v) & (v >= 0)
    f = {k: nx.sanitize(v, ok, 7.0 if k == "process_node_nm" else 1.0) for k, v in raw.items()}

    node = f["process_node_nm"]
    density = tech.node_value("logic_density_mtr_per_mm2", node) * 1e6  # transistors / mm²
    bitcell = tech.sram_bitcell_um2(node)

    vector_tr = (f["lane_int32_units"] * tr["int32_alu"]
                 + f["lane_fp16_units"] * _fpu_transistors(10.0)
                 + f["lane_fp32_units"] * _fpu_transistors(23.0)
                 + f["lane_fp64_units"] * tr["fpu64"])
    sa_tr = f["sa_rows"] * f["sa_cols"] * _fpu_transistors(f["sa_mantissa_bits"])
    control_tr = f["vector_width"] * tr["control_per_lane"]
    ports = f["regfile_ports"]
    w = rf["base_cell_tracks"]
    port_factor = ((w + ports) / (w + rf["anchor_ports"])) ** 2
    rf_area = (rf["anchor_area_mm2"] * f["regfile_bytes_per_lane"] * 8.0
               / rf["anchor_bits"] * port_factor * rf["anchor_density_mtr_per_mm2"] * 1e6
               / density)
    local = sram_area(f["physical_local_buffer_bytes"], bitcell)

    cores = f["cores"]
    lanes = f["lanes_per_core"]
    per_core = {
        "core_control": lanes * control_tr / density,
        "core_vector": lanes * vector_tr / density,
        "core_systolic": lanes * sa_tr / density,
        "core_regfile": lanes * rf_area,
        "core_local_buffer": local,
    }
    out = {k: cores * v for k, v in per_core.items()}
    out["cores"] = sum(out[k] for k in per_core)
    out["interconnect"] = cores * tr["crossbar_per_core"] / density

    mp = t["memory_protocol"]
    lp = t["link_protocol"]
    mcode = jnp.clip(jnp.round(f["mem_protocol"]), 0, len(mp["phy_mm2"]) - 1).astype(int)
    lcode = jnp.clip(jnp.round(f["link_protocol"]), 0, len(lp["phy_mm2"]) - 1).astype(int)
    channels = f["physical_mem_channels"]
    links = f["physical_device_links"]
    out["global_buffer"] = sram_area(f["physical_global_buffer_bytes"], bitcell)
    out["memory_phy"] = channels * jnp.asarray(mp["phy_mm2"])[mcode]
    out["memory_controller"] = channels * jnp.asarray(mp["controller_transistors"])[mcode] / density
    out["link_phy"] = links * jnp.asarray(lp["phy_mm2"])[lcode]
    out["link_controller"] = links * jnp.asarray(lp["controller_transistors"])[lcode] / density
    out["total"] = sum(out[k] for k in CATEGORIES)
    # absurd magnitudes may still overflow (inf, or 0·inf): the whole breakdown is then +inf
    _, ok, _ = nx.finalize(out["total"], ok)
    return {k: nx.where_feasible(ok, v) for k, v in out.items()}


_die_area_batched = batched(_die_area_single)


def die_area(dev: Device) -> dict:
    """Die area breakdown of a device, mm² (LLMCompass area model, LLMCompass §III-D).

    Args:
        dev: a :class:`jaxmodel.Device` (leaves may be batched). Area-only fields left at -1
            are filled from ``hw_db/tech/device_area.toml`` by ``dev.name``.

    Returns:
        dict with the ``die_area.csv`` categories ``cores, interconnect, global_buffer,
        memory_phy, memory_controller, link_phy, link_controller``, the per-core parts summed
        over all cores (``core_control, core_vector, core_systolic, core_regfile,
        core_local_buffer``) and ``total`` (mm²). Differentiable w.r.t. continuous fields
        (counts, buffer sizes, array sizes, ``process_node_nm``). Every entry is ``+inf``
        when a count or size is negative or not finite, the node is not positive, or the
        area overflows the float range (never NaN).

    Example:
        >>> jm.die_area(hw_db.device("mi210"))["total"]
        Array(7.03e+02, dtype=...)
    """
    return _die_area_batched(area_fields(dev))


die_area.single = _die_area_single
