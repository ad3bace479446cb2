"""jaxmodel.comm: link model, topologies, collective algorithms (NCCL's algorithm × protocol
choice on NCCL tiers, :mod:`jaxmodel.comm.nccl`), multi-tier hierarchies.

Public names: :func:`collective_latency` (seconds), :func:`collective_time`
(``(seconds, feasible, reason)``; ``collective_cost`` is its deprecated name),
:func:`collective_feasible`, and the name tables
``OPS``, ``ALGORITHMS``, ``ALGORITHM_CODES``, ``AUTO_ALGORITHM`` and :func:`algorithm_code`.
Each has ``.single`` for use inside other single-configuration formulas; pass it the static
:class:`NetVariant` of the system (:func:`net_variant_of`, computed at the API edge) to trace
only the algorithms its topologies need.
"""

from jaxmodel.comm.collectives import (ALGORITHM_CODES, ALGORITHMS, ANY_NET, AUTO_ALGORITHM,
                                       OPS, NetVariant, algorithm_code, collective_cost,
                                       collective_feasible, collective_latency, collective_time,
                                       level_algorithm_times, net_variant_of)
from jaxmodel.comm.link import overhead_factor, wire_bytes
from jaxmodel.comm.topology import group_tiers

__all__ = ["collective_latency", "collective_time", "collective_cost", "collective_feasible",
           "algorithm_code",
           "OPS", "ALGORITHMS", "ALGORITHM_CODES", "AUTO_ALGORITHM", "NetVariant",
           "net_variant_of"]
