"""A check of the Blackwell constants on a run they were not fitted on: MLPerf Training v4.1
GPT-3 175B on 64 B200 (NVIDIA, ``b200_n8_preview_nemo``, 8 × HGX B200).

The run (MLCommons ``training_results_v4.1``, ``NVIDIA/results/b200_n8_preview_nemo/gpt3/
result_{0,1,2}.txt`` and ``NVIDIA/benchmarks/gpt3/implementations/b200_n8_preview_nemo/
config_DGXB200_8x8x1024x4x8_mbs2_cg.sh``): TP 4, PP 8, interleaved pipeline 6, micro-batch 2,
global batch 2,048 sequences of 2,048 tokens (MLLOG ``global_batch_size``,
``max_sequence_length``), FP8 (``config_fp8.sh``, Transformer Engine), TP communication
overlapped (userbuffers), cuDNN fused attention (``NVTE_FUSED_ATTN=1``: a FlashAttention-style
kernel that never writes the score matrix), layer CUDA graphs, FP8 parameters
(``config_common.sh``: ``FP8_PARAMS=True``) and Transformer Engine's blocking amax reductions
over ``tp·dp`` (:data:`validate_mlperf.BLOCKING_DP_AMAX_ROUNDS`). Each of the three runs
trained 1,207,959,552 tokens (MLLOG ``train_samples``) in 11,552.2 / 11,624.3 / 11,633.4 s
from ``run_start`` to ``run_stop``: 104,105 tokens/s on the mean time. The plan is modelled as
``validate_mlperf.py`` models the H100 rows of the same benchmark (``recipe="mlperf-gpt3"``:
sequence parallelism, no recomputation, distributed optimizer with overlapped gradient and
parameter sync, p2p overlap, no dropout, flash attention) on ``dgx_b200`` with 8 nodes, with
the benchmark's evaluations inside the timed run (:func:`validate_mlperf.evaluation_overhead`;
printed without them too).

Nothing is fitted here: the B200 constants are transferred from the GB200 cuBLASLt
microbenchmarks (``experiments/calibrate.py``).

Usage: ``python experiments/check_blackwell.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jaxmodel as jm  # noqa: E402,F401,I001  (imported before hw_db: the package wires hw_db up)
import hw_db  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_mlperf as v30  # noqa: E402

#: run_start..run_stop of the three runs, s; tokens per run (MLLOG, see the module docstring)
RUN_SECONDS = (11552.193, 11624.299, 11633.398)
TOKENS_PER_RUN = 1_207_959_552


def predict():
    """The run's plan on ``dgx_b200`` × 8 (module docstring): the ``train_step`` result and
    :func:`validate_mlperf.predict`'s record (the run's throughput with and without its
    evaluations, the amax reductions counted)."""
    system, model = hw_db.system("dgx_b200", nodes=8), hw_db.model("gpt3-175b")
    par = v30.MLPERF.parallelism(dp=2, tp=4, pp=8, micro_batch=2, interleave=6,
                                 schedule="interleaved")
    row = {"mlperf_round": "v4.1"}        # FP8 parameters, blocking amax reductions
    rec, r = v30.predict(system, model, par, 2048, 2048, "fp8", dict(recipe=v30.MLPERF),
                         breakdown=True,
                         amax_s=v30.amax_sync_s(system, model, par, 2048, row),
                         precision=v30.round_precision(row), row=row)
    return r, rec


def main() -> list:
    measured = TOKENS_PER_RUN / (sum(RUN_SECONDS) / len(RUN_SECONDS))
    r, p = predict()
    ovh = p["fp8_eval_overhead"]
    out = []
    for with_eval in (True, False):
        pred = p["fp8_tokens_per_s"] if with_eval else p["fp8_train_tokens_per_s"]
        rec = {"evaluations": with_eval, "eval_overhead": ovh if with_eval else 0.0,
               "measured_tokens_per_s": measured,
               "predicted_tokens_per_s": pred, "err_pct": 100.0 * (pred / measured - 1.0),
               "feasible": bool(r.feasible), "memory_gib": float(r.memory_bytes) / 2 ** 30,
               "step_s": p["fp8_step_s"], "amax_sync_s": p["fp8_amax_sync_s"],
               **{f"{k}_s": float(v) for k, v in r.breakdown.items()}}
        out.append(rec)
        print(f"GPT-3 175B, 64 B200, MLPerf Training v4.1, "
              f"{'with' if with_eval else 'without'} the evaluations ({ovh:.3f}): measured "
              f"{measured:,.0f} tokens/s, predicted {pred:,.0f} ({rec['err_pct']:+.1f} %), "
              f"feasible {rec['feasible']}, {rec['memory_gib']:.1f} GiB")
    print("  step breakdown (s): " + ", ".join(f"{k} {float(v):.2f}"
                                               for k, v in r.breakdown.items())
          + f", amax reductions {p['fp8_amax_sync_s']:.2f}")
    dev = hw_db.device("b200")
    print(f"B200: sustained clock fraction {float(dev.sustained_clock_fraction):.3f}, executed "
          f"FP8 ratio {float(dev.matrix_ratio_fp8):.3f} (experiments/calibrate.py)")
    return out


if __name__ == "__main__":
    main()
