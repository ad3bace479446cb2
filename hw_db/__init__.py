"""The built-in hardware and model database, and its loaders.

Layout::

    hw_db/devices/<name>.toml   one accelerator: ``[device]`` table, every value
                                ``{value, source}`` (optionally ``unit``)
    hw_db/systems/<name>.toml   a device name + one ``[[levels]]`` table per network tier
    hw_db/models/<name>.json    a Hugging Face ``config.json``
    hw_db/tech/                 process nodes, memory, packaging and cost data

Loaders validate concrete values and raise ``ValueError`` naming the file, the field and the
value: wrong types, strings for booleans, non-finite or out-of-range magnitudes (the ranges
of ``jaxmodel.types.RANGES``), unknown keys (with the closest known key suggested). A value
may carry an explicit ``unit`` (``{ value = 1410, unit = "MHz", source = ... }``), converted
to SI here and nowhere else; without ``unit`` values are SI (Hz, bytes, bytes/s, s, W, nm).

Example:
    >>> dev = hw_db.device("a100_80gb")
    >>> float(dev.freq_hz)
    1410000000.0
    >>> sys = hw_db.system("dgx_a100", nodes=2)
    >>> float(sys.n_devices)
    16.0
    >>> m = hw_db.model("gpt3-175b")
    >>> int(m.n_layers), int(m.d_model)
    (96, 12288)
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import warnings
from pathlib import Path
from typing import Any, Mapping

from hw_db._toml import load_toml
from jaxmodel.types import (Device, Model, NetLevel, System, check_value, rule_of,
                            validate_device_usable, validate_model, validate_system)

ROOT = Path(__file__).resolve().parent
_KINDS = {"device": ("devices", ".toml"), "system": ("systems", ".toml"),
          "model": ("models", ".json")}

__all__ = ["device", "system", "model", "names", "load_toml", "to_si", "UNITS", "ROOT",
           "HF_MODELLED_KEYS", "HF_HARMLESS_KEYS"]

# Explicit units a ``{value, unit}`` entry may carry: unit -> (dimension, factor to SI).
UNITS: dict[str, tuple[str, float]] = {
    "Hz": ("Hz", 1.0), "kHz": ("Hz", 1e3), "MHz": ("Hz", 1e6), "GHz": ("Hz", 1e9),
    "B": ("B", 1.0), "KB": ("B", 1e3), "kB": ("B", 1e3), "MB": ("B", 1e6), "GB": ("B", 1e9),
    "TB": ("B", 1e12), "KiB": ("B", 2.0 ** 10), "MiB": ("B", 2.0 ** 20),
    "GiB": ("B", 2.0 ** 30), "TiB": ("B", 2.0 ** 40),
    "B/s": ("B/s", 1.0), "KB/s": ("B/s", 1e3), "kB/s": ("B/s", 1e3), "MB/s": ("B/s", 1e6),
    "GB/s": ("B/s", 1e9), "TB/s": ("B/s", 1e12), "KiB/s": ("B/s", 2.0 ** 10),
    "MiB/s": ("B/s", 2.0 ** 20), "GiB/s": ("B/s", 2.0 ** 30),
    "Mb/s": ("B/s", 1e6 / 8), "Gb/s": ("B/s", 1e9 / 8), "Tb/s": ("B/s", 1e12 / 8),
    "Gbit/s": ("B/s", 1e9 / 8),
    "s": ("s", 1.0), "ms": ("s", 1e-3), "us": ("s", 1e-6), "µs": ("s", 1e-6),
    "ns": ("s", 1e-9),
    "W": ("W", 1.0), "kW": ("W", 1e3), "nm": ("nm", 1.0),
}
_ENTRY_KEYS = ("value", "source", "unit")
# Calibrated constants a file must state even though the dataclass has a default: the
# defaults (efficiency 1, no overheads) are the idealised values of a hand-built config, and
# a file silently falling back to them would be optimistic without saying so.
DEVICE_FILE_REQUIRED = ("mem_bw_efficiency", "matmul_overhead_s", "softmax_overhead_s",
                        "layernorm_overhead_s", "gelu_overhead_s")
LEVEL_FILE_REQUIRED = ("efficiency", "base_latency", "chunk_latency")
# Top-level keys of the files (extend here when a file format grows a table).
DEVICE_FILE_KEYS = ("name", "description", "device")
SYSTEM_FILE_KEYS = ("name", "description", "device", "levels")
LEVEL_META_KEYS = ("name", "description", "scales_with_nodes")


def _suggest(key: str, known) -> str:
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _unknown(where: str, what: str, key: str, known) -> ValueError:
    return ValueError(f"{where}: unknown {what} '{key}'{_suggest(key, known)}; known: "
                      f"{sorted(known)}")


def names(kind: str = "device") -> list[str]:
    """Names available for ``kind`` in ``{"device", "system", "model"}``, sorted.

    Example:
        >>> hw_db.names("system")[:3]
        ['a100_dgx_vidur', 'dgx_a100', 'dgx_a100_40gb']
    """
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not one of {sorted(_KINDS)}")
    folder, ext = _KINDS[kind]
    return sorted(p.stem for p in (ROOT / folder).glob(f"*{ext}"))


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    folder, ext = _KINDS[kind]
    if not isinstance(name_or_path, (str, Path)):
        raise ValueError(f"{kind} must be a hw_db name or a {ext} path, got "
                         f"{name_or_path!r}")
    p = Path(name_or_path)
    if p.suffix == ext and p.exists():
        return p
    cand = ROOT / folder / f"{name_or_path}{ext}"
    if cand.exists():
        return cand
    hint = _suggest(str(name_or_path), names(kind))
    raise ValueError(f"unknown {kind} {str(name_or_path)!r}{hint}; available: {names(kind)} "
                     f"(or a path to a {ext} file)")


def to_si(value: float, unit: str, dim: str, where: str = "value") -> float:
    """Convert ``value`` given in ``unit`` to SI, checking that the unit measures ``dim``.

    Example:
        >>> hw_db.to_si(1410, "MHz", "Hz")
        1410000000.0
        >>> hw_db.to_si(200, "Gb/s", "B/s")
        25000000000.0
    """
    if not isinstance(unit, str) or unit not in UNITS:
        raise ValueError(f"{where}: unknown unit {unit!r}{_suggest(str(unit), UNITS)}; "
                         f"known: {sorted(UNITS)}")
    udim, factor = UNITS[unit]
    if not dim:
        raise ValueError(f"{where}: is dimensionless, so unit={unit!r} does not apply "
                         "(remove the 'unit' key)")
    if udim != dim:
        allowed = [u for u, (d, _) in UNITS.items() if d == dim]
        raise ValueError(f"{where}: unit {unit!r} measures {udim}, this field is in {dim} "
                         f"(use one of {allowed})")
    return float(value) * factor


def _number(path: Path, cls, field: str, shown: str, entry: Any) -> float:
    """The SI value of a ``{value, source[, unit]}`` entry of ``cls.field``, checked."""
    where = f"{path}: field '{shown}'"
    if not isinstance(entry, Mapping) or "value" not in entry:
        raise ValueError(f"{where} must be a table {{value = ..., source = ...}}, got "
                         f"{entry!r}")
    for k in entry:
        if k not in _ENTRY_KEYS:
            raise _unknown(where, "key", k, _ENTRY_KEYS)
    if not str(entry.get("source", "")).strip():
        raise ValueError(f"{where} has no 'source' note")
    v = entry["value"]
    rule = rule_of(cls, field)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        kind = "a number" if v is not None else "a number, got nothing"
        raise ValueError(f"{where} must be {kind}, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{where} must be finite, got {v!r}")
    si = float(v)
    unit = entry.get("unit")
    if unit is not None:
        si = to_si(v, unit, rule.dim, where)
    check_value(str(path), shown, si, rule)
    return si


def _device_from_table(path: Path, table: Mapping, name: str) -> Device:
    if not isinstance(table, Mapping):
        raise ValueError(f"{path}: [device] must be a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(Device) if f.name != "name"}
    kwargs = {}
    for key, entry in table.items():
        if key not in fields:
            raise _unknown(str(path), "device field", key, fields)
        kwargs[key] = _number(path, Device, key, key, entry)
    missing = [k for k, f in fields.items() if k not in kwargs and (
        f.default is dataclasses.MISSING or k in DEVICE_FILE_REQUIRED)]
    if missing:
        raise ValueError(f"{path}: missing device field(s) {missing}")
    return _validate(Device(name=name, **kwargs), where=f"{path}")


def _validate(dev: Device, where: str) -> Device:
    """Field ranges (types.validate_device) and the checks the models register (the buffers
    large enough for the smallest GEMM tile, :func:`jaxmodel.types.validate_device_usable`)."""
    return validate_device_usable(dev, where=where)


def _name_of(path: Path, data: Mapping) -> str:
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{path}: field 'name' must be a non-empty string, got {name!r}")
    return name


def _check_top(path: Path, data: Mapping, known) -> None:
    for k in data:
        if k not in known:
            raise _unknown(str(path), "top-level key", k, known)
    if "description" in data and not isinstance(data["description"], str):
        raise ValueError(f"{path}: field 'description' must be a string, got "
                         f"{data['description']!r}")


def device(name_or_path: str | Path = "a100_80gb", **overrides) -> Device:
    """Load a device by hw_db name or TOML path; ``overrides`` replace fields (SI units).

    Raises:
        ValueError: unknown name, malformed file, missing/unknown field, or a value out of
            range — the message names the file, the field and the value.

    Example:
        >>> float(hw_db.device("h100_sxm", mem_bw=4e12).mem_bw)
        4000000000000.0
        >>> hw_db.device("a100_80gb", mem_bw_efficiency=5)
        Traceback (most recent call last):
        ...
        ValueError: ... (overrides): field 'mem_bw_efficiency' = 5 is too large: must be <= 1
    """
    path = _resolve("device", name_or_path)
    data = load_toml(path)
    _check_top(path, data, DEVICE_FILE_KEYS)
    if "device" not in data:
        raise ValueError(f"{path}: missing [device] table")
    dev = _device_from_table(path, data["device"], _name_of(path, data))
    if overrides:
        known = [f.name for f in dataclasses.fields(Device) if f.name != "name"]
        for k in overrides:
            if k not in known:
                raise _unknown("device override", "field", k, known)
        dev = _validate(dataclasses.replace(dev, **overrides), where=f"{path} (overrides)")
    return dev


_LEVEL_FIELDS = {f.name: f for f in dataclasses.fields(NetLevel)}


def _level_from_table(path: Path, i: int, table: Mapping, nodes: int | None):
    where = f"levels[{i}]"
    if not isinstance(table, Mapping):
        raise ValueError(f"{path}: '{where}' must be a table ([[levels]]), got {table!r}")
    kwargs = {}
    scales = table.get("scales_with_nodes", False)
    if not isinstance(scales, bool):
        raise ValueError(f"{path}: field '{where}.scales_with_nodes' must be true or false, "
                         f"got {scales!r}")
    for key in ("name", "description"):
        if key in table and not isinstance(table[key], str):
            raise ValueError(f"{path}: field '{where}.{key}' must be a string, got "
                             f"{table[key]!r}")
    for key, entry in table.items():
        if key in LEVEL_META_KEYS:
            continue
        if key not in _LEVEL_FIELDS:
            raise _unknown(str(path), "field", f"{where}.{key}",
                           [f"{where}.{k}" for k in list(_LEVEL_FIELDS) + list(
                               LEVEL_META_KEYS)])
        if key == "topology":
            val = entry.get("value") if isinstance(entry, Mapping) else entry
            if isinstance(entry, Mapping):
                for k in entry:
                    if k not in ("value", "source"):
                        raise _unknown(f"{path}: field '{where}.topology'", "key", k,
                                       ("value", "source"))
            try:
                if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                    raise ValueError(f"topology={val!r} must be a name or a code")
                code = NetLevel(size=1, topology=val, bw_per_device=1,
                                link_latency=0).topology
                check_value(str(path), f"{where}.topology", code, rule_of(NetLevel,
                                                                          "topology"))
            except ValueError as e:
                raise ValueError(f"{path}: field '{where}.topology': {e}") from None
            kwargs[key] = code
            continue
        kwargs[key] = _number(path, NetLevel, key, f"{where}.{key}", entry)
    missing = [k for k, f in _LEVEL_FIELDS.items() if k not in kwargs and (
        f.default is dataclasses.MISSING or k in LEVEL_FILE_REQUIRED)]
    if missing:
        raise ValueError(f"{path}: missing field(s) {[f'{where}.{m}' for m in missing]}")
    if scales and nodes is not None:
        kwargs["size"] = float(nodes)
    return NetLevel(**kwargs), scales


def system(name_or_path: str | Path = "hgx_a100_4gpu", nodes: int | None = None,
           device_overrides: Mapping | None = None) -> System:
    """Load a system (device type + network levels) by hw_db name or TOML path.

    Args:
        name_or_path: hw_db system name or a TOML path.
        nodes: number of nodes; sets the size of the level marked ``scales_with_nodes``.
        device_overrides: fields to replace in the device (SI units).

    Example:
        >>> s = hw_db.system("dgx_h100", nodes=4)
        >>> s.device.name, [float(l.size) for l in s.levels]
        ('h100_sxm', [8.0, 4.0])
    """
    path = _resolve("system", name_or_path)
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)
                              or nodes < 1):
        raise ValueError(f"system {path.stem}: nodes must be an integer >= 1, got {nodes!r}")
    data = load_toml(path)
    _check_top(path, data, SYSTEM_FILE_KEYS)
    if "device" not in data:
        raise ValueError(f"{path}: missing 'device' (a hw_db device name)")
    if not isinstance(data["device"], str):
        raise ValueError(f"{path}: field 'device' must be a hw_db device name or a TOML "
                         f"path (a string), got {data['device']!r}")
    try:
        dev = device(data["device"], **dict(device_overrides or {}))
    except ValueError as e:
        raise ValueError(f"{path}: field 'device': {e}") from None
    levels_data = data.get("levels", [])
    if not isinstance(levels_data, list):
        raise ValueError(f"{path}: 'levels' must be an array of tables ([[levels]]), got "
                         f"{levels_data!r}")
    levels = []
    scalable = False
    for i, tbl in enumerate(levels_data):
        lvl, scales = _level_from_table(path, i, tbl, nodes)
        scalable |= scales
        levels.append(lvl)
    if sum(bool(t.get("scales_with_nodes", False)) for t in levels_data
           if isinstance(t, Mapping)) > 1:
        raise ValueError(f"{path}: more than one level is marked 'scales_with_nodes'")
    if nodes is not None and not scalable and nodes != 1:
        raise ValueError(f"{path}: system has no level marked 'scales_with_nodes', "
                         f"so nodes={nodes} cannot be applied")
    sys_ = System(device=dev, levels=tuple(levels), name=_name_of(path, data))
    return validate_system(sys_, where=str(path))


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json
# ---------------------------------------------------------------------------------------------
# HF config keys → Model fields (first key found wins).
_HF_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_heads": ("num_attention_heads", "n_head"),
    "n_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "d_ff": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "n_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token"),
    "moe_every": ("decoder_sparse_step", "moe_layer_freq"),
    "capacity_factor": ("capacity_factor",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "n_shared_experts": ("n_shared_experts", "num_shared_experts"),
    "moe_d_ff": ("moe_intermediate_size",),
    "first_k_dense": ("first_k_dense_replace",),
    "n_mtp_layers": ("num_nextn_predict_layers",),
    "n_group": ("n_group",),
    "topk_group": ("topk_group",),
    "sliding_window": ("sliding_window",),
    "global_every": ("sliding_window_pattern",),
    "attention_chunk": ("attention_chunk_size",),
    "encoder_params": ("encoder_params",),
}
# Keys that change compute, memory or communication and are modelled (read by ``model``).
HF_MODELLED_KEYS = frozenset(k for keys in _HF_KEYS.values() for k in keys) | {
    "hidden_act", "hidden_activation", "activation_function", "tie_word_embeddings",
    "model_type", "attention_bias", "multi_query", "new_decoder_architecture",
    "parallel_attn", "use_parallel_residual", "use_sliding_window", "max_window_layers",
    "layer_types", "quantization_config", "sliding_window_size", "mlp_only_layers"}
# Keys that do not change the cost of a step at a given sequence length, batch and precision:
# names and bookkeeping, tokenizer ids, the checkpoint's storage dtype (the run's precision is
# an argument of the call), the maximal context (the call gives the sequence length),
# position-encoding constants (RoPE scaling rescales angles: same FLOPs; partial rotary
# dimensions rotate fewer elements of the same tensors), normalisation epsilons and QK-norms
# (per-head RMSNorms: < 0.01 % of the parameters), initialisation, dropout probabilities
# (dropout kernels are a train_step option), the MoE routing and auxiliary-loss knobs (group
# limits, score function, scaling, normalisation of the top-k weights, the clamp of GPT-OSS's
# SwiGLU: same experts and GEMMs), expert-parallel hints of a deployment (``ep_size``), logit
# soft-capping (one tanh per score: elementwise, not modelled like the softmax's scale),
# Llama's ``pretraining_tp`` (a numerically equivalent split of the same GEMMs), small biases
# (``mlp_bias``, ``bias``: < 0.01 %), Falcon's post-layernorm residual flag, and GPT-2's
# classification-head and attention-scaling flags.
HF_HARMLESS_KEYS = frozenset({
    "_source", "_name_or_path", "name", "architectures", "transformers_version", "auto_map",
    "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "unk_token_id", "decoder_start_token_id", "tokenizer_class", "max_position_embeddings",
    "n_positions", "n_ctx", "max_sequence_length", "seq_length", "rope_theta",
    "rope_scaling", "rotary_pct", "rotary_emb_base", "rope_type", "partial_rotary_factor",
    "rope_local_base_freq", "rope_interleave", "original_max_position_embeddings",
    "initial_context_length", "rotary", "rotary_dim", "use_mrope", "cache_implementation",
    "position_embedding_type", "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps",
    "norm_eps", "use_qk_norm", "qk_layernorm",
    "initializer_range", "use_cache", "attention_dropout", "hidden_dropout",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "resid_pdrop", "embd_pdrop",
    "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "task_specific_params",
    "scale_attn_weights", "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx",
    "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "router_z_loss_coef", "aux_loss_alpha", "seq_aux", "n_group", "topk_group",
    "topk_method", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "ep_size",
    "swiglu_limit", "pretraining_tp", "mlp_bias", "bias",
    "apply_residual_connection_post_layernorm",
    "id2label", "label2id", "is_decoder", "is_encoder_decoder", "return_dict",
    "output_attentions", "output_hidden_states", "torchscript", "use_return_dict",
    "gradient_checkpointing", "prefix", "finetuning_task", "problem_type",
})
# Structural keys that are harmless only when they switch the feature off.
_HF_OFF_WHEN_FALSY = frozenset({"shared_expert_intermediate_size", "alibi"})
# Architectures (HF ``model_type``) whose MLP is gated: ``down(act(gate(x)) * up(x))``, three
# matrices. With ``hidden_act = "silu"`` that is SwiGLU, with a GELU GeGLU (Shazeer, "GLU
# Variants Improve Transformer", 2020), as in HF's ``LlamaMLP``/``MixtralBlockSparseTop2MLP``/
# ``GemmaMLP``/``Phi3MLP``/``DeepseekV3MLP``/``GptOssExperts``.
GATED_MLP_MODEL_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe",
                                   "qwen3", "qwen3_moe", "olmo", "olmo2", "granite", "gemma",
                                   "gemma2", "gemma3_text", "phi3", "deepseek_v2",
                                   "deepseek_v3", "gpt_oss"})
# Architectures with a plain two-matrix MLP ``fc2(act(fc1(x)))``.
PLAIN_MLP_MODEL_TYPES = frozenset({"gpt2", "gpt3", "gpt_neox", "gptj", "gpt_bigcode", "opt",
                                   "bloom", "falcon", "phi", "starcoder2", "codegen",
                                   "nemotron"})
# Architectures whose Q/K/V projections always carry biases (HF ``Qwen2Attention``).
QKV_BIAS_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})
# Architectures whose attention and MLP run in parallel on the same input whatever the config
# says (HF ``GPTJBlock``, ``CodeGenBlock``); Falcon and GPT-NeoX read a key.
PARALLEL_BLOCK_MODEL_TYPES = frozenset({"gptj", "codegen"})
# Architectures whose config class ties the LM head to the embedding when the key is absent
# (``tie_word_embeddings`` defaults to true in HF's ``PretrainedConfig``; Llama-family classes
# override it to false).
TIED_BY_DEFAULT_MODEL_TYPES = frozenset({"gpt2", "gemma", "gemma2", "gemma3_text", "falcon"})
# Architectures whose sliding window (when set) applies to every layer.
_WINDOW_ALL_LAYERS = frozenset({"mistral", "mixtral", "phi3", "starcoder2", "qwen2",
                                "qwen2_moe", "qwen3", "qwen3_moe"})
_GELU_NAMES = frozenset({"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast",
                         "gelu_accurate", "quick_gelu"})


def _activation(cfg: Mapping, where: str) -> str:
    """The FFN kind (a name of ``jm.ACTIVATIONS``) of a HF config.

    A SiLU activation means a gated SiLU FFN (SwiGLU, three matrices) in the architectures of
    :data:`GATED_MLP_MODEL_TYPES` and whenever ``model_type`` is absent and the key is HF's
    ``hidden_act`` (the Llama-family spelling); a GELU activation is GeGLU in a gated
    architecture (Gemma) and the two-matrix GELU FFN in a plain one. ``relu`` and ``relu2``
    (squared ReLU, Nemotron) are two-matrix FFNs. A non-gated SiLU FFN and gated ReLU
    variants are not modelled and are rejected. Gemma's ``hidden_activation`` wins over
    ``hidden_act`` as in HF's ``GemmaConfig``.
    """
    key = next((k for k in ("hidden_activation", "hidden_act", "activation_function")
                if cfg.get(k) is not None), None)
    act = cfg[key] if key else "gelu"
    mtype = cfg.get("model_type")
    if mtype is not None and not isinstance(mtype, str):
        raise ValueError(f"{where}: field 'model_type' must be a string, got {mtype!r}")
    if not isinstance(act, str):
        raise ValueError(f"{where}: field '{key}' must be a string, got {act!r}")
    a = act.lower()
    if mtype in GATED_MLP_MODEL_TYPES or mtype in PLAIN_MLP_MODEL_TYPES:
        gated = mtype in GATED_MLP_MODEL_TYPES
    else:                       # unknown architecture: HF's Llama-family spelling decides
        gated = key == "hidden_act" and a in ("silu", "swish")
    if a in ("silu", "swish"):
        if gated:
            return "swiglu"
        raise ValueError(f"{where}: field '{key}' = {act!r}: a non-gated SiLU FFN "
                         f"(model_type={mtype!r}) is not modelled (only SwiGLU, the gated "
                         "SiLU FFN of Llama-family architectures)")
    if a in _GELU_NAMES:
        return "geglu" if gated else "gelu"
    if a in ("relu", "relu2", "relu_squared", "squared_relu"):
        if gated:
            raise ValueError(f"{where}: field '{key}' = {act!r}: a gated ReLU FFN (ReGLU, "
                             f"model_type={mtype!r}) is not modelled")
        return "relu" if a == "relu" else "relu2"
    raise ValueError(f"{where}: field '{key}' = {act!r} is not modelled (GELU, ReLU, squared "
                     "ReLU, and gated SiLU/GELU = SwiGLU/GeGLU are)")


def _check_hf_keys(cfg: Mapping, where: str, strict: bool) -> None:
    for key, val in cfg.items():
        if key in HF_MODELLED_KEYS or key in HF_HARMLESS_KEYS:
            continue
        if key in _HF_OFF_WHEN_FALSY and (val is None or val is False or val == 0
                                          or val == {}):
            continue
        known = sorted(HF_MODELLED_KEYS | HF_HARMLESS_KEYS)
        msg = (f"{where}: key '{key}' = {val!r} may change compute, memory or communication "
               f"and is not modelled{_suggest(key, known)}")
        if strict:
            raise ValueError(msg + " (hw_db.model(..., strict=False) downgrades this to a "
                             "warning)")
        warnings.warn(msg, stacklevel=3)


def _flag(cfg: Mapping, key: str, where: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ValueError(f"{where}: field '{key}' must be true or false, got {v!r}")
    return v


def _window(cfg: Mapping, n_layers: float, where: str) -> tuple[float, float]:
    """``(sliding_window, global_every)`` of a HF config (see ``jm.Model``).

    - ``layer_types`` (GPT-OSS, recent configs): a list of ``"sliding_attention"`` /
      ``"full_attention"``; the full layers must be every ``k``-th (``(i + 1) % k == 0``) or none;
    - Gemma-2 alternates local and global layers (HF ``Gemma2DecoderLayer``: ``k = 2``);
      Gemma-3 every ``sliding_window_pattern``-th layer is global (HF default 6);
    - Mistral, Mixtral, Phi-3, Starcoder2: the window applies to every layer; Qwen2/Qwen3 only
      with ``use_sliding_window`` (then only when ``max_window_layers`` covers no layer:
      their bottom-full / top-local split is not modelled).
    """
    mtype = cfg.get("model_type")
    win = cfg.get("sliding_window")
    if win is None:
        win = cfg.get("sliding_window_size")
    if win is False:
        win = None
    if win is not None and (isinstance(win, bool) or not isinstance(win, (int, float))
                            or win < 0):
        raise ValueError(f"{where}: field 'sliding_window' must be a number >= 0, got {win!r}")
    types = cfg.get("layer_types")
    if types is not None:
        if (not isinstance(types, list) or len(types) != int(n_layers) or any(
                t not in ("sliding_attention", "full_attention") for t in types)):
            raise ValueError(f"{where}: field 'layer_types' must list 'sliding_attention' / "
                             f"'full_attention' for each of the {n_layers:g} layers")
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if len(full) == len(types) or not win:
            if len(full) != len(types):
                raise ValueError(f"{where}: field 'layer_types' has sliding layers but no "
                                 "'sliding_window'")
            return 0.0, 0.0
        if not full:
            return float(win), 0.0
        k = full[0] + 1
        if full != [i for i in range(len(types)) if (i + 1) % k == 0]:
            raise ValueError(f"{where}: field 'layer_types' = {types!r}: only one full-"
                             "attention layer every k layers is modelled")
        return float(win), float(k)
    if mtype in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") or "use_sliding_window" in cfg:
        if not _flag(cfg, "use_sliding_window", where, False):
            return 0.0, 0.0          # HF Qwen2/Qwen3 ignore the window then
        mwl = cfg.get("max_window_layers") or 0
        if mwl:
            raise ValueError(f"{where}: field 'max_window_layers' = {mwl!r} with "
                             "use_sliding_window: full attention below that layer and a "
                             "window above is not modelled")
        return (float(win), 0.0) if win else (0.0, 0.0)
    if not win:
        return 0.0, 0.0
    if mtype == "gemma2":
        return float(win), 2.0
    if mtype == "gemma3_text":
        pat = cfg.get("sliding_window_pattern", 6)
        if isinstance(pat, bool) or not isinstance(pat, int) or pat < 1:
            raise ValueError(f"{where}: field 'sliding_window_pattern' must be an integer "
                             f">= 1, got {pat!r}")
        return float(win), float(pat)
    if mtype in _WINDOW_ALL_LAYERS or "sliding_window_pattern" not in cfg:
        if mtype not in _WINDOW_ALL_LAYERS:
            raise ValueError(f"{where}: field 'sliding_window' = {win!r}: which layers of "
                             f"model_type={mtype!r} use it is not known (give 'layer_types')")
        return float(win), 0.0
    return float(win), float(cfg["sliding_window_pattern"])


def _quantization(cfg: Mapping, where: str) -> tuple[str, str]:
    """``(quantization, serving_precision)`` from a HF ``quantization_config`` (see
    ``jm.Model``): FP8 (DeepSeek-V3: E4M3 weights with 128×128 block scales, dynamic
    activation scaling: W8A8 FP8 GEMMs → preset ``"fp8"``); MXFP4 (GPT-OSS: E2M1 experts with
    an E8M0 scale per 32 elements, attention, router, embedding and head in BF16 → no preset
    matches a per-module mix: recorded only); AWQ/GPTQ 4-bit → ``"w4a16"``."""
    q = cfg.get("quantization_config")
    if not q:
        return "", ""
    if not isinstance(q, Mapping):
        raise ValueError(f"{where}: field 'quantization_config' must be an object, got {q!r}")
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        fmt = q.get("fmt", "e4m3")
        block = q.get("weight_block_size")
        desc = f"fp8 {fmt}" + (f", {block[0]}x{block[1]} block scales" if block else "")
        return desc, "fp8"
    if method == "mxfp4":
        keep = q.get("modules_to_not_convert") or []
        return ("mxfp4 (E2M1, E8M0 scale per 32 elements)"
                + (f"; not converted: {', '.join(map(str, keep))}" if keep else "")), ""
    if method in ("awq", "gptq") and q.get("bits", 4) == 4:
        return f"{method} 4-bit, group {q.get('group_size', 128)}", "w4a16"
    raise ValueError(f"{where}: field 'quantization_config' with quant_method={method!r} is "
                     "not modelled (fp8, mxfp4, awq/gptq 4-bit are)")


def model(name_or_config: str | Path | Mapping = "gpt3-175b", strict: bool = True) -> Model:
    """Load a model by hw_db name, from a HF ``config.json`` path, or from its dict.

    Reads the keys of ``_HF_KEYS`` (``num_hidden_layers, hidden_size, num_attention_heads,
    num_key_value_heads, head_dim, intermediate_size, vocab_size``; MoE ``num_local_experts /
    num_experts / n_routed_experts, num_experts_per_tok, decoder_sparse_step / moe_layer_freq,
    n_shared_experts, moe_intermediate_size, first_k_dense_replace``; MLA ``q_lora_rank,
    kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim``;
    ``num_nextn_predict_layers``; GPT-2's ``n_layer, n_embd, n_head, n_inner``) and
    ``hidden_act / hidden_activation / activation_function`` (:func:`_activation`),
    ``tie_word_embeddings`` (default per :data:`TIED_BY_DEFAULT_MODEL_TYPES`), the sliding
    window (:func:`_window`), Q/K/V biases (``attention_bias``, Qwen2), parallel blocks
    (GPT-J, Falcon ``parallel_attn``, GPT-NeoX ``use_parallel_residual``), Falcon's
    ``multi_query`` / ``new_decoder_architecture`` KV heads, and ``quantization_config``
    (:func:`_quantization`). Missing ``intermediate_size`` defaults to ``4·hidden`` and
    missing KV heads to the query heads. Every other key must be listed in
    :data:`HF_HARMLESS_KEYS` (it does not change the cost); a key that may change compute,
    memory or communication and is not modelled raises ``ValueError`` naming it
    (``strict=False``: a warning).

    Example:
        >>> m = hw_db.model({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
        ...                  "num_attention_heads": 4, "vocab_size": 100, "hidden_act": "silu"})
        >>> int(m.d_ff), float(m.ffn_matrices)
        (256, 3.0)
        >>> hw_db.model({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        ...              "vocab_size": 100, "shared_expert_intermediate_size": 5632})
        Traceback (most recent call last):
        ...
        ValueError: model config: key 'shared_expert_intermediate_size' = 5632 may change ...
    """
    if isinstance(name_or_config, Mapping):
        cfg, where = dict(name_or_config), "model config"
        name = cfg.get("_name_or_path", cfg.get("name", "custom"))
    else:
        path = _resolve("model", name_or_config)
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON: {e}") from None
        where, name = str(path), path.stem
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(cfg).__name__}")
    _check_hf_keys(cfg, where, strict)
    mtype = cfg.get("model_type")

    def get(field, default=None):
        found = None
        for key in _HF_KEYS[field]:
            if cfg.get(key) is not None:
                v = cfg[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ValueError(f"{where}: field '{key}' must be a number, got {v!r}")
                check_value(where, key, float(v), rule_of(Model, field))
                if found is not None and float(v) != found[1]:
                    raise ValueError(f"{where}: field '{key}' = {v!r} disagrees with "
                                     f"'{found[0]}' = {found[1]:g}")
                found = found or (key, float(v))
        if found is not None:
            return found[1]
        if default is None:
            raise ValueError(f"{where}: missing field '{_HF_KEYS[field][0]}'")
        return float(default)

    tied = _flag(cfg, "tie_word_embeddings", where, mtype in TIED_BY_DEFAULT_MODEL_TYPES)
    n_layers = get("n_layers")
    d_model = get("d_model")
    n_heads = get("n_heads")
    mla = cfg.get("kv_lora_rank") is not None
    mla_dims = dict(q_lora_rank=get("q_lora_rank", 0), kv_lora_rank=get("kv_lora_rank", 0),
                    qk_nope_head_dim=get("qk_nope_head_dim", 0),
                    qk_rope_head_dim=get("qk_rope_head_dim", 0),
                    v_head_dim=get("v_head_dim", 0))
    if mla:
        head_dim = get("head_dim", mla_dims["qk_nope_head_dim"] + mla_dims["qk_rope_head_dim"])
    else:
        head_dim = get("head_dim", d_model / n_heads)
        if "head_dim" not in cfg and d_model % n_heads:
            raise ValueError(f"{where}: field 'hidden_size' = {d_model:g} is not divisible by "
                             f"num_attention_heads = {n_heads:g}; give 'head_dim'")
    if mtype == "falcon" and not _flag(cfg, "new_decoder_architecture", where, False):
        n_kv = 1.0 if _flag(cfg, "multi_query", where, True) else n_heads
    else:
        n_kv = get("n_kv_heads", n_heads)
    parallel = (mtype in PARALLEL_BLOCK_MODEL_TYPES
                or (mtype == "falcon" and _flag(cfg, "parallel_attn", where, True))
                or (mtype == "gpt_neox" and _flag(cfg, "use_parallel_residual", where, True))
                or _flag(cfg, "parallel_attn", where, False))
    qkv_bias = mtype in QKV_BIAS_MODEL_TYPES or _flag(cfg, "attention_bias", where, False)
    mlp_only = cfg.get("mlp_only_layers")
    if mlp_only:
        raise ValueError(f"{where}: field 'mlp_only_layers' = {mlp_only!r}: dense layers at "
                         "arbitrary positions are not modelled (first_k_dense_replace is)")
    window, global_every = _window(cfg, n_layers, where)
    quant, serving = _quantization(cfg, where)
    m = Model(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv,
              head_dim=head_dim, d_ff=get("d_ff", 4 * d_model), vocab_size=get("vocab_size"),
              activation=_activation(cfg, where), n_experts=get("n_experts", 1),
              top_k=get("top_k", 1), moe_every=get("moe_every", 1),
              capacity_factor=get("capacity_factor", 1.0), tied_embeddings=float(tied),
              attention="mla" if mla else "gqa", **mla_dims,
              sliding_window=window, global_every=global_every, qkv_bias=float(qkv_bias),
              parallel_block=float(parallel), n_shared_experts=get("n_shared_experts", 0),
              moe_d_ff=get("moe_d_ff", 0), first_k_dense=get("first_k_dense", 0),
              n_mtp_layers=get("n_mtp_layers", 0), n_group=get("n_group", 0),
              topk_group=get("topk_group", 0), attention_chunk=get("attention_chunk", 0),
              encoder_params=get("encoder_params", 0),
              name=str(name), quantization=quant,
              serving_precision=serving)
    return validate_model(m, where=where)
