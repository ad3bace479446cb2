"""The sourced data tables of ``hw_db/tech`` (``{value, source}`` entries), read by path.

Every TOML value is ``{value, source}``; :func:`read` strips the source after checking it is
present (a missing source or a non-finite number raises ``ValueError`` naming the file and
key). Any layer may read these files: the files are parsed by hw_db's TOML reader
(:mod:`hw_db._toml`, which imports nothing of the project), the tables located by path.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from hw_db._toml import load_toml

TECH = Path(__file__).resolve().parents[1] / "hw_db" / "tech"


def _strip(path: Path, key: str, entry: Any):
    if isinstance(entry, dict) and "value" in entry:
        if not str(entry.get("source", "")).strip():
            raise ValueError(f"{path}: field '{key}' has no 'source' note")
        v = entry["value"]
        vals = v if isinstance(v, list) else [v]
        for x in vals:
            if isinstance(x, str):
                continue
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise ValueError(f"{path}: field '{key}' must be a finite number, got {x!r}")
        return v
    if isinstance(entry, dict):
        return {k: _strip(path, f"{key}.{k}", v) for k, v in entry.items()}
    raise ValueError(f"{path}: field '{key}' must be a table {{value = ..., source = ...}}, "
                     f"got {entry!r}")


def read(path: Path) -> dict:
    """Values of the TOML file ``path`` with sources stripped (nested dicts)."""
    return {k: _strip(path, k, v) for k, v in load_toml(path).items()}


@functools.lru_cache(maxsize=None)
def table(name: str) -> dict:
    """Values of ``hw_db/tech/<name>.toml`` with sources stripped (nested dicts)."""
    path = TECH / f"{name}.toml"
    if not path.exists():
        raise ValueError(f"unknown tech table {name!r}: {path} not found")
    return read(path)
