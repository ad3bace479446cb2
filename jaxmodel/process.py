"""Process-level runtime settings: JAX's persistent compilation cache, progress reporting.

Compilation cache
    :func:`configure_compilation_cache` (called once by ``import jaxmodel``) turns on JAX's
    persistent compilation cache in a per-user directory — ``$JAXMODEL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/jaxmodel/jax``, else ``~/.cache/jaxmodel/jax``; one subdirectory per
    host CPU type — unless

    - ``JAXMODEL_NO_CACHE=1`` is set, or
    - JAX has no GPU/TPU backend installed, ``JAXMODEL_CACHE_DIR`` is not set and this is not
      the ``jaxmodel`` command: in library use on CPU the cache is opt-in (set
      ``JAXMODEL_CACHE_DIR``), because jaxlib's CPU executable loader logs two long ERROR
      lines on every cache hit (openxla/xla#44565; results unaffected) unless
      ``TF_CPP_MIN_LOG_LEVEL=3`` was set before jaxlib loaded (:func:`prepare_logging` does so
      where the cache will be on), or
    - the user configured JAX's cache already (``jax_compilation_cache_dir`` set, e.g. by
      ``JAX_COMPILATION_CACHE_DIR``, or ``jax_enable_compilation_cache`` turned off).

    JAX keys each entry by the HLO module, the compile options, the backend and the jaxlib
    version, so a new jaxlib or a changed model recompiles; a hit returns the executable XLA
    would have built (results are identical). Compilations longer than :data:`MIN_COMPILE_S`
    are stored: besides the tile searches (tens of seconds to compile) a prediction runs some
    30 small jits of 0.1–1 s each, worth seconds together; reading an entry back costs
    milliseconds. Tracing and lowering to MLIR are not cached by JAX (it redoes them in every
    process); the command line adds the export cache (:func:`export_cache_dir`), which keeps
    the compiled batch functions on disk by a key that needs no tracing, so a repeated
    question with the same shapes (other numbers included) skips tracing, lowering and
    compiling: ``jaxmodel predict train`` went from ≈ 7 s to ≈ 2.2–3.2 s CPU time per warm
    process with the lowered modules stored (2 cores, load 13–15), and to ≈ 1.25–1.3 s with
    the executables stored (load 9–10), most of it the loading of two executables.

Progress
    :func:`progress_bar` (a tqdm bar for a loop of blocks) and :func:`stage` (one status line
    for a stage, with the seconds spent compiling reported separately from the rest) write to
    stderr only when a stage runs longer than :data:`SHOW_AFTER_S`; ``JAXMODEL_QUIET=1`` or
    :func:`set_quiet` silences both. Compile seconds come from JAX's own monitoring events
    (``/jax/core/compile/*`` durations: tracing, lowering and the XLA backend compile).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from pathlib import Path

MIN_COMPILE_S = 0.1   # store compilations longer than this in the persistent cache, s
SHOW_AFTER_S = 2.0    # report a stage that takes longer than this, s

_quiet: bool | None = None
_cache_dir: Path | None = None


# ---------------------------------------------------------------------------------------------
# persistent compilation cache

def _host_tag() -> str:
    """Short fingerprint of the host CPU (architecture and, on Linux, its feature flags).

    JAX's cache key names the backend but not the host's instruction-set extensions, and
    jaxlib 0.10's XLA:CPU loader only warns when a cached executable was built for features
    this host lacks (openxla/xla#44565 makes that check unreliable). One subdirectory per
    host type keeps a home directory shared between different machines safe."""
    import hashlib
    import platform
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            text += next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return "host-" + hashlib.sha1(text.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    """``$JAXMODEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/jaxmodel/jax``, else
    ``~/.cache/jaxmodel/jax`` — with one subdirectory per host CPU type (:func:`_host_tag`)."""
    env = os.environ.get("JAXMODEL_CACHE_DIR")
    if env:
        base = Path(env).expanduser()
    else:
        home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        base = Path(home).expanduser() / "jaxmodel" / "jax"
    return base / _host_tag()


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _accelerator_plugin_installed() -> bool:
    """True when a GPU or TPU backend of JAX is installed (checked without importing it)."""
    import importlib.util
    return any(importlib.util.find_spec(m) is not None for m in (
        "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin",
        "libtpu"))


def cli_process() -> bool:
    """True in the ``jaxmodel`` console script (whose cache defaults differ, see
    :func:`configure_compilation_cache`)."""
    return bool(sys.argv) and Path(sys.argv[0]).name in ("jaxmodel", "jaxmodel.exe")


def prepare_logging() -> None:
    """Called by ``import jaxmodel`` before jaxlib loads: where the persistent cache will be
    on in a CPU-only install (``JAXMODEL_CACHE_DIR`` set, or the command line), default
    ``TF_CPP_MIN_LOG_LEVEL`` to 3 so that jaxlib's two ERROR lines on every cache hit
    (openxla/xla#44565) stay hidden; a user's own value wins, and nothing changes once
    jaxlib is loaded (it reads the variable when it loads)."""
    if "jaxlib" in sys.modules or _truthy("JAXMODEL_NO_CACHE"):
        return
    if (os.environ.get("JAXMODEL_CACHE_DIR") or cli_process()) \
            and not _accelerator_plugin_installed():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def configure_compilation_cache(cli: bool | None = None) -> Path | None:
    """Enable JAX's persistent compilation cache in :func:`default_cache_dir` (see the module
    docstring for when it stays off). Returns the directory in use by jaxmodel, or None.

    ``cli`` (default: whether this is the ``jaxmodel`` console script) selects the command
    line's defaults: the cache on for CPU too, every compilation stored (a prediction's
    small jits are worth seconds together) and the export cache (:func:`export_cache_dir`)
    on. Call it before the first compilation: JAX fixes its cache settings then."""
    global _cache_dir, _export_dir
    cli = cli_process() if cli is None else cli
    if _truthy("JAXMODEL_NO_CACHE"):
        return None
    if not cli and not os.environ.get("JAXMODEL_CACHE_DIR") \
            and not _accelerator_plugin_installed():
        # CPU only: opt-in. jaxlib's CPU AOT loader logs two multi-kilobyte ERROR lines on
        # every cache hit (openxla/xla#44565) although the executables load and agree.
        return None
    import jax
    path = default_cache_dir()
    if (jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache) \
            and _cache_dir != path:
        return None   # the user's own configuration wins
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None   # read-only home: run without a persistent cache
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      0.0 if cli else MIN_COMPILE_S)
    _cache_dir = path
    if cli:
        _export_dir = path.parent / "exports" / path.name
    return path


# ---------------------------------------------------------------------------------------------
# export cache: traced-and-lowered batch functions, so a repeated question skips tracing

_export_dir: Path | None = None


def export_cache_dir() -> Path | None:
    """Directory of the export cache, or None (off; :func:`configure_compilation_cache`
    turns it on for the command line).

    :func:`jaxmodel.batching.call_batched` stores each batch function it traces there as the
    executable XLA compiled for it (``jax.experimental.serialize_executable``), keyed by the function, its static
    arguments, the input shapes and dtypes, ``XLA_FLAGS`` and :func:`code_fingerprint`; a
    later process with the same key loads the executable instead of tracing, lowering and
    compiling the model again (seconds per call). Only the command line turns it on: in
    library use a module attribute patched at run time (which the key cannot see) would give
    stale graphs."""
    return _export_dir


def set_export_cache_dir(path: Path | str | None) -> None:
    """Turn the export cache on in ``path`` (or off with None)."""
    global _export_dir
    _export_dir = None if path is None else Path(path)


_fingerprint: str | None = None


def code_fingerprint() -> str:
    """Hash of everything a traced graph may depend on besides its arguments: the source and
    data files of ``jaxmodel`` and ``hw_db`` (calibrated constants are read while tracing),
    the jax and jaxlib versions, the backend, the device count and the float width."""
    global _fingerprint
    if _fingerprint is None:
        import hashlib
        import importlib.util
        import jax
        import jaxlib
        h = hashlib.sha1()
        h.update(repr((jax.__version__, jaxlib.__version__, jax.default_backend(),
                       jax.device_count(), bool(jax.config.jax_enable_x64))).encode())
        for pkg in ("jaxmodel", "hw_db"):
            spec = importlib.util.find_spec(pkg)
            if spec is None or not spec.submodule_search_locations:
                continue
            root = Path(list(spec.submodule_search_locations)[0])
            for f in sorted(root.rglob("*")):
                if f.suffix in (".py", ".toml", ".json", ".csv") and f.is_file():
                    h.update(str(f.relative_to(root)).encode())
                    h.update(f.read_bytes())
        _fingerprint = h.hexdigest()[:16]
    return _fingerprint


def cache_state() -> str:
    """One phrase for reports: ``"off"`` or ``"<dir> (warm|empty)"``."""
    d = _cache_dir
    return "off" if d is None else f"{d} ({'warm' if any(d.iterdir()) else 'empty'})"


def compilation_cache_dir() -> Path | None:
    """The directory jaxmodel configured for JAX's compilation cache (None when it did not)."""
    return _cache_dir


# ---------------------------------------------------------------------------------------------
# quiet flag and compile-time accounting

def set_quiet(quiet: bool | None = True) -> None:
    """Silence (True) or allow (False) progress output; None follows ``JAXMODEL_QUIET``."""
    global _quiet
    _quiet = quiet


@contextlib.contextmanager
def silenced(on: bool = True):
    """Progress output off inside (when ``on``); the previous setting afterwards."""
    global _quiet
    prev = _quiet
    if on:
        _quiet = True
    try:
        yield
    finally:
        _quiet = prev


def quiet() -> bool:
    """True when progress output is off (:func:`set_quiet`, else ``JAXMODEL_QUIET=1``), and
    always on the processes other than process 0 of a ``jax.distributed`` job
    (:mod:`jaxmodel.distributed`: progress on process 0 only)."""
    if _secondary_process():
        return True
    return _quiet if _quiet is not None else _truthy("JAXMODEL_QUIET")


def _secondary_process() -> bool:
    """True in a ``jax.distributed`` job on a process other than 0 (JAX's distributed state
    read where JAX has loaded it; nothing is imported or started)."""
    mod = sys.modules.get("jax._src.distributed")
    state = getattr(mod, "global_state", None)
    return bool(state is not None and getattr(state, "client", None) is not None
                and (getattr(state, "process_id", 0) or 0) != 0)


_compile_s = 0.0
_compile_lock = threading.Lock()
_listening = False
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")


def _on_duration(event: str, duration: float, **_) -> None:
    global _compile_s
    if event in _COMPILE_EVENTS:
        with _compile_lock:
            _compile_s += float(duration)


def compile_seconds() -> float:
    """Seconds this process spent tracing, lowering and compiling with JAX since the first
    call of this function (a persistent-cache hit counts as its retrieval time)."""
    global _listening
    if not _listening:
        import jax
        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _listening = True
    return _compile_s


# ---------------------------------------------------------------------------------------------
# progress

def _fmt(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


@contextlib.contextmanager
def stage(desc: str, *, show_after: float | None = None, stream=None):
    """Time a stage; if it ran longer than ``show_after`` seconds (default
    :data:`SHOW_AFTER_S`) and output is not quiet,
    write ``[jaxmodel] desc: 12.3 s (compile 9.8 s, run 2.5 s)`` to stderr.

    Yields a dict in which the caller may put ``note`` (appended to the line, e.g. a count).
    """
    c0, t0 = compile_seconds(), time.perf_counter()
    info: dict = {}
    try:
        yield info
    finally:
        wall = time.perf_counter() - t0
        comp = min(compile_seconds() - c0, wall)
        info.update(wall_s=wall, compile_s=comp)
        if wall > (SHOW_AFTER_S if show_after is None else show_after) and not quiet():
            note = f", {info['note']}" if info.get("note") else ""
            print(f"[jaxmodel] {desc}: {_fmt(wall)} (compile {_fmt(comp)}, run "
                  f"{_fmt(wall - comp)}{note})", file=stream or sys.stderr, flush=True)


class progress_bar:
    """A tqdm bar on stderr for a loop of ``total`` units, shown only when the loop is not
    quiet and is still running after ``show_after`` seconds (so short loops print nothing).
    Use as ``with progress_bar(n, "sweep") as bar: ... bar.update(k)``."""

    def __init__(self, total: int, desc: str, unit: str = "pt", *,
                 show_after: float | None = None, enabled: bool = True):
        self.total, self.desc, self.unit = int(total), desc, unit
        self.show_after = SHOW_AFTER_S if show_after is None else show_after
        self.enabled = enabled and not quiet()
        self.done = 0
        self.t0 = time.perf_counter()
        self.c0 = compile_seconds()
        self._bar = None

    def __enter__(self):
        return self

    def update(self, n: int = 1) -> None:
        self.done += int(n)
        if self._bar is None and self.enabled and self.done < self.total \
                and time.perf_counter() - self.t0 > self.show_after:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit,
                             unit_scale=True, file=sys.stderr, initial=self.done - int(n))
        if self._bar is not None:
            self._bar.update(int(n))

    def close(self) -> None:
        if self._bar is not None:
            comp = compile_seconds() - self.c0
            self._bar.set_postfix_str(f"compile {_fmt(comp)}", refresh=True)
            self._bar.close()
            self._bar = None

    def __exit__(self, *exc):
        self.close()
        return False


def lazy_exports(package: str, table: dict[str, str]):
    """``(__getattr__, __dir__)`` for a package whose names load with their module on first
    access (PEP 562): ``table`` maps a name to the submodule of ``package`` defining it; the
    loaded value is kept in the package's namespace, so later look-ups are plain."""
    pkg_globals = sys.modules[package].__dict__

    def __getattr__(name):
        if name in table:
            value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
            pkg_globals[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(pkg_globals) | set(table))

    return __getattr__, __dir__
