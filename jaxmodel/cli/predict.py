"""``jaxmodel predict``, ``list`` and ``cost``: one training step or request batch
(:func:`jaxmodel.train_step`, :func:`jaxmodel.inference`) with its energy and memory table;
the hw_db names; die area and costs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping

from jaxmodel.plan_io import to_jsonable
from jaxmodel.cli.common import _spec_from_args, build_call


def cmd_list(a) -> Any:
    import hw_db
    kinds = {"devices": "device", "systems": "system", "models": "model"}
    chosen = [a.kind] if a.kind != "all" else list(kinds)
    out = {k: hw_db.names(kinds[k]) for k in chosen}
    if "models" in out:
        from jaxmodel.workload.params import param_count
        # total and per-token (active) parameters, billions (jaxmodel.param_count)
        out["models"] = {n: {"params_b": round(float(param_count.single(m)) / 1e9, 3),
                             "active_params_b": round(float(param_count.single(m, True)) / 1e9,
                                                      3)}
                         for n, m in ((n, hw_db.model(n)) for n in out["models"])}
    return out


# workload sizes: scalar inputs of the compiled functions, never a static switch, so a
# question differing only in them uses the same executables
_WORKLOAD_OPTIONS = ("--global-batch", "--seq-len", "--batch", "--prompt-len", "--gen-len")


def _question_file(a) -> Path | None:
    """Where the export cache notes which stored executables this command line used (None
    without an export cache); the workload sizes are left out of the name, so a later
    process asking the same question, or the same one with other sizes, starts loading them
    at once, in the background (:func:`jaxmodel.batching.prefetch_executables`)."""
    from jaxmodel.process import export_cache_dir
    d = export_cache_dir()
    argv = getattr(a, "argv", None)
    if d is None or argv is None:
        return None
    shape, skip = [], False
    for tok in argv:
        name = tok.split("=")[0]
        shape.append("#" if skip else name + "=#" if "=" in tok and name in _WORKLOAD_OPTIONS
                     else tok)
        skip = tok in _WORKLOAD_OPTIONS
    import hashlib
    return d / "questions" / f"{hashlib.sha1(repr(shape).encode()).hexdigest()}.txt"


def _predict_xla_flags() -> None:
    """Add :data:`jaxmodel.batching.ONE_SHOT_COMPILE_OPTIONS` to ``XLA_FLAGS`` where they
    can still act (JAX's backend not started; XLA reads the variable then) and the user set
    none of them: a one-configuration question compiles in about half the CPU time (24 ->
    16 s of CPU for a Llama-2-13B training step on an empty cache with the elemental
    emitters, and LLVM at -O0 another 1.6 s per big graph) with the same numbers
    (experiments/bench_predict.py compares them with the library's). The compilation caches
    key on ``XLA_FLAGS``, so these executables are kept apart."""
    from jaxmodel.batching import ONE_SHOT_COMPILE_OPTIONS, add_xla_flags
    from jaxmodel.process import _cli_process
    if _cli_process():         # in-process use: leave the host program's compiler alone
        add_xla_flags(ONE_SHOT_COMPILE_OPTIONS)


def cmd_predict(a) -> Any:
    from jaxmodel import batching
    _predict_xla_flags()
    question = _question_file(a)
    if question is not None and question.is_file():
        batching.prefetch_executables(question.read_text().split("\n"))
    with batching.recording_executables() as paths:
        result = _predict(a)
    if question is not None:
        used = "\n".join(str(p) for p in paths)
        if not question.is_file() or question.read_text() != used:
            batching.atomic_write(question, used.encode())
    return result


def _predict(a) -> Any:
    import jaxmodel as jm
    spec = _spec_from_args(a)
    if a.phase == "train":
        spec["args"] = {"global_batch": a.global_batch, "seq_len": a.seq_len}
        fn = jm.train_step
        if a.global_batch is None:               # 8 sequences per data-parallel replica
            spec["args"]["global_batch"] = 1.0
            args, _ = build_call(fn, spec)
            spec["args"]["global_batch"] = 8.0 * float(args[2].dp) * float(
                args[2].micro_batch)
    else:
        spec["args"] = {"batch": a.batch, "prompt_len": a.prompt_len, "gen_len": a.gen_len}
        fn = jm.inference
    if a.precision:
        spec["args"]["precision"] = a.precision
    if getattr(a, "runtime", None):
        if a.phase == "train":
            raise ValueError("--runtime applies to serving (prefill, decode, inference)")
        spec["args"]["runtime"] = a.runtime
    args, kwargs = build_call(fn, spec)
    lora = getattr(a, "lora_rank", None)
    if lora is not None or getattr(a, "lora_base", None):
        if a.phase != "train":
            raise ValueError("--lora-rank/--lora-base apply to training (predict train)")
        kwargs["finetune"] = jm.lora(16.0 if lora is None else lora, a.lora_modules,
                                     a.lora_base)
    raw = fn(*args, **kwargs)
    res = to_jsonable(raw)
    res.update(_energy_lines(a, args, kwargs, raw, spec))
    head = {"phase": a.phase, "system": args[0].name, "model": args[1].name,
            "parallelism": to_jsonable(args[2])}
    if a.phase == "train":
        head["global_batch"] = float(spec["args"]["global_batch"])
    if a.phase == "prefill":
        head["latency_s"] = res.get("ttft_s")
    elif a.phase == "decode":
        head["latency_s"] = res.get("tpot_s")
    res["memory_capacity_bytes"] = float(args[0].device.mem_capacity)
    if a.phase == "train":
        _print_memory_table(res)
    return {**head, **res}


def _print_memory_table(res: Mapping) -> None:
    """The training memory per device by term (GiB, :func:`jaxmodel.memory_breakdown`) as a
    small table on stderr; the JSON on stdout carries the same bytes under ``memory``."""
    import jaxmodel as jm
    mem = res.get("memory")
    if not isinstance(mem, Mapping) or any(k not in mem for k in jm.TRAIN_MEMORY_TERMS):
        return
    gib = jm.memory_breakdown({k: float(mem[k]) for k in jm.TRAIN_MEMORY_TERMS})
    cap = float(res.get("memory_capacity_bytes", 0.0)) / 2**30
    lines = ["memory per device (GiB):"]
    lines += [f"  {k:<18s}{float(v):9.2f}" for k, v in gib.items()]
    if cap > 0:
        lines.append(f"  {'capacity':<18s}{cap:9.2f}")
    print("\n".join(lines), file=sys.stderr)


def _energy_lines(a, args, kwargs, raw, spec) -> dict:
    """``joules_per_token`` (per trained / generated token, board energy of all devices) and
    ``power_w_per_gpu`` of a prediction (:mod:`jaxmodel.energy`); none for LoRA steps."""
    import jaxmodel as jm
    if kwargs.get("finetune") is not None:
        return {}
    system, model, par = args[:3]
    prec = kwargs.get("precision")
    if a.phase == "train":
        e = jm.train_energy(system, model, par, raw, prec)
    else:
        w = spec["args"]
        work = jm.InferenceOptions(float(w["batch"]), float(w["prompt_len"]),
                                   float(w["gen_len"]))
        e = jm.inference_energy(system, model, par, raw, work, prec, kwargs.get("runtime"))
    return to_jsonable({"joules_per_token": e.joules_per_token, "power_w_per_gpu": e.power_w,
                        "power_limited": e.power_limited})


def cmd_cost(a) -> Any:
    import hw_db
    import jaxmodel as jm
    out: dict = {}
    if a.nodes is not None and not a.system:
        raise ValueError("--nodes needs --system")
    if a.device or not a.system:
        dev = hw_db.device(a.device or "a100_80gb")
        out["device"] = dev.name
        out["die_area_mm2"] = to_jsonable(jm.die_area(dev))
        for name in ("die_cost", "device_cost"):
            if hasattr(jm, name):
                out[name] = to_jsonable(getattr(jm, name)(dev))
    if a.system:
        system = hw_db.system(a.system, nodes=a.nodes)
        out["system"] = system.name
        for name in ("system_cost", "tco"):
            if hasattr(jm, name):
                out[name] = to_jsonable(getattr(jm, name)(system))
    return out
