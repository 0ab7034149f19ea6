"""Validation and canonical encoding of appends, done once before anything touches the database.

Event bodies are stored as the canonical JSON text produced here (sorted keys, compact, UTF-8), and
the hash chain is computed over that same text. Storing the canonical text verbatim means
``verify`` can re-hash exactly what is stored without re-serialising, so it cannot be fooled by a
serializer that changes between versions.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from os import urandom as _urandom
from typing import NamedTuple

from fleetledger.eventstore._types import (
    ANY,
    NO_STREAM,
    STREAM_EXISTS,
    ExpectedVersion,
    NewEvent,
    StreamAppend,
    _ExpectedVersionMarker,
)
from fleetledger.eventstore.errors import InvalidEvent

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "EXPECT_ANY",
    "EXPECT_EXISTS",
    "LEADER_SHARD_KEY",
    "LEADER_TERM_KEY",
    "MAX_LEADER_TERM",
    "PreparedAppend",
    "PreparedEvent",
    "canonical_json",
    "check_leader_shard",
    "prepare_append",
    "prepare_many",
]

DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
"""Per event, data plus metadata. Large blobs belong in object storage with a reference here."""

MAX_NAME_LENGTH = 200
# Wire codes for the non-numeric expectations: the Postgres append function and the SQLite
# implementation share them.
EXPECT_ANY = -1
EXPECT_EXISTS = -2

LEADER_TERM_KEY = "leader_term"
"""The metadata key of an event's fencing term (see ``EventStore.leader_term``)."""
MAX_LEADER_TERM = 2**63 - 1
"""Terms are stored as Postgres ``bigint``."""
LEADER_SHARD_KEY = "leader_shard"
"""The metadata key naming the shard whose own term fences the event's ``leader_term`` (see
``EventStore.leader_term``); without it the term is fenced log-wide."""
MAX_SHARD_LENGTH = 200


# The prepared forms are NamedTuples rather than frozen dataclasses: they are built on every
# append, and a frozen dataclass's __init__ (one object.__setattr__ per field) costs several times
# as much as building a tuple. They stay immutable and internal.
class PreparedEvent(NamedTuple):
    event_id: str
    """The canonical text of the id (lowercase, hyphenated): hashed by the chain, used as key."""
    event_id_bytes: bytes
    """The same id's 16 bytes, which is how it travels to Postgres."""
    type: str
    schema_version: int
    data_text: str
    metadata_text: str
    term: int
    """The leader term in the metadata, 0 when there is none."""
    shard: str | None
    """The shard the term is fenced on; None for the log-wide fence (and when there is no term)."""


class PreparedAppend(NamedTuple):
    stream_id: str
    events: tuple[PreparedEvent, ...]
    expected: int
    """A version >= 0 (0: the stream must not exist), EXPECT_ANY or EXPECT_EXISTS."""
    expected_label: ExpectedVersion
    first_term: int
    """The lowest (first) leader term its events carry, 0 when none carries one."""
    last_term: int
    """The highest (last) leader term its events carry, 0 when none carries one."""
    shard: str | None
    """The shard every termed event names; None when they name none (the log-wide fence)."""


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The standard library's C encoder, built once. ``json.dumps`` with options builds a JSONEncoder
# and then a fresh C encoder on every call, which together cost as much as the encoding itself on
# an append's small bodies. Built once, it runs without a circular-reference registry (shared
# between threads it would report false cycles); a cyclic body then hits the recursion limit,
# which canonical_json reports. Same output as json.dumps(sort_keys=True, separators=(",", ":"),
# ensure_ascii=False, allow_nan=False).
_encode_chunks = (
    c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", True, False, False)
    if c_make_encoder is not None
    else None
)
_encode_canonical = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def canonical_json(value: object, *, what: str) -> str:
    """Sorted-key compact JSON; NaN, infinities, cycles and non-JSON types are refused."""
    try:
        return _canonical(value)
    except _NotJson as e:
        raise InvalidEvent(f"{what} is not JSON-serialisable: {e}") from e.__cause__


class _NotJson(Exception):
    """Raised by _canonical with the reason; callers name the value (only on failure, as
    formatting a name on every append would be a visible cost)."""


def _canonical(value: object) -> str:
    try:
        if _encode_chunks is None:
            return _encode_canonical(value)
        return "".join(_encode_chunks(value, 0))
    except (TypeError, ValueError) as e:
        raise _NotJson(str(e)) from e
    except RecursionError as e:
        raise _NotJson("it is cyclic or nested too deeply") from e


_control_character = re.compile(r"[\x00-\x1f\x7f]").search


def _check_name(value: object, *, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidEvent(f"{what} must be a non-empty string, got {value!r}")
    problem = _name_problem(value)
    if problem is not None:
        raise InvalidEvent(f"{what} {problem}")
    return value


@functools.lru_cache(maxsize=8192)
def _name_problem(value: str) -> str | None:
    """What is wrong with a stream id or event type, or None. Cached: names repeat constantly."""
    if len(value) > MAX_NAME_LENGTH:
        return f"is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
    # Control characters would make the hash-chain input ambiguous (fields are newline-separated)
    # and are never meaningful in an identifier.
    if _control_character(value):
        return f"{value!r} contains a control character"
    # A lone surrogate cannot be stored as UTF-8: the driver would raise mid-commit and fail
    # every caller of the group commit, not just this one.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{value!r} is not valid Unicode text: {e}"
    return None


def _expected_code(expected: object) -> int:
    if expected is ANY:
        return EXPECT_ANY
    if expected is STREAM_EXISTS:
        return EXPECT_EXISTS
    if expected is NO_STREAM:
        return 0
    if isinstance(expected, int) and not isinstance(expected, bool) and expected >= 0:
        return expected
    raise InvalidEvent(
        f"expected_version must be ANY, NO_STREAM, STREAM_EXISTS or an int >= 0, got {expected!r}"
    )


def _body_text(value: object, part: str, event_type: str) -> str:
    try:
        return _canonical(value)
    except _NotJson as e:
        problem = f"{part} of {event_type!r} is not JSON-serialisable: {e}"
        raise InvalidEvent(problem) from e.__cause__


def _utf8_size(text: str, event_type: str) -> int:
    if text.isascii():  # O(1) in CPython, and true of nearly every body
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as e:
        raise InvalidEvent(f"{event_type!r} holds text that is not valid Unicode: {e}") from e


def _event_id(value: object) -> tuple[str, bytes]:
    """The id's canonical text and bytes; a new random (version 4) id for None."""
    if value is None:
        return _new_event_id()
    if isinstance(value, uuid.UUID):
        return str(value), value.bytes
    if isinstance(value, str):
        if _is_canonical_uuid(value):
            # Already the canonical text (what the runtime's ids are): no UUID to build.
            return value, bytes.fromhex(value.replace("-", ""))
        try:
            parsed = uuid.UUID(value)
        except ValueError as e:
            raise InvalidEvent(f"event_id {value!r} is not a UUID") from e
        return str(parsed), parsed.bytes
    raise InvalidEvent(f"event_id must be a UUID, a UUID string or None, got {value!r}")


_is_canonical_uuid = re.compile(
    "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
).fullmatch


def _new_event_id() -> tuple[str, bytes]:
    # What uuid.uuid4() draws, without building a UUID object nobody reads: UUID's validating
    # constructor and str() cost three times the random draw, on every append.
    raw = bytearray(_urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}", bytes(raw)


def _prepare_event(event: object, *, max_event_bytes: int) -> PreparedEvent:
    if not isinstance(event, NewEvent):
        raise InvalidEvent(f"expected a NewEvent, got {type(event).__name__}")
    event_type = _check_name(event.type, what="event type")
    version = event.schema_version
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidEvent(f"schema_version must be an int >= 1, got {version!r}")
    data, metadata = event.data, event.metadata
    # ``type(...) is dict`` first: the ABC check behind isinstance(..., Mapping) is slow.
    if type(data) is not dict and not isinstance(data, Mapping):
        raise InvalidEvent(f"event data must be a JSON object (a mapping), got {type(data)}")
    if type(metadata) is not dict and not isinstance(metadata, Mapping):
        raise InvalidEvent("event metadata must be a JSON object (a mapping)")
    data_text = event.data_json
    if data_text is None:
        data_text = _body_text(data, "data", event_type)
    elif type(data_text) is not str:
        raise InvalidEvent(f"data_json of {event_type!r} must be text, got {type(data_text)}")
    metadata_text = _body_text(metadata, "metadata", event_type)
    size = _utf8_size(data_text, event_type) + _utf8_size(metadata_text, event_type)
    if size > max_event_bytes:
        raise InvalidEvent(
            f"{event_type!r} is {size} bytes of data and metadata; the limit is {max_event_bytes}. "
            "Store large payloads elsewhere and append a reference"
        )
    event_id, event_id_bytes = _event_id(event.event_id)
    term, shard = 0, None
    if LEADER_TERM_KEY in metadata:
        term = _leader_term(metadata, event_type)
        if LEADER_SHARD_KEY in metadata:
            shard = _leader_shard(metadata, event_type)
    elif LEADER_SHARD_KEY in metadata:
        raise InvalidEvent(
            f"metadata of {event_type!r} names {LEADER_SHARD_KEY!r} without {LEADER_TERM_KEY!r}: "
            "a shard is only meaningful with the term it fences; add the shard leader's term or "
            "leave both keys out"
        )
    return PreparedEvent(
        event_id, event_id_bytes, event_type, version, data_text, metadata_text, term, shard
    )


def _leader_term(metadata: Mapping[str, object], event_type: str) -> int:
    term = metadata[LEADER_TERM_KEY]
    if type(term) is not int or not 1 <= term <= MAX_LEADER_TERM:
        raise InvalidEvent(
            f"metadata {LEADER_TERM_KEY!r} of {event_type!r} must be a leader's term, an integer "
            f"from 1 to {MAX_LEADER_TERM}, got {term!r}; leave the key out of appends that "
            "are not fenced"
        )
    return term


def _leader_shard(metadata: Mapping[str, object], event_type: str) -> str:
    return check_leader_shard(
        metadata[LEADER_SHARD_KEY], what=f"metadata {LEADER_SHARD_KEY!r} of {event_type!r}"
    )


_shard_name = re.compile(rf"[A-Za-z0-9._/-]{{1,{MAX_SHARD_LENGTH}}}").fullmatch


@functools.lru_cache(maxsize=1024)
def _is_shard_name(value: str) -> bool:
    """Cached: a leader names its shard on every append."""
    return _shard_name(value) is not None


def check_leader_shard(value: object, *, what: str = "leader shard") -> str:
    """``value`` if it is a well-formed shard name, else InvalidEvent naming ``what``.

    Shard names are restricted to a small alphabet so they read the same in metadata, in the
    ``shard_fencing`` table and in lease names, and cannot smuggle separators or control
    characters into any of them."""
    if type(value) is not str or not _is_shard_name(value):
        raise InvalidEvent(
            f"{what} must be a shard name: 1 to {MAX_SHARD_LENGTH} characters of letters, digits, "
            f"'.', '_', '/' and '-' (such as 'nodes/3'), got {value!r}"
        )
    return value


def _term_span(
    carried: Sequence[int], stream_id: str | None, *, shard: str | None = None
) -> tuple[int, int]:
    """The first and last of the terms ``carried`` by an append's events (to ``stream_id``, or
    of append_many for None) on one fence (log-wide, or ``shard``'s), refusing terms that go
    down: the terms of a fence in the log never decrease, so such an append could never be
    written whole."""
    if not carried:
        return 0, 0
    for earlier, later in itertools.pairwise(carried):
        if later < earlier:
            where = "append_many" if stream_id is None else f"append to {stream_id!r}"
            of_shard = "" if shard is None else f" of shard {shard!r}"
            raise InvalidEvent(
                f"{where} carries leader term {later}{of_shard} after term {earlier}; "
                "the events of one append must not go back to an older term"
            )
    return carried[0], carried[-1]


def prepare_append(
    stream_id: object,
    events: Sequence[NewEvent],
    expected_version: object,
    *,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
) -> PreparedAppend:
    """Validate one stream's append and encode its events; raises InvalidEvent."""
    stream = _check_name(stream_id, what="stream id")
    expected = _expected_code(expected_version)
    if type(events) not in (list, tuple) and (
        isinstance(events, (str, bytes, Mapping)) or not isinstance(events, Sequence)
    ):
        raise InvalidEvent("events must be a list of NewEvent")
    if not events:
        raise InvalidEvent(f"append to {stream!r} has no events")
    prepared = tuple([_prepare_event(e, max_event_bytes=max_event_bytes) for e in events])
    if len(prepared) > 1 and len({e.event_id for e in prepared}) != len(prepared):
        raise InvalidEvent(f"append to {stream!r} repeats an event id")
    label: ExpectedVersion = (
        expected_version if isinstance(expected_version, _ExpectedVersionMarker) else expected
    )
    termed = [e for e in prepared if e.term]
    if not termed:
        return PreparedAppend(stream, prepared, expected, label, 0, 0, None)
    first = termed[0]
    if len(termed) == 1:  # the leader's usual append: nothing to compare
        return PreparedAppend(
            stream, prepared, expected, label, first.term, first.term, first.shard
        )
    shard = first.shard
    for event in termed:
        if event.shard != shard:
            raise InvalidEvent(
                f"append to {stream!r} names {_fence_name(shard)} and {_fence_name(event.shard)}; "
                f"every event of one stream's append that carries {LEADER_TERM_KEY!r} must name "
                f"the same {LEADER_SHARD_KEY!r} (or all none): split it into one append per shard"
            )
    first_term, last_term = _term_span([e.term for e in termed], stream, shard=shard)
    return PreparedAppend(stream, prepared, expected, label, first_term, last_term, shard)


def _fence_name(shard: str | None) -> str:
    return "no leader shard" if shard is None else f"leader shard {shard!r}"


def prepare_many(
    appends: Sequence[StreamAppend], *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
) -> tuple[PreparedAppend, ...]:
    """Validate a multi-stream append; streams stay in the caller's order, which is the order
    of their events in the log (a cause listed before its effects gets the lower positions)."""
    if isinstance(appends, (str, bytes)) or not isinstance(appends, Sequence) or not appends:
        raise InvalidEvent("append_many needs a non-empty list of StreamAppend")
    prepared: list[PreparedAppend] = []
    for item in appends:
        if not isinstance(item, StreamAppend):
            raise InvalidEvent(f"expected a StreamAppend, got {type(item).__name__}")
        prepared.append(
            prepare_append(
                item.stream_id, item.events, item.expected_version, max_event_bytes=max_event_bytes
            )
        )
    streams = [p.stream_id for p in prepared]
    if len(set(streams)) != len(streams):
        raise InvalidEvent("append_many names a stream twice; merge its events into one append")
    ids = [e.event_id for p in prepared for e in p.events]
    if len(set(ids)) != len(ids):
        raise InvalidEvent("append_many repeats an event id")
    # Terms of different shards (and the log-wide one) are independent: each must not go
    # down along the parts that carry it.
    fences: dict[str | None, list[int]] = {}
    for p in prepared:
        if p.first_term:
            fences.setdefault(p.shard, []).extend((p.first_term, p.last_term))
    for shard, terms in fences.items():
        _term_span(terms, None, shard=shard)
    return tuple(prepared)
