"""Shared builders for the cloud tests, and the scenario scripts behind the contract suite.

Each ``Harness`` drives one ``CloudMachines`` adapter and knows how to make its provider misbehave
the same way (quota gone, a zone out of capacity, throttling, a lost answer), so the very same
contract tests run against every adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    CapacityUnavailable,
    CloudError,
    CloudMachines,
    FakeCloud,
    MachineSpec,
)
from fleetledger.adapters.cloud.azure_vm import VmProfile
from fleetledger.domain.template import MachineTemplate
from tests.adapters.cloud.fake_arm import FakeArmServer

SUBSCRIPTION = "00000000-0000-0000-0000-0000000000aa"
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)

TEMPLATE = MachineTemplate(
    vm_size="Standard_D4s_v5",
    priority="spot",
    orchestrator_version="1.31.2",
    max_pods=110,
    kubelet_config=(("cpuManagerPolicy", "static"),),
    os_sku="Ubuntu",
    os_disk_size_gb=128,
    os_disk_type="Ephemeral",
    vnet_subnet_id=(
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/a"
    ),
)

PROFILE = VmProfile(
    location="westus3",
    image_id="/subscriptions/s/resourceGroups/images/providers/Microsoft.Compute/galleries/g"
    "/images/ubuntu/versions/1.0.0",
    ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake fleetledger@test",
    subnet_id="/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v"
    "/subnets/default",
)


def batch(*names: str, batch_id: str = "batch-1", zones: tuple[str, ...] = ()) -> BatchCreate:
    """A batch of ``names``; machine ``i`` asks for zone ``zones[i]`` when given, and is made
    for request ``req-<name>``."""
    machines = tuple(
        MachineSpec(
            name,
            zones=(zones[i],) if i < len(zones) else (),
            tags=(("team", "platform"), ("machine", name)),
            request_id=f"req-{name}",
        )
        for i, name in enumerate(names)
    )
    return BatchCreate(batch_id, TEMPLATE, machines)


Outcome = str | CloudError | None


def outcomes(cloud: CloudMachines, request: BatchCreate) -> dict[str, Outcome]:
    """Each machine's outcome: provider id, error, or ``None`` (unknown).

    A whole-call failure is that error for every machine: adapters differ in whether the provider
    refuses a batch as a whole (AKS) or machine by machine (VMs), and callers handle both.
    """
    try:
        result = cloud.create_batch(request)
    except CloudError as error:
        return dict.fromkeys(request.machine_names, error)
    return {
        name: result.created.get(name) or result.failed.get(name) for name in request.machine_names
    }


class Harness(Protocol):
    @property
    def cloud(self) -> CloudMachines: ...

    def exhaust_quota(self) -> None: ...

    def fail_capacity(self, machine_name: str, *, zone: str) -> None: ...

    def throttle(self, *, retry_after: float) -> None: ...

    def lose_result(self, machine_name: str) -> None: ...

    def creations(self) -> tuple[str, ...]: ...


@dataclass
class FakeHarness:
    cloud: FakeCloud

    @classmethod
    def build(cls) -> FakeHarness:
        return cls(FakeCloud(clock=ManualClock(EPOCH), latency=45.0))

    def exhaust_quota(self) -> None:
        self.cloud.set_quota(0)

    def fail_capacity(self, machine_name: str, *, zone: str) -> None:
        error = CapacityUnavailable("no capacity", zone=zone, provider_code="ZonalAllocationFailed")
        self.cloud.fail_machine(machine_name, error)

    def throttle(self, *, retry_after: float) -> None:
        self.cloud.throttle(retry_after=retry_after)

    def lose_result(self, machine_name: str) -> None:
        self.cloud.omit_from_result(machine_name)

    def creations(self) -> tuple[str, ...]:
        return self.cloud.creations


@dataclass
class ArmHarness:
    """A real adapter (its real SDK client) against the fake ARM server."""

    cloud: CloudMachines
    server: FakeArmServer

    def exhaust_quota(self) -> None:
        self.server.set_quota(0)

    def fail_capacity(self, machine_name: str, *, zone: str) -> None:
        # The adapter must find the zone itself (from the request), as ARM's answer has none.
        self.server.fail_async(machine_name, "ZonalAllocationFailed")

    def throttle(self, *, retry_after: float) -> None:
        self.server.throttle(retry_after=retry_after)

    def lose_result(self, machine_name: str) -> None:
        self.server.lose_response(machine_name)

    def creations(self) -> tuple[str, ...]:
        return self.server.creations
