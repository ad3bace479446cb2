"""Plans in, answers out: the helpers the applications (``jaxmodel`` command, explorer) share.

- :func:`build_parallelism` turns a mapping of degrees and choices into a validated
  :class:`jaxmodel.Parallelism`, ``dp`` defaulting to the devices left by ``tp·pp·cp``;
  :func:`default_tp` fills ``tp`` with the innermost network tier (Megatron-LM keeps tensor
  parallelism inside a node: Narayanan et al., "Efficient Large-Scale Language Model Training
  on GPU Clusters Using Megatron-LM", SC 2021, §3.3 takeaway #1);
- :func:`load_system` reads a system or one device from hw_db;
- :func:`to_jsonable` is the plain-Python view of a result pytree (JSON has no infinities:
  ``"inf"``; reason codes carry their name, :data:`jaxmodel.numerics.REASONS`);
- :func:`explain_infeasible` says in one line why an answer is infeasible and what to change.

Bad input raises ``ValueError`` naming the field and the value. Units: SI (bytes, s);
messages show GiB.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Mapping

import numpy as np

import hw_db
from jaxmodel.numerics import REASONS
from jaxmodel.types import (FA_VERSIONS, RECOMPUTE, SCHEDULES, ZERO3_IMPLS, Parallelism,
                            System, check_value, rule_of, validate_parallelism)

#: Fields of :class:`jaxmodel.Parallelism` a plan mapping may set.
PAR_FIELDS = ("dp", "tp", "pp", "sp", "ep", "micro_batch", "interleave", "schedule",
              "recompute", "zero", "flash_attention", "cp", "zero3_impl")

#: Names of the discrete choices, in code order (:mod:`jaxmodel.types`).
PAR_CHOICES = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "flash_attention": FA_VERSIONS,
               "zero3_impl": ZERO3_IMPLS}

DEFAULT_SYSTEM = "dgx_a100"
DEFAULT_MODEL = "gpt3-13b"


# --------------------------------------------------------------------------------------------
# answers out
# --------------------------------------------------------------------------------------------
def json_float(x) -> float | str | None:
    """A float for JSON: finite as is, ``"inf"`` / ``"-inf"``, NaN as ``None``."""
    v = float(x)
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf" if v < 0 else None)


def reason_label(code) -> str:
    """Name of a concrete reason code (``code_<n>`` outside :data:`REASONS`)."""
    c = int(code)
    return REASONS[c] if 0 <= c < len(REASONS) else f"code_{c}"


def to_jsonable(obj: Any) -> Any:
    """Plain-Python view of a result pytree (dataclasses, NamedTuples, dicts, arrays).

    A dataclass's integer ``reason`` becomes its name, the code kept as ``reason_code``.

    Example:
        >>> to_jsonable({"t": jnp.array([1.0, jnp.inf]), "n": np.int32(3)})
        {'t': [1.0, 'inf'], 'n': 3}
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if "reason" in out and isinstance(out["reason"], int):
            out["reason_code"] = out["reason"]
            out["reason"] = reason_label(out["reason"])
        return out
    if hasattr(obj, "_asdict"):
        return {k: to_jsonable(v) for k, v in obj._asdict().items()}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (str, type(None))):
        return obj
    arr = np.asarray(obj)
    if arr.dtype == bool:
        return arr.tolist()
    if np.issubdtype(arr.dtype, np.integer):
        return arr.tolist()
    if np.issubdtype(arr.dtype, np.number):
        vals = arr.astype(float)
        if vals.ndim == 0:
            return json_float(vals)
        return [to_jsonable(v) for v in vals]
    return str(obj)


#: What to change, per reason (option names as the command line spells them).
HINTS = {
    "out_of_memory": "raise --tp or --pp, use --zero 1..3 or --recompute selective/full, "
                     "lower --micro-batch (train) or --batch (inference), or add --nodes",
    "devices_mismatch": "--dp·--tp·--pp·--cp must equal the system's devices (leave --dp out "
                        "to derive it)",
    "heads_not_divisible": "choose --tp dividing the model's attention heads",
    "layers_not_divisible": "choose --pp (and --interleave) dividing the model's layers",
    "batch_not_divisible": "make --global-batch a multiple of dp·--micro-batch",
    "sequence_not_divisible": "make --seq-len a multiple of --tp, or drop --sp",
    "experts_not_divisible": "choose --ep dividing the experts and dp·tp",
    "topology_mismatch": "the group does not fit the network: change --tp/--pp or --nodes",
    "buffer_too_small": "the device's buffers are too small for any GEMM tile",
    "invalid_parallelism": "degrees must be integers >= 1",
    "invalid_workload": "batch and sequence lengths must be integers >= 1",
}


def explain_infeasible(result: Mapping, options: bool = True) -> str | None:
    """``None`` when a :func:`to_jsonable` result is feasible, else a one-line explanation:
    the reason, the memory needed against ``result["memory_capacity_bytes"]`` when out of
    memory, and what to change (:data:`HINTS`; ``options=False`` names the plan's fields,
    ``tp``, instead of the command's options, ``--tp``).

    Example:
        >>> explain_infeasible({"feasible": False, "reason": "heads_not_divisible"}, False)
        "infeasible: heads_not_divisible; choose tp dividing the model's attention heads"
    """
    if result.get("feasible", True) is not False:
        return None
    why = result.get("reason", "?")
    msg = f"infeasible: {why}"
    if why == "out_of_memory" and isinstance(result.get("memory_bytes"), (int, float)):
        msg += f" (needs {result['memory_bytes'] / 2**30:.1f} GiB per device"
        cap = result.get("memory_capacity_bytes")
        msg += f" of {cap / 2**30:.1f} GiB)" if isinstance(cap, (int, float)) else ")"
    hint = HINTS.get(why, "change the plan")
    if not options:
        hint = hint.replace("--", "").replace("micro-batch", "micro_batch") \
            .replace("global-batch", "global_batch").replace("seq-len", "seq_len")
    return f"{msg}; {hint}"


# --------------------------------------------------------------------------------------------
# plans in
# --------------------------------------------------------------------------------------------
def load_system(name: str | None, nodes: int | None, device: str | None) -> System:
    """A system from a hw_db name/TOML (``nodes`` scales it), or one ``device`` alone; neither:
    :data:`DEFAULT_SYSTEM`."""
    if name and device:
        raise ValueError(f"give either a system ({name!r}) or a device ({device!r}), not both")
    if nodes is not None and (isinstance(nodes, bool) or not isinstance(nodes, int)):
        raise ValueError(f"nodes must be an integer >= 1, got {nodes!r}")
    if name:
        return hw_db.system(name, nodes=nodes)
    if device:
        if nodes not in (None, 1):
            raise ValueError(f"nodes={nodes} needs a system, not a single device")
        return System(device=hw_db.device(device), levels=(), name=f"1x{device}")
    return hw_db.system(DEFAULT_SYSTEM if DEFAULT_SYSTEM in hw_db.names("system")
                        else hw_db.names("system")[0], nodes=nodes)


def build_parallelism(values: Mapping, n_devices: float | None = None) -> Parallelism:
    """A validated :class:`jaxmodel.Parallelism` from a mapping of :data:`PAR_FIELDS`;
    ``dp`` defaults to the devices left, ``n_devices / (tp·pp·cp)``.

    Example:
        >>> build_parallelism({"tp": 8, "pp": 2}, 64).dp
        4.0
    """
    if not isinstance(values, Mapping):
        raise ValueError(f"parallelism must be a table of {list(PAR_FIELDS)}, got {values!r}")
    for k in values:
        if k not in PAR_FIELDS:
            close = difflib.get_close_matches(str(k), PAR_FIELDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"parallelism: unknown field '{k}'{hint}; known: "
                             f"{list(PAR_FIELDS)}")
    kw = {k: v for k, v in values.items() if v is not None}
    for k in ("tp", "pp", "cp"):
        if k in kw:
            check_value("parallelism", k, kw[k], rule_of(Parallelism, k))
    if "dp" not in kw and n_devices is not None:
        tp, pp, cp = float(kw.get("tp", 1)), float(kw.get("pp", 1)), float(kw.get("cp", 1))
        dp = float(n_devices) / (tp * pp * cp)
        if dp < 1 or dp != round(dp):
            raise ValueError(f"parallelism: tp·pp·cp = {tp:g}·{pp:g}·{cp:g} does not divide "
                             f"the {float(n_devices):g} devices (dp would be {dp:g}); change "
                             "tp/pp/cp or the system's nodes")
        kw["dp"] = dp
    return validate_parallelism(Parallelism(**kw), "parallelism")


def default_tp(system, model, par_spec: Mapping) -> dict:
    """``par_spec`` with ``tp`` filled when not given: the innermost network tier when it
    divides the attention heads and the KV heads (or is a multiple of them) and, with ``dp``
    given, ``dp·tier·pp·cp`` is the system's devices; otherwise left out (``tp = 1``).

    Example:
        >>> default_tp(hw_db.system("dgx_a100"), hw_db.model("gpt3-13b"), {})
        {'tp': 8.0}
    """
    spec = dict(par_spec)
    if "tp" not in spec and system.levels:
        node = float(system.levels[0].size)
        h, kv = float(model.n_heads), float(model.n_kv_heads)
        pp = float(spec.get("pp", 1)) * float(spec.get("cp", 1))
        if node > 1 and h % node == 0 and (kv % node == 0 or node % kv == 0) and (
                "dp" not in spec or float(spec["dp"]) * node * pp == float(system.n_devices)):
            spec["tp"] = node
    return spec
