"""Node accounting invariants under random command sequences, and the stored form of its events."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.domain.codec import from_data, registered_event_types, to_data
from fleetledger.domain.errors import Rejected
from fleetledger.domain.nodes import (
    AgentResourcesRequest,
    Bounds,
    ChangeNodeConfig,
    ChangeVmLimits,
    ComputeUnit,
    ComputeUnitMismatch,
    ComputeUnitViolated,
    ContainerResources,
    ControllerRestarted,
    DeletePod,
    JoinNode,
    Limits,
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
    ReservedOtherPod,
    ReservePod,
    ReservePods,
    ResourcesGranted,
    RestartController,
    SetVmMigration,
    SetVmScaling,
    StartupBound,
    UpdateNodeCapacity,
    UpdateVmUse,
    VmLimitsChanged,
    VmMigrationChanged,
    VmPod,
    VmPodReserved,
    VmPodSpec,
    VmScalingChanged,
    VmUseChanged,
    decide,
    evolve,
    initial_state,
    needs_migration,
    other_reserved,
    snapshot,
    state_from_snapshot,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
SLOT = 1 << 30
CONFIG = NodeConfig(
    cpu_system_milli=1000,
    memory_system_slots=1,
    cpu_watermark=0.8,
    memory_watermark=0.8,
    compute_unit=ComputeUnit(250, 1),
    memory_slot_bytes=SLOT,
)
PODS = ("p0", "p1", "p2", "p3", "p4", "p5")


def _ints(value: object, where: str = "state") -> Iterator[tuple[str, int]]:
    """Every integer inside a state, with where it sits."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield where, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _ints(getattr(value, f.name), f"{where}.{f.name}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _ints(item, f"{where}[{key!r}]")


def _check_consistent(state: NodeState) -> None:
    """The node's figures are exactly the sums of its pods' (nothing was lost to saturation)."""
    other_cpu, other_memory = other_reserved(state)
    pods = list(state.vm_pods.values())
    assert state.cpu.reserved == sum(p.cpu.reserved for p in pods) + other_cpu
    assert state.memory.reserved == sum(p.memory.reserved for p in pods) + other_memory
    assert state.cpu.buffer == sum(p.cpu.buffer for p in pods)
    assert state.memory.buffer == sum(p.memory.buffer for p in pods)
    assert state.cpu.capacity_pressure == sum(p.cpu.capacity_pressure for p in pods)
    assert state.memory.capacity_pressure == sum(p.memory.capacity_pressure for p in pods)
    assert state.cpu.pressure_accounted_for == sum(p.cpu_accounted for p in pods if p.migrating)
    assert state.memory.pressure_accounted_for == sum(
        p.memory_accounted for p in pods if p.migrating
    )
    for pod in pods:
        assert pod.cpu.buffer <= pod.cpu.reserved
        assert pod.memory.buffer <= pod.memory.reserved
        if not pod.scaling_enabled:
            # A VM nobody scales holds exactly its use: nothing uncertain, nothing wanted.
            assert (pod.cpu.buffer, pod.memory.buffer, pod.awaiting_contact) == (0, 0, False)
            assert (pod.cpu.capacity_pressure, pod.memory.capacity_pressure) == (0, 0)


def _bounds(data: st.DataObject, top: int) -> Bounds:
    low = data.draw(st.integers(0, top // 4))
    high = data.draw(st.integers(low, top))
    return Bounds(low, data.draw(st.integers(low, high)), high)


def _other_spec(data: st.DataObject, pod: str) -> OtherPodSpec:
    containers = tuple(
        ContainerResources(
            cpu_request_milli=data.draw(st.integers(0, 1500)),
            memory_limit_bytes=data.draw(st.integers(0, 3 * SLOT)),
        )
        for _ in range(data.draw(st.integers(1, 3)))
    )
    return OtherPodSpec(name=pod, containers=containers)


def _vm_spec(data: st.DataObject, pod: str) -> VmPodSpec:
    mostly = st.sampled_from((True, True, True, False))
    return VmPodSpec(
        name=pod,
        cpu=_bounds(data, 8000),
        memory=_bounds(data, 16),
        scaling_enabled=data.draw(mostly),
        migration_enabled=data.draw(mostly),
    )


def _limits(data: st.DataObject, top: int) -> Limits:
    low = data.draw(st.integers(0, top // 4))
    return Limits(low, data.draw(st.integers(low, top)))


def _command(data: st.DataObject, state: NodeState, step: int) -> NodeCommand:
    at = T0 + timedelta(seconds=step)
    kind = data.draw(
        st.sampled_from(
            ("request",) * 6
            + ("vm", "vm", "other", "others", "delete", "config", "restart", "size")
            + ("limits", "scaling", "use", "migration")
        )
    )
    pod = data.draw(st.sampled_from(PODS))
    if kind == "limits":
        return ChangeVmLimits(pod, _limits(data, 8000), _limits(data, 16), at=at)
    if kind == "scaling":
        return SetVmScaling(pod, data.draw(st.booleans()), at=at)
    if kind == "migration":
        return SetVmMigration(pod, data.draw(st.booleans()), at=at)
    if kind == "use":
        cpu, memory = data.draw(st.integers(0, 8000)), data.draw(st.integers(0, 16))
        return UpdateVmUse(pod, cpu, memory, at=at)
    if kind == "request" and pod in state.vm_pods:
        vm = state.vm_pods[pod]
        fractional = data.draw(st.booleans())
        cpu = data.draw(st.integers(vm.cpu.min, vm.cpu.max))
        memory = data.draw(st.integers(vm.memory.min, vm.memory.max))
        if vm.migrating and data.draw(st.booleans()):
            cpu, memory = vm.cpu.reserved, vm.memory.reserved
        if not fractional and cpu % 1000 and cpu - cpu % 1000 >= vm.cpu.min:
            cpu -= cpu % 1000
        return AgentResourcesRequest(
            pod,
            cpu,
            memory,
            at=at,
            fractional_cpu=fractional or bool(cpu % 1000),
            load=data.draw(st.none() | st.floats(0, 8, allow_nan=False)),
        )
    if kind in ("vm", "request"):
        return ReservePod(_vm_spec(data, pod), at=at, already_running=data.draw(st.booleans()))
    if kind == "other":
        return ReservePod(_other_spec(data, pod), at=at)
    if kind == "others":
        names = data.draw(st.lists(st.sampled_from(PODS), unique=True, min_size=1, max_size=3))
        return ReservePods(tuple(_other_spec(data, name) for name in names), at=at)
    if kind == "delete":
        return DeletePod(pod, at=at)
    if kind == "config":
        config = replace(
            CONFIG,
            cpu_system_milli=data.draw(st.integers(0, 6000)),
            memory_system_slots=data.draw(st.integers(0, 8)),
            cpu_watermark=data.draw(st.sampled_from((0.0, 0.5, 0.9, 1.0))),
            memory_watermark=data.draw(st.sampled_from((0.5, 0.8, 1.0))),
            compute_unit=ComputeUnit(
                data.draw(st.sampled_from((250, 500, 1000))), data.draw(st.sampled_from((1, 2)))
            ),
        )
        return ChangeNodeConfig(config, at=at)
    if kind == "size":
        return UpdateNodeCapacity(
            data.draw(st.integers(4000, 16_000)), data.draw(st.integers(4, 24)) * SLOT, 0, at=at
        )
    listed = tuple(
        _vm_spec(data, name)
        for name in data.draw(st.lists(st.sampled_from(PODS), unique=True, max_size=3))
        if name not in state.other_pods
    )
    rule = data.draw(st.sampled_from(("log_bound", "assume_max")))
    return RestartController(state.incarnation + 1, listed, rule, at=at)  # type: ignore[arg-type]


def _check_request(
    state: NodeState, command: AgentResourcesRequest, events: list[NodeEvent]
) -> None:
    """What one agent request decided, against the seed's rules for it."""
    pod = state.vm_pods[command.pod]
    [grant] = [e for e in events if isinstance(e, ResourcesGranted)]
    if any(isinstance(e, MigrationStarted) and e.pod == pod.name for e in events):
        # No increase on the request that starts the pod's own migration: the rest is pressure.
        for permit, pressure, asked, held in (
            (grant.cpu_milli, grant.cpu_pressure, command.cpu_milli, pod.cpu.reserved),
            (grant.memory_slots, grant.memory_pressure, command.memory_slots, pod.memory.reserved),
        ):
            assert (permit, permit + pressure) == (min(asked, held), asked)
    warned = [e for e in events if isinstance(e, ComputeUnitMismatch)]
    if _on_unit(pod, command):
        assert warned == []
    else:
        assert [(e.cpu_milli, e.memory_slots, e.compute_unit) for e in warned] == [
            (command.cpu_milli, command.memory_slots, pod.last_compute_unit)
        ]


def _on_unit(pod: VmPod, command: AgentResourcesRequest) -> bool:
    """The unit rule, stated plainly: no unit sent yet, a resource at a bound, or n units each."""
    unit = pod.last_compute_unit
    if unit is None:
        return True
    cpu, memory = command.cpu_milli, command.memory_slots
    if cpu in (pod.cpu.min, pod.cpu.max) or memory in (pod.memory.min, pod.memory.max):
        return True
    return any((cpu, memory) == (n * unit.cpu_milli, n * unit.memory_slots) for n in range(0, 65))


class TestInvariants:
    @settings(max_examples=100, deadline=None)
    @given(st.data())
    def test_random_traffic_keeps_every_invariant(self, data: st.DataObject) -> None:
        """No negative value, no grant past total − system, no increase for a pod starting its
        migration, no migration at or below the watermarks or of a pod that may not migrate,
        the unit rule, sums agree; replay, snapshot agree."""
        state = initial_state()
        log: list[NodeEvent] = []
        for event in decide(state, JoinNode("n", 10_000, 16 * SLOT, 0, CONFIG, at=T0)):
            log.append(event)
            state = evolve(state, event)
        for step in range(1, data.draw(st.integers(1, 40)) + 1):
            command = _command(data, state, step)
            try:
                events = decide(state, command)
            except Rejected:
                continue
            if isinstance(command, AgentResourcesRequest):
                _check_request(state, command, events)
            for event in events:
                before = state
                log.append(event)
                state = evolve(state, event)
                if isinstance(event, ResourcesGranted):
                    pod = before.vm_pods[event.pod]
                    if event.cpu_milli > pod.cpu.reserved:
                        assert state.cpu.reserved <= state.cpu.total - state.cpu.system
                    if event.memory_slots > pod.memory.reserved:
                        assert state.memory.reserved <= state.memory.total - state.memory.system
                if isinstance(event, MigrationStarted):
                    # Seed 04: targets are picked only while some reserved > its watermark,
                    # and only among pods whose VM may migrate.
                    assert before.cpu.above_watermark or before.memory.above_watermark
                    assert before.vm_pods[event.pod].migration_enabled
                    assert needs_migration(before)
            negative = [(where, v) for where, v in _ints(state) if v < 0]
            assert negative == []
            _check_consistent(state)
        rebuilt = initial_state()
        for event in log:
            rebuilt = evolve(rebuilt, event)
        assert rebuilt == state
        assert state_from_snapshot(json.loads(json.dumps(snapshot(state)))) == state

    @settings(max_examples=50, deadline=None)
    @given(st.data())
    def test_buffers_reach_zero_once_every_agent_has_spoken(self, data: st.DataObject) -> None:
        """After a restart, one request from each VM pod leaves no buffer on the node."""
        state = initial_state()
        for event in decide(state, JoinNode("n", 64_000, 128 * SLOT, 0, CONFIG, at=T0)):
            state = evolve(state, event)
        specs = []
        for name in PODS:
            spec = VmPodSpec(name=name, cpu=_bounds(data, 8000), memory=_bounds(data, 16))
            specs.append(spec)
            for event in decide(state, ReservePod(spec, at=T0, already_running=True)):
                state = evolve(state, event)
        rule = data.draw(st.sampled_from(("log_bound", "assume_max")))
        restart = RestartController(1, tuple(specs), rule, at=T0)  # type: ignore[arg-type]
        for event in decide(state, restart):
            state = evolve(state, event)
        for spec in specs:
            ask = AgentResourcesRequest(spec.name, spec.cpu.use, spec.memory.use, at=T0)
            for event in decide(state, ask):
                state = evolve(state, event)
        assert (state.cpu.buffer, state.memory.buffer) == (0, 0)
        assert state.cpu.reserved - state.cpu.buffer <= state.cpu.total - state.cpu.system

    @settings(max_examples=50, deadline=None)
    @given(st.data())
    def test_log_bound_never_holds_more_than_assume_max(self, data: st.DataObject) -> None:
        """For the same node and listing, our bound holds at most what the seed's rule does."""
        state = initial_state()
        for event in decide(state, JoinNode("n", 64_000, 128 * SLOT, 0, CONFIG, at=T0)):
            state = evolve(state, event)
        listed = []
        for name in PODS:
            spec = VmPodSpec(name=name, cpu=_bounds(data, 8000), memory=_bounds(data, 16))
            if data.draw(st.booleans()):
                for event in decide(state, ReservePod(spec, at=T0, already_running=True)):
                    state = evolve(state, event)
            cpu = data.draw(st.integers(spec.cpu.min, spec.cpu.max))
            listed.append(replace(spec, cpu=Bounds(spec.cpu.min, cpu, spec.cpu.max)))
        held = {}
        for rule in ("log_bound", "assume_max"):
            restart = RestartController(1, tuple(listed), rule, at=T0)
            after = state
            for event in decide(state, restart):
                after = evolve(after, event)
            held[rule] = (after.cpu.reserved, after.cpu.buffer, after.memory.buffer)
        assert all(a <= b for a, b in zip(held["log_bound"], held["assume_max"], strict=True))


class TestBatchReserve:
    @settings(max_examples=100, deadline=None)
    @given(st.data())
    def test_a_batch_reserve_equals_the_same_reserves_one_by_one(self, data: st.DataObject) -> None:
        """On any reachable node, ReservePods leaves the state ReservePod for each pod in turn
        leaves, in one event, or refuses with the reason the first refused ReservePod gives —
        except that its pods are held (a placement's reservations, which cluster sync keeps)."""
        state = initial_state()
        for event in decide(state, JoinNode("n", 10_000, 16 * SLOT, 1, CONFIG, at=T0)):
            state = evolve(state, event)
        for step in range(1, data.draw(st.integers(0, 15)) + 1):
            try:
                for event in decide(state, _command(data, state, step)):
                    state = evolve(state, event)
            except Rejected:
                continue
        names = data.draw(st.lists(st.sampled_from(PODS), unique=True, min_size=1, max_size=6))
        specs = tuple(_other_spec(data, name) for name in names)
        at = T0 + timedelta(hours=1)
        one_by_one: NodeState | str = state
        for spec in specs:
            assert isinstance(one_by_one, NodeState)
            try:
                for event in decide(one_by_one, ReservePod(spec, at=at)):
                    one_by_one = evolve(one_by_one, event)
            except Rejected as e:
                one_by_one = e.reason
                break
        try:
            events = decide(state, ReservePods(specs, at=at))
        except Rejected as e:
            assert e.reason == one_by_one
            return
        assert sum(isinstance(e, OtherPodsReserved) for e in events) <= 1
        batched = state
        for event in events:
            batched = evolve(batched, event)
        assert isinstance(one_by_one, NodeState)
        # A pod the node already held is skipped; the others are reserved as held.
        fresh = {n for n in names if n not in state.other_pods and n not in state.vm_pods}
        assert all(batched.other_pods[name].held for name in fresh)
        assert batched == replace(
            one_by_one,
            other_pods={
                name: replace(pod, held=name in fresh or pod.held)
                for name, pod in one_by_one.other_pods.items()
            },
        )


BOUNDS = Bounds(250, 1000, 4000)
SAMPLES: list[NodeEvent] = [
    NodeJoined("n1", 16_000, 64, 2, CONFIG, T0),
    NodeCapacityChanged(8000, 32, 0, T0),
    NodeLeft(T0),
    NodeConfigChanged(replace(CONFIG, cpu_watermark=0.5), T0),
    VmPodReserved("a", BOUNDS, Bounds(1, 2, 8), 1, 1000, 2, False, T0),
    OtherPodReserved("o", 1500, 3 * SLOT + 1, 0, True, T0),
    OtherPodsReserved(
        (ReservedOtherPod("o1", 1500, 3 * SLOT + 1, 0), ReservedOtherPod("o2", 250, SLOT, 1)), T0
    ),
    PodDeleted("a", T0),
    ResourcesGranted("a", 3000, 4, 2000, 4, 1000, 0, ComputeUnit(250, 1), 0.75, T0),
    ResourcesGranted("a", 3000, 4, 3000, 4, 0, 0, ComputeUnit(250, 1), None, T0),
    VmPodReserved("a", BOUNDS, Bounds(1, 2, 8), 0, 1000, 2, True, T0, False, False),
    ComputeUnitViolated("a", "memory", 3, 2, T0),
    ComputeUnitMismatch("a", 1000, 3, ComputeUnit(250, 1), T0),
    MigrationStarted("a", 3000, 4, T0),
    VmLimitsChanged("a", Limits(250, 6000), Limits(1, 12), 6000, 5000, 0, 4, 2, 1, T0),
    VmScalingChanged("a", False, 1000, 2, T0),
    VmUseChanged("a", 1500, 3, T0),
    VmMigrationChanged("a", False, T0),
    ControllerRestarted(
        2,
        "log_bound",
        (
            StartupBound(
                pod="a",
                cpu=BOUNDS,
                memory=Bounds(1, 2, 8),
                gpu=0,
                cpu_reserved=2000,
                cpu_buffer=1000,
                memory_reserved=4,
                memory_buffer=2,
                known=True,
            ),
        ),
        T0,
    ),
]


class TestStoredForm:
    def test_names_are_pinned(self) -> None:
        """Every node event is registered under its pinned name, version 1."""
        registered = {
            name: t.schema_version
            for name, t in registered_event_types().items()
            if name.startswith("nodes.")
        }
        assert registered == {f"nodes.{type(e).__name__}": 1 for e in SAMPLES}

    def test_events_stored_before_the_vm_settings_still_load(self) -> None:
        """A VM pod reserved, or bounded by a restart, before VMs had settings loads with
        scaling and migration enabled, as every VM pod then was."""
        reserved = {
            "pod": "a",
            "cpu": {"min": 250, "use": 1000, "max": 4000},
            "memory": {"min": 1, "use": 2, "max": 8},
            "gpu": 0,
            "cpu_reserved": 1000,
            "memory_reserved": 2,
            "already_running": False,
            "at": T0.isoformat(),
        }
        event = from_data("nodes.VmPodReserved", 1, reserved)
        assert isinstance(event, VmPodReserved)
        assert (event.scaling_enabled, event.migration_enabled) == (True, True)
        bound = {k: v for k, v in reserved.items() if k in ("pod", "cpu", "memory", "gpu")} | {
            "cpu_reserved": 2000,
            "cpu_buffer": 1000,
            "memory_reserved": 4,
            "memory_buffer": 2,
            "known": True,
        }
        restarted = from_data(
            "nodes.ControllerRestarted",
            1,
            {"incarnation": 2, "rule": "log_bound", "bounds": [bound], "at": T0.isoformat()},
        )
        assert isinstance(restarted, ControllerRestarted)
        assert restarted.bounds[0].scaling_enabled and restarted.bounds[0].migration_enabled

    @pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
    def test_round_trip_through_json(self, event: NodeEvent) -> None:
        """Each event comes back equal from its JSON form."""
        name, version, data = to_data(event)
        assert from_data(name, version, json.loads(json.dumps(data))) == event
