"""Memory footprint per device: weights, gradients, optimizer states, activations, KV cache.

Every tensor class follows its storage type in the :class:`jaxmodel.Precision` (default
``"bf16"``; see :mod:`jaxmodel.precisions` for the presets and their sources).

Sources:
- mixed-precision Adam: 2 B fp16/bf16 weights + 2 B gradients (4 B with fp32 main gradients, as
  Megatron-LM keeps them) + 12 B optimizer states (fp32 master weights, momentum, variance) per
  parameter (Rajbhandari et al. 2020, ZeRO §3 "K = 12"); with ``precision``: weights
  ``weight_bytes``, the low-precision weight caches of Transformer Engine
  (:func:`weight_cache_bytes`: FP8 data + transpose), gradients ``grad_bytes``, optimizer
  ``master_bytes + optim_bytes`` — each a term of :func:`memory_breakdown`;
- ZeRO stages over ``dp`` (Rajbhandari et al. 2020 §5): stage 1 shards optimizer states,
  stage 2 also gradients, stage 3 also the weights;
- activations per layer: Korthikanti et al. 2022 (MLSys 2023) §4, eqs. 1–2 and Table 2,
  generalised to GQA, ``d_ff ≠ 4d`` and SwiGLU, with FP8 recipes' weight-GEMM inputs stored
  in FP8 (see :func:`activation_bytes_per_layer`);
- KV cache: ``2 · b · s · h_kv · d_h`` words per layer (Pope et al. 2023 §2); MLA's latent
  ``b · s · (d_c + d_h^R)`` (DeepSeek-V2 §2.1.2); sliding windows cap ``s``.

Units: bytes.

Example:
    >>> m = jm.training_memory(hw_db.model("gpt3-175b"),
    ...                        jm.Parallelism(tp=8, pp=8, sp=True, recompute="selective"),
    ...                        2048, in_flight=8)
    >>> float(m["total"]) / 2**30   # GiB per device (fp32 main gradients, as train_step)
    56.4
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.batching import batched
from jaxmodel.numerics import computed_once
from jaxmodel.parallel.pipeline import stage_layers
from jaxmodel.types import Model, Parallelism
from jaxmodel.workload import moe as _moe
from jaxmodel.workload.moe import moe_activation_bytes
from jaxmodel.workload import params as _params
from jaxmodel.workload.params import params_per_device
from jaxmodel import precisions as _prec


@batched
def activation_bytes_per_layer(model: Model, par: Parallelism, micro_batch, seq_len,
                               act_bytes=2.0, gemm_input_bytes=None):
    """Activation memory one layer stores for the backward pass, bytes per device.

    Source: Korthikanti et al. 2022 §4.1 (per-layer inventory, 2-byte activations, 1-byte
    dropout masks): attention ``11·sbh + 5·a·s²·b``, MLP ``19·sbh``, layernorms ``4·sbh``, in
    total ``sbh·(34 + 5as/h)``; §4.2.1 with TP ``sbh·(10 + 24/t + 5as/(ht))``; §4.2.2 with TP+SP
    ``sbh·(34/t + 5as/(ht))``; §5 selective recomputation drops the ``5as/h`` term; full
    recomputation keeps only the layer input ``2·sbh`` (Table 2; divided by ``t`` under SP,
    where Megatron checkpoints the sequence-sharded input). With ``flash_attention`` the
    ``s × s`` tensors are not stored (Dao et al. 2022), only the fp32 log-sum-exp (``4·a·s·b``).

    Generalisation (reduces to the paper's terms for GPT: ``d_attn = d_kv = h``, ``d_ff = 4h``):
    - replicated under TP (sharded by SP): two layernorm inputs ``4·sbd``, QKV input ``2·sbd``,
      two dropout masks ``2·sbd``, FFN input ``2·sbd`` → ``10·sbd``;
    - split over ``t``: Q ``2·sb·d_attn``, K and V ``4·sb·d_kv``, ``W_o`` input ``2·sb·d_attn``,
      FFN internals ``2·ffn_matrices·sb·d_ff`` (GELU: its input and ``W2``'s input ``16·sbh``;
      SwiGLU: gate, up and their product);
    - attention scores: softmax output (2), dropout mask (1), dropout output (2) → ``5·a·s²·b``.

    Precision: the 2-byte activation terms scale with ``act_bytes / 2``; the 1-byte dropout
    masks and FlashAttention's fp32 log-sum-exp do not.

    Quantised GEMM inputs (``gemm_input_bytes``, :func:`stored_gemm_input_bytes`): a
    Transformer Engine ``Linear`` / ``LayerNormLinear`` running in FP8 saves for its backward
    the FP8 cast of its input (or its transpose), not the 16-bit tensor (TransformerEngine
    ``pytorch/module/linear.py`` and ``layernorm_linear.py``, ``_Linear.forward``: the saved
    ``inputmat`` / ``ln_out`` is the FP8 tensor when ``fp8`` is on; TE 1.x). Four tensors of
    the inventory are such inputs: the QKV input (the first norm's output) and the FFN input
    (the second norm's output), ``2·sbd`` each, the ``W_o`` input ``2·sb·d_attn`` and the
    ``W2`` input ``2·sb·d_ff`` (GELU output; SwiGLU's product). The attention kernel keeps its
    own 16-bit output for its backward (FlashAttention saves ``O``; TE ``FusedAttnFunc``
    saves q, k, v, out), so without recomputation an FP8 ``W_o`` input is stored twice (16-bit
    and FP8); selective recomputation checkpoints the core attention (Megatron-core
    ``TransformerConfig.recompute_granularity = "selective"``), whose output is then
    recomputed and only the FP8 copy stays. The norm inputs, Q, K, V and the activation
    function's input stay 16-bit. Default ``gemm_input_bytes = act_bytes`` (Korthikanti's
    inventory).

    Args:
        micro_batch: sequences per micro-batch (``b``).
        seq_len: sequence length (``s``).
        act_bytes: bytes per stored activation element (2 in Korthikanti et al.).
        gemm_input_bytes: bytes per stored weight-GEMM input element (default
            ``act_bytes``).
            The ``norm_upproj`` recompute code's FP8-cached inputs take the same width
            (:func:`_norm_upproj`).
    """
    w = act_bytes / 2.0
    g = w if gemm_input_bytes is None else gemm_input_bytes / 2.0
    tp = jnp.maximum(par.tp, 1.0)
    sp = par.sp > 0.5
    rc = par.recompute
    flash = par.flash_attention > 0.5
    sb = seq_len * micro_batch
    d = model.d_model
    d_attn = model.n_heads * model.head_dim
    kv_heads = jnp.maximum(model.n_kv_heads / tp, 1.0) * tp   # replicated KV heads count full
    d_kv = kv_heads * model.head_dim
    # two norm inputs (4w), QKV and FFN inputs (2g each), 2 dropout masks of 1 B
    replicated = (4.0 * w + 4.0 * g + 2.0) * sb * d
    # quantised W_o input: FlashAttention's own 16-bit output too, unless recomputed
    o_twice = jnp.where(flash & (rc < 0.5) & (g != w), 2.0 * w, 0.0)
    split = sb * (2.0 * w * d_attn + 4.0 * w * d_kv + (2.0 * g + o_twice) * d_attn
                  + (2.0 * w * (model.ffn_matrices - 1.0) + 2.0 * g) * model.d_ff)
    scores = jnp.where(flash,
                       4.0 * model.n_heads * seq_len * micro_batch,
                       (4.0 * w + 1.0) * model.n_heads * seq_len * sb)
    scores = jnp.where(rc > 0.5, 0.0, scores)        # selective (and full) recompute
    replicated = jnp.where(sp, replicated / tp, replicated)
    per_layer = (replicated + split / tp + scores / tp
                 + moe_activation_bytes(model, par, micro_batch, seq_len))   # 0 when dense
    full = jnp.where(sp, 2.0 * w * sb * d / tp, 2.0 * w * sb * d)
    return jnp.where(rc > 2.5, _norm_upproj(model, tp, sb, act_bytes, gemm_input_bytes),
                     jnp.where(rc > 1.5, full, per_layer))


def _norm_upproj(model: Model, tp, tokens, act_bytes, gemm_bytes):
    """The ``norm_upproj`` recompute code's inventory (DeepSeek-V3 §3.2.3, §3.3.3;
    :func:`jaxmodel.workload.moe.norm_upproj_activation_bytes`): FP8-cached inputs at the
    GEMM input width ``gemm_bytes`` (default ``act_bytes``), E5M6 (1.5 B) for the attention
    output when that is below ``act_bytes``, bytes."""
    g = act_bytes if gemm_bytes is None else gemm_bytes
    return _moe.norm_upproj_activation_bytes(model, tokens, tp, act_bytes, g,
                                             jnp.where(g < act_bytes, 1.5, act_bytes))


#: The terms of a training step's memory (:func:`training_memory`, ``TrainResult.memory``),
#: bytes per device; they sum to its ``total`` (:func:`memory_breakdown`).
TRAIN_MEMORY_TERMS = ("weights", "fp8_weight_cache", "gradients", "optimizer", "activations",
                      "tp_comm_buffers", "nccl_buffers")

#: Transformer Engine's userbuffer communicators (``initialize_ub``, TE 1.8–2.x defaults):
#: ``(count, of them holding the all-gathered GEMM input)``: the ``ring_exchange``
#: ``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``, ``fc2_dgrad``, the ``pipeline``
#: ``proj_fprop``, ``fc2_fprop`` and the ``bulk`` ``qkv_dgrad``, ``qkv_wgrad``,
#: ``fc1_dgrad``, ``fc1_wgrad``; ``layers_all_gather_overlap`` lists six of them.
TE_USERBUFFERS = (10, 6)


def stored_gemm_input_bytes(prec):
    """Bytes per element of a weight-GEMM input stored for the backward: the quantised word
    (:func:`jaxmodel.precisions.gemm_word`, block scales included) where the recipe casts
    every GEMM input (``cast_bytes > 0``: Transformer Engine's FP8 ``Linear`` saves the FP8
    cast, see :func:`activation_bytes_per_layer`), else ``act_bytes``. Units: bytes."""
    return jnp.where(prec.cast_bytes > 0, _prec.gemm_word(prec), prec.act_bytes)


def tp_comm_buffer_bytes(model: Model, tokens, prec):
    """Device memory of Transformer Engine's tensor-parallel communication buffers
    (userbuffers) while ``--tp-comm-overlap`` runs, bytes per device.

    Source: Transformer Engine ``pytorch/module/base.py``, ``initialize_ub`` (1.8; the same
    communicators in 2.x): one communicator per overlapped GEMM of a layer
    (:data:`TE_USERBUFFERS`, 10), each registering a buffer of the layer input's global shape
    ``[tokens, d_model]`` — NeMo's ``MegatronGPTModel.initialize_ub_func`` and Megatron-LM's
    ``initialize_tp_communicators`` pass ``seq_length · micro_batch_size /
    context_parallel_size`` rows — shared by every layer of the model (allocated once, not
    per layer or micro-batch). The six all-gather buffers hold the quantised GEMM input
    under an FP8 recipe (``fp8_buf``: ``uint8`` when ``use_fp8``; here
    :func:`stored_gemm_input_bytes`), the four reduce-scatter buffers the 16-bit
    ``act_bytes``. Per-model ``ub_cfgs`` can move a buffer between the two widths
    (``fp8_buf`` on ``proj_fprop``) or enlarge a ring-exchange reduce-scatter buffer
    ``(2·tp − 1)/tp`` times (``comm_gemm_overlap.cpp``, ``CommOverlapP2PBase``); the
    defaults are counted. Not counted: the two extra cuBLAS workspaces of the userbuffer
    streams (``_NUM_MAX_UB_STREAMS = 3`` copies of 32 MiB on Hopper).

    Args:
        tokens: rows of the buffers, ``b · s / cp`` (micro-batch × sequence length over the
            context-parallel degree).
        prec: a :class:`jaxmodel.Precision`.

    Example (GPT-3 175B, micro-batch 1, 2,048 tokens, FP8: 14 bytes per element of
    ``[2048, 12288]``):
        >>> b = jm.workload.memory.tp_comm_buffer_bytes(hw_db.model("gpt3-175b"), 2048,
        ...                                             jm.precision("fp8"))
        >>> round(float(b) / 2**20)    # MiB
        336
    """
    count, gathered = TE_USERBUFFERS
    per_element = (gathered * stored_gemm_input_bytes(prec)
                   + (count - gathered) * prec.act_bytes)
    return per_element * tokens * model.d_model


def nccl_group_bytes(group_size, comm_bytes, pair_bytes):
    """Device memory of one NCCL communicator of ``group_size`` ranks that has run a
    collective, bytes: ``comm_bytes`` for three ranks or more, ``pair_bytes`` for two, 0 for
    one (no peer, no connection). Source and values: ``nccl_comm_bytes`` /
    ``nccl_pair_comm_bytes`` of ``hw_db/tech/training.toml`` (see :func:`nccl_buffer_bytes`).
    """
    g = jnp.asarray(group_size)
    return jnp.where(g > 2.5, comm_bytes, jnp.where(g > 1.5, pair_bytes, 0.0))


def nccl_buffer_bytes(model: Model, par: Parallelism, comm_bytes, pair_bytes):
    """Device memory of the NCCL communicators one rank of a Megatron-core training step
    runs collectives on, bytes per device.

    NCCL allocates, per communicator, a FIFO per channel and peer connection (NCCL
    ``src/init.cc`` ``computeBuffSizes``: Simple ``NCCL_BUFFSIZE`` 4 MiB + LL128 4.6875 MiB +
    LL 0.5 MiB) outside PyTorch's caching allocator; the buffers grow with the channels, not
    with the ranks (the NCCL maintainers' answers on github.com/NVIDIA/nccl, reports 864 and
    986). One value per communicator (:func:`nccl_group_bytes`): ``comm_bytes`` measured for
    a process group of more than two ranks on A100, ``pair_bytes`` for two ranks (a
    measurement reported on github.com/NVIDIA/nccl, report 964).

    Communicators (Megatron-core ``parallel_state`` groups, core_r0.8.0), each of its size:
    tensor parallel ``tp`` (the TP / SP collectives), context parallel ``cp``, data parallel
    with CP ``dp·cp`` (gradient reduce-scatter, parameter all-gather: ``distributed/
    param_and_grad_buffer.py``), expert parallel ``ep`` and its expert data-parallel group
    ``dp·cp/ep`` where ``ep > 1``, the embedding group of the first and last stage (2 ranks,
    ``finalize_model_grads.py`` all-reduces the tied word-embedding gradient when ``pp > 1``),
    and the gradient-norm / found-inf all-reduce group (``optimizer/clip_grads.py``): the
    model-parallel group ``tp·cp·pp``, the whole world with the distributed optimizer
    (``DistributedOptimizer.get_model_parallel_group`` returns None from ZeRO-1). Not counted:
    the pipeline's send/receive, whose channels share one buffer pool per communicator
    (github.com/NVIDIA/nccl, report 1450), the position-embedding group of a single
    first-stage rank, and communicators created but never used (NCCL allocates the connections at the first
    collective). The first stage, the one with the most activations in flight, belongs to
    every group counted.

    Args:
        comm_bytes, pair_bytes: bytes of a communicator of ≥ 3 and of 2 ranks
            (``hw_db/tech/training.toml``: ``nccl_comm_bytes``, ``nccl_pair_comm_bytes``).

    Example (GPT-3 175B, TP 4, PP 6, DP 64, distributed optimizer: the TP, DP, world and
    embedding groups, 3 × 688 MB + 544 MB):
        >>> par = jm.Parallelism(dp=64, tp=4, pp=6, zero=1)
        >>> round(float(jm.workload.memory.nccl_buffer_bytes(
        ...     hw_db.model("gpt3-175b"), par, 688e6, 544e6)) / 1e6)
        2608
    """
    tp, cp, pp = par.tp, par.cp, par.pp
    dp_cp = par.dp * cp
    ep = par.ep
    world = tp * cp * pp * par.dp
    stats = jnp.where(par.zero > 0.5, world, tp * cp * pp)
    embedding = jnp.where((pp > 1.5) & (model.tied_embeddings > 0.5), 2.0, 1.0)
    expert_dp = jnp.where(ep > 1.5, dp_cp / jnp.maximum(ep, 1.0), 1.0)
    groups = (tp, cp, dp_cp, ep, expert_dp, embedding, stats)
    return sum(nccl_group_bytes(g, comm_bytes, pair_bytes) for g in groups)


def weight_cache_bytes(prec):
    """Bytes per parameter of the low-precision weight copies kept across the micro-batches
    of a step (0 without a quantised copy, ``weight_copy_bytes = 0``).

    Source: Transformer Engine 1.x ``pytorch/module/base.py``,
    ``TransformerEngineBaseModule.get_fp8_workspace``: a module whose weights are not FP8
    keeps an FP8 workspace (``Float8Tensor`` of the weight's shape, 1 B per element) cached
    under ``cache_name="weight"`` whenever ``is_first_microbatch`` is given, filled by
    ``cast_transpose_`` with the data *and* its transpose (Hopper's FP8 GEMMs take only the
    "TN" layout, so the backward's ``dgrad`` GEMM reads the transpose). Megatron-core passes
    ``is_first_microbatch`` unless ``TransformerConfig.disable_parameter_transpose_cache``
    (default False: "the parameter transposes are cached for subsequent iterations";
    ``extensions/transformer_engine.py`` ``TELinear.forward``). With FP8 primary weights
    (TE ``fp8_model_init``, NeMo ``fp8_params``: ``weight_bytes`` no larger than the copy)
    the weights are the FP8 data and only the cached transpose is added
    (``Float8Tensor.transpose_2d(cache=True)``). Per element of a copy: ``weight_copy_bytes``
    plus the block scales (:func:`jaxmodel.precisions.scale_overhead`).

    Returns: bytes per parameter — ``2·copy`` (data + transpose), ``copy`` (transpose only,
    FP8 primary weights) or 0.
    """
    copy = prec.weight_copy_bytes
    word = copy + jnp.where(copy > 0, _prec.scale_overhead(prec), 0.0)
    primary = prec.weight_bytes <= word
    return jnp.where(copy > 0, jnp.where(primary, word, 2.0 * word), 0.0)


def quantised_input_delta(model: Model, par: Parallelism, micro_batch, seq_len, prec):
    """Bytes per layer and micro-batch by which storing the weight-GEMM inputs in
    :func:`stored_gemm_input_bytes` changes :func:`activation_bytes_per_layer` (≤ 0 with
    selective or full recomputation; the term is linear in the tokens, so it applies to any
    inventory of the same ``seq_len`` local tokens, e.g. context parallelism's). Units: bytes.
    """
    base = activation_bytes_per_layer.single(model, par, micro_batch, seq_len, prec.act_bytes)
    quant = activation_bytes_per_layer.single(model, par, micro_batch, seq_len, prec.act_bytes,
                                              stored_gemm_input_bytes(prec))
    return quant - base


def memory_breakdown(result) -> dict:
    """Training memory per device by term, GiB: :data:`TRAIN_MEMORY_TERMS` and ``total``
    (their sum), from a :class:`jaxmodel.TrainResult` (its ``memory``) or a
    :func:`training_memory` dict. Each value keeps the batch shape of the result.

    Terms (see :func:`training_memory` for the sources): ``weights`` (the model weights in
    ``weight_bytes``, ZeRO-3: the shard plus the gathered units), ``fp8_weight_cache`` (the
    cached low-precision copies, :func:`weight_cache_bytes`), ``gradients`` (the gradient
    buffer in ``grad_bytes``), ``optimizer`` (master weights + Adam moments, sharded over
    DP×CP by the distributed optimizer from ZeRO-1), ``activations`` (the in-flight
    micro-batches' stored activations), ``tp_comm_buffers`` (Transformer Engine's
    userbuffers where the TP overlap runs, :func:`tp_comm_buffer_bytes`), ``nccl_buffers``
    (the NCCL communicators' buffers, :func:`nccl_buffer_bytes`).

    Raises:
        ValueError: ``result`` has no memory terms.
    """
    mem = getattr(result, "memory", result)
    if not isinstance(mem, dict) or any(k not in mem for k in TRAIN_MEMORY_TERMS):
        raise ValueError(f"memory_breakdown: result={type(result).__name__} carries no "
                         f"training memory terms {TRAIN_MEMORY_TERMS}")
    out = {k: mem[k] / 2.0 ** 30 for k in TRAIN_MEMORY_TERMS}   # numbers stay numbers
    out["total"] = sum(out[k] for k in TRAIN_MEMORY_TERMS)
    return out


def _stage_in_flight(in_flight):
    """``(first, most, last)`` in-flight counts from a scalar (every stage alike) or a
    3-tuple (:func:`jaxmodel.parallel.pipeline.stage_in_flight`)."""
    if isinstance(in_flight, (tuple, list)):
        return tuple(in_flight)
    return (in_flight, in_flight, in_flight)


@batched
def training_memory(model: Model, par: Parallelism, seq_len, in_flight, grad_bytes=None,
                    precision=None, act_per_layer=None, last_stage_extra=0.0):
    """Training memory of the most loaded device (the pipeline stage with the largest total),
    bytes.

    Source: see module docstring. Per parameter of ``precision`` (default ``"bf16"``) and of
    :func:`~jaxmodel.workload.params.stage_params`, the terms :data:`TRAIN_MEMORY_TERMS`:

    - ``weights``: ``weight_bytes`` (2 B: Megatron-core's bf16 parameter buffer,
      ``distributed/param_and_grad_buffer.py``; 1 B with FP8 primary weights);
    - ``fp8_weight_cache``: :func:`weight_cache_bytes` (FP8: 2 B, the cached FP8 data and
      its transpose; 1 B with FP8 primary weights; 0 in 16-bit recipes);
    - ``gradients``: ``grad_bytes`` (4 B: fp32 main gradients, Megatron's
      ``accumulate_allreduce_grads_in_fp32``; 2 B where the recipe reduces in bf16, NeMo's
      ``grad_sync_dtype: bf16``), the contiguous gradient buffer;
    - ``optimizer``: ``master_bytes + optim_bytes`` (4 + 8 = 12 B: fp32 main parameters and
      Adam's two moments; Megatron-core ``optimizer/distrib_optimizer.py`` keeps them for
      the rank's shard of the DP×CP group only — the caller passes ``par.dp`` = DP·CP);
    - ``activations``: ``in_flight`` micro-batches (of ``par.micro_batch`` sequences)
      through the stage's layers, each :func:`activation_bytes_per_layer` with the GEMM
      inputs in :func:`stored_gemm_input_bytes`;
    - ``tp_comm_buffers``: 0 here; the training step adds Transformer Engine's userbuffers
      (:func:`tp_comm_buffer_bytes`) where its TP overlap runs;
    - ``nccl_buffers``: 0 here; the training step adds its NCCL communicators' buffers
      (:func:`nccl_buffer_bytes`).

    The model states are divided by ``dp`` from ZeRO stage 1 (optimizer), 2 (+ gradients),
    3 (+ weights and their caches). Three stages are evaluated — the first (embedding),
    the most loaded middle one (``⌈L/p⌉`` layers) and the last (LM head), see
    :func:`jaxmodel.parallel.pipeline.stage_layers` — and the one with the largest total is
    returned (all three coincide when ``pp`` divides the layers and ``in_flight`` is a scalar).

    Args:
        seq_len: sequence length.
        in_flight: micro-batches whose activations a stage holds at its peak, in units of
            one micro-batch through all the stage's layers: 1 without pipelining, ``pp`` for
            the first stage under 1F1B, ``pp + (pp−1)/m`` for interleaved 1F1B with ``m``
            chunks (Korthikanti §4.2.3), the number of micro-batches under GPipe — a scalar
            (every stage alike) or the ``(first, second, last)`` stages' counts of
            :func:`jaxmodel.parallel.pipeline.stage_in_flight`.
        grad_bytes: bytes per gradient element (default ``precision.grad_bytes``).
        precision: preset name or :class:`jaxmodel.Precision`; activations are stored in
            its ``act_bytes``.
        act_per_layer: activation bytes of one layer and micro-batch (default
            :func:`activation_bytes_per_layer`; context parallelism passes its own).
        last_stage_extra: bytes the last stage holds beside its layers' activations at its
            peak (counted in its ``activations``; e.g. the loss's fp32 logits,
            :func:`loss_logits_bytes`), default 0.

    Returns:
        dict with :data:`TRAIN_MEMORY_TERMS` and ``total`` (their sum).
    """
    prec = _prec.precision(precision)
    grad_bytes = prec.grad_bytes if grad_bytes is None else grad_bytes
    dp = jnp.maximum(par.dp, 1.0)
    zero = par.zero
    # expert weights are ZeRO-sharded over their data-parallel group dp/ep only (DeepSpeed-TED)
    dp_exp = jnp.maximum(dp / jnp.maximum(par.ep, 1.0), 1.0)
    if act_per_layer is None:
        act_per_layer = activation_bytes_per_layer.single(model, par, par.micro_batch, seq_len,
                                                          prec.act_bytes,
                                                          stored_gemm_input_bytes(prec))
    per_expert_layer = model.n_experts / jnp.maximum(par.ep, 1.0) * _params.expert_params(
        model) / _params.expert_tp(par)[0]
    stages = zip(_params.stage_params(model, par), _moe.stage_moe_layers(model, par),
                 stage_layers(model.n_layers, par.pp), _stage_in_flight(in_flight))
    best = None
    extras = (0.0, 0.0, last_stage_extra)
    for (params, n_moe, layers, flight), extra in zip(stages, extras):
        experts = n_moe * per_expert_layer

        def sharded(stage):
            on = zero >= stage
            return ((params - experts) / jnp.where(on, dp, 1.0)
                    + experts / jnp.where(on, dp_exp, 1.0))

        m = {"weights": prec.weight_bytes * sharded(2.5),
             "fp8_weight_cache": weight_cache_bytes(prec) * sharded(2.5),
             "gradients": grad_bytes * sharded(1.5),
             "optimizer": (prec.master_bytes + prec.optim_bytes) * sharded(0.5),
             "activations": flight * layers * act_per_layer + extra,
             "tp_comm_buffers": 0.0 * params,
             "nccl_buffers": 0.0 * params}
        m["total"] = sum(m[k] for k in TRAIN_MEMORY_TERMS)
        if best is None:
            best = m
        else:
            # one comparison of the stages' totals for every term (numerics.computed_once)
            more = computed_once(m["total"] > best["total"])
            best = {k: jnp.where(more, m[k], best[k]) for k in m}
    return best


def loss_logits_bytes(model: Model, par: Parallelism, tokens, act_bytes=2.0):
    """Peak bytes of the language-model loss on the last pipeline stage, one micro-batch of
    ``tokens`` local tokens: the ``[tokens, V/t]`` logits in ``act_bytes`` and their fp32
    copy, ``(act_bytes + 4)·tokens·V/t``.

    Source: Megatron-core (0.5–0.8) ``tensor_parallel/cross_entropy.py``:
    ``VocabParallelCrossEntropy.calculate_logits_max`` casts the vocab-parallel logits to
    float32 (``vocab_parallel_logits.float()``), the exponentials and the softmax are
    computed in place in that copy (``torch.exp(..., out=exp_logits)``, ``exp_logits.div_``)
    and saved for the backward, which turns them into the gradient in place and casts it
    back to the logits' type. The 16-bit logits stay referenced by the model's forward until
    the loss returns; the fp32 copy lives until the micro-batch's backward, which under 1F1B
    follows on the last stage before the next forward, so one micro-batch's worth is alive
    at a time. Megatron-LM 2021 (``vocab_parallel_cross_entropy(output.float(), labels)``)
    holds the same. Units: bytes.
    """
    return (act_bytes + 4.0) * tokens * model.vocab_size / jnp.maximum(par.tp, 1.0)


def usable_memory(mem_capacity, reserved_bytes, utilization=1.0):
    """Device memory the model's tensors may occupy, bytes: ``utilization · mem_capacity −
    reserved_bytes`` (the memory rule of training, inference and serving).

    ``reserved_bytes`` (``Device.runtime_reserved_bytes``) is what every real run holds
    besides its tensors: memory the driver withholds from the datasheet capacity (an "80 GB"
    H100 reports 79.22 GiB; vLLM pull request 10511) and the runtime context with its loaded
    library kernels (PyTorch's CUDA context: 0.67 GB with eager module loading, 0.29 GB lazy;
    PyTorch pull request 86509). Not included: the collective library's communicator
    buffers, which grow with the plan's communicators (NCCL, per channel and peer connection:
    ``NCCL_BUFFSIZE`` 4 MiB for the Simple protocol + 4.69 MiB LL128 + 0.5 MiB LL; NCCL
    ``init.cc`` defaults; the training step counts them as its ``nccl_buffers`` term,
    :func:`nccl_buffer_bytes`), nor allocator fragmentation.
    ``utilization``: the share of the capacity the framework may use, vLLM's
    ``gpu_memory_utilization``, which likewise subtracts its profiled non-torch memory from
    ``utilization · total`` (vLLM ``Worker.determine_num_available_blocks``); 1 for training
    and for the inference plan's rule.
    """
    return utilization * mem_capacity - reserved_bytes


def kv_elements_per_token(model: Model, par: Parallelism):
    """Cached elements per token and layer on one device (count).

    GQA/MHA/MQA: ``2 · h_kv' · d_h`` (K and V), ``h_kv' = max(h_kv/t, 1)``. MLA: the latent
    ``d_c + d_h^R`` (``kv_lora_rank + qk_rope_head_dim``; DeepSeek-AI 2024, "DeepSeek-V2",
    §2.1.2 and Table 1), replicated on every TP rank (its heads are only formed after the
    up projection).
    """
    tp = jnp.maximum(par.tp, 1.0)
    kv_heads = jnp.maximum(model.n_kv_heads / tp, 1.0)
    return jnp.where(model.is_mla, model.kv_lora_rank + model.qk_rope_head_dim,
                     2.0 * kv_heads * model.head_dim)


def cached_tokens_per_layer(model: Model, seq_len):
    """Tokens cached per sequence, averaged over the layers: ``s`` on a global layer,
    ``min(s, window)`` on a sliding-window layer (a rolling buffer; Jiang et al. 2023,
    "Mistral 7B" §2), weighted by the share of local layers."""
    share = _params.n_local_layers(model) / jnp.maximum(model.n_layers, 1.0)
    return (1.0 - share) * seq_len + share * _params.attended_keys(model, seq_len, True)


def kv_cache_bytes_single(model: Model, par: Parallelism, batch, seq_len, dtype_bytes=2.0):
    """Single-configuration body of :func:`kv_cache_bytes`."""
    layers = stage_layers(model.n_layers, par.pp)[1]      # the most loaded stage, ⌈L/p⌉
    return (batch * cached_tokens_per_layer(model, seq_len) * kv_elements_per_token(model, par)
            * dtype_bytes * layers)


@batched
def kv_cache_bytes(model: Model, par: Parallelism, batch, seq_len, dtype_bytes=2.0):
    """KV cache per device, bytes: ``2 · b · s · h_kv' · d_h · bytes · ⌈n_layers/pp⌉`` (the
    most loaded stage, :func:`jaxmodel.parallel.pipeline.stage_layers`).

    Source: Pope et al. 2023 "Efficiently Scaling Transformer Inference" §2 (K and V of every
    past token per layer). ``h_kv' = max(h_kv/t, 1)``: KV heads split over TP and replicated
    when ``t > h_kv`` (GQA/MQA). MLA caches its latent instead
    (:func:`kv_elements_per_token`); sliding-window layers keep the last ``window`` tokens
    (:func:`cached_tokens_per_layer`). ``batch`` is the sequences this device group serves.
    """
    return kv_cache_bytes_single(model, par, batch, seq_len, dtype_bytes)


kv_cache_bytes.single = kv_cache_bytes_single


def inference_memory_single(model: Model, par: Parallelism, batch, prompt_len, gen_len=0.0,
                            dtype_bytes=None, precision=None):
    """Single-configuration body of :func:`inference_memory`."""
    prec = _prec.resolve(precision, dtype_bytes)
    dtype_bytes = prec.act_bytes
    tp = jnp.maximum(par.tp, 1.0)
    # serving without speculative decoding: no multi-token-prediction modules
    weights = _prec.serving_weight_bytes(prec) * params_per_device.single(model, par, False)
    kv = kv_cache_bytes_single(model, par, batch, prompt_len + gen_len, prec.kv_bytes)
    # transient working set of the largest step, the prefill of one layer: scores + softmax
    # output, or the FFN intermediates, plus a few hidden-state buffers.
    heads = model.n_heads / tp
    scores = jnp.where(par.flash_attention > 0.5, 0.0,       # FlashAttention keeps S on chip
                       2.0 * dtype_bytes * batch * heads * prompt_len * prompt_len)
    ffn = (dtype_bytes * batch * prompt_len * model.ffn_matrices
           * jnp.maximum(model.d_ff, model.expert_d_ff) / tp)
    hidden = 4.0 * dtype_bytes * batch * prompt_len * model.d_model
    acts = jnp.maximum(scores, ffn) + hidden
    return {"weights": weights, "kv_cache": kv, "activations": acts,
            "total": weights + kv + acts}


@batched
def inference_memory(model: Model, par: Parallelism, batch, prompt_len, gen_len=0.0,
                     dtype_bytes=None, precision=None):
    """Inference memory per device serving ``batch`` sequences, bytes.

    Weights in the GEMM storage type of ``precision`` (default ``"bf16"``; 1 B for
    ``"fp8"``, 0.5 B + scales for ``"w4a16"``: :func:`jaxmodel.precisions.serving_weight_bytes`)
    × :func:`~jaxmodel.workload.params.params_per_device` (split over ``tp`` and ``pp``), the
    KV cache of ``prompt_len + gen_len`` tokens in ``kv_bytes`` (:func:`kv_cache_bytes`), and
    a transient activation working set (``act_bytes`` words) of the prompt's prefill:
    the larger of the score + softmax tensors (``2·b·h/t·s²`` words, unfused attention as in
    LLMCompass) and the FFN intermediates (``ffn_matrices·b·s·d_ff/t`` words), plus four
    ``[b·s, d]`` hidden-state buffers. The working set is an estimate; LLMCompass's
    ``memory_requirement`` counts weights + KV cache only.

    Returns:
        dict with ``weights``, ``kv_cache``, ``activations``, ``total``.
    """
    return inference_memory_single(model, par, batch, prompt_len, gen_len, dtype_bytes,
                                   precision)


inference_memory.single = inference_memory_single
