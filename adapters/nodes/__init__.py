"""Node resource accounting on the decider host (docs/ARCHITECTURE.md, "Node resource permits").

One ``node-<name>`` stream per node, hosted by :class:`NodeService`; :class:`ClusterSync` turns
what the cluster shows into node commands and takes nodes over at a restart; the migration
reactor starts the migrations nodes decide on through the :class:`Migrations` port;
:class:`NodesRuntime` assembles them with the read model of :mod:`fleetledger.projections.nodes`.
"""

from __future__ import annotations

from .aggregate import NODE_CODEC, NODE_EVENT_TYPES, node_aggregate, node_of_stream
from .errors import (
    InvalidRequest,
    LogContention,
    LogUnavailable,
    MigratingPodMismatch,
    NodesError,
    RequestRefused,
    RuntimeStopped,
    UnknownPod,
)
from .migrations import FakeMigrations, Migrations, migration_reactor
from .port import NodeStreams
from .runtime import NodesRuntime
from .service import Grant, NodeService, ResourceRequest
from .specs import DEFAULT_NODE_CONFIG, BadAnnotation, pod_spec, vm_annotations
from .sync import ClusterSync, SyncReport

__all__ = [
    "DEFAULT_NODE_CONFIG",
    "NODE_CODEC",
    "NODE_EVENT_TYPES",
    "BadAnnotation",
    "ClusterSync",
    "FakeMigrations",
    "Grant",
    "InvalidRequest",
    "LogContention",
    "LogUnavailable",
    "MigratingPodMismatch",
    "Migrations",
    "NodeService",
    "NodeStreams",
    "NodesError",
    "NodesRuntime",
    "RequestRefused",
    "ResourceRequest",
    "RuntimeStopped",
    "SyncReport",
    "UnknownPod",
    "migration_reactor",
    "node_aggregate",
    "node_of_stream",
    "pod_spec",
    "vm_annotations",
]
