"""LLM inference latency and throughput: prefill (time to first token) and decode (per token).

Source: LLMCompass §II-B, §III-C and §V (prefill computes the KV cache, decoding
generates one token per step against it; inference latency = prefill + decoding); Guo et al. §III
(Optimus inference with TP/PP, KV caching, GQA); Pope et al. 2023 (KV cache).

Model: ``dp`` replicas serve ``batch/dp`` sequences each; within a replica ``pp`` stages of
``n_layers/pp`` layers run one after another (by default one micro-batch, i.e. latency-optimal
pipelining; see ``micro_batches`` below; a hop between stages is a point-to-point transfer of the hidden states, placed as
in training by :mod:`jaxmodel.parallel.plan`: across the outermost tier the ``tp·pp`` devices
of one pipeline span) and each layer is the LLMCompass layer of
:func:`jaxmodel.workload.layer.layer_breakdown` under ``tp``.

Feasibility: the ``"infer"`` rules of :mod:`jaxmodel.parallel.plan` (structure, device,
network, finite times), then memory. Every result is finite with ``feasible=True`` or
``+inf`` with ``feasible=False`` and the reason of the first failing rule.

- ``ttft_s``: embedding of the prompt + all layers in prefill + ``pp − 1`` hops + LM head on the
  last position (``[b, d]×[d, V/t]``), an all-gather of the logits and a softmax over them
  (the embedding and head of :mod:`jaxmodel.workload.embedding`, shared with training: the
  head GEMM runs at the precision's higher-precision dtype, ``attn_dtype``).
- ``tpot_s``: one decode step (one new token per sequence) averaged over the KV growth: the
  mean of ``KV_SAMPLES`` steps at KV lengths evenly spaced (midpoints) over the decode phase
  (``prompt_len … prompt_len + gen_len − 2`` cached tokens; the latency is close to affine in
  the KV length, so the midpoint rule is near exact).
- ``runtime`` (:mod:`jaxmodel.serving_runtime`): the serving runtime's kernel overheads,
  fusions, CUDA-graph decode and fused attention apply to every layer, the embedding and the
  head (decode steps under ``cuda_graph`` at the kernel floors); its ``step_overhead_s`` is
  added once to ``ttft_s`` (the prefill step) and once to ``tpot_s`` (each decode step), its
  ``context_layer_overhead_s`` once to ``ttft_s`` for each of the ``n_layers/pp`` layers a
  rank holds (host set-up of the request's context step; the ranks set up in parallel).
- ``micro_batches`` ``m`` (pipelined inference, LLMCompass §II-B: pipeline parallelism
  raises throughput at the cost of latency; the micro-batch schedule of GPipe, Huang et al.
  2019, applied to generation as in DeepSpeed-Inference, Aminabadi et al. SC'22 §IV-B): the
  ``b`` sequences of a replica run as ``m`` micro-batches of ``b/m``; every time above is then
  taken at ``b/m`` sequences. With ``F`` the latency of one micro-batch through the whole
  pipeline (the formulas above) and ``S`` its slot on the busiest stage (``n_layers/pp``
  layers plus the embedding and the send on the first stage, or the LM head on the last):
  ``ttft_s = F_prefill + (m − 1)·S_prefill`` (the last micro-batch's first token) and
  ``tpot_s = max(F_decode, m·S_decode)`` (a micro-batch's next step needs its previous
  token, so a round of ``m`` micro-batches lasts at least one pass through the pipeline, and
  the busiest stage serves all ``m`` in turn). Each device keeps every micro-batch's KV cache
  of its layers; the prefill working set is one micro-batch's. ``m = 1`` is the formula above.
- ``total_s = ttft_s + (gen_len − 1)·tpot_s`` (the first token comes from the prefill);
  ``tokens_per_s = batch·gen_len / total_s``.
- ``memory_bytes``: weights (split over tp, pp), KV cache of ``prompt_len + gen_len`` tokens and
  the prefill working set (:func:`jaxmodel.workload.memory.inference_memory`); the rule
  ``out_of_memory`` compares it with the device's
  :func:`~jaxmodel.workload.memory.usable_memory` (capacity less ``runtime_reserved_bytes``).

Units: seconds, bytes, tokens/s.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import comm as _comm
from jaxmodel import serving_runtime as _rtp
from jaxmodel import speculative as _spec
from jaxmodel.batching import batch_shape, batched
from jaxmodel import numerics as nx
from jaxmodel.numerics import INF, first_reason, reason_name
from jaxmodel.parallel import plan as _plan
from jaxmodel.parallel.inference_options import (  # noqa: F401  (KV_SAMPLES: kept here)
    KV_SAMPLES, InferenceOptions, InferenceStatics)
from jaxmodel.types import (Model, Parallelism, System, is_concrete, validate_args,
                            validate_knobs)
from jaxmodel.workload.embedding import serving_embedding, serving_head
from jaxmodel.workload.layer import (LAYER_OPS, LayerOptions, Variant, Work, default_gemm,
                                     layer_times, runtime_inputs, variant_of)
from jaxmodel.workload.memory import (inference_memory_single, kv_cache_bytes_single,
                                      usable_memory)
from jaxmodel.workload.params import params_per_device
from jaxmodel.workload.moe import MOE_OPS
from jaxmodel import precisions as _prec

@dataclasses.dataclass(frozen=True)
class InferenceResult:
    """Result of :func:`inference` (a pytree; every field may carry batch axes).

    Attributes:
        ttft_s: time to first token, s.
        tpot_s: time per output token (one decode step), s.
        total_s: end-to-end latency of the request batch, s.
        tokens_per_s: generated tokens per second over all replicas.
        memory_bytes: memory per device, bytes.
        feasible: False for inconsistent plans or out of memory (times are then ``+inf``).
        reason: reason code (``jaxmodel.numerics.REASONS``; 0 when feasible).
        breakdown: dict of components (s or bytes), e.g. ``"prefill.qkv"`` (one layer),
            ``"prefill_layers"`` (all layers), ``"decode_layers"``, ``"pp_comm_prefill"``,
            ``"head_prefill"``, ``"memory.kv_cache"``.
    """

    ttft_s: jax.Array
    tpot_s: jax.Array
    total_s: jax.Array
    tokens_per_s: jax.Array
    memory_bytes: jax.Array
    feasible: jax.Array
    reason: jax.Array
    breakdown: dict

    @property
    def reason_name(self) -> str:
        """Name of the reason code of a single (unbatched) result."""
        return reason_name(self.reason)


jax.tree_util.register_dataclass(
    InferenceResult,
    data_fields=[f.name for f in dataclasses.fields(InferenceResult)], meta_fields=[])


def _pp_hop(system: System, par: Parallelism, nbytes, net=_comm.ANY_NET):
    """Point-to-point transfer of ``nbytes`` across a stage boundary, s.

    The pair sits where the plan module places it (:func:`jaxmodel.parallel.plan.placement`,
    Megatron order): across the outermost tier the ``tp·pp`` devices of one pipeline span,
    so a pipeline longer than a node pays the inter-node link.
    """
    multi = par.pp > 1.5
    hop = _plan.placement(system, par).stage_hop
    t = _comm.collective_latency.single(system, "p2p", nbytes, hop.size, stride=hop.stride,
                                        net=net)
    return jnp.where(multi, t, 0.0)


def _stage_slot(layers_s, hop_s, emb_s, head_s, pp):
    """Time one micro-batch occupies the busiest pipeline stage, s: its ``n_layers/pp``
    layers, plus the embedding and the send to the next stage on the first stage or the LM
    head on the last (one stage holds both when ``pp = 1``)."""
    return layers_s + jnp.where(pp > 1.5, jnp.maximum(emb_s + hop_s, head_s), emb_s + head_s)


def _plan_inputs(system, model, par, batch, prompt_len, gen_len, dtype_bytes):
    return _plan.inputs(model, par, n_devices=system.n_devices, batch=batch,
                        seq_len=prompt_len, gen_len=gen_len, dtype_bytes=dtype_bytes)


_COMM_OPS = ("allreduce_mha", "allreduce_ffn", "moe_alltoall")


class _Ctx(NamedTuple):
    """What the pieces of one inference configuration share (single configuration; built by
    :func:`inference_single`)."""

    system: System
    model: Model
    par: Parallelism
    prec: Any            # the resolved Precision
    rt: Any              # the serving Runtime, or None (eager, as LLMCompass)
    variant: Variant
    gemm: Any            # the GEMM function, or None (the tile search)
    mb: Any              # sequences per micro-batch
    b: Any               # sequences per replica
    prompt: Any          # prompt tokens per sequence (>= 1)
    gen: Any             # generated tokens per sequence (>= 1)
    dtype_s: Any         # bytes per activation word

    def at(self, decode):
        """The system with the runtime's kernel overheads of that phase."""
        if self.rt is None:
            return self.system
        return dataclasses.replace(self.system, device=runtime_inputs(
            self.system.device, self.par, self.variant, self.rt, decode)[0])


def _draft_costs(c: _Ctx, k, spec, one_tok, pre, head_ends):
    """``(prefill_s, step_s, memory)`` of the proposer of speculative decoding
    (:mod:`jaxmodel.speculative`) for ``c.mb`` sequences per micro-batch, ``c.b`` per replica;
    ``head_ends``: the embedding lookup, its all-reduce, the LM head and its all-gather of
    one draft token (``e["draft"]`` of :func:`_ends`, timed there beside the target's).

    - MTP / EAGLE head (DeepSeek-V3 §2.2; Li et al. 2024 §4.1): a draft token is the
      projection ``[mb, 2d]×[2d, d/t]``, one decoder layer of the model's kind at one new
      token against the mean context (``one_tok``), the embedding lookup and the shared LM
      head; ``k`` of them per step. The prompt passes the projection and the layer once
      (filling the head's KV cache). Memory: one module's weights
      (:func:`jaxmodel.workload.params.mtp_params` split as the model's layers) and one
      layer's KV cache.
    - draft model (Leviathan et al. 2023 §3): ``k`` decode steps of the draft model (all its
      layers at one token, embedding, LM head) on the same TP group, and its prefill of the
      prompt; its weights and KV cache. The draft runs under the target's ``par`` (its plan
      is not checked separately).

    Seconds and bytes per device.
    """
    model, par, prec, mb, prompt, dtype_s = c.model, c.par, c.prec, c.mb, c.prompt, c.dtype_s
    gemm_f = c.gemm or default_gemm
    d = model.d_model
    tp = jnp.maximum(par.tp, 1.0)
    dec_sys = c.at(True)
    lookup, ar, head_c, head_g = head_ends
    # the projection of a draft token and of the prompt: one (vmapped) GEMM call
    proj1, projp = jax.vmap(lambda m: gemm_f(c.system.device, m, d / tp, 2.0 * d, 1.0,
                                             dtype_s))(jnp.stack([mb, mb * prompt]))
    head_step = one_tok["total"] + proj1 + lookup + ar + head_c + head_g
    head_pre = pre["total"] + projp
    ctx = prompt + c.gen + k
    w_word = _prec.serving_weight_bytes(prec)
    one = dataclasses.replace(model, n_mtp_layers=1.0)
    head_w = w_word * (params_per_device.single(one, par, True)
                       - params_per_device.single(model, par, False))
    head_kv = kv_cache_bytes_single(model, par, c.b, ctx, prec.kv_bytes) / jnp.maximum(
        model.n_layers, 1.0)
    is_head = spec.method > 1.5
    pre_s = jnp.where(is_head, head_pre, 0.0)
    step_s = jnp.where(is_head, k * head_step, 0.0)
    mem_w = jnp.where(is_head, head_w, 0.0)
    mem_kv = jnp.where(is_head, head_kv, 0.0)
    if spec.draft is not None:
        dm = spec.draft
        is_dm = jnp.abs(spec.method - 1.0) < 0.5
        f = jnp.result_type(float)
        st = jax.vmap(lambda s, kv: layer_times(c.system, dm, par, Work(mb, s, "decode", kv),
                                                LayerOptions(c.gemm, prec, runtime=c.rt)))(
            jnp.stack([prompt, jnp.ones_like(prompt)]),
            jnp.stack([jnp.zeros_like(prompt), prompt + 0.5 * c.gen]).astype(f))
        lk_p, ar_p = serving_embedding(c.at(False), dm, par, mb * prompt, dtype_s)
        lk_d, ar_d = serving_embedding(dec_sys, dm, par, mb, dtype_s)
        hc_p, hg_p = serving_head(c.at(False), dm, par, mb, c.gemm, prec)
        hc_d, hg_d = serving_head(dec_sys, dm, par, mb, c.gemm, prec)
        dm_pre = dm.n_layers * st["total"][0] + lk_p + ar_p + hc_p + hg_p
        dm_step = dm.n_layers * st["total"][1] + lk_d + ar_d + hc_d + hg_d
        dm_w = w_word * params_per_device.single(dm, par, False)
        dm_kv = kv_cache_bytes_single(dm, par, c.b, ctx, prec.kv_bytes)
        pre_s = jnp.where(is_dm, dm_pre, pre_s)
        step_s = jnp.where(is_dm, k * dm_step, step_s)
        mem_w = jnp.where(is_dm, dm_w, mem_w)
        mem_kv = jnp.where(is_dm, dm_kv, mem_kv)
    return pre_s, step_s, {"weights": mem_w, "kv_cache": mem_kv}


def _layer_steps(c: _Ctx, kv_samples: int, spec):
    """One decoder layer at every lane, ``(steps, k_d, per_step)``: the prefill (``s_kv =
    s``: the decode formula with no cache), ``kv_samples`` decode steps at KV lengths evenly
    spaced (midpoints) over the decode phase, each verifying ``1 + k_d`` tokens under
    speculative decoding, and then one single-token lane of a draft head's layer; one traced
    layer vmapped over (new tokens, cached tokens)."""
    prompt = c.prompt
    span = jnp.maximum(c.gen - 2.0, 0.0)
    kvs = [prompt + span * (i + 0.5) / kv_samples for i in range(kv_samples)]
    # speculative decoding: each decode step verifies 1 + k tokens per sequence, and one
    # more lane times a single-token step of a draft head's layer (MTP / EAGLE)
    k_d = 0.0 if spec is None else _spec.draft_len(spec)
    per_step = 1.0 + k_d
    lanes_new = [prompt] + [per_step * jnp.ones_like(prompt)] * kv_samples
    lanes_kv = [jnp.zeros_like(prompt)] + kvs
    if spec is not None:
        lanes_new.append(jnp.ones_like(prompt))
        lanes_kv.append(prompt + 0.5 * span)
    steps = jax.vmap(lambda s, kv: layer_times(
        c.system, c.model, c.par, Work(c.mb, s, "decode", kv),
        LayerOptions(c.gemm, c.prec, c.variant, c.rt)))(jnp.stack(lanes_new), jnp.stack(lanes_kv))
    return steps, k_d, per_step


def _ends(c: _Ctx, per_step, spec):
    """The embedding, the ``pp − 1`` stage hops and the LM head of the prompt and of one
    decode step (index 0 / 1 of ``lookup``, ``emb_ar``, ``hop1``), with the runtime's step
    and per-layer set-up overheads, s. Under speculative decoding a third lane times the
    embedding and the LM head of one draft token per sequence (``mb`` rows at the decode
    step's kernel overheads; ``e["draft"]`` = lookup, all-reduce, head, all-gather, for
    :func:`_draft_costs`): the lanes of one traced call (one copy of each collective and of
    the head GEMM's tile search in the graph), the same numbers as separate calls."""
    model, par, mb = c.model, c.par, c.mb
    draft = spec is not None
    tokens = jnp.stack([mb * c.prompt, mb * per_step] + [mb] * draft)
    is_decode = jnp.asarray([False, True] + [True] * draft)
    lookup, emb_ar = jax.vmap(lambda n, d: serving_embedding(c.at(d), model, par, n, c.dtype_s,
                                                             c.variant))(tokens, is_decode)
    hop1 = jax.vmap(lambda n: _pp_hop(c.system, par, n * model.d_model * c.dtype_s,
                                      c.variant.net))(tokens[:2])
    hops = (jnp.maximum(par.pp, 1.0) - 1.0) * hop1
    emb = lookup + emb_ar
    e = {"lookup": lookup[:2], "emb_ar": emb_ar[:2], "hop1": hop1, "emb_pre": emb[0],
         "emb_dec": emb[1], "hop_pre": hops[0], "hop_dec": hops[1], "step": 0.0, "setup": 0.0}
    rows = jnp.stack([mb, mb * per_step] + [mb] * draft)
    if c.rt is None and spec is None:
        head_c, head_g = serving_head(c.system, model, par, mb, c.gemm, c.prec, c.variant)
        e["head_pre"] = e["head_dec"] = head_c + head_g
    elif c.rt is None:
        head_c, head_g = jax.vmap(lambda n: serving_head(c.system, model, par, n, c.gemm,
                                                         c.prec, c.variant))(rows)
        e["head_pre"], e["head_dec"] = head_c[0] + head_g[0], head_c[1] + head_g[1]
    else:
        head_c, head_g = jax.vmap(lambda n, d: serving_head(c.at(d), model, par, n, c.gemm,
                                                            c.prec, c.variant))(
            rows, is_decode)
        e["head_pre"], e["head_dec"] = head_c[0] + head_g[0], head_c[1] + head_g[1]
        e["step"] = c.rt.step_overhead_s
        e["setup"] = c.rt.context_layer_overhead_s * model.n_layers / jnp.maximum(par.pp, 1.0)
    if draft:
        e["draft"] = (lookup[2], emb_ar[2], head_c[2], head_g[2])
        head_c, head_g = head_c[:2], head_g[:2]
    e["head_c"], e["head_g"] = head_c, head_g
    return e


def _memory(c: _Ctx, k_d, many, draft_mem):
    """Memory per device (:func:`jaxmodel.workload.memory.inference_memory`): the runtime's
    attention kernel decides whether the prefill keeps the score matrix; speculation adds the
    ``k`` draft positions of a step to the target's cache and the proposer's weights and
    cache; every micro-batch's KV cache stays resident, the prefill working set is one
    micro-batch's; a runtime that loads the model's modality encoder on every device adds
    ``encoder_params · Runtime.encoder_bytes`` to the weights. Bytes."""
    par_mem = c.par if c.rt is None else runtime_inputs(c.system.device, c.par, c.variant,
                                                        c.rt, False)[1]
    mem = inference_memory_single(c.model, par_mem, c.b, c.prompt, c.gen + k_d,
                                  precision=c.prec)
    if c.rt is not None:
        mem = {**mem, "weights": mem["weights"] + c.model.encoder_params * c.rt.encoder_bytes}
    if draft_mem is not None:
        mem = {**mem, "weights": mem["weights"] + draft_mem["weights"],
               "kv_cache": mem["kv_cache"] + draft_mem["kv_cache"]}
    acts = jnp.where(many, mem["activations"] * (c.mb / c.b), mem["activations"])
    return {**mem, "activations": acts, "total": mem["weights"] + mem["kv_cache"] + acts}


def _rules(c: _Ctx, checks, pre, dec, e, mem, memory_rule: bool):
    """``(feasible, reason)``: the plan's ``"infer"`` rules (structure, device, network,
    precision, finite times), then memory unless ``memory_rule`` is False."""
    structure_ok, _ = first_reason(checks)
    compute = ([x[k] for x in (pre, dec) for k in LAYER_OPS + MOE_OPS if k not in _COMM_OPS]
               + [e["lookup"][0], e["lookup"][1], jnp.sum(e["head_c"])])
    rules = (checks + _plan.system_checks(_plan.INFER, c.system, c.par, structure_ok,
                                          word=_prec.widest_gemm_word(c.prec, kv_cache=True),
                                          compute=compute)
             + [(_prec.supported(c.system.device, c.prec), "precision_unsupported")]
             + _plan.finite_checks(
                 compute,
                 [x[k] for x in (pre, dec) for k in _COMM_OPS]
                 + [e["emb_ar"][0], e["emb_ar"][1], jnp.sum(e["head_g"]), e["hop_pre"],
                    e["hop_dec"]]))
    if memory_rule:
        dev = c.system.device
        rules = rules + [(mem["total"] <= usable_memory(dev.mem_capacity,
                                                        dev.runtime_reserved_bytes),
                          "out_of_memory")]
    return first_reason(rules)


def make_inference_step(system: System, model: Model, par: Parallelism, *, precision=None,
                        runtime=None, speculative=None,
                        statics: InferenceStatics = InferenceStatics()
                        ) -> Callable[[InferenceOptions], InferenceResult]:
    """The inference of one configuration as a pure function of its batched knobs.

    Fixes ``system``, ``model``, the plan ``par``, the precision, the serving runtime, the
    speculative proposer and the static graph switches once and returns
    ``step(options) -> InferenceResult`` for an
    :class:`~jaxmodel.parallel.inference_options.InferenceOptions` (batch, prompt and
    generated tokens, micro-batches; module docstring). Every leaf is traceable: ``jax.jit``,
    ``jax.grad`` and ``jax.vmap`` apply to ``step`` and to the factory's arguments alike (the
    factory may be called inside a traced function); :func:`inference` batches exactly this
    function.

    Args:
        system, model, par: one configuration (scalar leaves).
        precision: preset name or :class:`jaxmodel.Precision` (default ``"bf16"``).
        runtime: serving runtime, a preset name or a :class:`jaxmodel.Runtime`; None = eager,
            as LLMCompass (:func:`inference`).
        speculative: None or a :class:`jaxmodel.Speculative` (:func:`inference`).
        statics: :class:`~jaxmodel.parallel.inference_options.InferenceStatics` (GEMM hook,
            op-graph variant, KV samples, the memory rule; default every branch).

    Example:
        >>> step = jm.make_inference_step(hw_db.system("hgx_a100_4gpu"),
        ...                               hw_db.model("llama2-13b"), jm.Parallelism(tp=4))
        >>> r = jax.jit(step)(jm.InferenceOptions(batch=8, prompt_len=2048, gen_len=256))
        >>> float(r.ttft_s), float(r.tpot_s), bool(r.feasible)
        (0.642, 0.0173, True)
    """
    prec = _prec.precision(precision)
    rt = _rtp.runtime_arg(runtime)
    spec = _spec.speculative_arg(speculative)

    def step(options: InferenceOptions) -> InferenceResult:
        return _step(system, model, par, options, prec, rt, spec, statics)

    return step


def _step(system, model, par, options: InferenceOptions, prec, runtime, speculative,
          statics: InferenceStatics) -> InferenceResult:
    """:func:`make_inference_step`'s step on one configuration (module docstring);
    ``runtime`` and ``speculative`` as the factory resolved them."""
    batch, prompt_len, gen_len = options.batch, options.prompt_len, options.gen_len
    micro_batches, gemm, variant = options.micro_batches, statics.gemm, statics.variant
    kv_samples, memory_rule = statics.kv_samples, statics.memory_rule
    f = jnp.result_type(float)
    batch, prompt_len, gen_len, dtype_bytes = (jnp.asarray(x, dtype=f) for x in (
        batch, prompt_len, gen_len, prec.act_bytes))
    checks = _plan.structure_checks(_plan.INFER, _plan_inputs(
        system, model, par, batch, prompt_len, gen_len, dtype_bytes))
    b = jnp.maximum(batch / jnp.maximum(par.dp, 1.0), 1.0)    # sequences per replica
    n_mb = jnp.clip(jnp.asarray(micro_batches, dtype=f), 1.0, b)
    many = n_mb > 1.5
    gen = jnp.maximum(gen_len, 1.0)
    c = _Ctx(system, model, par, prec, _rtp.runtime_arg(runtime), variant, gemm, b / n_mb, b,
             jnp.maximum(prompt_len, 1.0), gen, jnp.where(dtype_bytes > 0, dtype_bytes, 2.0))
    n_layers = model.n_layers
    pp = jnp.maximum(par.pp, 1.0)
    spec = speculative
    steps, k_d, per_step = _layer_steps(c, kv_samples, spec)
    steps = nx.materialized(steps)
    pre = {k: v[0] for k, v in steps.items()}
    dec = {k: jnp.mean(v[1:1 + kv_samples]) for k, v in steps.items()}
    e = _ends(c, per_step, spec)

    # one micro-batch through the whole pipeline, and the busiest stage's slot per micro-batch
    first_pre = n_layers * pre["total"] + e["hop_pre"] + e["emb_pre"] + e["head_pre"]
    first_dec = n_layers * dec["total"] + e["hop_dec"] + e["emb_dec"] + e["head_dec"]
    slot_pre = jnp.where(many, _stage_slot(n_layers * pre["total"] / pp, e["hop1"][0],
                                           e["emb_pre"], e["head_pre"], pp), 0.0)  # 0·inf
    slot_dec = jnp.where(many, _stage_slot(n_layers * dec["total"] / pp, e["hop1"][1],
                                           e["emb_dec"], e["head_dec"], pp), 0.0)
    draft_mem = None
    if spec is not None:
        draft_pre, draft_dec, draft_mem = _draft_costs(
            c, k_d, spec, {k: v[-1] for k, v in steps.items()}, pre, e["draft"])
        first_pre, slot_pre = first_pre + draft_pre, slot_pre + draft_pre
        first_dec, slot_dec = first_dec + draft_dec, slot_dec + draft_dec
    ttft = jnp.where(many, first_pre + (n_mb - 1.0) * slot_pre, first_pre) + e["step"] \
        + e["setup"]
    tpot = jnp.where(many, jnp.maximum(first_dec, n_mb * slot_dec), first_dec) + e["step"]
    if spec is not None:
        # one iteration (k drafts + a verification over 1 + k tokens) emits E tokens
        spec_step = tpot
        spec_tokens = _spec.tokens_per_step(spec)
        tpot = spec_step / spec_tokens
    total = ttft + (gen - 1.0) * tpot

    mem = _memory(c, k_d, many, draft_mem)
    feasible, reason = _rules(c, checks, pre, dec, e, mem, memory_rule)

    def gate(x):
        return jnp.where(feasible, x, INF)

    rows = LAYER_OPS + MOE_OPS + (("quantize",) if "quantize" in pre else ())
    breakdown = {f"prefill.{k}": pre[k] for k in rows}
    breakdown.update({f"decode.{k}": dec[k] for k in rows})
    breakdown.update({
        "prefill_layers": n_layers * pre["total"], "decode_layers": n_layers * dec["total"],
        "pp_comm_prefill": e["hop_pre"], "pp_comm_decode": e["hop_dec"],
        "embedding_prefill": e["emb_pre"], "embedding_decode": e["emb_dec"],
        "head_prefill": e["head_pre"], "head_decode": e["head_dec"],
        "step_overhead": e["step"] + 0.0 * ttft, "request_setup": e["setup"] + 0.0 * ttft})
    if spec is not None:
        breakdown.update({"spec.step": spec_step, "spec.draft_prefill": draft_pre,
                          "spec.draft_step": draft_dec, "spec.tokens_per_step": spec_tokens})
    breakdown = {k: gate(v) for k, v in breakdown.items()}
    breakdown.update({f"memory.{k}": v for k, v in mem.items()})
    safe_total = jnp.where(feasible & (total > 0), total, 1.0)
    return InferenceResult(
        ttft_s=gate(ttft), tpot_s=gate(tpot), total_s=gate(total),
        tokens_per_s=jnp.where(feasible, batch * gen / safe_total, 0.0),
        memory_bytes=mem["total"], feasible=feasible, reason=reason, breakdown=breakdown)


def _inference_point(system, model, par, options, precision, runtime, speculative, statics):
    """:func:`make_inference_step`'s step on one configuration (what :func:`inference`
    batches)."""
    return make_inference_step(system, model, par, precision=precision, runtime=runtime,
                               speculative=speculative, statics=statics)(options)


#: The fields of :class:`InferenceStatics` (:func:`inference_single` takes them as keywords).
_STATIC_KEYS = tuple(f.name for f in dataclasses.fields(InferenceStatics))


def inference_single(system: System, model: Model, par: Parallelism, batch, prompt_len,
                     gen_len, gemm=None, **knobs) -> InferenceResult:
    """Single-configuration body of :func:`inference` (use inside other formulas):
    ``make_inference_step(system, model, par, ...)(InferenceOptions(batch, prompt_len,
    gen_len, micro_batches))``.

    ``gemm``: the GEMM function of :func:`inference` (static; None = the tile search).
    ``knobs``: ``micro_batches`` (see :func:`inference`); ``precision`` (and the legacy
    ``dtype_bytes``, :func:`jaxmodel.precisions.resolve`), ``runtime`` (a
    :class:`jaxmodel.Runtime`, a preset name or None: eager, as LLMCompass),
    ``speculative``; and the static ``variant``, ``kv_samples`` and ``memory_rule`` of
    :class:`~jaxmodel.parallel.inference_options.InferenceStatics`.
    ``memory_rule=False`` leaves out the last rule, ``out_of_memory``: the times of a plan
    that does not fit stay finite (co-design objectives penalise the memory smoothly); every
    other rule still applies.

    Raises:
        TypeError: an unknown keyword (named).
    """
    known = (set(_STATIC_KEYS) - {"gemm"}) | {"micro_batches", "precision", "dtype_bytes",
                                             "runtime", "speculative"}
    unknown = sorted(set(knobs) - known)
    if unknown:
        raise TypeError(f"inference_single: unknown keyword(s) {unknown}; known "
                        f"{sorted(known)}")
    statics = InferenceStatics(gemm, **{k: knobs[k] for k in _STATIC_KEYS if k in knobs})
    step = make_inference_step(
        system, model, par, precision=_prec.resolve(knobs.get("precision"),
                                                    knobs.get("dtype_bytes")),
        runtime=knobs.get("runtime"), speculative=knobs.get("speculative"), statics=statics)
    return step(InferenceOptions(batch, prompt_len, gen_len, knobs.get("micro_batches", 1.0)))


def inference(system: System, model: Model, par: Parallelism, batch, prompt_len, gen_len,
              gemm=None, dtype_bytes=None, precision=None, runtime=None,
              micro_batches=1.0, speculative=None) -> InferenceResult:
    """Latency, throughput and memory of serving ``batch`` requests (see module docstring).

    Args:
        system: devices and network; ``par.dp·tp·pp`` must equal ``system.n_devices``.
        model: the transformer.
        par: ``dp`` replicas (each serving ``batch/dp`` sequences), ``tp``, ``pp``, ``sp``.
        batch: sequences served together (global over ``dp``).
        prompt_len: prompt tokens per sequence.
        gen_len: generated tokens per sequence (``>= 1``).
        gemm: optional static GEMM function ``(dev, m, n, k, batch, dtype_bytes) -> s``.
        dtype_bytes: legacy bytes per weight / activation / KV element (sets those fields
            of ``precision``, :func:`jaxmodel.precisions.resolve`).
        precision: preset name (``"bf16"`` default, ``"fp8"``: FP8 weights, GEMMs and KV
            cache, ...) or a :class:`jaxmodel.Precision`; a device without a tensor-core rate
            for its compute dtypes gives ``feasible=False``, reason ``precision_unsupported``.
        runtime: serving runtime, a preset name (``"pytorch"`` default: PyTorch-eager
            per-call overheads, every op its own kernel; ``"trtllm"``: TensorRT-LLM /
            FasterTransformer; ``"vllm"``) or a :class:`jaxmodel.Runtime`
            (:mod:`jaxmodel.serving_runtime`).
        micro_batches: micro-batches each replica's ``batch/dp`` sequences are split into
            (``>= 1``, clipped to the sequences; 1 = the whole batch as one, today's
            latency-optimal pipeline). See the module docstring.
        speculative: None, or a :class:`jaxmodel.Speculative` (draft model, MTP or EAGLE
            heads, ``k`` drafts, acceptance ``α``; :mod:`jaxmodel.speculative`): every decode
            step is ``k`` draft steps plus a verification over ``1 + k`` tokens per
            sequence and emits ``E = (1 − α^{k+1})/(1 − α)`` tokens (Leviathan et al. 2023
            eq. 1), so ``tpot_s`` = step / ``E``; ``ttft_s`` adds the proposer's prefill;
            memory adds the proposer's weights and KV cache and ``k`` positions per
            sequence of the target's cache. ``breakdown["spec.step"]`` is the step,
            ``"spec.tokens_per_step"`` ``E``.

    Returns:
        :class:`InferenceResult`; batch axes of the inputs lead every field.

    Raises:
        ValueError: a single concrete configuration whose plan breaks a rule of
            :mod:`jaxmodel.parallel.plan` (tp not dividing the heads, dp·tp·pp ≠ devices, pp
            not dividing the layers, batch not divisible by dp, a group the network cannot
            place, ...); the message names the reason, fields and values. Out of memory and
            an unusable device are not errors: ``feasible=False`` with the reason.

    Example:
        >>> r = jm.inference(hw_db.system("hgx_a100_4gpu"), hw_db.model("llama2-13b"),
        ...                  jm.Parallelism(tp=4), batch=8, prompt_len=2048, gen_len=256)
        >>> float(r.ttft_s), float(r.tpot_s), bool(r.feasible)
        (0.642, 0.0173, True)
    """
    prec = _prec.resolve(precision, dtype_bytes)
    if is_concrete(system, model, par, batch, prompt_len, gen_len, prec) and batch_shape(
            system, model, par, batch, prompt_len, gen_len, prec) == ():
        validate_args(system, model, par, where="inference")
        with jax.ensure_compile_time_eval():      # concrete even inside an outer jax.jit
            _plan.raise_if_invalid("inference", _plan.INFER, _plan_inputs(
                system, model, par, batch, prompt_len, gen_len, prec.act_bytes), system, par)
    validate_knobs("inference", batch=batch, prompt_len=prompt_len, gen_len=gen_len,
                   dtype_bytes=dtype_bytes)
    if is_concrete(micro_batches) and np.ndim(micro_batches) == 0 and not (
            np.isfinite(micro_batches) and float(micro_batches) >= 1.0):
        raise ValueError(f"inference: micro_batches={micro_batches} must be >= 1")
    rt = _rtp.runtime_arg(runtime)
    if rt is not None and is_concrete(rt):
        _rtp.validate_runtime(rt, where="inference")
    spec = _spec.speculative_arg(speculative)
    if spec is not None and is_concrete(spec):
        _spec.validate_speculative(spec, where="inference")
    return batched(_inference_point)(
        system, model, par, InferenceOptions(batch, prompt_len, gen_len, micro_batches), prec,
        rt, spec, InferenceStatics(gemm, variant_of(model, par, system)))


inference.single = inference_single
