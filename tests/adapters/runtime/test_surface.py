"""The decider host's exported surface changes only on purpose."""

from __future__ import annotations

from fleetledger.adapters import runtime


class TestSurface:
    def test_exports(self) -> None:
        """``adapters.runtime.__all__`` is exactly the documented API, all importable."""
        assert sorted(runtime.__all__) == sorted(
            [
                "EVENT_ID_NAMESPACE", "LEADER_TERM_KEY", "Aggregate", "ClockDriver",
                "CommandRefused", "Companions", "Decision", "Deposed", "Duties", "EventCodec",
                "FileLease", "Fencing", "Folded", "HostError", "HostedStream", "InlineRunner",
                "Lease", "Leadership", "LogContention", "LogFollower", "LogUnavailable",
                "MemoryLease", "NoFencing", "Opening", "Plan", "PostgresLease", "ReadModel",
                "Reactor", "Reactors", "RetryPolicy", "SnapshotCodec", "TaskRunner", "ThreadRunner",
                "Writer", "append_decision", "correlation_of", "event_id", "events_of", "lease_for",
                "opening_append",
            ]
        )  # fmt: skip
        assert all(hasattr(runtime, name) for name in runtime.__all__)
