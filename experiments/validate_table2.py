"""Validate ZeRO-3 and PTD-P against Megatron-LM's Table 2 (GPT-3 175B and 530B on A100).

Narayanan et al., SC'21, Table 2: achieved TFLOP/s per GPU (the paper's eq. 3 FLOPs, full
recomputation) of PTD-P (TP 8 × PP 12 for 175B, TP 8 × PP 35 for 530B) and of ZeRO-3 without
model parallelism, on 384–2,240 A100-80GB of Selene (``hw_db.system("dgx_a100", nodes=N)``)
at fixed global batch (micro-batch 4/2/1 for ZeRO-3: one micro-batch per step).

- **ZeRO-3 rows**, as DeepSpeed ran them in 2021 (:func:`deepspeed_row`): the compute of
  :func:`jaxmodel.train_step` with ``Parallelism(dp=N, tp=1, pp=1, zero=3,
  recompute="full")`` and the ZeRO-3 part timed by :func:`jaxmodel.parallel.zero.zero3_step`
  with one FSDP unit per layer whose gathers and reduce-scatters are issued per parameter
  tensor (12 per layer) through the list API, each call paying NCCL's flat-ring latency over
  all N ranks and N copy kernels (:func:`jaxmodel.parallel.zero.call_overhead`), fp16
  gradient reduction (DeepSpeed's default for fp16 training), no prefetch beyond DeepSpeed's
  5·10⁷-parameter bucket (``prefetch=0``; ``1`` printed as a sensitivity case). Beside it:
  the training step's own ZeRO-3 (FSDP flat-parameter units, prefetch one unit, SM
  contention, :mod:`jaxmodel.parallel.overlap`) — what a flat-parameter implementation
  would reach — and the per-NIC / serial sensitivity cases.
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
from jaxmodel.parallel import zero

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


def deepspeed_row(params_b, gpus, batch, mb, prefetch=0.0):
    """Predicted TFLOP/s per GPU and the step of one ZeRO-3 row as DeepSpeed ran it in 2021:
    the training step's compute (:func:`zero3_row`) with the ZeRO-3 part re-timed by
    :func:`jaxmodel.parallel.zero.zero3_step` from per-tensor collectives — every layer's
    4 weight matrices and 8 vectors (QKV, output, FC1, FC2 weights; their biases; two
    LayerNorms' scale and shift) gathered and reduce-scattered one call each through the
    list API (:func:`jaxmodel.parallel.zero.call_overhead`). ``prefetch = 0``: DeepSpeed's
    default ``stage3_prefetch_bucket_size`` (5·10⁷ parameters) is a small fraction of one
    layer (1.8·10⁹ / 5.0·10⁹ parameters for 175B / 530B), so a layer's gathers are waited
    for when it runs; ``prefetch = 1`` is the sensitivity case of a layer gathered ahead."""
    model = MODELS[params_b]
    system = hw_db.system("dgx_a100", nodes=int(gpus) // 8)
    _, step, parts = zero3_row(params_b, gpus, batch, mb)
    n = float(model.n_layers)
    m = batch / (gpus * mb)
    # FSDP unit = one layer; forward = 1/3 of the layer compute, backward 2/3 + recompute
    t_f = parts["compute"] / 3.0 / (n * m)
    t_b = (2.0 * parts["compute"] / 3.0 + parts["recompute"]) / (n * m)
    p_unit = 12.0 * float(model.d_model) ** 2 + 13.0 * float(model.d_model)
    g = float(jm.collective_latency(system, "all_gather", 2.0 * p_unit, float(gpus)))
    r = float(jm.collective_latency(system, "reduce_scatter", 2.0 * p_unit, float(gpus)))
    oh = float(zero.call_overhead(system, float(gpus), 1.0, big_calls=4.0, small_calls=8.0,
                                  list_api=1.0))
    z = zero.zero3_step(system, n * p_unit, n, t_f, t_b, float(gpus), m, prefetch=prefetch,
                        grad_comm_bytes=2.0, collective_times=(g + oh, r + oh, 0.0))
    step = step - parts["dp_comm"] + float(z["total"] - z["compute"])
    return eq3_flops(model, batch) / (step * gpus) / 1e12, step, oh


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
            pred, step, oh = deepspeed_row(p, g, b, mb)
            fsdp, _, parts = zero3_row(p, g, b, mb)
            extra = {"per_tensor_call_overhead_ms": round(1e3 * oh, 1),
                     "deepspeed_prefetch1_tflops": round(deepspeed_row(p, g, b, mb, 1.0)[0], 1),
                     "fsdp_train_step_tflops": round(fsdp, 1),
                     **{f"zero3_{k}": v for k, v in parts.items()}}
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
        cols = ["per_tensor_call_overhead_ms", "deepspeed_prefetch1_tflops",
                "fsdp_train_step_tflops"] + [c for c in g.columns if c.startswith("zero3_")]
        print(g[["num_gpus"] + cols].round(2).to_string(index=False))
        for c in ("deepspeed_prefetch1_tflops", "fsdp_train_step_tflops"):
            print(f"  {c}: MAPE {100 * np.mean(np.abs(g[c] / g.measured_tflops - 1)):.1f} %, "
                  f"ratio last/first {g[c].iloc[-1] / g[c].iloc[0]:.2f}")
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
    print("\nZeRO-3 communication the measurements imply (serial reading: measured step − the "
          "model's compute, recomputation, embedding and optimizer), for the 3·Ψ·2 bytes each "
          "GPU moves per step (fp16 gathers forward and backward + fp16 reduce-scatter, "
          "·(N−1)/N):")
    print(implied_bandwidth(out).to_string(index=False))


def implied_bandwidth(out):
    """Per-GPU ZeRO-3 bandwidth implied by each measured row next to the model's serial one
    (a diagnostic: what the anchor says about the collectives, not a fit)."""
    rows = []
    z = out[out.scheme == "ZeRO-3"]
    for _, r in z.iterrows():
        model = MODELS[r.params_billion]
        flops = eq3_flops(model, r.global_batch)
        t_meas = flops / (r.measured_tflops * 1e12 * r.num_gpus)
        busy = sum(r[f"zero3_{k}"] for k in ("compute", "recompute", "embedding", "optimizer"))
        _, t_serial, _ = zero3_row(r.params_billion, r.num_gpus, r.global_batch,
                                   r.micro_batch, prefetch=0.0)
        nbytes = 3.0 * 2.0 * r.params_billion * 1e9 * (r.num_gpus - 1.0) / r.num_gpus
        rows.append({"params_billion": r.params_billion, "num_gpus": r.num_gpus,
                     "measured_step_s": round(t_meas, 1), "model_busy_s": round(busy, 1),
                     "implied_comm_s": round(t_meas - busy, 1),
                     "implied_GBps_per_gpu": round(nbytes / (t_meas - busy) / 1e9, 1),
                     "model_serial_comm_s": round(t_serial - busy, 1),
                     "model_GBps_per_gpu": round(nbytes / (t_serial - busy) / 1e9, 1)})
    return pd.DataFrame(rows)


if __name__ == "__main__":
    main()
