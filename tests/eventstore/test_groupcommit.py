"""Group commit: concurrent submits share transactions, and each keeps its own outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from fleetledger.eventstore import (
    NO_STREAM,
    AppendResult,
    EventStore,
    NewEvent,
    WrongExpectedVersion,
)
from fleetledger.eventstore._encoding import PreparedAppend, prepare_append
from fleetledger.eventstore._groupcommit import GroupCommitter
from fleetledger.eventstore._planner import AppendOutcome
from tests.eventstore.support import new_events

RequestT = TypeVar("RequestT")
OutcomeT = TypeVar("OutcomeT")

WAIT = 10.0


def wait_until_queued(committer: GroupCommitter[Any, Any], count: int) -> None:
    """Block until ``count`` submits wait behind the running commit.

    The queue is internal and nothing signals an arrival, so this polls it; a bounded wait for a
    state, never a bet on timing: the test proceeds the moment the followers are queued.
    """
    deadline = time.monotonic() + WAIT
    while True:
        with committer._lock:
            if len(committer._queue) >= count:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} submits did not queue within {WAIT} s")
        time.sleep(0.001)


class GatedCommit:
    """A commit function that records its batches and holds the first one until released.

    Holding the first batch makes every later submit queue behind it, deterministically.
    """

    def __init__(self, commit: Callable[[Sequence[Any]], Sequence[Any]]) -> None:
        self.batches: list[list[Any]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self._commit = commit

    def __call__(self, requests: Sequence[Any]) -> Sequence[Any]:
        self.batches.append(list(requests))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(WAIT), "the test never released the first batch"
        return self._commit(requests)


def run_gated(
    committer: GroupCommitter[RequestT, OutcomeT],
    gate: GatedCommit,
    first: RequestT,
    followers: Sequence[RequestT],
) -> tuple[Future[OutcomeT], list[Future[OutcomeT]]]:
    """Submit ``first`` (it leads and blocks in commit), queue ``followers``, then release."""
    pool = ThreadPoolExecutor(max_workers=len(followers) + 1)
    try:
        leader = pool.submit(committer.submit, first)
        assert gate.entered.wait(WAIT)
        queued = [pool.submit(committer.submit, request) for request in followers]
        wait_until_queued(committer, len(followers))
        gate.release.set()
        for future in [leader, *queued]:
            future.exception(timeout=WAIT)
    finally:
        pool.shutdown(wait=True)
    return leader, queued


def submit_in_daemon_thread(
    committer: GroupCommitter[RequestT, OutcomeT], request: RequestT
) -> Future[OutcomeT]:
    """Submit from a daemon thread: a committer that never answers fails the test on a
    timeout instead of hanging the run at exit."""
    future: Future[OutcomeT] = Future()

    def run() -> None:
        try:
            future.set_result(committer.submit(request))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=run, daemon=True).start()
    return future


def times_ten(requests: Sequence[int]) -> list[int]:
    return [r * 10 for r in requests]


class TestGroupCommitter:
    def test_a_lone_submit_commits_in_the_callers_thread(self) -> None:
        """With no contention a submit is one batch of one, run by the caller itself."""
        batches: list[tuple[list[int], threading.Thread]] = []

        def commit(requests: Sequence[int]) -> list[int]:
            batches.append((list(requests), threading.current_thread()))
            return times_ten(requests)

        committer: GroupCommitter[int, int] = GroupCommitter(commit)

        assert committer.submit(4) == 40
        assert committer.submit(5) == 50
        assert batches == [([4], threading.current_thread()), ([5], threading.current_thread())]

    def test_concurrent_submits_are_coalesced(self) -> None:
        """N concurrent submits take fewer than N batches: all who queue meanwhile share one."""
        gate = GatedCommit(times_ten)
        committer: GroupCommitter[int, int] = GroupCommitter(gate)

        submits = 12
        leader, followers = run_gated(committer, gate, 0, list(range(1, submits)))

        assert len(gate.batches) == 2 < submits
        assert gate.batches[0] == [0]
        assert sorted(gate.batches[1]) == list(range(1, 12))
        assert leader.result() == 0
        assert [f.result() for f in followers] == [r * 10 for r in range(1, 12)]

    def test_each_outcome_reaches_its_own_caller(self) -> None:
        """Within a shared batch every caller gets the outcome of its own request."""
        gate = GatedCommit(lambda requests: [f"done {r}" for r in requests])
        committer: GroupCommitter[str, str] = GroupCommitter(gate)
        names = [f"req-{i}" for i in range(8)]

        leader, followers = run_gated(committer, gate, "lead", names)

        assert leader.result() == "done lead"
        assert [f.result() for f in followers] == [f"done {n}" for n in names]

    def test_a_failing_commit_reaches_every_caller_of_that_batch(self) -> None:
        """If commit_batch raises, every caller of that batch gets the error; others don't."""

        def commit(requests: Sequence[int]) -> list[int]:
            if 0 not in requests:
                raise RuntimeError(f"disk full for {sorted(requests)}")
            return times_ten(requests)

        gate = GatedCommit(commit)
        committer: GroupCommitter[int, int] = GroupCommitter(gate)

        leader, followers = run_gated(committer, gate, 0, [1, 2, 3, 4])

        assert leader.result() == 0
        for future in followers:
            with pytest.raises(RuntimeError, match=r"disk full for \[1, 2, 3, 4\]"):
                future.result()

    def test_the_committer_recovers_after_a_failed_batch(self) -> None:
        """A batch that raised leaves the committer usable for the next submit."""
        fail = [True]

        def commit(requests: Sequence[int]) -> list[int]:
            if fail.pop() if fail else False:
                raise RuntimeError("transient")
            return times_ten(requests)

        committer: GroupCommitter[int, int] = GroupCommitter(commit)

        with pytest.raises(RuntimeError, match="transient"):
            committer.submit(1)
        assert committer.submit(2) == 20

    def test_wrong_number_of_outcomes_is_an_error_for_the_batch(self) -> None:
        """A commit function that loses an outcome fails its batch instead of mis-routing."""
        committer: GroupCommitter[int, int] = GroupCommitter(lambda requests: [])

        with pytest.raises(RuntimeError, match="wrong number of outcomes"):
            committer.submit(1)

    def test_a_lone_writer_never_pauses(self) -> None:
        def pause() -> None:
            raise AssertionError("paused without contention")

        committer: GroupCommitter[int, int] = GroupCommitter(
            times_ten, pause_after_contention=pause
        )

        assert [committer.submit(n) for n in range(3)] == [0, 10, 20]

    def test_after_a_shared_batch_a_new_leader_lets_writers_join_it(self) -> None:
        """The writers a shared commit releases resubmit together; the first of them to lead
        waits for the others to queue, instead of committing alone ahead of them."""
        late: list[Future[int]] = []
        pool = ThreadPoolExecutor(max_workers=1)

        def let_a_writer_queue() -> None:
            late.append(pool.submit(committer.submit, 99))
            wait_until_queued(committer, 2)  # the pausing leader and the late writer

        gate = GatedCommit(times_ten)
        committer: GroupCommitter[int, int] = GroupCommitter(
            gate, pause_after_contention=let_a_writer_queue
        )
        run_gated(committer, gate, 0, [1, 2])  # [1, 2] share a commit
        try:
            assert committer.submit(3) == 30
            assert late[0].result(timeout=WAIT) == 990
        finally:
            pool.shutdown(wait=True)

        assert gate.batches == [[0], [1, 2], [3, 99]]

    def test_an_interrupted_pause_still_commits_and_hands_over(self) -> None:
        """The pausing caller is already queued as leader: it must lead even if interrupted,
        or every later caller would wait behind it forever."""
        committed: list[int] = []

        def interrupt() -> None:
            raise KeyboardInterrupt

        def commit(requests: Sequence[int]) -> Sequence[int]:
            committed.extend(requests)
            return gate(requests)

        gate = GatedCommit(times_ten)
        committer: GroupCommitter[int, int] = GroupCommitter(
            commit, pause_after_contention=interrupt
        )
        run_gated(committer, gate, 0, [1, 2])

        with pytest.raises(KeyboardInterrupt):
            committer.submit(3)
        assert committed[-1] == 3
        assert submit_in_daemon_thread(committer, 4).result(timeout=WAIT) == 40

    def test_batches_respect_the_weight_limit(self) -> None:
        """max_batch_weight splits the queue into batches of at most that many events."""
        gate = GatedCommit(times_ten)
        committer: GroupCommitter[int, int] = GroupCommitter(gate, max_batch_weight=3)

        leader, followers = run_gated(committer, gate, 0, list(range(1, 8)))

        assert [len(batch) for batch in gate.batches] == [1, 3, 3, 1]
        assert sorted(r for batch in gate.batches for r in batch) == list(range(8))
        assert [f.result() for f in followers] == [r * 10 for r in range(1, 8)]
        assert leader.result() == 0


class TestGroupCommitOnTheBackend:
    def test_one_transaction_keeps_each_requests_outcome(self, store: EventStore) -> None:
        """Appends coalesced into one backend commit succeed or conflict each on their own."""
        store.append("vm-taken", new_events(1))
        gate = GatedCommit(store.backend.commit)
        committer: GroupCommitter[tuple[PreparedAppend, ...], AppendOutcome] = GroupCommitter(gate)

        def request(stream: str) -> tuple[PreparedAppend, ...]:
            return (prepare_append(stream, new_events(2), NO_STREAM),)

        streams = ["vm-a", "vm-taken", "vm-b", "vm-a", "vm-c"]
        followers = [request(s) for s in streams]
        leader, queued = run_gated(committer, gate, request("vm-first"), followers)

        assert [len(batch) for batch in gate.batches] == [1, 5]
        assert leader.result() == [AppendResult(2, 3, 2)]
        outcomes = [f.result() for f in queued]
        taken = outcomes[1]
        assert isinstance(taken, WrongExpectedVersion)
        assert (taken.stream_id, taken.actual) == ("vm-taken", 1)
        # The two vm-a appends share the transaction: whichever was queued first wins, and the
        # other is judged against what the winner wrote.
        [loser] = [o for o in (outcomes[0], outcomes[3]) if isinstance(o, WrongExpectedVersion)]
        assert (loser.stream_id, loser.actual) == ("vm-a", 2)
        written = [(r, o) for r, o in zip(followers, outcomes, strict=True) if isinstance(o, list)]
        assert len(written) == 3
        for (append,), [result] in written:
            stored = store.read_all(after=result.first_position - 1, limit=2)
            assert [str(e.event_id) for e in stored] == [e.event_id for e in append.events]
            assert {e.stream_id for e in stored} == {append.stream_id}
            assert result.stream_version == 2
        assert store.head() == 9
        assert store.verify().ok


class TestConcurrentAppends:
    THREADS = 16

    def test_each_caller_gets_its_own_result_or_error(self, store: EventStore) -> None:
        """Concurrent appends, half of them conflicting: each caller sees only its own outcome."""
        for n in range(0, self.THREADS, 2):
            store.append(f"vm-{n}", new_events(1))
        barrier = threading.Barrier(self.THREADS)

        def append(n: int) -> AppendResult:
            barrier.wait(WAIT)
            return store.append(f"vm-{n}", [NewEvent("Mine", {"n": n})], expected_version=NO_STREAM)

        with ThreadPoolExecutor(max_workers=self.THREADS) as pool:
            futures = [pool.submit(append, n) for n in range(self.THREADS)]

        for n, future in enumerate(futures):
            error = future.exception(timeout=WAIT)
            if n % 2 == 0:
                assert isinstance(error, WrongExpectedVersion)
                assert (error.stream_id, error.actual) == (f"vm-{n}", 1)
            else:
                assert error is None
                result = future.result()
                [event] = store.read_stream(f"vm-{n}")
                assert (result.first_position, result.stream_version) == (event.global_position, 1)
                assert event.data == {"n": n}
        assert store.head() == self.THREADS
        assert store.verify().ok

    def test_one_winner_per_expected_version(self, store: EventStore) -> None:
        """Of many concurrent appends expecting the same version exactly one succeeds."""
        barrier = threading.Barrier(8)

        def append(n: int) -> AppendResult:
            barrier.wait(WAIT)
            return store.append("vm-1", [NewEvent("Try", {"n": n})], expected_version=0)

        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = [pool.submit(append, n) for n in range(8)]

        errors = [f.exception(timeout=WAIT) for f in futures]
        winners = [n for n, e in enumerate(errors) if e is None]
        assert len(winners) == 1
        assert all(isinstance(e, WrongExpectedVersion) and e.actual == 1 for e in errors if e)
        [event] = store.read_stream("vm-1")
        assert event.data == {"n": winners[0]}
