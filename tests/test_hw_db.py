"""hw_db loaders: every contract name loads; bad files raise errors naming file/field/value."""

import re
import json

import pytest

import hw_db
import jaxmodel as jm

CONTRACT_DEVICES = "a100_80gb a100_40gb h100_sxm h200 b200 v100 mi210 mi300x tpuv3".split()
CONTRACT_MODELS = ("gpt2-small gpt2-medium gpt3-13b gpt3-175b llama2-7b llama2-13b llama2-70b "
                   "llama3-8b llama3-70b mixtral-8x7b").split()


@pytest.mark.parametrize("name", CONTRACT_DEVICES)
def test_contract_devices_load(name):
    dev = hw_db.device(name)
    assert isinstance(dev, jm.Device) and dev.name == name
    assert float(dev.peak_matrix_flops) > 1e13


def test_every_device_value_has_a_source():
    for name in hw_db.names("device"):
        data = hw_db.load_toml(hw_db.ROOT / "devices" / f"{name}.toml")
        for key, entry in data["device"].items():
            assert entry.get("source", "").strip(), f"{name}.{key} has no source"


@pytest.mark.parametrize("name", CONTRACT_MODELS)
def test_contract_models_load(name):
    m = hw_db.model(name)
    assert isinstance(m, jm.Model)
    assert float(m.n_heads) % float(m.n_kv_heads) == 0


def test_model_hf_keys_and_gqa():
    m = hw_db.model("llama3-70b")
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.d_ff) == (80, 8192, 64, 8, 28672)
    assert m.activation == 1.0 and m.ffn_matrices == 3.0
    g = hw_db.model("gpt2-small")  # GPT-2 keys n_layer/n_embd/n_head, d_ff defaults to 4h
    assert (g.n_layers, g.d_model, g.n_heads, g.d_ff) == (12, 768, 12, 3072)
    x = hw_db.model("mixtral-8x7b")
    assert (x.n_experts, x.top_k) == (8, 2)


def test_model_from_dict_and_path(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 100, "hidden_act": "silu"}
    assert hw_db.model(cfg).d_ff == 256
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert hw_db.model(str(p)).n_layers == 2


def test_model_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="hidden_size"):
        hw_db.model({"num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10})
    with pytest.raises(ValueError, match="num_attention_heads.*-4"):
        hw_db.model({"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": -4,
                     "vocab_size": 10})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        hw_db.model(str(bad))
    with pytest.raises(ValueError, match="unknown model"):
        hw_db.model("gpt-42")


def _write_device(tmp_path, body):
    p = tmp_path / "dev.toml"
    p.write_text(body)
    return p


_A100_TOML = hw_db.ROOT / "devices" / "a100_80gb.toml"


def _edited_device(tmp_path, old, new):
    """A copy of the A100 device file with ``old`` (which must occur) replaced by ``new``."""
    src = _A100_TOML.read_text()
    assert old in src, old
    return _write_device(tmp_path, src.replace(old, new))


def _rejected(tmp_path, edits):
    """Each ``(old, new, match)``: the edited A100 file is rejected with a matching error."""
    for old, new, match in edits:
        with pytest.raises(ValueError, match=match):
            hw_db.device(_edited_device(tmp_path, old, new))


def test_device_file_errors_name_file_field_value(tmp_path):
    _rejected(tmp_path, [
        ("mem_bw = { value = 2.039e12", "mem_bw = { value = -5", r"dev.toml.*mem_bw.*-5"),
        ("core_count = { value = 108", "core_count = { value = \"many\"", "core_count.*many"),
        ("[device]", "[device\n", "malformed TOML")])
    p = _write_device(tmp_path, _A100_TOML.read_text()
                      + "\nwarp_drive = { value = 1, source = \"x\" }\n")
    with pytest.raises(ValueError, match="warp_drive"):
        hw_db.device(p)
    with pytest.raises(ValueError, match="unknown device"):
        hw_db.device("a101")


def test_device_overrides():
    dev = hw_db.device("a100_80gb", mem_bw=3e12)
    assert dev.mem_bw == 3e12
    with pytest.raises(ValueError, match="mem_bw"):
        hw_db.device("a100_80gb", mem_bw=0.0)


def test_systems_load_and_scale():
    s = hw_db.system("hgx_a100_4gpu")
    assert float(s.n_devices) == 4 and s.device.name == "a100_80gb"
    with pytest.raises(ValueError, match="nodes"):
        hw_db.system("hgx_a100_4gpu", nodes=2)


def test_buffer_too_small_for_any_tile_is_rejected():
    with pytest.raises(ValueError, match="local_buffer_bytes.*too small"):
        hw_db.device("a100_80gb", local_buffer_bytes=512)


def _system_file(tmp_path, edit):
    src = (hw_db.ROOT / "systems" / "dgx_a100.toml").read_text()
    p = tmp_path / "sys.toml"
    p.write_text(edit(src))
    return p


def test_units_are_converted_or_rejected(tmp_path):
    freq = "freq_hz = { value = 1.41e9,"
    p = _edited_device(tmp_path, freq, "freq_hz = { value = 1410, unit = \"MHz\",")
    assert float(hw_db.device(p).freq_hz) == 1.41e9
    _rejected(tmp_path, [
        # 1410 Hz: a GEMM would take minutes
        (freq, "freq_hz = { value = 1410,", r"freq_hz.*1410.*too small"),
        (freq, "freq_hz = { value = 1.41, unit = \"GB\",", r"freq_hz.*'GB' measures B"),
        ("core_count = { value = 108,", "core_count = { value = 108, unit = \"MHz\",",
         "core_count.*dimensionless"),
        (freq, "freq_hz = { value = 1.41e9, unti = \"Hz\",", "did you mean 'unit'")])
    assert hw_db.to_si(8, "Gb/s", "B/s") == 1e9 and hw_db.to_si(3, "us", "s") == 3e-6


def test_unknown_keys_suggest_the_closest(tmp_path):
    _rejected(tmp_path, [("mem_bw_efficiency =", "mem_bw_eficiency =",
                          "did you mean 'mem_bw_efficiency'")])
    with pytest.raises(ValueError, match="did you mean 'a100_80gb'"):
        hw_db.device("a100_80g")
    with pytest.raises(ValueError, match="did you mean 'mem_bw'"):
        hw_db.device("a100_80gb", mem_bww=1e12)


def test_device_files_must_state_calibrated_constants(tmp_path):
    src = _A100_TOML.read_text()
    lines = [l for l in src.splitlines() if not l.startswith("mem_bw_efficiency")]
    p = _write_device(tmp_path, "\n".join(lines))
    with pytest.raises(ValueError, match="missing device field.*mem_bw_efficiency"):
        hw_db.device(p)


@pytest.mark.parametrize("edit,needle", [
    (lambda s: re.sub(r"\nefficiency = \{ value = [0-9.]+", "\nefficiency = { value = 2", s, count=1),
     "levels[0].efficiency"),
    (lambda s: s.replace('topology = { value = "switch", source = "Selene',
                         'topology = { value = 7, source = "Selene'), "levels[1].topology"),
    (lambda s: s.replace("scales_with_nodes = true", 'scales_with_nodes = "no"'),
     "scales_with_nodes"),
    (lambda s: s.replace('device = "a100_80gb"', "device = 7"), "'device'"),
    (lambda s: s.replace("bw_per_device = { value = 25e9",
                         'bw_per_device = { value = 200, unit = "ns"'), "bw_per_device"),
    (lambda s: s.replace("[[levels]]\nname = \"infiniband_hdr\"",
                         "[[levels]]\nname = \"infiniband_hdr\"\nswitch_latncy = 1"),
     "did you mean 'levels[1].switch_latency'"),
])
def test_system_file_errors(tmp_path, edit, needle):
    with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        hw_db.system(_system_file(tmp_path, edit), nodes=2)


def test_system_units_convert(tmp_path):
    p = _system_file(tmp_path, lambda s: s.replace(
        "bw_per_device = { value = 25e9", 'bw_per_device = { value = 200, unit = "Gb/s"'))
    assert float(hw_db.system(p, nodes=2).levels[1].bw_per_device) == 25e9


LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
         "intermediate_size": 172, "hidden_act": "silu", "torch_dtype": "bfloat16",
         "rope_scaling": {"type": "linear", "factor": 2.0}, "rms_norm_eps": 1e-5,
         "bos_token_id": 1, "eos_token_id": 2, "architectures": ["LlamaForCausalLM"],
         "sliding_window": None}


def test_hf_activation_is_decided_by_the_architecture():
    assert float(hw_db.model(LLAMA).ffn_matrices) == 3.0           # gated SiLU = SwiGLU
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 10}
    assert float(hw_db.model({**gpt2, "activation_function": "gelu_new"}).ffn_matrices) == 2.0
    with pytest.raises(ValueError, match="non-gated SiLU"):
        hw_db.model({**gpt2, "activation_function": "silu"})
    opt = hw_db.model({**LLAMA, "model_type": "opt", "hidden_act": "relu"})
    assert int(opt.activation) == jm.ACTIVATIONS.index("relu") and float(opt.ffn_matrices) == 2
    nemo = hw_db.model({**LLAMA, "model_type": "nemotron", "hidden_act": "relu2"})
    assert int(nemo.activation) == jm.ACTIVATIONS.index("relu2")
    assert float(nemo.ffn_matrices) == 2.0
    gemma = hw_db.model({**LLAMA, "model_type": "gemma", "hidden_act": "gelu_pytorch_tanh"})
    assert int(gemma.activation) == jm.ACTIVATIONS.index("geglu")
    assert float(gemma.ffn_matrices) == 3.0
    with pytest.raises(ValueError, match="ReGLU"):
        hw_db.model({**LLAMA, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="'tanh' is not modelled"):
        hw_db.model({**LLAMA, "hidden_act": "tanh"})


def test_hf_structural_keys_are_modelled_or_rejected():
    for key, val in (("shared_expert_intermediate_size", 5632), ("alibi", True),
                     ("num_mtp_modules", 1), ("hybrid_override_pattern", "M-M*")):
        with pytest.raises(ValueError, match=f"key '{key}'"):
            hw_db.model({**LLAMA, key: val})
        with pytest.warns(UserWarning, match=key):
            hw_db.model({**LLAMA, key: val}, strict=False)
    with pytest.raises(ValueError, match="did you mean 'num_hidden_layers'"):
        hw_db.model({**LLAMA, "num_hiden_layers": 2})
    for key in ("num_hidden_layers", "intermediate_size"):
        with pytest.raises(ValueError, match=key):
            hw_db.model({**LLAMA, key: 2.5})
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        hw_db.model({**LLAMA, "tie_word_embeddings": "yes"})
    with pytest.raises(ValueError, match="n_kv_heads"):
        hw_db.model({**LLAMA, "num_key_value_heads": 3})


def test_gb200_constants_give_both_cublaslt_dtypes(anchors):
    """GB200's one clock (fitted on the FP4 rows) and its executed FP8 rate reproduce the
    sustained cuBLASLt 16384³ GEMM of both dtypes (experiments/calibrate.py), hence the
    measured FP4/FP8 speed ratio 2.6, which the datasheet ratio 2 at one clock misses."""
    import numpy as np
    import pandas as pd
    from jaxmodel.parallel.train import sustained_device
    mb = pd.read_csv(anchors / "microbench" / "gpu_microbenchmarks.csv")
    r = mb[(mb.gpu == "GB200") & (mb.benchmark == "gemm_cublaslt")
           & (mb.shape_or_op == "m=16384 n=16384 k=16384")].set_index("dtype")
    measured = r.value.loc[["FP8", "FP4"]].to_numpy()
    dev = hw_db.device("gb200")
    ratio = np.array([float(dev.matrix_ratio_fp8), float(dev.matrix_ratio_fp4)])
    n = np.full(2, 16384.0)
    t = np.asarray(jm.gemm_latency(jm.ops.with_matrix_rate(sustained_device(dev), ratio), n, n,
                                   n, dtype_bytes=np.array([1.0, 0.5]), overhead="kernel"))
    pred = 2 * 16384.0 ** 3 / t / 1e12
    assert np.all(np.abs(pred / measured - 1) < 0.05), (pred, measured)
    assert pred[1] / pred[0] == pytest.approx(measured[1] / measured[0], rel=0.05)
    assert ratio[0] < 2.0 and ratio[1] == 4.0
    b200 = hw_db.device("b200")   # transferred: same silicon and kernels
    assert float(b200.sustained_clock_fraction) == float(dev.sustained_clock_fraction)
    assert float(b200.matrix_ratio_fp8) == float(dev.matrix_ratio_fp8)


def test_gb200_nvl72_hosts_racks_and_mlperf_sizes():
    """GB200 NVL72: hosts of 4 GPUs, 18 hosts in one NVLink domain, racks over InfiniBand (one
    NIC per GPU, an NCCL network tier); with 16 trays per rack in the job, 512-2,496 GPUs are
    whole racks and a 64-GPU replica (TP 4 x PP 8 x CP 2) stays inside one NVLink domain."""
    from jaxmodel.comm.topology import group_tiers
    nvl = hw_db.system("gb200_nvl72", nodes=2)
    assert [float(lv.size) for lv in nvl.levels] == [4.0, 18.0, 2.0]
    assert float(nvl.n_devices) == 144
    host, rack, ib = nvl.levels
    assert float(host.bw_per_device) == float(rack.bw_per_device) == 900e9
    assert float(ib.bw_per_device) == 50e9 and float(ib.nccl_link) == 2.0
    assert float(host.nccl_link) == float(rack.nccl_link) == 0.0
    for racks, gpus in ((8, 512), (39, 2496)):
        assert float(hw_db.system("gb200_nvl72_64gpu", nodes=racks).n_devices) == gpus
    s = hw_db.system("gb200_nvl72_64gpu", nodes=8)
    members, _, ok = group_tiers(s, 64.0, 1.0)          # one replica: TP x PP x CP
    assert bool(ok) and [float(m) for m in members] == [4.0, 16.0, 1.0]
    members, _, ok = group_tiers(s, 8.0, 64.0)          # its data-parallel group
    assert bool(ok) and [float(m) for m in members] == [1.0, 1.0, 8.0]
