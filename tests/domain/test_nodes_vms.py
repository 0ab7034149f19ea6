"""Per-VM settings of node accounting: scaling disabled, bounds changing at run time, and the
migration switch (seed 04's ``VmConfig`` and limits update)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fleetledger.domain import nodes
from fleetledger.domain.errors import InvalidCommand, Rejected
from fleetledger.domain.nodes import (
    ChangeVmLimits,
    Limits,
    MigrationStarted,
    ReservePod,
    ScalingDisabled,
    SetVmMigration,
    SetVmScaling,
    UnknownPod,
    UpdateVmUse,
    VmLimitsChanged,
    VmMigrationChanged,
    VmPodReserved,
    VmScalingChanged,
    VmUseChanged,
    migration_queue,
    needs_migration,
)

from .test_nodes import CONFIG, Node, at, granted, restarted, vm_spec


def fixed(name: str, cpu: int, memory: int, *, migration: bool = True) -> nodes.VmPodSpec:
    """A VM pod whose scaling is disabled, using ``cpu``/``memory`` within wide bounds."""
    return replace(
        vm_spec(name, (0, cpu, 8000), (0, memory, 16)),
        scaling_enabled=False,
        migration_enabled=migration,
    )


def _check_sums(node: Node) -> None:
    pods = node.state.vm_pods.values()
    assert node.state.cpu.reserved == sum(p.cpu.reserved for p in pods)
    assert node.state.cpu.buffer == sum(p.cpu.buffer for p in pods)
    assert node.state.cpu.capacity_pressure == sum(p.cpu.capacity_pressure for p in pods)
    assert node.state.memory.reserved == sum(p.memory.reserved for p in pods)
    assert node.state.memory.buffer == sum(p.memory.buffer for p in pods)
    assert node.replayed() == node.state


class TestScalingDisabled:
    def test_a_vm_without_scaling_holds_its_use(self) -> None:
        """Reserved is the VM's use, with no buffer, and the pod says it does not scale."""
        node = Node()
        events = node.do(ReservePod(fixed("a", 2000, 3), at=at()))
        assert isinstance(events[0], VmPodReserved) and not events[0].scaling_enabled
        pod = node.state.vm_pods["a"]
        assert not pod.scaling_enabled
        assert (pod.cpu.reserved, pod.cpu.buffer, pod.memory.reserved) == (2000, 0, 3)

    def test_its_agent_is_refused(self) -> None:
        """A VM that does not scale has no permits to ask for."""
        node = Node()
        node.do(ReservePod(fixed("a", 2000, 3), at=at()))
        with pytest.raises(ScalingDisabled, match="scaling is disabled"):
            node.ask("a", 3000, 3)

    def test_a_restart_holds_it_at_its_use_under_either_rule(self) -> None:
        """Seed 04: with scaling disabled the use is known exactly, so a restart holds no
        buffer for it, even under the seed's assume-max rule."""
        for rule in ("log_bound", "assume_max"):
            node = Node()
            node.do(ReservePod(vm_spec("known", (0, 1000, 8000), (0, 1, 16)), at=at()))
            restarted(
                node,
                fixed("known", 1500, 2),
                fixed("new", 1000, 1),
                rule=rule,
            )
            for name, use in (("known", 1500), ("new", 1000)):
                pod = node.state.vm_pods[name]
                assert (pod.cpu.reserved, pod.cpu.buffer) == (use, 0), (rule, name)
                assert not pod.awaiting_contact
            assert node.state.cpu.buffer == 0
            _check_sums(node)

    def test_disabling_scaling_drops_buffer_and_pressure(self) -> None:
        """Seed 04 (``handleAutoscalingDisabled``): reserved falls to the use, buffer and
        capacity pressure go."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(0, 8000))
        node.vm("b", cpu=8000, memory=1)
        node.ask("a", 4000, 1)
        restarted(node, vm_spec("a", (0, 1000, 8000), (0, 1, 20)))
        assert node.state.vm_pods["a"].cpu.buffer == 1000
        assert node.state.cpu.capacity_pressure == 2000
        events = node.do(SetVmScaling("a", False, at=at(20)))
        assert events == [VmScalingChanged("a", False, 1000, 1, at(20))]
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer, pod.cpu.capacity_pressure) == (1000, 0, 0)
        assert not pod.awaiting_contact
        _check_sums(node)

    def test_enabling_scaling_lets_its_agent_ask(self) -> None:
        """Once scaling is enabled again, the agent's requests are answered."""
        node = Node()
        node.do(ReservePod(fixed("a", 2000, 3), at=at()))
        assert node.do(SetVmScaling("a", True, at=at(1))) == [
            VmScalingChanged("a", True, 2000, 3, at(1))
        ]
        assert granted(node.ask("a", 3000, 3)).cpu_milli == 3000
        assert node.do(SetVmScaling("a", True, at=at(2))) == []

    def test_its_use_follows_the_vm_even_past_capacity(self) -> None:
        """Seed 04 (non-autoscaling usage change): a VM resized by hand holds its new use; it
        is a fact, counted even where it does not fit, and may start migrations."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.8))
        node.do(ReservePod(fixed("a", 2000, 1), at=at()))
        node.do(ReservePod(vm_spec("b", (0, 6000, 8000), (0, 1, 16)), at=at()))
        events = node.do(UpdateVmUse("a", 6000, 2, at=at(1)))
        assert events[0] == VmUseChanged("a", 6000, 2, at(1))
        assert node.state.cpu.reserved == 12_000
        assert [e.pod for e in events if isinstance(e, MigrationStarted)] == ["a"]
        _check_sums(node)

    def test_the_use_of_a_scaling_vm_is_its_agents_to_report(self) -> None:
        """A VM that scales changes its reservation through its agent, not through its use."""
        node = Node()
        node.vm("a", cpu=1000, memory=1)
        with pytest.raises(Rejected, match="agent"):
            node.do(UpdateVmUse("a", 2000, 1, at=at()))


def in_contact(node: Node, *, cpu: int = 3000, memory: int = 4) -> None:
    node.vm("a", cpu=1000, memory=1, cpu_bounds=(250, 8000), memory_bounds=(1, 16))
    node.ask("a", cpu, memory)


class TestLimits:
    def test_new_bounds_bind_the_next_request(self) -> None:
        """After the change the pod's min and max are the new ones."""
        node = Node()
        in_contact(node)
        events = node.do(ChangeVmLimits("a", Limits(500, 4000), Limits(2, 8), at=at(2)))
        assert isinstance(events[0], VmLimitsChanged)
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.min, pod.cpu.max, pod.memory.min, pod.memory.max) == (500, 4000, 2, 8)
        with pytest.raises(InvalidCommand, match=r"outside its VM's bounds \[500, 4000\]"):
            node.ask("a", 5000, 4)

    def test_in_contact_the_reservation_is_kept(self) -> None:
        """With the agent in contact, a lower max changes nothing held: the VM still uses its
        permit until its agent scales down and says so."""
        node = Node()
        in_contact(node)
        node.do(ChangeVmLimits("a", Limits(250, 2000), Limits(1, 16), at=at(2)))
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (3000, 0)
        assert granted(node.ask("a", 2000, 4)).cpu_milli == 2000
        _check_sums(node)

    def test_pressure_beyond_the_new_max_is_dropped(self) -> None:
        """An unmet increase past the new max can never be granted: it is no pressure."""
        node = Node()
        node.vm("a", cpu=1000, memory=1, cpu_bounds=(0, 8000))
        node.vm("b", cpu=8000, memory=1)
        node.ask("a", 6000, 1)
        assert node.state.vm_pods["a"].cpu.capacity_pressure == 4000
        node.do(ChangeVmLimits("a", Limits(0, 3000), Limits(0, 20), at=at(2)))
        assert node.state.vm_pods["a"].cpu.capacity_pressure == 1000
        assert node.state.cpu.capacity_pressure == 1000
        _check_sums(node)

    def test_before_contact_a_lower_max_lowers_the_bound_not_below_the_use(self) -> None:
        """Seed 04 (limits update, no contact yet): reserved = max(new max, use)."""
        node = Node()
        in_contact(node)
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)), rule="assume_max")
        node.do(ChangeVmLimits("a", Limits(250, 5000), Limits(1, 16), at=at(11)))
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (5000, 3000)
        node.do(ChangeVmLimits("a", Limits(250, 1000), Limits(1, 16), at=at(12)))
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (2000, 0)
        _check_sums(node)

    def test_before_contact_a_higher_max_raises_a_bound_held_at_the_max(self) -> None:
        """A pod held at its max may scale to the new one before it is heard from."""
        node = Node(cpu=20_000)
        in_contact(node)
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)), rule="assume_max")
        node.do(ChangeVmLimits("a", Limits(250, 12_000), Limits(1, 16), at=at(11)))
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (12_000, 10_000)
        _check_sums(node)

    def test_before_contact_a_logged_permit_below_the_max_still_bounds(self) -> None:
        """Under the log-bound rule the last permit, below both maxes, still bounds the pod."""
        node = Node()
        in_contact(node)
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)))
        node.do(ChangeVmLimits("a", Limits(250, 9000), Limits(1, 16), at=at(11)))
        pod = node.state.vm_pods["a"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (3000, 1000)
        assert pod.awaiting_contact
        node.ask("a", 2000, 2)
        assert not node.state.vm_pods["a"].awaiting_contact

    def test_a_raised_bound_holds_its_room_from_other_pods(self) -> None:
        """A bound raised before contact is capacity no other pod is granted."""
        node = Node()
        in_contact(node, cpu=8000)
        node.vm("b", cpu=1000, memory=1, cpu_bounds=(0, 2000))
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)))
        assert node.state.cpu.reserved == 9000
        node.do(ChangeVmLimits("a", Limits(250, 9000), Limits(1, 16), at=at(11)))
        assert node.state.cpu.reserved == 10_000
        permit = granted(node.ask("b", 2000, 1))
        assert (permit.cpu_milli, permit.cpu_pressure) == (1000, 1000)

    @pytest.mark.parametrize(
        ("cpu", "memory", "message"),
        [
            (Limits(3000, 2000), Limits(1, 16), "min ≤ max"),
            (Limits(-1, 2000), Limits(1, 16), "min ≤ max"),
            (Limits(0, 2000), (1, 16), "Limits"),
        ],
    )
    def test_bad_limits_are_invalid(self, cpu: Limits, memory: object, message: str) -> None:
        """Limits need 0 ≤ min ≤ max, in integers."""
        node = Node()
        in_contact(node)
        with pytest.raises(InvalidCommand, match=message):
            node.do(ChangeVmLimits("a", cpu, memory, at=at(2)))  # type: ignore[arg-type]

    def test_unchanged_limits_and_unknown_pods(self) -> None:
        """The same limits record nothing; a pod the node does not hold is UnknownPod."""
        node = Node()
        in_contact(node)
        assert node.do(ChangeVmLimits("a", Limits(250, 8000), Limits(1, 16), at=at(2))) == []
        with pytest.raises(UnknownPod):
            node.do(ChangeVmLimits("x", Limits(250, 8000), Limits(1, 16), at=at(2)))


class TestMigrationSwitch:
    def test_a_vm_that_may_not_migrate_is_never_picked(self) -> None:
        """Pressure starts the migration of the next pod that may migrate, never that one."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.do(ReservePod(fixed("a", 4000, 1, migration=False), at=at()))
        events = node.do(ReservePod(vm_spec("b", (0, 2000, 4000), (0, 1, 4)), at=at()))
        assert [e.pod for e in events if isinstance(e, MigrationStarted)] == ["b"]
        assert [p.name for p in migration_queue(node.state)] == []

    def test_its_own_increase_is_granted(self) -> None:
        """A pod that cannot migrate is never starting a migration, so it keeps its increase."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.6))
        for name, cpu in (("a", 2000), ("b", 5000)):
            spec = replace(vm_spec(name, (0, cpu, 8000), (0, 1, 16)), migration_enabled=False)
            node.do(ReservePod(spec, at=at()))
        events = node.ask("a", 4000, 1, load=0.1)
        assert granted(events).cpu_milli == 4000
        assert not [e for e in events if isinstance(e, MigrationStarted)]
        assert needs_migration(node.state)

    def test_switching_it_off_and_on(self) -> None:
        """Off takes the pod out of the queue; on puts it back and, with pressure unaccounted,
        starts its migration in the same decision."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.vm("a", cpu=2000, memory=1)
        assert node.do(SetVmMigration("a", False, at=at(1))) == [
            VmMigrationChanged("a", False, at(1))
        ]
        assert migration_queue(node.state) == ()
        node.do(ReservePod(fixed("b", 4000, 1, migration=False), at=at(2)))
        assert needs_migration(node.state)
        events = node.do(SetVmMigration("a", True, at=at(3)))
        assert events == [
            VmMigrationChanged("a", True, at(3)),
            MigrationStarted("a", 2000, 1, at(3)),
        ]
        assert node.do(SetVmMigration("a", True, at=at(4))) == []

    def test_switching_it_off_leaves_a_started_migration(self) -> None:
        """A migration already started is not called back; the pod stays migrating."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        node.vm("a", cpu=6000, memory=1)
        node.do(ReservePod(vm_spec("b", (0, 100, 100), (0, 1, 1)), at=at()))
        assert node.state.vm_pods["a"].migrating
        node.do(SetVmMigration("a", False, at=at(1)))
        assert node.state.vm_pods["a"].migrating
        assert not node.state.vm_pods["a"].migration_enabled


class TestShownAndStored:
    def test_dumpstate_shows_each_pods_settings(self) -> None:
        """Each VM pod's dump says whether it scales, may migrate, and awaits its agent."""
        node = Node()
        node.do(ReservePod(fixed("a", 2000, 1, migration=False), at=at()))
        node.vm("b", cpu=1000, memory=1)
        restarted(node)
        dumped = nodes.dumpstate([node.state], position=1)["nodes"]["n1"]["pods"]["vm"]  # type: ignore[index]
        assert {k: dumped["a"][k] for k in ("scaling_enabled", "migration_enabled")} == {
            "scaling_enabled": False,
            "migration_enabled": False,
        }
        assert (dumped["a"]["awaiting_contact"], dumped["b"]["awaiting_contact"]) == (False, True)

    def test_replay_and_snapshot_keep_every_setting(self) -> None:
        """The log and a snapshot both give back the settings and the limits."""
        node = Node(config=replace(CONFIG, cpu_watermark=0.5))
        in_contact(node)
        node.do(ReservePod(fixed("f", 1000, 1, migration=False), at=at(1)))
        restarted(node, vm_spec("a", (250, 2000, 8000), (1, 2, 16)))
        node.do(ChangeVmLimits("a", Limits(500, 6000), Limits(1, 12), at=at(11)))
        node.do(UpdateVmUse("f", 1500, 2, at=at(12)))
        node.do(SetVmScaling("f", True, at=at(13)))
        node.do(SetVmMigration("a", False, at=at(14)))
        assert node.replayed() == node.state
        data = json.loads(json.dumps(nodes.snapshot(node.state)))
        assert nodes.state_from_snapshot(data) == node.state
