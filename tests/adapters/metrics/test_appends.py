"""Append latency: every append of decisions the runtime makes is timed."""

from __future__ import annotations

import pytest

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.metrics import APPEND_LATENCY, AppendLatency
from fleetledger.adapters.runtime import RetryPolicy, append_decision
from fleetledger.eventstore import (
    NO_STREAM,
    EventStore,
    NewEvent,
    StreamAppend,
    WrongExpectedVersion,
)


def _count(latency: AppendLatency) -> float:
    return next(
        s.value
        for family in latency.collect()
        for s in family.samples
        if s.name == "fleetledger_log_append_duration_seconds_count"
    )


class TestAppendLatency:
    def test_each_committed_append_is_observed(self, store: EventStore) -> None:
        """One observation per ``append_decision`` that committed, on either backend."""
        before = _count(APPEND_LATENCY)
        append_decision(
            store,
            [StreamAppend("s-1", [NewEvent("Seen", {"n": 1})], NO_STREAM)],
            clock=SystemClock(),
            policy=RetryPolicy(),
        )
        assert _count(APPEND_LATENCY) == before + 1

    def test_a_refused_append_is_not_observed(self, sqlite_store: EventStore) -> None:
        """A version conflict is the caller's to decide again; it adds no timing."""
        sqlite_store.append("s-1", [NewEvent("Seen", {"n": 1})], expected_version=NO_STREAM)
        before = _count(APPEND_LATENCY)
        with pytest.raises(WrongExpectedVersion):
            append_decision(
                sqlite_store,
                [StreamAppend("s-1", [NewEvent("Seen", {"n": 2})], NO_STREAM)],
                clock=SystemClock(),
                policy=RetryPolicy(),
            )
        assert _count(APPEND_LATENCY) == before

    def test_negative_durations_count_as_zero(self) -> None:
        """A clock stepping back cannot make a negative observation."""
        latency = AppendLatency()
        latency.observe(-1.0)
        samples = {s.name: s.value for f in latency.collect() for s in f.samples if not s.labels}
        assert samples["fleetledger_log_append_duration_seconds_sum"] == 0
