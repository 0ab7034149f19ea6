"""HostedStream: commands arriving during an append are decided together; duties are fenced."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from datetime import datetime

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.runtime import (
    CommandRefused,
    Deposed,
    HostedStream,
    LogContention,
    LogUnavailable,
    RetryPolicy,
    Writer,
    opening_append,
)
from fleetledger.eventstore import (
    ANY,
    AppendResult,
    EventStore,
    Fenced,
    InvalidEvent,
    NewEvent,
    StoreUnavailable,
    StreamAppend,
    open_store,
)
from fleetledger.projections.recent import RecentEvents

from .test_example_aggregate import COUNTER, EPOCH, Command, Counter, Event, Increment

Hosted = HostedStream[Counter, Command, Event]


def plan(request_id: str, by: int = 1) -> object:
    return lambda at: [(Increment(request_id, by, at), request_id)]


class GatedStore:
    """The real store, whose first append waits until the test opens the gate (the append in
    flight while other commands arrive)."""

    def __init__(self, inner: EventStore) -> None:
        self._inner = inner
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.appends: list[int] = []

    def append_many(self, appends: list[StreamAppend]) -> list[AppendResult]:
        if not self.appends:
            self.entered.set()
            self.gate.wait(10)
        self.appends.append(sum(len(a.events) for a in appends))
        return self._inner.append_many(appends)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class TestGroupDecisions:
    def test_commands_arriving_during_an_append_share_the_next_one(self, store: EventStore) -> None:
        """While one append is in flight, ten more callers queue; they are decided together
        and land in one append, each caller getting its own events."""
        gated = GatedStore(store)
        stream: Hosted = HostedStream(gated, COUNTER, "counter-g", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        results: dict[str, tuple[object, ...]] = {}

        def call(request_id: str) -> None:
            results[request_id] = stream.execute(plan(request_id)).events  # type: ignore[arg-type]

        first = threading.Thread(target=call, args=("r-0",))
        first.start()
        assert gated.entered.wait(10)
        others = [threading.Thread(target=call, args=(f"r-{n}",)) for n in range(1, 11)]
        for thread in others:
            thread.start()
        wait_for(lambda: stream.queued() == 10)
        gated.gate.set()
        for thread in [first, *others]:
            thread.join(10)

        assert gated.appends == [1, 10]
        assert stream.state.total == 11
        assert {rid: [e.request_id for e in events] for rid, events in results.items()} == {  # type: ignore[attr-defined]
            f"r-{n}": [f"r-{n}"] for n in range(11)
        }

    def test_a_refusal_fails_only_its_own_caller(self, store: EventStore) -> None:
        """In a group, the refused submission raises CommandRefused; the others land."""
        gated = GatedStore(store)
        stream: Hosted = HostedStream(gated, COUNTER, "counter-r", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        errors: dict[str, BaseException] = {}

        def call(request_id: str, by: int) -> None:
            try:
                stream.execute(plan(request_id, by))  # type: ignore[arg-type]
            except CommandRefused as e:
                errors[request_id] = e

        threads = [
            threading.Thread(target=call, args=(rid, by))
            for rid, by in (("r-0", 1), ("bad", 0), ("r-1", 2))
        ]
        threads[0].start()
        assert gated.entered.wait(10)
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: stream.queued() == 2)
        gated.gate.set()
        for thread in threads:
            thread.join(10)

        assert list(errors) == ["bad"]
        assert stream.state.total == 3


class TestSubmit:
    def test_the_future_resolves_with_the_decision(self, store: EventStore) -> None:
        """submit() returns at once; its future carries what execute() would return."""
        stream: Hosted = HostedStream(store, COUNTER, "counter-s", clock=ManualClock(EPOCH))

        decision = stream.submit(plan("s-1", 2)).result(timeout=10)  # type: ignore[arg-type]

        assert [e.request_id for e in decision.events] == ["s-1"]  # type: ignore[union-attr]
        assert decision.last_position == store.head()
        assert stream.state.total == 2

    def test_a_refusal_fails_the_future(self, store: EventStore) -> None:
        """The future fails with the CommandRefused execute() would raise; nothing appended."""
        stream: Hosted = HostedStream(store, COUNTER, "counter-sr", clock=ManualClock(EPOCH))

        with pytest.raises(CommandRefused):
            stream.submit(plan("bad", 0)).result(timeout=10)  # type: ignore[arg-type]
        assert store.read_stream("counter-sr") == []

    def test_submissions_during_an_append_share_the_next_one(self, store: EventStore) -> None:
        """Submitted while a caller's append is in flight, they are decided together on a
        committer thread once it lands: one more append, not one each."""
        gated = GatedStore(store)
        stream: Hosted = HostedStream(gated, COUNTER, "counter-sg", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        first = threading.Thread(target=stream.execute, args=(plan("r-0"),))
        first.start()
        assert gated.entered.wait(10)

        futures = [stream.submit(plan(f"r-{n}")) for n in range(1, 6)]  # type: ignore[arg-type]
        gated.gate.set()
        decisions = [future.result(timeout=10) for future in futures]
        first.join(10)

        assert gated.appends == [1, 5]
        assert [d.events[0].request_id for d in decisions] == [f"r-{n}" for n in range(1, 6)]  # type: ignore[union-attr]
        assert stream.state.total == 6

    def test_an_observer_may_execute_on_a_stream_waiting_for_the_next_round(
        self, store: EventStore
    ) -> None:
        """An inline reactor hears of a round's events after the next round has gone to
        another committer thread, so executing on one of its streams does not wait forever."""
        gated = GatedStore(store)
        first_stream: Hosted = HostedStream(gated, COUNTER, "counter-na", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        other_stream: Hosted = HostedStream(gated, COUNTER, "counter-nb", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        reacted: list[object] = []

        def react(folded: object) -> None:
            if any(f.event.request_id == "a-1" for f in folded):  # type: ignore[attr-defined]
                reacted.append(other_stream.execute(plan("b-react")))  # type: ignore[arg-type]

        first_stream.on_events(react)
        first = first_stream.submit(plan("a-1"))  # type: ignore[arg-type]
        assert gated.entered.wait(10)
        queued = [
            first_stream.submit(plan("a-2")),  # type: ignore[arg-type]
            other_stream.submit(plan("b-1")),  # type: ignore[arg-type]
        ]
        gated.gate.set()

        for future in [first, *queued]:
            future.result(timeout=10)
        wait_for(lambda: len(reacted) == 1)
        assert other_stream.state.total == 2

    def test_a_group_that_cannot_be_encoded_fails_its_callers_and_the_stream_goes_on(
        self, store: EventStore
    ) -> None:
        """Whatever preparing a group's append raises answers its callers; none waits, and the
        next submission is decided as usual."""

        def fussy(events: object, records: object, at: datetime) -> list[StreamAppend]:
            if any(e.request_id == "bad" for e in events):  # type: ignore[attr-defined]
                raise RuntimeError("this companion cannot be built")
            return []

        stream: Hosted = HostedStream(
            store, COUNTER, "counter-se", clock=ManualClock(EPOCH), companions=fussy
        )

        with pytest.raises(RuntimeError, match="cannot be built"):
            stream.submit(plan("bad")).result(timeout=10)  # type: ignore[arg-type]
        decision = stream.submit(plan("good")).result(timeout=10)  # type: ignore[arg-type]

        assert [e.request_id for e in decision.events] == ["good"]  # type: ignore[union-attr]

    def test_a_stream_that_cannot_load_fails_every_waiting_caller(self, store: EventStore) -> None:
        """A load that fails answers every caller of the group with its error; none waits."""
        unreachable = FlakyStore(store, 0)
        unreachable.read_stream = _refuse_reads  # type: ignore[attr-defined]
        stream: Hosted = HostedStream(unreachable, COUNTER, "counter-sl", clock=ManualClock(EPOCH))  # type: ignore[arg-type]

        futures = [stream.submit(plan(f"r-{n}")) for n in range(3)]  # type: ignore[arg-type]

        for future in futures:
            with pytest.raises(StoreUnavailable):
                future.result(timeout=10)


class TestDecide:
    def test_the_caller_on_a_loop_gets_the_decision(self, store: EventStore) -> None:
        stream: Hosted = HostedStream(store, COUNTER, "counter-d", clock=ManualClock(EPOCH))

        decision = asyncio.run(stream.decide(plan("d-1", 3)))  # type: ignore[arg-type]

        assert [e.request_id for e in decision.events] == ["d-1"]  # type: ignore[union-attr]
        assert stream.state.total == 3

    def test_a_refusal_is_raised_in_the_caller(self, store: EventStore) -> None:
        stream: Hosted = HostedStream(store, COUNTER, "counter-dr", clock=ManualClock(EPOCH))

        with pytest.raises(CommandRefused):
            asyncio.run(stream.decide(plan("bad", 0)))  # type: ignore[arg-type]
        assert store.read_stream("counter-dr") == []

    def test_callers_on_one_loop_during_an_append_share_the_next_one(
        self, store: EventStore
    ) -> None:
        gated = GatedStore(store)
        stream: Hosted = HostedStream(gated, COUNTER, "counter-dg", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        first = threading.Thread(target=stream.execute, args=(plan("r-0"),))
        first.start()
        assert gated.entered.wait(10)

        async def five() -> list[object]:
            waiting = [asyncio.ensure_future(stream.decide(plan(f"r-{n}"))) for n in range(1, 6)]  # type: ignore[arg-type]
            await asyncio.sleep(0)  # each is queued before the gate opens
            gated.gate.set()
            return list(await asyncio.gather(*waiting))

        decisions = asyncio.run(five())
        first.join(10)

        assert gated.appends == [1, 5]
        assert [d.events[0].request_id for d in decisions] == [f"r-{n}" for n in range(1, 6)]  # type: ignore[attr-defined]

    def test_a_caller_that_gave_up_leaves_the_decision_standing(self, store: EventStore) -> None:
        """Cancelled while its group is in flight: the events still land, and the stream goes
        on answering others."""
        gated = GatedStore(store)
        stream: Hosted = HostedStream(gated, COUNTER, "counter-dc", clock=ManualClock(EPOCH))  # type: ignore[arg-type]

        async def give_up() -> None:
            waiting = asyncio.ensure_future(stream.decide(plan("gone")))  # type: ignore[arg-type]
            await asyncio.to_thread(gated.entered.wait, 10)
            waiting.cancel()
            gated.gate.set()
            with pytest.raises(asyncio.CancelledError):
                await waiting

        asyncio.run(give_up())
        later = asyncio.run(stream.decide(plan("later")))  # type: ignore[arg-type]

        assert [r.data["request_id"] for r in store.read_stream("counter-dc")] == ["gone", "later"]
        assert later.events[0].request_id == "later"  # type: ignore[union-attr]


class CountingReads:
    """The real store, counting the stream reads made through it."""

    def __init__(self, inner: EventStore) -> None:
        self._inner = inner
        self.reads = 0

    def read_stream(self, *args: object, **kwargs: object) -> object:
        self.reads += 1
        return self._inner.read_stream(*args, **kwargs)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class TestLoad:
    def test_a_version_already_folded_is_not_read_again(self, store: EventStore) -> None:
        """A reader that saw this process's own event in the log asks for it to be folded:
        the stream holds it already, so nothing is read."""
        counting = CountingReads(store)
        stream: Hosted = HostedStream(counting, COUNTER, "counter-l", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        stream.execute(plan("l-1"))  # type: ignore[arg-type]
        reads = counting.reads

        stream.load(through_version=1)

        assert counting.reads == reads

    def test_the_tail_is_read_while_an_append_of_the_stream_is_in_flight(
        self, store: EventStore
    ) -> None:
        """The read does not wait for the fold lock the append holds; what it read is folded
        once the append concludes, and the append, which the other writer made stale, lands
        after it."""
        gated = GatedStore(store)
        counting = CountingReads(gated)  # type: ignore[arg-type]
        stream: Hosted = HostedStream(counting, COUNTER, "counter-t", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        other: Hosted = HostedStream(store, COUNTER, "counter-t", clock=ManualClock(EPOCH))
        other.execute(plan("t-1"))  # type: ignore[arg-type]
        stream.load()
        other.execute(plan("t-2", 5))  # type: ignore[arg-type]
        appending = threading.Thread(target=stream.execute, args=(plan("t-3", 10),))
        appending.start()
        assert gated.entered.wait(10)
        reads = counting.reads

        loading = threading.Thread(target=stream.load)
        loading.start()
        wait_for(lambda: counting.reads > reads, timeout=5)
        gated.gate.set()
        for thread in (appending, loading):
            thread.join(10)

        assert stream.version == 3
        assert stream.state.total == 16

    def test_a_version_not_folded_yet_is_read(self, store: EventStore) -> None:
        """Appended by another writer: the stream reads its tail and folds it."""
        stream: Hosted = HostedStream(store, COUNTER, "counter-m", clock=ManualClock(EPOCH))
        stream.execute(plan("m-1"))  # type: ignore[arg-type]
        other: Hosted = HostedStream(store, COUNTER, "counter-m", clock=ManualClock(EPOCH))
        other.execute(plan("m-2", 5))  # type: ignore[arg-type]

        stream.load(through_version=2)

        assert stream.version == 2
        assert stream.state.total == 6


def commit_elsewhere(store: EventStore, stream: Hosted, by: int) -> tuple[list[Event], list[str]]:
    """An ``Increment`` decided on the stream's state, committed without it (as another
    capability's transaction carries a stream's events); the events and their ids."""
    events = list(COUNTER.decide(stream.state, Increment(f"elsewhere-{by}", by, EPOCH)))
    records = COUNTER.codec.encode(
        stream.stream_id,
        stream.version + 1,
        events,
        causation_ids=["elsewhere"] * len(events),
        actor="other",
    )
    store.append(stream.stream_id, records, expected_version=stream.version)
    return events, [str(record.event_id) for record in records]


class TestFoldCommitted:
    def test_events_committed_elsewhere_are_folded_without_a_read(self, store: EventStore) -> None:
        """The stream stands just before them: folded as a load would fold them, observers
        told, and nothing read."""
        counting = CountingReads(store)
        stream: Hosted = HostedStream(counting, COUNTER, "counter-f", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
        stream.execute(plan("f-1"))  # type: ignore[arg-type]
        heard: list[int] = []
        stream.on_events(lambda folded: heard.extend(f.version for f in folded))
        events, ids = commit_elsewhere(store, stream, 5)
        reads = counting.reads

        assert stream.fold_committed(events, first_version=2, event_ids=ids)

        assert counting.reads == reads
        assert (stream.version, stream.state.total, heard) == (2, 6, [2])
        fresh: Hosted = HostedStream(store, COUNTER, "counter-f", clock=ManualClock(EPOCH))
        fresh.load()
        assert (fresh.version, fresh.state) == (stream.version, stream.state)

    def test_a_stream_another_writer_moved_is_left_to_its_next_load(
        self, store: EventStore
    ) -> None:
        """Behind what was committed: nothing folded, and the next load reads it all."""
        stream: Hosted = HostedStream(store, COUNTER, "counter-g", clock=ManualClock(EPOCH))
        stream.execute(plan("g-1"))  # type: ignore[arg-type]
        other: Hosted = HostedStream(store, COUNTER, "counter-g", clock=ManualClock(EPOCH))
        other.execute(plan("g-2", 2))  # type: ignore[arg-type]
        events, ids = commit_elsewhere(store, other, 5)

        assert not stream.fold_committed(events, first_version=3, event_ids=ids)
        assert (stream.version, stream.state.total) == (1, 1)

        stream.load()
        assert (stream.version, stream.state.total) == (3, 8)

    def test_a_stream_not_loaded_yet_folds_nothing(self, store: EventStore) -> None:
        stream: Hosted = HostedStream(store, COUNTER, "counter-h", clock=ManualClock(EPOCH))
        other: Hosted = HostedStream(store, COUNTER, "counter-h", clock=ManualClock(EPOCH))
        events, ids = commit_elsewhere(store, other, 5)

        assert not stream.fold_committed(events, first_version=1, event_ids=ids)
        stream.load()
        assert (stream.version, stream.state.total) == (1, 5)


class TestRecentEvents:
    def test_the_writers_read_models_are_handed_what_its_streams_commit(
        self, store: EventStore
    ) -> None:
        """Whether executed or submitted, a committed event reaches the writer's ``recent``
        as the object decided, for this process's read models to fold without decoding."""
        recent = RecentEvents()
        writer = Writer(recent=recent)
        stream: Hosted = HostedStream(
            store, COUNTER, "counter-hand", clock=ManualClock(EPOCH), writer=writer
        )

        executed = stream.execute(plan("h-1"))  # type: ignore[arg-type]
        submitted = stream.submit(plan("h-2")).result(timeout=10)  # type: ignore[arg-type]

        first, second = store.read_stream("counter-hand")
        assert recent.decode(first) is executed.events[0]
        assert recent.decode(second) is submitted.events[0]


class TestCompanions:
    def test_the_decision_names_the_streams_own_last_position(self, store: EventStore) -> None:
        """A companion append lands after the stream's events; the decision's position is the
        stream's own, which a read model of this aggregate's events reaches without it."""

        def audit(events: object, records: object, at: datetime) -> list[StreamAppend]:
            note = NewEvent(type="test.Audited", data={"at": at.isoformat()})
            return [StreamAppend("audit-c", [note], expected_version=ANY)]

        stream: Hosted = HostedStream(
            store,
            COUNTER,
            "counter-c",
            clock=ManualClock(EPOCH),
            companions=audit,
        )

        decision = stream.execute(plan("c-1"))  # type: ignore[arg-type]

        [own] = store.read_stream("counter-c")
        [companion] = store.read_stream("audit-c")
        assert decision.last_position == own.global_position
        assert companion.global_position > own.global_position


def opener_of(store: EventStore, writer: Writer, key: str, **options: object) -> Hosted:
    """A stream whose every decision also opens ``counter-<key>`` (with an increment by 7)."""

    def companions(events: object, records: object, at: datetime) -> list[StreamAppend]:
        increment = Increment(f"open-{key}", 7, at)
        return [opening_append(COUNTER, key, increment, causation_id="c", writer=writer)]

    return HostedStream(
        store,
        COUNTER,
        f"counter-opener-of-{key}",
        clock=ManualClock(EPOCH),
        writer=writer,
        companions=companions,
        **options,  # type: ignore[arg-type]
    )


class TestOpenings:
    """A stream opened by a companion append of this process starts from the opening's events."""

    def test_a_stream_opened_here_is_not_read_back(self, store: EventStore) -> None:
        writer = Writer(recent=RecentEvents())
        opener_of(store, writer, "opened").execute(plan("o-1"))  # type: ignore[arg-type]
        counting = CountingReads(store)

        opened: Hosted = HostedStream(
            counting,  # type: ignore[arg-type]
            COUNTER,
            "counter-opened",
            clock=ManualClock(EPOCH),
            writer=writer,
        )

        [stored] = store.read_stream("counter-opened")
        assert (opened.state.total, opened.version) == (7, 1)
        assert opened.last_event_id == str(stored.event_id)
        assert counting.reads == 0

    def test_an_opening_moved_on_by_another_writer_is_caught_up_at_the_next_append(
        self, store: EventStore
    ) -> None:
        writer = Writer(recent=RecentEvents())
        opener_of(store, writer, "moved").execute(plan("o-2"))  # type: ignore[arg-type]
        opened: Hosted = HostedStream(
            store, COUNTER, "counter-moved", clock=ManualClock(EPOCH), writer=writer
        )
        assert (opened.state.total, opened.version) == (7, 1)  # loaded from the opening
        other: Hosted = HostedStream(store, COUNTER, "counter-moved", clock=ManualClock(EPOCH))
        other.execute(plan("elsewhere", 100))  # type: ignore[arg-type]

        opened.execute(plan("o-3", 1000))  # type: ignore[arg-type]

        assert (opened.state.total, opened.version) == (1107, 3)
        assert [r.data["by"] for r in store.read_stream("counter-moved")] == [7, 100, 1000]

    def test_an_opening_that_did_not_commit_is_not_handed_over(self, store: EventStore) -> None:
        HostedStream(store, COUNTER, "counter-taken", clock=ManualClock(EPOCH)).execute(
            plan("first-owner")  # type: ignore[arg-type]
        )
        recent = RecentEvents()
        opener = opener_of(
            store, Writer(recent=recent), "taken", retry=RetryPolicy(conflict_attempts=2)
        )

        with pytest.raises(LogContention):
            opener.execute(plan("o-4"))  # type: ignore[arg-type]

        assert recent.take_opening("counter-taken") is None


def _refuse_reads(*args: object, **kwargs: object) -> object:
    raise StoreUnavailable("the database is down")


class TestPoison:
    def test_events_that_cannot_be_stored_fail_only_their_caller(self, store_url: str) -> None:
        """A caller whose event is over the size limit is refused alone; the others of its
        group land and the stream goes on."""
        with contextlib.closing(open_store(store_url, max_event_bytes=2000)) as small:
            gated = GatedStore(small)
            stream: Hosted = HostedStream(gated, COUNTER, "counter-p", clock=ManualClock(EPOCH))  # type: ignore[arg-type]
            errors: dict[str, BaseException] = {}

            def call(request_id: str) -> None:
                try:
                    stream.execute(plan(request_id))  # type: ignore[arg-type]
                except InvalidEvent as e:
                    errors[request_id[:3]] = e

            threads = [
                threading.Thread(target=call, args=(r,)) for r in ("r-0", "big" * 1000, "r-1")
            ]
            threads[0].start()
            assert gated.entered.wait(10)
            for thread in threads[1:]:
                thread.start()
            wait_for(lambda: stream.queued() == 2)
            gated.gate.set()
            for thread in threads:
                thread.join(10)
            stream.execute(plan("r-2"))  # type: ignore[arg-type]

            assert list(errors) == ["big"]
            assert [e.data["request_id"] for e in small.read_stream("counter-p")] == [
                "r-0",
                "r-1",
                "r-2",
            ]


class Fencing:
    """A leadership stand-in: leads in ``term`` until told it was deposed."""

    def __init__(self, term: int) -> None:
        self.current: int | None = term
        self.reports: list[Fenced] = []

    def term(self) -> int | None:
        return self.current

    def deposed(self, error: Fenced) -> None:
        self.reports.append(error)
        self.current = None


class TestFencing:
    def test_a_duty_from_a_deposed_term_is_refused_and_reported(self, store: EventStore) -> None:
        """After term 2 is recorded, a duty of term 1 raises Deposed, appends nothing, and the
        fencing hears of it; a plain command still lands."""
        fencing = Fencing(term=1)
        stream: Hosted = HostedStream(
            store, COUNTER, "counter-f", clock=ManualClock(EPOCH), writer=Writer(fencing=fencing)
        )
        store.append("leadership-default", [NewEvent("Elected", {}, metadata={"leader_term": 2})])

        with pytest.raises(Deposed):
            stream.execute(plan("duty-1"), duty=True)  # type: ignore[arg-type]
        stream.execute(plan("plain-1"))  # type: ignore[arg-type]

        assert [r.current_term for r in fencing.reports] == [2]
        assert [e.metadata.get("leader_term") for e in store.read_stream("counter-f")] == [None]

    def test_duties_carry_the_term_and_commands_do_not(self, store: EventStore) -> None:
        """The leader's duties are stamped with its term; client commands are not fenced."""
        stream: Hosted = HostedStream(
            store, COUNTER, "counter-t", clock=ManualClock(EPOCH), writer=Writer(fencing=Fencing(3))
        )

        stream.execute(plan("duty"), duty=True)  # type: ignore[arg-type]
        stream.execute(plan("command"))  # type: ignore[arg-type]

        assert [e.metadata.get("leader_term") for e in store.read_stream("counter-t")] == [3, None]


class FlakyStore:
    """The real store, whose first ``failures`` appends land but answer as if the connection
    dropped before the answer came back."""

    def __init__(self, inner: EventStore, failures: int) -> None:
        self._inner = inner
        self.failures = failures

    def append_many(self, appends: list[StreamAppend]) -> list[AppendResult]:
        results = self._inner.append_many(appends)
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("connection lost before the answer")
        return results

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class TestUnknownOutcome:
    def test_a_landed_append_whose_answer_was_lost_is_not_duplicated(
        self, store: EventStore
    ) -> None:
        """The same events are re-sent; the store recognises them; one event in the log."""
        clock = ManualClock(EPOCH)
        stream: Hosted = HostedStream(FlakyStore(store, 1), COUNTER, "counter-u", clock=clock)  # type: ignore[arg-type]

        stream.execute(plan("once"))  # type: ignore[arg-type]

        assert len(store.read_stream("counter-u")) == 1
        assert stream.state.total == 1

    def test_an_outage_beyond_the_retries_is_reported(self, store: EventStore) -> None:
        """After the policy's attempts, LogUnavailable says to send it again."""
        stream: Hosted = HostedStream(
            FlakyStore(store, 10),  # type: ignore[arg-type]
            COUNTER,
            "counter-o",
            clock=ManualClock(EPOCH),
            retry=RetryPolicy(unavailable_attempts=2, backoff_seconds=0),
        )

        with pytest.raises(LogUnavailable, match="send the request again"):
            stream.execute(plan("lost"))  # type: ignore[arg-type]


def wait_for(condition: object, timeout: float = 10.0) -> None:
    deadline = datetime.now().timestamp() + timeout
    while not condition():  # type: ignore[operator]
        assert datetime.now().timestamp() < deadline, "condition not met in time"
        threading.Event().wait(0.01)
