"""The collective-algorithm registry: one function per algorithm, one registry line each.

Every algorithm of :mod:`jaxmodel.comm.collectives` is an :class:`AlgorithmSpec` in the ordered
:data:`ALGORITHM_REGISTRY`. Its public code (:func:`jaxmodel.comm.collectives.algorithm_code`)
is its position in the registry after ``auto`` = 0 and ``best`` = 1, so the built-in codes are
ring = 2, halving_doubling = 3, direct = 4, 2d = 5, tree = 6, in_network = 7 and a new algorithm
appended with :func:`register_algorithm` gets the next code. The formulas (sources in the
docstring of :mod:`jaxmodel.comm.collectives`) are written once per algorithm on a
:class:`Tier`, the per-tier quantities (bandwidths, hops, group shape) that every algorithm
reads:

- ``phase(tier, op)`` returns ``(latency s, bandwidth time s, sequential steps)`` of ``op``
  (``reduce_scatter`` / ``all_gather``, ``all_reduce`` or ``broadcast``) on one tier; the
  chunked pipeline :func:`pipelined` turns it into seconds (one Simple protocol), or
- where ``protocols`` is set (NCCL's ring, tree, NVLS/CollNet), NCCL's latency and bandwidth
  factors per protocol LL / LL128 / Simple (:mod:`jaxmodel.comm.nccl`) give the executed and
  the tuner's times, and NCCL's tuner (``auto`` on an NCCL tier) chooses among the algorithms
  listed for the op in ``nccl_ops``.

All-to-all (direct only) and point-to-point (one message, the same for every algorithm) are
not per-algorithm: :func:`level_algorithm_times` fills their rows itself.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp

from jaxmodel.comm import nccl
from jaxmodel.comm import topology as topo
from jaxmodel.comm.link import overhead_factor
from jaxmodel.numerics import INF, min_of, safe_div
from jaxmodel.types import TOPOLOGIES

__all__ = ["AlgorithmSpec", "ALGORITHM_REGISTRY", "register_algorithm", "algorithm_names",
           "algorithm_index", "Tier", "TierStatic", "pipelined", "level_algorithm_times", "OPS"]

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "p2p")
_INR_OPS = ("all_reduce", "reduce_scatter", "all_gather")
_SIMPLE = float(nccl.PROTOCOLS.index("simple"))
_GRIDS = ("mesh2d", "torus2d")


class AlgorithmSpec(NamedTuple):
    """One collective algorithm of one tier.

    Attributes:
        name: public name (lower case; its code is its registry position + 2).
        phase: ``phase(tier, op) -> (latency s, bandwidth time s, steps)`` for ``op`` in
            ``reduce_scatter``, ``all_gather``, ``all_reduce``, ``broadcast``; called only where
            ``applies`` is not the Python ``False``.
        applies: ``applies(tier, op) -> bool`` or a traced bool (a Python ``False`` keeps the
            algorithm out of the traced graph).
        static_ok: ``static_ok(op, topology, in_network) -> bool``: whether ``"best"`` must
            evaluate it on a tier of the static topology name (``in_network`` True, False or
            None when unknown).
        protocols: ``None`` (one Simple protocol) or NCCL's per-protocol model
            ``protocols(tier, op, phase) -> (executed at the tuner's protocol, fastest
            executed, tuner time, tuner protocol index)``.
        nccl_ops: the ops for which NCCL's tuner considers it (with ``protocols``).
        needs_in_network: NCCL considers it only where in-network reduction may be on.
        auto_for: topologies on which it is Guo et al.'s choice (``auto`` off NCCL tiers).
    """

    name: str
    phase: Callable
    applies: Callable
    static_ok: Callable
    protocols: Callable | None = None
    nccl_ops: tuple = ()
    needs_in_network: bool = False
    auto_for: tuple = ()


#: Ordered registry name -> :class:`AlgorithmSpec`; the order fixes the public codes.
ALGORITHM_REGISTRY: dict[str, AlgorithmSpec] = {}
_RESERVED = ("auto", "best", "hierarchical")


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Append ``spec`` to :data:`ALGORITHM_REGISTRY` (its code: the next free one).

    Raises:
        ValueError: a name already registered or reserved (``auto``, ``best``,
            ``hierarchical``), or a topology that another algorithm is already Guo et al.'s
            choice for.
    """
    if not isinstance(spec, AlgorithmSpec):
        raise ValueError(f"spec={spec!r} is not an AlgorithmSpec")
    if spec.name in ALGORITHM_REGISTRY or spec.name in _RESERVED or spec.name != spec.name.lower():
        raise ValueError(f"algorithm name={spec.name!r} is taken, reserved or not lower case")
    for t in spec.auto_for:
        if t not in TOPOLOGIES or any(t in s.auto_for for s in ALGORITHM_REGISTRY.values()):
            raise ValueError(f"auto_for={spec.auto_for!r}: {t!r} is unknown or already has an "
                             "auto algorithm")
    ALGORITHM_REGISTRY[spec.name] = spec
    return spec


def algorithm_names() -> tuple:
    """The registered algorithm names, in code order."""
    return tuple(ALGORITHM_REGISTRY)


def algorithm_index(name: str) -> int:
    """Position of ``name`` in the registry (its code minus 2)."""
    return algorithm_names().index(name)


def auto_algorithms() -> dict:
    """Guo et al.'s algorithm per topology name (``TOPOLOGIES`` order)."""
    return {t: s.name for t in TOPOLOGIES for s in ALGORITHM_REGISTRY.values()
            if t in s.auto_for}


def _log2(x):
    return jnp.log2(jnp.maximum(x, 1.0))


def _dim_load(c, closed):
    """Busiest-link load of an all-to-all along one dimension of ``c`` members, in units of
    one member-to-member message: ``c²/8`` on a bidirectional ring, ``⌊c/2⌋·⌈c/2⌉`` on a
    line."""
    return jnp.where(closed, c * c / 8.0, jnp.floor(c / 2.0) * jnp.ceil(c / 2.0))


def pipelined(lat, bwt, steps, chunk_latency):
    """``lat + bwt + S·c + 2·√(S·c·bwt)`` = ``lat + (√(S·c) + √bwt)²``, s.

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


class Tier:
    """What every algorithm reads of one tier joined by ``m`` members, buffer ``n`` bytes.

    Arguments as :func:`level_algorithm_times`. Attributes (s, bytes/s, bytes; arrays or, for
    static topologies, Python bools that fold the selects): topology flags ``is_ring``,
    ``is_sw``, ``is_fc``, ``is_grid``, ``is_torus``; ``B`` (per-device bandwidth × efficiency,
    capped by ``bw_per_node`` shared by ``sharers``), ``b`` (one link's), ``lat``, ``hop``
    (latency between consecutive members), ``sw_hop`` (device → switch → device), ``cl``
    (chunk latency), the group shape ``r × c`` with ``closed_x`` / ``closed_y`` (rings closing
    on a torus or ring), ``ring_bw`` / ``ring_step``, ``diam``, ``depth`` (⌈log2 m⌉),
    ``tree_bw``, ``inr`` (in-network reduction on), NCCL's ``is_nccl`` / ``link`` and its
    tuner bandwidth ``B_t`` (``nccl_bw`` on switch tiers, ``has_tb``).
    """

    def __init__(self, level, m, n, spacing=1.0, sharers=1.0, topology=None, in_network=None,
                 nccl_tier=None):
        f = self.f = jnp.result_type(float)
        self.level, self.memo_ = level, {}
        self._flags(level, topology)
        per_dev = level.bw_per_device
        node_cap = safe_div(level.bw_per_node, jnp.maximum(sharers, 1.0), fill=jnp.inf)
        per_dev = jnp.where(level.bw_per_node > 0, jnp.minimum(per_dev, node_cap), per_dev)
        raw_B = per_dev * level.efficiency
        B = self.B = jnp.where(raw_B > 0, raw_B, 1.0)
        b = self.b = topo.link_bw(level, B)
        lat = self.lat = level.link_latency
        d_r, self.cl = level.switch_latency, level.chunk_latency
        sp = jnp.maximum(spacing, 1.0)
        m = self.m = jnp.maximum(jnp.asarray(m, dtype=f), 1.0)
        self.n = jnp.maximum(jnp.asarray(n, dtype=f), 0.0)
        self.one = jnp.ones_like(m)
        self.active = m > 1.5
        self._shape(level, m, sp)
        is_sw, is_fc, closed_x = self.is_sw, self.is_fc, self.closed_x
        hop = self.hop = lat * sp                         # latency between consecutive members
        sw_hop = self.sw_hop = 2.0 * lat + d_r            # device -> switch -> device
        line_like = self.is_ring | (self.is_grid & (self.r < 1.5))
        ring_bw_1d = jnp.where(closed_x, 2.0 * b, b)
        ring_step_1d = jnp.where(closed_x, hop, hop * (m - 1.0))
        if is_sw is True:
            self.ring_bw, self.ring_step = B, sw_hop
        else:
            self.ring_bw = jnp.select([is_sw, is_fc, line_like], [B, (m - 1.0) * b, ring_bw_1d],
                                      2.0 * b)
            self.ring_step = jnp.select([is_sw, is_fc, line_like], [sw_hop, lat, ring_step_1d],
                                        hop)
        c, r = self.c, self.r
        self.diam = jnp.where(closed_x, jnp.floor(c / 2.0), c - 1.0) + jnp.where(
            self.closed_y, jnp.floor(r / 2.0), r - 1.0)
        if is_sw is False or in_network is False:
            self.inr = False
        elif is_sw is True and in_network is True:
            self.inr = True
        else:
            self.inr = is_sw & (level.in_network_reduction > 0.5)
        self.depth = jnp.ceil(_log2(m) - 1e-9)
        self.tree_bw = B if is_sw is True else jnp.where(is_sw, B, b)
        if nccl_tier is None:
            self.is_nccl, self.link = level.nccl_link > -0.5, level.nccl_link
        else:
            self.is_nccl, self.link = nccl_tier > -0.5, nccl_tier
        # NCCL's tuner sees its own bus bandwidth (``nccl_bw``: ring graph channels x bwIntra,
        # no packet overhead) where the level gives it; else the executed one. NCCL models the
        # tree and NVLS algorithms with their own graphs (``graphs[NCCL_ALGO_TREE]``,
        # ``graphs[NCCL_ALGO_NVLS]``: ``busBw = nChannels x bw``, tuning.cc
        # ``ncclTopoTuneModel``); on an NVSwitch tier they reach the same channels x bwIntra,
        # so the ring graph's bandwidth stands for all three (an approximation). The rescaling
        # ``bwt · B / B_t`` assumes the algorithm's bandwidth time is at ``B`` (switch tiers:
        # ring, tree and in-network all run at ``B``), so ``nccl_bw`` applies on switch tiers.
        self.has_tb = (level.nccl_bw > 0) & is_sw
        self.B_t = jnp.where(self.has_tb, level.nccl_bw, B)

    def _flags(self, level, topology):
        if topology is None:
            t = level.topology
            self.is_ring, self.is_sw = topo._is(t, topo.RING), topo._is(t, topo.SWITCH)
            self.is_fc = topo._is(t, topo.FULLY_CONNECTED)
            self.is_mesh, self.is_torus = topo._is(t, topo.MESH2D), topo._is(t, topo.TORUS2D)
            self.is_grid = self.is_mesh | self.is_torus
        else:   # Python bools: the where/select fold, unused branches are not traced
            (self.is_ring, self.is_sw, self.is_fc, self.is_mesh,
             self.is_torus) = (topology == name for name in TOPOLOGIES)
            self.is_grid = self.is_mesh or self.is_torus

    def _shape(self, level, m, sp):
        """The group's shape: a 1 x m line on a ring, an r x c sub-grid on a 2D tier."""
        is_grid = self.is_grid
        if is_grid is False:
            R, C, self.shape_ok, r, c = 1.0, level.size, jnp.asarray(True), self.one, m
        else:
            R, C, grid_ok = topo.level_grid(level)
            r_grid = topo.grid_rows(m, max_rows=R)
            c_grid = m / r_grid
            self.shape_ok = jnp.where(is_grid, grid_ok & (c_grid <= C + 1e-9), True)
            r = jnp.where(is_grid, r_grid, 1.0)
            c = jnp.where(is_grid, c_grid, m)
        self.r, self.c = r, c
        self.closed_x = jnp.where(self.is_ring, jnp.abs(m * sp - level.size) < 0.5,
                                  self.is_torus & (jnp.abs(c - C) < 0.5))
        self.closed_y = self.is_torus & (jnp.abs(r - R) < 0.5)

    def ovh(self, key):
        """Packet overhead factor of the per-step message: ``"u"`` = n/m, ``"half"`` = n/2,
        ``"2d"`` = n/(2c), ``"n"`` = the whole buffer (memoised: tracing cost)."""
        return self.memo("ovh/" + key, lambda t: overhead_factor(t.level, {
            "u": t.n / t.m, "half": t.n / 2.0, "2d": t.n / (2.0 * t.c), "n": t.n}[key]))

    def sel(self, sw, fc, other):
        """Switch / fully connected / ring-or-grid value (folds on a static switch tier)."""
        if self.is_sw is True:
            return sw
        return jnp.where(self.is_sw, sw, jnp.where(self.is_fc, fc, other))

    def memo(self, key, fn):
        """``fn(self)`` computed once per tier (tracing cost)."""
        if key not in self.memo_:
            self.memo_[key] = fn(self)
        return self.memo_[key]


def _twice(x):
    return (2.0 * x[0], 2.0 * x[1], 2.0 * x[2])


def _rs_or_twice(fn):
    """All-reduce (and broadcast: scatter + all-gather) as two reduce-scatter phases."""
    def phase(t, op):
        rs = t.memo(fn.__name__, fn)
        return rs if op in ("reduce_scatter", "all_gather") else _twice(rs)
    phase.__doc__ = fn.__doc__
    return phase


# ---- the algorithms: (latency, bandwidth time, sequential steps) of one phase --------------

def _ring_rs(t):
    """Ring reduce-scatter (= all-gather): ``m−1`` steps of ``n/m``."""
    return ((t.m - 1.0) * t.ring_step, (t.m - 1.0) / t.m * t.n * t.ovh("u") / t.ring_bw,
            t.m - 1.0)


def ring_phase(t, op):
    """Ring: reduce-scatter / all-gather, all-reduce = two of them, broadcast = a pipelined
    chain of ``m−1`` steps carrying the whole buffer."""
    if op == "broadcast":
        return ((t.m - 1.0) * t.ring_step,
                t.n * t.ovh("n") / jnp.where(t.is_fc, t.b, t.ring_bw), t.m - 1.0)
    rs = t.memo("ring", _ring_rs)
    return _twice(rs) if op == "all_reduce" else rs


def _hd_rs(t):
    """Rabenseifner; power-of-two core p' = 2^floor(log2 m), one extra step otherwise.
    Rings/grids: dimension X (c members) then Y (r) on n / c; step k spans 2^k hops."""
    m, n, c, r, B, b = t.m, t.n, t.c, t.r, t.B, t.b
    p2 = 2.0 ** jnp.floor(_log2(m) + 1e-9)
    extra = jnp.where(m - p2 > 0.5, 1.0, 0.0)
    steps = jnp.floor(_log2(m) + 1e-9)
    o_hd = t.ovh("half")
    hd_lat = t.sel(steps * t.sw_hop, steps * t.lat, ((c - 1.0) + (r - 1.0)) * t.hop)
    hd_bwt = t.sel((p2 - 1.0) / p2 * n * o_hd / B, (p2 - 1.0) / p2 * n * o_hd / b,
                   (_log2(c) * n / 2.0 + _log2(r) * n / (2.0 * c)) * o_hd / b)
    hd_lat = hd_lat + extra * t.sel(t.sw_hop, t.lat, t.hop)
    hd_bwt = hd_bwt + extra * n / 2.0 * o_hd / jnp.where(t.is_sw, B, b)
    return (hd_lat, hd_bwt, steps + extra)


def _direct_rs(t):
    """Direct: one step, n/m to each of the m−1 others; the busiest link sets the time."""
    u = t.n / t.m
    x_load = _dim_load(t.c, t.closed_x) * t.r * u
    y_load = _dim_load(t.r, t.closed_y) * t.c * u
    return (t.sel(t.sw_hop, t.lat, t.diam * t.hop),
            t.sel((t.m - 1.0) * u * t.ovh("u") / t.B, u * t.ovh("u") / t.b,
                  jnp.maximum(x_load, y_load) * t.ovh("u") / t.b), t.one)


def _two_d_rs(t):
    """Kumar & Jouppi: halves X-then-Y and Y-then-X, concurrently."""
    b, c, r, n = t.b, t.c, t.r, t.n
    bw_x = jnp.where(t.closed_x, 2.0 * b, b)
    bw_y = jnp.where(t.closed_y, 2.0 * b, b)
    step_x = jnp.where(t.closed_x, 1.0, c - 1.0)
    step_y = jnp.where(t.closed_y, 1.0, r - 1.0)
    load_x = (c - 1.0) / c * (n / 2.0 + n / (2.0 * r))
    load_y = (r - 1.0) / r * (n / 2.0 + n / (2.0 * c))
    return (((c - 1.0) * step_x + (r - 1.0) * step_y) * t.hop,
            jnp.maximum(load_x / bw_x, load_y / bw_y) * t.ovh("2d"),
            (c - 1.0) + (r - 1.0))


def _tree_hop(t):
    """Double binary tree edge: one switch round trip, one link, or h_avg ring/grid hops."""
    if t.is_sw is True:
        return t.sw_hop
    c, r = t.c, t.r
    h_avg = jnp.where(t.closed_x, c / 4.0, (c + 1.0) / 3.0) + jnp.where(
        r > 1.5, jnp.where(t.closed_y, r / 4.0, (r + 1.0) / 3.0), 0.0)
    return t.sel(t.sw_hop, t.lat, t.hop * jnp.maximum(h_avg, 1.0))


def tree_phase(t, op):
    """Double binary tree: all-reduce ``2·depth`` hops sending ``2n``; broadcast ``depth``
    hops sending ``n`` (all-reduce and broadcast only)."""
    hop = t.memo("tree_hop", _tree_hop)
    if op == "all_reduce":
        return (2.0 * t.depth * hop, 2.0 * t.n * t.ovh("n") / t.tree_bw, 2.0 * t.depth)
    return (t.depth * hop, t.n * t.ovh("n") / t.tree_bw, t.depth)


def in_network_phase(t, op):
    """In-network reduction (NVLS / SHARP): one switch round trip, ``(m−1)/m · n`` each way
    (all-reduce: two steps); broadcast: the switch multicasts the whole buffer."""
    if op == "all_reduce":
        return (2.0 * t.sw_hop, (t.m - 1.0) / t.m * t.n * t.ovh("u") / t.B, 2.0 * t.one)
    if op == "broadcast":
        return (t.sw_hop, t.n * t.ovh("n") / t.B, t.one)
    return t.memo("inr_rs", lambda t: (t.sw_hop, (t.m - 1.0) / t.m * t.n * t.ovh("u") / t.B,
                                       t.one))


# ---- NCCL's protocols (LL / LL128 / Simple) of its ring and tree, and NVLS / CollNet -------

def ring_tree_protocols(name):
    """NCCL's per-protocol model of its ring (``name = "ring"``) or tree.

    ``(executed at the tuner's protocol, executed at the fastest, tuner time, tuner protocol)``
    of one NCCL algorithm: NCCL's per-protocol latency and bandwidth factor
    (:mod:`jaxmodel.comm.nccl`, NCCL 2.30.7 ``src/graph/tuning.cc``) on this algorithm's
    bandwidth time; the per-chunk overhead ``chunk_latency`` applies to Simple only (LL/LL128
    carry a flag per line). The tuner's time uses NCCL's bandwidth ``nccl_bw`` where set."""
    def protocols(t, op, part):
        f, level, m, cl = t.f, t.level, t.m, t.cl
        _, bwt, steps = (jnp.asarray(a, dtype=f) for a in part)
        lat_p = nccl.latency(name, op, m, t.link)
        f_p = nccl.bw_factor(name, op, t.link, level.nvls_efficiency)
        # the same bandwidth time at the tuner's bandwidth, without the packet overhead of
        # this (op, algorithm)'s message: the whole buffer for the tree and every broadcast,
        # n/m for the ring's reduce-scatter / all-gather / all-reduce
        key = "n" if (name == "tree" or op == "broadcast") else "u"
        bwt_t = bwt * t.B / t.B_t / jnp.where(t.has_tb, t.ovh(key), 1.0)

        def proto_bwt(x, bw):
            """Per-protocol bandwidth time: NCCL's factors, LL's bus bandwidth capped at
            llMaxBw."""
            ll = jnp.where(level.ll_max_bw > 0,
                           x * bw / jnp.where(level.ll_max_bw > 0, level.ll_max_bw, 1.0), 0.0)
            return jnp.maximum(x / f_p, jnp.stack([ll, 0.0 * ll, 0.0 * ll]))

        bwt_p = proto_bwt(bwt, t.B)
        tune_p = proto_bwt(bwt_t, t.B_t)
        # executed LL128 at the level's measured fraction of Simple (tuner: NCCL's 0.92)
        ll128_x = jnp.stack([jnp.ones_like(cl),
                             nccl.ll128_executed(level.ll128_efficiency) + 0.0 * cl,
                             jnp.ones_like(cl)])
        cl_p = jnp.stack([0.0 * cl, 0.0 * cl, cl + 0.0 * t.one])
        bwt_x = bwt_p / ll128_x
        if name == "ring":
            # Simple: the channels' loads and stores bound the ring (executed time only)
            t_copy = nccl.copy_time(op, t.n, m, level.nccl_channels, level.channel_copy_bw)
            bwt_x = jnp.maximum(bwt_x, jnp.stack([0.0 * t_copy, 0.0 * t_copy, t_copy]))
        # small messages run on fewer channels (executed time only; NCCL's tuner ignores it)
        exe = pipelined(lat_p, bwt_x * nccl.channel_factor(name, t.n, m, level.nccl_channels),
                        steps, cl_p)
        if op == "all_reduce" and name == "tree":     # tuner-only corrections (NCCL)
            tune = lat_p + tune_p / nccl.tree_correction(t.n)
        elif op == "all_reduce":
            tune = lat_p * nccl.ring_plateau(t.link) + tune_p
        else:
            tune = lat_p + tune_p
        k = jnp.argmin(tune)
        return exe[k], min_of(exe), tune[k], k.astype(f)

    return protocols


def in_network_protocols(t, op, part):
    """NCCL's NVLS (NVLink tiers) or CollNet (network tiers): Simple only.

    All-reduce on an NVLink tier at NCCL's bandwidth, capped at the link's
    (:func:`jaxmodel.comm.nccl.nvls_allreduce_factor`); where the level gives NVLS its own
    executed bandwidth (``nvls_bw > 0``) the whole buffer once each way at it
    (:func:`jaxmodel.comm.nccl.nvls_allreduce_time`) with its own per-chunk latency. The
    tuner keeps NCCL's own NVLS model (it chooses by it), with the NVLS latency of the
    system's NCCL release (``nccl_nvls_latency``, :func:`jaxmodel.comm.nccl.nvls_tuner_latency`:
    NCCL 2.18 modelled none, so it ran NVLS at every size).

    CollNet (SHARP on the InfiniBand switches, a network tier with ``in_network_reduction``):
    each GPU sends its share up once and receives the result once (the ``(m−1)/m · n`` of
    :func:`in_network_phase`), at NCCL 2.30.7's CollNetDirect bus bandwidth factor, the
    level's ``nvls_efficiency`` there (``src/graph/tuning.cc``, ``ncclTopoTuneModel``: busBw ×
    0.85 where the minimum compute capability is ≥ 9.0, divided by ``1 + (r − 1)/2`` for
    ``r`` GPUs per NIC; 1 = the default, no factor), and NCCL's CollNetDirect network latency
    ``hwLat[NET][COLLNET_DIRECT][SIMPLE]`` = 31 µs (:func:`jaxmodel.comm.nccl.latency`). NVIDIA
    SHARP (Scalable Hierarchical Aggregation and Reduction Protocol) documentation: the
    switches reduce the streams of their ports and multicast the result back, so the data
    crosses each link once per direction instead of the ring's ``2(m−1)/m`` times."""
    f, level, link = t.f, t.level, t.link
    _, bwt, steps = (jnp.asarray(a, dtype=f) for a in part)
    lat_p = nccl.latency("in_network", op, t.m, link)
    f_p = nccl.bw_factor("in_network", op, link, level.nvls_efficiency)
    # CollNet on a network tier: the level's factor (NCCL's 0.85 on sm90+ where set)
    f_p = f_p * jnp.where(link > 1.5, level.nvls_efficiency, 1.0)
    bwt_t = bwt * t.B / t.B_t / jnp.where(t.has_tb, t.ovh("n" if op == "broadcast" else "u"),
                                          1.0)

    def nvls(x):
        if op != "all_reduce":
            return x / f_p[2]
        return jnp.where(link > 1.5, x / f_p[2],
                         x * nccl.nvls_allreduce_factor(level.nvls_efficiency))

    own = (level.nvls_bw > 0) & (link < 1.5) & (op == "all_reduce")
    t_nvls = (jnp.where(own, nccl.nvls_allreduce_time(
        bwt, t.m, t.B, jnp.where(own, level.nvls_bw, 1.0)), nvls(bwt))
        if op == "all_reduce" else nvls(bwt))
    exe = pipelined(lat_p[2], t_nvls, steps, jnp.where(own, level.nvls_chunk_latency, t.cl))
    # the tuner's NVLS latency is that of the system's NCCL release (nccl_nvls_latency)
    return (exe, exe, nccl.nvls_tuner_latency(link, level.nccl_nvls_latency) + nvls(bwt_t),
            jnp.full_like(exe, _SIMPLE))


# ---- the registry (order = public codes; append new algorithms at the end) -----------------

def _always(t, op):
    return True


def _everywhere(op, topology, inr):
    return True


register_algorithm(AlgorithmSpec(
    "ring", ring_phase, _always, _everywhere, protocols=ring_tree_protocols("ring"),
    nccl_ops=("all_reduce", "reduce_scatter", "all_gather", "broadcast"), auto_for=("ring",)))
register_algorithm(AlgorithmSpec(
    "halving_doubling", _rs_or_twice(_hd_rs), _always, _everywhere, auto_for=("switch",)))
register_algorithm(AlgorithmSpec(
    "direct", _rs_or_twice(_direct_rs), _always, _everywhere, auto_for=("fully_connected",)))
register_algorithm(AlgorithmSpec(
    "2d", _rs_or_twice(_two_d_rs), lambda t, op: t.is_grid,
    lambda op, topology, inr: topology in _GRIDS, auto_for=_GRIDS))
register_algorithm(AlgorithmSpec(
    "tree", tree_phase, lambda t, op: op in ("all_reduce", "broadcast"),
    lambda op, topology, inr: op in ("all_reduce", "broadcast"),
    protocols=ring_tree_protocols("tree"), nccl_ops=("all_reduce",)))
register_algorithm(AlgorithmSpec(
    "in_network", in_network_phase, lambda t, op: t.inr,
    lambda op, topology, inr: topology == "switch" and inr is not False,
    protocols=in_network_protocols, nccl_ops=_INR_OPS, needs_in_network=True))


# ---- one tier's table --------------------------------------------------------------------

def _table(t, op, wanted):
    """``(times (4, A), applicable (A,))`` of ``op`` (reduce-scatter, all-gather, all-reduce,
    broadcast) over the ``A`` registered algorithms; only the wanted and possibly applicable
    ones are traced, the others are +inf and not applicable."""
    f, specs = t.f, list(ALGORITHM_REGISTRY.values())
    false_ = jnp.asarray(False)
    app = [s.applies(t, op) for s in specs]
    keep = [i for i in range(len(specs)) if i in wanted and app[i] is not False]
    app = [jnp.asarray(a) if i in keep else false_ for i, a in enumerate(app)]
    if keep:
        parts = [specs[i].phase(t, op) for i in keep]
        simple = pipelined(*(jnp.stack([jnp.asarray(a[j], dtype=f) for a in parts])
                             for j in range(3)), t.cl)
        x = jnp.stack([simple, simple, INF * jnp.ones_like(simple),
                       _SIMPLE * jnp.ones_like(simple)])
        if t.is_nccl is not False:
            cols = [jnp.stack(specs[i].protocols(t, op, parts[j]))
                    if specs[i].protocols is not None else x[:, j] for j, i in enumerate(keep)]
            x = (jnp.stack(cols, axis=1) if t.is_nccl is True
                 else jnp.where(t.is_nccl, jnp.stack(cols, axis=1), x))
        mask = jnp.stack([app[i] for i in keep])
        x = jnp.where(mask, x, INF)
        x = jnp.where(t.active, x, jnp.where(mask, 0.0, INF))
    x_all = [INF * jnp.ones(4, dtype=f)] * len(specs)
    for j, i in enumerate(keep):
        x_all[i] = x[:, j]
    return jnp.stack(x_all, axis=1), jnp.stack(app)


def _all_to_all_table(t):
    """All-to-all: the direct algorithm only (every member sends n/m to every other)."""
    d = algorithm_index("direct")
    t_d = pipelined(*t.memo("_direct_rs", _direct_rs), t.cl)
    t_d = jnp.where(t.active, t_d, 0.0)
    idx = jnp.arange(len(ALGORITHM_REGISTRY))
    row = jnp.where(idx == d, t_d, INF)
    return (jnp.stack([row, row, INF * jnp.ones_like(row), jnp.full_like(row, _SIMPLE)]), idx == d)


def _p2p_table(t):
    """Point-to-point: every algorithm is the same single message."""
    t_p = pipelined(t.sel(t.sw_hop, t.lat, t.hop), t.n * t.ovh("n") / jnp.where(t.is_sw, t.B, t.b),
                    t.one, t.cl)
    t_p = jnp.where(t.active, t_p, 0.0)
    row = jnp.broadcast_to(t_p, (len(ALGORITHM_REGISTRY),))
    return (jnp.stack([row, row, INF * jnp.ones_like(row), jnp.full_like(row, _SIMPLE)]),
            jnp.ones(len(ALGORITHM_REGISTRY), dtype=bool))


class TierStatic(NamedTuple):
    """Static facts of one tier, known in Python at the API edge (``None``: read the traced
    ``level``); one tier's entries of :class:`jaxmodel.comm.collectives.NetVariant`. They only
    prune the traced graph (fewer topology selects and algorithms), never change a result.

    Attributes:
        topology: topology name of the tier (``types.TOPOLOGIES``); must equal
            ``level.topology``.
        in_network: in-network-reduction flag (bool) of the tier.
        nccl_tier: NCCL link class as ``NetLevel.nccl_link`` codes it (−1 = not an NCCL tier,
            0 NVLink, 1 PCI, 2 network).
    """

    topology: str | None = None
    in_network: bool | None = None
    nccl_tier: float | None = None


def level_algorithm_times(level, m, n, spacing=1.0, sharers=1.0, ops=OPS,
                          static: TierStatic = TierStatic(), algorithms=None):
    """Times of every registered algorithm and op on one tier, s (no base latency).

    Args:
        level: the :class:`~jaxmodel.types.NetLevel`.
        m: members of the group joined by this tier.
        n: buffer size at this tier, bytes (NCCL convention, see
            :mod:`jaxmodel.comm.collectives`).
        spacing: distance between consecutive members in tier positions (ring/grid hops).
        sharers: devices of one lower-tier unit communicating at this tier at the same time
            (they share ``bw_per_node`` when it is set).
        ops: the ops to evaluate (static; fewer ops trace faster).
        static: the tier's :class:`TierStatic` — ``topology`` name (``None``: read
            ``level.topology``; must equal it, see
            :class:`jaxmodel.comm.collectives.NetVariant`), ``in_network`` flag (``None``:
            read the level) and ``nccl_tier`` link class (``None``: read
            ``level.nccl_link``; −1 = not an NCCL tier).
        algorithms: static registry indices to evaluate (``None``: all); the others report
            ``+inf`` and not applicable.

    Returns:
        ``(times, applicable, ok)``: ``times[op]`` an array of shape ``(4, A)`` over the ``A``
        registered algorithms (+inf where not applicable): row 0 the executed time with the
        protocol NCCL's tuner picks for that algorithm, row 1 the executed time with the
        fastest protocol, row 2 the tuner's own predicted time (+inf off NCCL tiers and for
        algorithms NCCL does not choose among), row 3 the index into ``nccl.PROTOCOLS`` of
        the tuner's protocol. Off NCCL tiers all algorithms use the Simple protocol (rows 0 =
        1). ``applicable[op]`` the bool array over algorithms, ``ok`` False when the group
        shape does not fit a 2D tier. ``m = 1`` gives zero time for every algorithm.
    """
    t = Tier(level, m, n, spacing, sharers, *static)
    wanted = set(range(len(ALGORITHM_REGISTRY)) if algorithms is None else algorithms)
    out = {}
    for op in ops:
        if op == "all_to_all":
            out[op] = _all_to_all_table(t)
        elif op == "p2p":
            out[op] = _p2p_table(t)
        else:
            out[op] = _table(t, op, wanted)
    times = {k: v[0] for k, v in out.items()}
    apps = {k: v[1] for k, v in out.items()}
    return times, apps, t.shape_ok | ~t.active
