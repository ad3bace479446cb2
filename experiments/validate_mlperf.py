"""MLPerf Training v3.0 GPT-3 175B on 512–3,584 H100: predicted vs measured tokens/s.

Data: ``shared/anchors/training/mlperf_v30_gpt3_175b_h100.csv`` (NVIDIA NeMo and CoreWeave
submissions; tokens/s = training tokens of a run / its MLLOG run_start..run_stop time, mean
over the runs). The published plan of every row (MLCommons ``training_results_v3.0``,
``NVIDIA/benchmarks/gpt3``: ``config_DGXH100_*.sh``, ``config_tp_h100.sh``, ``config_common.sh``, ``run_and_time.sh``,
``conf/megatron_gpt_config.yaml``): TP 4, PP 8, virtual pipeline 12 (interleaved 1F1B),
micro-batch 1, and the rest as ``jm.recipe("mlperf-gpt3")`` (:mod:`jaxmodel.recipes`):
sequence parallelism, **no activation recomputation** (``ACT_CKPT_GRANULARITY=null`` in
``config_common.sh``, passed over the yaml's ``selective`` by ``run_and_time.sh``), no
dropout, distributed Adam (ZeRO-1) with overlapped gradient / parameter sync in bf16, TP
communication overlapped with the GEMMs (Transformer Engine userbuffers), the interleaved
schedule's p2p overlap (``OVERLAP_P2P_COMM=True``), FP8 GEMMs (Transformer Engine), no
Transformer Engine's ``DotProductAttention`` with its FlashAttention backend (flash-attn
1.x in the v3.0 container: ``"fa1"``; the later rounds ``"fa2"``): without recomputation
the plan fits only so (96.5 GiB with the unfused softmax's scores kept). Global batch and sequence length per
row from the CSV. Systems: ``dgx_h100`` with ``nodes = GPUs / 8`` (the CoreWeave HGX H100
nodes have the same 8×NDR 400 Gb/s fabric).

**Evaluation inside the timed region.** The measured time (MLLOG run_start..run_stop) holds
the benchmark's evaluations: ``config_common.sh`` sets ``VAL_CHECK_INTERVAL = ⌈24576 /
GBS⌉`` training steps and ``LIMIT_VAL_BATCHES=1.`` (the whole validation set, which the
proxy-run branch of the same file sizes as 5,662 sequences: ``⌈5662 / GBS⌉`` batches
"instead of full valid (1.0)"), padded to whole global batches
(``pad_samples_to_global_batch_size: True``); the run stops at the evaluation that reaches
the target. Per unit of training time the evaluations add (:func:`evaluation_overhead`)
``⌈5662 / GBS⌉ · f / ⌈24576 / GBS⌉``, where ``f`` is the forward share of a training step
(forward compute over forward + backward + recomputation compute of a layer, from
:func:`jaxmodel.parallel.train.stage_times`): an evaluation batch runs the training plan
forward only. An evaluation batch also pays what the forward share of a training step does
not hold (:func:`eval_extra_s`, in seconds per batch): (1) its stage-to-stage transfers —
forward-only, every chunk forward waits on its hop, ``(m·v + p − 1)·t_hop``
(:func:`jaxmodel.parallel.overlap.forward_only_p2p_exposed`), which a training step hides
behind its backward passes; (2) in v3.0 only (:data:`EVAL_RECAST_ROUNDS`), the re-cast of
every FP8 weight at every evaluation micro-batch (NeMo 1.17 leaves ``is_first_microbatch``
True outside training; :func:`jaxmodel.parallel.overlap.te_weight_cast_time`). The predicted
throughput is the step's divided by ``1 + overhead``.

**FP8 weight casts per step.** With 16-bit parameters (v3.0, v3.1) Transformer Engine casts
and transposes every FP8 GEMM weight at the first micro-batch of a step
(``is_first_microbatch=True``) and reuses the copy for the others: :func:`weight_cast_s`
(about 10 ms per step for the 5.4 G weights of a TP4 PP8 device) lengthens every training
step. The rounds with FP8 parameters get 0.

**FP8 amax reductions (v3.0 only).** Transformer Engine reduces each FP8 tensor's amax
over the amax group after every ``fp8_autocast`` region. v3.0's ``config_common.sh`` leaves
``NVTE_DP_AMAX_REDUCE_INTERVAL`` and ``NVTE_ASYNC_AMAX_REDUCTION`` at their Transformer
Engine ``release_v0.8`` defaults (1, 0): after every model chunk's forward and backward a
blocking all-reduce over the ``tp·dp`` consecutive ranks of the stage (64 ranks on 8 nodes at
512 GPUs, 448 on 56 at 3,584); v3.1's and v4.0's set them to 0 and 1 ("AMAX AR overlap and
disable DP": the TP group only, overlapped). :func:`amax_sync_s` adds
:func:`jaxmodel.parallel.overlap.te_amax_sync_exposed` with the system's small all-reduce
latency to every v3.0 training step (not to the evaluations: no amax reduction outside
training): 0.05–0.22 s per step, +1.6 … +2.3 %.

**What the MLLOG files say per step.** The result logs (``tracked_stats``) carry NeMo's
``train_step_timing`` of every step and ``validation_step_timing`` of every evaluation batch
(median of the three runs): v3.0 12.08 / 12.13 s per step at 512 / 768 GPUs (NVIDIA, 128
micro-batches per replica), 12.30 / 6.34 / 2.60 s at 768 / 1,536 / 3,584 (CoreWeave; 128 /
64 / 24 micro-batches: 93.3 ms per micro-batch + 0.36 s per step); v3.1 11.05 / 1.61 / 0.93 s
at 128 / 16 / 8 micro-batches (84.3 ms + 0.26 s). Evaluation batches: v3.0 4.96 s at 512
GPUs, 0.93 s at 3,584; v3.1 4.16 s at 512. Time outside both (logging between steps, the
evaluations' start and end): 0.3–1.8 % of v3.0's runs, 0.2–2.9 % of v3.1's. The model's
step (amax reductions and weight casts included) is 2.0 / 2.1 / 3.5 / 4.6 / 7.6 % shorter
than these steps at 512 / 768 / 768 / 1,536 / 3,584 GPUs: a per-step cost of ~0.14 s and
~2 ms per micro-batch (CoreWeave) remain unexplained in v3.0; for v3.1 the model's step is
within −1.5 … +1.5 % at 8–16 micro-batches and 5 % long at 128.

**Differences between the v3.0 and v3.1 submissions** (``NVIDIA/benchmarks/gpt3/
implementations/pytorch``: ``Dockerfile``, ``config_common.sh``, ``run_and_time.sh``, the
yaml files) and whether the model represents them. Containers: PyTorch 23.04 (NCCL 2.17) /
23.09 with NCCL built from a fixed commit; Transformer Engine ``release_v0.8`` / ``09ba842``;
NeMo ``v1.17.0_pt_23.04`` with Apex's pipeline schedules / ``bd0b818`` with Megatron-core
``df72712``; flash-attn 1.x / 2.0.8 — modelled: ``"fa1"`` / ``"fa2"`` (:func:`plan`). FP8
amax reductions blocking over ``tp·dp`` / TP only and asynchronous — modelled
(:func:`amax_sync_s`). Evaluation weight re-casts in NeMo 1.17 — modelled
(:func:`eval_extra_s`). Distributed Adam (Apex ``DistributedFusedAdam`` through NeMo in
both rounds, 100 MB buckets, bf16 gradient reduce-scatter and parameter all-gather): the
same in both; its per-chunk synchronisation follows the schedules' ``custom_grad_sync_func``
/ ``custom_param_sync_func``, which launch a chunk's reduce-scatter only after its last
backward and wait for chunk 0's whole all-gather before the first forward (the model's
Megatron-core estimate pipelines chunk 0's buckets with its own pass: ~5–10 ms per step
fewer; not modelled). Training-loss broadcast over all ranks every step (NeMo 1.17
``torch.distributed.broadcast(loss_mean, get_last_rank())``; v3.1 ``NEMO_LOG_TRAIN_LOSS=0``
skips it): 0.2–1.2 ms by the collective model, not modelled. Tensorboard logger on / off
(``create_tensorboard_logger``): host time between steps, outside the step, not modelled.
Manual garbage collection every 100 steps (``gc_interval``) in both; v3.1 also skips it
around the evaluations (``NEMO_MANUAL_GC_IN_VALIDATION=0``). Not modelled, no switch: the
TP-overlap yaml (v3.0 ``fc2_fprop`` pipelined reduce-scatter on 20 SMs, ``proj_fprop`` 24;
v3.1 4 with FP8 atomic GEMMs, ``NVTE_UB_ATOMIC_GEMM_RS=1``; the model: Transformer Engine's
default 16), LayerNorm SM margin 4 / 8, the default 128 KiB / 2 MiB NCCL p2p network chunks
(``NCCL_P2P_NET_CHUNKSIZE``), NCCL's default CTAs / per-communicator CTA limits
(``MEGATRON_CORE_*_MAX_CTAS``), ``NCCL_NVLS_ENABLE`` unset / 0 (NCCL 2.17 runs NVLink SHARP
on single-node all-reduces only: the TP collectives go through userbuffers), Transformer
Engine 0.8's per-module amax-history and scale updates (history 1,024, ``max``) against
1.x's.

The rows are a validation target: nothing here is fitted to them. The H100's sustained clock
fraction and HBM efficiency come from its cuBLASLt FP8 and STREAM microbenchmarks
(``experiments/calibrate.py``; printed with their provenance), its library-GEMM constants and
launch overheads are the A100's, the NVLink constants are fitted on H100 all-reduce kernel
times, the InfiniBand ones are the A100's / assumed.

Writes ``experiments/out/validate_mlperf.csv`` and ``.png``; prints predicted vs measured
tokens/s and the MAPE for ``precision="fp8"`` (and, for reference, ``"bf16"``).

Usage: ``python experiments/validate_mlperf.py``
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import jaxmodel as jm  # noqa: E402,I001  (imported before hw_db: the package wires hw_db up)
import hw_db  # noqa: E402
from common import OUT, anchor_dir  # noqa: E402
from jaxmodel.parallel.overlap import (forward_only_p2p_exposed,  # noqa: E402
                                       te_amax_sync_exposed, te_weight_cast_time)
from jaxmodel.parallel.pipeline import p2p_bytes  # noqa: E402
from jaxmodel.parallel.train import stage_times  # noqa: E402
from jaxmodel.workload.params import layer_params  # noqa: E402

ANCHOR = anchor_dir("training") / "mlperf_v30_gpt3_175b_h100.csv"


MLPERF = jm.recipe("mlperf-gpt3")
#: config_common.sh: ``VAL_CHECK_INTERVAL = ceil(24576 / GBS)`` training steps
EVAL_EVERY_SEQS = 24576
#: config_common.sh: the validation set, ``ceil(5662 / GBS)`` batches (its proxy-run sizing)
VALID_SEQS = 5662
#: Rounds whose Transformer Engine reduces the FP8 amaxes over the whole ``tp·dp`` amax group
#: after every model chunk's forward and backward, blocking: v3.0's ``config_common.sh`` sets
#: neither ``NVTE_DP_AMAX_REDUCE_INTERVAL`` nor ``NVTE_ASYNC_AMAX_REDUCTION`` (Transformer
#: Engine ``release_v0.8`` defaults 1 and 0); v3.1's sets both ("AMAX AR overlap and disable
#: DP": ``NVTE_DP_AMAX_REDUCE_INTERVAL=0``, ``NVTE_ASYNC_AMAX_REDUCTION=1``, the TP group
#: only, overlapped; its TE 09ba842 reads them). v4.0's container runs TE v1.6rc1 and v4.1's
#: a later 1.x, which no longer read either variable (removed in v1.6rc1): ``fp8.py``
#: ``FP8GlobalStateManager.reduce_tensor_across_group_op_max`` all-reduces every region's
#: amaxes with ``async_op=False`` over the autocast's ``fp8_group``, which Megatron-core
#: 0.7 sets to ``parallel_state.get_amax_reduction_group(with_context_parallel=True)``, the
#: tensor-and-data-parallel ranks — blocking over ``tp·dp`` again, whatever v4.0's
#: ``config_common.sh`` still exports.
BLOCKING_DP_AMAX_ROUNDS = ("v3.0", "v4.0", "v4.1")
#: FP8 GEMMs of a GPT layer in Transformer Engine (``LayerNormLinear`` QKV, ``Linear``
#: projection, ``LayerNormMLP`` FC1 + FC2) and the fp32 amaxes each contributes to a forward
#: / backward reduction (``num_gemms·3`` / ``num_gemms·2``, TE ``module.py``
#: ``init_fp8_meta_tensors``)
TE_GEMMS_PER_LAYER = 4
#: Rounds whose ``config_common.sh`` sets ``FP8_PARAMS=True`` (v4.0, v4.1; ``conf/custom.yaml``
#: ``fp8_params``): Transformer Engine's FP8 (1 B) model parameters, which the distributed
#: optimizer all-gathers in FP8 while keeping its fp32 shard (:func:`round_precision`)
FP8_PARAMS_ROUNDS = ("v4.0", "v4.1")
AMAX_FWD_PER_GEMM, AMAX_BWD_PER_GEMM = 3, 2
#: Rounds whose NeMo casts every FP8 weight again at every evaluation micro-batch. NeMo 1.17
#: (``v1.17.0_pt_23.04``, the v3.0 container) ``modules/common/megatron/transformer.py``
#: passes ``is_first_microbatch=self.is_first_microbatch`` to the Transformer Engine layers
#: and advances that flag only ``if torch.is_grad_enabled() and self.training``; it is True
#: after the last micro-batch of every training step, so each evaluation forward runs with
#: ``is_first_microbatch=True`` and Transformer Engine 0.8 re-casts the weights
#: (``module.py``: ``cast_to_fp8`` without gradients). NeMo 1.20 (v3.1, ``bd0b818``) caches
#: them at the first evaluation micro-batch only (``is_prev_microbatch_training and not
#: self.training``), as do the later rounds.
EVAL_RECAST_ROUNDS = ("v3.0",)
#: Bytes per weight of Transformer Engine's cast at the first micro-batch of a training step
#: (``fp8_cast_transpose_fused``: bf16 read, FP8 weight and FP8 transpose written) and of an
#: evaluation forward (``cast_to_fp8``: no transpose); :func:`jaxmodel.parallel.overlap.
#: te_weight_cast_time`
CAST_TRANSPOSE_BYTES, CAST_BYTES = 4.0, 3.0


def plan(row) -> tuple:
    """System, plan and keyword arguments of one anchor row (its published configuration)."""
    n = int(row["n_accelerators"])
    tp, pp, vp, mb = (int(row[k]) for k in ("tp", "pp", "vp", "micro_batch"))
    system = hw_db.system("dgx_h100", nodes=n // 8)
    par = MLPERF.parallelism(dp=n // (tp * pp), tp=tp, pp=pp, micro_batch=mb, interleave=vp,
                             schedule="interleaved")
    if row.get("mlperf_round", "v3.0") == "v3.0":       # flash-attn 1.x in the v3.0 container
        par = dataclasses.replace(par, flash_attention="fa1")
    return system, par, dict(recipe=MLPERF)


def round_precision(row):
    """The FP8 precision of the row's round: ``precision("fp8", weight_bytes=1)`` for the
    rounds of :data:`FP8_PARAMS_ROUNDS`, else ``None`` (the ``"fp8"`` preset: bf16
    parameters with a cached FP8 copy)."""
    if row.get("mlperf_round", "v3.0") in FP8_PARAMS_ROUNDS:
        return jm.precision("fp8", weight_bytes=1.0)
    return None


def amax_sync_s(system, model, par, global_batch, row) -> float:
    """Seconds per step of the round's blocking FP8 amax reductions
    (:func:`jaxmodel.parallel.overlap.te_amax_sync_exposed`): 0 unless the row's round is in
    :data:`BLOCKING_DP_AMAX_ROUNDS`; else each model chunk's forward (backward) amaxes, 4 B ×
    :data:`AMAX_FWD_PER_GEMM` (:data:`AMAX_BWD_PER_GEMM`) × :data:`TE_GEMMS_PER_LAYER` × its
    layers, all-reduced over the ``tp·dp`` consecutive ranks of its pipeline stage
    (:func:`jaxmodel.collective_latency` on ``system``), ``m = GBS / (dp · micro_batch)``
    micro-batches of ``v`` chunks per step."""
    if row.get("mlperf_round", "v3.0") not in BLOCKING_DP_AMAX_ROUNDS:
        return 0.0
    tp, pp, dp = float(par.tp), float(par.pp), float(par.dp)
    v = float(par.interleave)
    layers = float(model.n_layers) / (pp * v)
    per_gemm = 4.0 * TE_GEMMS_PER_LAYER * layers
    t_f, t_b = (float(jm.collective_latency(system, "all_reduce", per_gemm * k, dp * tp))
                for k in (AMAX_FWD_PER_GEMM, AMAX_BWD_PER_GEMM))
    m = float(global_batch) / (dp * float(par.micro_batch))
    return float(te_amax_sync_exposed(t_f, t_b, m, v, pp))


def _device_weights(model, par) -> tuple:
    """The FP8 GEMM weights one device holds (its stage's layers over TP, all ``v`` chunks;
    :func:`jaxmodel.workload.params.layer_params`, norms and biases included, < 0.01 %) and
    the cast kernels they take (:data:`TE_GEMMS_PER_LAYER` per layer)."""
    layers = float(model.n_layers) / float(par.pp)
    return (float(layer_params(model)) * layers / float(par.tp),
            TE_GEMMS_PER_LAYER * layers)


def weight_cast_s(system, model, par, precision=None) -> float:
    """Seconds per training step of Transformer Engine's FP8 weight casts at the first
    micro-batch (``is_first_microbatch=True``, NeMo's ``transformer.py`` at every round):
    each of the device's weights cast and transposed once per step
    (:func:`jaxmodel.parallel.overlap.te_weight_cast_time`, :data:`CAST_TRANSPOSE_BYTES`),
    on the critical path of the first forward of each chunk. Only for 16-bit parameters
    (``precision`` None: the ``"fp8"`` preset's bf16 weights with a cached FP8 copy); the
    rounds with FP8 parameters (:data:`FP8_PARAMS_ROUNDS`, :func:`round_precision`) get
    their FP8 weights from the optimizer step and are given 0."""
    if precision is not None and float(precision.weight_bytes) <= 1.0:
        return 0.0
    n, kernels = _device_weights(model, par)
    return float(te_weight_cast_time(system.device, n, CAST_TRANSPOSE_BYTES, kernels))


def eval_extra_s(system, model, par, global_batch, seq_len, row=None, fp8=True) -> float:
    """Seconds per evaluation batch beyond the forward share of a training step: the
    forward-only pass's stage-boundary transfers, one per chunk forward on the critical
    path (:func:`jaxmodel.parallel.overlap.forward_only_p2p_exposed`; one transfer of the
    micro-batch's ``[s/tp, b, h]`` bf16 activations, :func:`jaxmodel.parallel.pipeline.
    p2p_bytes`, between ranks ``tp·dp`` apart, :func:`jaxmodel.collective_latency`) and, for
    the rounds of :data:`EVAL_RECAST_ROUNDS` under FP8, the re-cast of every weight at every
    evaluation micro-batch (:data:`CAST_BYTES`); no ``row``: no re-casts."""
    tp, pp, dp = float(par.tp), float(par.pp), float(par.dp)
    m = float(global_batch) / (dp * float(par.micro_batch))
    hop = 0.0
    if pp > 1:
        nbytes = float(p2p_bytes(par.micro_batch, seq_len, model.d_model, tp))
        hop = float(jm.collective_latency(system, "p2p", nbytes, 2, stride=tp * dp))
    t = float(forward_only_p2p_exposed(hop, m, par.interleave, pp))
    rnd = None if row is None else row.get("mlperf_round", "v3.0")
    if fp8 and rnd in EVAL_RECAST_ROUNDS:
        n, kernels = _device_weights(model, par)
        t += m * float(te_weight_cast_time(system.device, n, CAST_BYTES, kernels))
    return t


def forward_share(system, model, par, global_batch, seq_len, precision="fp8") -> float:
    """Forward compute of a layer over its forward + backward + recomputation compute in a
    training step of this plan (:func:`jaxmodel.parallel.train.stage_times`)."""
    t = stage_times(system, model, par, global_batch, seq_len, precision=precision,
                    dropout=MLPERF.step["dropout"])
    return float(t["fwd"] / (t["fwd"] + t["bwd"] + t["recompute"]))


def evaluation_overhead(global_batch, share, extra_s=0.0, step_s=1.0) -> float:
    """Evaluation time per unit of training time inside run_start..run_stop: ``⌈5662/GBS⌉``
    forward-only global batches (each ``share`` of a training step of ``step_s`` seconds
    plus ``extra_s`` seconds, :func:`eval_extra_s`) every ``⌈24576/GBS⌉`` training steps
    (module docstring)."""
    gb = float(global_batch)
    per_batch = share + float(extra_s) / float(step_s)
    return math.ceil(VALID_SEQS / gb) * per_batch / math.ceil(EVAL_EVERY_SEQS / gb)


def predict(system, model, par, global_batch, seq_len, prec, kw, breakdown=False,
            amax_s=0.0, precision=None, row=None) -> tuple:
    """One row's prediction under precision ``prec``: ``(record, train_step result)``, the
    record holding the run's throughput with its evaluations (``{prec}_tokens_per_s``; the
    step alone as ``{prec}_train_tokens_per_s``), feasibility and memory; with ``breakdown``
    the step's terms and MFU. ``amax_s`` (:func:`amax_sync_s`, FP8 only) lengthens every
    training step, not the forward-only evaluation batches (Transformer Engine reduces amaxes
    in training only). ``precision``: a :class:`jaxmodel.Precision` to run instead of the
    preset ``prec`` (the records keep the name ``prec``). Under FP8 every training step
    also pays the weight casts of its first micro-batch (:func:`weight_cast_s`); every
    evaluation batch its forward-only transfers and, by ``row``'s round, the re-casts
    (:func:`eval_extra_s`)."""
    run = prec if precision is None else precision
    fp8 = prec == "fp8"
    r = jm.train_step(system, model, par, global_batch, seq_len, precision=run, **kw)
    step = float(r.step_time_s)
    extra = eval_extra_s(system, model, par, global_batch, seq_len, row, fp8=fp8)
    ovh = evaluation_overhead(global_batch,
                              forward_share(system, model, par, global_batch, seq_len, run),
                              extra_s=extra, step_s=step)
    amax = float(amax_s) if fp8 else 0.0
    cast = weight_cast_s(system, model, par, precision) if fp8 else 0.0
    tokens = float(global_batch) * float(seq_len)
    rec = {f"{prec}_train_tokens_per_s": tokens / (step + amax + cast),
           f"{prec}_eval_overhead": ovh,
           f"{prec}_tokens_per_s": tokens / (step + amax + cast + ovh * step),
           f"{prec}_step_s": step + amax + cast, f"{prec}_feasible": bool(r.feasible),
           f"{prec}_memory_gib": float(r.memory_bytes) / 2**30}
    if breakdown:
        rec.update({f"{prec}_{k}_s": float(v) for k, v in r.breakdown.items()})
        rec[f"{prec}_amax_sync_s"] = amax
        rec[f"{prec}_weight_cast_s"] = cast
        rec[f"{prec}_eval_extra_s"] = extra
        rec[f"{prec}_mfu_vs_bf16_peak"] = float(r.mfu)
    return rec, r


def main(out: Path = OUT) -> pd.DataFrame:
    rows = pd.read_csv(ANCHOR)
    model = hw_db.model("gpt3-175b")
    records = []
    for _, row in rows.iterrows():
        system, par, kw = plan(row)
        gb, seq = float(row["global_batch_size_seqs"]), float(row["seq_len"])
        rec = {"system_dir": row["system_dir"], "gpus": int(row["n_accelerators"]),
               "global_batch": int(gb), "measured_tokens_per_s": float(row["mean_tokens_per_sec"])}
        for prec in ("fp8", "bf16"):
            rec.update(predict(system, model, par, gb, seq, prec, kw, breakdown=prec == "fp8",
                               amax_s=amax_sync_s(system, model, par, gb, row), row=row)[0])
        records.append(rec)
        print(f"{rec['gpus']:5d} GPUs  measured {rec['measured_tokens_per_s']:>10,.0f} tok/s  "
              f"fp8 {rec['fp8_tokens_per_s']:>10,.0f}  bf16 {rec['bf16_tokens_per_s']:>10,.0f}",
              file=sys.stderr)
    df = pd.DataFrame(records)
    for prec in ("fp8", "bf16"):
        df[f"{prec}_err_pct"] = 100 * (df[f"{prec}_tokens_per_s"] / df["measured_tokens_per_s"]
                                       - 1)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "validate_mlperf.csv", index=False)
    mape = {p: float(np.mean(np.abs(df[f"{p}_err_pct"]))) for p in ("fp8", "bf16")}
    print(df[["gpus", "global_batch", "measured_tokens_per_s", "fp8_train_tokens_per_s",
              "fp8_eval_overhead", "fp8_amax_sync_s", "fp8_tokens_per_s", "fp8_err_pct",
              "bf16_tokens_per_s", "bf16_err_pct", "fp8_memory_gib"]]
          .to_string(index=False, float_format=lambda x: f"{x:,.1f}"))
    print(f"MAPE fp8 {mape['fp8']:.1f} %  (bf16 for reference {mape['bf16']:.1f} %)")
    dev = hw_db.device("h100_sxm")
    print(f"H100: sustained clock fraction {float(dev.sustained_clock_fraction):.3f} "
          f"({float(dev.freq_hz * dev.sustained_clock_fraction) / 1e9:.2f} GHz), HBM "
          f"efficiency {float(dev.mem_bw_efficiency):.3f}: cuBLASLt FP8 / STREAM "
          f"microbenchmarks (experiments/calibrate.py); matmul efficiency "
          f"{float(dev.matmul_efficiency):.2f} and launch overheads from the A100")
    d = df.sort_values("gpus")
    print("signed error by GPU count (fp8): " + ", ".join(
        f"{g}: {e:+.1f} %" for g, e in zip(d.gpus, d.fp8_err_pct)))
    _plot(df, mape, out / "validate_mlperf.png")
    return df


def _plot(df, mape, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    order = np.argsort(df["gpus"].to_numpy())
    g = df["gpus"].to_numpy()[order]
    ax.plot(g, df["measured_tokens_per_s"].to_numpy()[order] / 1e3, "ko-", label="measured")
    ax.plot(g, df["fp8_tokens_per_s"].to_numpy()[order] / 1e3, "s--", color="tab:red",
            label=f"model fp8 (MAPE {mape['fp8']:.1f} %)")
    ax.plot(g, df["bf16_tokens_per_s"].to_numpy()[order] / 1e3, "^:", color="tab:blue",
            label=f"model bf16 (MAPE {mape['bf16']:.1f} %)")
    ax.set_xlabel("H100 GPUs")
    ax.set_ylabel("training throughput (k tokens/s)")
    ax.set_title("GPT-3 175B, MLPerf Training v3.0 (TP4 PP8 VP12)")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
