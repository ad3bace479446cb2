"""``jaxmodel predict``, ``list`` and ``cost``: one training step or request batch
(:func:`jaxmodel.train_step`, :func:`jaxmodel.inference`) with its energy and memory table;
the hw_db names; die area and costs."""

from __future__ import annotations

import sys
from typing import Any, Mapping

from jaxmodel import batching
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


def cmd_predict(a) -> Any:
    batching.one_shot_xla_flags()     # where ``import jaxmodel`` has not added them
    # loading already started by ``import jaxmodel`` (batching.prepare_command_line) where
    # the command line begins with ``predict``; a second request is a no-op
    question = batching.prefetch_question(getattr(a, "argv", None))
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
    # one compiled call, kept in the export cache beside the prediction's (run eagerly, the
    # energy's few hundred jnp operations each compiled on their own: ~0.3 s per process)
    if a.phase == "train":
        e = batching.call_batched(jm.train_energy, system, model, par, raw, prec)
    else:
        w = spec["args"]
        work = jm.InferenceOptions(float(w["batch"]), float(w["prompt_len"]),
                                   float(w["gen_len"]))
        e = batching.call_batched(jm.inference_energy, system, model, par, raw, work, prec,
                                  kwargs.get("runtime"))
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
