"""Every acknowledged workload reaches an outcome, even when the log refuses to store a value a
batch holds: the batch is split until the value is alone with its workload, that workload is
rejected with a short, readable reason, and the workloads beside it are placed — on both
backends, and after a restart. Driven below the HTTP edge, so no edge limit helps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.placement import InvalidWorkload, LogUnavailable, PlacementRuntime
from fleetledger.adapters.placement.refusals import (
    MAX_REASON_LENGTH,
    describe,
    reason,
    refused_by_log,
)
from fleetledger.adapters.runtime import RetryPolicy
from fleetledger.domain.placement import Pool, WorkloadRequest
from fleetledger.eventstore import (
    AppendResult,
    EventStore,
    EventStoreError,
    InvalidEvent,
    StoreUnavailable,
    StreamAppend,
    WrongExpectedVersion,
    open_store,
)

from .support import CPU_POOL, T0, FakeMachines, join, node_service, workload

DEFAULT_LIMIT = 1024 * 1024
# Pools that take no workload without their selector: they only lengthen the reasons the
# planner gives (it lists every pool when none accepts a workload).
SELECTOR_POOLS = tuple(
    replace(CPU_POOL, name=f"reserved-{i:02}-{'x' * 30}", requires_selector=True) for i in range(30)
)
# Pools a small workload may use, none with a node: a workload too large for all of them is
# rejected with every pool's sizes in the reason.
SPARE_POOLS = tuple(replace(CPU_POOL, name=f"spare-{i:02}") for i in range(20))


def runtime_on(store: EventStore, pools: Sequence[Pool], *, joined: bool) -> PlacementRuntime:
    """A runtime as a fresh process builds it on ``store`` (node ``cpu-n1`` joined first when
    ``joined``), not started."""
    nodes_svc = node_service(store)
    if joined:
        join(nodes_svc, "cpu-n1")
    return PlacementRuntime(
        store,
        nodes_svc,
        pools,
        machines=FakeMachines(),
        clock=ManualClock(T0),
        threads=False,
    )


@contextlib.contextmanager
def limited(url: str, max_event_bytes: int) -> Iterator[EventStore]:
    """A second store on the test's database that refuses events over ``max_event_bytes``."""
    with contextlib.closing(open_store(url, max_event_bytes=max_event_bytes)) as store:
        yield store


def outcomes(runtime: PlacementRuntime, *ids: str) -> list[tuple[str, str | None]]:
    return [(s.state, s.node) for s in map(runtime.status, ids)]


class TestAMegabyteSelector:
    """The measured failure: a selector of about a megabyte fits the submission's event but not
    a rejection quoting it whole, and the batch holding it never reached an outcome."""

    @staticmethod
    def poison() -> WorkloadRequest:
        return workload("poison", selector="s" * (DEFAULT_LIMIT - 1000))

    def test_the_workload_is_rejected_and_its_neighbour_placed(self, store: EventStore) -> None:
        """One submission, one batch: the innocent workload is placed, the other rejected with
        a reason that quotes only the start of its selector."""
        runtime = runtime_on(store, [CPU_POOL, *SELECTOR_POOLS], joined=True)
        with runtime:
            runtime.submit([self.poison(), workload("innocent")])
            runtime.step()

            assert outcomes(runtime, "innocent") == [("placed", "cpu-n1")]
            rejected = runtime.status("poison")
        assert rejected.state == "rejected"
        assert rejected.reason is not None
        assert "no available pool accepts it" in rejected.reason
        assert f"({DEFAULT_LIMIT - 1000} characters)" in rejected.reason
        assert len(rejected.reason) < 5000

    def test_a_restart_before_the_batch_reaches_the_same_outcome(self, store: EventStore) -> None:
        """Acknowledged, then the process stops: the next one places and rejects them, and a
        third reads both answers back from the log."""
        with runtime_on(store, [CPU_POOL, *SELECTOR_POOLS], joined=True) as first:
            first.submit([self.poison(), workload("innocent")])
        with runtime_on(store, [CPU_POOL, *SELECTOR_POOLS], joined=False) as second:
            second.step()
            assert outcomes(second, "innocent", "poison") == [
                ("placed", "cpu-n1"),
                ("rejected", None),
            ]
            reason_given = second.status("poison").reason
        with runtime_on(store, [CPU_POOL, *SELECTOR_POOLS], joined=False) as third:
            assert third.step() == []
            assert outcomes(third, "innocent", "poison") == [
                ("placed", "cpu-n1"),
                ("rejected", None),
            ]
            assert third.status("poison").reason == reason_given


class TestAnOutcomeTheLogRefuses:
    """A log opened with a small event limit refuses a rejection whose reason lists twenty
    pools' sizes, while the workload's submission fits: the log's own refusal, on the real
    store."""

    LIMIT = 1200

    @pytest.mark.parametrize("restart", [False, True], ids=["same-process", "after-restart"])
    def test_the_offender_alone_is_rejected_with_a_short_reason(
        self, store_url: str, restart: bool
    ) -> None:
        """The innocent workload is placed; the one whose outcome the log refused is rejected
        with a reason naming the refusal, recorded, and read back after a restart."""
        pools = [CPU_POOL, *SPARE_POOLS]
        with limited(store_url, self.LIMIT) as store:
            submitter = runtime_on(store, pools, joined=True)
            with submitter:
                submitter.submit([workload("too-big", 64_000), workload("innocent")])
                if not restart:
                    submitter.step()
            placer = runtime_on(store, pools, joined=False) if restart else submitter
            with placer:
                placer.step()
                assert outcomes(placer, "innocent", "too-big") == [
                    ("placed", "cpu-n1"),
                    ("rejected", None),
                ]
                given = placer.status("too-big").reason
            with runtime_on(store, pools, joined=False) as after:
                assert after.step() == []
                recorded = after.status("too-big")
        assert given is not None
        assert "the event log refused to record its outcome" in given
        assert f"the limit is {self.LIMIT}" in given
        assert len(given) <= MAX_REASON_LENGTH
        assert (recorded.state, recorded.reason) == ("rejected", given)

    def test_a_batch_refused_whole_is_placed_in_parts(self, store_url: str) -> None:
        """Six long-named workloads on one node make a reservation over the limit; no workload
        is at fault, so every one is placed, in smaller appends."""
        ids = [f"w{i}-{'n' * 150}" for i in range(6)]
        with (
            limited(store_url, self.LIMIT) as store,
            runtime_on(store, [CPU_POOL], joined=True) as runtime,
        ):
            runtime.submit([workload(rid, 500) for rid in ids])
            [report] = runtime.step()
            assert outcomes(runtime, *ids) == [("placed", "cpu-n1")] * 6
        assert (report.requests, report.placed, report.rejected) == (6, 6, 0)
        assert report.appends > 2


class TestPostgresRefusingText:
    def test_a_nul_in_a_submission_refuses_it_whole_recording_nothing(
        self, postgres_store: EventStore
    ) -> None:
        """Postgres cannot store a NUL in JSON text: the submission is refused as invalid,
        naming the cause, before anything is acknowledged or queued."""
        runtime = runtime_on(postgres_store, [CPU_POOL], joined=True)
        head = postgres_store.head()
        with runtime:
            with pytest.raises(InvalidWorkload, match="nothing was recorded"):
                runtime.submit([workload("innocent"), workload("nul", selector="a\x00b")])
            assert len(runtime.collector) == 0
        assert postgres_store.head() == head


class _Down:
    """The store, refusing every append as unreachable while ``down``."""

    def __init__(self, store: EventStore) -> None:
        self._store = store
        self.down = True

    def append_many(self, appends: Sequence[StreamAppend]) -> list[AppendResult]:
        if self.down:
            raise StoreUnavailable("the network is down")
        return self._store.append_many(appends)

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)


class TestStalls:
    @staticmethod
    def runtime(store: _Down, clock: ManualClock) -> PlacementRuntime:
        nodes_svc = node_service(store._store)
        join(nodes_svc, "cpu-n1")
        return PlacementRuntime(
            store,  # type: ignore[arg-type]
            nodes_svc,
            [CPU_POOL],
            clock=clock,
            threads=False,
            retry=RetryPolicy(unavailable_attempts=1),
        )

    def test_batches_failing_in_a_row_are_reported_until_one_succeeds(
        self, sqlite_store: EventStore
    ) -> None:
        """Two failures are retries; the third makes a stall; a batch that lands clears it."""
        down = _Down(sqlite_store)
        with self.runtime(down, ManualClock(T0)) as runtime:
            down.down = False
            runtime.submit([workload("w1")])
            down.down = True
            seen = []
            for _ in range(3):
                with pytest.raises(LogUnavailable):
                    runtime.step()
                seen.append(runtime.stalls())
            down.down = False
            runtime.step()
            assert outcomes(runtime, "w1") == [("placed", "cpu-n1")]
            after = runtime.stalls()
        assert seen[:2] == [[], []]
        [stall] = seen[2]
        assert "placement batches failed 3 time(s) in a row" in stall
        assert "the network is down" in stall
        assert after == []

    def test_one_failure_long_enough_is_a_stall(self, sqlite_store: EventStore) -> None:
        """A batch failing for stall_seconds is reported even before the third failure."""
        down, clock = _Down(sqlite_store), ManualClock(T0)
        with self.runtime(down, clock) as runtime:
            down.down = False
            runtime.submit([workload("w1")])
            down.down = True
            with pytest.raises(LogUnavailable):
                runtime.step()
            clock.advance(31)
            assert len(runtime.stalls()) == 1


class TestReasons:
    def test_a_reason_never_quotes_the_refused_value(self) -> None:
        """However long, and whatever it holds, the refusal's message is cut to printable
        text; the reason stays within its bound."""
        error = EventStoreError("database error: \x00" + "v" * 100_000 + "\udc80")
        given = reason("w-" + "i" * 500, error)
        assert len(given) <= MAX_REASON_LENGTH
        assert given.isprintable() and given.isascii()
        assert describe(error).startswith("database error: ?vvv")

    @pytest.mark.parametrize(
        ("error", "refused"),
        [
            (InvalidEvent("'x' is 2000000 bytes"), True),
            (EventStoreError("database error: unsupported Unicode escape sequence"), True),
            (StoreUnavailable("the network is down"), False),
            (WrongExpectedVersion("workload-a", 1, 2), False),
        ],
        ids=["invalid-event", "database-refusal", "unavailable", "conflict"],
    )
    def test_what_counts_as_a_refused_value(self, error: Exception, refused: bool) -> None:
        """Only the store's refusals of what an append holds split a batch; a log that is down
        or a conflict never rejects a workload."""
        assert refused_by_log(error) is refused
