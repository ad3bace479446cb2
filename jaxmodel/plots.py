"""Figures for sweeps and predictions (matplotlib, Agg canvas; no pyplot global state).

- :func:`pareto_plot` — performance vs cost of a design sweep with its Pareto front;
- :func:`breakdown_plot` — stacked latency breakdowns (one bar per configuration);
- :func:`roofline_plot` — a device's roofline with operators placed on it;
- :func:`heatmap_plot` — a metric over two swept knobs;
- :func:`serving_plot` — throughput per device vs tokens/s per user of serving deployments,
  aggregated vs disaggregated fronts.

Every function returns the :class:`matplotlib.figure.Figure` and writes it when ``path`` is
given (PNG by suffix). Figures are drawn on an Agg canvas directly, so importing this module
never changes the user's matplotlib backend.

Example:
    (illustrative, skipped as a doctest: ``df`` is any sweep result)

    >>> df = jm.sweep(...)          # doctest: +SKIP
    >>> pareto_plot(df, x="cost_usd", y="tokens_per_s", path="pareto.png")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from jaxmodel.numerics import pareto_mask  # noqa: F401  (public here too)

__all__ = ["figure", "save", "pareto_mask", "PlotStyle", "pareto_plot", "breakdown_plot", "roofline_plot",
           "heatmap_plot", "serving_plot", "sensitivity_plot"]


def figure(figsize=(6.4, 4.4)):
    """A matplotlib ``Figure`` on the Agg canvas (no pyplot state), constrained layout."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig, path):
    """Write ``fig`` to ``path`` (PNG at 130 dpi, parent folders created) unless ``path`` is
    None; returns ``fig``."""
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=130)
    return fig


class PlotStyle(NamedTuple):
    """How a figure is labelled and scaled (:func:`pareto_plot`, :func:`heatmap_plot`).

    Attributes:
        title: the figure title (``None``: the plot's default).
        logx, logy: logarithmic x / y axis (:func:`pareto_plot`).
        fmt: format of the numbers on the heat map's ticks and cells (:func:`heatmap_plot`).
    """

    title: str | None = None
    logx: bool = False
    logy: bool = False
    fmt: str = "{:.3g}"


def pareto_plot(df, x: str, y: str, maximize: bool = True, color: str | None = None,
                label_front: str | None = None, style: PlotStyle = PlotStyle(), path=None):
    """Scatter of a sweep (``x`` = cost, ``y`` = performance) with its Pareto front.

    Args:
        df: a sweep DataFrame.
        x, y: column names (cost, performance).
        maximize: ``y`` is better when larger (throughput) rather than smaller (latency).
        color: optional column that colours the points.
        label_front: optional column annotated on a few front points.
        style: :class:`PlotStyle` — ``title`` and the log-scaled axes ``logx``, ``logy``.
        path: where to save the figure (PNG by suffix); ``None`` returns it.
    """
    title, logx, logy = style.title, style.logx, style.logy
    fig = figure()
    ax = fig.add_subplot()
    xs, ys = np.asarray(df[x], float), np.asarray(df[y], float)
    ok = np.isfinite(xs) & np.isfinite(ys)
    c = np.asarray(df[color], float)[ok] if color else None
    sc = ax.scatter(xs[ok], ys[ok], s=3, c=c, alpha=0.35, rasterized=True, linewidths=0,
                    cmap="viridis", label=f"{ok.sum():,} feasible designs")
    if color:
        fig.colorbar(sc, ax=ax, label=color)
    m = pareto_mask(xs, ys, maximize)
    order = np.argsort(xs[m])
    ax.plot(xs[m][order], ys[m][order], "-o", color="crimson", ms=3, lw=1.2,
            label=f"Pareto front ({m.sum()} designs)", drawstyle="steps-post")
    if label_front and m.any():
        lab = np.asarray(df[label_front])[m][order]
        for k in np.linspace(0, m.sum() - 1, min(5, m.sum())).astype(int):
            ax.annotate(str(lab[k]), (xs[m][order][k], ys[m][order][k]), fontsize=7)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    # a fixed corner: loc="best" scans every point (seconds for a 10^5-point sweep)
    ax.legend(fontsize=8, loc="lower right" if maximize else "upper right")
    ax.set_title(title or f"{y} vs {x}")
    return save(fig, path)


def breakdown_plot(breakdowns: Mapping[str, Mapping[str, float]], unit: str = "ms",
                   title: str = "latency breakdown", path=None, horizontal: bool = False):
    """Stacked bars: one bar per configuration, one segment per component (seconds in).

    Args:
        breakdowns: ``{config label: {component: seconds}}``.
        unit: ``"s"``, ``"ms"`` or ``"us"`` for the axis.
    """
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    labels = list(breakdowns)
    comps: list[str] = []
    for b in breakdowns.values():
        comps += [k for k in b if k not in comps]
    fig = figure((max(6.4, 1.1 * len(labels) + 3), 4.6))
    ax = fig.add_subplot()
    base = np.zeros(len(labels))
    cmap = __import__("matplotlib").colormaps["tab20"]
    for j, comp in enumerate(comps):
        vals = np.array([float(np.nan_to_num(breakdowns[lab].get(comp, 0.0), posinf=0.0))
                         for lab in labels]) * scale
        if horizontal:
            ax.barh(labels, vals, left=base, color=cmap(j % 20), label=comp)
        else:
            ax.bar(labels, vals, bottom=base, color=cmap(j % 20), label=comp)
        base += vals
    (ax.set_xlabel if horizontal else ax.set_ylabel)(f"time ({unit})")
    if not horizontal:
        ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize=7, ncols=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x" if horizontal else "y")
    return save(fig, path)


def roofline_plot(peak_flops: float, mem_bw: float, ops: Sequence[Mapping],
                  title: str = "roofline", path=None, extra_roofs: Mapping | None = None):
    """A roofline (Williams et al., CACM 2009) with operators placed on it.

    Args:
        peak_flops: compute roof, FLOP/s.
        mem_bw: memory roof, bytes/s.
        ops: dicts with ``name``, ``flops`` (FLOP), ``bytes`` (bytes moved) and optionally
            ``time_s`` (modelled or measured latency: the point is then drawn at the achieved
            FLOP/s, else on the roof).
        extra_roofs: ``{label: bytes/s}`` additional bandwidth roofs (e.g. L2).
    """
    fig = figure()
    ax = fig.add_subplot()
    ai = np.array([o["flops"] / max(o["bytes"], 1e-30) for o in ops] or [1.0])
    lo, hi = min(ai.min() / 4, peak_flops / mem_bw / 20), max(ai.max() * 4,
                                                               peak_flops / mem_bw * 20)
    grid = np.geomspace(lo, hi, 256)
    ax.loglog(grid, np.minimum(peak_flops, grid * mem_bw), "k-", lw=1.5,
              label=f"roof: {peak_flops / 1e12:.0f} TFLOP/s, {mem_bw / 1e9:.0f} GB/s")
    for lab, bw in (extra_roofs or {}).items():
        ax.loglog(grid, np.minimum(peak_flops, grid * bw), "--", lw=1, label=lab)
    for o, a in zip(ops, ai):
        t = o.get("time_s")
        perf = o["flops"] / t if t else min(peak_flops, a * mem_bw)
        ax.loglog([a], [perf], "o", ms=6, label=o["name"])
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("performance (FLOP/s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(title)
    return save(fig, path)


def heatmap_plot(df, x: str, y: str, value: str, agg: str = "min", log: bool = True,
                 style: PlotStyle = PlotStyle(), path=None):
    """Heat map of ``value`` over two swept knobs (other knobs aggregated with ``agg``;
    ``log``: colours by ``log10 value``; ``style``: :class:`PlotStyle`'s ``title`` and the
    number format ``fmt`` of ticks and cells)."""
    import pandas as pd
    title, fmt = style.title, style.fmt
    clean = df.replace([np.inf, -np.inf], np.nan)
    table = pd.pivot_table(clean, index=y, columns=x, values=value, aggfunc=agg)
    fig = figure((max(5.0, 0.55 * table.shape[1] + 2.5), max(4.0, 0.4 * table.shape[0] + 1.5)))
    ax = fig.add_subplot()
    data = table.to_numpy(dtype=float)
    shown = np.log10(np.where(data > 0, data, np.nan)) if log else data
    im = ax.imshow(shown, origin="lower", aspect="auto", cmap="magma_r")
    fig.colorbar(im, ax=ax, label=f"log10 {value}" if log else value)
    ax.set_xticks(range(table.shape[1]), [fmt.format(v) for v in table.columns], rotation=45,
                  fontsize=7)
    ax.set_yticks(range(table.shape[0]), [fmt.format(v) for v in table.index], fontsize=7)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if data.size <= 144:
        for (i, j), v in np.ndenumerate(data):
            if np.isfinite(v):
                ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6,
                        color="w")
    ax.set_title(title or f"{agg} {value}")
    return save(fig, path)


def serving_plot(df, x: str = "tokens_per_s_per_user", y: str = "throughput_per_gpu",
                 by: str = "mode", title: str | None = None, path=None):
    """Serving deployments meeting their limits (``df.meets_slo``; every row when the column
    is absent): ``y`` (output tokens/s per device) against ``x`` (tokens/s per user), one
    colour and one Pareto front per value of ``by`` (aggregated / disaggregated), and the
    overall front. ``df``: :func:`jaxmodel.search_serving` with ``full=True``."""
    fig = figure()
    ax = fig.add_subplot()
    ok = np.asarray(df["meets_slo"], bool) if "meets_slo" in df else np.ones(len(df), bool)
    xs, ys = np.asarray(df[x], float), np.asarray(df[y], float)
    ok = ok & np.isfinite(xs) & np.isfinite(ys) & (ys > 0)
    groups = np.asarray(df[by]) if by in df else np.full(len(df), "all")
    for i, g in enumerate(sorted(set(groups[ok]))):
        sel = ok & (groups == g)
        color = f"C{i}"
        ax.scatter(xs[sel], ys[sel], s=3, alpha=0.25, color=color, linewidths=0,
                   rasterized=True)
        m = pareto_mask(-xs[sel], ys[sel])
        order = np.argsort(xs[sel][m])
        ax.plot(xs[sel][m][order], ys[sel][m][order], "-o", ms=3, lw=1.2, color=color,
                label=f"{g}: {sel.sum():,} meet the limits, front of {m.sum()}")
    ax.set_xlabel(f"{x} (tokens/s per user)")
    ax.set_ylabel(f"{y} (output tokens/s per device)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(title or "serving deployments")
    return save(fig, path)


def sensitivity_plot(table, top: int = 10, title: str | None = None, path=None):
    """Horizontal bars of the largest elasticities of each metric of a
    :func:`jaxmodel.sensitivity` table (one panel per metric); knobs at a kink are hatched."""
    metrics = list(dict.fromkeys(table["metric"]))
    fig = figure((6.8, 1.2 + 0.32 * top * len(metrics)))
    axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0]
    for ax, m in zip(axes, metrics):
        sub = table[table["metric"] == m].head(top)[::-1]
        colors = ["tab:red" if e > 0 else "tab:blue" for e in sub["elasticity"]]
        bars = ax.barh(sub["knob"], sub["elasticity"], color=colors)
        for b, k in zip(bars, sub["kink"]):
            if k:
                b.set_hatch("//")
        ax.axvline(0.0, color="k", lw=0.6)
        ax.set_title(m, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(alpha=0.3, axis="x")
    axes[-1].set_xlabel("elasticity d ln metric / d ln knob")
    if title:
        fig.suptitle(title)
    return save(fig, path)
