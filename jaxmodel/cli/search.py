"""``jaxmodel sweep``, ``search``, ``serve-search`` and ``codesign`` (the design-space
commands), and ``--distributed``: the same as one multi-process ``jax.distributed`` job
(:mod:`jaxmodel.distributed`), the answer written by process 0 only."""

from __future__ import annotations

import sys
from typing import Any, Mapping

from jaxmodel.plan_io import load_system as _load_system
from jaxmodel.cli.common import _hardware_args, _number, _public_fn, build_call, load_spec
from jaxmodel.cli.launch import _search_export


SWEEP_KEYS = ("function", "system", "nodes", "device", "model", "parallelism", "par", "args",
              "grid", "chunk")


CODESIGN_KEYS = ("system", "nodes", "device", "model", "parallelism", "workload", "codesign",
                 "bounds", "init")


CODESIGN_OPTIONS = {"objective": str, "steps": int, "n_starts": int, "learning_rate": float,
                    "integer": list, "cost_cap_usd": float, "soft": float, "seed": int}


def check_codesign_spec(spec: Mapping, path: str) -> None:
    """Types and shapes of a co-design spec's tables (ranges are checked by the loaders)."""
    for table in ("codesign", "bounds", "init", "workload", "parallelism"):
        if table in spec and not isinstance(spec[table], Mapping):
            raise ValueError(f"{path}: [{table}] must be a table, got {spec[table]!r}")
    for k, v in dict(spec.get("codesign", {})).items():
        if k not in CODESIGN_OPTIONS:
            import difflib
            close = difflib.get_close_matches(k, list(CODESIGN_OPTIONS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ValueError(f"{path}: unknown [codesign] key '{k}'{hint}; known: "
                             f"{list(CODESIGN_OPTIONS)}")
        kind = CODESIGN_OPTIONS[k]
        if kind is str and not isinstance(v, str):
            raise ValueError(f"{path}: [codesign] {k} must be a string, got {v!r}")
        if kind is list and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise ValueError(f"{path}: [codesign] {k} must be a list of knob names, got {v!r}")
        if kind in (int, float):
            _number(f"{path}: [codesign] {k}", v, integer=kind is int, positive=k != "seed")
    for k, v in dict(spec.get("bounds", {})).items():
        if not isinstance(v, list) or len(v) != 2:
            raise ValueError(f"{path}: [bounds] {k} must be [lo, hi], got {v!r}")
        lo = _number(f"{path}: [bounds] {k} lower bound", v[0], positive=True)
        hi = _number(f"{path}: [bounds] {k} upper bound", v[1], positive=True)
        if lo >= hi:
            raise ValueError(f"{path}: [bounds] {k} = {v!r} needs lo < hi")
    for k, v in dict(spec.get("init", {})).items():
        _number(f"{path}: [init] {k}", v, positive=True)
    for k, v in dict(spec.get("workload", {})).items():
        _number(f"{path}: [workload] {k}", v, integer=True, positive=True)


def cmd_sweep(a) -> Any:
    import jaxmodel as jm
    spec = load_spec(a.spec, SWEEP_KEYS)
    if "function" not in spec:
        raise ValueError(f"{a.spec}: missing 'function' (e.g. function = \"inference\")")
    fn = _public_fn(spec["function"])
    args, kwargs = build_call(fn, spec)
    chunk = _number(f"{a.spec}: chunk", spec.get("chunk", 4096), integer=True, positive=True)
    grid = spec.get("grid")
    if grid is not None and not isinstance(grid, Mapping):
        raise ValueError(f"{a.spec}: [grid] must be a table, got {grid!r}")
    return jm.sweep(fn, *args, grid=grid, chunk=int(chunk), progress=not a.quiet, **kwargs)


def _step_options(items) -> dict:
    """``["dp_overlap=0,1", "tp_overlap=0,1"]`` → ``{"dp_overlap": [0.0, 1.0], ...}``."""
    from jaxmodel.types import validate_knobs
    out = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        try:
            vals = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            vals = []
        if not sep or not name.strip() or not vals:
            raise ValueError(f"--step-option {item!r}: expected NAME=V1,V2,... with numbers")
        for v in vals:
            validate_knobs("--step-option", **{name.strip(): v})
        out[name.strip()] = vals
    return out


def cmd_search(a) -> Any:
    import hw_db
    import jaxmodel as jm
    system = _load_system(a.system, a.nodes, a.device)
    model = hw_db.model(a.model)
    n = int(a.n_devices or round(float(system.n_devices)))
    if n < 1:
        raise ValueError(f"--n-devices must be >= 1, got {n}")
    df = jm.search_parallelism(system, model, n, a.global_batch, a.seq_len,
                               progress=not a.quiet,
                               step_options=_step_options(a.step_option) or None,
                               precision=a.precision.split(",") if a.precision else None)
    n_eval = df.attrs.get("n_evaluated")
    if not a.quiet:
        print(f"evaluated {n_eval:,} configurations in {df.attrs.get('wall_s', 0):.1f} s",
              file=sys.stderr)
    if getattr(a, "export", None):
        return _search_export(a, df, system, model)
    return df.head(a.top) if a.top else df


def cmd_codesign(a) -> Any:
    from jaxmodel.search import objectives
    spec = load_spec(a.spec, CODESIGN_KEYS)
    check_codesign_spec(spec, a.spec)
    if "system" in spec and "device" in spec:
        raise ValueError(f"{a.spec}: give either system or device, not both")
    return objectives.run_spec(spec, steps=a.steps)


def _serve_search_parser(add) -> None:
    p = add("serve-search", "search serving deployments (continuous batching, chunked prefill, "
            "disaggregated prefill/decode) under TTFT/TPOT limits; prints the Pareto front",
            "csv")
    _hardware_args(p)
    p.add_argument("--n-devices", type=int, dest="n_devices",
                   help="devices (default: the system's)")
    p.add_argument("--isl", type=float, default=1024, help="mean prompt tokens per request")
    p.add_argument("--osl", type=float, default=256, help="mean output tokens per request")
    p.add_argument("--ttft-slo", type=float, default=float("inf"), dest="ttft_slo",
                   help="limit on the mean time to first token, s")
    p.add_argument("--tpot-slo", type=float, default=float("inf"), dest="tpot_slo",
                   help="limit on the mean time per output token, s")
    p.add_argument("--precision", default="bf16,fp8",
                   help="comma-separated precision presets to search (default bf16,fp8)")
    p.add_argument("--runtime", default="pytorch,trtllm,vllm",
                   help="comma-separated runtime presets to search (default all three)")
    p.add_argument("--p99", action="store_true",
                   help="the limits bound the 99th percentiles instead of the means")
    p.add_argument("--ep", default="1",
                   help="comma-separated expert-parallel degrees to search for a "
                        "mixture-of-experts model (default 1)")
    p.add_argument("--speculative", default="",
                   help="comma-separated speculative options to search besides none: "
                        "METHOD:K:ACCEPT with METHOD mtp or eagle, e.g. eagle:3:0.7")
    p.add_argument("--no-disagg", action="store_true", dest="no_disagg",
                   help="aggregated serving only")
    p.add_argument("--all", action="store_true", dest="all_rows",
                   help="every evaluated configuration (with a 'pareto' column)")
    p.add_argument("--plot", help="write a PNG of the front here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_serve_search, table=True)


def cmd_serve_search(a) -> Any:
    import hw_db
    import jaxmodel as jm
    if a.device:
        raise ValueError("serve-search needs --system (a device alone has no network)")
    for name in ("isl", "osl"):
        v = getattr(a, name)
        if not (v >= 1 and v == int(v)):
            raise ValueError(f"--{name} must be an integer >= 1, got {v:g}")
    for name in ("ttft_slo", "tpot_slo"):
        if not getattr(a, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds, got "
                             f"{getattr(a, name):g}")
    system = _load_system(a.system, a.nodes, None)
    model = hw_db.model(a.model)
    df = jm.search_serving(system, model, a.n_devices, a.isl, a.osl,
                           ttft_slo_s=a.ttft_slo, tpot_slo_s=a.tpot_slo,
                           precision=[x for x in a.precision.split(",") if x],
                           runtime=[x for x in a.runtime.split(",") if x],
                           disaggregated=not a.no_disagg, full=a.all_rows or bool(a.plot),
                           progress=not a.quiet, tail=a.p99,
                           ep=_int_list(a.ep, "--ep"),
                           speculative=[None] + _speculative_list(a.speculative))
    if a.plot:
        from jaxmodel.plots import serving_plot
        serving_plot(df, path=a.plot, title=f"{model.name} on {df.attrs['n_devices']} × "
                                            f"{system.device.name}")
        if not a.all_rows:
            attrs = df.attrs
            df = df[df["pareto"]].sort_values("tokens_per_s_per_user",
                                              kind="stable").reset_index(drop=True)
            df.attrs.update(attrs)
    if not a.quiet:
        print(f"evaluated {df.attrs['n_evaluated']:,} configurations in "
              f"{df.attrs['wall_s']:.1f} s; {df.attrs['n_meeting_slo']:,} meet the limits",
              file=sys.stderr)
    return df


def _int_list(text: str, flag: str) -> list[int]:
    """Comma-separated integers >= 1 (``ValueError`` naming the flag and value)."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{flag} must list integers >= 1, got {text!r}")
    return vals


def _speculative_list(text: str) -> list:
    """``METHOD:K:ACCEPT`` items (METHOD ``mtp`` or ``eagle``) as :class:`jaxmodel.Speculative`."""
    import jaxmodel as jm
    out = []
    for item in (x for x in text.split(",") if x.strip()):
        parts = item.split(":")
        if len(parts) != 3 or parts[0] not in ("mtp", "eagle"):
            raise ValueError(f"--speculative item {item!r} must be METHOD:K:ACCEPT with METHOD "
                             "mtp or eagle (e.g. eagle:3:0.7)")
        try:
            k, acc = float(parts[1]), float(parts[2])
        except ValueError:
            raise ValueError(f"--speculative item {item!r}: K and ACCEPT must be numbers") \
                from None
        out.append(jm.Speculative(parts[0], k=k, accept=acc))
    return out


DISTRIBUTED_COMMANDS = ("sweep", "search", "serve-search", "codesign")


def _cmd_distributed(func):
    """``func`` (a command) run inside a ``jax.distributed`` job when ``--distributed`` is
    given: the job is joined first (flags, else ``JAX_COORDINATOR_ADDRESS`` /
    ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID``, else SLURM / Open MPI / Kubernetes as JAX
    detects them); processes other than 0 compute their share quietly and write nothing."""
    def run(a):
        if not a.distributed:
            return func(a)
        from jaxmodel import distributed
        distributed.initialize(a.coordinator, a.num_processes, a.process_id)
        if not distributed.is_main():
            a.emit = False
            if hasattr(a, "quiet"):
                a.quiet = True
        return func(a)
    run.__name__ = getattr(func, "__name__", "run")
    return run


def _distributed_parser(sub) -> None:
    for name in DISTRIBUTED_COMMANDS:
        p = sub.choices[name]
        g = p.add_argument_group(
            "multi-process run", "split the design space over the processes of a "
            "jax.distributed job (start the same command on every process); results are "
            "gathered and written by process 0")
        g.add_argument("--distributed", action="store_true",
                       help="join a jax.distributed job (coordinator, count and id from the "
                            "flags below, JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / "
                            "JAX_PROCESS_ID, or SLURM / Open MPI / Kubernetes)")
        g.add_argument("--coordinator", help="coordinator address host:port (process 0's)")
        g.add_argument("--num-processes", type=int, dest="num_processes",
                       help="processes in the job")
        g.add_argument("--process-id", type=int, dest="process_id",
                       help="this process's index, 0 .. num-processes - 1")
        p.set_defaults(func=_cmd_distributed(p.get_default("func")))
