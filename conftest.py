"""Doctest set-up for the package's docstring examples (``--doctest-modules jaxmodel hw_db``).

Every example may use ``jm``, ``hw_db``, ``jnp``, ``jax``, ``np`` and ``dataclasses``
unimported. Examples that compile a whole training or serving graph (tens of seconds on two
cores) are marked ``slow``: ``make test-all`` runs them, ``make test`` does not.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# docstring examples that compile a full train_step / inference / search graph
SLOW_DOCTESTS = (
    "jaxmodel.search.parallelism",
    "jaxmodel.parallel.train.train_step",
    "jaxmodel.parallel.train.make_train_step",
    "jaxmodel.search.objectives",
    "jaxmodel.parallel.inference_step.inference",
    "jaxmodel.parallel.inference_step.make_inference_step",
    "jaxmodel.parallel.gemm_table",
    "jaxmodel.serving.serving_costs",
    "jaxmodel.serving.continuous_batching",
    "jaxmodel.serving.disaggregated",
    "jaxmodel.serving.offline_throughput",
    "jaxmodel.serving.slo_throughput",
    "jaxmodel.search.serving.search_serving",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if type(item).__name__ == "DoctestItem" and item.name in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    import hw_db
    import jaxmodel as jm
    doctest_namespace.update(jm=jm, hw_db=hw_db, jnp=jnp, jax=jax, np=np,
                             dataclasses=dataclasses)
