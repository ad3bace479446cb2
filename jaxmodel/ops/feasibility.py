"""Can a device run the operator models at all? Batched check and a concrete validator.

A device is feasible for the operator models exactly when every field they divide by is a
finite positive number and some mapping of the GEMM search (:mod:`jaxmodel.ops.gemm`) fits
its buffers: at least one candidate of the static tile grid, unclipped (the tiles of a
problem larger than every grid tile), has its L1 tile (double buffered) in the local buffer
*and* its L2 working set in the global buffer, at fp16. That predicate is
:func:`jaxmodel.ops.gemm.device_feasible` (built on the search's own candidate mask,
:func:`jaxmodel.ops.gemm.tile_fits`, so it cannot drift from the mapper); it lives beside the
grid because the GEMM itself gates on it, and every vector operator gates on the same
function, so each operator's latency is finite exactly where :func:`ops_feasible` holds (and
its own dimensions are valid). Smaller problems clip their tiles and need less; wider words
need more (such a GEMM returns ``+inf`` by itself; a training step or a serving deployment
checks the buffers at its precision's widest word as well,
:func:`jaxmodel.parallel.plan.system_checks`). Inside a batch an infeasible device gives
``feasible=False`` with a reason code (``numerics.REASONS``) and ``+inf`` latencies.
"""

from __future__ import annotations

import dataclasses
import math
import types

import jax.numpy as jnp
import numpy as np

from jaxmodel import numerics as nx
from jaxmodel.batching import batched
from jaxmodel.ops.gemm import _device_ok, min_global_bytes, min_local_bytes, tile_fits
from jaxmodel.types import register_device_check, validate_device


def _ops_feasible_single(dev):
    """The reasons of :func:`jaxmodel.ops.gemm.device_feasible`, first failing first."""
    return nx.first_reason([(_device_ok(dev), "invalid_device"),
                            (tile_fits(dev), "buffer_too_small")])


@batched
def ops_feasible(dev):
    """``(feasible, reason)`` of a (batched) device for the operator models.

    ``invalid_device``: a rate, count or size is not a finite positive number;
    ``buffer_too_small``: no GEMM tile of the search grid fits the buffers (see
    :func:`tile_fits`). Reason codes index ``jaxmodel.numerics.REASONS``.

    Example:
        >>> ok, why = ops_feasible(hw_db.device("a100_80gb"))     # True, 0 ("ok")
    """
    return _ops_feasible_single(dev)


ops_feasible.single = _ops_feasible_single


def _numpy_device(dev):
    """The numeric fields of a concrete device as numpy arrays (the models' float dtype),
    with a trailing axis of length 1 for the candidates of :func:`tile_fits`."""
    dtype = jnp.result_type(float)
    return types.SimpleNamespace(**{
        f.name: np.asarray(getattr(dev, f.name), dtype=dtype)[..., None]
        for f in dataclasses.fields(dev) if not isinstance(getattr(dev, f.name), str)})


def validate_device_for_ops(dev, where: str = "Device"):
    """Validate a concrete device for the operator models; raise ``ValueError`` if unusable.

    Runs :func:`jaxmodel.validate_device` (field ranges) and then checks that some GEMM tile
    of the search grid fits the buffers (:func:`tile_fits`), naming the binding buffer field
    and its value otherwise: the local buffer when a tile would fit with an unbounded local
    buffer, else the global buffer. Evaluated in numpy (the same rules as the batched
    :func:`ops_feasible`, over the numpy namespace).
    Returns ``dev``.

    Example:
        >>> dev = dataclasses.replace(hw_db.device("a100_80gb"), local_buffer_bytes=1024.0)
        >>> validate_device_for_ops(dev)
        Traceback (most recent call last):
        ...
        ValueError: Device: field 'local_buffer_bytes' = 1024.0 is too small for any GEMM tile ...
    """
    validate_device(dev, where)
    return check_tiles(dev, where)


@register_device_check
def check_tiles(dev, where: str = "Device"):
    """The buffer part of :func:`validate_device_for_ops` on a device whose field ranges are
    valid: raise ``ValueError`` naming the binding buffer field unless some GEMM tile of the
    search grid fits (registered with :func:`jaxmodel.types.register_device_check`, so the
    hw_db loaders apply it). Returns ``dev``."""
    d = _numpy_device(dev)
    with np.errstate(invalid="ignore"):      # the rules in numpy: no dispatch, no compile
        fits = _device_ok(d, np)[..., 0] & tile_fits(d, xp=np)
        if np.all(fits):
            return dev
        local_binding = tile_fits(types.SimpleNamespace(**{**vars(d), "local_buffer_bytes": np.inf}),
                                  xp=np)
    if np.any(~fits & local_binding):
        field = "local_buffer_bytes"
        need = np.max(np.asarray(min_local_bytes(np.asarray(dev.sa_rows, dtype=float),
                                                 np.asarray(dev.sa_cols, dtype=float))))
    else:
        field = "global_buffer_bytes"
        need = float(min_global_bytes())
    raise ValueError(f"{where}: field '{field}' = {getattr(dev, field)!r} is too small "
                     f"for any GEMM tile of the search grid (the smallest tile alone needs "
                     f">= {math.ceil(float(need))} bytes)")
