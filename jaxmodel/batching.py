"""The API edge: evaluate a single-configuration function on batched configurations.

Convention 1 of docs/architecture.md: every formula is written for one configuration with scalar leaves;
batching happens only here. :func:`batched` turns such a function into one that accepts config
pytrees (and numeric arguments) whose leaves carry any common, broadcastable batch shape, runs
one jitted ``vmap`` (chunked with ``lax.map(batch_size=...)`` for large batches) and returns
outputs with that batch shape in front.

Python strings, booleans, ``None`` and types among the arguments are static (they select code
paths and are part of the compilation cache key); every other leaf is a float array.

Example:
    >>> @batched
    ... def peak(dev):
    ...     return dev.peak_matrix_flops
    >>> dev = hw_db.device("a100_80gb")
    >>> peak(dataclasses.replace(dev, core_count=jnp.array([64., 108.]))).shape
    (2,)
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_CHUNK = 4096


def _is_static(leaf: Any) -> bool:
    return isinstance(leaf, (str, bool, type(None), type)) or callable(leaf) and not hasattr(
        leaf, "shape")


def _float_dtype():
    return jnp.result_type(float)


@functools.partial(jax.jit, static_argnames=("fn", "treedef", "static", "positions", "chunk"))
def _run(dynamic, *, fn, treedef, static, positions, chunk):
    shape = jnp.broadcast_shapes(*[jnp.shape(x) for x in dynamic]) if dynamic else ()
    size = math.prod(shape)
    # Scalar leaves stay unmapped (closed over): broadcasting them to the batch would make
    # every candidate evaluation re-read a per-point copy of a shared constant.
    mapped = [i for i, x in enumerate(dynamic) if jnp.ndim(x) > 0]

    def rebuild(batched_vals):
        dyn = list(dynamic)
        for i, val in zip(mapped, batched_vals):
            dyn[i] = val
        leaves = list(static)
        for pos, val in zip(positions, dyn):
            leaves[pos] = val
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return fn(*args, **kwargs)

    if shape == ():
        return rebuild([])
    flat = [jnp.broadcast_to(dynamic[i], shape).reshape(size) for i in mapped]
    if size <= chunk:
        out = jax.vmap(rebuild)(flat)
    else:
        out = jax.lax.map(rebuild, pad_to_multiple(flat, chunk), batch_size=chunk)
        out = jax.tree_util.tree_map(lambda y: y[:size], out)
    return jax.tree_util.tree_map(lambda y: y.reshape(shape + y.shape[1:]), out)


def pad_to_multiple(flat, chunk: int):
    """Pad the leading axis of every array in ``flat`` to a multiple of ``chunk`` by
    repeating its last row.

    ``lax.map(batch_size=chunk)`` on a length that is not a multiple of ``chunk`` traces and
    compiles the body twice (the scan and a separate vmap for the remainder), which doubles
    compile time — the dominant cost of a large sweep. The padded rows repeat a real
    configuration (never NaN) and are sliced off by the caller.
    """
    def pad(x):
        n = x.shape[0]
        extra = (-n) % chunk
        if extra == 0:
            return x
        return jnp.concatenate([x, jnp.broadcast_to(x[-1:], (extra,) + x.shape[1:])])
    return jax.tree_util.tree_map(pad, flat)


def call_batched(fn: Callable, *args, chunk: int = DEFAULT_CHUNK, **kwargs):
    """Call single-config ``fn`` on batched arguments (see module docstring)."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    static, dynamic, positions = [], [], []
    dtype = _float_dtype()
    for i, leaf in enumerate(leaves):
        if _is_static(leaf):
            static.append(leaf)
        else:
            static.append(None)
            positions.append(i)
            if isinstance(leaf, jax.core.Tracer):
                dynamic.append(leaf.astype(dtype) if leaf.dtype != dtype else leaf)
            else:
                dynamic.append(jnp.asarray(np.asarray(leaf, dtype=dtype)
                                           if not isinstance(leaf, jax.Array) else
                                           leaf.astype(dtype)))
    return _run(dynamic, fn=fn, treedef=treedef, static=tuple(static),
                positions=tuple(positions), chunk=int(chunk))


def batched(fn: Callable | None = None, *, chunk: int = DEFAULT_CHUNK):
    """Decorator form of :func:`call_batched`.

    The decorated function keeps its signature and docstring; ``fn.single`` is the raw
    single-configuration function (for use inside other single-configuration formulas, where
    the batching has already happened).
    """
    if fn is None:
        return functools.partial(batched, chunk=chunk)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return call_batched(fn, *args, chunk=chunk, **kwargs)

    wrapper.single = fn
    return wrapper


def batch_shape(*trees: Any) -> tuple:
    """Common broadcast batch shape of the numeric leaves of ``trees``."""
    shapes = [jnp.shape(x) for t in trees for x in jax.tree_util.tree_leaves(t)
              if not _is_static(x)]
    return tuple(jnp.broadcast_shapes(*shapes)) if shapes else ()
