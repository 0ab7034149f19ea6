"""Read model of subnets: every subnet's state, per-node pools and last batch change.

Folded from the log in global order with the domain's own ``evolve``, one state per
``subnet-<id>`` stream, so a live model and one rebuilt from position 0 hold equal states. It
also keeps each subnet's last :class:`~fleetledger.domain.ipam.BatchSizeChanged`: the batch size
is only auditable with the inputs that decided it. The model lives in memory and is rebuilt on
start (docs/ARCHITECTURE.md, "Read models", says why).

:meth:`SubnetsProjection.view` is what ``GET /v1/subnets/{id}`` shows;
:meth:`SubnetsProjection.dump` is the ``subnets`` part of dumpstate, and :func:`dump_at` replays
the log up to any position instead — a live dump and a replay of the same position are equal.
"""

from __future__ import annotations

import dataclasses
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple
from uuid import UUID

from fleetledger.domain import ipam
from fleetledger.domain.codec import registered_event_types
from fleetledger.domain.ipam import BatchSizeChanged, SubnetEvent, SubnetState
from fleetledger.eventstore import EventStore, RecordedEvent

from ._reading import catch_up, events_after, position_in_log
from .heads import StreamHead
from .recent import RecentEvents, decode

__all__ = [
    "SUBNET_EVENT_TYPE_NAMES",
    "SubnetsProjection",
    "dump_at",
    "dump_of",
    "subnet_view",
]

# The naming is the runtime's (adapters.ipam.aggregate); a read model may not import adapters.
_PREFIX = "subnet-"

# The classes of SubnetEvent: checking a decoded event's exact class is one set lookup, where
# isinstance against the union tries its members in turn.
_SUBNET_EVENT_CLASSES = frozenset(typing.get_args(SubnetEvent))

SUBNET_EVENT_TYPE_NAMES: tuple[str, ...] = tuple(
    sorted(name for name in registered_event_types() if name.startswith("ipam."))
)
"""The stored names of every subnet event."""

Json = dict[str, object]


# A NamedTuple, not a frozen dataclass: one is built per subnet event folded, and a tuple is
# several times cheaper to build.
class _Subnet(NamedTuple):
    state: SubnetState
    last_change: BatchSizeChanged | None = None
    version: int = 0
    """The stream's version folded up to; -1 once a version was missing (a fold that did not
    start at the stream's first event), and then no stream is hosted from it."""
    last_event_id: UUID | None = None


class SubnetsProjection:
    """Subnet states by id, folded from the log; thread-safe.

    ``recent``: the events this process's subnet streams appended, which the model then folds
    without decoding them again (see :class:`~fleetledger.projections.recent.RecentEvents`).
    """

    def __init__(self, *, recent: RecentEvents | None = None) -> None:
        self.recent = recent if recent is not None else RecentEvents()
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._subnets: dict[str, _Subnet] = {}
        self._position = 0

    @property
    def position(self) -> int:
        """The global position of the last event folded."""
        with self._lock:
            return self._position

    def subnets(self) -> dict[str, SubnetState]:
        """Every subnet the log created, by id."""
        with self._lock:
            return {
                subnet_id: s.state
                for subnet_id, s in sorted(self._subnets.items())
                if s.state.subnet_id is not None
            }

    def catch_up(self, store: EventStore) -> int:
        """Fold every subnet event after :attr:`position`; return how many were read. The
        position then moves past the other events read over (see ``_reading.catch_up``)."""
        with self._reading:
            read, through = catch_up(
                store, self.position, types=SUBNET_EVENT_TYPE_NAMES, apply=self.apply
            )
            with self._lock:
                self._position = max(self._position, through)
        return read

    def apply(self, record: RecordedEvent) -> None:
        """Fold one event; events at or before :attr:`position` were folded already."""
        self.apply_page((record,))

    def apply_page(self, records: Sequence[RecordedEvent]) -> None:
        """Fold ``records``, in log order, as :meth:`apply` folds each, under one lock."""
        with self._lock:
            subnets, position, decode = self._subnets, self._position, self.recent.decode
            try:
                for record in records:
                    if record.global_position > position:
                        _fold_record(subnets, record, decode)
                        position = record.global_position
            finally:
                self._position = position

    def streams(self) -> dict[str, StreamHead[SubnetState]]:
        """Every subnet stream folded up to :attr:`position`, with its version and last event
        id, by subnet id (the states the stream would fold from the same events): a runtime
        starting up hosts them without reading each subnet's history back."""
        with self._lock:
            return {
                subnet_id: StreamHead(s.state, s.version, str(s.last_event_id))
                for subnet_id, s in self._subnets.items()
                if s.version > 0
            }

    def view(self, subnet_id: str) -> Json | None:
        """The subnet as ``GET /v1/subnets/{id}`` shows it, or ``None`` if it was never created."""
        with self._lock:
            found = self._subnets.get(subnet_id)
        if found is None or found.state.subnet_id is None:
            return None
        return subnet_view(found.state, found.last_change)

    def dump(self) -> Json:
        """Every subnet with its per-node pools, as of :attr:`position` (JSON-ready)."""
        with self._lock:
            subnets, position = dict(self._subnets), self._position
        return _dump(subnets, position)


def subnet_view(state: SubnetState, last_change: BatchSizeChanged | None = None) -> Json:
    """One subnet as JSON-ready data: capacity, nodes, IPs used, the batch size with the inputs
    of its last change, the exhaustion flag and every node's pool."""
    data = ipam.to_data(state)
    used = ipam.allocated(state)
    change: Json | None = None
    if last_change is not None:
        change = {
            field.name: getattr(last_change, field.name)
            for field in dataclasses.fields(last_change)
            if field.name not in ("subnet_id", "at")
        }
        change["at"] = last_change.at.isoformat()
    return {
        "subnet_id": state.subnet_id,
        "capacity": state.capacity,
        "node_count": len(state.nodes),
        "used": used,
        "utilization": used / state.capacity if state.capacity else 0.0,
        "batch_size": state.batch_size,
        "last_batch_change": change,
        "exhausted": state.exhausted,
        "nodes": data["nodes"],
    }


def dump_at(store: EventStore, position: int | None = None) -> Json:
    """The subnets as of log ``position`` (the head when ``None``), replayed from the log.

    Raises ``ValueError`` for a position the log has not reached.
    """
    position = position_in_log(store, position)
    subnets: dict[str, _Subnet] = {}
    for record in events_after(store, 0, types=SUBNET_EVENT_TYPE_NAMES, until=position):
        _fold_record(subnets, record, decode)
    return _dump(subnets, position)


def dump_of(
    subnets: Mapping[str, tuple[SubnetState, BatchSizeChanged | None]], position: int
) -> Json:
    """The subnets held in memory (a live runtime's: each state with its last batch change),
    labelled with ``position``: what :func:`dump_at` replays from the log, when they are the
    subnets as of that position."""
    return _dump({sid: _Subnet(state, last) for sid, (state, last) in subnets.items()}, position)


def _dump(subnets: Mapping[str, _Subnet], position: int) -> Json:
    return {
        "position": position,
        "subnets": {
            subnet_id: subnet_view(s.state, s.last_change)
            for subnet_id, s in sorted(subnets.items())
            if s.state.subnet_id is not None
        },
    }


def _fold_record(
    subnets: dict[str, _Subnet],
    record: RecordedEvent,
    decode: Callable[[RecordedEvent], object],
) -> None:
    if not record.stream_id.startswith(_PREFIX):
        return
    subnet_id = record.stream_id[len(_PREFIX) :]
    event = decode(record)
    if type(event) not in _SUBNET_EVENT_CLASSES and not isinstance(event, SubnetEvent):
        raise TypeError(f"{record.type} at {record.stream_id} is not a subnet event")
    current = subnets.get(subnet_id)
    if current is None:
        current = _Subnet(ipam.initial_state())
    state = ipam.evolve(current.state, typing.cast(SubnetEvent, event))  # checked above
    last = event if isinstance(event, BatchSizeChanged) else current.last_change
    version = record.stream_version if record.stream_version == current.version + 1 else -1
    subnets[subnet_id] = _Subnet(state, last, version, record.event_id)
