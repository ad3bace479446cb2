"""The names of the discrete choices and their numeric codes.

A discrete choice (topology, pipeline schedule, recompute mode, activation, attention kind,
rank order, FlashAttention version, dropout stack, ZeRO-3 implementation) is stored in the
configuration pytrees as a number: the position of its name in the tuples below
(docs/architecture.md, "Codes"). :func:`code_of` converts a name (or an alias of
:data:`ALIASES`) to its code; numbers and arrays pass through, so a batch may mix choices.
"""

from __future__ import annotations

import difflib
from typing import Any, Sequence

# Discrete choices, encoded by their position (docs/architecture.md, "Codes").
TOPOLOGIES = ("ring", "switch", "fully_connected", "mesh2d", "torus2d")
# "dualpipe": DeepSeek-V3's bidirectional schedule (DeepSeek-AI, "DeepSeek-V3 Technical
# Report", 2024, §3.2.1). "norm_upproj": its recomputation of RMSNorm and the MLA
# up-projections only (§3.2.3), with the activations cached as §3.3.3 states.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "dualpipe")
RECOMPUTE = ("none", "selective", "full", "norm_upproj")
# Rank orders (innermost first): the PTD-P placement (Narayanan et al., SC'21, §3.2), and
# Megatron-core's default ``order="tp-cp-ep-dp-pp"`` (megatron/core/parallel_state.py
# ``initialize_model_parallel``; DeepSeek-V3's 64-way EP on 8 nodes, §3.2), pipeline outermost.
PLACEMENTS = ("tp_cp_pp_dp", "tp_cp_ep_dp_pp")   # "-" spellings accepted
# FFN kinds: GELU and ReLU / squared ReLU (two matrices), SwiGLU and GeGLU (gated, three).
ACTIVATIONS = ("gelu", "swiglu", "geglu", "relu", "relu2")
# Attention kinds: "gqa" covers multi-head (h_kv = h), grouped-query and multi-query
# (h_kv = 1) attention; "mla" is DeepSeek's multi-head latent attention.
ATTENTIONS = ("gqa", "mla")


# Alternative spellings of code names. Only true synonyms are listed: GELU approximations
# (``gelu_new``, ``gelu_pytorch_tanh``) cost what GELU costs; multi-head and multi-query
# attention are the ``gqa`` kind with ``n_kv_heads = n_heads`` or 1. ``silu`` is not an alias:
# whether a SiLU FFN is gated (SwiGLU) depends on the architecture, which ``hw_db.model``
# decides from the HF config.
ALIASES = {"fc": "fully_connected", "full_connected": "fully_connected", "mesh": "mesh2d",
           "torus": "torus2d", "2d_mesh": "mesh2d", "2d_torus": "torus2d",
           "interleaved_1f1b": "interleaved", "pipedream_flush": "1f1b", "gelu_new": "gelu",
           "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "gelu_accurate": "gelu",
           "relu_squared": "relu2", "squared_relu": "relu2", "mha": "gqa", "mqa": "gqa"}


#: ``Parallelism.flash_attention`` codes: 0 standard attention, 1 FlashAttention-1 (Dao et
#: al., NeurIPS 2022; Guo et al.'s model), 2 FlashAttention-2 (Dao, ICLR 2024). ``True``
#: means 1.
FA_VERSIONS = ("standard", "fa1", "fa2")

#: ``train_step(dropout=...)`` codes: 0 no dropout (e.g. Llama recipes), 1 Megatron GPT's
#: hidden and attention dropout (default), 2 the same on the Megatron-LM 2021 software stack
#: of Narayanan et al., SC'21 (its eager bias/copy/gradient-accumulation kernels and fp32
#: cross entropy, :func:`jaxmodel.workload.layer.megatron2021_kernels`).
DROPOUT_MODES = ("none", "megatron", "megatron2021")

#: ``Parallelism.zero3_impl`` codes, how ZeRO stage 3 executes
#: (:mod:`jaxmodel.parallel.zero`): 0 ``fsdp`` — one flat parameter per unit, gathered one
#: unit ahead while the unit before computes (Zhao et al., "PyTorch FSDP: Experiences on
#: Scaling Fully Sharded Data Parallel", VLDB 2023, §3.2-3.3); 1 ``deepspeed`` — DeepSpeed's
#: stage 3 as released in 2021 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
#: Training Trillion Parameter Models", SC'20, §5.3; DeepSpeed ``partition_parameters.py``):
#: per-tensor collectives through the list API after a device synchronisation (serial),
#: parameters re-gathered for the recomputation, small parameters persistent.
ZERO3_IMPLS = ("fsdp", "deepspeed")


def code_of(value: Any, names: Sequence[str], field: str) -> Any:
    """Map a name to its numeric code; pass numbers and arrays through untouched.

    Args:
        value: a name from ``names`` (or an alias in :data:`ALIASES`), or a number / array
            already holding codes.
        names: the ordered names; the code of ``names[i]`` is ``i``.
        field: field name used in the error message.

    Raises:
        ValueError: ``value`` is a string that is not one of ``names``, or a Python bool
            (``recompute=True`` is ambiguous: give the name).

    Example:
        >>> code_of("interleaved", SCHEDULES, "schedule")
        2.0
        >>> code_of(True, RECOMPUTE, "recompute")
        Traceback (most recent call last):
        ...
        ValueError: recompute=True is not a name: use one of ['none', 'selective', 'full', 'norm_upproj']
    """
    if isinstance(value, bool):
        raise ValueError(f"{field}={value!r} is not a name: use one of {list(names)}")
    if isinstance(value, str):
        key = value.lower().replace("-", "_")
        key = ALIASES.get(key, key) if key not in names else key
        if key not in names:
            close = difflib.get_close_matches(key, list(names) + list(ALIASES), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{field}={value!r} is not one of {list(names)}{hint}")
        return float(names.index(key))
    return value
