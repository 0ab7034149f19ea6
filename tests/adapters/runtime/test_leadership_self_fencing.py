"""Self-fencing: a leader that cannot renew its lease stops acting before the lease can pass,
says ``stepping down``, and its guarded ports make no call meanwhile."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import BatchCreate, FakeCloud, MachineSpec
from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.runtime.leadership import DutyFencing, Leadership, MemoryLease
from fleetledger.adapters.runtime.self_fencing import (
    FencedCloud,
    FencedCluster,
    LeaseExpired,
    SelfFence,
)
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore, Fenced, NewEvent

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
LEASE = 4.0  # acting for 3 s after each renewal: the default margin is a quarter of it


class Monotonic:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class SlowLease(MemoryLease):
    """A lease whose renewal takes ``delay`` seconds to answer (a slow or cut-off database)."""

    def __init__(self, board: dict[str, str], *, holder: str, monotonic: Monotonic) -> None:
        super().__init__(board, holder=holder)
        self._monotonic = monotonic
        self.delay = 0.0

    def check(self) -> bool:
        self._monotonic.now += self.delay
        return super().check()


def leader(
    store: EventStore, board: dict[str, str], monotonic: Monotonic, *, holder: str = "a"
) -> tuple[Leadership, SlowLease]:
    lease = SlowLease(board, holder=holder, monotonic=monotonic)
    leadership = Leadership(
        store,
        lease,
        clock=ManualClock(EPOCH),
        holder=holder,
        check_interval=1.0,
        lease_seconds=LEASE,
        monotonic=monotonic,
    )
    return leadership, lease


BATCH = BatchCreate("b-1", MachineTemplate(vm_size="Standard_D4s_v5"), (MachineSpec("m-1"),))


class TestActingDeadline:
    def test_a_leader_acts_until_its_deadline_then_steps_down(self, store: EventStore) -> None:
        """Renewals stop: it acts for the lease less the margin, then refuses, reports
        ``stepping down`` and tells its duties to stop — keeping the lease until its own
        thread gives it up, then following."""
        board: dict[str, str] = {}
        clock = Monotonic()
        leadership, _ = leader(store, board, clock)
        reasons: list[str] = []
        leadership.on_deposed(reasons.append)
        assert leadership.step() == "leader"

        clock.now += LEASE * 0.75 - 0.01
        assert leadership.may_act() == 1
        clock.now += 0.01
        assert leadership.role == "stepping down"
        assert leadership.may_act() is None

        assert leadership.term() is None
        assert leadership.role == "stepping down"
        assert len(reasons) == 1 and "not renewed in time" in reasons[0]
        assert board == {"leader": "a"}
        assert leadership.step() == "follower"
        assert board == {}

    def test_each_renewal_moves_the_deadline(self, store: EventStore) -> None:
        board: dict[str, str] = {}
        clock = Monotonic()
        leadership, _ = leader(store, board, clock)
        leadership.step()

        for _ in range(5):
            clock.now += 2.0
            assert leadership.step() == "leader"

        assert leadership.may_act() == 1

    def test_a_renewal_counts_from_when_it_was_asked_not_answered(self, store: EventStore) -> None:
        """A renewal answered 2.5 s late holds the lease from when it was sent: only 0.5 s of
        acting time is left after the answer."""
        board: dict[str, str] = {}
        clock = Monotonic()
        leadership, lease = leader(store, board, clock)
        leadership.step()
        asked = clock.now
        lease.delay = 2.5

        assert leadership.step() == "leader"

        assert leadership.acting_deadline() == asked + LEASE * 0.75
        clock.now = asked + LEASE * 0.75
        assert leadership.may_act() is None

    def test_without_a_lease_time_there_is_no_deadline(self, store: EventStore) -> None:
        clock = Monotonic()
        leadership = Leadership(
            store, MemoryLease({}, holder="a"), clock=ManualClock(EPOCH), monotonic=clock
        )
        leadership.step()

        clock.now += 10_000

        assert leadership.may_act() == 1
        assert leadership.role == "leader"

    def test_renewals_must_come_more_often_than_the_acting_time(self, store: EventStore) -> None:
        with pytest.raises(ValueError, match="check_interval"):
            Leadership(
                store,
                MemoryLease({}, holder="a"),
                clock=ManualClock(EPOCH),
                check_interval=3.0,
                lease_seconds=LEASE,
            )
        with pytest.raises(ValueError, match="safety_margin"):
            Leadership(
                store,
                MemoryLease({}, holder="a"),
                clock=ManualClock(EPOCH),
                lease_seconds=LEASE,
                safety_margin=LEASE,
            )


class HeldLease(MemoryLease):
    """A lease whose renewal waits for the test to answer it (``answer``)."""

    def __init__(self, board: dict[str, str], *, holder: str) -> None:
        super().__init__(board, holder=holder)
        self.holding = False
        self.asked = threading.Event()
        self.answered = threading.Event()
        self.outcome = True

    def check(self) -> bool:
        if not self.holding:
            return super().check()
        self.asked.set()
        assert self.answered.wait(10), "the test never answered the renewal"
        return self.outcome and super().check()


class TestRenewalOnItsWay:
    @pytest.mark.parametrize(("outcome", "expected"), [(True, 1), (False, None)])
    def test_a_renewal_sent_before_the_deadline_decides_once_answered(
        self, store: EventStore, outcome: bool, expected: int | None
    ) -> None:
        """The deadline passes while a renewal is on its way: asked then, the leader waits for
        the answer — renewed, it acts on (the lease held from when it was sent); refused, it
        does not."""
        clock = Monotonic()
        lease = HeldLease({}, holder="a")
        leadership = Leadership(
            store,
            lease,
            clock=ManualClock(EPOCH),
            holder="a",
            check_interval=1.0,
            lease_seconds=LEASE,
            monotonic=clock,
        )
        leadership.step()
        clock.now += LEASE * 0.75 - 0.5
        lease.holding, lease.outcome = True, outcome
        renewal = threading.Thread(target=leadership.step)
        renewal.start()
        assert lease.asked.wait(10)
        clock.now += 1.0  # past the first deadline, within the renewal's
        answer = threading.Timer(0.2, lease.answered.set)
        answer.start()

        try:
            assert leadership.may_act() == expected
        finally:
            lease.answered.set()
            renewal.join(10)
            answer.cancel()


class TestDutyFencing:
    def test_a_stepped_down_leaders_duties_keep_its_term_and_are_fenced(
        self, store: EventStore
    ) -> None:
        """After the step-down its duty appends carry term 1, not none: once b records term
        2, the store refuses them."""
        board: dict[str, str] = {}
        clock = Monotonic()
        a, _ = leader(store, board, clock)
        b, _ = leader(store, board, clock, holder="b")
        a.step()
        clock.now += LEASE
        a.may_act()
        a.step()  # gives the lease up
        assert b.step() == "leader"
        fencing = DutyFencing(a)

        assert fencing.term() == 1
        with pytest.raises(Fenced):
            store.append("work-1", [NewEvent("Done", {}, metadata={"leader_term": fencing.term()})])

    def test_a_process_that_never_led_fences_nothing(self, store: EventStore) -> None:
        leadership, _ = leader(store, {"leader": "b"}, Monotonic())
        leadership.step()

        assert DutyFencing(leadership).term() is None


class TestGuards:
    def test_the_cloud_is_called_while_the_leader_may_act(self, store: EventStore) -> None:
        clock = Monotonic()
        leadership, _ = leader(store, {}, clock)
        leadership.step()
        fake = FakeCloud()
        cloud = FencedCloud(fake, SelfFence(leadership))

        cloud.create_batch(BATCH)

        assert fake.creations == ("m-1",)
        assert cloud.read_machine("m-1").status == "succeeded"

    def test_past_the_deadline_nothing_reaches_the_cloud(self, store: EventStore) -> None:
        clock = Monotonic()
        leadership, _ = leader(store, {}, clock)
        leadership.step()
        fake = FakeCloud()
        cloud = FencedCloud(fake, SelfFence(leadership))
        clock.now += LEASE

        with pytest.raises(LeaseExpired) as refused:
            cloud.create_batch(BATCH)
        with pytest.raises(LeaseExpired):
            cloud.read_machine("m-1")

        assert fake.calls == ()
        assert refused.value.term == 1
        assert leadership.role == "stepping down"

    def test_a_follower_writes_nothing_to_the_cluster_but_reads_it(self, store: EventStore) -> None:
        leadership, _ = leader(store, {"leader": "b"}, Monotonic())
        leadership.step()
        fake = FakeCluster()
        fake.add_node(Node("n1", labels={}, cpu_millis=4000, memory_mib=8192))
        cluster = FencedCluster(fake, SelfFence(leadership))

        with pytest.raises(LeaseExpired):
            cluster.create_pod(PodSpec("p-1", node="n1"))
        with pytest.raises(LeaseExpired):
            cluster.delete_pod("p-1")
        with pytest.raises(LeaseExpired):
            cluster.ensure_priority_class("ghosts", 10, description="")

        assert [n.name for n in cluster.list_nodes()] == ["n1"]
        assert cluster.list_pods() == []
