"""The Python facade: enqueue returns a future of the one outcome (the seed's response channel)."""

from __future__ import annotations

import asyncio

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud, QuotaExceeded
from fleetledger.adapters.machines import MachinesRuntime, RuntimeStopped, skip_batching
from fleetledger.eventstore import EventStore

from .support import EPOCH, manual_runtime, request


class TestEnqueue:
    def test_returns_a_future_resolved_with_the_outcome(self, sqlite_store: EventStore) -> None:
        """The future carries the machine's provider id once its batch completes."""
        runtime = manual_runtime(sqlite_store, FakeCloud(), ManualClock(EPOCH))

        with skip_batching():
            future = runtime.machines.enqueue(request(1))

        outcome = future.result(timeout=5)
        assert (outcome.request_id, outcome.status) == ("r-1", "created")
        assert outcome.provider_id == "fake://machines/m-1"

    def test_the_future_can_be_awaited(self, sqlite_store: EventStore) -> None:
        """``asyncio.wrap_future`` makes the outcome awaitable."""
        runtime = manual_runtime(sqlite_store, FakeCloud(), ManualClock(EPOCH))
        future = runtime.machines.enqueue(request(1, skip_batching=True))

        async def wait() -> str:
            return (await asyncio.wrap_future(future)).status

        assert asyncio.run(wait()) == "created"

    def test_a_failed_outcome_carries_the_classified_error(self, sqlite_store: EventStore) -> None:
        """Failures are values with a code and retry advice, not exceptions."""
        cloud = FakeCloud()
        cloud.fail_machine("m-1", QuotaExceeded("cores quota exceeded"))
        runtime = manual_runtime(sqlite_store, cloud, ManualClock(EPOCH))

        outcome = runtime.machines.enqueue(request(1, skip_batching=True)).result(timeout=5)

        assert outcome.status == "failed"
        assert outcome.error is not None
        assert (outcome.error.code, outcome.error.retryable) == ("quota_exceeded", False)

    def test_a_failed_name_can_be_requested_again(self, sqlite_store: EventStore) -> None:
        """When the future resolves, the failed request's machine name is free again."""
        cloud = FakeCloud()
        cloud.fail_machine("m-1", QuotaExceeded("cores quota exceeded"))
        runtime = manual_runtime(sqlite_store, cloud, ManualClock(EPOCH))
        runtime.machines.enqueue(request(1, skip_batching=True)).result(timeout=5)
        from dataclasses import replace

        retry = replace(request(1, skip_batching=True), request_id="r-1-retry")
        outcome = runtime.machines.enqueue(retry).result(timeout=5)

        assert outcome.status == "created"

    def test_a_stopped_runtime_refuses_requests(self, sqlite_store: EventStore) -> None:
        """Enqueueing before start (or after stop) is an error naming the fix."""
        runtime = MachinesRuntime(sqlite_store, FakeCloud(), threads=False)

        with pytest.raises(RuntimeStopped, match="start"):
            runtime.machines.enqueue(request(1))
