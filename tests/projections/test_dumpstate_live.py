"""The live dumpstate from the subnets read model a process holds: the bytes of the replay."""

from __future__ import annotations

from collections.abc import Sequence

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
from fleetledger.eventstore import EventStore, RecordedEvent, TypesPage
from fleetledger.projections.dumpstate import with_subnets
from fleetledger.projections.nodes import dump_json
from fleetledger.projections.subnets import SUBNET_EVENT_TYPE_NAMES
from tests.adapters.ipam.support import EPOCH
from tests.adapters.nodes.support import cluster, manual_runtime, node, vm_pod

SUBNETS = ("pods-a", "pods-b", "pods-c")


class ReadingStore:
    """The real store, noting where each read of subnet events starts."""

    def __init__(self, inner: EventStore) -> None:
        self._inner = inner
        self.subnet_reads_after: list[int] = []

    def read_all(
        self, *, after: int = 0, limit: int = 1000, types: Sequence[str] | None = None
    ) -> list[RecordedEvent]:
        self._note(after, types)
        return self._inner.read_all(after=after, limit=limit, types=types)

    def read_types(self, *, after: int, types: Sequence[str], limit: int = 1000) -> TypesPage:
        self._note(after, types)
        return self._inner.read_types(after=after, types=types, limit=limit)

    def _note(self, after: int, types: Sequence[str] | None) -> None:
        if types is not None and set(types) & set(SUBNET_EVENT_TYPE_NAMES):
            self.subnet_reads_after.append(after)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def subnets_in(store: EventStore) -> IpamRuntime:
    """Three subnets of 20 nodes each, with demands that change their batches, settled."""
    fake = InMemoryAllocator()
    runtime = IpamRuntime(store, fake, clock=ManualClock(EPOCH), threads=False).start()
    for number, subnet in enumerate(SUBNETS):
        fake.add_subnet(subnet, 1024)
        runtime.service.create(subnet, 1024)
        names = [f"{subnet}-n{i}" for i in range(20)]
        runtime.service.join(subnet, names)
        for i, name in enumerate(names):
            runtime.service.report_demand(subnet, name, (i * (number + 3)) % 40)
    runtime.step()
    return runtime


class TestLiveSubnets:
    def test_the_held_subnets_dump_as_the_replay(self, store: EventStore) -> None:
        """Nodes from their read model, subnets from the one the process holds: the bytes of
        the replay of the same position."""
        nodes = manual_runtime(store, cluster(node("n1"), pods=(vm_pod("a", "n1"),)))
        runtime = subnets_in(store)
        nodes.service.request_resources("a", cpu_milli=3000, memory_slots=2)
        node_dump = nodes.dump()

        live = with_subnets(store, node_dump, held=runtime.projection)

        assert live["subnets"]
        subnets = live["subnets"]
        assert isinstance(subnets, dict)
        assert all(s["last_batch_change"] for s in subnets.values())
        assert dump_json(live) == dump_json(with_subnets(store, node_dump))

    def test_subnets_ahead_of_the_nodes_dump_as_of_the_nodes(self, store: EventStore) -> None:
        """Subnet decisions after the nodes were dumped are left out: the dump is the replay of
        the nodes' position, not a mix of two positions."""
        nodes = manual_runtime(store, cluster(node("n1")))
        runtime = subnets_in(store)
        node_dump = nodes.dump()
        runtime.service.report_demand(SUBNETS[0], f"{SUBNETS[0]}-n1", 39)
        runtime.step()

        live = with_subnets(store, node_dump, held=runtime.projection)

        assert dump_json(live) == dump_json(with_subnets(store, node_dump))
        assert live["subnets"] != runtime.projection.dump()["subnets"]

    def test_a_live_dump_reads_only_what_the_model_lacks(self, store: EventStore) -> None:
        """The held model is caught up from where it stands: no subnet event is read again
        from the start of the log."""
        nodes = manual_runtime(store, cluster(node("n1")))
        runtime = subnets_in(store)
        runtime.service.report_demand(SUBNETS[1], f"{SUBNETS[1]}-n2", 33)  # not yet folded
        reading = ReadingStore(store)

        live = with_subnets(reading, nodes.dump(), held=runtime.projection)  # type: ignore[arg-type]

        assert reading.subnet_reads_after
        assert min(reading.subnet_reads_after) > 0
        assert dump_json(live) == dump_json(with_subnets(store, nodes.dump()))
        assert live["subnets"][SUBNETS[1]]["nodes"][f"{SUBNETS[1]}-n2"]["demand"] == 33  # type: ignore[index]
