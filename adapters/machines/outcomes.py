"""What a caller gets back for one machine request: created with its provider id, or failed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from fleetledger.domain.machines import BatchState, MachineCreated, MachineError, MachineFailed

__all__ = ["MachineOutcome", "OutcomeStatus", "outcomes_of"]

OutcomeStatus = Literal["created", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MachineOutcome:
    """The one terminal outcome of a request (the seed's ``CreateResponse``).

    ``error`` is set exactly when ``status`` is ``"failed"``; its ``retryable`` and
    ``retry_after_seconds`` tell the caller whether sending a new request may work, and when.
    """

    request_id: str
    machine_name: str
    batch_id: str
    status: OutcomeStatus
    at: datetime
    provider_id: str | None = None
    error: MachineError | None = None

    @property
    def created(self) -> bool:
        return self.status == "created"

    @classmethod
    def of(cls, event: MachineCreated | MachineFailed) -> MachineOutcome:
        """The outcome a batch stream's terminal event records."""
        if isinstance(event, MachineCreated):
            return cls(
                request_id=event.request_id,
                machine_name=event.machine_name,
                batch_id=event.batch_id,
                status="created",
                at=event.at,
                provider_id=event.provider_id,
            )
        return cls(
            request_id=event.request_id,
            machine_name=event.machine_name,
            batch_id=event.batch_id,
            status="failed",
            at=event.at,
            error=MachineError(
                event.code, event.message, event.retryable, event.retry_after_seconds
            ),
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the HTTP API's ``outcome``)."""
        error = self.error
        return {
            "request_id": self.request_id,
            "machine_name": self.machine_name,
            "batch_id": self.batch_id,
            "status": self.status,
            "at": self.at.isoformat(),
            "provider_id": self.provider_id,
            "error": None if error is None else dataclasses.asdict(error),
        }


def outcomes_of(state: BatchState) -> tuple[MachineOutcome, ...]:
    """Every outcome a batch has recorded so far, in batch order."""
    if state.opened is None:
        return ()
    return tuple(
        MachineOutcome.of(state.outcomes[m.request_id])
        for m in state.opened.machines
        if m.request_id in state.outcomes
    )
