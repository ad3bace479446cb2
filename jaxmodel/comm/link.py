"""Link model: packet overhead on one network tier.

LLMCompass §III-B2, eq. 1–2: a message of ``n`` bytes travels as packets of at most
``MaxPayload`` bytes, each carrying a header, so the bytes on the wire are
``n̂ = n + ceil(n / MaxPayload) · header`` (rounded up to whole flits here). The delay
``D = n̂ / b + l · h + D_r`` (Guo et al. eq. 4) is assembled per algorithm in
:mod:`jaxmodel.comm.collectives`.

Every function works on one configuration (scalar leaves) and is safe under ``jax.grad``:
roundings go through :func:`jaxmodel.numerics.smooth_ceil_div` (exact value, gradient of the
ratio).

Example:
    >>> lvl = jm.NetLevel(size=4, topology="fully_connected", bw_per_device=300e9,
    ...                   link_latency=8.92e-6, header_bytes=16, max_payload_bytes=256)
    >>> wire_bytes(lvl, 1024.0)        # 1024 + 4 · 16 = 1088 bytes
    Array(1088.0, dtype=......)
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.numerics import smooth_ceil_div
from jaxmodel.types import NetLevel

__all__ = ["wire_bytes", "overhead_factor"]


def wire_bytes(level: NetLevel, n):
    """Bytes on the wire for one ``n``-byte message (LLMCompass eq. 2), bytes.

    ``n̂ = n + ceil(n / max_payload) · header``, rounded up to a whole number of flits.
    ``n = 0`` gives 0.
    """
    n = jnp.maximum(n, 0.0)
    packets = smooth_ceil_div(n, level.max_payload_bytes)
    raw = n + packets * level.header_bytes
    return smooth_ceil_div(raw, level.flit_bytes) * level.flit_bytes


def overhead_factor(level: NetLevel, msg):
    """``wire_bytes(msg) / msg`` (≥ 1): packetisation overhead of messages of ``msg`` bytes."""
    ok = msg > 0
    safe_msg = jnp.where(ok, msg, 1.0)
    return jnp.where(ok, wire_bytes(level, safe_msg) / safe_msg, 1.0)
