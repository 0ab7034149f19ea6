"""The assembled runtime with its thread: passes run by themselves while it leads."""

from __future__ import annotations

from collections.abc import Collection
from typing import cast

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.runtime import LEADER_TERM_KEY
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.adapters.testbeds import GHOST_LABEL, FakeApplications, TestbedsRuntime
from fleetledger.eventstore import EventStore
from tests.waiting import eventually

from .support import BED, two_nodes


class WaitsNoted:
    """The real store, noting the types each wait for a wake-up names."""

    def __init__(self, inner: EventStore) -> None:
        self._inner = inner
        self.types: list[frozenset[str] | None] = []

    def wait_for_wake(
        self, seen: int, timeout: float, *, types: Collection[str] | None = None
    ) -> bool:
        self.types.append(None if types is None else frozenset(types))
        return self._inner.wait_for_wake(seen, timeout, types=types)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class TestThreads:
    def test_the_leader_reconciles_without_being_stepped(self, sqlite_store: EventStore) -> None:
        """Started with threads, the runtime creates a new testbed's ghost pods by itself and
        stops cleanly."""
        cluster = two_nodes()
        runtime = TestbedsRuntime(
            sqlite_store, cluster, FakeApplications(cluster), clock=SystemClock(), poll_seconds=0.1
        )
        with runtime:
            assert runtime.leading
            runtime.service.define_testbed(
                BED, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
            )
            assert eventually(lambda: len(cluster.list_pods(labels={GHOST_LABEL: BED})) == 4)
        assert not runtime.running and not runtime.leading

    def test_between_passes_only_its_own_events_wake_it(self, sqlite_store: EventStore) -> None:
        """Another capability's appends (a serve creating machines appends hundreds of times a
        second) do not send it on a pass; its own types and the poll do."""
        waits = WaitsNoted(sqlite_store)
        cluster = two_nodes()
        runtime = TestbedsRuntime(
            cast(EventStore, waits), cluster, FakeApplications(cluster), poll_seconds=0.05
        )
        with runtime:
            assert eventually(lambda: len(waits.types) >= 2)
        assert set(waits.types) == {frozenset(runtime.service.event_types)}
        assert any(name.startswith("testbed.") for name in runtime.service.event_types)

    def test_without_threads_nothing_happens_until_stepped(self, sqlite_store: EventStore) -> None:
        """threads=False runs no pass by itself: the simulator decides when."""
        cluster = two_nodes()
        runtime = TestbedsRuntime(
            sqlite_store, cluster, FakeApplications(cluster), clock=SystemClock(), threads=False
        )
        with runtime:
            runtime.service.define_testbed(
                BED, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
            )
            assert cluster.list_pods() == []
            runtime.step()
            assert len(cluster.list_pods()) == 4


def leadership(store: EventStore, board: dict[str, str], holder: str) -> Leadership:
    return Leadership(store, MemoryLease(board, holder=holder), clock=SystemClock(), holder=holder)


class TestLeadership:
    def test_a_follower_leaves_the_cluster_alone(self, sqlite_store: EventStore) -> None:
        """Without the lease the runtime accepts commands but creates no ghost pod."""
        board: dict[str, str] = {}
        leadership(sqlite_store, board, "other").step()
        cluster = two_nodes()
        follower = TestbedsRuntime(
            sqlite_store,
            cluster,
            FakeApplications(cluster),
            threads=False,
            leadership=leadership(sqlite_store, board, "me"),
        ).start()
        follower.service.define_testbed(
            BED, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
        )

        assert follower.step() == 0
        assert not follower.leading
        assert cluster.list_pods() == []

    def test_once_elected_its_duties_carry_its_term(self, sqlite_store: EventStore) -> None:
        """Elected, the runtime reconciles, and what it records of the cluster is fenced by its
        leader term."""
        board: dict[str, str] = {}
        other = leadership(sqlite_store, board, "other")
        other.step()
        mine = leadership(sqlite_store, board, "me")
        cluster = two_nodes()
        runtime = TestbedsRuntime(
            sqlite_store, cluster, FakeApplications(cluster), threads=False, leadership=mine
        ).start()
        runtime.service.define_testbed(
            BED, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
        )

        other.stop()
        mine.step()
        runtime.step()

        observed = [r for r in sqlite_store.read_all() if r.type == "testbed.ClusterObserved"]
        assert runtime.leading
        assert len(cluster.list_pods()) == 4
        assert observed
        assert {r.metadata.get(LEADER_TERM_KEY) for r in observed} == {mine.term()}
