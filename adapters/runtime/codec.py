"""Domain events ⇄ log records, with ids that make every append safe to re-send.

An event's id is ``uuid5`` over (stream id, the stream version it will get, its type, its
canonical JSON data). So:

- re-sending the very same decision after an unknown outcome (``StoreUnavailable``) sends the same
  ids at the same versions, which the store answers with the original result (a replay);
- a *different* decision at that version has different ids, so it is not mistaken for a replay:
  the expected-version check refuses it and the caller reloads and decides again.

Hashing the data as well as the slot matters: the store recognises a replay by id and place
alone, so ids over (stream, version) only would let a different decision pass as the first one.

Metadata (docs/ARCHITECTURE.md, "The log"): ``correlation_id`` (the request an event is about,
else the entity it concerns), ``causation_id`` (the command or event that caused it), ``actor``, any
fixed labels of the writer (e.g. ``grouper``) and, for the leader's duties, ``leader_term`` (the
store refuses a deposed term) with, for a shard's leader, ``leader_shard`` (the store fences the
term against that shard's own). None of it is part of the id: the same decision is the same event
whoever re-sends it.
"""

from __future__ import annotations

import hashlib
import typing
import uuid
from collections.abc import Mapping, Sequence
from typing import Final, Generic, TypeVar

from fleetledger.domain.codec import CodecError, from_data, registered_event_types, to_data
from fleetledger.eventstore import NewEvent, RecordedEvent, canonical_json

__all__ = [
    "EVENT_ID_NAMESPACE",
    "LEADER_SHARD_KEY",
    "LEADER_TERM_KEY",
    "CodecError",
    "EventCodec",
    "correlation_of",
    "event_id",
    "events_of",
]

EVENT_ID_NAMESPACE: Final = uuid.UUID("7f1d3c52-3a8e-5b0c-9d41-0e6a2f6c8b17")
"""The uuid5 namespace of fleetledger's event ids; never change it (ids in the log use it)."""

LEADER_TERM_KEY: Final = "leader_term"
"""The metadata key the event store reads a fencing term from."""

LEADER_SHARD_KEY: Final = "leader_shard"
"""The metadata key naming the shard whose term fences an event (only beside a term)."""

E = TypeVar("E")


def event_id(stream_id: str, version: int, type_name: str, data: object) -> uuid.UUID:
    """The deterministic id of an event with ``data`` at ``version`` of ``stream_id``.

    ``data`` is hashed as the log's canonical JSON (sorted keys, compact, UTF-8 as is), the very
    text ``json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` gives.
    Data the log refuses (NaN, a non-JSON type) is refused here as
    :class:`~fleetledger.eventstore.InvalidEvent`."""
    return uuid.UUID(_id_text(stream_id, version, type_name, _data_json(data, type_name)))


_NAMESPACE_BYTES: Final = EVENT_ID_NAMESPACE.bytes


def _data_json(data: object, type_name: str) -> str:
    # The store's prebuilt encoder: json.dumps builds an encoder on every call, which cost more
    # than twice the encoding.
    return canonical_json(data, what=f"the data of a {type_name} event")


def _id_text(stream_id: str, version: int, type_name: str, data_json: str) -> str:
    """``str(uuid.uuid5(EVENT_ID_NAMESPACE, name))`` for the event's name, written straight
    from the digest: building the UUID object, then its text, cost three times the hash."""
    name = f"{stream_id}\n{version}\n{type_name}\n{data_json}"
    raw = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name.encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def events_of(union: object) -> tuple[type, ...]:
    """The event classes of a domain's event union (``GrouperEvent`` is ``A | B | C``): a codec
    built from the union cannot drift from the events the aggregate folds."""
    members = typing.get_args(union) or (union,)
    if not all(isinstance(member, type) for member in members):
        raise TypeError(f"{union!r} is not a union of event classes")
    return tuple(members)


def correlation_of(event: object, fields: Sequence[str] = ("request_id",)) -> str:
    """The first of ``fields`` that ``event`` has as text: what the event is about (``""`` when
    none is)."""
    for name in fields:
        value = getattr(event, name, None)
        if isinstance(value, str):
            return value
    return ""


class EventCodec(Generic[E]):
    """Encodes and decodes the events of one aggregate (``event_types``) through the domain's
    registry of stored names (:mod:`fleetledger.domain.codec`).

    ``correlation_fields`` name, most specific first, the event fields that say what an event is
    about (the request a caller waits on, then the entity of the stream).
    """

    __slots__ = ("_correlation", "_name", "_types")

    def __init__(
        self,
        name: str,
        event_types: Sequence[type],
        *,
        correlation_fields: Sequence[str] = ("request_id",),
    ) -> None:
        if not event_types:
            raise ValueError(f"codec {name!r} needs at least one event type")
        self._name = name
        self._types = tuple(event_types)
        self._correlation = tuple(correlation_fields)

    @property
    def event_types(self) -> tuple[type, ...]:
        return self._types

    def encode(
        self,
        stream_id: str,
        first_version: int,
        events: Sequence[E],
        *,
        causation_ids: Sequence[str],
        actor: str,
        labels: Mapping[str, object] | None = None,
        leader_terms: Sequence[int | None] | None = None,
        leader_shard: str | None = None,
    ) -> list[NewEvent]:
        """``events`` as the records to append at ``first_version``, ``first_version + 1``, …

        ``causation_ids[i]`` is what caused ``events[i]``; ``leader_terms[i]``, when given and
        not ``None``, fences ``events[i]`` to that leader term — of ``leader_shard``'s leader
        when given. An event without a term carries no shard: the store refuses a shard alone.
        """
        if len(causation_ids) != len(events):
            raise ValueError("give one causation id per event")
        if leader_terms is not None and len(leader_terms) != len(events):
            raise ValueError("give one leader term (or None) per event")
        records: list[NewEvent] = []
        for offset, (event, causation_id) in enumerate(zip(events, causation_ids, strict=True)):
            type_name, schema_version, data = to_data(event)
            data_json = _data_json(data, type_name)
            metadata: dict[str, object] = {
                "correlation_id": correlation_of(event, self._correlation),
                "causation_id": causation_id,
                "actor": actor,
            }
            if labels:
                metadata.update(labels)
            term = None if leader_terms is None else leader_terms[offset]
            if term is not None:
                metadata[LEADER_TERM_KEY] = term
                if leader_shard is not None:
                    metadata[LEADER_SHARD_KEY] = leader_shard
            records.append(
                NewEvent(
                    type_name,
                    data,
                    metadata=metadata,
                    event_id=_id_text(stream_id, first_version + offset, type_name, data_json),
                    schema_version=schema_version,
                    data_json=data_json,
                )
            )
        return records

    def decode(self, record: RecordedEvent) -> E:
        """The event stored in ``record``; ``CodecError`` if it is not one of this codec's."""
        event = from_data(record.type, record.schema_version, record.data)
        if not isinstance(event, self._types):
            raise CodecError(
                f"{record.type} at {record.stream_id}@{record.stream_version} is not a "
                f"{self._name} event"
            )
        return event  # type: ignore[return-value]

    def type_names(self) -> list[str]:
        """The stored names of this codec's events (for filtered reads and subscriptions)."""
        return sorted(
            name for name, t in registered_event_types().items() if issubclass(t.cls, self._types)
        )
