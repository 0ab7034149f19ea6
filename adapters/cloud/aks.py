"""``CloudMachines`` on the AKS machines API: one PUT per batch.

Seed 01 ("BatchPutMachine Header"): the PUT body carries the shared template once; the
``BatchPutMachine`` header lists every machine of the batch with its name, zones and tags. The
PUT is addressed to the batch's first machine (the API's resource URL names one machine); the
header, not the URL, says which machines to make.

azure-mgmt-containerservice 41.8 only has ``machines.get``/``list`` — creating machines is in the
preview API (``2025-07-02-preview``), not in the installed SDK — so the PUT and the operation
polling go through the same client's pipeline with ``send_request`` (same credential, retry,
logging and user-agent policies); reads use the SDK's ``machines.get``.

Wire shape, and how this adapter reads it:

- ``201`` + ``Azure-AsyncOperation``: accepted. Each machine gets a :class:`ProgressNote` whose
  token is the operation URL. The terminal operation body is read as::

      {"status": "Succeeded" | "Failed" | "Canceled",
       "properties": {"machines": [{"name", "id", "provisioningState": "Succeeded"}, ...]},
       "error": {"code": "MultipleErrorsOccurred", "message": ...,
                 "details": [{"code": "ZonalAllocationFailed", "target": "<machine>", ...}]}}

  listed machines are *created* (``id`` is the provider id); a ``details`` entry whose ``target``
  names a machine *fails* that machine; an error without targeted details fails every machine not
  listed; anything else stays *unknown*. An operation still running at ``poll_timeout`` leaves
  every machine unknown (read them later with the token).
- non-2xx: the batch was refused. Targeted ``details`` fail the machines they name (the rest are
  unknown); without them the whole call raises the classified :class:`CloudError`.
- the answer to the PUT is lost (``ServiceResponseError``): every machine is unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from azure.core.exceptions import AzureError, ResourceNotFoundError, ServiceResponseError
from azure.core.rest import HttpRequest, HttpResponse

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.domain.template import MachineTemplate

from .arm import provisioning_status, sole_zone
from .errors import CloudError, classify_arm_error, from_azure_error, retry_after_seconds
from .port import (
    BATCH_PUT_MACHINE_HEADER,
    BatchCreate,
    BatchCreateResult,
    MachineObservation,
    ProgressNote,
    encode_batch_put_machine_header,
)

if TYPE_CHECKING:
    from azure.mgmt.containerservice import ContainerServiceClient

__all__ = ["PREVIEW_API_VERSION", "AksMachinesCloud", "machine_body"]

#: The first API version with machine create (``Machines_CreateOrUpdate``).
PREVIEW_API_VERSION = "2025-07-02-preview"

_TERMINAL = frozenset({"succeeded", "failed", "canceled"})


class AksMachinesCloud:
    """Creates machines in one AKS agent pool, a batch per PUT."""

    def __init__(
        self,
        client: ContainerServiceClient,
        *,
        resource_group: str,
        cluster_name: str,
        agent_pool: str,
        clock: Clock | None = None,
        api_version: str = PREVIEW_API_VERSION,
        poll_interval: float = 5.0,
        poll_timeout: float = 900.0,
    ) -> None:
        for name, value in (
            ("resource_group", resource_group),
            ("cluster_name", cluster_name),
            ("agent_pool", agent_pool),
            ("api_version", api_version),
        ):
            if not value:
                raise ValueError(f"AksMachinesCloud needs a non-empty {name}")
        if poll_interval < 0 or poll_timeout < 0:
            raise ValueError("poll_interval and poll_timeout are seconds and must be >= 0")
        self._client = client
        self._resource_group = resource_group
        self._cluster_name = cluster_name
        self._agent_pool = agent_pool
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._api_version = api_version
        self._poll_interval = poll_interval
        self._poll_timeout = timedelta(seconds=poll_timeout)

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: Callable[[ProgressNote], None] | None = None,
    ) -> BatchCreateResult:
        put = HttpRequest(
            "PUT",
            self._machine_path(request.machines[0].machine_name),
            params={"api-version": self._api_version},
            headers={BATCH_PUT_MACHINE_HEADER: encode_batch_put_machine_header(request.machines)},
            json=machine_body(request.template),
        )
        try:
            response = self._client.send_request(put)
        except ServiceResponseError:
            return BatchCreateResult()  # sent, answer lost: the batch may exist; all unknown
        except AzureError as e:
            raise from_azure_error(e) from e
        if response.status_code not in (200, 201):
            return _refused(request, response)
        operation_url = response.headers.get("Azure-AsyncOperation")
        if operation_url is None:
            # Our protocol always answers with an operation; without one nothing is known.
            return BatchCreateResult()
        if on_progress is not None:
            for name in request.machine_names:
                on_progress(ProgressNote(name, operation_url))
        operation = self._await(operation_url)
        if operation is None:
            return BatchCreateResult()
        return _outcomes(request, operation)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        if resume_token is not None:
            # Resuming is waiting for the batch's operation to end; the machine then says how
            # it went (its provisioningError carries the classified failure).
            self._await(resume_token)
        try:
            machine = self._client.machines.get(
                self._resource_group, self._cluster_name, self._agent_pool, machine_name
            )
        except ResourceNotFoundError:
            return MachineObservation(machine_name, "not_found")
        except AzureError as e:
            raise from_azure_error(e) from e
        # The stable SDK model predates provisioningState; its raw mapping still carries it.
        return _observation_of(machine_name, machine)

    # -- internals ------------------------------------------------------------------------------

    def _machine_path(self, machine_name: str) -> str:
        # The generated client keeps the subscription only in its config; reading it there keeps
        # the PUT and the SDK's own GET on the same subscription.
        subscription = self._client._config.subscription_id
        parts = (subscription, self._resource_group, self._cluster_name, self._agent_pool)
        s, rg, cluster, pool = (quote(p, safe="") for p in parts)
        return (
            f"/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.ContainerService"
            f"/managedClusters/{cluster}/agentPools/{pool}/machines/{quote(machine_name, safe='')}"
        )

    def _await(self, operation_url: str) -> Mapping[str, Any] | None:
        """The operation's terminal body, or ``None`` if it could not be learnt in time."""
        deadline = self._clock.now() + self._poll_timeout
        while True:
            try:
                response = self._client.send_request(HttpRequest("GET", operation_url))
            except AzureError:
                return None
            if response.status_code != 200:
                return None
            body = _json_object(response)
            if str(body.get("status", "")).lower() in _TERMINAL:
                return body
            if self._clock.now() >= deadline:
                return None
            wait = retry_after_seconds(response.headers)
            self._clock.sleep(self._poll_interval if wait is None else wait)


def machine_body(template: MachineTemplate) -> dict[str, object]:
    """The PUT body: the template as an AKS machine's properties (per-machine fields excluded)."""
    hardware: dict[str, object] = {"vmSize": template.vm_size}
    if template.gpu_profile is not None:
        hardware["gpuInstanceProfile"] = template.gpu_profile  # agent pools' name for it
    kubernetes = _present(
        orchestratorVersion=template.orchestrator_version,
        maxPods=template.max_pods,
        kubeletConfig=dict(template.kubelet_config) or None,
    )
    operating_system = _present(
        osType="Linux",
        osSKU=template.os_sku,
        osDiskSizeGB=template.os_disk_size_gb,
        osDiskType=template.os_disk_type,
        enableFips=template.enable_fips,
    )
    properties: dict[str, object] = {
        "hardware": hardware,
        "kubernetes": kubernetes,
        "operatingSystem": operating_system,
        "mode": template.mode,
        "priority": "Spot" if template.priority == "spot" else "Regular",
    }
    if template.vnet_subnet_id is not None:
        properties["network"] = {"vnetSubnetID": template.vnet_subnet_id}
    return {"properties": properties}


def _present(**fields: object) -> dict[str, object]:
    return {k: v for k, v in fields.items() if v is not None}


def _refused(request: BatchCreate, response: HttpResponse) -> BatchCreateResult:
    """A non-2xx answer: per-machine refusals if the error names machines, else raise."""
    error = _json_object(response).get("error") or {}
    failed, untargeted = _failures(
        request,
        error,
        status=response.status_code,
        retry_after=retry_after_seconds(response.headers),
    )
    if failed:
        return BatchCreateResult(failed=failed)
    raise untargeted


def _outcomes(request: BatchCreate, operation: Mapping[str, Any]) -> BatchCreateResult:
    properties = operation.get("properties") or {}
    created = {
        str(m["name"]): str(m.get("id") or m["name"])
        for m in properties.get("machines") or []
        if m.get("name") in request.machine_names
        and str(m.get("provisioningState", "")).lower() == "succeeded"
    }
    failed: dict[str, CloudError] = {}
    error = operation.get("error")
    if error:
        failed, untargeted = _failures(request, error)
        if not failed:
            # The operation failed as a whole: that verdict covers every machine not listed.
            failed = {n: untargeted for n in request.machine_names if n not in created}
    return BatchCreateResult(created=created, failed=failed)


def _failures(
    request: BatchCreate,
    error: Mapping[str, Any],
    *,
    status: int | None = None,
    retry_after: float | None = None,
) -> tuple[dict[str, CloudError], CloudError]:
    """Per-machine errors from ``details[].target``, and the error itself, classified."""
    failed: dict[str, CloudError] = {}
    for detail in error.get("details") or []:
        target = detail.get("target")
        if target not in request.machine_names:
            continue
        failed[target] = classify_arm_error(
            detail.get("code"),
            detail.get("message") or "",
            zone=request.spec(target).zone,
        )
    untargeted = classify_arm_error(
        error.get("code"), error.get("message") or "", status=status, retry_after=retry_after
    )
    return failed, untargeted


def _observation_of(machine_name: str, machine: Mapping[str, Any]) -> MachineObservation:
    properties: Mapping[str, Any] = machine.get("properties") or {}
    state = str(properties.get("provisioningState", ""))
    status = provisioning_status(state)
    error: CloudError | None = None
    if status == "failed":
        problem = (properties.get("status") or {}).get("provisioningError") or {}
        error = classify_arm_error(
            problem.get("code") or "ProvisioningFailed",
            problem.get("message") or f"machine {machine_name} is {state.lower()}",
            zone=sole_zone(machine.get("zones")),
        )
    provider_id = str(machine["id"]) if machine.get("id") else None
    return MachineObservation(machine_name, status, provider_id, error)


def _json_object(response: HttpResponse) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
