"""Dumpstate: nodes and subnets as of one position, from the log or from states in memory."""

from __future__ import annotations

from collections.abc import Sequence

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import IpamRuntime
from fleetledger.adapters.runtime import Folded
from fleetledger.domain.ipam import BatchSizeChanged, SubnetEvent
from fleetledger.eventstore import EventStore
from fleetledger.projections.dumpstate import dumpstate_at, dumpstate_of
from fleetledger.projections.nodes import dump_json
from tests.adapters.ipam.support import EPOCH, SUBNET, allocator
from tests.adapters.nodes.support import cluster, manual_runtime, node, vm_pod


class TestDumpstateOf:
    def test_states_in_memory_dump_as_the_replay_of_their_position(self, store: EventStore) -> None:
        """Nodes and a subnet held by their runtimes, dumped together with the subnet's last
        batch change, are the bytes ``dumpstate_at`` replays for the position they were taken
        at; later decisions make the replay of the head differ."""
        nodes = manual_runtime(store, cluster(node("n1"), pods=(vm_pod("a", "n1"),)))
        subnets = IpamRuntime(store, allocator(), clock=ManualClock(EPOCH), threads=False)
        changes: list[BatchSizeChanged] = []

        def heard(folded: Sequence[Folded[SubnetEvent]]) -> None:
            changes.extend(f.event for f in folded if isinstance(f.event, BatchSizeChanged))

        stream = subnets.service.stream(SUBNET)
        stream.on_events(heard)
        subnets.start()
        subnets.service.create(SUBNET, 256)
        # Enough nodes that the batch changes: the dump shows its last change.
        subnets.service.join(SUBNET, [f"n{i}" for i in range(1, 21)])
        subnets.step()
        nodes.service.request_resources("a", cpu_milli=3000, memory_slots=2)
        position = store.head()

        live = dumpstate_of(
            nodes.service.hosted(), {SUBNET: (stream.state, changes[-1])}, position=position
        )
        nodes.service.request_resources("a", cpu_milli=1000, memory_slots=1)

        assert changes
        assert dump_json(dumpstate_at(store, position)) == dump_json(live)
        assert dump_json(dumpstate_at(store)) != dump_json({**live, "position": store.head()})
