"""Doctest namespace for the package's docstring examples (``--doctest-modules``): every
example may use ``jm``, ``hw_db``, ``jnp``, ``jax``, ``np`` and ``dataclasses`` unimported."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace):
    import hw_db
    import jaxmodel as jm
    doctest_namespace.update(jm=jm, hw_db=hw_db, jnp=jnp, jax=jax, np=np,
                             dataclasses=dataclasses)
