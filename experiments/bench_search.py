"""Benchmark: exhaustive parallelism search for GPT-3 175B on 1536 A100-80GB.

Problem (Narayanan et al., SC'21, the GPT-3 175B run): 192 DGX A100 nodes (1536 GPUs), global
batch 1536, sequence 2048. ``jm.search_parallelism`` enumerates every consistent
DP × TP × PP × SP × EP × micro-batch × interleave × schedule × recompute × ZeRO × FlashAttention
plan, crossed with three execution options of the training step (gradient reduction overlapped
with the backward pass or not; bf16 or fp32 gradient reduction; TP communication overlapped
with the GEMMs or not), and ranks them.

Prints the number of configurations, wall time (compile included, one fresh process),
configurations/s (Calculon: ~125/s), the best plan, and the best plan with Megatron-LM's own
degrees (TP 8, PP 12, DP 16) — both as searched here and as run in 2021 (micro-batch 1, full
recompute, no SP, no FlashAttention, no overlap of the gradient all-reduce or of the TP
collectives, fp32 gradients).
Writes ``experiments/out/bench_search.csv`` (top 200 plans + Megatron's) and ``.png``.

Also prints ``import jaxmodel`` time and the first and second answer to a single question (one
training step of the best plan). Most of a cold run is XLA compilation of the training step;
jaxmodel's caches (``jaxmodel.process``: JAX's persistent compilation cache and the command
line's export cache) let a second process skip tracing and compiling: ``--cache DIR`` puts
them in DIR, ``--no-cache`` turns them off, and the printed ``compilation_cache`` field says
which case was measured (empty or warm).

``--precisions bf16,fp16,tf32,fp32`` searches those precisions as well (the A100's training
types: × 4 configurations); ``--attention standard,fa1,fa2`` the attention kernels (default
standard and FlashAttention-2; FlashAttention-1 ran on A100 too). With both: 6,709,824
configurations; ``--zero3-impls fsdp,deepspeed`` both implementations of ZeRO-3 (PyTorch
FSDP's and DeepSpeed 2021's per-tensor calls) for the ``zero = 3`` plans: with the four
precisions 5,575,296 configurations.

Run: ``.venv/bin/python experiments/bench_search.py [--small] [--cache DIR | --no-cache]
[--precisions LIST] [--attention LIST] [--zero3-impls LIST]``
"""

from __future__ import annotations

import json
import os
import sys
import time

if "--cache" in sys.argv:          # before importing jaxmodel, which configures the cache
    os.environ["JAXMODEL_CACHE_DIR"] = sys.argv[sys.argv.index("--cache") + 1]
if "--no-cache" in sys.argv:
    os.environ["JAXMODEL_NO_CACHE"] = "1"

from _bench import import_jaxmodel  # noqa: E402

jm, IMPORT_S, CACHE = import_jaxmodel()   # first: its import time is measured
if "--cache" in sys.argv:          # the command line's caches: every compilation stored and
    jm.process.configure_compilation_cache(cli=True)   # the compiled search kept for a rerun
    CACHE = jm.process.cache_state()
    print(f"persistent compilation cache, as the command line's: {CACHE}", flush=True)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import hw_db  # noqa: E402

from common import OUT  # noqa: E402
COLS = ["dp", "tp", "pp", "sp", "micro_batch", "interleave", "schedule", "recompute", "zero",
        "zero3_impl", "flash_attention", "dp_overlap", "grad_bytes", "tp_overlap", "step_time_s", "mfu",
        "hfu", "memory_bytes"]


def main(small: bool = False, precisions: list[str] | None = None,
         attention: tuple = (False, "fa2"), zero3_impls: tuple = ("fsdp",)) -> dict:
    nodes, n, gb = (16, 128, 128) if small else (192, 1536, 1536)
    system = hw_db.system("dgx_a100", nodes=nodes)
    model = hw_db.model("gpt3-175b")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    df = jm.search_parallelism(system, model, n, gb, 2048,
                               step_options={"dp_overlap": [0.0, 1.0],
                                             "grad_bytes": [2.0, 4.0],
                                             "tp_overlap": [0.0, 1.0]},
                               precision=precisions, flash_attention=attention,
                               zero3_impl=zero3_impls)
    wall = time.perf_counter() - t0
    n_eval = df.attrs["n_evaluated"]
    best = df.iloc[0]

    meg = df[(df.tp == 8) & (df.pp == 12) & (df.dp == n // 96)] if not small else df.iloc[:0]
    meg_2021 = meg[(meg.micro_batch == 1) & (meg.recompute == "full") & (meg.sp == 0)
                   & (meg.flash_attention == 0) & (meg.zero == 0) & (meg.dp_overlap == 0)
                   & (meg.grad_bytes == 4) & (meg.tp_overlap == 0)]
    if "precision" in df:    # the 2021 plan at the precision of an unsearched run
        meg_2021 = meg_2021[meg_2021.precision == "bf16"]
    OUT.mkdir(parents=True, exist_ok=True)
    pd.concat([df.head(200), meg.head(50), meg_2021.head(10)]).drop_duplicates().to_csv(
        OUT / "bench_search.csv", index=False)

    from jaxmodel.plots import figure, save
    fig = figure()
    ax = fig.add_subplot()
    feas = df[np.isfinite(df.step_time_s)]
    sc = ax.scatter(feas.memory_bytes / 1e9, feas.step_time_s, c=np.log2(feas.tp), s=2,
                    alpha=0.3, rasterized=True, cmap="viridis")
    fig.colorbar(sc, ax=ax, label="log2 TP")
    ax.scatter([best.memory_bytes / 1e9], [best.step_time_s], marker="*", s=150, c="crimson",
               label="best")
    if len(meg_2021):
        m = meg_2021.iloc[0]
        ax.scatter([m.memory_bytes / 1e9], [m.step_time_s], marker="X", s=120, c="k",
                   label="Megatron-LM 2021 plan")
    ax.set_yscale("log")
    ax.set_xlabel("memory per GPU (GB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"GPT-3 175B on {n} A100: {len(feas):,} feasible of {n_eval:,} plans")
    ax.legend(fontsize=8, loc="upper right")   # loc="best" is slow with 10^5 points
    save(fig, OUT / "bench_search.png")

    def plan(row):
        return {k: (row[k] if isinstance(row[k], str) else float(row[k]))
                for k in COLS + ["precision"] if k in row}

    # a single question after the search: one training step of the best plan (first answer:
    # this shape of call traces and compiles; second answer: the same call again)
    par = jm.Parallelism(**{k: best[k] for k in ("dp", "tp", "pp", "sp", "micro_batch",
                                                  "interleave", "schedule", "recompute",
                                                  "zero", "zero3_impl", "flash_attention")})
    answers = []
    for _ in range(2):
        t1 = time.perf_counter()
        r = jm.train_step(system, model, par, gb, 2048, dp_overlap=float(best.dp_overlap),
                          tp_overlap=float(best.tp_overlap),
                          grad_bytes=float(best.grad_bytes),
                          precision=best["precision"] if "precision" in best else None)
        float(r.step_time_s)
        answers.append(time.perf_counter() - t1)

    out = {"n_configs": int(n_eval), "n_feasible": int(df.attrs["n_feasible"]),
           "wall_s": round(wall, 1), "configs_per_s": round(n_eval / wall, 1),
           "import_s": round(IMPORT_S, 2), "compilation_cache": CACHE,
           "load_average": round(load, 1),
           "single_train_step_first_s": round(answers[0], 2),
           "single_train_step_second_s": round(answers[1], 3),
           "single_train_step_s": float(r.step_time_s),
           "timings": {k: round(v, 1) for k, v in df.attrs["timings"].items()},
           "best": plan(best)}
    no_tp_ov = df[df.tp_overlap == 0]
    if len(no_tp_ov):      # the same search without overlapped TP collectives
        out["best_without_tp_overlap"] = plan(no_tp_ov.iloc[0])
    if len(meg):
        out["megatron_degrees_best"] = plan(meg.iloc[0])
    if len(meg_2021):
        out["megatron_2021"] = plan(meg_2021.iloc[0])
        out["speedup_vs_megatron_2021"] = round(
            float(meg_2021.iloc[0].step_time_s / best.step_time_s), 3)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    def listed(flag):
        return sys.argv[sys.argv.index(flag) + 1].split(",") if flag in sys.argv else None
    main(small="--small" in sys.argv, precisions=listed("--precisions"),
         attention=tuple(listed("--attention") or (False, "fa2")),
         zero3_impls=tuple(listed("--zero3-impls") or ("fsdp",)))
