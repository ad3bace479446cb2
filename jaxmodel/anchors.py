"""Where the measurements the package validates against live: ``validation/anchors``.

The repository carries its anchor sets (public measurements and reference outputs, each folder
with its README, provenance and licence) under ``validation/anchors/<folder>/``; this is their
only location. Tests (the ``anchors`` fixture), the experiments (``experiments/common.py``) and
the package modules that read anchors (``jaxmodel.cost.chiplet``) all find them here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ANCHORS", "anchor_dir"]

#: ``validation/anchors`` of the repository holding this package (a source checkout).
ANCHORS = Path(__file__).resolve().parent.parent / "validation" / "anchors"


def anchor_dir(folder: str | None = None) -> Path:
    """``validation/anchors`` (or its sub-folder ``folder``), raising ``FileNotFoundError``
    naming the path when it is absent (an installed wheel without the repository)."""
    path = ANCHORS if folder is None else ANCHORS / folder
    if not path.exists():
        raise FileNotFoundError(f"anchor folder {str(path)!r} not found: the measurements live in "
                                "the repository's validation/anchors")
    return path
