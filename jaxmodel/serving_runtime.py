"""Serving runtime as a configuration dimension: kernel launch costs, fusions, CUDA graphs,
attention kernel and per-step host overhead.

The layer model of :mod:`jaxmodel.workload.layer` times every kernel of a layer with its
per-kernel overhead. *Which* overhead, and *which* kernels exist at all, depends on the serving
runtime: PyTorch eager launches every op as its own kernel through the Python dispatcher
(LLMCompass's measurements: the ``*_overhead_s`` device fields, e.g. 26 µs per GEMM, 48 µs per
LayerNorm on A100); compiled runtimes (TensorRT-LLM, FasterTransformer) enqueue kernels from
C++ ahead of the GPU and fuse the memory-bound operations of a layer, so the GPU sees only the
device-side kernel floors (the ``*_kernel_overhead_s`` / ``rmsnorm_overhead_s`` ... fields,
calibrated on kernel-timer data) of fewer kernels.

A :class:`Runtime` is a frozen dataclass pytree like :class:`jaxmodel.Precision` (every field
a numeric leaf, flags as 0/1), so a batch may mix runtimes.

Fields and what they change (:func:`device_for`, :func:`jaxmodel.workload.layer.layer_graph`,
:func:`jaxmodel.parallel.inference_step.inference`):

- ``kernel_floor``: 1 charges every kernel its device-side floor instead of the eager per-call
  overhead: GEMM ``matmul_kernel_overhead_s``; LayerNorm and softmax (one block per row,
  a row reduction) the RMSNorm family floor ``rmsnorm_overhead_s``; GELU the fused
  activation floor ``silu_mul_overhead_s``. Source: NVIDIA, "CUDA C++ Best Practices Guide"
  (asynchronous launches: the host runs ahead of the GPU, so with a C++ enqueue loop the GPU
  time per kernel is the kernel's own duration); TensorRT-LLM ``gptSession`` (C++ runtime).
- ``cuda_graph``: decode steps replay a captured CUDA graph: kernel floors in decode whatever
  ``kernel_floor`` says (one graph launch per step instead of one launch per kernel; the
  launch is in ``step_overhead_s``). Source: NVIDIA CUDA Programming Guide §3.2.8.7
  ("CUDA Graphs"); Kwon et al., "Efficient Memory Management for Large Language Model Serving
  with PagedAttention" (vLLM), SOSP'23, §6 (CUDA graphs for decoding).
- ``fuse_norm``: residual add + normalisation as one streaming kernel (TensorRT-LLM /
  FasterTransformer ``generalAddBiasResidualLayerNorm``, vLLM ``fused_add_rms_norm``):
  the norm row is timed by the bandwidth model of :func:`jaxmodel.ops.rmsnorm_latency`
  (two reads and one write of the row) instead of LLMCompass's LayerNorm tiling.
- ``fuse_act``: GELU / SiLU·mul in the epilogue of the first FFN GEMM (TensorRT-LLM
  gated-activation GEMM plugin, FasterTransformer ``addBiasGeluV2`` fused into the cuBLASLt
  epilogue): the ``act`` row is 0 (its elementwise work rides on the GEMM's output tiles).
- ``fuse_rope``: rotary embedding in the QKV epilogue / the attention kernel's prologue
  (TensorRT-LLM ``gpt_attention`` plugin, FlashInfer): no separate RoPE kernel.
- ``attention``: 0 the attention kernel of ``par.flash_attention``; 1 fused attention:
  FlashAttention-2 in prefill (Dao 2023) and a split-KV decode kernel whose thread blocks read
  each KV head's cache once for all its query heads (Flash-Decoding, Dao et al. 2023;
  TensorRT-LLM's XQA kernel, v0.7+; vLLM PagedAttention); 2 as 1 but the decode kernel runs
  one thread block per (sequence, query head), reading the KV head's cache once per query
  head (TensorRT-LLM's masked multi-head attention before XQA: v0.5-0.6 on GQA models).
- ``chunked_attention``: 1 decodes the chunked-attention layers of a model
  (``Model.attention_chunk > 0``: Llama-4's local layers) by the per-query-head kernel of
  ``attention`` 2 whatever ``attention`` says for the other layers. TensorRT-LLM's XQA
  generation kernels reject chunked attention (``supportConfigCommon`` in
  ``cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/decoderXQAImplJIT/
  kernelUtils.cpp``: "chunked attention is not supported yet"), so on Hopper those layers
  fall back to the masked multi-head attention kernel (MMHA), one thread block per (sequence,
  query head); TensorRT-LLM pull request 6306 ("Improve Llama4 performance for small
  max_seqlen cases": "XQA does not support chunked attention at the moment, while MMHA
  supports chunked attention but is slower") keeps XQA when ``max_seq_len`` is below the
  chunk; it reached release/1.0 as a cherry-pick (pull request 7681, September 2025),
  listed among the known problems of release 0.21 ("a known performance regression (only
  affect LLaMA4 model) on Hopper") until then. Global (NoPE) layers carry no chunk and keep XQA
  (``tensorrt_llm/_torch/models/modeling_llama.py``, ``Llama4DecoderLayer``:
  ``attention_chunk_size`` only where ``no_rope_layers[i]`` is 1).
- ``sustained_clock``: 1 runs the device at its sustained clock (``freq_hz`` ×
  ``sustained_clock_fraction``, the power-limited clock under back-to-back load, derived in
  hw_db from sustained cuBLASLt throughput), as a serving benchmark or a loaded server runs;
  0 at the boost clock (LLMCompass's single-kernel measurements). The training model uses
  the same field (:func:`jaxmodel.parallel.train.sustained_device`).
- ``step_overhead_s``: host time per forward step (prefill and each decode step) not hidden
  behind the GPU: sampling, scheduling, graph launch, s.
- ``context_layer_overhead_s``: host time per decoder layer, once per request, before the
  GPU starts the request's context (prefill) step, s. A static-batch session runtime
  (TensorRT-LLM ``GptSession::generate``, v0.5-0.6) switches the TensorRT execution context
  to the context-phase optimisation profile and binds every layer's KV-cache input and
  output tensors (``past_key_value_<i>``, ``present_key_value_<i>``) before enqueueing the
  engine, and TensorRT resolves the shapes of the whole network on the host when input
  shapes change (NVIDIA, "TensorRT Developer Guide", §"Working with Dynamic Shapes":
  ``setInputShape`` then ``enqueueV3``): host work proportional to the layers, serial with
  the GPU for the first step only (decode steps keep the generation profile and their
  shapes move by one token). The time to first token of ``gptSessionBenchmark`` is the host
  wall clock around ``generate()`` and a stream synchronisation (TensorRT-LLM
  ``benchmarks/cpp/gptSessionBenchmark.cpp``), so it includes this time. With ``pp``
  stages every rank binds its ``n_layers/pp`` layers at once.
- ``encoder_bytes``: bytes per parameter of the model's modality encoder
  (``Model.encoder_params``: Llama-4's vision tower and projector) that every device holds
  besides the language model; 0 = the encoder is not loaded (or not counted). TensorRT-LLM
  v1.0's PyTorch backend builds the Hugging Face ``Llama4VisionModel`` and
  ``Llama4MultiModalProjector`` on every rank (``tensorrt_llm/_torch/models/
  modeling_llama.py``, ``Llama4VisionEncoder.load_weights``: the modules are created with
  PyTorch's default dtype, float32, loaded from the checkpoint and moved to
  ``cuda:<rank>`` whole, neither sharded nor quantised; its ``forward`` casts the pixel
  values to float32), unless the encoder runs disaggregated: 4 bytes per parameter on every
  GPU, memory the KV pool does not get (the pool is a fraction of what remains after the
  weights, ``KvCacheCreator`` in ``tensorrt_llm/_torch/pyexecutor/_util.py``).

Units: seconds; bytes per parameter; flags are 0/1.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxmodel import tech_tables as _tech_tables
from jaxmodel.types import Array, _register, from_preset, stack_configs

#: Flag fields (0/1 numeric leaves).
FLAGS = ("kernel_floor", "cuda_graph", "fuse_norm", "fuse_act", "fuse_rope", "sustained_clock",
         "chunked_attention")


@dataclasses.dataclass(frozen=True)
class Runtime:
    """Serving runtime: launch costs, fusions, CUDA graphs, attention kernel, host overhead.

    Attributes:
        kernel_floor: 1 = device-side kernel floors for every kernel, 0 = eager per-call
            overheads (see the module docstring).
        cuda_graph: 1 = decode steps replayed from a CUDA graph (kernel floors in decode).
        fuse_norm: 1 = residual add + norm as one streaming kernel.
        fuse_act: 1 = the FFN activation fused into the first FFN GEMM's epilogue.
        fuse_rope: 1 = RoPE fused into the QKV GEMM epilogue / attention kernel.
        attention: 0 = ``par.flash_attention``'s kernel, 1 = FlashAttention-2 prefill and a
            GQA-packed split-KV decode kernel, 2 = the same prefill and a per-query-head
            decode kernel.
        sustained_clock: 1 = the device at its sustained (power-limited) clock.
        chunked_attention: 1 = chunked-attention layers decode by the per-query-head kernel.
        encoder_bytes: bytes per modality-encoder parameter held on every device.
        step_overhead_s: host time per forward step not overlapped with the GPU, s.
        context_layer_overhead_s: host time per decoder layer before a request's context
            step (once per request), s.
        name: preset name (static metadata).
    """

    kernel_floor: Array = 0.0
    cuda_graph: Array = 0.0
    fuse_norm: Array = 0.0
    fuse_act: Array = 0.0
    fuse_rope: Array = 0.0
    attention: Array = 0.0
    sustained_clock: Array = 0.0
    step_overhead_s: Array = 0.0
    context_layer_overhead_s: Array = 0.0
    chunked_attention: Array = 0.0
    encoder_bytes: Array = 0.0
    name: str = "custom"


_register(Runtime, meta=("name",))

#: Calibrated preset fields: ``hw_db/tech/runtime.toml`` (each value with its source,
#: :mod:`jaxmodel.tech_tables`).
CALIBRATION_FILE = _tech_tables.TECH / "runtime.toml"


@functools.lru_cache(maxsize=None)
def calibration() -> dict[str, dict[str, float]]:
    """The calibrated values of :data:`CALIBRATION_FILE`: table -> field -> value (s).

    Raises:
        ValueError: an entry that is not ``{value = <finite number>, source = "..."}``.
    """
    out: dict[str, dict[str, float]] = {}
    for table, entries in _tech_tables.read(CALIBRATION_FILE).items():
        out[table] = {}
        for key, v in (entries.items() if isinstance(entries, dict) else ()):
            if isinstance(v, (str, list, dict)):
                raise ValueError(f"{CALIBRATION_FILE}: field '{table}.{key}' must be "
                                 f"{{value = <finite number>, source = \"...\"}}")
            out[table][key] = float(v)
    return out


#: The TensorRT-LLM presets' calibrated host times, s.
_CAL = calibration()
_TRT = _CAL["tensorrt_llm"]

#: Presets. Flags follow the runtimes' documented kernels; ``step_overhead_s`` and
#: ``context_layer_overhead_s`` are calibrated per runtime on measured end-to-end data where
#: there is any (``hw_db/tech/runtime.toml``, with the fits and their errors), else 0.
PRESETS: dict[str, dict[str, Any]] = {
    # PyTorch eager as LLMCompass measured it: every op its own kernel, per-call overheads.
    "pytorch": dict(),
    # TensorRT-LLM (v0.7+, gptSessionBenchmark): C++ enqueue loop (kernel floors), fused
    # add+LayerNorm, activation in the GEMM epilogue, RoPE in the attention plugin, fused MHA
    # in the context phase and the XQA generation kernel (one pass over each KV head's cache),
    # sustained clock. step_overhead_s and context_layer_overhead_s: [tensorrt_llm] of
    # hw_db/tech/runtime.toml, calibrated (experiments/validate_serving.py) on the A100
    # v0.5/0.6 rows of shared/anchors/inference/trtllm_a100_fp16.csv (throughput of the
    # multi-step rows, time to first token of the batch-1 rows).
    "trtllm": dict(kernel_floor=1.0, cuda_graph=1.0, fuse_norm=1.0, fuse_act=1.0,
                   fuse_rope=1.0, attention=1.0, sustained_clock=1.0,
                   step_overhead_s=_TRT["step_overhead_s"],
                   context_layer_overhead_s=_TRT["context_layer_overhead_s"]),
    # TensorRT-LLM v0.5-0.6 (the versions of the published A100 tables) and
    # FasterTransformer: as "trtllm" but generation attention by the masked MHA kernel, one
    # thread block per (query head, sequence) (TensorRT-LLM mmha_launch_kernel_ex: grid
    # num_heads × batch_size), each reading its KV head's cache, so a GQA group's K/V is read
    # once per query head (the XQA kernel sharing K/V loads across a GQA group came with
    # v0.7, TensorRT-LLM release notes). Same step_overhead_s and context_layer_overhead_s
    # calibrations.
    "trtllm_v06": dict(kernel_floor=1.0, cuda_graph=1.0, fuse_norm=1.0, fuse_act=1.0,
                       fuse_rope=1.0, attention=2.0, sustained_clock=1.0,
                       step_overhead_s=_TRT["step_overhead_s"],
                       context_layer_overhead_s=_TRT["context_layer_overhead_s"]),
    # vLLM (v0.4-0.6): eager PyTorch prefill with custom kernels, CUDA-graph decode,
    # fused_add_rms_norm, separate silu_and_mul and rotary_embedding kernels, FlashAttention
    # prefill / PagedAttention decode. No end-to-end anchor: step_overhead_s not calibrated.
    "vllm": dict(kernel_floor=0.0, cuda_graph=1.0, fuse_norm=1.0, fuse_act=0.0,
                 fuse_rope=0.0, attention=1.0, sustained_clock=1.0, step_overhead_s=0.0),
    # TensorRT-LLM v1.0, PyTorch backend (the LLM API's default backend from v1.0): layers
    # are PyTorch modules calling TensorRT-LLM's kernels; the overlap scheduler (on by
    # default, ``disable_overlap_scheduler=False``) prepares iteration n+1 on the host while
    # the GPU runs iteration n, so the GPU time per kernel is the kernel's own duration
    # (kernel floors); generation-only iterations replay CUDA graphs (``cuda_graph_config``);
    # residual add + RMSNorm fused (FlashInfer ``fused_add_rmsnorm``), SwiGLU a separate
    # fused silu·mul(+quantise) kernel, RoPE inside the attention op (``TrtllmAttention``),
    # FMHA context and XQA generation kernels (MMHA on chunked-attention layers:
    # ``chunked_attention``, the Hopper build the perf-overview rows ran), sustained clock.
    # encoder_bytes 4: a Llama-4 checkpoint's vision tower is loaded in float32 on every rank
    # (module docstring).
    # step_overhead_s:
    # [tensorrt_llm_v1] of hw_db/tech/runtime.toml, fitted on the DGX H100 rows of
    # shared/anchors/inference/trtllm_v1_perf_overview_h100.csv (offline throughput; the
    # fit does not survive leave-one-model-out, so 0 is kept: see its source).
    "trtllm_v1": dict(kernel_floor=1.0, cuda_graph=1.0, fuse_norm=1.0, fuse_act=0.0,
                      fuse_rope=1.0, attention=1.0, sustained_clock=1.0,
                      chunked_attention=1.0, encoder_bytes=4.0,
                      step_overhead_s=_CAL.get("tensorrt_llm_v1", {}).get(
                          "step_overhead_s", 0.0)),
    # vLLM >= 0.10, V1 engine: piecewise CUDA graphs over every iteration (torch.compile
    # splits the graph at the attention op: the GEMMs and elementwise kernels of mixed
    # iterations replay from graphs too, vLLM docs "torch.compile integration"), the
    # scheduler overlapped with the GPU in a separate engine-core process, fused_add_rms_norm,
    # SiluAndMul and the rotary embedding as custom kernels (compiled into fused Triton
    # kernels by Inductor where possible), FlashAttention 3 for prefill and decode on Hopper.
    # No anchor: step_overhead_s transferred from the TensorRT-LLM v1.0 calibration
    # (both overlap the host's scheduling with the GPU; uncalibrated).
    "vllm_v1": dict(kernel_floor=1.0, cuda_graph=1.0, fuse_norm=1.0, fuse_act=0.0,
                    fuse_rope=0.0, attention=1.0, sustained_clock=1.0,
                    step_overhead_s=_CAL.get("tensorrt_llm_v1", {}).get(
                        "step_overhead_s", 0.0)),
    # SGLang (v0.4-0.5): CUDA graphs for decode batches, the overlap scheduler (CPU scheduling
    # of batch n+1 during GPU batch n, on by default), FlashInfer / FA3 attention,
    # sgl-kernel fused_add_rmsnorm and silu_and_mul, RoPE a separate kernel. No anchor:
    # step_overhead_s transferred from the TensorRT-LLM v1.0 calibration (uncalibrated).
    "sglang": dict(kernel_floor=1.0, cuda_graph=1.0, fuse_norm=1.0, fuse_act=0.0,
                   fuse_rope=0.0, attention=1.0, sustained_clock=1.0,
                   step_overhead_s=_CAL.get("tensorrt_llm_v1", {}).get(
                       "step_overhead_s", 0.0)),
}

#: Scheduler settings of each preset used by the serving models when the call does not give
#: them (:func:`jaxmodel.serving.offline_throughput`): ``max_batch`` sequences per replica,
#: ``max_tokens`` tokens per iteration, ``block_tokens`` per KV block, ``mem_fraction`` the
#: KV pool's memory share, ``kv_of_free`` 1 when that share is of the memory left after
#: weights and activations (TensorRT-LLM), 0 when of the whole device (vLLM, SGLang);
#: ``chunk`` the prompt tokens per iteration of an online server with chunked prefill (0 =
#: whole prompts; :func:`jaxmodel.serving.slo_throughput`).
SCHEDULER: dict[str, dict[str, float]] = {
    # vLLM's V0 engine defaults (max_num_seqs 256, max_num_batched_tokens 8192 with chunked
    # prefill, block 16, gpu_memory_utilization 0.9): the settings of continuous_batching.
    "default": dict(max_batch=256.0, max_tokens=8192.0, block_tokens=16.0, mem_fraction=0.9,
                    kv_of_free=0.0, chunk=0.0),
    # trtllm-bench throughput, PyTorch backend (TensorRT-LLM v1.0
    # ``tensorrt_llm/bench/build/tuning.py`` ``finetune_setting``): max_batch_size = the
    # requests the KV cache holds, capped at 4096 (then / pp), max_num_tokens =
    # max_batch·(1 + isl/osl) capped at 32768, i.e. never below the steady state's need up to
    # the cap; KvCacheConfig defaults: tokens_per_block 32, free_gpu_memory_fraction 0.9 of
    # the memory free after weights and the activation profile.
    # Chunked context is off by default (``enable_chunked_prefill=False``, LLM API v1.0).
    "trtllm_v1": dict(max_batch=4096.0, max_tokens=32768.0, block_tokens=32.0,
                      mem_fraction=0.9, kv_of_free=1.0, chunk=0.0),
    # vLLM >= 0.10 V1 offline (``LLM`` class) on a device with >= 70 GiB other than A100
    # (``EngineArgs.get_batch_defaults``, vllm/engine/arg_utils.py): max_num_batched_tokens
    # 16384, max_num_seqs 1024; block 16; gpu_memory_utilization 0.9 of the whole device;
    # V1 always chunks prefill, at the OpenAI server's max_num_batched_tokens 8192.
    "vllm_v1": dict(max_batch=1024.0, max_tokens=16384.0, block_tokens=16.0,
                    mem_fraction=0.9, kv_of_free=0.0, chunk=8192.0),
    # SGLang server defaults (python/sglang/srt/server_args.py): chunked_prefill_size 8192 on
    # 80 GB-class GPUs, page_size 1, mem_fraction_static ~0.88 of the device for weights + KV
    # (set per GPU memory and TP; 0.88 taken), max_running_requests from the KV pool (4096
    # taken as the cap). Not verified against a measurement.
    "sglang": dict(max_batch=4096.0, max_tokens=8192.0, block_tokens=1.0, mem_fraction=0.88,
                   kv_of_free=0.0, chunk=8192.0),
}


def scheduler_defaults(name: str) -> dict[str, float]:
    """Scheduler settings of preset ``name`` (:data:`SCHEDULER`; ``"default"`` for a preset
    without its own)."""
    return dict(SCHEDULER.get(name, SCHEDULER["default"]))


#: CUDA-graph batch sizes of the perf-overview ``llm_options.yml`` (TensorRT-LLM v1.0
#: ``docs/source/performance/perf-overview.md``: ``cuda_graph_config.batch_sizes`` with
#: ``enable_padding: true``), sequences.
PERF_OVERVIEW_GRAPH_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096,
                               8192)


def _round_up_ladder(x, floor, ladder, last_step):
    """trtllm-bench's rounding of a raw setting: up to a multiple of the step of the first
    ``(below, step)`` rung of ``ladder`` with ``x < below`` (``last_step`` beyond the last
    rung), never under ``floor``."""
    step = next((st for below, st in ladder if x < below), last_step)
    return max(floor, step * math.ceil(x / step))


def trtllm_bench_settings(checkpoint: dict, tp, pp, isl, osl, device_mem_bytes,
                          kv_fraction=0.9) -> dict[str, float]:
    """The scheduler settings ``trtllm-bench throughput`` (TensorRT-LLM v1.0, PyTorch backend)
    passes to the executor when the command gives none, and the CUDA-graph batch sizes the
    executor then captures (concrete values; a host-side heuristic, not traced).

    ``checkpoint``: what trtllm-bench reads from the checkpoint, ``param_count`` (the
    safetensors element count), ``weight_bytes`` and ``kv_bytes`` per element (1 for an FP8
    checkpoint with an FP8 KV cache, 2 unquantised), ``attention_layers``, ``n_kv_heads``,
    ``head_dim``; ``tp``, ``pp`` the deployment; ``isl``, ``osl`` the dataset's mean lengths
    (tokens); ``device_mem_bytes`` one device's memory as NVML reports it; ``kv_fraction``
    the command's ``--kv_cache_free_gpu_mem_fraction`` (0.90 unless given; perf-overview.md
    uses 0.95 "in many cases", the value per row unpublished).

    Sources (TensorRT-LLM v1.0):

    - ``tensorrt_llm/bench/build/tuning.py`` ``calc_engine_setting``: bytes per KV token
      ``2·layers·max(tp, n_kv_heads)·head_dim·kv_bytes`` (every TP rank holds at least one KV
      head), the engine ``param_count·weight_bytes`` (the checkpoint's safetensors element
      count, ``bench/build/dataclasses.py``), the memory ``tp·pp`` devices of
      ``device_mem_bytes`` (NVML total, ``bench/build/utils.py``), KV requests
      ``kv_fraction·(memory − engine) / (bytes per token · (isl + osl))``; then
      ``finetune_setting``: ``raw_bs = min(requests, 4096)/pp``, ``raw_tokens = min(raw_bs·(1 +
      isl/osl), 32768)``; ``max_batch_size`` rounded up to 32 (at least 64) below 256, to 128
      below 1024, else to 256; ``max_num_tokens`` rounded up to 256 (at least 2048) below 4096,
      to 512 below 8192, else to 1024.
    - ``tensorrt_llm/bench/benchmark/utils/general.py`` ``get_settings``: without chunked
      prefill ``max_num_tokens`` is raised to ``isl + max_batch_size``.
    - ``tensorrt_llm/_torch/pyexecutor/model_engine.py`` ``_filter_cuda_graph_batch_sizes``:
      the captured sizes are those of :data:`PERF_OVERVIEW_GRAPH_BATCHES` up to
      ``min(max_batch_size, max_num_tokens)``, plus that bound itself when padding is on and a
      larger size was asked for; a generation-only batch is padded up to the next captured
      size.

    Returns:
        dict: ``max_batch`` and ``max_tokens`` (sequences, tokens), ``kv_requests`` (the
        heuristic's KV estimate, requests), ``graph_batches`` (tuple of captured sizes).

    Raises:
        ValueError: a non-positive size or a fraction outside (0, 1], naming the field.
    """
    keys = ("param_count", "weight_bytes", "kv_bytes", "attention_layers", "n_kv_heads",
            "head_dim")
    missing = [k for k in keys if k not in checkpoint]
    if missing:
        raise ValueError(f"trtllm_bench_settings: checkpoint lacks {missing}")
    vals = {k: checkpoint[k] for k in keys}
    vals.update(tp=tp, pp=pp, isl=isl, osl=osl, device_mem_bytes=device_mem_bytes)
    for k, v in vals.items():
        if not (np.isfinite(float(v)) and float(v) > 0):
            raise ValueError(f"trtllm_bench_settings: {k}={v} must be finite and > 0")
    if not 0.0 < float(kv_fraction) <= 1.0:
        raise ValueError(f"trtllm_bench_settings: kv_fraction={kv_fraction} must be in (0, 1]")
    c = {k: float(v) for k, v in vals.items()}
    tp, pp, isl, osl = c["tp"], c["pp"], c["isl"], c["osl"]
    gib = 1024.0 ** 3
    per_token = (2.0 * c["attention_layers"] * max(tp, c["n_kv_heads"]) * c["head_dim"]
                 * c["kv_bytes"] / gib)
    engine = c["param_count"] * c["weight_bytes"] / gib
    available = c["device_mem_bytes"] / gib * tp * pp - engine
    requests = available * kv_fraction / (per_token * (isl + osl))
    raw_bs = min(requests, 4096.0) / pp
    raw_tokens = min(raw_bs * (1.0 + isl / osl), 32768.0)
    max_bs = _round_up_ladder(raw_bs, 64.0, ((256.0, 32.0), (1024.0, 128.0)), 256.0)
    max_tokens = _round_up_ladder(raw_tokens, 2048.0, ((4096.0, 256.0), (8192.0, 512.0)), 1024.0)
    max_tokens = max(max_tokens, isl + max_bs)
    bound = min(max_bs, max_tokens)
    graphs = [float(b) for b in PERF_OVERVIEW_GRAPH_BATCHES if b <= bound]
    if (not graphs or graphs[-1] != bound) and PERF_OVERVIEW_GRAPH_BATCHES[-1] > bound:
        graphs.append(bound)
    return dict(max_batch=max_bs, max_tokens=max_tokens, kv_requests=requests,
                graph_batches=tuple(graphs))


def graph_padded_batch(batch, graph_batches):
    """The batch a generation-only iteration of ``batch`` sequences runs at when CUDA-graph
    padding is on: the smallest captured size ``>= batch``, or ``batch`` itself above the
    largest (no graph: eager). TensorRT-LLM v1.0 ``PyTorchModelEngine._round_up_batch_size``
    (``tensorrt_llm/_torch/pyexecutor/model_engine.py``). Sequences (concrete values)."""
    for g in sorted(graph_batches):
        if g >= batch:
            return float(g)
    return float(batch)


def runtime(value: Any = None, **overrides) -> Runtime:
    """Convert a preset name, a mapping of fields or a :class:`Runtime` to a Runtime.

    ``None`` gives ``"pytorch"`` (the eager calibration: results as without a runtime).

    Raises:
        ValueError: unknown name or field; the message lists the known ones.

    Example:
        >>> rt = jm.runtime_of("trtllm")
        >>> float(rt.kernel_floor)
        1.0
    """
    return from_preset(Runtime, value, overrides, PRESETS, {
        "tensorrtllm": "trtllm", "trt": "trtllm", "fastertransformer": "trtllm_v06",
        "trtllmv06": "trtllm_v06", "trtllmv0.6": "trtllm_v06", "eager": "pytorch",
        "trtllmv1": "trtllm_v1", "trtllm_v1.0": "trtllm_v1", "vllmv1": "vllm_v1",
        "torch": "pytorch"}, "pytorch", "runtime")


def stack_runtimes(values) -> Runtime:
    """A batch of runtimes (leading axis) from names or Runtime objects."""
    return stack_configs(Runtime, [runtime(v) for v in values], "runtime")


def is_eager(rt: Runtime) -> bool:
    """True when ``rt`` is concretely the eager default (every flag and the step overhead 0):
    callers then skip the runtime branches and give bit-identical results."""
    try:
        return all(float(np.asarray(getattr(rt, f.name))) == 0.0
                   for f in dataclasses.fields(Runtime) if f.name != "name")
    except Exception:   # traced leaves
        return False


def runtime_arg(value: Any = None):
    """The runtime a public call passes down: ``None`` for the concrete eager default (the
    formulas then trace the eager graph only, bit-identical to a call without a runtime),
    else the resolved :class:`Runtime`."""
    rt = runtime(value)
    return None if is_eager(rt) else rt


def floors_on(rt: Runtime, decode) -> jnp.ndarray:
    """Whether kernels are charged their device-side floors: ``kernel_floor``, or a decode
    step (``decode`` true) replayed from a CUDA graph."""
    return (rt.kernel_floor > 0.5) | ((rt.cuda_graph > 0.5) & decode)


def device_for(dev, rt: Runtime, decode):
    """``dev`` with the per-kernel overhead fields the runtime charges.

    Under :func:`floors_on`, the eager per-call fields are replaced by the device-side
    floors: ``matmul_overhead_s`` ← ``matmul_kernel_overhead_s``; ``softmax_overhead_s`` and
    ``layernorm_overhead_s`` ← ``rmsnorm_overhead_s`` (one thread block per row, a block
    reduction: the same kernel shape, the only row-reduction family with a kernel-timer
    calibration); ``gelu_overhead_s`` ← ``silu_mul_overhead_s`` (the fused elementwise
    activation family). Otherwise ``dev`` unchanged. ``sustained_clock`` scales ``freq_hz`` by
    ``sustained_clock_fraction``. Single configuration (``decode`` may be
    traced).
    """
    on = floors_on(rt, decode)
    return dataclasses.replace(
        dev,
        freq_hz=jnp.where(rt.sustained_clock > 0.5, dev.freq_hz * dev.sustained_clock_fraction,
                          dev.freq_hz),
        matmul_overhead_s=jnp.where(on, dev.matmul_kernel_overhead_s, dev.matmul_overhead_s),
        softmax_overhead_s=jnp.where(on, dev.rmsnorm_overhead_s, dev.softmax_overhead_s),
        layernorm_overhead_s=jnp.where(on, dev.rmsnorm_overhead_s, dev.layernorm_overhead_s),
        gelu_overhead_s=jnp.where(on, dev.silu_mul_overhead_s, dev.gelu_overhead_s))


def validate_runtime(rt: Runtime, where: str = "Runtime") -> Runtime:
    """Check a concrete runtime: flags in {0, 1}, overheads finite and ``>= 0`` (ValueError)."""
    for f in FLAGS:
        v = np.asarray(getattr(rt, f))
        if not np.all((v == 0.0) | (v == 1.0)):
            raise ValueError(f"{where}: {f}={v} must be 0 or 1")
    v = np.asarray(rt.attention)
    if not np.all((v == 0.0) | (v == 1.0) | (v == 2.0)):
        raise ValueError(f"{where}: attention={v} must be 0, 1 or 2")
    for f in ("step_overhead_s", "context_layer_overhead_s", "encoder_bytes"):
        v = np.asarray(getattr(rt, f))
        if not np.all(np.isfinite(v) & (v >= 0)):
            raise ValueError(f"{where}: {f}={v} must be finite and >= 0")
    return rt
