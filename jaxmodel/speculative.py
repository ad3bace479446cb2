"""Speculative decoding as a switch of the same served model.

A cheap proposer drafts ``k`` tokens per sequence; the target model verifies them in one
forward pass over ``k + 1`` positions per sequence (the ``k`` drafts and the token after the
last accepted one) and keeps the longest accepted prefix plus one token of its own
(Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding",
ICML 2023, §3; Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling", 2023, Algorithm 2). With every draft token accepted independently with
probability ``α`` the expected tokens one verification step emits are (Leviathan et al. eq. 1)

    E[tokens] = (1 − α^{k+1}) / (1 − α)          (→ k + 1 as α → 1; 1 at k = 0),

so one decode *iteration* of the served model costs the proposer's ``k`` draft steps plus a
verification step over ``k + 1`` tokens per sequence, and emits ``E`` tokens per sequence.

Proposers (``method``, a code into :data:`METHODS`):

- ``"draft_model"``: a separate small model of the same vocabulary (Leviathan et al. §3;
  vLLM ``speculative_config={"model": ...}``, TensorRT-LLM ``DraftTarget``); each draft token
  is one decode step of the draft model at the same batch (embedding, all its layers, LM head),
  the prompt is prefilled by the draft model too; its weights and its own KV cache are held
  beside the target's (same tensor parallelism).
- ``"mtp"``: multi-token-prediction modules (DeepSeek-AI, "DeepSeek-V3 Technical Report",
  2024, §2.2 and §5.4.3: one MTP module drafts the next-next token; serving frameworks chain
  it ``k`` times, TensorRT-LLM ``MTPDecodingConfig.num_nextn_predict_layers``, SGLang
  ``--speculative-algorithm NEXTN``): per draft token one projection ``[2d, d]``, one decoder
  layer of the model's kind (MoE when the model is) and the shared LM head; the module's own
  KV cache (one layer) and weights (:func:`jaxmodel.workload.params.mtp_params`).
- ``"eagle"``: EAGLE heads (Li et al., "EAGLE: Speculative Sampling Requires Rethinking
  Feature Uncertainty", ICML 2024, §4.1: an FC layer ``[2d, d]`` over the feature and the
  token embedding, one decoder layer, the target's LM head); the same per-draft-token cost
  and memory as one MTP module. The chain draft is modelled (the tree of EAGLE-1/2 verifies
  more positions per step; an acceptance length measured with a tree is a chain's ``E``
  with the tree's verification width not counted).

Units: tokens, dimensionless rates.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel.types import Array, Model, code_of

#: Proposers, encoded by position in ``Speculative.method``.
METHODS = ("none", "draft_model", "mtp", "eagle")


@dataclasses.dataclass(frozen=True)
class Speculative:
    """Speculative-decoding configuration (a pytree; numeric fields may carry batch axes).

    Attributes:
        method: code into :data:`METHODS` (names accepted).
        k: draft tokens proposed per verification step (TensorRT-LLM ``max_draft_len``,
            vLLM ``num_speculative_tokens``).
        accept: per-token acceptance rate ``α`` in [0, 1] (Leviathan et al. §3.1, the
            expected acceptance of one draft token).
        draft: the draft :class:`jaxmodel.Model` (``method="draft_model"`` only).
    """

    method: Array = 2.0
    k: Array = 1.0
    accept: Array = 0.8
    draft: Optional[Model] = None

    def __post_init__(self):
        object.__setattr__(self, "method", code_of(self.method, METHODS, "method"))


jax.tree_util.register_dataclass(
    Speculative, data_fields=["method", "k", "accept", "draft"], meta_fields=[])


def validate_speculative(s: Speculative, where: str = "Speculative") -> Speculative:
    """Check a concrete configuration; ``ValueError`` names the field and value."""
    m = np.asarray(s.method, float)
    k = np.asarray(s.k, float)
    a = np.asarray(s.accept, float)
    if not np.all((m >= 0) & (m <= len(METHODS) - 1) & (m == np.round(m))):
        raise ValueError(f"{where}: method={s.method!r} must be one of {METHODS}")
    if not np.all(np.isfinite(k) & (k >= 0) & (k == np.round(k)) & (k <= 64)):
        raise ValueError(f"{where}: k={s.k!r} must be an integer in [0, 64]")
    if not np.all(np.isfinite(a) & (a >= 0) & (a <= 1)):
        raise ValueError(f"{where}: accept={s.accept!r} must lie in [0, 1]")
    if np.any(np.abs(m - METHODS.index("draft_model")) < 0.5) and s.draft is None:
        raise ValueError(f"{where}: method='draft_model' needs draft=<Model>")
    return s


def speculative_arg(value: Any) -> Optional[Speculative]:
    """``None`` (no speculation), a :class:`Speculative`, or a mapping of its fields."""
    if value is None or isinstance(value, Speculative):
        return value
    if isinstance(value, dict):
        return Speculative(**value)
    raise ValueError(f"speculative={value!r} must be None, a Speculative or a dict of its "
                     f"fields {[f.name for f in dataclasses.fields(Speculative)]}")


def draft_len(s: Speculative):
    """Draft tokens per step, 0 when ``method`` is ``"none"``."""
    return jnp.where(s.method < 0.5, 0.0, jnp.maximum(s.k, 0.0))


def expected_tokens(accept, k):
    """Expected tokens emitted per verification step (Leviathan et al. 2023 eq. 1):
    ``(1 − α^{k+1}) / (1 − α)``, ``k + 1`` at ``α = 1`` (double-where: finite gradient).
    Tokens per sequence per step, ``1 <= E <= k + 1``."""
    a = jnp.clip(accept, 0.0, 1.0)
    near = jnp.abs(1.0 - a) < 1e-6
    safe = jnp.where(near, 0.5, a)
    e = (1.0 - safe ** (k + 1.0)) / (1.0 - safe)
    return jnp.where(near, k + 1.0, e)


def tokens_per_step(s: Speculative):
    """:func:`expected_tokens` of ``s`` (1 without speculation)."""
    return expected_tokens(s.accept, draft_len(s))


__all__ = ["Speculative", "METHODS", "expected_tokens", "tokens_per_step", "draft_len",
           "validate_speculative", "speculative_arg"]
