"""The explorer's questions, answered by the public API: form fields in, JSON-ready dicts out.

Every function here takes the page's form as a flat mapping of strings (the URL's query, so a
view can be shared) and answers with plain Python (numbers, strings, lists, dicts). The numbers
are those of the public functions called with the same inputs — :func:`jaxmodel.train_step`,
:func:`jaxmodel.inference`, :func:`jaxmodel.tco`, :func:`jaxmodel.search_parallelism`,
:func:`jaxmodel.search_serving` — with the library's defaults (``dp`` = the devices left by
``tp·pp·cp``), so the page and the library agree.

Bad input raises :class:`FormError` naming the form field and the value it got.

Units: SI inside (s, bytes, bytes/s, Hz, USD); the what-if knobs are shown to the user in the
units of :data:`KNOBS` (GHz, GB/s, GiB, USD) and converted here.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping

import numpy as np

from jaxmodel.numerics import pareto_mask, reason_name
from jaxmodel.plan_io import PAR_CHOICES, build_parallelism, explain_infeasible
from jaxmodel.plan_io import json_float as _finite
from jaxmodel.plan_io import to_jsonable as _plain

# --------------------------------------------------------------------------------------------
# form fields
# --------------------------------------------------------------------------------------------
PHASES = ("train", "inference")
PAR_INT = ("dp", "tp", "pp", "ep", "cp", "micro_batch", "interleave", "zero")
PAR_CHOICE = {k: PAR_CHOICES[k] for k in ("schedule", "recompute", "flash_attention")}
WORKLOAD = {"train": ("global_batch", "seq_len"),
            "inference": ("batch", "prompt_len", "gen_len")}
DEFAULTS = {"phase": "train", "system": "dgx_a100", "nodes": "1", "model": "gpt3-13b",
            "global_batch": "64", "seq_len": "2048", "batch": "8", "prompt_len": "2048",
            "gen_len": "256"}

#: What-if knobs: form key -> (label, unit shown, SI factor, where in the System).
#: ``level<i>_bw`` is the i-th network level's ``bw_per_device``; ``price`` is USD per device.
KNOBS = {
    "freq": ("clock", "GHz", 1e9, "device.freq_hz"),
    "mem_bw": ("HBM bandwidth", "GB/s", 1e9, "device.mem_bw"),
    "mem_cap": ("HBM capacity", "GiB", 2.0 ** 30, "device.mem_capacity"),
    "price": ("price per device", "USD", 1.0, None),
}
SWEEP_POINTS = 256


class FormError(ValueError):
    """A form field with a bad value; ``field`` names it (the page marks that input)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _get(form: Mapping, key: str, default: Any = None):
    v = form.get(key, default)
    if isinstance(v, (list, tuple)):
        v = v[-1] if v else default
    if isinstance(v, str):
        v = v.strip()
        if v == "":
            return default
    return v


def _number(form: Mapping, key: str, default=None, *, integer=False, positive=True,
            minimum: float | None = None) -> float | None:
    v = _get(form, key, default)
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise FormError(key, f"expected a number, got {v!r}") from None
    if not math.isfinite(x):
        raise FormError(key, f"expected a finite number, got {v!r}")
    if integer and x != round(x):
        raise FormError(key, f"expected an integer, got {v!r}")
    if positive and not x > 0:
        raise FormError(key, f"must be > 0, got {v!r}")
    if minimum is not None and x < minimum:
        raise FormError(key, f"must be >= {minimum:g}, got {v!r}")
    return x


def _choice(form: Mapping, key: str, choices, default=None) -> str | None:
    v = _get(form, key, default)
    if v is None:
        return None
    if v not in choices:
        raise FormError(key, f"expected one of {list(choices)}, got {v!r}")
    return v


def options() -> dict:
    """Names the page offers: systems, devices, models, precisions, runtimes, knobs."""
    import hw_db
    import jaxmodel as jm
    return {"systems": hw_db.names("system"), "devices": hw_db.names("device"),
            "models": hw_db.names("model"), "precisions": sorted(jm.PRESETS),
            "runtimes": sorted(jm.RUNTIMES), "phases": list(PHASES),
            "choices": {k: list(v) for k, v in PAR_CHOICE.items()},
            "knobs": {k: {"label": v[0], "unit": v[1]} for k, v in KNOBS.items()},
            "defaults": DEFAULTS, "sweep_points": SWEEP_POINTS}


# --------------------------------------------------------------------------------------------
# building the call
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Question:
    """One prediction, built: the public function, its arguments, and the page's form."""
    phase: str
    fn: Any
    args: tuple
    kwargs: dict
    system: Any
    model: Any
    par: Any


def _model(form: Mapping, body: Mapping | None):
    import hw_db
    cfg = (body or {}).get("model_config")
    if cfg is not None:
        if isinstance(cfg, str):
            try:
                cfg = json.loads(cfg)
            except json.JSONDecodeError as e:
                raise FormError("model_config", f"not valid JSON ({e})") from None
        if not isinstance(cfg, Mapping):
            raise FormError("model_config", f"expected a JSON object, got {type(cfg).__name__}")
        try:
            return hw_db.model(dict(cfg))
        except (ValueError, KeyError, TypeError) as e:
            raise FormError("model_config", str(e)) from None
    name = _get(form, "model", DEFAULTS["model"])
    if name not in hw_db.names("model"):
        raise FormError("model", f"unknown model {name!r}; known: {hw_db.names('model')}")
    return hw_db.model(name)


def _system(form: Mapping):
    import hw_db
    name = _get(form, "system", DEFAULTS["system"])
    if name not in hw_db.names("system"):
        raise FormError("system", f"unknown system {name!r}; known: {hw_db.names('system')}")
    nodes = _number(form, "nodes", DEFAULTS["nodes"], integer=True)
    try:
        return hw_db.system(name, nodes=int(nodes))
    except ValueError as e:
        raise FormError("nodes", str(e)) from None


def parallelism(spec: Mapping, n_devices: float):
    """A validated :class:`jaxmodel.Parallelism` from the form's degrees
    (:func:`jaxmodel.plan_io.build_parallelism`: ``dp`` defaults to the devices left,
    ``n_devices / (tp·pp·cp)``); a bad value is a :class:`FormError` naming its field."""
    try:
        return build_parallelism(spec, n_devices)
    except ValueError as e:
        msg = str(e)
        field = next((k for k in spec if f".{k}" in msg or f" {k} " in msg or f"'{k}'" in msg),
                     "tp")
        raise FormError(field, msg) from None


def question(form: Mapping, body: Mapping | None = None) -> Question:
    """The public call a Predict form asks for (raises :class:`FormError` on bad input)."""
    import jaxmodel as jm
    phase = _choice(form, "phase", PHASES, DEFAULTS["phase"])
    system = _system(form)
    model = _model(form, body)
    par_spec: dict = {}
    for k in PAR_INT:
        v = _number(form, k, integer=True, minimum=0 if k == "zero" else 1,
                    positive=k != "zero")
        if v is not None:
            par_spec[k] = v
    for k, choices in PAR_CHOICE.items():
        code = _get(form, k)        # a search row carries the code: 0, 1, 2 (types.py order)
        if isinstance(code, (str, int, float)) and str(code).replace(".0", "").isdigit() \
                and int(float(code)) < len(choices):
            form = {**form, k: choices[int(float(code))]}
        v = _choice(form, k, choices)
        if v is not None:
            par_spec[k] = v
    sp = _get(form, "sp")
    if sp is not None:
        if str(sp).lower() not in ("0", "1", "true", "false", "on", "off"):
            raise FormError("sp", f"expected on/off, got {sp!r}")
        par_spec["sp"] = str(sp).lower() in ("1", "true", "on")
    par = parallelism(par_spec, float(system.n_devices))
    work = {k: _number(form, k, DEFAULTS[k], integer=True) for k in WORKLOAD[phase]}
    kwargs: dict = {}
    prec = _choice(form, "precision", sorted(jm.PRESETS))
    if prec is not None:
        kwargs["precision"] = prec
    if phase == "train":
        fn = jm.train_step
        args = (system, model, par, work["global_batch"], work["seq_len"])
        if _get(form, "runtime") is not None:
            raise FormError("runtime", "applies to inference, not training")
    else:
        fn = jm.inference
        args = (system, model, par, work["batch"], work["prompt_len"], work["gen_len"])
        rt = _choice(form, "runtime", sorted(jm.RUNTIMES))
        if rt is not None:
            kwargs["runtime"] = rt
    return Question(phase, fn, args, kwargs, system, model, par)


# --------------------------------------------------------------------------------------------
# answers
# --------------------------------------------------------------------------------------------
HEADLINE = {"train": ("step_time_s", "tokens_per_s", "mfu", "memory_bytes"),
            "inference": ("ttft_s", "tpot_s", "total_s", "tokens_per_s", "memory_bytes")}


def _explain(res: Mapping, q: Question) -> str | None:
    """One line for an infeasible answer: its reason, the memory it needs when that is the
    reason, and what to change (:func:`jaxmodel.plan_io.explain_infeasible`)."""
    return explain_infeasible(
        {**res, "memory_capacity_bytes": float(q.system.device.mem_capacity)}, options=False)


def predict(form: Mapping, body: Mapping | None = None) -> dict:
    """The Predict page: headline numbers, the time breakdown (stacked bar) and memory."""
    q = question(form, body)
    res = _plain(q.fn(*q.args, **q.kwargs))
    out = {"phase": q.phase, "system": q.system.name, "model": q.model.name,
           "n_devices": float(q.system.n_devices), "parallelism": _plain(q.par),
           "headline": {k: res.get(k) for k in HEADLINE[q.phase]},
           "feasible": res.get("feasible"), "reason": res.get("reason"),
           "explain": _explain(res, q),
           "breakdown": {k: v for k, v in (res.get("breakdown") or {}).items()
                         if isinstance(v, (int, float))},
           "memory": {k: v for k, v in (res.get("memory") or {}).items()
                      if isinstance(v, (int, float))},
           "memory_capacity_bytes": float(q.system.device.mem_capacity),
           "sensitivities": None}
    return out


def predict_rows(result: Mapping) -> list[dict]:
    """A Predict answer as CSV rows: one ``(section, name, value)`` row per number."""
    rows = [{"section": "input", "name": k, "value": result[k]}
            for k in ("phase", "system", "model", "n_devices")]
    rows += [{"section": "parallelism", "name": k, "value": v}
             for k, v in (result.get("parallelism") or {}).items()]
    for sec in ("headline", "breakdown", "memory"):
        rows += [{"section": sec, "name": k, "value": v}
                 for k, v in (result.get(sec) or {}).items()]
    rows.append({"section": "headline", "name": "feasible", "value": result.get("feasible")})
    return rows


# --------------------------------------------------------------------------------------------
# sensitivities: the Predict page's card, computed on demand (a background job)
# --------------------------------------------------------------------------------------------
#: Knobs shown per metric in the sensitivities card (largest |elasticity| first).
SENS_TOP = 8


def sensitivities(form: Mapping, body: Mapping | None = None) -> dict:
    """The Predict form's sensitivities card: :func:`jaxmodel.explain_train` /
    :func:`jaxmodel.explain_serve` for the same inputs — per metric its value and the
    :data:`SENS_TOP` knobs with the largest ``|d ln metric / d ln knob|`` (with the kink
    flag and both one-sided differences), the bottleneck view (seconds per group; per phase
    for serving) and the modelled board power. ``top`` (form) changes how many knobs."""
    import jaxmodel as jm
    q = question(form, body)
    top = int(_number(form, "top", SENS_TOP, integer=True))
    if q.phase == "train":
        x = jm.explain_train(*q.args, **q.kwargs)
    else:
        x = jm.explain_serve(*q.args[:3], jm.InferenceOptions(*q.args[3:]), **q.kwargs)
    t = x.table
    metrics = {}
    for m, value in x.metrics.items():
        sub = t[t["metric"] == m].head(top)
        metrics[m] = {"value": _finite(value), "knobs": [
            {"knob": r.knob, "elasticity": _finite(r.elasticity), "kink": bool(r.kink),
             "fd_forward": _finite(r.fd_forward), "fd_backward": _finite(r.fd_backward),
             "value": _finite(r.value)} for r in sub.itertuples()]}
    bn = x.bottleneck
    views = bn if "prefill" in bn else {"step": bn}
    return {"phase": q.phase, "system": q.system.name, "model": q.model.name,
            "feasible": bool(x.feasible), "reason": reason_name(x.reason), "metrics": metrics,
            "bottleneck": {ph: {k: _finite(v) for k, v in g.items()}
                           for ph, g in views.items()},
            "power_w": _finite(x.power_w), "power_limited": bool(x.power_limited),
            "knobs_total": int(t["knob"].nunique())}


def sensitivity_rows(result: Mapping) -> list[dict]:
    """A sensitivities answer as CSV rows: one ``(metric, knob, elasticity, ...)`` row per
    shown knob, then the bottleneck seconds."""
    rows = [{"section": "elasticity", "metric": m, "knob": k["knob"],
             "elasticity": k["elasticity"], "kink": k["kink"], "fd_forward": k["fd_forward"],
             "fd_backward": k["fd_backward"], "knob_value": k["value"],
             "metric_value": d["value"]}
            for m, d in result["metrics"].items() for k in d["knobs"]]
    rows += [{"section": f"bottleneck.{ph}", "metric": g, "elasticity": None, "metric_value": v}
             for ph, view in result["bottleneck"].items() for g, v in view.items()]
    return rows


# --------------------------------------------------------------------------------------------
# what-if: one batched call of SWEEP_POINTS points per slider move
# --------------------------------------------------------------------------------------------
def knob_names(system) -> dict:
    """Form key -> (label, unit, SI factor, path) for the knobs of ``system`` (its levels)."""
    out = dict(KNOBS)
    for i, lvl in enumerate(system.levels):
        out[f"level{i}_bw"] = (f"network level {i} bandwidth (size {float(lvl.size):g})",
                               "GB/s", 1e9, f"levels.{i}.bw_per_device")
    return out


def knob_values(system) -> dict:
    """Current value of each knob of ``system`` in display units. The price's default is the
    system's capital cost per device (:func:`jaxmodel.system_cost`: devices, hosts and
    network gear, divided by the devices), so at the default :func:`jaxmodel.tco` is its own
    default."""
    import jaxmodel as jm
    out = {}
    for key, (_, _, factor, path) in knob_names(system).items():
        if path is None:
            continue
        obj = system
        for part in path.split("."):
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        out[key] = float(obj) / factor
    out["price"] = float(np.asarray(jm.system_cost(system).total_usd)) / float(
        system.n_devices)
    return out


def _set_knob(system, path: str, value):
    """``system`` with the leaf at ``path`` (``device.mem_bw``, ``levels.0.bw_per_device``)
    replaced by ``value`` (a number or an array: a batch)."""
    head, _, rest = path.partition(".")
    if head == "device":
        return dataclasses.replace(system, device=dataclasses.replace(system.device,
                                                                      **{rest: value}))
    i, _, field = rest.partition(".")
    levels = list(system.levels)
    levels[int(i)] = dataclasses.replace(levels[int(i)], **{field: value})
    return dataclasses.replace(system, levels=tuple(levels))


def _apply_knobs(form: Mapping, system, names: Mapping) -> tuple[Any, dict]:
    """``system`` with every knob the form sets; returns it and the knobs' display values."""
    vals = knob_values(system)
    for key, (_, _, factor, path) in names.items():
        v = _number(form, f"k_{key}")
        if v is None:
            continue
        vals[key] = v
        if path is not None:
            system = _set_knob(system, path, v * factor)
    return system, vals


def sweep_points(value: float, lo: float, hi: float, n: int = SWEEP_POINTS) -> np.ndarray:
    """``n`` sorted points: ``n - 1`` evenly over ``[lo, hi]`` and ``value`` itself, so the
    answer at the slider is one of the swept rows."""
    pts = np.linspace(lo, hi, n - 1)
    return np.sort(np.append(pts, value))


def whatif(form: Mapping, body: Mapping | None = None) -> dict:
    """The What-if page: the answer at the sliders' values and the curve over one knob.

    One batched call of the public function over :data:`SWEEP_POINTS` values of the swept
    knob (the others at their sliders), the slider's own value among them; the price knob
    sweeps :func:`jaxmodel.tco` over the system's capital cost (``price · devices``) at the
    predicted throughput. Costs per million tokens follow :mod:`jaxmodel.cost.ownership`
    (capital over the lifetime + energy at the datacenter defaults of ``hw_db/tech``).
    """
    import jaxmodel as jm
    q = question(form, body)
    names = knob_names(q.system)
    system, vals = _apply_knobs(form, q.system, names)
    key = _get(form, "sweep", "mem_bw")
    if key not in names:
        raise FormError("sweep", f"expected one of {list(names)}, got {key!r}")
    label, unit, factor, path = names[key]
    v = vals[key]
    lo = _number(form, "lo", v / 2)
    hi = _number(form, "hi", v * 2)
    if not lo < hi:
        raise FormError("hi", f"must exceed lo ({lo:g}), got {hi:g}")
    if not lo <= v <= hi:
        raise FormError(f"k_{key}", f"{v:g} lies outside the swept range [{lo:g}, {hi:g}]")
    xs = sweep_points(v, lo, hi)
    n_dev = float(system.n_devices)
    if path is not None:
        batch = _set_knob(system, path, xs * factor)
        res = q.fn(batch, *q.args[1:], **q.kwargs)
        tps = np.asarray(res.tokens_per_s, dtype=float)
        capex = np.full_like(xs, vals["price"] * n_dev)
    else:
        res = q.fn(system, *q.args[1:], **q.kwargs)
        tps = np.broadcast_to(np.asarray(res.tokens_per_s, dtype=float), xs.shape)
        capex = xs * n_dev
    cost = jm.tco(system, tokens_per_s=tps, capex_usd=capex)
    metrics = {k: np.broadcast_to(np.asarray(getattr(res, k), dtype=float), xs.shape)
               for k in HEADLINE[q.phase]}
    metrics["usd_per_million_tokens"] = np.asarray(cost.usd_per_million_tokens, dtype=float)
    feasible = np.broadcast_to(np.asarray(res.feasible), xs.shape)
    i = int(np.searchsorted(xs, v))
    at = {k: _finite(m[i]) for k, m in metrics.items()}
    return {"phase": q.phase, "sweep": key, "label": label, "unit": unit, "value": v,
            "knobs": vals, "x": xs.tolist(),
            "curves": {k: [_finite(y) for y in m] for k, m in metrics.items()},
            "feasible": [bool(f) for f in feasible], "at": at,
            "at_feasible": bool(feasible[i])}


def whatif_rows(result: Mapping) -> list[dict]:
    """A What-if answer as CSV rows: one row per swept point."""
    key = f"{result['sweep']} ({result['unit']})"
    return [{key: x, "feasible": f, **{k: c[j] for k, c in result["curves"].items()}}
            for j, (x, f) in enumerate(zip(result["x"], result["feasible"]))]


# --------------------------------------------------------------------------------------------
# search: parallelism (training) and serving, ranked tables with a Pareto front
# --------------------------------------------------------------------------------------------
def _frame_rows(df) -> list[dict]:
    df = df.replace([np.inf, -np.inf], np.nan)
    rows = json.loads(df.to_json(orient="records"))
    return rows


def search(form: Mapping, body: Mapping | None = None) -> dict:
    """The Search page: ``kind=train`` ranks :func:`jaxmodel.search_parallelism`'s plans
    (front: most tokens/s for the least memory per device,
    :func:`jaxmodel.numerics.pareto_mask`), ``kind=serve`` runs
    :func:`jaxmodel.search_serving` (its own front: tokens/s per GPU against tokens/s per
    user)."""
    import jaxmodel as jm
    kind = _choice(form, "kind", ("train", "serve"), "train")
    system = _system(form)
    model = _model(form, body)
    n = int(_number(form, "n_devices", float(system.n_devices), integer=True))
    top = int(_number(form, "top", 200, integer=True))
    if kind == "train":
        gb = _number(form, "global_batch", DEFAULTS["global_batch"], integer=True)
        seq = _number(form, "seq_len", DEFAULTS["seq_len"], integer=True)
        prec = _choice(form, "precision", sorted(jm.PRESETS))
        df = jm.search_parallelism(system, model, n, gb, seq, progress=False,
                                   precision=prec)
        n_eval = df.attrs.get("n_evaluated")
        df = df[df["feasible"].astype(bool)] if "feasible" in df.columns else df
        df = df.head(top).reset_index(drop=True)
        df["pareto"] = pareto_mask(np.asarray(df["memory_bytes"], dtype=float),
                                   np.asarray(df["tokens_per_s"], dtype=float))
        axes = {"x": "tokens_per_s", "y": "memory_bytes"}
    else:
        isl = _number(form, "isl", 1024, integer=True)
        osl = _number(form, "osl", 256, integer=True)
        ttft = _number(form, "ttft_slo")              # empty: no limit
        tpot = _number(form, "tpot_slo")
        ttft, tpot = (float("inf") if v is None else v for v in (ttft, tpot))
        precs = [p for p in str(_get(form, "precisions", "bf16")).split(",") if p]
        rts = [r for r in str(_get(form, "runtimes", "trtllm")).split(",") if r]
        for p in precs:
            if p not in jm.PRESETS:
                raise FormError("precisions", f"unknown precision {p!r}")
        for r in rts:
            if r not in jm.RUNTIMES:
                raise FormError("runtimes", f"unknown runtime {r!r}")
        df = jm.search_serving(system, model, n, isl, osl, ttft_slo_s=ttft, tpot_slo_s=tpot,
                               precision=precs, runtime=rts, full=True, progress=False,
                               disaggregated=_get(form, "disagg", "1") in ("1", "on", "true"))
        n_eval = df.attrs.get("n_evaluated")
        df = df.sort_values(["pareto", "throughput_per_gpu"], ascending=False,
                            kind="stable").head(top).reset_index(drop=True)
        axes = {"x": "tokens_per_s_per_user", "y": "throughput_per_gpu"}
    return {"kind": kind, "system": system.name, "model": model.name, "n_devices": n,
            "n_evaluated": n_eval, "axes": axes, "columns": list(df.columns),
            "rows": _frame_rows(df)}


def plan_form(form: Mapping, row: Mapping) -> dict:
    """The Predict form for a row of a training search (its plan on the same system)."""
    out = {k: _get(form, k) for k in ("system", "nodes", "model", "global_batch", "seq_len")
           if _get(form, k) is not None}
    out["phase"] = "train"
    for k in PAR_INT + tuple(PAR_CHOICE) + ("sp", "precision"):
        if k in row and row[k] is not None:
            v = row[k]
            out[k] = str(int(v)) if isinstance(v, (int, float)) and k != "sp" else str(v)
    return out


# --------------------------------------------------------------------------------------------
# compare: two to four plans or devices side by side
# --------------------------------------------------------------------------------------------
def compare(forms: list[Mapping], body: Mapping | None = None) -> dict:
    """Predict each form (two to four), side by side."""
    if not 2 <= len(forms) <= 4:
        raise FormError("plans", f"compare two to four plans, got {len(forms)}")
    out = []
    for i, f in enumerate(forms):
        try:
            out.append(predict(f, body))
        except FormError as e:
            raise FormError(f"plan{i + 1}.{e.field}", str(e).split(": ", 1)[1]) from None
    return {"plans": out}


def compare_rows(result: Mapping) -> list[dict]:
    rows = []
    for i, p in enumerate(result["plans"]):
        for r in predict_rows(p):
            rows.append({"plan": i + 1, **r})
    return rows
