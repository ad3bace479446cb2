"""jaxmodel.cost."""

__all__: list[str] = []
