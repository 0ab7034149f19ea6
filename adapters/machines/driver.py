"""The grouper's clock: the host's clock driver, ticking the machine service."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.runtime import ClockDriver

from .service import MachineService
from .stalls import DutyWatch

__all__ = ["SEALING_DUTY", "GrouperDriver"]

SEALING_DUTY = "sealing due batches"
"""The name a :class:`DutyWatch` knows the driver's ticks by."""


class GrouperDriver(ClockDriver):
    """Sends ``Tick`` to the service when a batch deadline passes; with ``watch``, each tick's
    failure or success is counted there as :data:`SEALING_DUTY`."""

    def __init__(
        self, service: MachineService, *, clock: Clock, watch: DutyWatch | None = None
    ) -> None:
        tick: Callable[[], object] = service.tick
        if watch is not None:
            tick = partial(watch.run, SEALING_DUTY, service.tick)
        super().__init__(
            next_deadline=service.next_deadline,
            tick=tick,
            clock=clock,
            name=f"grouper-{service.grouper_name}",
        )
