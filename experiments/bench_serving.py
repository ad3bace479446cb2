"""Benchmark: serving-deployment search for Llama-3 8B and 70B on one DGX H100 (8 GPUs).

``jm.search_serving`` enumerates aggregated (continuous batching, with or without chunked
prefill) and disaggregated (prefill pool + decode pool, each with its own TP × PP)
deployments × batch cap × precision (bf16, fp8) × runtime (pytorch, trtllm, vllm) × load,
evaluates their steady state (``jaxmodel.serving``) and keeps the Pareto front of output
tokens/s per GPU against tokens/s per user under a TTFT and a TPOT limit.

Prints, per model: configurations, wall time (one fresh process, compile included; the two
stages — cost tables, steady state — separately), the process CPU time (all threads), the
XLA compilations (count, those over 1 s, seconds), the tracing, lowering and compile seconds
of every graph taking over half a second (``graphs_s``; cumulative over the process), configurations/s, the machine load, the
persistent compilation cache state, and the front with the best aggregated and the best
disaggregated deployment. Writes ``experiments/out/bench_serving_<model>.csv`` (the front)
and ``.png`` (every deployment meeting the limits, aggregated vs disaggregated).

``--options``: the search with the deployment options of today's serving as well —
Qwen3-30B-A3B (128 experts) on a DGX B200, expert parallelism (EP 1, 4 or 8 over the TP × DP ranks of a stage),
EAGLE speculative decoding (``k`` 3, acceptance 0.7) or none, FP8 or NVFP4 weights, TensorRT-LLM,
TP 1–8 × PP 1–4.

Run: ``.venv/bin/python experiments/bench_serving.py [--small | --options]`` (``--small``:
Llama-3 8B only). Most of a cold run is XLA compilation of the cost tables (:func:`jaxmodel.inference`);
``JAXMODEL_CACHE_DIR=DIR`` turns jaxmodel's persistent compilation cache on (CPU: opt-in),
``JAXMODEL_NO_CACHE=1`` off; the printed ``compilation_cache`` says which case was measured.
"""

from __future__ import annotations

import json
import os
import sys
import time

_t0 = time.perf_counter()
import jaxmodel as jm  # noqa: E402,I001  (first: its import time is measured)
IMPORT_S = time.perf_counter() - _t0

import hw_db  # noqa: E402
import jax  # noqa: E402

_COMPILES: list[float] = []     # seconds of every XLA compilation of this process
#: seconds of tracing, lowering and compiling per jitted function (JAX's monitoring events)
_PHASES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
           "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
           "/jax/core/compile/backend_compile_duration": "compile"}
_BY_FUNCTION: dict = {}


def _on_event(name, secs, fun_name="", **_):
    if name == "/jax/core/compile/backend_compile_duration":
        _COMPILES.append(secs)
    if name in _PHASES:
        fn = fun_name.removeprefix("jit(").removesuffix(")")
        phases = _BY_FUNCTION.setdefault(fn, {})
        phases[_PHASES[name]] = phases.get(_PHASES[name], 0.0) + secs


jax.monitoring.register_event_duration_secs_listener(_on_event)

from common import OUT  # noqa: E402
ISL, OSL = 1024, 256
# illustrative interactive-chat limits: first token within 1 s, 20 tokens/s per user
TTFT_SLO_S, TPOT_SLO_S = 1.0, 0.05
COLS = ["mode", "precision", "runtime", "tp", "pp", "dp", "prefill_tp", "prefill_pp",
        "prefill_dp", "max_batch", "chunk", "load", "rate_rps", "ttft_s", "tpot_s", "batch",
        "throughput_per_gpu", "tokens_per_s_per_user"]


#: ``--options``: today's deployment options searched as cost-table axes
OPTIONS = dict(tp=(1, 2, 4, 8), pp=(1, 2, 4), precision=("fp8", "nvfp4"), runtime=("trtllm",),
               ep=(1, 4, 8), speculative=(None, jm.Speculative("eagle", k=3.0, accept=0.7)))
COLS_OPTIONS = COLS[:3] + ["ep", "speculative"] + COLS[3:]


def run(model_name: str, system_name: str = "dgx_h100", options: dict | None = None) -> dict:
    system = hw_db.system(system_name)
    model = hw_db.model(model_name)
    load = os.getloadavg()[0]
    t0, cpu0, n0 = time.perf_counter(), time.process_time(), len(_COMPILES)
    df = jm.search_serving(system, model, 8, ISL, OSL, ttft_slo_s=TTFT_SLO_S,
                           tpot_slo_s=TPOT_SLO_S, full=True, **(options or {}))
    cols = COLS_OPTIONS if options else COLS
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    compiles = _COMPILES[n0:]
    from jaxmodel.plots import serving_plot
    serving_plot(df, path=OUT / f"bench_serving_{model_name}.png",
                 title=f"{model_name}, 8 × {system.device.name}, TTFT <= {TTFT_SLO_S} s, TPOT <= {TPOT_SLO_S} s")
    front = df[df["pareto"]].sort_values("tokens_per_s_per_user")
    OUT.mkdir(parents=True, exist_ok=True)
    front[cols].to_csv(OUT / f"bench_serving_{model_name}.csv", index=False)
    best = {m: df.attrs[f"best_{m}"] for m in ("aggregated", "disaggregated")}
    out = {
        "model": model_name, "system": f"{system_name} (8 × {system.device.name})", "isl": ISL, "osl": OSL,
        "ttft_slo_s": TTFT_SLO_S, "tpot_slo_s": TPOT_SLO_S,
        "configurations": df.attrs["n_evaluated"], "wall_s": round(wall, 2),
        "configs_per_s": round(df.attrs["n_evaluated"] / wall),
        "timings_s": {k: round(v, 2) for k, v in df.attrs["timings"].items()},
        "load_avg_1min": round(load, 2), "import_s": round(IMPORT_S, 2),
        "compilation_cache": jm.process.cache_state(),
        "cpu_s": round(cpu, 1),
        "xla_compilations": {"count": len(compiles),
                             "over_1s": sum(1 for c in compiles if c > 1.0),
                             "seconds": round(sum(compiles), 1)},
        # wall seconds per graph (the compilations run on threads, side by side)
        "graphs_s": {fn: {k: round(v, 2) for k, v in ph.items()}
                     for fn, ph in _BY_FUNCTION.items() if sum(ph.values()) > 0.5},
        "n_feasible": df.attrs["n_feasible"],
        "n_meeting_slo": df.attrs["n_meeting_slo"], "front_size": int(len(front)),
        "best": {m: None if b is None else {k: b[k] for k in cols} for m, b in best.items()},
    }
    print(json.dumps(out, indent=1, default=str))
    print(front[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    return out


def main(small: bool = False, options: bool = False):
    if options:
        return [run("qwen3-30b-a3b", "dgx_b200", OPTIONS)]
    return [run(m) for m in (["llama3-8b"] if small else ["llama3-8b", "llama3-70b"])]


if __name__ == "__main__":
    main(small="--small" in sys.argv, options="--options" in sys.argv)
