"""Validate the training step against Megatron-LM (PTD-P Table 1) and Korthikanti's memory.

1. **Throughput** — Narayanan et al., SC'21, Table 1: achieved TFLOP/s per GPU of GPT models
   from 1.7B to 1T parameters on 32–3072 A100-80GB of Selene
   (``hw_db.system("dgx_a100", nodes=N)``), FLOPs counted with the paper's eq. 3. Every row
   runs the authors' own launch configuration (:data:`LAUNCH`, from the Megatron-LM
   repository's ``examples/sc21/run_table_1.sh`` and ``CONFIG.sh``, published with the paper
   in August 2021): its micro-batch size, its interleaving (``--num-layers-per-virtual-
   pipeline-stage``; the 39B and the 1T runs use the plain 1F1B schedule), full activation
   recomputation, no sequence parallelism (it came later), the scatter/gather optimisation
   (on by default), and its data-parallel implementation — ``--DDP-impl torch`` (PyTorch
   DDP: bucketed all-reduce overlapped with the backward, Li et al., VLDB 2020, §3.2.3;
   ``dp_overlap=1``) for the rows without a pipeline, ``local`` (Megatron-LM's own DDP: one
   all-reduce after the pipeline flush, ``megatron/training.py: train_step``;
   ``dp_overlap=0``) for the others. The runs pass ``--fp16`` without
   ``--accumulate-allreduce-grads-in-fp32``: the gradients are reduced in fp16
   (``GRAD_BYTES = 2``) and the fp16 optimizer first copies them to fp32 main gradients and
   unscales them (``ADAM_BYTES``). The memory-bound kernels are those of that stack
   (``train_step(dropout="megatron2021")``, :data:`STACK_2021`). ``--fp32-grads-serial-dp``
   prints a sensitivity case beside: fp32 gradients, every data-parallel all-reduce serial
   after the pipeline flush, train_step's default optimizer bytes and kernel stack.
   TARGET: MAPE ≤ 5 %, no row beyond 10 % (Calculon: +2.7 … +17 %).
2. **Memory** — Korthikanti et al., MLSys 2023, Fig. 1: per-GPU weights+gradients+optimizer
   and activation memory of 22B/175B/530B/1T models (their Table 3: t = 8; p = 1/8/35/64;
   micro-batch 4/1/1/1), without ("none") and with sequence parallelism + selective
   recompute ("seqsel"). The interleaving is not in the anchor file: we use v = 3 for 175B
   and 530B (Megatron's launch scripts: 4 and 1 layers per virtual stage) and v = 1 for 1T
   (2 layers per stage); it only enters through the in-flight micro-batches (§4.2.3).

Writes ``experiments/out/validate_megatron.csv``, ``validate_megatron_memory.csv`` and
``validate_megatron.png``; prints every row's error, the MAPE and the worst row.

Run: ``.venv/bin/python experiments/validate_megatron.py``
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db
from jaxmodel.parallel.train import CONSTANTS as train_constants

from common import OUT, anchor_dir  # noqa: E402

ANCHORS = anchor_dir("training")

# The launch configuration of every Table 1 row, keyed by its size in billions of parameters:
# (micro-batch size, --num-layers-per-virtual-pipeline-stage (0: no interleaving),
# --DDP-impl). Source: NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh (commit de7dc40,
# 2021-08-10, "scripts for sc21"), the scripts behind Narayanan et al. SC'21's Table 1.
LAUNCH = {1.7: (16, 0, "torch"), 3.6: (16, 0, "torch"), 7.5: (16, 0, "torch"),
          18.4: (8, 0, "torch"), 39.1: (4, 0, "local"), 76.1: (2, 5, "local"),
          145.6: (2, 5, "local"), 310.1: (1, 3, "local"), 529.6: (1, 1, "local"),
          1008.0: (1, 0, "local")}
# --fp16 without --accumulate-allreduce-grads-in-fp32 (examples/sc21/CONFIG.sh): both DDP
# implementations of Megatron-LM 2021 all-reduce the fp16 ``param.grad`` tensors
# (megatron/model/distributed.py buckets them by the parameter's dtype), bytes per element.
GRAD_BYTES = 2.0
# Megatron-LM 2021's Float16OptimizerWithFloat16Params.step (megatron/optimizer/
# optimizer.py) before the Adam step of hw_db/tech/training.toml (``adam_bytes_per_param``,
# train_step's default): copy the fp16 gradients to fp32 main gradients
# (``model_param.grad.float()``: read 2 + write 4 B) and unscale them with the inf/NaN check
# (``torch._amp_foreach_non_finite_check_and_unscale_``: read 4 + write 4 B), bytes moved
# per local parameter.
FP16_GRAD_COPY_UNSCALE_BYTES = 6.0 + 8.0
ADAM_BYTES = train_constants["adam_bytes_per_param"] + FP16_GRAD_COPY_UNSCALE_BYTES
# ``train_step(dropout="megatron2021")``: Megatron GPT's dropout (0.1, the defaults of the SC'21 runs) on
# the Megatron-LM 2021 stack (PyTorch 1.8, NGC 20.12, as examples/sc21/SRUN.sh): the eager
# QKV-bias add, context copy, QKV-split and bias gradients
# (``jaxmodel.workload.layer.megatron2021_kernels``), the ``param.grad`` accumulation of
# every micro-batch but the first (``grad_accumulation``) and the cross entropy on fp32
# logits (``fp32_cross_entropy``).
STACK_2021 = "megatron2021"


def gpt(layers, hidden, heads, vocab=51200.0, ffn=None):
    """A Megatron GPT (tied embeddings, GELU, d_ff = 4h); leaves may be arrays."""
    return jm.Model(n_layers=layers, d_model=hidden, n_heads=heads, n_kv_heads=heads,
                    head_dim=hidden / heads, d_ff=4.0 * hidden if ffn is None else ffn,
                    vocab_size=vocab, activation="gelu", tied_embeddings=1.0, name="megatron")


def selene(nodes):
    """DGX A100 nodes (Selene) with the node count as a (possibly batched) leaf."""
    base = hw_db.system("dgx_a100", nodes=1)
    levels = list(base.levels)
    levels[-1] = dataclasses.replace(levels[-1], size=nodes)
    return dataclasses.replace(base, levels=tuple(levels))


def launch_plan(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``table`` with their launch configuration (:data:`LAUNCH`): micro-batch,
    virtual stages per device ``v = L / (p · layers per virtual stage)``, schedule code
    (interleaved 2 / 1F1B 1) and ``dp_overlap`` (1 for PyTorch DDP, 0 for Megatron's local
    DDP)."""
    cfg = [LAUNCH[round(float(b), 1)] for b in table.params_billion]
    mb = np.asarray([c[0] for c in cfg], dtype=np.float64)
    lpvs = np.asarray([c[1] for c in cfg], dtype=np.float64)
    v = np.where(lpvs > 0, table.num_layers / (table.pp * np.maximum(lpvs, 1.0)), 1.0)
    if np.any(v != np.round(v)):
        raise ValueError(f"layers per virtual stage do not divide the stages: {v}")
    return table.assign(micro_batch=mb, interleave=v, schedule=np.where(v > 1, 2.0, 1.0),
                        dp_overlap=[1.0 if c[2] == "torch" else 0.0 for c in cfg])


def run_table1(fp32_grads_serial_dp=False):
    """Table 1 under the launch configurations. ``fp32_grads_serial_dp``: fp32 gradients, a
    serial all-reduce on every row and train_step's default optimizer bytes and kernel stack
    (a sensitivity case)."""
    table = launch_plan(pd.read_csv(ANCHORS / "megatron_table1.csv"))
    col = lambda name: jnp.asarray(table[name].to_numpy(dtype=np.float64))  # noqa: E731
    system = selene(col("num_gpus") / 8.0)
    model = gpt(col("num_layers"), col("hidden_size"), col("attention_heads"),
                col("vocab_size"))
    par = jm.Parallelism(dp=col("dp"), tp=col("tp"), pp=col("pp"), sp=0.0,
                         micro_batch=col("micro_batch"), interleave=col("interleave"),
                         schedule=col("schedule"), recompute=2.0, zero=0.0)
    kw = (dict(dp_overlap=0.0) if fp32_grads_serial_dp else
          dict(dp_overlap=col("dp_overlap"), grad_bytes=GRAD_BYTES,
               adam_bytes_per_param=ADAM_BYTES, dropout=STACK_2021))
    res = jm.train_step(system, model, par, col("global_batch_size"), col("seq_len"), **kw)
    if not np.all(np.asarray(res.feasible)):
        bad = [jm.reason_name(c) for c in np.asarray(res.reason)]
        raise RuntimeError(f"a launch configuration of Table 1 is infeasible: {bad}")
    out = table.assign(
        step_time_s=np.asarray(res.step_time_s),
        predicted_tflops=np.asarray(res.achieved_flops_per_device) / 1e12,
        memory_GiB=np.asarray(res.memory_bytes) / 2**30,
        **{f"t_{k}": np.asarray(v) for k, v in res.breakdown.items()})
    out["error_pct"] = 100.0 * (out.predicted_tflops / out.achieved_tflops_per_gpu - 1.0)
    return out


def run_memory():
    fig = pd.read_csv(ANCHORS / "korthikanti_memory_fig1_fig7.csv")
    fig1 = fig[fig.figure == "fig1"]
    # Korthikanti Table 3 (t, p, b) and interleaving (see module docstring)
    cfg = {"megatron-22B": (48, 6144, 64, 8, 1, 4, 1),
           "gpt3-175B": (96, 12288, 96, 8, 8, 1, 3),
           "turing-530B": (105, 20480, 128, 8, 35, 1, 3),
           "megatron-1T": (128, 25600, 160, 8, 64, 1, 1)}
    keys = [(name, mode) for name in cfg for mode in ("none", "seqsel")]
    c = np.asarray([cfg[name] for name, _ in keys], dtype=np.float64).T
    L, h, a, t, p, b, v = (jnp.asarray(x) for x in c)
    seqsel = jnp.asarray([float(mode == "seqsel") for _, mode in keys])
    m = p * jnp.where(v > 1, 8.0, 1.0)         # enough micro-batches to fill the pipeline
    par = jm.Parallelism(dp=1.0, tp=t, pp=p, sp=seqsel, micro_batch=b, interleave=v,
                         schedule=jnp.where(v > 1, 2.0, 1.0), recompute=seqsel)
    r = jm.train_step(selene(t * p / 8.0), gpt(L, h, a), par, m * b, 2048.0)
    mem = {k: np.asarray(x) / 2**30 for k, x in r.memory.items()}
    rows = []
    for i, (name, mode) in enumerate(keys):
        meas = fig1[(fig1.model == name) & (fig1["mode"] == mode)].set_index("metric").value
        for metric, pred in (("params_and_optimizer_GiB_per_gpu",
                              mem["weights"][i] + mem["gradients"][i] + mem["optimizer"][i]),
                             ("activation_memory_GiB_per_gpu", mem["activations"][i])):
            rows.append({"model": name, "mode": mode, "metric": metric,
                         "measured": float(meas[metric]), "predicted": float(pred)})
    df = pd.DataFrame(rows)
    df["error_pct"] = 100.0 * (df.predicted / df.measured - 1.0)
    return df


def plot(out: pd.DataFrame, mem: pd.DataFrame, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    x = np.arange(len(out))
    ax[0].bar(x - 0.2, out.achieved_tflops_per_gpu, 0.4, label="Megatron-LM (Table 1)")
    ax[0].bar(x + 0.2, out.predicted_tflops, 0.4, label="jaxmodel")
    ax[0].set_xticks(x, [f"{p:g}B" for p in out.params_billion], rotation=45)
    ax[0].set_ylabel("TFLOP/s per GPU (eq. 3)")
    ax[0].set_title(f"PTD-P Table 1: MAPE {out.error_pct.abs().mean():.1f} %")
    ax[0].legend(fontsize=8)
    lab = [f"{m.split('-')[-1]} {md}\n{'act' if 'activation' in me else 'w+opt'}"
           for m, md, me in zip(mem.model, mem["mode"], mem.metric)]
    y = np.arange(len(mem))
    ax[1].bar(y - 0.2, mem.measured, 0.4, label="Korthikanti Fig. 1")
    ax[1].bar(y + 0.2, mem.predicted, 0.4, label="jaxmodel")
    ax[1].set_xticks(y, lab, rotation=90, fontsize=6)
    ax[1].set_ylabel("GiB per GPU")
    ax[1].set_title(f"Memory: MAPE {mem.error_pct.abs().mean():.1f} %")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def gemm_sustained_ratio():
    """Sustained cuBLASLt throughput (microbench anchors) / the ops GEMM model, A100 fp16, on
    the shapes the ``sustained_clock_fraction`` of ``hw_db/tech/training.toml`` is derived
    from — printed so that a change of the GEMM model shows up here."""
    mb = pd.read_csv(ANCHORS.parent / "microbench" / "gpu_microbenchmarks.csv")
    rows = mb[(mb.gpu == "A100") & (mb.benchmark == "gemm_cublaslt")]
    shapes = {"m=8192 n=8192 k=8192", "m=16384 n=16384 k=16384", "m=6144 n=12288 k=12288"}
    rows = rows[rows.shape_or_op.isin(shapes)]
    mnk = np.asarray([[float(t.split("=")[1]) for t in s.split()] for s in rows.shape_or_op])
    dev = hw_db.device("a100_80gb")
    t = np.asarray(jm.gemm_latency(dev, jnp.asarray(mnk[:, 0]), jnp.asarray(mnk[:, 1]),
                                   jnp.asarray(mnk[:, 2])))
    model_tflops = 2.0 * mnk.prod(axis=1) / t / 1e12
    return rows.value.to_numpy() / model_tflops


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    ratio = gemm_sustained_ratio()
    print(f"sustained/model GEMM ratio on the derivation shapes: {np.round(ratio, 3)} "
          f"(mean {ratio.mean():.3f}); a100_80gb sustained_clock_fraction = "
          f"{float(hw_db.device('a100_80gb').sustained_clock_fraction)}")
    out = run_table1()
    out.to_csv(OUT / "validate_megatron.csv", index=False)
    cols = ["params_billion", "tp", "pp", "dp", "num_gpus", "micro_batch", "interleave",
            "dp_overlap", "achieved_tflops_per_gpu", "predicted_tflops", "error_pct"]
    print("PTD-P Table 1 (achieved TFLOP/s per GPU, eq. 3), the authors' launch configurations:")
    print(out[cols].to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    mape = out.error_pct.abs().mean()
    worst = out.error_pct.abs().max()
    print(f"Table 1: MAPE {mape:.2f} % (target <= 5 %), worst {worst:.2f} % (target <= 10 %)")
    groups = (("pp = 1", out.pp == 1), ("pp > 1, 1F1B", (out.pp > 1) & (out.interleave == 1)),
              ("pp > 1, interleaved", out.interleave > 1))
    for name, rows in groups:
        print(f"  {name}: mean error {out.error_pct[rows].mean():+.2f} % over {rows.sum()} rows")
    if "--fp32-grads-serial-dp" in sys.argv:
        before = run_table1(fp32_grads_serial_dp=True)
        print("sensitivity, fp32 gradients and a serial all-reduce on every row: errors "
              f"{np.round(before.error_pct.to_numpy(), 1)} %, MAPE "
              f"{before.error_pct.abs().mean():.2f} %")

    mem = run_memory()
    mem.to_csv(OUT / "validate_megatron_memory.csv", index=False)
    print("\nKorthikanti Fig. 1 memory (GiB per GPU):")
    print(mem.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"Memory: MAPE {mem.error_pct.abs().mean():.2f} %, worst "
          f"{mem.error_pct.abs().max():.2f} %")
    plot(out, mem, OUT / "validate_megatron.png")
    print(f"wrote {OUT / 'validate_megatron.csv'}, validate_megatron_memory.csv, "
          f"validate_megatron.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
