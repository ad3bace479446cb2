"""The flag table of the launch exports: every flag or config key an exporter may emit, with
the framework release and source file it was checked against (:data:`SOURCES`,
:data:`FLAGS`), the result type (:class:`LaunchConfig`) and the checked flag writer."""

from __future__ import annotations

import dataclasses
import shlex
from types import MappingProxyType
from typing import Any, Mapping



# --------------------------------------------------------------------------------------------
# Sources and the flag table
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Source:
    """Where a framework's flags were checked: project, release, commit, file(s)."""
    project: str
    version: str
    commit: str
    files: tuple[str, ...]


#: framework -> the release and source files its flags were checked against
SOURCES: Mapping[str, Source] = MappingProxyType({
    "megatron": Source("NVIDIA/Megatron-LM", "core_v0.15.0",
                       "0d7e02bd26d3eb347ad8d1bef625002babfa6df7",
                       ("megatron/training/arguments.py",
                        "megatron/core/transformer/pipeline_parallel_layer_layout.py",
                        "megatron/core/transformer/enums.py")),
    "torchtitan": Source("pytorch/torchtitan", "v0.2.2",
                         "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce",
                         ("torchtitan/config/job_config.py",
                          "torchtitan/distributed/pipeline_parallel.py",
                          "torchtitan/components/quantization/float8.py")),
    # the launcher of the training frameworks (PyTorch elastic)
    "torchrun": Source("pytorch/pytorch", "main@f34fa151",
                       "f34fa1515024423a239ce26f33a8b65ea9252502",
                       ("torch/distributed/run.py",)),
    "nemo": Source("NVIDIA/NeMo", "v2.4.0", "2381f42f6979449b5b99538f8f80135831009b51",
                   ("nemo/lightning/pytorch/strategies/megatron_strategy.py",
                    "nemo/lightning/pytorch/plugins/mixed_precision.py",
                    "nemo/collections/llm/recipes/llama31_405b.py",
                    "nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py")),
    # generated from the engine's config dataclasses; its deprecations name v0.12 and v0.13
    "vllm": Source("vllm-project/vllm", "0.11.x (main@99d7eb5d)",
                   "99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b", ("vllm/engine/arg_utils.py",)),
    # the server-arguments reference generated from python/sglang/srt/server_args.py
    "sglang": Source("sgl-project/sglang", "main@b36e8e19",
                     "b36e8e198b71553316b55bce53de6ecf9b3a9a47",
                     ("docs/advanced_features/server_arguments.md",)),
    "trtllm": Source("NVIDIA/TensorRT-LLM", "main@4c05a748",
                     "4c05a74891e4df8066f08ed4ce14b0972abe4e25",
                     ("tensorrt_llm/commands/serve.py", "tensorrt_llm/llmapi/llm_args.py")),
})

_MEGATRON_FLAGS = (
    # model shape
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--kv-channels", "--group-query-attention", "--num-query-groups", "--swiglu",
    "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
    "--seq-length", "--max-position-embeddings",
    # batch
    "--micro-batch-size", "--global-batch-size",
    # parallel layout
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
    "--context-parallel-size", "--cp-comm-type", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--pipeline-model-parallel-layout",
    # memory
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    "--ckpt-format",
    # numerics and kernels
    "--bf16", "--fp16", "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe",
    "--attention-backend",
    # overlap
    "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
    "--no-overlap-p2p-communication",
)

_TORCHTITAN_KEYS = (
    "model.converters",
    "training.local_batch_size", "training.global_batch_size", "training.seq_len",
    "training.mixed_precision_param",
    "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
    "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
    "parallelism.enable_async_tensor_parallel", "parallelism.pipeline_parallel_degree",
    "parallelism.pipeline_parallel_schedule", "parallelism.pipeline_parallel_microbatch_size",
    "parallelism.pipeline_parallel_layers_per_stage",
    "parallelism.pipeline_parallel_first_stage_less_layers",
    "parallelism.pipeline_parallel_last_stage_less_layers",
    "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
    "parallelism.expert_tensor_parallel_degree",
    "activation_checkpoint.mode", "activation_checkpoint.selective_ac_option",
    "compile.enable",
    "quantize.linear.float8.recipe_name", "quantize.linear.float8.enable_fsdp_float8_all_gather",
    "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
)


_NEMO_STRATEGY_KEYS = tuple("trainer.strategy." + k for k in (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel",
    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
    "pipeline_model_parallel_layout", "virtual_pipeline_model_parallel_size"))
_NEMO_PRECISION_KEYS = ("trainer.plugins.precision", "trainer.plugins.fp8",
                        "trainer.plugins.fp8_recipe")
#: recipe attributes as the v2.4.0 recipes set them (llama31_405b.py: ``trainer.num_nodes``,
#: ``trainer.devices``, ``data.*``, ``model.config.*``, ``optim.config.*``, ``ddp``)
_NEMO_RECIPE_KEYS = (
    "trainer.num_nodes", "trainer.devices", "data.micro_batch_size", "data.global_batch_size",
    "data.seq_length", "model.config.seq_length", "model.config.recompute_granularity",
    "model.config.recompute_method", "model.config.recompute_num_layers",
    "optim.config.use_distributed_optimizer", "trainer.strategy.ddp.overlap_grad_reduce",
    "trainer.strategy.ddp.overlap_param_gather",
)

_VLLM_FLAGS = (
    "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
    "--enable-expert-parallel", "--max-num-seqs", "--max-num-batched-tokens",
    "--enable-chunked-prefill", "--block-size", "--gpu-memory-utilization", "--dtype",
    "--quantization", "--kv-cache-dtype",
)

_SGLANG_FLAGS = (
    "--model-path", "--tp-size", "--pp-size", "--dp-size", "--ep-size",
    "--enable-dp-attention", "--max-running-requests", "--chunked-prefill-size",
    "--max-prefill-tokens", "--page-size", "--mem-fraction-static", "--dtype",
    "--quantization", "--kv-cache-dtype",
)

_TRTLLM_FLAGS = (
    "--backend", "--tp_size", "--pp_size", "--ep_size", "--max_batch_size",
    "--max_num_tokens", "--kv_cache_free_gpu_memory_fraction", "--enable_chunked_prefill",
    "--extra_llm_api_options",
)

#: keys of the ``--extra_llm_api_options`` YAML (``BaseLlmArgs`` / ``KvCacheConfig`` fields)
_TRTLLM_YAML_KEYS = (
    "dtype", "enable_attention_dp", "kv_cache_config.dtype",
    "kv_cache_config.tokens_per_block",
)


def _table(fw: str, names, file_index: int = 0) -> dict:
    s = SOURCES[fw]
    return {(fw, n): (s.project, s.version, s.files[file_index]) for n in names}


#: (framework, flag or config key) -> (project, version, source file): every flag this module
#: emits, and where it was read
FLAGS: Mapping[tuple[str, str], tuple[str, str, str]] = MappingProxyType({
    **_table("torchrun", ("--nnodes", "--nproc-per-node", "-m")),
    **_table("megatron", _MEGATRON_FLAGS),
    **_table("torchtitan", _TORCHTITAN_KEYS),
    **_table("nemo", _NEMO_STRATEGY_KEYS),
    **_table("nemo", _NEMO_PRECISION_KEYS, 1),
    **_table("nemo", _NEMO_RECIPE_KEYS, 2),
    **_table("vllm", _VLLM_FLAGS),
    **_table("sglang", _SGLANG_FLAGS),
    **_table("trtllm", _TRTLLM_FLAGS),
    **_table("trtllm", _TRTLLM_YAML_KEYS, 1),
})

TRAIN_FRAMEWORKS = ("megatron", "nemo", "torchtitan")
SERVE_FRAMEWORKS = ("vllm", "sglang", "trtllm")
FRAMEWORKS = TRAIN_FRAMEWORKS + SERVE_FRAMEWORKS


# --------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """What to type to run a plan.

    Attributes:
        framework: a name of :data:`FRAMEWORKS`.
        version: the framework release the flags were checked against (:data:`SOURCES`).
        argv: the command, one token per element (the launcher, e.g. ``torchrun``, first).
        flags: flag or config key -> value (``True`` for a switch), in emission order.
        files: file name -> contents that the command reads (TOML, YAML); empty if none.
        notes: what the export assumed or left to the user (one sentence each).

    Example:
        >>> cfg = LaunchConfig("vllm", "v0.11.0", ("vllm", "serve", "my model", "-tp", "2"),
        ...                    {"-tp": 2}, {})
        >>> cfg.command
        "vllm serve 'my model' -tp 2"
    """
    framework: str
    version: str
    argv: tuple[str, ...]
    flags: Mapping[str, Any]
    files: Mapping[str, str]
    notes: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The command line, shell-quoted."""
        return shlex.join(self.argv)

    def __str__(self) -> str:
        out = [self.command]
        for name, text in self.files.items():
            out += [f"# --- {name} ---", text.rstrip("\n")]
        out += [f"# note: {n}" for n in self.notes]
        return "\n".join(out) + "\n"


class _Emitter:
    """Ordered flags of one framework, each checked against :data:`FLAGS`."""

    def __init__(self, fw: str):
        self.fw, self.flags = fw, {}

    def __call__(self, name: str, value: Any = True) -> None:
        if (self.fw, name) not in FLAGS:
            raise KeyError(f"{self.fw}: flag {name!r} is not in jaxmodel.export.FLAGS")
        self.flags[name] = value

    def argv(self) -> list[str]:
        out = []
        for k, v in self.flags.items():
            if v is True:
                out.append(k)
            elif isinstance(v, (list, tuple)):
                out += [k, *map(str, v)]
            else:
                out += [k, str(v)]
        return out
