"""DeepSeek-V3 (671 B total, 37 B active; DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024):
its training cluster and a one-node deployment, with breakdowns a reviewer can follow.

1. **Training** (report §3.1–3.3): 2,048 H800 (``hw_db.system("dgx_h800", nodes=256)``:
   NVLink 400 GB/s and 8×400 Gb/s InfiniBand per node), pipeline parallelism 16, expert
   parallelism 64 spanning 8 nodes, ZeRO-1 data parallelism (no tensor parallelism), FP8
   mixed precision (Transformer Engine recipe of :mod:`jaxmodel.precisions`), sequences of
   4,096 tokens, batch 15,360 (the batch after the ramp-up, §4.2). 61 layers on 16 stages are
   uneven (:func:`jaxmodel.parallel.pipeline.stage_layers`: 3 | 13 × 4, 3 | 3).
   Reported: 1,543 tokens/s per GPU (Table 1, 2.664 M GPU hours for 14.8 T tokens).
   Three plans: Megatron's 1F1B with ``selective`` and with ``full`` recomputation (the
   nearest Megatron modes, PTD-P rank order), and DeepSeek's own recipe: ``schedule=
   "dualpipe"`` (§3.2.1: paired forward/backward chunks hiding the all-to-all on 112 of 132
   SMs, bubble ``(p/2 − 1)(F&B + B − 3W)``, two stage copies per rank, PP+1 micro-batches
   in flight), ``recompute="norm_upproj"`` (§3.2.3: RMSNorm and MLA up-projections
   recomputed; §3.3.3: FP8/E5M6-cached activations), Megatron-core's rank order
   ``"tp-cp-ep-dp-pp"`` (EP 64 on 8 nodes) with the model's node-limited routing
   (``topk_group`` 4: IB once per destination node, NVLink forwarding, FP8 dispatch).
   Printed: the plan's stage layout, step time, MFU, tokens/s per GPU against the reported
   1,543, the per-step breakdown (compute / recompute / communication per kind / bubble /
   embedding) and the memory of the most loaded stage (weights, gradients, optimizer
   states, activations).
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


#: The three training plans: (name, schedule, recompute, rank order).
PLANS = (("1f1b_selective", "1f1b", "selective", "tp-cp-pp-dp"),
         ("1f1b_full", "1f1b", "full", "tp-cp-pp-dp"),
         ("deepseek_recipe", "dualpipe", "norm_upproj", "tp-cp-ep-dp-pp"))


def training(schedule: str, recompute: str, order: str = "tp-cp-pp-dp"):
    model = hw_db.model("deepseek-v3")
    system = hw_db.system("dgx_h800", nodes=TRAIN["nodes"])
    dp = system.n_devices // TRAIN["pp"]
    par = jm.Parallelism(dp=dp, tp=1, pp=TRAIN["pp"], ep=TRAIN["ep"], zero=TRAIN["zero"],
                         micro_batch=1, schedule=schedule, recompute=recompute,
                         flash_attention=True, order=order)
    r = jm.train_step(system, model, par, TRAIN["global_batch"], TRAIN["seq_len"],
                      precision=TRAIN["precision"], dropout=0.0)
    return model, system, par, r


#: DeepSeek-V3 Technical Report, Table 1: 2,664 K H800 GPU hours of pre-training for 14.8 T
#: tokens (§1): 14.8e12 / (2.664e6 · 3600 s) = 1,543 tokens/s per GPU, 3.16 M tokens/s on
#: the 2,048 GPUs of the cluster (a step of 15,360 × 4,096 tokens in 19.9 s).
REPORTED_TOKENS_PER_S_PER_GPU = 14.8e12 / (2.664e6 * 3600.0)
REPORTED_TOKENS_PER_S = REPORTED_TOKENS_PER_S_PER_GPU * 2048

def print_training(model, system, par, r):
    first, most, last = (int(x) for x in pl.stage_layers(model.n_layers, par.pp))
    L, p = int(model.n_layers), int(par.pp)
    n_most = (L - first - last) - (p - 2) * (most - 1)      # middle stages holding ⌈L/p⌉
    print(f"DeepSeek-V3 training on {int(system.n_devices)} H800 ({TRAIN['precision']}): "
          f"dp {int(par.dp)} (ZeRO-{int(par.zero)}) × pp {p} × ep {int(par.ep)}, "
          f"recompute code {int(par.recompute)}, batch {TRAIN['global_batch']} × "
          f"{TRAIN['seq_len']} tokens, {float(r.microbatches):.0f} micro-batches per replica, "
          f"schedule code {int(par.schedule)}, rank order code {int(par.order)}")
    print(f"  stages: first {first} layers + embedding | {n_most} × {most}, "
          f"{p - 2 - n_most} × {most - 1} | last {last} layers + LM head + MTP module "
          f"(61 layers; Megatron --decoder-first/last-pipeline-num-layers {first}/{last})")
    print(f"  feasible {bool(r.feasible)} ({REASONS[int(r.reason)]}); step "
          f"{float(r.step_time_s):.2f} s, MFU {float(r.mfu):.3f}, "
          f"{float(r.tokens_per_s) / 1e6:.2f} M tokens/s")
    step = float(r.step_time_s)
    per_gpu = float(r.tokens_per_s) / float(system.n_devices)
    if bool(r.feasible):
        print(f"  {per_gpu:.0f} tokens/s per GPU vs reported "
              f"{REPORTED_TOKENS_PER_S_PER_GPU:.0f} (2.664 M GPU hours for 14.8 T tokens): "
              f"{per_gpu / REPORTED_TOKENS_PER_S_PER_GPU - 1:+.1%}")
    if bool(r.feasible):          # an infeasible plan's parts are all +inf: nothing to share
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
    for name, schedule, rc, order in PLANS:
        model, system, par, r = training(schedule, rc, order)
        print_training(model, system, par, r)
        print()
        rows.append({"case": f"train_{name}", "feasible": bool(r.feasible),
                     "tokens_per_s_per_gpu": float(r.tokens_per_s) / float(system.n_devices),
                     "reported_tokens_per_s_per_gpu": REPORTED_TOKENS_PER_S_PER_GPU,
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
