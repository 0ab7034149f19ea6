"""The ghost-pod reconciler: observe the cluster, record it, apply the testbed's diff.

One pass for a testbed (:meth:`GhostPodReconciler.reconcile`):

1. list the nodes carrying the testbed's label and the testbed's pods — its ghost pods (by the
   :data:`GHOST_LABEL`) and the job pods annotated with its name — and decide ``ObserveCluster``
   (nothing is appended when nothing changed);
2. apply :func:`fleetledger.domain.testbeds.reconcile` of the new state through the
   :class:`~fleetledger.adapters.cluster.ClusterGateway`: delete the undesired ghost pods, then
   create the missing ones. A pod already created (or already gone) is skipped, so a pass repeated
   after a crash, or run twice, changes nothing more;
3. observe again when it acted, so the log shows the result.

Problems the diff reports (a node without room for its slots, conflicting pods) are logged when
they change; they need an operator.
"""

from __future__ import annotations

import threading

import structlog

from fleetledger.adapters.cluster import ClusterGateway, NoRoom, Pod, PodExists, PodSpec, UnknownPod
from fleetledger.domain.testbeds import TESTBED_ANNOTATION, testbed

from .service import TestbedsService

__all__ = ["GHOST_LABEL", "POSITION_ANNOTATION", "SLOT_ANNOTATION", "GhostPodReconciler"]

log = structlog.get_logger(__name__)

GHOST_LABEL = "fleetledger.io/ghost-of"
"""Carried by every ghost pod: the name of its testbed."""
POSITION_ANNOTATION = "fleetledger.io/position-on-node"
SLOT_ANNOTATION = "fleetledger.io/slot-id"
GHOST_PRIORITY = 0
"""Ghost pods have the lowest priority: any job pod may preempt them."""

_ENDED = frozenset({"Succeeded", "Failed"})


class GhostPodReconciler:
    """Keeps every testbed's ghost pods as its slots want them."""

    def __init__(self, service: TestbedsService, cluster: ClusterGateway) -> None:
        self._service = service
        self._cluster = cluster
        self._problems: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def observe(self, name: str) -> int:
        """Record what the cluster shows of the testbed; returns how many events that took."""
        stream = self._service.testbed(name)
        defined = stream.state.defined
        if defined is None:
            return 0
        nodes = tuple(
            testbed.ObservedNode(n.name, n.labels[defined.node_label], n.cpu_millis, n.memory_mib)
            for n in self._cluster.list_nodes(label=defined.node_label)
        )
        pods = tuple(
            _observed(p)
            for p in self._cluster.list_pods()
            if _belongs(p, name) and p.phase not in _ENDED
        )
        decision = self._service.execute(
            stream,
            lambda at: testbed.ObserveCluster(nodes, pods, at=at),
            cause=f"observe-cluster:{name}",
            duty=True,
        )
        return len(decision.events)

    def reconcile(self, name: str) -> int:
        """One pass (see the module docstring); returns how many events and pod actions."""
        changes = self.observe(name)
        state = self._service.testbed(name).state
        defined = state.defined
        if defined is None:
            return changes
        plan = testbed.reconcile(state)
        self._report(name, plan.problems)
        acted = 0
        # Deletions first: a resized slot's new ghost only fits once the old one is gone.
        for pod in plan.delete:
            try:
                self._cluster.delete_pod(pod)
                acted += 1
            except UnknownPod:
                continue
        for ghost in plan.create:
            try:
                self._cluster.create_pod(
                    PodSpec(
                        ghost.name,
                        labels={GHOST_LABEL: name},
                        annotations={
                            POSITION_ANNOTATION: str(ghost.position_on_node),
                            SLOT_ANNOTATION: str(ghost.slot_id),
                        },
                        node=ghost.node,
                        cpu_millis=ghost.cpu_millis,
                        memory_mib=ghost.memory_mib,
                        owner=f"testbed/{name}",
                        priority=GHOST_PRIORITY,
                    )
                )
                acted += 1
            except PodExists:
                continue
            except NoRoom as e:
                log.warning(
                    "cannot place a ghost pod yet", testbed=name, pod=ghost.name, error=str(e)
                )
        if acted:
            changes += self.observe(name)
        return changes + acted

    def _report(self, name: str, problems: tuple[str, ...]) -> None:
        with self._lock:
            if self._problems.get(name) == problems:
                return
            self._problems[name] = problems
        for problem in problems:
            log.warning("testbed needs an operator", testbed=name, problem=problem)


def _belongs(pod: Pod, name: str) -> bool:
    return pod.labels.get(GHOST_LABEL) == name or (
        GHOST_LABEL not in pod.labels and pod.annotations.get(TESTBED_ANNOTATION) == name
    )


def _observed(pod: Pod) -> testbed.ObservedPod:
    ghost = GHOST_LABEL in pod.labels
    position = pod.annotations.get(POSITION_ANNOTATION)
    return testbed.ObservedPod(
        pod.name,
        pod.uid,
        pod.node,
        ghost,
        int(position) if ghost and position is not None else None,
        pod.cpu_millis,
        pod.memory_mib,
        pod.terminating,
    )
