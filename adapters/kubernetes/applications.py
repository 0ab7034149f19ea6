"""The :class:`~fleetledger.adapters.testbeds.applications.Applications` port on a real cluster:
``SparkApplication`` and ``FlinkDeployment`` objects through the official client's
``CustomObjectsApi``, in one namespace.

* :meth:`KubernetesApplications.create` posts the manifest to its kind's resource;
  ``409 AlreadyExists`` means an earlier attempt landed, so creating is idempotent.
* :meth:`KubernetesApplications.phase` reads the object and maps its operator's status (below);
  ``404`` is ``absent``.
* :meth:`KubernetesApplications.delete` deletes with ``propagationPolicy: Foreground`` (by
  default): the object stays, marked for deletion, until the garbage collector has deleted its
  dependents (the driver, the job manager's deployment, and through them the executor and task
  manager pods), so ``absent`` means the pods are gone too. ``404`` is a no-op.

The port names applications without their kind. The adapter remembers the kind of every
application it created; for a name it does not know (another process created it, or this one
restarted) it tries ``sparkapplications`` and then ``flinkdeployments``: a job's application is
one or the other under its own name.

**Phases.** Spark (``status.applicationState.state``)::

    "" (new), SUBMITTED, PENDING_RERUN, INVALIDATING,
    SUSPENDING, SUSPENDED, RESUMING, UNKNOWN              -> pending
    RUNNING, SUCCEEDING, FAILING                          -> running
    COMPLETED                                             -> completed
    FAILED, SUBMISSION_FAILED                             -> failed

``SUCCEEDING`` and ``FAILING`` are the driver's end being processed; with the restart policy
``Never`` they become ``COMPLETED`` and ``FAILED``. ``UNKNOWN`` (the driver pod's state is lost,
its node gone) reports no progress rather than a guess.

Flink (``status.jobStatus.state``, the Flink job's own state, and ``status.lifecycleState``)::

    job FINISHED                                          -> completed
    job FAILED or CANCELED, or lifecycle FAILED           -> failed
    job RUNNING, FAILING, CANCELLING, RESTARTING,
        RECONCILING                                       -> running
    anything else (no job status yet, INITIALIZING,
        CREATED, SUSPENDED)                               -> pending

A lifecycle of ``FAILED`` covers a deployment the operator refused (``status.error``) before any
job ran. Neither operator reports "every pod placed" on its own, so this adapter never answers
``scheduled``: the job may skip it.

Errors are translated at this edge into the applications error tree: ``400``/``422`` (a manifest
the API refuses) :class:`InvalidApplication`, ``404`` on create (no such resource: the operator's
CRD is not installed) :class:`OperatorMissing`, anything else or an unreachable API
:class:`ApplicationsUnavailable`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any, Literal, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from fleetledger.adapters.testbeds.applications import (
    ApplicationsUnavailable,
    InvalidApplication,
    OperatorMissing,
)
from fleetledger.adapters.testbeds.manifests import (
    APPLICATION_RESOURCES,
    FLINK_DEPLOYMENT,
    SPARK_APPLICATION,
    ApplicationResource,
    ManifestError,
    resource_of,
)
from fleetledger.domain.testbeds import ApplicationPhase

from .status import status_message

__all__ = ["KubernetesApplications", "flink_phase", "spark_phase"]

Propagation = Literal["Foreground", "Background"]

_SPARK_PHASES: dict[str, ApplicationPhase] = {
    "": "pending",
    "SUBMITTED": "pending",
    "PENDING_RERUN": "pending",
    "INVALIDATING": "pending",
    "SUSPENDING": "pending",
    "SUSPENDED": "pending",
    "RESUMING": "pending",
    "UNKNOWN": "pending",
    "RUNNING": "running",
    "SUCCEEDING": "running",
    "FAILING": "running",
    "COMPLETED": "completed",
    "FAILED": "failed",
    "SUBMISSION_FAILED": "failed",
}
_FLINK_JOB_PHASES: dict[str, ApplicationPhase] = {
    "FINISHED": "completed",
    "FAILED": "failed",
    "CANCELED": "failed",
    "RUNNING": "running",
    "FAILING": "running",
    "CANCELLING": "running",
    "RESTARTING": "running",
    "RECONCILING": "running",
}


def spark_phase(obj: Mapping[str, Any]) -> ApplicationPhase:
    """A ``SparkApplication``'s phase, from its operator's status (see the module docstring)."""
    status = obj.get("status") or {}
    state = str((status.get("applicationState") or {}).get("state") or "")
    return _SPARK_PHASES.get(state, "pending")


def flink_phase(obj: Mapping[str, Any]) -> ApplicationPhase:
    """A ``FlinkDeployment``'s phase, from its operator's status (see the module docstring)."""
    status = obj.get("status") or {}
    job = str((status.get("jobStatus") or {}).get("state") or "")
    phase = _FLINK_JOB_PHASES.get(job)
    if phase in ("completed", "failed"):
        return phase
    if status.get("lifecycleState") == "FAILED":
        return "failed"
    return phase or "pending"


_PHASE_OF = {SPARK_APPLICATION: spark_phase, FLINK_DEPLOYMENT: flink_phase}


class KubernetesApplications:
    """Spark and Flink applications in ``namespace``, through the Kubernetes API."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        namespace: str = "default",
        propagation: Propagation = "Foreground",
    ) -> None:
        self._api = client.CustomObjectsApi(api_client)
        self._namespace = namespace
        self._propagation = propagation
        self._lock = threading.Lock()
        self._kinds: dict[str, ApplicationResource] = {}

    def create(self, manifest: Mapping[str, object]) -> None:
        try:
            resource = resource_of(manifest)
        except ManifestError as e:
            raise InvalidApplication(str(e)) from e
        metadata = manifest.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        if not isinstance(name, str) or not name:
            raise InvalidApplication("the manifest has no metadata.name")
        namespace = cast(Mapping[str, object], metadata).get("namespace", self._namespace)
        if namespace != self._namespace:
            raise InvalidApplication(
                f"application {name} is for namespace {namespace}; this adapter serves "
                f"{self._namespace}"
            )
        try:
            self._api.create_namespaced_custom_object(
                resource.group,
                resource.version,
                self._namespace,
                resource.plural,
                cast(Any, dict(manifest)),
                _preload_content=False,
            )
        except ApiException as e:
            if e.status == 409:
                self._remember(name, resource)
                return
            if e.status in (400, 422):
                raise InvalidApplication(
                    f"{resource.kind} {name} refused: {status_message(e)}"
                ) from e
            if e.status == 404:
                raise OperatorMissing(
                    f"the API does not serve {resource.plural}.{resource.group}/"
                    f"{resource.version}: is the operator's CRD installed? ({status_message(e)})"
                ) from e
            raise ApplicationsUnavailable(
                f"could not create {resource.kind} {name}: {e.status} {status_message(e)}"
            ) from e
        except HTTPError as e:
            raise ApplicationsUnavailable(f"could not create {resource.kind} {name}: {e}") from e
        self._remember(name, resource)

    def phase(self, name: str) -> ApplicationPhase:
        for resource in self._candidates(name):
            obj = self._read(resource, name)
            if obj is not None:
                self._remember(name, resource)
                return _PHASE_OF[resource](obj)
        return "absent"

    def delete(self, name: str) -> None:
        options = client.V1DeleteOptions(propagation_policy=self._propagation)
        for resource in self._candidates(name):
            try:
                self._api.delete_namespaced_custom_object(
                    resource.group,
                    resource.version,
                    self._namespace,
                    resource.plural,
                    name,
                    body=options,
                    _preload_content=False,
                )
            except ApiException as e:
                if e.status == 404:
                    continue
                raise ApplicationsUnavailable(
                    f"could not delete {resource.kind} {name}: {e.status} {status_message(e)}"
                ) from e
            except HTTPError as e:
                raise ApplicationsUnavailable(
                    f"could not delete {resource.kind} {name}: {e}"
                ) from e

    def _read(self, resource: ApplicationResource, name: str) -> dict[str, Any] | None:
        try:
            response: Any = self._api.get_namespaced_custom_object(
                resource.group,
                resource.version,
                self._namespace,
                resource.plural,
                name,
                _preload_content=False,
            )
        except ApiException as e:
            # Also the answer for a resource nobody serves (that operator is not installed):
            # no application of that kind, either way.
            if e.status == 404:
                return None
            raise ApplicationsUnavailable(
                f"could not read {resource.kind} {name}: {e.status} {status_message(e)}"
            ) from e
        except HTTPError as e:
            raise ApplicationsUnavailable(f"could not read {resource.kind} {name}: {e}") from e
        body = json.loads(response.data)
        return body if isinstance(body, dict) else None

    def _candidates(self, name: str) -> tuple[ApplicationResource, ...]:
        with self._lock:
            known = self._kinds.get(name)
        return (known,) if known is not None else APPLICATION_RESOURCES

    def _remember(self, name: str, resource: ApplicationResource) -> None:
        with self._lock:
            self._kinds[name] = resource
