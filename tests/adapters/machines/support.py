"""Builders for the machine-runtime tests: templates, requests, a manual runtime, crash doubles.

The doubles here stand in for the *world* (a process dying, a cloud call that never leaves), never
for our own code: they wrap the real ``FakeCloud`` behind the ``CloudMachines`` port, or implement
the one-method ``TaskRunner`` port.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fleetledger.adapters.clock import ManualClock, SystemClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    CloudMachines,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
)
from fleetledger.adapters.machines import MachineRequest, MachinesRuntime
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
D4 = MachineTemplate(vm_size="Standard_D4s_v5", orchestrator_version="1.31.2", max_pods=110)
D8 = MachineTemplate(vm_size="Standard_D8s_v5", orchestrator_version="1.31.2", max_pods=110)
CONFIG = GrouperConfig(
    idle_timeout=timedelta(seconds=1), max_timeout=timedelta(seconds=5), max_batch_size=50
)


def request(
    n: int,
    template: MachineTemplate = D4,
    *,
    zones: tuple[str, ...] = (),
    tags: dict[str, str] | None = None,
    skip_batching: bool | None = None,
) -> MachineRequest:
    """Request ``r-<n>`` for machine ``m-<n>``."""
    return MachineRequest(
        request_id=f"r-{n}",
        machine_name=f"m-{n}",
        template=template,
        zones=zones,
        tags=tags or {},
        skip_batching=skip_batching,
    )


def manual_runtime(
    store: EventStore, cloud: CloudMachines, clock: ManualClock, **options: object
) -> MachinesRuntime:
    """A runtime without threads: batches run inline, time moves only when the test says."""
    settings: dict[str, object] = {"config": CONFIG, "threads": False, **options}
    return MachinesRuntime(store, cloud, clock=clock, **settings).start()  # type: ignore[arg-type]


def pass_idle_timeout(runtime: MachinesRuntime, clock: ManualClock) -> None:
    """Let the idle timeout elapse and give the driver its step, as the thread would."""
    clock.advance(CONFIG.idle_timeout)
    runtime.driver.step()


def terminal_outcomes(store: EventStore) -> Counter[str]:
    """How many terminal events (created or failed) each request has in the log."""
    counts: Counter[str] = Counter()
    types = ["vm.MachineCreated", "vm.MachineFailed"]
    for event in store.read_all(after=0, limit=100_000, types=types):
        counts[str(event.data["request_id"])] += 1
    return counts


def events_of(store: EventStore, stream_id: str) -> list[str]:
    return [event.type for event in store.read_stream(stream_id)]


class SimulatedCrash(BaseException):
    """The process dies here (a BaseException, so no ``except Exception`` survives it)."""


class CrashingCloud:
    """The real fake cloud, with the process dying once just before or just after a create."""

    def __init__(self, inner: FakeCloud, *, when: str) -> None:
        assert when in ("before_call", "after_call")
        self._inner = inner
        self._when = when
        self._armed = True

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        if self._armed and self._when == "before_call":
            self._armed = False
            raise SimulatedCrash("died after recording the dispatch, before the call left")
        result = self._inner.create_batch(request, on_progress=on_progress)
        if self._armed:
            self._armed = False
            raise SimulatedCrash("died after the cloud created the machines, before recording")
        return result

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self._inner.read_machine(machine_name, resume_token=resume_token)


class LostCalls:
    """A cloud whose create calls never leave the machine (a connection error, unclassified)."""

    def __init__(self, inner: FakeCloud) -> None:
        self._inner = inner
        self.attempts = 0

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        self.attempts += 1
        raise ConnectionResetError("connection reset before the request was sent")

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self._inner.read_machine(machine_name, resume_token=resume_token)


class CountingCloud:
    """The fake cloud, counting reads."""

    def __init__(self, inner: FakeCloud) -> None:
        self.inner = inner
        self.reads: list[str] = []

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        self.reads.append(machine_name)
        return self.inner.read_machine(machine_name, resume_token=resume_token)


class HeldRunner:
    """A task runner whose tasks never run: the process dies right after sealing."""

    def __init__(self) -> None:
        self.held: list[Callable[[], None]] = []

    def submit(self, task: Callable[[], None]) -> None:
        self.held.append(task)


class HeldCloud:
    """The fake cloud, whose create calls wait until the test lets them go (in flight)."""

    def __init__(self) -> None:
        self.inner = FakeCloud(clock=SystemClock())
        self._entered = threading.Semaphore(0)
        self.release = threading.Event()

    def wait_entered(self, calls: int, *, timeout: float) -> None:
        for _ in range(calls):
            assert self._entered.acquire(timeout=timeout), "a batch never reached the cloud"

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self._entered.release()
        assert self.release.wait(60), "the test never released the cloud calls"
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.inner.read_machine(machine_name, resume_token=resume_token)
