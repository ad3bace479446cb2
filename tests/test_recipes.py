"""Named recipes (jaxmodel.recipes): settings, overrides, and train_step(recipe=)."""
import pytest

import hw_db
import jaxmodel as jm


def test_recipe_tables_overrides_and_errors():
    r = jm.recipe("nemo-24.07")
    assert r.step["precision"].name == "fp8" and r.step["grad_bytes"] == 2
    assert r.plan["zero"] == 1 and r.plan["recompute"] == "none"
    g = jm.recipe("nemo-24.07", dropout="megatron")
    assert g.step["dropout"] == "megatron" and r.step["dropout"] == "none"
    p = r.parallelism(jm.Parallelism(dp=8, tp=2, micro_batch=2))
    assert float(p.zero) == 1 and float(p.recompute) == 0 and float(p.dp) == 8
    with pytest.raises(ValueError, match="recipe='nemo'"):
        jm.recipe("nemo")
    with pytest.raises(ValueError, match="'zeroo'"):
        jm.recipe("deepspeed", zeroo=1)
    for name in ("nemo-24.07-sft", "mlperf-gpt3", "megatron-2021", "torchtitan", "deepspeed"):
        assert jm.recipe(name).source
    ml = jm.recipe("mlperf-gpt3")   # ACT_CKPT_GRANULARITY=null, OVERLAP_P2P_COMM=True
    assert ml.plan["recompute"] == "none" and ml.step["pp_overlap"] == 1
    assert ml.plan["flash_attention"] == "fa2" and ml.step["tp_overlap"] == 1


def test_merge_keeps_non_default_caller_values():
    from jaxmodel.recipes import merge_step_kwargs
    d = dict(precision=None, dropout=1.0, grad_bytes=None, dp_overlap=1.0, tp_overlap=0.0)
    out = merge_step_kwargs("nemo-24.07", dict(d, grad_bytes=4), d)
    assert out["grad_bytes"] == 4 and out["precision"].name == "fp8" and out["tp_overlap"] == 1


@pytest.mark.slow
def test_train_step_recipe_equals_the_spelled_out_settings():
    sysm, m = hw_db.system("dgx_h100", nodes=1), hw_db.model("llama2-7b")
    par = jm.Parallelism(dp=8, micro_batch=1)
    a = jm.train_step(sysm, m, par, 128, 4096, recipe="nemo-24.07")
    b = jm.train_step(sysm, m, jm.Parallelism(dp=8, micro_batch=1, recompute="none",
                                              zero=1, flash_attention="fa2", sp=True),
                      128, 4096, precision=jm.precision("fp8", master_bytes=2.0),
                      dropout="none", grad_bytes=2,
                      dp_overlap=1, tp_overlap=1, pp_overlap=1)
    assert float(a.step_time_s) == float(b.step_time_s)
    assert float(a.memory_bytes) == float(b.memory_bytes)


def test_nemo_optimizer_state_bytes():
    """NeMo's distributed Adam: fp32 states with 16-bit master remainders under the
    pre-training recipe (4 + 8 B → 2 + 8 B), bf16 states and a bf16 parameter copy beside FP8
    parameters under the SFT recipe (1 B weights, 1 B cached transpose, 2 + 4 B optimizer)."""
    from jaxmodel.workload.memory import weight_cache_bytes
    pre = jm.recipe("nemo-24.07").step["precision"]
    sft = jm.recipe("nemo-24.07-sft").step["precision"]
    assert float(pre.master_bytes + pre.optim_bytes) == 10.0
    assert float(pre.weight_bytes) == 2.0 and float(weight_cache_bytes(pre)) == 2.0
    assert float(sft.master_bytes + sft.optim_bytes) == 6.0
    assert float(sft.weight_bytes) == 1.0 and float(weight_cache_bytes(sft)) == 1.0
    assert jm.recipe("nemo-24.07-sft").plan["recompute"] == "none"
