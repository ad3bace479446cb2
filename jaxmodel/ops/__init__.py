"""jaxmodel.ops: single-device operator models (LLMCompass seed 003 §III-B).

GEMM tile-level mapper (:func:`gemm_latency`) with a roofline reference, the vector-unit
operators (softmax, layernorm, GELU, a generic elementwise kernel), and feasibility checks.
"""

from jaxmodel.ops.feasibility import ops_feasible, validate_device_for_ops
from jaxmodel.ops.gemm import gemm_latency, gemm_roofline
from jaxmodel.ops.systolic import systolic_cycles
from jaxmodel.ops.vector import (elementwise_latency, gelu_latency, layernorm_latency,
                                 softmax_latency)

__all__ = ["gemm_latency", "gemm_roofline", "softmax_latency", "layernorm_latency",
           "gelu_latency", "elementwise_latency", "ops_feasible", "validate_device_for_ops",
           "systolic_cycles"]
