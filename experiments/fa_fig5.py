"""Guo et al. Fig. 5: FlashAttention speed-up vs batch size and GPU generation; attention vs MLP.

Setting (Guo et al. §V-A): GPT-2 XL (1.5B: 48 layers, hidden 1600, 25 heads of 64), context
2048, 16 GPUs joined by one NVLink-4 switch tier (the NVLink tier of ``hw_db`` ``dgx_h100``
grown to 16 devices, no InfiniBand), data parallelism 16, the global batch B swept from 16 to
2048 sequences; each point runs at its best micro-batch of {1, 2, 4, 8} sequences (≤ B/16)
and activation recomputation (none or Megatron's selective recomputation of the attention
core, which lets standard attention use larger micro-batches) that fits the memory. Three
parts:

1. **Speed-up vs B** on H100: tokens/s with FlashAttention-1 (Guo et al.'s model) and
   FlashAttention-2 over standard attention.
2. **GPU generations** at B = 2048: A100-80GB, H100, B200 (each with its own node's NVLink
   tier grown to 16 devices), same fp16 precision everywhere.
3. **Attention vs MLP** (per layer, forward + backward of a micro-batch of 8 sequences):
   attention = QKV projection + attention core + output projection, MLP = W1 + activation +
   W2, standard / FA-1 / FA-2, per GPU.

Plus the mechanism (the "attention time grows as O(N²) memory traffic without FA and
stays compute-bound with"): the attention core alone on an H100 for N = 512 … 16k — time, HBM
bytes, and the compute share ``(t_GEMM + t_pt) / t`` of FlashAttention (Guo et al., eq. 1).

No numeric target: Guo et al.'s Fig. 5 is a what-if study. Writes
``experiments/out/fa_fig5.csv`` and ``.png`` and prints the key numbers.

Run: ``.venv/bin/python experiments/fa_fig5.py``
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import jaxmodel as jm  # noqa: I001  (imported before hw_db)
import hw_db
from jaxmodel.ops.attention import AttentionKernel
from jaxmodel.workload import layer as wl

from common import OUT  # noqa: E402
SEQ = 2048.0
BATCHES = (16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)
GPUS = {"A100": "dgx_a100", "H100": "dgx_h100", "B200": "dgx_b200"}


def gpt2_xl():
    return dataclasses.replace(hw_db.model({"model_type": "gpt2", "n_layer": 48, "n_embd": 1600,
                                            "n_head": 25, "vocab_size": 50257,
                                            "activation_function": "gelu_new",
                                            "tie_word_embeddings": True}), name="custom")


def nvlink16(node: str):
    """The node's NVLink switch tier grown to 16 devices (one NVLink domain)."""
    base = hw_db.system(node)
    return dataclasses.replace(base, levels=(dataclasses.replace(base.levels[0], size=16.0),))


MICRO = (1.0, 2.0, 4.0, 8.0)


def speedup_vs_batch() -> pd.DataFrame:
    rows = []
    for gpu, node in GPUS.items():
        system = nvlink16(node)
        batches = BATCHES if gpu == "H100" else (2048.0,)
        grid = [(bb, fa, mb, rc) for bb in batches for fa in (0.0, 1.0, 2.0) for mb in MICRO
                for rc in (0.0, 1.0) if mb <= bb / 16.0]
        col = lambda i: jnp.asarray([g[i] for g in grid])  # noqa: E731
        res = jm.train_step(system, gpt2_xl(),
                            jm.Parallelism(dp=16.0, flash_attention=col(1), micro_batch=col(2),
                                           recompute=col(3)),
                            col(0), SEQ)
        d = pd.DataFrame({"batch": np.asarray(col(0)), "fa": np.asarray(col(1)),
                          "mb": np.asarray(col(2)), "rc": np.asarray(col(3)),
                          "ok": np.asarray(res.feasible), "tps": np.asarray(res.tokens_per_s)})
        d = d[d.ok].loc[d[d.ok].groupby(["batch", "fa"]).tps.idxmax()]
        for bb in batches:
            t = d[d.batch == bb].set_index("fa")
            rows.append({"gpu": gpu, "batch": bb, "tokens_per_s_std": t.tps[0.0],
                         "tokens_per_s_fa1": t.tps[1.0], "tokens_per_s_fa2": t.tps[2.0],
                         "mb_std": t.mb[0.0], "mb_fa1": t.mb[1.0], "mb_fa2": t.mb[2.0],
                         "recompute_std": t.rc[0.0],
                         "speedup": t.tps[1.0] / t.tps[0.0],
                         "speedup_fa2": t.tps[2.0] / t.tps[0.0]})
    return pd.DataFrame(rows)


def attention_vs_mlp() -> pd.DataFrame:
    rows = []
    model = gpt2_xl()
    for gpu, node in GPUS.items():
        dev = hw_db.system(node).device
        for fa in (0.0, 1.0, 2.0):
            g, v = wl.layer_graph(dev, model, jm.Parallelism(dp=16.0, flash_attention=fa),
                                  8.0, SEQ, SEQ, training=True)
            r = {k: float(a) + float(b) for k, (a, b) in
                 wl.evaluate(wl.default_gemm, dev, g, v, backward=True).items()}
            attn = r["qkv"] + r["qk"] + r["softmax"] + r["av"] + r["wo"]
            mlp = r["w1"] + r["act"] + r["w2"]
            rows.append({"gpu": gpu, "flash_attention": fa, "attention_s": attn, "mlp_s": mlp,
                         "attention_over_mlp": attn / mlp})
    return pd.DataFrame(rows)


def attention_core_scaling() -> pd.DataFrame:
    dev = hw_db.device("h100_sxm")
    ns = jnp.asarray([512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0])
    fa = jm.flash_attention_latency(dev, 1.0, 25.0, ns, ns, 64.0,
                                    kernel=AttentionKernel(version=1.0))
    sd = jm.standard_attention_latency(dev, 1.0, 25.0, ns, ns, 64.0)
    comp = (fa["gemm"] + fa["pointwise"] + fa["gemm_bwd"] + fa["pointwise_bwd"])
    return pd.DataFrame({
        "n": np.asarray(ns), "std_s": np.asarray(sd["total"]), "fa_s": np.asarray(fa["total"]),
        "std_hbm_bytes": np.asarray(sd["hbm_bytes"]), "fa_hbm_bytes": np.asarray(fa["hbm_bytes"]),
        "fa_compute_share": np.asarray(comp / fa["total"]),
        "std_mem_bound_ratio": np.asarray(sd["hbm_bytes"] / dev.mem_bw
                                          / (sd["flops"] / dev.peak_matrix_flops))})


def plot(sp, am, core, path):
    from jaxmodel.plots import figure, save
    fig = figure(figsize=(10, 7))
    axes = fig.subplots(2, 2)
    h = sp[sp.gpu == "H100"]
    axes[0, 0].plot(h.batch, h.speedup, "o-", label="FA-1")
    axes[0, 0].plot(h.batch, h.speedup_fa2, "s--", label="FA-2")
    axes[0, 0].legend()
    axes[0, 0].set_xscale("log", base=2)
    axes[0, 0].set_xlabel("global batch B (sequences of 2048)")
    axes[0, 0].set_ylabel("FA speed-up (tokens/s)")
    axes[0, 0].set_title("GPT-2 XL, 16×H100 (NVLink4)")
    g = sp[sp.batch == 2048.0]
    xg = np.arange(len(g))
    axes[0, 1].bar(xg - 0.2, g.speedup, 0.4, color="C1", label="FA-1")
    axes[0, 1].bar(xg + 0.2, g.speedup_fa2, 0.4, color="C2", label="FA-2")
    axes[0, 1].set_xticks(xg, list(g.gpu))
    axes[0, 1].legend()
    axes[0, 1].set_title("speed-up at B = 2048")
    x = np.arange(len(GPUS))
    for i, fa in enumerate((0.0, 1.0, 2.0)):
        d = am[am.flash_attention == fa]
        axes[1, 0].bar(x + (i - 1) * 0.27, d.attention_over_mlp, 0.27,
                       label=("standard", "FA-1", "FA-2")[i])
    axes[1, 0].set_xticks(x, list(GPUS))
    axes[1, 0].axhline(1.0, color="grey", lw=0.8)
    axes[1, 0].set_ylabel("attention / MLP time")
    axes[1, 0].legend()
    axes[1, 1].loglog(core.n, core.std_hbm_bytes, "o-", label="standard: HBM bytes")
    axes[1, 1].loglog(core.n, core.fa_hbm_bytes, "s-", label="FA-1: HBM bytes")
    axes[1, 1].set_xlabel("context N")
    axes[1, 1].set_ylabel("bytes (fwd, 25 heads)")
    axes[1, 1].legend()
    save(fig, path)


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    sp = speedup_vs_batch()
    am = attention_vs_mlp()
    core = attention_core_scaling()
    pd.concat([sp.assign(part="speedup"), am.assign(part="attention_vs_mlp"),
               core.assign(part="attention_core")], ignore_index=True).to_csv(
        OUT / "fa_fig5.csv", index=False)
    plot(sp, am, core, OUT / "fa_fig5.png")
    fmt = "%.3f"
    print("FA speed-up vs global batch (GPT-2 XL, 2k context, 16 GPUs, DP 16)")
    print(sp.to_string(index=False, float_format=fmt))
    print("\nattention (QKV + core + Wo) vs MLP per layer, fwd + bwd of 8 sequences")
    print(am.to_string(index=False, float_format=fmt))
    print("\nattention core alone on H100 (b = 1, 25 heads, d = 64)")
    print(core.to_string(index=False, float_format="%.3g"))
    h = sp[sp.gpu == "H100"].speedup.to_numpy()
    h2 = sp[sp.gpu == "H100"].speedup_fa2.to_numpy()
    print(f"\nspeed-up monotonic in B: FA-1 {bool(np.all(np.diff(h) >= -1e-9))}, "
          f"FA-2 {bool(np.all(np.diff(h2) >= -1e-9))}; B=2048: " + ", ".join(
              f"{r.gpu} {r.speedup:.2f}x (FA-2 {r.speedup_fa2:.2f}x)"
              for r in sp[sp.batch == 2048.0].itertuples()))


if __name__ == "__main__":
    main()
