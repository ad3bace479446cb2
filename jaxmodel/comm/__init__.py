"""jaxmodel.comm: link model, topologies, collective algorithms, multi-tier hierarchies.

Public names: :func:`collective_latency` (seconds), :func:`collective_cost`
(``(latency, feasible, reason)``), :func:`collective_feasible`, and the name tables
``OPS``, ``ALGORITHMS``, ``AUTO_ALGORITHM``. Each has ``.single`` for use inside other
single-configuration formulas.
"""

from jaxmodel.comm.collectives import (ALGORITHMS, AUTO_ALGORITHM, OPS, collective_cost,
                                       collective_feasible, collective_latency,
                                       level_algorithm_times)
from jaxmodel.comm.link import effective_bw, overhead_factor, p2p_delay, wire_bytes
from jaxmodel.comm.topology import placement

__all__ = ["collective_latency", "collective_cost", "collective_feasible", "OPS",
           "ALGORITHMS", "AUTO_ALGORITHM"]
