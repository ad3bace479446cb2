"""Jitting single-configuration functions whose arguments are config pytrees: the split of
their leaves into static ones (names, flags, functions: part of a compilation's key) and
numeric ones (traced), XLA:CPU compiler options for the model's graphs, tracing with the
``jax.numpy`` helpers' jits inlined, and background compilation. :mod:`jaxmodel.batching`
(the API edge) builds on these and re-exports them.

Units: none (code, not formulas).
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import threading
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def is_static(leaf: Any) -> bool:
    """True for a leaf that selects code rather than carrying a number (a string, boolean,
    None, type or function): part of a compilation's cache key, never traced."""
    return isinstance(leaf, (str, bool, type(None), type)) or callable(leaf) and not hasattr(
        leaf, "shape")


#: Device arrays of at most this many elements are re-typed on the host by
#: :func:`_as_float`: an eager cast compiles an XLA program of its own (30-50 ms each in a
#: fresh process: a training result's bool ``feasible`` and int ``reason`` passed on to the
#: energy model cost a command-line answer ~70 ms), a host cast of a few numbers nothing.
HOST_CAST_MAX_SIZE = 4096


def _as_float(leaf: Any, dtype):
    """A numeric leaf in the float dtype ``dtype``: traced and large device arrays converted
    on the device, small device arrays (:data:`HOST_CAST_MAX_SIZE`) and host values as
    numpy (a compiled call transfers them in one go; the same values: a bool becomes 0 or 1,
    an integer rounds to nearest either way), shapes (:class:`jax.ShapeDtypeStruct`, for
    ahead-of-time compilation) re-typed."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf if leaf.dtype == dtype else jax.ShapeDtypeStruct(leaf.shape, dtype)
    if isinstance(leaf, jax.core.Tracer):
        return leaf.astype(dtype) if leaf.dtype != dtype else leaf
    if isinstance(leaf, jax.Array):
        if leaf.dtype == dtype:
            return leaf
        return (np.asarray(leaf).astype(dtype) if leaf.size <= HOST_CAST_MAX_SIZE
                else leaf.astype(dtype))
    return np.asarray(leaf, dtype=dtype)


def split_leaves(args: tuple, kwargs: dict | None = None, *, cast: bool = True):
    """Split the arguments of a call into ``(dynamic, treedef, static)``: ``dynamic`` lists
    the numeric leaves (in the float dtype when ``cast``), ``static`` is a hashable tuple of
    every leaf with the static ones (:func:`is_static`) kept and None where a numeric leaf
    goes, so ``(treedef, static)`` keys a compilation. :func:`join_leaves` inverts it."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs or {})))
    dtype = _float_dtype()
    static = tuple(x if is_static(x) else None for x in leaves)
    dynamic = [_as_float(x, dtype) if cast else x for x in leaves if not is_static(x)]
    return dynamic, treedef, static


def join_leaves(dynamic: Sequence, treedef, static: tuple):
    """``(args, kwargs)`` from :func:`split_leaves`' parts (``dynamic`` may be traced)."""
    leaves = list(static)
    for i, x in zip([i for i, s in enumerate(static) if s is None], dynamic):
        leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves)


#: XLA:CPU compiler options of the model's one-shot executables: the elemental (pre-MLIR)
#: emitters instead of the fusion emitters (same HLO passes and LLVM optimisation level)
#: compile the model's graphs — thousands of scalar operations, evaluated once — in about
#: half to two thirds of the CPU time, with the same numbers to float rounding (a few ulp
#: in float32; experiments/bench_predict.py compares the command line's answers).
CPU_COMPILE_OPTIONS = {"xla_cpu_use_fusion_emitters": False}

#: XLA:CPU options of a process that evaluates each executable once (``jaxmodel predict``):
#: :data:`CPU_COMPILE_OPTIONS` and LLVM's optimisation level 0 — the HLO passes are XLA's
#: usual ones and XLA:CPU never enables fast-math reassociation, so the numbers are the same
#: (bit-identical on the command line's questions, experiments/bench_predict.py); the
#: two big graphs of a training step compile in about 60 % of the CPU time (4.1 -> 2.5 s
#: each), while a batch of millions of points would run slower.
ONE_SHOT_COMPILE_OPTIONS = {**CPU_COMPILE_OPTIONS, "xla_backend_optimization_level": 0}


def xla_flags(options: dict) -> tuple[str, ...]:
    """``options`` (name -> value) as ``XLA_FLAGS`` tokens (``--name=value``)."""
    return tuple(f"--{k}={str(v).lower() if isinstance(v, bool) else v}"
                 for k, v in options.items())


def backend_started() -> bool:
    """Whether JAX has started its backends (``XLA_FLAGS`` is read then); False where this
    JAX has no such query (flags set then are harmless if read too late)."""
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


@functools.lru_cache(maxsize=None)
def xla_knows(flags: tuple[str, ...]) -> bool:
    """Whether this JAX's XLA accepts ``flags`` in ``XLA_FLAGS``: XLA aborts the process at
    backend start on a flag it does not know, so a fresh Python process starts the CPU
    backend with them (about a second, once per process and set of flags)."""
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    try:
        return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def add_xla_flags(options: dict, accept=None) -> None:
    """Add ``options`` to ``XLA_FLAGS`` — those the user did not set — while XLA can still
    read the variable (before JAX starts its backend; child processes inherit it), and only
    if ``accept(flags)`` (when given) says this XLA knows them: XLA aborts the process at
    backend start on a flag it does not know (:func:`xla_knows` checks; the command line
    skips the check, a second start of JAX would cost most of its answer time)."""
    if backend_started():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    add = tuple(f for f in xla_flags(options) if f.split("=")[0] not in flags)
    if add and (accept is None or accept(add)):
        os.environ["XLA_FLAGS"] = " ".join([flags, *add]).strip()


@contextlib.contextmanager
def inlined_jits():
    """Inside a traced function: nested ``jax.jit`` calls (the jitted ``jax.numpy`` / ``lax``
    helpers) run as plain Python, their primitives entering the graph directly instead of
    as ``pjit`` equations — the same computation (XLA inlines those calls; the serving cost
    tables come out bit-identical), but a ``pjit`` equation is re-batched at every enclosing
    ``vmap`` (``jax._src.pjit._pjit_batcher``, JAX 0.10): most of the inference graph's
    tracing. The switch is the thread-local ``jax.disable_jit``, which unrolls ``lax.scan`` /
    ``fori_loop``: :func:`map_points` keeps its ``lax.map`` / ``shard_map``; use it only
    around bodies without loops of their own."""
    with jax.disable_jit():
        yield


class jit_leaves:
    """``fn`` jitted with :func:`split_leaves` (static leaves — names, flags, functions —
    baked in; numeric leaves as arguments, in the float dtype when ``cast``) and compiled
    with ``compiler_options`` (default :data:`CPU_COMPILE_OPTIONS`) on the CPU backend;
    plainly elsewhere, or where this XLA does not know an option (found on the first
    compile). ``compile(*args, **kwargs)`` lowers and compiles without running (numeric
    leaves may be :class:`jax.ShapeDtypeStruct`), filling the cache that the next call with
    the same shapes uses; it may run on another thread (XLA releases the GIL while
    compiling). ``cache_size()``: executables compiled so far.

    ``inline``: trace ``fn``'s body under :func:`inlined_jits` (the jitted ``jax.numpy``
    helpers inside enter the graph as their primitives: the same computation, traced and
    lowered in less time where the body nests ``vmap`` s; see there)."""

    def __init__(self, fn: Callable, cast: bool = True, compiler_options: dict | None = None,
                 inline: bool = False):
        self.cast = cast

        def flat(dynamic, treedef, static):
            args, kwargs = join_leaves(dynamic, treedef, static)
            with inlined_jits() if inline else contextlib.nullcontext():
                return fn(*args, **kwargs)
        # compilations (logs, jax.monitoring events) carry fn's name
        flat.__name__ = flat.__qualname__ = getattr(fn, "__name__", "fn")
        names = ("treedef", "static")
        self.plain = jax.jit(flat, static_argnames=names)
        self.tuned = jax.jit(flat, static_argnames=names, compiler_options=(
            CPU_COMPILE_OPTIONS if compiler_options is None else compiler_options))
        self.use_tuned = None

    def _split(self, args, kwargs):
        dynamic, treedef, static = split_leaves(args, kwargs, cast=self.cast)
        return dict(dynamic=dynamic, treedef=treedef, static=static)

    def _with(self, go):
        if self.use_tuned is None:
            self.use_tuned = jax.default_backend() == "cpu"
        if self.use_tuned:
            try:
                return go(self.tuned)
            except jax.errors.JaxRuntimeError as e:
                if "compile option" not in str(e):
                    raise
                self.use_tuned = False
        return go(self.plain)

    def __call__(self, *args, **kwargs):
        kw = self._split(args, kwargs)
        return self._with(lambda f: f(**kw))

    def compile(self, *args, **kwargs):
        kw = self._split(args, kwargs)
        return self._with(lambda f: f.lower(**kw).compile())

    def compile_async(self, *args, **kwargs) -> threading.Thread:
        """:meth:`compile` traced and lowered here (Python: one thread at a time), compiled
        on a background thread (XLA releases the GIL) while the caller traces its next
        graph; ``.join()`` the thread returned. A hint: a failed compilation is the call's
        to repeat and raise (an option this XLA does not know: the call compiles plainly)."""
        kw = self._split(args, kwargs)
        if self.use_tuned is None:
            self.use_tuned = jax.default_backend() == "cpu"
        tuned = self.use_tuned
        lowered = (self.tuned if tuned else self.plain).lower(**kw)

        def work():
            try:
                lowered.compile()
            except jax.errors.JaxRuntimeError as e:
                if tuned and "compile option" in str(e):
                    self.use_tuned = False
        return _Background(work)

    def cache_size(self) -> int:
        return self.plain._cache_size() + self.tuned._cache_size()


def _float_dtype():
    return jnp.result_type(float)


class _Background(threading.Thread):
    """Run ``work()`` in the background (loading or compiling an executable: jaxlib releases
    the GIL meanwhile, so it overlaps the caller's Python work); ``get()`` waits and returns
    its result, None where it raised."""

    def __init__(self, work: Callable):
        super().__init__(daemon=True)
        self.work, self.result = work, None
        self.start()

    def run(self):
        try:
            self.result = self.work()
        except Exception:          # a hint only: the caller builds it again
            self.result = None

    def get(self):
        self.join()
        return self.result
