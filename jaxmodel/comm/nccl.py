"""NCCL's tuning model: protocols, per-protocol latencies and bandwidth factors.

Source: NVIDIA NCCL 2.30.7, ``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``,
``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``) and ``src/graph/topo.h`` (NVLink bandwidth per
link). The numbers below are NCCL's published defaults (facts), not calibrated here.

NCCL predicts the time of a collective with algorithm ``a`` and protocol ``p`` as
``lat(a, p) + nbytes / bw(a, p)`` and runs the minimum (``getAlgoInfo``). Protocols:

=========  =====================================================================================
``ll``     Low-Latency: 8-byte stores carrying 4 data bytes + a 4-byte flag; no fences, so the
           per-step latency is smallest; half the link bandwidth (ring: ``busBw·0.5``, capped at
           ``llMaxBw``; tree: ``busBw/3.8``).
``ll128``  128-byte lines with 120 data bytes + flag (ring ``·0.92``; single-node tree ``·7/9``).
``simple`` bulk copies with a memory fence and flag per chunk; full bandwidth, highest per-step
           latency (the per-chunk synchronisation is the ``chunk_latency`` of the executed-time
           model in :mod:`jaxmodel.comm.collectives`).
=========  =====================================================================================

Latency (µs in NCCL, seconds here) per algorithm on one tier of ``m`` ranks:

- ring:  ``baseLat[ring][p] + steps · hwLat[link][ring][p]``, ``steps = 2(m−1)`` for all-reduce,
  ``m−1`` for reduce-scatter / all-gather / broadcast;
- tree (all-reduce): ``baseLat[tree][p] + 2 · hops · hwLat[link][tree][p]`` with ``hops = m−1``
  inside a node (NCCL's intra-node tree is a chain) and ``log2 m`` across nodes;
- NVLS / CollNet (in-network reduction, Simple only): ``hwLat[link][nvls][simple]`` (NVLink
  SHARP) or ``hwLat[net][collnet_direct][simple]`` (SHARP on the network switches); NVLS's
  all-reduce bandwidth is the link's (:func:`nvls_allreduce_factor`). The tuner's NVLS
  latency changed between releases (0 in 2.17–2.18, 23 µs in 2.19–2.20, 25 µs since 2.21,
  :data:`NVLS_TUNER_LATENCY`); a level running an older release sets ``nccl_nvls_latency``
  (:func:`nvls_tuner_latency`). Other differences of older tuners (ring LL bus bandwidth
  ×1/4 for all-reduce before 2.21, the NVLS bus-to-algorithm ratio 5/6 before 2.28) are not
  modelled.

The tuner (not the executed time) also scales the tree all-reduce bandwidth by
``treeCorrectionFactor[p][log2(n/64)]`` and the Simple ring all-reduce latency across nodes by
1.4 (``ncclTopoGetAlgoTime``): :func:`tree_correction`, :func:`ring_plateau`.

Channels (``enqueue.cc`` ``topoGetAlgoInfo``): NCCL's model gives a ring or tree
``nChannels × bw`` of bus bandwidth (``tuning.cc``: ``busBw = graphs[a]->nChannels * bw``),
but a small message runs on fewer channels: ``nc`` drops while ``nBytes < nc · nt ·
threshold`` (``nt`` threads per channel: LL 512, LL128 640, Simple 512, ``src/include/device.h``;
``threshold`` bytes per thread: LL 8 (× ranks on a ring), LL128 8, Simple 64,
``NCCL_*_THREAD_THRESHOLD`` and ``ncclTopoTuneModel``). The executed bandwidth is then
``nc / nChannels`` of the tuner's (:func:`channel_factor`); the tuner itself does not see it.
NVLS and CollNet keep their channels.

Memory traffic (executed time only): every byte of a Simple ring passes through the thread
block of its channel, ``copy_bytes`` loads and stores per buffer byte (``all_reduce.h``
``runRing``), so a ring is also bound by ``copy_bytes · n / (nc · channel_copy_bw)``
(:func:`copy_time`; ``channel_copy_bw`` a calibration constant of the level). Small rings move
more memory per link byte (4 at 2 ranks, 3.14 at 8), which is why a 2-GPU ring on NVSwitch
reaches a lower bus bandwidth than an 8-GPU one. NCCL's tuner chooses with its own bus
bandwidth (``NetLevel.nccl_bw``: graph channels × ``bwIntra``), not the executed one.

Link classes (``NetLevel.nccl_link``): 0 = NVLink, 1 = PCIe, 2 = network (NCCL's ``NCCL_HW_*``).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.numerics import smooth_ceil_div

__all__ = ["PROTOCOLS", "LL128_FACTOR", "NVLINK", "PCI", "NET", "BASE_LAT", "HW_LAT", "latency",
           "bw_factor",
           "NVLINK_BW_PER_LINK", "TREE_CORRECTION", "tree_correction", "ring_plateau",
           "channel_factor", "nvls_allreduce_factor", "nvls_allreduce_time", "copy_bytes",
           "copy_time", "NVLS_TUNER_LATENCY", "nvls_tuner_latency"]

PROTOCOLS = ("ll", "ll128", "simple")
NVLINK, PCI, NET = 0.0, 1.0, 2.0
_US = 1e-6

# ncclTunerConstantsDefaults.baseLatencies (µs), per algorithm, protocols (LL, LL128, Simple).
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet": (0.0, 0.0, 0.0),
            "nvls": (0.0, 0.0, 0.0)}
# ncclTunerConstantsDefaults.hwLatencies (µs) [link class][algorithm][protocol]; "collnet" is
# CollNetDirect; 0 where NCCL defines no value (protocol not supported by the algorithm).
HW_LAT = {
    "ring": ((0.6, 1.9, 3.4), (1.0, 2.5, 5.7), (2.7, 4.0, 14.0)),
    "tree": ((0.6, 1.25, 4.0), (1.0, 1.9, 4.0), (5.0, 8.5, 14.0)),
    "collnet": ((0.0, 0.0, 3.7), (0.0, 0.0, 3.7), (0.0, 0.0, 31.0)),
    "nvls": ((0.0, 0.0, 25.0), (0.0, 0.0, 0.0), (0.0, 0.0, 18.0)),
}
# hwLat[NVLINK][NVLS][SIMPLE] (s) by NCCL release, src/graph/tuning.cc: 0 in 2.17.1 and
# 2.18.1-2.18.5 (NVLS then modelled without latency, so the tuner ran NVLS at every size it
# was enabled for), 23 us in 2.19.1-2.20.5, 25 us from 2.21.5 (through 2.30.7, HW_LAT above).
NVLS_TUNER_LATENCY = {"2.17-2.18": 0.0, "2.19-2.20": 23e-6, "2.21-2.30": 25e-6}
# tuning.cc ncclTopoTuneModel: LL128 bus bandwidth = 0.92 (~120/128) of Simple's (ring; tree
# inside a node 0.92 · 7/9). A NetLevel's ``ll128_efficiency`` replaces it in executed times.
LL128_FACTOR = 0.92
# tuning.cc ncclTopoTuneModel: tree bus bandwidth ×0.92 (a separate refinement that happens
# to share LL128's value).
TREE_FACTOR = 0.92
# Floor on a level's ``ll128_efficiency`` where it divides a time (a 0 in a batch would give
# inf and NaN gradients).
MIN_LL128_EFFICIENCY = 1e-3


def ll128_executed(ll128_efficiency):
    """Executed LL128 bandwidth relative to NCCL's tuner value: ``ll128_efficiency / 0.92``,
    the efficiency floored at :data:`MIN_LL128_EFFICIENCY` (dimensionless)."""
    return jnp.maximum(ll128_efficiency, MIN_LL128_EFFICIENCY) / LL128_FACTOR
# device.h: threads per channel (NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS,
# NCCL_SIMPLE_MAX_NTHREADS) and bytes per thread before another channel is used
# (NCCL_LL_THREAD_THRESHOLD, NCCL_LL128_THREAD_THRESHOLD, NCCL_SIMPLE_THREAD_THRESHOLD), per
# protocol (LL, LL128, Simple).
THREADS = (512.0, 640.0, 512.0)
THREAD_THRESHOLD = (8.0, 8.0, 64.0)
# topo.h: NCCL's NVLink bandwidth per link, GB/s (SM80 20.0, SM90 20.6, SM100 40.1); for
# reference in the provenance of hw_db ``efficiency`` values.
NVLINK_BW_PER_LINK = {"a100": 20.0e9, "h100": 20.6e9, "b200": 40.1e9}


# ncclTopoGetAlgoTime: tree all-reduce bandwidth x treeCorrectionFactor[protocol][log2(n/64)]
# for log2(n/64) in 0..22 (the tuner's estimate only).
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9,
     .9),
)


def tree_correction(n):
    """NCCL's tuner factor on the tree all-reduce bandwidth per protocol for ``n`` bytes
    (``treeCorrectionFactor``; 1 outside the table), shape (3,)."""
    f = jnp.result_type(float)
    idx = jnp.floor(jnp.log2(jnp.maximum(n / 64.0, 1.0)) + 1e-9)
    inside = (n >= 64.0) & (idx < len(TREE_CORRECTION[0]))
    i = jnp.clip(idx, 0, len(TREE_CORRECTION[0]) - 1).astype(jnp.int32)
    return jnp.where(inside, jnp.asarray(TREE_CORRECTION, dtype=f)[:, i], 1.0)


def ring_plateau(link):
    """NCCL's tuner factor on the Simple ring all-reduce latency across nodes (``1.4`` from
    compute capability 8.0 on, "plateau effect of ring"; NCCL applies it from 64 B per channel
    and rank, here to every size), per protocol, shape (3,)."""
    f = jnp.result_type(float)
    simple = _where(link > 1.5, 1.4, 1.0)
    return jnp.stack([jnp.ones((), f), jnp.ones((), f), jnp.asarray(simple, dtype=f)])


def nvls_allreduce_factor(nvls_efficiency):
    """NVLS all-reduce time on an NVLink tier over its ``(m−1)/m · n / B`` traffic time.

    ``ncclTopoTuneModel`` (``tuning.cc``): ``intraBw = bwIntra · nvlsEfficiency ·
    (nCh−1)/nCh``, doubled for all-reduce ("AllReduce pipelines two operations"), then
    ``bw = min(intraBw, interBw)`` with ``interBw = bwInter = bwIntra`` inside one node, and the
    bus bandwidth converted to algorithm bandwidth by ``nRanks / nsteps = m / (2(m−1))``: NCCL
    models ``2(m−1)/m · n / (B · min(2 · eff, 1))`` (``(nCh−1)/nCh`` → 1), a ring's bandwidth
    time whenever ``eff ≥ 0.5``. The executed time uses the same where the level gives NVLS
    no bandwidth of its own (``nvls_bw = 0``; else :func:`nvls_allreduce_time`). Returns
    ``2 / min(2 · eff, 1)``.
    """
    f = jnp.result_type(float)
    eff = jnp.asarray(nvls_efficiency, dtype=f)
    return 2.0 / jnp.clip(2.0 * eff, 1e-9, 1.0)


def nvls_allreduce_time(ring_bwt, m, bw, nvls_bw):
    """Bandwidth time of NCCL's NVLS all-reduce at its own executed bandwidth, s.

    NCCL ``src/device/all_reduce.h`` (``runRing``'s NVLS sibling, ``ncclFunction`` NVLS,
    2.18+): the scatter/reduce warps issue ``multimem.ld_reduce`` on the multicast address,
    which makes the NVSwitch read the rank's ``n/m`` shard from all ``m`` GPUs and return
    the sum, and ``multimem.st`` writes the result, which the switch replicates to every
    GPU. Each GPU's link therefore carries the whole buffer ``n`` once in each direction
    (its ``m`` shards read, ``m`` shards written), against ``2(m−1)/m · n`` for the ring: the
    bus bandwidth ``2(m−1)/m · n / t`` can exceed the link's. ``nvls_bw`` (bytes/s per GPU,
    level constant, fitted on nccl-tests) is what the multimem kernels sustain.

    Args:
        ring_bwt: the part's traffic time ``(m−1)/m · n / bw``, s (with the packet overhead
            of the message), as :func:`nvls_allreduce_factor` takes it.
        m: group size; bw: the bandwidth ``ring_bwt`` was computed at, bytes/s.
    Returns ``n / nvls_bw`` (with the same packet overhead), s.
    """
    f = jnp.result_type(float)
    m = jnp.asarray(m, dtype=f)
    return ring_bwt * m / jnp.maximum(m - 1.0, 1.0) * bw / nvls_bw


def channel_factor(alg: str, n, m, channels):
    """``nChannels / nc``: how much slower than NCCL's modelled bus bandwidth a ring or tree
    runs ``n`` bytes on ``m`` ranks, per protocol, shape (3,) (``enqueue.cc``
    ``topoGetAlgoInfo``; see the module docstring).

    ``nc = clip(⌊n / (nt · threshold)⌋, 1, nChannels)``, the ring's LL threshold multiplied by
    ``m``. ``channels = 0`` (not set) gives 1. The floor has the value of NCCL's integer
    division and the gradient of the ratio (:func:`jaxmodel.numerics.smooth_ceil_div`).
    """
    f = jnp.result_type(float)
    thr = jnp.asarray(THREAD_THRESHOLD, dtype=f)
    if alg == "ring":
        thr = thr * jnp.stack([jnp.asarray(m, dtype=f), jnp.ones((), f), jnp.ones((), f)])
    per_channel = jnp.asarray(THREADS, dtype=f) * thr                 # bytes per channel
    c = jnp.asarray(channels, dtype=f)
    has = c > 0.5
    c_safe = jnp.where(has, c, 1.0)
    ratio = jnp.asarray(n, dtype=f) / per_channel
    nc = -smooth_ceil_div(-ratio, 1.0)                       # floor, gradient of the ratio
    nc = jnp.clip(nc, 1.0, c_safe)
    return jnp.where(has, c_safe / nc, 1.0)


def copy_bytes(op: str, m):
    """Bytes that one rank's NCCL channels load and store per byte of the buffer ``n`` in a
    ring ``op`` on ``m`` ranks (Simple protocol; dimensionless, multiply by ``n``).

    Source: NCCL 2.30.7 ``src/device/all_reduce.h`` ``runRing`` and ``reduce_scatter.h`` /
    ``all_gather.h`` / ``broadcast.h``: per chunk of ``c = n/m`` bytes a rank runs ``send``
    (load, store: 2c), ``m−2`` × ``recvReduceSend`` (2 loads, 1 store: 3c),
    ``recvReduceCopySend`` (2 loads, 2 stores: 4c), ``m−2`` × ``recvCopySend`` (1 load, 2
    stores: 3c) and ``recv`` (2c), every byte through the thread block of its channel
    (``prims_simple.h``). All-reduce: ``(6m − 4)/m`` (the same in and out of place).

    Buffer placement: in place throughout, as training frameworks call these collectives
    (``torch.distributed.broadcast`` on one tensor; all-gather into a buffer whose rank slice
    is the input, as Megatron-LM's distributed optimizer and FSDP do):

    - reduce-scatter (``send``, ``m−2`` × ``recvReduceSend``, ``recvReduceCopy``):
      ``(3m − 1)/m``, the same out of place;
    - all-gather in place (``directSend``: 2c, ``m−2`` × ``recvCopySend``, ``recv``):
      ``(3m − 2)/m``; out of place (nccl-tests' default) the first step is
      ``directCopySend`` (3c): ``(3m − 1)/m``;
    - broadcast: the root sends (in place ``directSend``: 2n; out of place
      ``directCopySend``: 3n), the middle ranks ``recvCopySend`` (3n), the last receives
      (2n); the busiest rank sets the time: 3 at ``m > 2``, 2 at ``m = 2`` (in place).

    Per byte on the link (``2(m−1)/m`` resp. ``(m−1)/m``) that is 4 at ``m = 2``, 3.33 at 4
    and 3.14 at 8 for all-reduce: small rings move more memory per link byte, so a copy-bound
    ring loses bus bandwidth at 2 ranks first.

    Validation: ``channel_copy_bw`` is fitted on all-reduce kernel times only; the
    reduce-scatter, all-gather and broadcast bounds apply the same per-channel throughput to
    the primitive counts above and are not checked against any measurement.
    """
    f = jnp.result_type(float)
    m = jnp.maximum(jnp.asarray(m, dtype=f), 1.0)
    if op == "all_reduce":
        return (6.0 * m - 4.0) / m
    if op == "reduce_scatter":
        return (3.0 * m - 1.0) / m
    if op == "all_gather":
        return (3.0 * m - 2.0) / m
    if op == "broadcast":
        return jnp.where(m > 2.5, 3.0, 2.0)
    raise ValueError(f"no NCCL ring copy traffic for op {op!r}")


def copy_time(op: str, n, m, channels, channel_copy_bw):
    """Time the ring's channels need to load and store their data, s: ``copy_bytes(op, m) ·
    n / (channels · channel_copy_bw)``; 0 where either is not set (no bound)."""
    f = jnp.result_type(float)
    total = jnp.asarray(channels, dtype=f) * jnp.asarray(channel_copy_bw, dtype=f)
    has = total > 0
    return jnp.where(has, copy_bytes(op, m) * jnp.asarray(n, dtype=f)
                     / jnp.where(has, total, 1.0), 0.0)


def _by_link(table, link):
    """Pick a row of a (NVLink, PCI, NET) table with a link code (a Python number folds)."""
    f = jnp.result_type(float)
    if isinstance(link, (int, float)):
        return jnp.asarray(table[0 if link < 0.5 else 1 if link < 1.5 else 2], dtype=f) * _US
    rows = jnp.asarray(table, dtype=f) * _US                           # (3 links, 3 protos)
    return jnp.where(link < 0.5, rows[0], jnp.where(link < 1.5, rows[1], rows[2]))


def _where(c, a, b):
    """``jnp.where`` that folds when ``c`` is a Python bool."""
    if isinstance(c, bool):
        return a if c else b
    return jnp.where(c, a, b)


def latency(alg: str, op: str, m, link):
    """NCCL's predicted latency of ``op`` with ``alg`` on one tier, per protocol, s (shape (3,)).

    ``alg``: ``"ring"``, ``"tree"`` or ``"in_network"`` (NVLS on NVLink/PCIe tiers, CollNet on
    a network tier). ``m``: ranks joined by the tier. ``link``: NCCL link class code.
    """
    f = jnp.result_type(float)
    m = jnp.asarray(m, dtype=f)
    if alg == "ring":
        steps = 2.0 * (m - 1.0) if op == "all_reduce" else m - 1.0
        return jnp.asarray(BASE_LAT["ring"], dtype=f) * _US + steps * _by_link(HW_LAT["ring"],
                                                                              link)
    if alg == "tree":
        hops = _where(link > 1.5, jnp.ceil(jnp.log2(jnp.maximum(m, 1.0)) - 1e-9), m - 1.0)
        k = 2.0 if op == "all_reduce" else 1.0
        return (jnp.asarray(BASE_LAT["tree"], dtype=f) * _US
                + k * hops * _by_link(HW_LAT["tree"], link))
    if alg == "in_network":
        return _where(link > 1.5, _by_link(HW_LAT["collnet"], link),
                      _by_link(HW_LAT["nvls"], link))
    raise ValueError(f"no NCCL latency for algorithm {alg!r}")


def nvls_tuner_latency(link, nccl_nvls_latency):
    """NCCL's tuner latency of in-network reduction on a tier, s: ``nccl_nvls_latency`` (the
    ``NetLevel`` field: the NVLS latency of the NCCL release the system runs,
    :data:`NVLS_TUNER_LATENCY`) on NVLink/PCIe tiers where it is set (>= 0), else NCCL
    2.30.7's :func:`latency` (NVLS 25 µs; CollNet on a network tier 31 µs)."""
    f = jnp.result_type(float)
    table = latency("in_network", "all_reduce", 2.0, link)[2]
    v = jnp.asarray(nccl_nvls_latency, dtype=f)
    return jnp.where((v >= 0) & (jnp.asarray(link, dtype=f) < 1.5), v, table)


def bw_factor(alg: str, op: str, link, nvls_efficiency=1.0):
    """NCCL's bandwidth factor per protocol relative to the Simple ring (shape (3,)).

    Ring: LL 0.5, LL128 0.92, Simple 1. Tree all-reduce: 0.92 · (LL 1/3.8, LL128 7/9 inside a
    node or 120/128 across nodes, Simple 1). In-network: Simple only, ``nvls_efficiency`` for
    NVLS (NCCL: Hopper 0.85, Blackwell 0.74), CollNet 1. Unsupported protocols get 0.
    """
    f = jnp.result_type(float)
    if alg == "ring":
        return jnp.asarray((0.5, LL128_FACTOR, 1.0), dtype=f)
    if alg == "tree":
        ll128 = jnp.asarray(_where(link > 1.5, 120.0 / 128.0, 7.0 / 9.0), dtype=f)
        return TREE_FACTOR * jnp.stack([jnp.asarray(1.0 / 3.8, dtype=f), ll128,
                                 jnp.asarray(1.0, dtype=f)])
    if alg == "in_network":
        eff = _where(link > 1.5, 1.0, nvls_efficiency)
        return jnp.stack([jnp.zeros((), f), jnp.zeros((), f), jnp.asarray(eff, dtype=f)])
    raise ValueError(f"no NCCL bandwidth factor for algorithm {alg!r}")
