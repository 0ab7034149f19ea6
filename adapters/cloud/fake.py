"""An in-memory ``CloudMachines`` for tests and the deterministic simulator.

It keeps the port's promises the way Azure does, so code tested against it behaves the same
against the real adapters:

- creates are create-only by name: creating an existing name reports the existing machine
  (created, still creating → unknown, or failed with its error) and never makes a second one;
- a refusal (:class:`QuotaExceeded`, :class:`SkuUnavailable`, :class:`Throttled`) leaves nothing
  behind, so the same name may be retried; a provisioning failure (:class:`CapacityUnavailable`,
  :class:`UnknownCloudError`) leaves a *failed* machine under that name, as a VM whose allocation
  failed stays in ``Failed`` state — retrying that name reports the failure again;
- a machine becomes ready ``latency`` seconds (on the injected :class:`Clock`) after it was
  accepted; ``create_batch`` waits that long, so a :class:`ManualClock` makes it free;
- with ``delete_failed=True``, as the real adapters do by default, ``create_batch`` deletes the
  failed machines it reports (they would stay billed) and names them in
  ``BatchCreateResult.deleted``, and ``read_machine`` deletes a failed machine it finds
  (``MachineObservation.deleted``); the name is then free again. Off by default here, so that code
  tested against the fake sees the plain create-only semantics unless it asks otherwise.

Everything a test scripts is consumed once: ``fail_machine`` fails the next create of that name,
``fail_next_calls``/``throttle`` the next calls, ``omit_from_result`` the next report of a name.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from fleetledger.adapters.clock import Clock, SystemClock

from .errors import (
    CloudError,
    QuotaExceeded,
    SkuUnavailable,
    Throttled,
)
from .port import (
    BatchCreate,
    BatchCreateResult,
    MachineObservation,
    ProgressCallback,
    ProgressNote,
    batch_put_machine_header,
)

__all__ = ["FakeCall", "FakeCloud"]

# Errors that refuse a create outright; anything else fails a machine that was accepted.
_REFUSALS = (QuotaExceeded, SkuUnavailable, Throttled)


@dataclass(frozen=True, slots=True)
class FakeCall:
    """One ``create_batch`` call as received, with the header the real API would have carried."""

    request: BatchCreate
    header: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class _Machine:
    provider_id: str
    ready_at: datetime
    error: CloudError | None


class FakeCloud:
    """In-memory cloud; thread-safe; see the module docstring for its semantics."""

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        latency: float = 0.0,
        quota: int | None = None,
        delete_failed: bool = False,
    ) -> None:
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency}")
        _check_quota(quota)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._latency = timedelta(seconds=latency)
        self._quota = quota
        self._lock = threading.Lock()
        self._machines: dict[str, _Machine] = {}
        self._creations: list[str] = []
        self._calls: list[FakeCall] = []
        self._call_failures: deque[CloudError] = deque()
        self._machine_failures: dict[str, CloudError] = {}
        self._omitted: set[str] = set()
        self._delete_failed = delete_failed
        self._deletions: list[str] = []

    # -- scripting -----------------------------------------------------------------------------

    def set_quota(self, quota: int | None) -> None:
        """Allow at most ``quota`` live (not failed) machines; ``None`` lifts the limit."""
        _check_quota(quota)
        with self._lock:
            self._quota = quota

    def fail_machine(self, machine_name: str, error: CloudError) -> None:
        """Fail the next create of ``machine_name`` with ``error``."""
        with self._lock:
            self._machine_failures[machine_name] = error

    def fail_next_calls(self, error: CloudError, *, count: int = 1) -> None:
        """Make the next ``count`` ``create_batch`` calls raise ``error`` as a whole."""
        with self._lock:
            self._call_failures.extend([error] * count)

    def throttle(self, *, retry_after: float | None = None, count: int = 1) -> None:
        """Make the next ``count`` calls raise :class:`Throttled` with ``retry_after``."""
        self.fail_next_calls(Throttled(retry_after=retry_after), count=count)

    def omit_from_result(self, *machine_names: str) -> None:
        """Create these machines normally but leave them out of the next result that has them."""
        with self._lock:
            self._omitted.update(machine_names)

    # -- observation ---------------------------------------------------------------------------

    @property
    def calls(self) -> tuple[FakeCall, ...]:
        """Every ``create_batch`` call received, in order, including refused ones."""
        with self._lock:
            return tuple(self._calls)

    @property
    def creations(self) -> tuple[str, ...]:
        """Machine names in the order machines came into existence; a name appears at most once,
        unless its failed machine was deleted (``delete_failed``) and the name created again."""
        with self._lock:
            return tuple(self._creations)

    @property
    def deletions(self) -> tuple[str, ...]:
        """Failed machines deleted by ``delete_failed``, in order."""
        with self._lock:
            return tuple(self._deletions)

    def machine_names(self) -> tuple[str, ...]:
        """The machines that exist now (created or failed), in creation order."""
        with self._lock:
            return tuple(self._machines)

    def failed_leftovers(self) -> tuple[str, ...]:
        """Machines that exist in a failed state: billed resources nobody will use."""
        with self._lock:
            return tuple(n for n, m in self._machines.items() if m.error is not None)

    # -- CloudMachines ---------------------------------------------------------------------------

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        with self._lock:
            self._calls.append(FakeCall(request, batch_put_machine_header(request.machines)))
            if self._call_failures:
                raise self._call_failures.popleft()
            accepted, refused = self._accept(request)
            omitted = self._omitted & set(accepted)
            self._omitted -= omitted
        if on_progress is not None and accepted:
            on_progress(
                [ProgressNote(name, f"fake:{request.batch_id}:{name}") for name in accepted]
            )
        self._clock.sleep(self._latency.total_seconds())
        created: dict[str, str] = {}
        failed: dict[str, CloudError] = dict(refused)
        for name in accepted:
            if name in omitted:
                continue
            seen = self._observe(name)
            if seen.status == "succeeded" and seen.provider_id is not None:
                created[name] = seen.provider_id
            elif seen.status == "failed" and seen.error is not None:
                failed[name] = seen.error
            # still creating (another call's create of the same name): unknown, left out
        deleted = self._delete_failed_machines(failed) if self._delete_failed else ()
        return BatchCreateResult(created=created, failed=failed, deleted=deleted)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        seen = self._observe(machine_name, resume_token=resume_token)
        if seen.status == "failed" and seen.error is not None and self._delete_failed:
            # Found failed later (after a restart, say): as billed as one create_batch reports.
            deleted = self._delete_failed_machines({machine_name: seen.error})
            return replace(seen, deleted=bool(deleted))
        return seen

    # -- internals ------------------------------------------------------------------------------

    def _observe(self, machine_name: str, *, resume_token: str | None = None) -> MachineObservation:
        with self._lock:
            machine = self._machines.get(machine_name)
        if machine is None:
            return MachineObservation(machine_name, "not_found")
        now = self._clock.now()
        if now < machine.ready_at:
            if resume_token is None:
                return MachineObservation(machine_name, "creating", machine.provider_id)
            # Resuming means waiting for the create to finish, as the real adapters' pollers do.
            self._clock.sleep((machine.ready_at - now).total_seconds())
        if machine.error is not None:
            return MachineObservation(machine_name, "failed", machine.provider_id, machine.error)
        return MachineObservation(machine_name, "succeeded", machine.provider_id)

    def _accept(self, request: BatchCreate) -> tuple[list[str], dict[str, CloudError]]:
        """Decide each machine under the lock: accepted (new or existing) or refused."""
        ready_at = self._clock.now() + self._latency
        accepted: list[str] = []
        refused: dict[str, CloudError] = {}
        for name in request.machine_names:
            if name in self._machines:
                accepted.append(name)  # create-only: report the existing machine
                continue
            error = self._machine_failures.pop(name, None)
            if isinstance(error, _REFUSALS):
                refused[name] = error
                continue
            if error is None and self._quota is not None and self._live() >= self._quota:
                refused[name] = QuotaExceeded(
                    f"creating {name!r} would exceed the quota of {self._quota} machines",
                    provider_code="OperationNotAllowed",
                )
                continue
            self._machines[name] = _Machine(f"fake://machines/{name}", ready_at, error)
            self._creations.append(name)
            accepted.append(name)
        return accepted, refused

    def _delete_failed_machines(self, failed: Mapping[str, CloudError]) -> tuple[str, ...]:
        deleted: list[str] = []
        with self._lock:
            for name in failed:
                machine = self._machines.get(name)
                if machine is not None and machine.error is not None:
                    del self._machines[name]
                    self._deletions.append(name)
                    deleted.append(name)
        return tuple(deleted)

    def _live(self) -> int:
        return sum(1 for m in self._machines.values() if m.error is None)


def _check_quota(quota: int | None) -> None:
    if quota is not None and quota < 0:
        raise ValueError(f"quota must be >= 0 machines or None for no limit, got {quota}")
