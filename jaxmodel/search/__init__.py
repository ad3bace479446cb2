"""jaxmodel.search: design-space sweeps, parallelism search and gradient co-design.

Public names: :func:`sweep` (any model function over a lazy cartesian grid, chunked and
sharded over all JAX devices) and :func:`save`; :func:`search_parallelism` (ranked 5D plans);
:func:`codesign` → :class:`CodesignResult` (optax over continuous hardware knobs);
:func:`search_serving` (serving deployments under TTFT/TPOT limits, Pareto front).
Modules: :mod:`~jaxmodel.search.grid` (spec parsing, index arithmetic),
:mod:`~jaxmodel.search.objectives` (hardware knobs and co-design objectives).
"""

from jaxmodel.process import lazy_exports

# name -> module; modules are imported on first access (pandas and optax load with them)
_LAZY = {"sweep": "explore", "save": "explore", "codesign": "optimize",
         "CodesignResult": "optimize", "search_parallelism": "parallelism",
         "enumerate_plans": "parallelism", "search_serving": "serving",
         "SweepOptions": "explore", "CodesignOptions": "optimize"}

__all__: list[str] = ["sweep", "save", "codesign", "CodesignResult", "search_parallelism",
                      "enumerate_plans", "search_serving", "SweepOptions", "CodesignOptions"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
