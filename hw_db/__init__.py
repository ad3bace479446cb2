"""The built-in hardware and model database, and its loaders.

Layout::

    hw_db/devices/<name>.toml   one accelerator: ``[device]`` table, every value ``{value, source}``
    hw_db/systems/<name>.toml   a device name + one ``[[levels]]`` table per network tier
    hw_db/models/<name>.json    a Hugging Face ``config.json``
    hw_db/tech/                 process nodes, memory, packaging and cost data

Loaders validate concrete values and raise ``ValueError`` naming the file, the field and the
value. Values are converted to SI units here and nowhere else.

Example:
    >>> import hw_db
    >>> dev = hw_db.device("a100_80gb")
    >>> sys = hw_db.system("dgx_a100", nodes=2)
    >>> m = hw_db.model("gpt3-175b")
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any, Mapping

from jaxmodel.types import Device, Model, NetLevel, System, validate_model, validate_system

ROOT = Path(__file__).resolve().parent
_KINDS = {"device": ("devices", ".toml"), "system": ("systems", ".toml"),
          "model": ("models", ".json")}

__all__ = ["device", "system", "model", "names", "load_toml", "ROOT"]


def names(kind: str = "device") -> list[str]:
    """Names available for ``kind`` in ``{"device", "system", "model"}``, sorted."""
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not one of {sorted(_KINDS)}")
    folder, ext = _KINDS[kind]
    return sorted(p.stem for p in (ROOT / folder).glob(f"*{ext}"))


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    folder, ext = _KINDS[kind]
    p = Path(name_or_path)
    if p.suffix == ext and p.exists():
        return p
    cand = ROOT / folder / f"{name_or_path}{ext}"
    if cand.exists():
        return cand
    raise ValueError(f"unknown {kind} {str(name_or_path)!r}; available: {names(kind)} "
                     f"(or a path to a {ext} file)")


def load_toml(path: Path) -> dict:
    """Parse a TOML file; a syntax error names the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: malformed TOML: {e}") from None


def _number(path: Path, field: str, entry: Any) -> float:
    """Extract the value of a ``{value, source}`` entry, checking type and source note."""
    if not isinstance(entry, Mapping) or "value" not in entry:
        raise ValueError(f"{path}: field '{field}' must be a table {{value = ..., source = ...}},"
                         f" got {entry!r}")
    if not str(entry.get("source", "")).strip():
        raise ValueError(f"{path}: field '{field}' has no 'source' note")
    v = entry["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{path}: field '{field}' must be a number, got {v!r}")
    if not math.isfinite(v):
        raise ValueError(f"{path}: field '{field}' must be finite, got {v!r}")
    return float(v)


def _device_from_table(path: Path, table: Mapping, name: str) -> Device:
    fields = {f.name: f for f in dataclasses.fields(Device) if f.name != "name"}
    kwargs = {}
    for key, entry in table.items():
        if key not in fields:
            raise ValueError(f"{path}: unknown device field '{key}'; known: {sorted(fields)}")
        kwargs[key] = _number(path, key, entry)
    missing = [k for k, f in fields.items()
               if f.default is dataclasses.MISSING and k not in kwargs]
    if missing:
        raise ValueError(f"{path}: missing device field(s) {missing}")
    dev = Device(name=name, **kwargs)
    return _validate(dev, where=f"{path}")


def _validate(dev: Device, where: str) -> Device:
    """Field ranges (types.validate_device) and buffers large enough for the smallest tile."""
    from jaxmodel.ops import validate_device_for_ops  # late: jaxmodel imports this package's types
    return validate_device_for_ops(dev, where=where)


def device(name_or_path: str | Path = "a100_80gb", **overrides) -> Device:
    """Load a device by hw_db name or TOML path; ``overrides`` replace fields (SI units).

    Raises:
        ValueError: unknown name, malformed file, missing/unknown field, or a value out of
            range — the message names the file, the field and the value.
    """
    path = _resolve("device", name_or_path)
    data = load_toml(path)
    if "device" not in data:
        raise ValueError(f"{path}: missing [device] table")
    dev = _device_from_table(path, data["device"], data.get("name", path.stem))
    if overrides:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(Device)}
        if unknown:
            raise ValueError(f"device override: unknown field(s) {sorted(unknown)}")
        dev = _validate(dataclasses.replace(dev, **overrides), where=f"{path} (overrides)")
    return dev


_LEVEL_FIELDS = {f.name: f for f in dataclasses.fields(NetLevel)}


def _level_from_table(path: Path, i: int, table: Mapping, nodes: int | None) -> NetLevel:
    kwargs = {}
    where = f"levels[{i}]"
    scales = False
    for key, entry in table.items():
        if key in ("name", "description"):
            continue
        if key == "scales_with_nodes":
            scales = bool(entry)
            continue
        if key not in _LEVEL_FIELDS:
            raise ValueError(f"{path}: unknown field '{where}.{key}'; known: "
                             f"{sorted(_LEVEL_FIELDS)} and 'scales_with_nodes'")
        if key == "topology":
            val = entry.get("value") if isinstance(entry, Mapping) else entry
            try:
                kwargs[key] = NetLevel(size=1, topology=val, bw_per_device=1,
                                       link_latency=0).topology
            except ValueError as e:
                raise ValueError(f"{path}: field '{where}.topology': {e}") from None
            continue
        kwargs[key] = _number(path, f"{where}.{key}", entry)
    missing = [k for k, f in _LEVEL_FIELDS.items()
               if f.default is dataclasses.MISSING and k not in kwargs]
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
    """
    path = _resolve("system", name_or_path)
    data = load_toml(path)
    if "device" not in data:
        raise ValueError(f"{path}: missing 'device' (a hw_db device name)")
    dev = device(data["device"], **dict(device_overrides or {}))
    levels = []
    scalable = False
    for i, tbl in enumerate(data.get("levels", [])):
        lvl, scales = _level_from_table(path, i, tbl, nodes)
        scalable |= scales
        levels.append(lvl)
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"system {path.stem}: nodes must be an integer >= 1, got {nodes!r}")
        if not scalable and nodes != 1:
            raise ValueError(f"{path}: system has no level marked 'scales_with_nodes', "
                             f"so nodes={nodes} cannot be applied")
    sys_ = System(device=dev, levels=tuple(levels), name=data.get("name", path.stem))
    return validate_system(sys_, where=str(path))


# HF config keys → Model fields (first key found wins).
_HF_KEYS = {
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_heads": ("num_attention_heads", "n_head"),
    "n_kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "d_ff": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "vocab_size": ("vocab_size",),
    "n_experts": ("num_local_experts", "num_experts"),
    "top_k": ("num_experts_per_tok",),
    "moe_every": ("decoder_sparse_step",),
    "capacity_factor": ("capacity_factor",),
}


def model(name_or_config: str | Path | Mapping = "gpt3-175b") -> Model:
    """Load a model by hw_db name, from a HF ``config.json`` path, or from its dict.

    Reads ``num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
    intermediate_size, vocab_size, hidden_act, num_local_experts, num_experts_per_tok,
    decoder_sparse_step`` and GPT-2's ``n_layer, n_embd, n_head``. Missing
    ``intermediate_size`` defaults to ``4·hidden`` and missing KV heads to the query heads.
    """
    if isinstance(name_or_config, Mapping):
        cfg, where, name = dict(name_or_config), "model config", name_or_config.get(
            "_name_or_path", name_or_config.get("name", "custom"))
    else:
        path = _resolve("model", name_or_config)
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON: {e}") from None
        where, name = str(path), path.stem
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{where}: expected a JSON object, got {type(cfg).__name__}")

    def get(field, default=None):
        for key in _HF_KEYS[field]:
            if cfg.get(key) is not None:
                v = cfg[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                    raise ValueError(f"{where}: field '{key}' must be a positive number, "
                                     f"got {v!r}")
                return float(v)
        if default is None:
            raise ValueError(f"{where}: missing field '{_HF_KEYS[field][0]}'")
        return float(default)

    d_model = get("d_model")
    n_heads = get("n_heads")
    act = str(cfg.get("hidden_act", cfg.get("activation_function", "gelu")))
    try:
        m = Model(
            n_layers=get("n_layers"), d_model=d_model, n_heads=n_heads,
            n_kv_heads=get("n_kv_heads", n_heads), head_dim=get("head_dim", d_model / n_heads),
            d_ff=get("d_ff", 4 * d_model), vocab_size=get("vocab_size"),
            activation=act, n_experts=get("n_experts", 1), top_k=get("top_k", 1),
            moe_every=get("moe_every", 1), capacity_factor=get("capacity_factor", 1.0),
            tied_embeddings=float(bool(cfg.get("tie_word_embeddings", False))), name=str(name))
    except ValueError as e:
        raise ValueError(f"{where}: field 'hidden_act': {e}") from None
    return validate_model(m, where=where)
