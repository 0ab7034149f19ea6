"""``BatchThrottled``: a batch's wait for the cloud's write budget, recorded in its stream.

A batch that waits before its create call, because the controller's write budget
(:mod:`~fleetledger.adapters.machines.write_budget`) has no tokens left or because the cloud
answered a 429 whose ``Retry-After`` has not passed, records the wait *before* waiting, so an
auditor reading the batch's stream sees why its dispatch came late: for how long, for which
reason, how many writes it needed and the write rate then in force (shrunk after 429s).

The batch lifecycle (:mod:`fleetledger.domain.machines.batch`) knows nothing of it: waiting
changes no request's fate, so the event leaves the batch's state as it is, and the command is
decided here, next to the lifecycle's own (:func:`decide_throttle`), by the batch aggregate of
:mod:`~fleetledger.adapters.machines.aggregates`.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import TypeAlias, get_args

from fleetledger.domain.codec import register_event
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.machines import BatchCommand, BatchEvent, BatchState, needs_dispatch

from .write_budget import ThrottleReason

__all__ = [
    "BatchLogCommand",
    "BatchLogEvent",
    "BatchThrottled",
    "RecordThrottle",
    "decide_throttle",
]

_REASONS: tuple[str, ...] = get_args(ThrottleReason)


@dataclass(frozen=True, slots=True)
class RecordThrottle:
    """The runtime is about to wait ``wait_seconds`` before dispatch ``attempt`` (the next one)
    for ``writes`` writes of the cloud's budget; append the resulting event before waiting."""

    batch_id: str
    attempt: int
    reason: ThrottleReason
    wait_seconds: float
    writes: int
    write_rate: float | None
    _: KW_ONLY
    at: datetime


@register_event("vm.BatchThrottled")
@dataclass(frozen=True, slots=True)
class BatchThrottled:
    """The batch waits ``wait_seconds`` from ``at`` before dispatch ``attempt``, for ``reason``
    (``write_budget``: the controller's bucket is empty; ``retry_after``: the cloud answered a
    429 and asked to wait). ``write_rate`` is the budget's rate then (writes per second, ``None``
    without a local limit); ``writes`` what the dispatch costs."""

    batch_id: str
    attempt: int
    reason: ThrottleReason
    wait_seconds: float
    writes: int
    write_rate: float | None
    at: datetime


BatchLogCommand: TypeAlias = BatchCommand | RecordThrottle
"""What the coordinator decides on a batch stream: the lifecycle's commands and throttle waits."""

BatchLogEvent: TypeAlias = BatchEvent | BatchThrottled
"""What a batch stream holds."""


def decide_throttle(state: BatchState, command: RecordThrottle) -> list[BatchThrottled]:
    """One :class:`BatchThrottled` for a batch about to dispatch; refuses anything else."""
    opened = state.opened
    if opened is None:
        raise Rejected(f"batch {command.batch_id} is not open; it has nothing to wait for")
    if state.completed is not None:
        raise Rejected(f"batch {opened.batch_id} is complete; it has nothing left to send")
    if not needs_dispatch(state):
        raise Rejected(
            f"batch {opened.batch_id} has no machine to dispatch; a wait for the write budget "
            "comes before a dispatch"
        )
    expected = len(state.dispatches) + 1
    if command.attempt != expected:
        raise InvalidCommand(
            f"batch {opened.batch_id} waits before dispatch {expected}, not {command.attempt!r}"
        )
    if command.reason not in _REASONS:
        raise InvalidCommand(f"reason must be one of {', '.join(_REASONS)}, got {command.reason!r}")
    if not (isinstance(command.wait_seconds, float | int) and math.isfinite(command.wait_seconds)):
        raise InvalidCommand(f"wait_seconds must be a number, got {command.wait_seconds!r}")
    if command.wait_seconds <= 0:
        raise InvalidCommand(
            f"wait_seconds must be > 0 (no wait, no event), got {command.wait_seconds}"
        )
    if type(command.writes) is not int or command.writes < 1:
        raise InvalidCommand(f"writes must be a whole number >= 1, got {command.writes!r}")
    rate = command.write_rate
    if rate is not None and not (
        isinstance(rate, float | int) and math.isfinite(rate) and rate > 0
    ):
        raise InvalidCommand(f"write_rate must be > 0 writes per second or None, got {rate!r}")
    return [
        BatchThrottled(
            opened.batch_id,
            command.attempt,
            command.reason,
            float(command.wait_seconds),
            command.writes,
            None if rate is None else float(rate),
            command.at,
        )
    ]
