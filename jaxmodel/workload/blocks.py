"""Building blocks of a layer's op graph: the TP shard, the static variant, the GEMM timing.

Shared by the decoder layer (:mod:`jaxmodel.workload.layer`), the embedding / LM head / loss
(:mod:`jaxmodel.workload.embedding`), the Megatron-LM 2021 kernels
(:mod:`jaxmodel.workload.megatron2021`) and fine-tuning (:mod:`jaxmodel.workload.finetune`):

- :class:`Shard` / :func:`shard` — Megatron's tensor-parallel split of one layer
  (Shoeybi et al. 2019 §3);
- :class:`Variant` / :func:`variant_of` — static switches of the graph, fixed at the API edge;
- :func:`layer_checks` / :func:`layer_feasibility` / :func:`raise_if_invalid` — the plan's
  ``"layer"`` rules (:mod:`jaxmodel.parallel.plan`);
- :func:`evaluate` — every GEMM of a graph (and its gradient GEMMs) timed in one vmapped call
  per kind, at the precision's tensor-core rate (LLMCompass §III-B mapper through
  :func:`jaxmodel.ops.gemm_latency`), with the recipe's quantisation kernels
  (:func:`quantize_times`);
- :func:`tp_collective` / :func:`tp_group` / :func:`tp_syncs` — the tensor-parallel
  synchronisation points (Shoeybi et al. 2019; Korthikanti et al. 2022 §4.2.2).

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import comm as _comm
from jaxmodel import ops as _ops
from jaxmodel import precisions as _prec
from jaxmodel.batching import batch_shape
from jaxmodel.numerics import INF, first_reason, weighted
from jaxmodel.ops import gemm as _gemm_ops
from jaxmodel.parallel import plan as _plan
from jaxmodel.types import Model, Parallelism, System, is_concrete, static_flag
from jaxmodel.workload.ffn import Gemm, _elementwise

GemmFn = Callable  # (dev, m, n, k, batch, dtype_bytes) -> seconds, one kernel incl. overhead


def default_gemm(dev, m, n, k, batch=1.0, dtype_bytes=2.0):
    """GEMM latency by the ops tile search, per-kernel overhead included (s).

    ``C[m, n] = A[m, k]·B[k, n]``, ``batch`` independent products. Wraps
    :func:`jaxmodel.ops.gemm_latency` (LLMCompass §III-B mapper).
    """
    return _ops.gemm_latency.single(dev, m, n, k, batch=batch, dtype_bytes=dtype_bytes,
                                    overhead=True)


class Shard(NamedTuple):
    """Per-device dimensions of one layer under tensor parallelism (counts)."""

    tp: jnp.ndarray        # tensor-parallel degree (sanitised >= 1)
    heads: jnp.ndarray     # query heads per device, h/t
    kv_heads: jnp.ndarray  # KV heads per device, max(h_kv/t, 1)
    group: jnp.ndarray     # query heads per KV head on a device
    head_dim: jnp.ndarray
    d_model: jnp.ndarray
    d_ff: jnp.ndarray      # FFN width per device, d_ff/t
    ffn_in: jnp.ndarray    # W1 output width per device: (ffn_matrices - 1)·d_ff/t


def shard(model: Model, par: Parallelism) -> Shard:
    """Megatron TP split of one layer (Shoeybi et al. 2019 §3): heads and the FFN width over t.

    Degrees are sanitised (``t >= 1``) so infeasible plans still give finite numbers; callers
    flag them through :func:`layer_feasibility`.
    """
    tp = jnp.maximum(par.tp, 1.0)
    heads = model.n_heads / tp
    kv_heads = jnp.maximum(model.n_kv_heads / tp, 1.0)
    d_ff = model.d_ff / tp
    return Shard(tp=tp, heads=heads, kv_heads=kv_heads, group=heads / kv_heads,
                 head_dim=model.head_dim, d_model=model.d_model, d_ff=d_ff,
                 ffn_in=(model.ffn_matrices - 1.0) * d_ff)


class Variant(NamedTuple):
    """Static switches of the op graph, fixed at the API edge from concrete inputs.

    ``None`` keeps both branches and selects per configuration with ``jnp.where`` (what a
    traced caller gets, e.g. a formula calling ``.single`` inside a sweep); ``True`` /
    ``False`` trace one branch only, which compiles and runs faster. :func:`variant_of`
    derives the flags from concrete ``model`` / ``par`` (a batch mixing both settings gets
    ``None``). Passed through ``@batched`` as static (its leaves are bools).
    """

    sp: bool | None = None    # sequence parallelism: RS + AG (True) or all-reduce (False)
    tp: bool | None = None    # tensor parallelism t > 1 anywhere: TP collectives needed
    moe: bool | None = None   # any MoE layer (n_experts > 1): MoE FFN / all-to-all branches
    flash: bool | None = None  # FlashAttention anywhere: the fused attention branch
    net: _comm.NetVariant = _comm.ANY_NET  # static topologies of the system's tiers
    mla: bool | None = None    # multi-head latent attention: the MLA projections / core
    window: bool | None = None  # sliding-window layers: a second, windowed attention core
    zero3_calls: bool | None = None  # DeepSpeed's per-tensor ZeRO-3 calls (zero 3, impl 1)


ANY = Variant()


def variant_of(model: Model, par: Parallelism, system: System | None = None) -> Variant:
    """The :class:`Variant` of concrete inputs (``ANY`` under tracing); with ``system``
    also its tiers' static topologies (:func:`jaxmodel.comm.net_variant_of`)."""
    return Variant(sp=static_flag(par.sp, lambda a: a > 0.5),
                   tp=static_flag(par.tp, lambda a: a > 1.5),
                   moe=static_flag(model.n_experts, lambda a: a > 1.5),
                   flash=static_flag(par.flash_attention, lambda a: a > 0.5),
                   net=_comm.net_variant_of(system),
                   mla=static_flag(model.attention, lambda a: a > 0.5),
                   window=static_flag(model.sliding_window, lambda a: a > 0.5),
                   zero3_calls=zero3_calls_flag(par))


def zero3_calls_flag(par: Parallelism) -> bool | None:
    """Whether concrete plans run ZeRO-3 as DeepSpeed 2021 did (``zero = 3`` and
    ``zero3_impl = "deepspeed"``): True (all), False (none) or None (mixed or traced)."""
    if not (is_concrete(par.zero) and is_concrete(par.zero3_impl)):
        return None
    z, impl = np.broadcast_arrays(np.asarray(par.zero, float), np.asarray(par.zero3_impl, float))
    return static_flag((z > 2.5) & (impl > 0.5), lambda a: a > 0.5)


def layer_checks(model: Model, par: Parallelism):
    """Checks of one layer's split as ``[(ok, reason_name), ...]`` (see ``numerics.REASONS``):
    the ``"layer"`` rules of the plan (:mod:`jaxmodel.parallel.plan`) — positive model
    dimensions, integer degrees ``>= 1``, ``t`` dividing the query heads with the KV heads
    divided over (or replicated across) ``t`` (Megatron GQA), and ``ep`` dividing the experts
    and ``dp``.
    """
    return _plan.structure_checks(_plan.LAYER, _plan.inputs(model, par))


def layer_feasibility(model: Model, par: Parallelism):
    """``(feasible, reason)`` of :func:`layer_checks` (first failing check wins)."""
    return first_reason(layer_checks(model, par))


# --------------------------------------------------------------------------------------------
# building blocks (single configuration)
#
# A block returns its GEMMs as shapes, ``{row: [(Gemm, count), ...]}``, and its other kernels
# as times, ``{row: (fwd_s, bwd_s)}``. :func:`evaluate` then times every GEMM of the layer (and,
# for training, its two gradient GEMMs) in ONE vmapped call per kind, so the tile search is
# traced and compiled once per layer instead of once per kernel.
# --------------------------------------------------------------------------------------------
def _grads(g: Gemm):
    """The two gradient GEMMs of ``C = A·B``: ``dA = dC·Bᵀ`` ``[m,n]×[n,k]`` and
    ``dB = Aᵀ·dC`` ``[k,m]×[m,n]`` (Narayanan et al. 2021 Appendix: backward = 2× forward)."""
    return (Gemm(g.m, g.k, g.n, g.batch), Gemm(g.k, g.n, g.m, g.batch))


def _time_gemms(gemm, dev, shapes, batched_kind, dtype_bytes, static=None):
    """Times of the GEMMs ``shapes`` (one vmapped call), or, with ``static`` (their
    ``(m, n, k, batch)`` as positive Python numbers, :func:`static_gemm_shapes`), once per
    distinct static shape: the default GEMM model then searches the tiles of all of them
    at once, pruned to each shape (:func:`jaxmodel.ops.gemm.gemm_latencies`), and takes the
    GEMV path alone where ``m`` or ``n`` is 1. A traced shape that differs from its static
    one (beyond float rounding) gives ``+inf``, never a wrong time."""
    if not shapes:
        return []
    if static is not None and all(min(st) > 0 for st in static):
        distinct = list(dict.fromkeys(static))
        if gemm is default_gemm:
            times = _gemm_ops.gemm_latencies(dev, distinct, dtype_bytes, overhead=True)
        else:
            times = [gemm(dev, m, n, k, b, dtype_bytes) for m, n, k, b in distinct]
        timed = dict(zip(distinct, times))
        out = []
        for g, st in zip(shapes, static):
            traced = [g.m, g.n, g.k] + ([g.batch] if batched_kind else [])
            same = jnp.all(jnp.stack([jnp.abs(x - v) <= 1e-6 * abs(v)
                                      for x, v in zip(traced, st)]))
            out.append(jnp.where(same, timed[st], INF))
        return out
    dtype = jnp.result_type(float)
    mnk = [jnp.stack([jnp.asarray(getattr(g, f), dtype=dtype) for g in shapes])
           for f in ("m", "n", "k")]
    if batched_kind:
        bs = jnp.stack([jnp.asarray(g.batch, dtype=dtype) for g in shapes])
        times = jax.vmap(lambda m, n, k, b: gemm(dev, m, n, k, b, dtype_bytes))(*mnk, bs)
    else:
        # batch=1.0 as a Python float lets the ops skip the merged-batch alternative
        times = jax.vmap(lambda m, n, k: gemm(dev, m, n, k, 1.0, dtype_bytes))(*mnk)
    return [times[i] for i in range(len(shapes))]


#: Weight-GEMM rows whose forward input gets its own quantisation kernel (the attention output
#: feeding ``W_o``); the inputs of QKV / W1 / W2 come from a layernorm or the activation,
#: which Transformer Engine's LayerNormLinear / LayerNormMLP fuse the cast into.
FWD_CAST_ROWS = ("wo",)
#: Weight-GEMM rows whose output gradient gets its own cast-transpose kernel (W1's is fused
#: with the activation backward, dGELU-cast-transpose, in LayerNormMLP).
BWD_CAST_ROWS = ("qkv", "wo", "w2")
#: Weight-GEMM rows whose saved FP8 input is transposed for the weight-gradient GEMM under
#: per-tensor scaling (Hopper's FP8 GEMMs take only the "TN" layout): Transformer Engine 1.x
#: ``_LayerNormLinear.backward`` / ``_LayerNormMLP.backward`` ``tex.fp8_transpose`` of
#: ``ln_out_total`` (QKV, W1) and of ``gelu_out`` (W2), ``_Linear`` (W_o) the
#: ``fp8_cast_transpose_fused`` of its input (forward) or ``fp8_transpose`` of the gathered
#: input (backward, sequence parallelism); TE v1.9 ``pytorch/module/*.py``.
BWD_TRANSPOSE_ROWS = ("qkv", "wo", "w1", "w2")


def quantize_times(dev, gemm_rows, prec, backward=False):
    """The precision recipe's quantisation kernels of a layer's weight GEMMs, ``(fwd_s, bwd_s)``.

    Source: Transformer Engine documentation ("FP8 primer": per-tensor delayed scaling, the
    amax of each tensor reduced inside its cast kernel) and Micikevicius et al., "FP8 Formats
    for Deep Learning", 2022, §4 (FP8 GEMM inputs scaled per tensor). Forward: a cast of the
    GEMM input ``[m, k]`` for :data:`FWD_CAST_ROWS`, ``cast_bytes`` per element; backward: a
    cast-transpose of the output gradient ``[m, n]`` for :data:`BWD_CAST_ROWS`, reading the
    16-bit gradient and writing the low-precision tensor and its transpose
    (``2·cast_bytes − act_bytes`` per element), and under per-tensor scaling
    (``scale_block = 0``) a transpose of each weight GEMM's saved low-precision input
    ``[m, k]`` for its weight-gradient GEMM (:data:`BWD_TRANSPOSE_ROWS`: read and write the
    GEMM word, ``2·gemm_bytes`` per element). Memory-bound elementwise kernels
    (:func:`jaxmodel.ops.elementwise_latency`, ~3 FLOP per element: amax, scale, convert;
    0 for a transpose). 0 when ``cast_bytes = 0``.
    """
    on = prec.cast_bytes > 0
    bwd_bytes = 2.0 * prec.cast_bytes - prec.act_bytes
    per_tensor = on & (prec.scale_block <= 0)
    fwd = 0.0
    bwd = 0.0
    for row, items in gemm_rows.items():
        for g, count in items:
            if g.batch is not None:
                continue
            c = jnp.where(on & (count > 0), count, 0.0)
            if row in FWD_CAST_ROWS:
                fwd = fwd + weighted(c, _elementwise(dev, g.m * g.k, prec.cast_bytes, 3.0))
            if backward and row in BWD_CAST_ROWS:
                bwd = bwd + weighted(c, _elementwise(dev, g.m * g.n, bwd_bytes, 3.0))
            if backward and row in BWD_TRANSPOSE_ROWS:
                ct = jnp.where(per_tensor, c, 0.0)
                bwd = bwd + weighted(ct, _elementwise(dev, g.m * g.k,
                                                      2.0 * prec.gemm_bytes, 0.0))
    return jnp.asarray(fwd), jnp.asarray(bwd)


def _gemm_entries(gemm_rows, backward):
    """The GEMMs :func:`evaluate` times, ``(plain, multi)``: lists of ``(row, count,
    direction, Gemm)`` for the weight GEMMs and the batched (attention) products, forward
    (direction 0) and, with ``backward``, the two gradient GEMMs (direction 1) of each."""
    entries = [e for _, e in _keyed_entries(gemm_rows, backward)]
    return ([e for e in entries if e[3].batch is None],
            [e for e in entries if e[3].batch is not None])


def _keyed_entries(gemm_rows, backward):
    """:func:`_gemm_entries`' entries in order, each with its key ``(row, index, part)``:
    entry ``index`` of ``gemm_rows[row]``, ``part`` 0 its forward GEMM, 1, 2 its gradient
    GEMMs (:func:`evaluate_with`'s references)."""
    for row, items in gemm_rows.items():
        for i, (g, count) in enumerate(items):
            yield (row, i, 0), (row, count, 0, g)
            if backward:
                for part, gb in enumerate(_grads(g), start=1):
                    yield (row, i, part), (row, count, 1, gb)


def evaluate(gemm, dev, gemm_rows, vector_rows, backward=False, *, precision=None,
             attn_word=None, shapes=None):
    """Time a layer's rows: ``{row: (fwd_s, bwd_s)}``.

    Weight GEMMs (``batch`` None) run at the tensor-core rate of ``precision.gemm_dtype``
    (the device passed to ``gemm`` has ``sa_mac_per_cycle`` scaled by
    :func:`jaxmodel.precisions.matrix_ratio`) on :func:`jaxmodel.precisions.gemm_word` bytes
    per element; the batched attention products at ``attn_dtype``'s rate on ``attn_word``
    bytes (default ``act_bytes``). With a quantising recipe (``cast_bytes > 0``) a row
    ``"quantize"`` holds :func:`quantize_times`.

    Args:
        gemm: GEMM latency function ``(dev, m, n, k, batch, dtype_bytes) -> s``.
        gemm_rows: ``{row: [(Gemm, count), ...]}``.
        vector_rows: ``{row: (fwd_s, bwd_s)}`` already timed.
        backward: also time the gradient GEMMs (else ``bwd_s = 0`` for GEMM rows).
        precision: a :class:`jaxmodel.Precision` or preset name (default ``"bf16"``).
        attn_word: bytes per element of the attention products (default ``act_bytes``).
        shapes: optional static shapes of the GEMMs (:func:`static_gemm_shapes`): each GEMM
            timed once per distinct shape by a search pruned to it.
    """
    return _evaluate(gemm, dev, (gemm_rows, vector_rows, None), backward,
                     (precision, attn_word, shapes))[0]


def evaluate_with(gemm, dev, gemm_rows, vector_rows, forward_rows, backward=False, *,
                  precision=None):
    """:func:`evaluate` and, in the same vmapped GEMM call, the forward-only rows
    ``forward_rows``: ``(rows, forward)`` with ``forward = {row: fwd_s}``.

    ``forward_rows`` is ``{row: [(item, count), ...]}``; an item is a weight :class:`Gemm`
    (timed beside the layer's weight GEMMs, at their rate and word, forward only: no
    gradient GEMMs, no quantisation kernels) or a reference ``(gemm_row, index, part)`` to
    entry ``index`` of ``gemm_rows[gemm_row]`` — ``part`` 0 its forward GEMM, 1 and 2 (with
    ``backward``) its gradient GEMMs ``dA`` and ``dB`` — whose time is reused, not timed
    again. Each row sums ``count × seconds`` over its items in order, as :func:`evaluate`
    sums its rows (e.g. the split TP-overlap host GEMMs of a training layer and the whole
    ones, :func:`jaxmodel.parallel.overlap.te_split_gemms`).
    """
    return _evaluate(gemm, dev, (gemm_rows, vector_rows, forward_rows), backward,
                     (precision, None, None))


def _evaluate(gemm, dev, rows, backward, options):
    """:func:`evaluate_with` on ``rows = (gemm_rows, vector_rows, forward_rows)`` and
    ``options = (precision, attn_word, shapes)``."""
    gemm_rows, vector_rows, forward_rows = rows
    precision, attn_word, shapes = options
    prec = _prec.resolve(precision)
    w_gemm = _prec.gemm_word(prec)
    w_attn = prec.act_bytes if attn_word is None else attn_word
    dev_gemm = _prec.scaled_device(dev, prec.gemm_dtype)
    dev_attn = _prec.scaled_device(dev, prec.attn_dtype)
    plain, multi = _gemm_entries(gemm_rows, backward)
    forward_rows = forward_rows or {}
    extra = [g for items in forward_rows.values() for g, _ in items if isinstance(g, Gemm)]
    if any(g.batch is not None for g in extra):
        raise ValueError("evaluate_with: forward_rows hold weight GEMMs only (batch None)")
    st = _parse_shapes(shapes) if shapes is not None else None
    if st is not None and len(st) != len(plain) + len(multi):
        raise ValueError(f"{len(st)} static GEMM shapes for {len(plain) + len(multi)} GEMMs")
    times = _time_gemms(gemm, dev_gemm, [e[3] for e in plain] + extra, False, w_gemm,
                        None if st is None else st[:len(plain)])
    times, t_extra = times[:len(plain)], times[len(plain):]
    times = times + _time_gemms(gemm, dev_attn, [e[3] for e in multi], True, w_attn,
                                None if st is None else st[len(plain):])
    out = {row: [0.0, 0.0] for row in gemm_rows}
    for (row, count, direction, _), t in zip(plain + multi, times):
        # counts may be arrays (MoE share, FlashAttention switch); a zero count adds exactly 0
        out[row][direction] = out[row][direction] + weighted(count, t)
    out = {row: (jnp.asarray(f), jnp.asarray(b)) for row, (f, b) in out.items()}
    for row, (f, b) in vector_rows.items():     # a row may have GEMM and vector parts
        gf, gb = out.get(row, (0.0, 0.0))
        out[row] = (jnp.asarray(gf + f), jnp.asarray(gb + b))
    if not (isinstance(prec.cast_bytes, (int, float)) and prec.cast_bytes == 0):
        out["quantize"] = quantize_times(dev, gemm_rows, prec, backward)
    if not forward_rows:
        return out, {}
    # the time of every (row, index, part) of gemm_rows, in the order timed (plain, multi)
    keyed = list(_keyed_entries(gemm_rows, backward))
    order = ([k for k, e in keyed if e[3].batch is None]
             + [k for k, e in keyed if e[3].batch is not None])
    by_key = dict(zip(order, times))
    fresh = iter(t_extra)
    forward = {}
    for row, items in forward_rows.items():
        f = 0.0
        for item, count in items:
            f = f + weighted(count, next(fresh) if isinstance(item, Gemm) else by_key[item])
        forward[row] = jnp.asarray(f)
    return out, forward

def tp_collective(system: System, par: Parallelism, nbytes, variant: Variant = ANY):
    """One Megatron TP synchronisation point on a ``[b·s, d]`` activation of ``nbytes`` (s).

    Without SP: an all-reduce over the ``t`` devices (Shoeybi et al. 2019, the ``g``/``f``
    operators); with SP: a reduce-scatter and an all-gather of the same buffer (Korthikanti
    et al. 2022 §4.2.2, same bandwidth cost). ``nbytes`` is the full per-device buffer (NCCL
    convention), passed to :func:`jaxmodel.comm.collective_latency`. Zero when ``t = 1``.
    ``variant`` (static) skips the collectives a configuration cannot need.
    """
    if variant.tp is False:
        return 0.0 * nbytes
    tp = par.tp
    multi = tp > 1.5
    group = jnp.where(multi, tp, 2.0)      # double-where: never evaluate a group of 1
    if variant.sp is not True:
        ar = _comm.collective_latency.single(system, "all_reduce", nbytes, group,
                                             net=variant.net)
    if variant.sp is not False:
        rs = _comm.collective_latency.single(system, "reduce_scatter", nbytes, group,
                                             net=variant.net)
        ag = _comm.collective_latency.single(system, "all_gather", nbytes, group,
                                             net=variant.net)
    if variant.sp is None:
        t = jnp.where(par.sp > 0.5, rs + ag, ar)
    else:
        t = rs + ag if variant.sp else ar
    return jnp.where(multi, t, 0.0)


def tp_group(system: System, par: Parallelism, kind: str, nbytes, variant: Variant, like):
    """Collective ``kind`` of ``nbytes`` over the ``t`` TP ranks, s; 0 when ``t = 1`` (the
    group is never evaluated at size 1: double-where) or when ``variant`` rules TP out.
    ``like``: an array whose shape and type the zero takes."""
    if variant.tp is False:
        return 0.0 * like
    multi = par.tp > 1.5
    t = _comm.collective_latency.single(system, kind, nbytes, jnp.where(multi, par.tp, 2.0),
                                        net=variant.net)
    return jnp.where(multi, t, 0.0)


def tp_syncs(model: Model):
    """Tensor-parallel synchronisation points of one layer per pass (count): 2 for the
    sequential block (the attention and the MLP each end in a row-parallel GEMM whose
    partial sums are all-reduced — Megatron's ``g``/``f`` pair, Shoeybi et al. 2019 §3 — or,
    under SP, reduce-scattered and all-gathered again), 1 for a parallel attention + MLP
    block (GPT-J, Falcon, GPT-NeoX, PaLM): both branches read the same input and their
    row-parallel outputs are summed locally before a single all-reduce in the forward pass,
    and their input gradients before a single one in the backward pass (Black et al. 2022,
    "GPT-NeoX-20B", §2.1.3 "Parallel Attention + FF Layers"; Chowdhery et al. 2022, "PaLM",
    §2 "Parallel Layers"; Megatron-LM's and GPT-NeoX's parallel-residual layers)."""
    return 2.0 - jnp.clip(model.parallel_block, 0.0, 1.0)



def _parse_shapes(shapes):
    """:func:`static_gemm_shapes`' strings as ``(m, n, k, batch)`` tuples of floats."""
    return tuple(tuple(float(v) for v in row.split(",")) for row in shapes)


def raise_if_invalid(model, par):
    """Raise ``ValueError`` for an inconsistent *concrete, unbatched* plan (API edge)."""
    if not is_concrete(model, par) or batch_shape(model, par) != ():
        return
    with jax.ensure_compile_time_eval():      # concrete even inside an outer jax.jit
        _plan.raise_if_invalid("layer", _plan.LAYER, _plan.inputs(model, par))
