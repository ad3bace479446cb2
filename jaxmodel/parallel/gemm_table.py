"""GEMM de-duplication for big sweeps: evaluate each unique GEMM shape once, then look it up.

A parallelism sweep on one system evaluates thousands of plans, but their GEMMs come from a
handful of shapes (they depend on ``tp``, the micro-batch, the sequence and the model only).
The tile search (:func:`jaxmodel.ops.gemm_latency`) is the expensive part of a plan, so:

1. :func:`collect_gemm_shapes` runs the batched model once with a *recording* GEMM hook
   (a ``jax.pure_callback`` that returns 0 and stores the requested ``(m, n, k, batch,
   dtype_bytes)``) — it captures exactly the shapes the model asks for, whatever the op graph;
2. :meth:`GemmTable.build` times the unique shapes with ONE batched tile search;
3. :meth:`GemmTable.lookup` is a GEMM hook ``(dev, m, n, k, batch, dtype_bytes) -> s`` for the
   models' static ``gemm=`` argument: each dimension is located by ``searchsorted`` in its
   sorted unique values and the time gathered from a dense table (O(log U) per call). A shape
   that is not in the table gives ``+inf`` (the plan becomes infeasible), never a wrong value.

The table is valid for ONE device (the one it was built with); :meth:`lookup` reads only
its ``dev`` argument's ``sa_mac_per_cycle`` (a sixth key column: the layer model scales it by
the compute dtype's tensor-core rate, :func:`jaxmodel.precisions.scaled_device`, so one table
holds the GEMMs of several precisions), so use it only in sweeps whose device is otherwise
fixed (as in a parallelism search).
:func:`jaxmodel.train_step` runs the device at its sustained training clock
(:func:`jaxmodel.parallel.train.sustained_device`), so build tables on that device
(:meth:`GemmTable.for_train_step` does).
Gradients w.r.t. device knobs do not flow through a table (use the tile search for those).

Example:
    >>> system, model = hw_db.system("dgx_a100", nodes=2), hw_db.model("gpt2-medium")
    >>> par_batch = jm.Parallelism(dp=jnp.array([2.0, 4.0]), tp=jnp.array([8.0, 4.0]))
    >>> table = GemmTable.for_train_step(system, model, par_batch, 64, 1024)
    >>> r = jm.train_step(system, model, par_batch, 64, 1024, gemm=table.lookup)
    >>> r.step_time_s.shape, bool(r.feasible.all())
    ((2,), True)
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import ops as _ops
from jaxmodel.batching import bucket_width, map_blocks
from jaxmodel.parallel.train import stage_times, sustained_device
from jaxmodel.types import Device

_FIELDS = ("m", "n", "k", "batch", "dtype_bytes", "sa_mac_per_cycle")
_MAX_DENSE = 1 << 22   # entries of the dense lookup grid


class _Recorder:
    """Collects the GEMM shapes passed to its hook (thread-safe; host callbacks)."""

    def __init__(self):
        self.rows = []
        self.lock = threading.Lock()

    def _record(self, *cols):
        cols = np.broadcast_arrays(*[np.asarray(c, dtype=np.float64) for c in cols])
        with self.lock:
            self.rows.append(np.stack([c.reshape(-1) for c in cols], axis=-1))
        return np.zeros(cols[0].shape, dtype=jnp.result_type(float))

    def hook(self, dev, m, n, k, batch=1.0, dtype_bytes=2.0):
        f = jnp.result_type(float)
        args = [jnp.asarray(x, dtype=f) for x in (m, n, k, batch, dtype_bytes,
                                                  dev.sa_mac_per_cycle)]
        shape = jnp.broadcast_shapes(*[a.shape for a in args])
        args = [jnp.broadcast_to(a, shape) for a in args]
        return jax.pure_callback(self._record, jax.ShapeDtypeStruct(shape, f), *args,
                                 vmap_method="broadcast_all")

    def shapes(self) -> np.ndarray:
        if not self.rows:
            return np.zeros((0, len(_FIELDS)))
        allrows = np.concatenate(self.rows, axis=0)
        allrows = allrows[np.all(np.isfinite(allrows), axis=1)]
        return np.unique(allrows, axis=0)


def collect_gemm_shapes(fn: Callable, *args, **kwargs) -> np.ndarray:
    """Unique GEMM shapes a batched model function requests, ``(U, 6)`` [m, n, k, batch,
    dtype_bytes, the device's sa_mac_per_cycle].

    ``fn`` must accept a static ``gemm=`` hook (e.g. :func:`jaxmodel.train_step`,
    :func:`jaxmodel.workload.layer.training_layer_times`). It is run once on ``args`` with a
    recording hook that returns 0 s for every GEMM (so the rest of the model runs as usual).
    """
    rec = _Recorder()
    out = fn(*args, gemm=rec.hook, **kwargs)
    jax.block_until_ready(out)
    return rec.shapes()


class GemmTable:
    """Precomputed GEMM latencies of one device on a set of shapes, with a lookup hook.

    Attributes:
        shapes: ``(U, 6)`` numpy array of unique ``(m, n, k, batch, dtype_bytes,
            sa_mac_per_cycle)``.
        times: ``(U,)`` seconds from the tile search (incl. the per-kernel overhead).
    """

    def __init__(self, shapes: np.ndarray, times: np.ndarray):
        shapes = np.asarray(shapes, dtype=np.float64)
        if shapes.size and (shapes.ndim != 2 or shapes.shape[1] != len(_FIELDS)):
            raise ValueError(f"GemmTable: shapes must be rows of {_FIELDS}, got shape "
                             f"{shapes.shape}")
        shapes = shapes.reshape(-1, len(_FIELDS))
        times = np.asarray(times, dtype=np.float64).reshape(-1)
        if shapes.shape[0] != times.shape[0]:
            raise ValueError(f"GemmTable: {shapes.shape[0]} shapes but {times.shape[0]} times")
        self.shapes, self.times = shapes, times
        self.axes = [np.unique(shapes[:, j]) if len(shapes) else np.zeros(1)
                     for j in range(len(_FIELDS))]
        dims = [len(a) for a in self.axes]
        self.dense = int(np.prod(dims)) <= _MAX_DENSE and len(shapes) > 0
        if self.dense:
            grid = np.full(dims, np.inf)
            idx = tuple(np.searchsorted(self.axes[j], shapes[:, j]) for j in range(len(dims)))
            grid[idx] = times
            self._grid = grid.reshape(-1)
            self._strides = np.cumprod([1] + dims[::-1][:-1])[::-1].astype(np.int64)

    def __len__(self):
        return len(self.shapes)

    @classmethod
    def build(cls, dev: Device, shapes: np.ndarray) -> "GemmTable":
        """Time ``shapes`` (rows of m, n, k, batch, dtype_bytes[, sa_mac_per_cycle]) on ``dev``
        with ONE batched tile search (:func:`jaxmodel.ops.gemm_latency`); a missing sixth
        column is ``dev.sa_mac_per_cycle``."""
        shapes = np.asarray(shapes, dtype=np.float64)
        if shapes.ndim == 2 and shapes.shape[1] == len(_FIELDS) - 1:
            shapes = np.concatenate([shapes, np.full((len(shapes), 1), float(np.asarray(
                dev.sa_mac_per_cycle)))], axis=1)
        shapes = shapes.reshape(-1, len(_FIELDS))
        leaves = jax.tree_util.tree_leaves(dev)
        if any(np.ndim(x) for x in leaves):
            raise ValueError("GemmTable.build: the device must be a single configuration "
                             "(a table is valid for one device)")
        if len(shapes) == 0:
            return cls(shapes, np.zeros(0))
        # one batched tile search, its width a power of two (>= 64) so tables of similar size
        # share one compilation; column 5 is the systolic rate of the row's compute dtype
        def tile_search(rows):
            d = dataclasses.replace(dev, sa_mac_per_cycle=rows[:, 5])
            return _ops.gemm_latency(d, rows[:, 0], rows[:, 1], rows[:, 2], batch=rows[:, 3],
                                     dtype_bytes=rows[:, 4])
        t = map_blocks(tile_search, jnp.asarray(shapes), width=bucket_width(len(shapes), 64),
                       progress=False)
        times = np.asarray(t, dtype=np.float64)
        return cls(shapes, times)

    @classmethod
    def for_train_step(cls, system, model, par, global_batch, seq_len, **kwargs) -> "GemmTable":
        """Collect the GEMMs of a (batched, concrete) :func:`jaxmodel.train_step` call and time
        them on the sustained-clock device."""
        # the GEMMs live in the per-layer stage times: record them on the distinct stage
        # inputs only (train_step's de-duplication), without composing the steps
        kw = {k: v for k, v in kwargs.items() if k in ("dtype_bytes", "clock_fraction",
                                                        "dropout", "chunk", "precision",
                                                        "finetune")}
        shapes = collect_gemm_shapes(stage_times, system, model, par, global_batch, seq_len,
                                     **kw)
        return cls.build(sustained_device(system.device, kwargs.get("clock_fraction")), shapes)

    def lookup(self, dev, m, n, k, batch=1.0, dtype_bytes=2.0):
        """GEMM hook: the tabulated latency of ``[batch×m×k]·[batch×k×n]`` (s); ``+inf`` when
        the shape is not in the table. Of ``dev`` only ``sa_mac_per_cycle`` is read (the
        compute dtype's rate); the rest is the table's device."""
        f = jnp.result_type(float)
        q = [jnp.asarray(x, dtype=f) for x in (m, n, k, batch, dtype_bytes,
                                               dev.sa_mac_per_cycle)]
        if not len(self.shapes):
            return jnp.full(jnp.broadcast_shapes(*[x.shape for x in q]), jnp.inf, dtype=f)
        hit = jnp.asarray(True)
        idx = []
        for j, x in enumerate(q):
            axis = jnp.asarray(self.axes[j], dtype=f)
            i = jnp.clip(jnp.searchsorted(axis, x), 0, len(self.axes[j]) - 1)
            hit = hit & (jnp.abs(axis[i] - x) <= 1e-6 * jnp.maximum(1.0, jnp.abs(x)))
            idx.append(i)
        if self.dense:
            flat = sum(i.astype(jnp.int32) * int(s) for i, s in zip(idx, self._strides))
            t = jnp.asarray(self._grid, dtype=f)[flat]
        else:  # sparse fallback: exact match against every row
            keys = jnp.asarray(self.shapes, dtype=f)
            qv = jnp.stack(jnp.broadcast_arrays(*q), axis=-1)
            match = jnp.all(jnp.abs(keys - qv[..., None, :])
                            <= 1e-6 * jnp.maximum(1.0, jnp.abs(qv[..., None, :])), axis=-1)
            t = jnp.where(jnp.any(match, axis=-1),
                          jnp.asarray(self.times, dtype=f)[jnp.argmax(match, axis=-1)], jnp.inf)
        return jnp.where(hit, t, jnp.inf)
