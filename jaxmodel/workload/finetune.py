"""Parameter-efficient fine-tuning: LoRA and QLoRA (frozen base, trainable low-rank adapters).

Sources:
    * Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022, §4.1: a
      frozen weight ``W0 ∈ R^{d×k}`` is adapted as ``h = W0·x + B·A·x`` with ``B ∈ R^{d×r}``,
      ``A ∈ R^{r×k}`` and ``r ≪ min(d, k)``; ``W0`` "does not receive gradient updates" — no
      gradient and no optimizer state for it (§4.2: VRAM of GPT-3 175B training from 1.2 TB
      to 350 GB); the adapters are applied to the attention projections ``W_q, W_k, W_v, W_o``
      (§4.2, §7.1) and, in common practice (QLoRA §4), to every linear layer of the block.
    * Dettmers et al., "QLoRA: Efficient Finetuning of Quantized LLMs", NeurIPS 2023, §3: the
      frozen base is stored in 4-bit NormalFloat with block-wise scales and dequantised to BF16
      for each GEMM (``Y = X·doubleDequant(c1, c2, W^NF4) + X·L1·L2``, eq. 5); gradients flow
      through the frozen weights to the input (``∂E/∂X``) but never form ``∂E/∂W``; adapters and
      their optimizer states in 16/32 bit.

What changes against full training (one device, one micro-batch, per layer):
    * **compute**: the frozen weight GEMMs keep their forward and their activation-gradient
      (dgrad, ``dX = dY·Wᵀ``) GEMMs and drop the weight-gradient (wgrad, ``dW = Xᵀ·dY``) GEMMs
      (:func:`frozen_wgrad_times`, the same tile-searched shapes the layer's backward holds);
      the LM head drops its wgrad and the embedding its gradient scatter-add. The adapters add
      two skinny GEMMs per adapted module forward (``X·A``, ``(X·A)·B``) and their four gradient
      GEMMs backward (:func:`adapter_times`). QLoRA adds a dequantisation kernel per weight
      GEMM and pass (read the stored word, write the 16-bit one), forward, backward and a
      recomputed forward.
    * **memory**: base weights in their storage type (``base_bytes``; FSDP / ZeRO-3 shards
      them over the data-parallel group, ZeRO-1/2 leave them whole), no gradients or optimizer
      states for them; adapters with full training state (weights, gradients, master weights
      and Adam moments of the precision, sharded by ZeRO as usual). Activations are those of
      full training (the adapted GEMMs' inputs are kept for the adapters' weight gradients, the
      nonlinearities' inputs for the backward through the frozen base).
    * **communication**: the data-parallel reduction and the ZeRO-1/2 parameter gather move
      the adapters only; ZeRO-3 still gathers the (frozen) base weights per layer.

Tensor parallelism of an adapter follows its base layer: column-parallel modules (q, k, v,
gate, up) keep ``A`` whole and split ``B``'s outputs over ``t``; row-parallel ones (o, down)
split ``A``'s inputs over ``t`` and keep ``B`` whole (PEFT's Megatron layers); the rank-``r``
partial sums of a row-parallel adapter join the layer's all-reduce (``r ≪ d``: not costed).

Units: parameters (count), bytes, seconds.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from jaxmodel.parallel.pipeline import stage_layers
from jaxmodel.types import Array, Model, Parallelism, _register
from jaxmodel.workload import params as _params
from jaxmodel.workload.ffn import Gemm, _elementwise
from jaxmodel.workload.layer import evaluate
from jaxmodel import precisions as _prec

#: Adaptable modules: the attention projections and the FFN matrices (HF PEFT names
#: ``q_proj k_proj v_proj o_proj gate_proj up_proj down_proj``).
MODULES = ("q", "k", "v", "o", "gate", "up", "down")
_COLUMN = ("q", "k", "v", "gate", "up")     # output split over t; the rest are row-parallel


@dataclasses.dataclass(frozen=True)
class LoRA:
    """A LoRA / QLoRA fine-tuning setting (frozen pytree; every field a leaf but ``name``).

    Attributes:
        rank: adapter rank ``r`` (Hu et al. 2022 §4.1).
        q, k, v, o, gate, up, down: 1 where the module carries an adapter, else 0 (``gate``
            exists only in gated FFNs; on a GELU FFN ``up`` is ``W1`` and ``down`` ``W2``).
        base_bytes: bytes per frozen base parameter as stored (0 = the training precision's
            weights, :func:`jaxmodel.precisions.training_weight_bytes`; QLoRA: the 4-bit
            word with its block scales).
        dequant: 1 when every GEMM first dequantises the stored base to 16 bit (QLoRA).
        name: label (static).
    """

    rank: Array = 16.0
    q: Array = 1.0
    k: Array = 1.0
    v: Array = 1.0
    o: Array = 1.0
    gate: Array = 1.0
    up: Array = 1.0
    down: Array = 1.0
    base_bytes: Array = 0.0
    dequant: Array = 0.0
    name: str = "lora"


_register(LoRA, meta=("name",))


def lora(rank=16.0, modules=MODULES, base=None) -> LoRA:
    """A :class:`LoRA` setting from names.

    Args:
        rank: adapter rank ``r`` (a number or an array of them).
        modules: adapted modules, names of :data:`MODULES` (``"all"`` = every one).
        base: storage of the frozen base: ``None`` (the training precision, LoRA) or a
            precision preset name (:data:`jaxmodel.precisions.PRESETS`) whose deployed weight
            word it takes (:func:`jaxmodel.precisions.serving_weight_bytes`): ``"w4a16"`` =
            QLoRA's 4-bit base (0.5 B + block scales), dequantised to 16 bit for every GEMM;
            ``"fp8"``/``"int8"`` an 8-bit base.

    Raises:
        ValueError: an unknown module or base name, or a rank below 1.

    Example:
        >>> cfg = lora(16, "q,v")
        >>> float(cfg.rank), float(cfg.q), float(cfg.k)
        (16.0, 1.0, 0.0)
    """
    if isinstance(modules, str):
        modules = MODULES if modules == "all" else tuple(
            m.strip() for m in modules.split(",") if m.strip())
    bad = [m for m in modules if m not in MODULES]
    if bad or not modules:
        raise ValueError(f"lora: modules {bad or list(modules)} must be a non-empty subset of "
                         f"{MODULES}")
    try:
        low = float(jnp.min(jnp.asarray(rank)))
    except TypeError:                                      # traced: checked by the caller
        low = 1.0
    if not low >= 1.0:
        raise ValueError(f"lora: rank={rank!r} must be >= 1")
    flags = {m: float(m in modules) for m in MODULES}
    if base is None:
        return LoRA(rank=rank, **flags)
    p = _prec.precision(base)
    word = float(_prec.serving_weight_bytes(p))
    return LoRA(rank=rank, base_bytes=word, dequant=float(float(p.gemm_bytes) < 1.0),
                name=f"qlora-{p.name}" if float(p.gemm_bytes) < 1.0 else f"lora-{p.name}",
                **flags)


def qlora(rank=16.0, modules=MODULES, base="w4a16") -> LoRA:
    """QLoRA (Dettmers et al. 2023): :func:`lora` over a 4-bit frozen base (``"w4a16"``)."""
    return lora(rank, modules, base)


# --------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------
def _attention_dims(model: Model):
    """``{module: (d_in, d_out)}`` of the attention projections (GQA; MLA: q the query path,
    k the joint KV down projection, v the key/value up projection, o the output)."""
    d, h, dh, kv = model.d_model, model.n_heads, model.head_dim, model.n_kv_heads
    mla = model.is_mla
    d_qk = model.qk_nope_head_dim + model.qk_rope_head_dim

    def pick(a, b):
        return (jnp.where(mla, a[0], b[0]), jnp.where(mla, a[1], b[1]))

    return {"q": pick((d, h * d_qk), (d, h * dh)),
            "k": pick((d, model.kv_lora_rank + model.qk_rope_head_dim), (d, kv * dh)),
            "v": pick((model.kv_lora_rank, h * (model.qk_nope_head_dim + model.v_head_dim)),
                      (d, kv * dh)),
            "o": pick((h * model.v_head_dim, d), (h * dh, d))}


def _ffn_dims(model: Model, d_ff):
    return {"gate": (model.d_model, d_ff), "up": (model.d_model, d_ff),
            "down": (d_ff, model.d_model)}


def _per_device(module, d_in, d_out, tp):
    """``(A's input width, B's output width)`` on one device under TP (module docstring)."""
    if module in _COLUMN:
        return d_in, d_out / tp
    return d_in / tp, d_out


def _flag(cfg: LoRA, model: Model, module):
    on = jnp.clip(getattr(cfg, module), 0.0, 1.0)
    return on * model.is_gated if module == "gate" else on


def _layer_modules(model: Model, cfg: LoRA):
    """``[(module, d_in, d_out, held, routed, visits)]`` of one average layer: the attention
    modules once; the FFN modules of a dense layer once; of an MoE layer, ``held`` once per
    shared expert and ``routed`` once per routed expert (parameters), ``visits`` once per
    expert a token passes (``top_k`` + shared: compute); MoE terms weighted by the MoE-layer
    share."""
    share = _params.n_moe_layers(model) / jnp.maximum(model.n_layers, 1.0)
    out = [(m, a, b, 1.0, 0.0, 1.0) for m, (a, b) in _attention_dims(model).items()]
    for m, (a, b) in _ffn_dims(model, model.d_ff).items():
        out.append((m, a, b, 1.0 - share, 0.0, 1.0 - share))
    for m, (a, b) in _ffn_dims(model, model.expert_d_ff).items():
        out.append((m, a, b, share * model.n_shared_experts, share * model.n_experts,
                    share * (model.top_k + model.n_shared_experts)))
    return out


def adapter_params_per_device(model: Model, par: Parallelism, cfg: LoRA):
    """Adapter parameters on the most loaded device (count): per adapted module
    ``r·(d_in' + d_out')`` with the TP split of the module docstring, summed over one average
    layer and the ``⌈L/p⌉`` layers of the most loaded stage (routed experts' adapters split
    over ``ep`` like the experts)."""
    tp = jnp.maximum(par.tp, 1.0)
    ep = jnp.maximum(par.ep, 1.0)
    total = 0.0
    for m, a, b, held, routed, _ in _layer_modules(model, cfg):
        d_in, d_out = _per_device(m, a, b, tp)
        total = total + _flag(cfg, model, m) * (held + routed / ep) * cfg.rank * (d_in + d_out)
    return total * stage_layers(model.n_layers, par.pp)[1]


def adapter_times(dev, model: Model, par: Parallelism, tokens, cfg: LoRA, gemm, prec):
    """Adapter GEMMs of one average layer on one device, ``(fwd_s, bwd_s)``: per adapted
    module ``[T, d_in']×[d_in', r]`` and ``[T, r]×[r, d_out']`` forward, their input and
    weight gradients backward (timed by the tile search, in the 16-bit dtype of the
    precision's attention, as the adapters are kept in 16 bit)."""
    tp = jnp.maximum(par.tp, 1.0)
    rows = {}
    for i, (m, a, b, _, _, visits) in enumerate(_layer_modules(model, cfg)):
        d_in, d_out = _per_device(m, a, b, tp)
        c = _flag(cfg, model, m) * visits
        rows[f"lora{i}"] = [(Gemm(tokens, cfg.rank, d_in), c), (Gemm(tokens, d_out, cfg.rank), c)]
    t = evaluate(gemm, dev, rows, {}, backward=True, precision=_sixteen_bit(prec))
    return sum(f for f, _ in t.values()), sum(b for _, b in t.values())


def _sixteen_bit(prec):
    return dataclasses.replace(prec, gemm_dtype=prec.attn_dtype, gemm_bytes=prec.act_bytes,
                               scale_block=0.0 * prec.scale_block, cast_bytes=0.0)


def frozen_wgrad_times(dev, gemm_rows, gemm, prec):
    """Time of the weight-gradient GEMMs ``dW = Xᵀ·dY`` (``[k, m]×[m, n]``) of a layer's
    weight GEMMs (``batch`` None; the attention products have no weights), s — the part of
    the layer's backward a frozen base skips."""
    rows = {row: [(Gemm(g.k, g.n, g.m), c) for g, c in items if g.batch is None]
            for row, items in gemm_rows.items()}
    rows = {r: v for r, v in rows.items() if v}
    t = evaluate(gemm, dev, rows, {}, backward=False, precision=prec)
    return sum(f for r, (f, _) in t.items() if r != "quantize")


def dequant_time(dev, model: Model, par: Parallelism, cfg: LoRA, prec):
    """QLoRA's dequantisation of one average layer's base weights on one device for one
    GEMM pass, s: read ``base_bytes``, write ``act_bytes`` per weight (Dettmers et al. 2023
    §3, eq. 5), a memory-bound kernel; 0 unless ``cfg.dequant``."""
    tp = jnp.maximum(par.tp, 1.0)
    share = _params.n_moe_layers(model) / jnp.maximum(model.n_layers, 1.0)
    ffn = ((1.0 - share) * _params.ffn_params(model)
           + share * (model.top_k + model.n_shared_experts) * _params.expert_params(model))
    n = (_params.attention_params(model) + ffn) / tp
    t = _elementwise(dev, n, cfg.base_bytes + prec.act_bytes, 1.0)
    return jnp.where(cfg.dequant > 0.5, t, 0.0)


def stage_time_changes(dev, model: Model, par: Parallelism, tokens, frozen, cfg: LoRA, gemm,
                       prec) -> dict:
    """What a LoRA setting changes in the per-layer and embedding times of one micro-batch
    (module docstring), s: ``{"fwd", "bwd", "recompute_full", "lm_head_bwd"}`` to add (the
    wgrad savings negative) and ``"embed_bwd"`` to drop (a multiplier, 0). ``frozen`` =
    ``(gemm_rows, head_gemm)``: the layer's GEMM rows and the LM head's GEMM, whose weight
    gradients the frozen base skips."""
    gemm_rows, head_gemm = frozen
    ad_f, ad_b = adapter_times(dev, model, par, tokens, cfg, gemm, prec)
    deq = dequant_time(dev, model, par, cfg, prec)
    wgrad = frozen_wgrad_times(dev, gemm_rows, gemm, prec)
    head_w = frozen_wgrad_times(dev, {"head": [(head_gemm, 1.0)]}, gemm, _sixteen_bit(prec))
    return {"fwd": ad_f + deq, "bwd": ad_b + deq - wgrad, "recompute_full": ad_f + deq,
            "lm_head_bwd": -head_w, "embed_bwd": 0.0}


def memory_states(model: Model, par: Parallelism, cfg: LoRA, base_params, prec,
                  grad_bytes) -> dict:
    """Weights, gradients and optimizer states of the most loaded device, bytes: the frozen
    base (``base_params`` on the device) in ``base_bytes`` (or the precision's training
    weights), sharded over ``dp`` only under ZeRO-3 / FSDP, without gradients or optimizer
    states (Hu et al. 2022 §4.2); the adapters (:func:`adapter_params_per_device`) with the
    precision's weights, ``grad_bytes`` gradients and ``master + optim`` bytes, sharded by
    ZeRO stage 1 (optimizer), 2 (+ gradients), 3 (+ weights). ``par.dp`` is the group
    the states are sharded over."""
    dp = jnp.maximum(par.dp, 1.0)
    zero = par.zero
    n_ad = adapter_params_per_device(model, par, cfg)
    w_base = jnp.where(cfg.base_bytes > 0, cfg.base_bytes, _prec.training_weight_bytes(prec))

    def sharded(n, stage):
        return n / jnp.where(zero >= stage, dp, 1.0)

    return {"weights": w_base * sharded(base_params, 2.5)
            + prec.weight_bytes * sharded(n_ad, 2.5),
            "gradients": grad_bytes * sharded(n_ad, 1.5),
            "optimizer": (prec.master_bytes + prec.optim_bytes) * sharded(n_ad, 0.5)}


def frozen_flops_per_token(model: Model) -> Any:
    """Weight-gradient FLOP per token a frozen base does not spend: ``2·N_active`` (one GEMM
    pass over every weight a token multiplies with, Narayanan et al. 2021 Appendix: the
    backward is 2× the forward, half of it wgrad), FLOP."""
    return 2.0 * _params.param_count.single(model, True)


__all__ = ["LoRA", "MODULES", "lora", "qlora", "adapter_params_per_device", "adapter_times",
           "frozen_wgrad_times", "dequant_time", "stage_time_changes", "memory_states",
           "frozen_flops_per_token"]
