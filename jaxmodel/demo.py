"""The main job (``make demo``): jaxmodel end to end in a few minutes on a laptop CPU.

``python -m jaxmodel.demo --out demo_out`` runs

1. predictions — GPT-3 175B and Llama-3-70B on DGX A100, H100 and B200 systems: one training
   step (512 GPUs, TP 8 × PP 8 × DP 8, interleaved 1F1B, SP, selective recompute,
   FlashAttention, ZeRO-1) and one inference run (one 8-GPU node, TP 8, batch 8, prompt 2048,
   512 generated tokens), each in ONE batched call over the 6 (system, model) pairs;
2. a roofline of Llama-3-70B's layer GEMMs on H100 (prefill and decode);
3. a 131,072-point hardware sweep (core count × HBM stacks × global buffer × local buffer ×
   NVLink bandwidth of an H100-like device serving Llama-3-70B on 8 devices) with its Pareto
   front of throughput vs cost of ownership (``jm.sweep``, ``jm.tco``);
4. a parallelism search (Llama-3-70B on 64 H100, ``jm.search_parallelism``);
5. a gradient co-design run (``jm.codesign``: TCO per million tokens over core count, HBM
   stacks and buffers of the device serving GPT-3 175B).

It writes CSV and PNG files into ``--out`` and prints a short summary with progress.
``--quick`` shrinks the sweep, the search and the co-design (for tests).

Nearly all of the demo's time is XLA compiling its graphs, one graph at a time and mostly on
one core. The stages are therefore split over two processes that run side by side (stages 1,
2 and 5 here, 3 and 4 in a second process started first; ``--serial`` runs all five in this
process). The second process ends with this one (on an error, Ctrl-C or SIGTERM here; on
Linux also if this one is killed). Both compile with ``--xla_cpu_use_fusion_emitters=false``
in ``XLA_FLAGS`` (:data:`jaxmodel.batching.CPU_COMPILE_OPTIONS`; left out where the user set
it or this XLA does not know it). Each process times its own stages, but the two run at the
same time on the same cores, so a stage's printed compile and run times include the slowdown
from the other process's stages.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxmodel.batching import xla_knows

SYSTEMS = ("dgx_a100", "dgx_h100", "dgx_b200")
MODELS = ("gpt3-175b", "llama3-70b")


class Progress:
    """Section timer printing ``[demo t=…s] message`` lines (silenced by ``--quiet`` or
    ``JAXMODEL_QUIET=1``); ``t0`` (a ``time.perf_counter()`` reading, on Linux one clock for
    every process) lets the second process count from the same start."""

    def __init__(self, t0: float | None = None):
        self.t0 = time.perf_counter() if t0 is None else t0

    def __call__(self, msg: str):
        from jaxmodel import process
        if not process.quiet():
            print(f"[demo {time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)


def _stack(objs):
    """One config pytree whose leaves carry a leading axis over ``objs`` (names dropped)."""
    def clean(o):
        if isinstance(o, jm_types().System):
            return dataclasses.replace(o, name="stack",
                                       device=dataclasses.replace(o.device, name="stack"))
        return dataclasses.replace(o, name="stack")
    objs = [clean(o) for o in objs]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x, jnp.float32)
                                                         for x in xs]), *objs)


def jm_types():
    import jaxmodel.types as t
    return t


def predictions(out: Path, say) -> pd.DataFrame:
    import hw_db
    import jaxmodel as jm
    from jaxmodel.plots import breakdown_plot
    from jaxmodel.cost.area import area_fields
    pairs = [(s, m) for s in SYSTEMS for m in MODELS]
    systems = _stack([dataclasses.replace(hw_db.system(s, nodes=64), device=area_fields(
        hw_db.device(hw_db.load_toml(hw_db.ROOT / "systems" / f"{s}.toml")["device"])))
        for s, _ in pairs])
    models = _stack([hw_db.model(m) for _, m in pairs])
    par = jm.Parallelism(dp=8, tp=8, pp=8, sp=True, micro_batch=1, interleave=2,
                         schedule="interleaved", recompute="selective", zero=1,
                         flash_attention="fa2")
    tr = jm.train_step(systems, models, par, 1024, 2048)
    say("training step of 2 models × 3 systems (512 GPUs each) evaluated")
    node = _stack([dataclasses.replace(hw_db.system(s, nodes=1)) for s, _ in pairs])
    inf = jm.inference(node, models, jm.Parallelism(tp=8, flash_attention="fa2"), 8, 2048, 512)
    say("inference of 2 models × 3 systems (one 8-GPU node each) evaluated")
    tco = jm.tco(node, inf.tokens_per_s)
    rows, breakdowns = [], {}
    for i, (s, m) in enumerate(pairs):
        rows.append(dict(
            system=s, model=m, train_step_s=float(tr.step_time_s[i]), train_mfu=float(tr.mfu[i]),
            train_tokens_per_s=float(tr.tokens_per_s[i]),
            train_memory_gb=float(tr.memory_bytes[i]) / 1e9,
            train_feasible=bool(tr.feasible[i]), ttft_s=float(inf.ttft_s[i]),
            tpot_ms=1e3 * float(inf.tpot_s[i]), infer_tokens_per_s=float(inf.tokens_per_s[i]),
            infer_memory_gb=float(inf.memory_bytes[i]) / 1e9,
            infer_feasible=bool(inf.feasible[i]),
            usd_per_million_tokens=float(tco.usd_per_million_tokens[i])))
        breakdowns[f"{s.replace('dgx_', '')}\n{m}"] = {
            k: float(v[i]) for k, v in tr.breakdown.items()}
    df = pd.DataFrame(rows)
    df.to_csv(out / "predictions.csv", index=False)
    breakdown_plot(breakdowns, unit="s", title="training step breakdown (512 GPUs, TP8 PP8 DP8)",
                   path=out / "train_breakdown.png")
    inf_bd = {f"{s.replace('dgx_', '')}\n{m}": {
        "prefill (TTFT)": float(inf.ttft_s[i]),
        "decode (511 × TPOT)": 511 * float(inf.tpot_s[i])} for i, (s, m) in enumerate(pairs)}
    breakdown_plot(inf_bd, unit="s", title="inference latency (8 GPUs, TP 8, batch 8, 2048+512)",
                   path=out / "inference_breakdown.png")
    return df


def roofline(out: Path, say):
    import hw_db
    import jaxmodel as jm
    from jaxmodel.plots import roofline_plot
    system = hw_db.system("dgx_h100")
    model = hw_db.model("llama3-70b")
    par = jm.Parallelism(tp=8)
    dev = system.device
    d, dff, t = float(model.d_model), float(model.d_ff), 8.0
    kv = float(model.n_kv_heads * model.head_dim)
    ops = []
    for phase, b, s, kvlen in (("prefill", 8.0, 2048.0, 0.0), ("decode", 8.0, 1.0, 2048.0)):
        times = jm.layer_breakdown(system, model, par, b, s, phase, kv_len=kvlen)
        tok = b * s
        shapes = {"qkv": (tok, (d + 2 * kv) / t, d), "wo": (tok, d, d / t),
                  "w1": (tok, 2 * dff / t, d), "w2": (tok, d, dff / t)}
        for op, (m, n, k) in shapes.items():
            ops.append({"name": f"{phase} {op}", "flops": 2 * m * n * k,
                        "bytes": 2 * (m * k + k * n + m * n), "time_s": float(times[op])})
    roofline_plot(float(dev.peak_matrix_flops), float(dev.mem_bw), ops,
                  title="Llama-3-70B layer GEMMs on H100 (TP 8)",
                  extra_roofs={"L2": float(dev.global_buffer_bw)}, path=out / "roofline.png")
    pd.DataFrame(ops).to_csv(out / "roofline_ops.csv", index=False)
    say("roofline of Llama-3-70B GEMMs on H100 written")


def hardware_sweep(out: Path, say, quick: bool) -> pd.DataFrame:
    import hw_db
    import jaxmodel as jm
    from jaxmodel.cost.area import area_fields
    from jaxmodel.plots import PlotStyle, heatmap_plot, pareto_mask, pareto_plot
    from jaxmodel.parallel.inference_step import inference_single
    from jaxmodel.search.objectives import apply_knobs
    from jaxmodel.workload import layer as _layer
    base = hw_db.system("dgx_h100")
    base = dataclasses.replace(base, device=area_fields(base.device))
    model = hw_db.model("llama3-70b")
    par = jm.Parallelism(tp=8, flash_attention="fa2")
    variant = _layer.variant_of(model, par, base)
    batch, prompt, gen = 32.0, 2048.0, 512.0

    def serve(system, p):
        s = apply_knobs(system, p)
        r = inference_single(s, model, par, batch, prompt, gen, variant=variant)
        fits = r.feasible
        tps = r.tokens_per_s
        cost = jm.tco.single(s, tps)
        return {"tokens_per_s": tps, "usd_per_hour": cost.usd_per_hour,
                "capex_usd": cost.capex_usd, "usd_per_mtok": cost.usd_per_million_tokens,
                "fits_memory": fits}

    n = 2 if quick else 1
    grid = {"p.core_count": np.round(np.geomspace(33, 264, 16 // n)),
            "p.hbm_stacks": np.arange(1.0, 9.0, n),
            "p.global_buffer_bytes": np.geomspace(12.5e6, 100e6, 8 // n),
            "p.local_buffer_bytes": np.geomspace(64 * 1024, 1024 * 1024, 8 // n),
            "p.link_bw": np.geomspace(112.5e9, 1800e9, 16 // n)}
    df = jm.sweep(serve, base, {k[2:]: 1.0 for k in grid}, grid=grid, chunk=1024,
                  progress=True)
    df.columns = [c[2:] if c.startswith("p.") else c for c in df.columns]
    say(f"hardware sweep: {len(df):,} designs in {df.attrs['wall_s']:.1f} s "
        f"({len(df) / df.attrs['wall_s']:,.0f} designs/s incl. compile)")
    ok = df["fits_memory"].to_numpy() & np.isfinite(df["usd_per_mtok"].to_numpy())
    feas = df[ok]
    front = feas[pareto_mask(feas["usd_per_hour"], feas["tokens_per_s"])]
    front.sort_values("usd_per_hour").to_csv(out / "hw_sweep_pareto.csv", index=False)
    df.sample(n=min(len(df), 20000), random_state=0).to_csv(out / "hw_sweep_sample.csv",
                                                            index=False)
    pareto_plot(feas, x="usd_per_hour", y="tokens_per_s", color="hbm_stacks",
                style=PlotStyle(title=f"Llama-3-70B serving on 8 devices: {len(feas):,} "
                                "feasible designs", logx=True, logy=True),
                path=out / "hw_sweep_pareto.png")
    heatmap_plot(feas, x="core_count", y="hbm_stacks", value="usd_per_mtok", agg="min",
                 style=PlotStyle(title="best USD per million tokens", fmt="{:.3g}"),
                 path=out / "hw_sweep_heatmap.png")
    return df


def parallelism_search(out: Path, say, quick: bool) -> pd.DataFrame:
    import hw_db
    import jaxmodel as jm
    nodes = 2 if quick else 8
    opts = dict(recompute=("selective", "full"), zero=(0, 1), flash_attention=("fa2",)) \
        if quick else {}
    df = jm.search_parallelism(hw_db.system("dgx_h100", nodes=nodes), hw_db.model("llama3-70b"),
                               8 * nodes, 256, 4096, progress=True, **opts)
    say(f"parallelism search: {df.attrs['n_evaluated']:,} plans for Llama-3-70B on "
        f"{8 * nodes} H100 in {df.attrs['wall_s']:.1f} s; {df.attrs['n_feasible']:,} feasible")
    df.head(200).to_csv(out / "parallelism_search_top200.csv", index=False)
    from jaxmodel.plots import figure, save
    fig = figure()
    ax = fig.add_subplot()
    feas = df[np.isfinite(df.step_time_s)]
    sc = ax.scatter(feas.memory_bytes / 1e9, feas.step_time_s, c=np.log2(feas.tp), s=3,
                    alpha=0.4, cmap="viridis", rasterized=True)
    fig.colorbar(sc, ax=ax, label="log2 TP")
    ax.set_xlabel("memory per GPU (GB)")
    ax.set_ylabel("step time (s)")
    ax.set_yscale("log")
    ax.set_title(f"Llama-3-70B on {8 * nodes} H100: feasible plans")
    save(fig, out / "parallelism_search.png")
    return df


def codesign_run(out: Path, say, quick: bool):
    import hw_db
    import jaxmodel as jm
    from jaxmodel.search.objectives import evaluate_design, make_objective
    system = hw_db.system("dgx_a100")
    model = hw_db.model("gpt3-175b")
    par = jm.Parallelism(tp=8)
    wl = dict(batch=8.0, prompt_len=2048.0, gen_len=1024.0)
    obj = make_objective(system, model, par, **wl)
    bounds = {"core_count": (8.0, 256.0), "hbm_stacks": (1.0, 8.0),
              "global_buffer_bytes": (8 * 2.0 ** 20, 128 * 2.0 ** 20),
              "local_buffer_bytes": (64 * 1024.0, 1024 * 1024.0)}
    init = {"core_count": 108.0, "hbm_stacks": 5.0, "global_buffer_bytes": 40 * 2.0 ** 20,
            "local_buffer_bytes": 192 * 1024.0}
    res = jm.codesign(obj, init, bounds, steps=10 if quick else 30,
                      integer=("core_count", "hbm_stacks"),
                      options=jm.CodesignOptions(n_starts=2 if quick else 4,
                                                 polish=16 if quick else 32))
    a100 = evaluate_design(system, model, par, init, **wl)
    best = evaluate_design(system, model, par, res.params, **wl)
    a100_v = res.init_value                  # the objective at the A100 design
    say(f"co-design: USD per million tokens {a100_v:.3f} (A100 design) → {res.value:.3f} "
        f"({res.n_evals} evaluations)")
    pd.DataFrame({"step": np.arange(len(res.best_history)),
                  "best_usd_per_mtok": res.best_history}).to_csv(out / "codesign_history.csv",
                                                                 index=False)
    from jaxmodel.plots import figure, save
    fig = figure()
    ax = fig.add_subplot()
    ax.plot(res.history, alpha=0.5)
    ax.plot(res.best_history, "k-", lw=2, label="best so far")
    ax.axhline(a100_v, color="crimson", ls="--", label="A100 design")
    ax.set_xlabel("Adam step")
    ax.set_ylabel("USD per million tokens (GPT-3 175B, 8 devices)")
    ax.legend(fontsize=8)
    ax.set_title("gradient co-design of the device")
    save(fig, out / "codesign.png")
    return {"a100_design": {**init, **a100, "usd_per_mtok": a100_v},
            "codesign": {**res.params, **best, "usd_per_mtok": res.value,
                         "n_evals": res.n_evals}}


def _summary_predictions(out, say, quick):
    pred = predictions(out, say)
    return {"predictions": pred.round(4).to_dict(orient="records"), "_pred": pred}


def _summary_roofline(out, say, quick):
    roofline(out, say)
    return {}


def _summary_sweep(out, say, quick):
    sw = hardware_sweep(out, say, quick)
    feas = sw[sw.fits_memory]
    best = feas.loc[feas.usd_per_mtok.idxmin()]
    return {"hardware_sweep": {"n_designs": len(sw), "n_feasible": len(feas),
                               "best_usd_per_mtok": {k: float(best[k]) for k in best.index
                                                     if k != "fits_memory"}}}


def _summary_search(out, say, quick):
    se = parallelism_search(out, say, quick)
    cols = ["dp", "tp", "pp", "sp", "micro_batch", "interleave", "schedule", "recompute",
            "zero", "flash_attention", "step_time_s", "mfu"]
    return {"parallelism_search": {"n_plans": int(se.attrs["n_evaluated"]),
                                   "best": {k: (v if isinstance(v, str) else float(v))
                                            for k, v in se.iloc[0][cols].items()}}}


def _summary_codesign(out, say, quick):
    return {"codesign": codesign_run(out, say, quick)}


#: the five stages in order: (label, function returning its part of ``summary.json``)
STAGES = (("1/5 predictions", _summary_predictions), ("2/5 roofline", _summary_roofline),
          ("3/5 hardware sweep", _summary_sweep), ("4/5 parallelism search", _summary_search),
          ("5/5 co-design", _summary_codesign))
#: the stages the second process runs (side by side with the others): about half of the
#: demo's CPU time each
SIDE = ("3/5 hardware sweep", "4/5 parallelism search")


def use_compile_options() -> None:
    """Add :data:`jaxmodel.batching.CPU_COMPILE_OPTIONS` to ``XLA_FLAGS`` (those the user did
    not set, and only if this XLA knows them: :func:`xla_knows`) while XLA can still read it —
    before JAX starts its backend — so that every graph of the demo compiles with them (the
    batched model calls jit without compiler options). Child processes inherit the variable.
    On other backends the options do nothing."""
    from jaxmodel.batching import CPU_COMPILE_OPTIONS, add_xla_flags
    add_xla_flags(CPU_COMPILE_OPTIONS, accept=xla_knows)


def _exit_with_parent(parent_pid: int) -> None:
    """In a child process: have Linux send it SIGTERM when its parent dies
    (``prctl(PR_SET_PDEATHSIG)``); and exit now if the parent is already gone. Elsewhere,
    nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)        # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def _worker_main(conn, parent_pid, fn, args):
    _exit_with_parent(parent_pid)
    try:
        msg = ("ok", fn(*args))
    except BaseException:                             # noqa: BLE001  (sent to the parent)
        msg = ("error", traceback.format_exc())
    conn.send(msg)
    conn.close()


class Worker:
    """``fn(*args)`` in a second (spawned) process; :meth:`result` waits for its value
    (raising :class:`RuntimeError` with the child's traceback if it failed or died),
    :meth:`stop` ends it (SIGTERM, then SIGKILL). As a context manager it stops the child on
    leaving, whatever the way out; the child also ends when this process dies (Linux)."""

    def __init__(self, fn, *args):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=_worker_main, args=(child, os.getpid(), fn, args))
        self.process.start()
        child.close()

    def result(self):
        from multiprocessing.connection import wait
        wait([self._conn, self.process.sentinel])
        if not self._conn.poll():
            self.process.join()
            raise RuntimeError(f"second process died (exit code {self.process.exitcode})")
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"second process failed:\n{value}")
        return value

    def stop(self, grace_s: float = 2.0) -> None:
        p = self.process
        if p.is_alive():
            p.terminate()
            p.join(grace_s)
        if p.is_alive():
            p.kill()
        p.join()
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def run_stages(labels, out: Path, quick: bool, quiet: bool, t0: float | None = None) -> dict:
    """Run the stages named in ``labels`` (in :data:`STAGES` order) in this process; returns
    their parts of the summary. Each stage reports its wall time split into compile and run
    (stderr, when > 2 s)."""
    import jaxmodel  # noqa: F401  (import cost inside the timed run)
    from jaxmodel.process import set_quiet, stage
    if quiet:
        set_quiet(True)
    say = Progress(t0)
    summary = {}
    for label, fn in STAGES:
        if label in labels:
            say(f"{label}: started")
            with stage(f"demo {label}"):
                summary.update(fn(out, say, quick))
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxmodel.demo", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--out", default="demo_out", help="output folder")
    ap.add_argument("--quick", action="store_true", help="smaller sweep, search and co-design")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress output (as JAXMODEL_QUIET=1); the summary still prints")
    ap.add_argument("--serial", action="store_true",
                    help="run every stage in this process (no second process)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    use_compile_options()
    say = Progress()
    side = () if a.serial else SIDE
    say(f"jaxmodel demo → {out}/ (JAX {jax.__version__}, {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s)"
        + (f"; stages {', '.join(l.split()[0] for l in side)} in a second process)"
           if side else ")"))
    if side:
        say("the two processes share the CPU: each stage's time includes the other's load")
    own = [l for l, _ in STAGES if l not in side]
    # SIGTERM as an exception here, so that the second process is stopped on the way out
    term = (signal.signal(signal.SIGTERM, _raise_exit)
            if side and threading.current_thread() is threading.main_thread() else None)
    try:
        if side:
            with Worker(run_stages, side, out, a.quick, a.quiet, say.t0) as other:
                summary = run_stages(own, out, a.quick, a.quiet, say.t0)
                summary.update(other.result())
        else:
            summary = run_stages(own, out, a.quick, a.quiet, say.t0)
    finally:
        if term is not None:
            signal.signal(signal.SIGTERM, term)
    pred = summary.pop("_pred")
    summary = {k: summary[k] for k in ("predictions", "hardware_sweep", "parallelism_search",
                                       "codesign")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))

    print("\n=== summary ===")
    show = pred[["system", "model", "train_step_s", "train_mfu", "ttft_s", "tpot_ms",
                 "infer_tokens_per_s", "usd_per_million_tokens"]]
    print(show.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    b = summary["parallelism_search"]["best"]
    print(f"best Llama-3-70B plan: dp {b['dp']:.0f} tp {b['tp']:.0f} pp {b['pp']:.0f} "
          f"mb {b['micro_batch']:.0f} {b['schedule']} v{b['interleave']:.0f} "
          f"recompute {b['recompute']} zero {b['zero']:.0f}: {b['step_time_s']:.2f} s/step, "
          f"MFU {b['mfu']:.2f}")
    c = summary["codesign"]["codesign"]
    print(f"co-designed device: {c['core_count']:.0f} cores, {c['hbm_stacks']:.0f} HBM stacks, "
          f"{c['global_buffer_bytes'] / 2 ** 20:.0f} MiB L2, "
          f"{c['local_buffer_bytes'] / 1024:.0f} KiB L1 → {c['usd_per_mtok']:.3f} USD/Mtok "
          f"(A100: {summary['codesign']['a100_design']['usd_per_mtok']:.3f})")
    files = sorted(p.name for p in out.iterdir())
    say(f"done: {len(files)} files in {out}/: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
