"""Strict JAX configuration for the whole suite (equinox/diffrax style).

- rank promotion raises, so accidental broadcasting between a batch axis and a candidate axis
  is an error rather than a silent wrong answer;
- float64 is enabled: gradient checks compare against finite differences in float64. Models
  themselves run in the default float dtype, so float32 behaviour is tested by the
  ``float32`` fixture where it matters;
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
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def float32():
    """Run a test with float64 disabled (the library's default precision)."""
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", True)


@pytest.fixture(scope="session")
def anchors():
    """Path to the repository's ``validation/anchors`` (real measurements and reference
    outputs); a missing folder is an error, never a skip."""
    from jaxmodel.anchors import anchor_dir
    return anchor_dir()
