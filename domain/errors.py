"""Domain refusals.

Exception tree::

    Rejected                 a command the aggregate refuses; ``reason`` says what to change
     └── InvalidCommand      the command itself is malformed (a field out of range, a bad value)
"""

from __future__ import annotations

__all__ = ["InvalidCommand", "Rejected"]


class Rejected(Exception):
    """Raised by ``decide`` when a command cannot be accepted in the current state."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidCommand(Rejected, ValueError):
    """Raised when a command or configuration value is malformed, whatever the state."""
