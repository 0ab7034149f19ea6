"""The hosted nodes as placement plans on them, kept up to date one changed node at a time.

A batch plans on every node's free capacity, but touches a handful of nodes: reading all of them
per batch made a batch cost O(nodes). :class:`NodeView` keeps, per node, the stream version and
state placement last planned on and the worker they give (in a
:class:`~fleetledger.domain.placement.Capacity`), and re-reads a node only once something says
it changed:

* the node service names every node whose stream is hosted or folds events
  (``NodeService.watch``);
* the placement service names the nodes whose reservations it appended itself (its own fold
  of them is newer than the hosted stream until that stream loads them), and the workers whose
  status it set.

Missing a change can never overbook a node, only cost a conflict: each reservation is appended
with the version the view planned on as its expected version, and a conflict loads the node's
stream (which names it here again) and plans its requests again. A node's version is read before
its state, so a state newer than its version can likewise only cause a conflict.

Without a node service that names its changes (a :class:`NodeStreams` without ``watch``), every
refresh reads every hosted node, as a snapshot always did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from fleetledger.adapters.nodes.port import NodeStreams
from fleetledger.domain.nodes import NodeState
from fleetledger.domain.placement import Capacity, Pool, Worker, WorkerStatus

from .capacity import worker_of
from .commit import NodeBatch

__all__ = ["NodeView"]


@runtime_checkable
class _Watched(Protocol):
    def watch(self, observer: Callable[[str], None]) -> None: ...


class NodeView:
    """Every hosted node as placement last read it. :meth:`changed` is thread-safe; the rest
    belongs to the batch thread (the placement service's batch lock)."""

    __slots__ = (
        "_all",
        "_capacity",
        "_dirty",
        "_dirty_lock",
        "_entries",
        "_nodes",
        "_pool_of",
        "_present",
    )

    def __init__(
        self, nodes: NodeStreams, pools: Sequence[Pool], pool_of: Callable[[str], str | None]
    ) -> None:
        self._nodes = nodes
        self._pool_of = pool_of
        self._capacity = Capacity(pools)
        # The nodes a batch may plan on (present, of a pool): version, state, worker as read.
        self._entries: dict[str, tuple[int, NodeState, Worker]] = {}
        self._present: set[str] = set()
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        # Until the first refresh every hosted node is unknown; without a watch, always.
        self._all: bool | None = None
        if isinstance(nodes, _Watched):
            self._all = True
            nodes.watch(self.changed)

    @property
    def capacity(self) -> Capacity:
        return self._capacity

    def changed(self, node: str) -> None:
        """``node`` moved: the next refresh reads it again."""
        with self._dirty_lock:
            self._dirty.add(node)

    def present(self, node: str) -> bool:
        """Whether ``node`` was hosted and present at the last refresh."""
        return node in self._present

    def base(self, node: str) -> NodeBatch:
        """``node`` as the last refresh read it, for a batch to reserve on."""
        version, state, _ = self._entries[node]
        return NodeBatch(state, version)

    def refresh(
        self,
        known: Callable[[str], tuple[int, NodeState] | None],
        status: Callable[[str], WorkerStatus],
    ) -> None:
        """Read again the nodes named since the last refresh (every hosted node the first
        time). ``known`` is placement's own fold of a node (what it
        appended), used when newer than the hosted stream; ``status`` the worker status set."""
        with self._dirty_lock:
            names, self._dirty = self._dirty, set()
        if self._all is not False:
            names = set(self._nodes.hosted())
            if self._all:
                self._all = False
        left = sorted(names, reverse=True)
        try:
            while left:
                name = left[-1]
                self._read(name, known(name), status(name))
                left.pop()
        finally:
            if left:
                # A read failed (the log unreachable): what was not read yet is read next time.
                with self._dirty_lock:
                    self._dirty.update(left)

    def _read(self, name: str, mine: tuple[int, NodeState] | None, status: WorkerStatus) -> None:
        stream = self._nodes.stream(name)
        version = stream.version  # before the state: see the module docstring
        if mine is not None and mine[0] >= version:
            version = mine[0]
        entry = self._entries.get(name)
        if entry is not None and entry[0] == version:
            _, state, worker = entry
        else:
            state = mine[1] if mine is not None and mine[0] == version else stream.state
            pool = self._pool_of(name)
            if state.present:
                self._present.add(name)
            else:
                self._present.discard(name)
            if pool is None or not state.present:
                self._entries.pop(name, None)
                self._capacity.discard(name)
                return
            worker = worker_of(state, version=version, pool=pool)
            self._entries[name] = (version, state, worker)
        self._capacity.put(worker if status == "available" else replace(worker, status=status))
