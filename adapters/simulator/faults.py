"""The faults of deterministic simulation testing: a schedule drawn from a seed, and the wrappers
that inject it into the real runtimes' ports.

A :class:`FaultSchedule` is drawn up front from ``random.Random(seed)``, like a scenario's script,
so a seed fixes every fault; the wrappers only execute it, counting each fault they actually
inject (a fault scheduled for a call that never comes is not counted). The faults:

``crash_before_cloud_call``
    The controller dies between appending a batch's dispatch and calling the cloud.
``crash_after_cloud_call``
    The controller dies after the cloud created the machines, before their results are appended.
``crash_in_commit`` / ``crash_after_commit``
    The controller dies inside a group commit: before the transaction commits (nothing of it
    lands) or right after (all of it lands and no caller hears so).
``commit_reply_lost``
    A commit lands but its caller gets ``StoreUnavailable`` (the outcome is unknown to it, as when
    the connection drops while the database commits).
``crash``
    The controller dies at a moment drawn in virtual time, wherever its tasks are.
``leader_change``
    The leader's lease lapses; another process is elected and takes over, while the old one, not
    yet aware, still has batches in flight (its later appends must be fenced).
``quota`` / ``zonal_capacity``
    A machine is refused for the subscription's quota (``OperationNotAllowed``) or fails with
    ``ZonalAllocationFailed``.
``throttle``
    A create call is refused with a 429 and a ``Retry-After``.
``timeout``
    A create call times out before it reaches the cloud (nothing is created).
``reply_lost``
    A create call succeeds but its reply is lost (a timeout after the cloud did the work).
``watch_duplicate`` / ``watch_reorder``
    The cluster watch delivers events again (a re-watch from an older ``resourceVersion`` replays
    them in order) or delivers events of different objects in another order. A watch keeps the
    order of one object's events (the API server's contract), so neither breaks that order.
``clock_jump``
    The controller's clock jumps forward (an NTP step, a VM resumed after a pause).

Crashes are :class:`ControllerCrashed`, a ``BaseException``: the runtime catches ``Exception``
only, so nothing of the dying process handles it — as with ``kill -9``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Literal, get_args

from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    CapacityUnavailable,
    FakeCloud,
    MachineObservation,
    ProgressCallback,
    QuotaExceeded,
)
from fleetledger.eventstore._encoding import PreparedAppend
from fleetledger.eventstore._planner import AppendOutcome
from fleetledger.eventstore._sql import SqlBackend
from fleetledger.eventstore.errors import StoreUnavailable

__all__ = [
    "FAULT_KINDS",
    "CloudCallFault",
    "CommitFault",
    "ControllerCrashed",
    "FaultKind",
    "FaultSchedule",
    "FaultyBackend",
    "FaultyCloud",
    "TimedFault",
    "draw_schedule",
]

FaultKind = Literal[
    "crash_before_cloud_call",
    "crash_after_cloud_call",
    "crash_in_commit",
    "crash_after_commit",
    "commit_reply_lost",
    "crash",
    "leader_change",
    "quota",
    "zonal_capacity",
    "throttle",
    "timeout",
    "reply_lost",
    "watch_duplicate",
    "watch_reorder",
    "clock_jump",
]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
CloudCallFault = Literal[
    "crash_before_cloud_call", "crash_after_cloud_call", "throttle", "timeout", "reply_lost"
]
CommitFault = Literal["crash_in_commit", "crash_after_commit", "commit_reply_lost"]
TimedKind = Literal["crash", "leader_change", "clock_jump", "watch_duplicate", "watch_reorder"]

_CLOUD_CALL_FAULTS: tuple[CloudCallFault, ...] = get_args(CloudCallFault)
_COMMIT_FAULTS: tuple[CommitFault, ...] = get_args(CommitFault)
_CRASHES = frozenset(
    {
        "crash_before_cloud_call",
        "crash_after_cloud_call",
        "crash_in_commit",
        "crash_after_commit",
        "crash",
    }
)


class ControllerCrashed(BaseException):
    """The simulated controller process dies here (see the module docstring)."""

    def __init__(self, kind: FaultKind) -> None:
        super().__init__(kind)
        self.kind: FaultKind = kind


@dataclass(frozen=True, slots=True)
class TimedFault:
    """A fault at ``at_seconds`` of virtual time; ``amount`` is a clock jump's seconds."""

    at_seconds: float
    kind: TimedKind
    amount: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSchedule:
    """Every fault of one seed's run (see the module docstring).

    ``cloud_calls`` maps a create call's number (1-based, over the whole run) to its fault,
    ``commits`` a group commit's number to its fault, ``machines`` a machine name to the refusal
    or failure its first create meets.
    """

    seed: int
    cloud_calls: Mapping[int, CloudCallFault]
    commits: Mapping[int, CommitFault]
    machines: Mapping[str, Literal["quota", "zonal_capacity"]]
    timed: tuple[TimedFault, ...]
    throttle_retry_after: float = 2.0

    def describe(self) -> tuple[str, ...]:
        """One line per fault, in a stable order (what a seed's report lists)."""
        lines = [f"create call {n}: {kind}" for n, kind in sorted(self.cloud_calls.items())]
        lines += [f"commit {n}: {kind}" for n, kind in sorted(self.commits.items())]
        lines += [f"machine {name}: {kind}" for name, kind in sorted(self.machines.items())]
        lines += [
            f"at {f.at_seconds:.3f} s: {f.kind}" + (f" +{f.amount:g} s" if f.amount else "")
            for f in self.timed
        ]
        return tuple(lines)

    def without(self, *kinds: FaultKind) -> FaultSchedule:
        """The same schedule minus every fault of ``kinds`` (to leave out a kind known to break
        a capability until it is fixed)."""
        drop = set(kinds)
        return FaultSchedule(
            seed=self.seed,
            cloud_calls={n: k for n, k in self.cloud_calls.items() if k not in drop},
            commits={n: k for n, k in self.commits.items() if k not in drop},
            machines={m: k for m, k in self.machines.items() if k not in drop},
            timed=tuple(f for f in self.timed if f.kind not in drop),
            throttle_retry_after=self.throttle_retry_after,
        )


def draw_schedule(
    rng: Random,
    *,
    seed: int,
    machine_names: Sequence[str],
    horizon_seconds: float,
    max_crashes: int = 2,
) -> FaultSchedule:
    """Draw one run's faults. At most ``max_crashes`` crashes of any kind, so that every seed
    also spends time recovering rather than only dying; the rest is sparse enough that batches
    still complete within the run."""
    crashes = 0

    def allowed(kind: str) -> bool:
        nonlocal crashes
        if kind not in _CRASHES:
            return True
        if crashes >= max_crashes:
            return False
        crashes += 1
        return True

    cloud_calls: dict[int, CloudCallFault] = {}
    for call in range(1, 13):
        if rng.random() < 0.3:
            kind = rng.choice(_CLOUD_CALL_FAULTS)
            if allowed(kind):
                cloud_calls[call] = kind
    commits: dict[int, CommitFault] = {}
    for _ in range(rng.randint(0, 3)):
        kind_c = rng.choice(_COMMIT_FAULTS)
        if allowed(kind_c):
            commits[rng.randint(1, 120)] = kind_c
    picked = rng.sample(list(machine_names), min(len(machine_names), rng.randint(0, 3)))
    machines: dict[str, Literal["quota", "zonal_capacity"]] = {
        name: rng.choice(("quota", "zonal_capacity")) for name in picked
    }
    timed: list[TimedFault] = []
    for _ in range(rng.randint(0, 2)):
        kind_t: TimedKind = rng.choice(("crash", "leader_change", "clock_jump"))
        if not allowed(kind_t):
            continue
        at = round(rng.uniform(0.5, horizon_seconds), 3)
        amount = float(rng.choice((15, 60, 600))) if kind_t == "clock_jump" else 0.0
        timed.append(TimedFault(at, kind_t, amount))
    for _ in range(rng.randint(0, 3)):
        kind_w: TimedKind = rng.choice(("watch_duplicate", "watch_reorder"))
        timed.append(TimedFault(round(rng.uniform(0.5, horizon_seconds), 3), kind_w))
    timed.sort(key=lambda f: (f.at_seconds, f.kind))
    return FaultSchedule(
        seed=seed,
        cloud_calls=cloud_calls,
        commits=commits,
        machines=machines,
        timed=tuple(timed),
        throttle_retry_after=float(rng.choice((1, 2, 5))),
    )


class FaultyCloud:
    """The fake cloud behind the schedule's create-call faults; counts what it injects.

    Shared by every controller process of a run (one cloud), so call numbers run over the whole
    run. Per-machine
    faults are handed to the fake itself (:meth:`FakeCloud.fail_machine`),
    which models them as Azure does; ``injected`` counts them when a create meets them.
    """

    def __init__(
        self,
        fake: FakeCloud,
        schedule: FaultSchedule,
        injected: Counter[str],
    ) -> None:
        self.fake = fake
        self._schedule = schedule
        self._injected = injected
        self.calls = 0
        self._pending_machines = dict(schedule.machines)
        for name, kind in schedule.machines.items():
            fake.fail_machine(name, _machine_error(kind, name))

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self.calls += 1
        fault = self._schedule.cloud_calls.get(self.calls)
        met = [n for n in request.machine_names if n in self._pending_machines]
        if fault == "crash_before_cloud_call":
            self._injected[fault] += 1
            raise ControllerCrashed(fault)
        if fault == "timeout":
            self._injected[fault] += 1
            raise TimeoutError("the create call timed out before it reached the cloud")
        if fault == "throttle":
            self._injected[fault] += 1
            self.fake.throttle(retry_after=self._schedule.throttle_retry_after)
        result = self.fake.create_batch(request, on_progress=on_progress)
        if fault != "throttle":
            # The per-machine faults were met only if the call got as far as the machines.
            for name in met:
                self._injected[self._pending_machines.pop(name)] += 1
        if fault == "crash_after_cloud_call":
            self._injected[fault] += 1
            raise ControllerCrashed(fault)
        if fault == "reply_lost":
            self._injected[fault] += 1
            raise TimeoutError("the create call's reply was lost after the cloud acted")
        return result

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        return self.fake.read_machine(machine_name, resume_token=resume_token)


def _machine_error(kind: str, name: str) -> QuotaExceeded | CapacityUnavailable:
    if kind == "quota":
        return QuotaExceeded(
            f"creating {name} would exceed the approved standardDSv5Family Cores quota",
            provider_code="OperationNotAllowed",
        )
    return CapacityUnavailable(
        "allocation failed: no Standard capacity left in the zone",
        zone="1",
        provider_code="ZonalAllocationFailed",
    )


class FaultyBackend(SqlBackend):
    """The store's backend with the schedule's group-commit faults. Commit numbers run over
    the whole run (``counter`` is shared by every process's backend)."""

    def __init__(
        self,
        url: str,
        *,
        schedule: FaultSchedule,
        injected: Counter[str],
        counter: list[int],
    ) -> None:
        super().__init__(url)
        self._schedule = schedule
        self._injected = injected
        self._counter = counter

    def commit(self, items: Sequence[tuple[PreparedAppend, ...]]) -> list[AppendOutcome]:
        self._counter[0] += 1
        fault = self._schedule.commits.get(self._counter[0])
        if fault == "crash_in_commit":
            self._injected[fault] += 1
            raise ControllerCrashed(fault)
        outcomes = super().commit(items)
        if fault == "crash_after_commit":
            self._injected[fault] += 1
            raise ControllerCrashed(fault)
        if fault == "commit_reply_lost":
            self._injected[fault] += 1
            raise StoreUnavailable(
                "the connection dropped while the database committed; the outcome is unknown"
            )
        return outcomes
