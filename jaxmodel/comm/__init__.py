"""jaxmodel.comm."""

__all__: list[str] = []
