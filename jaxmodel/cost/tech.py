"""Technology tables from ``hw_db/tech`` (process nodes, area constants, prices).

Every TOML value is ``{value, source}``, read by :func:`jaxmodel.tech_tables.table` (a missing
source or a non-numeric value raises ``ValueError`` naming the file and key).
Per-node tables are interpolated log-log over the node size in JAX (:func:`node_value`), so
``process_node_nm`` is a continuous, differentiable knob.

Example:
    >>> density = node_value("logic_density_mtr_per_mm2", 7.0)     # 96.3 MTr/mm²
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmodel.tech_tables import table


@functools.lru_cache(maxsize=None)
def _node_points(field: str):
    t = table("process_nodes")
    if field not in t:
        raise ValueError(f"process_nodes.toml has no table [{field}]; known: {sorted(t)}")
    pts = sorted((float(k), float(v)) for k, v in t[field].items())
    nodes = np.log(np.array([p[0] for p in pts]))
    vals = np.log(np.array([p[1] for p in pts]))
    return nodes, vals


def node_value(field: str, node_nm):
    """Per-node value at ``node_nm``, log-log interpolated between listed nodes, clamped outside.

    Args:
        field: a table of ``process_nodes.toml`` (``logic_density_mtr_per_mm2``,
            ``wafer_cost_usd``, ``defect_density_per_mm2``, ``mask_set_usd``, ...).
        node_nm: node size in nm (scalar or array, differentiable).
    """
    nodes, vals = _node_points(field)
    x = jnp.log(jnp.maximum(node_nm, 1e-3))
    return jnp.exp(jnp.interp(x, jnp.asarray(nodes), jnp.asarray(vals)))


def sram_bitcell_um2(node_nm):
    """SRAM bit-cell area, µm². LLMCompass values at 7/6/5 nm; elsewhere the 7 nm cell scaled
    by ``ρ_7nm/ρ_node`` (our assumption, stated in hw_db/tech/process_nodes.toml)."""
    listed = node_value("sram_bitcell_um2", node_nm)
    nodes, _ = _node_points("sram_bitcell_um2")
    lo, hi = float(np.exp(nodes.min())), float(np.exp(nodes.max()))
    scaled = 0.170 * node_value("logic_density_mtr_per_mm2", 7.0) / node_value(
        "logic_density_mtr_per_mm2", node_nm)
    inside = (node_nm >= lo - 1e-9) & (node_nm <= hi + 1e-9)
    return jnp.where(inside, listed, scaled)


def constant(name: str, key: str):
    """A single value from ``[constants]``-like tables: ``constant("process_nodes",
    "constants.yield_clustering_alpha")``."""
    d: Any = table(name)
    for part in key.split("."):
        if part not in d:
            raise ValueError(f"hw_db/tech/{name}.toml has no field '{key}'")
        d = d[part]
    return d
