"""Multi-process runs: one sweep or search spread over the processes of a ``jax.distributed`` job.

JAX's multi-controller runtime runs one Python process per host (or per accelerator), all
executing the same program; :func:`jax.distributed.initialize` connects them through a
coordinator (JAX documentation, "Multi-host and multi-process environments";
``jax/_src/distributed.py`` of JAX 0.10 and its cluster detectors in
``jax/_src/clusters/``: SLURM, Open MPI, Kubernetes, Cloud TPU, mpi4py). The searches of
:mod:`jaxmodel.search` use it through three helpers here (after :func:`initialize`), so that the same call runs on one
process or on many and returns the same rows in the same order:

- :func:`process_slice`: the contiguous share ``[lo, hi)`` of ``n`` design points (or plans,
  starts, rows) that this process evaluates — the first ``n mod P`` processes take one more;
- :func:`gather` / :func:`gather_rows`: every process's result (any picklable object; for
  rows, the pytrees of numpy arrays concatenated in process order) on every process, through
  two all-gathers (the sizes, then the bytes) over a global mesh of one device per process
  (:func:`jax.experimental.multihost_utils.process_allgather`; the gloo CPU collectives on a
  CPU cluster, NCCL or the TPU interconnect elsewhere). Results travel as their pickled
  bytes, so dtypes, strings and 64-bit numbers arrive bit for bit;
- :func:`check_same`: the processes' inputs compared through one all-gather of their
  SHA-256 digests; a mismatch raises ``ValueError`` naming the input (down to the pytree
  leaf, e.g. ``system.levels[0].bw_per_device``) and the processes that differ.

Evaluation stays process-local: each process maps its share over its own devices
(:func:`jaxmodel.batching.device_mesh` defaults to :func:`jax.local_devices`), so the model's
graphs hold no collectives, processes never wait for each other between blocks, and a
point's numbers do not depend on which process evaluated it. The only synchronisation is
the input check before and the gather after a search.

Process 0 alone shows progress (:func:`jaxmodel.process.quiet` is true on the others).
Inside ``with local():`` calls run whole on their process (work split by the caller);
:func:`launch_local` starts a job of ``n`` processes on this machine (tests, benchmarks).

Example (two processes on one machine, the second started with ``process_id=1``)::

    jm.distributed.initialize("127.0.0.1:12355", num_processes=2, process_id=0)
    df = jm.sweep(jm.gemm_latency, dev, 4096, 4096, 4096, grid={"dev.mem_bw": bws})
    # every process returns the whole DataFrame; process 0 writes it
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
from typing import Any, Mapping

import numpy as np

__all__ = ["initialize", "is_distributed", "process_index", "process_count", "is_main",
           "process_slice", "local_rows", "local", "gather", "gather_rows", "check_same",
           "fingerprint", "free_port", "launch_local"]

#: Environment variables read by :func:`initialize` when an argument is not given
#: (``JAX_COORDINATOR_ADDRESS`` is JAX's own; the other two follow its naming).
ENV = {"coordinator_address": "JAX_COORDINATOR_ADDRESS",
       "num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}


def _state():
    from jax._src import distributed as _d
    return _d.global_state


_LOCAL = threading.local()


def is_distributed() -> bool:
    """True in a ``jax.distributed`` job of more than one process (read from JAX's
    distributed state: no backend is started), outside :func:`local`."""
    if getattr(_LOCAL, "depth", 0):
        return False
    s = _state()
    return s.client is not None and (s.num_processes or 1) > 1


@contextlib.contextmanager
def local():
    """``with local():`` — searches and sweeps inside evaluate everything on this process
    alone (no split, no check, no gather), as outside a job. For work split by the caller:
    e.g. a co-search giving each process its own hardware points
    (:func:`process_slice`), each searched whole, the best rows :func:`gather`-ed after.
    :func:`process_index` and :func:`process_count` still describe the job."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


def _in_job() -> bool:
    s = _state()
    return s.client is not None and (s.num_processes or 1) > 1


def process_index() -> int:
    """This process's index (0 outside a distributed job)."""
    return int(_state().process_id or 0) if _in_job() else 0


def process_count() -> int:
    """Processes of the job (1 outside a distributed job)."""
    return int(_state().num_processes or 1) if _in_job() else 1


def is_main() -> bool:
    """True on process 0 (and in a single-process run)."""
    return process_index() == 0


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids=None,
               initialization_timeout: int = 300) -> int:
    """Join (or start, on process 0) a ``jax.distributed`` job; returns the process count.

    Arguments left ``None`` come from :data:`ENV` (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), and otherwise from JAX's cluster detection
    (SLURM, Open MPI's ``mpirun``, Kubernetes indexed jobs, Cloud TPU: ``jax._src.clusters``).
    Must run before anything starts JAX's backends; a second call in a process that joined
    a job already does nothing. On the CPU backend the cross-process collectives are gloo's
    (``jax_cpu_collectives_implementation``, JAX 0.10's default).

    Raises:
        ValueError: a number that is not an integer in range (naming the argument), or no
            coordinator found (not given, not in the environment, no detected cluster).
    """
    import jax
    if _state().client is not None:
        return process_count()

    def from_env(name, value):
        if value is None and os.environ.get(ENV[name], "").strip():
            value = os.environ[ENV[name]].strip()
        return value

    coordinator_address = from_env("coordinator_address", coordinator_address)
    num_processes = from_env("num_processes", num_processes)
    process_id = from_env("process_id", process_id)
    for name, v, low in (("num_processes", num_processes, 1), ("process_id", process_id, 0)):
        if v is None:
            continue
        try:
            iv = int(str(v))
        except ValueError:
            raise ValueError(f"distributed.initialize: {name} must be an integer, got "
                             f"{v!r}") from None
        if iv < low:
            raise ValueError(f"distributed.initialize: {name} must be >= {low}, got {v!r}")
    num_processes = None if num_processes is None else int(str(num_processes))
    process_id = None if process_id is None else int(str(process_id))
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"distributed.initialize: process_id={process_id} is not below "
                         f"num_processes={num_processes}")
    try:
        if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except AttributeError:         # a JAX without the option: its own default
        pass
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   local_device_ids=local_device_ids,
                                   initialization_timeout=initialization_timeout)
    except ValueError as e:
        raise ValueError(
            f"distributed.initialize: {e} (give the coordinator address, process count and "
            f"id, set {', '.join(ENV.values())}, or run under SLURM / mpirun / a "
            f"Kubernetes indexed job)") from None
    return process_count()


def process_slice(n: int, index: int | None = None, count: int | None = None
                  ) -> tuple[int, int]:
    """``(lo, hi)``: the contiguous share of ``n`` items of process ``index`` of ``count``
    (default: this process of this job; the whole range inside :func:`local`); the first
    ``n mod count`` processes take one item more, so shares differ by at most one and, in
    process order, tile ``0 .. n``."""
    job = is_distributed()            # inside :func:`local`: the whole range
    index = (process_index() if job else 0) if index is None else int(index)
    count = (process_count() if job else 1) if count is None else int(count)
    n = int(n)
    if n < 0 or count < 1 or not 0 <= index < count:
        raise ValueError(f"process_slice: bad n={n}, index={index}, count={count}")
    base, extra = divmod(n, count)
    lo = index * base + min(index, extra)
    return lo, lo + base + (index < extra)


def local_rows(n: int) -> tuple[slice, int]:
    """``(rows, keep)``: the slice of ``n`` rows this process evaluates and how many of its
    results it keeps — its share (:func:`process_slice`), or, for a process left without
    rows (more processes than rows), the last row with none kept, so that every process
    runs the same graphs and returns the same structure. ``n >= 1``."""
    lo, hi = process_slice(n)
    if hi > lo:
        return slice(lo, hi), hi - lo
    return slice(n - 1, n), 0


def _allgather_u32(words: np.ndarray) -> np.ndarray:
    """``(P,) + words.shape``: this process's ``uint32`` array (same shape everywhere) from
    every process, in process order. The words travel padded to a power of two (at least
    64): each gathered shape is a compilation of the collective, so the small messages (digests,
    sizes) share one."""
    from jax.experimental import multihost_utils
    words = np.ascontiguousarray(words, dtype=np.uint32)
    n = words.size
    width = max(64, 1 << max(0, (n - 1).bit_length()))
    flat = np.zeros(width, dtype=np.uint32)
    flat[:n] = words.reshape(-1)
    out = np.asarray(multihost_utils.process_allgather(flat, tiled=False), dtype=np.uint32)
    return out.reshape(process_count(), width)[:, :n].reshape((process_count(),) + words.shape)


def gather(obj: Any) -> list:
    """Every process's ``obj`` (picklable), as a list in process order, on every process;
    ``[obj]`` outside a distributed job. Two all-gathers: the byte lengths, then the bytes
    (padded to the longest)."""
    if not is_distributed():
        return [obj]
    blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sizes = _allgather_u32(np.asarray([len(blob) & 0xFFFFFFFF, len(blob) >> 32],
                                      dtype=np.uint64).astype(np.uint32))
    lengths = [int(s[0]) | (int(s[1]) << 32) for s in sizes]
    words = -(-max(lengths) // 4)
    buf = np.zeros(words * 4, dtype=np.uint8)
    buf[:len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    allw = _allgather_u32(buf.view(np.uint32))
    return [pickle.loads(allw[p].view(np.uint8)[:lengths[p]].tobytes())
            for p in range(len(lengths))]


def gather_rows(tree: Any) -> Any:
    """A pytree of arrays whose leaves carry this process's rows on the leading axis, with
    every process's rows concatenated in process order (the inverse of
    :func:`process_slice`): the same pytree a single process would have computed.
    Unchanged outside a distributed job."""
    if not is_distributed():
        return tree
    import jax
    parts = gather(jax.tree_util.tree_map(np.asarray, tree))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=0), *parts)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _digest_leaf(leaf: Any) -> bytes:
    h = hashlib.sha256()
    if callable(leaf) and not hasattr(leaf, "shape"):
        h.update(f"callable:{getattr(leaf, '__module__', '')}."
                 f"{getattr(leaf, '__qualname__', type(leaf).__qualname__)}".encode())
    elif isinstance(leaf, (str, bytes, bool, type(None), type)):
        h.update(repr(leaf).encode())
    else:
        try:
            a = np.asarray(leaf)
        except Exception:
            a = None
        if a is not None and a.dtype != object:
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(_ADDRESS.sub("", repr(leaf)).encode())
    return h.digest()


def fingerprint(obj: Any) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``(digest, structure digest, [(leaf path, leaf digest)])`` of a pytree of inputs:
    numbers by dtype, shape and bytes; strings, flags and types by ``repr``; functions by
    module and qualified name; other objects by ``repr`` without memory addresses."""
    import jax
    paths, treedef = jax.tree_util.tree_flatten_with_path(obj)
    leaves = [(jax.tree_util.keystr(p), _digest_leaf(x)) for p, x in paths]
    struct = hashlib.sha256(_ADDRESS.sub("", str(treedef)).encode()).digest()
    h = hashlib.sha256(struct)
    for _, d in leaves:
        h.update(d)
    return h.digest(), struct, leaves


def _words(digest: bytes) -> np.ndarray:
    return np.frombuffer(digest[:16], dtype=np.uint32)


def check_same(where: str, inputs: Mapping[str, Any]) -> None:
    """Raise unless every process of the job passes equal ``inputs`` (``{name: pytree}``,
    the same names on every process: the call's arguments). One all-gather of the digests
    (:func:`fingerprint`) in the common case; on a mismatch a second one names the pytree
    leaves that differ (where the inputs' structures agree). Nothing outside a distributed
    job.

    Raises:
        ValueError: naming ``where``, the differing input or leaves and the processes.
    """
    if not is_distributed():
        return
    names = list(inputs)
    prints = [fingerprint(inputs[k]) for k in names]
    mine = np.stack([np.concatenate([_words(d), _words(s), [len(lv)]]).astype(np.uint32)
                     for d, s, lv in prints]) if names else np.zeros((0, 9), np.uint32)
    everyone = _allgather_u32(mine)                              # (P, inputs, 9)
    differs = [i for i in range(len(names)) if (everyone[:, i] != everyone[0, i]).any()]
    if not differs:
        return
    # leaf-level comparison of the inputs whose structure agrees on every process
    same_struct = [i for i in differs if (everyone[:, i, 4:] == everyone[0, i, 4:]).all()]
    leaf_words = [_words(d) for i in same_struct for _, d in prints[i][2]]
    detail = {}
    if leaf_words:
        allw = _allgather_u32(np.stack(leaf_words))               # (P, leaves, 4)
        j = 0
        for i in same_struct:
            paths = [p for p, _ in prints[i][2]]
            k = len(paths)
            bad = (allw[:, j:j + k] != allw[0, j:j + k]).any(axis=(0, 2))
            detail[i] = [names[i] + paths[m] for m in np.nonzero(bad)[0]]
            j += k
    parts = []
    for i in differs:
        procs = [int(p) for p in np.nonzero((everyone[:, i] != everyone[0, i]).any(axis=1))[0]]
        what = (", ".join(detail[i][:8]) + (" ..." if len(detail[i]) > 8 else "")
                if detail.get(i) else f"{names[i]} (its structure)")
        parts.append(f"{what} on process(es) {procs}")
    raise ValueError(
        f"{where}: the processes of this jax.distributed job disagree on their inputs — "
        f"{'; '.join(parts)} differ from process 0's (every process must make the same "
        f"call with the same arguments)")



def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the operating system's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_local(argv: list[str], n: int, *, env: Mapping[str, str] | None = None,
                 timeout: float | None = None, cwd=None, grace: float = 20.0) -> list:
    """Run ``n`` copies of the Python command ``argv`` (arguments after the interpreter) as
    the processes of one ``jax.distributed`` job on this machine: a free coordinator port
    on 127.0.0.1 and :data:`ENV` set per process (``JAX_PROCESS_ID`` = 0 .. n-1), so each
    copy joins with a bare :func:`initialize`; ``JAX_PLATFORMS=cpu`` unless ``env`` sets
    it. Waits for all and returns their :class:`subprocess.CompletedProcess` list (text
    output), in process order. When one fails, the others (waiting for it in a
    collective) get ``grace`` seconds before they are killed; past ``timeout`` seconds all
    are killed and :class:`subprocess.TimeoutExpired` raised."""
    import tempfile
    import time
    n = int(n)
    if n < 1:
        raise ValueError(f"launch_local: n must be >= 1, got {n}")
    base = dict(os.environ if env is None else env)
    base.setdefault("JAX_PLATFORMS", "cpu")
    base[ENV["coordinator_address"]] = f"127.0.0.1:{free_port()}"
    base[ENV["num_processes"]] = str(n)
    with tempfile.TemporaryDirectory() as tmp:
        files = [(open(f"{tmp}/{i}.out", "w+"), open(f"{tmp}/{i}.err", "w+"))
                 for i in range(n)]
        procs = [subprocess.Popen([sys.executable, *map(str, argv)], cwd=cwd,
                                  stdout=files[i][0], stderr=files[i][1], text=True,
                                  env={**base, ENV["process_id"]: str(i)})
                 for i in range(n)]
        t0, failed_at = time.monotonic(), None
        try:
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if failed_at is None and any(p.returncode for p in procs):
                    failed_at = now
                if timeout is not None and now - t0 > timeout:
                    raise subprocess.TimeoutExpired(argv, timeout)
                if failed_at is not None and now - failed_at > grace:
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        done = []
        for p, (fo, fe) in zip(procs, files):
            fo.seek(0), fe.seek(0)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, fo.read(),
                                                    fe.read()))
            fo.close(), fe.close()
    return done
