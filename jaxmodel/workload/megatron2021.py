"""Kernels of the Megatron-LM 2021 software stack that the layer model does not count.

Source: the code behind Narayanan et al., SC'21, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM" (NVIDIA/Megatron-LM at commit de7dc40,
2021-08-10, ``examples/sc21``), run on the PyTorch of its time (1.8/1.9): the eager
memory-bound kernels of a GPT layer (:func:`megatron2021_kernels`) and the per-micro-batch
gradient accumulation into ``param.grad`` (:func:`grad_accumulation`). The fp32 cross
entropy of that stack lives with the loss (:func:`jaxmodel.workload.embedding.
fp32_cross_entropy`). Each kernel is one :func:`jaxmodel.ops.elementwise_latency` call
(roofline + launch overhead). Units: s.
"""

from __future__ import annotations

from jaxmodel.types import Model, Parallelism
from jaxmodel.workload.blocks import shard
from jaxmodel.workload.ffn import _elementwise


def megatron2021_kernels(dev, model: Model, par: Parallelism, micro_batch, seq_len,
                         dtype_bytes=2.0):
    """Memory-bound kernels of one Megatron-LM 2021 GPT layer that neither the LLMCompass
    layer nor the fused bias-dropout-add model (:func:`jaxmodel.parallel.train.
    residual_dropout_times`) counts, per micro-batch on one device: ``(fwd_s, bwd_s)``.

    Source: the code behind Narayanan et al., SC'21, "Efficient Large-Scale Language Model
    Training on GPU Clusters Using Megatron-LM" (NVIDIA/Megatron-LM at commit de7dc40,
    2021-08-10, ``examples/sc21``), run on the PyTorch of its time (1.8/1.9):

    - QKV bias: ``ColumnParallelLinear`` (``skip_bias_add=False`` for ``query_key_value``)
      calls ``F.linear`` on the 3-D ``[s, b, h]`` input, which PyTorch's ``at::linear`` runs as
      ``matmul`` then ``output.add_(bias)`` (the fused ``addmm`` only for 2-D inputs): forward
      read + write of the ``[s, b, 3h/t]`` output (4 B per element); backward the bias
      gradient ``sum_to_size`` reads the output gradient (2 B);
    - ``context_layer.permute(2, 0, 1, 3).contiguous()`` after ``A·V``: read + write of the
      ``[s, b, h/t]`` context (4 B), forward;
    - ``split_tensor_along_last_dim`` of the fused QKV output (``torch.split``, views): its
      backward concatenates the three gradients into ``[s, b, 3h/t]`` (read + write, 4 B);
    - ``bias_gelu_impl`` (``GeLUFunction``): its backward returns the same tensor as the input
      and the bias gradient, so autograd reduces ``[s, b, d_ff/t]`` to the bias (read, 2 B);
    Each kernel is one :func:`jaxmodel.ops.elementwise_latency` call (roofline + launch
    overhead); byte counts scale with ``dtype_bytes / 2``. Full recomputation repeats the
    forward kernels (the caller adds them to the recomputed forward). Units: s.
    """
    sh = shard(model, par)
    w = dtype_bytes / 2.0
    tokens = micro_batch * seq_len
    n_qkv = tokens * (sh.heads + 2.0 * sh.kv_heads) * sh.head_dim
    n_ctx = tokens * sh.heads * sh.head_dim

    def k(n, nbytes, flops=1.0):
        return _elementwise(dev, n, nbytes * w, flops)

    fwd = k(n_qkv, 4.0) + k(n_ctx, 4.0, 0.0)
    bwd = k(n_qkv, 4.0, 0.0) + k(n_qkv, 2.0) + k(tokens * sh.ffn_in, 2.0)
    return fwd, bwd


def grad_accumulation(dev, model: Model, par: Parallelism, grad_bytes=2.0):
    """Accumulating one micro-batch's weight gradients of one layer into ``param.grad``, s.

    Source: Megatron-LM 2021 (NVIDIA/Megatron-LM at de7dc40, the code of Narayanan et al.,
    SC'21): without ``--use-contiguous-buffers-in-ddp`` (not set by its ``examples/sc21``
    scripts) neither DDP implementation accumulates into a buffer of its own: every
    micro-batch's weight gradients are added to ``param.grad`` by PyTorch autograd's
    ``AccumulateGrad`` (``variable_grad += new_grad``: read 2 words, write 1, ``grad_bytes``
    each, 6 B in fp16), one kernel per tensor: 12 per GPT layer (fused QKV, ``W_o``,
    ``W_1``, ``W_2``, their biases, the two layernorms' scale and shift), on the tensor-
    parallel shards. The optimizer's ``zero_grad(set_to_none=True)`` leaves ``param.grad``
    None, so the first micro-batch of a step steals its gradient instead: the caller charges
    this on ``m − 1`` of ``m`` micro-batches. Each kernel one
    :func:`jaxmodel.ops.elementwise_latency` call (roofline + launch overhead).
    """
    sh = shard(model, par)
    d = sh.d_model
    qkv = (sh.heads + 2.0 * sh.kv_heads) * sh.head_dim
    tensors = (d * qkv, sh.heads * sh.head_dim * d, d * sh.ffn_in, sh.d_ff * d,
               qkv, d, sh.ffn_in, d, d, d, d, d)
    return sum(_elementwise(dev, n, 3.0 * grad_bytes, 1.0) for n in tensors)
