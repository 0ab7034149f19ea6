"""Group commit: concurrent appends from threads of one process share one transaction.

Leader/follower: a caller arriving while no commit is running becomes the leader and commits its
own request at once; callers arriving meanwhile queue up. When the leader's commit returns, it
hands leadership to the oldest queued caller, if any, and returns its own result immediately; the
new leader commits everything queued so far (its own request first) in one transaction. A lone
writer therefore pays no thread hop and no queueing, and under contention one commit (and one
fsync) serves many callers. Right after a shared commit, a caller that finds no commit running
first lets the writers just released queue behind it (see ``submit``), so batches stay large
instead of alternating between one caller and all the others.

Each queued request keeps its own outcome: the backend checks every request separately inside the
shared transaction, so one caller's version conflict never fails another's append. A caller may
bring several independent requests at once (``submit_many``): they join the same transaction and
come back with their own outcomes, which lets one thread commit for many others without a thread
each.
"""

from __future__ import annotations

import threading
import time
from _thread import LockType, allocate_lock
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupCommitter"]

RequestT = TypeVar("RequestT")
OutcomeT = TypeVar("OutcomeT")


def _yield_to_other_threads() -> None:
    # sleep(0) releases the GIL and yields the CPU once: no timed wait, only a turn for threads
    # that are ready to run now.
    time.sleep(0)


class _Waiter(Generic[RequestT, OutcomeT]):
    """A caller in the queue: waiting behind an active leader, or leading it."""

    __slots__ = ("error", "gate", "outcomes", "promoted", "requests", "weight")

    def __init__(self, requests: Sequence[RequestT], weight: int, gate: LockType | None) -> None:
        self.requests = requests
        self.weight = weight
        # Held until the waiter's outcome is known or it is promoted to leader; None for a
        # caller that leads from the start and so never waits.
        self.gate = gate
        self.promoted = False
        self.outcomes: Sequence[OutcomeT] = ()
        self.error: BaseException | None = None


class GroupCommitter(Generic[RequestT, OutcomeT]):
    """Coalesces concurrent ``submit`` calls into calls of ``commit_batch``.

    ``commit_batch(requests)`` returns one outcome per request, in order; if it raises, every
    request of that batch gets the exception. ``max_batch_weight`` bounds one transaction (in
    events), so a flood of writers cannot build an unbounded transaction.
    ``pause_after_contention`` runs before a caller leads right after a shared batch (by default
    it lets other runnable threads take the GIL once).
    """

    def __init__(
        self,
        commit_batch: Callable[[Sequence[RequestT]], Sequence[OutcomeT]],
        *,
        max_batch_weight: int = 2000,
        pause_after_contention: Callable[[], None] = _yield_to_other_threads,
    ) -> None:
        self._commit_batch = commit_batch
        self._max_batch_weight = max_batch_weight
        self._pause_after_contention = pause_after_contention
        self._lock = threading.Lock()
        self._queue: list[_Waiter[RequestT, OutcomeT]] = []
        # Invariant: while no leader is active the queue is empty.
        self._leader_active = False
        # Whether the last batch served more than one caller.
        self._contended = False

    def submit(self, request: RequestT, *, weight: int = 1) -> OutcomeT:
        return self.submit_many((request,), weight=weight)[0]

    def submit_many(self, requests: Sequence[RequestT], *, weight: int = 1) -> Sequence[OutcomeT]:
        """Commit ``requests`` (independent of each other, ``weight`` in all) in one batch
        with whoever else is queued; one outcome per request, in order."""
        waiter: _Waiter[RequestT, OutcomeT] | None
        with self._lock:
            if self._leader_active:
                waiter = _Waiter(requests, weight, _closed_gate())
                self._queue.append(waiter)
            else:
                self._leader_active = True
                # Without recent contention the caller commits alone, queueing nothing; else it
                # leads from the head of the queue, where others can join it (gate None: it
                # never waits).
                waiter = _Waiter(requests, weight, None) if self._contended else None
                if waiter is not None:
                    self._queue.append(waiter)
        if waiter is None:
            return self._commit_alone(requests)
        if waiter.gate is None:
            # The last commit served several writers, and they are likely about to submit
            # again: a leader committing at once would commit alone and make them all wait a
            # whole commit, halving the batch size. One pause lets those already runnable queue
            # behind it first; a lone writer never pays for it.
            try:
                self._pause_after_contention()
            finally:
                self._lead()  # even if interrupted: others may already be queued behind us
        else:
            waiter.gate.acquire()  # opened by the leader that committed us, or that promoted us
            if waiter.promoted:
                self._lead()
        return self._result(waiter)

    def _commit_alone(self, requests: Sequence[RequestT]) -> Sequence[OutcomeT]:
        """Nobody was committing, so nobody is queued: commit at once. A lone writer's path."""
        try:
            outcomes = self._commit_batch(requests)
            if len(outcomes) != len(requests):
                raise RuntimeError("commit_batch returned the wrong number of outcomes")
            return outcomes
        finally:
            self._hand_over()

    def _lead(self) -> None:
        """Commit the queue's head (the leading caller) and whoever queued behind it."""
        with self._lock:
            batch = self._take_batch()
            self._contended = len(batch) > 1
        try:
            outcomes = self._commit_batch([r for w in batch for r in w.requests])
            if len(outcomes) != sum(len(w.requests) for w in batch):
                raise RuntimeError("commit_batch returned the wrong number of outcomes")
            start = 0
            for waiter in batch:
                waiter.outcomes = outcomes[start : start + len(waiter.requests)]
                start += len(waiter.requests)
        except BaseException as e:
            for waiter in batch:
                waiter.error = e
        finally:
            self._hand_over()
            # batch[0] is the leader's own request: it is not waiting on its gate.
            for waiter in batch[1:]:
                assert waiter.gate is not None
                waiter.gate.release()

    def _hand_over(self) -> None:
        """Promote the oldest queued caller to leader, or note that no leader is active."""
        with self._lock:
            successor = self._queue[0] if self._queue else None
            if successor is None:
                self._leader_active = False
            else:
                successor.promoted = True
        if successor is not None:
            assert successor.gate is not None
            successor.gate.release()

    def _take_batch(self) -> list[_Waiter[RequestT, OutcomeT]]:
        # The leader is always first in the queue, so it is always in its batch.
        total = 0
        count = 0
        for waiter in self._queue:
            if count and total + waiter.weight > self._max_batch_weight:
                break
            total += waiter.weight
            count += 1
        batch, self._queue = self._queue[:count], self._queue[count:]
        return batch

    @staticmethod
    def _result(waiter: _Waiter[RequestT, OutcomeT]) -> Sequence[OutcomeT]:
        if waiter.error is not None:
            raise waiter.error
        return waiter.outcomes


def _closed_gate() -> LockType:
    # A bare lock taken at birth is the cheapest one-shot signal: the waiter blocks acquiring it
    # and the leader releases it once. threading.Event builds a Condition and a second lock per
    # wait, a visible cost when eight writers queue on every commit.
    gate = allocate_lock()
    gate.acquire()
    return gate
