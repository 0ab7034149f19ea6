"""Domain events ⇄ log records, with ids that make every append safe to re-send.

An event's id is ``uuid5`` over (stream id, the stream version it will get, its type, its
canonical JSON data). So:

- re-sending the very same decision after an unknown outcome (``StoreUnavailable``) sends the same
  ids at the same versions, which the store answers with the original result (a replay);
- a *different* decision at that version has different ids, so it is not mistaken for a replay:
  the expected-version check refuses it and the caller reloads and decides again.

Hashing the data as well as the slot matters: the store recognises a replay by id and place
alone, so ids over (stream, version) only would let a different decision pass as the first one.

Metadata follows PRODUCT.md §3: ``correlation_id`` (the request an event is about, or the batch
for batch-wide events), ``causation_id`` (the command or event that caused it), ``actor`` and
``grouper``. It is not part of the id: the same decision is the same event whoever re-sends it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Final

from fleetledger.domain import grouper, machine_batch
from fleetledger.domain.codec import CodecError, from_data, to_data
from fleetledger.eventstore import NewEvent, RecordedEvent

__all__ = [
    "EVENT_ID_NAMESPACE",
    "correlation_of",
    "decode",
    "decode_batch_event",
    "decode_grouper_event",
    "encode",
    "event_id",
]

EVENT_ID_NAMESPACE: Final = uuid.UUID("7f1d3c52-3a8e-5b0c-9d41-0e6a2f6c8b17")
"""The uuid5 namespace of fleetledger's machine-request events; never change it."""


def event_id(stream_id: str, version: int, type_name: str, data: object) -> uuid.UUID:
    """The deterministic id of an event with ``data`` at ``version`` of ``stream_id``."""
    body = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return uuid.uuid5(EVENT_ID_NAMESPACE, f"{stream_id}\n{version}\n{type_name}\n{body}")


def correlation_of(event: object) -> str:
    """The request an event is about, or the batch for events about a whole batch."""
    request_id = getattr(event, "request_id", None)
    if isinstance(request_id, str):
        return request_id
    batch_id = getattr(event, "batch_id", None)
    return batch_id if isinstance(batch_id, str) else ""


def encode(
    stream_id: str,
    first_version: int,
    events: Sequence[object],
    *,
    causation_ids: Sequence[str],
    actor: str,
    grouper: str,
) -> list[NewEvent]:
    """``events`` as the records to append at ``first_version``, ``first_version + 1``, …

    ``causation_ids[i]`` is what caused ``events[i]`` (a command's id or an event's id).
    """
    if len(causation_ids) != len(events):
        raise ValueError("give one causation id per event")
    records: list[NewEvent] = []
    for offset, (event, causation_id) in enumerate(zip(events, causation_ids, strict=True)):
        type_name, schema_version, data = to_data(event)
        records.append(
            NewEvent(
                type_name,
                data,
                metadata={
                    "correlation_id": correlation_of(event),
                    "causation_id": causation_id,
                    "actor": actor,
                    "grouper": grouper,
                },
                event_id=event_id(stream_id, first_version + offset, type_name, data),
                schema_version=schema_version,
            )
        )
    return records


def decode(record: RecordedEvent) -> grouper.GrouperEvent | machine_batch.BatchEvent:
    """The domain event stored in ``record``; ``CodecError`` if it is not one of ours."""
    event = from_data(record.type, record.schema_version, record.data)
    if isinstance(event, _GROUPER_EVENTS + _BATCH_EVENTS):
        return event
    raise CodecError(f"{record.type} is not a machine-request event")


def decode_grouper_event(record: RecordedEvent) -> grouper.GrouperEvent:
    """The grouper event in ``record``; ``CodecError`` if it holds anything else."""
    event = decode(record)
    if isinstance(event, _GROUPER_EVENTS):
        return event
    raise CodecError(
        f"{record.type} at {record.stream_id}@{record.stream_version} is not a grouper event"
    )


def decode_batch_event(record: RecordedEvent) -> machine_batch.BatchEvent:
    """The batch event in ``record``; ``CodecError`` if it holds anything else."""
    event = decode(record)
    if isinstance(event, _BATCH_EVENTS):
        return event
    raise CodecError(
        f"{record.type} at {record.stream_id}@{record.stream_version} is not a batch event"
    )


_GROUPER_EVENTS = (
    grouper.MachineRequested,
    grouper.BatchSealed,
    grouper.BatchOutcomesRecorded,
)
_BATCH_EVENTS = (
    machine_batch.BatchOpened,
    machine_batch.BatchDispatched,
    machine_batch.MachineCreated,
    machine_batch.MachineFailed,
    machine_batch.MachineNotFound,
    machine_batch.MachineCreateAccepted,
    machine_batch.BatchCompleted,
)
