"""FP4 serving precisions (NVFP4 / MXFP4 weights, NVFP4 KV cache): block-scale bytes against
hand values, the devices' FP4 tensor rates, and a device without FP4 made infeasible."""

import numpy as np
import pytest

import hw_db
import jaxmodel as jm
from jaxmodel import precisions as _prec


def test_block_scale_bytes_hand_values():
    # NVFP4: 0.5 B + one E4M3 byte per 16 elements; MXFP4: one E8M0 byte per 32
    assert float(_prec.gemm_word(jm.precision("nvfp4"))) == pytest.approx(0.5 + 1 / 16)
    assert float(_prec.gemm_word(jm.precision("mxfp4"))) == pytest.approx(0.5 + 1 / 32)
    assert float(_prec.serving_weight_bytes(jm.precision("mxfp4"))) == pytest.approx(0.53125)
    # KV cache: FP8 with FP4 weights, NVFP4 (with its scales) in "nvfp4_kv"
    assert float(jm.precision("nvfp4").kv_bytes) == 1.0
    assert float(jm.precision("nvfp4_kv").kv_bytes) == pytest.approx(0.5 + 1 / 16)
    for name in ("nvfp4", "mxfp4", "nvfp4_kv"):
        p = jm.precision(name)
        assert p.name == name.replace("_", "") and int(p.gemm_dtype) == jm.DTYPES.index("fp4")
        _prec.validate_precision(p)


@pytest.mark.parametrize("device,ok,ratio", [("b200", True, 4.0), ("gb200", True, 4.0),
                                             ("h100_sxm", False, 0.0), ("h200", False, 0.0),
                                             ("a100_80gb", False, 0.0)])
def test_fp4_tensor_rate_of_the_devices(device, ok, ratio):
    dev = hw_db.device(device)
    for name in ("nvfp4", "mxfp4", "nvfp4_kv"):
        assert bool(_prec.supported(dev, jm.precision(name))) is ok
    assert float(_prec.matrix_ratio(dev, jm.DTYPES.index("fp4"))) == ratio


@pytest.mark.slow
def test_fp4_serving_infeasible_without_fp4_and_smaller_on_blackwell():
    model = hw_db.model("llama3-8b")
    par = jm.Parallelism(dp=8)
    h = jm.inference(hw_db.system("dgx_h100"), model, par, 8, 1024, 256, precision="nvfp4",
                     runtime="trtllm_v1")
    assert not bool(h.feasible) and h.reason_name == "precision_unsupported"
    assert np.isinf(float(h.tpot_s))
    b = hw_db.system("dgx_b200")
    r8 = jm.inference(b, model, par, 8, 1024, 256, precision="fp8", runtime="trtllm_v1")
    r4 = jm.inference(b, model, par, 8, 1024, 256, precision="nvfp4_kv",
                      runtime="trtllm_v1")
    assert bool(r4.feasible)
    w8, w4 = (float(r.breakdown["memory.weights"]) for r in (r8, r4))
    kv8, kv4 = (float(r.breakdown["memory.kv_cache"]) for r in (r8, r4))
    assert w4 / w8 == pytest.approx(0.5625, rel=1e-6)
    assert kv4 / kv8 == pytest.approx(0.5625, rel=1e-6)
    assert float(r4.tpot_s) < float(r8.tpot_s)
