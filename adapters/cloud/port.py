"""The cloud port: create a batch of machines sharing one template, and read one machine.

Seed 01 (PRODUCT §4.1): machines whose templates hash alike travel in one batch; the template is
sent once and each machine's variations (name, zones, tags) ride in the ``BatchPutMachine`` header.
Results come back per machine. Three outcomes are possible for each machine of a batch:

- **created** — in ``BatchCreateResult.created`` with its provider id;
- **failed** — in ``BatchCreateResult.failed`` with a classified :class:`CloudError`;
- **unknown** — in neither. The provider did not say (a lost response, an incomplete error map, a
  create still running when polling gave up). The caller must :meth:`CloudMachines.read_machine`
  it and never assume it was created — the original batching code did, and lost machines.

A whole call the provider refused (quota for the whole batch, throttling, a request that could not
be sent) *raises* a :class:`CloudError`; nothing was created by it.

Creates are create-only and keyed by machine name: creating a name that already exists never makes
a second machine; the existing one is reported (created, or failed with its error). So retrying a
batch after a crash or an unknown outcome is always safe.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias

from fleetledger.domain.machines import batch_put_machine_header as domain_batch_put_machine_header
from fleetledger.domain.template import MachineTemplate

from .errors import CloudError

__all__ = [
    "BATCH_PUT_MACHINE_HEADER",
    "BatchCreate",
    "BatchCreateResult",
    "CloudMachines",
    "MachineObservation",
    "MachineSpec",
    "MachineStatus",
    "ProgressCallback",
    "ProgressNote",
    "batch_put_machine_header",
    "encode_batch_put_machine_header",
]

#: Name of the HTTP header that lists a batch's machines (seed 01, "BatchPutMachine Header").
BATCH_PUT_MACHINE_HEADER = "BatchPutMachine"

MachineStatus = Literal["succeeded", "creating", "failed", "not_found"]


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """One machine of a batch: what may differ between machines sharing a template."""

    machine_name: str
    zones: tuple[str, ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    #: The request the machine is made for; the machine carries it as its ``fleetledger-request``
    #: tag (:data:`~fleetledger.domain.machines.REQUEST_TAG`): in the ``BatchPutMachine``
    #: header on AKS, on the VM itself on Compute.
    request_id: str | None = None

    def __post_init__(self) -> None:
        if not self.machine_name:
            raise ValueError("MachineSpec.machine_name must be a non-empty string")
        keys = [k for k, _ in self.tags]
        if len(keys) != len(set(keys)):
            raise ValueError(f"MachineSpec {self.machine_name!r} repeats a tag key: {keys}")

    @property
    def zone(self) -> str | None:
        """The zone a zonal error refers to: the requested zone if exactly one, else ``None``."""
        return self.zones[0] if len(self.zones) == 1 else None


@dataclass(frozen=True, slots=True)
class BatchCreate:
    """A request to create ``machines`` from one shared ``template``."""

    batch_id: str
    template: MachineTemplate
    machines: tuple[MachineSpec, ...]

    def __post_init__(self) -> None:
        if not self.batch_id:
            raise ValueError("BatchCreate.batch_id must be a non-empty string")
        if not self.machines:
            raise ValueError(f"batch {self.batch_id!r} has no machines; send at least one")
        names = [m.machine_name for m in self.machines]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"batch {self.batch_id!r} names a machine twice: {duplicates}")

    @property
    def machine_names(self) -> tuple[str, ...]:
        return tuple(m.machine_name for m in self.machines)

    def spec(self, machine_name: str) -> MachineSpec:
        """The spec of ``machine_name``; ``KeyError`` if it is not in the batch."""
        for machine in self.machines:
            if machine.machine_name == machine_name:
                return machine
        raise KeyError(machine_name)


@dataclass(frozen=True, slots=True)
class BatchCreateResult:
    """Per-machine results; a machine in neither map is *unknown* and must be read.

    ``deleted`` names failed machines that remained in the cloud as failed resources and were
    deleted, so that nothing billed stays behind; each is also in ``failed``.
    """

    created: Mapping[str, str] = field(default_factory=dict)
    failed: Mapping[str, CloudError] = field(default_factory=dict)
    deleted: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        both = sorted(set(self.created) & set(self.failed))
        if both:
            raise ValueError(f"machines reported both created and failed: {both}")
        stray = sorted(set(self.deleted) - set(self.failed))
        if stray:
            raise ValueError(f"machines reported deleted but not failed: {stray}")

    def unknown(self, request: BatchCreate) -> tuple[str, ...]:
        """Machines of ``request`` this result says nothing about, in request order."""
        return tuple(
            name
            for name in request.machine_names
            if name not in self.created and name not in self.failed
        )


@dataclass(frozen=True, slots=True)
class ProgressNote:
    """The provider accepted ``machine_name``'s create; ``resume_token`` resumes waiting for it.

    Record it before anything else: after a restart, ``read_machine(name, resume_token=…)``
    picks the create up where it was instead of sending it again.
    """

    machine_name: str
    resume_token: str


ProgressCallback: TypeAlias = Callable[[Sequence[ProgressNote]], None]
"""Told the machines the provider accepted, all those accepted together in one call."""


@dataclass(frozen=True, slots=True)
class MachineObservation:
    """What the provider says about one machine right now.

    ``deleted``: the machine was ``failed``, remained as a failed resource, and the adapter
    deleted it so that nothing billed stays behind (as ``BatchCreateResult.deleted`` does for a
    batch); a later read finds it ``not_found``.
    """

    machine_name: str
    status: MachineStatus
    provider_id: str | None = None
    error: CloudError | None = None
    deleted: bool = False

    def __post_init__(self) -> None:
        if self.deleted and self.status != "failed":
            raise ValueError(
                f"machine {self.machine_name!r} is {self.status}, not failed: only a failed "
                "machine's leftover is deleted"
            )


class CloudMachines(Protocol):
    """Creates batches of machines and reads machines back."""

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        """Create every machine of ``request``; see the module docstring for the outcomes.

        ``on_progress`` is given the notes of the machines the provider accepted, before their
        outcomes are awaited: in one call those accepted together (one batch PUT's), so that they
        are recorded in one append rather than one each; calls never overlap, though they may
        come from a worker thread. An exception it raises propagates out of ``create_batch``
        (the creates already accepted carry on in the cloud, and can be resumed with the tokens
        already noted).
        """
        ...

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        """What the provider says about ``machine_name``.

        With a ``resume_token`` from a :class:`ProgressNote`, the read resumes waiting for that
        create and reports its outcome (including a classified error), as ``create_batch`` would
        have; without one it is a single read. A machine of ours found failed is deleted when
        the adapter deletes failed leftovers, and the observation says so (``deleted``).
        """
        ...


def batch_put_machine_header(machines: Sequence[MachineSpec]) -> dict[str, object]:
    """The ``BatchPutMachine`` header object for ``machines``, every machine in order.

    Built by :func:`fleetledger.domain.machines.batch_put_machine_header`, the one
    implementation of the shape (the coordinator records the header it sends from the same
    function): ``{"vmSkus": {"value": []}, "batchMachines": [{"machineName", "zones", "tags"},
    …]}``, absent zones ``[]`` and absent tags ``{}``, never omitted; a machine with a
    ``request_id`` carries it in its tags as ``fleetledger-request``.
    """
    return domain_batch_put_machine_header(machines)


def encode_batch_put_machine_header(machines: Sequence[MachineSpec]) -> str:
    """The header *value*: compact JSON, ASCII only so it is a valid HTTP header field.

    Same JSON as the domain's encoding (which the log records), escaped for the wire: the two
    texts parse to equal objects, which is what the batch lifecycle checks.
    """
    return json.dumps(batch_put_machine_header(machines), separators=(",", ":"), ensure_ascii=True)
