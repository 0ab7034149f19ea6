"""The grouper's clock: the host's clock driver, ticking the machine service."""

from __future__ import annotations

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import ClockDriver

from .service import MachineService

__all__ = ["GrouperDriver"]


class GrouperDriver(ClockDriver):
    """Sends ``Tick`` to the service when a batch deadline passes."""

    def __init__(self, service: MachineService, *, clock: Clock) -> None:
        super().__init__(
            next_deadline=service.next_deadline,
            tick=service.tick,
            clock=clock,
            name=f"grouper-{service.grouper_name}",
        )
