"""Numeric precision as a configuration dimension: compute dtypes and storage bytes per tensor.

A :class:`Precision` says, per tensor class, which dtype the tensor cores compute in and how
many bytes each tensor occupies in memory and on the wires. It is a frozen dataclass pytree like
:class:`jaxmodel.Device` (every field a numeric leaf, dtypes as codes into :data:`DTYPES`), so a
batch may mix precisions, e.g. a parallelism search over ``["bf16", "fp8"]``.

Who reads what:

- **GEMMs** (weight products: QKV, W_o, FFN, LM head): the tensor-core rate of ``gemm_dtype``
  (the device's ``matrix_ratio_<dtype>`` × its 16-bit systolic peak) and
  :func:`gemm_word` bytes per operand element (``gemm_bytes`` + block-scale overhead);
- **attention** (``QKᵀ``, ``AV``, FlashAttention): the rate of ``attn_dtype``; operands of
  ``act_bytes`` in training, of ``kv_bytes`` in inference (the KV cache is read in its storage
  type);
- **memory-bound kernels, activations, pipeline and TP traffic**: ``act_bytes``;
- **training memory** (:func:`jaxmodel.workload.memory.training_memory`): weights
  ``weight_bytes`` + a low-precision working copy ``weight_copy_bytes`` (Transformer Engine
  caches the FP8 weights across micro-batches), gradients ``grad_bytes``, master weights
  ``master_bytes``, optimizer state ``optim_bytes`` (Adam ``m`` and ``v``), stored activations
  ``act_bytes``;
- **serving memory**: weights in the GEMM storage type (:func:`gemm_word`, the deployed
  quantised checkpoint, no master copy), KV cache ``kv_bytes``;
- **the recipe's own kernels**: every weight-GEMM input (forward) and output gradient
  (backward) passes through a quantisation kernel moving ``cast_bytes`` per element (read the
  16-bit tensor, write the low-precision one; the amax reduction of per-tensor scaling is fused
  into it, Transformer Engine "delayed scaling"), modelled as a memory-bound elementwise kernel.
  Block scaling (``scale_block`` elements share one ``scale_bytes`` scale) adds
  ``scale_bytes / scale_block`` bytes per element to every quantised tensor.

One preset serves training and serving: ``"fp8"`` is the Transformer-Engine training recipe
(FP8 GEMMs forward and backward, BF16 attention, BF16 weights + FP32 master weights and
gradients) *and*, for :func:`jaxmodel.inference`, FP8 weights (the GEMM storage type) and an FP8
KV cache. Training never reads ``kv_bytes``; serving never reads the master, gradient or
optimizer fields.

Sources:
- Micikevicius et al., "FP8 Formats for Deep Learning", arXiv:2209.05433 (2022): E4M3/E5M2,
  FP8 GEMM inputs with higher-precision accumulation and master weights, per-tensor scaling;
- NVIDIA Transformer Engine documentation, "Using FP8 with Transformer Engine" (delayed
  scaling with amax history; FP8 GEMMs in Linear/LayerNormLinear/LayerNormMLP, attention in
  BF16 unless FP8 DPA is enabled; FP8 weight caching across micro-batches,
  ``is_first_microbatch``);
- Micikevicius et al., "Mixed Precision Training", ICLR 2018 (FP16 compute, FP32 master
  weights); Rajbhandari et al., "ZeRO", SC'20, §3 (2 + 2 + 12 bytes per parameter);
- Open Compute Project, "OCP Microscaling Formats (MX) Specification v1.0" (2023): blocks of
  32 elements share one E8M0 (1 byte) scale; MXFP4 = E2M1 elements;
- NVIDIA Blackwell architecture technical brief and "Introducing NVFP4" (2025): E2M1 elements,
  one E4M3 scale per 16 elements plus a per-tensor FP32 scale;
- Xiao et al., "SmoothQuant", ICML 2023 (W8A8 INT8 GEMMs); Lin et al., "AWQ", MLSys 2024 and
  Frantar et al., "GPTQ", ICLR 2023 (4-bit weights, group size 128 with FP16 scales, FP16
  activations and compute).

Units: bytes per element / parameter.

Example:
    >>> p = jm.precision("fp8")
    >>> float(p.gemm_bytes), float(p.master_bytes)
    (1.0, 4.0)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel.types import (Array, Rule, _code, _register, check_value, code_of, from_preset,
                            stack_configs)

#: Compute dtypes, encoded by position (the code stored in ``gemm_dtype`` / ``attn_dtype``).
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")
#: Device fields holding the dense matrix (tensor-core) peak of each dtype relative to the
#: device's modelled systolic peak (:attr:`jaxmodel.Device.peak_matrix_flops`, the 16-bit
#: dense peak); 0 = not supported.
RATIO_FIELDS = tuple(f"matrix_ratio_{d}" for d in DTYPES)


@dataclasses.dataclass(frozen=True)
class Precision:
    """Compute dtypes and storage bytes per tensor class (see the module docstring).

    Attributes:
        gemm_dtype: code into :data:`DTYPES` of the weight GEMMs (names accepted).
        attn_dtype: code into :data:`DTYPES` of the attention products (names accepted).
        gemm_bytes: bytes per GEMM operand element as stored (before block scales).
        act_bytes: bytes per activation element (stored for backward, sent between stages
            and over TP, read/written by memory-bound kernels).
        kv_bytes: bytes per KV-cache element (inference).
        weight_bytes: bytes per parameter of the training model weights.
        weight_copy_bytes: bytes per parameter of a low-precision weight copy kept during
            training (FP8 weights cached across micro-batches); 0 = none.
        grad_bytes: bytes per gradient element (memory and data-parallel reduction).
        master_bytes: bytes per parameter of master weights (0 = the weights are the master).
        optim_bytes: bytes per parameter of optimizer state (Adam ``m`` + ``v``).
        cast_bytes: main-memory bytes moved per element by the quantisation kernel of each
            weight-GEMM input and output gradient (0 = no cast kernels).
        scale_block: elements sharing one scale (0 = per-tensor scaling).
        scale_bytes: bytes per block scale.
        name: preset name (static metadata).
    """

    gemm_dtype: Array = 2.0
    attn_dtype: Array = 2.0
    gemm_bytes: Array = 2.0
    act_bytes: Array = 2.0
    kv_bytes: Array = 2.0
    weight_bytes: Array = 2.0
    weight_copy_bytes: Array = 0.0
    grad_bytes: Array = 4.0
    master_bytes: Array = 4.0
    optim_bytes: Array = 8.0
    cast_bytes: Array = 0.0
    scale_block: Array = 0.0
    scale_bytes: Array = 0.0
    name: str = "custom"

    def __post_init__(self):
        for f in ("gemm_dtype", "attn_dtype"):
            object.__setattr__(self, f, code_of(getattr(self, f), DTYPES, f))


_register(Precision, meta=("name",))

#: Presets by name (bytes per element / parameter; see the module docstring for sources).
PRESETS: dict[str, dict[str, Any]] = {
    # FP32 training: weights are the master copy (no separate master), Adam m, v in fp32.
    "fp32": dict(gemm_dtype="fp32", attn_dtype="fp32", gemm_bytes=4.0, act_bytes=4.0,
                 kv_bytes=4.0, weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0,
                 optim_bytes=8.0),
    # TF32 tensor cores on FP32 storage (A100 whitepaper: TF32 is the default FP32 math mode).
    "tf32": dict(gemm_dtype="tf32", attn_dtype="tf32", gemm_bytes=4.0, act_bytes=4.0,
                 kv_bytes=4.0, weight_bytes=4.0, grad_bytes=4.0, master_bytes=0.0,
                 optim_bytes=8.0),
    # Mixed precision (Micikevicius et al. 2018; Megatron-LM): 16-bit weights and
    # activations, fp32 main gradients, fp32 master weights + Adam m, v (2 + 4 + 12 B).
    "bf16": dict(gemm_dtype="bf16", attn_dtype="bf16"),
    "fp16": dict(gemm_dtype="fp16", attn_dtype="fp16"),
    # Transformer Engine FP8 (Micikevicius et al. 2022): E4M3/E5M2 GEMMs forward and
    # backward, per-tensor delayed scaling (amax fused into the cast: read 2 B, write 1 B),
    # BF16 attention and weights, a cached FP8 weight copy; serving: FP8 weights and KV.
    "fp8": dict(gemm_dtype="fp8", attn_dtype="bf16", gemm_bytes=1.0, kv_bytes=1.0,
                weight_copy_bytes=1.0, cast_bytes=3.0),
    # NVFP4 (Blackwell): E2M1 elements (0.5 B), one E4M3 scale per 16 elements; GEMMs in FP4
    # (cast: read 2 B, write 0.5 B), attention in BF16, FP8 KV cache when serving.
    "fp4": dict(gemm_dtype="fp4", attn_dtype="bf16", gemm_bytes=0.5, kv_bytes=1.0,
                weight_copy_bytes=0.5, cast_bytes=2.5, scale_block=16.0, scale_bytes=1.0),
    # Serving presets of the two FP4 block formats as TensorRT-LLM / vLLM deploy them on
    # Blackwell. NVFP4 ("Introducing NVFP4", NVIDIA 2025; TensorRT-LLM ``QuantAlgo.NVFP4``,
    # ModelOpt ``nvidia/*-FP4`` checkpoints): E2M1 elements, one E4M3 (1 B) scale per 16
    # elements (the per-tensor FP32 scale is negligible): 0.5 + 1/16 B per weight; FP8 KV.
    "nvfp4": dict(gemm_dtype="fp4", attn_dtype="bf16", gemm_bytes=0.5, kv_bytes=1.0,
                  weight_copy_bytes=0.5, cast_bytes=2.5, scale_block=16.0, scale_bytes=1.0),
    # NVFP4 weights and an NVFP4 KV cache (TensorRT-LLM "NVFP4 KV Cache",
    # ``KvCacheConfig(dtype="nvfp4")``, Blackwell only): the cache holds E2M1 elements plus
    # one E4M3 scale per 16, 0.5 + 1/16 = 0.5625 B per element.
    "nvfp4kv": dict(gemm_dtype="fp4", attn_dtype="bf16", gemm_bytes=0.5, kv_bytes=0.5625,
                      weight_copy_bytes=0.5, cast_bytes=2.5, scale_block=16.0,
                      scale_bytes=1.0),
    # MXFP4 (OCP Microscaling v1.0 §5: 32 E2M1 elements share one E8M0 (1 B) scale): 0.5 +
    # 1/32 B per weight; FP4 GEMMs on Blackwell's block-scaled tensor cores (vLLM / TensorRT-LLM
    # gpt-oss MXFP4 checkpoints), FP8 KV cache.
    "mxfp4": dict(gemm_dtype="fp4", attn_dtype="bf16", gemm_bytes=0.5, kv_bytes=1.0,
                  weight_copy_bytes=0.5, cast_bytes=2.5, scale_block=32.0, scale_bytes=1.0),
    # INT8 W8A8 (SmoothQuant): int8 GEMMs, per-token activation quantisation (read 2, write
    # 1 B), FP16 attention and KV cache.
    "int8": dict(gemm_dtype="int8", attn_dtype="fp16", gemm_bytes=1.0,
                 weight_copy_bytes=1.0, cast_bytes=3.0),
    # 4-bit weights, 16-bit activations (AWQ/GPTQ): FP16 tensor-core compute on weights
    # dequantised in the kernel, group size 128 with FP16 scales; the GEMM streams 4-bit
    # weights (one word for all operands in the tile model: 0.5 B + scales).
    "w4a16": dict(gemm_dtype="fp16", attn_dtype="fp16", gemm_bytes=0.5, scale_block=128.0,
                  scale_bytes=2.0),
}


def precision(value: Any = None, **overrides) -> Precision:
    """Convert a preset name, a mapping of fields or a :class:`Precision` to a Precision.

    Args:
        value: ``None`` (→ ``"bf16"``), a name of :data:`PRESETS`, a mapping of fields, or a
            :class:`Precision` (returned as is, with ``overrides`` applied).
        **overrides: fields to replace (names accepted for the dtype codes).

    Raises:
        ValueError: unknown name or field; the message lists the known ones.

    Example:
        >>> p = jm.precision("fp8", kv_bytes=2.0)
        >>> p.name, float(p.gemm_bytes), float(p.kv_bytes), float(p.master_bytes)
        ('fp8', 1.0, 2.0, 4.0)
    """
    return from_preset(Precision, value, overrides, PRESETS, {
        "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "e4m3": "fp8",
        "w8a8": "int8", "awq": "w4a16", "gptq": "w4a16"},
        "bf16", "precision")


def resolve(precision_arg: Any = None, dtype_bytes: Any = None) -> Precision:
    """The precision of a public call from its ``precision=`` and legacy ``dtype_bytes=``.

    ``dtype_bytes`` alone keeps its old meaning (bytes per weight / activation / KV element
    with a 16-bit compute rate): the ``"bf16"`` preset with ``gemm_bytes``, ``act_bytes``,
    ``kv_bytes`` and ``weight_bytes`` set to it. Both given: ``dtype_bytes`` overrides those
    four fields of ``precision``.
    """
    p = precision(precision_arg)
    if dtype_bytes is None:
        return p
    return dataclasses.replace(p, gemm_bytes=dtype_bytes, act_bytes=dtype_bytes,
                               kv_bytes=dtype_bytes, weight_bytes=dtype_bytes)


def stack_precisions(values) -> Precision:
    """A batch of precisions (leading axis) from names or Precision objects."""
    return stack_configs(Precision, [precision(v) for v in values], "precision")


def validate_precision(p: Precision, where: str = "Precision") -> Precision:
    """Check a concrete precision: dtype codes in range, byte counts >= 0 (GEMM operands,
    activations, KV cache and weights > 0); ``ValueError`` names the field and value."""
    positive = ("gemm_bytes", "act_bytes", "kv_bytes", "weight_bytes")
    for f in dataclasses.fields(Precision):
        if f.name == "name":
            continue
        if f.name in ("gemm_dtype", "attn_dtype"):
            rule = _code(DTYPES)
        elif f.name == "scale_block":
            rule = Rule(lo=0.0, hi=2.0 ** 20, integer=True)
        else:
            rule = Rule(lo=0.0, hi=64.0, lo_open=f.name in positive, dim="B")
        check_value(where, f.name, getattr(p, f.name), rule)
    return p


# ------------------------------------------------------------------------------------------
# derived quantities (single configuration, pure JAX)
# ------------------------------------------------------------------------------------------
def scale_overhead(p: Precision):
    """Block-scale bytes per element, ``scale_bytes / scale_block`` (0 for per-tensor)."""
    blk = p.scale_block
    return jnp.where(blk > 0, p.scale_bytes / jnp.where(blk > 0, blk, 1.0), 0.0)


def gemm_word(p: Precision):
    """Bytes per weight-GEMM operand element incl. block scales (OCP MX v1.0 §5; NVFP4)."""
    return p.gemm_bytes + scale_overhead(p)


def widest_gemm_word(p: Precision, kv_cache: bool = False):
    """Bytes per element of the widest operands a training or serving step multiplies: the
    weight GEMMs' :func:`gemm_word` or the attention products and LM head, which run on
    activations (``act_bytes``); with ``kv_cache`` (serving) also ``kv_bytes``, the words
    the attention products read from the KV cache. The device's buffer check is made at
    this word (:func:`jaxmodel.parallel.plan.system_checks`)."""
    word = jnp.maximum(gemm_word(p), p.act_bytes)
    return jnp.maximum(word, p.kv_bytes) if kv_cache else word


def serving_weight_bytes(p: Precision):
    """Bytes per parameter of deployed weights: the GEMM storage type incl. scales."""
    return gemm_word(p)


def training_weight_bytes(p: Precision):
    """Bytes per parameter of the weights held in training: the model copy plus the cached
    low-precision copy (with its block scales)."""
    copy = p.weight_copy_bytes
    return p.weight_bytes + copy + jnp.where(copy > 0, scale_overhead(p), 0.0)


def matrix_ratio(dev, code):
    """Dense matrix peak of dtype ``code`` relative to the device's 16-bit peak (0 = none)."""
    ratios = [getattr(dev, f) for f in RATIO_FIELDS]
    if np.ndim(code) == 0 and not isinstance(code, jax.core.Tracer):
        # a constant code: pick the field in Python (no select of constants to evaluate)
        hits = [i for i in range(len(DTYPES)) if abs(float(code) - i) < 0.5]
        return ratios[hits[0]] if hits else 0.0
    return jnp.select([jnp.abs(code - i) < 0.5 for i in range(len(DTYPES))], ratios, 0.0)


def supported(dev, p: Precision):
    """True where the device's tensor cores run both ``gemm_dtype`` and ``attn_dtype``."""
    return (matrix_ratio(dev, p.gemm_dtype) > 0) & (matrix_ratio(dev, p.attn_dtype) > 0)


def scaled_device(dev, code):
    """``dev`` with its systolic arrays running at dtype ``code``'s rate: ``sa_mac_per_cycle``
    × :func:`matrix_ratio` (an unsupported dtype keeps the 16-bit rate; callers flag it with
    :func:`supported`, so the time stays finite and the gradient too)."""
    r = matrix_ratio(dev, code)
    r = (jnp if isinstance(r, jax.Array) else np).where(r > 0, r, 1.0)
    return dataclasses.replace(dev, sa_mac_per_cycle=dev.sa_mac_per_cycle * r)


__all__ = ["Precision", "precision", "PRESETS", "DTYPES", "RATIO_FIELDS", "gemm_word",
           "supported", "matrix_ratio", "stack_precisions", "validate_precision"]
