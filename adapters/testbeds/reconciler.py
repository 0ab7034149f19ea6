"""The ghost-pod reconciler: observe the cluster, record it, apply the testbed's diff.

One pass for a testbed (:meth:`GhostPodReconciler.reconcile`):

1. list the nodes carrying the testbed's label and the testbed's pods — its ghost pods (by the
   :data:`GHOST_LABEL`) and the job pods annotated with its name — and decide ``ObserveCluster``
   (nothing is appended when nothing changed). A ghost pod that ended (phase ``Failed`` or
   ``Succeeded``, or evicted by its kubelet: reason ``Evicted``) is shown as ``failed``, so the
   domain replaces it under a fresh name; a job pod that ended holds no slot and is left out;
2. apply :func:`fleetledger.domain.testbeds.reconcile` of the new state through the
   :class:`~fleetledger.adapters.cluster.ClusterGateway`: delete the undesired ghost pods, each
   in the namespace it was observed in and with the uid and resource version it was observed
   with as the delete's preconditions (a newer pod that took the name, or the pod changed since,
   is left alone: :class:`~fleetledger.adapters.cluster.StalePod`), then create the missing ones.
   A pod already created (or already gone) is skipped, so a pass repeated after a crash, or run
   twice, changes nothing more. When a delete was refused as stale the decision was made on a
   cluster that is no more: the pass observes again and decides again, once, on what it reads
   (never repeating the refused delete as it was); what is still contested waits for the next
   pass;
3. observe again when it acted, so the log shows the result.

Ghost pods get their priority only from their PriorityClass (:data:`GHOST_PRIORITY_CLASS`,
value :data:`GHOST_PRIORITY`, below every job pod's): a pod may not set ``spec.priority``
itself, and admission refuses one naming a class that does not exist. The reconciler makes sure
the class exists before its first ghost, and again should admission refuse a ghost for want of
it.

Problems the diff reports (a node without room for its slots, conflicting pods) are logged when
they change; they need an operator.
"""

from __future__ import annotations

import threading

import structlog

from fleetledger.adapters.cluster import (
    ClusterGateway,
    NoRoom,
    Pod,
    PodExists,
    PodSpec,
    StalePod,
    UnknownPod,
    UnknownPriorityClass,
)
from fleetledger.domain.testbeds import SEED_TESTBED_LABEL, TESTBED_ANNOTATION, testbed

from .service import TestbedsService

__all__ = [
    "GHOST_LABEL",
    "GHOST_PRIORITY",
    "GHOST_PRIORITY_CLASS",
    "POSITION_ANNOTATION",
    "SLOT_ANNOTATION",
    "GhostPodReconciler",
]

log = structlog.get_logger(__name__)

GHOST_LABEL = "fleetledger.io/ghost-of"
"""Carried by every ghost pod: the name of its testbed."""
POSITION_ANNOTATION = "fleetledger.io/position-on-node"
SLOT_ANNOTATION = "fleetledger.io/slot-id"
GHOST_PRIORITY_CLASS = "fleetledger-ghost"
"""The PriorityClass of ghost pods (created by the reconciler if absent)."""
GHOST_PRIORITY = -1000
"""Its value: below the default priority (0) and any job's class, so every job pod may preempt
a ghost pod."""

_ENDED = frozenset({"Succeeded", "Failed"})
_EVICTED = "Evicted"


class GhostPodReconciler:
    """Keeps every testbed's ghost pods as its slots want them."""

    def __init__(
        self,
        service: TestbedsService,
        cluster: ClusterGateway,
        *,
        priority_class: str = GHOST_PRIORITY_CLASS,
        priority: int = GHOST_PRIORITY,
    ) -> None:
        self._service = service
        self._cluster = cluster
        self._priority_class = priority_class
        self._priority = priority
        self._class_ensured = False
        self._problems: dict[str, tuple[str, ...]] = {}
        self._observed: dict[str, dict[str, Pod]] = {}
        """Per testbed, its pods at the last observation by uid: where a delete finds the
        namespace and resource version the decision was made on."""
        self._lock = threading.Lock()

    def ensure_priority_class(self) -> None:
        """Make sure the ghost pods' PriorityClass exists (once, until admission says it is
        gone); :class:`~fleetledger.adapters.cluster.PriorityClassConflict` if it exists with
        another value."""
        self._cluster.ensure_priority_class(
            self._priority_class,
            self._priority,
            description="fleetledger ghost pods: hold testbed slots until a job pod preempts them",
        )
        with self._lock:
            self._class_ensured = True

    def observe(self, name: str) -> int:
        """Record what the cluster shows of the testbed; returns how many events that took."""
        stream = self._service.testbed(name)
        defined = stream.state.defined
        if defined is None:
            return 0
        # Taken before listing: a reservation made while the cluster is listed must not be
        # judged against a listing that predates its pod (see ``ObserveCluster``).
        listed_at = self._service.clock.now()
        nodes = tuple(
            testbed.ObservedNode(n.name, n.labels[defined.node_label], n.cpu_millis, n.memory_mib)
            for n in self._cluster.list_nodes(label=defined.node_label)
        )
        listed = [
            p
            for p in self._cluster.list_pods()
            if _belongs(p, name) and (GHOST_LABEL in p.labels or not _ended(p))
        ]
        with self._lock:
            self._observed[name] = {p.uid: p for p in listed}
        pods = tuple(_observed(p) for p in listed)
        decision = self._service.execute(
            stream,
            lambda _: testbed.ObserveCluster(nodes, pods, at=listed_at),
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
        # Deletions first: a resized slot's new ghost only fits once the old one is gone.
        acted, stale = self._delete(name, plan.delete)
        if stale:
            changes += self.observe(name)
            plan = testbed.reconcile(self._service.testbed(name).state)
            self._report(name, plan.problems)
            again, _ = self._delete(name, plan.delete)
            acted += again
        if plan.create:
            with self._lock:
                ensured = self._class_ensured
            if not ensured:
                self.ensure_priority_class()
        for ghost in plan.create:
            spec = PodSpec(
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
                priority_class_name=self._priority_class,
            )
            try:
                try:
                    self._cluster.create_pod(spec)
                except UnknownPriorityClass:
                    # Deleted behind our back since we ensured it: once more, then the ghost.
                    self.ensure_priority_class()
                    self._cluster.create_pod(spec)
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

    def _delete(self, name: str, doomed: tuple[tuple[str, str], ...]) -> tuple[int, int]:
        """Delete ``doomed`` (pod name, uid) as observed; returns how many went and how many
        were refused as stale."""
        with self._lock:
            observed = dict(self._observed.get(name, {}))
        deleted = stale = 0
        for pod, uid in doomed:
            seen = observed.get(uid)
            try:
                self._cluster.delete_pod(
                    pod,
                    namespace=seen.namespace if seen is not None else None,
                    uid=uid,
                    resource_version=(seen.resource_version or None) if seen is not None else None,
                )
                deleted += 1
            except UnknownPod:
                continue
            except StalePod as e:
                stale += 1
                log.info("ghost pod changed since observed; deciding again", pod=pod, error=str(e))
        return deleted, stale

    def _report(self, name: str, problems: tuple[str, ...]) -> None:
        with self._lock:
            if self._problems.get(name) == problems:
                return
            self._problems[name] = problems
        for problem in problems:
            log.warning("testbed needs an operator", testbed=name, problem=problem)


def _belongs(pod: Pod, name: str) -> bool:
    if GHOST_LABEL in pod.labels:
        return pod.labels[GHOST_LABEL] == name
    # A job's pod, by this project's annotation or the original operator's label.
    return name in (pod.annotations.get(TESTBED_ANNOTATION), pod.labels.get(SEED_TESTBED_LABEL))


def _ended(pod: Pod) -> bool:
    return pod.phase in _ENDED or pod.reason == _EVICTED


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
        failed=ghost and _ended(pod),
    )
