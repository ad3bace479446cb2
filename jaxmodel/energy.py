"""Device power and energy per token of a training step or a served request batch.

**Power model** (one device, W): idle power plus the activity-dependent dynamic power of the
chip, main memory and the off-device links, at most the board power limit::

    P = P_idle + P_dyn1·φ³·(s_mac·a + s_sram·b) + P_mem + P_link,   P_board = min(P, TDP)

- ``P_idle``: the board with a CUDA context and nothing running (``Device.idle_power_w``;
  ``-1`` = :data:`IDLE_TDP_SHARE` × TDP).
- ``P_dyn1``: the chip's switching power running a dense GEMM at the full clock ``freq_hz``
  (``Device.dynamic_power_w``). CMOS dynamic power is ``α·C·V²·f`` (Weste & Harris, "CMOS
  VLSI Design", 4th ed., §5.1) with ``V ∝ f`` over the DVFS range, so at the clock fraction
  ``φ`` it is ``P_dyn1·φ³``. It is a property of the silicon: the board limit ``tdp_w`` does
  not set it, it only caps the total (below). Where the device gives none (``-1``) it is
  derived from the device's calibrated sustained clock ``φ_s``: a dense GEMM sustained for
  minutes runs at the clock where the board meets its limit (the definition of power-limited
  clocks; NVIDIA A100/H100 datasheets give TDP as that limit), so ``P_idle + P_dyn1·φ_s³ =
  TDP`` and ``P_dyn1 = (TDP − P_idle)/φ_s³`` (:func:`dynamic_power`; the GEMM's own operand
  traffic is neglected there: large GEMMs reuse each byte thousands of times). The shipped
  hw_db devices carry this value computed at their datasheet TDP, so varying ``tdp_w``
  (a what-if, a sensitivity) moves the cap, never the silicon's power at a given clock.
- Activity: ``a`` is the tensor-core duty (achieved matrix FLOP/s over ``peak·φ·
  matmul_efficiency``), ``b`` the busy fraction — the share of the time an SM executes a
  kernel (GEMM, attention, normalisation, elementwise, optimizer) rather than waiting on
  communication, a pipeline bubble or the host. The on-chip dynamic power splits into the
  multiply-accumulate datapath, which switches with ``a``, and the register files, L1/shared
  memory, L2 and control that every executing kernel clocks, which switch with ``b``: the
  shares :data:`MAC_SHARE` and :data:`SRAM_SHARE` = 1 − ``MAC_SHARE`` are DeepFlow's V100
  power budget (Ardalani, Pal, Gupta, "DeepFlow: A Cross-Stack Pathfinding Framework for
  Distributed AI Systems", ACM TODAES 2024; ``configs/hardware-config/v100.yaml``,
  ``power_breakdown``: core 0.3745, register files 0.3022, L1 0.1041, L2 0.008 of TDP).
  A dense GEMM has ``a = b = 1``. Taking the on-chip memories at full activity while any
  kernel runs is an upper bound for memory-bound kernels, which touch them at the rate of
  their main-memory stream.
- ``P_mem = e_mem · (HBM bytes/s)``, ``e_mem = Device.mem_energy_per_byte``: HBM2 ≈ 3.9
  pJ/bit including I/O and core (O'Connor et al., "Fine-Grained DRAM: Energy-Efficient DRAM
  for Extreme Bandwidth Systems", MICRO 2017, §2 and Fig. 2).
- ``P_link = e_link · (link bytes/s)``, ``e_link = Device.link_energy_per_byte``: off-package
  SerDes energy (NVIDIA Grace Hopper Superchip architecture whitepaper, 2023: NVLink-C2C at
  1.3 pJ/bit is "5× more energy efficient than PCIe Gen 5", i.e. ≈ 6.5 pJ/bit for a
  long-reach SerDes, taken for NVLink and the NIC path).

**Power limit and clock** (the sustained-clock rule): when ``P > TDP`` at the clock the time
model assumed, the board caps its power at TDP and the clock falls to ``φ`` with
``P_idle + P_dyn1·φ³·(s_mac·a + s_sram·b) + P_mem + P_link = TDP`` (:func:`device_power`
returns it as ``clock_fraction``). More TDP never raises the power at a given achieved clock.
Training already runs at ``φ_s`` (``jaxmodel.parallel.train.sustained_device``), so a
training step on a device at its datasheet TDP is at or under TDP by construction, as is
serving with a runtime that runs at the sustained clock (TensorRT-LLM, vLLM presets); eager
serving runs at ``freq_hz``, and a compute-bound prefill is then reported ``power_limited``
(its time is not re-evaluated at the lower clock — the energy is ``TDP × time``, a lower
bound), as is any step on a device whose ``tdp_w`` was set below its silicon's demand.

This reproduces the measured pattern of Patel et al., "Characterizing Power Management
Opportunities for LLMs in the Cloud" (ASPLOS 2024, §4): compute phases of training and prompt
(prefill) phases reach TDP, communication phases and token (decode) phases, memory-bound,
draw well below it.

**Activities** (per device):

- training (:func:`train_energy`): matrix FLOP/s = ``achieved_flops_per_device`` (hardware
  FLOPs incl. recomputation, PTD-P eq. 3); busy = the step's compute, recomputation,
  embedding/head and optimizer seconds over the step (exposed communication and the bubble
  are not busy); HBM bytes per step = per micro-batch the stage's weights read 3× (forward,
  data- and weight-gradient GEMMs; 4× with full recomputation) and its stored activations
  written and read once, plus the optimizer step at achievable bandwidth (its time ×
  ``achievable_mem_bw``); link bytes = exposed communication seconds × the innermost tier's
  executed bandwidth (both directions; overlapped traffic is not counted — a lower bound).
- serving (:func:`inference_energy`): prefill FLOPs = one forward over the prompt
  (``model_flops_per_token/3`` at the prompt length), decode per token at the mean context
  ``isl + osl/2``; busy = each phase's time less its exposed collectives and the runtime's
  per-step overhead; HBM bytes per decode step = the device's weights + its KV cache at the
  mean context (Pope et al., "Efficiently Scaling Transformer Inference", MLSys 2023, §2.1),
  per prefill the weights + the prompt's KV written.

Energy is the board energy of all devices (what NVML/``nvidia-smi`` integrate, as in the
ML.ENERGY benchmark); host, network switches and the facility's PUE are in
:func:`jaxmodel.tco`. Units: W, J, J/token, J/FLOP, J/byte.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxmodel import numerics as nx
from jaxmodel import serving_runtime as _rtp
from jaxmodel.parallel import pipeline as _pl
from jaxmodel.parallel.inference_options import InferenceOptions
from jaxmodel.types import Device, System
from jaxmodel.workload import params as _params

from jaxmodel import precisions as _prec

__all__ = ["device_power", "idle_power", "dynamic_power", "Energy", "train_energy",
           "inference_energy", "IDLE_TDP_SHARE", "MAC_SHARE", "SRAM_SHARE"]

#: Idle power over TDP used where a device gives none (``idle_power_w = -1``): the mean of
#: the shipped boards that give one (hw_db/devices: A100 60/400 W, H100/H200 80/700 W → 0.13).
IDLE_TDP_SHARE = 0.13


@dataclasses.dataclass(frozen=True)
class Energy:
    """Power and energy of one workload (a pytree; fields carry the batch shape).

    Attributes:
        power_w: mean board power per device, W (≤ TDP).
        uncapped_w: the power the activities ask for at the modelled clock, W (may exceed TDP).
        power_limited: True where ``uncapped_w > TDP``.
        clock_fraction: the clock the power limit allows, over ``freq_hz`` (≤ 1).
        joules: board energy of all devices for the step / the request batch, J.
        joules_per_token: ``joules`` per trained token / per generated token, J.
        parts_w: dict of mean power per device by part (``idle``, ``compute``, ``memory``,
            ``link``), W, uncapped.
    """

    power_w: Any
    uncapped_w: Any
    power_limited: Any
    clock_fraction: Any
    joules: Any
    joules_per_token: Any
    parts_w: dict


jax.tree_util.register_dataclass(
    Energy, data_fields=[f.name for f in dataclasses.fields(Energy)], meta_fields=[])


def idle_power(dev: Device):
    """``dev.idle_power_w``, or :data:`IDLE_TDP_SHARE` × TDP where it is −1 (unknown), W."""
    return jnp.where(dev.idle_power_w >= 0, dev.idle_power_w, IDLE_TDP_SHARE * dev.tdp_w)


def dynamic_power(dev: Device):
    """``P_dyn1``: the chip's switching power at full clock and full activity, W —
    ``dev.dynamic_power_w``, or ``(TDP − P_idle)/φ_s³`` where it is −1 (module docstring)."""
    phi = jnp.clip(dev.sustained_clock_fraction, 1e-3, 1.0)
    derived = jnp.maximum(dev.tdp_w - idle_power(dev), 0.0) / phi ** 3
    return jnp.where(dev.dynamic_power_w >= 0, dev.dynamic_power_w, derived)


#: Share of the on-chip dynamic power in the multiply-accumulate datapath at a dense GEMM:
#: DeepFlow's V100 budget, core 0.3745 of (core 0.3745 + register files 0.3022 + L1 0.1041
#: + L2 0.008) of TDP (module docstring) = 0.475.
MAC_SHARE = 0.3745 / (0.3745 + 0.3022 + 0.1041 + 0.008)
#: The rest: register files, L1/shared memory, L2 and control, clocked by any kernel.
SRAM_SHARE = 1.0 - MAC_SHARE


def device_power(dev: Device, duty, mem_bytes_per_s, link_bytes_per_s, clock=1.0,
                 busy=None) -> dict:
    """Board power of one device (module docstring), W.

    Args:
        dev: the device (its ``freq_hz`` the full clock).
        duty: tensor-core duty ``a`` in [0, 1] at ``clock`` (achieved matrix FLOP/s over
            ``peak·clock·matmul_efficiency``).
        mem_bytes_per_s: main-memory traffic, bytes/s.
        link_bytes_per_s: off-device link traffic (both directions), bytes/s.
        clock: clock fraction the time model ran at (``φ``).
        busy: share ``b`` in [0, 1] of the time a kernel executes on the SMs; default
            ``duty`` (a GEMM-only activity).

    Returns:
        dict: ``power_w`` (≤ TDP), ``uncapped_w``, ``power_limited``, ``clock_fraction``
        (the clock at which the power meets TDP, ≤ ``clock``), ``idle``, ``compute``
        (tensor datapath and on-chip memories), ``memory``, ``link`` (W).
    """
    idle = idle_power(dev)
    a = jnp.clip(duty, 0.0, 1.0)
    b = a if busy is None else jnp.clip(busy, 0.0, 1.0)
    act = MAC_SHARE * a + SRAM_SHARE * b
    pc1 = dynamic_power(dev)
    p_c = pc1 * act * clock ** 3
    p_m = dev.mem_energy_per_byte * jnp.maximum(mem_bytes_per_s, 0.0)
    p_l = dev.link_energy_per_byte * jnp.maximum(link_bytes_per_s, 0.0)
    total = idle + p_c + p_m + p_l
    limited = total > dev.tdp_w
    room = jnp.maximum(dev.tdp_w - idle - p_m - p_l, 0.0)
    denom = pc1 * act
    ok = limited & (denom > 0)
    # cube root of a positive floor: finite derivative where no room is left
    ratio = jnp.maximum(nx.safe_div(room, jnp.where(ok, denom, 1.0), fill=0.0), 1e-9)
    phi = jnp.where(ok, jnp.cbrt(ratio), clock)
    return dict(power_w=jnp.minimum(total, dev.tdp_w), uncapped_w=total,
                power_limited=limited, clock_fraction=jnp.minimum(phi, clock),
                idle=idle, compute=p_c, memory=p_m, link=p_l)


def _link_rate(system: System):
    """Executed bandwidth of the innermost network tier, both directions, bytes/s."""
    if not system.levels:
        return 0.0
    lvl = system.levels[0]
    return 2.0 * lvl.bw_per_device * lvl.efficiency


def _peak(dev: Device, prec) -> Any:
    """Dense matrix peak of the precision's GEMM dtype × ``matmul_efficiency``, FLOP/s."""
    return dev.peak_matrix_flops * _prec.matrix_ratio(dev, prec.gemm_dtype) * \
        dev.matmul_efficiency


def _finite(x):
    x = jnp.asarray(x, dtype=float)
    return jnp.where(jnp.isfinite(x), x, 0.0)


def _seconds(bd: dict, keys) -> Any:
    return sum(_finite(bd[k]) for k in keys if k in bd)


def train_energy(system: System, model, par, result, precision=None) -> Energy:
    """Power and energy of one training step (``result = jm.train_step(...)`` of one plan or a
    batch; pure, differentiable). ``joules_per_token`` is per trained token
    (``global_batch·seq_len``). Infeasible plans give ``inf`` energy and 0 power."""
    prec = _prec.resolve(precision)
    dev = system.device
    phi = jnp.clip(dev.sustained_clock_fraction, 1e-3, 1.0)
    ok = jnp.asarray(result.feasible).astype(bool)    # a batched call passes it as a float
    T = jnp.where(ok, result.step_time_s, 1.0)
    n = system.n_devices
    flops_s = jnp.where(ok, result.achieved_flops_per_device, 0.0)
    duty = nx.safe_div(flops_s, _peak(dev, prec) * phi, fill=0.0)
    m = jnp.where(ok, result.microbatches, 0.0)
    weights = _finite(result.memory["weights"])
    in_flight = jnp.maximum(_pl.stage_in_flight(par.schedule, par.pp, jnp.maximum(m, 1.0),
                                                par.interleave)[0], 1.0)
    act_mb = _finite(result.memory["activations"]) / in_flight
    passes = jnp.where(par.recompute > 1.5, 4.0, 3.0)
    bd = result.breakdown
    opt_bytes = _finite(bd["optimizer"]) * dev.mem_bw * dev.mem_bw_efficiency
    hbm = jnp.where(ok, m * (passes * weights + 2.0 * act_mb) + opt_bytes, 0.0)
    comm = _seconds(bd, ("tp_comm", "dp_comm", "pp_comm", "ep_comm"))
    link = jnp.where(ok, comm * _link_rate(system), 0.0)
    busy = jnp.where(ok, _seconds(bd, ("compute", "recompute", "embedding", "optimizer")),
                     0.0)
    p = device_power(dev, duty, hbm / T, link / T, clock=phi, busy=busy / T)
    joules = jnp.where(ok, p["power_w"] * T * n, jnp.inf)
    tokens = jnp.where(ok, result.tokens_per_s * T, 1.0)
    return Energy(power_w=jnp.where(ok, p["power_w"], 0.0),
                  uncapped_w=jnp.where(ok, p["uncapped_w"], 0.0),
                  power_limited=ok & p["power_limited"], clock_fraction=p["clock_fraction"],
                  joules=joules, joules_per_token=jnp.where(ok, joules / tokens, jnp.inf),
                  parts_w={k: jnp.where(ok, p[k], 0.0)
                           for k in ("idle", "compute", "memory", "link")})


def inference_energy(system: System, model, par, result, work: InferenceOptions,
                     precision=None, runtime=None) -> Energy:
    """Power and energy of serving one request batch (``result = jm.inference(...)`` with
    the same arguments, ``work`` its :class:`jaxmodel.InferenceOptions`: ``batch``
    sequences of ``prompt_len`` prompt and ``gen_len`` generated tokens; pure,
    differentiable): a prefill of ``ttft`` and ``gen_len − 1`` decode steps of ``tpot``.
    ``power_w`` is the time-weighted mean over both phases; ``joules_per_token`` is per
    generated token; ``clock_fraction`` that of the prefill.
    ``runtime``: the one given to ``jm.inference`` — a runtime with ``sustained_clock``
    (TensorRT-LLM, vLLM presets) ran the device at ``sustained_clock_fraction``, the eager
    default at ``freq_hz``."""
    batch, prompt_len, gen_len = work.batch, work.prompt_len, work.gen_len
    prec = _prec.resolve(precision)
    dev = system.device
    rt = _rtp.runtime_arg(runtime)
    phi = 1.0 if rt is None else jnp.where(
        rt.sustained_clock > 0.5, jnp.clip(dev.sustained_clock_fraction, 1e-3, 1.0), 1.0)
    ok = jnp.asarray(result.feasible).astype(bool)    # a batched call passes it as a float
    n = system.n_devices
    bd = result.breakdown
    ttft = jnp.where(ok, result.ttft_s, 1.0)
    tpot = jnp.where(ok, result.tpot_s, 1.0)
    isl, osl = jnp.maximum(prompt_len, 1.0), jnp.maximum(gen_len, 1.0)
    ctx = isl + 0.5 * osl
    fwd = lambda s: _params.model_flops_per_token.single(model, s, False) / 3.0  # noqa: E731
    peak = _peak(dev, prec)
    weights = _finite(bd["memory.weights"])
    kv_full = _finite(bd["memory.kv_cache"])          # at isl + osl
    link_rate = _link_rate(system)

    def comm(ph):
        return (sum(_finite(bd.get(f"{ph}.{op}", 0.0)) for op in
                    ("allreduce_mha", "allreduce_ffn", "moe_alltoall")) * model.n_layers
                + _finite(bd.get(f"pp_comm_{ph}", 0.0)))

    step_oh = _finite(bd.get("step_overhead", 0.0))

    def busy(ph, t):
        oh = step_oh + (_finite(bd.get("request_setup", 0.0)) if ph == "prefill" else 0.0)
        return jnp.clip(1.0 - (comm(ph) + oh) / t, 0.0, 1.0)

    pre_flops = batch * isl * fwd(isl) / n
    pre = device_power(dev, nx.safe_div(pre_flops / ttft, peak * phi, fill=0.0),
                       (weights + kv_full * isl / (isl + osl)) / ttft,
                       comm("prefill") * link_rate / ttft, clock=phi,
                       busy=busy("prefill", ttft))
    dec_flops = batch * fwd(ctx) / n
    dec = device_power(dev, nx.safe_div(dec_flops / tpot, peak * phi, fill=0.0),
                       (weights + kv_full * ctx / (isl + osl)) / tpot,
                       comm("decode") * link_rate / tpot, clock=phi,
                       busy=busy("decode", tpot))
    t_dec = (osl - 1.0) * tpot
    total_t = ttft + t_dec
    e_dev = pre["power_w"] * ttft + dec["power_w"] * t_dec
    joules = jnp.where(ok, e_dev * n, jnp.inf)
    mean = lambda k: (pre[k] * ttft + dec[k] * t_dec) / total_t  # noqa: E731
    return Energy(power_w=jnp.where(ok, e_dev / total_t, 0.0),
                  uncapped_w=jnp.where(ok, mean("uncapped_w"), 0.0),
                  power_limited=ok & (pre["power_limited"] | dec["power_limited"]),
                  clock_fraction=pre["clock_fraction"],
                  joules=joules,
                  joules_per_token=jnp.where(ok, joules / (batch * osl), jnp.inf),
                  parts_w={k: jnp.where(ok, mean(k), 0.0)
                           for k in ("idle", "compute", "memory", "link")})
