"""Collective communication latency on multi-tier networks.

Sources:

- Guo et al. §III-D: topology-specific all-reduce — ring algorithm on a ring, Rabenseifner
  (recursive halving + doubling, Thakur, Rabenseifner & Gropp 2005) on a switch, direct
  reduction on a fully connected network, the 2D algorithm of Kumar & Jouppi (2020) on a 2D
  mesh; eq. 4 ``D = d/b + l·h + D_r`` for every message; multi-level hierarchies.
- LLMCompass §III-B2 eq. 1–2: packet overhead (see :mod:`jaxmodel.comm.link`).
- NCCL's hierarchical all-reduce (reduce-scatter inside a node, all-reduce across nodes,
  all-gather inside) for groups spanning tiers; NVLink SHARP (NVLS) in-network reduction.

Size convention (NCCL's, as nccl-tests counts it): ``nbytes`` is the full, unsharded buffer of
one device — the all-reduce buffer; the reduce-scatter *input*; the all-gather *output*; the
all-to-all send buffer (``nbytes / g`` to every member); the broadcast buffer; the p2p message.

Algorithm model (one tier, ``m`` members, buffer ``n``; ``B`` = ``bw_per_device · efficiency``,
``b`` the link bandwidth of :func:`jaxmodel.comm.topology.link_bw`, ``l`` the link latency,
``D_r`` the switch latency; bandwidth terms carry the packet overhead of eq. 2):

==================  =========================================================================
``ring``            ``m−1`` steps of ``n/m`` per reduce-scatter (and all-gather). Closed ring:
                    two counter-rotating rings, bandwidth ``2b``; a sub-ring of a larger ring
                    is a line (both link directions used by one ring: bandwidth ``b``, the
                    wrap-around step crosses ``m−1`` hops); switch ``B`` with 2 hops + D_r;
                    fully connected: ``m−1`` edge-disjoint rings, bandwidth ``(m−1)·b``.
``halving_doubling``  Rabenseifner: ``log2 m`` steps of ``n/2, n/4, …``; non-powers of two
                    add one step of ``n/2`` per phase (Thakur et al. §4). On rings/grids step
                    ``k`` spans ``2^k`` hops and ``2^k`` messages share each link.
``direct``          every member sends ``n/m`` to every other member at once; the busiest
                    link (dimension-ordered shortest paths) sets the time.
``2d``              Kumar & Jouppi: reduce-scatter along rows then columns for one half of the
                    data and columns then rows for the other half, concurrently; rings on a
                    torus (bandwidth ``2b`` per dimension), lines on a mesh (``b``; the
                    wrap-around crosses ``len−1`` hops). Mesh/torus only.
``tree``            double binary tree (NCCL): ``2·log2 m`` hops, ``2n`` sent per device;
                    all-reduce and broadcast only.
``in_network``      NVLink SHARP (or CollNet/SHARP on a network tier) on a switch tier with
                    ``in_network_reduction = 1``: each device sends and receives its
                    ``(m−1)/m · n`` once; the switch reduces (all-reduce) or multicasts
                    (all-gather) — half the traffic of a ring. NCCL's NVLS bandwidth model
                    (``tuning.cc``: all-reduce bus bandwidth doubled, ratio ``m/(2(m−1))``)
                    gives the same ``(m−1)/m · n / B``.
==================  =========================================================================

The algorithms are the ordered registry of :mod:`jaxmodel.comm.algorithms` (one phase
function and one ``register_algorithm`` line each; the registry order gives the public codes
of ``ALGORITHM_CODES``). All-reduce = reduce-scatter + all-gather for ring, halving_doubling,
direct and 2d. A group
spanning tiers uses the hierarchical composition: reduce-scatter on every inner tier,
all-reduce on the outermost tier the group reaches (on ``n / Π inner members``), all-gather back
down. ``"hierarchical"`` is accepted as a name for ``"auto"`` (the composition is always
hierarchical). Exception: all-gather and reduce-scatter over two or more NCCL tiers run as
NCCL runs them, one flat ring over all ranks (NCCL has no tree or hierarchical algorithm for
them): ``g − 1`` steps at NCCL's per-step latencies, the bandwidth of the slowest hop
(:func:`_flat_ring`, NCCL 2.30.7 ``src/graph/tuning.cc``); ``"best"`` takes the faster of
that ring and the composition. Each collective adds the largest ``base_latency`` among the
tiers it uses
(software/launch overhead, a calibration constant in hw_db), and a collective measured per
kernel in a host-bound loop takes at least the largest ``launch_floor`` of its tiers (rank 0's
kernel waits for the peers' later launches; 0 on systems that describe device-bound runs).

NCCL tiers (``NetLevel.nccl_link >= 0``: NVLink/NVSwitch, PCIe, InfiniBand) add NCCL's
protocol dimension (:mod:`jaxmodel.comm.nccl`, NCCL 2.30.7 ``src/graph/tuning.cc``): for ring,
tree and in-network (NVLS inside a node, CollNet/SHARP on a network tier) and each protocol
LL / LL128 / Simple, the executed time is NCCL's latency ``lat(a, p)`` (base + per-step
hardware latency of the link class) plus the algorithm's bandwidth time divided by NCCL's
protocol factor (LL ½ capped at ``ll_max_bw``, LL128 0.92 in the tuner and the level's
measured ``ll128_efficiency`` when it runs, tree ×0.92, NVLS all-reduce at
the link's bandwidth, :func:`jaxmodel.comm.nccl.nvls_allreduce_factor`), Simple with the
chunked pipeline of :func:`_pipelined`; a ring or tree running a small message on fewer of
NCCL's ``nccl_channels`` is slower by :func:`jaxmodel.comm.nccl.channel_factor` (``enqueue.cc``;
executed time only), and a Simple ring is also bound by its channels' loads and stores
(:func:`jaxmodel.comm.nccl.copy_time`, ``channel_copy_bw``; executed time only). ``"auto"`` is
NCCL's tuner (``getAlgoInfo``): the argmin over ``(a, p)`` of NCCL's own predicted time
``lat(a, p) + bandwidth time`` at NCCL's own bus bandwidth (``nccl_bw`` where the level gives
it, without packet overhead; NVLS at the tuner latency of the system's NCCL release,
``NetLevel.nccl_nvls_latency``) — a code chosen inside the traced graph — and the executed
time of that choice; ``"best"`` the minimum executed time over every algorithm and protocol. A
hierarchical all-reduce composes per tier (NVLS reduce-scatter inside the node + tree or
ring across nodes ≈ NCCL's NVLS-tree). Tiers with ``nccl_link = −1`` (TPU ICI, the LLMCompass
fully connected node) keep Guo et al.'s per-topology choice with one (Simple) protocol.

Example:
    >>> sys = hw_db.system("hgx_a100_4gpu")
    >>> jm.collective_latency(sys, "all_reduce", 64 * 2**20, 4)          # seconds
    Array(0.000587, dtype=...)
    >>> jm.collective_latency(sys, "all_reduce", jnp.logspace(12, 30, 10, base=2), 4,
    ...                       algorithm="best")                           # shape (10,)
    Array([1.75e-05, 1.89e-05, 2.17e-05, 2.79e-05,
           4.27e-05, 8.2e-05, 0.000199, 0.000587,
           0.00198, 0.00722], dtype=...)
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxmodel.batching import batched
from jaxmodel.comm import nccl
from jaxmodel.comm import topology as topo
from jaxmodel.comm.algorithms import (ALGORITHM_REGISTRY, OPS, AlgorithmSpec, TierStatic,
                                      algorithm_index, algorithm_names, auto_algorithms,
                                      level_algorithm_times, register_algorithm)
from jaxmodel.comm.algorithms import pipelined as _pipelined
from jaxmodel.comm.link import overhead_factor
from jaxmodel.numerics import INF, first_reason, min_of, reason_name, safe_div
from jaxmodel.types import TOPOLOGIES, System, is_concrete, static_flag, validate_args

__all__ = ["OPS", "ALGORITHMS", "ALGORITHM_CODES", "AUTO_ALGORITHM", "algorithm_code",
           "collective_latency", "collective_time", "collective_cost", "collective_feasible",
           "level_algorithm_times", "TierStatic", "NetVariant", "ANY_NET", "net_variant_of",
           "ALGORITHM_REGISTRY", "AlgorithmSpec", "register_algorithm"]

#: The algorithm names registered at import (:mod:`jaxmodel.comm.algorithms`), in code order.
ALGORITHMS = algorithm_names()
_ALIASES = {"rabenseifner": "halving_doubling", "recursive_halving_doubling": "halving_doubling",
            "hd": "halving_doubling", "mesh2d": "2d", "2d_mesh": "2d", "torus": "2d",
            "nvls": "in_network", "sharp": "in_network", "double_binary_tree": "tree",
            "hierarchical": "auto"}
# Guo et al. §III-D: ring → ring, switch → Rabenseifner, fully connected → direct, 2D → 2D.
AUTO_ALGORITHM = auto_algorithms()
#: Public codes: ``auto`` = 0, ``best`` = 1, then the registry (ring = 2 ... in_network = 7).
ALGORITHM_CODES = ("auto", "best") + ALGORITHMS


def _codes() -> tuple:
    """The codes of the live registry (``ALGORITHM_CODES`` plus any algorithm registered
    after import)."""
    return ("auto", "best") + algorithm_names()


class NetVariant(NamedTuple):
    """Static per-tier facts of a concrete system, fixed at the API edge.

    A traced ``level.topology`` makes the collective model evaluate every algorithm on every
    topology and select with ``jnp.where`` (1–3k operations per collective and tier). When
    the topology of a tier is known in Python (one code across the batch), only the
    algorithms that the requested choice can pick are traced — with ``algorithm="auto"``
    just the seed's one — which cuts compile time of the training step and of sweeps
    several-fold. Results are identical up to float rounding. Passed through ``@batched`` as static (its leaves
    are strings, bools and ``None``).

    Attributes:
        topologies: per tier, the topology name (``types.TOPOLOGIES``) or ``None`` (any).
        in_network: per tier, whether in-network reduction is on (``True``/``False``) or
            ``None`` (varies or traced).
        nccl: per tier, the static NCCL link class by name (``"off"`` = not an NCCL tier,
            ``"nvlink"``, ``"pci"``, ``"net"``; ``NetLevel.nccl_link`` −1/0/1/2) or ``None``
            (varies or traced). Names, not numbers: static leaves must not be traced.
    """

    topologies: tuple = ()
    in_network: tuple = ()
    nccl: tuple = ()

    def topology(self, k: int):
        return self.topologies[k] if k < len(self.topologies) else None

    def inr(self, k: int):
        return self.in_network[k] if k < len(self.in_network) else None

    def is_nccl(self, k: int):
        v = self.nccl_link(k)
        return None if v is None else v > -0.5

    def nccl_link(self, k: int):
        v = self.nccl[k] if k < len(self.nccl) else None
        return None if v is None else float(_LINK_NAMES.index(v) - 1)


ANY_NET = NetVariant()
_LINK_NAMES = ("off", "nvlink", "pci", "net")     # NetLevel.nccl_link −1, 0, 1, 2


def net_variant_of(system: System) -> NetVariant:
    """The :class:`NetVariant` of a concrete ``system`` (``ANY_NET`` under tracing).

    Example:
        >>> net_variant_of(hw_db.system("dgx_a100", nodes=2)).topologies
        ('switch', 'switch')
    """
    if system is None:
        return ANY_NET
    topos, inr, nccl = [], [], []
    for lvl in system.levels:
        inr.append(static_flag(lvl.in_network_reduction, lambda a: a > 0.5))
        code = _static_code(lvl.nccl_link)
        ok = code is not None and code == round(code) and -1 <= code <= 2
        nccl.append(_LINK_NAMES[int(code) + 1] if ok else None)
        if not is_concrete(lvl.topology):    # other leaves may be traced (grad over bw)
            topos.append(None)
            continue
        codes = np.unique(np.asarray(lvl.topology, dtype=float))
        ok = (codes.size == 1 and codes[0] == round(codes[0])
              and 0 <= codes[0] < len(TOPOLOGIES))
        topos.append(TOPOLOGIES[int(codes[0])] if ok else None)
    return NetVariant(tuple(topos), tuple(inr), tuple(nccl))


def _static_code(x):
    """The single value of a concrete leaf as a Python float (``None`` if traced or varied)."""
    if not is_concrete(x):
        return None
    v = np.unique(np.asarray(x, dtype=float))
    return float(v[0]) if v.size == 1 else None


def _nccl_candidates(op: str, inr) -> tuple:
    """Registry indices among which NCCL's tuner chooses for ``op`` (the algorithms with
    NCCL's protocol model listing ``op``: ring; tree for all-reduce; NVLS / CollNet where
    in-network reduction may be on)."""
    return tuple(i for i, s in enumerate(ALGORITHM_REGISTRY.values())
                 if s.protocols is not None and op in s.nccl_ops
                 and not (s.needs_in_network and inr is False))


_SIMPLE = float(nccl.PROTOCOLS.index("simple"))


def _needed_algorithms(op: str, algorithm, topology, inr, nccl=False) -> tuple | None:
    """Registry indices that can decide ``op``'s time on a tier of the static ``topology``
    (``None`` = all). ``auto`` needs the seed's algorithm only (NCCL tiers: the tuner's
    candidates); a named one also needs the auto fallback; ``best`` every algorithm whose
    ``static_ok`` admits the topology."""
    if topology is None or nccl is None or not isinstance(algorithm, str):
        return None
    if op == "all_to_all":
        return (algorithm_index("direct"),)
    autos = (_nccl_candidates(op, inr) if nccl and op not in ("p2p",)
             else (algorithm_index(auto_algorithms()[topology]),))
    auto = autos[0]
    if algorithm == "auto":
        return autos
    if algorithm == "best":
        keep = [i for i, s in enumerate(ALGORITHM_REGISTRY.values())
                if s.static_ok(op, topology, inr)]
        return tuple(sorted(set(keep) | set(autos)))
    return tuple(sorted({auto, *autos, algorithm_index(algorithm)}))


def algorithm_code(algorithm) -> float:
    """Numeric code of an algorithm name (its index in ``ALGORITHM_CODES``).

    ``auto`` = 0, ``best`` = 1, then the registry in order (ring = 2 ... in_network = 7; an
    algorithm appended with :func:`register_algorithm` gets the next code).
    Codes let a batch vary the algorithm: pass an array of codes as ``algorithm``.
    """
    return float(_codes().index(_canonical("all_reduce", algorithm)[1]))


def _canonical(op: str, algorithm) -> tuple[str, object]:
    if not isinstance(op, str) or op.lower() not in OPS:
        raise ValueError(f"op={op!r} is not one of {list(OPS)}")
    if not isinstance(algorithm, str):
        if isinstance(algorithm, bool) or algorithm is None:
            raise ValueError(f"algorithm={algorithm!r} must be a name or a numeric code")
        if is_concrete(algorithm):
            codes, names = np.asarray(algorithm, dtype=float), _codes()
            bad = (codes < 0) | (codes > len(names) - 1) | (codes != np.round(codes))
            if np.any(bad):
                raise ValueError(f"algorithm code(s) {codes[bad].tolist()} are not in "
                                 f"0..{len(names) - 1} ({list(names)})")
        return op.lower(), algorithm
    a = algorithm.lower().replace("-", "_")
    a = _ALIASES.get(a, a)
    if a not in _codes():
        raise ValueError(f"algorithm={algorithm!r} is not one of "
                         f"{[*_codes(), *sorted(_ALIASES)]}")
    return op.lower(), a


def _choose(times, app, level, algorithm, static_topology=None, nccl_tier=None):
    """Pick one algorithm's time on a tier: auto, best (min) or a named one.

    ``times``: the ``(4, A)`` array of :func:`level_algorithm_times` (``A`` registered
    algorithms). ``auto``
    on an NCCL tier (``level.nccl_link >= 0``) is the executed time of the algorithm and
    protocol with the smallest tuner time (NCCL ``getAlgoInfo``: argmin over its own cost
    model); elsewhere Guo et al.'s choice per topology. ``best`` is the fastest executed
    (algorithm, protocol).

    ``algorithm`` is a name (static) or a numeric code (``ALGORITHM_CODES``; may be traced).
    A named algorithm that does not apply to this tier falls back to the tier's auto choice;
    ``used`` tells whether the named one was applied. ``static_topology`` (a name) and
    ``nccl_tier`` (a bool) replace the traced level codes when known.
    """
    topology = level.topology
    exe, fastest, tune = times[0], times[1], times[2]
    auto = _guo_auto(exe, topology, static_topology)
    if nccl_tier is not False:
        has = jnp.isfinite(min_of(tune))
        nccl_auto = exe[jnp.argmin(tune)]
        use = has if nccl_tier else has & (level.nccl_link > -0.5)
        auto = jnp.where(use, nccl_auto, auto)
    times = exe
    if isinstance(algorithm, str):
        code = _codes().index(algorithm)
        if code == 0:
            return auto, jnp.asarray(True)
        if code == 1:
            return min_of(fastest), jnp.asarray(True)
        i = code - 2
        return jnp.where(app[i], times[i], auto), app[i]
    n_alg = len(ALGORITHM_REGISTRY)
    code = jnp.clip(jnp.round(jnp.asarray(algorithm)), 0, n_alg + 1)
    i = jnp.clip(code - 2, 0, n_alg - 1).astype(jnp.int32)
    named_ok = app[i]
    named = jnp.where(named_ok, times[i], auto)
    t = jnp.select([code < 0.5, code < 1.5], [auto, min_of(fastest)], named)
    used = jnp.where(code < 1.5, True, named_ok)
    return t, used


def _guo_auto(times, topology, static_topology=None):
    """Guo et al. §III-D's algorithm per topology (ring → ring, switch → Rabenseifner, fully
    connected → direct, 2D → 2D; ``AlgorithmSpec.auto_for``); the fastest where that one is
    not applicable."""
    autos = auto_algorithms()
    if static_topology is not None:
        auto = times[algorithm_index(autos[static_topology])]
    else:
        auto_idx = jnp.asarray(tuple(float(algorithm_index(autos[t])) for t in TOPOLOGIES))[
            jnp.clip(jnp.round(topology), 0, len(TOPOLOGIES) - 1).astype(jnp.int32)]
        auto = times[auto_idx.astype(jnp.int32)]
    return jnp.where(jnp.isfinite(auto), auto, min_of(times))  # e.g. all-to-all: direct only


# NCCL 2.30.7 ``src/graph/tuning.cc`` ``getNetOverhead``: per-step host overhead of a ring
# that crosses nodes (µs; x86 Intel and other CPUs 1.0, AMD 2.0; Simple ×3).
_NET_OVERHEAD = 1.0e-6


def _flat_ring_latency(system: System, members, net: NetVariant, f):
    """NCCL's latency of a ring all-gather / reduce-scatter over the group ``members`` (per
    tier), per protocol (LL, LL128, Simple), s (:func:`_flat_ring`)."""
    K = len(system.levels)
    links = []
    any_net = jnp.asarray(False)
    for k, lvl in enumerate(system.levels):
        link = net.nccl_link(k)
        links.append(jnp.asarray(lvl.nccl_link if link is None else link, dtype=f))
        any_net = any_net | ((members[k] > 1.5) & (links[k] > 1.5))
    # c[k]: ring steps crossing tier k or above
    c = []
    for k in range(K):
        prod = jnp.asarray(1.0, dtype=f)
        for j in range(k, K):
            prod = prod * members[j]
        c.append(jnp.maximum(prod - 1.0, 0.0))
    c.append(jnp.asarray(0.0, dtype=f))
    ovhd = _NET_OVERHEAD * jnp.asarray((1.0, 1.0, 3.0), dtype=f)
    lat = jnp.asarray(nccl.BASE_LAT["ring"], dtype=f) * 1e-6
    for k in range(K):
        hw = nccl._by_link(nccl.HW_LAT["ring"], links[k])
        hw = jnp.where(any_net & (links[k] < 1.5), jnp.maximum(hw, ovhd), hw)
        lat = lat + (c[k] - c[k + 1]) * hw
    return lat


def _flat_ring(system: System, n, members, inner, g, net: NetVariant, f):
    """NCCL's all-gather / reduce-scatter on a group spanning several NCCL tiers: ONE ring
    over all ``g`` ranks (NCCL has no tree or hierarchical algorithm for them; PAT needs one
    GPU per node, NVLS/CollNet across nodes need SHARP plugins).

    Source: NVIDIA NCCL 2.30.7 ``src/graph/tuning.cc`` ``ncclTopoTuneModel``: ``nsteps =
    nRanks − 1``; latency ``baseLat + (nsteps − nInterSteps) · intraLat + nInterSteps ·
    interLat`` with ``nInterSteps = nNodes − 1``, ``intraLat = max(hwLat[intra][ring][p],
    netOverhead)`` (``getNetOverhead``, ×3 for Simple) and ``interLat = hwLat[NET][ring][p]``;
    bus bandwidth ``nChannels · bwInter`` (``nNodes > 2``), LL ½ capped at ``llMaxBw``, LL128
    0.92 (executed: the outermost active tier's ``ll128_efficiency``). Generalised to ``K`` tiers: the steps whose highest crossed tier is ``k`` number
    ``c_k − c_{k+1}`` with ``c_k = Π_{j≥k} m_j − 1``, each at tier ``k``'s per-step latency.
    Bandwidth: a pipelined ring runs at its slowest hop; every rank forwards
    ``(g−1)/g · n``, and tier ``k``'s hops of one lower-tier unit share the ``inner[k]``
    devices' links (NCCL's channels spread over the node's NICs, one per GPU on rail-optimised
    nodes), so the time is ``max_k (g−1)/g · n / (inner[k] · B_k)``; Simple's per-chunk
    overhead (:func:`_pipelined`) is paid on every step at its tier's ``chunk_latency``
    (``S·c`` → ``Σ_k steps_k · c_k``). Returns
    ``(executed at the tuner's protocol, fastest executed)``.

    Not modelled here (unlike a single tier, :func:`level_algorithm_times`): the channels'
    copy bound (``channel_copy_bw``, :func:`jaxmodel.comm.nccl.copy_time`) and a tuner
    bandwidth of NCCL's own (``nccl_bw``). NCCL's multi-node ring bus bandwidth is
    ``nChannels · bwInter`` of the network graph, which no network tier carries, so the tuner
    compares the protocols at the executed bandwidth. The copy bound would not bind on the
    InfiniBand systems of hw_db, but not by much: on DGX A100 a node's ring hop runs at
    8 × 25 GB/s × 0.9 = 180 GB/s of buffer, while 24 channels × 29.6 GB/s of loads and stores
    at ~3 bytes per buffer byte (``copy_bytes``) allow ~237 GB/s; on a faster network it
    could bind and this ring would be optimistic.
    """
    gm1 = jnp.maximum(g - 1.0, 0.0)
    lat = _flat_ring_latency(system, members, net, f)
    bwt = jnp.asarray(0.0, dtype=f)
    bus = jnp.asarray(INF, dtype=f)
    cl = jnp.asarray(0.0, dtype=f)
    llmax = jnp.asarray(0.0, dtype=f)
    ll128 = jnp.asarray(nccl.LL128_FACTOR, dtype=f)
    channels = jnp.asarray(0.0, dtype=f)
    c = [jnp.maximum(jnp.prod(jnp.stack(members[k:])) - 1.0, 0.0) for k in range(len(members))]
    c.append(jnp.asarray(0.0, dtype=f))
    for k, lvl in enumerate(system.levels):
        active = members[k] > 1.5
        per_dev = lvl.bw_per_device
        cap = safe_div(lvl.bw_per_node, jnp.maximum(inner[k], 1.0), fill=jnp.inf)
        per_dev = jnp.where(lvl.bw_per_node > 0, jnp.minimum(per_dev, cap), per_dev)
        raw = per_dev * lvl.efficiency * inner[k]
        b_k = jnp.where(raw > 0, raw, 1.0)
        t_k = gm1 / jnp.maximum(g, 1.0) * n * overhead_factor(lvl, n / jnp.maximum(g, 1.0)) / b_k
        bwt = jnp.where(active, jnp.maximum(bwt, t_k), bwt)
        bus = jnp.where(active, jnp.minimum(bus, b_k), bus)
        cl = cl + (c[k] - c[k + 1]) * lvl.chunk_latency     # Σ steps · chunk overhead
        llmax = jnp.where(active, lvl.ll_max_bw, llmax)         # the outermost tier's
        ll128 = jnp.where(active, lvl.ll128_efficiency, ll128)  # the outermost tier's
        channels = jnp.where(active & (lvl.nccl_channels > 0), lvl.nccl_channels, channels)
    bus = jnp.where(jnp.isfinite(bus), bus, 1.0)
    bwt_p = bwt / nccl.bw_factor("ring", "all_gather", 0.0)
    ll_t = jnp.where(llmax > 0, bwt * bus / jnp.where(llmax > 0, llmax, 1.0), 0.0)
    bwt_p = jnp.maximum(bwt_p, jnp.stack([ll_t, 0.0 * ll_t, 0.0 * ll_t]))
    cl_p = jnp.stack([0.0 * cl, 0.0 * cl, cl])
    # executed LL128 at the outermost active tier's measured fraction (tuner: NCCL's 0.92),
    # as level_algorithm_times does per tier
    ll128_x = jnp.stack([jnp.ones_like(cl), nccl.ll128_executed(ll128) + 0.0 * cl,
                         jnp.ones_like(cl)])
    exe = _pipelined(lat, bwt_p / ll128_x * nccl.channel_factor("ring", n, g, channels),
                     1.0, cl_p)
    tune = lat + bwt_p
    return exe[jnp.argmin(tune)], min_of(exe)


def _flat_ring_override(system, n, members, inner, g, algorithm, net, total):
    """Replace the hierarchical all-gather / reduce-scatter time by NCCL's flat ring
    (:func:`_flat_ring`) when the group spans two or more tiers, all of them NCCL tiers:
    ``auto`` and ``ring`` run the ring, ``best`` the faster of the ring and the hierarchical
    composition; other named algorithms keep the composition."""
    f = jnp.result_type(float)
    K = len(system.levels)
    if K < 2:
        return total
    n_active = jnp.asarray(0.0, dtype=f)
    all_nccl = jnp.asarray(True)
    for k, lvl in enumerate(system.levels):
        active = members[k] > 1.5
        n_active = n_active + jnp.where(active, 1.0, 0.0)
        st = net.is_nccl(k)
        if st is False:
            all_nccl = all_nccl & ~active
        elif st is None:
            all_nccl = all_nccl & (~active | (lvl.nccl_link > -0.5))
    multi = (n_active > 1.5) & all_nccl
    ring_t, best_t = _flat_ring(system, n, members, inner, g, net, f)
    ring_code = float(_codes().index("ring"))
    if isinstance(algorithm, str):
        code = float(_codes().index(algorithm))
        if code == 1.0:
            return jnp.where(multi, jnp.minimum(best_t, total), total)
        if code in (0.0, ring_code):
            return jnp.where(multi, ring_t, total)
        return total
    code = jnp.round(jnp.asarray(algorithm, dtype=f))
    flat = jnp.where(code == 1.0, jnp.minimum(best_t, total), ring_t)
    use = multi & ((code == 0.0) | (code == 1.0) | (code == ring_code))
    return jnp.where(use, flat, total)


def _cost(system: System, op: str, nbytes, group_size, algorithm: str = "auto", stride=1.0,
          net: NetVariant = ANY_NET):
    """Single-configuration collective model: ``(latency_s, feasible, reason)``.

    ``net`` (static, :func:`net_variant_of`) must describe ``system``; it only prunes the
    traced graph, never changes a result."""
    op, algorithm = _canonical(op, algorithm)
    f = jnp.result_type(float)
    n = jnp.asarray(nbytes, dtype=f)
    n_ok = (n >= 0) & jnp.isfinite(n)
    n = jnp.where(n_ok, n, 0.0)
    net_ok = jnp.asarray(True)
    for lvl in system.levels:
        net_ok = net_ok & (lvl.size >= 1) & (lvl.bw_per_device > 0) & (lvl.efficiency > 0) & (
            lvl.link_latency >= 0) & (lvl.switch_latency >= 0) & (lvl.base_latency >= 0) & (
            lvl.launch_floor >= 0) & (lvl.max_payload_bytes > 0) & (lvl.flit_bytes > 0)
    members, spacing, place_ok = topo.group_tiers(system, group_size, stride)
    n_levels = len(system.levels)

    # tier k sees the buffer divided by the members of the tiers inside it
    inner = [jnp.asarray(1.0, dtype=f)]
    for m in members[:-1]:
        inner.append(inner[-1] * m)
    top = []
    for k in range(n_levels):
        above = jnp.asarray(True)
        for j in range(k + 1, n_levels):
            above = above & (members[j] < 1.5)
        top.append(above & (members[k] > 1.5))
    g = inner[-1] * members[-1] if n_levels else jnp.asarray(1.0, dtype=f)

    total = jnp.asarray(0.0, dtype=f)
    base = jnp.asarray(0.0, dtype=f)
    floor = jnp.asarray(0.0, dtype=f)
    shape_ok = jnp.asarray(True)
    used_any = jnp.asarray(False)
    any_active = jnp.asarray(False)
    for k, lvl in enumerate(system.levels):
        m = members[k]
        active = m > 1.5
        any_active = any_active | active
        if op == "all_to_all":
            n_k = n * inner[k] * m / jnp.maximum(g, 1.0)
        elif op in ("broadcast", "p2p"):
            n_k = n
        elif op == "all_gather":
            n_k = n / inner[k]
        else:
            n_k = n / inner[k]
        needed = ("all_reduce", "reduce_scatter") if op == "all_reduce" else (op,)
        st, nt, nl = net.topology(k), net.is_nccl(k), net.nccl_link(k)
        algs = _needed_algorithms(op, algorithm, st, net.inr(k), nt)
        if algs is not None and op == "all_reduce":
            algs = tuple(sorted(set(algs) | set(_needed_algorithms(
                "reduce_scatter", algorithm, st, net.inr(k), nt))))
        times, apps, ok = level_algorithm_times(lvl, m, n_k, spacing[k], inner[k], needed,
                                                TierStatic(st, net.inr(k), nl), algs)
        shape_ok = shape_ok & ok
        specs = list(ALGORITHM_REGISTRY.values())
        if op == "p2p" or (algs is not None and not any(
                specs[i].protocols is not None for i in algs)):
            # no NCCL algorithm timed: the tuner row is +inf (no tuner choice); static, so
            # no min over a constant row broadcast to the batch is traced (XLA would fold it)
            nt = False
        if op == "all_reduce":
            # inner tiers: reduce-scatter + all-gather with the same algorithm; top: all-reduce
            inner_t = 2.0 * times["reduce_scatter"]
            t_top, used_top = _choose(times["all_reduce"], apps["all_reduce"], lvl,
                                      algorithm, st, nt)
            t_in, used_in = _choose(inner_t, apps["reduce_scatter"], lvl, algorithm, st, nt)
            t_k = jnp.where(top[k], t_top, t_in)
            used = jnp.where(top[k], used_top, used_in)
        elif op in ("broadcast",):
            t_k, used = _choose(times[op], apps[op], lvl, algorithm, st, nt)
        elif op == "p2p":
            t_k, used = _choose(times[op], apps[op], lvl, algorithm, st, nt)
            t_k = jnp.where(top[k], t_k, 0.0)
        else:
            t_k, used = _choose(times[op], apps[op], lvl, algorithm, st, nt)
        t_k = jnp.where(active, t_k, 0.0)
        total = total + t_k
        used_any = used_any | (active & used)
        base = jnp.maximum(base, jnp.where(active, lvl.base_latency, 0.0))
        floor = jnp.maximum(floor, jnp.where(active, lvl.launch_floor, 0.0))

    if op in ("all_gather", "reduce_scatter"):
        total = _flat_ring_override(system, n, members, inner, g, algorithm, net, total)

    feasible, reason = first_reason([
        (net_ok, "invalid_network"),
        (n_ok, "invalid_workload"),
        (place_ok, "topology_mismatch"),
        (shape_ok, "topology_mismatch"),
        (used_any | ~any_active, "topology_mismatch"),
    ])
    latency = jnp.where(feasible, jnp.maximum(total + base, floor), INF)
    return latency, feasible, reason


_cost_batched = batched(_cost)


def collective_time(system: System, op: str, nbytes, group_size, algorithm: str = "auto",
                    stride=1.0):
    """Collective time with feasibility: ``(latency_s, feasible, reason_code)``, seconds.

    Same arguments as :func:`collective_latency`. Never raises for values: an infeasible
    configuration gives ``latency = +inf``, ``feasible = False`` and a reason code from
    :data:`jaxmodel.numerics.REASONS` (``topology_mismatch`` for a group that does not fit,
    ``invalid_network`` for non-positive bandwidth or size, ``invalid_workload`` for a
    negative size). ``collective_time.single`` is the single-configuration function.
    ``collective_cost`` is its deprecated former name (every other ``*_cost`` is in USD).

    Example:
        >>> t, ok, why = jm.collective_time(hw_db.system("tpuv3_8"), "all_reduce", 2**20, 7)
        >>> bool(ok), jm.reason_name(why)        # 7 of the ring's 8 cores: a line of 7
        (True, 'ok')
        >>> t, ok, why = jm.collective_time(hw_db.system("tpuv3_8"), "all_reduce", 2**20, 9)
        >>> float(t), bool(ok), jm.reason_name(why)   # more members than the system has
        (inf, False, 'topology_mismatch')
    """
    _canonical(op, algorithm)
    return _cost_batched(system, op, nbytes, group_size, algorithm, stride,
                         net=net_variant_of(system))


collective_time.single = _cost

#: Deprecated name of :func:`collective_time` (it returns seconds, not USD).
collective_cost = collective_time


def _latency_single(system: System, op: str, nbytes, group_size, algorithm: str = "auto",
                    stride=1.0, net: NetVariant = ANY_NET):
    return _cost(system, op, nbytes, group_size, algorithm, stride, net)[0]


def collective_latency(system: System, op: str, nbytes, group_size, algorithm: str = "auto",
                       stride=1.0):
    """Latency of one collective on a (possibly multi-tier) system, seconds.

    Sources: Guo et al. §III-D (topologies, topology-specific algorithms, eq. 4, multi-level
    hierarchies), LLMCompass §III-B2 eq. 1–2 (packets); see the module docstring for every
    algorithm's formula.

    Args:
        system: :class:`~jaxmodel.types.System` (leaves may carry a batch axis).
        op: ``"all_reduce"``, ``"reduce_scatter"``, ``"all_gather"``, ``"all_to_all"``,
            ``"broadcast"`` or ``"p2p"`` (static).
        nbytes: the full buffer per device, bytes, as NCCL counts it: the all-reduce buffer,
            the reduce-scatter input, the all-gather output, the all-to-all send buffer, the
            broadcast buffer, the p2p message.
        group_size: devices in the group (traced; a batch may vary it).
        algorithm: ``"auto"`` (NCCL's tuner choice of algorithm and protocol on NCCL tiers;
            elsewhere Guo et al.'s choice per topology: ring → ring, switch → Rabenseifner,
            fully connected → direct, 2D → 2D), ``"best"`` (fastest applicable algorithm and
            protocol, per tier), or one of ``"ring"``, ``"halving_doubling"`` (``"rabenseifner"``),
            ``"direct"``, ``"2d"``, ``"tree"``, ``"in_network"`` (NVLS; switch tiers with
            ``in_network_reduction = 1``), ``"hierarchical"`` (= auto). A named algorithm is
            used on every tier where it applies, the tier's auto choice elsewhere. A number
            or array of codes (:func:`algorithm_code`, ``ALGORITHM_CODES``) lets a batch vary
            the algorithm.
        stride: devices between consecutive group members (1 = contiguous, e.g. TP; ``tp·pp``
            for a DP group whose members sit in different nodes).

    Returns:
        Seconds, with the batch shape of the arguments. ``+inf`` for infeasible entries of a
        batch; see :func:`collective_time` for the reason.

    Raises:
        ValueError: unknown ``op``/``algorithm``, or a concrete single configuration that is
            infeasible (group larger than the system, a 2D tier of prime size, a named
            algorithm that applies to none of the tiers used, ...).

    Example:
        >>> sys = hw_db.system("dgx_a100", nodes=2)
        >>> jm.collective_latency(sys, "all_reduce", 2**26, 16)          # hierarchical
        Array(0.00138, dtype=...)
        >>> jm.collective_latency(sys, "all_reduce", 2**26, 2, stride=8)  # DP across nodes
        Array(0.00365, dtype=...)
    """
    _canonical(op, algorithm)
    validate_args(system, where="collective_latency")
    t, ok, why = _cost_batched(system, op, nbytes, group_size, algorithm, stride,
                               net=net_variant_of(system))
    if (is_concrete(system, nbytes, group_size, stride, algorithm) and np.ndim(t) == 0
            and not bool(ok)):
        raise ValueError(
            f"collective_latency: infeasible {op} of group_size={_fmt(group_size)} "
            f"(stride={_fmt(stride)}, algorithm={algorithm!r}) on system "
            f"{getattr(system, 'name', '?')!r} with tier sizes "
            f"{[_fmt(l.size) for l in system.levels]}: {reason_name(why)}")
    return t


def _fmt(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return x


collective_latency.single = _latency_single


def collective_feasible(system: System, group_size, op: str = "all_reduce",
                        algorithm: str = "auto", stride=1.0):
    """``(feasible, reason_code)`` of placing a group on ``system`` (no exception).

    Example:
        >>> ok, why = jm.collective_feasible(hw_db.system("dgx_a100", nodes=2), 24)
    """
    _, ok, why = collective_time(system, op, 0.0, group_size, algorithm, stride)
    return ok, why


def _feasible_single(system, group_size, op="all_reduce", algorithm="auto", stride=1.0,
                     net: NetVariant = ANY_NET):
    _, ok, why = _cost(system, op, 0.0, group_size, algorithm, stride, net)
    return ok, why


collective_feasible.single = _feasible_single
