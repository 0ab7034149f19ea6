"""``CloudMachines`` on plain Azure VMs: one create-only PUT per machine, bounded in parallel.

The compute API has no batch create, so a batch becomes ``begin_create_or_update`` per machine
(PRODUCT §4.1), at most ``max_parallel`` PUTs in flight per instance — ARM counts writes per
subscription, and a burst of fifty PUTs is the throttling the batching exists to avoid.

Every PUT is create-only: ``match_condition=IfMissing`` makes the SDK send ``If-None-Match: *``,
so a retry (ours, the caller's after a crash, or azure-core's after a lost answer) can never
create a second VM or overwrite the first. ARM answers 412 when the VM exists; the adapter then
reads it and reports what it finds.

Once a PUT is accepted, the LRO's continuation token goes to ``on_progress``; after a restart
``read_machine(name, resume_token=token)`` resumes the SDK poller instead of sending the PUT again.

Outcomes per machine: created (LRO succeeded, id from the final GET); failed (the PUT was refused,
or the LRO reported ``Failed`` — e.g. ``ZonalAllocationFailed``); unknown (the answer was lost, or
polling itself broke — the machine may exist).

Refused before any PUT: a machine naming more than one zone (a VM lives in exactly one), tag keys
Azure refuses (``/`` and friends), and a template without a subnet when the profile has none
either (the VM would have no network interface and fail late, after allocation).

Throttling: the PUTs go out with azure-core's retries off (``retry_total=0``). The SDK would
otherwise sleep out a 429's ``Retry-After`` and retry inside the call, holding a parallelism
slot and hiding the throttling from the grouper. Instead the first 429 of a batch is reported as
:class:`Throttled` (with ``Retry-After``) for that machine and for every machine not yet sent,
which are then not sent at all: the caller backs off as the provider asked. The pollers inherit
the call's options, so a failed poll is not retried either: it leaves the machine unknown, which
a read (with the SDK's retries, as reads are idempotent) resolves.

Ownership: every VM is tagged with its owner, batch and (when known) request
(:data:`OWNER_TAG`, :data:`BATCH_TAG`, :data:`REQUEST_TAG`). After a 412 the existing VM is taken
over only if its owner tag is ours; otherwise that request fails with :class:`NameInUse`.

Failed leftovers: a VM whose create failed stays as a failed resource (billed for its disk and
address); it is deleted (``delete_failed``) and the result names it in ``deleted``. One of ours
that ``read_machine`` finds failed (after a restart, say) is deleted too, and the observation says
so (``MachineObservation.deleted``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceResponseError,
)
from azure.core.polling import LROPoller
from azure.core.polling.base_polling import OperationFailed
from azure.mgmt.compute import models as compute

from fleetledger.domain.machines import REQUEST_TAG
from fleetledger.domain.template import MachineTemplate, template_hash

from .arm import invalid_tag_keys, provisioning_status, sole_zone
from .errors import (
    CloudError,
    NameInUse,
    Throttled,
    UnknownCloudError,
    classify_arm_error,
    from_azure_error,
)
from .port import (
    BatchCreate,
    BatchCreateResult,
    MachineObservation,
    MachineSpec,
    ProgressCallback,
    ProgressNote,
)

if TYPE_CHECKING:
    from azure.mgmt.compute import ComputeManagementClient

__all__ = [
    "BATCH_TAG",
    "OWNER_TAG",
    "REQUEST_TAG",
    "TEMPLATE_HASH_TAG",
    "AzureVmCloud",
    "VmProfile",
    "virtual_machine",
]

#: Tag on every VM naming the template it was made from (its hash).
TEMPLATE_HASH_TAG = "fleetledger-template"
#: Ownership tags (Azure refuses tag names containing ``/``, hence the dashes).
OWNER_TAG = "fleetledger-owner"
BATCH_TAG = "fleetledger-batch"

# Compute's instance view spells a failed create "ProvisioningState/failed/<ARM error code>".
_FAILED_STATUS_PREFIX = "ProvisioningState/failed/"
# azure-mgmt-compute's models work out each class's fields on its first construction, without a
# lock: two workers building their first VM bodies at once can fail with "dictionary changed
# size during iteration". Building a body takes microseconds beside its PUT, so one at a time.
_MODEL_BUILDING = threading.Lock()

_Started = LROPoller[compute.VirtualMachine] | MachineObservation | None


@dataclass(frozen=True, slots=True, kw_only=True)
class VmProfile:
    """What every VM needs beyond the template: where it lives and how it boots.

    ``image_id`` is an image or gallery image version resource id (AKS node images are gallery
    images). ``subnet_id`` is the subnet of VMs whose template names none.
    """

    location: str
    image_id: str
    ssh_public_key: str
    admin_username: str = "azureuser"
    subnet_id: str | None = None

    def __post_init__(self) -> None:
        for name in ("location", "image_id", "ssh_public_key", "admin_username"):
            if not getattr(self, name):
                raise ValueError(f"VmProfile needs a non-empty {name}")


class AzureVmCloud:
    """Creates VMs in one resource group, one create-only PUT per machine."""

    def __init__(
        self,
        client: ComputeManagementClient,
        *,
        resource_group: str,
        profile: VmProfile,
        max_parallel: int = 8,
        owner: str = "fleetledger",
        delete_failed: bool = True,
    ) -> None:
        if not resource_group:
            raise ValueError("AzureVmCloud needs a non-empty resource_group")
        if not owner:
            raise ValueError("AzureVmCloud needs a non-empty owner")
        if max_parallel < 1:
            raise ValueError(f"max_parallel must be at least 1 PUT in flight, got {max_parallel}")
        self._vms = client.virtual_machines
        self._resource_group = resource_group
        self._profile = profile
        self._max_parallel = max_parallel
        self._owner = owner
        self._delete_failed = delete_failed
        # Bounds PUTs across concurrent create_batch calls, not just within one.
        self._slots = threading.BoundedSemaphore(max_parallel)

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        note = _serialised(on_progress)
        subnet = request.template.vnet_subnet_id or self._profile.subnet_id
        if subnet is None:
            raise UnknownCloudError(
                "the template names no subnet and the VmProfile has no subnet_id: a VM without "
                "a network interface fails late; set vnet_subnet_id or VmProfile.subnet_id",
                provider_code="SubnetRequired",
            )
        tags = {OWNER_TAG: self._owner, BATCH_TAG: request.batch_id}
        throttle = _ThrottleGate()

        def start(spec: MachineSpec) -> _Started:
            refused = _refused_before_sending(spec)
            if refused is not None:
                return refused
            return self._start(
                request.template, spec, subnet_id=subnet, tags=tags, note=note, throttle=throttle
            )

        # Phase 1, bounded: send the PUTs. Phase 2: wait for the pollers, which poll in their
        # own threads, so waiting one after the other costs no more than the slowest create.
        workers = min(self._max_parallel, len(request.machines))
        with ThreadPoolExecutor(workers, thread_name_prefix="vm-create") as pool:
            started = list(pool.map(start, request.machines))
        created: dict[str, str] = {}
        failed: dict[str, CloudError] = {}
        deleted: list[str] = []
        for spec, begun in zip(request.machines, started, strict=True):
            seen = _finish(spec, begun) if isinstance(begun, LROPoller) else begun
            if seen is None:
                continue  # unknown
            if seen.status == "succeeded" and seen.provider_id is not None:
                created[spec.machine_name] = seen.provider_id
            elif seen.status == "failed" and seen.error is not None:
                failed[spec.machine_name] = seen.error
                # An accepted create that failed, or our failed VM met again, is a resource
                # left behind; a refused PUT left nothing.
                left_behind = isinstance(begun, LROPoller) or seen.provider_id is not None
                if left_behind and self._delete_failed and self._delete(spec.machine_name):
                    deleted.append(spec.machine_name)
        return BatchCreateResult(created=created, failed=failed, deleted=tuple(deleted))

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        if resume_token is not None:
            self._resume(machine_name, resume_token)
        vm = self._read(machine_name)
        if vm is None:
            return MachineObservation(machine_name, "not_found")
        seen = _observation_of(machine_name, vm)
        # A failed VM found by a read (after a restart, say) is as billed as one found by
        # create_batch; another owner's is never ours to delete.
        ours = (vm.tags or {}).get(OWNER_TAG) == self._owner
        if seen.status == "failed" and ours and self._delete_failed and self._delete(machine_name):
            return replace(seen, deleted=True)
        return seen

    # -- internals ------------------------------------------------------------------------------

    def _start(
        self,
        template: MachineTemplate,
        spec: MachineSpec,
        *,
        subnet_id: str,
        tags: dict[str, str],
        note: Callable[[ProgressNote], None],
        throttle: _ThrottleGate,
    ) -> _Started:
        """Send one PUT: a poller if accepted, else the machine's observation or ``None``."""
        owned = {**tags, REQUEST_TAG: spec.request_id} if spec.request_id else tags
        with _MODEL_BUILDING:
            body = virtual_machine(template, spec, self._profile, subnet_id=subnet_id, tags=owned)
        with self._slots:
            held = throttle.held()
            if held is not None:
                # The provider asked us to wait: sending more now only earns more 429s.
                return MachineObservation(spec.machine_name, "failed", error=held)
            try:
                poller = self._vms.begin_create_or_update(
                    self._resource_group,
                    spec.machine_name,
                    body,
                    match_condition=MatchConditions.IfMissing,
                    retry_total=0,
                )
            except ServiceResponseError:
                return None  # sent, answer lost: it may exist
            except HttpResponseError as e:
                if e.status_code == 412:  # If-None-Match: * failed — the VM already exists
                    return self._observe_existing(spec.machine_name)
                error = from_azure_error(e, zone=spec.zone)
                if isinstance(error, Throttled):
                    throttle.hold(error)
                return MachineObservation(spec.machine_name, "failed", error=error)
            except AzureError as e:
                return MachineObservation(
                    spec.machine_name, "failed", error=from_azure_error(e, zone=spec.zone)
                )
        note(ProgressNote(spec.machine_name, poller.continuation_token()))
        return poller

    def _resume(self, machine_name: str, resume_token: str) -> None:
        """Wait for the create behind ``resume_token``; its verdict is then read from the VM."""
        try:
            # With a continuation token the SDK ignores the body and rebuilds the poller.
            poller = self._vms.begin_create_or_update(
                self._resource_group,
                machine_name,
                compute.VirtualMachine(location=self._profile.location),
                continuation_token=resume_token,
            )
            poller.wait()
        except (AzureError, ValueError):
            # A broken or expired token only costs the wait; the read below tells the truth.
            return

    def _observe_existing(self, machine_name: str) -> MachineObservation | None:
        """The existing VM's state if it is ours; ``None`` (unknown) if reading it fails."""
        try:
            vm = self._read(machine_name)
        except CloudError:
            return None
        if vm is None:
            return None  # gone between the 412 and the read: nothing is known
        if (vm.tags or {}).get(OWNER_TAG) != self._owner:
            return MachineObservation(
                machine_name,
                "failed",
                error=NameInUse(
                    f"virtual machine name {machine_name} is in use by another owner (its "
                    f"{OWNER_TAG} tag is not ours); choose another name",
                    provider_code="NameInUse",
                ),
            )
        return _observation_of(machine_name, vm)

    def _delete(self, machine_name: str) -> bool:
        """Delete a failed VM (its disk and NIC go with it); ``False`` if that was refused."""
        try:
            self._vms.begin_delete(self._resource_group, machine_name).wait()
        except AzureError:
            return False
        return True

    def _read(self, machine_name: str) -> compute.VirtualMachine | None:
        try:
            return self._vms.get(self._resource_group, machine_name, expand="instanceView")
        except ResourceNotFoundError:
            return None
        except AzureError as e:
            raise from_azure_error(e) from e


def virtual_machine(
    template: MachineTemplate,
    spec: MachineSpec,
    profile: VmProfile,
    *,
    subnet_id: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> compute.VirtualMachine:
    """The VM body for one machine: the template's VM-level fields plus its zones and tags.

    ``subnet_id`` defaults to the template's, then the profile's; ``tags`` (ownership) are added
    to the machine's own.

    Kubernetes-level fields (orchestrator version, max pods, kubelet config, mode, OS SKU, FIPS)
    have no VM API field; they reach the node through its bootstrap data, which is not this
    adapter's job. The template-hash tag says which template a VM came from.
    """
    os_disk = compute.OSDisk(
        create_option="FromImage",
        disk_size_gb=template.os_disk_size_gb,
        delete_option="Delete",
    )
    if template.os_disk_type == "Ephemeral":
        os_disk.diff_disk_settings = compute.DiffDiskSettings(option="Local")
        # Compute refuses an ephemeral OS disk with any caching but ReadOnly.
        os_disk.caching = "ReadOnly"
    properties = compute.VirtualMachineProperties(
        hardware_profile=compute.HardwareProfile(vm_size=template.vm_size),
        storage_profile=compute.StorageProfile(
            image_reference=compute.ImageReference(id=profile.image_id),
            os_disk=os_disk,
        ),
        os_profile=compute.OSProfile(
            computer_name=spec.machine_name,
            admin_username=profile.admin_username,
            linux_configuration=compute.LinuxConfiguration(
                disable_password_authentication=True,
                ssh=compute.SshConfiguration(
                    public_keys=[
                        compute.SshPublicKey(
                            path=f"/home/{profile.admin_username}/.ssh/authorized_keys",
                            key_data=profile.ssh_public_key,
                        )
                    ]
                ),
            ),
        ),
    )
    if template.priority == "spot":
        properties.priority = "Spot"
        properties.eviction_policy = "Delete"
        properties.billing_profile = compute.BillingProfile(max_price=-1)  # pay up to on-demand
    subnet = subnet_id or template.vnet_subnet_id or profile.subnet_id
    if subnet is not None:
        properties.network_profile = _network_profile(spec.machine_name, subnet)
    return compute.VirtualMachine(
        location=profile.location,
        zones=list(spec.zones) or None,
        tags={**dict(spec.tags), **dict(tags or {}), TEMPLATE_HASH_TAG: template_hash(template)},
        properties=properties,
    )


def _network_profile(machine_name: str, subnet_id: str) -> compute.NetworkProfile:
    # NIC created with the VM (networkApiVersion set), deleted with it.
    ip_configuration = compute.VirtualMachineNetworkInterfaceIPConfiguration(
        name="ipconfig1",
        properties=compute.VirtualMachineNetworkInterfaceIPConfigurationProperties(
            subnet=compute.SubResource(id=subnet_id), primary=True
        ),
    )
    return compute.NetworkProfile(
        network_api_version="2020-11-01",
        network_interface_configurations=[
            compute.VirtualMachineNetworkInterfaceConfiguration(
                name=f"{machine_name}-nic",
                properties=compute.VirtualMachineNetworkInterfaceConfigurationProperties(
                    primary=True,
                    delete_option="Delete",
                    ip_configurations=[ip_configuration],
                ),
            )
        ],
    )


def _finish(
    spec: MachineSpec, poller: LROPoller[compute.VirtualMachine]
) -> MachineObservation | None:
    """Wait for an accepted create; ``None`` when its outcome could not be learnt."""
    try:
        vm = poller.result()
    except HttpResponseError as e:
        if isinstance(e.__cause__, OperationFailed):
            # The operation itself reported Failed: a verdict about the machine.
            return MachineObservation(
                spec.machine_name, "failed", error=from_azure_error(e, zone=spec.zone)
            )
        return None  # a polling request failed: the create may still succeed
    except AzureError:
        return None
    return MachineObservation(spec.machine_name, "succeeded", vm.id)


def _observation_of(machine_name: str, vm: compute.VirtualMachine) -> MachineObservation:
    properties = vm.properties
    status = provisioning_status(properties.provisioning_state if properties else None)
    error = _provisioning_error(vm, zone=sole_zone(vm.zones)) if status == "failed" else None
    return MachineObservation(machine_name, status, vm.id, error)


def _provisioning_error(vm: compute.VirtualMachine, *, zone: str | None) -> CloudError:
    view = vm.properties.instance_view if vm.properties else None
    for status in (view.statuses if view else None) or []:
        code = status.code or ""
        if code.startswith(_FAILED_STATUS_PREFIX):
            return classify_arm_error(
                code.removeprefix(_FAILED_STATUS_PREFIX), status.message or "", zone=zone
            )
    return UnknownCloudError(f"virtual machine {vm.name} failed to provision")


def _refused_before_sending(spec: MachineSpec) -> MachineObservation | None:
    """A machine no PUT could create: more than one zone, or tag keys Azure refuses."""
    problem = None
    if len(spec.zones) > 1:
        problem = (
            f"a virtual machine lives in exactly one zone, and {spec.machine_name} asks for "
            f"{len(spec.zones)} ({', '.join(spec.zones)}); request one zone per machine"
        )
    elif bad := invalid_tag_keys(spec.tags):
        problem = (
            f"Azure refuses tag names containing / < > % & \\ ?; rename {', '.join(bad)} on "
            f"{spec.machine_name}"
        )
    if problem is None:
        return None
    return MachineObservation(
        spec.machine_name,
        "failed",
        error=UnknownCloudError(problem, provider_code="InvalidRequest"),
    )


class _ThrottleGate:
    """The first 429 of a batch, held so the machines not yet sent are not sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._error: Throttled | None = None

    def hold(self, error: Throttled) -> None:
        with self._lock:
            if self._error is None:
                self._error = error

    def held(self) -> Throttled | None:
        with self._lock:
            return self._error


def _serialised(
    on_progress: ProgressCallback | None,
) -> Callable[[ProgressNote], None]:
    """``on_progress`` behind a lock, so callers never see overlapping calls from workers; each
    PUT is accepted on its own, so each is noted on its own."""
    lock = threading.Lock()

    def note(progress: ProgressNote) -> None:
        if on_progress is not None:
            with lock:
                on_progress([progress])

    return note
