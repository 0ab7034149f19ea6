"""The fault schedule and the wrappers that inject it into the cloud, the store and the watch."""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from random import Random

import pytest

from fleetledger.adapters.cloud import BatchCreate, FakeCloud, MachineSpec, Throttled
from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.simulator.dst import WatchedCluster
from fleetledger.adapters.simulator.faults import (
    ControllerCrashed,
    FaultSchedule,
    FaultyBackend,
    FaultyCloud,
    draw_schedule,
)
from fleetledger.eventstore import EventStore, NewEvent, StoreUnavailable
from tests.adapters.machines.support import D4

NAMES = [f"m-{n}" for n in range(10)]


def schedule(**faults: object) -> FaultSchedule:
    values: dict[str, object] = {"cloud_calls": {}, "commits": {}, "machines": {}, "timed": ()}
    values.update(faults)
    return FaultSchedule(seed=0, **values)  # type: ignore[arg-type]


def batch(*names: str) -> BatchCreate:
    return BatchCreate("b-1", D4, tuple(MachineSpec(name) for name in names))


class TestSchedule:
    def test_the_same_seed_draws_the_same_faults(self) -> None:
        def draw(seed: int) -> FaultSchedule:
            return draw_schedule(Random(seed), seed=seed, machine_names=NAMES, horizon_seconds=15)

        assert draw(7) == draw(7)
        assert draw(7).describe() == draw(7).describe()
        assert draw(7) != draw(8)

    def test_a_seed_crashes_at_most_max_crashes_times(self) -> None:
        crashes = {"crash", "crash_before_cloud_call", "crash_after_cloud_call",
                   "crash_in_commit", "crash_after_commit"}  # fmt: skip
        for seed in range(200):
            drawn = draw_schedule(
                Random(seed), seed=seed, machine_names=NAMES, horizon_seconds=15, max_crashes=2
            )
            kinds: list[str] = [*drawn.cloud_calls.values(), *drawn.commits.values()]
            kinds += [f.kind for f in drawn.timed]
            assert sum(1 for k in kinds if k in crashes) <= 2

    def test_without_leaves_a_kind_out(self) -> None:
        drawn = schedule(cloud_calls={1: "timeout", 2: "throttle"}, commits={3: "crash_in_commit"})
        kept = drawn.without("timeout", "crash_in_commit")
        assert (kept.cloud_calls, kept.commits) == ({2: "throttle"}, {})


class TestFaultyCloud:
    def make(self, **faults: object) -> tuple[FakeCloud, FaultyCloud, Counter[str]]:
        fake, injected = FakeCloud(), Counter[str]()
        return fake, FaultyCloud(fake, schedule(**faults), injected), injected

    def test_a_crash_before_the_call_creates_nothing(self) -> None:
        fake, cloud, injected = self.make(cloud_calls={1: "crash_before_cloud_call"})
        with pytest.raises(ControllerCrashed):
            cloud.create_batch(batch("m-1"))
        assert (fake.creations, injected) == ((), Counter({"crash_before_cloud_call": 1}))

    def test_a_crash_after_the_call_leaves_its_machines(self) -> None:
        fake, cloud, _ = self.make(cloud_calls={1: "crash_after_cloud_call"})
        with pytest.raises(ControllerCrashed):
            cloud.create_batch(batch("m-1", "m-2"))
        assert fake.creations == ("m-1", "m-2")

    def test_a_lost_reply_hides_machines_the_cloud_made(self) -> None:
        fake, cloud, injected = self.make(cloud_calls={2: "reply_lost"})
        cloud.create_batch(batch("m-1"))
        with pytest.raises(TimeoutError):
            cloud.create_batch(batch("m-2"))
        assert fake.creations == ("m-1", "m-2")
        assert injected == Counter({"reply_lost": 1})

    def test_a_timeout_before_the_cloud_creates_nothing(self) -> None:
        fake, cloud, _ = self.make(cloud_calls={1: "timeout"})
        with pytest.raises(TimeoutError):
            cloud.create_batch(batch("m-1"))
        assert fake.creations == ()

    def test_a_throttled_call_is_refused_with_its_retry_after(self) -> None:
        fake, cloud, _ = self.make(cloud_calls={1: "throttle"})
        with pytest.raises(Throttled) as refused:
            cloud.create_batch(batch("m-1"))
        assert refused.value.retry_after == 2.0
        assert fake.creations == ()

    def test_a_machine_fault_is_counted_when_a_create_meets_it(self) -> None:
        _, cloud, injected = self.make(machines={"m-2": "quota", "m-9": "zonal_capacity"})
        result = cloud.create_batch(batch("m-1", "m-2"))
        assert result.failed["m-2"].code == "quota_exceeded"
        assert injected == Counter({"quota": 1})


class TestFaultyBackend:
    def store(self, url: str, **faults: object) -> tuple[EventStore, Counter[str]]:
        injected: Counter[str] = Counter()
        backend = FaultyBackend(url, schedule=schedule(**faults), injected=injected, counter=[0])
        return EventStore(backend), injected

    def test_a_crash_in_the_commit_lands_nothing(self, sqlite_url: str) -> None:
        store, injected = self.store(sqlite_url, commits={1: "crash_in_commit"})
        with contextlib.closing(store):
            with pytest.raises(ControllerCrashed):
                store.append("s", [NewEvent("E", {})])
            assert store.head() == 0
        assert injected == Counter({"crash_in_commit": 1})

    def test_a_crash_after_the_commit_lands_everything(self, sqlite_url: str) -> None:
        store, _ = self.store(sqlite_url, commits={1: "crash_after_commit"})
        with contextlib.closing(store):
            with pytest.raises(ControllerCrashed):
                store.append("s", [NewEvent("E", {}), NewEvent("E", {})])
            assert store.head() == 2

    def test_a_lost_commit_reply_is_an_unknown_outcome(self, sqlite_url: str) -> None:
        """The events land, the caller hears StoreUnavailable, and re-sending the same events
        returns the original result."""
        store, _ = self.store(sqlite_url, commits={1: "commit_reply_lost"})
        events = [NewEvent("E", {"n": 1}, event_id=uuid.uuid4())]
        with contextlib.closing(store):
            with pytest.raises(StoreUnavailable):
                store.append("s", events, expected_version=0)
            again = store.append("s", events, expected_version=0)
            assert (store.head(), again.stream_version) == (1, 1)


class TestWatchedCluster:
    def make(self) -> tuple[FakeCluster, WatchedCluster, Counter[str]]:
        server, injected = FakeCluster([Node("n-1", cpu_millis=4000)]), Counter[str]()
        watched = WatchedCluster(server, injected)
        watched.record()
        return server, watched, injected

    def test_the_cache_shows_a_change_once_delivered(self) -> None:
        server, watched, _ = self.make()
        server.create_pod(PodSpec("p-1", node="n-1"))
        watched.record()
        assert watched.list_pods() == []
        watched.deliver()
        assert [p.name for p in watched.list_pods()] == ["p-1"]

    def test_duplicated_and_reordered_deliveries_end_where_the_server_is(self) -> None:
        """A replay of delivered events and a swap of two objects' events still leave the cache
        equal to the server: a watch never reorders one object's events."""
        server, watched, injected = self.make()
        for name in ("p-1", "p-2", "p-3"):
            server.create_pod(PodSpec(name, node="n-1"))
            watched.record()
        watched.deliver()
        server.delete_pod("p-1")
        watched.record()
        server.create_pod(PodSpec("p-4", node="n-1"))
        watched.record()
        watched.duplicate_next()
        watched.reorder_next()
        watched.deliver()

        assert watched.list_pods() == server.list_pods()
        assert watched.list_nodes() == server.list_nodes()
        assert injected == Counter({"watch_duplicate": 1, "watch_reorder": 1})
