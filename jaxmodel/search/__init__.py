"""jaxmodel.search: design-space sweeps, parallelism search and gradient co-design.

Public names: :func:`sweep` (any model function over a lazy cartesian grid, chunked and
sharded over all JAX devices) and :func:`save`; :func:`search_parallelism` (ranked 5D plans);
:func:`codesign` → :class:`CodesignResult` (optax over continuous hardware knobs).
Modules: :mod:`~jaxmodel.search.grid` (spec parsing, index arithmetic),
:mod:`~jaxmodel.search.objectives` (hardware knobs and co-design objectives).
"""

from jaxmodel.search.explore import save, sweep
from jaxmodel.search.optimize import CodesignResult, codesign
from jaxmodel.search.parallelism import enumerate_plans, search_parallelism

__all__: list[str] = ["sweep", "save", "codesign", "CodesignResult", "search_parallelism",
                      "enumerate_plans"]
