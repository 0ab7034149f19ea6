"""Pure domain aggregates: frozen commands, events and state; ``decide`` and ``evolve``.

Nothing in this package performs I/O, reads a clock or draws a random number. Time arrives on
commands (``at: datetime``) and deadlines are computed, never waited for. The rule is enforced by
``tests/test_layering.py``.
"""

from __future__ import annotations

# Its modules are imported by name; the package itself exports nothing.
__all__: list[str] = []
