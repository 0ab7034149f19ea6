"""The extender's decisions: which node a job's pod goes to, and which ghost pod it evicts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetledger.domain.testbeds import extender as ext
from fleetledger.domain.testbeds import testbed as tb

T0 = datetime(2025, 1, 1, tzinfo=UTC)
NODES = ("n1", "n2")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ghost(node: str, pos: int) -> tb.ObservedPod:
    name = tb.ghost_pod_name("bed", node, pos, 1000, 1024)
    return tb.ObservedPod(name, f"uid-{node}-{pos}", node, True, pos, 1000, 1024)


def ready() -> tb.TestbedState:
    """Two nodes of two slots, every ghost pod running: slots 0, 2 on n1 and 1, 3 on n2."""
    state = tb.initial_state()
    for command in (
        tb.DefineTestbed("bed", "testbed", 2, 1000, 1024, at=at(0)),
        tb.ObserveCluster(
            tuple(tb.ObservedNode(n, n, 4000, 4096) for n in NODES),
            tuple(ghost(n, p) for n in NODES for p in (0, 1)),
            at=at(1),
        ),
    ):
        for event in tb.decide(state, command):
            state = tb.evolve(state, event)
    return state


def applied(state: tb.TestbedState, events: tuple[tb.TestbedEvent, ...]) -> tb.TestbedState:
    for event in events:
        state = tb.evolve(state, event)
    return state


POD = ext.PodToPlace("exec-1", "uid-exec-1", (1, 2))


class TestFilter:
    def test_reserves_the_first_free_slot_and_answers_its_node(self) -> None:
        """The pod's lowest free slot is reserved (an event) and only its node passes."""
        decision = ext.filter_pod(ready(), POD, NODES, at=at(2))
        assert decision.nodes == ("n2",)
        assert decision.failed == {"n1": "pod exec-1 has slot 1, which is on node n2"}
        [event] = decision.events
        assert isinstance(event, tb.SlotReserved) and (event.slot_id, event.pod_name) == (
            1,
            "exec-1",
        )

    def test_a_reserved_pod_gets_its_node_again_without_events(self) -> None:
        """Asked again, the extender answers the reserved slot's node and reserves nothing."""
        state = applied(ready(), ext.filter_pod(ready(), POD, NODES, at=at(2)).events)
        decision = ext.filter_pod(state, POD, NODES, at=at(3))
        assert (decision.nodes, decision.events) == (("n2",), ())

    def test_only_candidate_nodes_are_used(self) -> None:
        """A slot on a node the scheduler filtered out is not chosen."""
        decision = ext.filter_pod(ready(), POD, ("n1",), at=at(2))
        assert decision.nodes == ("n1",)
        assert isinstance(decision.events[0], tb.SlotReserved)
        assert decision.events[0].slot_id == 2

    def test_no_free_slot_gives_no_node_and_the_reason(self) -> None:
        """With every slot of the pod taken, no node passes and each says why."""
        state = ready()
        for i, slot in enumerate((1, 2)):
            other = ext.PodToPlace(f"other-{i}", f"uid-o{i}", (slot,))
            state = applied(state, ext.filter_pod(state, other, NODES, at=at(2)).events)
        decision = ext.filter_pod(state, POD, NODES, at=at(3))
        assert decision.nodes == () and decision.events == ()
        assert set(decision.failed) == set(NODES)
        assert "no free slot for pod exec-1" in decision.failed["n1"]

    def test_reserved_slot_off_the_candidates_gives_no_node(self) -> None:
        """A pod whose slot is on a node the scheduler did not offer is not placed elsewhere."""
        state = applied(ready(), ext.filter_pod(ready(), POD, NODES, at=at(2)).events)
        decision = ext.filter_pod(state, POD, ("n1",), at=at(3))
        assert decision.nodes == ()
        assert decision.failed == {"n1": "pod exec-1 has slot 1, which is on node n2"}


class TestPreempt:
    def test_victim_is_the_slots_ghost_pod(self) -> None:
        """Preemption picks the pod's slot and names that slot's ghost pod as the victim."""
        decision = ext.preempt_pod(ready(), POD, at=at(2))
        assert (decision.node, decision.victim_uids) == ("n2", ("uid-n2-0",))
        assert isinstance(decision.events[0], tb.SlotReserved)

    def test_preempt_after_filter_keeps_the_reservation(self) -> None:
        """A pod reserved by filter gets the same slot and victim from preempt."""
        state = applied(ready(), ext.filter_pod(ready(), POD, ("n1",), at=at(2)).events)
        decision = ext.preempt_pod(state, POD, at=at(3))
        assert (decision.node, decision.victim_uids, decision.events) == (
            "n1",
            ("uid-n1-1",),
            (),
        )

    def test_no_free_slot_gives_no_node(self) -> None:
        """Without a free slot preemption names no node, and says why."""
        state = applied(ready(), ext.preempt_pod(ready(), POD, at=at(2)).events)
        state = applied(
            state, ext.preempt_pod(state, ext.PodToPlace("x", "ux", (2,)), at=at(3)).events
        )
        decision = ext.preempt_pod(state, ext.PodToPlace("y", "uy", (1, 2)), at=at(4))
        assert decision.node is None and decision.victim_uids == ()
        assert "no free slot for pod y" in decision.reason

    def test_only_the_candidate_nodes_are_considered(self) -> None:
        """A new reservation is made only on a node the scheduler offered as a candidate."""
        decision = ext.preempt_pod(ready(), POD, at=at(2), candidate_nodes=("n1",))
        assert (decision.node, decision.victim_uids) == ("n1", ("uid-n1-1",))
        [event] = decision.events
        assert isinstance(event, tb.SlotReserved) and event.slot_id == 2

    def test_no_free_slot_on_the_candidates_gives_no_node(self) -> None:
        """With the pod's free slots all off the candidate nodes, no node is answered."""
        decision = ext.preempt_pod(
            ready(), ext.PodToPlace("p", "up", (1,)), at=at(2), candidate_nodes=("n1",)
        )
        assert (decision.node, decision.victim_uids, decision.events) == (None, (), ())
        assert "no free slot for pod p" in decision.reason

    def test_an_existing_reservation_off_the_candidates_gives_no_node(self) -> None:
        """A pod whose reserved slot is on a node the scheduler did not offer gets no node."""
        state = applied(ready(), ext.filter_pod(ready(), POD, NODES, at=at(2)).events)
        decision = ext.preempt_pod(state, POD, at=at(3), candidate_nodes=("n1",))
        assert decision.node is None and decision.victim_uids == ()
        assert "not among the candidate nodes" in decision.reason

    def test_a_slot_without_a_ghost_pod_gives_no_node(self) -> None:
        """A reserved slot whose ghost pod is already gone has no victim: a preemption answer
        without victims is refused by the kube-scheduler, so no node is answered, with the
        reason."""
        state = applied(ready(), ext.filter_pod(ready(), POD, NODES, at=at(2)).events)
        preemptor = tb.ObservedPod(POD.name, POD.uid, None, False)
        pods = (*(p for p in state.pods if p.uid != "uid-n2-0"), preemptor)
        observed = tb.decide(state, tb.ObserveCluster(state.nodes, pods, at=at(3)))
        state = applied(state, tuple(observed))

        decision = ext.preempt_pod(state, POD, at=at(4), candidate_nodes=NODES)

        assert (decision.node, decision.victim_uids) == (None, ())
        assert "has no ghost pod left to evict" in decision.reason
