"""DeepSeek-V3 (671 B total, 37 B active; DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024):
its training cluster and a one-node deployment, with breakdowns a reviewer can follow.

1. **Training** (report §3.1–3.3): 2,048 H800 (``hw_db.system("dgx_h800", nodes=256)``:
   NVLink 400 GB/s and 8×400 Gb/s InfiniBand per node), pipeline parallelism 16, expert
   parallelism 64 spanning 8 nodes, ZeRO-1 data parallelism (no tensor parallelism), FP8
   mixed precision (Transformer Engine recipe of :mod:`jaxmodel.precisions`), sequences of
   4,096 tokens, batch 15,360 (the batch after the ramp-up, §4.2). 61 layers on 16 stages are
   uneven (:func:`jaxmodel.parallel.pipeline.stage_layers`: 3 | 13 × 4, 3 | 3). The
   schedule is 1F1B: the report's DualPipe (§3.2.1) overlaps the all-to-all with compute and
   shrinks the bubble — not a schedule of the step yet, so the step here is an upper bound of
   DeepSeek's; :func:`dualpipe_estimate` prints what the full-recompute step's compute gives
   with DualPipe's overlap and bubble and node-limited all-to-all (an estimate beside the
   model's step). Reported: 1,543 tokens/s per GPU (Table 1, 2.664 M GPU hours for 14.8 T
   tokens).
   Activation recomputation: the report recomputes RMSNorm and the MLA up-projections
   (§3.2.3); ``selective`` is the nearest Megatron mode, ``full`` the fallback when it does
   not fit. Printed: the plan's stage layout, step time, MFU, the per-step breakdown
   (compute / recompute / communication per kind / bubble / embedding) and the memory of
   the most loaded stage (weights, gradients, optimizer states, activations).
2. **Serving** on one 8×H200 node (``dgx_h200``) with the published FP8 weights
   (``quantization_config``: e4m3 blocks of 128×128) and an FP8 latent KV cache, TP 8:
   time to first token, time per output token, memory, and the KV-cache bytes per token of
   MLA's latent ``(d_c + d_h^R)·L`` (DeepSeek-V2 §2.1.2) beside what full multi-head
   attention with the same heads would cache, ``2·h·d_h·L``-style (K of ``d_h + d_h^R`` and
   V of ``d_v`` per head).

Writes ``experiments/out/deepseek_v3.csv``. Run: ``.venv/bin/python experiments/deepseek_v3.py``
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

import jaxmodel as jm
import hw_db
from jaxmodel.numerics import REASONS
from jaxmodel.parallel import pipeline as pl
from jaxmodel.workload.memory import kv_cache_bytes

OUT = Path(__file__).resolve().parent / "out"
GiB = 2.0 ** 30

TRAIN = dict(nodes=256, pp=16, ep=64, zero=1, global_batch=15360, seq_len=4096,
             precision="fp8")
SERVE = dict(batch=32, prompt_len=4096, gen_len=1024, precision="fp8", tp=8)


def training(recompute: str):
    model = hw_db.model("deepseek-v3")
    system = hw_db.system("dgx_h800", nodes=TRAIN["nodes"])
    dp = system.n_devices // TRAIN["pp"]
    par = jm.Parallelism(dp=dp, tp=1, pp=TRAIN["pp"], ep=TRAIN["ep"], zero=TRAIN["zero"],
                         micro_batch=1, schedule="1f1b", recompute=recompute,
                         flash_attention=True)
    r = jm.train_step(system, model, par, TRAIN["global_batch"], TRAIN["seq_len"],
                      precision=TRAIN["precision"], dropout=0.0)
    return model, system, par, r


#: DeepSeek-V3 Technical Report, Table 1: 2,664 K H800 GPU hours of pre-training for 14.8 T
#: tokens (§1): 14.8e12 / (2.664e6 · 3600 s) = 1,543 tokens/s per GPU, 3.16 M tokens/s on
#: the 2,048 GPUs of the cluster (a step of 15,360 × 4,096 tokens in 19.9 s).
REPORTED_TOKENS_PER_S_PER_GPU = 14.8e12 / (2.664e6 * 3600.0)
REPORTED_TOKENS_PER_S = REPORTED_TOKENS_PER_S_PER_GPU * 2048

#: DualPipe's communication SMs (DeepSeek-V3 §3.2.2: 20 of the H800's 132 SMs).
SM_COMM, SM_TOTAL = 20.0, 132.0


def dualpipe_estimate(model, system, par, r):
    """An estimate outside the model's step (DualPipe is not a schedule code of
    :func:`jaxmodel.train_step` yet): the full-recompute step's compute of the slowest
    stage with DeepSeek-V3's own recipe of §3.2 — no full recomputation (its recomputation of
    RMSNorm and the MLA up-projections is left out: an optimistic bound), the all-to-all of
    node-limited routing with NVLink forwarding (:func:`jaxmodel.workload.moe.
    node_limited_alltoall`: at most 4 of the EP group's 8 nodes per token, FP8 dispatch, BF16
    combine forward, BF16 both backward) and the pipeline transfers hidden behind the paired
    chunks on 112 of 132 SMs (:func:`jaxmodel.workload.moe.dualpipe_overlap`), the bubble
    of :func:`jaxmodel.parallel.pipeline.dualpipe_bubble` with ``F = B = W`` a third of a
    micro-batch's stage compute. Memory is not re-evaluated. Returns tokens/s per GPU and
    the parts (s)."""
    from jaxmodel.workload import moe as _moe
    m = float(r.microbatches)
    _, most, _ = (float(x) for x in pl.stage_layers(model.n_layers, par.pp))
    ep_nodes = float(par.ep) / float(system.levels[0].size)
    T, d, k = TRAIN["seq_len"] * float(par.micro_batch), float(model.d_model), 8.0
    a2a = (float(_moe.node_limited_alltoall(system, T, d, k, 4.0, ep_nodes, 1.0, 2.0))
           + float(_moe.node_limited_alltoall(system, T, d, k, 4.0, ep_nodes, 2.0, 2.0)))
    compute = float(r.breakdown["compute"])
    comm = m * most * a2a + float(r.breakdown["pp_comm"])
    slowed, exposed = (float(x) for x in _moe.dualpipe_overlap(compute, comm, SM_TOTAL,
                                                                SM_COMM))
    c = slowed / m
    fwd = compute / m / 3.0
    bubble = float(pl.dualpipe_bubble(float(par.pp), c, fwd, fwd))
    rest = sum(float(r.breakdown[x]) for x in ("dp_comm", "optimizer", "embedding"))
    step = slowed + exposed + bubble + rest
    parts = {"compute_on_112_SMs": slowed, "all_to_all+pp": comm, "exposed_comm": exposed,
             "bubble": bubble, "dp+optimizer+embedding": rest, "step": step}
    return TRAIN["global_batch"] * TRAIN["seq_len"] / step / float(system.n_devices), parts


def print_training(model, system, par, r):
    first, most, last = (int(x) for x in pl.stage_layers(model.n_layers, par.pp))
    L, p = int(model.n_layers), int(par.pp)
    n_most = (L - first - last) - (p - 2) * (most - 1)      # middle stages holding ⌈L/p⌉
    print(f"DeepSeek-V3 training on {int(system.n_devices)} H800 ({TRAIN['precision']}): "
          f"dp {int(par.dp)} (ZeRO-{int(par.zero)}) × pp {p} × ep {int(par.ep)}, "
          f"recompute code {int(par.recompute)}, batch {TRAIN['global_batch']} × "
          f"{TRAIN['seq_len']} tokens, {float(r.microbatches):.0f} micro-batches per replica")
    print(f"  stages: first {first} layers + embedding | {n_most} × {most}, "
          f"{p - 2 - n_most} × {most - 1} | last {last} layers + LM head + MTP module "
          f"(61 layers; Megatron --decoder-first/last-pipeline-num-layers {first}/{last})")
    print(f"  feasible {bool(r.feasible)} ({REASONS[int(r.reason)]}); step "
          f"{float(r.step_time_s):.2f} s, MFU {float(r.mfu):.3f}, "
          f"{float(r.tokens_per_s) / 1e6:.2f} M tokens/s")
    step = float(r.step_time_s)
    if bool(r.feasible):
        hidden = float(r.breakdown["ep_comm"]) + float(r.breakdown["recompute"])
        print(f"  reported: {REPORTED_TOKENS_PER_S / 1e6:.2f} M tokens/s (2.664 M GPU hours "
              f"for 14.8 T tokens); without the exposed all-to-all (DualPipe overlaps it) "
              f"and the recomputation (DeepSeek recomputes only norms and up-projections) "
              f"this step would give {TRAIN['global_batch'] * TRAIN['seq_len'] / (step - hidden) / 1e6:.2f}"
              f" M tokens/s")
        per_gpu, parts = dualpipe_estimate(model, system, par, r)
        print(f"  DualPipe + node-limited all-to-all estimate (outside the step, memory not "
              f"re-evaluated): {per_gpu:.0f} tokens/s per GPU vs reported "
              f"{REPORTED_TOKENS_PER_S_PER_GPU:.0f} ({per_gpu / REPORTED_TOKENS_PER_S_PER_GPU - 1:+.0%}); "
              + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    print("  step breakdown (slowest stage; s and share):")
    for k, v in r.breakdown.items():
        print(f"    {k:10s} {float(v):8.3f}  {float(v) / step:6.1%}")
    print("  memory of the most loaded stage (GiB per GPU, capacity "
          f"{float(system.device.mem_capacity) / GiB:.0f}):")
    for k, v in r.memory.items():
        print(f"    {k:12s} {float(v) / GiB:7.2f}")


def serving(ep=1):
    """``ep > 1``: the experts over the TP ranks (attention TP 8 × EP 8, expert TP 1), the
    layout vLLM ``--enable-expert-parallel``, SGLang ``--ep-size`` and TensorRT-LLM
    ``moe_expert_parallel_size`` serve."""
    model = hw_db.model("deepseek-v3")
    system = hw_db.system("dgx_h200")
    par = jm.Parallelism(tp=SERVE["tp"], ep=ep, flash_attention=True)
    r = jm.inference(system, model, par, SERVE["batch"], SERVE["prompt_len"],
                     SERVE["gen_len"], precision=SERVE["precision"])
    return model, system, par, r


def kv_per_token(model, par, kv_bytes):
    """Bytes per cached token on one device, MLA's latent vs multi-head K and V."""
    latent = float(kv_cache_bytes(model, par, 1.0, 1.0, kv_bytes))
    h = float(model.n_heads) / float(par.tp)
    mha = (h * (float(model.qk_nope_head_dim) + float(model.qk_rope_head_dim)
                + float(model.v_head_dim)) * float(model.n_layers) * kv_bytes)
    return latent, mha


def print_serving(model, system, par, r):
    kvb = 1.0                                          # FP8 KV cache of the "fp8" preset
    latent, mha = kv_per_token(model, par, kvb)
    tp = float(par.tp)
    print(f"DeepSeek-V3 serving on one 8×H200 node ({SERVE['precision']} weights and KV "
          f"cache, tp {int(tp)}): batch {SERVE['batch']}, prompt {SERVE['prompt_len']}, "
          f"{SERVE['gen_len']} new tokens")
    print(f"  feasible {bool(r.feasible)} ({REASONS[int(r.reason)]}); TTFT "
          f"{float(r.ttft_s) * 1e3:.0f} ms, TPOT {float(r.tpot_s) * 1e3:.1f} ms, "
          f"{float(r.tokens_per_s):.0f} tokens/s")
    for k in ("weights", "kv_cache", "activations", "total"):
        print(f"    {k:12s} {float(r.breakdown['memory.' + k]) / GiB:7.2f} GiB per GPU "
              f"(capacity {float(system.device.mem_capacity) / GiB:.0f})")
    n_l = float(model.n_layers)
    for ph in ("prefill", "decode"):
        rows = {k.split(".", 1)[1]: float(v) for k, v in r.breakdown.items()
                if k.startswith(ph + ".")}
        top = sorted(rows.items(), key=lambda kv: -kv[1])[:4]
        print(f"  {ph}: layers {float(r.breakdown[ph + '_layers']) * 1e3:.1f} ms "
              f"(61 × {float(r.breakdown[ph + '_layers']) / n_l * 1e3:.2f} ms); largest rows "
              "per layer: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in top))
    print(f"  KV cache per token (all 61 layers): MLA latent {latent / 1e3:.1f} kB (every "
          f"GPU of the TP group holds a copy) vs multi-head K+V {mha * tp / 1e6:.2f} MB "
          f"({mha / 1e3:.0f} kB per GPU): {mha * tp / latent:.0f}× less per token, "
          f"{mha / latent:.1f}× less per GPU")
    return latent, mha


def main():
    OUT.mkdir(exist_ok=True)
    rows = []
    for rc in ("selective", "full"):
        model, system, par, r = training(rc)
        print_training(model, system, par, r)
        print()
        rows.append({"case": f"train_{rc}", "feasible": bool(r.feasible),
                     "reason": REASONS[int(r.reason)], "step_time_s": float(r.step_time_s),
                     "mfu": float(r.mfu), "memory_gib": float(r.memory_bytes) / GiB,
                     **{f"t_{k}": float(v) for k, v in r.breakdown.items()},
                     **{f"mem_{k}_gib": float(v) / GiB for k, v in r.memory.items()}})
    model, system, par, r = serving()
    latent, mha = print_serving(model, system, par, r)
    rows.append({"case": "serve_h200x8", "feasible": bool(r.feasible),
                 "reason": REASONS[int(r.reason)], "ttft_s": float(r.ttft_s),
                 "tpot_s": float(r.tpot_s), "memory_gib": float(r.memory_bytes) / GiB,
                 "kv_latent_bytes_per_token_gpu": latent, "kv_mha_bytes_per_token_gpu": mha})
    _, _, par_ep, r_ep = serving(ep=SERVE["tp"])
    print(f"  with the experts over the TP ranks (tp {int(par_ep.tp)} × ep {int(par_ep.ep)}): "
          f"feasible {bool(r_ep.feasible)} ({REASONS[int(r_ep.reason)]}); TTFT "
          f"{float(r_ep.ttft_s) * 1e3:.0f} ms, TPOT {float(r_ep.tpot_s) * 1e3:.1f} ms, "
          f"{float(r_ep.tokens_per_s):.0f} tokens/s, weights "
          f"{float(r_ep.breakdown['memory.weights']) / GiB:.2f} GiB per GPU")
    rows.append({"case": "serve_h200x8_ep8", "feasible": bool(r_ep.feasible),
                 "reason": REASONS[int(r_ep.reason)], "ttft_s": float(r_ep.ttft_s),
                 "tpot_s": float(r_ep.tpot_s), "memory_gib": float(r_ep.memory_bytes) / GiB})
    pd.DataFrame(rows).to_csv(OUT / "deepseek_v3.csv", index=False)
    return rows


if __name__ == "__main__":
    main()
