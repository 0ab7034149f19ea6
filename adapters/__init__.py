"""Everything that touches the world: runtimes, cloud and cluster clients, the CLI, benchmarks."""

from __future__ import annotations

# Its modules are imported by name; the package itself exports nothing.
__all__: list[str] = []
