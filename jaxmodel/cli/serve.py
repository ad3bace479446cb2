"""``jaxmodel serve {offline,slo}``: the throughput of one serving deployment
(:func:`jaxmodel.offline_throughput`, :func:`jaxmodel.slo_throughput`)."""

from __future__ import annotations

from typing import Any

from jaxmodel.plan_io import to_jsonable
from jaxmodel.cli.common import _hardware_args, build_call


def _serve_parser(add) -> None:
    p = add("serve", "throughput of one serving deployment: offline (every request queued, "
            "trtllm-bench / MLPerf Offline) or the highest Poisson rate meeting p99 TTFT/TPOT "
            "limits")
    p.add_argument("mode", choices=["offline", "slo"])
    _hardware_args(p)
    g = p.add_argument_group("parallelism (default: tp = GPUs per node when it divides the "
                             "heads, pp = 1, dp = the devices left)")
    for f in ("dp", "tp", "pp", "ep"):
        g.add_argument(f"--{f}", type=float, dest=f, default=None)
    p.add_argument("--isl", type=float, default=1024, help="prompt tokens per request")
    p.add_argument("--osl", type=float, default=256, help="output tokens per request")
    p.add_argument("--precision", help="precision preset (default bf16)")
    p.add_argument("--runtime", default="trtllm_v1",
                   help="runtime preset: trtllm_v1 (default), vllm_v1, sglang, trtllm, vllm "
                        "(its scheduler defaults fill the settings not given)")
    p.add_argument("--max-batch", type=float, dest="max_batch",
                   help="sequences per replica (max_batch_size / max_num_seqs)")
    p.add_argument("--max-tokens", type=float, dest="max_tokens",
                   help="offline: tokens per iteration (max_num_tokens)")
    p.add_argument("--chunk", type=float, help="slo: chunked-prefill tokens (0 = off)")
    p.add_argument("--ttft-p99", type=float, dest="ttft_p99", help="slo: p99 TTFT limit, s")
    p.add_argument("--tpot-p99", type=float, dest="tpot_p99", help="slo: p99 TPOT limit, s")
    s = p.add_argument_group("speculative decoding (jaxmodel.speculative)")
    s.add_argument("--speculative", choices=["mtp", "eagle", "draft_model"],
                   help="proposer of draft tokens (default: none)")
    s.add_argument("--draft-k", type=float, dest="draft_k", default=1.0,
                   help="draft tokens per verification step (default 1)")
    s.add_argument("--accept", type=float, default=0.8,
                   help="per-token acceptance rate in [0, 1] (default 0.8)")
    s.add_argument("--draft-model", dest="draft_model",
                   help="hw_db model of the draft (--speculative draft_model)")
    p.set_defaults(func=cmd_serve, table=False)


def cmd_serve(a) -> Any:
    import jaxmodel as jm
    for name in ("isl", "osl"):
        v = getattr(a, name)
        if not (v >= 1 and v == int(v)):
            raise ValueError(f"--{name} must be an integer >= 1, got {v:g}")
    spec = {"model": a.model, "parallelism": {f: getattr(a, f) for f in ("dp", "tp", "pp",
                                                                          "ep")
                                              if getattr(a, f, None) is not None}}
    for k in ("system", "nodes", "device"):
        if getattr(a, k, None) is not None:
            spec[k] = getattr(a, k)
    kw = dict(precision=a.precision, runtime=a.runtime, max_batch=a.max_batch)
    if (getattr(a, "speculative", None) == "draft_model") != (
            getattr(a, "draft_model", None) is not None):
        raise ValueError("--draft-model goes with --speculative draft_model (and only with it)")
    if getattr(a, "speculative", None):
        import hw_db
        kw["speculative"] = jm.Speculative(
            a.speculative, k=a.draft_k, accept=a.accept,
            draft=hw_db.model(a.draft_model) if a.draft_model else None)
    if a.mode == "offline":
        if a.ttft_p99 is not None or a.tpot_p99 is not None or a.chunk is not None:
            raise ValueError("--ttft-p99/--tpot-p99/--chunk apply to 'serve slo'")
        fn = jm.offline_throughput
        kw["max_tokens"] = a.max_tokens
    else:
        if a.ttft_p99 is None or a.tpot_p99 is None:
            raise ValueError("'serve slo' needs --ttft-p99 and --tpot-p99 (seconds)")
        if a.max_tokens is not None:
            raise ValueError("--max-tokens applies to 'serve offline'")
        fn = jm.slo_throughput
        kw.update(ttft_p99_s=a.ttft_p99, tpot_p99_s=a.tpot_p99, chunk=a.chunk)
    spec["args"] = {"isl": a.isl, "osl": a.osl}
    args, _ = build_call(fn, spec)
    res = to_jsonable(fn(*args, **kw))
    out = {"mode": a.mode, "system": args[0].name, "model": args[1].name,
           "parallelism": to_jsonable(args[2]), "isl": a.isl, "osl": a.osl,
           "runtime": a.runtime, **res}
    if "speculative" in kw:
        from jaxmodel.speculative import tokens_per_step
        out["speculative"] = {"method": a.speculative, "k": a.draft_k, "accept": a.accept,
                              "tokens_per_step": float(tokens_per_step(kw["speculative"]))}
    return out
