"""Read models folded from the log, each rebuildable from position 0."""

from __future__ import annotations

# Its modules are imported by name; the package itself exports nothing.
__all__: list[str] = []
