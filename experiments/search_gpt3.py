"""The parallelism search's best plan for GPT-3 175B on 1,536 A100, with a breakdown a
reviewer can follow.

Problem (Narayanan et al., SC'21, the GPT-3 175B run): 192 DGX A100 nodes (1,536 GPUs of
Selene, ``hw_db.system("dgx_a100", nodes=192)``), global batch 1,536, sequence 2,048.
``jm.search_parallelism`` enumerates every consistent plan crossed with the execution options
(data-parallel gradient reduction overlapped with the backward or not; bf16 or fp32 gradient
reduction; TP collectives pipelined with their GEMMs or not) and ranks them by step time.

For the best plan (and the best plan without TP overlap, without ZeRO-3 when the best uses
it, and with Megatron-LM's TP 8 × PP 12 degrees) the script prints:

- the step's parts (:attr:`jaxmodel.TrainResult.breakdown`, they sum to the step time) in
  seconds and in per cent of the step;
- each communication's standalone time (the same plan with that overlap option off) next to
  its exposed part, and the compute slowdown that overlap costs (SMs and memory bandwidth
  the collectives take, :mod:`jaxmodel.parallel.overlap`);
- with the TP overlap, the extra time of Transformer Engine's split host GEMMs (ring-exchange
  chunks of ``b·s/tp`` rows, pipelined chunks of ``b·s/4``, each at its own shape's rate;
  :func:`jaxmodel.parallel.train_stage.tp_split_times`), part of the exposed ``tp_comm``;
- the sustained GEMM efficiency of the compute part (model FLOPs per device / compute
  seconds / peak) and the MFU, beside published A100 MFUs for comparison: Korthikanti et
  al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023, Table 5:
  GPT-3 175B with sequence parallelism and selective recomputation, 51.4 % MFU;
  530B 56.0 %; 1T 56.3 %).

Before the plans it prints the search's throughput: configurations, wall seconds and CPU
seconds of the search call (``time.process_time``, all threads; the machine may be shared,
so the CPU time is the figure to compare) and the load average.

For the best plan it also splits the compute part into GEMM families (QKV, output
projection, FC1, FC2), the attention core, the vector kernels (layernorms, activation,
softmax) and the bias/dropout/residual kernels, from the same per-layer op list
:func:`jaxmodel.train_step` uses, and walks a ladder from Megatron-LM's 2021 execution of
the same degrees to the best plan (one change at a time; the gradient precision early, as
fp32 gradient buffers do not fit these degrees with larger micro-batches). Cross-check of the overlap's net value: Lee et al., "Characterizing
Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and
Power Implications" (arXiv 2507.03114, 2025) measure on 4×A100/H100 that running compute
and communication one after the other is on average 10.2 % (at most 26.6 %) slower than
overlapping them, and that overlapped compute runs on average 18.9 % (at most 40 %) slower
than alone.

Cross-check of the compute part on one node: the best MFU the model gives GPT-3 1.3B and
2.7B (Brown et al. 2020 shapes) trained with FlashAttention-2 on 8 A100 (data parallel,
sequence 2k and 8k), beside Dao, "FlashAttention-2: Faster Attention with Better Parallelism
and Work Partitioning" (2023, §4.3): end to end "up to 225 TFLOPs/s per A100 (72 % model
FLOPs utilization)".

Then it undoes one assumption of the best plan at a time (TP overlap, DP overlap, bf16
gradient reduction, no recomputation, FlashAttention, the micro-batch, the virtual stages;
and the one the search leaves off, Megatron-core's ``overlap_p2p_comm``) and prints the MFU
and memory of each: what carries the best plan's MFU. The best plan's memory is printed by
term (:func:`jaxmodel.memory_breakdown`) beside the device's usable capacity.

Writes ``experiments/out/search_gpt3.csv`` (the top 50 plans).

Run: ``.venv/bin/python experiments/search_gpt3.py [--small]`` (``--small``: 128 GPUs).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db: the package wires hw_db up)
import hw_db
from jaxmodel.parallel import train as _train
from jaxmodel.parallel import train_stage as _train_stage
from jaxmodel.workload import layer as _layer

from common import OUT  # noqa: E402
PLAN = ("dp", "tp", "pp", "sp", "micro_batch", "interleave", "schedule", "recompute", "zero",
        "flash_attention")
OPTS = ("dp_overlap", "grad_bytes", "tp_overlap")
#: rows of the layer's op list by family (jaxmodel.workload.layer.layer_graph)
FAMILIES = {"QKV GEMM": ("qkv",), "attention core": ("qk", "softmax", "av"),
            "out-proj GEMM": ("wo",), "FC1 GEMM": ("w1",), "FC2 GEMM": ("w2",),
            "layernorm+activation": ("layernorm_mha", "layernorm_ffn", "act")}
OVERLAP_MEASURED = {"serial/overlapped, mean": 1.102, "serial/overlapped, max": 1.266,
                    "compute slowdown under overlap, mean": 0.189}
FA2_MEASURED_MAX_TFLOPS = 225.0     # Dao 2023, §4.3, GPT-style models on 8 A100
PUBLISHED_MFU = {"Korthikanti et al. 2023, GPT-3 175B": 0.514,
                 "Korthikanti et al. 2023, 530B": 0.560,
                 "Korthikanti et al. 2023, 1T": 0.563}


def step(system, model, row, gb, seq, **over):
    """:func:`jaxmodel.train_step` of a search row, with execution options overridden."""
    par = jm.Parallelism(**{k: row[k] for k in PLAN})
    opts = {k: float(row[k]) for k in OPTS}
    opts.update(over)
    return jm.train_step(system, model, par, gb, seq, **opts)


def explain(system, model, row, gb, seq, title):
    """Print the breakdown of one plan (module docstring)."""
    r = step(system, model, row, gb, seq)
    t = float(r.step_time_s)
    plan = ", ".join(f"{k}={row[k]}" if isinstance(row[k], str) else f"{k}={float(row[k]):g}"
                     for k in PLAN + OPTS)
    print(f"\n== {title}\n   {plan}")
    print(f"   step {t:.3f} s, MFU {float(r.mfu):.3f}, HFU {float(r.hfu):.3f}, memory "
          f"{float(r.memory_bytes) / 2**30:.1f} GiB, {float(r.microbatches):g} micro-batches")
    dev = system.device
    usable = float(dev.mem_capacity - dev.runtime_reserved_bytes) / 2**30
    print("   memory (GiB): " + ", ".join(f"{k} {float(v):.2f}" for k, v in
                                          jm.memory_breakdown(r).items())
          + f"; usable {usable:.2f} ({float(dev.mem_capacity) / 2**30:.0f} GiB less "
          f"{float(dev.runtime_reserved_bytes) / 2**30:.2f} GiB runtime reserve)")
    parts = {k: float(v) for k, v in r.breakdown.items()}
    for k, v in sorted(parts.items(), key=lambda kv: -kv[1]):
        if v > 0:
            print(f"   {k:>10s} {v:8.3f} s  {100 * v / t:5.1f} %")
    n = float(row.dp * row.tp * row.pp)
    flops_dev = float(r.flops_per_step) / n
    peak = float(dev.peak_matrix_flops)
    print(f"   model FLOPs per device {flops_dev:.3e} = {flops_dev / peak:.3f} s at peak; the "
          f"compute part runs at {flops_dev / parts['compute'] / peak:.3f} of peak (GEMM "
          f"shapes, vector kernels, launches, the slowdown under overlapped collectives)")
    families(system, model, row, seq, parts["compute"], t)
    if float(row["tp_overlap"]) > 0 and float(row["tp"]) > 1 and float(row["sp"]) > 0:
        split_hosts(system, model, row, gb, seq, float(r.microbatches), parts["tp_comm"])
    # what each overlap hides and costs: the same plan with the option off
    for opt, key in (("tp_overlap", "tp_comm"), ("dp_overlap", "dp_comm")):
        if float(row[opt]) > 0:
            off = step(system, model, row, gb, seq, **{opt: 0.0})
            serial = float(off.breakdown[key])
            print(f"   {key}: standalone {serial:.3f} s, exposed {parts[key]:.3f} s with "
                  f"{opt}=1 (step {float(off.step_time_s):.3f} s with {opt}=0: overlap "
                  f"saves {float(off.step_time_s) - t:.3f} s)")
    if float(row["tp_overlap"]) > 0 or float(row["dp_overlap"]) > 0:
        ser = step(system, model, row, gb, seq, tp_overlap=0.0, dp_overlap=0.0)
        ratio = float(ser.step_time_s) / t
        print(f"   all overlap off: step {float(ser.step_time_s):.3f} s, MFU "
              f"{float(ser.mfu):.3f}; serial/overlapped = {ratio:.3f} (measured on 4 GPUs, "
              f"Lee et al. 2025: mean {OVERLAP_MEASURED['serial/overlapped, mean']}, max "
              f"{OVERLAP_MEASURED['serial/overlapped, max']})")
    return r


def families(system, model, row, seq, compute_s, step_s):
    """Split the step's ``compute`` part (s) into the layer's op families in proportion to
    their per-layer times (the op list and device of :func:`jaxmodel.train_step`)."""
    dev = _train.sustained_device(system.device)
    par = jm.Parallelism(**{k: row[k] for k in PLAN})
    b = float(row.micro_batch)

    @jax.jit
    def rows(dev, model, par):
        g, v = _layer.layer_graph(dev, model, par, b, seq, seq, training=True)
        return _layer.evaluate(_layer.default_gemm, dev, g, v, backward=True)

    r = {k: float(f) + float(bw) for k, (f, bw) in rows(dev, model, par).items()}
    rd = _train.residual_dropout_times(dev, model, par, b, seq)
    rc = float(rd[0]) + float(rd[1])
    total = sum(r.values()) + rc
    print("   compute by op family (share of the compute part; per layer and micro-batch):")
    for name, keys in FAMILIES.items():
        x = sum(r.get(k, 0.0) for k in keys)
        print(f"   {name:>22s} {compute_s * x / total:7.3f} s  {100 * x / total:5.1f} % of "
              f"compute, {100 * compute_s * x / total / step_s:5.1f} % of step "
              f"({x * 1e3:.2f} ms)")
    print(f"   {'bias/dropout/residual':>22s} {compute_s * rc / total:7.3f} s  "
          f"{100 * rc / total:5.1f} % of compute ({rc * 1e3:.2f} ms)")


def split_hosts(system, model, row, gb, seq, m, tp_exposed):
    """Print the extra time of the TP overlap's split host GEMMs over the step (Transformer
    Engine's ring-exchange chunks of b·s/tp rows and pipelined chunks of b·s/4 rows, each at
    its own shape's rate: stage keys ``tp_split_*``), part of the exposed ``tp_comm``."""
    par = jm.Parallelism(**{k: row[k] for k in PLAN})
    st = _train.stage_times(system, model, par, gb, seq)
    per_layer = {k: float(st[k]) for k in _train_stage.SPLIT_KEYS}
    layers = float(model.n_layers) / float(row["pp"])
    total = m * layers * sum(per_layer.values())
    print(f"   split host GEMMs of the TP overlap (chunks at their own shapes): "
          f"{total:.3f} s over the step where every kind overlaps, of the exposed tp_comm "
          f"{tp_exposed:.3f} s (per layer and micro-batch: "
          + ", ".join(f"{k.removeprefix('tp_split_')} {v * 1e3:.2f} ms"
                      for k, v in per_layer.items()) + ")")


#: Megatron-LM 2021 → the best plan, one change at a time: (label, plan fields, options)
def ladder(best):
    """Rungs from Megatron-LM's 2021 execution (micro-batch 1, full recompute, no SP, no
    FlashAttention, serial fp32 gradient all-reduce, serial TP) of the best plan's degrees to
    the best plan; the distributed optimizer's sharded states come first so that the
    degrees fit in memory."""
    cur_p = dict(sp=0.0, micro_batch=1.0, recompute="full", flash_attention=0.0,
                 zero=float(best.zero))
    cur_o = dict(dp_overlap=0.0, grad_bytes=4.0, tp_overlap=0.0)
    steps = [("Megatron-LM 2021 execution (+ distributed optimizer, serial)", dict(cur_p),
              dict(cur_o))]
    for label, dp_, do_ in (
            ("+ sequence parallelism, selective recompute (Korthikanti et al. 2023)",
             dict(sp=float(best.sp), recompute="selective"), {}),
            ("+ best gradient precision (bf16: Megatron-LM's --grad-reduce-in-bf16)", {},
             dict(grad_bytes=float(best.grad_bytes))),
            ("+ best micro-batch", dict(micro_batch=float(best.micro_batch)), {}),
            ("+ FlashAttention-2, best recompute", dict(
                flash_attention=float(best.flash_attention), recompute=best.recompute), {}),
            ("+ overlapped DP (Megatron-core overlap_grad_reduce/param_gather)", {},
             dict(dp_overlap=float(best.dp_overlap))),
            ("+ TP overlap (Transformer Engine userbuffers)", {},
             dict(tp_overlap=float(best.tp_overlap)))):
        cur_p, cur_o = {**cur_p, **dp_}, {**cur_o, **do_}
        steps.append((label, dict(cur_p), dict(cur_o)))
    return steps


def walk(system, model, best, gb, seq):
    """Print the ladder (:func:`ladder`) for the best plan's degrees."""
    print("\n== from Megatron-LM 2021 to the best plan (same dp, tp, pp, interleave)")
    prev = None
    for label, p, o in ladder(best):
        row = best.copy()
        for k, v in {**p, **o}.items():
            row[k] = v
        r = step(system, model, row, gb, seq)
        ok = bool(r.feasible)
        t = float(r.step_time_s)
        gain = "" if prev is None or not ok else f"  x{prev / t:.3f}"
        why = "" if ok else f" (infeasible: {jm.numerics.REASONS[int(r.reason)]})"
        print(f"   {label:<72s} MFU {float(r.mfu):.3f}{why}{gain}")
        prev = t if ok else prev


#: one assumption of the best plan undone at a time: (label, plan fields, step options);
#: a callable value takes the best plan's value
UNDO = (("TP overlap off (serial TP collectives)", {}, dict(tp_overlap=0.0)),
        ("DP overlap off (reduce after the backward)", {}, dict(dp_overlap=0.0)),
        ("fp32 gradient reduction", {}, dict(grad_bytes=4.0)),
        ("selective recompute", dict(recompute="selective"), {}),
        ("no FlashAttention (unfused softmax)", dict(flash_attention=0.0), {}),
        ("micro-batch 1", dict(micro_batch=1.0), {}),
        ("half the virtual stages", dict(interleave=lambda b: max(float(b) / 2, 1.0)), {}),
        ("stage exchanges beside compute (overlap_p2p_comm)", {}, dict(pp_overlap=1.0)))


def carriers(system, model, best, gb, seq):
    """Print the best plan's MFU with one assumption undone at a time (:data:`UNDO`): how
    much of the MFU each carries, and whether the plan still fits."""
    print("\n== what carries the best plan: one assumption undone at a time")
    base = step(system, model, best, gb, seq)
    print(f"   {'best plan':<52s} MFU {float(base.mfu):.3f}, memory "
          f"{float(base.memory_bytes) / 2**30:.1f} GiB")
    for label, p, o in UNDO:
        row = best.copy()
        for k, v in p.items():
            row[k] = v(best[k]) if callable(v) else v
        for k, v in o.items():
            if k in OPTS:
                row[k] = v
        extra = {k: v for k, v in o.items() if k not in OPTS}
        r = step(system, model, row, gb, seq, **extra)
        why = "" if bool(r.feasible) else \
            f" (infeasible: {jm.numerics.REASONS[int(r.reason)]})"
        print(f"   {label:<52s} MFU {float(r.mfu):.3f}, memory "
              f"{float(r.memory_bytes) / 2**30:.1f} GiB{why}")


def fa2_check():
    """Best model MFU of GPT-3 1.3B / 2.7B with FlashAttention-2 on one DGX A100 (module
    docstring), over micro-batches 1-8, printed beside Dao 2023's measured maximum."""
    system = hw_db.system("dgx_a100", nodes=1)
    print("\n== compute cross-check: GPT-3 1.3B / 2.7B, FlashAttention-2, 8 A100 (data "
          f"parallel); measured: up to {FA2_MEASURED_MAX_TFLOPS:g} TFLOP/s per GPU "
          "(Dao 2023)")
    peak = float(system.device.peak_matrix_flops)
    for name, layers, h, heads in (("GPT-3 1.3B", 24, 2048, 16), ("GPT-3 2.7B", 32, 2560, 32)):
        model = jm.Model(n_layers=layers, d_model=h, n_heads=heads, n_kv_heads=heads,
                         head_dim=h / heads, d_ff=4 * h, vocab_size=50257.0,
                         activation="gelu", tied_embeddings=1.0, name=name)
        for seq, gb in ((2048.0, 256), (8192.0, 64)):
            par = jm.Parallelism(dp=8, tp=1, pp=1, micro_batch=jax.numpy.asarray(
                [1.0, 2.0, 4.0, 8.0]), recompute="none", zero=0, flash_attention="fa2")
            r = jm.train_step(system, model, par, gb, seq)
            mfu = max(float(x) for x, ok in zip(r.mfu, r.feasible) if ok)
            print(f"   {name} at {seq:5.0f} tokens: model MFU {mfu:.3f} = "
                  f"{mfu * peak / 1e12:.0f} TFLOP/s per GPU")


#: flash-attention's own end-to-end runs (Dao-AILab/flash-attention ``training/README.md``,
#: "Training speed": one node of 8 A100 80GB SXM4 (400 W) with NVLink, bf16, FlashAttention
#: 1.x, batch 1M tokens = 512 sequences of 2,048): (name, layers, hidden, heads, tokens/s
#: of the node); GPT3-2.7B with head dimension 128
FA1_MEASURED = (("GPT3-1.3B", 24, 2048, 16, 169e3), ("GPT3-2.7B", 32, 2560, 20, 85e3))


def fa1_check():
    """The model's best tokens/s of flash-attention's GPT3-1.3B / 2.7B runs on 8 A100
    (:data:`FA1_MEASURED`; FlashAttention-1, data parallel, no recomputation, micro-batches
    1-16) beside the measured ones: an end-to-end check of the compute part on A100."""
    system = hw_db.system("dgx_a100", nodes=1)
    print("\n== compute cross-check: flash-attention's GPT-3 runs, FlashAttention-1, 8 A100, "
          "batch 512 x 2,048 (training/README.md)")
    for name, layers, h, heads, measured in FA1_MEASURED:
        model = jm.Model(n_layers=layers, d_model=h, n_heads=heads, n_kv_heads=heads,
                         head_dim=h / heads, d_ff=4 * h, vocab_size=50257.0,
                         activation="gelu", tied_embeddings=1.0, name=name)
        par = jm.Parallelism(dp=8, tp=1, pp=1, micro_batch=jax.numpy.asarray(
            [1.0, 2.0, 4.0, 8.0, 16.0]), recompute="none", zero=0, flash_attention="fa1")
        r = jm.train_step(system, model, par, 512, 2048.0)
        tok = max(float(x) for x, ok in zip(r.tokens_per_s, r.feasible) if ok)
        print(f"   {name}: model {tok / 1e3:.0f}k tokens/s, measured {measured / 1e3:.0f}k "
              f"({100 * (tok / measured - 1):+.1f} %)")


def main(small=False):
    nodes, n, gb = (16, 128, 128) if small else (192, 1536, 1536)
    seq = 2048.0
    system = hw_db.system("dgx_a100", nodes=nodes)
    model = hw_db.model("gpt3-175b")
    t0, c0 = time.perf_counter(), time.process_time()
    df = jm.search_parallelism(system, model, n, gb, seq, progress=False,
                               step_options={"dp_overlap": [0.0, 1.0],
                                             "grad_bytes": [2.0, 4.0],
                                             "tp_overlap": [0.0, 1.0]})
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"GPT-3 175B on {n} A100, batch {gb}, seq {seq:g}: {df.attrs['n_evaluated']:,} "
          f"plans, {df.attrs['n_feasible']:,} feasible; search {wall:.0f} s wall, {cpu:.0f} s "
          f"CPU (all threads), load {os.getloadavg()[0]:.1f}")
    OUT.mkdir(parents=True, exist_ok=True)
    df.head(50).to_csv(OUT / "search_gpt3.csv", index=False)
    cols = [c for c in PLAN + OPTS + ("step_time_s", "mfu", "memory_bytes") if c in df]
    pd.set_option("display.width", 250)
    print(df[cols].head(10).to_string(index=False))
    explain(system, model, df.iloc[0], gb, seq, "best plan")
    walk(system, model, df.iloc[0], gb, seq)
    carriers(system, model, df.iloc[0], gb, seq)
    no_tp = df[df.tp_overlap == 0]
    if len(no_tp):
        explain(system, model, no_tp.iloc[0], gb, seq, "best plan without TP overlap")
    no_z3 = df[df.zero < 2.5]
    if len(no_z3) and float(df.iloc[0].zero) > 2.5:
        explain(system, model, no_z3.iloc[0], gb, seq, "best plan without ZeRO-3")
    meg = df[(df.tp == 8) & (df.pp == 12)]
    if len(meg):
        explain(system, model, meg.iloc[0], gb, seq, "best plan with Megatron-LM's TP 8 x PP 12")
    fa2_check()
    fa1_check()
    print("\npublished A100 MFU for comparison: "
          + "; ".join(f"{k} {v:.3f}" for k, v in PUBLISHED_MFU.items()))
    return df


if __name__ == "__main__":
    main(small="--small" in sys.argv)
