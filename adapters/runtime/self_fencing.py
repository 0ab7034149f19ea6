"""Self-fencing: a leader that cannot renew its lease stops acting before the lease can pass.

The log fences a deposed leader's *appends* (its term is refused once a newer one is recorded),
but not its calls to the cloud or the cluster: a leader cut off from the database goes on
believing it leads until its renewal fails, and by then another process may lead and make the
same calls. So every side-effect port of a leading process is wrapped in a guard that asks the
process's :class:`~fleetledger.adapters.runtime.leadership.Leadership` first
(:meth:`~fleetledger.adapters.runtime.leadership.Leadership.may_act`): a call is made only while
this process leads and before its acting deadline (last renewal + lease − safety margin, on the
monotonic clock). Otherwise the guard raises :class:`LeaseExpired` without calling, and the
leader steps down; the work is left to the next leader, who reads before it re-sends.

The guards wrap the ports where ``serve`` wires them, so the code calling a port is unchanged:

- :class:`FencedCloud` — ``CloudMachines`` (creates, and reads: a read may delete a failed
  leftover, and a stepping-down leader has no business resuming a create's wait);
- :class:`FencedCluster` — ``ClusterGateway`` writes (pods, priority classes); its reads come
  from the informers' caches and need no lease;
- :class:`FencedApplications` — the testbeds' ``Applications`` (create, delete; ``phase`` reads).

A guard checks before the call, not during it: a call already under way when the deadline
passes carries on (the deadline's margin is there for it to reach the provider).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from fleetledger.adapters.cluster import ClusterHealth

from .errors import Deposed

if TYPE_CHECKING:
    from fleetledger.adapters.cloud import (
        BatchCreate,
        BatchCreateResult,
        CloudMachines,
        MachineObservation,
        ProgressCallback,
    )
    from fleetledger.adapters.cluster import ClusterGateway, Node, Pod, PodSpec
    from fleetledger.adapters.testbeds.applications import Applications
    from fleetledger.domain.testbeds import ApplicationPhase

__all__ = [
    "ActingLeader",
    "FencedApplications",
    "FencedCloud",
    "FencedCluster",
    "LeaseExpired",
    "SelfFence",
]


class LeaseExpired(Deposed):
    """Raised by a guarded port instead of calling: this process does not lead, or its lease
    may have passed to another process. Nothing was sent; leave the work to the next leader."""


class ActingLeader(Protocol):
    """What a guard asks: the term to act in, or ``None`` (see ``Leadership.may_act``)."""

    def may_act(self) -> int | None: ...

    @property
    def last_term(self) -> int | None: ...


class SelfFence:
    """The one check every guard makes before a side effect."""

    __slots__ = ("_leader",)

    def __init__(self, leader: ActingLeader) -> None:
        self._leader = leader

    def check(self, action: str) -> int:
        """The term to act in; :class:`LeaseExpired` (nothing done) when this process must not
        act now."""
        term = self._leader.may_act()
        if term is None:
            last = self._leader.last_term or 0
            raise LeaseExpired(
                f"not {action}: this process does not hold the lease now (its lease may have "
                "passed to another process); the next leader does it",
                term=last,
                current_term=last,
            )
        return term


class FencedCloud:
    """``CloudMachines`` that calls the cloud only while the process may act."""

    def __init__(self, cloud: CloudMachines, fence: SelfFence) -> None:
        self.inner = cloud
        self._fence = fence

    def create_batch(
        self, request: BatchCreate, *, on_progress: ProgressCallback | None = None
    ) -> BatchCreateResult:
        self._fence.check(f"creating batch {request.batch_id}")
        return self.inner.create_batch(request, on_progress=on_progress)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        self._fence.check(f"reading machine {machine_name}")
        return self.inner.read_machine(machine_name, resume_token=resume_token)


class FencedCluster:
    """A ``ClusterGateway`` whose writes are made only while the process may act."""

    def __init__(self, cluster: ClusterGateway, fence: SelfFence) -> None:
        self.inner = cluster
        self._fence = fence

    def list_nodes(self, *, label: str | None = None) -> Sequence[Node]:
        return self.inner.list_nodes(label=label)

    def list_pods(self, *, labels: Mapping[str, str] | None = None) -> Sequence[Pod]:
        return self.inner.list_pods(labels=labels)

    def create_pod(self, spec: PodSpec) -> Pod:
        self._fence.check(f"creating pod {spec.name}")
        return self.inner.create_pod(spec)

    def delete_pod(
        self,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        self._fence.check(f"deleting pod {name}")
        self.inner.delete_pod(name, namespace=namespace, uid=uid, resource_version=resource_version)

    def ensure_priority_class(self, name: str, value: int, *, description: str) -> None:
        self._fence.check(f"ensuring priority class {name}")
        self.inner.ensure_priority_class(name, value, description=description)

    # The inner gateway's health (ClusterHealth), when it keeps caches; none to report else.

    def staleness_seconds(self) -> Mapping[str, float]:
        inner = self.inner
        return inner.staleness_seconds() if isinstance(inner, ClusterHealth) else {}

    def problems(self) -> Sequence[str]:
        inner = self.inner
        return inner.problems() if isinstance(inner, ClusterHealth) else []


class FencedApplications:
    """The testbeds' ``Applications``, created and deleted only while the process may act."""

    def __init__(self, applications: Applications, fence: SelfFence) -> None:
        self.inner = applications
        self._fence = fence

    def create(self, manifest: Mapping[str, object]) -> None:
        self._fence.check("creating an application")
        self.inner.create(manifest)

    def delete(self, name: str) -> None:
        self._fence.check(f"deleting application {name}")
        self.inner.delete(name)

    def phase(self, name: str) -> ApplicationPhase:
        return self.inner.phase(name)
