"""Read model of node accounting: every node's state and pods, as of a log position.

Folded from the log in global order with the domain's own ``evolve``, one state per
``node-<name>`` stream, so a live model and one rebuilt from position 0 hold equal states. The
model lives in memory and is rebuilt on start (docs/ARCHITECTURE.md, "Read models", says why).

Dumpstate (seed 04's ``dumpstate.go``) is :func:`fleetledger.domain.nodes.dumpstate` over these
states; :func:`dumpstate_at` folds the log up to any position instead, and :func:`dump_json`
writes either as canonical JSON, so a live dump and a replay of the same position are the same
bytes.
"""

from __future__ import annotations

import json
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from uuid import UUID

from fleetledger.domain import nodes
from fleetledger.domain.codec import registered_event_types
from fleetledger.domain.nodes import NodeEvent, NodeState
from fleetledger.eventstore import EventStore, RecordedEvent

from ._reading import catch_up, events_after, position_in_log
from .heads import StreamHead
from .recent import RecentEvents, decode

__all__ = [
    "NODE_EVENT_TYPE_NAMES",
    "NodesProjection",
    "dump_json",
    "dump_of",
    "dumpstate_at",
    "fold_nodes",
]

_PREFIX = nodes.stream_id("")

NODE_EVENT_TYPE_NAMES: tuple[str, ...] = tuple(
    sorted(name for name in registered_event_types() if name.startswith("nodes."))
)
"""The stored names of every node-accounting event."""

# The classes of NodeEvent: checking a decoded event's exact class is one set lookup, where
# isinstance against the union tries its members in turn.
_NODE_EVENT_CLASSES = frozenset(typing.get_args(NodeEvent))

_STATELESS_TYPE_NAMES = frozenset(
    name
    for name, registered in registered_event_types().items()
    if registered.cls in (nodes.ComputeUnitMismatch, nodes.ComputeUnitViolated)
)

Json = dict[str, object]

# The head of a stream not folded yet: version 0, whose next event is its first.
_NEW_STREAM: tuple[int, UUID | None] = (0, None)


class NodesProjection:
    """Node states by name, folded from the log; thread-safe.

    ``recent``: the events this process's node streams appended, which the model then folds
    without decoding them again (see :class:`~fleetledger.projections.recent.RecentEvents`).
    """

    def __init__(self, *, recent: RecentEvents | None = None) -> None:
        self.recent = recent if recent is not None else RecentEvents()
        self._lock = threading.Lock()
        self._reading = threading.Lock()
        self._states: dict[str, NodeState] = {}
        # Each node stream's version and last event id as folded, so a process starting up can
        # host the streams from these states instead of reading each stream back. A stream
        # whose versions were not folded one after the other (another type in it) is left out.
        self._heads: dict[str, tuple[int, UUID] | None] = {}
        self._position = 0
        # Each node's last dump, with the state it was made of.
        self._dumped: dict[str, tuple[NodeState, Json]] = {}

    @property
    def position(self) -> int:
        """The global position of the last event folded."""
        with self._lock:
            return self._position

    def states(self) -> dict[str, NodeState]:
        """Every node the log showed, present or gone, by name."""
        with self._lock:
            return dict(self._states)

    def streams(self) -> tuple[int, dict[str, StreamHead[NodeState]]]:
        """:attr:`position`, and every node stream folded up to it with its state, version and
        last event id, by node name (the states a stream would fold from the same events)."""
        with self._lock:
            return self._position, {
                name: StreamHead(self._states[name], head[0], str(head[1]))
                for name, head in self._heads.items()
                if head is not None
            }

    def node_of(self, pod: str) -> str | None:
        """The present node accounting ``pod``, if any (the last one to reserve it)."""
        with self._lock:
            return next(
                (
                    name
                    for name, state in self._states.items()
                    if state.present and (pod in state.vm_pods or pod in state.other_pods)
                ),
                None,
            )

    def catch_up(self, store: EventStore) -> int:
        """Fold every node event after :attr:`position`; return how many were read. The
        position then moves past the other events read over (see ``_reading.catch_up``)."""
        with self._reading:
            read, through = catch_up(
                store, self.position, types=NODE_EVENT_TYPE_NAMES, apply=self.apply
            )
            with self._lock:
                self._position = max(self._position, through)
        return read

    def apply(self, record: RecordedEvent) -> None:
        """Fold one event; events at or before :attr:`position` were folded already."""
        self.apply_page((record,))

    def apply_page(self, records: Sequence[RecordedEvent]) -> None:
        """Fold ``records``, in log order, as :meth:`apply` folds each: under one lock, the
        calls bound once (a replay folds most of a log's events here)."""
        with self._lock:
            states, heads, decode = self._states, self._heads, self.recent.decode
            position = self._position
            try:
                for record in records:
                    if record.global_position <= position:
                        continue
                    name = _fold_record(states, record, decode)
                    if name is not None:
                        version = record.stream_version
                        head = heads.get(name, _NEW_STREAM)
                        follows = head is not None and head[0] + 1 == version
                        heads[name] = (version, record.event_id) if follows else None
                    position = record.global_position
            finally:
                self._position = position

    def dump(self, *, settings: Mapping[str, object] | None = None) -> Json:
        """Dumpstate as of :attr:`position` (the present nodes, their pods, the queue)."""
        with self._lock:
            states, position = dict(self._states), self._position
        return _dump(states, position, settings, self._dump_node)

    def _dump_node(self, state: NodeState) -> Json:
        # A node whose state is the very object dumped last time dumps the same: a fleet's
        # dump redoes only the nodes that changed since the last one.
        kept = self._dumped.get(state.name)
        if kept is not None and kept[0] is state:
            return kept[1]
        dumped = nodes.dump_node(state)
        self._dumped[state.name] = (state, dumped)
        return dumped


def fold_nodes(store: EventStore, position: int) -> dict[str, NodeState]:
    """Every node's state folded from the log's start up to ``position`` included."""
    states: dict[str, NodeState] = {}
    for record in events_after(store, 0, types=NODE_EVENT_TYPE_NAMES, until=position):
        _fold_record(states, record, decode)
    return states


def dumpstate_at(
    store: EventStore, position: int | None = None, *, settings: Mapping[str, object] | None = None
) -> Json:
    """Dumpstate as of log ``position`` (the head when ``None``), replayed from the log.

    Raises ``ValueError`` for a position the log has not reached.
    """
    position = position_in_log(store, position)
    return _dump(fold_nodes(store, position), position, settings)


def dump_of(
    states: Mapping[str, NodeState],
    position: int,
    *,
    settings: Mapping[str, object] | None = None,
) -> Json:
    """Dumpstate of node ``states`` held in memory (a live runtime's hosted streams), labelled
    with ``position``: what :func:`dumpstate_at` replays from the log, when they are the states
    as of that position."""
    return _dump(states, position, settings)


def dump_json(dump: Mapping[str, object]) -> str:
    """``dump`` as canonical JSON text: the same dump always gives the same bytes."""
    return json.dumps(dump, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dump(
    states: Mapping[str, NodeState],
    position: int,
    settings: Mapping[str, object] | None,
    dump: Callable[[NodeState], Json] | None = None,
) -> Json:
    present = [state for state in states.values() if state.present]
    return nodes.dumpstate(present, position=position, settings=settings, dump=dump)


def _fold_record(
    states: dict[str, NodeState],
    record: RecordedEvent,
    decode: Callable[[RecordedEvent], object],
) -> str | None:
    """Fold ``record`` into its node's state; the node's name (``None``: not a node stream)."""
    if not record.stream_id.startswith(_PREFIX):
        return None
    name = record.stream_id[len(_PREFIX) :]
    if record.type in _STATELESS_TYPE_NAMES:
        # Warnings that evolve returns the state unchanged for: a third of the node events
        # of the restart scenario, folded without decoding their bodies.
        if name not in states:
            states[name] = nodes.initial_state()
        return name
    event = decode(record)
    if type(event) not in _NODE_EVENT_CLASSES and not isinstance(event, NodeEvent):
        raise TypeError(f"{record.type} at {record.stream_id} is not a node-accounting event")
    state = states.get(name)
    node_event = typing.cast(NodeEvent, event)  # checked above
    states[name] = nodes.evolve(nodes.initial_state() if state is None else state, node_event)
    return name
