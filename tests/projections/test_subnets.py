"""The subnets read model: equal rebuilt or incremental, auditable, dumpable at any position."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime, SubnetService
from fleetledger.adapters.runtime import Folded
from fleetledger.domain.ipam import BatchSizeChanged, SubnetEvent
from fleetledger.eventstore import EventStore
from fleetledger.projections.subnets import (
    SUBNET_EVENT_TYPE_NAMES,
    SubnetsProjection,
    dump_at,
    dump_of,
)
from tests.adapters.ipam.support import EPOCH, SUBNET, allocator

NODES = tuple(f"node-{i}" for i in range(30))


def busy_subnet(store: EventStore, fake: InMemoryAllocator | None = None) -> IpamRuntime:
    """A /22 whose 30 nodes fill it past the exhaustion threshold, then empty it again."""
    runtime = IpamRuntime(store, fake or allocator(), clock=ManualClock(EPOCH), threads=False)
    runtime.start()
    runtime.service.create(SUBNET, 1024)
    runtime.service.join(SUBNET, NODES)
    runtime.step()
    for demand in (10, 31, 5):
        for node in NODES:
            runtime.service.report_demand(SUBNET, node, demand)
        runtime.step()
    return runtime


class TestFolding:
    def test_rebuilt_equals_incremental(self, store: EventStore) -> None:
        """Folding the log in one go from 0 gives the model that followed it step by step."""
        live = SubnetsProjection()
        runtime = IpamRuntime(store, allocator(), clock=ManualClock(EPOCH), threads=False)
        runtime.start()
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES[:5])
        live.catch_up(store)
        for index, node in enumerate(NODES[:5]):
            runtime.service.report_demand(SUBNET, node, 10 * index)
            runtime.step()
            live.catch_up(store)
        runtime.service.leave(SUBNET, NODES[0])
        runtime.step()
        live.catch_up(store)

        rebuilt = SubnetsProjection()
        rebuilt.catch_up(store)

        assert rebuilt.position == live.position == store.head()
        assert rebuilt.subnets() == live.subnets()
        assert rebuilt.dump() == live.dump()

    def test_folding_the_events_handed_over_equals_decoding_them(self, store: EventStore) -> None:
        """The runtime's model takes its own streams' events as handed over, not decoded
        again, and holds what a model decoding every event holds."""
        runtime = busy_subnet(store)
        decoded = SubnetsProjection()
        decoded.catch_up(store)

        assert len(runtime.projection.recent) == len(store.read_all(types=SUBNET_EVENT_TYPE_NAMES))
        assert runtime.projection.position == decoded.position == store.head()
        assert runtime.projection.subnets() == decoded.subnets()
        assert runtime.projection.dump() == decoded.dump()

    def test_a_page_folds_as_its_events_one_by_one(self, store: EventStore) -> None:
        """Folding the log a page at a time, the first page again, gives the subnets, dump and
        position that folding each event does."""
        busy_subnet(store)
        records = store.read_all(limit=10_000)
        one_by_one, paged = SubnetsProjection(), SubnetsProjection()
        for record in records:
            one_by_one.apply(record)
        for start in range(0, len(records), 7):
            paged.apply_page(records[start : start + 7])
        paged.apply_page(records[:7])
        assert paged.subnets() == one_by_one.subnets()
        assert paged.dump() == one_by_one.dump()
        assert paged.position == one_by_one.position == store.head()

    def test_each_stream_as_a_load_of_it_stands(self, store: EventStore) -> None:
        """The state, version and last event id a runtime hosts the stream from are what
        reading the stream back gives."""
        busy_subnet(store)
        model = SubnetsProjection()
        model.catch_up(store)
        loaded = SubnetService(store, clock=ManualClock(EPOCH)).stream(SUBNET)
        loaded.load()
        [last] = store.read_stream(f"subnet-{SUBNET}", from_version=loaded.version)

        head = model.streams()[SUBNET]

        assert (head.state, head.version) == (loaded.state, loaded.version)
        assert head.last_event_id == str(last.event_id)
        assert head.version > 10

    def test_a_fold_that_missed_a_stream_version_hosts_no_stream(self, store: EventStore) -> None:
        busy_subnet(store)
        model = SubnetsProjection()
        without_the_first = store.read_all(limit=10_000)[1:]
        model.apply_page(without_the_first)

        assert model.streams() == {}

    def test_the_model_holds_what_the_subnet_decided(self, store: EventStore) -> None:
        """The read model's state is the hosted stream's, event for event."""
        runtime = busy_subnet(store)
        model = SubnetsProjection()
        model.catch_up(store)

        assert model.subnets() == {SUBNET: runtime.service.load(SUBNET)}


class TestView:
    def test_the_batch_size_comes_with_the_inputs_of_its_last_change(
        self, store: EventStore
    ) -> None:
        """The view says what the batch is and which demand, floor and direction made it."""
        busy_subnet(store)
        model = SubnetsProjection()
        model.catch_up(store)

        found = model.view(SUBNET)

        assert found is not None
        view = json.loads(json.dumps(found))
        change = view["last_batch_change"]
        assert change["batch_size"] == view["batch_size"]
        assert change["node_count"] == view["node_count"] == len(NODES)
        assert change["direction"] in ("rising", "falling", "steady")
        assert {"previous", "total_demand", "floor", "allocated", "cause", "at"} <= set(change)
        assert view["used"] == sum(len(p["held"]) for p in view["nodes"].values())

    def test_a_subnet_never_created_has_no_view(self, store: EventStore) -> None:
        """``None``, which the API turns into 404."""
        model = SubnetsProjection()
        model.catch_up(store)

        assert model.view(SUBNET) is None


class TestDump:
    def test_the_dump_is_json_with_a_stable_key_order(self, store: EventStore) -> None:
        """Subnets and their nodes sorted by name: the same state always dumps the same text."""
        busy_subnet(store)
        model = SubnetsProjection()
        model.catch_up(store)

        text = json.dumps(model.dump())
        dump = json.loads(text)

        assert list(dump["subnets"][SUBNET]["nodes"]) == sorted(NODES)
        rebuilt = SubnetsProjection()
        rebuilt.catch_up(store)
        assert json.dumps(rebuilt.dump()) == text
        assert dump["position"] == store.head()

    def test_the_dump_shows_the_batch_clamped_to_the_node_maximum(self, store: EventStore) -> None:
        """A /16 with one node dumps a batch of 250 — the most IPs a node holds — not 2^15, and
        each node's own maximum (none: the configured one)."""
        runtime = IpamRuntime(
            store, allocator(65536), clock=ManualClock(EPOCH), threads=False
        ).start()
        runtime.service.create(SUBNET, 65536)
        runtime.service.join(SUBNET, ["big"])
        runtime.service.join(SUBNET, ["small"], max_ips={"small": 30})
        runtime.step()
        runtime.projection.catch_up(store)
        subnet = runtime.projection.dump()["subnets"][SUBNET]  # type: ignore[index]
        assert subnet["batch_size"] == 250
        nodes = subnet["nodes"]
        assert (nodes["big"]["max_ips"], nodes["small"]["max_ips"]) == (None, 30)
        assert (nodes["big"]["requested"], nodes["small"]["requested"]) == (250, 30)
        assert dump_at(store) == runtime.projection.dump()

    def test_a_replay_to_the_head_equals_the_live_dump(self, store: EventStore) -> None:
        """``dump_at`` the head is the followed model's dump."""
        busy_subnet(store)
        model = SubnetsProjection()
        model.catch_up(store)

        assert dump_at(store) == model.dump()

    def test_a_replay_to_an_earlier_position_shows_the_past(self, store: EventStore) -> None:
        """As of a position the dump holds only what was decided up to it."""
        runtime = IpamRuntime(store, allocator(), clock=ManualClock(EPOCH), threads=False)
        runtime.start()
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES[:2])
        before = store.head()
        runtime.service.join(SUBNET, NODES[2:4])

        past = json.loads(json.dumps(dump_at(store, before)))

        assert past["position"] == before
        assert sorted(past["subnets"][SUBNET]["nodes"]) == list(NODES[:2])

    def test_the_hosted_state_dumps_as_the_replay_of_its_position(self, store: EventStore) -> None:
        """``dump_of`` the runtime's hosted subnet, with the last batch change it decided,
        equals a replay of the log to the position it was taken at."""
        runtime = IpamRuntime(store, allocator(), clock=ManualClock(EPOCH), threads=False)
        changes: list[BatchSizeChanged] = []
        stream = runtime.service.stream(SUBNET)

        def heard(folded: Sequence[Folded[SubnetEvent]]) -> None:
            changes.extend(f.event for f in folded if isinstance(f.event, BatchSizeChanged))

        stream.on_events(heard)
        runtime.start()
        runtime.service.create(SUBNET, 1024)
        runtime.service.join(SUBNET, NODES)
        runtime.step()
        for node in NODES:
            runtime.service.report_demand(SUBNET, node, 31)
        runtime.step()
        position = store.head()
        live = dump_of({SUBNET: (stream.state, changes[-1])}, position)
        runtime.service.report_demand(SUBNET, NODES[0], 2)

        assert changes, "the demand was meant to change the batch"
        assert dump_at(store, position) == live
        assert dump_at(store) != live

    def test_a_position_outside_the_log_is_refused(self, store: EventStore) -> None:
        """What to pick instead is in the message."""
        with pytest.raises(ValueError, match="outside the log"):
            dump_at(store, store.head() + 1)
