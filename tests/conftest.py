"""Strict JAX configuration for the whole suite (equinox/diffrax style).

- rank promotion raises, so accidental broadcasting between a batch axis and a candidate axis
  is an error rather than a silent wrong answer;
- float32, the library's default, is the suite's default too, so the no-NaN fuzz and the
  anchors see what a user sees (float32 overflow included). float64 runs only where finite
  differences or hand-derived values need it: a test marked ``@pytest.mark.float64`` (or
  asking for the ``float64`` fixture), or every test of a module in :data:`FLOAT64_MODULES`
  (modules of hand-derived values at float64 tolerances, ``rel=1e-9`` and the like);
  the ``float32`` fixture still forces the library default inside such a module;
- jaxmodel's persistent compilation cache (jaxmodel.process) stays off: the suite tests the
  code, not executables cached by an earlier run, and writes nothing into the user's home.
  Setting ``JAXMODEL_CACHE_DIR`` (or JAX's own ``JAX_COMPILATION_CACHE_DIR``) opts back in;
- XLA:CPU compiles with the command line's one-shot options
  (:data:`jaxmodel.batching.ONE_SHOT_COMPILE_OPTIONS`: the elemental emitters, LLVM level 0),
  as ``jaxmodel predict`` does: the suite's graphs are compiled once and run once, and these
  options take about 60 % of the compile time (the same HLO passes, no fast-math in either).
  Flags the user set in ``XLA_FLAGS`` are kept.
"""

import os

if not os.environ.get("JAXMODEL_CACHE_DIR"):
    os.environ.setdefault("JAXMODEL_NO_CACHE", "1")

from jaxmodel.batching import ONE_SHOT_COMPILE_OPTIONS, add_xla_flags, xla_knows  # noqa: E402

add_xla_flags(ONE_SHOT_COMPILE_OPTIONS, accept=xla_knows)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_enable_x64", False)

#: Test modules whose every test runs in float64: they compare the model with hand-derived
#: values or finite differences at float64 tolerances (relative 1e-9 .. 1e-6). Paths relative
#: to ``tests/``. Every other module runs in float32 (the library default) unless a test is
#: marked ``float64``. Checked with ``JAXMODEL_TEST_FLOAT32=1`` on a sample: cost/*,
#: workload/test_params, ops/test_attention, search/test_sweep, search/test_codesign and
#: comm/test_collectives fail in float32 (hand values, finite differences); the modules
#: that passed whole (ops/test_vector, test_systolic, test_fa_occupancy, test_mutation,
#: test_numerics_batching) left the list. A module's tests may move to per-test markers.
FLOAT64_MODULES = frozenset((
    "comm/test_collectives.py", "comm/test_nccl.py",
    "cost/test_area.py", "cost/test_chiplet.py", "cost/test_device.py", "cost/test_uarch.py",
    "cost/test_wafer.py",
    "ops/test_attention.py", "ops/test_gemm.py", "ops/test_llama_ops.py",
    "parallel/test_context.py", "parallel/test_gemm_table.py", "parallel/test_inference.py",
    "parallel/test_moe_training.py", "parallel/test_overlap.py", "parallel/test_pipeline.py",
    "parallel/test_pipeline_dualpipe.py", "parallel/test_plan.py", "parallel/test_train.py",
    "parallel/test_train_cp.py", "parallel/test_zero.py", "parallel/test_zero_impl.py",
    "search/test_codesign.py", "search/test_objectives.py", "search/test_serving_fast.py",
    "search/test_sweep.py",
    "test_energy.py", "test_explain.py", "test_models.py", "test_precision.py",
    "test_serving.py",
    "test_serving_fp4.py", "test_serving_runtime.py", "test_serving_speculative.py",
    "workload/test_layer.py", "workload/test_lora.py", "workload/test_memory.py",
    "workload/test_memory_breakdown.py", "workload/test_moe.py", "workload/test_params.py",
))
_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "float64: run this test with jax_enable_x64 (finite differences, hand "
        "values at float64 tolerance); the suite's default is float32")


def pytest_collection_modifyitems(config, items):
    """Mark the tests of :data:`FLOAT64_MODULES` ``float64``; ``JAXMODEL_TEST_FLOAT32=1``
    skips that (every test in float32: how to find the module tests that still need
    float64)."""
    if os.environ.get("JAXMODEL_TEST_FLOAT32") == "1":
        return
    for item in items:
        rel = os.path.relpath(str(item.path), _TESTS).replace(os.sep, "/")
        if rel in FLOAT64_MODULES:
            item.add_marker(pytest.mark.float64)


def _wants_float64(item) -> bool:
    return item.get_closest_marker("float64") is not None or "float64" in getattr(
        item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Set the float width before the test's fixtures are built (a module's fixtures are
    computed in the width of the module's first test)."""
    jax.config.update("jax_enable_x64", _wants_float64(item))


def pytest_runtest_teardown(item, nextitem):
    jax.config.update("jax_enable_x64", False)


def _width(x64: bool):
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", x64)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", prev)


@pytest.fixture
def float32():
    """Run a test in float32 (the library's default precision), also inside a float64
    module."""
    yield from _width(False)


@pytest.fixture
def float64():
    """Run a test with float64 enabled (finite differences, hand values)."""
    yield from _width(True)


@pytest.fixture(scope="session")
def anchors():
    """Path to the repository's ``validation/anchors`` (real measurements and reference
    outputs); a missing folder is an error, never a skip."""
    from jaxmodel.anchors import anchor_dir
    return anchor_dir()
