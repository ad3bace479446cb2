"""Context parallelism (CP): the sequence of every layer split over ``cp`` devices
(single configuration).

Sources: Liu, Zaharia & Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite
Context" (ICLR 2024, §3: KV blocks passed around a ring of devices, each step's transfer
overlapped with the attention of the block held); Megatron-core context parallelism
(``--context-parallel-size``, Transformer Engine ``attn_forward_func_with_cp``: p2p ring,
``cp − 1`` KV exchanges forward, KV and dKV exchanges backward; causal load balancing by
splitting the sequence into ``2·cp`` chunks and giving rank ``r`` chunks ``r`` and
``2cp−1−r``); Dubey et al., "The Llama 3 Herd of Models" (2024, §3.3.2: all-gather based
CP — K and V all-gathered over the CP group before the attention of the local queries,
their gradients reduce-scattered in the backward; GQA keeps the gathered tensors small).

**Placement.** The CP group sits between TP and PP: device id = tp_rank + tp·(cp_rank +
cp·(pp_rank + pp·dp_rank)) (Megatron-core ``RankGenerator`` order tp-cp-ep-dp-pp puts CP
next to TP), so CP neighbours are ``tp`` devices apart and the ring crosses the outermost
tier the ``tp·cp`` devices of one group span.

**Per layer and micro-batch, one device** (:func:`cp_layer_times`). Every token-wise
operation (QKV, ``W_o``, FFN, layernorms, TP collectives) runs on ``s/cp`` tokens. The
attention core of the local queries (``s/cp`` of them) runs against all ``s`` keys as the
ring executes it: ``cp`` kernel calls of ``s/cp`` queries against one block of ``s/cp``
keys (a causal FlashAttention call of that square has ``1/cp`` of the causal pairs of the
whole sequence, the load-balanced share; without balancing the last rank does
``(2cp−1)/cp²`` of the work, :func:`causal_imbalance`); standard attention computes the full
``s/cp × s`` rectangle (``cp`` squares). Sliding-window layers are timed as the square calls
too (window ≥ ``s/cp`` assumed). KV chunk per rank
``2·b·(s/cp)·(kv_heads/tp)·d_head·bytes`` (K and V, :func:`kv_chunk_bytes`).

- Ring (``mode = RING``): forward ``(cp−1)·ov(a_f/cp, p2p(kv)) + a_f/cp`` (each block's
  attention overlapped with receiving the next, contention per :mod:`overlap`); backward
  ``(cp−1)·ov(a_b/cp, p2p(2·kv)) + a_b/cp + p2p(kv)`` (KV and the partial dKV travel;
  the last dKV return is exposed).
- All-gather (``mode = ALLGATHER``, Llama 3): forward ``all_gather(cp·kv) + a_f``, backward
  ``a_b + reduce_scatter(cp·kv)``, not overlapped (Dubey et al. §3.3.2 accept the exposed
  all-gather because GQA makes K, V small).

Activation memory per layer (:func:`cp_activation_bytes`): the layer's stored activations on
``s/cp`` tokens (Korthikanti et al. 2023 §4.1 inventory, :func:`jaxmodel.workload.memory.
activation_bytes_per_layer`), i.e. ÷ cp; plus the transient KV buffers of the attention (two
chunks in flight for the ring, the gathered ``cp`` chunks for the all-gather).

Gradients of the weights are reduced over the combined ``dp·cp`` group (Megatron-core folds
CP into the data-parallel gradient reduction): that is the caller's DP term.

Units: seconds, bytes.
"""

from __future__ import annotations


import jax.numpy as jnp

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel.parallel import overlap as ov
from jaxmodel.parallel import plan as _plan
from jaxmodel.workload import layer as _layer
from jaxmodel.workload import memory as _memory
from jaxmodel.workload import moe as _moe
from jaxmodel.types import static_flag

from jaxmodel import precisions as _prec

RING, ALLGATHER = 0, 1
MODES = ("ring", "all_gather")

CP_LAYER_KEYS = ("fwd", "bwd", "recompute", "tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd",
                 "ep_comm_bwd", "cp_comm_fwd", "cp_comm_bwd", "cp_contention")


def mode_code(mode) -> float:
    """``"ring"`` → 0, ``"all_gather"`` (``"allgather"``) → 1; numbers pass through."""
    if isinstance(mode, str):
        name = {"allgather": "all_gather", "p2p": "ring"}.get(mode, mode)
        if name not in MODES:
            raise ValueError(f"context parallel mode {mode!r} must be one of {MODES}")
        return float(MODES.index(name))
    return mode


def cp_checks(seq_len, cp, tp=1.0, sp=0.0):
    """Structural checks ``[(ok, reason_name), ...]``: ``cp`` an integer ≥ 1, the sequence
    divisible into ``2·cp`` load-balancing chunks (and each rank's ``s/cp`` tokens by ``tp``
    under sequence parallelism) — the plan's rule, :func:`jaxmodel.parallel.plan.
    cp_sequence_ok`."""
    f = jnp.result_type(float)
    cp = jnp.asarray(cp, dtype=f)
    degree_ok = (cp >= 1) & nx.is_integer(cp)
    return [(degree_ok, "invalid_parallelism"),
            (_plan.cp_sequence_ok(jnp, seq_len, cp, tp, sp), "sequence_not_divisible")]


def causal_imbalance(cp, balanced=1.0):
    """Causal attention work of the most loaded CP rank relative to ``1/cp`` of the total:
    1 with the ``2·cp``-chunk load balancing; ``(2cp−1)/cp`` for a contiguous split (rank
    ``r`` of a contiguous split attends to ``r+½`` chunks of ``cp``: work ∝ ``(2r+1)/cp²``)."""
    c = jnp.maximum(jnp.asarray(cp, dtype=jnp.result_type(float)), 1.0)
    return jnp.where(jnp.asarray(balanced) > 0.5, 1.0, (2.0 * c - 1.0) / c)


def kv_chunk_bytes(model, par, micro_batch, seq_len, cp, act_bytes=2.0):
    """K and V of one rank's ``s/cp`` tokens on one TP rank, ``act_bytes`` per element:
    ``2·b·(s/cp)·max(kv_heads/tp, 1)·d_head·bytes``."""
    c = jnp.maximum(cp, 1.0)
    kv = jnp.maximum(model.n_kv_heads / jnp.maximum(par.tp, 1.0), 1.0)
    return 2.0 * micro_batch * (seq_len / c) * kv * model.head_dim * act_bytes


_EXCHANGE = {"mode": RING, "channels": None, "net": _comm.ANY_NET}


def _exchange(where: str, options: dict, known=tuple(_EXCHANGE)) -> dict:
    """The keyword options with their defaults; ``TypeError`` naming an unknown one."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{where}: unknown keyword(s) {unknown}; known {sorted(known)}")
    return options


def cp_attention_time(system, attn_fwd, attn_bwd, kv_bytes, cp, tp=1.0, **exchange):
    """The attention core of one layer under CP (module docstring), one device, s.

    Args:
        attn_fwd, attn_bwd: attention core time of the local queries against all keys
            (all ``cp`` blocks together, imbalance included), forward and backward, s.
        kv_bytes: K and V of one rank (:func:`kv_chunk_bytes`), bytes.
        cp: context-parallel degree; tp: tensor-parallel degree (CP neighbours' stride).
        **exchange: ``mode`` — :data:`RING` (0, default) or :data:`ALLGATHER` (1);
            ``channels`` — NCCL channels (SMs) of the exchange (default
            ``DEFAULT_CHANNELS["cp"]``); ``net`` — the static
            :class:`jaxmodel.comm.NetVariant` of ``system``.

    Returns:
        dict: ``fwd``, ``bwd`` (total attention incl. communication), ``comm_fwd``,
        ``comm_bwd`` (their exposed communication incl. contention), ``contention``,
        ``feasible``.
    """
    o = {**_EXCHANGE, **_exchange("cp_attention_time", exchange)}
    mode, channels, net = o["mode"], o["channels"], o["net"]
    f = jnp.result_type(float)
    c = jnp.maximum(jnp.asarray(cp, dtype=f), 1.0)
    tp = jnp.maximum(jnp.asarray(tp, dtype=f), 1.0)
    multi = c > 1.5
    group = jnp.where(multi, c, 2.0)
    dev = system.device
    pair = jnp.maximum(_plan.cross_stride(system, tp * c), tp)
    t_p2p, ok_p, _ = _comm.collective_time.single(system, "p2p", kv_bytes, 2.0, "auto", pair,
                                                  net)
    t_p2p2, _, _ = _comm.collective_time.single(system, "p2p", 2.0 * kv_bytes, 2.0, "auto",
                                                pair, net)
    t_ag, ok_g, _ = _comm.collective_time.single(system, "all_gather", group * kv_bytes, group,
                                                 "auto", tp, net)
    t_rs, _, _ = _comm.collective_time.single(system, "reduce_scatter", group * kv_bytes,
                                              group, "auto", tp, net)
    share = ov.sm_share(dev, ov.DEFAULT_CHANNELS["cp"] if channels is None else channels)
    # ring: cp blocks, cp-1 exchanges each overlapped with one block
    blk_f, blk_b = attn_fwd / c, attn_bwd / c
    tot_f, _, sl_f = ov.overlapped_time(blk_f, t_p2p, 0.0,
                                        ov.comm_hbm_bytes("p2p", kv_bytes, 2.0), share, dev)
    tot_b, _, sl_b = ov.overlapped_time(blk_b, t_p2p2, 0.0,
                                        ov.comm_hbm_bytes("p2p", 2.0 * kv_bytes, 2.0), share,
                                        dev)
    ring_f = (c - 1.0) * tot_f + blk_f
    ring_b = (c - 1.0) * tot_b + blk_b + t_p2p
    ring_sl = (c - 1.0) * (sl_f + sl_b)
    ag_f = t_ag + attn_fwd
    ag_b = attn_bwd + t_rs
    is_ring = jnp.asarray(mode, dtype=f) < 0.5
    fwd = jnp.where(multi, jnp.where(is_ring, ring_f, ag_f), attn_fwd)
    bwd = jnp.where(multi, jnp.where(is_ring, ring_b, ag_b), attn_bwd)
    ok = ~multi | (ok_g & jnp.where(is_ring, ok_p, True))   # the group must fit the tiers
    fwd = jnp.where(ok, fwd, jnp.inf)
    bwd = jnp.where(ok, bwd, jnp.inf)
    return {"fwd": fwd, "bwd": bwd, "comm_fwd": fwd - attn_fwd, "comm_bwd": bwd - attn_bwd,
            "contention": jnp.where(multi & is_ring, ring_sl, 0.0), "feasible": ok}


def context_flag(par) -> bool | None:
    """Static switch of :func:`cp_layer_times` from concrete plans: whether they use context
    parallelism (``cp > 1``) — True (all), False (none), None (mixed or traced)."""
    return static_flag(par.cp, lambda a: a > 1.5)


_LAYER_OPTIONS = {"mode": RING, "balanced": 1.0, "channels": None, "gemm": None,
                  "variant": _layer.ANY, "context": None, "forward_rows": None}


def cp_layer_times(system, model, par, micro_batch, seq_len, cp, precision=None, **options):
    """Per-layer, per-micro-batch training times of one device under context parallelism
    of degree ``cp`` (module docstring), s — the CP counterpart of
    :func:`jaxmodel.workload.layer.training_layer_times` (``cp = 1`` reproduces it).

    ``precision``: a preset name or :class:`jaxmodel.Precision` (default bf16). Options:
    ``mode`` (:data:`RING` default, :data:`ALLGATHER`), ``balanced`` (1 = the 2·cp-chunk
    load balancing, 0 = a contiguous split: :func:`causal_imbalance`), ``channels`` (of the
    exchange, :func:`cp_attention_time`), and the static ``gemm`` (GEMM latency hook),
    ``variant`` (:class:`jaxmodel.workload.layer.Variant`) and ``context`` (below), and
    ``forward_rows``: forward-only GEMM rows timed in the layer's own GEMM call
    (:func:`jaxmodel.workload.blocks.evaluate_with`: GEMMs, or references to the layer's
    GEMMs), returned under their names beside :data:`CP_LAYER_KEYS` (not masked).

    Returns:
        dict :data:`CP_LAYER_KEYS`: ``fwd``/``bwd`` compute incl. the CP attention with its
        exposed exchange, ``recompute`` (per ``par.recompute``: full repeats the forward
        incl. its TP and CP communication, selective the attention core), ``tp_comm_fwd``,
        ``tp_comm_bwd`` (TP collectives on ``s/cp`` tokens, serial), ``cp_comm_fwd``,
        ``cp_comm_bwd`` (exposed CP exchange, part of ``fwd``/``bwd``), ``cp_contention``,
        ``ep_comm_fwd``/``ep_comm_bwd`` (MoE dispatch + combine all-to-all of the ``b·s/cp``
        local tokens, :func:`jaxmodel.workload.moe.alltoall_time`; full recomputation
        repeats it). Infeasible TP splits, CP placements or unsupported precisions give
        ``+inf``. ``context`` (static, :func:`context_flag`): ``False`` when no
        configuration has ``cp > 1``, which keeps the CP exchange (four collectives) out of
        the graph — the same numbers.

    Raises:
        TypeError: an unknown option (named).
    """
    o = {**_LAYER_OPTIONS, **_exchange("cp_layer_times", options, tuple(_LAYER_OPTIONS))}
    variant, context = o["variant"], o["context"]
    gemm = o["gemm"] or _layer.default_gemm
    f = jnp.result_type(float)
    dev = system.device
    prec = _prec.precision(precision)
    act_bytes = prec.act_bytes
    c = jnp.maximum(jnp.asarray(cp, dtype=f), 1.0)
    local = seq_len / c
    # the attention core as the ring runs it: cp kernel calls of the local queries against one
    # rank's s/cp keys each (causal: cp·(s/cp)²/2 = 1/cp of the causal s²/2 query-key
    # pairs; the standard kernels' full s/cp × s rectangle = cp squares). Timing it as one
    # s/cp × s call would take the short-query, long-key shape for a KV-cache decode kernel.
    gemms, vectors = _layer.layer_graph(dev, model, par, micro_batch, local, local,
                                        training=True, variant=variant, precision=prec)
    # DeepSeek-V3's recomputed up-projections timed with the layer's GEMMs
    up = _layer.norm_upproj_rows(model, par, micro_batch * local)
    fwd_rows = o["forward_rows"] or {}
    if set(up) & set(fwd_rows):
        raise ValueError(f"cp_layer_times: forward_rows {sorted(set(up) & set(fwd_rows))} "
                         "clash with the layer's own")
    rows, forward = _layer.evaluate_with(gemm, dev, gemms, vectors, backward=True,
                                         precision=prec, forward_rows={**fwd_rows, **up})
    # every phase's time reads the rows: kept once (numerics.materialized)
    rows, forward = nx.materialized((rows, forward))
    t_up = forward.pop("norm_upproj")
    fwd_all = sum(a for a, _ in rows.values())
    bwd_all = sum(b for _, b in rows.values())
    attn_f = rows["qk"][0] + rows["softmax"][0] + rows["av"][0]
    attn_b = rows["qk"][1] + rows["softmax"][1] + rows["av"][1]
    # FlashAttention skips fully masked blocks: with the 2·cp-chunk load balancing every rank
    # does 1/cp of the causal work, a contiguous split loads the last rank with (2cp−1)/cp of
    # it (:func:`causal_imbalance`). Standard attention computes the full rectangle on every
    # rank: no imbalance either way.
    fa = par.flash_attention > 0.5
    scale = c * jnp.where(fa, causal_imbalance(c, o["balanced"]), 1.0)
    if context is False:    # cp = 1: cp_attention_time's values without its collectives
        zero = 0.0 * attn_f
        attn = {"fwd": attn_f * scale, "bwd": attn_b * scale, "comm_fwd": zero,
                "comm_bwd": zero, "contention": zero, "feasible": True}
    else:
        attn = cp_attention_time(system, attn_f * scale, attn_b * scale,
                                 kv_chunk_bytes(model, par, micro_batch, seq_len, c,
                                                act_bytes),
                                 c, par.tp, mode=o["mode"], channels=o["channels"],
                                 net=variant.net)
    fwd = fwd_all - attn_f + attn["fwd"]
    bwd = bwd_all - attn_b + attn["bwd"]
    sync = _layer.tp_collective(system, par, micro_batch * local * model.d_model * act_bytes,
                                variant)
    comm = _layer.tp_syncs(model) * sync
    a2a, a2a_b = ((0.0 * sync, 0.0 * sync) if variant.moe is False else
                  _moe.alltoall_times(system, model, par, micro_batch * local, act_bytes,
                                      net=variant.net, dispatch_bytes=prec.gemm_bytes))
    attn_core_fwd = jnp.where(par.flash_attention > 0.5, 0.0, attn["fwd"])
    rc = par.recompute
    recompute = jnp.select([rc < 0.5, rc < 1.5, rc < 2.5],
                           [jnp.zeros_like(fwd), attn_core_fwd, fwd + comm + a2a],
                           _layer.norm_upproj_recompute(gemm, dev, model, par,
                                                        micro_batch * local, rows, prec, t_up))
    out = {"fwd": fwd, "bwd": bwd, "recompute": recompute, "tp_comm_fwd": comm,
           "tp_comm_bwd": comm, "ep_comm_fwd": a2a, "ep_comm_bwd": a2a_b,
           "cp_comm_fwd": attn["comm_fwd"], "cp_comm_bwd": attn["comm_bwd"],
           "cp_contention": attn["contention"]}
    ok, _ = _layer.layer_feasibility(model, par)
    ok = ok & attn["feasible"] & _prec.supported(dev, prec)
    out = {k: jnp.where(ok, v, jnp.inf) for k, v in out.items()}
    if set(forward) & set(out):
        raise ValueError(f"cp_layer_times: forward_rows {sorted(set(forward) & set(out))} "
                         "clash with the layer's keys")
    return {**out, **forward}


def cp_activation_bytes(model, par, micro_batch, seq_len, cp, mode=RING, act_bytes=2.0,
                        gemm_bytes=None):
    """Activation memory one layer stores for the backward under CP, bytes per device: the
    per-layer inventory on ``s/cp`` tokens (:func:`jaxmodel.workload.memory.
    activation_bytes_per_layer`; its ``s²`` attention-score term becomes ``(s/cp)·s``) plus
    the transient KV buffers (ring: the two chunks in flight; all-gather: all ``cp`` chunks,
    Dubey et al. 2024 §3.3.2); ``act_bytes`` per activation element (the precision's),
    ``gemm_bytes`` per stored GEMM input (default ``act_bytes``)."""
    f = jnp.result_type(float)
    c = jnp.maximum(jnp.asarray(cp, dtype=f), 1.0)
    local = seq_len / c
    act = _memory.activation_bytes_per_layer.single(model, par, micro_batch, local, act_bytes,
                                                    gemm_bytes)
    # the s² term computed at s/cp counts (s/cp)²; the local queries see all s keys
    scores_local = jnp.where(
        (par.flash_attention > 0.5) | (par.recompute > 0.5), 0.0,
        (4.0 * act_bytes / 2.0 + 1.0) * model.n_heads * local * local * micro_batch
        / jnp.maximum(par.tp, 1.0))
    act = act + jnp.where(par.recompute > 1.5, 0.0, scores_local * (c - 1.0))
    kv = kv_chunk_bytes(model, par, micro_batch, seq_len, c, act_bytes)
    buf = jnp.where(jnp.asarray(mode, dtype=f) < 0.5, 2.0 * kv, c * kv)
    return act + jnp.where(c > 1.5, buf, 0.0)


__all__ = ["cp_layer_times", "cp_attention_time", "cp_activation_bytes", "cp_checks",
           "causal_imbalance", "kv_chunk_bytes", "mode_code", "RING", "ALLGATHER", "MODES",
           "CP_LAYER_KEYS", "context_flag"]
