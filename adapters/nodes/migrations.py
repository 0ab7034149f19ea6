"""Carrying out migrations the nodes start: the :class:`Migrations` port and its reactor.

A node decides *that* a pod migrates (:class:`~fleetledger.domain.nodes.MigrationStarted`); the
reactor asks the port to start moving the VM. When the move finishes, the cluster shows the pod
on its new node, and cluster sync sends the target's ``ReservePod`` and the source's
``DeletePod``. The reactor runs at least once per event, so it reads the node's state first and
the port treats a repeated start of the same migration as a no-op.
"""

from __future__ import annotations

import threading
from typing import Protocol

import structlog

from fleetledger.adapters.runtime.reactors import Reactor
from fleetledger.domain.nodes import MigrationStarted, NodeEvent
from fleetledger.eventstore import RecordedEvent

from .aggregate import NODE_CODEC, node_of_stream
from .service import NodeService

__all__ = ["FakeMigrations", "Migrations", "migration_reactor"]

log = structlog.get_logger(__name__)


class Migrations(Protocol):
    """Where VM migrations are started (NeonVM's ``VirtualMachineMigration`` in production)."""

    def start_migration(self, *, node: str, pod: str) -> None:
        """Start moving ``pod``'s VM off ``node``; a repeat for a started one does nothing."""
        ...


class FakeMigrations:
    """Migrations in memory: remembers which were started, once each; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: dict[str, str] = {}
        self.calls = 0
        """How many times a start was asked for (repeats included), for idempotence tests."""

    def start_migration(self, *, node: str, pod: str) -> None:
        with self._lock:
            self.calls += 1
            self._started.setdefault(pod, node)

    @property
    def started(self) -> dict[str, str]:
        """Pod → the node it is migrating away from."""
        with self._lock:
            return dict(self._started)


def migration_reactor(
    service: NodeService, migrations: Migrations, *, name: str = "nodes-migrations"
) -> Reactor[NodeEvent]:
    """The reactor starting a migration for every ``MigrationStarted`` still in effect."""

    def react(event: NodeEvent, record: RecordedEvent) -> None:
        node = node_of_stream(record.stream_id)
        if node is None or not isinstance(event, MigrationStarted):
            return
        stream = service.stream(node)
        if record.stream_version > stream.version:
            stream.load()  # written by another process: fold it before reading the state
        pod = stream.state.vm_pods.get(event.pod)
        if pod is None or not pod.migrating:
            return  # already moved and deleted: the reactor is catching up on history
        log.info("starting a migration", node=node, pod=event.pod)
        migrations.start_migration(node=node, pod=event.pod)

    return Reactor(
        name=name,
        codec=NODE_CODEC,
        types=(MigrationStarted,),
        streams=lambda stream_id: node_of_stream(stream_id) is not None,
        react=react,
    )
