"""Softmax / layernorm / GELU / elementwise: hand values, overheads, batching, infeasibility."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmodel as jm
from jaxmodel import numerics as nx


def test_gelu_hand_value(a100):
    n = 2.0 ** 20
    lanes = 108 * 4 * 32
    padded = math.ceil(n / lanes) * lanes
    word = 2.0
    io = max(2 * padded * word / float(a100.mem_bw * a100.mem_bw_efficiency),
             2 * padded * word / float(a100.global_buffer_bw))
    compute = padded * (10 + 35) / float(a100.peak_vector_flops)
    want = max(io, compute) + float(a100.gelu_overhead_s)
    assert float(jm.gelu_latency(a100, n)) == pytest.approx(want)


def test_elementwise_hand_value(a100):
    n = 8 * 2048 * 12288.0
    want = max(n * 6 / float(a100.mem_bw * a100.mem_bw_efficiency),
               n * 1 / float(a100.peak_vector_flops)) + float(a100.gelu_overhead_s)
    assert float(jm.elementwise_latency(a100, n, 6.0, 1.0)) == pytest.approx(want)
    assert float(jm.elementwise_latency(a100, n, 6.0, 1.0, overhead=False)) == pytest.approx(
        want - float(a100.gelu_overhead_s))


@pytest.mark.parametrize("fn,field", [(jm.softmax_latency, "softmax_overhead_s"),
                                      (jm.layernorm_latency, "layernorm_overhead_s")])
def test_row_ops_overhead_monotone_and_batched(a100, fn, field):
    rows = jnp.array([256.0, 1024.0, 4096.0, 16384.0])
    t = fn(a100, rows, 4096.0)
    t0 = fn(a100, rows, 4096.0, overhead=False)
    assert np.allclose(np.asarray(t - t0), float(getattr(a100, field)))
    assert bool(jnp.all(jnp.diff(t) > 0))
    # memory traffic bounds it from below
    bound = rows * 4096 * 2 * 2 / float(a100.mem_bw * a100.mem_bw_efficiency)
    assert bool(jnp.all(t0 >= bound))
    for i in range(4):
        assert float(t[i]) == pytest.approx(float(fn(a100, float(rows[i]), 4096.0)), rel=1e-9)


def test_row_ops_gradient_wrt_bandwidth_finite_differences(a100):
    for single in (jm.softmax_latency.single, jm.layernorm_latency.single,
                   jm.gelu_latency.single):
        args = (16384.0 * 4096.0,) if single is jm.gelu_latency.single else (16384.0, 4096.0)
        fn = jax.jit(lambda bw: single(dataclasses.replace(a100, mem_bw=bw), *args))
        g = float(jax.jit(jax.grad(fn))(2.0e12))
        h = 2.0e6
        fd = (float(fn(2.0e12 + h)) - float(fn(2.0e12 - h))) / (2 * h)
        assert g < 0 and g == pytest.approx(fd, rel=1e-4)


def test_infeasible_devices_inf_no_nan(a100):
    batch = dataclasses.replace(a100, mem_bw=jnp.array([2e12, 0.0, 2e12]),
                                local_buffer_bytes=jnp.array([196608.0, 196608.0, 10.0]))
    for t in (jm.softmax_latency(batch, 4096, 4096), jm.layernorm_latency(batch, 4096, 4096),
              jm.gelu_latency(batch, 2 ** 20), jm.elementwise_latency(batch, 1e6, 4.0, 1.0)):
        assert bool(jnp.isfinite(t[0])) and bool(jnp.all(jnp.isinf(t[1:])))
        assert not bool(jnp.any(jnp.isnan(t)))

    def total(bw):
        (d,), _ = nx.broadcast_batch(dataclasses.replace(batch, mem_bw=bw))
        y = jax.vmap(lambda dd: jm.softmax_latency.single(dd, 4096.0, 4096.0)
                     + jm.layernorm_latency.single(dd, 4096.0, 4096.0))(d)
        return jnp.sum(jnp.where(jnp.isfinite(y), y, 0.0))

    assert bool(jnp.all(jnp.isfinite(jax.jit(jax.grad(total))(batch.mem_bw))))
