"""Prefect's one home in vfops (placeholder while it moves in)."""

__all__: list[str] = []
