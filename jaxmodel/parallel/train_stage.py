"""The per-micro-batch stage times of a training step on one device, and the sanitised
inputs of one configuration (:func:`prepare`).

:func:`stage_times_single` gives the layer, embedding, LM-head and loss times of one
micro-batch (:data:`STAGE_KEYS`) from the workload's training layer
(:func:`jaxmodel.workload.layer.training_layer_times` under context parallelism,
:func:`jaxmodel.parallel.context.cp_layer_times`), plus the memory-bound bias / dropout /
residual kernels of a Megatron layer (:func:`residual_dropout_times`) and, under LoRA /
QLoRA, the adapter changes (:func:`jaxmodel.workload.finetune.stage_time_changes`).
:mod:`jaxmodel.parallel.train_compose` composes a step from them.

Units: seconds, bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxmodel import numerics as nx
from jaxmodel import ops as _ops
from jaxmodel import precisions as _prec
from jaxmodel.parallel import context as _cx
from jaxmodel.parallel import overlap as _ov
from jaxmodel.parallel import pipeline as pl
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel.train_options import (TrainOptions, TrainStatics, sustained_device,
                                             with_defaults)
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload import finetune as _lora
from jaxmodel.workload import layer as _layer

STAGE_KEYS = ("fwd", "bwd", "recompute", "tp_comm_fwd", "tp_comm_bwd", "ep_comm_fwd",
              "ep_comm_bwd", "embed_fwd", "embed_bwd", "lm_head_fwd", "lm_head_bwd",
              "loss_fwd", "loss_bwd", "emb_comm_fwd", "emb_comm_bwd", "rd_fwd", "rd_bwd",
              "rd_selective", "grad_accum", "tp_split_ag_fwd", "tp_split_rs_fwd",
              "tp_split_ag_bwd")
LAYER_KEYS = STAGE_KEYS[:7]     # the transformer layer's (cp_layer_times)
SPLIT_KEYS = STAGE_KEYS[-3:]    # the split TP-overlap hosts' extra time (tp_split_times)
PART_KEYS = {"layer": LAYER_KEYS + SPLIT_KEYS,   # stage_times_single's two parts
             "rest": tuple(k for k in STAGE_KEYS if k not in LAYER_KEYS + SPLIT_KEYS)}


def tp_split_rows(model: Model, par: Parallelism, tokens, variant=_layer.ANY,
                  whole_from_layer: bool = True):
    """The forward-only GEMM rows of :func:`tp_split_times` for ``tokens`` rows
    (``b·s/cp``), to be timed in the training layer's GEMM call
    (:func:`jaxmodel.parallel.context.cp_layer_times`' ``forward_rows``,
    :func:`jaxmodel.workload.blocks.evaluate_with`): the split chunks of
    :func:`jaxmodel.parallel.overlap.te_split_gemms`, and the whole host GEMMs as references
    to the layer's own entries (:data:`jaxmodel.parallel.overlap.TE_SPLIT_WHOLE_ENTRIES`,
    timed once for both) where ``whole_from_layer`` and the static ``variant`` rules out
    multi-head latent attention, else as GEMMs of their own. None where the variant has no
    TP or no sequence parallelism (no overlap can run)."""
    if variant.tp is False or variant.sp is False:
        return None
    rows = _ov.te_split_gemms(model, par, tokens)
    if whole_from_layer and variant.mla is False:
        rows.update({k: [(entry, 1.0) for entry in entries]
                     for k, entries in _ov.TE_SPLIT_WHOLE_ENTRIES.items()})
    return rows


def tp_split_extra(timed: dict | None, tokens) -> dict:
    """``{tp_split_ag_fwd, tp_split_rs_fwd, tp_split_ag_bwd}`` = split − whole, s, from the
    forward seconds of :func:`tp_split_rows` (``timed``; None: 0 for ``tokens``' shape)."""
    if timed is None:
        zero = 0.0 * jnp.asarray(tokens, dtype=jnp.result_type(float))
        return {k: zero for k in SPLIT_KEYS}
    return {f"tp_split_{k}": timed[k + "_split"] - timed[k] for k in ("ag_fwd", "rs_fwd",
                                                                      "ag_bwd")}


def tp_split_times(dev, model: Model, par: Parallelism, tokens, gemm=None, precision=None,
                   variant=_layer.ANY) -> dict:
    """Extra seconds of one layer's TP-overlap host GEMMs when Transformer Engine splits
    them (:func:`jaxmodel.parallel.overlap.te_split_gemms`: the ring-exchange all-gather
    hosts in ``tp`` chunks, the pipelined reduce-scatter hosts in
    :data:`jaxmodel.parallel.overlap.TP_OVERLAP_CHUNKS`), each chunk timed at its own shape
    by the GEMM model (``gemm``, default the tile search) at the precision's GEMM rate:
    ``{tp_split_ag_fwd, tp_split_rs_fwd, tp_split_ag_bwd}`` = split − whole, s, for
    ``tokens`` rows (``b·s/cp``). Paid only where the TP overlap runs
    (:func:`jaxmodel.parallel.overlap.te_tp_exposed`); 0 where the static ``variant`` has no
    TP or no sequence parallelism (no overlap can run). On its own: the whole GEMMs timed
    here too; :func:`stage_times_single` times the chunks in the layer's GEMM call and takes
    the whole ones from the layer (:func:`tp_split_rows`), the same seconds."""
    rows = tp_split_rows(model, par, tokens, variant, whole_from_layer=False)
    if rows is None:
        return tp_split_extra(None, tokens)
    _, timed = _layer.evaluate_with(gemm or _layer.default_gemm, dev, {}, {},
                                    precision=precision, forward_rows=rows)
    return tp_split_extra(timed, tokens)


def residual_dropout_times(dev, model: Model, par: Parallelism, micro_batch, seq_len,
                           options: TrainOptions | None = None, precision=None, kv_len=None):
    """Memory-bound kernels of a Megatron training layer that the LLMCompass-style layer
    (:mod:`jaxmodel.workload.layer`, "no residual adds, biases or dropout kernels") omits,
    per layer and micro-batch on one device: ``(fwd_s, bwd_s, selective_recompute_s)``.

    Source: Megatron-LM GPT layer (Shoeybi et al. 2019; Narayanan et al. 2021 code,
    ``ParallelTransformerLayer``): after attention and after the MLP a fused
    bias-dropout-add (``bias_dropout_add_fused_train``) on the ``[s, b, h]`` activations
    (sequence-sharded under SP, replicated over TP otherwise), and dropout on the attention
    probabilities ``[b, a/t, s, s]`` (unless FlashAttention fuses it); dropout 0.1 is
    Megatron's GPT default (``--hidden-dropout``, ``--attention-dropout``). Bytes per element
    (2-byte activations, 1-byte masks, as Korthikanti et al. 2023 §4.1 count them; scaled by
    the precision's ``act_bytes / 2``):

    - bias-dropout-add forward: read x and the residual, write out and the mask: 7 B
      (6 B without dropout: a fused bias + residual add);
    - its backward: dropout backward (read grad and mask, write: 5 B), the gradient sum at
      the residual fork (read 2 × 2, write 2: 6 B), the bias-gradient reduction (2 B): 13 B
      (8 B without dropout);
    - attention dropout: forward 5 B (read, write, mask), backward 5 B (read grad and mask,
      write); part of the attention core that selective recomputation repeats.

    Each kernel is one :func:`jaxmodel.ops.elementwise_latency` call (roofline + launch
    overhead). ``options.dropout`` is 1 (Megatron GPT, default) or 0 (no dropout, e.g. Llama
    recipes); ``options.megatron2021_stack = 1`` adds the eager kernels of the Megatron-LM
    2021 stack of Narayanan et al., SC'21 (:func:`jaxmodel.workload.layer.
    megatron2021_kernels`; forward ones repeated by a full recomputation through ``fwd_s``).
    ``seq_len`` is the device's tokens (``s/cp`` under context parallelism), ``kv_len`` the
    keys each attends to (default ``seq_len``); ``precision`` a name or
    :class:`jaxmodel.Precision` (default bf16).
    """
    opts = with_defaults(options if options is not None else TrainOptions(None, seq_len))
    act_bytes = _prec.precision(precision).act_bytes
    tp = jnp.maximum(par.tp, 1.0)
    heads = model.n_heads / tp
    e = micro_batch * seq_len * model.d_model
    e = jnp.where(par.sp > 0.5, e / tp, e)
    probs = micro_batch * heads * seq_len * (seq_len if kv_len is None else kv_len)
    on = opts.dropout > 0.5
    w = act_bytes / 2.0                       # byte counts above are for 2-byte activations

    def k(n, nbytes, flops):
        return _ops.elementwise_latency.single(dev, n, nbytes * w, flops)

    bda_f = k(e, jnp.where(on, 7.0, 6.0), 3.0)
    bda_b = k(e, jnp.where(on, 5.0, 0.0), 1.0) + k(e, 6.0, 1.0) + k(e, 2.0, 1.0)
    bda_b = jnp.where(on, bda_b, k(e, 8.0, 1.0))
    attn = jnp.where(on & (par.flash_attention < 0.5), k(probs, 5.0, 1.0), 0.0)
    # the Megatron-LM 2021 eager kernels on top (not part of the attention core)
    old_f, old_b = _layer.megatron2021_kernels(dev, model, par, micro_batch, seq_len,
                                               act_bytes)
    legacy = opts.megatron2021_stack > 0.5
    return (2.0 * bda_f + attn + jnp.where(legacy, old_f, 0.0),
            2.0 * bda_b + attn + jnp.where(legacy, old_b, 0.0), attn)


class Prep(NamedTuple):
    """Inputs of the composition of one configuration (:func:`prepare`)."""

    system: System            # at its sustained clock
    peak: Any                 # nominal (datasheet) matrix FLOP/s, for the MFU
    checks: list              # the plan's structural rules [(ok, reason)] (plan module)
    structure_ok: Any         # all of them hold
    model: Model              # sanitised (double-where)
    par: Parallelism          # sanitised
    global_batch: Any         # sanitised, sequences per step
    seq_len: Any              # sanitised, tokens per sequence


def prepare(system: System, model: Model, par: Parallelism, options: TrainOptions,
            precision) -> Prep:
    """Sustained-clock system, the plan's rules and sanitised inputs (single configuration;
    ``precision`` a :class:`jaxmodel.Precision`)."""
    f = jnp.result_type(float)
    peak = system.device.peak_matrix_flops          # nominal (datasheet) peak for the MFU
    system = dataclasses.replace(system, device=sustained_device(system.device,
                                                                 options.clock_fraction))
    global_batch = jnp.asarray(options.global_batch, dtype=f)
    seq_len = jnp.asarray(options.seq_len, dtype=f)
    checks = _plan.structure_checks(_plan.TRAIN, _plan.inputs(
        model, par, n_devices=system.n_devices, batch=global_batch, seq_len=seq_len,
        dtype_bytes=precision.act_bytes))
    structure_ok, _ = nx.first_reason(checks)
    model_ok = _plan.all_ok(checks, "invalid_model")
    model_s = _plan.sanitised_model(model, model_ok)
    par_s = _plan.sanitised(par, structure_ok)
    gb = jnp.where(structure_ok, global_batch, par_s.dp * par_s.micro_batch)
    seq = jnp.where(model_ok & _plan.all_ok(checks, "invalid_workload"), seq_len, 1.0)
    return Prep(system, peak, checks, structure_ok, model_s, par_s, gb, seq)


def stage_plan(par_s: Parallelism) -> Parallelism:
    """The plan fields the per-layer times may read, others canonical (dp = ep satisfies
    the expert checks; interleave, schedule and ZeRO with its implementation do not enter
    a layer). Plans equal here share their stage times (the de-duplication key of
    :func:`jaxmodel.parallel.train.stage_times`)."""
    one = jnp.ones_like(par_s.dp)
    return dataclasses.replace(par_s, dp=jnp.maximum(par_s.ep, 1.0), interleave=one,
                               schedule=one, zero=0.0 * one, zero3_impl=0.0 * one)


def stage_times_single(system: System, model: Model, par: Parallelism, options: TrainOptions,
                       precision=None, finetune=None, statics: TrainStatics = TrainStatics(),
                       part: str | None = None) -> dict:
    """Per-layer and embedding times of one micro-batch (``par.micro_batch`` sequences of
    ``options.seq_len`` tokens) on one device, s: the workload's training layer and embedding
    times plus :func:`residual_dropout_times` (keys :data:`STAGE_KEYS`), under context
    parallelism (:func:`jaxmodel.parallel.context.cp_layer_times`) on ``s/cp`` tokens.
    ``system`` runs at its sustained clock, ``model``/``par`` are sanitised (see
    :func:`prepare`); of ``options`` only ``seq_len``, ``dropout`` and ``megatron2021_stack``
    are read. ``finetune`` (a :class:`jaxmodel.workload.finetune.LoRA`):
    :func:`_finetune_times`. ``statics``: the GEMM hook, the op-graph variant and the
    context-parallel switch. ``part`` (static; without ``finetune``): ``"layer"`` the keys of
    the transformer layer (:data:`LAYER_KEYS`) and of its split TP-overlap hosts
    (:data:`SPLIT_KEYS`, timed in the layer's GEMM call, :func:`tp_split_rows`), ``"rest"``
    the others (:data:`PART_KEYS`), None all — the two parts are separate graphs that
    compile in parallel (:func:`jaxmodel.parallel.train.stage_times`)."""
    if part not in (None, "layer", "rest") or part is not None and finetune is not None:
        raise ValueError(f"stage_times_single: part={part!r} (None, 'layer' or 'rest'; "
                         "None under fine-tuning)")
    opts = with_defaults(options)
    seq_len = opts.seq_len
    gemm, variant = statics.gemm, statics.variant
    b = par.micro_batch
    prec = _prec.precision(precision)
    # the layer under context parallelism (every token-wise op on s/cp tokens, the attention
    # of the local queries against all s keys with its ring exchange; the MoE all-to-all of
    # the b·s/cp local tokens); cp = 1 is the workload's training layer
    cp = jnp.maximum(par.cp, 1.0)
    local = seq_len / cp
    out = {}
    if part != "rest":
        split = tp_split_rows(model, par, b * local, variant)
        lt = _cx.cp_layer_times(system, model, par, b, seq_len, cp, gemm=gemm,
                                precision=prec, variant=variant, context=statics.context,
                                forward_rows=split)
        out.update({k: lt[k] for k in LAYER_KEYS})
        out.update(tp_split_extra(None if split is None else lt, b * local))
        if part == "layer":
            return out
    et = _layer.embedding_times.single(system, model, par, b, local, gemm=gemm,
                                       precision=prec, variant=variant)
    rd = residual_dropout_times(system.device, model, par, b, local, opts, prec,
                                kv_len=seq_len)
    out.update({k: et[k] for k in STAGE_KEYS[7:13]})
    # the vocab-parallel cross entropy runs on fp32 logits, one kernel per line, in every
    # Megatron release: Megatron-LM 2021 ``vocab_parallel_cross_entropy(output.float(), ..)``
    # and Megatron-core (0.5-0.8, NeMo 24.0x) ``tensor_parallel/cross_entropy.py``,
    # ``VocabParallelCrossEntropy.calculate_logits_max`` (``vocab_parallel_logits.float()``,
    # max), ``calculate_predicted_logits`` (subtract, exp ``out=``, sum),
    # ``calculate_cross_entropy_loss`` (``exp_logits.div_``), backward ``mul_`` and the
    # cast's backward: :func:`jaxmodel.workload.layer.fp32_cross_entropy`'s kernels
    # (Megatron-core's ``cross_entropy_loss_fusion`` fuses some of them: not modelled)
    ce_f, ce_b = _layer.fp32_cross_entropy(system.device, b * local,
                                           model.vocab_size / jnp.maximum(par.tp, 1.0),
                                           prec.act_bytes)
    legacy = opts.megatron2021_stack > 0.5
    out.update(loss_fwd=ce_f, loss_bwd=ce_b,
               grad_accum=jnp.where(legacy, _layer.grad_accumulation(
                   system.device, model, par, prec.weight_bytes), 0.0))
    out.update(emb_comm_fwd=et["comm_fwd"], emb_comm_bwd=et["comm_bwd"], rd_fwd=rd[0],
               rd_bwd=rd[1], rd_selective=rd[2])
    if finetune is not None:
        out = _finetune_times(system, model, par, seq_len, out, finetune, prec, statics)
    return out


def _finetune_times(system, model, par, seq_len, out, cfg, prec, statics):
    """The stage times under LoRA / QLoRA (:func:`jaxmodel.workload.finetune.
    stage_time_changes`: Hu et al., ICLR 2022; Dettmers et al., NeurIPS 2023): adapter GEMMs
    and QLoRA's dequantisation added to the forward, backward and a full recomputation; the
    frozen weights' and the LM head's weight-gradient GEMMs removed from the backward; no
    embedding gradient. ``seq_len`` is the whole sequence (``s/cp`` tokens per device)."""
    b = par.micro_batch
    local = seq_len / jnp.maximum(par.cp, 1.0)
    gemms, _ = _layer.layer_graph(system.device, model, par, b, local, seq_len, training=True,
                                  variant=statics.variant, precision=prec)
    tokens = b * local
    head = _layer.Gemm(tokens, model.vocab_size / jnp.maximum(par.tp, 1.0), model.d_model)
    d = _lora.stage_time_changes(system.device, model, par, tokens, (gemms, head), cfg,
                                 statics.gemm or _layer.default_gemm, prec)
    out = dict(out)
    out["fwd"] = out["fwd"] + d["fwd"]
    out["bwd"] = out["bwd"] + d["bwd"]
    out["recompute"] = out["recompute"] + jnp.where(pl.is_full_recompute(par.recompute),
                                                    d["recompute_full"], 0.0)
    out["lm_head_bwd"] = out["lm_head_bwd"] + d["lm_head_bwd"]
    out["embed_bwd"] = 0.0 * out["embed_bwd"]
    return out
