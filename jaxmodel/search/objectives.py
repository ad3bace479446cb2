"""Hardware knobs and co-design objectives built from the jaxmodel formulas.

A *design* is a dict of knob values (real units). :func:`apply_knobs` turns it into a
``System`` by editing the base hardware, keeping coupled fields consistent:

==========================  ===================================================================
knob                        fields set
==========================  ===================================================================
``core_count``              ``core_count`` and ``physical_core_count`` (a die without spares)
``hbm_stacks``              ``mem_channels``, and ``mem_bw`` / ``mem_capacity`` scaled from the
                            base device's per-stack bandwidth and capacity
``global_buffer_bytes``     it and ``physical_global_buffer_bytes``
``local_buffer_bytes``      it and ``physical_local_buffer_bytes``
``link_bw``                 ``bw_per_device`` of the innermost network level
any other ``Device`` field  that field
==========================  ===================================================================

Objectives (lower is better; LLMCompass §V's "performance per cost" inverted). The served
workload is one request batch, timed by the single-configuration body of
:func:`jaxmodel.inference` (prefill, ``gen_len − 1`` decode steps, embedding, LM head and
pipeline hops; LLMCompass §IV-A/§V-A), the same numbers ``jm.inference`` returns:

- ``usd_per_mtok`` (default): total cost of ownership per million generated tokens,
  :func:`jaxmodel.tco` (system capital — devices, hosts, network — amortised, plus energy)
  at the served throughput ``batch·gen_len / time`` (``jm.inference``'s ``tokens_per_s``);
- ``usd_seconds``: device cost (:func:`jaxmodel.device_cost`, die + memory + package) × the
  serving time — LLMCompass Table IV's performance/cost, inverted;
- ``latency_cost_cap``: the serving time, plus a quadratic penalty when the device cost
  exceeds ``cost_cap_usd`` ("latency under a cost cap").

Every objective is multiplied by ``1 + penalty·max(0, memory/capacity − 1)²``: weights, KV
cache and working set per device (:func:`jaxmodel.workload.memory.inference_memory`) must fit
the device memory, which the ``hbm_stacks`` knob sets.

:func:`run_spec` runs :func:`jaxmodel.codesign` from a TOML spec (the ``jaxmodel codesign``
command).

Example:
    >>> obj = make_objective(hw_db.system("dgx_a100"), hw_db.model("gpt3-175b"),
    ...                      jm.Parallelism(tp=8))
    >>> float(obj({"core_count": 108.0, "hbm_stacks": 5.0}))      # USD per million tokens
    8.09
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from jaxmodel.types import Device, Model, Parallelism, System

__all__ = ["apply_knobs", "make_objective", "OBJECTIVES", "run_spec"]

OBJECTIVES = ("usd_per_mtok", "usd_seconds", "latency_cost_cap")
_DEVICE_FIELDS = {f.name for f in dataclasses.fields(Device)} - {"name"}
_SPECIAL = {"core_count", "hbm_stacks", "global_buffer_bytes", "local_buffer_bytes", "link_bw"}


def knob_names() -> list[str]:
    """Accepted knob names."""
    return sorted(_SPECIAL | _DEVICE_FIELDS)


def apply_knobs(system: System, params: Mapping[str, Any]) -> System:
    """``system`` with the knobs of ``params`` applied (see module docstring).

    Raises:
        ValueError: unknown knob name.
    """
    dev = system.device
    upd: dict = {}
    for k, v in params.items():
        if k == "core_count":
            upd.update(core_count=v, physical_core_count=v)
        elif k == "hbm_stacks":
            per_bw = dev.mem_bw / dev.mem_channels
            per_cap = dev.mem_capacity / dev.mem_channels
            upd.update(mem_channels=v, mem_bw=v * per_bw, mem_capacity=v * per_cap)
            if hasattr(dev, "physical_mem_channels"):
                upd["physical_mem_channels"] = v
        elif k in ("global_buffer_bytes", "local_buffer_bytes"):
            upd[k] = v
            if hasattr(dev, f"physical_{k}"):
                upd[f"physical_{k}"] = v
        elif k == "link_bw":
            continue
        elif k in _DEVICE_FIELDS:
            upd[k] = v
        else:
            raise ValueError(f"codesign: unknown knob {k!r}; known: {knob_names()}")
    levels = system.levels
    if "link_bw" in params:
        if not levels:
            raise ValueError("codesign: knob 'link_bw' needs a system with a network level")
        levels = (dataclasses.replace(levels[0], bw_per_device=params["link_bw"]),) + tuple(
            levels[1:])
    return dataclasses.replace(system, device=dataclasses.replace(dev, **upd), levels=levels)


#: The served workload of an objective (a spec's ``[workload]`` table) and its defaults:
#: ``batch``, ``prompt_len``, ``gen_len`` as :func:`jaxmodel.inference` takes them
#: (``batch`` over the plan's ``dp`` replicas), ``n_layers`` (serve that many layers of the
#: model; None = all) and ``precision`` (preset name or :class:`jaxmodel.Precision` of the
#: served model: rates, weight / KV-cache bytes; None = ``"bf16"``).
WORKLOAD_DEFAULTS = {"batch": 8.0, "prompt_len": 2048.0, "gen_len": 1024.0, "n_layers": None,
                     "precision": None}


def _serving(system: System, model: Model, par: Parallelism, workload: Mapping, gemm=None,
             variant=None):
    """:func:`jaxmodel.inference`'s single-configuration body on the served ``workload``
    (keys of :data:`WORKLOAD_DEFAULTS`, the missing ones at their defaults), with every rule
    but memory (the objectives penalise memory smoothly)."""
    from jaxmodel.parallel.inference_step import inference_single
    from jaxmodel.workload import layer as _layer
    wl = {**WORKLOAD_DEFAULTS, **workload}
    if wl["n_layers"] is not None:
        model = dataclasses.replace(model, n_layers=wl["n_layers"])
    return inference_single(system, model, par, wl["batch"], wl["prompt_len"], wl["gen_len"],
                            gemm=gemm, variant=_layer.ANY if variant is None else variant,
                            memory_rule=False, precision=wl["precision"])


def make_objective(system: System, model: Model, par: Parallelism,
                   kind: str = "usd_per_mtok", *, cost_cap_usd=None, penalty=10.0, soft=None,
                   **workload) -> Callable:
    """An objective ``f(params) -> scalar`` for :func:`jaxmodel.codesign` (lower is better).

    Args:
        system, model, par: the base hardware, model and (inference) parallelism.
        kind: one of :data:`OBJECTIVES` (module docstring).
        cost_cap_usd: device cost cap of ``latency_cost_cap``.
        penalty: weight of the squared relative violation of the memory capacity (and of
            the cost cap).
        soft: optional soft-min temperature of the GEMM tile search (smoother gradients).
        **workload: the served workload, the keys of :data:`WORKLOAD_DEFAULTS` (``batch``,
            ``prompt_len``, ``gen_len``, ``n_layers``, ``precision``).

    Raises:
        ValueError: an unknown objective or workload key (named), or ``latency_cost_cap``
            without ``cost_cap_usd``.
    """
    from jaxmodel import cost as _cost
    from jaxmodel import ops as _ops
    from jaxmodel.cost.area import area_fields
    if kind not in OBJECTIVES:
        raise ValueError(f"codesign: objective={kind!r} is not one of {OBJECTIVES}")
    if kind == "latency_cost_cap" and cost_cap_usd is None:
        raise ValueError("codesign: objective 'latency_cost_cap' needs cost_cap_usd")
    unknown = sorted(set(workload) - set(WORKLOAD_DEFAULTS))
    if unknown:
        raise ValueError(f"codesign: unknown workload key(s) {unknown}; known "
                         f"{sorted(WORKLOAD_DEFAULTS)}")
    gemm = None
    if soft is not None:
        def gemm(dev, m, n, k, b=1.0, d=2.0):
            return _ops.gemm_latency.single(dev, m, n, k, batch=b, dtype_bytes=d, soft=soft)
    from jaxmodel.workload import layer as _layer
    base = dataclasses.replace(system, device=area_fields(system.device))
    variant = _layer.variant_of(model, par, base)

    def objective(params):
        s = apply_knobs(base, params)
        r = _serving(s, model, par, workload, gemm, variant)
        t = r.total_s
        over = jnp.maximum(r.memory_bytes / s.device.mem_capacity - 1.0, 0.0)
        fit = 1.0 + penalty * over ** 2
        if kind == "usd_per_mtok":
            return _cost.tco.single(s, r.tokens_per_s).usd_per_million_tokens * fit
        usd = _cost.device_cost.single(s.device).total_usd
        if kind == "usd_seconds":
            return usd * t * fit
        excess = jnp.maximum(usd / cost_cap_usd - 1.0, 0.0)
        return t * (1.0 + penalty * excess ** 2) * fit

    return objective


def base_values(system: System, knobs) -> dict:
    """Current values of ``knobs`` in ``system`` (the inverse of :func:`apply_knobs`)."""
    dev = system.device
    out = {}
    for k in knobs:
        if k == "hbm_stacks":
            out[k] = float(dev.mem_channels)
        elif k == "link_bw":
            out[k] = float(system.levels[0].bw_per_device)
        elif k in _DEVICE_FIELDS:
            out[k] = float(getattr(dev, k))
        else:
            raise ValueError(f"codesign: unknown knob {k!r}; known: {knob_names()}")
    return out


def evaluate_design(system: System, model: Model, par: Parallelism, params: Mapping,
                    **workload) -> dict:
    """Time, device cost and die area of one design (concrete numbers, for reports)."""
    from jaxmodel.cost.area import area_fields
    from jaxmodel.workload import layer as _layer
    from jaxmodel.precisions import precision as _as_precision
    f = jnp.result_type(float)
    base = dataclasses.replace(system, device=area_fields(system.device))
    wl = {k: jnp.asarray(v, f) for k, v in workload.items() if v is not None
          and k != "precision"}
    wl["precision"] = _as_precision(workload.get("precision"))
    out = _design_metrics(base, model, par, {k: jnp.asarray(v, f) for k, v in params.items()},
                          wl, variant=_layer.variant_of(model, par, base))
    return {k: float(v) for k, v in out.items()}


@functools.partial(jax.jit, static_argnames=("variant",))
def _design_metrics(system, model, par, params, workload, variant):
    """Jitted body of :func:`evaluate_design` (op-by-op eager evaluation takes seconds)."""
    from jaxmodel import cost as _cost
    s = apply_knobs(system, params)
    t = _serving(s, model, par, workload, variant=variant).total_s
    c = _cost.device_cost.single(s.device)
    return {"time_s": t, "device_usd": c.total_usd, "die_area_mm2": c.die_area_mm2,
            "usd_seconds": t * c.total_usd, "mem_capacity_gb": s.device.mem_capacity / 1e9,
            "mem_bw_gbs": s.device.mem_bw / 1e9}


def run_spec(spec: Mapping, steps: int | None = None) -> dict:
    """Run a co-design TOML spec; return a JSON-ready summary.

    Spec keys: ``system``/``nodes`` (or ``device``), ``model``, ``[parallelism]``,
    ``[workload]`` (batch, prompt_len, gen_len, n_layers), ``[codesign]`` (objective, steps,
    n_starts, learning_rate, integer = [...], cost_cap_usd, soft, seed), ``[bounds]``
    (knob = [lo, hi]) and optional ``[init]`` (default: the base hardware's values).
    """
    import hw_db
    from jaxmodel.search.optimize import CodesignOptions, codesign
    cd = dict(spec.get("codesign", {}))
    bounds = {k: tuple(v) for k, v in dict(spec.get("bounds", {})).items()}
    if not bounds:
        raise ValueError("codesign spec: missing [bounds] (knob = [lo, hi])")
    system = _spec_system(spec.get("system"), spec.get("nodes"), spec.get("device"))
    model = hw_db.model(spec.get("model", "gpt3-175b"))
    par = _spec_parallelism(dict(spec.get("parallelism", {})), float(system.n_devices))
    wl = dict(spec.get("workload", {}))
    unknown = set(wl) - set(WORKLOAD_DEFAULTS)
    if unknown:
        raise ValueError(f"codesign spec: unknown [workload] key(s) {sorted(unknown)}")
    for k in bounds:
        if k not in _SPECIAL and k not in _DEVICE_FIELDS:
            raise ValueError(f"codesign spec: unknown knob {k!r}; known: {knob_names()}")
    kind = cd.get("objective", "usd_per_mtok")
    obj = make_objective(system, model, par, kind=kind, cost_cap_usd=cd.get("cost_cap_usd"),
                         soft=cd.get("soft"), **wl)
    exact = make_objective(system, model, par, kind=kind, cost_cap_usd=cd.get("cost_cap_usd"),
                           **wl)
    init = {**base_values(system, bounds), **dict(spec.get("init", {}))}
    init = {k: min(max(v, bounds[k][0]), bounds[k][1]) for k, v in init.items()}
    res = codesign(obj, init, bounds, steps or int(cd.get("steps", 100)),
                   integer=tuple(cd.get("integer", ())), exact=exact,
                   options=CodesignOptions(n_starts=int(cd.get("n_starts", 4)),
                                           learning_rate=float(cd.get("learning_rate", 0.05)),
                                           seed=int(cd.get("seed", 0))))
    return {"objective": kind, "params": res.params,
            "value": res.value, "continuous_params": res.continuous_params,
            "continuous_value": res.continuous_value, "n_evals": res.n_evals,
            "best_history": res.best_history[:: max(1, len(res.best_history) // 20)].tolist(),
            "design": evaluate_design(system, model, par, res.params, **wl)}


def _spec_system(name: str | None, nodes: int | None, device: str | None) -> System:
    """The system of a spec: a named system (``nodes`` of it), else one ``device``, else
    DGX A100."""
    import hw_db
    if name:
        return hw_db.system(name, nodes=nodes)
    if device:
        return System(device=hw_db.device(device), levels=(), name=f"1x{device}")
    return hw_db.system("dgx_a100" if "dgx_a100" in hw_db.names("system")
                        else hw_db.names("system")[0], nodes=nodes)


def _spec_parallelism(values: Mapping, n_devices: float) -> Parallelism:
    """The plan of a spec's ``[parallelism]`` table; ``dp`` defaults to the devices left."""
    from jaxmodel.types import validate_parallelism
    known = [f.name for f in dataclasses.fields(Parallelism)]
    unknown = set(values) - set(known)
    if unknown:
        raise ValueError(f"parallelism: unknown field(s) {sorted(unknown)}; known: {known}")
    kw = {k: v for k, v in values.items() if v is not None}
    if "dp" not in kw:
        tp, pp = float(kw.get("tp", 1)), float(kw.get("pp", 1))
        kw["dp"] = max(1.0, float(n_devices) / (tp * pp))
    return validate_parallelism(Parallelism(**kw))
