"""jaxmodel.workload."""

__all__: list[str] = []
