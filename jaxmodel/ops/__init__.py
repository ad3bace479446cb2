"""jaxmodel.ops: single-device operator models (LLMCompass LLMCompass §III-B).

GEMM tile-level mapper (:func:`gemm_latency`) with a roofline reference, the vector-unit
operators (softmax, layernorm, GELU, a generic elementwise kernel; RMSNorm, RoPE, SiLU·mul,
residual add and embedding lookup of Llama-family layers), feasibility checks, and the
attention kernels (standard three-pass and FlashAttention-1/2, :mod:`jaxmodel.ops.attention`).
"""

from jaxmodel.ops.attention import (FA_VERSIONS, AttentionKernel, AttentionShape,
                                    flash_attention_latency, flash_attention_rows,
                                    flash_attention_tiles, standard_attention_latency)
from jaxmodel.ops.feasibility import ops_feasible, validate_device_for_ops
from jaxmodel.ops.gemm import gemm_latency, gemm_roofline, with_matrix_rate
from jaxmodel.ops.systolic import systolic_cycles
from jaxmodel.ops.vector import (add_latency, elementwise_latency, embedding_latency,
                                 gelu_latency, layernorm_latency, rmsnorm_latency, rope_latency,
                                 silu_mul_latency, softmax_latency)

__all__ = ["gemm_latency", "gemm_roofline", "with_matrix_rate", "softmax_latency", "layernorm_latency",
           "gelu_latency", "elementwise_latency", "rmsnorm_latency", "rope_latency",
           "silu_mul_latency", "add_latency", "embedding_latency", "ops_feasible", "validate_device_for_ops",
           "systolic_cycles", "flash_attention_latency", "standard_attention_latency",
           "flash_attention_tiles", "flash_attention_rows", "FA_VERSIONS", "AttentionKernel",
           "AttentionShape"]
