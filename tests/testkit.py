"""Helpers shared by several test modules (``tests/`` is on ``sys.path``: pytest puts the
directory of the top-level ``conftest.py`` there).

- :func:`roofline_gemm`: a GEMM timer for the public ``gemm`` hook of the layer and
  inference models (roofline + per-kernel overhead: fast compiles, no tile search);
- :func:`small_model`: a :class:`jaxmodel.Model` from a dict of defaults and overrides.
"""

from __future__ import annotations

import jaxmodel as jm


def roofline_gemm(dev, m, n, k, batch, dtype_bytes):
    """Roofline GEMM time plus the device's per-kernel overhead, s."""
    return jm.gemm_roofline.single(dev, m, n, k, batch, dtype_bytes) + dev.matmul_overhead_s


def small_model(defaults: dict, **overrides) -> jm.Model:
    """``jm.Model`` from ``defaults`` updated with ``overrides``; numbers become floats,
    names (``activation``) stay strings."""
    fields = {**defaults, **overrides}
    return jm.Model(**{k: (v if isinstance(v, str) else float(v)) for k, v in fields.items()})
