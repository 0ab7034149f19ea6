"""A stop answers every caller: nobody waits forever for a batch the stop left behind."""

from __future__ import annotations

import contextlib
import threading

import pytest

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
)
from fleetledger.adapters.machines import CoordinatorOptions, MachinesRuntime, RuntimeStopped
from fleetledger.eventstore import open_store

from .support import CONFIG, request


class StuckCloud:
    """The fake cloud, whose create calls hang until the test lets them go."""

    def __init__(self) -> None:
        self.inner = FakeCloud()
        self.entered = threading.Event()
        self.release = threading.Event()

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self.entered.set()
        self.release.wait(30)
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.inner.read_machine(machine_name, resume_token=resume_token)


class TestStop:
    def test_callers_of_unsent_and_stuck_batches_are_told_the_controller_stops(
        self, sqlite_url: str
    ) -> None:
        """One batch stuck in the cloud, one queued behind it (one call at a time): a stop
        with a short timeout answers both callers, naming what happens to their requests."""
        cloud = StuckCloud()
        with contextlib.closing(open_store(sqlite_url)) as store:
            runtime = MachinesRuntime(
                store,
                cloud,
                clock=SystemClock(),
                config=CONFIG,
                coordinator_options=CoordinatorOptions(max_concurrent_batches=1),
            ).start()
            stuck = runtime.machines.enqueue(request(1, skip_batching=True))
            assert cloud.entered.wait(10)
            queued = runtime.machines.enqueue(request(2, skip_batching=True))

            runtime.stop(timeout=0.2)
            cloud.release.set()

            for future in (stuck, queued):
                with pytest.raises(RuntimeStopped, match="controller shutting down"):
                    future.result(timeout=5)
            # The requests stay in the log for the next leader.
            logged = store.read_all(types=["vm.MachineRequested"])
            assert {e.data["request_id"] for e in logged} == {"r-1", "r-2"}
