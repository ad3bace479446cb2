"""jaxmodel.search: design-space sweeps, parallelism search and gradient co-design."""

from jaxmodel.search.explore import save, sweep

__all__: list[str] = ["sweep", "save"]
