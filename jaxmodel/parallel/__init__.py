"""jaxmodel.parallel."""

__all__: list[str] = []
