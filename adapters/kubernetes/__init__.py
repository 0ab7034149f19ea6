"""The ports on a real Kubernetes cluster (the official ``kubernetes`` client).

:class:`KubernetesCluster` serves the :class:`~fleetledger.adapters.cluster.ClusterGateway`'s
reads from informer caches (list + watch with resource versions; objects by namespace and name,
changed only by newer versions; listing again on ``410 Gone`` or a stalled watch; staleness
reported) and its writes from the API, with preconditions on deletes.
:class:`KubernetesApplications` serves the testbeds'
:class:`~fleetledger.adapters.testbeds.Applications`: Spark and Flink applications as their
operators' custom objects.
"""

from __future__ import annotations

from .applications import KubernetesApplications
from .cluster import KubernetesCluster
from .convert import node_from, pod_from
from .informer import Informer

__all__ = ["Informer", "KubernetesApplications", "KubernetesCluster", "node_from", "pod_from"]
