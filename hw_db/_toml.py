"""hw_db's TOML reader: one parse of a file, errors naming the file.

The data files of ``hw_db`` (devices, systems, the sourced ``tech`` tables) are TOML; this
module reads them for the loaders of ``hw_db`` and for :mod:`jaxmodel.tech_tables`. It imports
nothing of the project, so any layer may use it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path


def load_toml(path: Path) -> dict:
    """Parse a TOML file; a syntax error or an unreadable file names the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: malformed TOML: {e}") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror}") from None
