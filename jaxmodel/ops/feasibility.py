"""Can a device run the operator models at all? Batched check and a concrete validator.

The GEMM search (:mod:`jaxmodel.ops.gemm`) needs at least its smallest tiles to fit: a
``32×32`` output L1 tile with ``tk ≥ 1``, double buffered, in the local buffer, and the
smallest L2 tile of the grid in the global buffer (fp16). Inside a batch an infeasible device
gives ``feasible=False`` with a reason code (``numerics.REASONS``) and ``+inf`` latencies.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.gemm import MIN_L1_TILE, MIN_L2_TILE, _device_ok
from jaxmodel.types import validate_device

_WORD = 2.0  # fp16: the precision the buffer check is made for


def _min_local_bytes():
    t = MIN_L1_TILE
    return 2.0 * (t * t + 2.0 * t) * _WORD          # double-buffered 32×32×1 tile


def _min_global_bytes():
    tm, tn, tk = MIN_L2_TILE
    return (tm * tn + tn * tk + tm * tk) * _WORD


def _ops_feasible_single(dev):
    valid = _device_ok(dev)
    fits = ((dev.local_buffer_bytes >= _min_local_bytes())
            & (dev.global_buffer_bytes >= _min_global_bytes()))
    return nx.first_reason([(valid, "invalid_device"), (fits, "buffer_too_small")])


@batched
def ops_feasible(dev):
    """``(feasible, reason)`` of a (batched) device for the operator models.

    ``invalid_device``: a rate, count or size is not a finite positive number;
    ``buffer_too_small``: the smallest GEMM tile of the search grid does not fit (local buffer
    below 4.2 KB or global buffer below 147 KB at fp16).

    Example:
        >>> ok, why = ops_feasible(hw_db.device("a100_80gb"))     # True, 0 ("ok")
    """
    return _ops_feasible_single(dev)


ops_feasible.single = _ops_feasible_single


def validate_device_for_ops(dev, where: str = "Device"):
    """Validate a concrete device for the operator models; raise ``ValueError`` if unusable.

    Runs :func:`jaxmodel.validate_device` (field ranges) and then checks that the smallest GEMM
    tile of the search grid fits the buffers, naming the field and the value otherwise.
    Returns ``dev``.
    """
    validate_device(dev, where)
    for field, need in (("local_buffer_bytes", _min_local_bytes()),
                        ("global_buffer_bytes", _min_global_bytes())):
        v = np.asarray(getattr(dev, field), dtype=float)
        if not np.all(v >= need):
            raise ValueError(f"{where}: field '{field}' = {getattr(dev, field)!r} is too small "
                             f"for any GEMM tile (needs >= {math.ceil(need)} bytes)")
    return dev
