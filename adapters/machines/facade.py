"""The Python entry point: enqueue a machine request, get a future of its outcome.

Seed 01 ("Response Channel Pattern"): ``EnqueueCreate(req)`` returns a channel instead of
blocking, so the caller can do other work, time out, or give up. Here that is a
:class:`concurrent.futures.Future` — ``future.result(timeout=…)`` blocks with a timeout,
``add_done_callback`` reacts, and ``asyncio.wrap_future`` awaits it::

    future = machines.enqueue(MachineRequest(machine_name="m-1", template=template))
    outcome = future.result(timeout=30)
    with skip_batching():                      # the seed's WithSkipBatching(ctx)
        urgent = machines.enqueue(MachineRequest(machine_name="m-2", template=template))

The request is durable (appended to the log) when ``enqueue`` returns; cancelling the future
only stops waiting, it does not withdraw the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

from .errors import RuntimeStopped
from .machine_request import MachineRequest
from .outcomes import MachineOutcome
from .service import MachineService

__all__ = ["Machines"]


class Machines:
    """Enqueue machine requests; each returns a future of its one outcome."""

    def __init__(
        self, service: MachineService, *, running: Callable[[], bool] | None = None
    ) -> None:
        self._service = service
        self._running = running

    def enqueue(self, request: MachineRequest) -> Future[MachineOutcome]:
        """Append ``request`` and return a future of its outcome.

        Raises :class:`~fleetledger.adapters.machines.errors.InvalidRequest` /
        :class:`~fleetledger.adapters.machines.errors.RequestRejected` at once when it cannot be
        accepted.
        """
        return self.enqueue_many([request])[0]

    def enqueue_many(self, requests: Sequence[MachineRequest]) -> list[Future[MachineOutcome]]:
        """Append ``requests`` atomically (all or none); futures in the same order."""
        if self._running is not None and not self._running():
            raise RuntimeStopped("the machines runtime is not running; call start() first")
        accepted = self._service.request(requests)
        return [self._service.outcome_future(request_id) for request_id in accepted.request_ids]

    def outcome(self, request_id: str) -> Future[MachineOutcome]:
        """A future of an earlier request's outcome (done at once if it is already known)."""
        return self._service.outcome_future(request_id)
