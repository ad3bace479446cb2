"""jaxmodel.ops."""

__all__: list[str] = []
