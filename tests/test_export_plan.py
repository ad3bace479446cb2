"""Launch configurations (jaxmodel.export): expected flags per plan, written by hand from the
frameworks' argument parsers / config dataclasses (the releases of
``jaxmodel.export.SOURCES``), every emitted flag in the cited table, round trips, and the
errors for plans a framework cannot express. No train_step is compiled (export reads the
plan only)."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
import yaml

import hw_db
import jaxmodel as jm
from jaxmodel import export as ex

_TRAIN_KNOBS = tuple(f.name for f in ex.TrainExportOptions.__dataclass_fields__.values())
_SERVE_KNOBS = tuple(f.name for f in ex.ServeExportOptions.__dataclass_fields__.values())


def _grouped(**kw) -> dict:
    """``export_plan`` keywords from one flat dict of the cases below: the training knobs go
    into ``training=TrainExportOptions(...)``, the scheduler settings into
    ``serving=ServeExportOptions(...)``."""
    train = {k: kw.pop(k) for k in _TRAIN_KNOBS if k in kw}
    serve = {k: kw.pop(k) for k in _SERVE_KNOBS if k in kw}
    if train:
        kw["training"] = jm.TrainExportOptions(**train)
    if serve:
        kw["serving"] = jm.ServeExportOptions(**serve)
    return kw


@pytest.fixture(scope="module")
def models():
    return {n: hw_db.model(n) for n in ("llama3.1-405b", "llama3-70b", "mixtral-8x7b",
                                        "gpt3-175b", "llama2-7b")}


def _argv_flags(cfg) -> dict:
    """flag -> value (True for a switch) read back from the command line."""
    argv = shlex.split(cfg.command)
    i = next(k for k, t in enumerate(argv) if t.startswith("--") and not t.startswith(
        ("--nnodes", "--nproc")))
    out, cur = {}, None
    for t in argv[i:]:
        if t.startswith("--"):
            cur = t
            out[cur] = True
        elif out[cur] is True:
            out[cur] = t
        else:
            out[cur] = [out[cur], t] if not isinstance(out[cur], list) else out[cur] + [t]
    return out


# (name, plan fields, export kwargs, expected subset of flags, flags that must be absent)
MEGATRON_CASES = [
    # Llama 3.1 405B, 126 layers on PP 8 x VP 8: (126 + embedding + loss) / 64 = 2 per chunk
    ("405b_pp8_vp8_fp8", "llama3.1-405b",
     dict(dp=8, tp=8, pp=8, sp=True, interleave=8, schedule="interleaved",
          recompute="none", zero=1, flash_attention="fa2"),
     dict(global_batch=2048, seq_len=8192, precision="fp8", tp_overlap=1),
     {"--tensor-model-parallel-size": "8", "--pipeline-model-parallel-size": "8",
      "--num-layers-per-virtual-pipeline-stage": "2",
      "--account-for-embedding-in-pipeline-split": True,
      "--account-for-loss-in-pipeline-split": True, "--sequence-parallel": True,
      "--num-layers": "126", "--group-query-attention": True, "--num-query-groups": "8",
      "--swiglu": True, "--bf16": True, "--fp8-format": "hybrid", "--fp8-recipe": "delayed",
      "--use-distributed-optimizer": True, "--overlap-grad-reduce": True,
      "--overlap-param-gather": True, "--tp-comm-overlap": True,
      "--micro-batch-size": "1", "--global-batch-size": "2048", "--seq-length": "8192",
      "--attention-backend": "flash"},
     ("--recompute-granularity", "--decoder-first-pipeline-num-layers",
      "--context-parallel-size")),
    # the same 126 layers on PP 8 without interleaving: stages 15 | 16 x 6 | 15
    ("405b_pp8_1f1b", "llama3.1-405b",
     dict(dp=8, tp=8, pp=8, sp=True, recompute="full"),
     dict(global_batch=512, seq_len=4096),
     {"--account-for-embedding-in-pipeline-split": True,
      "--account-for-loss-in-pipeline-split": True, "--recompute-granularity": "full",
      "--recompute-method": "uniform", "--recompute-num-layers": "1"},
     ("--num-layers-per-virtual-pipeline-stage", "--fp8-format")),
    # context parallelism, 70B on 64 GPUs
    ("70b_cp2", "llama3-70b",
     dict(dp=4, tp=8, pp=1, cp=2, sp=True, recompute="selective"),
     dict(global_batch=64, seq_len=16384, dp_overlap=0),
     {"--context-parallel-size": "2", "--cp-comm-type": "p2p",
      "--recompute-granularity": "selective", "--pipeline-model-parallel-size": "1",
      "--bf16": True},
     ("--overlap-grad-reduce", "--use-distributed-optimizer", "--tp-comm-overlap",
      "--account-for-loss-in-pipeline-split")),
    # expert parallelism over the data-parallel ranks (ep | dp): experts keep tp = 1
    ("mixtral_ep8", "mixtral-8x7b",
     dict(dp=8, tp=1, pp=4, ep=8, micro_batch=1),
     dict(global_batch=256, seq_len=4096),
     {"--num-experts": "8", "--moe-router-topk": "2", "--expert-model-parallel-size": "8",
      "--expert-tensor-parallel-size": "1", "--tensor-model-parallel-size": "1"},
     ("--sequence-parallel",)),
    # ZeRO-3 (FSDP) -> Megatron-FSDP, sharding params, grads and optimizer states
    ("7b_zero3", "llama2-7b",
     dict(dp=64, tp=1, pp=1, zero=3, flash_attention=False),
     dict(global_batch=512, seq_len=4096),
     {"--use-megatron-fsdp": True, "--data-parallel-sharding-strategy": "optim_grads_params",
      "--ckpt-format": "fsdp_dtensor", "--overlap-grad-reduce": True,
      "--overlap-param-gather": True, "--attention-backend": "unfused"},
     ("--use-distributed-optimizer",)),
]


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_megatron_flags(case, models):
    _, name, fields, kw, expected, absent = case
    cfg = jm.export_plan(jm.Parallelism(**fields), framework="megatron", model=models[name],
                         **_grouped(**kw))
    got = _argv_flags(cfg)
    for flag, val in expected.items():
        assert got.get(flag) == val, (flag, got.get(flag), val)
    for flag in absent:
        assert flag not in got, flag
    # the command line reads back to the flags it was written from, all of them cited
    assert got == {k: (v if v is True else str(v) if not isinstance(v, (list, tuple))
                       else [str(x) for x in v]) for k, v in cfg.flags.items()}
    assert all(("megatron", f) in ex.FLAGS for f in got)
    assert cfg.version == ex.SOURCES["megatron"].version
    assert cfg.argv[0] == "torchrun" and cfg.argv[1] == "pretrain_gpt.py"


def _megatron_layout_stages(layout: str) -> list[int]:
    """Decoder layers per stage of a --pipeline-model-parallel-layout string, expanded as
    Megatron-core core_v0.15.0 PipelineParallelLayerLayout.parse_str_to_list does."""
    s = layout.replace(",", "")
    s = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), s)
    return [stage.count("t") for stage in s.split("|")]


@pytest.mark.parametrize("L,pp,expect", [
    (126, 8, {"--account-for-embedding-in-pipeline-split": True,
              "--account-for-loss-in-pipeline-split": True}),
    (7, 4, {"--account-for-loss-in-pipeline-split": True}),   # stages 2 | 2 | 2 | 1
    (32, 8, {}),                                                # even split: no flag
    (61, 16, None),                                             # 3 | 13 x 4, 3 | 3: layout
    (30, 4, {"--account-for-embedding-in-pipeline-split": True,  # 7 | 8 | 8 | 7
             "--account-for-loss-in-pipeline-split": True,
             "--decoder-first-pipeline-num-layers": None}),
])
def test_megatron_uneven_pipeline(L, pp, expect):
    """The model's stage split (jaxmodel.parallel.pipeline.stage_layers) is what Megatron
    builds from the emitted flags."""
    model = hw_db.model("llama2-7b")
    import dataclasses
    model = dataclasses.replace(model, n_layers=float(L))
    stages = ex.pipeline_stages(L, pp)
    assert sum(stages) == L and len(stages) == pp
    from jaxmodel.parallel.pipeline import stage_layers
    first, most, last = (int(float(x)) for x in stage_layers(float(L), float(pp)))
    assert (stages[0], max(stages), stages[-1]) == (first, most, last)
    cfg = jm.export_plan(jm.Parallelism(dp=1, tp=1, pp=pp), model=model, global_batch=8,
                         seq_len=1024)
    got = _argv_flags(cfg)
    if expect is None:
        assert _megatron_layout_stages(got["--pipeline-model-parallel-layout"]) == stages
        assert got["--pipeline-model-parallel-layout"].startswith("E")
        assert got["--pipeline-model-parallel-layout"].endswith("L")
        return
    for k, v in expect.items():
        assert got.get(k) == v, (k, got.get(k))
    if not expect:
        assert not any("pipeline-split" in k or "layout" in k or "decoder-" in k for k in got)


def test_torchtitan_zero3_fsdp(models):
    """ZeRO-3 -> FSDP2 sharding over dp; TP with SP; full AC; FP8 tensorwise; 1F1B split
    of 80 layers on 4 stages (even, no less-layer stages)."""
    par = jm.Parallelism(dp=16, tp=8, pp=4, sp=True, zero=3, micro_batch=2, recompute="full")
    cfg = jm.export_plan(par, framework="torchtitan", model=models["llama3-70b"],
                         global_batch=256, seq_len=8192, precision="fp8")
    doc = tomllib.loads(cfg.files["plan.toml"])
    P = doc["parallelism"]
    assert P["data_parallel_shard_degree"] == 16 and P["data_parallel_replicate_degree"] == 1
    assert P["fsdp_reshard_after_forward"] == "always"
    assert P["tensor_parallel_degree"] == 8 and P["pipeline_parallel_degree"] == 4
    assert P["pipeline_parallel_schedule"] == "1F1B"
    assert P["pipeline_parallel_microbatch_size"] == 2
    split = ("pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
             "pipeline_parallel_last_stage_less_layers")
    assert tuple(P[k] for k in split) == (20, 0, 0)
    assert doc["training"] == {"local_batch_size": 16, "global_batch_size": 256,
                               "seq_len": 8192, "mixed_precision_param": "bfloat16"}
    assert doc["activation_checkpoint"]["mode"] == "full"
    assert doc["model"]["converters"] == ["quantize.linear.float8"]
    assert doc["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"
    # TOML round trip: every key is a cited config field
    flat = {}

    def walk(d, pre=""):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{pre}{k}.")
            else:
                flat[pre + k] = v
    walk(doc)
    assert flat == {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.flags.items()}
    assert all(("torchtitan", k) in ex.FLAGS for k in flat)
    assert cfg.argv == ("torchrun", "-m", "torchtitan.train", "--job.config_file", "plan.toml")


def test_torchtitan_interleaved_405b(models):
    par = jm.Parallelism(dp=8, tp=8, pp=8, sp=True, interleave=8, schedule="interleaved",
                         zero=2)
    cfg = jm.export_plan(par, framework="torchtitan", model=models["llama3.1-405b"],
                         global_batch=2048, seq_len=8192)
    P = tomllib.loads(cfg.files["plan.toml"])["parallelism"]
    assert P["pipeline_parallel_schedule"] == "Interleaved1F1B"
    # ceil((126 + 1 + 1) / 2) = 64 virtual stages = pp 8 x v 8
    split = ("pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
             "pipeline_parallel_last_stage_less_layers")
    assert tuple(P[k] for k in split) == (2, 1, 1)
    assert P["fsdp_reshard_after_forward"] == "never"


@pytest.mark.parametrize("fw,fields,kw,match", [
    ("megatron", dict(dp=8, tp=8, pp=8, schedule="gpipe"), {}, "schedule='gpipe'"),
    ("megatron", dict(dp=64, zero=3, zero3_impl="deepspeed"), {}, "zero3_impl='deepspeed'"),
    ("megatron", dict(dp=64), dict(dp_overlap=0.5), "dp_overlap=0.5"),
    ("megatron", dict(dp=64), dict(precision="int8"), "precision='int8'"),
    ("torchtitan", dict(dp=64, zero=1), {}, "zero=1"),
    ("torchtitan", dict(dp=8, tp=8, sp=False, zero=3), {}, "sp=0"),
    ("torchtitan", dict(dp=8, tp=8, sp=True, zero=0), {}, "zero=0"),
    ("torchtitan", dict(dp=64, zero=3), dict(precision="fp16"), "precision='fp16'"),
    ("megatron", dict(dp=16, tp=3), {}, "heads_not_divisible"),
    ("caffe", dict(dp=64), {}, "framework='caffe'"),
])
def test_inexpressible_plans_raise(fw, fields, kw, match, models):
    with pytest.raises(ValueError, match=re.escape(match)):
        jm.export_plan(jm.Parallelism(**fields), framework=fw, model=models["llama2-7b"],
                       global_batch=512, seq_len=4096, **_grouped(**kw))


def test_recipe_and_defaults(models):
    """A recipe's plan fields and step knobs apply as in train_step; without one,
    train_step's defaults (dp_overlap 1, tp_overlap 0, bf16)."""
    par = jm.Parallelism(dp=8, tp=8, pp=1, sp=True)
    plain = jm.export_plan(par, model=models["llama3-70b"], global_batch=64, seq_len=4096)
    assert "--overlap-grad-reduce" in plain.flags and "--tp-comm-overlap" not in plain.flags
    assert "--bf16" in plain.flags
    r = jm.recipe("nemo-24.07")
    cfg = jm.export_plan(par, model=models["llama3-70b"], global_batch=64, seq_len=4096,
                         training=jm.TrainExportOptions(recipe=r))
    p = ex.train_plan(par, models["llama3-70b"], 64, 4096,
                      options=jm.TrainExportOptions(recipe=r))
    assert p.zero == int(r.plan.get("zero", 0))
    assert ("--use-distributed-optimizer" in cfg.flags) == (p.zero == 1)


def test_flag_table_cites_sources():
    for (fw, flag), (project, version, path) in ex.FLAGS.items():
        src = ex.SOURCES[fw]
        assert (project, version) == (src.project, src.version) and path in src.files
        assert len(src.commit) == 40
        assert flag.startswith("-") or "." in flag or (fw, path) == (
            "trtllm", "tensorrt_llm/llmapi/llm_args.py")
    with pytest.raises(KeyError):
        ex._Emitter("megatron")("--not-a-flag", 1)


# serving: (name, framework, plan fields, export kwargs, expected flags, absent flags)
SERVE_CASES = [
    ("vllm_70b_fp8", "vllm", "llama3-70b", dict(dp=1, tp=2),
     dict(precision="fp8", max_batch=256, max_tokens=8192, chunk=0),
     {"--tensor-parallel-size": "2", "--pipeline-parallel-size": "1",
      "--max-num-seqs": "256", "--max-num-batched-tokens": "8192",
      "--quantization": "fp8", "--kv-cache-dtype": "fp8", "--dtype": "bfloat16"},
     ("--enable-chunked-prefill", "--enable-expert-parallel", "--data-parallel-size")),
    ("vllm_mixtral_ep", "vllm", "mixtral-8x7b", dict(dp=2, tp=4, ep=8),
     dict(chunk=2048),
     {"--data-parallel-size": "2", "--tensor-parallel-size": "4",
      "--enable-expert-parallel": True, "--enable-chunked-prefill": True,
      "--max-num-batched-tokens": "2048"},
     ("--quantization", "--kv-cache-dtype")),
    ("sglang_mixtral_dpattn", "sglang", "mixtral-8x7b", dict(dp=2, tp=4, ep=8),
     dict(max_batch=128, chunk=4096, precision="fp8"),
     {"--tp-size": "8", "--dp-size": "2", "--enable-dp-attention": True, "--ep-size": "8",
      "--max-running-requests": "128", "--chunked-prefill-size": "4096",
      "--quantization": "fp8", "--kv-cache-dtype": "fp8_e4m3"},
     ()),
    ("sglang_dense_nochunk", "sglang", "llama3-8b", dict(dp=4, tp=2),
     dict(chunk=0),
     {"--tp-size": "2", "--dp-size": "4", "--chunked-prefill-size": "-1"},
     ("--enable-dp-attention", "--ep-size", "--quantization")),
    ("trtllm_tp8_pp2", "trtllm", "llama3-70b", dict(dp=1, tp=8, pp=2),
     dict(max_batch=512, max_tokens=16384),
     {"--backend": "pytorch", "--tp_size": "8", "--pp_size": "2", "--max_batch_size": "512",
      "--max_num_tokens": "16384", "--extra_llm_api_options": "extra_llm_api_options.yaml"},
     ("--ep_size", "--enable_chunked_prefill")),
]


@pytest.mark.parametrize("case", SERVE_CASES, ids=[c[0] for c in SERVE_CASES])
def test_serving_flags(case, models):
    _, fw, name, fields, kw, expected, absent = case
    model = models[name] if name in models else hw_db.model(name)
    cfg = jm.export_plan(jm.Parallelism(**fields), framework=fw, model=model, **_grouped(**kw))
    got = _argv_flags(cfg)
    for flag, val in expected.items():
        assert got.get(flag) == val, (flag, got.get(flag), val)
    for flag in absent:
        assert flag not in got, flag
    assert all((fw, f) in ex.FLAGS for f in got)
    assert all((fw, k.removeprefix("yaml:")) in ex.FLAGS for k in cfg.flags)


def test_trtllm_attention_dp_yaml(models):
    """MoE over dp·tp devices -> one tp_size = dp·tp engine with attention DP; FP8 KV in the
    YAML (round trip through PyYAML, a test dependency)."""
    cfg = jm.export_plan(jm.Parallelism(dp=2, tp=4, ep=8), framework="trtllm",
                         model=models["mixtral-8x7b"], precision="fp8")
    got = _argv_flags(cfg)
    assert (got["--tp_size"], got["--ep_size"]) == ("8", "8")
    text = cfg.files["extra_llm_api_options.yaml"]
    assert "enable_attention_dp: true" in text and "  dtype: fp8" in text
    assert "  tokens_per_block: 32" in text
    assert yaml.safe_load(text) == {"dtype": "bfloat16", "enable_attention_dp": True,
                                    "kv_cache_config": {"tokens_per_block": 32,
                                                        "dtype": "fp8"}}


def test_serving_defaults_follow_runtime_presets(models):
    """Left out, the scheduler settings are the runtime preset's (what the serving model
    assumed): vLLM V1 chunks at 8192 tokens with 1024 sequences."""
    from jaxmodel.serving_runtime import scheduler_defaults
    d = scheduler_defaults("vllm_v1")
    got = _argv_flags(jm.export_plan(jm.Parallelism(tp=8), framework="vllm",
                                     model=models["llama3-70b"]))
    assert got["--max-num-seqs"] == str(int(d["max_batch"]))
    assert got["--max-num-batched-tokens"] == str(int(d["chunk"]))
    assert got["--gpu-memory-utilization"] == str(d["mem_fraction"])


@pytest.mark.parametrize("fw,fields,kw,match", [
    ("vllm", dict(dp=4, tp=2, ep=2), {}, "ep=2"),
    ("sglang", dict(dp=4, tp=2, ep=2), {}, "ep=2 with dp=4"),
    ("vllm", dict(tp=2), dict(precision="w4a16"), "precision='w4a16'"),
    ("vllm", dict(tp=2), dict(max_tokens=4096, chunk=2048), "max_tokens=4096 and chunk=2048"),
    ("trtllm", dict(tp=2, cp=2), {}, "cp=2"),
    ("vllm", dict(tp=2), dict(global_batch=8), "global_batch applies to training"),
    ("megatron", dict(tp=2), dict(max_batch=8), "max_batch applies to serving"),
    ("vllm", dict(tp=2), dict(system=hw_db.system("dgx_h100")), "system applies to training"),
    ("megatron", dict(tp=2), dict(training={"dp_overlap": 0}),
     "training must be a jaxmodel.TrainExportOptions, got dict"),
])
def test_serving_inexpressible_raise(fw, fields, kw, match, models):
    model = models["mixtral-8x7b"] if fields.get("ep", 1) > 1 else models["llama3-70b"]
    train = dict(global_batch=8, seq_len=1024) if fw == "megatron" else {}
    with pytest.raises(ValueError, match=re.escape(match)):
        jm.export_plan(jm.Parallelism(**fields), framework=fw, model=model,
                       **_grouped(**train, **kw))


def _cli(argv):
    import io
    import json
    from jaxmodel import cli
    out = io.StringIO()
    rc = cli.main(argv, stdout=out)
    return rc, (json.loads(out.getvalue()) if out.getvalue().strip() else None)


def test_cli_export_train_and_serve(tmp_path):
    """`jaxmodel export train|serve` parse the plan as predict / serve do (tp defaults to
    the node, dp to the devices left) and print the command; --write leaves launch.sh and
    the files."""
    rc, res = _cli(["export", "train", "--system", "dgx_h100", "--nodes", "4", "--model",
                    "llama3-70b", "--pp", "4", "--sp", "--zero", "3", "--recompute", "full",
                    "--global-batch", "64", "--seq-len", "4096", "--framework", "torchtitan",
                    "--write", str(tmp_path)])
    assert rc == 0 and res["framework"] == "torchtitan"
    doc = tomllib.loads((tmp_path / "plan.toml").read_text())
    assert doc["parallelism"]["tensor_parallel_degree"] == 8
    assert doc["parallelism"]["data_parallel_shard_degree"] == 1
    launch = (tmp_path / "launch.sh").read_text()
    assert "torchrun --nnodes=4 --nproc-per-node=8 -m torchtitan.train" in launch
    assert all(("torchrun", t.split("=")[0]) in ex.FLAGS for t in res["command"].split()[1:4])
    rc, res = _cli(["export", "serve", "--system", "dgx_h100", "--model", "llama3-70b",
                    "--tp", "4", "--framework", "trtllm", "--max-batch", "64"])
    assert rc == 0 and "--tp_size 4" in res["command"] and "--max_batch_size 64" in \
        res["command"]
    rc, _ = _cli(["export", "serve", "--model", "llama3-70b", "--global-batch", "8"])
    assert rc == 2
    from jaxmodel import cli
    rc, res = _cli(cli.EXAMPLES["export"].split()[1:])      # the --help example
    assert rc == 0 and "--num-layers-per-virtual-pipeline-stage 2" in res["command"]
    rc, _ = _cli(["export", "train", "--model", "llama3-70b", "--framework", "vllm"])
    assert rc == 2


@pytest.mark.slow
def test_cli_search_export_best_plan():
    """`jaxmodel search ... --export megatron` turns the fastest feasible row into
    Megatron arguments with the row's own layout."""
    rc, res = _cli(["search", "--system", "hgx_a100_4gpu", "--model", "gpt2-medium",
                    "--global-batch", "64", "--seq-len", "1024", "--quiet", "--export",
                    "megatron"])
    assert rc == 0 and res["framework"] == "megatron"
    assert res["step_time_s"] > 0
    assert "--tensor-model-parallel-size" in res["flags"]


def test_nemo_recipe_405b(models):
    """NeMo 2.0 reads the same Megatron-core settings: the 405B interleaved plan as
    `nemo llm pretrain --factory llama31_405b` overrides and a recipe snippet; defaults a
    NeMo recipe turns on (distributed optimizer, DP overlap) are written explicitly."""
    par = jm.Parallelism(dp=8, tp=8, pp=8, sp=True, interleave=8, schedule="interleaved",
                         recompute="selective")
    cfg = jm.export_plan(par, framework="nemo", model=models["llama3.1-405b"],
                         global_batch=2048, seq_len=8192, precision="fp8",
                         training=jm.TrainExportOptions(
                             dp_overlap=0, system=hw_db.system("dgx_h100", nodes=64)))
    argv = list(cfg.argv)
    assert argv[:5] == ["nemo", "llm", "pretrain", "--factory", "llama31_405b"]
    kv = dict(a.split("=", 1) for a in argv[5:])
    assert kv["trainer.strategy.virtual_pipeline_model_parallel_size"] == "8"
    assert kv["trainer.strategy.account_for_embedding_in_pipeline_split"] == "True"
    assert kv["trainer.strategy.account_for_loss_in_pipeline_split"] == "True"
    assert kv["trainer.strategy.sequence_parallel"] == "True"
    assert kv["model.config.recompute_granularity"] == "selective"
    assert kv["optim.config.use_distributed_optimizer"] == "False"
    assert kv["trainer.strategy.ddp.overlap_grad_reduce"] == "False"
    assert kv["trainer.plugins.fp8"] == "hybrid" and kv["trainer.num_nodes"] == "64"
    assert all(("nemo", k) in ex.FLAGS for k in kv)
    snippet = cfg.files["recipe.py"]
    assert "llm.llama31_405b.pretrain_recipe(num_nodes=64, num_gpus_per_node=8)" in snippet
    compile(snippet, "recipe.py", "exec")      # valid Python
    with pytest.raises(ValueError, match=re.escape("zero=3")):
        jm.export_plan(jm.Parallelism(dp=64, zero=3), framework="nemo",
                       model=models["llama2-7b"], global_batch=512, seq_len=4096)


def _plan_from_megatron(flags: dict, n_layers: int, world: int) -> dict:
    """The plan Megatron-LM core_v0.15.0 builds from these arguments (validate_args:
    dp = world / (tp·pp·cp); virtual stages = (layers + account flags) / pp / layers per
    virtual stage), written from arguments.py independently of the exporter."""
    tp = int(flags.get("--tensor-model-parallel-size", 1))
    pp = int(flags.get("--pipeline-model-parallel-size", 1))
    cp = int(flags.get("--context-parallel-size", 1))
    s = int("--account-for-embedding-in-pipeline-split" in flags) + int(
        "--account-for-loss-in-pipeline-split" in flags)
    k = flags.get("--num-layers-per-virtual-pipeline-stage")
    v = (n_layers + s) // pp // int(k) if k is not None else 1
    zero = 1 if "--use-distributed-optimizer" in flags else {
        "optim_grads": 2, "optim_grads_params": 3}.get(
        flags.get("--data-parallel-sharding-strategy"), 0)
    rec = flags.get("--recompute-granularity", "none")
    return dict(dp=world // (tp * pp * cp), tp=tp, pp=pp, cp=cp,
                ep=int(flags.get("--expert-model-parallel-size", 1)),
                sp=int("--sequence-parallel" in flags),
                micro_batch=int(flags["--micro-batch-size"]), interleave=v,
                recompute=rec, zero=zero)


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c[0] for c in MEGATRON_CASES])
def test_megatron_round_trip(case, models):
    """Megatron's reading of the exported arguments is the plan that was exported."""
    _, name, fields, kw, _, _ = case
    par = jm.Parallelism(**fields)
    cfg = jm.export_plan(par, framework="megatron", model=models[name], **_grouped(**kw))
    world = int(par.dp * par.tp * par.pp * par.cp)
    back = _plan_from_megatron(_argv_flags(cfg), int(models[name].n_layers), world)
    p = ex.train_plan(par, models[name], kw["global_batch"], kw["seq_len"])
    assert back == dict(dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep,
                        sp=int(p.sp and p.tp > 1), micro_batch=p.micro_batch, interleave=p.v,
                        recompute=p.recompute, zero=p.zero)


def test_plan_must_fill_the_system(models):
    """With a system, the plan's dp·tp·pp·cp must be its devices (the model's rule)."""
    with pytest.raises(ValueError, match="devices_mismatch"):
        jm.export_plan(jm.Parallelism(dp=2, tp=8), model=models["llama3-70b"],
                       global_batch=64, seq_len=4096,
                       training=jm.TrainExportOptions(system=hw_db.system("dgx_h100", nodes=4)))


def test_megatron_p2p_overlap_follows_the_plan(models):
    """Megatron-LM turns overlap_p2p_comm on by default for the interleaved schedule
    (``--no-overlap-p2p-communication`` turns it off) and off for 1F1B: an interleaved plan
    modelled without it says so, one with it (the NeMo 24.07 recipe sets it) and 1F1B plans
    carry no flag."""
    m = models["llama3.1-405b"]
    inter = jm.Parallelism(dp=8, tp=8, pp=8, sp=True, interleave=8, schedule="interleaved")
    kw = dict(framework="megatron", model=m, global_batch=2048, seq_len=8192)
    flag = "--no-overlap-p2p-communication"
    assert flag in jm.export_plan(inter, **kw).flags
    assert flag not in jm.export_plan({**{f: getattr(inter, f) for f in (
        "dp", "tp", "pp", "sp", "interleave", "schedule")}, "pp_overlap": 1.0}, **kw).flags
    assert ex.train_plan(inter, m, 2048, 8192,
                         options=jm.TrainExportOptions(recipe="nemo-24.07")).pp_overlap == 1.0
    one_f1b = jm.Parallelism(dp=8, tp=8, pp=8, sp=True)
    assert flag not in jm.export_plan(one_f1b, **kw).flags
    assert ("megatron", flag) in ex.FLAGS
