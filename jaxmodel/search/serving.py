"""Serving-configuration search under time-to-first-token / time-per-output-token limits.

:func:`search_serving` enumerates, for one model on ``n_devices`` devices, every serving
configuration of

- aggregated serving (continuous batching, :func:`jaxmodel.serving.continuous_batching`):
  ``tp × pp`` (``dp = n/(tp·pp)`` replicas) × batch cap × prefill chunk (0 = none) ×
  precision × runtime × load;
- disaggregated serving (:func:`jaxmodel.serving.disaggregated`): a prefill pool of ``n_p``
  and a decode pool of ``n − n_p`` devices, each with its own ``tp × pp`` (DistServe's
  per-phase parallelism, Zhong et al., OSDI'24, §4.1) × batch cap × precision × runtime ×
  load;

where *load* is the arrival rate as a fraction of the configuration's capacity (the rate at
which its queue becomes unbounded), so every configuration is visited along its own
latency-throughput curve (the concurrency sweep of NVIDIA aiconfigurator's and
vLLM's benchmark tools). It returns the Pareto front of output tokens/s per device against
tokens/s per user among the configurations that are feasible and meet both limits
(:func:`jaxmodel.plots.serving_plot` draws it from ``full=True``).

Two batched stages, as :func:`jaxmodel.search_parallelism` de-duplicates its stage times:

1. the per-iteration cost table (:func:`jaxmodel.serving.serving_costs`: the expensive
   :func:`jaxmodel.inference` evaluations with their GEMM tile searches) once per distinct
   ``(tp, pp, precision, runtime)`` — tens of rows;
2. the steady-state formulas (:mod:`jaxmodel.serving`, elementwise algebra on the table) on
   every configuration, gathering its table rows by index, in one jitted
   :func:`jaxmodel.batching.map_points` call — 10⁵ rows.

A search compiles four executables: the cost tables, their offline column and the steady
state of the aggregated and of the disaggregated rows. Stage 2 needs only the shapes of the
tables, so the graphs are traced one after the other on the caller's thread (tracing is
Python: one thread at a time) and each compiles on a thread of its own as soon as it is
lowered (XLA releases the GIL while compiling): stage 2 traces while stage 1 compiles, and
the compilations run side by side. Stage 1 runs in parts of its rows, one per core, side by
side with one executable (XLA:CPU evaluates its biggest fusion, the tables' GEMM tile
searches, on one core). Stage 1 times its GEMMs together
(:func:`jaxmodel.parallel.gemm_table.gemms_batched` with the hook
:func:`~jaxmodel.parallel.gemm_table.deferred_gemm`): every GEMM of the inference graph (the
layer lanes, LM heads and draft projections of every table row and batch point) in one
tile search per kind over the distinct shapes — the decode lanes at three KV lengths share
their weight GEMMs, tables of one tensor-parallel degree many more — so the graph holds two
copies of the tile search instead of one per call site and evaluates a fraction of the
candidates. Stage 1 is traced with the ``jax.numpy`` helpers' jits
inlined (:func:`jaxmodel.batching.inlined_jits`: the same graph, about 40 % less tracing
and lowering under its nested ``vmap`` s). On the CPU backend
(:class:`jaxmodel.batching.jit_leaves`) stage 1, which runs once on tens of rows, compiles with
:data:`jaxmodel.batching.ONE_SHOT_COMPILE_OPTIONS` (LLVM level 0: about half the compile time
of its graph, the same numbers to float rounding) and stage 2, which runs on 10⁵ rows, with
:data:`jaxmodel.batching.CPU_COMPILE_OPTIONS`. Most of a cold search is the tracing and XLA
compilation of stage 1's graph (the inference model with its GEMM tile searches), whose size
does not depend on how many configurations are searched.

Both stages print their progress through :func:`jaxmodel.process.stage`. In a
``jax.distributed`` job (:mod:`jaxmodel.distributed`) every process computes the cost tables
(tens of rows: mostly compilation, which each process does anyway) and evaluates a contiguous
share of the configurations in stage 2; the rows are gathered onto every process before the
front is taken: the same table as one process computes.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxmodel import distributed
from jaxmodel import process as _process
from jaxmodel import serving_runtime as _rtp
from jaxmodel import serving as _srv
from jaxmodel import speculative as _spec
from jaxmodel.batching import ONE_SHOT_COMPILE_OPTIONS, jit_leaves, map_points
from jaxmodel.numerics import REASONS, pareto_mask
from jaxmodel.parallel.gemm_table import deferred_gemm, gemms_batched
from jaxmodel.types import Model, Parallelism, System
from jaxmodel.workload.layer import variant_of

from jaxmodel import precisions as _precision

__all__ = ["search_serving"]

#: Defaults of the enumeration.
MAX_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CHUNKS = (0, 256, 512, 1024, 2048)
LOADS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95,
         0.98)
PRECISIONS = ("bf16", "fp8")
RUNTIMES = ("pytorch", "trtllm", "vllm")
PP = (1, 2, 4, 8)
ROW_CHUNK = 8192
#: Most parts the cost tables are evaluated in side by side (:func:`_table_parts`).
MAX_TABLE_PARTS = 4


def _default_tp(system: System) -> list[int]:
    """The powers of two up to the size of the system's innermost network tier."""
    inner = int(float(np.asarray(system.levels[0].size))) if system.levels else 1
    return [2 ** i for i in range(8) if 2 ** i <= max(inner, 1)]


def _plans(n: int, tps: Sequence[int], pps: Sequence[int]) -> list[tuple[int, int]]:
    return [(t, p) for t in sorted(set(tps)) for p in sorted(set(pps))
            if t >= 1 and p >= 1 and n % (t * p) == 0]


def _evaluate(table, rows, system, isl, osl, ttft_slo, tpot_slo, disagg: bool):
    """Stage 2: the steady state of every row (one :func:`map_points` call)."""
    def take(k):
        return jax.tree_util.tree_map(lambda x: x[k.astype(jnp.int32)], table)

    def agg(r):
        c = take(r["k"])
        cap = r["dp"] * _srv.aggregated_capacity(c, isl, osl, r["max_batch"], r["pp"],
                                                  r["chunk"])
        opts = _srv.ServingOptions(max_batch=r["max_batch"], chunk=r["chunk"],
                                   ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo)
        return _srv.continuous_batching_from_costs(c, isl, osl, r["load"] * cap, opts,
                                                   r["dp"], r["pp"], r["n"])

    def dis(r):
        pre, dec = take(r["k"]), take(r["k_d"])
        pools = _srv.Pools(r["dp_p"], r["pp_p"], r["tp_p"], r["dp"], r["pp"], r["tp"])
        probe = _srv.disaggregated_from_costs(
            pre, dec, system, isl, osl, 0.0, _srv.ServingOptions(max_batch=r["max_batch"]),
            pools)
        opts = _srv.ServingOptions(max_batch=r["max_batch"], ttft_slo_s=ttft_slo,
                                   tpot_slo_s=tpot_slo)
        return _srv.disaggregated_from_costs(
            pre, dec, system, isl, osl, r["load"] * probe.capacity_rps, opts, pools)

    return map_points(dis if disagg else agg, rows, chunk=ROW_CHUNK)


#: Stage 1: :func:`jaxmodel.serving.serving_costs` of every (plan, precision, runtime) row
#: with its GEMMs timed together (:func:`jaxmodel.parallel.gemm_table.gemms_batched`; the
#: tables' engine carries :func:`~jaxmodel.parallel.gemm_table.deferred_gemm`)
#: (and :data:`_offline_jit`, the offline column of the same rows): run once per search,
#: so compiled with :data:`jaxmodel.batching.ONE_SHOT_COMPILE_OPTIONS` on the CPU backend
#: (XLA's HLO passes unchanged, LLVM level 0: the inference graph with its GEMM tile
#: searches compiles in less time; the same numbers to float rounding), traced with the
#: jitted jax.numpy helpers inlined (no loops inside but the GEMMs' own, which
#: :func:`~jaxmodel.parallel.gemm_table.gemms_batched` builds as a loop:
#: :func:`jaxmodel.batching.inlined_jits`).
_tables_jit = jit_leaves(gemms_batched(_srv._serving_costs),
                         compiler_options=ONE_SHOT_COMPILE_OPTIONS, inline=True)
#: Stage 2: the steady state of 10⁵ rows (run on many rows: the default optimisation level).
_evaluate_jit = jit_leaves(_evaluate, cast=False)


def _table_struct(n_rows: int) -> _srv.ServingCosts:
    """Shapes and dtypes of the stage-1 tables of ``n_rows`` rows (to compile stage 2 before
    they exist)."""
    f = jnp.result_type(float)
    grid = {"step_s", "attn_s"}
    dtype = {"feasible": jnp.bool_, "reason": jnp.int32}
    return _srv.ServingCosts(**{name: jax.ShapeDtypeStruct(
        (n_rows, len(_srv.TOKEN_GRID)) if name in grid else (n_rows,), dtype.get(name, f))
        for name in _srv.ServingCosts.__dataclass_fields__})


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """What :func:`search_serving` enumerates and how it reports: its keyword arguments
    besides the limits (each documented there; the defaults are its defaults)."""

    tp: Sequence[int] | None = None
    pp: Sequence[int] = PP
    max_batch: Sequence[int] = MAX_BATCH
    chunk: Sequence[int] = CHUNKS
    precision: Sequence = PRECISIONS
    runtime: Sequence = RUNTIMES
    loads: Sequence[float] = LOADS
    disaggregated: bool = True
    full: bool = False
    progress: bool = True
    tail: bool = False
    speculative: Sequence = (None,)
    ep: Sequence[int] = (1,)


def _space(options: dict) -> SearchSpace:
    """The :class:`SearchSpace` of :func:`search_serving`'s keyword arguments (a
    ``TypeError`` names one it does not take, as Python's own check would)."""
    fields = {f.name for f in dataclasses.fields(SearchSpace)}
    for name in options:
        if name not in fields:
            raise TypeError(f"search_serving() got an unexpected keyword argument {name!r}")
    return SearchSpace(**options)


def search_serving(system: System, model: Model, n_devices: int | None = None, isl=1024,
                   osl=256, *, ttft_slo_s: float = float("inf"),
                   tpot_slo_s: float = float("inf"), **options) -> pd.DataFrame:
    """Best serving deployments of ``model`` on ``n_devices`` under TTFT/TPOT limits.

    The keyword arguments after the limits (``tp`` … ``ep`` below) are the fields of
    :class:`SearchSpace`, with its defaults.

    Args:
        system: the hardware; its outermost network level is resized to ``n_devices``
            (default: the system's devices).
        model: the transformer.
        n_devices: devices of the deployment.
        isl, osl: mean prompt and output tokens per request.
        ttft_slo_s, tpot_slo_s: limits on the mean time to first token and time per output
            token, s.
        tp: tensor-parallel degrees (default: the powers of two up to the innermost network
            tier); ``pp``: pipeline degrees; only ``tp·pp`` dividing ``n_devices``.
        max_batch: batch caps (sequences per replica); ``chunk``: prefill chunk sizes of
            aggregated serving (0 = no chunking).
        precision, runtime: presets to search (names of :data:`jaxmodel.PRESETS` and
            :data:`jaxmodel.RUNTIMES`).
        loads: arrival rates as fractions of each configuration's capacity.
        disaggregated: also search prefill/decode splits.
        full: return every evaluated configuration (with a ``pareto`` column) instead of the
            front.
        progress: print the stages to stderr.
        tail: the limits bound the 99th percentiles (``ttft_p99_s``, ``tpot_p99_s`` of
            :class:`jaxmodel.serving.ServingResult`) instead of the means.
        speculative: speculative-decoding options to search: ``None`` (none) or
            :class:`jaxmodel.Speculative` (draft model, MTP or EAGLE heads, ``k``, acceptance
            ``α``; at most one distinct draft model); each is a cost-table axis.
        ep: expert-parallel degrees for a mixture-of-experts model (experts over the
            ``tp × dp`` ranks of a pipeline stage, attention kept tensor/data parallel as
            the plan rules of :func:`jaxmodel.check_plan` allow); a degree is searched on
            a plan when it divides the expert count and the stage's ``n/pp`` devices;
            ignored (1) for dense models. FP4 deployments are a ``precision`` (e.g.
            ``"nvfp4"``, ``"nvfp4kv"``, ``"mxfp4"``; ``precision_unsupported`` on devices
            without an FP4 tensor rate).

    Returns:
        DataFrame of the Pareto front (sorted by tokens/s per user): ``mode``
        (``aggregated``/``disaggregated``), ``precision``, ``runtime``, ``tp``, ``pp``,
        ``dp`` (the decode pool's when disaggregated), ``prefill_tp``, ``prefill_pp``,
        ``prefill_dp`` (0 when aggregated), ``ep``, ``speculative`` (method name),
        ``spec_k``, ``spec_accept``, ``max_batch``, ``chunk``, ``load``, ``rate_rps``
        and every field of :class:`jaxmodel.serving.ServingResult` (``reason_name`` beside
        ``reason``), and ``offline_throughput_per_gpu``: the configuration's output tokens/s
        per device with every request queued (:func:`jaxmodel.serving.offline_from_costs`
        under its runtime's scheduler defaults; 0 for disaggregated rows). ``df.attrs``:
        ``n_evaluated``, ``n_feasible``, ``n_meeting_slo``,
        ``wall_s``, ``configs_per_s``, ``timings``, ``best_aggregated`` and
        ``best_disaggregated`` (highest throughput per device meeting the limits, as dicts).

    Raises:
        ValueError: unknown presets, empty option lists or a system that cannot be resized;
            in a ``jax.distributed`` job, arguments that differ between processes.

    Example:
        >>> df = jm.search_serving(hw_db.system("dgx_h100"), hw_db.model("llama3-8b"), 8,
        ...                        1024, 256, ttft_slo_s=1.0, tpot_slo_s=0.05)
        >>> bool((df.tpot_s <= 0.05).all())
        True
    """
    from jaxmodel.search.parallelism import _as_int, _scaled_system

    def say(msg):
        if progress and not _process.quiet():
            print(f"[search_serving] {msg}", file=sys.stderr, flush=True)

    sp = _space(options)
    progress = sp.progress
    t0 = time.perf_counter()
    distributed.check_same("search_serving", dict(
        system=system, model=model, n_devices=n_devices, isl=isl, osl=osl,
        ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, tp=sp.tp, pp=sp.pp,
        max_batch=sp.max_batch, chunk=sp.chunk, precision=sp.precision, runtime=sp.runtime,
        loads=sp.loads, disaggregated=sp.disaggregated, full=sp.full, tail=sp.tail,
        speculative=sp.speculative, ep=sp.ep))
    n = _as_int(system.n_devices if n_devices is None else n_devices, "n_devices")
    system = _scaled_system(system, n)
    isl_f, osl_f = float(isl), float(osl)
    plans = _plans(n, _default_tp(system) if sp.tp is None else sp.tp, sp.pp)
    precs = [_precision.precision(p) for p in sp.precision]
    rts = [_rtp.runtime(r) for r in sp.runtime]
    _check_options(isl, osl, plans, precs, rts, sp.max_batch, sp.chunk, sp.loads)
    specs = _speculative_options(sp.speculative)
    keys = [(t, p, i, j, e, s) for (t, p) in plans for i in range(len(precs))
            for j in range(len(rts)) for e in _ep_degrees(model, n, t, p, sp.ep)
            for s in range(len(specs))]     # one cost table each
    rows_a = _aggregated_rows(keys, n, sp.max_batch, sp.chunk, sp.loads)
    rows_d = _disaggregated_rows(keys, plans if sp.disaggregated else [], n, sp.max_batch,
                                 sp.loads)
    n_a, n_d = len(rows_a["k"]), len(rows_d["k"])
    say(f"{n_a + n_d:,} configurations ({n_a:,} aggregated, {n_d:,} disaggregated)")
    say(f"{len(keys)} cost tables ({len(plans)} tp×pp plans × {len(precs)} precisions × "
        f"{len(rts)} runtimes × expert-parallel degrees × {len(specs)} speculative options) "
        f"for {model.name} on {n} devices")
    par, prec_b, rt_b = _table_inputs(keys, n, precs, rts)
    spec_b = _stacked_speculative(specs, keys)
    res, table, timings = _run_stages(system, model, (par, prec_b, rt_b, spec_b),
                                      (rows_a, rows_d),
                                      (isl_f, osl_f), (float(ttft_slo_s), float(tpot_slo_s)),
                                      progress)
    kt = np.asarray(keys, dtype=float)
    offline = _offline_per_table(table, par, [rts[int(j)] for j in kt[:, 3]], isl_f, osl_f)
    names = (np.asarray([p.name for p in precs]), np.asarray([r.name for r in rts]), specs)
    frames = [_frame(rows_a, res[0], "aggregated", kt, names, offline)]
    if n_d:
        frames.append(_frame(rows_d, res[1], "disaggregated", kt, names, offline))
    df = _with_front(pd.concat(frames, ignore_index=True), ttft_slo_s, tpot_slo_s, sp.tail)
    wall = time.perf_counter() - t0
    attrs = _summary(df, n_a + n_d, n, wall, timings)
    say(f"{n_a + n_d:,} configurations in {wall:.1f} s ({(n_a + n_d) / wall:,.0f}/s); "
        f"{attrs['n_meeting_slo']:,} meet the limits, {int(df['pareto'].sum())} on the front")
    out = df if sp.full else df[df["pareto"]].sort_values(
        "tokens_per_s_per_user", kind="stable").reset_index(drop=True)
    out.attrs.update(attrs)
    return out


def _full_signature(fn) -> inspect.Signature:
    """``fn``'s signature with its ``**options`` spelled out as the keyword-only fields of
    :class:`SearchSpace` (what ``help`` and editors show)."""
    sig = inspect.signature(fn)
    params = [q for q in sig.parameters.values() if q.kind is not q.VAR_KEYWORD]
    params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default)
               for f in dataclasses.fields(SearchSpace)]
    return sig.replace(parameters=params)


search_serving.__signature__ = _full_signature(search_serving)


def _summary(df, n_eval, n, wall, timings) -> dict:
    """``df.attrs`` of a search: counts, wall time, stage timings and the best deployment
    of each mode meeting the limits (highest output tokens/s per device, as a dict)."""
    ok = df["meets_slo"].to_numpy()
    attrs = dict(n_evaluated=int(n_eval), n_devices=n, n_feasible=int(df["feasible"].sum()),
                 n_meeting_slo=int(ok.sum()), wall_s=wall, configs_per_s=n_eval / wall,
                 timings=timings)
    for mode in ("aggregated", "disaggregated"):
        sel = df[(df["mode"] == mode) & df["meets_slo"]]
        attrs[f"best_{mode}"] = (sel.loc[sel["throughput_per_gpu"].idxmax()].to_dict()
                                 if len(sel) else None)
    return attrs


def _check_options(isl, osl, plans, precs, rts, max_batch, chunk, loads):
    """A ``ValueError`` for prompt/output lengths below 1, an empty option list, negative
    chunks, batch caps below 1 or loads outside (0, 1)."""
    if not (float(isl) >= 1 and float(osl) >= 1):
        raise ValueError(f"search_serving: isl and osl must be >= 1, got {isl!r}, {osl!r}")
    for name, vals in (("tp/pp", plans), ("precision", precs), ("runtime", rts),
                       ("max_batch", max_batch), ("chunk", chunk), ("loads", loads)):
        if len(vals) == 0:
            raise ValueError(f"search_serving: no {name} to search")
    if any(float(c) < 0 for c in chunk) or any(float(b) < 1 for b in max_batch):
        raise ValueError("search_serving: chunk sizes must be >= 0 and batch caps >= 1")
    if any(not 0 < float(x) < 1 for x in loads):
        raise ValueError(f"search_serving: loads must lie in (0, 1), got {list(loads)}")


def _speculative_options(speculative) -> list:
    """The validated speculative options (``None`` or :class:`jaxmodel.Speculative`), at
    least one, at most one distinct draft model (the tables stack them)."""
    specs = [_spec.speculative_arg(s) for s in speculative]
    for s in specs:
        if s is not None:
            _spec.validate_speculative(s, where="search_serving")
    if not specs:
        raise ValueError("search_serving: no speculative options to search (use (None,))")
    drafts = {id(s.draft): s.draft for s in specs if s is not None and s.draft is not None}
    if len(drafts) > 1:
        raise ValueError(f"search_serving: speculative options carry {len(drafts)} draft "
                         "models; search one draft model per call")
    return specs


def _stacked_speculative(specs, keys):
    """One :class:`jaxmodel.Speculative` per cost table (``keys[k][5]`` indexes ``specs``),
    stacked; ``None`` when no option speculates (the tables then trace no proposer)."""
    if all(s is None for s in specs):
        return None
    draft = next((s.draft for s in specs if s is not None and s.draft is not None), None)
    none = _spec.Speculative(method="none", k=0.0, accept=0.0, draft=draft)
    full = [none if s is None else dataclasses.replace(s, draft=draft) for s in specs]
    f = jnp.result_type(float)
    idx = np.asarray([key[5] for key in keys], dtype=int)
    return jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.asarray(xs, dtype=float)[idx], f),
                                  *full)


def _ep_degrees(model, n, tp, pp, ep) -> list:
    """Expert-parallel degrees searched on a ``tp × pp`` plan of ``n`` devices: 1, and for
    a mixture-of-experts model each requested degree dividing the expert count and the
    ``n/pp`` devices of a stage (experts over the stage's ``tp × dp`` ranks)."""
    experts = int(round(float(np.asarray(model.n_experts))))
    stage = n // pp
    out = [1]
    for e in sorted({int(x) for x in ep}):
        if e < 1:
            raise ValueError(f"search_serving: expert-parallel degree {e} must be >= 1")
        if e > 1 and experts > 0 and experts % e == 0 and stage % e == 0:
            out.append(e)
    return out


def _aggregated_rows(keys, n, max_batch, chunk, loads) -> dict:
    """The aggregated configurations: every cost table ``k`` (``keys[k] = (tp, pp,
    precision index, runtime index, ep, speculative index)``) × batch cap × chunk × load,
    as columns."""
    mb, ch, ld = (np.asarray(v, dtype=float) for v in (max_batch, chunk, loads))
    agg = []
    for k, (t, p, *_) in enumerate(keys):
        g = np.meshgrid(mb, ch, ld, indexing="ij")
        m = g[0].size
        agg.append(np.stack([np.full(m, k), np.full(m, t), np.full(m, p), np.full(m, n / (t * p)),
                             g[0].ravel(), g[1].ravel(), g[2].ravel()], axis=1))
    agg = np.concatenate(agg)
    rows = {name: agg[:, c] for c, name in enumerate(
        ("k", "tp", "pp", "dp", "max_batch", "chunk", "load"))}
    rows["n"] = np.full(len(agg), float(n))
    return rows


def _disaggregated_rows(keys, plans, n, max_batch, loads) -> dict:
    """The disaggregated configurations: for each precision, runtime, expert-parallel
    degree and speculative option, a prefill pool of ``n_p`` devices (one plan) and a
    decode pool of ``n − n_p`` (another) × batch cap × load, as columns (``k``/``k_d``:
    the pools' cost tables; a degree that does not fit both plans' stages is skipped)."""
    index = {key: k for k, key in enumerate(keys)}
    mb, ld = np.asarray(max_batch, dtype=float), np.asarray(loads, dtype=float)
    dis = []
    for i, j, e, s in dict.fromkeys(key[2:] for key in keys):    # precision-major order
        for (tp_p, pp_p) in plans:
            for (tp_d, pp_d) in plans:
                if (tp_p, pp_p, i, j, e, s) not in index or (tp_d, pp_d, i, j, e, s) not in index:
                    continue
                sp, sd = tp_p * pp_p, tp_d * pp_d
                for n_p in range(sp, n, sp):
                    n_d = n - n_p
                    if n_d % sd:
                        continue
                    g = np.meshgrid(mb, ld, indexing="ij")
                    m = g[0].size
                    dis.append(np.stack([
                        np.full(m, index[(tp_p, pp_p, i, j, e, s)]),
                        np.full(m, index[(tp_d, pp_d, i, j, e, s)]),
                        np.full(m, tp_p), np.full(m, pp_p), np.full(m, n_p / sp),
                        np.full(m, tp_d), np.full(m, pp_d), np.full(m, n_d / sd),
                        g[0].ravel(), g[1].ravel()], axis=1))
    dis = np.concatenate(dis) if dis else np.zeros((0, 10))
    return {name: dis[:, c] for c, name in enumerate(
        ("k", "k_d", "tp_p", "pp_p", "dp_p", "tp", "pp", "dp", "max_batch", "load"))}


def _table_inputs(keys, n, precs, rts):
    """The plans, precisions and runtimes of the cost tables, stacked (one row per key)."""
    kt = np.asarray(keys, dtype=float)
    f = jnp.result_type(float)
    par = Parallelism(dp=jnp.asarray(n / (kt[:, 0] * kt[:, 1]), f), tp=jnp.asarray(kt[:, 0], f),
                      pp=jnp.asarray(kt[:, 1], f), ep=jnp.asarray(kt[:, 4], f))
    prec_b = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)[kt[:, 2].astype(int)],
                                                          f), _precision.stack_precisions(precs))
    rt_b = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x)[kt[:, 3].astype(int)], f),
                                  _rtp.stack_runtimes(rts))
    return par, prec_b, rt_b


def _run_stages(system, model, tables_in, rows, lengths, limits, progress):
    """Stage 1 (the cost tables of ``tables_in`` = the stacked plans, precisions,
    runtimes and speculative options) and stage 2 (the steady state of ``rows`` = (aggregated, disaggregated) at
    ``lengths`` = (isl, osl) under ``limits`` = (TTFT, TPOT)); each process evaluates its
    share of the rows. Returns ``(results, table, timings)``.

    The graphs are traced one after the other on this thread and each compiles on a thread
    of its own as soon as it is lowered (:meth:`jaxmodel.batching.jit_leaves.compile_async`):
    stage 2 and the offline column need only the tables' shapes, so they trace while stage 1
    compiles, and the compilations (which release the GIL) run side by side."""
    shown = None if progress else math.inf
    par, prec_b, rt_b, spec_b = tables_in
    n_tables = int(np.shape(par.tp)[0])
    f = np.dtype(jnp.result_type(float))
    jobs, keeps = [], []
    for r, flag in zip(rows, (False, True)):
        if len(r["k"]):
            share, keep = distributed.local_rows(len(r["k"]))
            jobs.append(({k: np.asarray(v[share], dtype=f) for k, v in r.items()}, flag))
            keeps.append(keep)
    # the name is a static pytree field: without it, models of one family share the
    # executable within a process; the variant of every table (one graph for all parts)
    model_s, variant = dataclasses.replace(model, name=""), variant_of(model, par, system)
    parts = [(system, model_s, p, *lengths, _srv.Engine(pr, rt, variant, sp, deferred_gemm))
             for p, pr, rt, sp in _table_parts((par, prec_b, rt_b, spec_b), n_tables)]
    with _process.stage("search_serving: cost tables", show_after=shown) as st:
        tables_built = _tables_jit.compile_async(*parts[0])
        later = [_evaluate_jit.compile_async(_table_struct(n_tables), r, system, *lengths,
                                             *limits, disagg=flag) for r, flag in jobs]
        tables_built.join()
        table = _run_parts(_tables_jit, parts, n_tables)
        st["note"] = f"{n_tables} tables × {len(_srv.TOKEN_GRID)} batch sizes"
    timings = {"cost_tables_s": st["wall_s"]}
    with _process.stage("search_serving: steady state", show_after=shown) as st:
        for built in later:
            built.join()
        res = [_evaluate_jit(table, r, system, *lengths, *limits, disagg=flag)
               for r, flag in jobs]
        res = [distributed.gather_rows(jax.tree_util.tree_map(lambda x: np.asarray(x)[:k], r))
               for r, k in zip(res, keeps)]
        st["note"] = f"{sum(len(r['k']) for r in rows):,} configurations"
    timings["steady_state_s"] = st["wall_s"]
    return res, table, timings


def _host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _table_parts(stacked, n_rows: int) -> list:
    """``stacked`` (a pytree whose non-scalar leaves carry ``n_rows`` rows) cut into
    consecutive parts of one size, one per host core (at most :data:`MAX_TABLE_PARTS`), the
    last one padded by repeating the final row: :func:`_run_parts` evaluates them side by
    side with one executable. One part on a single core or a single row."""
    n_parts = max(1, min(MAX_TABLE_PARTS, _host_cores(), n_rows))
    size = -(-n_rows // n_parts)
    idx = np.minimum(np.arange(n_parts * size), n_rows - 1).reshape(n_parts, size)
    return [jax.tree_util.tree_map(lambda x, i=i: np.asarray(x)[i] if jnp.ndim(x) else x,
                                   stacked) for i in idx]


def _run_parts(jitted, parts: list, n_rows: int):
    """``jitted(*part)`` of every part of :func:`_table_parts`, each on a thread of its own
    (XLA:CPU runs the stage-1 graph's biggest fusion, the GEMM tile searches of every table,
    on one core; executions release the GIL), concatenated back to ``n_rows`` rows as numpy.
    The rows are independent: the same numbers as one call on all of them."""
    if len(parts) == 1:
        outs = [jax.block_until_ready(jitted(*parts[0]))]
    else:
        with ThreadPoolExecutor(len(parts), thread_name_prefix="search_serving") as pool:
            outs = list(pool.map(lambda a: jax.block_until_ready(jitted(*a)), parts))
    return jax.tree_util.tree_map(
        lambda *xs: np.concatenate([np.asarray(x) for x in xs])[:n_rows], *outs)


def _offline_per_table(table, par, rts, isl, osl):
    """Output tokens/s per device of every cost table with every request queued, under its
    runtime's scheduler defaults (:func:`jaxmodel.serving.offline_from_costs`; elementwise
    on the tables: tens of rows)."""
    f = jnp.result_type(float)
    sch = [_rtp.scheduler_defaults(r.name) for r in rts]
    opts = _srv.ServingOptions(**{name: np.asarray([s[name] for s in sch]) for name in (
        "max_batch", "max_tokens", "block_tokens", "mem_fraction", "kv_of_free")})
    opts = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(jnp.asarray(x, f), (len(sch),)),
                                  opts)

    return np.asarray(_offline_jit(table, par.tp, par.pp, par.dp, opts, isl, osl))


def _offline_tables(table, tp, pp, dp, opts, isl, osl):
    """:func:`jaxmodel.serving.offline_from_costs`'s throughput per device, vmapped over the
    tables (their plans ``tp``, ``pp``, ``dp`` and scheduler settings ``opts``)."""
    def one(c, t, p, d, o):
        return _srv.offline_from_costs(c, isl, osl, o, d, p, d * t * p).throughput_per_gpu
    return jax.vmap(one)(table, tp, pp, dp, opts)


_offline_jit = jit_leaves(_offline_tables, cast=False, compiler_options=ONE_SHOT_COMPILE_OPTIONS)


def _frame(rows, r, mode, kt, names, offline):
    """The DataFrame of one mode's rows: the configuration columns, every field of
    :class:`jaxmodel.serving.ServingResult` and the offline throughput of its table."""
    prec_names, rt_names, specs = names
    k = rows["k"].astype(int)
    s = kt[k, 5].astype(int)
    spec_name = np.asarray(["none" if x is None else _spec.METHODS[int(np.asarray(x.method))]
                            for x in specs])
    spec_k = np.asarray([0.0 if x is None else float(np.asarray(x.k)) for x in specs])
    spec_a = np.asarray([0.0 if x is None else float(np.asarray(x.accept)) for x in specs])
    cols = {"mode": np.full(len(k), mode), "precision": prec_names[kt[k, 2].astype(int)],
            "runtime": rt_names[kt[k, 3].astype(int)], "ep": kt[k, 4],
            "speculative": spec_name[s], "spec_k": spec_k[s], "spec_accept": spec_a[s],
            "tp": rows["tp"],
            "pp": rows["pp"], "dp": rows["dp"],
            "prefill_tp": rows.get("tp_p", np.zeros(len(k))),
            "prefill_pp": rows.get("pp_p", np.zeros(len(k))),
            "prefill_dp": rows.get("dp_p", np.zeros(len(k))),
            "max_batch": rows["max_batch"], "chunk": rows.get("chunk", np.zeros(len(k))),
            "load": rows["load"], "rate_rps": rows["load"] * r.capacity_rps}
    cols.update({name: np.asarray(getattr(r, name)) for name in
                 _srv.ServingResult.__dataclass_fields__})
    cols["offline_throughput_per_gpu"] = (offline[k] if mode == "aggregated"
                                          else np.zeros(len(k)))
    return pd.DataFrame(cols)


def _with_front(df, ttft_slo_s, tpot_slo_s, tail: bool):
    """``df`` with ``reason_name``, the limits on the 99th percentiles where ``tail``
    (``meets_slo``, ``goodput_per_gpu``) and the ``pareto`` column: the front of tokens/s
    per device against tokens/s per user among the rows meeting the limits."""
    df["reason_name"] = np.asarray(REASONS + ("?",))[np.clip(
        df["reason"].to_numpy().astype(int), 0, len(REASONS))]
    if tail:
        meets = (df["feasible"].to_numpy() & (df["ttft_p99_s"].to_numpy() <= ttft_slo_s)
                 & (df["tpot_p99_s"].to_numpy() <= tpot_slo_s))
        df["meets_slo"] = meets
        df["goodput_per_gpu"] = np.where(meets, df["throughput_per_gpu"].to_numpy(), 0.0)
    ok = df["meets_slo"].to_numpy()
    user = np.where(ok, df["tokens_per_s_per_user"].to_numpy(), np.nan)
    df["pareto"] = pareto_mask(-user, df["throughput_per_gpu"].to_numpy())
    return df
