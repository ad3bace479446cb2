"""Mixture-of-Experts layers with expert parallelism (DeepSpeed-TED placement, GShard capacity).

Sources:

- Guo et al. §III-C: every ``moe_every``-th layer's FFN becomes ``E`` experts; a gating GEMM
  ``[tokens × d]·[d × E]`` and a softmax pick the top-``k`` experts per token; tokens are
  dispatched to and combined from the experts by all-to-all; DeepSpeed-TED placement
  (Singh et al., ICS 2023) ``TP × EP × DP_exp = TP × DP_attn`` (eq. 2) with ``DP_exp = 1``
  by default, i.e. ``EP = DP_attn``; each expert's FFN is split by TP (``W1`` by columns,
  ``W2`` by rows, one all-reduce; DeepSpeed-MoE, Rajbhandari et al. 2022 Fig. 3).
- Guo et al. eq. 3 / GShard (Lepikhin et al. 2021 §2.2, Algorithm 1): every expert has a buffer of
  ``C = ⌈capacity_factor · k · S / E⌉`` token slots for a group of ``S`` tokens (one device's
  tokens); tokens beyond it are dropped, empty slots are zero padding, so the all-to-all volume
  is fixed, ``E · C · d · bytes`` per device and direction, independent of the load balance.
- Grouped GEMM (CUTLASS ``GemmGrouped``; Megatron-core ``TEGroupedMLP``; vLLM / SGLang
  ``fused_moe``; DeepSeek-AI's DeepGEMM grouped kernels): the ``g`` active experts of one
  projection run as ONE kernel over ``g`` problems ``[m × k]×[k × n]``: one launch, the
  ``g·⌈m/T_m⌉·⌈n/T_n⌉`` tiles of all experts share the cores (one wave-quantisation over the
  summed tile count), every active expert's weights streamed once. Costed by
  :func:`grouped_gemm`: the K-concatenated weight GEMM ``[m × g·k]×[g·k × n]`` through the
  GEMM model, whose FLOPs ``2·g·m·n·k``, operand bytes ``(g·m·k + g·k·n)·word`` and single
  launch equal the grouped kernel's; its tiles are scheduled over the cores together (with
  split-K ``s = g`` they would be exactly the grouped kernel's ``g·⌈m/T_m⌉·⌈n/T_n⌉`` work
  units of depth ``k``; the library bound picks ``s`` from its own grid and charges a split-K
  fix-up of ``2·s·m·n`` fp32 words the grouped kernel does not have, small next to the
  weights when ``m`` is small), and whose gradient GEMMs ``[m × n]×[n ×
  g·k]`` and ``[g·k × m]×[m × n]`` are exactly the grouped ``dX`` and ``dW``; the ``(g−1)·m·n``
  output elements the concatenated form does not write are added as streamed bytes
  (:func:`grouped_extra_output`). Serving (dropless) uses it by default; capacity training keeps
  the per-expert kernel loop of DeepSpeed-MoE (Rajbhandari et al. 2022) that Guo et al.
  validate against (``grouped=True`` switches it on, as Megatron-core ``--moe-grouped-gemm``).
- Dropless inference (Mixtral; Jiang et al. 2024, served by vLLM/TensorRT-LLM): no capacity
  padding; with ``T`` tokens routed uniformly at random, an expert receives at least one token
  with probability ``p = 1 − (1 − k/E)^T``, so ``E·p`` experts are *active* (their weights are
  read) and each processes ``k·T/(E·p)`` tokens on average; the all-to-all carries the ``k·T``
  routed token copies. (Expert ``e`` misses all ``T`` tokens with probability ``(1 − k/E)^T``:
  each token picks ``k`` of ``E`` without replacement, missing ``e`` with probability
  ``C(E−1, k)/C(E, k) = 1 − k/E``, tokens independent; linearity of expectation over the
  ``E`` indicator variables gives ``E[active] = E·(1 − (1 − k/E)^T)``.)

Per device with ``t = tp``, ``ep`` expert-parallel ranks, ``T`` tokens per micro-batch on the
device (replicated over its TP group), ``E_loc = E/ep`` local experts:

==================  ==========================================================================
row                 kernel(s)
==================  ==========================================================================
``w1``, ``w2``      per active local expert: ``[m × d]×[d × (ffn_matrices−1)·d_ff/t]`` and
                    ``[m × d_ff/t]×[d_ff/t × d]``, one grouped kernel per projection when
                    serving; training: ``E_loc`` experts × ``m = ep·C`` slots (``C`` from
                    each of the ``ep`` senders), one kernel each
``act``             GELU / SwiGLU over the expert rows (``ffn_block`` of the dense layer)
``moe_router``      gating GEMM ``[T × d]×[d × E]``, softmax over ``[T, E]`` (one streaming
                    elementwise pass: ``E`` is narrow), top-k selection,
                    dispatch permutation into the ``E × C`` buffer and the weighted combine
``moe_alltoall``    dispatch + combine all-to-all over the ``ep`` group (stride ``tp·pp``,
                    :func:`jaxmodel.comm.collective_latency`), twice more in the backward
==================  ==========================================================================

Dense and MoE layers are mixed by their share ``f = n_moe/n_layers`` (rows of one *average*
layer: dense FFN weighted ``1 − f``, MoE FFN weighted ``f``), so ``n_layers ×`` the layer
time is the model's time. Load imbalance beyond the capacity padding is not modelled.

Units: seconds, bytes, counts.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from jaxmodel import comm as _comm
from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel.batching import batched
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel.pipeline import stage_layers
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload import ffn as _ffn
from jaxmodel.workload.params import expert_params, expert_tp, n_moe_layers

__all__ = ["MOE_OPS", "moe_layer_fraction", "expert_capacity", "moe_dims",
           "moe_feasibility", "grouped_gemm", "grouped_extra_output", "ExpertDispatch", "ffn_rows", "alltoall_time", "expert_params_per_device",
           "moe_activation_bytes", "moe_layer_times", "node_limited_alltoall", "node_limit",
           "alltoall_times",
           "dualpipe_overlap", "norm_upproj_activation_bytes"]

#: Extra per-layer rows of an MoE model (zero for dense models), after ``LAYER_OPS``.
MOE_OPS = ("moe_router", "moe_alltoall")

# Top-k selection: one compare per score and selected expert (Shazeer et al. 2017 noisy top-k
# without the noise), reading the [T, E] scores once.
_TOPK_FLOP_PER_SCORE = 1.0


def moe_layer_fraction(model: Model):
    """Share of MoE layers ``f = n_moe / n_layers`` (0 for dense models)."""
    layers = nx.sanitize(model.n_layers, model.n_layers > 0)
    return n_moe_layers(model) / layers


def expert_capacity(model: Model, tokens):
    """GShard expert capacity ``C = ⌈capacity_factor · k · tokens / E⌉`` (token slots).

    Source: Lepikhin et al. 2021 §2.2 ("expert capacity ... ``2N/E`` for top-2"), Guo et al.
    eq. 3. ``tokens`` is the group size ``S`` (one device's tokens, as in GShard).

    Example:
        >>> expert_capacity(hw_db.model("mixtral-8x7b"), 4096.0)   # 1.0·2·4096/8 = 1024
        Array(1024.0, dtype=......)
    """
    E = jnp.maximum(model.n_experts, 1.0)
    k = jnp.clip(model.top_k, 1.0, E)
    return jnp.maximum(nx.ceil_div(model.capacity_factor * k * tokens, E), 1.0)


def moe_dims(model: Model, par: Parallelism, tokens, dtype_bytes=2.0, dropless=False):
    """Per-device MoE quantities for ``tokens`` tokens on the device (single configuration).

    Returns:
        dict with ``local_experts`` (``E/ep``), ``capacity`` (GShard ``C``), ``experts``
        (expert GEMMs run: all local experts with capacity, the expected active ones when
        ``dropless``), ``expert_tokens`` (rows of each expert GEMM), ``slots`` (token slots
        through the dispatch/combine permutations) and ``a2a_bytes`` (all-to-all send buffer
        per device and direction: ``E·C·d·bytes``, or ``k·T·d·bytes`` dropless).
    """
    E = jnp.maximum(model.n_experts, 1.0)
    k = jnp.clip(model.top_k, 1.0, E)
    ep = jnp.maximum(par.ep, 1.0)
    local = E / ep
    # an EP group folded over ``ept`` ranks of a TP group: each of them dispatches its 1/ept
    # share of the TP group's (replicated) tokens (Megatron-core's MoE token dispatcher,
    # megatron/core/transformer/moe/token_dispatcher.py, splits them over the TP ranks)
    tokens = tokens / expert_tp(par)[1]
    cap = expert_capacity(model, tokens)
    d = model.d_model
    if dropless:
        # tokens routed inside the EP group; no tokens (an invalid workload, flagged by the
        # callers) means no active expert and empty GEMMs, never 0/0
        group = jnp.maximum(tokens, 0.0) * ep
        q = jnp.clip(1.0 - k / E, 0.0, 1.0)
        q_safe = jnp.where(q > 0, q, 0.5)
        active = jnp.where(q > 0, 1.0 - q_safe ** group, 1.0)
        experts = local * active
        m = nx.safe_div(k * group, E * active, fill=0.0)
        slots = k * tokens
    else:
        experts = local
        m = ep * cap
        slots = E * cap
    return {"local_experts": local, "capacity": cap, "experts": experts,
            "expert_tokens": m, "slots": slots, "a2a_bytes": slots * d * dtype_bytes}


@batched
def moe_feasibility(model: Model, par: Parallelism):
    """``(feasible, reason)`` of the plan's expert rule (batched): ``ep`` divides the experts
    and either the data-parallel degree (DeepSpeed-TED eq. 2 with integer ``DP_exp = dp/ep``)
    or is ``dp`` times a divisor of ``tp`` (the EP group folded over TP ranks,
    :func:`~jaxmodel.workload.params.expert_tp`); the rule lives in
    :mod:`jaxmodel.parallel.plan`.

    Example:
        >>> ok, why = moe_feasibility(hw_db.model("mixtral-8x7b"), jm.Parallelism(dp=3, ep=3))
        >>> jm.reason_name(why)                                # 'experts_not_divisible'
        'experts_not_divisible'
    """
    return nx.first_reason([c for c in _plan.structure_checks(_plan.LAYER, _plan.inputs(
        model, par)) if c[1] == "experts_not_divisible"])


def _scale(rows, w):
    return {k: (w * f, w * b) for k, (f, b) in rows.items()}


def _safe(w, t):
    """``w·t`` that is exactly 0 where ``w = 0``, even if ``t = inf``, with finite gradients
    (:func:`jaxmodel.numerics.weighted`)."""
    return nx.weighted(w, t)


def grouped_gemm(groups, m, n, k, weight=1.0, grouped=True):
    """Gemm rows ``[(Gemm, count)]`` of ``groups`` expert problems ``[m × k]×[k × n]`` (counts).

    ``grouped``: one grouped kernel, as the K-concatenated GEMM ``[m × groups·k]×[groups·k ×
    n]`` counted ``weight`` times (module docstring); else the per-expert loop, ``weight ·
    groups`` kernels ``[m × k]×[k × n]``. ``groups`` may be fractional (expected active
    experts). Both forms have the same FLOPs, ``2·groups·m·n·k`` per ``weight``.

    Example:
        >>> [(tuple(g[:3]), float(c)) for g, c in grouped_gemm(4.0, 2.0, 8.0, 16.0)]
        [((2.0, 8.0, 64.0), 1.0)]
    """
    if grouped:
        # no active expert (no tokens): no kernel, never an empty GEMM's +inf
        return [(_ffn.Gemm(m, n, groups * k), jnp.where(groups > 0, weight, 0.0))]
    return [(_ffn.Gemm(m, n, k), weight * groups)]


def grouped_extra_output(dev, groups, m, n, dtype_bytes=2.0):
    """Streaming time of the ``(groups − 1)·m·n`` elements of the per-expert ``[m × n]`` output
    (forward; the output gradient read by each gradient GEMM in the backward) a grouped kernel
    moves beyond its K-concatenated stand-in (:func:`grouped_gemm`), s: bytes over the memory bandwidth a
    GEMM's operand stream reaches (the ``η_mem`` of :func:`jaxmodel.ops.gemm_latency`'s library
    bound), no launch (the same kernel). 0 for ``groups ≤ 1``.
    """
    eff = jnp.where(dev.matmul_bw_efficiency > 0, dev.matmul_bw_efficiency,
                    dev.mem_bw_efficiency)
    extra = jnp.maximum(groups - 1.0, 0.0) * jnp.maximum(m, 0.0) * n * dtype_bytes
    return nx.safe_div(extra, dev.mem_bw * eff, fill=jnp.inf)


class ExpertDispatch(NamedTuple):
    """How the routed experts of an MoE layer receive and run their tokens (static choices).

    Attributes:
        dropless: no capacity factor, every routed token is computed (:func:`moe_dims`;
            serving), else the capacity-padded slots of training.
        grouped: the routed experts of a projection as one grouped GEMM kernel
            (:func:`grouped_gemm`) instead of one kernel per expert; ``None`` = ``dropless``.
    """

    dropless: bool = False
    grouped: bool | None = None


def ffn_rows(dev, model: Model, par: Parallelism, sh, tokens, dtype_bytes=2.0, backward=False,
             dispatch: ExpertDispatch = ExpertDispatch()):
    """FFN rows of one average layer: the dense FFN weighted ``1 − f``, the MoE FFN ``f``.

    Drop-in replacement of :func:`jaxmodel.workload.ffn.ffn_block` (same return format,
    ``(gemm_rows, vector_rows)``, counts may be arrays) adding the ``moe_router`` row. For a
    dense model ``f = 0`` and the rows equal ``ffn_block``'s exactly. ``dispatch``
    (:class:`ExpertDispatch`): dropless routing, and the routed experts as one grouped GEMM
    kernel or one kernel per expert.
    """
    dropless = dispatch.dropless
    grouped = dropless if dispatch.grouped is None else bool(dispatch.grouped)
    f = moe_layer_fraction(model)
    dense_g, dense_v = _ffn.ffn_block(dev, model, sh, tokens, dtype_bytes, backward)
    dims = moe_dims(model, par, tokens, dtype_bytes, dropless)
    n_exp, m = dims["experts"], dims["expert_tokens"]
    G = _ffn.Gemm
    # routed experts of width moe_d_ff (fine-grained experts); shared experts (DeepSeekMoE,
    # Dai et al. 2024 §3.2) as one dense FFN of n_shared·moe_d_ff on every token, TP-split
    e_ff = model.expert_d_ff / sh.tp
    # routed experts: split over the expert-TP degree etp = tp/ept (:func:`expert_tp`)
    e_ff_r = e_ff * expert_tp(par)[1]
    sh_r = sh._replace(d_ff=e_ff_r, ffn_in=(model.ffn_matrices - 1.0) * e_ff_r)
    has_shared = jnp.where(model.n_shared_experts > 0, 1.0, 0.0)
    s_ff = jnp.where(has_shared > 0, model.n_shared_experts, 1.0) * e_ff   # finite when 0
    sh_s = sh._replace(d_ff=s_ff, ffn_in=(model.ffn_matrices - 1.0) * s_ff)
    fs = f * has_shared
    gemms = {"w1": [(g, (1.0 - f) * c) for g, c in dense_g["w1"]]
             + grouped_gemm(n_exp, m, sh_r.ffn_in, sh.d_model, f, grouped)
             + [(G(tokens, sh_s.ffn_in, sh.d_model), fs)],
             "w2": [(g, (1.0 - f) * c) for g, c in dense_g["w2"]]
             + grouped_gemm(n_exp, m, sh.d_model, sh_r.d_ff, f, grouped)
             + [(G(tokens, sh.d_model, s_ff), fs)],
             "moe_router": [(G(tokens, jnp.maximum(model.n_experts, 1.0), sh.d_model), f)]}
    _, moe_v = _ffn.ffn_block(dev, model, sh_r, n_exp * m, dtype_bytes, backward)
    _, shared_v = _ffn.ffn_block(dev, model, sh_s, tokens, dtype_bytes, backward)
    act_d, act_m, act_s = dense_v["act"], moe_v["act"], shared_v["act"]
    vectors = {"act": tuple(_safe(1.0 - f, a) + _safe(f, b) + _safe(fs, c)
                            for a, b, c in zip(act_d, act_m, act_s))}

    # router softmax + top-k, dispatch (scatter into the slots) and combine (weighted gather)
    E = jnp.maximum(model.n_experts, 1.0)
    w = dtype_bytes
    ew = _ops.elementwise_latency.single
    # softmax over E (a few to a few hundred) columns: one streaming pass, read + write
    sm = ew(dev, tokens * E, 2.0 * w, dev.exp_flops + 5.0, True)
    topk = ew(dev, tokens * E, w, _TOPK_FLOP_PER_SCORE * model.top_k, True)
    slots_d = dims["slots"] * sh.d_model
    perm = ew(dev, slots_d, 2.0 * w, 0.0, True) + ew(dev, slots_d, 2.0 * w, 2.0, True)
    fwd = sm + topk + perm
    if backward:
        bwd = ew(dev, tokens * E, 3.0 * w, 4.0, True) + perm     # softmax bwd + permutations
    else:
        bwd = jnp.zeros_like(fwd)
    vectors["moe_router"] = (_safe(f, fwd), _safe(f, bwd))
    if grouped:
        # the per-expert [m × n] tensors the concatenated stand-in holds once: the forward
        # output, and the output gradient dC read by both gradient GEMMs (dX, dW)
        for row, n_ in (("w1", sh_r.ffn_in), ("w2", sh.d_model)):
            extra = _safe(f, grouped_extra_output(dev, n_exp, m, n_, dtype_bytes))
            vectors[row] = (extra, 2.0 * extra if backward else jnp.zeros_like(extra))
    return gemms, vectors


def alltoall_time(system: System, model: Model, par: Parallelism, tokens, dtype_bytes=2.0,
                  dropless=False, net: _comm.NetVariant = _comm.ANY_NET, dispatch_bytes=None):
    """:func:`alltoall_times`' forward (dispatch in ``dispatch_bytes``), seconds."""
    return alltoall_times(system, model, par, tokens, dtype_bytes, dropless, net,
                          dispatch_bytes)[0]


def alltoall_times(system: System, model: Model, par: Parallelism, tokens, dtype_bytes=2.0,
                   dropless=False, net: _comm.NetVariant = _comm.ANY_NET, dispatch_bytes=None):
    """Dispatch + combine all-to-all of one average layer, ``(forward, backward)`` seconds.

    Guo et al. eq. 3 (``T_A2A = E·C·D·precision / BW_A2A``) through the network model: two
    all-to-alls (dispatch, combine) of :func:`moe_dims`' ``a2a_bytes`` over the ``ep`` group,
    whose members are ``tp·pp`` devices apart (TP innermost, then PP, then DP; DeepSpeed-TED
    takes the EP group from the data-parallel ranks; ``tp`` apart under Megatron-core's
    order, ``par.order = 1``, :func:`jaxmodel.parallel.plan.placement`), weighted by the
    MoE-layer share ``f``. The backward pass repeats both (the gradients travel the same
    way back). 0 when ``ep = 1``.

    Node-limited routing (``0 < model.topk_group < model.n_group``; DeepSeek-V3 §2.1.2, §3.2.2) with the
    EP group spanning more than one node: :func:`node_limited_alltoall` instead — every token
    crosses InfiniBand once per destination node (at most ``M`` nodes,
    :func:`node_limit`) and is forwarded over NVLink inside it, the dispatch in
    ``dispatch_bytes`` per element (FP8 in DeepSeek-V3, §3.3.3; default ``dtype_bytes``),
    the combine in ``dtype_bytes``; no capacity padding (DeepSeek-V3 drops no tokens, §2.1.2).

    Tokens already on every EP rank: 0. With one data-parallel replica (``dp = 1``), the EP
    group folded inside the TP group (``ep ≤ tp``) and no sequence parallelism, every rank of
    the group holds the whole micro-batch (attention TP replicates its output), so a rank
    runs its local experts on the tokens routed to them and the layer's TP all-reduce
    (``allreduce_ffn``) sums the experts' outputs: nothing is dispatched or combined.
    Sources: TensorRT-LLM 1.0 ``_torch/models/modeling_qwen3_moe.py`` (``Qwen3MoE.forward``:
    without attention DP the fused MoE takes the replicated hidden states, its all-reduce
    over the TP group reduces the partial outputs) and ``_torch/modules/fused_moe``
    (``CutlassFusedMoE`` with ``ep > 1``: only the local experts' slots); vLLM
    ``model_executor/layers/fused_moe/layer.py`` (``FusedMoE`` with expert parallelism and no
    data parallelism: ``reduce_results`` all-reduces over the TP group).
    """
    f = moe_layer_fraction(model)
    dims = moe_dims(model, par, tokens, dtype_bytes, dropless)
    ep = par.ep
    replicated = ((jnp.maximum(par.dp, 1.0) < 1.5) & (ep <= jnp.maximum(par.tp, 1.0) + 0.5)
                  & (par.sp < 0.5))
    multi = (ep > 1.5) & ~replicated
    group = jnp.where(multi, ep, 2.0)      # double-where: never evaluate a group of 1
    # DP-drawn group at stride tp·pp; folded over TP ranks (ep > dp): neighbours, stride 1
    stride = jnp.where(ep > jnp.maximum(par.dp, 1.0), 1.0,
                       jnp.maximum(par.tp, 1.0) * jnp.where(
                           getattr(par, "order", 0.0) > 0.5, 1.0, jnp.maximum(par.pp, 1.0)))
    t = _comm.collective_latency.single(system, "all_to_all", dims["a2a_bytes"], group, "auto",
                                        stride, net)
    generic = jnp.where(multi, _safe(f, 2.0 * t), 0.0)
    # node-limited routing over the nodes the group spans (members ``stride`` apart)
    g = jnp.maximum(system.levels[0].size, 1.0)
    nodes = jnp.where(stride >= g, ep, jnp.maximum(ep * stride / g, 1.0))
    # a restriction only where fewer groups than there are may be reached (topk_group =
    # n_group, as DeepSeek-V2-Lite's 1 of 1, routes freely: the generic all-to-all)
    limited = ((model.topk_group > 0) & (model.topk_group < model.n_group) & (nodes > 1.5)
               & (len(system.levels) > 1))
    if len(system.levels) < 2:
        return generic, generic
    w_d = dtype_bytes if dispatch_bytes is None else dispatch_bytes
    out = []
    for w in (w_d, dtype_bytes):          # forward dispatch, backward (gradients) in dtype
        t_nl = node_limited_alltoall(system, tokens / expert_tp(par)[1], model.d_model,
                                     model.top_k, node_limit(model, nodes), nodes, w,
                                     dtype_bytes)
        out.append(jnp.where(multi & limited, _safe(f, t_nl), generic))
    return tuple(out)


def node_limit(model: Model, ep_nodes):
    """Nodes a token's routed experts reach at most, ``M`` (count): DeepSeek-V3 §2.1.2 sends
    each token to at most ``topk_group`` of the ``n_group`` expert groups, one group per node
    of its 8-node EP group (``n_group = 8``); with the EP group spanning ``N`` nodes each group
    covers ``max(N/n_group, 1)`` of them, so ``M = min(topk_group · max(N/n_group, 1), N,
    k)`` (never more nodes than the ``k`` routed experts)."""
    per_group = jnp.maximum(nx.safe_div(ep_nodes, model.n_group, fill=1.0), 1.0)
    return jnp.minimum(jnp.minimum(model.topk_group * per_group, ep_nodes),
                       jnp.maximum(model.top_k, 1.0))


def expert_params_per_device(model: Model, par: Parallelism):
    """Routed-expert weights on the most loaded device (count): ``n_moe/pp · (E/ep) ·
    expert/etp`` (:func:`~jaxmodel.workload.params.expert_tp`; the MoE layers of the stage with ``⌈L/p⌉`` layers, :func:`stage_moe_layers`;
    shared experts are dense weights, reduced over ``dp``).

    The part of :func:`jaxmodel.workload.params.params_per_device` whose gradients are reduced
    (and optimizer states ZeRO-sharded) over ``DP_exp = dp/ep`` only (DeepSpeed-TED §4;
    DeepSpeed-MoE expert-data-parallel groups). The router is dense (reduced over ``dp``).
    """
    ep = jnp.maximum(par.ep, 1.0)
    return (stage_moe_layers(model, par)[1] * model.n_experts / ep * expert_params(model)
            / expert_tp(par)[0])


def stage_moe_layers(model: Model, par: Parallelism):
    """MoE layers on the first, the most loaded and the last pipeline stage: the stage's
    layers (:func:`jaxmodel.parallel.pipeline.stage_layers`) times the model-wide MoE share
    (counts; ``n_moe/pp`` each when ``pp`` divides the layers)."""
    share = n_moe_layers(model) / jnp.maximum(model.n_layers, 1.0)
    return tuple(share * x for x in stage_layers(model.n_layers, par.pp))


def moe_activation_bytes(model: Model, par: Parallelism, micro_batch, seq_len):
    """Extra activation memory of one average layer of an MoE model, bytes per device.

    Korthikanti et al. 2022 §4.1 count the MLP's stored tensors on ``s·b`` tokens (for GELU
    ``2·sbh`` input + ``16·sbh`` internals; generalised in
    :func:`jaxmodel.workload.memory.activation_bytes_per_layer`); an MoE layer stores the
    expert inputs and internals on its ``slots = capacity_factor·k·s·b`` dispatched tokens
    instead of ``s·b``, plus the fp32 gate probabilities ``[s·b, E]``. The difference,
    weighted by the MoE-layer share, is returned (0 for dense models). Selective/full
    recomputation do not drop it (the expert block is not recomputed selectively).
    """
    tp = jnp.maximum(par.tp, 1.0)
    tokens = micro_batch * seq_len
    dims = moe_dims(model, par, tokens)
    extra_tokens = dims["slots"] - tokens
    ffn = extra_tokens * (2.0 * model.d_model + 2.0 * model.ffn_matrices * model.expert_d_ff / tp)
    gates = 4.0 * tokens * model.n_experts
    full = par.recompute > 1.5          # full, or norm_upproj (its own inventory)
    return jnp.where(full, 0.0, moe_layer_fraction(model) * (ffn + gates))


@batched
def moe_layer_times(system: System, model: Model, par: Parallelism, tokens, dtype_bytes=2.0,
                    dropless=False):
    """MoE-specific forward times of one MoE layer (not averaged) on one device, seconds.

    A convenience for analyses (Guo et al. Fig. 6): ``alltoall`` (dispatch + combine),
    ``router`` (gating GEMM, softmax, top-k, permutations) and the ``capacity``/``a2a_bytes``
    of :func:`moe_dims`. GEMMs use the ops tile search.

    Example:
        >>> r = moe_layer_times(hw_db.system("dgx_a100", nodes=4), hw_db.model("mixtral-8x7b"),
        ...                     jm.Parallelism(dp=4, tp=8, ep=8), 2048.0)
        >>> sorted(r)[:3], bool(r["alltoall"] > 0)
        (['a2a_bytes', 'alltoall', 'capacity'], True)
    """
    dims = moe_dims(model, par, tokens, dtype_bytes, dropless)
    one = _with_all_moe(model)
    a2a = alltoall_time(system, one, par, tokens, dtype_bytes, dropless)
    dev = system.device
    E = jnp.maximum(model.n_experts, 1.0)
    gate = _ops.gemm_latency.single(dev, tokens, E, model.d_model, 1.0, dtype_bytes, True)
    ew = _ops.elementwise_latency.single
    slots_d = dims["slots"] * model.d_model
    router = (gate + ew(dev, tokens * E, 2.0 * dtype_bytes, dev.exp_flops + 5.0, True)
              + ew(dev, tokens * E, dtype_bytes, _TOPK_FLOP_PER_SCORE * model.top_k, True)
              + ew(dev, slots_d, 2.0 * dtype_bytes, 0.0, True)
              + ew(dev, slots_d, 2.0 * dtype_bytes, 2.0, True))
    return {"alltoall": a2a, "router": router, "capacity": dims["capacity"],
            "a2a_bytes": dims["a2a_bytes"]}


def _with_all_moe(model: Model) -> Model:
    """The model with every layer an MoE layer (``f = 1``), for per-MoE-layer figures."""
    import dataclasses
    return dataclasses.replace(model, moe_every=jnp.ones_like(jnp.asarray(model.moe_every)),
                               first_k_dense=jnp.zeros_like(jnp.asarray(model.first_k_dense)))


def node_limited_alltoall(system: System, tokens, d_model, top_k, max_nodes, ep_nodes,
                          dispatch_bytes=1.0, combine_bytes=2.0):
    """Dispatch + combine of one MoE layer's forward under node-limited routing with
    DeepEP-style forwarding (InfiniBand across nodes, NVLink inside), seconds per device.

    Source: DeepSeek-AI, "DeepSeek-V3 Technical Report" (2024), §3.2.2: each token is sent to
    at most ``M`` nodes (``max_nodes``; 4 in DeepSeek-V3, its ``topk_group``), once per node
    over InfiniBand to the GPU with the same in-node index, which forwards it over NVLink to
    the node's GPUs holding its experts; InfiniBand and NVLink transfers overlap; dispatch in
    FP8 (1 B), combine in BF16 (2 B) (§3.3.3). With the ``M`` nodes of a token uniform over
    the ``N = ep_nodes`` nodes of the EP group, its own node is among them with probability
    ``M/N``, so ``M·(1 − 1/N)`` copies cross InfiniBand; of the ``k`` expert copies a share
    ``1 − 1/g`` (``g`` GPUs per node) moves over NVLink. Per direction and device:
    ``IB = T·M·(1 − 1/N)·d·w``, ``NVL = T·k·(1 − 1/g)·d·w``; time ``max(IB/(B_IB·η_IB),
    NVL/(B_NVL·η_NVL))`` per all-to-all, for ``w`` = dispatch then combine bytes. Levels:
    ``system.levels[0]`` the node (NVLink), ``[1]`` InfiniBand (bytes/s per device and
    direction times the level's achievable ``efficiency``). Units: s, bytes.
    """
    nvl, ib = system.levels[0], system.levels[1]
    g = jnp.maximum(nvl.size, 1.0)
    n = jnp.maximum(ep_nodes, 1.0)
    m_nodes = jnp.minimum(jnp.maximum(max_nodes, 1.0), n)
    remote = m_nodes * (1.0 - 1.0 / n)
    local = jnp.maximum(top_k, 1.0) * (1.0 - 1.0 / g)
    total = 0.0
    for w in (dispatch_bytes, combine_bytes):
        t_ib = nx.safe_div(tokens * remote * d_model * w, ib.bw_per_device * ib.efficiency,
                           fill=jnp.inf)
        t_nvl = nx.safe_div(tokens * local * d_model * w, nvl.bw_per_device * nvl.efficiency,
                            fill=jnp.inf)
        total = total + jnp.maximum(t_ib, t_nvl)
    return total


def dualpipe_overlap(compute, comm, sm_total, sm_comm):
    """Exposed time of a DualPipe chunk pair, seconds: ``(compute', exposed_comm)``.

    Source: DeepSeek-V3 Technical Report §3.2.1 (Fig. 4): a forward chunk of one micro-batch
    and a backward chunk of another run together, the all-to-all dispatch/combine and the
    pipeline transfers of each hidden behind the other's computation; ``sm_comm`` of the
    ``sm_total`` SMs (20 of 132 on H800, §3.2.2) run the communication, so the computation
    runs on the rest: ``compute' = compute·sm_total/(sm_total − sm_comm)``, and the
    communication shows only where it outlasts it: ``exposed = max(comm − compute', 0)``.
    ``compute`` and ``comm`` are the pair's totals (s).
    """
    share = nx.safe_div(sm_total, sm_total - sm_comm, fill=jnp.inf)
    slowed = compute * share
    return slowed, jnp.maximum(comm - slowed, 0.0)


def norm_upproj_activation_bytes(model: Model, tokens, tp=1.0, act_bytes=2.0, fp8_bytes=1.0,
                                 e5m6_bytes=1.5):
    """Activations one average MLA layer stores for its backward under DeepSeek-V3's
    recomputation (the ``norm_upproj`` recompute code), bytes per device.

    Source: DeepSeek-V3 Technical Report §3.2.3 (RMSNorm and the MLA up-projections
    recomputed in the backward: their outputs are not stored) and §3.3.3 (the input of the
    Linear after attention cached in E5M6, 1.5 B; the experts' inputs cached in FP8 — they
    are quantised before the dispatch —; the SwiGLU inputs cached in FP8 and its output
    recomputed). Per token (``T = tokens``): the layer input and the attention's residual
    output, ``2·d`` words; MLA's latents ``d_c' + d_c + d_h^R`` (q_lora_rank, kv_lora_rank,
    qk_rope_head_dim) words, from which the recomputed up-projections rebuild Q, K, V; the
    attention output ``h·d_v/t`` in E5M6 with FlashAttention's fp32 log-sum-exp ``4·h/t``.
    FFN, an MoE layer (share ``f`` of the layers, :func:`moe_layer_fraction`): the fp32
    router scores ``4·E``; per routed copy (``k``) and for the shared experts the FP8 input
    ``d`` and the FP8 SwiGLU input ``2·d_ff^e/t``; a dense layer (``1 − f``): the FP8 input
    ``d`` and SwiGLU input ``(ffn_matrices − 1)·d_ff/t``. The routing weight's gradient is
    taken as the row-wise product of the recomputed SwiGLU output and W2's input gradient,
    so no expert output is stored (an assumption; the report does not say). ``fp8_bytes``:
    the GEMM input type of the precision (1 under FP8, the activation width otherwise).
    Units: bytes.
    """
    t = jnp.maximum(tp, 1.0)
    d = model.d_model
    h = model.n_heads / t
    latents = model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim
    attn = (2.0 * d + latents) * act_bytes + h * model.v_head_dim * e5m6_bytes + 4.0 * h
    copies = model.top_k + model.n_shared_experts
    gate = model.ffn_matrices - 1.0
    experts = (4.0 * model.n_experts
               + copies * (d + gate * model.expert_d_ff / t) * fp8_bytes)
    dense = (d + gate * model.d_ff / t) * fp8_bytes
    f = moe_layer_fraction(model)
    return tokens * (attn + _safe(f, experts) + _safe(1.0 - f, dense))
