"""The time series of the all-capabilities report, read back from each scenario's log.

The scenarios report totals; what happened *over time* is in their logs, where every event
carries its virtual time (``at``). Reading the log rather than instrumenting the scenarios keeps
the charts honest: they show what an auditor replaying the log would see. Node accounting is
folded with the domain's own ``evolve`` (the read model's fold), so reservations, buffers and
capacity are the node aggregate's, not a recount.

Each function returns one :class:`Series`: a table of named columns, one row per change, whose
first column is the virtual time in seconds since the run's start. The CSV files and the charts
are drawn from the same tables.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from fleetledger.domain import nodes
from fleetledger.domain.nodes import NodeEvent, NodeState
from fleetledger.eventstore import EventStore, RecordedEvent
from fleetledger.projections.nodes import NODE_EVENT_TYPE_NAMES
from fleetledger.projections.recent import decode

__all__ = [
    "Cell",
    "Series",
    "batch_series",
    "cloud_call_series",
    "node_series",
    "slot_series",
    "subnet_series",
]

Cell = int | float | str
_PAGE = 1000


@dataclass(frozen=True, slots=True)
class Series:
    """One table: ``columns`` name the cells of every row; the first is ``t_s``."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]

    def column(self, name: str) -> list[Cell]:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def numbers(self, name: str) -> list[float]:
        """A numeric column as floats (``ValueError`` for a text column)."""
        return [float(v) for v in self.column(name)]


def batch_series(store: EventStore, *, start: datetime) -> Series:
    """Every sealed VM batch: when, how many requests, and why it was sealed."""
    rows = [
        (_t(record, start), len(_list(record, "request_ids")), str(record.data["reason"]))
        for record in _read(store, ("vm.BatchSealed",))
    ]
    return Series("batch_sizes", ("t_s", "batch_size", "seal_reason"), tuple(rows))


def cloud_call_series(store: EventStore, *, start: datetime) -> Series:
    """Requests received and cloud create calls made, both cumulative. Without batching every
    request is its own call, so ``requests`` is also the naive run's calls."""
    requests = calls = 0
    rows: list[tuple[Cell, ...]] = [(0.0, 0, 0)]
    for record in _read(store, ("vm.MachineRequested", "vm.BatchDispatched")):
        if record.type == "vm.MachineRequested":
            requests += 1
        else:
            calls += 1
        _put(rows, (_t(record, start), requests, calls))
    return Series("cloud_calls", ("t_s", "requests", "cloud_calls"), tuple(rows))


def node_series(store: EventStore, *, start: datetime) -> Series:
    """The fleet's CPU and memory: reserved (buffer included), buffer and reservable capacity
    (``total − system``) summed over the present nodes, after every node event."""
    states: dict[str, NodeState] = {}
    rows: list[tuple[Cell, ...]] = []
    for record in _read(store, NODE_EVENT_TYPE_NAMES):
        event = decode(record)
        if not isinstance(event, NodeEvent):
            raise TypeError(f"{record.type} at {record.stream_id} is not a node-accounting event")
        state = states.get(record.stream_id, nodes.initial_state())
        states[record.stream_id] = nodes.evolve(state, event)
        present = [s for s in states.values() if s.present]
        _put(
            rows,
            (
                _t(record, start),
                sum(s.cpu.reserved for s in present),
                sum(s.cpu.buffer for s in present),
                sum(s.cpu.reservable for s in present),
                sum(s.memory.reserved for s in present),
                sum(s.memory.buffer for s in present),
                sum(s.memory.reservable for s in present),
            ),
        )
    columns = (
        "t_s",
        "cpu_reserved_milli",
        "cpu_buffer_milli",
        "cpu_reservable_milli",
        "memory_reserved_slots",
        "memory_buffer_slots",
        "memory_reservable_slots",
    )
    return Series("node_reservations", columns, tuple(rows))


def subnet_series(store: EventStore, *, start: datetime) -> Series:
    """The subnet's IPs handed to nodes, its capacity and its batch size, at every change."""
    allocated = capacity = batch = 0
    rows: list[tuple[Cell, ...]] = []
    types = ("ipam.SubnetCreated", "ipam.BatchSizeChanged", "ipam.IpsAllocated", "ipam.IpsReleased")
    for record in _read(store, types):
        data = record.data
        if record.type == "ipam.SubnetCreated":
            capacity, batch = int(data["capacity"]), int(data["batch_size"])
        elif record.type == "ipam.BatchSizeChanged":
            batch = int(data["batch_size"])
        elif record.type == "ipam.IpsAllocated":
            allocated += len(_list(record, "ips"))
        else:
            allocated -= len(_list(record, "ips"))
        utilization = allocated / capacity if capacity else 0.0
        _put(rows, (_t(record, start), allocated, capacity, round(utilization, 4), batch))
    columns = ("t_s", "allocated_ips", "capacity_ips", "utilization", "batch_size")
    return Series("subnet", columns, tuple(rows))


def slot_series(store: EventStore, *, start: datetime) -> Series:
    """Testbed slots held by a pod, the testbed's slots, and how many are held by two pods at
    once (a slot reserved again for another pod before it was cleared)."""
    per_node = 0
    node_count = 0
    held: dict[tuple[str, int], str] = {}
    doubled: set[tuple[str, int]] = set()
    rows: list[tuple[Cell, ...]] = []
    types = (
        "testbed.TestbedDefined",
        "testbed.ClusterObserved",
        "testbed.SlotReserved",
        "testbed.ReservationCleared",
    )
    for record in _read(store, types):
        data = record.data
        slot = (record.stream_id, int(data.get("slot_id", -1)))
        if record.type == "testbed.TestbedDefined":
            per_node = int(data["slots_per_node"])
        elif record.type == "testbed.ClusterObserved":
            node_count = len(_list(record, "nodes"))
        elif record.type == "testbed.SlotReserved":
            pod = str(data["pod_name"])
            if held.get(slot, pod) != pod:
                doubled.add(slot)
            held[slot] = pod
        else:
            held.pop(slot, None)
            doubled.discard(slot)
        _put(rows, (_t(record, start), len(held), per_node * node_count, len(doubled)))
    columns = ("t_s", "slots_held", "slots_total", "slots_double_held")
    return Series("slot_occupancy", columns, tuple(rows))


# -- reading ---------------------------------------------------------------------------------


def _read(store: EventStore, types: Sequence[str]) -> Iterator[RecordedEvent]:
    after = 0
    while True:
        page = store.read_all(after=after, limit=_PAGE, types=list(types))
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1].global_position


def _t(record: RecordedEvent, start: datetime) -> float:
    """The event's virtual time, in seconds since ``start`` (millisecond precision: the
    scenarios' clocks tick no finer, and rounding keeps the CSV free of float noise)."""
    at = datetime.fromisoformat(str(record.data["at"]))
    return round((at - start).total_seconds(), 3)


def _list(record: RecordedEvent, key: str) -> list[object]:
    value = record.data[key]
    if not isinstance(value, list):
        raise TypeError(f"{record.type} at position {record.global_position}: {key} is no list")
    return value


def _put(rows: list[tuple[Cell, ...]], row: tuple[Cell, ...]) -> None:
    """Append ``row``, replacing the previous one at the same instant: a chart shows where an
    instant ended, not every event of a group commit."""
    if rows and rows[-1][0] == row[0]:
        rows[-1] = row
    else:
        rows.append(row)
