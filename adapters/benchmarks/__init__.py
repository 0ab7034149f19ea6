"""Benchmarks behind ``fleetledger bench``: one module per subject (``grouper``, ``store``, …).

Nothing is imported here, so loading one benchmark never drags in another's dependencies.
"""

from __future__ import annotations

# Its modules are imported by name; the package itself exports nothing.
__all__: list[str] = []
