"""The testbed: slot numbering, slot states, the ghost-pod diff, reservations and claims."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.codec import from_data, to_data
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.testbeds import testbed as tb

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CPU, MEM = 1000, 2048


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def node(name: str, label: str = "", cpu: int = 8000, memory: int = 16384) -> tb.ObservedNode:
    return tb.ObservedNode(name, label or name, cpu, memory)


def ghost(node_name: str, pos: int, *, cpu: int = CPU, memory: int = MEM) -> tb.ObservedPod:
    name = tb.ghost_pod_name("bed", node_name, pos, cpu, memory)
    return tb.ObservedPod(name, f"uid-{name}", node_name, True, pos, cpu, memory)


def job_pod(name: str, node_name: str | None) -> tb.ObservedPod:
    return tb.ObservedPod(name, f"uid-{name}", node_name, False)


class Bed:
    """One testbed stream driven through commands."""

    def __init__(self, slots_per_node: int = 2) -> None:
        self.state = tb.initial_state()
        self.events: list[tb.TestbedEvent] = []
        self(tb.DefineTestbed("bed", "testbed", slots_per_node, CPU, MEM, at=at(0)))

    def __call__(self, command: tb.TestbedCommand) -> list[tb.TestbedEvent]:
        events = tb.decide(self.state, command)
        for event in events:
            self.state = tb.evolve(self.state, event)
        self.events.extend(events)
        return events

    def observe(
        self, nodes: Sequence[tb.ObservedNode], pods: Sequence[tb.ObservedPod], seconds: float = 1
    ) -> list[tb.TestbedEvent]:
        return self(tb.ObserveCluster(tuple(nodes), tuple(pods), at=at(seconds)))

    def statuses(self) -> dict[int, str]:
        return {s.slot_id: s.status for s in tb.slots(self.state)}


def ready_bed() -> Bed:
    """Two nodes, two slots each, every ghost pod running."""
    bed = Bed()
    bed.observe([node("n1"), node("n2")], [ghost(n, p) for n in ("n1", "n2") for p in (0, 1)])
    return bed


class TestSurface:
    def test_stream_name(self) -> None:
        """One stream per testbed."""
        assert tb.stream_name("bed") == "testbed-bed"


class TestDefine:
    def test_define_records_the_shape(self) -> None:
        """Defining a testbed records its label, slots per node and slot size."""
        bed = Bed(3)
        assert bed.state.defined == tb.TestbedDefined("bed", "testbed", 3, CPU, MEM, at(0))

    def test_same_definition_again_changes_nothing(self) -> None:
        """Repeating the definition is a no-op."""
        bed = Bed()
        assert bed(tb.DefineTestbed("bed", "testbed", 2, CPU, MEM, at=at(5))) == []

    def test_resize_is_recorded(self) -> None:
        """A new size is a new definition."""
        bed = Bed()
        assert bed(tb.DefineTestbed("bed", "testbed", 3, CPU, MEM, at=at(5)))

    @pytest.mark.parametrize("field", ["slots_per_node", "cpu_millis", "memory_mib"])
    def test_non_positive_sizes_are_refused(self, field: str) -> None:
        """Slots per node and the slot size must be positive."""
        values = {"slots_per_node": 2, "cpu_millis": CPU, "memory_mib": MEM, field: 0}
        with pytest.raises(InvalidCommand, match=field):
            tb.decide(tb.initial_state(), tb.DefineTestbed("bed", "l", **values, at=at(0)))

    def test_commands_before_definition_are_refused(self) -> None:
        """Nothing but a definition starts the stream."""
        with pytest.raises(Rejected, match="not defined"):
            tb.decide(tb.initial_state(), tb.ObserveCluster((), (), at=at(0)))

    def test_naive_time_is_refused(self) -> None:
        """Commands carry timezone-aware times."""
        with pytest.raises(InvalidCommand, match="timezone-aware"):
            Bed()(tb.ClaimTestbed("s", at=datetime(2025, 1, 1)))


class TestNumbering:
    def test_round_robin_across_nodes(self) -> None:
        """Slot ids go round-robin: by position on node, then by node."""
        bed = Bed()
        bed.observe([node("n2"), node("n1")], [])
        places = [(s.slot_id, s.node, s.position_on_node) for s in tb.slots(bed.state)]
        assert places == [(0, "n1", 0), (1, "n2", 0), (2, "n1", 1), (3, "n2", 1)]

    def test_nodes_are_ordered_by_label_value(self) -> None:
        """The label value orders the nodes, ahead of their names."""
        bed = Bed(1)
        bed.observe([node("a", "2"), node("b", "1")], [])
        assert [s.node for s in tb.slots(bed.state)] == ["b", "a"]

    def test_numeric_label_values_compare_as_numbers(self) -> None:
        """Label values that are numbers order the nodes as numbers: node 2 before node 10."""
        bed = Bed(1)
        bed.observe([node("a", "10"), node("b", "2"), node("c", "1")], [])
        assert [s.node for s in tb.slots(bed.state)] == ["c", "b", "a"]

    def test_other_label_values_follow_the_numbers_in_string_order(self) -> None:
        """A value that is no number comes after every numeric one; among themselves such values
        keep their string order, and equal values fall back to the node name."""
        bed = Bed(1)
        bed.observe(
            [node("w", "rack-b"), node("x", "12"), node("y", "rack-a"), node("z", "12")], []
        )
        assert [s.node for s in tb.slots(bed.state)] == ["x", "z", "y", "w"]

    def test_nodes_of_slots(self) -> None:
        """The nodes a set of slots is on, for the pods' node affinity."""
        assert tb.nodes_of(ready_bed().state, (0, 2)) == ("n1",)
        assert tb.nodes_of(ready_bed().state, (3, 0)) == ("n1", "n2")

    def test_no_nodes_no_slots(self) -> None:
        """A testbed without labelled nodes has no slots."""
        assert tb.slots(Bed().state) == ()


class TestSlotStates:
    def test_missing_ghosts_are_creating(self) -> None:
        """A slot whose ghost pod is not there yet is being created."""
        bed = Bed()
        bed.observe([node("n1")], [ghost("n1", 0)])
        assert bed.statuses() == {0: "free", 1: "creating"}

    def test_ghost_pods_make_slots_free(self) -> None:
        """A slot held by its ghost pod alone is free."""
        assert set(ready_bed().statuses().values()) == {"free"}
        assert tb.free_slot_ids(ready_bed().state) == (0, 1, 2, 3)

    def test_reserved_until_the_pod_is_bound(self) -> None:
        """A reservation whose pod has no node yet makes the slot reserved."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (2,), at=at(2)))
        assert bed.statuses()[2] == "reserved"

    def test_occupied_once_the_pod_runs_on_the_node(self) -> None:
        """The reserving pod bound to the slot's node occupies it."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (2,), at=at(2)))
        bed.observe([node("n1"), node("n2")], [*bed.state.pods, job_pod("p", "n1")], 3)
        assert bed.statuses()[2] == "occupied"

    def test_pod_bound_elsewhere_is_an_error(self) -> None:
        """The reserving pod running on another node is a conflict."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (2,), at=at(2)))
        bed.observe([node("n1"), node("n2")], [*bed.state.pods, job_pod("p", "n2")], 3)
        assert bed.statuses()[2] == "error"

    def test_two_ghosts_on_one_slot_are_an_error(self) -> None:
        """Two ghost pods on one slot conflict."""
        bed = Bed(1)
        twin = tb.ObservedPod("twin", "uid-twin", "n1", True, 0, CPU, MEM)
        bed.observe([node("n1")], [ghost("n1", 0), twin])
        assert bed.statuses() == {0: "error"}

    def test_ghost_of_another_size_does_not_hold_the_slot(self) -> None:
        """After a resize the old ghost pod no longer counts."""
        bed = Bed(1)
        bed.observe([node("n1")], [ghost("n1", 0, cpu=500)])
        assert bed.statuses() == {0: "creating"}


class TestOverallState:
    def test_all_free_is_success(self) -> None:
        """Every slot free: success."""
        assert tb.overall_state(ready_bed().state) == "success"

    def test_pending_ghosts_are_in_progress(self) -> None:
        """Ghost pods still to create: in progress."""
        bed = Bed()
        bed.observe([node("n1")], [])
        assert tb.overall_state(bed.state) == "in_progress"

    def test_reservations_are_in_progress(self) -> None:
        """A pending reservation: in progress."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        assert tb.overall_state(bed.state) == "in_progress"

    def test_any_occupied_is_running(self) -> None:
        """An occupied slot: running, even while another is reserved."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        bed(tb.ReserveSlot("q", "uid-q", (1,), at=at(2)))
        bed.observe([node("n1"), node("n2")], [*bed.state.pods, job_pod("p", "n1")], 3)
        assert tb.overall_state(bed.state) == "running"

    def test_node_without_room_is_an_error(self) -> None:
        """A node that cannot hold its slots puts the testbed in error."""
        bed = Bed()
        bed.observe([node("n1", cpu=1500)], [ghost("n1", 0), ghost("n1", 1)])
        assert tb.overall_state(bed.state) == "error"
        assert "lower slots_per_node" in tb.reconcile(bed.state).problems[0]


class TestReconcile:
    def test_creates_every_missing_ghost(self) -> None:
        """Desired ghost pods that are not observed are created, one per slot."""
        bed = Bed()
        bed.observe([node("n1"), node("n2")], [ghost("n1", 0)])
        plan = tb.reconcile(bed.state)
        assert [(g.node, g.position_on_node, g.slot_id) for g in plan.create] == [
            ("n2", 0, 1),
            ("n1", 1, 2),
            ("n2", 1, 3),
        ]
        assert all((g.cpu_millis, g.memory_mib) == (CPU, MEM) for g in plan.create)
        assert plan.delete == ()

    def test_nothing_to_do_when_observed_equals_desired(self) -> None:
        """Observed equal to desired: no change."""
        assert tb.reconcile(ready_bed().state) == tb.ReconcilePlan((), (), ())

    def test_ghosts_of_an_unlabelled_node_are_deleted(self) -> None:
        """A node that lost its label loses its ghost pods."""
        bed = ready_bed()
        bed.observe([node("n1")], list(bed.state.pods), 2)
        plan = tb.reconcile(bed.state)
        assert plan.delete == tuple(
            sorted((g.name, g.uid) for g in (ghost("n2", 0), ghost("n2", 1)))
        )
        assert plan.create == ()

    def test_resize_replaces_the_ghosts(self) -> None:
        """A new slot size deletes the old ghost pods and creates new ones under new names."""
        bed = ready_bed()
        bed(tb.DefineTestbed("bed", "testbed", 2, 500, MEM, at=at(2)))
        plan = tb.reconcile(bed.state)
        assert len(plan.create) == 4 and len(plan.delete) == 4
        assert not {g.name for g in plan.create} & {name for name, _ in plan.delete}

    def test_fewer_slots_per_node_deletes_the_extra_ghosts(self) -> None:
        """Lowering slots per node deletes the ghost pods of the positions that went away."""
        bed = ready_bed()
        bed(tb.DefineTestbed("bed", "testbed", 1, CPU, MEM, at=at(2)))
        assert tb.reconcile(bed.state).delete == tuple(
            (g.name, g.uid) for g in (ghost("n1", 1), ghost("n2", 1))
        )

    def test_second_ghost_of_a_slot_is_deleted(self) -> None:
        """Of two ghost pods on one slot, the later by name goes."""
        bed = Bed(1)
        twin = tb.ObservedPod("zz-twin", "uid-twin", "n1", True, 0, CPU, MEM)
        bed.observe([node("n1")], [ghost("n1", 0), twin])
        plan = tb.reconcile(bed.state)
        assert plan.delete == (("zz-twin", "uid-twin"),)
        assert "conflicting" in plan.problems[0]

    def test_occupied_slot_deletes_its_ghost(self) -> None:
        """A slot holding its pod and its ghost deletes the ghost: the preemption is done."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        bed.observe([node("n1"), node("n2")], [*bed.state.pods, job_pod("p", "n1")], 3)
        assert tb.reconcile(bed.state).delete == ((ghost("n1", 0).name, ghost("n1", 0).uid),)

    def test_reserved_slot_gets_no_new_ghost(self) -> None:
        """A reserved slot whose ghost was preempted is not given a new one."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        pods = [p for p in bed.state.pods if p.name != ghost("n1", 0).name]
        bed.observe([node("n1"), node("n2")], [*pods, job_pod("p", None)], 3)
        assert tb.reconcile(bed.state).create == ()

    def test_terminating_ghosts_are_left_alone(self) -> None:
        """A ghost pod already terminating is not deleted again."""
        bed = Bed(1)
        going = tb.ObservedPod("old", "uid-old", "n1", True, 0, 500, MEM, terminating=True)
        bed.observe([node("n1")], [ghost("n1", 0), going])
        assert tb.reconcile(bed.state).delete == ()

    @settings(max_examples=60, deadline=None)
    @given(
        nodes=st.integers(0, 4),
        per_node=st.integers(1, 3),
        present=st.sets(st.tuples(st.integers(0, 4), st.integers(0, 3))),
    )
    def test_applying_the_plan_converges(
        self, nodes: int, per_node: int, present: set[tuple[int, int]]
    ) -> None:
        """Applying the diff leaves exactly one ghost per slot and nothing more to do."""
        bed = Bed(per_node)
        labelled = [node(f"n{i}") for i in range(nodes)]
        pods = [ghost(f"n{n}", p) for n, p in present]
        bed.observe(labelled, pods)
        plan = tb.reconcile(bed.state)
        created = [
            tb.ObservedPod(g.name, f"uid-{g.name}", g.node, True, g.position_on_node, CPU, MEM)
            for g in plan.create
        ]
        deleted = {name for name, _ in plan.delete}
        after = [p for p in pods if p.name not in deleted] + created
        bed.observe(labelled, after, 2)
        assert tb.reconcile(bed.state) == tb.ReconcilePlan((), (), ())
        statuses = Counter(s.status for s in tb.slots(bed.state))
        assert set(statuses) <= {"free"} and statuses.total() == nodes * per_node


class TestObservation:
    def test_unchanged_cluster_records_nothing(self) -> None:
        """The same observation twice is recorded once."""
        bed = ready_bed()
        assert bed.observe(list(bed.state.nodes), list(bed.state.pods), 5) == []

    def test_listing_order_does_not_matter(self) -> None:
        """The same cluster listed in another order is no change."""
        bed = ready_bed()
        nodes, pods = list(bed.state.nodes), list(bed.state.pods)
        assert bed.observe(nodes[::-1], pods[::-1], 5) == []

    def test_duplicate_names_are_refused(self) -> None:
        """An observation listing a pod twice is malformed."""
        with pytest.raises(InvalidCommand, match="pod twice"):
            Bed().observe([node("n1")], [ghost("n1", 0), ghost("n1", 0)])

    def test_reservation_of_a_gone_pod_is_cleared(self) -> None:
        """A reservation whose pod is no longer observed is cleared."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        events = bed.observe(list(bed.state.nodes), list(bed.state.pods), 3)
        assert [type(e) for e in events] == [tb.ReservationCleared]
        assert bed.statuses()[0] == "free"

    def test_older_snapshot_does_not_clear_a_reservation(self) -> None:
        """An observation taken before the reservation may predate the pod: nothing is cleared."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        assert bed.observe(list(bed.state.nodes), list(bed.state.pods), 2) == []

    def test_reservation_of_a_replaced_pod_is_cleared(self) -> None:
        """A new pod under the reserved pod's name (an application run again) is not the pod the
        slot was reserved for: the reservation is cleared."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        again = tb.ObservedPod("p", "uid-p-again", None, False)
        events = bed.observe(list(bed.state.nodes), [*bed.state.pods, again], 3)
        assert [type(e) for e in events] == [tb.ClusterObserved, tb.ReservationCleared]
        assert tb.reservation_of(bed.state, "p") is None

    def test_reservation_on_a_removed_node_is_cleared(self) -> None:
        """A node that leaves the testbed takes its reservations with it."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (1,), at=at(2)))
        events = bed.observe([node("n1")], [*bed.state.pods, job_pod("p", None)], 3)
        cleared = [e for e in events if isinstance(e, tb.ReservationCleared)]
        assert [(e.node, e.reason) for e in cleared] == [("n2", "node n2 left the testbed")]


class TestReserve:
    def test_first_free_slot_by_id(self) -> None:
        """The pod gets the lowest free slot of its list."""
        bed = ready_bed()
        [event] = bed(tb.ReserveSlot("p", "uid-p", (3, 1), at=at(2)))
        assert isinstance(event, tb.SlotReserved)
        assert (event.slot_id, event.node, event.ghost_pod) == (1, "n2", ghost("n2", 0).name)

    def test_candidate_nodes_limit_the_choice(self) -> None:
        """Only slots on candidate nodes are considered."""
        bed = ready_bed()
        [event] = bed(tb.ReserveSlot("p", "uid-p", (0, 1, 2), ("n2",), at=at(2)))
        assert isinstance(event, tb.SlotReserved) and event.slot_id == 1

    def test_a_pod_keeps_its_reservation(self) -> None:
        """Asking again for a pod that holds a slot decides nothing."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0, 1), at=at(2)))
        assert bed(tb.ReserveSlot("p", "uid-p", (0, 1), at=at(3))) == []
        assert tb.reservation_of(bed.state, "p") == tb.slots(bed.state)[0]

    def test_no_free_slot_is_refused_with_the_slots_states(self) -> None:
        """Without a free slot the refusal lists what the pod's slots are doing."""
        bed = ready_bed()
        bed(tb.ReserveSlot("p", "uid-p", (0,), at=at(2)))
        with pytest.raises(Rejected, match="0 reserved on n1"):
            bed(tb.ReserveSlot("q", "uid-q", (0,), at=at(3)))

    def test_empty_slot_list_is_invalid(self) -> None:
        """A pod without slot ids cannot be placed."""
        with pytest.raises(InvalidCommand, match="no slot ids"):
            ready_bed()(tb.ReserveSlot("p", "uid-p", (), at=at(2)))

    @settings(max_examples=80, deadline=None)
    @given(
        requests=st.lists(
            st.tuples(st.integers(0, 5), st.sets(st.integers(0, 5), min_size=1)), max_size=12
        )
    )
    def test_a_slot_is_never_held_by_two_pods(self, requests: list[tuple[int, set[int]]]) -> None:
        """Whatever pods ask for, each slot is reserved for at most one pod, and each pod holds
        at most one slot."""
        bed = ready_bed()
        for i, (pod, wanted) in enumerate(requests):
            with contextlib.suppress(Rejected):
                bed(tb.ReserveSlot(f"p{pod}", f"uid-{pod}", tuple(sorted(wanted)), at=at(2 + i)))
        holders = [s.reserved_for for s in tb.slots(bed.state) if s.reserved_for is not None]
        assert len(holders) == len(set(holders))
        assert len(bed.state.reservations) == len(holders)


class TestClaims:
    def test_claim_and_release(self) -> None:
        """A scheduling holds the testbed until it releases it."""
        bed = ready_bed()
        assert bed(tb.ClaimTestbed("s1", at=at(2))) == [tb.TestbedClaimed("s1", at(2))]
        assert bed(tb.ClaimTestbed("s1", at=at(3))) == []
        assert bed(tb.ReleaseTestbed("s1", at=at(4))) == [tb.TestbedReleased("s1", at(4))]
        assert bed.state.holder is None

    def test_held_testbed_refuses_another_scheduling(self) -> None:
        """A second scheduling's claim is refused while the first holds the testbed."""
        bed = ready_bed()
        bed(tb.ClaimTestbed("s1", at=at(2)))
        with pytest.raises(Rejected, match="held by scheduling s1"):
            bed(tb.ClaimTestbed("s2", at=at(3)))

    def test_release_by_a_non_holder_changes_nothing(self) -> None:
        """Only the holder's release counts."""
        bed = ready_bed()
        bed(tb.ClaimTestbed("s1", at=at(2)))
        assert bed(tb.ReleaseTestbed("s2", at=at(3))) == []


def failed(pod: tb.ObservedPod) -> tb.ObservedPod:
    return replace(pod, failed=True)


class TestFailedGhosts:
    def test_a_failed_ghost_is_replaced_under_a_fresh_name(self) -> None:
        """A ghost observed failed (or evicted) holds no slot: it is deleted by name and uid, and
        the slot gets a new ghost whose name differs from the failed pod's."""
        bed = ready_bed()
        gone = ghost("n1", 0)
        others = [p for p in bed.state.pods if p.name != gone.name]
        bed.observe(list(bed.state.nodes), [*others, failed(gone)], 2)

        plan = tb.reconcile(bed.state)

        assert bed.statuses()[0] == "creating"
        assert plan.delete == ((gone.name, gone.uid),)
        [fresh] = plan.create
        assert (fresh.node, fresh.position_on_node, fresh.slot_id) == ("n1", 0, 0)
        assert fresh.name == f"{gone.name}-g1"

    def test_seeing_the_failed_ghost_again_keeps_the_new_name(self) -> None:
        """The failed pod observed again (it may linger) does not move the slot on once more: a
        repeated pass asks for the same replacement, so no second ghost is created."""
        bed = ready_bed()
        gone = ghost("n1", 0)
        others = [p for p in bed.state.pods if p.name != gone.name]
        bed.observe(list(bed.state.nodes), [*others, failed(gone)], 2)
        first = tb.reconcile(bed.state).create
        bed.observe(list(bed.state.nodes), [*others], 3)
        bed.observe(list(bed.state.nodes), [*others, failed(gone)], 4)

        assert tb.reconcile(bed.state).create == first
        assert tb.ghost_generation(bed.state, "n1", 0) == 1

    def test_a_failed_replacement_moves_to_the_next_generation(self) -> None:
        """When the replacement fails too, the next one is named with generation 2."""
        bed = ready_bed()
        gone = ghost("n1", 0)
        others = [p for p in bed.state.pods if p.name != gone.name]
        bed.observe(list(bed.state.nodes), [*others, failed(gone)], 2)
        [fresh] = tb.reconcile(bed.state).create
        replacement = tb.ObservedPod(fresh.name, "uid-g1", "n1", True, 0, CPU, MEM)
        bed.observe(list(bed.state.nodes), [*others, replacement], 3)
        assert bed.statuses()[0] == "free"

        bed.observe(list(bed.state.nodes), [*others, failed(replacement)], 4)

        [again] = tb.reconcile(bed.state).create
        assert again.name == f"{gone.name}-g2"

    def test_the_generation_is_folded_from_the_log(self) -> None:
        """Replaying the recorded events gives the same names: the scheme needs no memory
        outside the log."""
        bed = ready_bed()
        gone = ghost("n2", 1)
        others = [p for p in bed.state.pods if p.name != gone.name]
        bed.observe(list(bed.state.nodes), [*others, failed(gone)], 2)

        replayed = tb.initial_state()
        for event in bed.events:
            replayed = tb.evolve(replayed, event)

        assert tb.reconcile(replayed) == tb.reconcile(bed.state)
        assert tb.reconcile(replayed).create[0].name == f"{gone.name}-g1"


class TestProblems:
    def test_a_node_without_room_loses_its_ghosts(self) -> None:
        """A node too small for its slots gets no ghost pod created and its existing ones deleted;
        its slots are in error and cannot hold a job."""
        bed = Bed()
        small = node("n2", cpu=1500)
        bed.observe([node("n1"), small], [ghost("n2", 0)])

        plan = tb.reconcile(bed.state)

        assert {g.node for g in plan.create} == {"n1"}
        assert plan.delete == ((ghost("n2", 0).name, ghost("n2", 0).uid),)
        assert bed.statuses() == {0: "creating", 1: "error", 2: "creating", 3: "error"}
        assert tb.usable_slot_ids(bed.state) == (0, 2)

    def test_problems_are_reported_on_the_testbed_when_they_change(self) -> None:
        """The observation records the problems once, with the node named, and records again
        only when they change: here, when the node gets room."""
        bed = Bed()
        events = bed.observe([node("n1", cpu=1500)], [], 1)
        reported = [e for e in events if isinstance(e, tb.ProblemsReported)]
        assert len(reported) == 1 and "node n1" in reported[0].problems[0]
        assert bed.state.problems == reported[0].problems

        assert bed.observe([node("n1", cpu=1500)], [], 2) == []

        events = bed.observe([node("n1")], [], 3)
        assert events[-1] == tb.ProblemsReported((), at(3))
        assert bed.state.problems == ()

    def test_slots_in_error_are_reported(self) -> None:
        """Two ghost pods on one slot are a problem recorded on the testbed."""
        bed = Bed(1)
        twin = tb.ObservedPod("twin", "uid-twin", "n1", True, 0, CPU, MEM)
        bed.observe([node("n1")], [ghost("n1", 0), twin])
        assert bed.state.problems == ("slot 0 on node n1 holds conflicting pods",)

    def test_a_resize_is_reported_with_the_next_observation(self) -> None:
        """Problems that a new definition causes are recorded by the next observation, even when
        the cluster itself did not change."""
        bed = ready_bed()
        bed(tb.DefineTestbed("bed", "testbed", 2, 5000, MEM, at=at(2)))
        events = bed.observe(list(bed.state.nodes), list(bed.state.pods), 3)
        assert [type(e) for e in events] == [tb.ProblemsReported]
        assert len(bed.state.problems) == 2


class TestDelete:
    def test_delete_is_refused_while_a_scheduling_holds_the_testbed(self) -> None:
        """The refusal names the holder and what to do."""
        bed = ready_bed()
        bed(tb.ClaimTestbed("s1", at=at(2)))
        with pytest.raises(
            Rejected, match="testbed bed is held by scheduling s1; release that scheduling first"
        ):
            bed(tb.DeleteTestbed("bed", at=at(3)))
        assert not bed.state.deleted

    def test_delete_is_recorded_once(self) -> None:
        """Deleting records the fact; deleting again is a no-op."""
        bed = ready_bed()
        assert bed(tb.DeleteTestbed("bed", at=at(2))) == [tb.TestbedDeleted("bed", at(2))]
        assert bed.state.deleted
        assert bed(tb.DeleteTestbed("bed", at=at(3))) == []

    def test_a_deleted_testbed_has_no_slots_and_deletes_every_ghost(self) -> None:
        """No slot for the extender, no ghost desired: every ghost pod is to be deleted."""
        bed = ready_bed()
        bed(tb.DeleteTestbed("bed", at=at(2)))
        plan = tb.reconcile(bed.state)
        assert tb.slots(bed.state) == () and tb.free_slot_ids(bed.state) == ()
        assert plan.create == ()
        assert plan.delete == tuple(sorted((p.name, p.uid) for p in bed.state.pods))

    @pytest.mark.parametrize(
        "command",
        [
            tb.ReserveSlot("p", "uid-p", (0,), at=at(3)),
            tb.ClaimTestbed("s1", at=at(3)),
            tb.ReleaseTestbed("s1", at=at(3)),
        ],
        ids=lambda c: type(c).__name__,
    )
    def test_a_deleted_testbed_refuses_commands(self, command: tb.TestbedCommand) -> None:
        """Only a definition brings a deleted testbed back."""
        bed = ready_bed()
        bed(tb.DeleteTestbed("bed", at=at(2)))
        with pytest.raises(Rejected, match="bed is deleted; define it again"):
            bed(command)

    def test_observations_continue_so_the_ghosts_are_seen_to_go(self) -> None:
        """The reconciler keeps recording the cluster of a deleted testbed, so its plan empties
        once the ghost pods are gone."""
        bed = ready_bed()
        bed(tb.DeleteTestbed("bed", at=at(2)))
        bed.observe(list(bed.state.nodes), [], 3)
        assert tb.reconcile(bed.state) == tb.ReconcilePlan((), (), ())

    def test_defining_it_again_recreates_it(self) -> None:
        """The same definition after a deletion is recorded again and clears the deletion."""
        bed = ready_bed()
        bed(tb.DeleteTestbed("bed", at=at(2)))
        assert bed(tb.DefineTestbed("bed", "testbed", 2, CPU, MEM, at=at(3)))
        assert not bed.state.deleted
        assert tb.free_slot_ids(bed.state) == (0, 1, 2, 3)

    def test_deleting_an_undefined_testbed_is_refused(self) -> None:
        """Nothing to delete before a definition."""
        with pytest.raises(Rejected, match="not defined"):
            tb.decide(tb.initial_state(), tb.DeleteTestbed("bed", at=at(0)))


EVENTS = [
    tb.TestbedDefined("bed", "testbed", 2, CPU, MEM, T0),
    tb.ClusterObserved((node("n1"),), (ghost("n1", 0), job_pod("p", None)), T0),
    tb.SlotReserved(0, "n1", 0, "p", "uid-p", "g", "uid-g", T0),
    tb.SlotReserved(0, "n1", 0, "p", "uid-p", None, None, T0),
    tb.ReservationCleared(0, "n1", 0, "p", "pod p is gone", T0),
    tb.TestbedClaimed("s1", T0),
    tb.TestbedReleased("s1", T0),
]


class TestCodec:
    @pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
    def test_round_trip(self, event: tb.TestbedEvent) -> None:
        """Every testbed event survives the codec under a ``testbed.`` name."""
        name, version, data = to_data(event)
        assert name.startswith("testbed.") and version == 1
        assert from_data(name, version, data) == event
