"""The API edge: evaluate a single-configuration function on many configurations.

Convention 1 of docs/architecture.md: every formula is written for one configuration with scalar
leaves; batching happens only here, by one mechanism:

- :func:`map_points` (traceable): a single-point function over the leading axis of a pytree of
  inputs — padded to whole chunks by repeating the last row (:func:`pad_to_multiple`), run as
  ``lax.map(fn, xs, batch_size=chunk)`` (one ``vmap`` when the batch fits one chunk), sharded
  over the devices of a 1-D mesh with ``shard_map`` when several JAX devices are visible, and
  sliced back to the real rows;
- :func:`call_batched` / :func:`batched` turn a single-config function into one that accepts
  config pytrees (and numeric arguments) whose leaves carry any common, broadcastable batch
  shape: one jitted :func:`map_points` call, outputs with that batch shape in front; an
  outer-product batch ``(..., K)`` (some leaves along the leading axes only, some along the
  last only, ``K <=`` :data:`MAX_INNER`) maps its leading points, each evaluating its ``K``
  last-axis points in one ``vmap`` that computes what they share once;
  :func:`compile_ahead` builds a later call's executable in a background thread;
- :func:`map_blocks` (host side) runs a jitted batch function over rows in blocks of one fixed
  width (one compilation for any row count), overlapping each block's device work with the
  previous block's transfer, with a progress bar for long loops
  (:class:`jaxmodel.process.progress_bar`);
- :func:`dedup_map` evaluates a function once per distinct input row of a concrete batch and
  gathers the results back (bit-identical to evaluating every row).

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

import atexit
import contextlib
import functools
import hashlib
import math
import os
import pickle
import threading
import types
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from jaxmodel.jitting import (  # noqa: F401  (re-exported: batching is their public home)
    CPU_COMPILE_OPTIONS, ONE_SHOT_COMPILE_OPTIONS, _Background, _float_dtype, add_xla_flags,
    backend_started, inlined_jits, is_static, jit_leaves, join_leaves, split_leaves, xla_flags,
    xla_knows)
from jaxmodel.numerics import packed_by_dtype
from jaxmodel.process import cli_process, code_fingerprint, export_cache_dir, progress_bar

DEFAULT_CHUNK = 4096
AXIS = "d"   # name of the device axis of the sharding mesh


def device_mesh(devices: Sequence | None = None) -> Mesh | None:
    """1-D mesh (axis :data:`AXIS`) over ``devices`` (default: this process's JAX devices,
    :func:`jax.local_devices` — all of them in a single process; in a ``jax.distributed``
    job each process evaluates its own share, :mod:`jaxmodel.distributed`); None when
    there is only one device (nothing to shard)."""
    devs = list(devices) if devices is not None else jax.local_devices()
    return Mesh(np.asarray(devs), (AXIS,)) if len(devs) > 1 else None


def pad_to_multiple(flat, chunk: int):
    """Pad the leading axis of every array in the pytree ``flat`` to a multiple of ``chunk``
    by repeating its last row (numpy arrays stay numpy, others become JAX arrays).

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
        xp = np if isinstance(x, np.ndarray) else jnp
        return xp.concatenate([x, xp.broadcast_to(x[-1:], (extra,) + x.shape[1:])])
    return jax.tree_util.tree_map(pad, flat)


def map_points(fn: Callable, xs, *, chunk: int = DEFAULT_CHUNK, mesh: Mesh | None = None,
               shard: bool = True):
    """``fn`` (one point → pytree) over the leading axis of the pytree ``xs``; traceable.

    The batch is padded to whole chunks (per device), evaluated with
    ``lax.map(fn, xs, batch_size=chunk)`` — or one ``vmap`` when a device's share fits one
    chunk — and sliced back to its ``n`` rows. With several devices (``mesh``, default
    :func:`device_mesh` when ``shard``; only for batches larger than one chunk) each device
    evaluates a contiguous share under ``shard_map``; arrays ``fn`` closes over are
    replicated. Results do not depend on the device count.
    """
    leaves = jax.tree_util.tree_leaves(xs)
    n = leaves[0].shape[0]
    if n == 0:
        return jax.vmap(fn)(xs)
    if mesh is None and shard and n > chunk:
        mesh = device_mesh()
    n_dev = mesh.devices.size if mesh is not None else 1
    per_dev = -(-n // n_dev)
    width = min(chunk, per_dev)
    per_dev = -(-per_dev // width) * width

    point, unpack = packed_by_dtype(fn)     # fewer, shared output fusions
    inline = bool(jax.config.jax_disable_jit)    # under inlined_jits: the caller's setting

    def as_caller(f):
        def g(x):
            with jax.disable_jit(inline):
                return f(x)
        return g

    def local(x):
        if per_dev <= width:
            return jax.vmap(point)(x)
        # a chunked map stays a loop (inlined_jits would unroll it); its body as the caller's
        with jax.disable_jit(False):
            return jax.lax.map(as_caller(point), x, batch_size=width)

    padded = pad_to_multiple(xs, per_dev * n_dev)
    if n_dev > 1:
        with jax.disable_jit(False):
            out = jax.shard_map(as_caller(local), mesh=mesh, in_specs=(P(AXIS),),
                                out_specs=P(AXIS), check_vma=False)(padded)
    else:
        out = local(padded)
    out = unpack(out)
    if per_dev * n_dev == n:
        return out
    return jax.tree_util.tree_map(lambda y: y[:n], out)


@functools.partial(jax.jit, static_argnames=("fn", "treedef", "static", "chunk"))
def _run(dynamic, *, fn, treedef, static, chunk):
    shape = jnp.broadcast_shapes(*[jnp.shape(x) for x in dynamic]) if dynamic else ()
    size = math.prod(shape)
    # Scalar leaves stay unmapped (closed over): broadcasting them to the batch would make
    # every candidate evaluation re-read a per-point copy of a shared constant.
    mapped = [i for i, x in enumerate(dynamic) if jnp.ndim(x) > 0]

    def rebuild(batched_vals):
        dyn = list(dynamic)
        for i, val in zip(mapped, batched_vals):
            dyn[i] = val
        args, kwargs = join_leaves(dyn, treedef, static)
        return fn(*args, **kwargs)

    if shape == ():
        return rebuild([])
    inner = _inner_axis(dynamic, shape)
    if inner:
        return _run_outer_inner(dynamic, mapped, rebuild, shape, inner, chunk)
    flat = [jnp.broadcast_to(dynamic[i], shape).reshape(size) for i in mapped]
    out = map_points(rebuild, flat, chunk=chunk)
    return jax.tree_util.tree_map(lambda y: y.reshape(shape + y.shape[1:]), out)


MAX_INNER = 64   # longest last axis evaluated as an inner vmap per point (_inner_axis)


def _inner_axis(dynamic, shape) -> int:
    """Length ``K`` of the last batch axis when the batch is an outer product worth mapping
    as one: ``shape = (..., K)`` with ``2 <= K <=`` :data:`MAX_INNER`, some leaf varying
    along the leading axes only (last dimension 1) and some along the last axis only
    (leading dimensions 1). 0 otherwise."""
    if len(shape) < 2 or not 2 <= shape[-1] <= MAX_INNER:
        return 0
    shapes = [(1,) * (len(shape) - jnp.ndim(x)) + tuple(jnp.shape(x)) for x in dynamic
              if jnp.ndim(x) > 0]
    outer_only = any(s[-1] == 1 and math.prod(s) > 1 for s in shapes)
    inner_only = any(s[-1] > 1 and math.prod(s[:-1]) == 1 for s in shapes)
    return shape[-1] if outer_only and inner_only else 0


def _run_outer_inner(dynamic, mapped, rebuild, shape, inner, chunk):
    """:func:`_run` on an outer-product batch ``shape = outer + (K,)``: the points of
    ``outer`` are mapped (:func:`map_points`, ``chunk // K`` per step) and each evaluates
    its ``K`` inner points in one ``vmap`` in which the leaves constant along the last axis
    are unbatched — what a point computes from them alone is computed once for its ``K``
    inner points (e.g. a training plan's per-layer times for its step options). The same
    numbers as the flat mapping."""
    outer = shape[:-1]
    n_out = math.prod(outer)
    nd = len(shape)

    def padded(x):
        return jnp.reshape(x, (1,) * (nd - jnp.ndim(x)) + jnp.shape(x))
    vals = [padded(dynamic[i]) for i in mapped]
    by_outer, by_inner = [], []          # positions among ``mapped``
    for j, v in enumerate(vals):
        s = v.shape
        (by_inner if math.prod(s[:-1]) == 1 and s[-1] > 1 else by_outer).append(j)
    outer_vals = [jnp.broadcast_to(vals[j], outer + (vals[j].shape[-1],)).reshape(n_out, -1)
                  for j in by_outer]
    inner_vals = [vals[j].reshape(inner) for j in by_inner]

    def point(row):
        axes = [0 if r.shape[0] > 1 else None for r in row]

        def one(row_k, inner_k):
            vals = [None] * len(mapped)
            for j, v, a in zip(by_outer, row_k, axes):
                vals[j] = v if a is not None else v[0]
            for j, v in zip(by_inner, inner_k):
                vals[j] = v
            return rebuild(vals)
        return jax.vmap(one, in_axes=(axes, 0))(row, inner_vals)
    out = map_points(point, outer_vals, chunk=max(1, chunk // inner))
    return jax.tree_util.tree_map(lambda y: y.reshape(shape + y.shape[2:]), out)


def call_batched(fn: Callable, *args, chunk: int = DEFAULT_CHUNK, **kwargs):
    """Call single-config ``fn`` on batched arguments (see module docstring)."""
    dynamic, treedef, static = split_leaves(args, kwargs)
    chunk = int(chunk)
    if export_cache_dir() is not None:
        out = _cached_call(dynamic, fn=fn, treedef=treedef, static=static, chunk=chunk)
        if out is not None:
            return out
    if _COMPILING and not any(isinstance(x, jax.core.Tracer) for x in dynamic):
        pending = _COMPILING.pop(_run_key(dynamic, fn=fn, treedef=treedef, static=static,
                                          chunk=chunk), None)
        if pending is not None:
            pending.join()         # compile_ahead's build: then in _run's cache
    return _run(dynamic, fn=fn, treedef=treedef, static=static, chunk=chunk)


def _static_key(leaf: Any):
    """A process-independent key for a static leaf, or None when it has none (a closure, a
    bound method or a lambda carries state the cache key cannot see)."""
    if isinstance(leaf, (str, bool, type(None))):
        return repr(leaf)
    if isinstance(leaf, type) or isinstance(leaf, types.FunctionType):
        name = getattr(leaf, "__qualname__", "")
        if "<" in name or getattr(leaf, "__closure__", None):
            return None
        return f"{leaf.__module__}.{name}"
    return None


def _export_path(dynamic, *, fn, treedef, static, chunk):
    """The export cache's file of a batched call (``<key>.xla``), or None when the call
    cannot be keyed (traced inputs, a stateful static argument). ``dynamic`` may hold
    :class:`jax.ShapeDtypeStruct` leaves: only shapes and dtypes enter the key."""
    if any(isinstance(x, jax.core.Tracer) for x in dynamic):
        return None
    keys = [_static_key(x) for x in (fn,) + tuple(x for x in static if x is not None)]
    if any(k is None for k in keys):
        return None
    positions = tuple(i for i, s in enumerate(static) if s is None)
    key = hashlib.sha1(repr((code_fingerprint(), keys, str(treedef), positions, chunk,
                             [(tuple(x.shape), x.dtype.name) for x in dynamic],
                             os.environ.get("XLA_FLAGS", ""))).encode()).hexdigest()
    return export_cache_dir() / f"{key}.xla"


def _cached_call(dynamic, *, fn, treedef, static, chunk):
    """:func:`_run` through the export cache (:func:`jaxmodel.process.export_cache_dir`).

    Each keyed call is stored as the executable XLA compiled for it (``<key>.xla``,
    ``jax.experimental.serialize_executable``). A later process with the same key loads the
    executable and runs it: no tracing, no lowering, no compilation and no lookup in JAX's
    persistent cache (whose key needs the lowered module). In one process the loaded
    executable is kept (:data:`_EXECUTABLES`). None when the call cannot be keyed (traced
    inputs, a stateful static argument); the caller then runs :func:`_run`. The executable
    is that of :func:`_run`'s module (debug locations dropped), on the same devices: its
    results are :func:`_run`'s, bit for bit."""
    xla = _export_path(dynamic, fn=fn, treedef=treedef, static=static, chunk=chunk)
    if xla is None:
        return None
    _USED.append(xla)
    loaded = _EXECUTABLES.get(xla)
    if loaded is None:
        pending = _PREFETCHING.pop(xla, None)
        loaded = pending.get() if pending is not None else None
        if loaded is None:
            loaded = _load_executable(xla) or _build_executable(
                xla, dynamic, fn=fn, treedef=treedef, static=static, chunk=chunk)
        if isinstance(loaded[1], bytes):     # as stored (_load_executable)
            loaded = (loaded[0], pickle.loads(loaded[1]))
        _EXECUTABLES[xla] = loaded
    return jax.tree_util.tree_unflatten(loaded[1], loaded[0](*dynamic))


def _build_executable(xla, dynamic, *, fn, treedef, static, chunk):
    """Trace, lower and compile :func:`_run` for ``dynamic`` (arrays or
    :class:`jax.ShapeDtypeStruct`) and store the executable at ``xla``; returns
    ``(executable, output treedef)``."""
    return _compile_and_store(xla, *_lower_flat(dynamic, fn=fn, treedef=treedef,
                                                static=static, chunk=chunk))


def _lower_flat(dynamic, *, fn, treedef, static, chunk):
    """:func:`_run` for ``dynamic`` traced and lowered as a function of the flat leaves,
    debug locations dropped: ``(lowered, output treedef)``."""
    box = {}

    def flat(*dyn):
        out = _run(list(dyn), fn=fn, treedef=treedef, static=static, chunk=chunk)
        leaves, box["tree"] = jax.tree_util.tree_flatten(out)
        return leaves
    lowered = jax.jit(flat).lower(*dynamic)
    _strip_debug_info(lowered.compiler_ir("stablehlo"))
    return lowered, box["tree"]


def _compile_and_store(xla, lowered, out_tree):
    """Compile ``lowered`` (:func:`_lower_flat`) and store the executable at ``xla``;
    returns ``(executable, output treedef)``."""
    with _outside_persistent_cache():
        compiled = lowered.compile()
    try:
        from jax.experimental import serialize_executable
        # the output treedef pickled apart: its classes' modules import when it is read,
        # which a loading thread must not do while ``import jaxmodel`` runs
        # (prepare_command_line): it is read where the call returns
        blob = pickle.dumps((serialize_executable.serialize(compiled), pickle.dumps(out_tree)))
    except Exception:              # not serializable (a backend, host callbacks): not kept
        blob = None
    if blob is not None:
        atomic_write(xla, blob)
    return compiled, out_tree


def compile_ahead(fn: Callable, *args, chunk: int = DEFAULT_CHUNK, **kwargs) -> None:
    """Trace and lower ``call_batched(fn, *args, chunk=chunk, **kwargs)`` here and compile it
    in a background thread; numeric leaves may be :class:`jax.ShapeDtypeStruct` (only shapes
    and dtypes matter). The later call with the same static arguments and shapes waits for
    that compilation instead of compiling. Tracing is Python (one thread at a time), but
    XLA releases the GIL while it compiles, so on a multi-core host the compilation overlaps
    the caller's next tracing: a caller that lowers its graphs one after the other
    (:func:`call_batched_many`) waits for its last compilation only. With the export cache
    on, a stored executable is loaded in the background instead, and a built one is
    stored. Only a hint: inputs that cannot be keyed (traced), or a graph that fails to
    trace, leave the call to compile (or raise) itself."""
    dynamic, treedef, static = split_leaves(args, kwargs)
    kw = dict(fn=fn, treedef=treedef, static=static, chunk=int(chunk))
    if any(isinstance(x, jax.core.Tracer) for x in dynamic):
        return
    xla = _export_path(dynamic, **kw) if export_cache_dir() is not None else None
    if xla is not None:
        if xla in _EXECUTABLES or xla in _PREFETCHING:
            return
        if xla.is_file():
            _PREFETCHING[xla] = _Background(functools.partial(_load_executable, xla))
            return
        try:
            lowered, out_tree = _lower_flat(dynamic, **kw)
        except Exception:          # the call itself raises the tracing error
            return
        _PREFETCHING[xla] = _Background(
            functools.partial(_compile_and_store, xla, lowered, out_tree))
        return
    key = _run_key(dynamic, **kw)
    if key in _COMPILING:
        return
    try:
        lowered = _run.lower(dynamic, **kw)
    except Exception:
        return
    # the compiled executable enters _run's own cache: the later call finds it there
    _COMPILING[key] = _Background(lowered.compile)


def call_batched_many(calls: Sequence[tuple], *, chunk: int = DEFAULT_CHUNK) -> list:
    """``[call_batched(fn, *args, chunk=chunk, **kwargs) for fn, args, kwargs in calls]``
    with the graphs compiled in parallel: each is traced and lowered in turn and compiled
    in the background while the next one traces (:func:`compile_ahead`), so splitting one
    big graph into parts that are built this way costs the wall time of the tracing plus
    the last part's compilation, not of every compilation. The same numbers as the calls
    one by one."""
    for fn, args, kwargs in calls:
        compile_ahead(fn, *args, chunk=chunk, **kwargs)
    return [call_batched(fn, *args, chunk=chunk, **kwargs) for fn, args, kwargs in calls]


def _run_key(dynamic, *, fn, treedef, static, chunk):
    """Key of :func:`_run`'s compilation for ``dynamic`` (shapes and dtypes of the leaves,
    the static arguments)."""
    return (fn, treedef, static, chunk,
            tuple((tuple(x.shape), np.dtype(x.dtype).name) for x in dynamic))


# this process: .xla path -> (compiled executable, output treedef); loads and builds under
# way; the .xla paths of the keyed calls made, in order; compile_ahead's compilations of
# _run without the export cache (key -> thread)
_EXECUTABLES: dict = {}
_PREFETCHING: dict = {}
_USED: list = []
_COMPILING: dict = {}


def prefetch_executables(paths) -> None:
    """Start loading the stored executables ``paths`` (from :func:`recording_executables`
    in an earlier process asking the same question) in background threads;
    :func:`_cached_call` then waits for the one it needs instead of loading it. Only a
    hint: an executable runs only for its own key (its path); absent paths are skipped."""
    from pathlib import Path
    for p in paths:
        p = Path(p)
        if p not in _EXECUTABLES and p not in _PREFETCHING and p.is_file():
            _PREFETCHING[p] = _Background(functools.partial(_load_executable, p))


#: Workload sizes of ``jaxmodel predict``: scalar inputs of the compiled functions, never a
#: static switch, so a question differing only in them uses the same executables.
WORKLOAD_OPTIONS = ("--global-batch", "--seq-len", "--batch", "--prompt-len", "--gen-len")


def question_file(argv: Sequence[str] | None):
    """Where the export cache notes which stored executables a command line ``argv`` (the
    tokens after the program name) used; None without an export cache. The workload sizes
    (:data:`WORKLOAD_OPTIONS`) are left out of the name, so a later process asking the same
    question, or the same one with other sizes, starts loading them at once
    (:func:`prefetch_question`)."""
    d = export_cache_dir()
    if d is None or argv is None:
        return None
    shape, skip = [], False
    for tok in argv:
        name = tok.split("=")[0]
        shape.append("#" if skip else name + "=#" if "=" in tok and name in WORKLOAD_OPTIONS
                     else tok)
        skip = tok in WORKLOAD_OPTIONS
    return d / "questions" / f"{hashlib.sha1(repr(shape).encode()).hexdigest()}.txt"


def prefetch_question(argv: Sequence[str] | None):
    """Start loading, in background threads, the executables an earlier process asking the
    question ``argv`` used (:func:`question_file`, :func:`prefetch_executables`); returns
    the question's file (None without an export cache). Repeating it is a no-op."""
    question = question_file(argv)
    if question is not None and question.is_file():
        prefetch_executables(question.read_text().split("\n"))
    return question


def one_shot_xla_flags() -> None:
    """In the ``jaxmodel`` console script, add :data:`ONE_SHOT_COMPILE_OPTIONS` to
    ``XLA_FLAGS`` where they can still act (JAX's backend not started; XLA reads the
    variable then) and the user set none of them: a one-configuration question compiles in
    about half the CPU time (24 -> 16 s of CPU for a Llama-2-13B training step on an empty
    cache with the elemental emitters, and LLVM at -O0 another 1.6 s per big graph) with
    the same numbers (experiments/bench_predict.py compares them with the library's). The
    compilation caches key on ``XLA_FLAGS``, so these executables are kept apart. In-process
    use leaves the host program's compiler alone."""
    if cli_process():
        add_xla_flags(ONE_SHOT_COMPILE_OPTIONS)


def prepare_command_line(argv: Sequence[str]) -> None:
    """Called by ``import jaxmodel`` right after its cache set-up: in the console script
    answering ``jaxmodel predict ...`` (``argv``: the tokens after the program name), the
    compiler options (:func:`one_shot_xla_flags`) and the loading of a repeated question's
    stored executables (:func:`prefetch_question`) start here, so the loading (XLA parses
    and analyses each stored module: about 0.15 s per MB of executable on one core) runs
    on a second core while the rest of the package imports and the arguments are parsed,
    instead of after. Anything else is left to the command itself."""
    if not cli_process() or not argv or argv[0] != "predict":
        return
    one_shot_xla_flags()
    prefetch_question(tuple(argv))


def finish_background() -> None:
    """Wait for loads and builds nobody asked for (no thread inside jaxlib at interpreter
    exit; every stored executable written)."""
    for pending in list(_PREFETCHING.values()) + list(_COMPILING.values()):
        pending.join()


atexit.register(finish_background)


@contextlib.contextmanager
def recording_executables():
    """``with recording_executables() as paths:`` — afterwards ``paths`` lists the stored
    executables (``.xla`` paths) the keyed calls inside used, in order, each once."""
    start, paths = len(_USED), []
    try:
        yield paths
    finally:
        paths.extend(dict.fromkeys(_USED[start:]))


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed); errors ignored (a
    read-only cache only costs the next process a compilation)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass


def _load_executable(path):
    """``(executable, pickled output treedef)`` stored by :func:`_cached_call`, or None
    (absent, damaged, of an older layout, or built for another backend)."""
    if not path.is_file():
        return None
    try:
        from jax.experimental import serialize_executable
        (blob, in_tree, exe_out_tree), out_tree = pickle.loads(path.read_bytes())
        if not isinstance(out_tree, bytes):
            return None                      # an older layout: built again
        return serialize_executable.deserialize_and_load(blob, in_tree, exe_out_tree), out_tree
    except Exception:
        return None


def _strip_debug_info(module) -> None:
    """Drop source locations (XLA's per-instruction op names) from a lowered module in place:
    debug text only — the stored executable is a third smaller and loads ~15 % faster."""
    from jax.extend.mlir import passmanager
    with module.context:
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(module.operation)


_outside = {"depth": 0, "lock": threading.Lock()}


@contextlib.contextmanager
def _outside_persistent_cache():
    """Compile without JAX's persistent compilation cache: jaxlib 0.10's XLA:CPU cannot run
    a serialized executable that was itself loaded from that cache ("NOT_FOUND: Function
    ... not found"), and an executable stored here need not be stored twice. JAX's switch
    is process-wide: it stays off while any thread is inside (compilations of other
    threads meanwhile only skip the persistent cache)."""
    from jax.experimental.compilation_cache import compilation_cache as cc
    with _outside["lock"]:
        if _outside["depth"] == 0 and not (jax.config.jax_enable_compilation_cache
                                           and jax.config.jax_compilation_cache_dir):
            on = False
        else:
            on = True
            if _outside["depth"] == 0:
                jax.config.update("jax_enable_compilation_cache", False)
                cc.reset_cache()
            _outside["depth"] += 1
    try:
        yield
    finally:
        if on:
            with _outside["lock"]:
                _outside["depth"] -= 1
                if _outside["depth"] == 0:
                    jax.config.update("jax_enable_compilation_cache", True)
                    cc.reset_cache()


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
              if not is_static(x)]
    return tuple(jnp.broadcast_shapes(*shapes)) if shapes else ()


def bucket_width(n: int, minimum: int = 64) -> int:
    """The power of two ``>= max(n, minimum)``: batch widths that let calls of similar size
    share one compilation."""
    return max(int(minimum), 1 << max(0, math.ceil(math.log2(max(int(n), 1)))))


def map_blocks(batch_fn: Callable, xs, *, width: int, to_host: Callable = np.asarray,
               desc: str | None = None, unit: str = "row", units_per_row: int = 1,
               total_units: int | None = None, progress: bool = True):
    """Host-side loop: ``batch_fn`` over the rows of the pytree ``xs`` in blocks of exactly
    ``width`` rows (the last one padded by repeating the final row), so a jitted ``batch_fn``
    compiles once for any row count. Block ``b + 1`` is dispatched before block ``b``'s
    result is copied to the host (``to_host``), so transfers overlap device work.

    Each block's outputs carry a leading axis of ``R`` rows (``R = width`` for a row-wise
    function); they are concatenated and cut to ``n · R / width`` rows. A progress bar
    (``desc``, counting ``units_per_row`` per input row, at most ``total_units``) appears for
    loops longer than a few seconds unless ``progress=False`` or output is quiet.
    """
    width = max(1, int(width))
    leaves = jax.tree_util.tree_leaves(xs)
    n = leaves[0].shape[0]
    if n == 0:
        raise ValueError("map_blocks: empty batch")
    padded = pad_to_multiple(xs, width)
    n_blocks = -(-n // width)
    outs, pending = [], None
    total = n * units_per_row if total_units is None else int(total_units)
    with progress_bar(total, desc or getattr(batch_fn, "__name__", "batch"), unit,
                      enabled=progress and n_blocks > 1) as bar:
        for b in range(n_blocks):
            block = jax.tree_util.tree_map(lambda x: x[b * width:(b + 1) * width], padded)
            res = batch_fn(block)
            if pending is not None:
                outs.append(jax.tree_util.tree_map(to_host, pending[0]))
                bar.update(pending[1])
            done = b * width * units_per_row
            pending = (res, max(0, min(width * units_per_row, total - done)))
        outs.append(jax.tree_util.tree_map(to_host, pending[0]))
        bar.update(pending[1])

    def cat(*ys):
        y = np.concatenate(ys) if len(ys) > 1 else ys[0]
        return y[:n * (y.shape[0] // n_blocks) // width]
    return jax.tree_util.tree_map(cat, *outs)


def dedup_map(fn: Callable, inputs: tuple, *, shape: tuple | None = None,
              chunk: int | None = None, parts: Sequence[dict] | None = None, **kwargs):
    """``call_batched(fn, *inputs, **kwargs)`` evaluated once per distinct input row. With
    ``parts`` (keyword sets, e.g. a static switch selecting part of the outputs): a tuple,
    ``fn`` with each set's keywords added, one graph per part, compiled in parallel
    (:func:`call_batched_many`).

    ``inputs`` is a tuple of positional arguments (config pytrees, numbers) with concrete
    leaves broadcastable to ``shape`` (default: their common batch shape). Leaves constant
    over the batch are passed as scalars (unmapped: XLA folds them, and they do not enter the
    comparison); the rows of the varying leaves are reduced with an exact ``numpy.unique``,
    ``fn`` runs on the distinct rows only, and the outputs are gathered back — bit-identical
    to evaluating every row. Static leaves (strings, booleans, None) pass through;
    ``kwargs`` go unchanged to every evaluation (static options, or numbers without the batch
    axis).

    Returns:
        ``fn``'s output pytree with ``shape`` in front of every leaf.

    Raises:
        ValueError: an empty batch, or traced (non-concrete) inputs.
    """
    kw = {} if chunk is None else {"chunk": int(chunk)}
    shape = tuple(batch_shape(*inputs)) if shape is None else tuple(shape)
    leaves, tree = jax.tree_util.tree_flatten(tuple(inputs))
    n = math.prod(shape)
    if n == 0:
        raise ValueError("dedup_map: empty batch")
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
        raise ValueError("dedup_map: inputs must be concrete (de-duplication runs on the host)")
    dyn = [i for i, x in enumerate(leaves) if not is_static(x)]
    cols = {i: np.broadcast_to(np.asarray(leaves[i]), shape).reshape(n) for i in dyn}
    varying = [i for i in dyn if cols[i].min() != cols[i].max()]
    if varying:
        _, first, inverse = np.unique(np.stack([cols[i] for i in varying], axis=1), axis=0,
                                      return_index=True, return_inverse=True)
    else:
        first, inverse = np.zeros(1, dtype=int), np.zeros(n, dtype=int)
    new = list(leaves)
    for i in dyn:
        new[i] = cols[i][first] if i in varying else cols[i][0]   # call_batched transfers
    sub = jax.tree_util.tree_unflatten(tree, new)
    if parts is not None:
        out_u = tuple(call_batched_many([(fn, sub, {**kwargs, **p}) for p in parts], **kw))
    else:
        out_u = call_batched(fn, *sub, **kw, **kwargs)
    inverse = np.asarray(inverse).reshape(n)

    def gather(v):
        v = np.asarray(v)
        v = v.reshape((1,) + v.shape) if not varying else v
        # device_put, not jnp.asarray: no eager op to compile in a fresh process
        return jax.device_put(v[inverse].reshape(shape + v.shape[1:]))
    return jax.tree_util.tree_map(gather, out_u)
