"""jaxmodel.search: design-space sweeps, parallelism search and gradient co-design."""

from jaxmodel.search.explore import save, sweep
from jaxmodel.search.optimize import CodesignResult, codesign

__all__: list[str] = ["sweep", "save", "codesign", "CodesignResult"]
