"""Link model: packet overhead and point-to-point delay on one network tier.

Two sources are combined:

- LLMCompass §III-B2, eq. 1–2: a message of ``n`` bytes travels as packets of at
  most ``MaxPayload`` bytes, each carrying a header, so the bytes on the wire are
  ``n̂ = n + ceil(n / MaxPayload) · header`` (rounded up to whole flits here), and
  ``T = L + O + n̂ / B``.
- Guo et al. §III-D, eq. 4: ``D_total = d / b + l · h + D_r`` — serialisation over the link
  bandwidth ``b``, ``h`` hops of latency ``l`` and an optional switching delay ``D_r``.

Every function works on one configuration (scalar leaves) and is safe under ``jax.grad``:
divisions go through :func:`jaxmodel.numerics.safe_div`, roundings through
:func:`jaxmodel.numerics.smooth_ceil_div` (exact value, gradient of the ratio).

Example:
    >>> lvl = jm.NetLevel(size=4, topology="fully_connected", bw_per_device=300e9,
    ...                   link_latency=8.92e-6, header_bytes=16, max_payload_bytes=256)
    >>> wire_bytes(lvl, 1024.0)        # 1024 + 4 · 16 = 1088 bytes
    Array(1088.0, dtype=......)
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxmodel.numerics import safe_div, smooth_ceil_div
from jaxmodel.types import NetLevel

__all__ = ["wire_bytes", "overhead_factor", "p2p_delay", "effective_bw"]


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


def effective_bw(level: NetLevel):
    """Achievable off-device bandwidth of one device at this tier, bytes/s per direction.

    ``bw_per_device · efficiency``; ``efficiency`` is a calibration constant stored in hw_db.
    """
    return level.bw_per_device * level.efficiency


def p2p_delay(level: NetLevel, nbytes, bw, hops=1.0, switches=0.0):
    """Point-to-point delay of one message, s (Guo et al. eq. 4 with LLMCompass eq. 1–2).

    ``D = n̂ / b + l · h + D_r · switches``.

    Args:
        level: the tier (latency, switch latency and packet format are read from it).
        nbytes: message size, bytes.
        bw: bandwidth available to the message, bytes/s.
        hops: links traversed.
        switches: switch traversals (each adds ``switch_latency``).
    """
    return (safe_div(wire_bytes(level, nbytes), bw, fill=jnp.inf)
            + level.link_latency * hops + level.switch_latency * switches)
