"""What other capabilities may use of VM creation's adapters: the machine request they hand
over (placement asks for new workers with it)."""

from __future__ import annotations

from .machine_request import MachineRequest

__all__ = ["MachineRequest"]
