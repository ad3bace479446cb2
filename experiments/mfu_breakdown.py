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

Rows are timed on the device as :func:`jaxmodel.train_step` runs it: at its sustained
(power-limited) clock, :func:`jaxmodel.parallel.train.sustained_device` (``freq_hz ×
sustained_clock_fraction``), so a row's TFLOP/s is the rate the step uses.

Three published anchors are printed beside the rows, each through the same code path:

- **GEMMs**: the A100 cuBLASLt GEMMs of ``shared/anchors/microbench/gpu_microbenchmarks.csv``
  (Azure ND A100 v4, sustained: 10,000 warm-up iterations), measured TFLOP/s beside the
  model's on the sustained device (device-side kernel floor). The three largest shapes are
  the ones ``sustained_clock_fraction`` is derived on (in sample); the others are out of
  sample.
- **Attention core**: the FlashAttention-2 rows' rate (causal FLOPs) beside Dao,
  "FlashAttention-2" (2023), abstract: "50-73 % of the theoretical maximum FLOPs/s on A100"
  (forward and backward kernels, non-causal and causal, head dimensions 64 and 128).
- **End to end, sequence parallelism + selective recomputation, no data parallelism**:
  Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
  (MLSys 2023), Table 3 plans (TP 8; PP 1/8/35/64; micro-batch 4/1/1/1; 8/64/280/512 GPUs,
  global batch 4/64/280/512 sequences of 2,048) and their MFU (the Megatron-LM README's
  table of the same runs, "measured using a data parallel size of one": 41.5, 51.4, 56.0,
  56.3 %). No FlashAttention (it came later), TP collectives serial, fp32 gradients; the
  interleaving is not stated (v = 3 for 175B and 530B, 1 for 22B and 1T, as
  ``experiments/validate_megatron.py``'s memory check). These runs are mostly compute, so
  they anchor the compute part of the step.

Writes ``experiments/out/mfu_breakdown.csv``; prints one table per pair, then the anchors.

Run (from the repository root): ``PYTHONPATH=. .venv/bin/python experiments/mfu_breakdown.py``
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db
from jaxmodel.parallel.train import sustained_device
from jaxmodel.workload import layer as _layer

from common import ANCHORS, OUT  # noqa: E402

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
    """One layer's rows ``{row: (fwd_s, bwd_s)}`` for one sequence, on the device at its
    sustained clock (as :func:`jaxmodel.train_step` times them)."""
    @jax.jit
    def run(dev, model, par):
        gemms, vectors = _layer.layer_graph(dev, model, par, 1.0, seq, seq, training=True)
        return _layer.evaluate(_layer.default_gemm, dev, gemms, vectors, backward=True)
    dev = sustained_device(system.device)
    return {k: (float(f), float(b)) for k, (f, b) in run(dev, model, par).items()}


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


#: Korthikanti et al. (MLSys 2023) Table 3 plans and the Megatron-LM README's MFU of the
#: same runs (data-parallel size 1): (name, layers, hidden, heads, tp, pp, micro-batch,
#: global batch, interleave (not stated; see the module docstring), measured MFU)
KORTHIKANTI = (("22B", 48, 6144, 64, 8, 1, 4, 4, 1, 0.415),
               ("175B", 96, 12288, 96, 8, 8, 1, 64, 3, 0.514),
               ("530B", 105, 20480, 128, 8, 35, 1, 280, 3, 0.560),
               ("1T", 128, 25600, 160, 8, 64, 1, 512, 1, 0.563))


def gemm_anchor(dev_name="a100_80gb"):
    """Sustained cuBLASLt GEMMs (Azure ND A100 v4) beside the model on the sustained device
    (device-side kernel floor): ``DataFrame(shape, measured, model, error_pct, in_sample)``."""
    mb = pd.read_csv(ANCHORS / "microbench" / "gpu_microbenchmarks.csv")
    r = mb[(mb.gpu == "A100") & (mb.benchmark == "gemm_cublaslt")
           & (mb.dtype == "FP16")].drop_duplicates("shape_or_op")
    mnk = np.asarray([[float(t.split("=")[1]) for t in x.split()] for x in r.shape_or_op])
    dev = sustained_device(hw_db.device(dev_name))
    t = np.asarray(jm.gemm_latency(dev, mnk[:, 0], mnk[:, 1], mnk[:, 2], overhead="kernel"))
    model = 2.0 * mnk.prod(axis=1) / t / 1e12
    biggest = set(r.shape_or_op.iloc[np.argsort(-mnk.prod(axis=1))[:3]])
    return pd.DataFrame({"shape": r.shape_or_op.to_numpy(), "measured": r.value.to_numpy(),
                         "model": model,
                         "error_pct": 100.0 * (model / r.value.to_numpy() - 1.0),
                         "in_sample": [x in biggest for x in r.shape_or_op]})


def korthikanti():
    """MFU of Korthikanti et al.'s runs (:data:`KORTHIKANTI`) by :func:`jaxmodel.train_step`
    (sequence parallelism, selective recomputation, no FlashAttention, serial TP, fp32
    gradients, dp = 1): ``DataFrame(model, measured, predicted, error_pct, step_s, parts)``."""
    c = np.asarray([k[1:-1] for k in KORTHIKANTI], dtype=np.float64).T
    L, h, a, t, p, b, gb, v = (jnp.asarray(x) for x in c)
    base = hw_db.system("dgx_a100", nodes=1)
    levels = list(base.levels)
    levels[-1] = dataclasses.replace(levels[-1], size=t * p / 8.0)
    system = dataclasses.replace(base, levels=tuple(levels))
    model = jm.Model(n_layers=L, d_model=h, n_heads=a, n_kv_heads=a, head_dim=h / a,
                     d_ff=4.0 * h, vocab_size=51200.0, activation="gelu",
                     tied_embeddings=1.0, name="megatron")
    par = jm.Parallelism(dp=1.0, tp=t, pp=p, sp=True, micro_batch=b, interleave=v,
                         schedule=jnp.where(v > 1, 2.0, 1.0), recompute="selective", zero=0.0,
                         flash_attention=0.0)
    res = jm.train_step(system, model, par, gb, 2048.0, grad_bytes=4.0)
    parts = {k: np.asarray(x) for k, x in res.breakdown.items()}
    step = np.asarray(res.step_time_s)
    return pd.DataFrame({
        "model": [k[0] for k in KORTHIKANTI], "measured": [k[-1] for k in KORTHIKANTI],
        "predicted": np.asarray(res.mfu),
        "error_pct": 100.0 * (np.asarray(res.mfu) / np.asarray([k[-1] for k in KORTHIKANTI])
                              - 1.0),
        "step_s": step,
        "compute_share": (parts["compute"] + parts["recompute"]) / step})


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

    g = gemm_anchor()
    print("\n== GEMM anchor: sustained cuBLASLt FP16 on A100 (Azure ND A100 v4, 10,000 "
          "warm-up iterations) vs the model on the sustained device (TFLOP/s)")
    print(g.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    oos = g[~g.in_sample]
    print(f"   in sample (the sustained_clock_fraction derivation): mean |error| "
          f"{g[g.in_sample].error_pct.abs().mean():.1f} %; out of sample: mean error "
          f"{oos.error_pct.mean():+.1f} %, mean |error| {oos.error_pct.abs().mean():.1f} %")
    fa = pd.concat(frames)
    core = fa[(fa.row.isin(("qk", "softmax", "av"))) & (fa.flash_attention == 2)
              & (fa.system == "dgx_a100")]
    pk = float(hw_db.system("dgx_a100").device.peak_matrix_flops)
    for m, c in core.groupby("model"):
        rate = c.flop.sum() / c.time_s.sum()
        print(f"== FlashAttention-2 core, {m} on dgx_a100 (one sequence per micro-batch): "
              f"{rate / 1e12:.0f} TFLOP/s = {100 * rate / pk:.0f} % of peak (causal FLOPs; "
              f"Dao 2023, A100 kernels: 50-73 %)")
    k = korthikanti()
    print("\n== end to end: Korthikanti et al. 2023 (SP + selective recompute, dp = 1; MFU "
          "from the Megatron-LM README), predicted by train_step")
    print(k.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"   MAPE {k.error_pct.abs().mean():.1f} %, mean error {k.error_pct.mean():+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
