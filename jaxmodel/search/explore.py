"""Design-space sweeps: any single-config model function over millions of design points.

:func:`sweep` evaluates a ``@batched`` model function (or any single-configuration formula,
docs/architecture.md, convention 1) over

- a cartesian grid of knobs given as a spec (``{"device.mem_bw": [...], "par.tp": [...]}``),
  never materialised: each jitted chunk turns a flat index range into knob values by index
  arithmetic (:mod:`jaxmodel.search.grid`);
- and/or config arguments whose leaves already carry a batch axis (``dataclasses.replace(dev,
  mem_bw=array)``); the grid is then repeated for every batch element.

Work is split into blocks of design points (one jitted call each, the progress-bar step), driven
by :func:`jaxmodel.batching.map_blocks` (the next block is dispatched before the previous one is
copied back). Inside a block, :func:`jaxmodel.batching.map_points` evaluates the points: the
block's index range is built inside the jitted call (nothing but a scalar start crosses the host
link), sharded over every JAX device with ``shard_map`` on a 1-D mesh, and each shard runs
``lax.map(batch_size=chunk)`` (convention 3: chunked evaluation keeps the candidate tensors of
the tile search small). In a ``jax.distributed`` job of several processes
(:mod:`jaxmodel.distributed`) each process evaluates its contiguous share of the design points
on its own devices and the rows are gathered onto every process afterwards, in order: the
same DataFrame as a single process, after a check that every process was given the same
inputs.

Results come back as a :class:`pandas.DataFrame`, one row per design point: one column per knob
(and per batched leaf), one per scalar output leaf (dataclass fields, dict keys, tuple items;
nested names joined by dots). ``df.attrs`` holds ``n_evaluated``, ``wall_s`` and the device
count. :func:`save` writes CSV or Parquet (Parquet needs ``pyarrow``).

Example:
    >>> import jaxmodel as jm, hw_db
    >>> dev = hw_db.device("a100_80gb")
    >>> df = jm.sweep(jm.gemm_latency, dev, 4096, 4096, 4096,
    ...               grid={"dev.mem_bw": [1e12, 2e12], "dev.core_count": [64, 108]})
    >>> len(df), list(df.columns)[:2]
    (4, ['dev.mem_bw', 'dev.core_count'])
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmodel import distributed
from jaxmodel.batching import DEFAULT_CHUNK, device_mesh, is_static, map_blocks, map_points
from jaxmodel.search.grid import Grid, knob_positions, leaf_names

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["sweep", "SweepOptions", "save", "output_names"]

def output_names(tree: Any, default: str = "value") -> list[str]:
    """Column names of the leaves of an output pytree (dots between nested names)."""
    paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    names = []
    for path, _ in paths:
        parts = []
        for k in path:
            if isinstance(k, jax.tree_util.GetAttrKey):
                parts.append(k.name)
            elif isinstance(k, jax.tree_util.DictKey):
                parts.append(str(k.key))
            elif isinstance(k, jax.tree_util.SequenceKey):
                parts.append(str(k.idx))
            else:
                parts.append(str(getattr(k, "key", k)))
        names.append(".".join(parts) if parts else default)
    return names


class _BlockPlan(NamedTuple):
    """The static layout of a sweep's jitted block (hashable: the compilation key)."""

    fn: Callable            # the single-configuration function
    treedef: Any            # of ``(args, kwargs)``
    static: tuple           # every leaf, None where a dynamic leaf or knob goes
    positions: tuple        # leaf positions of the dynamic (batched) leaves
    knob_pos: tuple         # leaf positions of the grid's knobs
    strides: tuple          # the grid's index strides and sizes per knob
    sizes: tuple
    grid_size: int          # grid points
    batch_size: int         # batch elements (the grid is repeated for each)
    step: int               # design points per block (all devices)
    chunk: int              # points per ``lax.map`` step
    mesh: Any               # the 1-D device mesh


@functools.partial(jax.jit, static_argnames=("plan",))
def _block(start, last, dynamic, knob_values, consts, *, plan: _BlockPlan):
    """Evaluate design points ``start .. start + step`` (indices clamped to ``last``, the
    last point of this process's share) with :func:`jaxmodel.batching.map_points`: the
    index range is built inside the jitted call (and sharded with it), so only the scalars
    ``start`` and ``last`` cross the host link."""
    p = plan

    def point(i):
        b = i // p.grid_size
        g = i % p.grid_size
        leaves = list(p.static)
        for pos, val in zip(p.positions, dynamic):
            leaves[pos] = val[b] if p.batch_size > 1 and val.ndim else val
        for pos, vals, s, n in zip(p.knob_pos, knob_values, p.strides, p.sizes):
            leaves[pos] = vals[(g // s) % n]
        args, kwargs = jax.tree_util.tree_unflatten(p.treedef, leaves)
        return p.fn(*args, **kwargs, **consts)

    idx = jnp.minimum(start + jnp.arange(p.step, dtype=jnp.int32), last)
    return map_points(point, idx, chunk=p.chunk, mesh=p.mesh, shard=False)


def _to_host(tree):
    return jax.tree_util.tree_map(np.asarray, tree)


def _split(fn, args, kwargs, g: Grid):
    """The arguments' leaves for :func:`sweep`: ``(treedef, static, dynamic, positions,
    knob_pos, n_batch, display)`` — every leaf with None where a dynamic one goes, the
    dynamic leaves (float arrays, flattened to ``n_batch`` rows when batched), their leaf
    positions, the grid knobs' positions and the leaves' display names. ``ValueError`` for a
    knob that is also a batched leaf."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    lookup, display = leaf_names(fn, args, kwargs)
    dtype = jnp.result_type(float)
    static, dynamic, positions, static_pos = [], [], [], set()
    for i, leaf in enumerate(leaves):
        if is_static(leaf):
            static.append(leaf)
            static_pos.add(i)
        else:
            static.append(None)
            positions.append(i)
            dynamic.append(jnp.asarray(leaf, dtype=dtype))
    knob_pos = knob_positions(g, lookup, static_pos)
    shapes = [x.shape for x in dynamic]
    bshape = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    n_batch = math.prod(bshape)
    for pos, x in zip(positions, dynamic):
        if pos in knob_pos and x.ndim:
            key = g.keys[knob_pos.index(pos)]
            raise ValueError(f"sweep spec: knob {key!r} is already batched in the arguments")
    if n_batch > 1:
        dynamic = [jnp.broadcast_to(x, bshape).reshape(n_batch) if x.ndim else x
                   for x in dynamic]
    return treedef, static, dynamic, positions, knob_pos, n_batch, display


def _block_size(n_local: int, n_dev: int, chunk: int, block: int | None) -> tuple[int, int]:
    """``(step, chunk)``: design points per jitted block over all devices (a whole number
    of chunks per device; default up to 16 chunks) and the chunk, for ``n_local`` points."""
    chunk = max(1, int(chunk))
    per_dev_needed = max(1, -(-n_local // n_dev))
    if block is None:
        block = min(per_dev_needed, 16 * chunk)
    per_device = max(1, min(int(block), per_dev_needed))
    chunk = min(chunk, per_device)
    per_device = -(-per_device // chunk) * chunk
    return per_device * n_dev, chunk


def _output_columns(out_tree, n_rows: int, default: str) -> dict:
    """One column per scalar output leaf (``name[j]`` per element of a vector leaf)."""
    cols = {}
    flat_out, _ = jax.tree_util.tree_flatten(out_tree)
    for name, val in zip(output_names(out_tree, default=default), flat_out):
        val = val.reshape(n_rows, math.prod(val.shape[1:])) if val.ndim > 1 else val
        if val.ndim == 2:
            for j in range(val.shape[1]):
                cols[f"{name}[{j}]"] = val[:, j]
        else:
            cols[name] = val
    return cols


class SweepOptions(NamedTuple):
    """Where a :func:`sweep` runs and how it returns its rows (the defaults suit one process).

    Attributes:
        devices: JAX devices to shard over (default: all of this process's; in a
            ``jax.distributed`` job each process evaluates its share of the points on its
            own devices, :mod:`jaxmodel.distributed`).
        block: design points per jitted call and device (default: up to 16 chunks).
        labels: show the spec's own labels (e.g. schedule names) in knob columns.
        gather: in a ``jax.distributed`` job, gather every process's rows onto every process
            (default); ``False`` returns this process's contiguous share only, indexed by its
            global row numbers (the shares, concatenated in process order, are the whole
            table: write one file per process for sweeps too large to gather).

    Example:
        >>> jm.SweepOptions(block=8).gather
        True
    """

    devices: Any = None
    block: int | None = None
    labels: bool = True
    gather: bool = True


def sweep(fn: Callable, *args, chunk: int = DEFAULT_CHUNK, grid: Mapping | None = None,
          progress: bool = True, consts: Mapping | None = None,
          sweep_options: SweepOptions = SweepOptions(), **kwargs) -> pd.DataFrame:
    """Evaluate a model function over a design space; one DataFrame row per design point.

    Args:
        fn: a ``@batched`` model function (its ``.single`` is used) or any single-config
            function of config pytrees and numbers returning a pytree of scalars.
        *args, **kwargs: the function's arguments. Numeric leaves may carry a common
            broadcastable batch shape (flattened row-major into the rows); strings, booleans
            and ``None`` are static.
        chunk: design points per ``lax.map`` step on each device.
        grid: ``{knob: values}`` cartesian spec (see :mod:`jaxmodel.search.grid`); rows vary
            the last knob fastest, as ``itertools.product``. Repeated for each batch element.
        progress: show a progress bar (stderr) when the sweep takes several blocks and more
            than a few seconds (``JAXMODEL_QUIET=1`` silences it).
        consts: keyword arguments passed whole to every evaluation (arrays are neither
            batched nor shown, e.g. lookup tables); traced jit inputs, so XLA does not
            constant-fold over them.
        sweep_options: :class:`SweepOptions` — the ``devices`` to shard over, the ``block``
            size, knob ``labels`` and, in a ``jax.distributed`` job, whether to ``gather``
            every process's rows.

    Returns:
        ``pandas.DataFrame`` with knob columns, batched-leaf columns and output columns;
        ``df.attrs`` has ``n_evaluated``, ``wall_s``, ``n_devices`` (over every process),
        ``n_processes``, ``sync_s`` (seconds in the input check and the gather, including
        waiting for the slowest process).

    Raises:
        ValueError: unknown/ambiguous/non-numeric knob, empty range, bad values (naming the
            knob), a knob that is also a batched leaf; in a ``jax.distributed`` job, inputs
            that differ between processes (naming them) or another process's devices.
    """
    devices, block, labels, gather = sweep_options
    t0 = time.perf_counter()
    distributed.check_same("sweep", {
        "fn": getattr(fn, "single", fn), "args": args, "kwargs": kwargs,
        "grid": dict(grid or {}), "chunk": chunk, "labels": labels, "consts": dict(consts or {}),
        "gather": gather})
    t_sync = time.perf_counter() - t0
    single = getattr(fn, "single", fn)
    g = Grid.from_spec(grid)
    treedef, static, dynamic, positions, knob_pos, n_batch, display = _split(fn, args, kwargs,
                                                                            g)
    n_grid = g.size
    n_total = n_batch * n_grid
    if n_total >= 2 ** 31 - 1:
        raise ValueError(f"sweep: {n_total} design points exceed the int32 index range; "
                         f"split the spec")

    devs = list(devices) if devices is not None else jax.local_devices()
    if distributed.is_distributed() and not set(devs) <= set(jax.local_devices()):
        raise ValueError(f"sweep: devices={devs} include another process's; in a "
                         f"jax.distributed job each process evaluates its share on its own "
                         f"(jax.local_devices())")
    mesh = device_mesh(devs)
    n_dev = len(devs)
    # this process's contiguous share of the points (all of them in a single process)
    lo, hi = distributed.process_slice(n_total)
    n_local = hi - lo
    step, chunk = _block_size(n_local, n_dev, chunk, block)
    n_blocks = -(-n_local // step) if n_local else 0
    plan = _BlockPlan(single, treedef, tuple(static), tuple(positions), knob_pos, g.strides,
                      g.sizes, n_grid, n_batch, step, chunk, mesh)
    knob_values = tuple(jnp.asarray(v, dtype=jnp.result_type(float)) for v in g.values)
    consts = dict(consts or {})
    # a process without points (more processes than points) evaluates its neighbour's last
    # one and keeps none of it, so that every process returns the same output structure
    starts = lo + np.arange(max(n_blocks, 1), dtype=np.int32) * step
    last = jnp.int32(hi - 1 if n_local else min(lo, n_total - 1))
    starts = np.minimum(starts, n_total - 1)
    out_tree = map_blocks(
        lambda s: _block(jnp.int32(s[0]), last, dynamic, knob_values, consts, plan=plan),
        starts, width=1, to_host=_to_host, desc=f"sweep {getattr(fn, '__name__', 'fn')}",
        unit="pt", units_per_row=step, total_units=max(n_local, 1), progress=progress)
    out_tree = jax.tree_util.tree_map(lambda y: y[:n_local], out_tree)
    t1 = time.perf_counter()
    if gather:
        out_tree = distributed.gather_rows(out_tree)
        lo, hi = 0, n_total
    n_proc = distributed.process_count() if distributed.is_distributed() else 1
    n_dev = sum(distributed.gather(n_dev)) if n_proc > 1 else n_dev
    t_sync += time.perf_counter() - t1
    rows = np.arange(lo, hi)
    cols: dict[str, Any] = {}
    if n_batch > 1:
        bi = rows // n_grid
        for pos, x in zip(positions, dynamic):
            if x.ndim:
                cols[display[pos]] = np.asarray(x)[bi]
    gi = rows % n_grid if n_batch > 1 else rows
    if n_grid > 1 or g.keys:
        cols.update(g.values_at(gi, labels=labels))
    cols.update(_output_columns(out_tree, hi - lo, getattr(fn, "__name__", "value")))
    import pandas as pd   # imported here: ``import jaxmodel`` stays fast
    df = pd.DataFrame(cols, index=None if lo == 0 and hi == n_total else rows)
    df.attrs.update(n_evaluated=int(n_total), wall_s=time.perf_counter() - t0,
                    n_devices=int(n_dev), n_blocks=int(n_blocks),
                    n_processes=n_proc, sync_s=t_sync)
    return df


def save(df: pd.DataFrame, path: str | Path) -> Path:
    """Write a sweep result to ``.csv`` or ``.parquet`` (chosen by the suffix).

    Raises:
        ImportError: Parquet requested but ``pyarrow`` is not installed.
        ValueError: unknown suffix.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        df.to_csv(path, index=False)
    elif suffix in (".parquet", ".pq"):
        import importlib.util
        if importlib.util.find_spec("pyarrow") is None:
            raise ImportError(f"cannot write {path}: Parquet export needs pyarrow "
                              f"(pip install pyarrow), or save as .csv")
        df.to_parquet(path, index=False)
    else:
        raise ValueError(f"save: unknown file type {suffix!r} for {path} (use .csv or "
                         f".parquet)")
    return path
