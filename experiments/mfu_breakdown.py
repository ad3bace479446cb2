"""Per-op MFU breakdown of a training step: Llama-3-70B vs GPT-3 175B on DGX H100 and DGX A100.

For each (model, system) pair, one decoder layer's training kernels (forward + backward,
Megatron TP 8 with sequence parallelism, FlashAttention-2, BF16) are timed row by row
(:func:`jaxmodel.workload.layer.layer_graph` + :func:`~jaxmodel.workload.layer.evaluate`,
the same calls :func:`jaxmodel.train_step` makes) and set beside each row's FLOPs:

- weight GEMMs: ``2·m·n·k`` forward, twice that backward (Narayanan et al., SC'21, Appendix);
- attention core (FlashAttention, causal; rows qk, softmax, av share one kernel, so only
  their sum is an efficiency): ``4·s²·h·d_h/2`` forward per sequence and
  ``2.5×`` that backward (Dao, "FlashAttention-2", 2023, §4: 5 GEMMs backward vs 2 forward),
  counting only the causal half, i.e. the work the kernel does;
- vector kernels (norm, RoPE, SiLU·mul / GELU, softmax): 0 model FLOPs (memory-bound).

The step's MFU is then :func:`jaxmodel.train_step`'s (PaLM, Chowdhery et al. 2022, App. B:
model FLOPs ``6·N + 12·L·h·s`` per token — non-causal attention, no recomputation — over
step time × devices × peak), printed beside two alternative counts: ``6·N`` only, and
``6·N`` + causal attention (``6·L·h·s``, the half the kernel computes; Meta's "The Llama 3
Herd of Models", 2024, Table 4 does not state its count).

Plans (per-device shapes only depend on TP and the micro-batch): Llama-3-70B at s = 8192,
GPT-3 175B at s = 2048, TP 8, PP 4 (Llama) / 8 (GPT-3), micro-batch 1, 1F1B, selective
recompute, ZeRO-1, 64 GPUs, global batch 128 sequences (Llama) / 512 (GPT-3).

Writes ``experiments/out/mfu_breakdown.csv``; prints one table per pair.

Run (from the repository root): ``PYTHONPATH=. .venv/bin/python experiments/mfu_breakdown.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db
from jaxmodel.workload import layer as _layer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "out"

CASES = {  # model -> (seq_len, pp, global batch)
    "llama3-70b": (8192, 4, 128),
    "gpt3-175b": (2048, 8, 512),
}
#: (model, FlashAttention code): ``flash_attention=True`` is code 1, FlashAttention-1
RUNS = (("llama3-70b", 1), ("llama3-70b", 2), ("gpt3-175b", 2))
SYSTEMS = ("dgx_h100", "dgx_a100")
N_GPUS = 64
TP = 8
ROWS = ("qkv", "qk", "softmax", "av", "wo", "layernorm_mha", "w1", "act", "w2",
        "layernorm_ffn")


def row_flops(model, seq, tp):
    """Per-device FLOPs of one layer's rows for one sequence, ``{row: (fwd, bwd)}``."""
    d, h, hkv, dh, ff = (float(x) for x in (model.d_model, model.n_heads, model.n_kv_heads,
                                             model.head_dim, model.d_ff))
    mats = 3.0 if float(model.is_gated) > 0.5 else 2.0
    g = {"qkv": 2 * seq * d * (h + 2 * hkv) * dh / tp,
         "wo": 2 * seq * h * dh * d / tp,
         "w1": 2 * seq * d * (mats - 1) * ff / tp,
         "w2": 2 * seq * ff * d / tp}
    out = {k: (v, 2 * v) for k, v in g.items()}
    causal = seq * seq * h * dh / tp             # one of QKᵀ / PV: 2·s²·d_h·h/t halved
    out["qk"] = (causal, 2.5 * causal)
    out["av"] = (causal, 2.5 * causal)
    return out


def layer_rows(system, model, par, seq):
    @jax.jit
    def run(system, model, par):
        gemms, vectors = _layer.layer_graph(system.device, model, par, 1.0, seq, seq,
                                            training=True)
        return _layer.evaluate(_layer.default_gemm, system.device, gemms, vectors,
                               backward=True)
    return {k: (float(f), float(b)) for k, (f, b) in run(system, model, par).items()}


def one(model_name, sys_name, fa):
    seq, pp, gb = CASES[model_name]
    model = hw_db.model(model_name)
    system = hw_db.system(sys_name, nodes=N_GPUS // 8)
    dp = N_GPUS // (TP * pp)
    par = jm.Parallelism(dp=dp, tp=TP, pp=pp, sp=True, micro_batch=1, schedule="1f1b",
                         recompute="selective", zero=1, flash_attention=fa)
    dev = system.device
    peak = float(dev.peak_matrix_flops)     # nominal (datasheet) BF16 dense peak
    rows = layer_rows(system, model, par, seq)
    fl = row_flops(model, seq, TP)
    recs = []
    for r in ROWS:
        f, b = rows.get(r, (0.0, 0.0))
        ff, fb = fl.get(r, (0.0, 0.0))
        recs.append({"row": r, "time_s": f + b, "fwd_s": f, "bwd_s": b, "flop": ff + fb})
    df = pd.DataFrame(recs)
    res = jm.train_step(system, model, par, gb, seq)
    step = float(res.step_time_s)
    n_layer_mb = float(model.n_layers) / pp * (gb / dp)   # layers × micro-batches per device
    df["step_share"] = df.time_s * n_layer_mb / step
    df["pct_peak"] = 100.0 * df.flop / np.maximum(df.time_s, 1e-30) / peak
    df["tflops"] = np.where(df.time_s > 0, df.flop / df.time_s / 1e12, 0.0)
    df["model"], df["system"], df["flash_attention"] = model_name, sys_name, fa
    n = float(jm.param_count(model))
    L, hd = float(model.n_layers), float(model.n_heads * model.head_dim)
    tokens = gb * seq
    denom = step * N_GPUS * peak
    mfu = {"train_step": float(res.mfu),
           "6N": 6 * n * tokens / denom,
           "6N+causal attn": (6 * n + 6 * L * hd * seq) * tokens / denom,
           "6N+full attn (PaLM)": (6 * n + 12 * L * hd * seq) * tokens / denom}
    # Megatron-core --tp-comm-overlap (Wang et al., ASPLOS'23), same plan
    mfu["train_step tp_overlap=1"] = float(
        jm.train_step(system, model, par, gb, seq, tp_overlap=1.0).mfu)
    bd = {k: float(v) for k, v in res.breakdown.items()}
    return df, mfu, bd, step


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    frames = []
    for sys_name in SYSTEMS:
        for model_name, fa in RUNS:
            df, mfu, bd, step = one(model_name, sys_name, fa)
            frames.append(df)
            print(f"\n== {model_name} on {sys_name} (64 GPUs, FlashAttention-{fa}): "
                  f"step {step:.2f} s")
            print(df[["row", "time_s", "flop", "tflops", "pct_peak", "step_share"]].to_string(
                index=False, float_format=lambda x: f"{x:.4g}"))
            core = df[df.row.isin(("qk", "softmax", "av"))]
            print(f"   attention core: {core.time_s.sum()*1e3:.2f} ms, "
                  f"{core.flop.sum()/core.time_s.sum()/1e12:.0f} TFLOP/s (causal FLOPs), "
                  f"{core.step_share.sum():.1%} of the step")
            layer_t, layer_f = df.time_s.sum(), df.flop.sum()
            print(f"   layer: {layer_t*1e3:.1f} ms, {layer_f/layer_t/1e12:.0f} TFLOP/s; "
                  f"step parts: " + ", ".join(f"{k} {v:.2f}" for k, v in bd.items() if v))
            print("   MFU: " + ", ".join(f"{k} {v:.3f}" for k, v in mfu.items()))
    pd.concat(frames).to_csv(OUT / "mfu_breakdown.csv", index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
