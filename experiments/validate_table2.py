"""Validate ZeRO-3 and PTD-P against Megatron-LM's Table 2 (GPT-3 175B and 530B on A100).

Narayanan et al., SC'21, Table 2 and §5.2: achieved TFLOP/s per GPU (the paper's eq. 3 FLOPs,
full recomputation) of PTD-P (TP 8 × PP 12 for 175B, TP 8 × PP 35 for 530B) and of DeepSpeed
ZeRO-3 without model parallelism, on 384–2,240 A100-80GB of Selene
(``hw_db.system("dgx_a100", nodes=N)``) at fixed global batch (micro-batch 4/2/1 for ZeRO-3:
one micro-batch per step).

- **ZeRO-3 rows**, as DeepSpeed ran them in 2021: :func:`jaxmodel.train_step` with
  ``Parallelism(dp=N, tp=1, pp=1, zero=3, zero3_impl="deepspeed", recompute="full")`` and
  fp16 gradient reduction (``grad_bytes=2``): one unit per layer, serial (DeepSpeed
  synchronises the device before every parameter gather), three gathers per layer (forward,
  re-forward of the checkpointed layer, backward), fp16 gathers and gradient reduce-scatters
  issued per parameter tensor through the list API
  (:func:`jaxmodel.parallel.zero.per_tensor_collectives`): the 4 weight matrices gathered
  (biases and LayerNorms stay gathered: DeepSpeed's ``stage3_param_persistence_threshold``
  10⁵), all 12 tensors reduce-scattered. Beside it, the same rows with the default
  ``zero3_impl="fsdp"`` (prefetched flat-parameter units).
- The NCCL model reaches these rows' communication only at a fraction of its speed: that
  fraction, ``flat_ring_efficiency`` of the InfiniBand tier (``hw_db/tech/network.toml``,
  :data:`jaxmodel.parallel.zero.FLAT_RING_EFFICIENCY`), is the one calibrated constant,
  fitted here (``--calibrate``) on the six ZeRO-3 rows with leave-one-row-out and
  leave-one-model-out cross-validation printed beside it. The fit evaluates the step in
  closed form from its parts (the step without ZeRO communication, and per layer the NCCL
  and list-API seconds of :func:`~jaxmodel.parallel.zero.per_tensor_collectives` at
  efficiency 1), checked against :func:`jaxmodel.train_step` at hw_db's value.
- **PTD-P rows**: :func:`jaxmodel.train_step` with its defaults otherwise (full recompute,
  no SP, Megatron-LM 2021's serial data-parallel all-reduce ``dp_overlap=0``, the row's
  micro-batch of 1) and the interleaving that gives the shortest modelled step among
  {1, 2, 4, 8} (175B) / {1, 3} (530B) virtual stages per device: the launch settings of
  these rows are not in the anchor, unlike Table 1's, which ``validate_megatron.py`` runs
  at the authors' own settings; nothing calibrated.

Prints predicted vs measured TFLOP/s per GPU, the per-row ZeRO-3 breakdown (compute, NCCL
gathers and reduce-scatters, list-API costs, what the measurement implies), the MAPE per
scheme and the cross-validation; writes ``experiments/out/validate_table2.csv``.

Run: ``.venv/bin/python experiments/validate_table2.py [--calibrate]``
"""

from __future__ import annotations


import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db
from jaxmodel.parallel import zero

from common import OUT, anchor_dir  # noqa: E402

ANCHORS = anchor_dir("training")
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


def zero3_row(params_b, gpus, batch, mb, impl="deepspeed"):
    """TFLOP/s per GPU, the step and its breakdown of one ZeRO-3 row through
    :func:`jaxmodel.train_step` with ``zero3_impl=impl``."""
    model = MODELS[params_b]
    system = hw_db.system("dgx_a100", nodes=int(gpus) // 8)
    par = jm.Parallelism(dp=float(gpus), tp=1.0, pp=1.0, sp=False, micro_batch=float(mb),
                         recompute="full", zero=3, zero3_impl=impl)
    r = jm.train_step(system, model, par, float(batch), SEQ, grad_bytes=2.0)
    step = float(r.step_time_s)
    parts = {k: float(v) for k, v in r.breakdown.items()}
    parts["memory_GB"] = float(r.memory_bytes) / 1e9
    return eq3_flops(model, batch) / (step * gpus) / 1e12, step, parts


def deepspeed_parts(params_b, gpus, batch, mb):
    """One DeepSpeed ZeRO-3 row of :func:`jaxmodel.train_step` and its parts: the step
    without ZeRO communication (``busy``), and per layer the NCCL and list-API seconds of
    the gathers and reduce-scatters at ring efficiency 1 (the tensors of
    :func:`jaxmodel.parallel.zero.layer_tensors`, as the step issues them)."""
    model = MODELS[params_b]
    system = hw_db.system("dgx_a100", nodes=int(gpus) // 8)
    pred, step, parts = zero3_row(params_b, gpus, batch, mb)
    el, cnt = zero.layer_tensors(model)
    out = {"tflops": pred, "step": step, "busy": step - parts["dp_comm"],
           "n": float(model.n_layers), "m": batch / (gpus * mb),
           "fsdp_train_step_tflops": zero3_row(params_b, gpus, batch, mb, "fsdp")[0],
           "memory_GB": parts["memory_GB"]}
    for key, op in (("ag", "all_gather"), ("rs", "reduce_scatter")):
        nccl, full = (float(zero.per_tensor_collectives(system, op, el, float(gpus),
                                                        counts=cnt, list_api=api,
                                                        ring_efficiency=1.0)[0])
                      for api in (0.0, 1.0))
        out[f"{key}_nccl"], out[f"{key}_list_api"] = nccl, full - nccl
    return out


def closed_form_tflops(d, eff, params_b, gpus, batch):
    """The DeepSpeed row of :func:`deepspeed_parts` at ring efficiency ``eff`` in closed
    form, for the calibration grid (serial, one micro-batch per step: every layer gathers
    three times and reduce-scatters once)."""
    comm = d["n"] * d["m"] * (3.0 * (d["ag_nccl"] / eff + d["ag_list_api"])
                              + d["rs_nccl"] / eff + d["rs_list_api"])
    return eq3_flops(MODELS[params_b], batch) / ((d["busy"] + comm) * gpus) / 1e12


GRID = np.round(np.arange(0.05, 1.0001, 0.005), 3)


def fit_efficiency(rows):
    """The grid value of the ring efficiency minimising the MAPE over ``rows`` (tuples of
    the pieces, the row's keys and the measured TFLOP/s)."""
    mape = [np.mean([abs(closed_form_tflops(d, e, *k) / meas - 1) for d, k, meas in rows])
            for e in GRID]
    return float(GRID[int(np.argmin(mape))])


def cross_validate(rows):
    """In-sample fit, leave-one-row-out and leave-one-model-out errors (%)."""
    e_all = fit_efficiency(rows)
    ins = [100 * (closed_form_tflops(d, e_all, *k) / meas - 1) for d, k, meas in rows]
    loo = []
    for i, (d, k, meas) in enumerate(rows):
        e = fit_efficiency([r for j, r in enumerate(rows) if j != i])
        loo.append(100 * (closed_form_tflops(d, e, *k) / meas - 1))
    lomo = []
    for i, (d, k, meas) in enumerate(rows):
        e = fit_efficiency([r for r in rows if r[1][0] != k[0]])
        lomo.append(100 * (closed_form_tflops(d, e, *k) / meas - 1))
    return e_all, ins, loo, lomo


def ptdp_row(params_b, gpus, batch, mb):
    """Predicted TFLOP/s per GPU of the published PTD-P plan at the interleaving with the
    shortest modelled step."""
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


def main(calibrate=False):
    df = pd.read_csv(ANCHORS / "megatron_table2_ptdp_vs_zero3.csv")
    eff = zero.FLAT_RING_EFFICIENCY
    rows, fit_rows = [], []
    for _, r in df.iterrows():
        p, g, b, mb = r.params_billion, r.num_gpus, r.global_batch_size, r.microbatch_size
        if r.scheme == "ZeRO-3":
            d = deepspeed_parts(p, g, b, mb)
            pred, step = d["tflops"], d["step"]
            # the closed form of the calibration is the step of jm.train_step (float32)
            assert abs(pred / closed_form_tflops(d, eff, p, g, b) - 1) < 1e-4, (
                pred, closed_form_tflops(d, eff, p, g, b))
            fit_rows.append((d, (p, g, b), r.achieved_tflops_per_gpu))
            t_meas = eq3_flops(MODELS[p], b) / (r.achieved_tflops_per_gpu * 1e12 * g)
            n = d["n"] * d["m"]
            extra = {"busy_s": d["busy"],
                     "gathers_nccl_s": 3 * n * d["ag_nccl"] / eff,
                     "gathers_list_api_s": 3 * n * d["ag_list_api"],
                     "rs_nccl_s": n * d["rs_nccl"] / eff,
                     "rs_list_api_s": n * d["rs_list_api"],
                     "implied_comm_s": t_meas - d["busy"],
                     "eff1_tflops": closed_form_tflops(d, 1.0, p, g, b),
                     "fsdp_train_step_tflops": d["fsdp_train_step_tflops"],
                     "memory_GB": d["memory_GB"]}
        else:
            pred, step, v = ptdp_row(p, g, b, mb)
            extra = {"interleave": v}
        err = (pred - r.achieved_tflops_per_gpu) / r.achieved_tflops_per_gpu
        rows.append({"scheme": r.scheme, "params_billion": p, "num_gpus": g,
                     "global_batch": b, "micro_batch": mb,
                     "measured_tflops": r.achieved_tflops_per_gpu,
                     "predicted_tflops": round(pred, 1), "step_time_s": round(step, 2),
                     "error_pct": round(100 * err, 1),
                     **{k: round(v, 2) for k, v in extra.items()}})
    out = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    out.to_csv(OUT / "validate_table2.csv", index=False)
    pd.set_option("display.width", 220)
    print(out[["scheme", "params_billion", "num_gpus", "micro_batch", "measured_tflops",
               "predicted_tflops", "step_time_s", "error_pct"]].to_string(index=False))
    for scheme, grp in out.groupby("scheme"):
        mape = np.mean(np.abs(grp.error_pct))
        print(f"{scheme}: MAPE {mape:.1f} % over {len(grp)} rows "
              f"(175B only: {np.mean(np.abs(grp[grp.params_billion < 200].error_pct)):.1f} %)")
    z = out[out.scheme == "ZeRO-3"]
    print(f"\nZeRO-3 breakdown per step, s (ring efficiency {eff:g} of the InfiniBand tier; "
          "implied = measured step − busy):")
    cols = ["params_billion", "num_gpus", "busy_s", "gathers_nccl_s", "gathers_list_api_s",
            "rs_nccl_s", "rs_list_api_s", "implied_comm_s", "step_time_s", "eff1_tflops",
            "fsdp_train_step_tflops", "memory_GB"]
    print(z[cols].to_string(index=False))
    for c in ("eff1_tflops", "fsdp_train_step_tflops"):
        print(f"  {c}: MAPE {100 * np.mean(np.abs(z[c] / z.measured_tflops - 1)):.1f} %")
    for p, grp in z.groupby("params_billion"):
        g = grp.sort_values("num_gpus")
        print(f"ZeRO-3 {p:g}B throughput ratio last/first: predicted "
              f"{g.predicted_tflops.iloc[-1] / g.predicted_tflops.iloc[0]:.2f}, measured "
              f"{g.measured_tflops.iloc[-1] / g.measured_tflops.iloc[0]:.2f} "
              f"(GPUs ×{g.num_gpus.iloc[-1] / g.num_gpus.iloc[0]:g})")
    e_all, ins, loo, lomo = cross_validate(fit_rows)
    print(f"\nring efficiency fit (grid {GRID[0]:g}-{GRID[-1]:g}): {e_all:g} (hw_db: {eff:g}); "
          f"MAPE in sample {np.mean(np.abs(ins)):.1f} %, leave-one-row-out "
          f"{np.mean(np.abs(loo)):.1f} %, leave-one-model-out {np.mean(np.abs(lomo)):.1f} %")
    print("  per row, in / LOO / LOMO %:",
          [f"{a:+.0f}/{b:+.0f}/{c:+.0f}" for a, b, c in zip(ins, loo, lomo)])
    if calibrate:
        print(f"--calibrate: set hw_db/tech/network.toml infiniband.flat_ring_efficiency = "
              f"{e_all:g}")


if __name__ == "__main__":
    import sys
    main(calibrate="--calibrate" in sys.argv[1:])
