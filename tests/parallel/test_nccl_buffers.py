"""The NCCL communicators' buffers of a training step (``nccl_buffers`` memory term):
hand-counted groups of Megatron-core plans, a batch against a loop, and the term in a
``train_step`` result (slow)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm  # noqa: F401  (import before hw_db)
import hw_db
from jaxmodel.parallel.train_options import CONSTANTS
from jaxmodel.workload.memory import TRAIN_MEMORY_TERMS, nccl_buffer_bytes, nccl_group_bytes

C, P = 688e6, 544e6           # a communicator of >= 3 ranks, of 2 ranks (hw_db values)
GPT3 = hw_db.model("gpt3-175b")        # tied embeddings
LLAMA = hw_db.model("llama2-70b")      # untied


def test_constants_are_the_measured_values():
    assert CONSTANTS["nccl_comm_bytes"] == C
    assert CONSTANTS["nccl_pair_comm_bytes"] == P


@pytest.mark.parametrize("model, fields, groups", [
    # TP 4, DP 64, world (distributed optimizer), embedding pair (pp > 1, tied)
    (GPT3, dict(dp=64, tp=4, pp=6, zero=1), 3 * C + P),
    # without the distributed optimizer the norm group is the model-parallel one (TP x PP)
    (GPT3, dict(dp=64, tp=4, pp=6, zero=0), 3 * C + P),
    # data parallel only, no optimizer sharding: the DP group alone
    (GPT3, dict(dp=8, tp=1, pp=1, zero=0), C),
    # ... with ZeRO-1 the world group too (same ranks, its own communicator)
    (GPT3, dict(dp=8, tp=1, pp=1, zero=1), 2 * C),
    # untied embeddings: no embedding group; TP 2 is a pair; TP x PP = 8 for the norm
    (LLAMA, dict(dp=1, tp=2, pp=4, zero=0), P + C),
    # context parallel 2 (pair), DP x CP = 16, world
    (LLAMA, dict(dp=8, tp=8, pp=1, cp=2, zero=1), C + P + C + C),
    # one device: no communicator
    (LLAMA, dict(dp=1, tp=1, pp=1, zero=1), 0.0),
])
def test_hand_counted_groups(model, fields, groups):
    par = jm.Parallelism(**fields)
    assert float(nccl_buffer_bytes(model, par, C, P)) == pytest.approx(groups, rel=1e-6)


def test_expert_groups():
    """EP 2 (a pair) and its expert data-parallel group dp·cp/ep = 4 beside DP 8 and the
    world."""
    par = jm.Parallelism(dp=8, tp=1, pp=1, ep=2, zero=1)
    assert float(nccl_buffer_bytes(hw_db.model("mixtral-8x7b"), par, C, P)) == pytest.approx(
        P + C + C + C, rel=1e-6)


def test_batch_and_group_sizes():
    """A batch of TP degrees in one call: DP 4, world, embedding pair, and TP 1 / 2 / ≥ 3."""
    tps = jnp.asarray([1.0, 2.0, 4.0, 8.0])
    got = jax.jit(lambda tp: nccl_buffer_bytes(
        GPT3, jm.Parallelism(dp=4, tp=tp, pp=2, zero=1), C, P))(tps)
    base = 2 * C + P
    np.testing.assert_allclose(np.asarray(got), [base, base + P, base + C, base + C],
                               rtol=1e-6)
    assert [float(g) for g in nccl_group_bytes(jnp.asarray([1.0, 2.0, 3.0, 1536.0]), C, P)] \
        == [0.0, P, C, C]


@pytest.mark.slow
def test_train_step_counts_the_communicators():
    """A train_step result: the term equals the groups' buffers and is in the total."""
    system = hw_db.system("dgx_a100", nodes=8)
    par = jm.Parallelism(dp=4, tp=4, pp=4, sp=True, micro_batch=1, interleave=2,
                         schedule="interleaved", recompute="selective", zero=1,
                         flash_attention="fa2")
    r = jm.train_step(system, GPT3, par, 64, 2048)
    mem = {k: float(v) for k, v in r.memory.items()}
    assert mem["nccl_buffers"] == pytest.approx(3 * C + P, rel=1e-6)
    assert mem["total"] == pytest.approx(sum(mem[k] for k in TRAIN_MEMORY_TERMS), rel=1e-6)
    assert float(r.memory_bytes) == pytest.approx(mem["total"], rel=1e-6)
