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

Two settings make it behave like AKS under load (the simulator's ``aks`` cloud profile):
``vary_latency`` draws each call's latency from a range (a batch's long-running operation takes
60 to 120 s), and ``limit_writes`` puts ARM's write budget in front of it
(:mod:`~fleetledger.adapters.cloud.throttling`): each call spends one write per
``machines_per_write`` machines, as each AKS batch PUT of up to 50 machines is one ARM write, and
a call the bucket cannot pay for is refused as a whole with :class:`Throttled` and the
``Retry-After`` ARM would give (whole seconds until the bucket holds enough), creating nothing.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from random import Random

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
from .throttling import BucketLimits, TokenBucket

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
        self._latency_range: tuple[float, float, Random] | None = None
        self._writes: TokenBucket | None = None
        self._machines_per_write = 1
        self._write_refusals = 0

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

    def vary_latency(self, low: float, high: float, *, seed: int) -> None:
        """Give each later call's machines a latency drawn uniformly from ``low``-``high`` s,
        one draw per call (a batch's long-running operation), from a generator seeded with
        ``seed``: the same calls in the same order get the same latencies."""
        if not 0 <= low <= high:
            raise ValueError(f"need 0 <= low <= high seconds, got {low} and {high}")
        with self._lock:
            self._latency_range = (low, high, Random(seed))

    def limit_writes(
        self,
        limits: BucketLimits,
        *,
        available: float | None = None,
        machines_per_write: int = 50,
    ) -> None:
        """Refuse calls beyond a write budget, as ARM does (see the module docstring).

        ``available``: the tokens left when the limit starts (the bucket is shared with the
        subscription's other writers; full by default). A call costs one write per
        ``machines_per_write`` machines, rounded up.
        """
        if machines_per_write < 1:
            raise ValueError(f"machines_per_write must be >= 1, got {machines_per_write}")
        with self._lock:
            self._writes = TokenBucket(limits, available=available)
            self._machines_per_write = machines_per_write

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

    @property
    def write_refusals(self) -> int:
        """Calls refused because the write budget (``limit_writes``) could not pay for them."""
        with self._lock:
            return self._write_refusals

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
            self._spend_writes(len(request.machines))
            latency = self._call_latency()
            accepted, refused = self._accept(request, latency)
            omitted = self._omitted & set(accepted)
            self._omitted -= omitted
        if on_progress is not None and accepted:
            on_progress(
                [ProgressNote(name, f"fake:{request.batch_id}:{name}") for name in accepted]
            )
        self._clock.sleep(latency.total_seconds())
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

    def _call_latency(self) -> timedelta:
        """This call's latency (under the lock, so draws follow the order of calls)."""
        if self._latency_range is None:
            return self._latency
        low, high, rng = self._latency_range
        return timedelta(seconds=rng.uniform(low, high))

    def _spend_writes(self, machines: int) -> None:
        """Pay for a call from the write budget (under the lock), or refuse it as ARM would."""
        if self._writes is None:
            return
        cost = min(math.ceil(machines / self._machines_per_write), self._writes.limits.bucket_size)
        wait = self._writes.take(cost, self._clock.now())
        if wait > 0:
            self._write_refusals += 1
            retry_after = float(math.ceil(wait))
            raise Throttled(
                f"Number of write requests for the subscription exceeded its limit; please try "
                f"again after {retry_after:g} seconds",
                retry_after=retry_after,
                provider_code="SubscriptionRequestsThrottled",
            )

    def _accept(
        self, request: BatchCreate, latency: timedelta
    ) -> tuple[list[str], dict[str, CloudError]]:
        """Decide each machine under the lock: accepted (new or existing) or refused."""
        ready_at = self._clock.now() + latency
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
