"""jaxmodel.workload: the transformer layer op graph under TP/SP, its training variant,
parameter/FLOP counts and the memory footprint (weights, optimizer, activations, KV cache).

Public names (each batched at the API edge; ``.single`` is the single-configuration body for
use inside other formulas):

- :func:`layer_breakdown` — per-op seconds of one layer (LLMCompass rows, :data:`LAYER_OPS`);
- :func:`training_layer_times`, :func:`embedding_times` — training graph (fwd, bwd,
  recompute, TP communication), embedding / LM head / loss (:mod:`jaxmodel.workload.embedding`,
  whose head and lookup serve inference too);
- :func:`param_count`, :func:`params_per_device`, :func:`model_flops_per_token`;
- :func:`activation_bytes_per_layer`, :func:`training_memory`, :func:`kv_cache_bytes`,
  :func:`inference_memory`, :func:`memory_breakdown` (a training result's memory terms, GiB;
  :data:`TRAIN_MEMORY_TERMS`);
- Mixture-of-Experts (:mod:`jaxmodel.workload.moe`): :func:`expert_capacity`,
  :func:`moe_dims`, :func:`moe_feasibility`, :func:`moe_layer_times`, :func:`alltoall_time`,
  :func:`expert_params_per_device`, :data:`MOE_OPS` (extra layer rows);
- fine-tuning (:mod:`jaxmodel.workload.finetune`): :class:`LoRA`, :func:`lora`, :func:`qlora`
  (the ``finetune=`` argument of :func:`jaxmodel.train_step`);

:func:`~jaxmodel.parallel.inference_step.inference` and ``InferenceResult`` live in
``jaxmodel.parallel.inference_step`` and are exported by ``jaxmodel.parallel`` (data flows
workload → parallel, so this package does not import them).
"""

from jaxmodel.workload.embedding import embedding_times
from jaxmodel.workload.layer import LAYER_OPS, layer_breakdown, training_layer_times
from jaxmodel.workload.memory import (TRAIN_MEMORY_TERMS, activation_bytes_per_layer,
                                      inference_memory, kv_cache_bytes, memory_breakdown,
                                      training_memory)
from jaxmodel.workload.moe import (MOE_OPS, alltoall_time, expert_capacity,
                                   expert_params_per_device, moe_dims, moe_feasibility,
                                   moe_layer_fraction, moe_layer_times)
from jaxmodel.workload.finetune import LoRA, lora, qlora
from jaxmodel.workload.params import model_flops_per_token, param_count, params_per_device

__all__ = ["LAYER_OPS", "layer_breakdown", "training_layer_times", "embedding_times",
           "param_count", "params_per_device", "model_flops_per_token",
           "activation_bytes_per_layer", "training_memory", "kv_cache_bytes",
           "memory_breakdown", "TRAIN_MEMORY_TERMS",
           "inference_memory", "MOE_OPS", "expert_capacity", "moe_dims", "moe_feasibility",
           "moe_layer_fraction", "moe_layer_times", "alltoall_time", "expert_params_per_device",
           "LoRA", "lora", "qlora"]
