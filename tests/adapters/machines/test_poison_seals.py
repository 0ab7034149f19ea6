"""Requests too large for one seal, on SQLite and Postgres, with the log's event limit lowered.

A burst of valid requests with large tags whose one seal would be over the log's limit is sealed
in parts, and every request reaches its outcome; a request too large to be stored even alone is
refused by itself while the others go on; a request right at the bound, with the longest ids the
margin allows for, is stored in every event of its batch.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import (
    InvalidRequest,
    MachineRequest,
    grouper_stream_id,
)
from fleetledger.adapters.machines.aggregates import SEAL_MARGIN_BYTES
from fleetledger.domain.machines import BatchMachine, seal_size
from fleetledger.eventstore import EventStore, RecordedEvent, open_store

from .support import D4, EPOCH, manual_runtime, pass_idle_timeout, terminal_outcomes

LIMIT = 64 * 1024
"""The log's event limit in these tests: a sixteenth of the default, so a burst can exceed it."""


@contextlib.contextmanager
def small_store(url: str) -> Iterator[EventStore]:
    with contextlib.closing(open_store(url, max_event_bytes=LIMIT)) as store:
        yield store


def tagged(n: int, *, count: int = 40, width: int = 256) -> MachineRequest:
    """Request ``r-<n>`` with ``count`` tags of ``width`` characters: valid, about 11 kB."""
    return MachineRequest(
        request_id=f"r-{n}",
        machine_name=f"m-{n}",
        template=D4,
        tags={f"tag-{i:02d}": f"{n}:{i}:".ljust(width, "v") for i in range(count)},
    )


def oversized(n: int) -> MachineRequest:
    """A valid request (by Azure's limits) over the log's limit by itself: 50 tags of long
    keys and values in two- and three-byte characters, some 90 kB."""
    return MachineRequest(
        request_id=f"r-{n}",
        machine_name=f"m-{n}",
        template=D4,
        tags={f"{i:02d}".ljust(512, "é"): "€" * 256 for i in range(50)},
    )


def stored_types(store: EventStore) -> Counter[str]:
    return Counter(event.type for event in store.read_all(after=0, limit=100_000))


class TestBurstOverOneSeal:
    def test_every_request_reaches_its_outcome_through_several_seals(self, store_url: str) -> None:
        """Thirty requests of ~11 kB (one seal would be ~340 kB, the log takes 64 kB per
        event) are sealed in parts when they idle out; each gets exactly one outcome."""
        clock = ManualClock(EPOCH)
        cloud = FakeCloud(clock=clock)
        with small_store(store_url) as store:
            runtime = manual_runtime(store, cloud, clock)
            futures = runtime.machines.enqueue_many([tagged(n) for n in range(30)])
            pass_idle_timeout(runtime, clock)

            outcomes = [future.result(timeout=10) for future in futures]
            counts = terminal_outcomes(store)
            types = stored_types(store)
            seals = [
                e
                for e in store.read_stream(grouper_stream_id("default"))
                if e.type == "vm.BatchSealed"
            ]
            runtime.stop()

        assert [o.status for o in outcomes] == ["created"] * 30
        assert counts == Counter({f"r-{n}": 1 for n in range(30)})
        assert len(seals) >= 6
        assert [r for seal in seals for r in seal.data["request_ids"]] == [
            f"r-{n}" for n in range(30)
        ]
        assert types["vm.BatchOpened"] == types["vm.BatchCompleted"] == len(seals)
        assert runtime.stalls() == []

    def test_a_full_batch_over_the_limit_is_sealed_by_the_request_that_fills_it(
        self, store_url: str
    ) -> None:
        """With 50 per batch, the fiftieth request seals its batch, in parts, at once: no tick
        is needed, and every request is created."""
        clock = ManualClock(EPOCH)
        with small_store(store_url) as store:
            runtime = manual_runtime(store, FakeCloud(clock=clock), clock)
            accepted = [runtime.service.request([tagged(n)]) for n in range(50)]
            outcomes = [runtime.machines.outcome(f"r-{n}").result(timeout=10) for n in range(50)]
            runtime.stop()

        assert sum(len(a.sealed_batch_ids) for a in accepted) >= 10
        assert all(o.created for o in outcomes)


class TestRequestTooLargeAlone:
    def test_it_is_refused_alone_and_the_others_are_created(self, store_url: str) -> None:
        """Eight callers at once, one of them with a request no event could hold: that one is
        told its tags are too large; the seven others are accepted and created."""
        clock = ManualClock(EPOCH)
        with small_store(store_url) as store:
            runtime = manual_runtime(store, FakeCloud(clock=clock), clock)
            start = threading.Barrier(8)
            errors: dict[int, Exception] = {}

            def send(n: int) -> None:
                start.wait()
                try:
                    runtime.service.request([oversized(n) if n == 3 else tagged(n)])
                except Exception as e:
                    errors[n] = e

            callers = [threading.Thread(target=send, args=(n,)) for n in range(8)]
            for caller in callers:
                caller.start()
            for caller in callers:
                caller.join(timeout=30)
            pass_idle_timeout(runtime, clock)
            counts = terminal_outcomes(store)
            runtime.stop()

        assert list(errors) == [3]
        assert isinstance(errors[3], InvalidRequest)
        assert errors[3].field == "tags"
        assert "too large to seal" in str(errors[3])
        assert counts == Counter({f"r-{n}": 1 for n in range(8) if n != 3})

    def test_it_leaves_nothing_in_the_log(self, store_url: str) -> None:
        """The refusal comes before anything is appended."""
        clock = ManualClock(EPOCH)
        with small_store(store_url) as store:
            runtime = manual_runtime(store, FakeCloud(clock=clock), clock)
            head = store.head()
            with pytest.raises(InvalidRequest):
                runtime.service.request([oversized(1)])
            after = store.head()
            runtime.stop()

        assert after == head


class TestMargin:
    def test_a_request_at_the_bound_with_the_longest_ids_is_stored_everywhere(
        self, store_url: str
    ) -> None:
        """A request filling the bound to within a few bytes, with a 128-character request id
        and a 63-character grouper name: its request, seal, opening, dispatch and outcome all
        fit, the largest of them within a kilobyte of the bound."""
        bound = LIMIT - SEAL_MARGIN_BYTES
        request_id = "r" * 128
        tags = _tags_filling(bound, request_id=request_id, machine_name="m-1")
        clock = ManualClock(EPOCH)
        with small_store(store_url) as store:
            runtime = manual_runtime(store, FakeCloud(clock=clock), clock, grouper_name="g" * 63)
            request = MachineRequest(
                request_id=request_id, machine_name="m-1", template=D4, tags=tags
            )
            runtime.service.request([request])
            pass_idle_timeout(runtime, clock)
            outcome = runtime.machines.outcome(request_id).result(timeout=10)
            largest = max(_stored_size(e) for e in store.read_all(after=0, limit=1000))
            runtime.stop()

        assert outcome.created
        # The request is at the edge, or this test would prove nothing about the margin.
        assert LIMIT - SEAL_MARGIN_BYTES - 1024 < largest <= LIMIT


def _stored_size(event: RecordedEvent) -> int:
    """An event's data and metadata as the store measures them (canonical JSON, UTF-8)."""
    return sum(
        len(json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        for part in (event.data, event.metadata)
    )


def _tags_filling(bound: int, *, request_id: str, machine_name: str) -> dict[str, str]:
    """Tags of the longest texts in three-byte characters (the fewest strings, so the least
    slack in the bound) and, to finish, of plain letters, that bring a request's seal to within
    20 bytes under ``bound``."""
    tags: dict[str, str] = {}

    def size(candidate: dict[str, str]) -> int:
        machine = BatchMachine(request_id, machine_name, (), tuple(sorted(candidate.items())))
        return seal_size(D4, [machine])

    candidates = [(f"{i:02d}".ljust(512, "€"), "€" * 256) for i in range(50)]
    candidates += [(f"{i:02d}", "v" * width) for i in range(50) for width in range(256, -1, -1)]
    for key, value in candidates:
        if len(tags) < 50 and key not in tags and size({**tags, key: value}) <= bound:
            tags[key] = value
    assert bound - 20 < size(tags) <= bound, size(tags)
    return tags
