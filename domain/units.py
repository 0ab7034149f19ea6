"""Units every capability counts in, so that amounts pass between them without conversion."""

from __future__ import annotations

__all__ = ["MILLI_PER_CPU"]

MILLI_PER_CPU = 1000
"""CPU is counted in milli-CPU (Kubernetes' ``m``); nodes round pods' sums up to whole CPUs."""
