"""Exhaustive parallelism search.

:func:`search_parallelism` enumerates every consistent 5D plan for a model on ``n`` devices —
the rules of :mod:`jaxmodel.parallel.plan` (``dp·tp·pp·cp = n``, ``tp`` dividing the attention
heads, ``pp`` times the interleave dividing the layers, micro-batches dividing the per-replica
batch, experts sharded over data-parallel ranks, ``ep | dp``), crossed
with sequence parallelism, pipeline schedule, virtual stages, activation recompute, ZeRO stage
and FlashAttention (and, optionally, execution options of the training step), and evaluates
all of them in one batched :func:`jaxmodel.train_step` call. That call does the
de-duplication (``parallel`` package): the per-layer stage times (where the GEMM
tile searches are) are computed once per distinct stage input and composed into every plan
(exact); optionally the GEMM shapes are also timed once and looked up
(:mod:`jaxmodel.parallel.gemm_table`).
docs/architecture.md, "Data flows one way": this module only calls ``parallel``.

In a ``jax.distributed`` job (:mod:`jaxmodel.distributed`) each process evaluates a
contiguous share of the plans and the results are gathered onto every process before the
ranking: the same table as one process computes.

The row order groups plans by ``tp``, ``pp``, micro-batch, schedule/interleave, SP, EP and then
recompute, ZeRO, FlashAttention (a stable sort by step time keeps it among ties).

Source of the enumeration rules: Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC'21 §2–3 (PTD-P; interleaving needs the
micro-batch count to be a multiple of ``pp``); Korthikanti et al. 2022 (SP, selective
recompute); Rajbhandari et al. 2020 (ZeRO 1–3); Guo et al. §III (5D parallelism, EP).

Example:
    >>> df = jm.search_parallelism(hw_db.system("dgx_a100", nodes=192),
    ...                            hw_db.model("gpt3-175b"), 1536, 1536, 2048)
    >>> df.iloc[0][["dp", "tp", "pp", "micro_batch", "step_time_s"]]
    dp                  32.0
    tp                   8.0
    pp                   6.0
    micro_batch          4.0
    step_time_s    11.9
    Name: 0, dtype: object
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxmodel import distributed, process, recipes as _recipes
from jaxmodel.numerics import REASONS
from jaxmodel.parallel import plan as _plan
from jaxmodel.types import (DROPOUT_MODES, FA_VERSIONS, RECOMPUTE, SCHEDULES, ZERO3_IMPLS, Model,
                            Parallelism, System, code_of, is_concrete)

from jaxmodel import precisions as _precision

__all__ = ["search_parallelism", "enumerate_plans", "PlanSpace"]

PAR_FIELDS = tuple(f.name for f in dataclasses.fields(Parallelism))
# context-parallel degrees considered (Megatron-core ``--context-parallel-size``; powers of
# two inside a DGX node and across a few)
CP_DEGREES = (1, 2, 4, 8, 16)
# sequences this long and longer are where context parallelism pays (Megatron-core's
# context-parallel guide: CP for long-context training, 8K tokens and beyond; Dubey et al.,
# "The Llama 3 Herd of Models", 2024, §3.3.2: CP only in the long-context stage). Below it
# :func:`search_parallelism` enumerates cp = 1 unless ``cp=`` is given.
LONG_CONTEXT_TOKENS = 8192


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _as_int(x, field: str) -> int:
    v = float(np.asarray(x))
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise ValueError(f"search_parallelism: {field} must be an integer >= 1, got {x!r}")
    return int(v)


@dataclasses.dataclass(frozen=True)
class PlanSpace:
    """The enumeration options of :func:`enumerate_plans` (documented there)."""

    schedules: Sequence = SCHEDULES[:3]
    recompute: Sequence = RECOMPUTE[:3]
    zero: Sequence[int] = (0, 1, 2, 3)
    sp: Sequence[bool] = (False, True)
    flash_attention: Sequence = (False, "fa2")
    max_tp: int | None = None
    max_pp: int | None = None
    micro_batches: Sequence[int] | None = None
    max_interleave: int | None = None
    seq_len: float | None = None
    cp: Sequence[int] = CP_DEGREES
    zero3_impl: Sequence = ("fsdp",)


class _Codes(NamedTuple):
    """The options of a :class:`PlanSpace` as sorted numeric codes."""

    sched: list
    rc: list
    zero: list
    sp: list
    fa: list
    cp: list
    impls: list


def _codes(space: PlanSpace) -> _Codes:
    """Validate and normalise the options (``ValueError`` naming a bad one)."""
    sched_codes = sorted({int(code_of(s, SCHEDULES, "schedules")) for s in space.schedules})
    rc_codes = sorted({int(code_of(r, RECOMPUTE, "recompute")) for r in space.recompute})
    for z in space.zero:
        if z not in (0, 1, 2, 3):
            raise ValueError(f"search_parallelism: zero stage {z!r} is not 0, 1, 2 or 3")
    zero = sorted(set(int(z) for z in space.zero))
    sp_opts = sorted(set(float(bool(s)) for s in space.sp))
    fa_opts = sorted(set(float(f) if isinstance(f, bool)
                         else float(code_of(f, FA_VERSIONS, "flash_attention"))
                         for f in space.flash_attention))
    cp_opts = sorted({_as_int(c, "cp") for c in space.cp
                      if space.seq_len is not None or int(c) == 1})
    impls = sorted({float(code_of(i, ZERO3_IMPLS, "zero3_impl")) for i in space.zero3_impl})
    if not (sched_codes and rc_codes and zero and sp_opts and fa_opts and cp_opts and impls):
        raise ValueError("search_parallelism: every option list must be non-empty")
    return _Codes(sched_codes, rc_codes, zero, sp_opts, fa_opts, cp_opts, impls)


_HEAD = ("dp", "tp", "pp", "sp", "ep", "micro_batch", "interleave", "schedule", "cp")


def _structural(model: Model, n: int, gb: int, space: PlanSpace, c: _Codes) -> np.ndarray:
    """The candidates of the structural fields (columns :data:`_HEAD`, in the order of the
    output) that pass the training rules of :mod:`jaxmodel.parallel.plan`."""
    L = _as_int(model.n_layers, "model.n_layers")
    E = int(float(np.asarray(model.n_experts)))
    sched_v = []
    for s in c.sched:
        if s == 2:
            # chunk counts dividing L, L + 1 or L + 2 (the embedding and the loss as
            # pipeline slots, :func:`jaxmodel.parallel.plan.layers_ok`); the rules keep the
            # ones whose pp·v divides
            vs = sorted(set(_divisors(L)) | set(_divisors(L + 1)) | set(_divisors(L + 2)))
            sched_v += [(2, v) for v in vs if v >= 2 and
                        (space.max_interleave is None or v <= space.max_interleave)]
        else:
            sched_v.append((s, 1))
    mbs = [b for b in _divisors(gb) if space.micro_batches is None or b in space.micro_batches]
    rows = []
    for tp in _divisors(n):
        if space.max_tp and tp > space.max_tp:
            continue
        sps = [s for s in c.sp if tp > 1 or s == 0.0] or [0.0]
        for cp in (cp for cp in c.cp if (n // tp) % cp == 0):
            for pp in _divisors(n // (tp * cp)):
                if space.max_pp and pp > space.max_pp:
                    continue
                sv = [x for x in sched_v if x[0] != 2 or pp > 1]
                if not sv or not mbs:
                    continue
                g = np.meshgrid(mbs, np.arange(len(sv)), sps, _divisors(E), indexing="ij")
                g = [x.reshape(-1) for x in g]
                svs = np.asarray(sv, dtype=float)[g[1]]
                k = g[0].size
                rows.append(np.stack([np.full(k, n // (tp * cp * pp)), np.full(k, tp),
                                      np.full(k, pp), g[2], g[3], g[0], svs[:, 1], svs[:, 0],
                                      np.full(k, cp)], axis=1))
    cand = (np.concatenate(rows).astype(float) if rows else np.zeros((0, len(_HEAD))))
    cols = {f: cand[:, i] for i, f in enumerate(_HEAD)}
    zeros = np.zeros(len(cand))
    f = {k: float(np.asarray(getattr(model, k))) for k in _plan._MODEL}
    p = _plan.PlanInputs(n_devices=float(n), batch=float(gb),
                         seq_len=1.0 if space.seq_len is None else float(space.seq_len),
                         gen_len=1.0, dtype_bytes=2.0, recompute=zeros, zero=zeros,
                         flash_attention=zeros, **cols, **f)
    keep = np.ones(len(cand), dtype=bool)
    for ok, reason in _plan.structure_checks(_plan.TRAIN, p, np):
        if space.seq_len is None and reason == "sequence_not_divisible":
            continue
        keep &= np.broadcast_to(ok, keep.shape)
    return cand[keep]


def enumerate_plans(model: Model, n_devices: int, global_batch: int,
                    space: PlanSpace | None = None, **options) -> dict[str, np.ndarray]:
    """All consistent plans as columns ``{field: float array}`` (Parallelism field names).

    The candidate product — ``tp``, ``cp`` (of ``cp``) and ``pp`` over the divisors of
    ``n_devices`` with ``dp = n/(tp·cp·pp)``, every divisor of the experts as ``ep``, every
    divisor of the global batch as ``micro_batch``, the schedules with their virtual stages
    (GPipe and 1F1B one chunk per device; interleaved ``v >= 2`` dividing the layers
    ``L``, ``L + 1`` or ``L + 2``),
    sequence parallelism —
    is filtered with the training rules of :mod:`jaxmodel.parallel.plan` (the same rules
    :func:`jaxmodel.train_step` checks, evaluated on numpy columns), and crossed with
    recompute, ZeRO and FlashAttention. Among them: ``dp·tp·pp·cp = n``; ``cp > 1`` splits
    the sequence into ``2·cp`` chunks (needs ``seq_len``); ``tp`` divides the
    heads (KV heads divide or are replicated); ``pp ≤`` the layers (uneven stages:
    :func:`jaxmodel.parallel.pipeline.stage_layers`), ``pp·v`` dividing them, or them plus
    the embedding's and the loss's pipeline slots, when interleaved;
    ``dp·micro_batch`` divides the global batch, a multiple of ``pp`` micro-batches for the
    interleaved schedule; ``ep`` divides the experts and ``dp`` (DeepSpeed-TED); with
    ``seq_len``, ``tp`` divides each CP rank's ``s/cp`` tokens under SP.

    Plans that would duplicate another are not generated: ``sp`` only with ``tp > 1`` (a
    no-op otherwise), ZeRO stages > 0 only with ``dp > 1``, the interleaved schedule only
    with ``pp > 1``.

    Args:
        model: concrete model (counts are read as integers).
        n_devices, global_batch: integers.
        space: a :class:`PlanSpace` (the options below as one object); ``**options``
            override its fields.

    Options (fields of :class:`PlanSpace`):
        schedules, recompute: names or codes to consider (default the Megatron ones;
            ``"dualpipe"`` and ``"norm_upproj"`` when named).
        zero, sp, flash_attention: options to consider (attention kernels as codes or
            names of ``FA_VERSIONS``; default standard attention and FlashAttention-2, the
            kernel of today's training stacks; ``True`` is FlashAttention-1).
        max_tp, max_pp, max_interleave: optional caps; ``micro_batches``: allowed sizes.
        seq_len: tokens per sequence (checks SP's and CP's divisibility; ``None``: not
            checked, and only ``cp = 1`` is enumerated).
        cp: context-parallel degrees to consider (default :data:`CP_DEGREES`).
        zero3_impl: implementations of ZeRO stage 3 to consider for the ``zero = 3`` plans
            (names or codes of :data:`jaxmodel.types.ZERO3_IMPLS`; default FSDP's).
    """
    if not is_concrete(model):
        raise ValueError("search_parallelism: the model must be concrete (not traced)")
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(PlanSpace)})
    if unknown:
        raise ValueError(f"search_parallelism: unknown enumeration option(s) {unknown}")
    space = dataclasses.replace(space or PlanSpace(), **options)
    n = _as_int(n_devices, "n_devices")
    gb = _as_int(global_batch, "global_batch")
    _as_int(model.n_layers, "model.n_layers")
    for field in ("n_heads", "n_kv_heads", "n_experts"):
        _as_int(getattr(model, field), f"model.{field}")
    c = _codes(space)
    cand = _structural(model, n, gb, space, c)

    # ---- crossed with the execution options (ZeRO > 0 only with dp > 1) ---------------------
    idx, blocks = [], []
    for multi_dp in (False, True):
        rows_i = np.nonzero((cand[:, 0] > 1) == multi_dp)[0]
        zs = [(z, i) for z in c.zero if multi_dp or z == 0
              for i in (c.impls if z == 3 else [0.0])] or [(0, 0.0)]
        g = [x.reshape(-1) for x in np.meshgrid(c.rc, np.arange(len(zs)), c.fa,
                                                 indexing="ij")]
        zi = np.asarray(zs, dtype=float)[g[1]]
        opts = np.stack([g[0], zi[:, 0], g[2], zi[:, 1]], axis=1)
        idx.append(np.repeat(rows_i, len(opts)))
        blocks.append(np.concatenate([np.repeat(cand[rows_i], len(opts), axis=0),
                                      np.tile(opts, (len(rows_i), 1))], axis=1))
    order = np.argsort(np.concatenate(idx), kind="stable")
    table = np.concatenate(blocks)[order].astype(float)
    fields = _HEAD + ("recompute", "zero", "flash_attention", "zero3_impl")
    plans = {k: table[:, i] for i, k in enumerate(fields)}
    plans["order"] = np.zeros(len(table))       # the PTD-P rank order (types.PLACEMENTS)
    assert set(plans) == set(PAR_FIELDS), "Parallelism gained a field: extend the search"
    return plans


def _scaled_system(system: System, n_devices: int) -> System:
    """``system`` with its outermost level resized so it holds ``n_devices`` devices."""
    have = float(np.asarray(system.n_devices))
    if have == n_devices:
        return system
    if not system.levels:
        raise ValueError(f"search_parallelism: n_devices={n_devices} but the system has "
                         f"{have:g} device(s) and no network level to scale")
    inner = math.prod(float(np.asarray(l.size)) for l in system.levels[:-1])
    outer = n_devices / inner
    if outer < 1 or outer != int(outer):
        raise ValueError(f"search_parallelism: n_devices={n_devices} is not a multiple of "
                         f"the {inner:g} devices below the system's outer level")
    levels = system.levels[:-1] + (dataclasses.replace(system.levels[-1], size=float(outer)),)
    return dataclasses.replace(system, levels=levels)


def _with_recipe(recipe, options: dict, step_options, precision):
    """A recipe's plan fields as the only enumeration choice of those fields and its step
    settings as step options, wherever ``options`` / ``step_options`` / ``precision`` leave
    them: ``(options, step_options, precision)``."""
    r = _recipes.recipe(recipe)
    options = {**{k: (v,) for k, v in r.plan.items()}, **options}
    step_options = dict(step_options or {})
    for k, v in r.step.items():
        if k == "precision":
            if precision is None and "precision" not in step_options:
                precision = v
        else:
            step_options.setdefault(k, [float(code_of(v, DROPOUT_MODES, k))
                                        if k == "dropout" else v])
    return options, step_options, precision


def _step_option_values(step_options, precision):
    """The searched step options as ``{name: float values}`` (precisions by their index into
    the returned list of :class:`jaxmodel.Precision`, None when not searched); ``ValueError``
    for an option that is not a keyword of :func:`jaxmodel.train_step` or has no values."""
    from jaxmodel import parallel as _parallel
    extra = {}
    step_options = dict(step_options or {})
    if isinstance(precision, (list, tuple)):
        step_options["precision"] = precision
    elif precision is not None:
        step_options.setdefault("precision", [precision])
    precisions = None
    known = set(inspect.signature(_parallel.train_step).parameters)
    for k, vals in step_options.items():
        if k not in known or k in ("system", "model", "par", "global_batch", "seq_len"):
            raise ValueError(f"search_parallelism: step option {k!r} is not a keyword of "
                             f"train_step")
        if k == "precision":       # presets are searched by their index into the list
            precisions = [_precision.precision(v) for v in (
                [vals] if isinstance(vals, (str, _precision.Precision)) else vals)]
            vals = np.arange(len(precisions))
        vals = np.asarray(vals, dtype=float).reshape(-1)
        if vals.size == 0:
            raise ValueError(f"search_parallelism: step option {k!r} has no values")
        extra[k] = vals
    return extra, precisions


def _combinations(extra: dict) -> dict:
    """Index of each step option's value in every combination (the last option fastest)."""
    sizes = tuple(len(v) for v in extra.values())
    reps = math.prod(sizes) if extra else 1
    return dict(zip(extra, np.unravel_index(np.arange(reps), sizes))) if extra else {}


def _batch_layout(plans: dict, extra: dict, precisions):
    """The train_step batch of the search: a (plan, precision, other options) outer
    product — train_step's stage times are computed per plan and precision, and each plan
    composes its step options in one inner vmap (batching: outer-product batches) that
    shares what they have in common. Returns ``(par, step keywords, layout, reps)`` with
    ``layout`` the output row of each (plan, combination) and ``reps`` the combinations."""
    n_plans = len(plans["dp"])
    sizes = {k: len(v) for k, v in extra.items()}
    reps = math.prod(sizes.values()) if extra else 1
    inner_keys = [k for k in extra if k != "precision"]
    n_prec = sizes.get("precision", 1)
    n_inner = math.prod(sizes[k] for k in inner_keys) if inner_keys else 1
    combo = _combinations(extra)
    inner_of_combo = (np.ravel_multi_index([combo[k] for k in inner_keys],
                                           [sizes[k] for k in inner_keys])
                      if inner_keys else np.zeros(reps, dtype=int))
    layout = (np.arange(n_plans)[:, None] * (n_prec * n_inner)
              + (combo.get("precision", np.zeros(reps, dtype=int)) * n_inner
                 + inner_of_combo)[None, :]).reshape(-1)
    f = jnp.result_type(float)
    par = Parallelism(**{k: jnp.asarray(plans[k], f).reshape(-1, 1, 1) for k in PAR_FIELDS})
    inner_grid = np.meshgrid(*[extra[k] for k in inner_keys], indexing="ij")
    kw = {k: jnp.asarray(g.reshape(1, 1, -1), f) for k, g in zip(inner_keys, inner_grid)}
    if precisions is not None:
        kw["precision"] = jax.tree_util.tree_map(
            lambda x: jnp.asarray(np.asarray(x), f).reshape(1, -1, 1),
            _precision.stack_precisions(precisions))
    return par, kw, layout, reps


def _ranked_table(plans: dict, extra: dict, precisions, res, n_eval: int) -> pd.DataFrame:
    """The search's DataFrame: plan fields (schedule and recompute as names), step options,
    every scalar output of the step, ``reason_name``; ranked by ``step_time_s`` (stable)."""
    from jaxmodel.search.explore import output_names
    cols = {k: plans[k] for k in PAR_FIELDS}
    cols["schedule"] = np.asarray(SCHEDULES)[plans["schedule"].astype(int)]
    cols["recompute"] = np.asarray(RECOMPUTE)[plans["recompute"].astype(int)]
    cols.update(extra)
    if precisions is not None:
        cols["precision"] = np.asarray([p.name for p in precisions])[
            extra["precision"].astype(int)]
    leaves = jax.tree_util.tree_leaves(res)
    for name, val in zip(output_names(res), leaves):
        val = np.asarray(val).reshape(n_eval, -1)
        if val.shape[1] == 1:
            cols[name] = val[:, 0]
        else:
            for j in range(val.shape[1]):
                cols[f"{name}[{j}]"] = val[:, j]
    df = pd.DataFrame(cols)
    if "reason" in df:
        df["reason_name"] = np.asarray(REASONS + ("?",))[np.clip(
            df["reason"].to_numpy().astype(int), 0, len(REASONS))]
    return df.sort_values("step_time_s", kind="stable").reset_index(drop=True)


def _plans(model: Model, n: int, gb: int, seq_len: float, options: dict) -> dict:
    """:func:`enumerate_plans` with ``cp = 1`` below :data:`LONG_CONTEXT_TOKENS` unless
    ``options`` name ``cp``; ``ValueError`` when no plan is consistent."""
    if "cp" not in options and seq_len < LONG_CONTEXT_TOKENS:
        options = {**options, "cp": (1,)}
    plans = enumerate_plans(model, n, gb, **{"seq_len": seq_len, **options})
    if len(plans["dp"]) == 0:
        raise ValueError(f"search_parallelism: no consistent plan for {n} devices, global "
                         f"batch {gb} and the given options")
    return plans


def _gemm_table(system, model, par, workload, precision, finetune, shown):
    """Time every distinct GEMM of the batch once (:class:`jaxmodel.parallel.gemm_table.
    GemmTable`; ``workload`` = (global batch, sequence length)): ``(lookup hook, distinct
    shapes, seconds)``."""
    from jaxmodel.parallel.gemm_table import GemmTable
    with process.stage("search_parallelism: GEMM table", show_after=shown) as st:
        table = GemmTable.for_train_step(system, model, par, *workload, precision=precision,
                                         finetune=finetune)
        n_unique = int(len(table.shapes))
        st["note"] = f"{n_unique} distinct GEMM shapes"
    return table.lookup, n_unique, st["wall_s"]


def search_parallelism(system: System, model: Model, n_devices: int, global_batch,
                       seq_len, *, gemm_table: bool = False, progress: bool = True,
                       top: int | None = None, step_options: Mapping | None = None,
                       precision=None, finetune=None, recipe=None,
                       **options) -> pd.DataFrame:
    """Rank every consistent parallelism plan for training ``model`` on ``n_devices``.

    The plans of :func:`enumerate_plans` (crossed with ``step_options``) are evaluated in ONE
    batched :func:`jaxmodel.train_step` call, which de-duplicates the expensive part: the
    per-layer stage times depend on few plan fields and are computed once per distinct
    combination, then every plan is composed from them (exact). With ``gemm_table`` the
    distinct GEMM shapes are first timed once by the tile search and looked up
    (:class:`jaxmodel.parallel.gemm_table.GemmTable`; a missing shape would make a plan
    infeasible, never wrong).

    Args:
        system: the hardware; its outermost network level is resized when it holds a
            different number of devices than ``n_devices``.
        model: the transformer.
        n_devices: devices to use (``dp·tp·pp·cp``).
        global_batch: sequences per optimizer step.
        seq_len: tokens per sequence.
        gemm_table: time each distinct GEMM shape once, then look it up. Off by default:
            the stage-time de-duplication already runs the tile search on few rows, and the
            table's extra recording pass costs more compile time than it saves (GPT-3 175B on
            1536 GPUs: 87 s with, 65 s without, on 2 CPU cores).
        progress: print the stages (plans, GEMM table, evaluation) to stderr.
        top: return only the best ``top`` rows.
        step_options: execution options of :func:`jaxmodel.train_step` to search as well,
            ``{name: values}`` (e.g. ``{"dp_overlap": [0, 1], "grad_bytes": [2, 4],
            "tp_overlap": [0, 1]}``: overlapped gradient reduction on/off, bf16 vs fp32
            gradient reduction, Megatron-core ``--tp-comm-overlap`` on/off: TP collectives
            beside their GEMMs at Transformer Engine's granularity where
            :func:`jaxmodel.parallel.overlap.tp_eligible` admits the plan);
            ``"precision"`` takes a list of preset names / :class:`jaxmodel.Precision`
            (e.g. ``["bf16", "fp8"]``), searched like any other option.
        precision: one precision for every plan (name or :class:`jaxmodel.Precision`), or
            a list of them to search (the same as ``step_options={"precision": [...]}``).
        finetune: ``None`` (full training) or a :class:`jaxmodel.LoRA` for every plan
            (LoRA / QLoRA fine-tuning, :func:`jaxmodel.train_step`).
        recipe: ``None`` or a :class:`jaxmodel.recipes.Recipe` / its name: its plan fields
            become the only enumeration choice of those fields and its step settings the
            step options, wherever ``options`` / ``step_options`` / ``precision`` leave them.
        **options: enumeration options of :func:`enumerate_plans` (``schedules``,
            ``recompute``, ``zero``, ``sp``, ``flash_attention``, ``max_tp``, ``cp``, ...);
            ``cp`` defaults to :data:`CP_DEGREES` from :data:`LONG_CONTEXT_TOKENS` tokens on,
            to ``(1,)`` for shorter sequences.

    Returns:
        DataFrame ranked by ``step_time_s`` (infeasible plans last, ``+inf``), one row per
        plan: the plan fields (``schedule``/``recompute`` as names), the step options, every
        scalar output of the training step (``step_time_s``, ``mfu``, ``tokens_per_s``,
        ``memory_bytes``, ``feasible``, ``reason`` and ``reason_name``, ``breakdown.*``,
        ``memory.*``). ``df.attrs``: ``n_evaluated``, ``wall_s``, ``configs_per_s``,
        ``n_feasible``, ``timings`` and ``n_unique_gemms``.

    Raises:
        ValueError: no consistent plan, bad options, or a system that cannot be resized; in
            a ``jax.distributed`` job, arguments that differ between processes (naming them).
    """
    import sys

    from jaxmodel import parallel as _parallel

    def say(msg):
        if progress and not process.quiet():
            print(f"[search_parallelism] {msg}", file=sys.stderr, flush=True)

    shown = None if progress else math.inf     # process.stage lines follow ``progress`` too
    t0 = time.perf_counter()
    distributed.check_same("search_parallelism", dict(
        system=system, model=model, n_devices=n_devices, global_batch=global_batch,
        seq_len=seq_len, gemm_table=gemm_table, top=top, step_options=step_options,
        precision=precision, finetune=finetune, recipe=recipe, options=options))
    n = _as_int(n_devices, "n_devices")
    gb = _as_int(global_batch, "global_batch")
    if recipe is not None:
        options, step_options, precision = _with_recipe(recipe, options, step_options,
                                                        precision)
    system = _scaled_system(system, n)
    plans = _plans(model, n, gb, float(seq_len), options)
    n_plans = len(plans["dp"])
    extra, precisions = _step_option_values(step_options, precision)
    par, kw, layout, reps = _batch_layout(plans, extra, precisions)
    # the columns of the table, plans × options with the options varying fastest
    combo = _combinations(extra)
    if reps > 1:
        plans = {k: np.repeat(v, reps) for k, v in plans.items()}
    extra = {k: np.tile(extra[k][combo[k]], n_plans) for k in extra}
    n_eval = n_plans * reps
    timings = {"enumerate_s": time.perf_counter() - t0}
    say(f"{n_eval:,} plans for {model.name} on {n} devices")
    gemm, info = None, {}
    # this process's share of the plans (all of them in a single process)
    rows, keep = distributed.local_rows(n_plans)
    par = jax.tree_util.tree_map(lambda x: x[rows], par)
    if gemm_table:
        gemm, info["n_unique_gemms"], timings["gemm_table_s"] = _gemm_table(
            system, model, par, (float(gb), float(seq_len)), kw.get("precision"), finetune,
            shown)
    with process.stage("search_parallelism: train_step", show_after=shown) as st, \
            process.silenced(not progress):          # train_step's own stage lines too
        res = _parallel.train_step(system, model, par, float(gb), float(seq_len), gemm=gemm,
                                   finetune=finetune, **kw)
        res = jax.tree_util.tree_map(lambda x: np.asarray(x)[:keep], res)
        res = distributed.gather_rows(res)
        res = jax.tree_util.tree_map(
            lambda x: np.asarray(x).reshape((n_eval,) + np.shape(x)[3:])[layout], res)
        st["note"] = f"{n_eval:,} plans"
    timings["evaluate_s"] = st["wall_s"]

    df = _ranked_table(plans, extra, precisions, res, n_eval)
    wall = time.perf_counter() - t0
    attrs = dict(n_evaluated=int(n_eval), wall_s=wall, configs_per_s=n_eval / wall,
                 n_feasible=int(np.sum(np.isfinite(df["step_time_s"]))), timings=timings,
                 **info)
    if top:
        df = df.head(int(top)).copy()
    df.attrs.update(attrs)
    return df
