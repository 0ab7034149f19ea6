"""The node read model: incremental equals rebuilt, and live dumps equal replayed ones."""

from __future__ import annotations

import pytest

from fleetledger.adapters.nodes import NodesRuntime
from fleetledger.eventstore import EventStore
from fleetledger.projections.nodes import (
    NODE_EVENT_TYPE_NAMES,
    NodesProjection,
    dump_json,
    dump_of,
    dumpstate_at,
    fold_nodes,
)
from tests.adapters.nodes.support import cluster, manual_runtime, node, vm_pod


def _traffic(runtime: NodesRuntime, rounds: int = 4) -> None:
    for round_ in range(rounds):
        for pod in ("a", "b", "c"):
            cpu = 1000 + 1000 * ((round_ + len(pod)) % 4)
            runtime.service.request_resources(pod, cpu_milli=cpu, memory_slots=1 + round_ % 3)


@pytest.fixture
def runtime(store: EventStore) -> NodesRuntime:
    fleet = cluster(
        node("n1"), node("n2"), pods=(vm_pod("a", "n1"), vm_pod("b", "n1"), vm_pod("c", "n2"))
    )
    return manual_runtime(store, fleet)


class TestNodesProjection:
    def test_incremental_equals_rebuilt(self, runtime: NodesRuntime, store: EventStore) -> None:
        """Catching up after every request gives the states a rebuild from 0 gives."""
        incremental = NodesProjection()
        incremental.catch_up(store)
        for _ in range(3):
            _traffic(runtime, rounds=1)
            incremental.catch_up(store)
        rebuilt = NodesProjection()
        rebuilt.catch_up(store)
        assert incremental.states() == rebuilt.states()
        assert incremental.position == rebuilt.position == store.head()

    def test_it_holds_what_the_streams_hold(self, runtime: NodesRuntime, store: EventStore) -> None:
        """The read model's states are the hosted streams' states."""
        _traffic(runtime)
        projection = NodesProjection()
        projection.catch_up(store)
        assert projection.states() == runtime.service.hosted()

    def test_folding_the_events_handed_over_equals_decoding_them(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """The runtime's model takes its own streams' events as handed over, not decoded
        again, and holds what a model decoding every event holds."""
        _traffic(runtime)
        runtime.projection.catch_up(store)
        decoded = NodesProjection()
        decoded.catch_up(store)

        assert len(runtime.projection.recent) == len(store.read_all(types=NODE_EVENT_TYPE_NAMES))
        assert runtime.projection.states() == decoded.states()

    def test_applying_an_event_twice_changes_nothing(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """Events at or before the position are ignored, so a re-read does not double-count."""
        projection = NodesProjection()
        projection.catch_up(store)
        before = projection.states()
        for record in store.read_all(types=NODE_EVENT_TYPE_NAMES):
            projection.apply(record)
        assert projection.states() == before

    def test_a_page_folds_as_its_events_one_by_one(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """Folding the log a page at a time, other capabilities' events among the node events
        and the first page again, gives the states, stream heads and position that folding
        each event does."""
        _traffic(runtime)
        records = store.read_all(limit=10_000)
        one_by_one, paged = NodesProjection(), NodesProjection()
        for record in records:
            one_by_one.apply(record)
        for start in range(0, len(records), 7):
            paged.apply_page(records[start : start + 7])
        paged.apply_page(records[:7])
        assert paged.states() == one_by_one.states()
        assert paged.streams() == one_by_one.streams()
        assert paged.position == one_by_one.position == store.head()


class TestDumpstate:
    def test_live_and_replayed_dumps_are_the_same_bytes(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """A dump taken live at a position and one replayed to it later are byte-identical."""
        live: dict[int, str] = {}
        for _ in range(3):
            _traffic(runtime, rounds=1)
            dump = runtime.dump()
            live[int(str(dump["position"]))] = dump_json(dump)
        _traffic(runtime, rounds=2)
        for position, text in live.items():
            assert dump_json(dumpstate_at(store, position)) == text

    def test_a_dump_has_the_documented_keys(self, runtime: NodesRuntime) -> None:
        """position, config, nodes (with resources and pods) and migration_queue."""
        dump = runtime.dump()
        assert list(dump)[:4] == ["position", "config", "nodes", "migration_queue"]
        nodes = dump["nodes"]
        assert isinstance(nodes, dict)
        assert set(nodes["n1"]["pods"]["vm"]) == {"a", "b"}
        assert nodes["n1"]["resources"]["cpu"]["total"] == 10000

    def test_an_earlier_position_shows_the_earlier_state(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """Replaying to a position before a grant shows the pod's reservation before it."""
        runtime.service.request_resources("a", cpu_milli=3000, memory_slots=1)
        before = store.head()
        runtime.service.request_resources("a", cpu_milli=1000, memory_slots=1)
        assert fold_nodes(store, before)["n1"].vm_pods["a"].cpu.reserved == 3000
        assert fold_nodes(store, store.head())["n1"].vm_pods["a"].cpu.reserved == 1000

    def test_the_hosted_states_dump_as_the_replay_of_their_position(
        self, runtime: NodesRuntime, store: EventStore
    ) -> None:
        """``dump_of`` the streams' states held in memory equals a replay to the position they
        were taken at, and differs from a replay to an earlier one."""
        _traffic(runtime, rounds=1)
        earlier = store.head()
        runtime.service.request_resources("a", cpu_milli=3000, memory_slots=2)
        position = store.head()
        live = dump_of(runtime.service.hosted(), position)
        runtime.service.request_resources("a", cpu_milli=1000, memory_slots=1)

        assert dump_json(dumpstate_at(store, position)) == dump_json(live)
        assert dumpstate_at(store, earlier)["nodes"] != live["nodes"]

    def test_a_position_beyond_the_log_is_refused(self, store: EventStore) -> None:
        """Asking for a position the log has not reached says which positions exist."""
        with pytest.raises(ValueError, match="outside the log"):
            dumpstate_at(store, store.head() + 5)
