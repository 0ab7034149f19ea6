"""The machine-request events as the host encodes them: two aggregates, one codec each.

``GROUPER_CODEC`` covers the grouper stream (``vmgrouper-<grouper>``), ``BATCH_CODEC`` each batch
stream (``vmbatch-<grouper>-<batch id>``): the batch lifecycle's events and the runtime's record of
throttling waits (:class:`~fleetledger.adapters.machines.throttled.BatchThrottled`). Ids and
metadata follow :mod:`fleetledger.adapters.runtime.codec`: deterministic ids over (stream, version,
type, data), a correlation id naming the request an event is about (or the batch, for batch-wide
events), and the writing grouper as a label.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetledger.adapters.runtime.codec import EventCodec, event_id, events_of
from fleetledger.domain.machines import batch as machine_batch
from fleetledger.domain.machines import grouper
from fleetledger.eventstore import NewEvent, RecordedEvent

from .throttled import BatchLogEvent, BatchThrottled

__all__ = [
    "BATCH_CODEC",
    "GROUPER_CODEC",
    "decode",
    "decode_batch_event",
    "decode_grouper_event",
    "encode",
    "event_id",
]

_CORRELATION = ("request_id", "batch_id")
_GROUPER_EVENTS = events_of(grouper.GrouperEvent)
_BATCH_EVENTS = (*events_of(machine_batch.BatchEvent), BatchThrottled)

GROUPER_CODEC: EventCodec[grouper.GrouperEvent] = EventCodec(
    "grouper", _GROUPER_EVENTS, correlation_fields=_CORRELATION
)
BATCH_CODEC: EventCodec[BatchLogEvent] = EventCodec(
    "batch", _BATCH_EVENTS, correlation_fields=_CORRELATION
)
_MACHINE_EVENTS: EventCodec[grouper.GrouperEvent | BatchLogEvent] = EventCodec(
    "machine-request", _GROUPER_EVENTS + _BATCH_EVENTS, correlation_fields=_CORRELATION
)


def encode(
    stream_id: str,
    first_version: int,
    events: Sequence[grouper.GrouperEvent | BatchLogEvent],
    *,
    causation_ids: Sequence[str],
    actor: str,
    grouper: str,
) -> list[NewEvent]:
    """``events`` as the records to append at ``first_version``, ``first_version + 1``, …"""
    return _MACHINE_EVENTS.encode(
        stream_id,
        first_version,
        events,
        causation_ids=causation_ids,
        actor=actor,
        labels={"grouper": grouper},
    )


def decode(record: RecordedEvent) -> grouper.GrouperEvent | BatchLogEvent:
    """The domain event stored in ``record``; ``CodecError`` if it is not a machine-request one."""
    return _MACHINE_EVENTS.decode(record)


def decode_grouper_event(record: RecordedEvent) -> grouper.GrouperEvent:
    """The grouper event in ``record``; ``CodecError`` if it holds anything else."""
    return GROUPER_CODEC.decode(record)


def decode_batch_event(record: RecordedEvent) -> BatchLogEvent:
    """The batch event in ``record``; ``CodecError`` if it holds anything else."""
    return BATCH_CODEC.decode(record)
