"""The embedding, the LM head and the loss: one set of formulas for training and serving.

Source: Megatron-LM's vocab-parallel embedding and cross entropy (Shoeybi et al. 2019,
"Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism", §3:
each of the ``t`` tensor-parallel ranks holds ``V/t`` rows of the embedding table and ``V/t``
columns of the output layer); the LM head GEMM ``[tokens, d]×[d, V/t]`` (Narayanan et al.
2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
eq. 3's ``V/(16lh)`` term); the loss and the sampling softmax over ``[rows, V/t]``
(LLMCompass Softmax kernel, Zhang et al., ISCA 2024 §III-B).

The pieces, each a single-configuration formula:

- :func:`lookup_time` / :func:`lookup_grad_time` — the table gather (read + write one ``d``-row
  per token) and its backward scatter-add (read ``dY``, read + write the row), memory-bound;
- :func:`head_precision` — the precision the LM head runs in: the recipe's higher-precision
  dtype (``attn_dtype``) on activation words (Transformer Engine keeps the output layer in
  BF16 under its FP8 recipes — NVIDIA Transformer Engine documentation, "Using FP8 with
  Transformer Engine": only ``te.Linear``-family modules run FP8, the output layer of
  Megatron-core's ``GPTModel`` (``megatron/core/models/gpt/gpt_model.py``) is a plain
  ``tensor_parallel.ColumnParallelLinear``; a quantised serving checkpoint keeps ``lm_head``
  unquantised — NVIDIA TensorRT Model Optimizer, ``modelopt/torch/quantization/config.py``:
  ``_default_disabled_quantizer_cfg`` disables the ``*lm_head*`` quantizers of every preset);
- :func:`lm_head_times` — the head GEMM (and its two gradient GEMMs in training) by the layer's
  GEMM timing (:func:`jaxmodel.workload.blocks.evaluate`) at :func:`head_precision`;
- :func:`logits_softmax` — the softmax over the ``V/t`` logits of each row (the loss forward
  in training, the sampling distribution in serving);
- :func:`loss_grad_time` — ``d logits = softmax − onehot`` (read ``p``, write the gradient);
- :func:`fp32_cross_entropy` — Megatron-LM 2021's cross entropy on fp32 logits;
- :func:`embedding_times` — training: all of the above per micro-batch, forward and backward,
  with the tensor-parallel communication;
- :func:`serving_embedding` / :func:`serving_head` — serving: the prompt's (or a decode step's)
  embedding and the head on the last position of each sequence.

Units: seconds, bytes, FLOP.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxmodel import ops as _ops
from jaxmodel import precisions as _prec
from jaxmodel.batching import batched
from jaxmodel.numerics import INF
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload.blocks import (ANY, GemmFn, Variant, default_gemm, evaluate,
                                      layer_feasibility, raise_if_invalid, tp_collective,
                                      tp_group, variant_of)
from jaxmodel.workload.ffn import Gemm, _elementwise


def vocab_shard(model: Model, par: Parallelism):
    """Vocabulary rows (and logits) per tensor-parallel rank, ``V/t`` (``t`` sanitised to
    ``>= 1``), count."""
    return model.vocab_size / jnp.maximum(par.tp, 1.0)


def head_precision(prec: _prec.Precision) -> _prec.Precision:
    """The precision of the LM head GEMM: ``prec`` with its GEMMs at the recipe's
    higher-precision dtype (``attn_dtype``) on ``act_bytes`` words, no block scales and no
    cast kernels (see the module docstring for the sources)."""
    return dataclasses.replace(prec, gemm_dtype=prec.attn_dtype, gemm_bytes=prec.act_bytes,
                               scale_block=0.0 * prec.scale_block, cast_bytes=0.0)


def lookup_time(dev, tokens, d_model, dtype_bytes):
    """Embedding gather of ``tokens`` rows of ``d_model`` words: read + write a word per
    element (memory-bound, one kernel), s."""
    return _elementwise(dev, tokens * d_model, 2.0 * dtype_bytes, 0.0)


def lookup_grad_time(dev, tokens, d_model, dtype_bytes):
    """Backward of the gather: scatter-add of ``dY`` into the embedding gradient (read ``dY``,
    read + write the row: 3 words per element, one add), s."""
    return _elementwise(dev, tokens * d_model, 3.0 * dtype_bytes, 1.0)


def lm_head_times(gemm: GemmFn | None, dev, tokens, vocab, d_model, prec,
                  backward: bool = False):
    """``(fwd_s, bwd_s)`` of the LM head GEMM ``[tokens, d]×[d, vocab]`` at
    :func:`head_precision` (the device's tensor-core rate of ``attn_dtype``,
    :func:`jaxmodel.precisions.scaled_device`); ``backward``: its two gradient GEMMs
    (Narayanan et al. 2021 Appendix), else ``bwd_s = 0``. ``vocab`` is the per-rank
    ``V/t``."""
    rows = evaluate(gemm or default_gemm, dev, {"head": [(Gemm(tokens, vocab, d_model), 1.0)]},
                    {}, backward=backward, precision=head_precision(prec))
    return rows["head"]


def logits_softmax(dev, rows, vocab):
    """Softmax over ``rows`` rows of ``vocab`` logits (LLMCompass Softmax kernel, launch
    overhead included), s."""
    return _ops.softmax_latency.single(dev, rows, vocab, overhead=True)


def loss_grad_time(dev, tokens, vocab, dtype_bytes):
    """``d logits = softmax − onehot`` over ``[tokens, vocab]``: read ``p``, write the
    gradient (2 words, 2 FLOP per element), s."""
    return _elementwise(dev, tokens * vocab, 2.0 * dtype_bytes, 2.0)


def embedding_single(system: System, model: Model, par: Parallelism, micro_batch, seq_len,
                     gemm: GemmFn | None = None, variant: Variant = ANY, precision=None):
    """Single-configuration body of :func:`embedding_times` (``precision``: a
    :class:`jaxmodel.Precision` or a preset name; the legacy ``dtype_bytes`` is resolved at
    the API edge)."""
    dev = system.device
    prec = _prec.resolve(precision)
    dtype_bytes = prec.act_bytes
    tokens = micro_batch * seq_len
    vocab = vocab_shard(model, par)
    embed_f = lookup_time(dev, tokens, model.d_model, dtype_bytes)
    embed_b = lookup_grad_time(dev, tokens, model.d_model, dtype_bytes)
    head_f, head_b = lm_head_times(gemm, dev, tokens, vocab, model.d_model, prec,
                                   backward=True)
    loss_f = logits_softmax(dev, tokens, vocab)
    loss_b = loss_grad_time(dev, tokens, vocab, dtype_bytes)
    # vocab-parallel embedding output all-reduce (fwd) and its input-grad mirror (bwd);
    # vocab-parallel cross entropy: 2 small fp32 all-reduces (max, sum-exp) of [tokens]
    sync = tp_collective(system, par, tokens * model.d_model * dtype_bytes, variant)
    small = tp_group(system, par, "all_reduce", tokens * 4.0, variant, tokens)
    comm_f = sync + 2.0 * small
    comm_b = sync
    out = {"embed_fwd": embed_f, "embed_bwd": embed_b, "lm_head_fwd": head_f,
           "lm_head_bwd": head_b, "loss_fwd": loss_f, "loss_bwd": loss_b,
           "comm_fwd": comm_f, "comm_bwd": comm_b,
           "fwd": embed_f + head_f + loss_f, "bwd": embed_b + head_b + loss_b}
    ok, _ = layer_feasibility(model, par)
    ok = ok & _prec.supported(dev, prec)
    return {k: jnp.where(ok, v, INF) for k, v in out.items()}


@batched
def _embedding_times(system, model, par, micro_batch, seq_len, gemm, precision, variant):
    return embedding_single(system, model, par, micro_batch, seq_len, gemm, variant=variant,
                            precision=precision)


def embedding_times(system: System, model: Model, par: Parallelism, micro_batch, seq_len,
                    gemm: GemmFn | None = None, dtype_bytes=None, precision=None):
    """Embedding lookup, LM head and loss per micro-batch per device, forward and backward (s).

    Source: see the module docstring (Megatron-LM vocab-parallel embedding and cross entropy;
    the head GEMM ``[b·s, d]×[d, V/t]`` at :func:`head_precision`; the loss = softmax over
    ``[b·s, V/t]``).

    Returns:
        dict with ``embed_fwd/bwd`` (first stage), ``lm_head_fwd/bwd`` and ``loss_fwd/bwd``
        (last stage), ``comm_fwd/bwd`` (TP all-reduce of the embedding output / its gradient,
        reduce-scatter + all-gather under SP, :func:`jaxmodel.workload.blocks.tp_collective`;
        two small fp32 all-reduces of the vocab-parallel loss), and the totals ``fwd``/``bwd``
        of compute (embedding + head + loss; a pipeline splits them over its first and last
        stage).
    """
    raise_if_invalid(model, par)
    return _embedding_times(system, model, par, micro_batch, seq_len, gemm,
                            _prec.resolve(precision, dtype_bytes),
                            variant_of(model, par, system))


embedding_times.single = embedding_single


def serving_embedding(system: System, model: Model, par: Parallelism, tokens, dtype_bytes,
                      variant: Variant = ANY):
    """``(lookup_s, all_reduce_s)`` of the vocab-parallel embedding of ``tokens`` rows when
    serving: each TP rank gathers its slice (:func:`lookup_time`) and an all-reduce of the
    ``[tokens, d]`` result over the ``t`` ranks combines them (Shoeybi et al. 2019 §3; 0 for
    ``t = 1``). ``dtype_bytes``: the activation word."""
    lookup = lookup_time(system.device, tokens, model.d_model, dtype_bytes)
    return lookup, tp_group(system, par, "all_reduce", tokens * model.d_model * dtype_bytes,
                            variant, lookup)


def serving_head(system: System, model: Model, par: Parallelism, rows, gemm=None,
                 precision=None, variant: Variant = ANY):
    """``(gemm_and_softmax_s, all_gather_s)`` of the LM head on ``rows`` positions (the last
    of each sequence) when serving: the GEMM ``[rows, d]×[d, V/t]`` at
    :func:`head_precision` (:func:`lm_head_times`), the softmax over the ``V/t`` logits
    (:func:`logits_softmax`) and an all-gather of the ``[rows, V]`` logits over the ``t``
    ranks (activation words). The same in prefill (only the last prompt position produces a
    token) and in every decode step."""
    prec = _prec.resolve(precision)
    dev = system.device
    vocab = vocab_shard(model, par)
    head, _ = lm_head_times(gemm, dev, rows, vocab, model.d_model, prec)
    head = head + logits_softmax(dev, rows, vocab)
    return head, tp_group(system, par, "all_gather", rows * model.vocab_size * prec.act_bytes,
                          variant, head)


def fp32_cross_entropy(dev, tokens, vocab, dtype_bytes=2.0):
    """Megatron-LM 2021's vocab-parallel cross entropy on fp32 logits, ``(fwd_s, bwd_s)``
    per micro-batch on one device, ``tokens`` rows of ``vocab`` (= V/t) logits.

    Source: NVIDIA/Megatron-LM at de7dc40 (the SC'21 code), ``megatron/model/gpt_model.py``
    (``vocab_parallel_cross_entropy(output.float(), labels)`` unless
    ``--fp16-lm-cross-entropy``, which the SC'21 scripts do not set) and
    ``megatron/mpu/cross_entropy.py`` (``_VocabParallelCrossEntropy``), one PyTorch kernel
    per line, bytes per logit: forward the cast ``.float()`` (read ``dtype_bytes`` +
    write 4), ``torch.max`` (read 4), ``sub_`` (read 4 + write 4), ``torch.exp(out=)``
    (8), ``sum`` (4) and the softmax ``div_`` (8); backward ``grad_input.mul_(grad_output)``
    (8) and the cast's backward to the logits' type (read 4 + write ``dtype_bytes``); the
    target gather / scatter touch one logit per row (neglected) and the three ``[tokens]``
    fp32 all-reduces are timed with the TP communication. Each kernel one
    :func:`jaxmodel.ops.elementwise_latency` call. Units: s.
    """
    n = tokens * vocab
    w = dtype_bytes
    fwd = (_elementwise(dev, n, w + 4.0, 0.0) + _elementwise(dev, n, 4.0, 1.0)
           + _elementwise(dev, n, 8.0, 1.0) + _elementwise(dev, n, 8.0, dev.exp_flops)
           + _elementwise(dev, n, 4.0, 1.0) + _elementwise(dev, n, 8.0, 1.0))
    bwd = _elementwise(dev, n, 8.0, 1.0) + _elementwise(dev, n, 4.0 + w, 0.0)
    return fwd, bwd
