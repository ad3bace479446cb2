"""NeMo 24.07 (DGX-H100, FP8) and MLPerf v3.1/v4.0 GPT-3 175B: predicted vs measured.

Data: ``shared/anchors/training/nemo_2407_h100_fp8.csv`` (NeMo performance summary:
pre-training, SFT and LoRA rows with their TP/PP/CP/VP, micro-batch, global batch and
sequence length) and ``mlperf_v31_v40_gpt3_175b_h100.csv`` (MLLOG run times and the
published TP/PP/VP/micro-batch of each submission).

Every pre-training row runs ``jm.train_step(..., recipe="nemo-24.07")`` (:mod:`jaxmodel.
recipes`: FP8 hybrid, Transformer Engine TP overlap, distributed Adam = ZeRO-1 with
overlapped bf16 gradient sync and 16-bit master remainders, no recomputation as the 24.07
configs set, sequence parallelism, TE fused attention) on its published plan. Settings
assumed where the tables are silent, printed per row:

- dropout: the NeMo-Framework-Launcher configs set ``hidden_dropout`` 0.1 for GPT-3 and 0.0
  for Llama and Nemotron (``dropout="megatron"`` / ``"none"``); MLPerf GPT-3 runs without
  dropout (its ``megatron_gpt_config.yaml``);
- schedule: interleaved 1F1B where VP > 1, 1F1B where PP > 1;
- SFT: full-parameter training of the packed 4096-token sequences under
  ``recipe="nemo-24.07-sft"`` (NeMo-Framework-Launcher 24.07 ``examples/peft/llama/h100/*.sh``:
  ``fp8_params``, bf16 distributed-Adam states, no recomputation), with the scripts' VP (20
  for 70B, 10 for 13B; blank in the table, :data:`SFT_VP`); LoRA: ``jm.lora(32)`` — NeMo's
  ``peft.lora_tuning.adapter_dim`` default;
- Nemotron-4 340B: its 24.07 launcher config (``nemotron/nemotron_340b.yaml``) sets
  ``activations_checkpoint_granularity: selective`` and ``optim.dtype: bf16`` for
  ``distributed_fused_adam``: with the optimizer dtype equal to the bf16 model dtype NeMo's
  ``setup_optimization`` sets ``store_params=False`` (the bf16 parameters are the master: 0
  B) and Adam's two moments are bf16 (4 B per parameter instead of 8);
- MLPerf rows: the submissions' own configuration, ``recipe="mlperf-gpt3"``, and the
  benchmark's evaluations inside the timed run, exactly as ``experiments/validate_mlperf.py``
  predicts them; rows with no VP in the table: VP 12, the v3.0 NVIDIA configuration.

Nothing is fitted here: the MAPE is out-of-sample (the H100 constants come from
microbenchmarks, ``experiments/calibrate.py``). Writes ``experiments/out/validate_recipes.csv``
and ``.png``.

Usage: ``python experiments/validate_recipes.py [--quick]`` (``--quick``: pre-training rows
only).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jaxmodel as jm  # noqa: E402,I001
import hw_db  # noqa: E402

sys.path.insert(0, str(ROOT / "experiments"))
from common import OUT, anchor_dir  # noqa: E402
import validate_mlperf as v30  # noqa: E402

ANCHORS = anchor_dir("training")
MODELS = {"GPT3-5B": "gpt3-5b", "GPT3-20B": "gpt3-20b", "GPT3-175B": "gpt3-175b",
          "LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b",
          "LLAMA3-8B": "llama3-8b", "LLAMA3-70B": "llama3-70b", "Nemotron-8B": "nemotron3-8b",
          "Nemotron-22B": "nemotron3-22b", "Nemotron-340B": "nemotron4-340b"}


#: VP of the SFT rows, blank in the table: NeMo-Framework-Launcher 24.07
#: ``examples/peft/llama/h100/70b_2node.sh`` (16 GPUs, TP 4, PP 4, micro-batch 1, global batch
#: 32: the table's plan) and ``13b_1node.sh`` (8 GPUs, TP 1, PP 4) set
#: ``virtual_pipeline_model_parallel_size`` 20 and 10; ``7b_1node.sh`` has no pipeline
SFT_VP = {"LLAMA2-70B": 20, "LLAMA2-13B": 10}


def _int(x, default=1):
    return default if pd.isna(x) or x == "" else int(x)


def rows(quick=False):
    """(label, task, model name, gpus, gb, mb, seq, tp, pp, cp, vp, measured tok/s/GPU,
    assumptions) for every anchor row."""
    out = []
    nemo = pd.read_csv(ANCHORS / "nemo_2407_h100_fp8.csv")
    for _, r in nemo.iterrows():
        if quick and r["task"] != "pretrain":
            continue
        name = MODELS[r["model"]]
        assumed = []
        vp = _int(r["vp"])
        if _int(r["cp"], 0) == 0:
            vp = SFT_VP.get(r["model"], 1) if r["task"] == "SFT" else 1
            assumed.append(f"cp=1,vp={vp} (blank{'; example script' if vp > 1 else ''})")
        out.append(dict(source="nemo-24.07", label=f"{r['model']} {r['task']}", task=r["task"],
                        model=name, gpus=int(r["num_gpus"]), gb=int(r["global_batch_size"]),
                        mb=int(r["micro_batch_size"]), seq=int(r["seq_len"]), tp=int(r["tp"]),
                        pp=int(r["pp"]), cp=_int(r["cp"]), vp=vp,
                        measured=float(r["tokens_per_s_per_gpu"]),
                        dropout="megatron" if name.startswith("gpt3") else "none",
                        assumed=assumed))
        if name == "nemotron4-340b":
            out[-1].update(recompute="selective", optim_bytes=4.0, master_bytes=0.0)
            assumed.append("selective recompute, bf16 Adam states, no master copy "
                           "(nemotron_340b.yaml)")
    ml = pd.read_csv(ANCHORS / "mlperf_v31_v40_gpt3_175b_h100.csv")
    for _, r in ml.iterrows():
        if pd.isna(r["tp"]) or quick:
            continue
        n = int(r["n_accelerators"])
        assumed = ["recipe mlperf-gpt3 + evaluations (validate_mlperf.py)"]
        if pd.isna(r["vp"]):
            assumed.append("vp=12 (conf/custom.yaml default)")
        out.append(dict(source=f"mlperf-{r['mlperf_round']}", mlperf_round=r["mlperf_round"],
                        label=f"{r['submitter']} {r['system_dir']}", task="pretrain",
                        model="gpt3-175b", gpus=n, gb=int(r["global_batch_size_seqs"]),
                        mb=int(r["micro_batch"]), seq=int(r["seq_len"]), tp=int(r["tp"]),
                        pp=int(r["pp"]), cp=1, vp=_int(r["vp"], 12),
                        measured=float(r["mean_tokens_per_sec"]) / n, dropout="none",
                        assumed=assumed))
    return out


def evaluate(row):
    n, tp, pp, cp, vp = row["gpus"], row["tp"], row["pp"], row["cp"], row["vp"]
    system = hw_db.system("dgx_h100", nodes=max(n // 8, 1))
    schedule = "interleaved" if vp > 1 else ("1f1b" if pp > 1 else "1f1b")
    par = jm.Parallelism(dp=n // (tp * pp * cp), tp=tp, pp=pp, cp=cp, micro_batch=row["mb"],
                         interleave=vp, schedule=schedule)
    finetune = jm.lora(32) if row["task"] == "LoRA" else None
    if row["source"].startswith("mlperf"):
        return _mlperf(row, system, par)
    rcp = jm.recipe("nemo-24.07-sft" if row["task"] == "SFT" else "nemo-24.07",
                    dropout=row["dropout"])
    if "recompute" in row:
        rcp = rcp.with_(recompute=row["recompute"])
    if "optim_bytes" in row:
        rcp = rcp.with_(precision=jm.precision(rcp.step["precision"],
                                               optim_bytes=row["optim_bytes"],
                                               master_bytes=row["master_bytes"]))
    r = jm.train_step(system, hw_db.model(row["model"]), par, row["gb"], row["seq"],
                      recipe=rcp, finetune=finetune)
    rec = dict(row, assumed="; ".join(row["assumed"]),
               predicted=float(r.tokens_per_s) / n, feasible=bool(r.feasible),
               reason=jm.reason_name(int(r.reason)), memory_gib=float(r.memory_bytes) / 2**30)
    rec.update({f"mem_{k}_gib": float(v) / 2**30 for k, v in r.memory.items()})
    rec["err_pct"] = 100 * (rec["predicted"] / rec["measured"] - 1)
    return rec


def _mlperf(row, system, par):
    """An MLPerf row as ``validate_mlperf.py`` predicts it: the submissions' own configuration
    (``recipe="mlperf-gpt3"``), the round's FP8 parameters and amax reductions
    (:func:`validate_mlperf.round_precision`, :func:`validate_mlperf.amax_sync_s`) and the
    evaluations inside the timed run."""
    model, n = hw_db.model(row["model"]), row["gpus"]
    par = v30.MLPERF.parallelism(par)
    p, r = v30.predict(system, model, par, row["gb"], row["seq"], "fp8", dict(recipe=v30.MLPERF),
                       amax_s=v30.amax_sync_s(system, model, par, row["gb"], row),
                       precision=v30.round_precision(row))
    rec = dict(row, assumed="; ".join(row["assumed"]), predicted=p["fp8_tokens_per_s"] / n,
               feasible=bool(r.feasible), reason=jm.reason_name(int(r.reason)),
               memory_gib=float(r.memory_bytes) / 2**30)
    rec.update({f"mem_{k}_gib": float(v) / 2**30 for k, v in r.memory.items()})
    rec["err_pct"] = 100 * (rec["predicted"] / rec["measured"] - 1)
    return rec


def main(quick=False, out: Path = OUT) -> pd.DataFrame:
    recs = []
    for row in rows(quick):
        rec = evaluate(row)
        recs.append(rec)
        print(f"{rec['source']:12s} {rec['label'][:34]:34s} {rec['gpus']:5d} GPUs  "
              f"measured {rec['measured']:8,.0f}  model {rec['predicted']:8,.0f} tok/s/GPU  "
              f"{rec['err_pct']:+6.1f} %  {rec['memory_gib']:5.1f} GiB "
              f"{'ok' if rec['feasible'] else rec['reason']}  {rec['assumed']}",
              file=sys.stderr, flush=True)
    df = pd.DataFrame(recs)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "validate_recipes.csv", index=False)
    mem_cols = [c for c in df.columns if c.startswith("mem_")]
    print(df[["source", "label", "gpus", "measured", "predicted", "err_pct", "memory_gib",
              "feasible"]].to_string(index=False, float_format=lambda x: f"{x:,.1f}"))
    print("memory breakdown (GiB per device):")
    print(df[["label"] + mem_cols].to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    for name, sel in (("NeMo pre-training", (df.source == "nemo-24.07") & (df.task == "pretrain")),
                      ("NeMo SFT/LoRA", (df.source == "nemo-24.07") & (df.task != "pretrain")),
                      ("MLPerf v3.1/v4.0", df.source.str.startswith("mlperf"))):
        if sel.any():
            e = df.err_pct[sel]
            print(f"{name}: MAPE {np.mean(np.abs(e)):.1f} % over {int(sel.sum())} rows "
                  f"(max |err| {np.max(np.abs(e)):.1f} %), infeasible "
                  f"{int((~df.feasible[sel]).sum())} (nothing fitted: out-of-sample)")
    _plot(df, out / "validate_recipes.png")
    return df


def _plot(df, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for src, mk in (("nemo-24.07", "o"), ("mlperf-v3.1", "s"), ("mlperf-v4.0", "^")):
        d = df[df.source == src]
        if len(d):
            ax.scatter(d.measured, d.predicted, marker=mk, label=src)
    lim = [df[["measured", "predicted"]].min().min() * 0.8,
           df[["measured", "predicted"]].max().max() * 1.2]
    ax.plot(lim, lim, "k-", lw=0.8)
    ax.plot(lim, [v * 1.1 for v in lim], "k:", lw=0.6)
    ax.plot(lim, [v * 0.9 for v in lim], "k:", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured tokens/s per GPU")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.set_title("NeMo 24.07 recipe on DGX-H100 (FP8)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
