"""MachinesRuntime with a leadership: the leader runs each batch it seals once, and learns of
what followers accept through its read model's follower."""

from __future__ import annotations

import contextlib
from collections import Counter
from datetime import timedelta

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.runtime import Leadership, MemoryLease
from fleetledger.domain.machines import GrouperConfig
from fleetledger.eventstore import EventStore, RecordedEvent, open_store
from tests.adapters.runtime.test_stream import wait_for

from .support import HeldCloud, request

FAST = GrouperConfig(
    idle_timeout=timedelta(milliseconds=50), max_timeout=timedelta(seconds=1), max_batch_size=50
)


def elected(store: EventStore, board: dict[str, str], holder: str) -> Leadership:
    return Leadership(store, MemoryLease(board, holder=holder), clock=SystemClock(), holder=holder)


def the_seal(store: EventStore) -> RecordedEvent:
    wait_for(lambda: len(store.read_all(types=["vm.BatchSealed"])) == 1)
    [sealed] = store.read_all(types=["vm.BatchSealed"])
    return sealed


class TestBatchesItSeals:
    def test_a_batch_is_not_run_again_when_its_seal_is_read_from_the_log(
        self, sqlite_url: str
    ) -> None:
        """The seal reaches the coordinator once, directly; reading it from the log while the
        batch is still in flight does not hand it over a second time."""
        cloud = HeldCloud()
        with contextlib.closing(open_store(sqlite_url)) as store:
            runtime = MachinesRuntime(
                store, cloud, clock=SystemClock(), config=FAST, leadership=elected(store, {}, "a")
            )
            runs: Counter[str] = Counter()
            execute = runtime.coordinator.execute

            def counted(batch_id: str) -> object:
                runs[batch_id] += 1
                return execute(batch_id)

            runtime.coordinator.execute = counted  # type: ignore[method-assign,assignment]
            with runtime:
                futures = runtime.machines.enqueue_many([request(n) for n in range(3)])
                cloud.wait_entered(1, timeout=10)
                sealed = the_seal(store)
                wait_for(lambda: runtime.projection.position >= sealed.global_position)
                cloud.release.set()
                assert [f.result(timeout=10).status for f in futures] == ["created"] * 3
                assert runtime.coordinator.wait_idle(10)

        assert list(runs.values()) == [1]


class TestRequestsAFollowerAccepts:
    def test_are_created_by_the_leader(self, sqlite_url: str) -> None:
        board: dict[str, str] = {}
        with (
            contextlib.closing(open_store(sqlite_url)) as leader_store,
            contextlib.closing(open_store(sqlite_url)) as follower_store,
        ):
            cloud = FakeCloud()
            leader = MachinesRuntime(
                leader_store, cloud, clock=SystemClock(), config=FAST,
                leadership=elected(leader_store, board, "leader"),
            )  # fmt: skip
            follower = MachinesRuntime(
                follower_store, FakeCloud(), clock=SystemClock(), config=FAST,
                leadership=elected(follower_store, board, "follower"),
            )  # fmt: skip
            with leader:
                wait_for(lambda: leader.leading)
                with follower:
                    assert follower.role == "follower"
                    follower.machines.enqueue_many([request(n) for n in range(3)])
                    wait_for(lambda: len(leader_store.read_all(types=["vm.MachineCreated"])) == 3)

        assert sorted(cloud.creations) == ["m-0", "m-1", "m-2"]
