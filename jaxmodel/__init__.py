"""jaxmodel: a vectorised, differentiable performance and cost model of LLM training and
inference on accelerator systems.

Every latency, communication and cost formula is a pure JAX function of configuration pytrees
(:class:`Device`, :class:`System`, :class:`Model`, :class:`Parallelism`), so one jitted, vmapped
call evaluates a whole design space and ``jax.grad`` differentiates with respect to continuous
hardware knobs. See ``docs/architecture.md`` for the public API contract.

Example:
    >>> import jaxmodel as jm, hw_db
    >>> dev = hw_db.device("a100_80gb")
    >>> t = jm.gemm_latency(dev, 2048, 12288, 12288)      # seconds
"""

from jaxmodel import process as _process

_process.prepare_logging()   # before jaxlib loads (see process)
_process.configure_compilation_cache()   # JAXMODEL_CACHE_DIR / JAXMODEL_NO_CACHE, see process

import sys as _sys  # noqa: E402
from jaxmodel import batching as _batching  # noqa: E402
_batching.prepare_command_line(_sys.argv[1:])   # a repeated question starts loading (see batching)

from jaxmodel.types import (ACTIVATIONS, ATTENTIONS, RECOMPUTE, SCHEDULES, TOPOLOGIES, Device,  # noqa: E402,E501
                            Model, NetLevel, Parallelism, System, validate_device, validate_model,
                            validate_parallelism, validate_system)
from jaxmodel.numerics import REASONS, reason_name  # noqa: E402
from jaxmodel.precisions import (DTYPES,  # noqa: E402
                                PRESETS, Precision, precision, stack_precisions,
                                validate_precision)
from jaxmodel.serving_runtime import PRESETS as RUNTIMES, Runtime, runtime as runtime_of  # noqa: E402,E501

# Each subpackage lists its public names in its own __all__ (tests/test_api.py checks that
# these imports take exactly those names).
from jaxmodel.ops import (  # noqa: E402
                          FA_VERSIONS, add_latency, elementwise_latency, embedding_latency,
                          flash_attention_latency, flash_attention_rows, flash_attention_tiles,
                          gelu_latency, gemm_latency, gemm_roofline, layernorm_latency,
                          ops_feasible, rmsnorm_latency, rope_latency, silu_mul_latency,
                          softmax_latency, standard_attention_latency, systolic_cycles,
                          validate_device_for_ops)
from jaxmodel.ops import AttentionKernel, AttentionShape, with_matrix_rate  # noqa: E402
from jaxmodel.comm import (  # noqa: E402
                           ALGORITHM_CODES, ALGORITHMS, AUTO_ALGORITHM, OPS, algorithm_code,
                           collective_cost, collective_feasible, collective_latency,
                           collective_time, net_variant_of, NetVariant)
from jaxmodel.workload import (  # noqa: E402
                               LAYER_OPS, MOE_OPS, activation_bytes_per_layer, alltoall_time,
                               embedding_times, expert_capacity, expert_params_per_device,
                               inference_memory, kv_cache_bytes, layer_breakdown, LoRA, lora,
                               memory_breakdown, TRAIN_MEMORY_TERMS,
                               model_flops_per_token, moe_dims, moe_feasibility,
                               moe_layer_fraction, moe_layer_times, param_count, params_per_device,
                               qlora, training_layer_times, training_memory)
from jaxmodel.parallel import (  # noqa: E402
                               inference, InferenceResult, train_step, TrainResult,
                               make_train_step, TrainOptions, TrainStatics,
                               make_inference_step, InferenceOptions, InferenceStatics)
from jaxmodel.cost import (  # noqa: E402
                           TCO, chiplet_cost, chiplet_system_cost, ChipletCost, ChipletSystem,
                           device_cost, DeviceCost, die_area, die_cost, dies_per_wafer,
                           dies_per_wafer_grid, dies_per_wafer_smooth, dies_per_wafer_ttm, dvfs,
                           LinkTech, load_chiplet_system, load_deepflow_config, load_library,
                           negative_binomial_yield, reticle_utilization, sram_area, SRAMTech,
                           system_cost, SystemCost, tco, uarch, UArchBudgets, UArchTech)
from jaxmodel.serving import (OfflineResult, ServingCosts, ServingResult,  # noqa: E402
                              continuous_batching, disaggregated, offline_throughput,
                              serving_costs, slo_throughput)
from jaxmodel.speculative import Speculative, expected_tokens  # noqa: E402

from jaxmodel.recipes import RECIPES, Recipe, recipe  # noqa: E402
from jaxmodel.export import LaunchConfig, export_plan  # noqa: E402
from jaxmodel.export import ServeExportOptions, TrainExportOptions  # noqa: E402
from jaxmodel.cost import DatacenterOperation  # noqa: E402
from jaxmodel.energy import inference_energy, train_energy  # noqa: E402
from jaxmodel.explain import bottleneck, explain_serve, explain_train, sensitivity  # noqa: E402,E501

__version__ = "0.1.0"

#: The public names (docs/architecture.md, "Public names"; tests/test_api.py).
__all__ = [
    "ACTIVATIONS", "ALGORITHMS", "ALGORITHM_CODES", "ATTENTIONS", "AUTO_ALGORITHM", "ChipletCost",
    "ChipletSystem", "CodesignResult", "DTYPES", "Device", "DeviceCost", "FA_VERSIONS",
    "InferenceOptions", "InferenceResult", "InferenceStatics", "LAYER_OPS", "LaunchConfig", "LinkTech", "LoRA", "MOE_OPS", "Model",
    "NetLevel", "NetVariant", "OPS", "OfflineResult", "PRESETS", "Parallelism", "Precision",
    "REASONS", "RECIPES", "RECOMPUTE", "RUNTIMES", "Recipe", "Runtime", "SCHEDULES", "SRAMTech",
    "ServingCosts", "ServingResult", "Speculative", "System", "SystemCost", "TCO", "TOPOLOGIES",
    "TRAIN_MEMORY_TERMS", "TrainOptions", "TrainResult", "TrainStatics", "UArchBudgets", "UArchTech",
    "activation_bytes_per_layer", "add_latency", "algorithm_code", "alltoall_time", "bottleneck",
    "chiplet_cost", "chiplet_system_cost", "codesign", "collective_cost", "collective_feasible",
    "collective_latency", "collective_time", "continuous_batching", "device_cost", "die_area",
    "die_cost", "dies_per_wafer", "dies_per_wafer_grid", "dies_per_wafer_smooth",
    "dies_per_wafer_ttm", "disaggregated", "dvfs", "elementwise_latency", "embedding_latency",
    "embedding_times", "enumerate_plans", "expected_tokens", "expert_capacity",
    "expert_params_per_device", "explain_serve", "explain_train", "export_plan",
    "flash_attention_latency", "flash_attention_rows", "flash_attention_tiles", "gelu_latency",
    "gemm_latency", "gemm_roofline", "inference", "inference_energy", "inference_memory",
    "kv_cache_bytes", "layer_breakdown", "layernorm_latency", "load_chiplet_system",
    "load_deepflow_config", "load_library", "lora", "make_inference_step", "make_train_step", "memory_breakdown", "model_flops_per_token",
    "moe_dims", "moe_feasibility", "moe_layer_fraction", "moe_layer_times",
    "negative_binomial_yield", "net_variant_of", "offline_throughput", "ops_feasible",
    "param_count", "params_per_device", "precision", "qlora", "reason_name", "recipe",
    "reticle_utilization", "rmsnorm_latency", "rope_latency", "runtime_of", "save",
    "search_parallelism", "search_serving", "sensitivity", "serving_costs", "silu_mul_latency",
    "slo_throughput", "softmax_latency", "sram_area", "stack_precisions",
    "standard_attention_latency", "sweep", "system_cost", "systolic_cycles", "tco",
    "train_energy", "train_step", "training_layer_times", "training_memory", "uarch",
    "validate_device", "validate_device_for_ops", "validate_model", "validate_parallelism",
    "validate_precision", "validate_system",
    "AttentionKernel", "AttentionShape", "CodesignOptions", "DatacenterOperation",
    "ServeExportOptions", "SweepOptions", "TrainExportOptions", "with_matrix_rate",
]

# Heavy optional dependencies (pandas, optax, matplotlib, tqdm) are imported inside the
# functions that use them; the search package (pandas DataFrames) loads on first use of one of
# its names, so ``import jaxmodel`` stays well under a second.
from jaxmodel import search as _search_pkg  # noqa: E402  (lazy: its modules load on access)
from jaxmodel import distributed  # noqa: E402,F401  (jm.distributed.initialize: multi-process runs)


def __getattr__(name):
    if name in _search_pkg.__all__:
        return getattr(_search_pkg, name)
    raise AttributeError(f"module 'jaxmodel' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_search_pkg.__all__))

