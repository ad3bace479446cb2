"""Serving exporters: a :class:`~jaxmodel.export.plans.ServePlan` as a ``vllm serve``
(:func:`vllm_args`), SGLang (:func:`sglang_args`) or ``trtllm-serve`` (:func:`trtllm_args`)
command; every flag from :data:`jaxmodel.export.flags.FLAGS`."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from jaxmodel.export.flags import LaunchConfig, SOURCES, _Emitter
from jaxmodel.export.plans import ServePlan


def _serve_precision(fw: str, p: ServePlan) -> None:
    if p.precision not in ("bf16", "fp16", "fp8"):
        raise ValueError(f"{fw}: precision={p.precision!r} is not mapped to {fw} (bf16, fp16 "
                         "and fp8 are); give a quantized checkpoint and its flags by hand")


def _token_budget(fw: str, p: ServePlan) -> tuple[int, bool]:
    """One token budget per iteration (vLLM ``max_num_batched_tokens``, TensorRT-LLM
    ``max_num_tokens``), which is also the prefill chunk when chunking is on: the chunk
    when chunked prefill is on, else ``max_tokens``; given both and different, an error."""
    if p.chunk > 0 and p.max_tokens_given and p.chunk_given and p.max_tokens != p.chunk:
        raise ValueError(f"{fw}: max_tokens={p.max_tokens} and chunk={p.chunk} cannot both "
                         "be expressed: the engine has one token budget per iteration, which "
                         "is also its prefill chunk")
    if p.chunk > 0 and not p.max_tokens_given:
        return p.chunk, True
    return p.max_tokens, p.chunk > 0


def _moe_layout(fw: str, p: ServePlan) -> str:
    """How the serving plan's experts map onto the engine (the model's placement,
    :func:`jaxmodel.workload.params.expert_tp`): ``"none"`` (dense, or ep = 1: experts
    tensor-parallel like the rest), ``"ep_tp"`` (dp = 1, ep | tp: experts over the TP
    group, ``etp = tp/ep``), ``"dp_attention"`` (dp > 1, dp | ep | dp·tp: attention data-
    parallel over dp replicas of tp, the experts over ep of the dp·tp devices with
    ``etp = dp·tp/ep``, SGLang ``--enable-dp-attention`` / TensorRT-LLM
    ``enable_attention_dp``). ``1 < ep < dp`` (experts replicated across replicas) has no
    engine layout (error)."""
    if not p.moe or p.ep == 1:
        return "none"
    if p.dp == 1:
        return "ep_tp"
    if p.ep % p.dp:
        raise ValueError(f"{fw}: ep={p.ep} with dp={p.dp} cannot be expressed: the engines' "
                         "expert parallelism spans the attention-data-parallel ranks (ep a "
                         "multiple of dp dividing dp·tp)")
    return "dp_attention"


def vllm_args(p: ServePlan) -> LaunchConfig:
    """``vllm serve MODEL ...`` (vLLM 0.11.x, ``vllm/engine/arg_utils.py`` at commit
    99d7eb5d, :data:`SOURCES`).

    Mapping (Kwon et al., "Efficient Memory Management for Large Language Model Serving with
    PagedAttention", SOSP 2023, for the block pool): tp, pp → ``--tensor-parallel-size``,
    ``--pipeline-parallel-size``; dp > 1 → ``--data-parallel-size`` (replicas in one
    server); MoE: vLLM's ``--enable-expert-parallel`` gives the experts EP = tp·dp (its
    ``FusedMoEParallelConfig``), so the plan's ep must be 1 or tp·dp (else an error);
    ``max_batch`` → ``--max-num-seqs``; the token budget (:func:`_token_budget`) →
    ``--max-num-batched-tokens``, with ``--enable-chunked-prefill`` when chunking; KV block
    and pool → ``--block-size``, ``--gpu-memory-utilization``; precision bf16 / fp16 →
    ``--dtype bfloat16`` / ``float16``, fp8 → ``--quantization fp8`` (FP8 weights and
    GEMMs, quantized at load) with the FP8 KV cache ``--kv-cache-dtype fp8`` when the
    precision stores KV in one byte.
    """
    fw = "vllm"
    _serve_precision(fw, p)
    e, notes = _Emitter(fw), []
    e("--tensor-parallel-size", p.tp)
    e("--pipeline-parallel-size", p.pp)
    if p.dp > 1:
        e("--data-parallel-size", p.dp)
    if p.moe and p.ep > 1:
        if p.ep != p.dp * p.tp:
            raise ValueError(f"vllm: ep={p.ep} cannot be expressed: --enable-expert-parallel "
                             f"places the experts over tp·dp = {p.dp * p.tp} devices")
        e("--enable-expert-parallel")
    budget, chunked = _token_budget(fw, p)
    e("--max-num-seqs", p.max_batch)
    e("--max-num-batched-tokens", budget)
    if chunked:
        e("--enable-chunked-prefill")
    e("--block-size", p.block_tokens)
    e("--gpu-memory-utilization", p.mem_fraction)
    e("--dtype", "float16" if p.precision == "fp16" else "bfloat16")
    if p.precision == "fp8":
        e("--quantization", "fp8")
    if p.kv_fp8:
        e("--kv-cache-dtype", "fp8")
    argv = ["vllm", "serve", p.model.name] + e.argv()
    notes.append("MODEL is the jaxmodel model name: replace it with the checkpoint's path or "
                 "Hugging Face id")
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(dict(e.flags)),
                        MappingProxyType({}), tuple(notes))


def sglang_args(p: ServePlan) -> LaunchConfig:
    """``python -m sglang.launch_server ...`` (SGLang server arguments, ``docs/
    advanced_features/server_arguments.md`` at commit b36e8e19, generated from
    ``python/sglang/srt/server_args.py``; :data:`SOURCES`).

    Mapping (Zheng et al., "SGLang: Efficient Execution of Structured Language Model
    Programs", NeurIPS 2024): dense or ep = 1 → ``--tp-size tp --pp-size pp --dp-size dp``
    (dp replicas); MoE with ep > 1 (:func:`_moe_layout`): dp = 1 → ``--tp-size tp --ep-size
    ep``; dp > 1 → DP attention ``--tp-size dp·tp --dp-size dp --enable-dp-attention
    --ep-size ep`` (attention over dp groups of tp, experts over ep with the rest as expert
    TP); ``--max-running-requests`` = max_batch, ``--chunked-prefill-size`` = the chunk
    (-1 = off), ``--max-prefill-tokens`` = max_tokens, ``--page-size`` = KV block,
    ``--mem-fraction-static`` = the pool share (weights + KV); bf16 / fp16 → ``--dtype``;
    fp8 → ``--quantization fp8``; the FP8 KV cache → ``--kv-cache-dtype fp8_e4m3``.
    """
    fw = "sglang"
    _serve_precision(fw, p)
    layout = _moe_layout(fw, p)
    e, notes = _Emitter(fw), []
    e("--model-path", p.model.name)
    if layout == "dp_attention":
        e("--tp-size", p.dp * p.tp)
        e("--pp-size", p.pp)
        e("--dp-size", p.dp)
        e("--enable-dp-attention")
        e("--ep-size", p.ep)
    else:
        e("--tp-size", p.tp)
        e("--pp-size", p.pp)
        if p.dp > 1:
            e("--dp-size", p.dp)
        if layout == "ep_tp":
            e("--ep-size", p.ep)
    e("--max-running-requests", p.max_batch)
    e("--chunked-prefill-size", p.chunk if p.chunk > 0 else -1)
    e("--max-prefill-tokens", p.max_tokens)
    e("--page-size", p.block_tokens)
    e("--mem-fraction-static", p.mem_fraction)
    e("--dtype", "float16" if p.precision == "fp16" else "bfloat16")
    if p.precision == "fp8":
        e("--quantization", "fp8")
    if p.kv_fp8:
        e("--kv-cache-dtype", "fp8_e4m3")
    notes.append("--model-path is the jaxmodel model name: replace it with the checkpoint's "
                 "path or Hugging Face id")
    argv = ["python", "-m", "sglang.launch_server"] + e.argv()
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(dict(e.flags)),
                        MappingProxyType({}), tuple(notes))


def _yaml(keys: Mapping[str, Any]) -> str:
    """A YAML mapping from dotted keys (one level of nesting, scalars only)."""
    out: dict[str, Any] = {}
    for k, v in keys.items():
        head, _, leaf = k.partition(".")
        if leaf:
            out.setdefault(head, {})[leaf] = v
        else:
            out[head] = v

    def scalar(v):
        return "true" if v is True else "false" if v is False else str(v)
    lines = []
    for k, v in out.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {scalar(vv)}" for kk, vv in v.items()]
        else:
            lines.append(f"{k}: {scalar(v)}")
    return "\n".join(lines) + "\n"


def trtllm_args(p: ServePlan) -> LaunchConfig:
    """``trtllm-serve MODEL --backend pytorch ...`` with an ``--extra_llm_api_options``
    YAML (TensorRT-LLM at commit 4c05a748: CLI options of ``tensorrt_llm/commands/
    serve.py``, YAML keys of ``tensorrt_llm/llmapi/llm_args.py`` ``BaseLlmArgs`` /
    ``KvCacheConfig``; :data:`SOURCES`).

    Mapping: tp, pp → ``--tp_size``, ``--pp_size`` (one replica; dp > 1 replicas of a dense
    model or of ep = 1 run as dp servers behind a load balancer, noted); MoE with ep > 1
    (:func:`_moe_layout`): dp = 1 → ``--ep_size ep``; dp > 1 → ``--tp_size dp·tp --ep_size
    ep`` with ``enable_attention_dp: true``; ``--max_batch_size`` = max_batch,
    ``--max_num_tokens`` = the token budget (:func:`_token_budget`), ``--enable_chunked_
    prefill`` when chunking; ``--kv_cache_free_gpu_memory_fraction`` = the pool share of the
    memory left after weights; ``kv_cache_config.tokens_per_block`` = KV block;
    ``kv_cache_config.dtype: fp8`` for the FP8 KV cache; bf16 / fp16 → ``dtype``. The
    PyTorch backend takes FP8 weights from the checkpoint's quantization config (an FP8
    checkpoint, noted), not from a flag.
    """
    fw = "trtllm"
    _serve_precision(fw, p)
    layout = _moe_layout(fw, p)
    e, y, notes = _Emitter(fw), _Emitter(fw), []
    e("--backend", "pytorch")
    tp = p.dp * p.tp if layout == "dp_attention" else p.tp
    e("--tp_size", tp)
    e("--pp_size", p.pp)
    if layout != "none":
        e("--ep_size", p.ep)
    budget, chunked = _token_budget(fw, p)
    e("--max_batch_size", p.max_batch)
    e("--max_num_tokens", budget)
    e("--kv_cache_free_gpu_memory_fraction", p.mem_fraction)
    if chunked:
        e("--enable_chunked_prefill")
    e("--extra_llm_api_options", "extra_llm_api_options.yaml")
    y("dtype", "float16" if p.precision == "fp16" else "bfloat16")
    if layout == "dp_attention":
        y("enable_attention_dp", True)
    y("kv_cache_config.tokens_per_block", p.block_tokens)
    if p.kv_fp8:
        y("kv_cache_config.dtype", "fp8")
    if p.dp > 1 and layout != "dp_attention":
        notes.append(f"dp={p.dp}: run {p.dp} such servers (one per replica) behind a load "
                     "balancer")
    if p.precision == "fp8":
        notes.append("precision fp8: MODEL must be an FP8 checkpoint (TensorRT Model "
                     "Optimizer); the PyTorch backend reads its quantization config")
    notes.append("MODEL is the jaxmodel model name: replace it with the checkpoint's path or "
                 "Hugging Face id")
    argv = ["trtllm-serve", p.model.name] + e.argv()
    flags = {**e.flags, **{f"yaml:{k}": v for k, v in y.flags.items()}}
    return LaunchConfig(fw, SOURCES[fw].version, tuple(argv), MappingProxyType(flags),
                        MappingProxyType({"extra_llm_api_options.yaml": _yaml(y.flags)}),
                        tuple(notes))
