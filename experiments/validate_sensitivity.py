"""Validation of the elasticities of ``jm.sensitivity`` against central finite differences on
random hardware points (float64).

Points: ``--points`` (default 1,000; seeded) split between a training family
(``jm.explain_train``'s metrics: step time, tokens/s per GPU, USD per million tokens, J/token)
and a serving family (``jm.explain_serve``'s: TTFT, TPOT, tokens/s per GPU, USD/Mtok,
J/token). Each point draws a system from :data:`SYSTEMS` (hw_db), multiplies **every**
continuous Device/NetLevel knob that ``jm.sensitivity`` covers (``jaxmodel.explain.knobs``)
by an independent log-uniform factor in ``[1/SPREAD, SPREAD]`` (clipped into the field's
admissible range, ``jaxmodel.types.RANGES``: efficiencies stay ≤ 1), and draws a model, a
plan and a workload from the family's lists (one static variant per family, so each family
is one compiled ``jax.lax.map`` over points of the per-point ``jax.jacrev`` and the vmapped
``x·e^{±h}`` evaluations: :func:`jaxmodel.explain.sensitivity_batch`).

Comparison, per (point, metric, knob): the elasticity ``ε`` (reverse mode) against the
central difference in log space ``c = (ln f(x·e^h) − ln f(x·e^{−h}))/(2h)``, ``h`` =
:data:`STEP`. Agreement: ``|ε − c| ≤ 1 % · max(|c|, FLOOR)`` (relative, with the absolute
floor ``0.01·FLOOR`` for near-zero elasticities). **Kinks** (the model is piecewise smooth:
tile-search winners, NCCL algorithm/protocol switches, ``max``-type overlaps, feasibility
steps) are detected from the one-sided differences ``d± = ±(ln f(x·e^{±h}) − ln f(x))/h``:
a pair is excluded when ``|d+ − d−| > KINK_TOL · max(|c|, FLOOR)`` (a switch within a
relative step ``h`` of the point: the derivative there is one-sided and ``ε`` is one side's,
so ``|ε − c|`` is half the jump — a jump below :data:`KINK_TOL` stays in the comparison and
must still pass the 1 %). A feasibility step within ``±h`` (the base point feasible, a
step not: the finite differences are undefined there) is excluded as a kink too. Pairs of
infeasible points (out of memory at a halved capacity, ...) are counted apart; every number
is checked finite (NaN count must be 0). Kinks are detected from the differences only, not
from the tile/algorithm choice itself (not exposed by the model's result).

Cost: each family is two compiled graphs (the mapped reverse pass and the mapped steps),
compiled once for a chunk of ``--chunk`` points; printed as the first chunk's time and the
run time per point.

Writes ``experiments/out/validate_sensitivity.csv`` (one row per (point, metric, knob)),
``_summary.csv`` and ``.png`` (``|ε − c|`` against ``|c|``, kinks marked).
Run: ``.venv/bin/python experiments/validate_sensitivity.py [--points N] [--batch-size B]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from jaxmodel.batching import ONE_SHOT_COMPILE_OPTIONS, add_xla_flags

add_xla_flags(ONE_SHOT_COMPILE_OPTIONS)   # before JAX starts: the graphs compile once

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import hw_db  # noqa: E402
import jaxmodel as jm  # noqa: E402
from jaxmodel import energy as en  # noqa: E402
from jaxmodel import explain as ex  # noqa: E402
from jaxmodel.types import rule_of  # noqa: E402

from common import OUT, figure, save  # noqa: E402

#: Systems the points are drawn from (one DGX-class node each: the same network structure).
SYSTEMS = ("dgx_h100", "dgx_h200", "dgx_b200")
#: Log-uniform factor range of every knob: ``[1/SPREAD, SPREAD]``.
SPREAD = 2.0
#: Relative finite-difference step ``h`` (float64: truncation ~h·f''/f, rounding ~1e-16/h).
STEP = 1e-4
#: Agreement tolerance (relative) and the floor of ``|c|`` it is relative to.
TOL, FLOOR = 0.01, 0.05
#: One-sided differences disagreeing by more than this (relative to max(|c|, FLOOR)): kink.
KINK_TOL = 0.02

#: Training family: dense, TP 8 with sequence parallelism and FlashAttention on one node;
#: (model, pp, global batch, sequence length) drawn per point.
TRAIN_MODELS = ("llama3-8b", "llama2-13b", "gpt3-13b")
TRAIN_WORK = ((8, 2048), (16, 4096), (32, 2048), (64, 4096))
#: Serving family: TP 8 on one node, TensorRT-LLM runtime; (model, batch, ISL, OSL).
SERVE_MODELS = ("llama3-8b", "llama2-70b", "llama3-70b")
SERVE_WORK = ((1, 512, 128), (16, 1024, 256), (64, 2048, 256), (128, 256, 512))


def _scaled(system, rng):
    """The system with every knob scaled by a log-uniform factor, clipped into range."""
    vals = {}
    for name, owner, field in ex._walk(system, ""):
        if name not in KNOBS:
            continue
        rule = rule_of(type(owner), field)
        v = float(getattr(owner, field)) * float(np.exp(rng.uniform(-np.log(SPREAD),
                                                                     np.log(SPREAD))))
        hi = rule.hi if np.isfinite(rule.hi) else v
        vals[name] = float(np.clip(v, rule.lo if rule.lo > 0 else v, hi))
    return ex._set_all(system, vals)


KNOBS: set = set()


def _base(name):
    """The hw_db system with sentinel values made explicit (the idle power a device does not
    give is :data:`jaxmodel.energy.IDLE_TDP_SHARE` × TDP): the same knobs on every system."""
    sy = hw_db.system(name)
    dev = sy.device
    if float(dev.idle_power_w) < 0:
        dev = dataclasses.replace(dev, idle_power_w=float(en.idle_power(dev)))
    return dataclasses.replace(sy, device=dev)


def _knobs():
    """Knobs of every system of :data:`SYSTEMS` (their intersection, in the first's order)."""
    per = [ex.knobs(_base(s)) for s in SYSTEMS]
    return [k for k in per[0] if all(k in p for p in per[1:])]


def _draw(family, n, rng):
    systems, models, pars, work = [], [], [], []
    base = {s: _base(s) for s in SYSTEMS}
    names = []
    for _ in range(n):
        s = SYSTEMS[rng.integers(len(SYSTEMS))]
        systems.append(_scaled(base[s], rng))
        names.append(s)
        if family == "train":
            models.append(hw_db.model(TRAIN_MODELS[rng.integers(len(TRAIN_MODELS))]))
            pars.append(jm.Parallelism(tp=8, sp=True, recompute="selective",
                                       flash_attention=True))
            work.append(TRAIN_WORK[rng.integers(len(TRAIN_WORK))])
        else:
            models.append(hw_db.model(SERVE_MODELS[rng.integers(len(SERVE_MODELS))]))
            pars.append(jm.Parallelism(tp=8))
            work.append(SERVE_WORK[rng.integers(len(SERVE_WORK))])
    return names, systems, models, pars, work


def _call(family, systems, models, pars, work, batch_size, mode="rev"):
    kw = dict(wrt=_knobs(), step=STEP, kink_tol=KINK_TOL,
              jacobian=ex.JacobianMap(batch_size=batch_size, mode=mode))
    if family == "train":
        return ex.explain_train_batch(systems, models, pars, [w[0] for w in work],
                                      [w[1] for w in work], **kw)
    return ex.explain_serve_batch(systems, models, pars,
                                  [jm.InferenceOptions(*w[:3]) for w in work],
                                  runtime="trtllm", **kw)


def run_family(family, n, rng, batch_size, chunk, mode="rev", partial=None):
    """The family's ``n`` points in chunks of ``chunk`` (one shape: one compile; the last
    chunk is padded with its first point); prints the compile and per-point run times and,
    with ``partial`` (a path), writes the pairs done so far after each chunk."""
    names, systems, models, pars, work = _draw(family, n, rng)
    t_start = time.perf_counter()
    parts, times = [], []
    for lo in range(0, n, chunk):
        idx = list(range(lo, min(lo + chunk, n)))
        idx += [idx[0]] * (chunk - len(idx))
        t0 = time.perf_counter()
        parts.append(_call(family, [systems[i] for i in idx], [models[i] for i in idx],
                           [pars[i] for i in idx], [work[i] for i in idx], batch_size,
                           mode))
        times.append(time.perf_counter() - t0)
        print(f"  {family}: points {lo}..{min(lo + chunk, n) - 1} in {times[-1]:.0f} s",
              flush=True)
        if partial is not None:     # a fresh checkout has no experiments/out yet
            done = min(lo + chunk, n)
            Path(partial).parent.mkdir(parents=True, exist_ok=True)
            _frame(family, done, parts, names[:done], models[:done]).to_csv(partial,
                                                                             index=False)
    wall = time.perf_counter() - t_start
    run = (sum(times[1:]) / (len(times) - 1) / chunk) if len(times) > 1 else float("nan")
    print(f"  {family}: first chunk (compile + run) {times[0]:.0f} s; then {run:.2f} s per "
          "point", flush=True)
    return _frame(family, n, parts, names, models), wall


def _frame(family, n, parts, names, models):
    """One row per (point, metric, knob) of the first ``n`` points of the chunks."""
    out = {"knobs": parts[0]["knobs"]}
    for m in parts[0]:
        if m not in ("knobs", "step"):
            out[m] = {c: np.concatenate([p[m][c] for p in parts])[:n] for c in parts[0][m]}
    knobs = out["knobs"]
    frames = []
    for m, d in out.items():
        if m in ("knobs", "step"):
            continue
        k = len(knobs)
        frames.append(pd.DataFrame(dict(
            family=family, point=np.repeat(np.arange(n), k),
            system=np.repeat(names, k),
            model=np.repeat([mo.name for mo in models], k),
            metric=m, knob=np.tile(knobs, n),
            metric_value=np.repeat(d["value"], k), feasible=np.repeat(d["feasible"], k),
            elasticity=d["elasticity"].ravel(), fd_forward=d["fd_forward"].ravel(),
            fd_backward=d["fd_backward"].ravel(), fd_central=d["fd_central"].ravel(),
            fd_ok=d["fd_ok"].ravel())))
    return pd.concat(frames, ignore_index=True)


def classify(df):
    """Adds ``kink``, ``within`` and ``nan`` columns (module docstring)."""
    c = df["fd_central"].to_numpy()
    scale = np.maximum(np.abs(c), FLOOR)
    nums = df[["elasticity", "fd_forward", "fd_backward", "fd_central"]].to_numpy()
    df["nan"] = ~np.isfinite(nums).all(axis=1)
    one_sided = np.abs(df["fd_forward"] - df["fd_backward"]).to_numpy() > KINK_TOL * scale
    step = df["feasible"].to_numpy() & ~df["fd_ok"].to_numpy()
    df["kink"] = np.where(step, "feasibility", np.where(one_sided, "one-sided", ""))
    df["err"] = np.abs(df["elasticity"].to_numpy() - c)
    df["within"] = df["err"].to_numpy() <= TOL * scale
    return df


def summarize(df):
    feas = df["feasible"]
    kink = df["kink"] != ""
    comp = feas & ~kink
    rows = []
    for (fam, m), g in df.groupby(["family", "metric"], sort=False):
        gk = g["kink"] != ""
        gc = g[g["feasible"] & ~gk]
        rows.append(dict(family=fam, metric=m, pairs=len(g),
                         infeasible=int((~g["feasible"]).sum()),
                         kinks=int((g["feasible"] & (g["kink"] == "one-sided")).sum()),
                         steps=int((g["feasible"] & (g["kink"] == "feasibility")).sum()),
                         compared=len(gc), within=int(gc["within"].sum()),
                         pct_within=100.0 * gc["within"].mean() if len(gc) else float("nan"),
                         worst_err=float(gc["err"].max()) if len(gc) else 0.0,
                         nan=int(g["nan"].sum())))
    s = pd.DataFrame(rows)
    total = dict(family="all", metric="all", pairs=len(df), infeasible=int((~feas).sum()),
                 kinks=int((feas & (df["kink"] == "one-sided")).sum()),
                 steps=int((feas & (df["kink"] == "feasibility")).sum()),
                 compared=int(comp.sum()),
                 within=int(df["within"][comp].sum()),
                 pct_within=100.0 * df["within"][comp].mean() if comp.any() else float("nan"),
                 worst_err=float(df["err"][comp].max()) if comp.any() else 0.0,
                 nan=int(df["nan"].sum()))
    return pd.concat([s, pd.DataFrame([total])], ignore_index=True)


def plot(df, path):
    fig = figure(figsize=(6.5, 4.5))
    ax = fig.add_subplot()
    feas = df[df["feasible"]]
    for sel, label, kw in ((feas["kink"] == "", "compared", dict(s=4, alpha=0.4)),
                           (feas["kink"] != "", "kink (excluded)", dict(s=8, marker="x"))):
        sub = feas[sel]
        ax.scatter(np.maximum(np.abs(sub["fd_central"]), 1e-8),
                   np.maximum(sub["err"], 1e-16), label=f"{label} ({len(sub)})", **kw)
    xs = np.logspace(-8, 1, 50)
    ax.plot(xs, TOL * np.maximum(xs, FLOOR), "k--", lw=1, label="1 % (floor 0.05)")
    ax.set(xscale="log", yscale="log", xlabel="|central difference|",
           ylabel="|elasticity − central difference|",
           title=f"{df.point.nunique()} random points, h = {STEP:g} (float64)")
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=50)
    ap.add_argument("--mode", choices=("rev", "fwd"), default="rev",
                    help="derivative mode of the batch (rev = jm.sensitivity's reverse mode)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="train,serve")
    ap.add_argument("--out", default=str(OUT / "validate_sensitivity"))
    ap.add_argument("--merge", nargs="*", default=None, metavar="CSV",
                    help="summarize the per-pair CSVs of earlier runs (one per family) "
                         "instead of computing")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    KNOBS.update(_knobs())
    fams = [f for f in a.families.split(",") if f]
    frames = []
    if a.merge:
        for path in a.merge:
            d = pd.read_csv(path, keep_default_na=False, na_values=[""])
            if "kink" in d:
                d["kink"] = d["kink"].fillna("")
            d["point"] = d["family"] + ":" + d["point"].astype(str)
            frames.append(d)
    for i, fam in enumerate([] if a.merge else fams):
        n = a.points // len(fams) + (1 if i < a.points % len(fams) else 0)
        df, wall = run_family(fam, n, rng, a.batch_size, min(a.chunk, n), a.mode,
                              partial=a.out + f"_{fam}.partial.csv")
        print(f"{fam}: {n} points x {df.knob.nunique()} knobs x {df.metric.nunique()} "
              f"metrics in {wall:.0f} s (compile included)")
        df["point"] = fam + ":" + df["point"].astype(str)
        frames.append(df)
    df = classify(pd.concat(frames, ignore_index=True))
    s = summarize(df)
    out = a.out
    OUT.mkdir(parents=True, exist_ok=True)
    df.to_csv(out + ".csv", index=False)
    s.to_csv(out + "_summary.csv", index=False)
    plot(df, out + ".png")
    tot = s.iloc[-1]
    print(s.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"\npoints {df.point.nunique()}, knobs {df.knob.nunique()}, h = {STEP:g} (float64); "
          f"{int(tot.compared)} (point, metric, knob) pairs compared, "
          f"{tot.pct_within:.2f} % within {100 * TOL:g} % (floor |c| >= {FLOOR}); "
          f"kinks excluded {int(tot.kinks)} (one-sided differences disagree by > "
          f"{100 * KINK_TOL:g} %), feasibility steps within ±h excluded {int(tot.steps)}; "
          f"infeasible pairs {int(tot.infeasible)} "
          f"({df[~df.feasible].point.nunique()} points); NaN {int(tot.nan)}")
    comp = df[df["feasible"] & (df["kink"] == "")]
    worst = comp.assign(rel=comp["err"] / np.maximum(np.abs(comp["fd_central"]), FLOOR))
    print("worst compared pairs:")
    print(worst.nlargest(8, "rel")[["family", "system", "model", "metric", "knob",
                                    "elasticity", "fd_central", "fd_forward",
                                    "fd_backward"]].to_string(index=False))
    return df, s


if __name__ == "__main__":
    main()
