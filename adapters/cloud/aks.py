"""``CloudMachines`` on the AKS machines API: one batch PUT, then one list of the pool per poll.

Seed 01 ("BatchPutMachine Header"): the PUT body carries the shared template once; the
``BatchPutMachine`` header lists every machine of the batch with its name, zones and tags. The
PUT is addressed to the batch's first machine (the API's resource URL names one machine); the
header, not the URL, says which machines to make. The header keeps seed 01's shape,
``{"vmSkus": {"value": []}, "batchMachines": [...]}``: the service reads ``batchMachines`` and
accepts the header with or without ``vmSkus``, and the log records the header in that shape
(:func:`fleetledger.domain.machines.batch_put_machine_header`; the adapter adds only the
ownership tags, see below), so changing the shape would change every recorded dispatch for
nothing.

The PUT is the SDK's typed ``machines.begin_create_or_update`` (azure-mgmt-containerservice
41.9.0b1 and later), with the header attached and its poller discarded. The client must speak the
preview API version those releases carry: only it can create machines, and only its machine model
has ``provisioningState`` and ``status`` (on the stable version a machine would read as creating
forever). Reads go through the same client, so through the same version.

How the service answers the batch PUT, and how this adapter reads it:

- ``2xx``: every machine of the header has started. The ``Azure-AsyncOperation`` it returns covers
  only the machine the URL names, so the machines' progress is read from the pool (see
  "Progress" below) until each is final or ``poll_timeout`` passes (then it stays *unknown*).
- a flat error body (no ``error`` wrapper) with code ``BatchMachineClientError`` lists the
  machines that did not start in ``details[]`` (``target`` is the machine name, each with its own
  code and message); with ``BatchMachineInternalServerError`` the same list is JSON inside
  ``message``. Machines not listed have started.
- any other error code applies to every machine of the batch, and nothing started: the call
  raises the classified :class:`CloudError`. A batch of more than 50 machines goes out as several
  PUTs, one after the other; when a later one is refused so (a 429, say), the machines of the
  earlier ones exist, so it is reported per machine instead, for that PUT's machines and those
  of the PUTs not sent after it.
- a lost answer or a 5xx without per-machine details: nothing is known, so each machine is read.

Progress. Each poll lists the pool's machines once (the SDK's ``machines.list``, ``GET
…/agentPools/{pool}/machines``, which pages through ``nextLink``): a batch of 50 costs one list
(and its pages) per poll, not 50 GETs. A machine of the batch the list does not show (a list can
lag a create) is read with its own GET; if the list itself fails, that poll reads nothing and
the next one tries again. The preview ``Machine``'s ``provisioningState`` decides:

- ``Succeeded``: created;
- ``Failed`` (or ``Canceled``): failed with its ``status.provisioningError``, and deleted (below);
- ``Deleting``: failed at once. Something is deleting the machine under its create, so it will
  never succeed; waiting would only hold the request until ``poll_timeout``. It is reported as a
  retryable :class:`UnknownCloudError` (provider code ``MachineDeleting``), since the name is
  free again once the deletion ends, and no delete is sent: one is already under way;
- anything else (``Creating``, ``Updating``…): still creating.

Retries. azure-core's retry policy re-sends a PUT after a 5xx, a 429 or a lost answer, and the
service answers a machine that already exists with an error, so a replayed batch would report
the machines its first attempt started as failed. The batch PUT therefore goes out with transport
retries off (``retry_total=0``); after a lost answer the machines a GET cannot find (known not to
have started) are sent once more, and a machine the service says failed is read before it is
reported failed: if it exists and its ownership tags are ours, it started after all.

Ownership: in batch mode the service discards the body's ``zones`` and ``tags`` and gives each
machine the zones and tags of its own header entry (the Karpenter Azure provider's batch design,
github.com/Azure/karpenter-provider-azure ``designs/0010-aks-machines-batch-creation.md``:
"Zone/Tags fields in the shared body will be discarded"). So the body carries neither, and
every header entry carries the machine's own tags plus the owner and the batch (:data:`OWNER_TAG`,
:data:`BATCH_TAG`) and its request id (:data:`~fleetledger.domain.machines.REQUEST_TAG`). Tags
in the body would reach no machine: a machine read back after a lost answer, a 5xx or a replay
would look like someone else's, and a failed leftover would never be deleted.

A machine is ours when its :data:`OWNER_TAG` is our owner. One with no owner tag at all but
whose :data:`REQUEST_TAG` is the request we are creating it for is ours too: it was made by an
earlier version of this adapter, whose owner tag the service discarded, and no one else could
have named it after our request. A machine under another owner's tags is never taken over: its
request fails with :class:`NameInUse`.

The header sent therefore differs from the one the coordinator records
(:func:`fleetledger.domain.machines.batch_put_machine_header`) by exactly the two ownership tags
per machine, which this adapter adds; names, zones, caller tags and request ids are the same.

Failed leftovers: a machine whose provisioning failed stays in the pool as a failed resource; it is
deleted (``delete_failed``) and the result says so (``BatchCreateResult.deleted``). One of ours
that ``read_machine`` finds failed is deleted too (``MachineObservation.deleted``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceResponseError,
)

from fleetledger.adapters.clock import Clock, SystemClock
from fleetledger.domain.machines import REQUEST_TAG
from fleetledger.domain.template import MachineTemplate

from .arm import invalid_tag_keys, provisioning_status, sole_zone
from .errors import (
    CloudError,
    CloudSetupError,
    NameInUse,
    UnknownCloudError,
    classify_arm_error,
    from_azure_error,
)
from .port import (
    BATCH_PUT_MACHINE_HEADER,
    BatchCreate,
    BatchCreateResult,
    MachineObservation,
    MachineSpec,
    ProgressCallback,
    ProgressNote,
    encode_batch_put_machine_header,
)

if TYPE_CHECKING:
    from azure.mgmt.containerservice import ContainerServiceClient
    from azure.mgmt.containerservice.models import Machine

__all__ = [
    "BATCH_TAG",
    "MAX_BATCH_MACHINES",
    "OWNER_TAG",
    "PREVIEW_API_VERSION",
    "AksMachinesCloud",
    "machine_body",
]

#: The preview API version of azure-mgmt-containerservice 41.9.0b1, the first release whose
#: ``machines.begin_create_or_update`` exists; build the client with ``api_version=`` this.
PREVIEW_API_VERSION = "2026-08-02-preview"

#: The machines API takes at most this many machines in one batch PUT, whatever the grouper's
#: ``max_batch_size``; larger batches go out as several PUTs.
MAX_BATCH_MACHINES = 50

#: Ownership tags on every machine (Azure refuses tag names containing ``/<>%&\\?``).
OWNER_TAG = "fleetledger-owner"
BATCH_TAG = "fleetledger-batch"

_BATCH_CLIENT_ERROR = "BatchMachineClientError"
_BATCH_INTERNAL_ERROR = "BatchMachineInternalServerError"
_MACHINES_MODE = "machines"
# Not an Azure error code: ours, for a machine found Deleting while we create it.
_DELETING_CODE = "MachineDeleting"


class AksMachinesCloud:
    """Creates machines in one AKS agent pool (in ``Machines`` mode), a batch per PUT."""

    def __init__(
        self,
        client: ContainerServiceClient,
        *,
        resource_group: str,
        cluster_name: str,
        agent_pool: str,
        owner: str = "fleetledger",
        clock: Clock | None = None,
        poll_interval: float = 5.0,
        poll_timeout: float = 900.0,
        max_batch_machines: int = MAX_BATCH_MACHINES,
        delete_failed: bool = True,
    ) -> None:
        for name, value in (
            ("resource_group", resource_group),
            ("cluster_name", cluster_name),
            ("agent_pool", agent_pool),
            ("owner", owner),
        ):
            if not value:
                raise ValueError(f"AksMachinesCloud needs a non-empty {name}")
        if poll_interval < 0 or poll_timeout < 0:
            raise ValueError("poll_interval and poll_timeout are seconds and must be >= 0")
        if not 1 <= max_batch_machines <= MAX_BATCH_MACHINES:
            raise ValueError(
                f"max_batch_machines must be 1-{MAX_BATCH_MACHINES} (the API's limit), "
                f"got {max_batch_machines}"
            )
        api_version = str(getattr(client._config, "api_version", ""))
        if not api_version.endswith("-preview"):
            raise CloudSetupError(
                f"the ContainerServiceClient speaks API version {api_version!r}, which cannot "
                f"create machines and reads them without a provisioning state; build it with "
                f"api_version={PREVIEW_API_VERSION!r}"
            )
        self._client = client
        self._resource_group = resource_group
        self._cluster_name = cluster_name
        self._agent_pool = agent_pool
        self._owner = owner
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._poll_interval = poll_interval
        self._poll_timeout = timedelta(seconds=poll_timeout)
        self._max_batch = max_batch_machines
        self._delete_failed = delete_failed
        self._check_agent_pool()

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        bad = {m.machine_name: invalid_tag_keys(m.tags) for m in request.machines}
        if any(bad.values()):
            # The header must list every machine of the batch as recorded, so one machine cannot
            # be left out: the batch is refused before anything is sent.
            named = "; ".join(f"{n}: {', '.join(keys)}" for n, keys in bad.items() if keys)
            raise UnknownCloudError(
                f"Azure refuses tag names containing / < > % & \\ ?; rename them ({named})",
                provider_code="InvalidRequest",
            )
        created: dict[str, str] = {}
        failed: dict[str, CloudError] = {}
        deleted: list[str] = []
        refusal: CloudError | None = None
        for start in range(0, len(request.machines), self._max_batch):
            part = request.machines[start : start + self._max_batch]
            if refusal is not None:
                # Not sent: the same PUT would meet the same refusal (a 429 only earns more).
                failed.update(dict.fromkeys((m.machine_name for m in part), refusal))
                continue
            try:
                result = self._create_part(request, part, on_progress)
            except CloudError as e:
                if start == 0:
                    raise  # nothing of the batch was sent yet: the whole call was refused
                # The earlier parts' machines exist: raising would say nothing was created.
                refusal = e
                failed.update(dict.fromkeys((m.machine_name for m in part), e))
                continue
            created.update(result.created)
            failed.update(result.failed)
            deleted.extend(result.deleted)
        return BatchCreateResult(created=created, failed=failed, deleted=tuple(deleted))

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        if resume_token is None:
            seen = self._observe(machine_name)
        else:
            # The token only says the machine was started; resuming is reading it until it is
            # done.
            awaited = self._await([machine_name]).get(machine_name)
            seen = awaited if awaited is not None else self._observe(machine_name)
        if seen.status == "failed" and self._delete_failed and not _being_deleted(seen):
            return self._delete_if_ours(seen)
        return seen

    # -- the batch PUT ------------------------------------------------------------------------

    def _create_part(
        self,
        request: BatchCreate,
        machines: Sequence[MachineSpec],
        on_progress: ProgressCallback | None,
    ) -> BatchCreateResult:
        body = machine_body(request.template)
        machines = [self._owned(spec, request.batch_id) for spec in machines]
        specs = {spec.machine_name: spec for spec in machines}
        started, refused = self._put(machines, body)
        failed: dict[str, CloudError] = {}
        if refused is None:
            # Nothing is known: what exists started; what does not never did, so one more PUT
            # of those alone cannot make anything twice.
            started, unstarted, failed = self._sort_out(machines)
            if unstarted:
                try:
                    again, refused = self._put(unstarted, body)
                except CloudError as e:
                    # Refused as a whole this time: it speaks for the unstarted machines only.
                    again, refused = [], dict.fromkeys((m.machine_name for m in unstarted), e)
                started += again
                if refused is None:
                    refused = {}
        for name, error in (refused or {}).items():
            try:
                machine = self._get(name)
            except CloudError:
                continue  # unknown: reading it later decides
            if machine is None:
                failed[name] = error
            elif self._is_ours(machine, specs[name]):
                started.append(name)  # ours already: a replay, or a create that did start
            else:
                failed[name] = _name_in_use(name)
        if on_progress is not None and started:
            # One batch PUT accepted them together: noted together, in one append.
            on_progress([ProgressNote(name, self._machine_token(name)) for name in started])
        created: dict[str, str] = {}
        deleted: list[str] = []
        for name, seen in self._await(started).items():
            if seen.status == "succeeded" and seen.provider_id is not None:
                created[name] = seen.provider_id
            elif seen.status == "failed" and seen.error is not None:
                failed[name] = seen.error
                if self._delete_failed and not _being_deleted(seen) and self._delete([name]):
                    deleted.append(name)
        return BatchCreateResult(created=created, failed=failed, deleted=tuple(deleted))

    def _put(
        self, machines: Sequence[MachineSpec], body: Machine
    ) -> tuple[list[str], dict[str, CloudError] | None]:
        """Send one batch PUT: the machines started, and those refused (``None``: not known).

        Raises the classified error when the batch was refused as a whole.
        """
        names = [m.machine_name for m in machines]
        try:
            self._client.machines.begin_create_or_update(
                self._resource_group,
                self._cluster_name,
                self._agent_pool,
                names[0],
                body,
                headers={BATCH_PUT_MACHINE_HEADER: encode_batch_put_machine_header(machines)},
                polling=False,
                retry_total=0,
            )
        except ServiceResponseError:
            return [], None
        except HttpResponseError as e:
            refused = _refusals(e, machines)
            if refused is not None:
                return [n for n in names if n not in refused], refused
            if e.status_code is not None and e.status_code >= 500:
                return [], None  # the service's own trouble: it may have started some
            raise from_azure_error(e) from e
        except AzureError as e:
            raise from_azure_error(e) from e
        return names, {}

    def _sort_out(
        self, machines: Sequence[MachineSpec]
    ) -> tuple[list[str], list[MachineSpec], dict[str, CloudError]]:
        """After a lost answer: started (ours, found), never started, and others' names."""
        started: list[str] = []
        unstarted: list[MachineSpec] = []
        failed: dict[str, CloudError] = {}
        for spec in machines:
            try:
                machine = self._get(spec.machine_name)
            except CloudError:
                continue  # unknown: reading it later decides
            if machine is None:
                unstarted.append(spec)
            elif self._is_ours(machine, spec):
                started.append(spec.machine_name)
            else:
                failed[spec.machine_name] = _name_in_use(spec.machine_name)
        return started, unstarted, failed

    # -- reading machines ---------------------------------------------------------------------

    def _await(self, names: Sequence[str]) -> dict[str, MachineObservation]:
        """Poll the machines until each is final or ``poll_timeout`` passes; unread ones are
        left out (unknown)."""
        deadline = self._clock.now() + self._poll_timeout
        final: dict[str, MachineObservation] = {}
        waiting = list(names)
        while waiting:
            listed = self._list()
            still: list[str] = []
            for name in waiting:
                if listed is None:
                    still.append(name)  # the list failed, not the machine: read it next poll
                    continue
                try:
                    seen = self._progress(name, listed)
                except CloudError:
                    continue  # a failed read says nothing about the machine: unknown
                if seen.status == "creating":
                    still.append(name)
                elif seen.status != "not_found":
                    final[name] = seen
            waiting = still
            if not waiting or self._clock.now() >= deadline:
                break
            self._clock.sleep(self._poll_interval)
        return final

    def _list(self) -> dict[str, Machine] | None:
        """The pool's machines by name, every page followed; ``None`` if the list failed."""
        try:
            pages = self._client.machines.list(
                self._resource_group, self._cluster_name, self._agent_pool
            )
            return {machine.name: machine for machine in pages if machine.name}
        except AzureError:
            return None

    def _progress(self, machine_name: str, listed: dict[str, Machine]) -> MachineObservation:
        """The machine as the list shows it, or as its own GET does if the list lags it."""
        machine = listed.get(machine_name)
        if machine is None:
            return self._observe(machine_name)
        return _observation_of(machine_name, machine)

    def _observe(self, machine_name: str) -> MachineObservation:
        machine = self._get(machine_name)
        if machine is None:
            return MachineObservation(machine_name, "not_found")
        return _observation_of(machine_name, machine)

    def _get(self, machine_name: str) -> Machine | None:
        try:
            return self._client.machines.get(
                self._resource_group, self._cluster_name, self._agent_pool, machine_name
            )
        except ResourceNotFoundError:
            return None
        except AzureError as e:
            raise from_azure_error(e) from e

    def _delete_if_ours(self, seen: MachineObservation) -> MachineObservation:
        """A failed machine found by a read (after a restart, say) is as billed as one found by
        ``create_batch``: delete it, unless its tags say it is another owner's."""
        try:
            machine = self._get(seen.machine_name)
        except CloudError:
            return seen  # ownership unknown: the next read may delete it
        if machine is None or not self._is_ours(machine):
            return seen
        if self._delete([seen.machine_name]):
            return replace(seen, deleted=True)
        return seen

    def _is_ours(self, machine: Machine, spec: MachineSpec | None = None) -> bool:
        """Its tags, as the service reports them, say the machine is ours (for ``spec``)."""
        tags = (machine.properties.tags if machine.properties else None) or {}
        owner = tags.get(OWNER_TAG)
        if owner is not None:
            return owner == self._owner
        # No owner tag: a machine of an earlier version of this adapter (its owner tag went in
        # the body, which batch mode discards) is still recognised by the request it was made
        # for, which only we could have put in its header entry.
        request_id = spec.request_id if spec is not None else None
        return request_id is not None and tags.get(REQUEST_TAG) == request_id

    def _delete(self, names: list[str]) -> bool:
        """Delete failed leftovers so nothing billed stays behind; ``False`` if it was refused."""
        from azure.mgmt.containerservice.models import AgentPoolDeleteMachinesParameter

        try:
            self._client.agent_pools.begin_delete_machines(
                self._resource_group,
                self._cluster_name,
                self._agent_pool,
                AgentPoolDeleteMachinesParameter(machine_names=names),
                polling=False,
            )
        except AzureError:
            return False
        return True

    # -- set-up -------------------------------------------------------------------------------

    def _check_agent_pool(self) -> None:
        where = f"{self._resource_group}/{self._cluster_name}/{self._agent_pool}"
        try:
            pool = self._client.agent_pools.get(
                self._resource_group, self._cluster_name, self._agent_pool
            )
        except ResourceNotFoundError as e:
            raise CloudSetupError(
                f"agent pool {where} does not exist; create it with mode Machines"
            ) from e
        except AzureError as e:
            raise CloudSetupError(f"agent pool {where} could not be read: {e}") from e
        raw = pool.properties.mode if pool.properties else None
        # The SDK hands back its enum for known modes and the plain string for others.
        mode = str(getattr(raw, "value", raw) or "")
        if mode.lower() != _MACHINES_MODE:
            raise CloudSetupError(
                f"agent pool {where} is in mode {mode or 'unknown'!r}; the machines API needs "
                f"an agent pool in mode Machines"
            )

    def _owned(self, spec: MachineSpec, batch_id: str) -> MachineSpec:
        """``spec`` with the owner and batch tags in its own tags, so in its header entry: batch
        mode applies only the header's tags (ownership is ours to state, over a caller's tag of
        the same name)."""
        ownership = {OWNER_TAG: self._owner, BATCH_TAG: batch_id}
        tags = tuple((k, v) for k, v in spec.tags if k not in ownership)
        return replace(spec, tags=tags + tuple(ownership.items()))

    def _machine_token(self, machine_name: str) -> str:
        return (
            f"aks-machine:{self._resource_group}/{self._cluster_name}/{self._agent_pool}"
            f"/{machine_name}"
        )


def machine_body(template: MachineTemplate) -> Machine:
    """The PUT body: the template as a typed AKS machine, without zones or tags.

    Batch mode discards the body's zones and tags (each machine gets its header entry's), so
    they would only mislead a reader of the request; every per-machine field is in the header.
    """
    from azure.mgmt.containerservice import models

    hardware = models.MachineHardwareProfile(
        vm_size=template.vm_size, gpu_instance_profile=template.gpu_profile
    )
    kubernetes = models.MachineKubernetesProfile(
        orchestrator_version=template.orchestrator_version,
        max_pods=template.max_pods,
        kubelet_config=(
            models.KubeletConfig(dict(template.kubelet_config)) if template.kubelet_config else None
        ),
    )
    operating_system = models.MachineOSProfile(
        os_type="Linux",
        os_sku=template.os_sku,
        os_disk_size_gb=template.os_disk_size_gb,
        os_disk_type=template.os_disk_type,
        enable_fips=template.enable_fips,
    )
    network = (
        models.MachineNetworkProperties(vnet_subnet_id=template.vnet_subnet_id)
        if template.vnet_subnet_id is not None
        else None
    )
    properties = models.MachineProperties(
        hardware=hardware,
        kubernetes=kubernetes,
        operating_system=operating_system,
        mode=template.mode,
        priority="Spot" if template.priority == "spot" else "Regular",
        network=network,
    )
    return models.Machine(properties=properties)


def _refusals(
    error: HttpResponseError, machines: Sequence[MachineSpec]
) -> dict[str, CloudError] | None:
    """Per-machine refusals of a batch error body, or ``None`` if it is not one."""
    body = _body(error)
    code = body.get("code")
    if code == _BATCH_CLIENT_ERROR:
        details = body.get("details")
    elif code == _BATCH_INTERNAL_ERROR:
        try:
            details = json.loads(str(body.get("message") or "")).get("details")
        except (ValueError, AttributeError):
            details = None
    else:
        return None
    names = {m.machine_name: m for m in machines}
    refused: dict[str, CloudError] = {}
    for detail in details if isinstance(details, list) else []:
        target = detail.get("target") if isinstance(detail, dict) else None
        if target not in names:
            continue
        server_side = code == _BATCH_INTERNAL_ERROR
        refused[target] = classify_arm_error(
            detail.get("code"),
            str(detail.get("message") or ""),
            status=500 if server_side else None,
            zone=names[target].zone,
        )
    if not refused:
        return None  # a batch code without usable details tells nothing per machine
    return refused


def _body(error: HttpResponseError) -> dict[str, Any]:
    try:
        text = error.response.text() if error.response is not None else ""
        body = json.loads(text) if text else {}
    except (ValueError, AttributeError):
        return {}
    return body if isinstance(body, dict) else {}


def _name_in_use(machine_name: str) -> NameInUse:
    return NameInUse(
        f"machine name {machine_name} is in use by another owner (its {OWNER_TAG} tag is not "
        "ours); choose another name",
        provider_code="NameInUse",
    )


def _being_deleted(seen: MachineObservation) -> bool:
    """The machine failed because it is being deleted: no delete of ours is needed."""
    return seen.error is not None and seen.error.provider_code == _DELETING_CODE


def _observation_of(machine_name: str, machine: Machine) -> MachineObservation:
    properties = machine.properties
    state = str((properties.provisioning_state if properties else None) or "")
    provider_id = str(machine.id) if machine.id else None
    if state.lower() == "deleting":
        deleting = UnknownCloudError(
            f"machine {machine_name} is being deleted while it was being created, so it will "
            "never be ready; create it again once the deletion has finished",
            retryable=True,
            provider_code=_DELETING_CODE,
        )
        return MachineObservation(machine_name, "failed", provider_id, deleting)
    status = provisioning_status(state)
    error: CloudError | None = None
    if status == "failed":
        problem = properties.status.provisioning_error if properties and properties.status else None
        code = (problem.code if problem else None) or "ProvisioningFailed"
        message = (problem.message if problem else None) or (
            f"machine {machine_name} is {state.lower()}"
        )
        error = classify_arm_error(code, message, zone=sole_zone(machine.zones))
        if isinstance(error, UnknownCloudError) and not error.message:
            error = UnknownCloudError(f"machine {machine_name} failed to provision")
    return MachineObservation(machine_name, status, provider_id, error)
