"""Upcasters: old event shapes are converted on read; stored rows are never rewritten."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Upcaster", "Upcasters"]

Upcaster = Callable[[Mapping[str, Any]], Mapping[str, Any]]
"""Turns the data of ``(type, v)`` into the data of ``(type, v + 1)``."""


class Upcasters:
    """A registry of single-step upcasters, chained on read until no step applies."""

    __slots__ = ("_steps",)

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Upcaster] = {}

    def register(self, event_type: str, from_version: int, upcaster: Upcaster) -> None:
        key = (event_type, from_version)
        if key in self._steps:
            raise ValueError(
                f"an upcaster for {event_type!r} v{from_version} is already registered"
            )
        self._steps[key] = upcaster

    def upcaster(self, event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator form of :meth:`register`."""

        def decorate(fn: Upcaster) -> Upcaster:
            self.register(event_type, from_version, fn)
            return fn

        return decorate

    def __bool__(self) -> bool:
        return bool(self._steps)

    def upcast(
        self, event_type: str, schema_version: int, data: Mapping[str, Any]
    ) -> tuple[int, Mapping[str, Any]]:
        step = self._steps.get((event_type, schema_version))
        while step is not None:
            data = step(data)
            schema_version += 1
            step = self._steps.get((event_type, schema_version))
        return schema_version, data
