"""Topologies of one network tier and the placement of a communication group on a system.

Guo et al. §III-D: ring, switch, fully connected, 2D mesh (and here 2D torus); "the total
off-GPU bandwidth is divided by the number of links" (§V-C), so a device's ``bw_per_device``
(bytes/s per direction) is shared by its links at that tier:

=================  =====================  ==========================================
topology           links per device       link bandwidth (per direction)
=================  =====================  ==========================================
ring               2                      B / 2
switch             1 (to the switch)      B
fully_connected    size − 1               B / (size − 1)
mesh2d, torus2d    4                      B / 4  (interior device of the grid)
=================  =====================  ==========================================

Placement (docs/architecture.md, "Placement"): a group of ``g`` devices whose consecutive
members are ``stride`` devices apart fills the innermost tier first (tensor parallelism inside
a node, then across nodes). :func:`group_tiers` returns how many members share each tier.

Everything is written for one configuration with scalar leaves; discrete quantities (grid
shapes, divisibility) come from a fixed candidate grid and masks, never Python branches.

Example:
    >>> sys = hw_db.system("dgx_a100", nodes=4)
    >>> members, spacing, ok = group_tiers(sys, 16.0, 1.0)   # members = (8, 2, ...)
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.numerics import (computed_once, divides, is_integer, materialized, max_of,
                               safe_div)
from jaxmodel.types import TOPOLOGIES, NetLevel, System

__all__ = ["RING", "SWITCH", "FULLY_CONNECTED", "MESH2D", "TORUS2D", "links_per_device",
           "link_bw", "grid_rows", "group_tiers", "level_grid"]

RING, SWITCH, FULLY_CONNECTED, MESH2D, TORUS2D = (float(i) for i in range(len(TOPOLOGIES)))

# Row candidates for 2D grids: supports grids up to 1024 x 1024 (10^6 devices per tier).
_ROW_CANDIDATES = tuple(float(r) for r in range(1, 1025))


def _is(topology, code):
    return jnp.abs(topology - code) < 0.5


def links_per_device(level: NetLevel):
    """Links of one device at this tier (Guo et al. §V-C; see the module table)."""
    t = level.topology
    return jnp.select([_is(t, RING), _is(t, SWITCH), _is(t, FULLY_CONNECTED)],
                      [2.0, 1.0, jnp.maximum(level.size - 1.0, 1.0)], 4.0)


def link_bw(level: NetLevel, bw):
    """Bandwidth of one link, bytes/s per direction: ``bw`` (per device) / links."""
    return bw / links_per_device(level)


def grid_rows(m, max_rows=jnp.inf):
    """Rows ``r`` of the most square ``r × (m / r)`` grid with ``r ≤ max_rows``.

    ``r`` is the largest divisor of ``m`` with ``r² ≤ m`` (and ``r ≤ max_rows``); 1 for primes.
    A fixed grid of 1024 candidates, so ``m`` up to about 10^6 is exact.
    """
    r = jnp.asarray(_ROW_CANDIDATES, dtype=jnp.result_type(float))
    ok = divides(r, m) & (r * r <= m * (1.0 + 1e-9)) & (r <= max_rows + 1e-9)
    return max_of(jnp.where(ok, r, 1.0))


def level_grid(level: NetLevel):
    """``(rows, cols, ok)`` of a 2D tier's physical grid; ``ok`` False for a prime size ≥ 2.

    A 2D mesh/torus of prime size cannot be laid out as a 2D grid (Guo et al. §III-D models
    ``r × c`` grids); such a tier is reported infeasible (``topology_mismatch``).
    """
    rows = grid_rows(level.size)
    ok = (rows >= 2.0) | (level.size < 1.5)
    return rows, safe_div(level.size, rows, fill=1.0), ok


def group_tiers(system: System, group_size, stride=1.0):
    """Members of a group per tier, their spacing, and whether the group fits.

    Members ``0, s, 2s, ...`` (``s = stride`` devices apart, device ids counted innermost
    tier fastest) fill the innermost tier first.

    Returns:
        ``(members, spacing, ok)``: tuples with one entry per tier — ``members[k]`` is the
        number of group members joined by tier ``k`` (product = ``group_size``), ``spacing[k]``
        the distance between consecutive members in tier-``k`` positions — and a bool that is
        False when the group does not fit (larger than the system, a stride or size that does
        not tile the tiers evenly).
    """
    g = jnp.asarray(group_size, dtype=jnp.result_type(float))
    s = jnp.asarray(stride, dtype=jnp.result_type(float))
    ok = (g >= 1.0) & is_integer(g) & (s >= 1.0) & is_integer(s)
    g = jnp.where(ok, g, 1.0)
    s = jnp.where(ok, s, 1.0)
    inner = jnp.asarray(1.0, dtype=g.dtype)   # devices per element of the current tier
    rem = g
    members, spacing = [], []
    for lvl in system.levels:
        size = jnp.maximum(lvl.size, 1.0)
        s_k = jnp.maximum(1.0, s / inner)        # member spacing in tier-k positions
        # strides must tile evenly: s_k divides the tier, or the tier divides s_k
        regular = (s_k >= size) | divides(s_k, size)
        ok = ok & regular & is_integer(s_k)
        cap = jnp.maximum(jnp.floor(size / s_k + 1e-9), 1.0)
        m_k = jnp.clip(jnp.minimum(cap, rem), 1.0, None)
        ok = ok & is_integer(m_k) & divides(m_k, rem)
        m_k = jnp.where(is_integer(m_k), m_k, jnp.floor(m_k))
        m_k = jnp.maximum(m_k, 1.0)
        rem = rem / m_k
        members.append(m_k)
        spacing.append(jnp.where(s_k < size, s_k, 1.0))
        inner = inner * size
    ok = computed_once(ok & (jnp.abs(rem - 1.0) < 1e-6))
    # each tier's count is a chain through the tiers before it, read by every collective on
    # the group: kept once (numerics.materialized)
    members, spacing = materialized((tuple(members), tuple(spacing)))
    return members, spacing, ok
