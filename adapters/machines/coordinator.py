"""The Coordinator reactor: executes sealed batches against a ``CloudMachines`` port.

One batch, one stream (``vmbatch-<grouper>-<batch_id>``), opened by the service in the same append
as the grouper's ``BatchSealed``. Executing it follows the rules of
:mod:`fleetledger.domain.machines.batch`:

1. **Read before retry.** Machines dispatched earlier but without an outcome are *in doubt* (the
   process may have died mid-call): read each one and record what the read saw. Never re-create
   blindly; a machine that is not found goes back to "to dispatch".
2. **Record the dispatch before the call.** ``RecordDispatch`` (with the exact ``BatchPutMachine``
   header, built by :func:`fleetledger.domain.machines.encode_batch_put_machine_header` from
   ``machines_to_dispatch``; ``header=None`` for per-machine PUT adapters) is appended first, then
   ``create_batch`` is called once for the whole batch.
3. **Results per machine.** Created and failed machines are recorded (failed leftovers the
   adapter deleted, from a result or from a read, with ``deleted``); machines missing from both
   maps stay unresolved and go through step 1 — the original treated them as created. A raised
   :class:`~fleetledger.adapters.cloud.CloudError` proves nothing was created, so it fails every
   unresolved request (``RecordCallFailure``) with that classified error; its ``retryable`` and
   ``retry_after`` reach the requester, who decides whether to ask again. Any other exception leaves
   the outcome unknown: the machines are read.
4. **Completion.** When ``BatchCompleted`` is recorded, the outcomes go to the grouper
   (``on_complete`` → ``RecordBatchOutcomes``), which resolves the callers' futures.

Crash safety: on start the runtime submits every batch the grouper has no outcomes for; step 1
then settles the in-doubt machines and step 2 dispatches only what was never sent or was read back
as missing, up to the batch's ``max_attempts``. Create-only cloud semantics make a re-sent create
of an existing name report that machine instead of making a second one.

Log outages: a batch whose log append or read fails after the host's re-sends (the database is
down or its connections were cut) is not given up: the coordinator waits (``log_retry_seconds``,
doubling up to ``log_retry_max_seconds``) and executes it again from the top — load the stream,
read the in-doubt machines, then dispatch what is left — exactly as a restart would, for as long as
this process leads. :meth:`Coordinator.halt` ends the waiting (a stop past its grace period, a
step-down): the batch is then left to the next leader.

Concurrency: batches run on a :class:`~fleetledger.adapters.runtime.runners.TaskRunner`, whose
bound (``max_concurrent_batches`` when the runtime builds it) is a ceiling, set high by default:
what paces the batches is the cloud's write budget. One batch never runs twice at once in this
process. Two processes working the same batch would both be safe (expected versions,
create-only), but wasteful: run one leader. When they do meet — a new leader and the one it
replaced, each about to dispatch the same attempt — the one whose dispatch, decided again after
catching up, turns out to be already recorded sends nothing: nothing of its own was appended, so
no fence stopped it, and the calls belong to the process that recorded them. It reads those
machines instead, as any in-doubt machine.

The write budget: before each dispatch the batch reserves the writes its create call costs from
a :class:`~fleetledger.adapters.machines.write_budget.WriteBudget` (Azure's per-subscription
write bucket by default: 200 at once, 10 a second), and if it must wait, records
:class:`~fleetledger.adapters.machines.throttled.BatchThrottled` (the wait, and why: the local
budget, or a 429's ``Retry-After``) before waiting, with the dispatch not yet recorded. A 429 the
cloud answers anyway (other writers share the budget; providers behind ARM have their own) still
fails its batch's machines with ``throttled`` and the ``Retry-After``, as above, and tells the
budget, which pauses every batch's writes until the ``Retry-After`` has passed and lowers its
rate, growing back while no 429 comes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import structlog

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.cloud import (
    BatchCreate,
    CloudError,
    CloudMachines,
    MachineObservation,
    MachineSpec,
    ProgressNote,
    Throttled,
)
from fleetledger.adapters.cloud.throttling import ARM_SUBSCRIPTION_WRITES
from fleetledger.adapters.runtime import (
    Aggregate,
    CommandRefused,
    Deposed,
    Folded,
    HostedStream,
    LogContention,
    LogUnavailable,
    RetryPolicy,
    TaskRunner,
    Writer,
)
from fleetledger.domain.machines import (
    ERROR_CODES,
    BatchCompleted,
    BatchState,
    ErrorCode,
    MachineError,
    RecordCallFailure,
    RecordCreateAccepted,
    RecordDispatch,
    RecordMachineRead,
    RecordMachineResults,
    encode_batch_put_machine_header,
    is_complete,
    machines_to_dispatch,
    needs_dispatch,
    resume_token,
    unresolved_machines,
)
from fleetledger.domain.machines import batch as machine_batch
from fleetledger.eventstore import EventStore, StoreUnavailable

from .aggregates import batch_aggregate
from .context import BatchMetadata, batch_metadata
from .errors import BatchStalled, MachinesError
from .errors import LogContention as MachinesLogContention
from .errors import LogUnavailable as MachinesLogUnavailable
from .outcomes import MachineOutcome, outcomes_of
from .streams import validate_grouper_name
from .throttled import BatchLogCommand, BatchLogEvent, RecordThrottle
from .write_budget import ThrottleReason, WriteBudget

__all__ = [
    "DEFAULT_MAX_CONCURRENT_BATCHES",
    "CompletionHandler",
    "Coordinator",
    "CoordinatorOptions",
    "DispatchMode",
    "machine_error",
]

log = structlog.get_logger(__name__)

DispatchMode = Literal["batch", "per_machine"]

DEFAULT_MAX_CONCURRENT_BATCHES = 1200
"""Batches executed at once, at most, by default: ARM's sustained write rate (10 a second) times
the longest an AKS batch takes to finish (some 120 s). Below it the ceiling, not the cloud's
budget, would pace a steady load of long batches; each in-flight batch holds a thread."""

CompletionHandler = Callable[[str, tuple[MachineOutcome, ...], str], None]
"""``(batch_id, outcomes, completed_event_id)``: a batch has every outcome."""

_RETRY_AFTER: ThrottleReason = "retry_after"
_PAUSE_SLICE_SECONDS = 1.0
"""A throttling wait is slept in slices this long, so that a halt ends it within one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoordinatorOptions:
    """How batches are sent, how many at once, and how long in-doubt machines are waited for.

    ``dispatch_mode="batch"`` records the ``BatchPutMachine`` header (one call per batch, the AKS
    machines API and the fake); ``"per_machine"`` records one call per machine and no header
    (plain VMs, ``AzureVmCloud``). A machine read as still *creating* is read again every
    ``read_poll_seconds`` for up to ``read_timeout_seconds``; a read that fails is retried
    ``read_error_attempts`` times. Past either bound the batch is left for the next start. A
    batch the log failed under is executed again after ``log_retry_seconds``, the wait doubling
    up to ``log_retry_max_seconds`` while the log stays unreachable.

    ``max_concurrent_batches`` bounds the batches executed at once (the thread runner the runtime
    builds); the default, :data:`DEFAULT_MAX_CONCURRENT_BATCHES`, leaves the cloud's budget to
    pace them. ``write_rate`` (writes per second) and ``write_burst`` (writes at once) size the
    write budget (:mod:`~fleetledger.adapters.machines.write_budget`); the defaults are Azure
    Resource Manager's documented per-subscription write bucket, 10 a second and 200
    (:data:`~fleetledger.adapters.cloud.throttling.ARM_SUBSCRIPTION_WRITES`, with sources), and
    ``write_rate=None`` sets no local limit (a cloud without ARM in front of it). After a 429
    the rate grows back to ``write_rate`` over ``write_recovery_seconds``. A create call costs
    one write per machine in ``"per_machine"`` mode, and one per ``machines_per_write`` machines
    in ``"batch"`` mode (the AKS machines API takes 50 machines in one PUT).
    """

    dispatch_mode: DispatchMode = "batch"
    read_poll_seconds: float = 5.0
    read_timeout_seconds: float = 900.0
    read_error_attempts: int = 5
    log_retry_seconds: float = 0.5
    log_retry_max_seconds: float = 5.0
    max_concurrent_batches: int = DEFAULT_MAX_CONCURRENT_BATCHES
    write_rate: float | None = ARM_SUBSCRIPTION_WRITES.refill_per_second
    write_burst: int = ARM_SUBSCRIPTION_WRITES.bucket_size
    write_recovery_seconds: float = 60.0
    machines_per_write: int = 50

    def __post_init__(self) -> None:
        if self.dispatch_mode not in ("batch", "per_machine"):
            raise ValueError(
                f"dispatch_mode must be 'batch' or 'per_machine', got {self.dispatch_mode!r}"
            )
        if self.read_poll_seconds <= 0 or self.read_timeout_seconds < 0:
            raise ValueError("read_poll_seconds must be > 0 and read_timeout_seconds >= 0")
        if self.read_error_attempts < 1:
            raise ValueError("read_error_attempts must be at least 1")
        if not 0 < self.log_retry_seconds <= self.log_retry_max_seconds:
            raise ValueError(
                "log_retry_seconds must be > 0 and at most log_retry_max_seconds, got "
                f"{self.log_retry_seconds} and {self.log_retry_max_seconds}"
            )
        for name in ("max_concurrent_batches", "write_burst", "machines_per_write"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        rate = self.write_rate
        if rate is not None and not (
            isinstance(rate, float | int) and math.isfinite(rate) and rate > 0
        ):
            raise ValueError(
                f"write_rate must be a number of writes per second > 0, or None for no local "
                f"limit; got {rate!r}"
            )
        if not self.write_recovery_seconds > 0:
            raise ValueError(
                f"write_recovery_seconds must be > 0, got {self.write_recovery_seconds!r}"
            )

    def write_budget(self) -> WriteBudget:
        """A fresh write budget of this size."""
        return WriteBudget(
            rate=self.write_rate,
            burst=self.write_burst,
            recovery_seconds=self.write_recovery_seconds,
        )

    def writes_for(self, machines: int) -> int:
        """The writes a create call of ``machines`` machines costs."""
        if self.dispatch_mode == "per_machine":
            return machines
        return math.ceil(machines / self.machines_per_write)


def machine_error(error: CloudError) -> MachineError:
    """The domain's record of a classified cloud error."""
    code: ErrorCode = next((c for c in ERROR_CODES if c == error.code), "unknown")
    return MachineError(
        code,
        error.message or type(error).__name__,
        bool(error.retryable),
        error.retry_after,
    )


class Coordinator:
    """Executes sealed batches; see the module docstring for the rules it follows."""

    def __init__(
        self,
        store: EventStore,
        cloud: CloudMachines,
        *,
        clock: Clock,
        runner: TaskRunner,
        on_complete: CompletionHandler,
        grouper_name: str,
        options: CoordinatorOptions | None = None,
        actor: str = "fleetledger",
        retry: RetryPolicy | None = None,
        writer: Writer | None = None,
        write_budget: WriteBudget | None = None,
    ) -> None:
        self._store = store
        self._cloud = cloud
        self._clock = clock
        self._runner = runner
        self._on_complete = on_complete
        self._grouper = validate_grouper_name(grouper_name)
        self._batches = batch_aggregate(self._grouper)
        self._options = options or CoordinatorOptions()
        # One per subscription: given, when several coordinators share one.
        self._budget = write_budget if write_budget is not None else self._options.write_budget()
        self._writer = writer or Writer(actor=actor, labels=(("grouper", self._grouper),))
        self._retry = retry or RetryPolicy()
        self._idle = threading.Condition()
        self._in_flight: set[str] = set()
        # Submitted again while running (a new term's resubmission racing the old run's end):
        # run once more when the current run ends, or the batch could be dropped by both.
        self._again: set[str] = set()
        self._halted = threading.Event()

    @property
    def write_budget(self) -> WriteBudget:
        """The write budget the batches spend before their create calls."""
        return self._budget

    # -- scheduling --------------------------------------------------------------------------

    def submit(self, batch_ids: Sequence[str]) -> None:
        """Execute these batches on the runner (each at most once at a time); returns at once
        with a thread runner. Usable as the service's ``on_sealed`` observer."""
        for batch_id in batch_ids:
            with self._idle:
                if batch_id in self._in_flight:
                    self._again.add(batch_id)
                    continue
                self._in_flight.add(batch_id)
            self._runner.submit(_BoundTask(self, batch_id))

    def halt(self) -> None:
        """Stop waiting for the log: batches waiting to be executed again after an outage are
        left to the next leader (a stop past its grace period, a step-down)."""
        self._halted.set()

    def resume(self) -> None:
        """Lead again: batches failed by a log outage are executed again once it passes."""
        self._halted.clear()

    def in_flight(self) -> tuple[str, ...]:
        """Batches submitted and not finished yet."""
        with self._idle:
            return tuple(sorted(self._in_flight))

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no batch is in flight (True) or ``timeout`` seconds pass (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._in_flight, timeout=timeout)

    def _run(self, batch_id: str) -> None:
        try:
            self._execute_through_outages(batch_id)
        except Deposed as e:
            log.info(
                "no longer the leader; the batch is left to the new leader",
                batch_id=batch_id,
                term=e.term,
                current_term=e.current_term,
            )
        except (MachinesError, StoreUnavailable) as e:
            log.error(
                "batch left incomplete; it is resumed on the next start",
                batch_id=batch_id,
                error=str(e),
            )
        except Exception:
            log.exception(
                "batch execution failed unexpectedly; it is resumed on the next start",
                batch_id=batch_id,
            )
        finally:
            with self._idle:
                again = batch_id in self._again and not self._halted.is_set()
                self._again.discard(batch_id)
                if not again:
                    self._in_flight.discard(batch_id)
                    self._idle.notify_all()
        if again:
            # Still in flight: nobody else may start it meanwhile.
            self._runner.submit(_BoundTask(self, batch_id))

    def _execute_through_outages(self, batch_id: str) -> None:
        """:meth:`execute`, again and again while the log is unreachable (until halted).

        Each attempt starts over from the log, as a restart would: the stream is loaded, the
        machines dispatched without a recorded outcome are read before anything is sent again.
        """
        wait = self._options.log_retry_seconds
        while True:
            try:
                self.execute(batch_id)
                return
            except (MachinesLogUnavailable, StoreUnavailable) as e:
                if self._halted.is_set():
                    raise
                log.warning(
                    "event log unreachable; executing the batch again once it is back",
                    batch_id=batch_id,
                    retry_in_seconds=wait,
                    error=str(e),
                )
                # An interruptible wait, not a sleep: halt() ends it at once.
                if self._halted.wait(wait):
                    raise
                wait = min(wait * 2, self._options.log_retry_max_seconds)

    # -- execution ---------------------------------------------------------------------------

    def execute(self, batch_id: str) -> BatchState:
        """Drive one batch to completion in the calling thread; returns its final state.

        Raises :class:`BatchStalled` when the cloud or the log cannot make it progress now.
        """
        batch = _BatchLog(
            self._store,
            batch_id,
            aggregate=self._batches,
            clock=self._clock,
            retry=self._retry,
            writer=self._writer,
        )
        batch.load()
        if batch.state.opened is None:
            raise BatchStalled(
                f"batch {batch_id} has no stream {batch.stream_id}; it was sealed by another "
                "grouper name or its stream was never opened"
            )
        if not is_complete(batch.state):
            log.debug(
                "executing batch", batch_id=batch_id, status=machine_batch.status(batch.state)
            )
            self._read_unresolved(batch)
            while not is_complete(batch.state):
                if needs_dispatch(batch.state):
                    self._dispatch(batch)
                elif not unresolved_machines(batch.state):
                    raise BatchStalled(f"batch {batch_id} neither complete nor executable")
                self._read_unresolved(batch)
        self._on_complete(batch_id, outcomes_of(batch.state), batch.completed_event_id)
        return batch.state

    def _dispatch(self, batch: _BatchLog) -> None:
        state = batch.state
        opened = state.opened
        assert opened is not None
        machines = machines_to_dispatch(state)
        attempt = len(state.dispatches) + 1
        self._await_write_budget(batch, attempt, self._options.writes_for(len(machines)))
        if self._options.dispatch_mode == "batch":
            header: str | None = encode_batch_put_machine_header(machines)
            calls: tuple[str, ...] = (
                f"create_batch {batch.batch_id}: {len(machines)} machine(s), BatchPutMachine",
            )
        else:
            header = None
            calls = tuple(f"create {m.machine_name} (create-only PUT)" for m in machines)
        dispatch = RecordDispatch(batch.batch_id, attempt, calls, header, at=self._clock.now())
        if not batch.record(dispatch):
            # The append met another process's dispatch of this very attempt (a new leader, or
            # the old one it replaced) and was decided again to nothing: nothing of ours was
            # appended, so no fence was met either. That process sends (or sent) these
            # machines; sending them too would make the same creates twice. Read them instead.
            log.info(
                "another process recorded this dispatch; reading its machines instead",
                batch_id=batch.batch_id,
                attempt=attempt,
            )
            return
        if self._halted.is_set():
            # Deposed between the record and the call: the next leader reads these machines
            # (not found: never sent) and sends them.
            raise BatchStalled(
                f"batch {batch.batch_id}: this process stopped leading before its create call; "
                "it is left to the next leader"
            )
        request = BatchCreate(
            batch.batch_id,
            opened.template,
            tuple(
                MachineSpec(m.machine_name, m.zones, m.tags, request_id=m.request_id)
                for m in machines
            ),
        )
        log.debug(
            "dispatching batch",
            batch_id=batch.batch_id,
            attempt=attempt,
            machines=len(machines),
            reason=opened.seal_reason,
        )
        metadata = BatchMetadata(
            batch_id=batch.batch_id, machine_names=request.machine_names, attempt=attempt
        )

        def record_accepted(notes: Sequence[ProgressNote]) -> None:
            # In the log before the creates are awaited further: a restart resumes them. Notes
            # the cloud gives together (one batch PUT's) are one append.
            now = self._clock.now()
            batch.record(
                *(
                    RecordCreateAccepted(batch.batch_id, n.machine_name, n.resume_token, at=now)
                    for n in notes
                )
            )

        try:
            with batch_metadata(metadata):
                result = self._cloud.create_batch(request, on_progress=record_accepted)
        except (MachinesError, Deposed):
            # Raised by record_accepted: the log failed, not the cloud. The call's outcome is
            # unknown; the next execution reads its machines before sending anything again.
            raise
        except CloudError as e:
            log.warning(
                "cloud refused the whole batch",
                batch_id=batch.batch_id,
                code=e.code,
                retryable=e.retryable,
                error=e.message,
            )
            if isinstance(e, Throttled):
                self._throttled({name: e for name in request.machine_names})
            error = machine_error(e)
            batch.record(RecordCallFailure(batch.batch_id, attempt, error, at=self._clock.now()))
            return
        except Exception as e:
            # No classified answer: the call may have created some machines. Read them; if the
            # batch gives up on one, its failure keeps what the first such call raised.
            log.warning(
                "cloud call ended without an answer; reading its machines",
                batch_id=batch.batch_id,
                error_type=type(e).__name__,
                error=str(e),
            )
            batch.call_error = batch.call_error or f"{type(e).__name__}: {e}"
            return
        self._throttled(result.failed)
        failed = {name: machine_error(error) for name, error in result.failed.items()}
        batch.record(
            RecordMachineResults(
                batch.batch_id,
                dict(result.created),
                failed,
                at=self._clock.now(),
                deleted=tuple(result.deleted),
            )
        )

    # -- the write budget -------------------------------------------------------------------

    def _await_write_budget(self, batch: _BatchLog, attempt: int, writes: int) -> None:
        """Reserve the dispatch's writes; record and wait out what the budget asks for.

        A wait made before a 429 answered another batch is followed by that 429's pause, so
        the write does not go out while the cloud refuses writes.
        """
        reservation = self._budget.reserve(writes, self._clock.now())
        wait, reason = reservation.wait_seconds, reservation.reason
        while wait > 0:
            rate = self._budget.rate(self._clock.now())
            batch.record(
                RecordThrottle(
                    batch.batch_id, attempt, reason, wait, writes, rate, at=self._clock.now()
                )
            )
            log.info(
                "batch waits for the cloud's write budget",
                batch_id=batch.batch_id,
                reason=reason,
                wait_seconds=round(wait, 3),
                writes=writes,
                write_rate=rate,
            )
            self._pause(batch.batch_id, wait)
            wait = self._budget.pause_remaining(self._clock.now())
            reason = _RETRY_AFTER

    def _pause(self, batch_id: str, seconds: float) -> None:
        """Sleep ``seconds`` on the clock, in slices, ending early (raising) on a halt."""
        remaining = seconds
        while True:
            if self._halted.is_set():
                raise BatchStalled(
                    f"batch {batch_id} was waiting for the write budget when this process "
                    "stopped leading; it is left to the next leader"
                )
            if remaining <= 1e-9:
                return
            step = min(remaining, _PAUSE_SLICE_SECONDS)
            self._clock.sleep(step)
            remaining -= step

    def _throttled(self, errors: Mapping[str, CloudError]) -> None:
        """Tell the write budget when the cloud answered 429 (once per call)."""
        refusals = [e for e in errors.values() if isinstance(e, Throttled)]
        if refusals:
            waits = [e.retry_after for e in refusals if e.retry_after is not None]
            self._budget.refused(max(waits) if waits else None, self._clock.now())

    def _read_unresolved(self, batch: _BatchLog) -> None:
        for machine in unresolved_machines(batch.state):
            seen = self._observe(
                batch.batch_id,
                machine.machine_name,
                resume_token(batch.state, machine.machine_name),
            )
            now = self._clock.now()
            if seen.status == "succeeded":
                # A machine that exists has an id; the name is the fallback an adapter without
                # one can still be traced by.
                provider_id = seen.provider_id or machine.machine_name
                command: BatchLogCommand = RecordMachineRead(
                    batch.batch_id, machine.machine_name, "created", provider_id, at=now
                )
            elif seen.status == "failed":
                error = (
                    machine_error(seen.error)
                    if seen.error is not None
                    else MachineError("unknown", f"machine {machine.machine_name} failed")
                )
                # A failed leftover the adapter deleted is recorded as deleted, as in results.
                command = RecordMachineRead(
                    batch.batch_id,
                    machine.machine_name,
                    "failed",
                    error=error,
                    at=now,
                    deleted=seen.deleted,
                )
            else:
                command = RecordMachineRead(
                    batch.batch_id,
                    machine.machine_name,
                    "not_found",
                    at=now,
                    call_error=batch.call_error,
                )
            log.info(
                "read in-doubt machine",
                batch_id=batch.batch_id,
                machine=machine.machine_name,
                status=seen.status,
            )
            batch.record(command)

    def _observe(self, batch_id: str, machine_name: str, token: str | None) -> MachineObservation:
        options = self._options
        give_up = self._clock.now().timestamp() + options.read_timeout_seconds
        failures = 0
        while True:
            try:
                seen = self._cloud.read_machine(machine_name, resume_token=token)
            except Deposed:
                raise  # a self-fenced port: not a failed read, no reason to try again
            except Exception as e:
                failures += 1
                if failures >= options.read_error_attempts:
                    raise BatchStalled(
                        f"cannot read machine {machine_name} of batch {batch_id} "
                        f"({failures} attempts, last: {e!r}); check the cloud credentials and "
                        "reachability — the batch resumes on the next start"
                    ) from e
                retry_after = e.retry_after if isinstance(e, CloudError) else None
                self._clock.sleep(
                    retry_after if retry_after is not None else options.read_poll_seconds
                )
                continue
            if seen.status != "creating":
                return seen
            if self._clock.now().timestamp() >= give_up:
                raise BatchStalled(
                    f"machine {machine_name} of batch {batch_id} is still creating after "
                    f"{options.read_timeout_seconds:.0f} s; the batch resumes on the next start"
                )
            self._clock.sleep(options.read_poll_seconds)


class _BoundTask:
    """``coordinator._run(batch_id)`` as a named callable (shows up readably in tracebacks)."""

    __slots__ = ("_batch_id", "_coordinator")

    def __init__(self, coordinator: Coordinator, batch_id: str) -> None:
        self._coordinator = coordinator
        self._batch_id = batch_id

    def __call__(self) -> None:
        self._coordinator._run(self._batch_id)

    def __repr__(self) -> str:
        return f"execute batch {self._batch_id}"


class _BatchLog:
    """One batch's hosted stream, and the id of its ``BatchCompleted`` once folded."""

    def __init__(
        self,
        store: EventStore,
        batch_id: str,
        *,
        aggregate: Aggregate[BatchState, BatchLogCommand, BatchLogEvent],
        clock: Clock,
        retry: RetryPolicy,
        writer: Writer,
    ) -> None:
        self.batch_id = batch_id
        self._stream: HostedStream[BatchState, BatchLogCommand, BatchLogEvent] = HostedStream(
            store, aggregate, aggregate.stream_of(batch_id), clock=clock, writer=writer, retry=retry
        )
        self.completed_event_id = ""
        self.call_error: str | None = None
        """What the first create call that ended without a classified answer raised."""
        self._stream.on_events(self._note_completion)

    @property
    def stream_id(self) -> str:
        return self._stream.stream_id

    @property
    def state(self) -> BatchState:
        return self._stream.state

    def load(self) -> None:
        """Fold the whole stream (its history included: a completed batch has its id)."""
        try:
            self._stream.load(announce_history=True)
        except StoreUnavailable as e:
            raise MachinesLogUnavailable(f"cannot load batch {self.batch_id}: {e}") from e

    def record(self, *commands: BatchLogCommand) -> bool:
        """Decide ``commands`` in turn on the current state and append what they decide in one
        append, or nothing if one is refused (a leader duty); whether anything was appended
        (nothing: the state, caught up after a conflict, already had it all).

        Each event's causation is the event the decision was taken after (the stream's last).
        """
        try:
            decision = self._stream.execute(
                lambda at: [(command, self._stream.last_event_id) for command in commands],
                duty=True,
            )
        except CommandRefused as e:
            raise BatchStalled(f"batch {self.batch_id}: {e.error.reason}") from e.error
        except LogContention as e:
            raise MachinesLogContention(
                f"{e}; is another coordinator running batch {self.batch_id}?"
            ) from e
        except (LogUnavailable, StoreUnavailable) as e:
            # StoreUnavailable: a read on the way (catching up after a conflict) failed.
            raise MachinesLogUnavailable(str(e)) from e
        return bool(decision.events)

    def _note_completion(self, folded: Sequence[Folded[BatchLogEvent]]) -> None:
        for f in folded:
            if isinstance(f.event, BatchCompleted):
                self.completed_event_id = f.event_id
