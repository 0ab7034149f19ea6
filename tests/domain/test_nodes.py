"""Node resource accounting: reserving pods, the agent protocol, pressure, config and restarts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fleetledger.domain import nodes
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.nodes import (
    AgentResourcesRequest,
    Bounds,
    ChangeNodeConfig,
    ComputeUnit,
    ComputeUnitMismatch,
    ContainerResources,
    ControllerRestarted,
    DeletePod,
    JoinNode,
    MigratingPodMismatch,
    MigrationStarted,
    NodeCapacityChanged,
    NodeCommand,
    NodeConfig,
    NodeConfigChanged,
    NodeEvent,
    NodeJoined,
    NodeLeft,
    NodeState,
    OtherPodReserved,
    OtherPodSpec,
    OtherPodsReserved,
    PodDeleted,
    RemoveNode,
    ReservedOtherPod,
    ReservePod,
    ReservePods,
    ResourcesGranted,
    RestartController,
    UnknownPod,
    Unschedulable,
    UpdateNodeCapacity,
    VmPodReserved,
    VmPodSpec,
    decide,
    evolve,
    initial_state,
    migration_queue,
    needs_migration,
    stream_id,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
GIB = 1 << 30
UNIT = ComputeUnit(250, 1)
CONFIG = NodeConfig(
    cpu_system_milli=0,
    memory_system_slots=0,
    cpu_watermark=1.0,
    memory_watermark=1.0,
    compute_unit=UNIT,
    memory_slot_bytes=GIB,
)


def at(seconds: float = 0) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Node:
    """One node driven through commands, keeping every event so the log can be replayed."""

    def __init__(
        self,
        *,
        cpu: int = 10_000,
        memory: int = 10,
        gpu: int = 0,
        config: NodeConfig = CONFIG,
        name: str = "n1",
    ) -> None:
        self.state = initial_state()
        self.events: list[NodeEvent] = []
        self.do(JoinNode(name, cpu, memory * GIB, gpu, config, at=at()))

    def do(self, command: NodeCommand) -> list[NodeEvent]:
        events = decide(self.state, command)
        self.record(events)
        return events

    def record(self, events: Iterable[NodeEvent]) -> None:
        for event in events:
            self.events.append(event)
            self.state = evolve(self.state, event)

    def vm(
        self,
        name: str,
        *,
        cpu: int = 0,
        memory: int = 0,
        cpu_bounds: tuple[int, int] = (0, 10_000),
        memory_bounds: tuple[int, int] = (0, 20),
        gpu: int = 0,
    ) -> None:
        """Record a VM pod holding ``cpu``/``memory`` as a fact, whether it fits or not."""
        self.record(
            [
                VmPodReserved(
                    name,
                    Bounds(cpu_bounds[0], cpu, cpu_bounds[1]),
                    Bounds(memory_bounds[0], memory, memory_bounds[1]),
                    gpu,
                    cpu,
                    memory,
                    True,
                    at(),
                )
            ]
        )

    def ask(
        self, pod: str, cpu: int, memory: int, *, fractional: bool = True, load: float | None = None
    ) -> list[NodeEvent]:
        return self.do(
            AgentResourcesRequest(pod, cpu, memory, at=at(1), fractional_cpu=fractional, load=load)
        )

    def replayed(self) -> NodeState:
        state = initial_state()
        for event in self.events:
            state = evolve(state, event)
        return state


def granted(events: Sequence[NodeEvent]) -> ResourcesGranted:
    found = [e for e in events if isinstance(e, ResourcesGranted)]
    assert len(found) == 1
    return found[0]


def unit_warnings(events: Sequence[NodeEvent]) -> list[NodeEvent]:
    """The compute-unit warnings among ``events`` (anything but grants and migrations)."""
    return [e for e in events if not isinstance(e, ResourcesGranted | MigrationStarted)]


def vm_spec(
    name: str, cpu: tuple[int, int, int], memory: tuple[int, int, int], gpu: int = 0
) -> VmPodSpec:
    return VmPodSpec(name=name, cpu=Bounds(*cpu), memory=Bounds(*memory), gpu=gpu)


class TestSurface:
    def test_stream_per_node(self) -> None:
        """Each node's accounting lives in its own stream."""
        assert stream_id("aks-pool-1") == "node-aks-pool-1"


class TestJoin:
    def test_join_counts_memory_in_whole_slots(self) -> None:
        """Joining records the totals, memory rounded down to whole slots."""
        events = decide(initial_state(), JoinNode("n1", 8000, 5 * GIB + 5, 1, CONFIG, at=at()))
        assert events == [NodeJoined("n1", 8000, 5, 1, CONFIG, at())]

    def test_join_again_unchanged_is_a_no_op(self) -> None:
        """A repeated join with the same figures changes nothing."""
        node = Node()
        assert node.do(JoinNode("n1", 10_000, 10 * GIB, 0, CONFIG, at=at(5))) == []

    def test_join_again_with_other_figures_is_refused(self) -> None:
        """A joined node changes through UpdateNodeCapacity, not a second join."""
        node = Node()
        with pytest.raises(Rejected, match="UpdateNodeCapacity"):
            node.do(JoinNode("n1", 12_000, 10 * GIB, 0, CONFIG, at=at()))

    def test_commands_before_join_are_refused(self) -> None:
        """Nothing is accounted on a node that has not joined."""
        with pytest.raises(Rejected, match="must join"):
            decide(initial_state(), DeletePod("p", at=at()))

    def test_bad_watermark_is_refused_with_a_hint(self) -> None:
        """A watermark outside [0, 1] says what a watermark is."""
        with pytest.raises(InvalidCommand, match="fraction"):
            decide(
                initial_state(),
                JoinNode("n1", 1, 1, 0, replace(CONFIG, cpu_watermark=90.0), at=at()),
            )

    def test_naive_time_is_refused(self) -> None:
        """Commands carry timezone-aware times."""
        with pytest.raises(InvalidCommand, match="timezone-aware"):
            decide(initial_state(), JoinNode("n1", 1, 1, 0, CONFIG, at=datetime(2025, 1, 1)))

    def test_capacity_change_and_leaving(self) -> None:
        """Totals follow the cluster; a node that leaves holds nothing and refuses requests."""
        node = Node()
        node.vm("a", cpu=2000, memory=2)
        assert node.do(UpdateNodeCapacity(16_000, 12 * GIB, 2, at=at(1))) == [
            NodeCapacityChanged(16_000, 12, 2, at(1))
        ]
        assert node.do(RemoveNode(at=at(2))) == [NodeLeft(at(2))]
        assert node.state.vm_pods == {}
        assert node.state.cpu.reserved == 0
        with pytest.raises(Rejected):
            node.ask("a", 1000, 1)


class TestReserve:
    def test_vm_pod_reserves_its_use(self) -> None:
        """A VM pod that fits holds its VM's current use."""
        node = Node()
        node.do(ReservePod(vm_spec("a", (250, 2000, 4000), (1, 3, 8)), at=at()))
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (2000, 3)
        assert node.state.vm_pods["a"].cpu.reserved == 2000

    def test_pod_that_does_not_fit_is_unschedulable_and_changes_nothing(self) -> None:
        """A reservation above what remains is refused, naming every short resource."""
        node = Node()
        node.vm("a", cpu=9000, memory=2)
        before = node.state
        with pytest.raises(Unschedulable, match=r"cpu needs 2000 milli-CPU, 1000 milli-CPU remain"):
            node.do(ReservePod(vm_spec("b", (0, 2000, 2000), (0, 1, 1)), at=at()))
        assert node.state == before

    def test_gpus_must_fit_too(self) -> None:
        """A pod asking more GPUs than are free is unschedulable."""
        node = Node(gpu=1)
        node.do(ReservePod(vm_spec("a", (0, 100, 100), (0, 1, 1), gpu=1), at=at()))
        with pytest.raises(Unschedulable, match="gpu"):
            node.do(ReservePod(vm_spec("b", (0, 100, 100), (0, 1, 1), gpu=1), at=at()))

    def test_already_running_pod_is_counted_even_over_capacity(self) -> None:
        """A pod already bound to the node counts whatever remains."""
        node = Node()
        node.vm("a", cpu=9000, memory=9)
        node.do(ReservePod(vm_spec("b", (0, 3000, 3000), (0, 3, 3)), at=at(), already_running=True))
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (12_000, 12)
        assert node.state.cpu.remaining == 0

    def test_retried_reserve_is_a_no_op(self) -> None:
        """Reserving a pod the node already holds changes nothing."""
        node = Node()
        spec = vm_spec("a", (0, 1000, 2000), (0, 1, 2))
        node.do(ReservePod(spec, at=at()))
        assert node.do(ReservePod(spec, at=at(1))) == []

    def test_non_vm_pod_uses_requests_then_limits(self) -> None:
        """Each container counts its request, else its limit."""
        node = Node()
        spec = OtherPodSpec(
            name="o",
            containers=(
                ContainerResources(cpu_request_milli=300, memory_limit_bytes=GIB // 2),
                ContainerResources(cpu_limit_milli=200, memory_request_bytes=GIB // 4),
            ),
        )
        assert node.do(ReservePod(spec, at=at())) == [
            OtherPodReserved("o", 500, GIB // 2 + GIB // 4, 0, False, at())
        ]

    def test_container_without_a_value_is_refused_with_the_fix(self) -> None:
        """A container with neither request nor limit for a resource cannot be accounted for."""
        node = Node()
        spec = OtherPodSpec(name="o", containers=(ContainerResources(cpu_request_milli=100),))
        with pytest.raises(InvalidCommand, match=r"resources\.requests\.memory"):
            node.do(ReservePod(spec, at=at()))

    def test_non_vm_sums_round_up_once(self) -> None:
        """Raw sums of non-VM pods round up together: three 300m pods hold one CPU, not three."""
        node = Node()
        for n in range(3):
            spec = OtherPodSpec(
                name=f"o{n}",
                containers=(ContainerResources(cpu_request_milli=300, memory_request_bytes=100),),
            )
            node.do(ReservePod(spec, at=at()))
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (1000, 1)
        node.do(DeletePod("o0", at=at(1)))
        node.do(DeletePod("o1", at=at(1)))
        node.do(DeletePod("o2", at=at(1)))
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (0, 0)

    def test_non_vm_pod_fits_into_rounding_slack(self) -> None:
        """A non-VM pod that fits in what rounding already holds needs nothing more."""
        node = Node()
        node.vm("big", cpu=9000, memory=9)
        first = OtherPodSpec(
            name="o1",
            containers=(ContainerResources(cpu_request_milli=400, memory_request_bytes=1),),
        )
        node.do(ReservePod(first, at=at()))
        assert node.state.cpu.remaining == 0
        second = OtherPodSpec(
            name="o2",
            containers=(ContainerResources(cpu_request_milli=500, memory_request_bytes=1),),
        )
        node.do(ReservePod(second, at=at()))
        assert node.state.cpu.reserved == 10_000

    def test_deleting_an_unknown_pod_is_a_no_op(self) -> None:
        """A deletion seen twice changes nothing the second time."""
        assert Node().do(DeletePod("ghost", at=at())) == []


def other(name: str, cpu: int, memory: int = GIB // 4, gpu: int = 0) -> OtherPodSpec:
    return OtherPodSpec(
        name=name,
        containers=(
            ContainerResources(cpu_request_milli=cpu, memory_request_bytes=memory, gpu=gpu),
        ),
    )


class TestReserveMany:
    def test_a_batch_is_one_event_for_every_pod(self) -> None:
        """Several non-VM pods reserved together are one event, in the order given."""
        node = Node()
        events = node.do(ReservePods((other("a", 300), other("b", 500, GIB)), at=at()))
        assert events == [
            OtherPodsReserved(
                (ReservedOtherPod("a", 300, GIB // 4, 0), ReservedOtherPod("b", 500, GIB, 0)),
                at(),
            )
        ]
        assert set(node.state.other_pods) == {"a", "b"}

    def test_a_batch_rounds_its_sums_once(self) -> None:
        """Three 300m pods in one batch hold one CPU, as they do reserved one by one."""
        node = Node()
        node.do(ReservePods(tuple(other(f"o{n}", 300, 100) for n in range(3)), at=at()))
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (1000, 1)
        assert node.state.other_raw_cpu_milli == 900

    @pytest.mark.parametrize(
        ("specs", "refused", "short"),
        [
            ((other("a", 6000), other("b", 3000), other("c", 2000)), "c", "cpu"),
            ((other("a", 1000, 9 * GIB), other("b", 100, GIB + 1)), "b", "memory"),
            ((other("a", 100, gpu=1), other("b", 100, gpu=1)), "b", "gpu"),
        ],
        ids=["cpu", "memory", "gpu"],
    )
    def test_a_pod_that_does_not_fit_refuses_the_whole_batch_naming_it(
        self, specs: tuple[OtherPodSpec, ...], refused: str, short: str
    ) -> None:
        """Each pod is checked on the room the pods before it leave; the first that does not
        fit refuses the batch by name, and nothing is reserved."""
        node = Node(gpu=1)
        before = node.state
        with pytest.raises(Unschedulable, match=rf"pod {refused} is unschedulable.*{short} needs"):
            node.do(ReservePods(specs, at=at()))
        assert node.state == before

    def test_a_batch_fills_the_rounding_slack(self) -> None:
        """A pod that fits in what the pods before it already round up to needs nothing more."""
        node = Node()
        node.vm("big", cpu=9000, memory=9)
        node.do(ReservePods((other("o1", 400, 1), other("o2", 500, 1)), at=at()))
        assert node.state.cpu.reserved == 10_000

    def test_pods_already_held_are_skipped(self) -> None:
        """A retried batch reserves only the pods the node does not hold yet."""
        node = Node()
        node.do(ReservePod(other("a", 300), at=at()))
        events = node.do(ReservePods((other("a", 300), other("b", 200)), at=at(1)))
        assert events == [OtherPodsReserved((ReservedOtherPod("b", 200, GIB // 4, 0),), at(1))]
        assert node.do(ReservePods((other("a", 300), other("b", 200)), at=at(2))) == []

    def test_a_vm_pod_of_the_same_name_refuses_the_batch(self) -> None:
        """A name the node holds as a VM pod cannot be reserved again as a non-VM pod."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        with pytest.raises(Rejected, match="pod a is already reserved on n1 as a VM pod"):
            node.do(ReservePods((other("b", 100), other("a", 100)), at=at()))

    @pytest.mark.parametrize(
        ("specs", "message"),
        [
            ((), "non-empty tuple"),
            ((other("a", 100), other("a", 200)), "pod a twice"),
            ((vm_spec("v", (0, 100, 100), (0, 1, 1)),), "reserve a VM pod with ReservePod"),
        ],
        ids=["empty", "twice", "vm-pod"],
    )
    def test_malformed_batches_are_invalid(self, specs: tuple[object, ...], message: str) -> None:
        """An empty batch, a pod listed twice, or a VM pod are refused with what to do."""
        with pytest.raises(InvalidCommand, match=message):
            Node().do(ReservePods(specs, at=at()))  # type: ignore[arg-type]

    def test_a_batch_replays_to_the_live_state(self) -> None:
        """Folding the logged batch event again gives the state the decision left."""
        node = Node()
        node.do(ReservePods((other("a", 300), other("b", 1700, 3 * GIB)), at=at()))
        node.do(DeletePod("a", at=at(1)))
        assert node.replayed() == node.state
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (2000, 3)

    def test_a_batch_that_raises_pressure_starts_migrations(self) -> None:
        """Reserving past the watermark starts migrations, as a single reserve does."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.vm("v", cpu=4000, memory=1)
        events = node.do(ReservePods((other("a", 1000), other("b", 1000)), at=at()))
        assert [type(e) for e in events] == [OtherPodsReserved, MigrationStarted]


# Seed 04's behaviour table: total 10, system 0; (pod reserved, node reserved) -> request ->
# (permit, pod pressure, node reserved after, node pressure after).
ORIGINAL_CASES = [
    ((2, 5), 3, (3, 0, 6, 0)),
    ((3, 6), 2, (2, 0, 5, 0)),
    ((1, 8), 5, (3, 2, 10, 2)),
    ((2, 12), 3, (2, 1, 12, 1)),
    ((4, 15), 2, (2, 0, 13, 0)),
]


class TestOriginalBehaviour:
    @pytest.mark.parametrize(("before", "asking", "after"), ORIGINAL_CASES)
    @pytest.mark.parametrize(("resource", "scale"), [("cpu", 1000), ("memory", 1)])
    def test_ports_of_the_seed_table(
        self,
        before: tuple[int, int],
        asking: int,
        after: tuple[int, int, int, int],
        resource: str,
        scale: int,
    ) -> None:
        """Each row of the seed's table, in milli-CPU and in memory slots alike."""
        pod, node_reserved = before
        node = Node(cpu=10 * 1000, memory=10)
        mine = {"cpu": 0, "memory": 0, resource: pod * scale}
        theirs = {"cpu": 0, "memory": 0, resource: (node_reserved - pod) * scale}
        node.vm("pod", cpu=mine["cpu"], memory=mine["memory"])
        node.vm("others", cpu=theirs["cpu"], memory=theirs["memory"])
        asked = {"cpu": 0, "memory": 0, resource: asking * scale}
        permit = granted(node.ask("pod", asked["cpu"], asked["memory"]))
        res = getattr(node.state, resource)
        permitted = permit.cpu_milli if resource == "cpu" else permit.memory_slots
        got = (
            permitted // scale,
            getattr(permit, f"{resource}_pressure") // scale,
            res.reserved // scale,
            res.capacity_pressure // scale,
        )
        assert got == after


class TestAgentRequest:
    def test_decrease_clears_the_pods_pressure(self) -> None:
        """A request at or below the reservation is granted and clears capacity pressure."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        node.vm("b", cpu=8000, memory=8)
        node.ask("a", 4000, 1)
        assert node.state.cpu.capacity_pressure == 2000
        node.ask("a", 2000, 1)
        assert node.state.vm_pods["a"].cpu.capacity_pressure == 0
        assert node.state.cpu.capacity_pressure == 0

    def test_whole_cpu_agents_get_whole_cpus(self) -> None:
        """For an agent without fractional CPU, what remains is rounded down to whole CPUs."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        node.vm("b", cpu=7500, memory=1)
        permit = granted(node.ask("a", 3000, 1, fractional=False))
        assert (permit.cpu_milli, permit.cpu_pressure) == (2000, 1000)

    def test_fractional_cpu_on_an_old_protocol_is_refused(self) -> None:
        """An agent that cannot do fractional CPU must ask in whole CPUs."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        with pytest.raises(InvalidCommand, match="whole CPUs"):
            node.ask("a", 1500, 1, fractional=False)

    def test_unknown_pod_is_refused(self) -> None:
        """Only VM pods on the node can ask."""
        with pytest.raises(UnknownPod, match="no VM pod"):
            Node().ask("ghost", 1000, 1)

    def test_request_outside_the_vm_bounds_is_refused(self) -> None:
        """An agent cannot ask for more than its VM's max."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(250, 2000))
        with pytest.raises(InvalidCommand, match=r"outside its VM's bounds \[250, 2000\]"):
            node.ask("a", 3000, 1)

    def test_permit_carries_the_current_compute_unit(self) -> None:
        """Every answer names the node's compute unit, and the pod remembers it."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        assert granted(node.ask("a", 1250, 2)).compute_unit == UNIT
        assert node.state.vm_pods["a"].last_compute_unit == UNIT

    def test_first_request_is_not_checked_against_a_unit(self) -> None:
        """Before any answer the agent knows no unit, so nothing is checked."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        assert unit_warnings(node.ask("a", 1100, 1)) == []

    def test_unit_mismatch_is_a_warning_not_a_refusal(self) -> None:
        """An amount off the unit last sent is recorded and still granted."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        node.ask("a", 1000, 4)
        events = node.ask("a", 1100, 4)
        assert unit_warnings(events) == [ComputeUnitMismatch("a", 1100, 4, UNIT, at(1))]
        assert granted(events).cpu_milli == 1100

    def test_cpu_and_memory_must_be_the_same_number_of_units(self) -> None:
        """Whole multiples of the unit are not enough: 4 CPU units with 1 memory unit is off
        the unit (seed 04: the agent asks in compute units, the same count for both)."""
        node = Node()
        node.vm("a", cpu=1000, memory=4)
        node.ask("a", 1000, 4)
        assert unit_warnings(node.ask("a", 1000, 4)) == []
        events = node.ask("a", 1000, 1)
        assert unit_warnings(events) == [ComputeUnitMismatch("a", 1000, 1, UNIT, at(1))]

    def test_min_and_max_are_exempt_from_the_unit(self) -> None:
        """The VM's bounds need not be multiples of the unit."""
        node = Node()
        node.vm("a", cpu=1000, memory=4, cpu_bounds=(100, 2100))
        node.ask("a", 1000, 4)
        assert unit_warnings(node.ask("a", 2100, 1)) == []
        assert unit_warnings(node.ask("a", 100, 1)) == []

    def test_a_request_at_a_bound_is_exempt_as_a_whole(self) -> None:
        """One resource at its VM's min or max exempts the request, the other resource too:
        a VM whose bounds are not in the unit's ratio reaches one bound before the other."""
        node = Node(config=replace(CONFIG, compute_unit=ComputeUnit(250, 2)))
        node.vm("a", cpu=1000, memory=8, cpu_bounds=(100, 2100), memory_bounds=(2, 20))
        node.ask("a", 1000, 8)
        assert unit_warnings(node.ask("a", 2100, 3)) == []
        assert unit_warnings(node.ask("a", 1100, 2)) == []
        assert unit_warnings(node.ask("a", 1100, 20)) == []
        assert len(unit_warnings(node.ask("a", 1100, 3))) == 1

    def test_unit_is_checked_against_the_last_one_sent(self) -> None:
        """After a unit change the agent is held to the unit it was told, once."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        node.ask("a", 1000, 4)
        node.do(ChangeNodeConfig(replace(CONFIG, compute_unit=ComputeUnit(500, 2)), at=at(2)))
        assert unit_warnings(node.ask("a", 1250, 5)) == []
        assert unit_warnings(node.ask("a", 1250, 5)) == [
            ComputeUnitMismatch("a", 1250, 5, ComputeUnit(500, 2), at(1))
        ]

    def test_migrating_pod_must_ask_its_reservation(self) -> None:
        """A migrating pod asking anything else is refused; asking its reservation is answered."""
        node = Node()
        node.vm("a", cpu=2000, memory=2)
        node.record([MigrationStarted("a", 2000, 2, at())])
        with pytest.raises(MigratingPodMismatch, match="exactly its reservation"):
            node.ask("a", 3000, 2)
        assert granted(node.ask("a", 2000, 2)).cpu_milli == 2000

    def test_migrating_pod_reports_its_use_first_after_a_restart(self) -> None:
        """Right after a restart a migrating pod may report its real use below the bound."""
        node = Node()
        node.vm("a", cpu=2000, memory=2)
        node.record([MigrationStarted("a", 2000, 2, at())])
        restarted(node, vm_spec("a", (0, 1000, 4000), (0, 1, 20)), rule="assume_max")
        permit = granted(node.ask("a", 1000, 1))
        assert (permit.cpu_milli, permit.memory_slots) == (1000, 1)
        with pytest.raises(MigratingPodMismatch):
            node.ask("a", 900, 1)

    def test_load_is_kept_for_the_queue(self) -> None:
        """A reported load marks the pod as having metrics."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        node.ask("a", 1000, 1, load=0.5)
        node.ask("a", 1000, 1)
        assert node.state.vm_pods["a"].load == 0.5


def pressured_node(watermark: float = 0.5) -> Node:
    node = Node(config=replace(CONFIG, cpu_watermark=watermark, memory_watermark=1.0))
    node.vm("a", cpu=2000, memory=1)
    node.vm("b", cpu=2000, memory=1)
    node.vm("c", cpu=2000, memory=1)
    return node


class TestPressure:
    def test_reserved_above_the_watermark_starts_a_migration(self) -> None:
        """Logical pressure not yet accounted for picks a pod from the queue."""
        node = pressured_node()
        node.ask("a", 1000, 1, load=3.0)
        node.ask("b", 1000, 1, load=1.0)
        events = node.ask("c", 4000, 1)
        # reserved 6000 > watermark 5000: one migration of the lowest-load pod with metrics.
        assert [e for e in events if isinstance(e, MigrationStarted)] == [
            MigrationStarted("b", 1000, 0 + 1, at(1))
        ]
        assert node.state.vm_pods["b"].migrating
        assert not needs_migration(node.state)

    def test_queue_prefers_metrics_then_low_load_then_name(self) -> None:
        """Pods with metrics come first, lowest load first; pods without metrics last."""
        node = Node()
        for name in ("d", "c", "b", "a"):
            node.vm(name, cpu=1000, memory=1)
        node.ask("c", 1000, 1, load=2.0)
        node.ask("d", 1000, 1, load=0.1)
        assert [p.name for p in migration_queue(node.state)] == ["d", "c", "a", "b"]

    def test_migration_accounts_reserved_and_pressure(self) -> None:
        """Starting a migration accounts the pod's reserved plus its capacity pressure."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.9))
        node.vm("a", cpu=1000, memory=1)
        node.vm("b", cpu=8000, memory=1)
        node.ask("a", 4000, 1)
        # a got 2000 and 2000 of pressure; first in the queue, it goes on the next decision.
        events = node.ask("b", 8000, 1)
        assert [e for e in events if isinstance(e, MigrationStarted)] == [
            MigrationStarted("a", 4000, 1, at(1))
        ]
        assert node.state.cpu.pressure_accounted_for == 4000

    def test_migrations_continue_until_the_pressure_is_accounted_for(self) -> None:
        """One migration is not enough when it covers less than the pressure."""
        node = pressured_node()
        events = node.ask("c", 4000, 1)
        # reserved 8000 against a watermark of 5000: a (2000) then b (2000) cover the 3000.
        assert [e.pod for e in events if isinstance(e, MigrationStarted)] == ["a", "b"]

    def test_deleting_a_migrating_pod_removes_what_it_accounted(self) -> None:
        """When the migrated pod goes, its accounted pressure goes with it."""
        node = pressured_node()
        node.ask("c", 4000, 1)
        before = node.state.cpu.pressure_accounted_for
        node.do(DeletePod("a", at=at(2)))
        assert node.state.cpu.pressure_accounted_for == before - 2000
        assert node.state.cpu.reserved == 6000

    def test_buffer_is_slack(self) -> None:
        """Reserved held as buffer after a restart does not start migrations."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.vm("a", cpu=4000, memory=1, cpu_bounds=(0, 8000))
        events = node.do(
            RestartController(1, (vm_spec("a", (0, 1000, 8000), (0, 1, 20)),), at=at(1))
        )
        assert not any(isinstance(e, MigrationStarted) for e in events)
        assert node.state.cpu.buffer == 3000

    def test_empty_queue_stops_the_search(self) -> None:
        """With every pod migrating, more pressure starts nothing more."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.1))
        node.vm("a", cpu=2000, memory=1)
        events = node.ask("a", 9000, 1)
        assert [e.pod for e in events if isinstance(e, MigrationStarted)] == ["a"]
        assert node.ask("a", 2000, 1)[-1] == granted(node.ask("a", 2000, 1))

    def test_nothing_migrates_at_the_watermark_whatever_the_capacity_pressure(self) -> None:
        """Seed 04: migrations are picked only while reserved > watermark. A full node with a
        watermark of 1.0 and an unmet request has capacity pressure but starts nothing."""
        node = Node()
        node.vm("a", cpu=2000, memory=1)
        node.vm("b", cpu=8000, memory=1)
        events = node.ask("a", 4000, 1, load=0.1)
        assert granted(events).cpu_pressure == 2000
        assert not [e for e in events if isinstance(e, MigrationStarted)]
        assert not needs_migration(node.state)

    def test_memory_at_its_watermark_starts_nothing_either(self) -> None:
        """Memory is compared the same way: reserved equal to its watermark is no pressure."""
        node = Node()
        node.vm("a", cpu=1000, memory=2)
        node.vm("b", cpu=1000, memory=8)
        events = node.ask("a", 1000, 4, load=0.1)
        assert granted(events).memory_pressure == 2
        assert node.state.memory.reserved == node.state.memory.watermark
        assert not [e for e in events if isinstance(e, MigrationStarted)]
        assert not needs_migration(node.state)

    def test_capacity_pressure_counts_once_the_node_is_above_a_watermark(self) -> None:
        """Above the watermark, capacity pressure adds to the logical pressure to account for."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.vm("a", cpu=4000, memory=1)
        node.vm("b", cpu=2000, memory=1)
        # 1000 above the watermark, accounted for by b's migration ...
        node.record([MigrationStarted("b", 2000, 1, at())])
        assert not needs_migration(node.state)
        # ... until a wants 2000 more than it holds: 3000 to account for, 2000 are.
        node.record([ResourcesGranted("a", 6000, 1, 4000, 1, 2000, 0, UNIT, None, at())])
        assert needs_migration(node.state)


class TestMigrationStartingOnItsOwnRequest:
    """Seed 04 (``handleRequested`` with ``startingMigration``): a pod whose migration starts on
    its own request is granted no increase; what it asked beyond its reservation becomes
    capacity pressure, which its migration accounts for."""

    def test_the_increase_becomes_pressure(self) -> None:
        """Node reserved 7 of 10 CPUs, watermark 6: the pod asking 2 → 4 keeps 2, wants 2."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.6))
        node.vm("a", cpu=2000, memory=1)
        node.vm("b", cpu=5000, memory=1)
        events = node.ask("a", 4000, 1, load=0.1)
        permit = granted(events)
        assert (permit.cpu_milli, permit.cpu_pressure) == (2000, 2000)
        assert [e for e in events if isinstance(e, MigrationStarted)] == [
            MigrationStarted("a", 4000, 1, at(1))
        ]
        assert (node.state.cpu.reserved, node.state.cpu.capacity_pressure) == (7000, 2000)
        assert node.replayed() == node.state

    def test_a_decrease_in_the_same_request_is_granted(self) -> None:
        """Only increases are held back: a resource the pod lowers is lowered."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.6))
        node.vm("a", cpu=3000, memory=1)
        node.vm("b", cpu=5000, memory=1)
        events = node.ask("a", 2000, 3, load=0.1)
        permit = granted(events)
        assert (permit.cpu_milli, permit.memory_slots, permit.memory_pressure) == (2000, 1, 2)
        assert [e for e in events if isinstance(e, MigrationStarted)] == [
            MigrationStarted("a", 2000, 3, at(1))
        ]

    def test_another_pods_migration_leaves_the_increase_granted(self) -> None:
        """A request that starts some other pod's migration is granted as usual."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.6))
        node.vm("a", cpu=2000, memory=1)
        node.vm("b", cpu=4000, memory=1)
        node.ask("b", 4000, 1, load=0.1)
        events = node.ask("a", 3000, 1, load=0.5)
        assert granted(events).cpu_milli == 3000
        assert [e.pod for e in events if isinstance(e, MigrationStarted)] == ["b"]

    def test_an_increase_crossing_the_watermark_is_granted_and_its_migration_waits(
        self,
    ) -> None:
        """The seed decides on the node as the request finds it: below the watermark, the
        increase is granted. The pod, first in the queue, migrates on the next decision."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.vm("a", cpu=1000, memory=1)
        node.vm("b", cpu=4000, memory=1)
        first = node.ask("a", 3000, 1, load=0.1)
        assert granted(first).cpu_milli == 3000
        assert not [e for e in first if isinstance(e, MigrationStarted)]
        assert needs_migration(node.state)
        second = node.ask("a", 3000, 1, load=0.1)
        assert granted(second).cpu_milli == 3000
        assert [e.pod for e in second if isinstance(e, MigrationStarted)] == ["a"]
        assert not needs_migration(node.state)


class TestConfigChange:
    def test_raising_system_leaves_reserved_over_and_saturates(self) -> None:
        """After system grows, reserved may exceed total − system; increases become pressure."""
        node = Node()
        node.vm("a", cpu=4000, memory=4)
        node.vm("b", cpu=4000, memory=4)
        node.do(ChangeNodeConfig(replace(CONFIG, cpu_system_milli=4000), at=at(1)))
        assert node.state.cpu.reserved == 8000 > node.state.cpu.reservable == 6000
        assert node.state.cpu.remaining == 0
        assert node.state.vm_pods["a"].migrating
        permit = granted(node.ask("b", 5000, 4))
        assert (permit.cpu_milli, permit.cpu_pressure) == (4000, 1000)

    def test_lowering_the_watermark_starts_migrations_at_once(self) -> None:
        """A new watermark takes effect in the same decision."""
        node = Node()
        node.vm("a", cpu=4000, memory=1)
        events = node.do(ChangeNodeConfig(replace(CONFIG, cpu_watermark=0.2), at=at(1)))
        assert events[0] == NodeConfigChanged(replace(CONFIG, cpu_watermark=0.2), at(1))
        assert [e.pod for e in events if isinstance(e, MigrationStarted)] == ["a"]

    def test_slot_size_cannot_change(self) -> None:
        """Memory is counted in the node's slots, so their size is fixed."""
        with pytest.raises(InvalidCommand, match="fixed for a node's life"):
            Node().do(ChangeNodeConfig(replace(CONFIG, memory_slot_bytes=GIB // 2), at=at()))

    def test_same_config_is_a_no_op(self) -> None:
        """Re-sending the current settings records nothing."""
        assert Node().do(ChangeNodeConfig(CONFIG, at=at())) == []


def restarted(node: Node, *specs: VmPodSpec, rule: str = "log_bound") -> ControllerRestarted:
    events = node.do(RestartController(1, specs, rule, at=at(10)))  # type: ignore[arg-type]
    assert isinstance(events[0], ControllerRestarted)
    return events[0]


class TestRestart:
    def test_known_pod_is_held_at_its_last_logged_permit(self) -> None:
        """The bound is min(max, last permit), the buffer that bound minus the use."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(250, 8000), memory_bounds=(1, 16))
        node.ask("a", 3000, 4)
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)))
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (3000, 1000)
        assert (pod.memory.reserved, pod.memory.buffer) == (4, 2)
        assert (node.state.cpu.reserved, node.state.cpu.buffer) == (3000, 1000)

    def test_seed_rule_holds_the_max(self) -> None:
        """The seed's rule, for comparison, holds every VM pod at its max."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(250, 8000), memory_bounds=(1, 16))
        node.ask("a", 3000, 4)
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)), rule="assume_max")
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (8000, 6000)
        assert node.state.cpu.remaining == 2000

    def test_pod_the_log_never_saw_falls_back_to_max(self) -> None:
        """A pod created while no controller ran is held at its VM's max."""
        node = Node()
        event = restarted(node, vm_spec("new", (250, 1000, 4000), (1, 2, 8)))
        assert not event.bounds[0].known
        pod = node.state.vm_pods["new"]
        assert (pod.cpu.reserved, pod.cpu.buffer, pod.memory.reserved, pod.memory.buffer) == (
            4000,
            3000,
            8,
            6,
        )

    def test_a_use_above_the_permit_raises_the_bound(self) -> None:
        """Never hold less than the cluster shows in use."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(250, 8000))
        restarted(node, vm_spec("a", (250, 5000, 8000), (0, 1, 20)))
        assert node.state.vm_pods["a"].cpu.reserved == 5000

    def test_pod_missing_from_the_listing_keeps_its_logged_figures(self) -> None:
        """A known pod not in the listing is bounded by what the log knows of it."""
        node = Node()
        node.vm("a", cpu=2000, memory=2)
        restarted(node)
        assert (node.state.vm_pods["a"].cpu.reserved, node.state.cpu.buffer) == (2000, 0)

    def test_first_message_zeroes_the_buffer(self) -> None:
        """The agent's first request sets the real use and releases the buffer."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(250, 8000), memory_bounds=(1, 16))
        node.ask("a", 3000, 4)
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)))
        permit = granted(node.ask("a", 2000, 2))
        assert (permit.cpu_milli, permit.memory_slots) == (2000, 2)
        assert (node.state.cpu.buffer, node.state.memory.buffer) == (0, 0)
        assert (node.state.cpu.reserved, node.state.memory.reserved) == (2000, 2)

    def test_capacity_pressure_survives_a_restart(self) -> None:
        """An unmet request is still wanted after the restart."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        node.vm("b", cpu=8000, memory=1)
        node.ask("a", 4000, 1)
        restarted(node)
        assert node.state.cpu.capacity_pressure == 2000

    def test_same_incarnation_is_a_no_op_and_older_is_refused(self) -> None:
        """A retried takeover changes nothing; a deposed controller is told to stop."""
        node = Node()
        restarted(node)
        assert node.do(RestartController(1, at=at(11))) == []
        node.do(RestartController(3, at=at(12)))
        with pytest.raises(Rejected, match="deposed"):
            node.do(RestartController(2, at=at(13)))


class TestReplay:
    def test_rebuilding_from_the_events_gives_the_live_state(self) -> None:
        """Folding the recorded events from nothing reproduces the state."""
        node = pressured_node()
        node.ask("a", 1000, 1, load=1.0)
        node.ask("c", 4000, 1)
        node.do(ReservePod(vm_spec("d", (0, 500, 1000), (0, 1, 1)), at=at(2)))
        restarted(node, vm_spec("e", (0, 500, 1000), (0, 1, 2)))
        node.do(DeletePod("d", at=at(11)))
        assert node.replayed() == node.state

    def test_snapshot_restores_the_state_exactly(self) -> None:
        """A snapshot taken through JSON loads back equal, pods, pressure and buffers included."""
        node = pressured_node()
        node.ask("a", 1000, 1, load=1.5)
        node.ask("c", 4000, 1)
        restarted(node, vm_spec("e", (0, 500, 1000), (0, 1, 2)))
        node.do(
            ReservePod(
                OtherPodSpec(
                    name="o",
                    containers=(ContainerResources(cpu_limit_milli=10, memory_request_bytes=5),),
                ),
                at=at(11),
                already_running=True,
            )
        )
        data = json.loads(json.dumps(nodes.snapshot(node.state)))
        assert nodes.state_from_snapshot(data) == node.state
        assert nodes.state_from_snapshot(nodes.snapshot(initial_state())) == initial_state()

    def test_evolve_refuses_a_stranger(self) -> None:
        """Evolve only applies node events."""
        with pytest.raises(TypeError):
            evolve(initial_state(), object())  # type: ignore[arg-type]

    def test_unknown_pod_events_are_ignored(self) -> None:
        """Facts about a pod the node no longer holds change nothing."""
        node = Node()
        before = node.state
        node.record([PodDeleted("x", at()), MigrationStarted("x", 1, 1, at())])
        assert node.state == before


class TestDumpstate:
    def test_dump_carries_position_config_nodes_and_queue(self) -> None:
        """The dump names its log position, settings, nodes with resources and pods, and queue."""
        node = pressured_node(watermark=1.0)
        node.ask("a", 2000, 1, load=0.25)
        dump = nodes.dumpstate([node.state], position=42, settings={"protocol": 5})
        assert list(dump) == ["position", "config", "nodes", "migration_queue"]
        assert dump["position"] == 42
        assert dump["config"] == {
            "controller": {"protocol": 5},
            "nodes": {
                "n1": {
                    "cpu_system_milli": 0,
                    "memory_system_slots": 0,
                    "cpu_watermark": 1.0,
                    "memory_watermark": 1.0,
                    "compute_unit": {"cpu_milli": 250, "memory_slots": 1},
                    "memory_slot_bytes": GIB,
                }
            },
        }
        n1 = dump["nodes"]["n1"]  # type: ignore[index]
        assert n1["resources"]["cpu"]["reserved"] == 6000
        assert n1["pods"]["vm"]["a"]["load"] == 0.25
        assert dump["migration_queue"][0] == {  # type: ignore[index]
            "node": "n1",
            "pod": "a",
            "has_metrics": True,
            "load": 0.25,
            "node_needs_migration": False,
        }

    def test_dump_text_does_not_depend_on_arrival_order(self) -> None:
        """The same pods and nodes reached in another order dump to the same bytes."""
        one, two = Node(name="n1"), Node(name="n2")
        one.vm("a", cpu=1000, memory=1)
        one.vm("b", cpu=1000, memory=1)
        two.vm("c", cpu=1000, memory=1)
        other = Node(name="n1")
        other.vm("b", cpu=1000, memory=1)
        other.vm("a", cpu=1000, memory=1)
        first = json.dumps(nodes.dumpstate([one.state, two.state], position=7))
        second = json.dumps(nodes.dumpstate([two.state, other.state], position=7))
        assert first == second

    def test_live_and_replayed_dumps_are_identical(self) -> None:
        """A dump of the replayed log is byte-identical to the live one."""
        node = pressured_node()
        node.ask("c", 4000, 1, load=2.0)
        live = json.dumps(nodes.dumpstate([node.state], position=9))
        assert json.dumps(nodes.dumpstate([node.replayed()], position=9)) == live
