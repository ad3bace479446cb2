"""Validate ZeRO-3 and PTD-P against Megatron-LM's Table 2 (GPT-3 175B and 530B on A100).

Narayanan et al., SC'21, Table 2: achieved TFLOP/s per GPU (the paper's eq. 3 FLOPs, full
recomputation) of PTD-P (TP 8 × PP 12 for 175B, TP 8 × PP 35 for 530B) and of ZeRO-3 without
model parallelism, on 384–2,240 A100-80GB of Selene (``hw_db.system("dgx_a100", nodes=N)``)
at fixed global batch (micro-batch 4/2/1 for ZeRO-3: one micro-batch per step).

- **ZeRO-3 rows**: :func:`jaxmodel.train_step` with ``Parallelism(dp=N, tp=1, pp=1,
  zero=3, recompute="full")`` — the step's ZeRO-3 model (:func:`jaxmodel.parallel.zero.
  zero3_step` inside the training step): one FSDP unit per layer, parameter all-gather before
  the forward and again before the backward, gradient reduce-scatter in every micro-batch,
  prefetch one unit ahead (``dp_overlap=1``; ``0`` serialises), with SM contention
  (:mod:`jaxmodel.parallel.overlap`); fp16 gradient reduction (``grad_bytes=2``, DeepSpeed's
  default communication type for fp16 training); optimizer step on the 1/N shard.
- **PTD-P rows**: :func:`jaxmodel.train_step` as it is (full recompute, no SP, Megatron-LM 2021
  serial data-parallel all-reduce ``dp_overlap=0``, micro-batch 1, the best interleaving of
  {1, 2, 4, 8} / {1, 3} as in ``validate_megatron.py``).

Nothing is calibrated to these rows. Prints predicted vs measured TFLOP/s per GPU, the error
of every row and the MAPE per scheme; writes ``experiments/out/validate_table2.csv``.

Run: ``.venv/bin/python experiments/validate_table2.py``
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "out"
ANCHORS = next(p for p in (ROOT.parent / "shared" / "anchors", ROOT / "shared" / "anchors")
               if p.exists()) / "training"
SEQ = 2048.0


def gpt(layers, hidden, heads, vocab=51200.0):
    """A Megatron GPT (tied embeddings, GELU, d_ff = 4h)."""
    return jm.Model(n_layers=layers, d_model=hidden, n_heads=heads, n_kv_heads=heads,
                    head_dim=hidden / heads, d_ff=4.0 * hidden, vocab_size=vocab,
                    activation="gelu", tied_embeddings=1.0, name="megatron")


MODELS = {174.6: gpt(96.0, 12288.0, 96.0), 529.6: gpt(105.0, 20480.0, 128.0)}
PTDP_PP = {174.6: 12.0, 529.6: 35.0}


def eq3_flops(model, batch, seq=SEQ):
    """Narayanan et al. SC'21 eq. 3 (full recomputation): 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    l, h, v = model.n_layers, model.d_model, model.vocab_size
    return 96.0 * batch * seq * l * h * h * (1.0 + seq / (6.0 * h) + v / (16.0 * l * h))


def per_nic(system, gpus):
    """The sensitivity case "no rail aggregation": every GPU reaches all others only through
    its own InfiniBand port (one switch tier of ``gpus`` devices, the node's NVLink unused) —
    the bound of a collective whose inter-node traffic is not spread over a node's 8 rails."""
    ib = system.levels[-1]
    return dataclasses.replace(system, levels=[dataclasses.replace(ib, size=float(gpus))])


def zero3_row(params_b, gpus, batch, mb, prefetch=1.0, rails=True):
    """Predicted TFLOP/s per GPU, the step and its breakdown for one ZeRO-3 row through
    :func:`jaxmodel.train_step` (default: NCCL-level hierarchical collectives, prefetch one
    unit; ``prefetch=0`` serialises, ``rails=False`` is the :func:`per_nic` sensitivity
    case)."""
    model = MODELS[params_b]
    system = hw_db.system("dgx_a100", nodes=int(gpus) // 8)
    if not rails:
        system = per_nic(system, gpus)
    par = jm.Parallelism(dp=float(gpus), tp=1.0, pp=1.0, sp=False, micro_batch=float(mb),
                         recompute="full", zero=3)
    r = jm.train_step(system, model, par, float(batch), SEQ, dp_overlap=prefetch,
                      grad_bytes=2.0)
    step = float(r.step_time_s)
    tflops = eq3_flops(model, batch) / (step * gpus) / 1e12
    parts = {k: float(v) for k, v in r.breakdown.items()}
    parts["memory_GB"] = float(r.memory_bytes) / 1e9
    return tflops, step, parts


def ptdp_row(params_b, gpus, batch, mb):
    """Predicted TFLOP/s per GPU of the published PTD-P plan (best interleaving)."""
    model = MODELS[params_b]
    pp = PTDP_PP[params_b]
    dp = gpus / (8.0 * pp)
    system = hw_db.system("dgx_a100", nodes=int(gpus) // 8)
    best = None
    for v in (1.0, 2.0, 3.0, 4.0, 8.0):
        if model.n_layers % (pp * v):
            continue
        par = jm.Parallelism(dp=dp, tp=8.0, pp=pp, sp=False, micro_batch=float(mb),
                             interleave=v, schedule="interleaved" if v > 1 else "1f1b",
                             recompute="full", zero=0)
        r = jm.train_step(system, model, par, batch, SEQ, dp_overlap=0.0)
        if bool(r.feasible) and (best is None or float(r.step_time_s) < best[1]):
            best = (v, float(r.step_time_s))
    step = best[1]
    return eq3_flops(model, batch) / (step * gpus) / 1e12, step, best[0]


def main():
    df = pd.read_csv(ANCHORS / "megatron_table2_ptdp_vs_zero3.csv")
    rows = []
    for _, r in df.iterrows():
        p, g, b, mb = r.params_billion, r.num_gpus, r.global_batch_size, r.microbatch_size
        if r.scheme == "ZeRO-3":
            pred, step, parts = zero3_row(p, g, b, mb)
            extra = {f"zero3_{k}": v for k, v in parts.items()}
        else:
            pred, step, v = ptdp_row(p, g, b, mb)
            extra = {"interleave": v}
        err = (pred - r.achieved_tflops_per_gpu) / r.achieved_tflops_per_gpu
        rows.append({"scheme": r.scheme, "params_billion": p, "num_gpus": g,
                     "global_batch": b, "micro_batch": mb,
                     "measured_tflops": r.achieved_tflops_per_gpu,
                     "predicted_tflops": round(pred, 1), "step_time_s": round(step, 2),
                     "error_pct": round(100 * err, 1), **extra})
    out = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    out.to_csv(OUT / "validate_table2.csv", index=False)
    pd.set_option("display.width", 200)
    print(out[["scheme", "params_billion", "num_gpus", "micro_batch", "measured_tflops",
               "predicted_tflops", "step_time_s", "error_pct"]].to_string(index=False))
    for scheme, grp in out.groupby("scheme"):
        mape = np.mean(np.abs(grp.error_pct))
        print(f"{scheme}: MAPE {mape:.1f} % over {len(grp)} rows "
              f"(175B only: {np.mean(np.abs(grp[grp.params_billion < 200].error_pct)):.1f} %)")
    z = out[out.scheme == "ZeRO-3"]
    for p, grp in z.groupby("params_billion"):
        g = grp.sort_values("num_gpus")
        print(f"ZeRO-3 {p:g}B throughput ratio last/first: predicted "
              f"{g.predicted_tflops.iloc[-1] / g.predicted_tflops.iloc[0]:.2f}, measured "
              f"{g.measured_tflops.iloc[-1] / g.measured_tflops.iloc[0]:.2f} "
              f"(GPUs ×{g.num_gpus.iloc[-1] / g.num_gpus.iloc[0]:g})")
        cols = [c for c in g.columns if c.startswith("zero3_")]
        print(g[["num_gpus"] + cols].round(2).to_string(index=False))
    # sensitivity (not the model's prediction): serial collectives and/or no rail aggregation
    print("\nZeRO-3 sensitivity, predicted TFLOP/s per GPU (measured in the last column):")
    sens = []
    for _, r in df[df.scheme == "ZeRO-3"].iterrows():
        row = {"params_billion": r.params_billion, "num_gpus": r.num_gpus}
        for name, pre, rails in (("overlap_rails", 1.0, True), ("serial_rails", 0.0, True),
                                 ("overlap_per_nic", 1.0, False),
                                 ("serial_per_nic", 0.0, False)):
            row[name] = round(zero3_row(r.params_billion, r.num_gpus, r.global_batch_size,
                                        r.microbatch_size, pre, rails)[0], 1)
        row["measured"] = r.achieved_tflops_per_gpu
        sens.append(row)
    sens = pd.DataFrame(sens)
    print(sens.to_string(index=False))
    for c in ("overlap_rails", "serial_rails", "overlap_per_nic", "serial_per_nic"):
        print(f"  {c}: MAPE {100 * np.mean(np.abs(sens[c] / sens.measured - 1)):.1f} %")
    sens.to_csv(OUT / "validate_table2_zero3_sensitivity.csv", index=False)



if __name__ == "__main__":
    main()
