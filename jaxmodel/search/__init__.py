"""jaxmodel.search."""

__all__: list[str] = []
