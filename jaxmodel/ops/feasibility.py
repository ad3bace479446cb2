"""Can a device run the operator models at all? Batched check and a concrete validator.

The GEMM search (:mod:`jaxmodel.ops.gemm`) needs its smallest tiles to fit: the smallest L1
tile of the grid (``MIN_L1_ARRAYS`` systolic arrays on a side, ``tk ≥ 1``, double buffered, fp16)
in the local buffer, and the smallest L2 working set of the grid (fp16) in the global buffer.
Smaller problems clip their tiles and need less. Inside a batch an infeasible device gives
``feasible=False`` with a reason code (``numerics.REASONS``) and ``+inf`` latencies.
"""

from __future__ import annotations

import math

import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.gemm import _device_fits, _device_ok, min_global_bytes, min_local_bytes
from jaxmodel.types import validate_device


def _ops_feasible_single(dev):
    return nx.first_reason([(_device_ok(dev), "invalid_device"),
                            (_device_fits(dev), "buffer_too_small")])


@batched
def ops_feasible(dev):
    """``(feasible, reason)`` of a (batched) device for the operator models.

    ``invalid_device``: a rate, count or size is not a finite positive number;
    ``buffer_too_small``: the smallest GEMM tile of the search grid does not fit (see
    :func:`min_local_bytes`, :func:`min_global_bytes`). Reason codes index
    ``jaxmodel.numerics.REASONS``.

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

    Example:
        >>> dev = dataclasses.replace(hw_db.device("a100_80gb"), local_buffer_bytes=1024.0)
        >>> validate_device_for_ops(dev)
        Traceback (most recent call last):
        ...
        ValueError: Device: field 'local_buffer_bytes' = 1024.0 is too small for any GEMM tile ...
    """
    validate_device(dev, where)
    need_local = np.asarray(min_local_bytes(np.asarray(dev.sa_rows, dtype=float),
                                            np.asarray(dev.sa_cols, dtype=float)))
    for field, need in (("local_buffer_bytes", need_local),
                        ("global_buffer_bytes", np.asarray(min_global_bytes()))):
        v = np.asarray(getattr(dev, field), dtype=float)
        if not np.all(v >= need):
            raise ValueError(f"{where}: field '{field}' = {getattr(dev, field)!r} is too small "
                             f"for any GEMM tile (needs >= {math.ceil(float(np.max(need)))} "
                             "bytes)")
    return dev
