"""Appends the log refuses for what they hold, told apart from a log that is down.

An append can fail for good because of a value in it: an event over the store's size limit, text
it cannot encode, text the database will not store (Postgres refuses a NUL character in its JSON
column). Sending it again changes nothing, so a batch holding such a value must not go back to the
queue whole — it would fail at every attempt and after every restart, and every workload planned
with it would stay queued for ever. The placement service splits such a batch until the value is
alone with its workload, and records that workload's rejection with a reason made here: short,
printable, naming the cause without quoting the value the log refused.
"""

from __future__ import annotations

from fleetledger.eventstore import EventStoreError, InvalidEvent

__all__ = ["MAX_REASON_LENGTH", "decided_before_sending", "describe", "refused_by_log", "reason"]

MAX_REASON_LENGTH = 400
"""The longest rejection reason recorded for a refused workload: far below any event size limit
a store is opened with, so the rejection itself is never what the log refuses."""

_MAX_ERROR_LENGTH = 200
_MAX_ID_LENGTH = 64


def refused_by_log(error: BaseException) -> bool:
    """Whether ``error`` is the log refusing what an append holds, rather than a log that is
    down (``StoreUnavailable``), a conflict, or a deposed writer.

    ``InvalidEvent`` is the store's own refusal, made before anything is sent. A bare
    ``EventStoreError`` is how the store reports a database error it has no finer class for —
    a Postgres data exception (a NUL in text) among them; whether it is the value's fault is
    only known once the value is sent alone (see :func:`decided_before_sending`).
    """
    return isinstance(error, InvalidEvent) or type(error) is EventStoreError


def decided_before_sending(error: BaseException) -> bool:
    """Whether the store refused ``error``'s append before sending it: the refusal depends on
    the append alone, so sending the same append again is refused again."""
    return isinstance(error, InvalidEvent)


def describe(error: BaseException, *, limit: int = _MAX_ERROR_LENGTH) -> str:
    """``error``'s message fit to be recorded: printable ASCII on one line, at most ``limit``
    characters (a message may quote part of the value it refused)."""
    return _printable(str(error) or type(error).__name__, limit)


def reason(workload_id: str, error: BaseException) -> str:
    """Why a workload is rejected when the log refuses to record its outcome: bounded by
    :data:`MAX_REASON_LENGTH`, and what to do about it."""
    shown = _printable(workload_id, _MAX_ID_LENGTH)
    text = (
        f"workload {shown}: the event log refused to record its outcome "
        f"({describe(error)}); a field of the request is too large or holds text the log "
        "cannot store: fix it and submit the workload again"
    )
    return text[:MAX_REASON_LENGTH]


def _printable(text: str, limit: int) -> str:
    text = "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))
    return text if len(text) <= limit else f"{text[: limit - 3]}..."
