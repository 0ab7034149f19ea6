"""The :class:`~fleetledger.adapters.cluster.ClusterGateway` on a real cluster, through the
official ``kubernetes`` client.

Reads come from two informers (nodes, pods across namespaces) kept current by list + watch, so a
controller listing the cluster every few seconds costs the API server nothing but the watches.
Pods are cached by namespace and name, nodes by name. Writes go to the API at once, to the pod's
namespace, ``namespace`` when the caller names none.

A pod is sent with its ``priorityClassName`` and never a ``priority``: the priority admission
plugin fills the value in from the class, and refuses a pod whose ``priority`` differs from it.
A delete sends the uid and resource version the caller saw as ``DeleteOptions.preconditions``,
so the API server itself refuses to delete a newer pod that took the name, or a pod that changed
since it was read. On that ``409 Conflict`` the adapter reads the pod again and puts what it read
into the pod cache before raising :class:`~fleetledger.adapters.cluster.StalePod` (the pod
attached): the caller's next listing shows the pod as it is, to decide again on.

How fresh the caches are is :meth:`KubernetesCluster.staleness_seconds`, and
:meth:`KubernetesCluster.problems` names a cache never filled or stale past
``stale_after_seconds`` (the :class:`~fleetledger.adapters.cluster.ClusterHealth` port).

API errors are translated at this edge: ``409 Conflict`` on create is
:class:`~fleetledger.adapters.cluster.PodExists`, ``403`` naming a missing priority class
:class:`~fleetledger.adapters.cluster.UnknownPriorityClass`, ``404`` on delete
:class:`~fleetledger.adapters.cluster.UnknownPod`, ``409`` on a delete with a uid (the
preconditions failed) :class:`~fleetledger.adapters.cluster.StalePod`, an existing priority class
of another value :class:`~fleetledger.adapters.cluster.PriorityClassConflict`, anything else
:class:`~fleetledger.adapters.cluster.ClusterError`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from fleetledger.adapters.cluster import (
    ClusterError,
    Node,
    Pod,
    PodExists,
    PodSpec,
    PriorityClassConflict,
    StalePod,
    UnknownPod,
    UnknownPriorityClass,
)

from .convert import node_from, pod_from
from .informer import Informer
from .status import status_message

__all__ = ["KubernetesCluster"]


class KubernetesCluster:
    """Nodes and pods of one cluster: informer caches for reads, the API for writes.

    ``watch_seconds`` is each watch's server timeout and ``read_grace_seconds`` how much longer
    a watch may stay silent before it counts as stalled (and the cache is listed again);
    ``stale_after_seconds`` (default: twice their sum, a stalled watch and a failed recovery)
    is when :meth:`problems` calls a cache stale. ``clock`` (monotonic seconds) times staleness.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str = "default",
        watch_seconds: int = 60,
        read_grace_seconds: float = 15.0,
        stale_after_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stale_after_seconds is not None and stale_after_seconds <= 0:
            raise ValueError(f"stale_after_seconds must be positive, not {stale_after_seconds}")
        self._core = client.CoreV1Api(api_client)
        self._scheduling = client.SchedulingV1Api(api_client)
        self._namespace = namespace
        self._stale_after = (
            stale_after_seconds
            if stale_after_seconds is not None
            else 2 * (watch_seconds + read_grace_seconds)
        )
        self.nodes = Informer(
            self._core.list_node,
            node_from,
            kind="Node",
            watch_seconds=watch_seconds,
            read_grace_seconds=read_grace_seconds,
            clock=clock,
        )
        self.pods = Informer(
            self._core.list_pod_for_all_namespaces,
            pod_from,
            kind="Pod",
            watch_seconds=watch_seconds,
            read_grace_seconds=read_grace_seconds,
            clock=clock,
        )
        self._threads: list[threading.Thread] = []

    # -- running the informers -------------------------------------------------------------------

    def sync(self) -> None:
        """Bring both caches up to date once (list if never listed, then one watch round)."""
        try:
            self.nodes.watch(timeout_seconds=1)
            self.pods.watch(timeout_seconds=1)
        except (ApiException, HTTPError) as e:
            raise ClusterError(f"could not read the cluster: {e}") from e

    def start(self) -> KubernetesCluster:
        """List both kinds, then keep watching them from threads."""
        try:
            self.nodes.relist()
            self.pods.relist()
        except (ApiException, HTTPError) as e:
            raise ClusterError(f"could not list the cluster: {e}") from e
        self._threads = [
            threading.Thread(target=informer.run, name=f"informer-{informer.kind}", daemon=True)
            for informer in (self.nodes, self.pods)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.nodes.stop()
        self.pods.stop()
        for thread in self._threads:
            thread.join(timeout)
        self._threads = []

    # -- how fresh the caches are ----------------------------------------------------------------

    def staleness_seconds(self) -> dict[str, float]:
        """Seconds since each cache last heard from the API server, by kind."""
        return {i.kind: i.staleness_seconds() for i in (self.nodes, self.pods)}

    def problems(self) -> list[str]:
        """Caches never filled, or silent for longer than ``stale_after_seconds``."""
        found = []
        for informer in (self.nodes, self.pods):
            staleness = informer.staleness_seconds()
            if not informer.synced:
                found.append(f"the {informer.kind} cache has not listed the cluster yet")
            elif staleness > self._stale_after:
                found.append(
                    f"the {informer.kind} cache is stale: nothing from the API server for "
                    f"{staleness:.0f} s (limit {self._stale_after:.0f} s)"
                )
        return found

    # -- the port --------------------------------------------------------------------------------

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        return [n for n in self.nodes.items() if label is None or label in n.labels]

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        wanted = dict(labels or {})
        return [
            p for p in self.pods.items() if all(p.labels.get(k) == v for k, v in wanted.items())
        ]

    def create_pod(self, spec: PodSpec) -> Pod:
        body = _pod_body(spec)
        try:
            response: Any = self._core.create_namespaced_pod(
                spec.namespace or self._namespace, cast(Any, body), _preload_content=False
            )
        except ApiException as e:
            if e.status == 409:
                raise PodExists(f"pod {spec.name} already exists") from e
            message = status_message(e)
            if e.status == 403 and "no PriorityClass with name" in message:
                raise UnknownPriorityClass(message) from e
            raise ClusterError(f"could not create pod {spec.name}: {e.status} {message}") from e
        except HTTPError as e:
            raise ClusterError(f"could not create pod {spec.name}: {e}") from e
        return pod_from(json.loads(response.data))

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        namespace = namespace or self._namespace
        guarded = uid is not None or resource_version is not None
        options = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid, resource_version=resource_version)
            if guarded
            else None
        )
        try:
            self._core.delete_namespaced_pod(name, namespace, body=options, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                raise UnknownPod(f"no pod named {name} in namespace {namespace}") from e
            if e.status == 409 and guarded:
                # The pod is not the one the caller decided on: show the caller (and the cache)
                # what it is now, so the next decision is made on that, not repeated blindly.
                raise StalePod(
                    f"pod {namespace}/{name} no longer matches uid {uid}, version "
                    f"{resource_version}: {status_message(e)}",
                    current=self._read_again(namespace, name),
                ) from e
            raise ClusterError(
                f"could not delete pod {name}: {e.status} {status_message(e)}"
            ) from e
        except HTTPError as e:
            raise ClusterError(f"could not delete pod {name}: {e}") from e

    def _read_again(self, namespace: str, name: str) -> Pod | None:
        """The pod as the API shows it now, put into the pod cache if newer than its entry;
        ``None`` if it is gone or cannot be read (the watch will tell)."""
        try:
            response: Any = self._core.read_namespaced_pod(name, namespace, _preload_content=False)
        except (ApiException, HTTPError):
            return None
        raw = json.loads(response.data)
        self.pods.observe(raw)
        return pod_from(raw)

    def ensure_priority_class(self, name: str, value: int, *, description: str) -> None:
        body = _priority_class_body(name, value, description=description)
        try:
            self._scheduling.create_priority_class(cast(Any, body), _preload_content=False)
            return
        except ApiException as e:
            if e.status != 409:
                raise ClusterError(
                    f"could not create priority class {name}: {e.status} {status_message(e)}"
                ) from e
        except HTTPError as e:
            raise ClusterError(f"could not create priority class {name}: {e}") from e
        # It exists: fine if it is ours (an earlier attempt, another replica), not if its value
        # differs, since a class's value cannot be updated.
        try:
            response: Any = self._scheduling.read_priority_class(name, _preload_content=False)
        except (ApiException, HTTPError) as e:
            raise ClusterError(f"could not read priority class {name}: {e}") from e
        existing = json.loads(response.data).get("value")
        if existing != value:
            raise PriorityClassConflict(
                f"priority class {name} exists with value {existing}, not {value}"
            )


def _priority_class_body(name: str, value: int, *, description: str) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1`` PriorityClass: never the global default, preempting lower
    priorities (the API's default policy, spelled out)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": description,
    }


def _pod_body(spec: PodSpec) -> dict[str, Any]:
    requests = {"cpu": f"{spec.cpu_millis}m", "memory": f"{spec.memory_mib}Mi"}
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": requests},
            }
        ],
        "schedulerName": spec.scheduler_name,
    }
    if spec.priority_class_name is not None:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if spec.node is not None:
        pod_spec["nodeName"] = spec.node
    metadata: dict[str, Any] = {
        "name": spec.name,
        "labels": dict(spec.labels),
        "annotations": dict(spec.annotations),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
