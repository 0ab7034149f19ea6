"""NodesRuntime: restarts under the log-bound rule, leadership, migrations, the read model."""

from __future__ import annotations

import gc

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster
from fleetledger.adapters.nodes import (
    FakeMigrations,
    NodeService,
    NodesRuntime,
    RuntimeStopped,
    migration_reactor,
)
from fleetledger.adapters.runtime import Shard
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.adapters.runtime.reactors import Reactors
from fleetledger.domain.nodes import StartupRule
from fleetledger.eventstore import EventStore, RecordedEvent
from fleetledger.projections.nodes import NodesProjection, dump_json, dumpstate_at
from tests.counting_store import CountingStore

from .support import CONFIG, EPOCH, cluster, manual_runtime, node, vm_pod


def _restarted(
    store: EventStore, fleet: FakeCluster, *, rule: StartupRule = "log_bound"
) -> NodesRuntime:
    return NodesRuntime(
        store, fleet, clock=ManualClock(EPOCH), config=CONFIG, threads=False, rule=rule
    ).start()


class TestRestart:
    def test_a_pod_not_yet_heard_from_holds_its_last_logged_permit(
        self, postgres_store: EventStore
    ) -> None:
        """After a restart a VM pod holds its last permit (not its max), the rest as buffer."""
        fleet = cluster(node("n1"), pods=(vm_pod("vm", "n1", cpu=(1000, 1000, 8000)),))
        first = manual_runtime(postgres_store, fleet)
        first.service.request_resources("vm", cpu_milli=3000, memory_slots=2)
        first.stop()
        second = _restarted(postgres_store, fleet)
        pod = second.service.stream("n1").state.vm_pods["vm"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (3000, 2000)
        assert second.service.stream("n1").state.incarnation == 2

    def test_the_seed_rule_holds_the_max_instead(self, postgres_store: EventStore) -> None:
        """With rule="assume_max" the same restart holds the VM's max, as the seed does."""
        fleet = cluster(node("n1"), pods=(vm_pod("vm", "n1", cpu=(1000, 1000, 8000)),))
        first = manual_runtime(postgres_store, fleet)
        first.service.request_resources("vm", cpu_milli=3000, memory_slots=2)
        first.stop()
        second = _restarted(postgres_store, fleet, rule="assume_max")
        assert second.service.stream("n1").state.vm_pods["vm"].cpu.reserved == 8000

    def test_the_first_request_after_a_restart_clears_the_buffer(
        self, postgres_store: EventStore
    ) -> None:
        """The agent's first message sets the real use: the node's buffer drops to zero."""
        fleet = cluster(node("n1"), pods=(vm_pod("vm", "n1", cpu=(1000, 1000, 8000)),))
        first = manual_runtime(postgres_store, fleet)
        first.service.request_resources("vm", cpu_milli=3000, memory_slots=2)
        first.stop()
        second = _restarted(postgres_store, fleet)
        second.service.request_resources("vm", cpu_milli=2000, memory_slots=2)
        state = second.service.stream("n1").state
        assert (state.cpu.buffer, state.vm_pods["vm"].cpu.reserved) == (0, 2000)

    def test_a_pod_the_log_never_saw_is_held_at_its_max(self, postgres_store: EventStore) -> None:
        """A VM pod that appeared while no controller ran is held at its VM's max."""
        fleet = cluster(node("n1"))
        manual_runtime(postgres_store, fleet).stop()
        fleet.create_pod(vm_pod("late", "n1", cpu=(1000, 1000, 6000)))
        second = _restarted(postgres_store, fleet)
        pod = second.service.stream("n1").state.vm_pods["late"]
        assert (pod.cpu.reserved, pod.cpu.buffer) == (6000, 5000)

    def test_restarting_twice_in_one_incarnation_appends_nothing(
        self, postgres_store: EventStore
    ) -> None:
        """Taking nodes over again for the same incarnation is a no-op."""
        runtime = manual_runtime(postgres_store, cluster(node("n1"), pods=(vm_pod("v", "n1"),)))
        head = postgres_store.head()
        report = runtime.sync.restart(1)
        assert (postgres_store.head(), report.nodes_restarted) == (head, 0)

    def test_the_leader_term_is_the_incarnation(self, postgres_store: EventStore) -> None:
        """With a leadership, the runtime takes nodes over as its term once elected."""
        clock = ManualClock(EPOCH)
        board: dict[str, str] = {}
        leadership = Leadership(
            postgres_store, MemoryLease(board, holder="a"), clock=clock, holder="a"
        )
        runtime = NodesRuntime(
            postgres_store,
            cluster(node("n1")),
            clock=clock,
            config=CONFIG,
            threads=False,
            leadership=leadership,
        ).start()
        assert runtime.leading
        term = leadership.term()
        assert term is not None
        assert runtime.service.stream("n1").state.incarnation == term
        runtime.stop()


class TestReadModel:
    def test_rebuilt_from_the_log_equals_the_live_states(self, postgres_store: EventStore) -> None:
        """Folding the log from position 0 gives the states the streams hold live."""
        fleet = cluster(
            node("n1"), node("n2"), pods=(vm_pod("a", "n1"), vm_pod("b", "n2"), vm_pod("c", "n2"))
        )
        runtime = manual_runtime(postgres_store, fleet, snapshot_every=3)
        for cpu in (3000, 1000, 4000, 2000):
            runtime.service.request_resources("a", cpu_milli=cpu, memory_slots=2)
            runtime.service.request_resources("c", cpu_milli=cpu, memory_slots=3)
        fleet.delete_pod("b")
        runtime.step()
        rebuilt = NodesProjection()
        rebuilt.catch_up(postgres_store)
        assert rebuilt.states() == runtime.service.hosted()
        reloaded = _restarted(postgres_store, fleet)
        live = {name: state for name, state in reloaded.service.hosted().items()}
        folded = NodesProjection()
        folded.catch_up(postgres_store)
        assert folded.states() == live


class TestDump:
    def test_a_dump_after_changes_equals_a_replay(self, store: EventStore) -> None:
        """The live dump redoes only changed nodes, and is still what a replay of the log to
        the same position gives, byte for byte."""
        fleet = cluster(node("n1"), node("n2"), pods=(vm_pod("a", "n1"), vm_pod("b", "n2")))
        runtime = manual_runtime(store, fleet)
        first = runtime.dump()
        runtime.service.request_resources("a", cpu_milli=3000, memory_slots=2)
        second = runtime.dump()
        assert first["nodes"] != second["nodes"]
        for dump in (first, second):
            position = dump["position"]
            assert isinstance(position, int)
            assert dump_json(dump) == dump_json(dumpstate_at(store, position))


class TestStart:
    def test_the_node_streams_start_from_the_read_model(self, store: EventStore) -> None:
        """A restarted process reads the log once: no node stream is read back, and each is
        hosted with the state and version its own load would give."""
        fleet = cluster(node("n1"), node("n2"), pods=(vm_pod("a", "n1"), vm_pod("b", "n2")))
        first = manual_runtime(store, fleet, snapshot_every=3)
        for cpu in (3000, 1000, 4000, 2000):
            first.service.request_resources("a", cpu_milli=cpu, memory_slots=2)
        first.stop()
        counting = CountingStore(store)
        second = NodesRuntime(
            counting,  # type: ignore[arg-type]
            fleet,
            clock=ManualClock(EPOCH),
            config=CONFIG,
            threads=False,
            leadership=Leadership(counting, MemoryLease({}, holder="p2"), clock=ManualClock(EPOCH)),  # type: ignore[arg-type]
            manage_leadership=False,
        ).start()
        assert counting.stream_reads == 0
        assert second.service.logged_nodes() == ["n1", "n2"]
        for name in ("n1", "n2"):
            loaded = NodeService(store, clock=ManualClock(EPOCH)).stream(name)
            hosted = second.service.stream(name)
            assert (hosted.state, hosted.version, hosted.last_event_id) == (
                loaded.state,
                loaded.version,
                loaded.last_event_id,
            )
        assert second.service.node_of("a") == "n1"

    def test_the_start_folds_the_log_without_collections_and_turns_them_back_on(
        self, store: EventStore
    ) -> None:
        """The fold of the whole log at start-up is one-shot: the collector is off while it
        runs (as in a replay) and on again once the runtime has started."""
        fleet = cluster(node("n1"), pods=(vm_pod("a", "n1"),))
        manual_runtime(store, fleet).stop()
        restarted = NodesRuntime(store, fleet, clock=ManualClock(EPOCH), threads=False)
        folding: list[bool] = []
        fold = restarted.projection.apply

        def watched(record: RecordedEvent) -> None:
            folding.append(gc.isenabled())
            fold(record)

        restarted.projection.apply = watched  # type: ignore[method-assign]
        assert gc.isenabled()

        restarted.start()

        assert folding and not any(folding)
        assert gc.isenabled()

    def test_a_stream_started_from_the_read_model_appends_after_it(self, store: EventStore) -> None:
        """The first decision of a restarted process continues each stream's versions."""
        fleet = cluster(node("n1"), pods=(vm_pod("a", "n1"),))
        first = manual_runtime(store, fleet)
        first.service.request_resources("a", cpu_milli=3000, memory_slots=2)
        first.stop()
        second = _restarted(store, fleet)
        second.service.request_resources("a", cpu_milli=2000, memory_slots=2)
        versions = [r.stream_version for r in store.read_stream("node-n1")]
        assert versions == list(range(1, len(versions) + 1))
        assert second.service.stream("n1").version == len(versions)


class TestMigrations:
    def _pressured(self, store: EventStore, migrations: FakeMigrations) -> NodesRuntime:
        fleet = cluster(
            node("n1"),
            pods=(
                vm_pod("small", "n1", cpu=(1000, 1000, 1000), memory=(1, 1, 1)),
                vm_pod("big", "n1", cpu=(1000, 7000, 9000), memory=(1, 1, 1)),
            ),
        )
        runtime = manual_runtime(store, fleet, migrations=migrations)
        runtime.service.request_resources("big", cpu_milli=9000, memory_slots=1)
        runtime.step()
        return runtime

    def test_a_started_migration_is_carried_out_once(self, store: EventStore) -> None:
        """Pressure past the watermark starts a migration; the reactor starts it through the
        port once."""
        migrations = FakeMigrations()
        runtime = self._pressured(store, migrations)
        assert set(migrations.started) == {
            p.name for p in runtime.service.stream("n1").state.vm_pods.values() if p.migrating
        }
        assert migrations.started
        calls = migrations.calls
        runtime.step()
        assert migrations.calls == calls

    def test_a_finished_migration_is_not_started_again_on_replay(self, store: EventStore) -> None:
        """A reactor replaying history skips migrations whose pod has since left the node."""
        migrations = FakeMigrations()
        runtime = self._pressured(store, migrations)
        fleet = runtime.cluster
        assert isinstance(fleet, FakeCluster)
        for pod in migrations.started:
            fleet.delete_pod(pod)
        runtime.step()
        again = FakeMigrations()
        Reactors(
            store, [migration_reactor(runtime.service, again, name="replay")]
        ).run_until_caught_up()
        assert again.calls == 0


class TestThreads:
    def test_a_threaded_runtime_serves_and_stops(self, postgres_store: EventStore) -> None:
        """With threads the runtime grants, keeps its read model current and stops cleanly."""
        fleet = cluster(node("n1"), pods=(vm_pod("vm", "n1"),))
        runtime = NodesRuntime(postgres_store, fleet, config=CONFIG, sync_seconds=0.05)
        with runtime:
            grant = runtime.service.request_resources("vm", cpu_milli=2500, memory_slots=2)
            dump = runtime.dump()
        assert dump["position"] == grant.position
        assert not runtime.running


def _shard_runtime(
    store: EventStore,
    fleet: FakeCluster,
    board: dict[str, str],
    holder: str,
    shard: Shard,
    *,
    migrations: FakeMigrations | None = None,
) -> NodesRuntime:
    """A runtime without threads leading ``shard`` once it wins the shard's lease on ``board``;
    started (elected at once if the lease is free)."""
    clock = ManualClock(EPOCH)
    leadership = Leadership(
        store,
        MemoryLease(board, holder=holder, name=shard.name),
        clock=clock,
        holder=holder,
        shard=shard,
    )
    return NodesRuntime(
        store,
        fleet,
        clock=clock,
        config=CONFIG,
        migrations=migrations,
        threads=False,
        leadership=leadership,
        shard=shard,
    ).start()


def _fences(store: EventStore) -> dict[str, set[tuple[object, object]]]:
    """Each node stream's (leader_term, leader_shard) pairs of its duty events."""
    found: dict[str, set[tuple[object, object]]] = {}
    for record in store.read_all():
        if record.stream_id.startswith("node-") and "leader_term" in record.metadata:
            fence = (record.metadata["leader_term"], record.metadata.get("leader_shard"))
            found.setdefault(record.stream_id.removeprefix("node-"), set()).add(fence)
    return found


ZERO, ONE = Shard("nodes", 0, 2), Shard("nodes", 1, 2)


class TestShards:
    def _fleet(self) -> FakeCluster:
        names = [f"n{i:02d}" for i in range(20)]
        return cluster(*(node(n) for n in names), pods=tuple(vm_pod(f"vm-{n}", n) for n in names))

    def test_each_shard_leader_takes_over_and_syncs_only_its_own_nodes(
        self, postgres_store: EventStore
    ) -> None:
        """Two runtimes on one log lead nodes/0-of-2 and nodes/1-of-2 at once: each joins and
        restarts exactly its partition's nodes, every duty event naming its shard and term 1."""
        fleet, board = self._fleet(), dict[str, str]()
        first = _shard_runtime(postgres_store, fleet, board, "a", ZERO)
        second = _shard_runtime(postgres_store, fleet, board, "b", ONE)
        assert first.leading and second.leading

        owned = {n.name: ZERO.name if ZERO.owns(n.name) else ONE.name for n in fleet.list_nodes()}
        assert set(owned.values()) == {ZERO.name, ONE.name}
        assert _fences(postgres_store) == {n: {(1, shard)} for n, shard in owned.items()}
        assert first.last_restart is not None and second.last_restart is not None
        assert first.last_restart.nodes_joined == sum(s == ZERO.name for s in owned.values())
        assert second.last_restart.nodes_joined == sum(s == ONE.name for s in owned.values())
        for runtime, shard in ((first, ZERO), (second, ONE)):
            assert runtime.sync.sync().nodes_joined == 0
            hosted = runtime.service.hosted()
            assert {s.incarnation for n, s in hosted.items() if shard.owns(n)} == {1}

    def test_agents_are_answered_for_any_shards_node(self, postgres_store: EventStore) -> None:
        """The read model and agents' requests stay whole: the nodes/1-of-2 process grants a pod on
        a nodes/0-of-2 node, with no term (no duty of anyone's)."""
        fleet, board = self._fleet(), dict[str, str]()
        _shard_runtime(postgres_store, fleet, board, "a", ZERO)
        second = _shard_runtime(postgres_store, fleet, board, "b", ONE)
        theirs = next(n.name for n in fleet.list_nodes() if ZERO.owns(n.name))

        grant = second.service.request_resources(f"vm-{theirs}", cpu_milli=2000, memory_slots=2)

        assert grant.node == theirs
        [granted] = [r for r in postgres_store.read_stream(f"node-{theirs}")][-1:]
        assert "leader_term" not in granted.metadata
        assert len(second.dump()["nodes"]) == 20  # type: ignore[arg-type]

    def test_a_moved_shards_old_leader_is_fenced_and_the_other_shard_goes_on(
        self, postgres_store: EventStore
    ) -> None:
        """nodes/0-of-2 passes to a third runtime (term 2 of nodes/0-of-2), which takes its nodes
        over as incarnation 2. The old nodes/0-of-2 leader's next sync append is refused and it
        stops leading; nodes/1-of-2's leader goes on syncing at its term 1."""
        fleet, board = self._fleet(), dict[str, str]()
        old = _shard_runtime(postgres_store, fleet, board, "a", ZERO)
        other = _shard_runtime(postgres_store, fleet, board, "b", ONE)
        del board[ZERO.name]  # the old holder stalled past its lease
        new = _shard_runtime(postgres_store, fleet, board, "c", ZERO)
        assert new.leading and new.leadership is not None and new.leadership.term() == 2
        mine = next(n.name for n in fleet.list_nodes() if ZERO.owns(n.name))
        theirs = next(n.name for n in fleet.list_nodes() if ONE.owns(n.name))
        assert new.service.stream(mine).state.incarnation == 2
        fleet.create_pod(vm_pod("late-0", mine))
        fleet.create_pod(vm_pod("late-1", theirs))
        before = postgres_store.read_stream(f"node-{mine}")

        with pytest.raises(RuntimeStopped):
            old.step()
        other.step()
        new.step()

        assert not old.leading and other.leading
        after = postgres_store.read_stream(f"node-{mine}")
        added = after[len(before) :]
        assert [(r.metadata["leader_term"], r.metadata["leader_shard"]) for r in added] == [
            (2, ZERO.name)
        ]
        assert (_fences(postgres_store)[theirs]) == {(1, ONE.name)}
        assert other.service.stream(theirs).state.vm_pods.keys() >= {"late-1"}
        assert (postgres_store.leader_term(ZERO.name), postgres_store.leader_term(ONE.name)) == (
            2,
            1,
        )

    def test_a_shard_takes_its_nodes_over_past_their_earlier_incarnations(
        self, postgres_store: EventStore
    ) -> None:
        """A shard's first term is 1, but its nodes were taken over as incarnation 2 by an
        earlier, unsharded controller: the shard's leader takes them over as 3, not skipping
        them as taken over already."""
        fleet = self._fleet()
        manual_runtime(postgres_store, fleet).stop()
        manual_runtime(postgres_store, fleet).stop()

        runtime = _shard_runtime(postgres_store, fleet, {}, "a", ZERO)

        states = runtime.service.hosted()
        assert {s.incarnation for n, s in states.items() if ZERO.owns(n)} == {3}
        assert {s.incarnation for n, s in states.items() if ONE.owns(n)} == {2}

    def test_each_shards_reactor_starts_its_own_nodes_migrations(
        self, postgres_store: EventStore
    ) -> None:
        """Pressure on a node of each shard: each leader's migration reactor starts the
        migration of its own node only, from a checkpoint of its own."""
        names = {ZERO: "n01", ONE: "n00"}
        assert all(shard.owns(name) for shard, name in names.items())
        fleet = cluster(
            *(node(n) for n in names.values()),
            pods=tuple(
                pod
                for n in names.values()
                for pod in (
                    vm_pod(f"small-{n}", n, cpu=(1000, 1000, 1000), memory=(1, 1, 1)),
                    vm_pod(f"big-{n}", n, cpu=(1000, 7000, 9000), memory=(1, 1, 1)),
                )
            ),
        )
        board: dict[str, str] = {}
        started = {ZERO: FakeMigrations(), ONE: FakeMigrations()}
        runtimes = {
            shard: _shard_runtime(
                postgres_store,
                fleet,
                board,
                f"p{shard.partition}",
                shard,
                migrations=started[shard],
            )
            for shard in (ZERO, ONE)
        }
        for name in names.values():
            runtimes[ZERO].service.request_resources(f"big-{name}", cpu_milli=9000, memory_slots=1)

        for runtime in runtimes.values():
            runtime.step()

        for shard, name in names.items():
            assert started[shard].started
            assert set(started[shard].started.values()) == {name}

    def test_a_runtime_and_its_leadership_lead_the_same_shard(
        self, postgres_store: EventStore
    ) -> None:
        """A shard without its leadership, a leadership of another shard, or a shard of
        another capability is refused at construction, saying what to give."""
        clock = ManualClock(EPOCH)

        def leading(shard: str | None) -> Leadership:
            return Leadership(postgres_store, MemoryLease({}, holder="a"), clock=clock, shard=shard)

        for leadership, shard, problem in (
            (leading(None), ZERO, "leads every node"),
            (leading("nodes/1-of-2"), ZERO, "leads shard 'nodes/1-of-2'"),
            (leading("nodes/0-of-2"), None, "no shard"),
            (None, Shard("machines", 0, 2), "a shard of the nodes"),
        ):
            with pytest.raises(ValueError, match=problem):
                NodesRuntime(
                    postgres_store,
                    cluster(),
                    clock=clock,
                    threads=False,
                    leadership=leadership,
                    shard=shard,
                )
