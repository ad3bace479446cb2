"""Cartesian design grids as index arithmetic, and knob names for config pytrees.

A sweep spec maps knob names to value lists, e.g.
``{"device.mem_bw": [1e12, 2e12], "par.tp": [1, 2, 4, 8]}``. The grid is their cartesian
product in ``itertools.product`` order (the last knob varies fastest), but it is never
materialised: design point ``i`` has knob ``j`` at value index ``(i // stride_j) % size_j``
with ``stride_j = prod(size_{j+1:})``. Inside a jitted chunk this is two integer operations and
one gather per knob, so a 10⁸-point grid costs no host memory.

Knob names address leaves of the function's arguments: the first component is the argument's
parameter name (``dev``, ``system``, ``m``), an alias of its type (``device``, ``system``,
``model``, ``par``) or ``argN``; the rest are dataclass fields and tuple indices
(``system.levels[1].bw_per_device`` or ``system.levels.1.bw_per_device``). The fields of a
``System``'s device are also reachable as ``device.<field>`` when no argument claims that name.

Example:
    >>> g = Grid.from_spec({"a": [1, 2], "b": [10, 20, 30]})
    >>> g.size, g.values_at(np.arange(6))["b"].tolist()
    (6, [10.0, 20.0, 30.0, 10.0, 20.0, 30.0])
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel.types import (ACTIVATIONS, RECOMPUTE, SCHEDULES, TOPOLOGIES, Device, Model,
                            NetLevel, Parallelism, System, code_of)

# Fields that hold codes: a sweep spec may list their names ("gpipe", "ring", ...).
CODE_FIELDS = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "topology": TOPOLOGIES,
               "activation": ACTIVATIONS}

_TYPE_ALIASES = {Device: ("device", "dev"), System: ("system", "sys"), Model: ("model",),
                 Parallelism: ("par", "parallelism"), NetLevel: ("level",)}

_INDEX = re.compile(r"\[(\d+)\]")


def parse_key(key: str) -> tuple:
    """Split a knob name into components: ``"s.levels[1].bw"`` → ``("s", "levels", 1, "bw")``."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"sweep spec: knob name must be a non-empty string, got {key!r}")
    parts = _INDEX.sub(r".\1", key.strip()).split(".")
    if any(p == "" for p in parts):
        raise ValueError(f"sweep spec: malformed knob name {key!r}")
    return tuple(int(p) if p.isdigit() else p for p in parts)


def canonical(parts: Sequence) -> str:
    """Canonical knob name: components joined by dots, tuple indices in brackets."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def expand_values(key: str, values: Any) -> np.ndarray:
    """Turn a spec entry into a 1-D value array.

    Accepted: a list/tuple/array of numbers (or of names for code fields such as
    ``schedule``), a scalar, or a table ``{"linspace": [lo, hi, n]}``,
    ``{"logspace": [lo, hi, n]}`` (geometric, endpoints in real units) or
    ``{"range": [start, stop, step]}`` (stop exclusive).

    Raises:
        ValueError: empty range, non-numeric or non-finite values; the message names ``key``.
    """
    field = parse_key(key)[-1]
    if isinstance(values, Mapping):
        if len(values) != 1 or next(iter(values)) not in ("linspace", "logspace", "range"):
            raise ValueError(f"sweep spec {key!r}: a table must be one of "
                             f"{{linspace|logspace|range = [a, b, n]}}, got {dict(values)!r}")
        kind, arg = next(iter(values.items()))
        try:
            a, b, n = (float(x) for x in arg)
        except (TypeError, ValueError):
            raise ValueError(f"sweep spec {key!r}: {kind} needs three numbers, "
                             f"got {arg!r}") from None
        if kind == "range":
            if n == 0:
                raise ValueError(f"sweep spec {key!r}: range step must be non-zero")
            arr = np.arange(a, b, n)
        else:
            if n < 1 or n != int(n):
                raise ValueError(f"sweep spec {key!r}: {kind} count must be an integer >= 1,"
                                 f" got {n!r}")
            if kind == "logspace" and (a <= 0 or b <= 0):
                raise ValueError(f"sweep spec {key!r}: logspace endpoints must be > 0, "
                                 f"got {a!r}, {b!r}")
            arr = (np.linspace(a, b, int(n)) if kind == "linspace"
                   else np.geomspace(a, b, int(n)))
    else:
        seq = list(values) if isinstance(values, (list, tuple, np.ndarray, range)) else [values]
        if isinstance(field, str) and field in CODE_FIELDS:
            try:
                seq = [code_of(v, CODE_FIELDS[field], key) for v in seq]
            except ValueError as e:
                raise ValueError(f"sweep spec {key!r}: {e}") from None
        try:
            arr = np.asarray(seq, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"sweep spec {key!r}: values must be numbers, got {values!r}") \
                from None
    if arr.size == 0:
        raise ValueError(f"sweep spec {key!r}: empty range of values")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"sweep spec {key!r}: values must be finite, got {arr.tolist()!r}")
    return arr


@dataclasses.dataclass(frozen=True)
class Grid:
    """A cartesian grid over named knobs, addressed by flat index (row-major).

    Attributes:
        keys: knob names in spec order (the last one varies fastest).
        values: one 1-D float array per knob.
        labels: what the result table shows per knob (the spec's own values, e.g. names).
    """

    keys: tuple
    values: tuple
    labels: tuple

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> "Grid":
        """Build a grid from ``{knob: values}`` (see :func:`expand_values`)."""
        if spec is None:
            return cls((), (), ())
        if not isinstance(spec, Mapping):
            raise ValueError(f"sweep spec must be a mapping knob -> values, got "
                             f"{type(spec).__name__}")
        keys, vals, labels = [], [], []
        for key, v in spec.items():
            arr = expand_values(key, v)
            keys.append(key)
            vals.append(arr)
            raw = (list(v) if isinstance(v, (list, tuple, np.ndarray, range)) else
                   None if isinstance(v, Mapping) else [v])
            labels.append(np.asarray(raw) if raw is not None and any(
                isinstance(x, str) for x in raw) else arr)
        return cls(tuple(keys), tuple(vals), tuple(labels))

    @property
    def sizes(self) -> tuple:
        return tuple(len(v) for v in self.values)

    @property
    def strides(self) -> tuple:
        """Flat-index stride of each knob (row-major, last knob fastest)."""
        out, s = [], 1
        for n in reversed(self.sizes):
            out.append(s)
            s *= n
        return tuple(reversed(out))

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def indices(self, flat) -> list:
        """Per-knob value indices of flat design-point indices (numpy or jax integers)."""
        return [(flat // s) % n for s, n in zip(self.strides, self.sizes)]

    def values_at(self, flat: np.ndarray, labels: bool = False) -> dict:
        """Knob values (or labels) of flat indices, on the host: ``{key: array}``."""
        src = self.labels if labels else self.values
        return {k: v[i] for k, v, i in zip(self.keys, src, self.indices(np.asarray(flat)))}


# --------------------------------------------------------------------------------------------
# Knob names → leaves of the argument pytree
# --------------------------------------------------------------------------------------------
def arg_names(fn: Callable, n_args: int) -> list[str]:
    """Parameter names of the first ``n_args`` positional arguments of ``fn`` (or ``argN``)."""
    target = getattr(fn, "single", fn)
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n_args):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                   params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            names.append(f"arg{i}")
    return names


def _components(path) -> tuple:
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(k.idx)
        elif isinstance(k, jax.tree_util.DictKey):
            out.append(str(k.key))
        else:  # FlattenedIndexKey and friends
            out.append(getattr(k, "key", str(k)))
    return tuple(out)


def leaf_names(fn: Callable, args: tuple, kwargs: Mapping) -> tuple[dict, list[str]]:
    """Map knob names to positions in ``tree_leaves((args, kwargs))``.

    Returns:
        ``(lookup, display)``: ``lookup`` maps every accepted canonical name (parameter names,
        type aliases, ``argN``) to a leaf position, ``None`` marking an ambiguous alias;
        ``display`` is the preferred name of each leaf (for result columns).
    """
    paths, _ = jax.tree_util.tree_flatten_with_path((tuple(args), dict(kwargs)))
    names = arg_names(fn, len(args))
    lookup: dict = {}
    display: list[str] = []
    primary: dict = {}
    aliases: dict = {}
    for pos, (path, _) in enumerate(paths):
        comps = _components(path)
        if comps[0] == 0:  # positional
            i, rest = comps[1], comps[2:]
            obj = args[i]
            heads = [names[i], f"arg{i}"]
            alias_heads = list(_TYPE_ALIASES.get(type(obj), ()))
            if isinstance(obj, System) and rest and rest[0] == "device":
                for a in _TYPE_ALIASES[Device]:
                    aliases.setdefault(canonical((a,) + rest[1:]), set()).add(pos)
        else:
            heads, rest, alias_heads = [comps[1]], comps[2:], []
        for h in heads:
            primary[canonical((h,) + rest)] = pos
        for h in alias_heads:
            aliases.setdefault(canonical((h,) + rest), set()).add(pos)
        display.append(canonical((heads[0],) + rest))
    for name, poss in aliases.items():
        if name not in primary:
            lookup[name] = next(iter(poss)) if len(poss) == 1 else None
    lookup.update(primary)
    return lookup, display


def knob_positions(grid: Grid, lookup: Mapping, static_positions: set) -> tuple:
    """Leaf position of each grid knob; ``ValueError`` naming an unknown/ambiguous knob."""
    out = []
    known = sorted(k for k, v in lookup.items() if v is not None)
    for key in grid.keys:
        name = canonical(parse_key(key))
        if name not in lookup:
            close = [k for k in known if k.split(".")[-1] == name.split(".")[-1]][:6]
            hint = f"; did you mean one of {close}?" if close else ""
            raise ValueError(f"sweep spec: unknown knob {key!r}{hint}")
        pos = lookup[name]
        if pos is None:
            raise ValueError(f"sweep spec: knob {key!r} is ambiguous (several arguments have "
                             f"it); prefix it with the parameter name")
        if pos in static_positions:
            raise ValueError(f"sweep spec: knob {key!r} is not numeric and cannot be swept")
        if pos in out:
            raise ValueError(f"sweep spec: knob {key!r} names a leaf already swept")
        out.append(pos)
    return tuple(out)


def gather(values: jax.Array, flat_index: jax.Array, stride: int, size: int) -> jax.Array:
    """Value of one knob at a flat design-point index, inside a jitted chunk."""
    return values[(flat_index // stride) % size]


def as_device_values(grid: Grid, dtype=None) -> tuple:
    """Grid value arrays as jax arrays of the default float dtype."""
    dtype = dtype or jnp.result_type(float)
    return tuple(jnp.asarray(v, dtype=dtype) for v in grid.values)
