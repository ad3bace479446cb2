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

All-reduce = reduce-scatter + all-gather for ring, halving_doubling, direct and 2d. A group
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
it, without packet overhead) — a code chosen inside the traced graph — and the executed time of
that choice; ``"best"`` the minimum executed time over every algorithm and protocol. A
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
from jaxmodel.comm.link import overhead_factor
from jaxmodel.numerics import INF, first_reason, reason_name, safe_div
from jaxmodel.types import TOPOLOGIES, System, is_concrete, static_flag, validate_args

__all__ = ["OPS", "ALGORITHMS", "ALGORITHM_CODES", "AUTO_ALGORITHM", "algorithm_code",
           "collective_latency", "collective_time", "collective_cost", "collective_feasible",
           "level_algorithm_times", "NetVariant", "ANY_NET", "net_variant_of"]

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "p2p")
ALGORITHMS = ("ring", "halving_doubling", "direct", "2d", "tree", "in_network")
_ALIASES = {"rabenseifner": "halving_doubling", "recursive_halving_doubling": "halving_doubling",
            "hd": "halving_doubling", "mesh2d": "2d", "2d_mesh": "2d", "torus": "2d",
            "nvls": "in_network", "sharp": "in_network", "double_binary_tree": "tree",
            "hierarchical": "auto"}
# Guo et al. §III-D: ring → ring, switch → Rabenseifner, fully connected → direct, 2D → 2D.
AUTO_ALGORITHM = {"ring": "ring", "switch": "halving_doubling", "fully_connected": "direct",
                  "mesh2d": "2d", "torus2d": "2d"}
_AUTO_INDEX = tuple(float(ALGORITHMS.index(AUTO_ALGORITHM[t])) for t in
                    ("ring", "switch", "fully_connected", "mesh2d", "torus2d"))


ALGORITHM_CODES = ("auto", "best") + ALGORITHMS


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
    """Indices into ``ALGORITHMS`` among which NCCL's tuner chooses for ``op`` (ring; tree for
    all-reduce; NVLS / CollNet where in-network reduction may be on)."""
    names = ["ring"] + (["tree"] if op == "all_reduce" else [])
    names += ["in_network"] if inr is not False and op in _INR_OPS else []
    return tuple(ALGORITHMS.index(a) for a in names)


_INR_OPS = ("all_reduce", "reduce_scatter", "all_gather")
_SIMPLE = float(nccl.PROTOCOLS.index("simple"))


def _needed_algorithms(op: str, algorithm, topology, inr, nccl=False) -> tuple | None:
    """Indices into ``ALGORITHMS`` that can decide ``op``'s time on a tier of the static
    ``topology`` (``None`` = all). ``auto`` needs the seed's algorithm only (NCCL tiers: the
    tuner's candidates); a named one also needs the auto fallback; ``best`` every algorithm
    applicable to the topology."""
    if topology is None or nccl is None or not isinstance(algorithm, str):
        return None
    if op == "all_to_all":
        return (ALGORITHMS.index("direct"),)
    autos = (_nccl_candidates(op, inr) if nccl and op not in ("p2p",)
             else (ALGORITHMS.index(AUTO_ALGORITHM[topology]),))
    auto = autos[0]
    if algorithm == "auto":
        return autos
    if algorithm == "best":
        grid = topology in ("mesh2d", "torus2d")
        tree_ok = op in ("all_reduce", "broadcast")
        keep = [ALGORITHMS.index(a) for a in ("ring", "halving_doubling", "direct")]
        keep += [ALGORITHMS.index("2d")] if grid else []
        keep += [ALGORITHMS.index("tree")] if tree_ok else []
        keep += ([ALGORITHMS.index("in_network")] if topology == "switch" and inr is not False
                 else [])
        return tuple(sorted(set(keep) | set(autos)))
    return tuple(sorted({auto, *autos, ALGORITHMS.index(algorithm)}))


def algorithm_code(algorithm) -> float:
    """Numeric code of an algorithm name (its index in ``ALGORITHM_CODES``).

    ``auto`` = 0, ``best`` = 1, then ``ALGORITHMS`` in order (ring = 2 ... in_network = 7).
    Codes let a batch vary the algorithm: pass an array of codes as ``algorithm``.
    """
    return float(ALGORITHM_CODES.index(_canonical("all_reduce", algorithm)[1]))


def _canonical(op: str, algorithm) -> tuple[str, object]:
    if not isinstance(op, str) or op.lower() not in OPS:
        raise ValueError(f"op={op!r} is not one of {list(OPS)}")
    if not isinstance(algorithm, str):
        if isinstance(algorithm, bool) or algorithm is None:
            raise ValueError(f"algorithm={algorithm!r} must be a name or a numeric code")
        if is_concrete(algorithm):
            codes = np.asarray(algorithm, dtype=float)
            bad = (codes < 0) | (codes > len(ALGORITHM_CODES) - 1) | (codes != np.round(codes))
            if np.any(bad):
                raise ValueError(f"algorithm code(s) {codes[bad].tolist()} are not in "
                                 f"0..{len(ALGORITHM_CODES) - 1} ({list(ALGORITHM_CODES)})")
        return op.lower(), algorithm
    a = algorithm.lower().replace("-", "_")
    a = _ALIASES.get(a, a)
    if a not in ALGORITHM_CODES:
        raise ValueError(f"algorithm={algorithm!r} is not one of "
                         f"{[*ALGORITHM_CODES, *sorted(_ALIASES)]}")
    return op.lower(), a


def _log2(x):
    return jnp.log2(jnp.maximum(x, 1.0))


def _dim_load(c, closed):
    """Busiest-link load of an all-to-all along one dimension of ``c`` members, in units of
    one member-to-member message: ``c²/8`` on a bidirectional ring, ``⌊c/2⌋·⌈c/2⌉`` on a line."""
    return jnp.where(closed, c * c / 8.0, jnp.floor(c / 2.0) * jnp.ceil(c / 2.0))


def _pipelined(lat, bwt, steps, chunk_latency):
    """``lat + bwt + S·c + 2·√(S·c·bwt)`` = ``lat + (√(S·c) + √bwt)²``.

    Optimally chunked pipeline (Bar-Noy & Kipnis 1994; Träff & Ripke 2008 for pipelined
    collectives): ``k`` chunks through ``S`` sequential steps, each chunk paying an overhead
    ``c`` (synchronisation, flag polling, kernel loop), cost ``(S + k − 1)(c + bwt/k)``, minimal
    at ``k* = √((S−1)·bwt / c)``. Its cross term makes the achieved bandwidth ramp up with
    message size, as measured (NCCL). ``c = 0`` gives the seed's ``lat + bwt`` exactly; the
    double-where keeps the gradient finite there.
    """
    x = steps * chunk_latency * bwt
    ok = x > 0
    root = jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0)
    return lat + bwt + steps * chunk_latency + 2.0 * root


def level_algorithm_times(level, m, n, spacing=1.0, sharers=1.0, ops=OPS, topology=None,
                          in_network=None, algorithms=None, nccl_tier=None):
    """Times of every algorithm and op on one tier, s (no base latency).

    Args:
        level: the :class:`~jaxmodel.types.NetLevel`.
        m: members of the group joined by this tier.
        n: buffer size at this tier, bytes (NCCL convention, see module docstring).
        spacing: distance between consecutive members in tier positions (ring/grid hops).
        sharers: devices of one lower-tier unit communicating at this tier at the same time
            (they share ``bw_per_node`` when it is set).
        ops: the ops to evaluate (static; fewer ops trace faster).
        topology: static topology name of the tier (``None``: read ``level.topology``);
            must equal ``level.topology`` (see :class:`NetVariant`).
        in_network: static in-network-reduction flag (``None``: read the level).
        algorithms: static indices into ``ALGORITHMS`` to evaluate (``None``: all); the
            others report ``+inf`` and not applicable.
        nccl_tier: static NCCL link class (``None``: read ``level.nccl_link``; −1 = not an
            NCCL tier).

    Returns:
        ``(times, applicable, ok)``: ``times[op]`` an array of shape ``(4, len(ALGORITHMS))``
        (+inf where not applicable): row 0 the executed time with the protocol NCCL's tuner
        picks for that algorithm, row 1 the executed time with the fastest protocol, row 2
        the tuner's own predicted time (+inf off NCCL tiers and for algorithms NCCL does not
        choose among), row 3 the index into ``nccl.PROTOCOLS`` of the tuner's protocol.
        Off NCCL tiers all algorithms use the Simple protocol (rows 0 = 1).
        ``applicable[op]`` the bool array over algorithms, ``ok`` False when the group
        shape does not fit a 2D tier. ``m = 1`` gives zero time for every algorithm.
    """
    f = jnp.result_type(float)
    if topology is None:
        t = level.topology
        is_ring, is_sw, is_fc = topo._is(t, topo.RING), topo._is(t, topo.SWITCH), topo._is(
            t, topo.FULLY_CONNECTED)
        is_mesh, is_torus = topo._is(t, topo.MESH2D), topo._is(t, topo.TORUS2D)
        is_grid = is_mesh | is_torus
    else:   # Python bools: the where/select below fold, unused branches are not traced
        is_ring, is_sw, is_fc, is_mesh, is_torus = (topology == name for name in TOPOLOGIES)
        is_grid = is_mesh or is_torus
    wanted = set(range(len(ALGORITHMS)) if algorithms is None else algorithms)

    per_dev = level.bw_per_device
    node_cap = safe_div(level.bw_per_node, jnp.maximum(sharers, 1.0), fill=jnp.inf)
    per_dev = jnp.where(level.bw_per_node > 0, jnp.minimum(per_dev, node_cap), per_dev)
    raw_B = per_dev * level.efficiency
    B = jnp.where(raw_B > 0, raw_B, 1.0)
    b = topo.link_bw(level, B)
    lat, d_r, cl = level.link_latency, level.switch_latency, level.chunk_latency
    sp = jnp.maximum(spacing, 1.0)
    m = jnp.maximum(jnp.asarray(m, dtype=f), 1.0)
    n = jnp.maximum(jnp.asarray(n, dtype=f), 0.0)
    one = jnp.ones_like(m)
    active = m > 1.5

    # ---- group shape: a 1 x m line on a ring, an r x c sub-grid on a 2D tier ----------------
    if is_grid is False:
        R, C, shape_ok, r, c = 1.0, level.size, jnp.asarray(True), one, m
    else:
        R, C, grid_ok = topo.level_grid(level)
        r_grid = topo.grid_rows(m, max_rows=R)
        c_grid = m / r_grid
        shape_ok = jnp.where(is_grid, grid_ok & (c_grid <= C + 1e-9), True)
        r = jnp.where(is_grid, r_grid, 1.0)
        c = jnp.where(is_grid, c_grid, m)
    closed_x = jnp.where(is_ring, jnp.abs(m * sp - level.size) < 0.5,
                         is_torus & (jnp.abs(c - C) < 0.5))
    closed_y = is_torus & (jnp.abs(r - R) < 0.5)
    hop = lat * sp                                    # latency between consecutive members
    sw_hop = 2.0 * lat + d_r                          # device -> switch -> device

    ovh_memo = {}

    def ovh(key):
        """Packet overhead factor of the per-step message: ``"u"`` = n/m, ``"half"`` = n/2,
        ``"2d"`` = n/(2c), ``"n"`` = the whole buffer (memoised: tracing cost)."""
        if key not in ovh_memo:
            msg = {"u": n / m, "half": n / 2.0, "2d": n / (2.0 * c), "n": n}[key]
            ovh_memo[key] = overhead_factor(level, msg)
        return ovh_memo[key]

    def sel(sw, fc, other):
        if is_sw is True:       # static switch tier: fold (fewer traced operations)
            return sw
        return jnp.where(is_sw, sw, jnp.where(is_fc, fc, other))

    # Each algorithm below is (latency, bandwidth time, sequential steps) of one phase. They
    # are built lazily so that tracing only pays for the ops requested.
    memo = {}

    def lazy(fn):
        def get():
            if fn.__name__ not in memo:
                memo[fn.__name__] = fn()
            return memo[fn.__name__]
        return get

    line_like = is_ring | (is_grid & (r < 1.5))
    ring_bw_1d = jnp.where(closed_x, 2.0 * b, b)
    ring_step_1d = jnp.where(closed_x, hop, hop * (m - 1.0))
    if is_sw is True:
        ring_bw, ring_step = B, sw_hop
    else:
        ring_bw = jnp.select([is_sw, is_fc, line_like], [B, (m - 1.0) * b, ring_bw_1d], 2.0 * b)
        ring_step = jnp.select([is_sw, is_fc, line_like], [sw_hop, lat, ring_step_1d], hop)
    u = n / m
    diam = jnp.where(closed_x, jnp.floor(c / 2.0), c - 1.0) + jnp.where(
        closed_y, jnp.floor(r / 2.0), r - 1.0)
    if is_sw is False or in_network is False:
        inr = False
    elif is_sw is True and in_network is True:
        inr = True
    else:
        inr = is_sw & (level.in_network_reduction > 0.5)
    depth = jnp.ceil(_log2(m) - 1e-9)
    tree_bw = B if is_sw is True else jnp.where(is_sw, B, b)

    @lazy
    def ring():
        # reduce-scatter (= all-gather)
        return ((m - 1.0) * ring_step, (m - 1.0) / m * n * ovh("u") / ring_bw, m - 1.0)

    @lazy
    def hd():
        # Rabenseifner; power-of-two core p' = 2^floor(log2 m), one extra step otherwise.
        # Rings/grids: dimension X (c members) then Y (r) on n / c; step k spans 2^k hops.
        p2 = 2.0 ** jnp.floor(_log2(m) + 1e-9)
        extra = jnp.where(m - p2 > 0.5, 1.0, 0.0)
        steps = jnp.floor(_log2(m) + 1e-9)
        o_hd = ovh("half")
        hd_lat = sel(steps * sw_hop, steps * lat, ((c - 1.0) + (r - 1.0)) * hop)
        hd_bwt = sel((p2 - 1.0) / p2 * n * o_hd / B, (p2 - 1.0) / p2 * n * o_hd / b,
                     (_log2(c) * n / 2.0 + _log2(r) * n / (2.0 * c)) * o_hd / b)
        hd_lat = hd_lat + extra * sel(sw_hop, lat, hop)
        hd_bwt = hd_bwt + extra * n / 2.0 * o_hd / jnp.where(is_sw, B, b)
        return (hd_lat, hd_bwt, steps + extra)

    @lazy
    def direct():
        # one step, n/m to each of the m-1 others; the busiest link sets the time
        x_load = _dim_load(c, closed_x) * r * u
        y_load = _dim_load(r, closed_y) * c * u
        return (sel(sw_hop, lat, diam * hop),
                sel((m - 1.0) * u * ovh("u") / B, u * ovh("u") / b,
                    jnp.maximum(x_load, y_load) * ovh("u") / b), one)

    @lazy
    def two_d():
        # Kumar & Jouppi: halves X-then-Y and Y-then-X, concurrently
        bw_x = jnp.where(closed_x, 2.0 * b, b)
        bw_y = jnp.where(closed_y, 2.0 * b, b)
        step_x = jnp.where(closed_x, 1.0, c - 1.0)
        step_y = jnp.where(closed_y, 1.0, r - 1.0)
        load_x = (c - 1.0) / c * (n / 2.0 + n / (2.0 * r))
        load_y = (r - 1.0) / r * (n / 2.0 + n / (2.0 * c))
        return (((c - 1.0) * step_x + (r - 1.0) * step_y) * hop,
                jnp.maximum(load_x / bw_x, load_y / bw_y) * ovh("2d"),
                (c - 1.0) + (r - 1.0))

    @lazy
    def inr_rs():
        # NVLS reduce-scatter / all-gather: one switch round trip
        return (sw_hop, (m - 1.0) / m * n * ovh("u") / B, one)

    @lazy
    def tree_hop():
        # double binary tree edge: one switch round trip, one link, or h_avg ring/grid hops
        if is_sw is True:
            return sw_hop
        h_avg = jnp.where(closed_x, c / 4.0, (c + 1.0) / 3.0) + jnp.where(
            r > 1.5, jnp.where(closed_y, r / 4.0, (r + 1.0) / 3.0), 0.0)
        return sel(sw_hop, lat, hop * jnp.maximum(h_avg, 1.0))

    def twice(x):
        return (2.0 * x[0], 2.0 * x[1], 2.0 * x[2])

    nothing = (0.0 * one, 0.0 * one, one)
    false_ = jnp.asarray(False)

    if nccl_tier is None:
        is_nccl, link = level.nccl_link > -0.5, level.nccl_link
    else:
        is_nccl, link = nccl_tier > -0.5, nccl_tier

    # NCCL's tuner sees its own bus bandwidth (``nccl_bw``: ring graph channels x bwIntra, no
    # packet overhead) where the level gives it; else the executed one. NCCL models the tree
    # and NVLS algorithms with their own graphs (``graphs[NCCL_ALGO_TREE]``,
    # ``graphs[NCCL_ALGO_NVLS]``: ``busBw = nChannels x bw``, tuning.cc
    # ``ncclTopoTuneModel``); on an NVSwitch tier they reach the same channels x bwIntra, so
    # the ring graph's bandwidth stands for all three (an approximation). The rescaling
    # ``bwt · B / B_t`` below assumes the algorithm's bandwidth time is at ``B`` (switch tiers:
    # ring, tree and in-network all run at ``B``), so ``nccl_bw`` applies on switch tiers only.
    has_tb = (level.nccl_bw > 0) & is_sw
    B_t = jnp.where(has_tb, level.nccl_bw, B)

    def protocols(name, op, part):
        """(executed at the tuner's protocol, executed at the fastest, tuner time) of one
        NCCL algorithm: NCCL's per-protocol latency and bandwidth factor
        (:mod:`jaxmodel.comm.nccl`) on this algorithm's bandwidth time; the per-chunk
        overhead ``chunk_latency`` applies to Simple only (LL/LL128 carry a flag per line).
        The tuner's time uses NCCL's bandwidth ``nccl_bw`` where set."""
        _, bwt, steps = (jnp.asarray(a, dtype=f) for a in part)
        lat_p = nccl.latency(name, op, m, link)
        f_p = nccl.bw_factor(name, op, link, level.nvls_efficiency)
        # the same bandwidth time at the tuner's bandwidth, without the packet overhead of
        # this (op, algorithm)'s message: the whole buffer for the tree and every broadcast
        # (``table``), n/m for the ring and in-network reduce-scatter / all-gather / all-reduce
        key = "n" if (name == "tree" or op == "broadcast") else "u"
        bwt_t = bwt * B / B_t / jnp.where(has_tb, ovh(key), 1.0)
        if name == "in_network":         # NVLS / CollNet: Simple only
            def nvls(x):
                if op != "all_reduce":
                    return x / f_p[2]
                # NVLS all-reduce (NVLink tiers) at NCCL's bandwidth, capped at the link's
                # (nccl.nvls_allreduce_factor); CollNet (network tiers) as above
                return jnp.where(link > 1.5, x / f_p[2],
                                 x * nccl.nvls_allreduce_factor(level.nvls_efficiency))

            # where the level gives NVLS its own executed bandwidth (nvls_bw > 0): the whole
            # buffer once each way at it (nccl.nvls_allreduce_time; bwt is the (m-1)/m · n / B
            # of this part) and its own per-chunk latency
            own = (level.nvls_bw > 0) & (link < 1.5) & (op == "all_reduce")
            t_nvls = (jnp.where(own, nccl.nvls_allreduce_time(
                bwt, m, B, jnp.where(own, level.nvls_bw, 1.0)), nvls(bwt))
                if op == "all_reduce" else nvls(bwt))
            exe = _pipelined(lat_p[2], t_nvls, steps, jnp.where(own, level.nvls_chunk_latency, cl))
            # the tuner keeps NCCL's own NVLS model (it chooses by it; executed at nvls_bw)
            return exe, exe, lat_p[2] + nvls(bwt_t), _SIMPLE + 0.0 * exe

        def proto_bwt(x, bw):
            """Per-protocol bandwidth time: NCCL's factors, LL's bus bandwidth capped at
            llMaxBw."""
            ll = jnp.where(level.ll_max_bw > 0,
                           x * bw / jnp.where(level.ll_max_bw > 0, level.ll_max_bw, 1.0), 0.0)
            return jnp.maximum(x / f_p, jnp.stack([ll, 0.0 * ll, 0.0 * ll]))

        bwt_p = proto_bwt(bwt, B)
        tune_p = proto_bwt(bwt_t, B_t)
        # executed LL128 at the level's measured fraction of Simple (tuner: NCCL's 0.92)
        ll128_x = jnp.stack([jnp.ones_like(cl),
                             nccl.ll128_executed(level.ll128_efficiency) + 0.0 * cl,
                             jnp.ones_like(cl)])
        cl_p = jnp.stack([0.0 * cl, 0.0 * cl, cl + 0.0 * one])
        bwt_x = bwt_p / ll128_x
        if name == "ring":
            # Simple: the channels' loads and stores bound the ring (executed time only)
            t_copy = nccl.copy_time(op, n, m, level.nccl_channels, level.channel_copy_bw)
            bwt_x = jnp.maximum(bwt_x, jnp.stack([0.0 * t_copy, 0.0 * t_copy, t_copy]))
        # small messages run on fewer channels (executed time only; NCCL's tuner ignores it)
        exe = _pipelined(lat_p, bwt_x
                         * nccl.channel_factor(name, n, m, level.nccl_channels), steps, cl_p)
        if op == "all_reduce" and name == "tree":     # tuner-only corrections (NCCL)
            tune = lat_p + tune_p / nccl.tree_correction(n)
        elif op == "all_reduce":
            tune = lat_p * nccl.ring_plateau(link) + tune_p
        else:
            tune = lat_p + tune_p
        k = jnp.argmin(tune)
        return exe[k], jnp.min(exe), tune[k], k.astype(f)

    def finish(algs, app, op):
        """``algs``: one thunk per algorithm returning (latency, bandwidth time, steps);
        only the wanted and possibly applicable ones are traced."""
        keep = [i for i in range(len(algs)) if i in wanted and app[i] is not False]
        app = [jnp.asarray(a) if i in keep else false_ for i, a in enumerate(app)]
        if keep:
            parts = [algs[i]() for i in keep]
            simple = _pipelined(*(jnp.stack([jnp.asarray(a[j], dtype=f) for a in parts])
                                  for j in range(3)), cl)
            x = jnp.stack([simple, simple, INF * jnp.ones_like(simple),
                           _SIMPLE * jnp.ones_like(simple)])
            if is_nccl is not False:
                cols = []
                for j, i in enumerate(keep):
                    if ALGORITHMS[i] in ("ring", "tree", "in_network"):
                        cols.append(jnp.stack(protocols(ALGORITHMS[i], op, parts[j])))
                    else:
                        cols.append(x[:, j])
                x = (jnp.stack(cols, axis=1) if is_nccl is True
                     else jnp.where(is_nccl, jnp.stack(cols, axis=1), x))
            mask = jnp.stack([app[i] for i in keep])
            x = jnp.where(mask, x, INF)
            x = jnp.where(active, x, jnp.where(mask, 0.0, INF))
        x_all = [INF * jnp.ones(4, dtype=f)] * len(algs)
        for j, i in enumerate(keep):
            x_all[i] = x[:, j]
        return jnp.stack(x_all, axis=1), jnp.stack(app)

    def table(op):
        if op in ("reduce_scatter", "all_gather"):
            return finish([ring, hd, direct, two_d, lambda: nothing, inr_rs],
                          [True, True, True, is_grid, False, inr], op)
        if op == "all_reduce":
            return finish([lambda: twice(ring()), lambda: twice(hd()), lambda: twice(direct()),
                           lambda: twice(two_d()),
                           lambda: (2.0 * depth * tree_hop(), 2.0 * n * ovh("n") / tree_bw,
                                    2.0 * depth),
                           lambda: (2.0 * sw_hop, (m - 1.0) / m * n * ovh("u") / B,
                                    2.0 * one)],
                          [True, True, True, is_grid, True, inr], op)
        if op == "all_to_all":
            t_d = _pipelined(*direct(), cl)
            t_d = jnp.where(active, t_d, 0.0)
            idx = jnp.arange(len(ALGORITHMS))
            row = jnp.where(idx == 2, t_d, INF)
            return (jnp.stack([row, row, INF * jnp.ones_like(row), _SIMPLE + 0.0 * row]),
                    idx == 2)
        if op == "broadcast":
            # pipelined chain (ring); scatter + all-gather (hd, direct, 2d)
            return finish([lambda: ((m - 1.0) * ring_step,
                                    n * ovh("n") / jnp.where(is_fc, b, ring_bw), m - 1.0),
                           lambda: twice(hd()), lambda: twice(direct()),
                           lambda: twice(two_d()),
                           lambda: (depth * tree_hop(), n * ovh("n") / tree_bw, depth),
                           lambda: (sw_hop, n * ovh("n") / B, one)],
                          [True, True, True, is_grid, True, inr], op)
        # p2p: every algorithm is the same single message
        t_p = _pipelined(sel(sw_hop, lat, hop), n * ovh("n") / jnp.where(is_sw, B, b), one, cl)
        t_p = jnp.where(active, t_p, 0.0)
        row = jnp.broadcast_to(t_p, (len(ALGORITHMS),))
        return (jnp.stack([row, row, INF * jnp.ones_like(row), _SIMPLE + 0.0 * row]),
                jnp.ones(len(ALGORITHMS), dtype=bool))

    out = {op: table(op) for op in ops}
    times = {k: v[0] for k, v in out.items()}
    apps = {k: v[1] for k, v in out.items()}
    return times, apps, shape_ok | ~active


def _choose(times, app, level, algorithm, static_topology=None, nccl_tier=None):
    """Pick one algorithm's time on a tier: auto, best (min) or a named one.

    ``times``: the ``(4, len(ALGORITHMS))`` array of :func:`level_algorithm_times`. ``auto``
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
        has = jnp.isfinite(jnp.min(tune))
        nccl_auto = exe[jnp.argmin(tune)]
        use = has if nccl_tier else has & (level.nccl_link > -0.5)
        auto = jnp.where(use, nccl_auto, auto)
    times = exe
    if isinstance(algorithm, str):
        code = ALGORITHM_CODES.index(algorithm)
        if code == 0:
            return auto, jnp.asarray(True)
        if code == 1:
            return jnp.min(fastest), jnp.asarray(True)
        i = code - 2
        return jnp.where(app[i], times[i], auto), app[i]
    code = jnp.clip(jnp.round(jnp.asarray(algorithm)), 0, len(ALGORITHM_CODES) - 1)
    i = jnp.clip(code - 2, 0, len(ALGORITHMS) - 1).astype(jnp.int32)
    named_ok = app[i]
    named = jnp.where(named_ok, times[i], auto)
    t = jnp.select([code < 0.5, code < 1.5], [auto, jnp.min(fastest)], named)
    used = jnp.where(code < 1.5, True, named_ok)
    return t, used


def _guo_auto(times, topology, static_topology=None):
    """Guo et al. §III-D's algorithm per topology (ring → ring, switch → Rabenseifner, fully
    connected → direct, 2D → 2D); the fastest where that one is not applicable."""
    if static_topology is not None:
        auto = times[ALGORITHMS.index(AUTO_ALGORITHM[static_topology])]
    else:
        auto_idx = jnp.asarray(_AUTO_INDEX)[jnp.clip(jnp.round(topology), 0, 4).astype(
            jnp.int32)]
        auto = times[auto_idx.astype(jnp.int32)]
    return jnp.where(jnp.isfinite(auto), auto, jnp.min(times))  # e.g. all-to-all: direct only


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
    return exe[jnp.argmin(tune)], jnp.min(exe)


def _flat_ring_override(system, n, members, inner, g, algorithm, net, total, f):
    """Replace the hierarchical all-gather / reduce-scatter time by NCCL's flat ring
    (:func:`_flat_ring`) when the group spans two or more tiers, all of them NCCL tiers:
    ``auto`` and ``ring`` run the ring, ``best`` the faster of the ring and the hierarchical
    composition; other named algorithms keep the composition."""
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
    ring_code = float(ALGORITHM_CODES.index("ring"))
    if isinstance(algorithm, str):
        code = float(ALGORITHM_CODES.index(algorithm))
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
                                                topology=st, in_network=net.inr(k),
                                                algorithms=algs, nccl_tier=nl)
        shape_ok = shape_ok & ok
        if op == "p2p" or (algs is not None and not any(
                ALGORITHMS[i] in ("ring", "tree", "in_network") for i in algs)):
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
        total = _flat_ring_override(system, n, members, inner, g, algorithm, net, total, f)

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
