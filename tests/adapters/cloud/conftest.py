"""Fixtures: the fake ARM server, real SDK clients pointed at it, and the adapters under test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.containerservice import ContainerServiceClient

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud.aks import PREVIEW_API_VERSION, AksMachinesCloud
from fleetledger.adapters.cloud.azure_vm import AzureVmCloud
from tests.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential

from .support import EPOCH, PROFILE, SUBSCRIPTION, ArmHarness, FakeHarness, Harness


@pytest.fixture
def fake_arm() -> Iterator[FakeArmServer]:
    with FakeArmServer() as server:
        yield server


@pytest.fixture
def compute_client(fake_arm: FakeArmServer) -> Iterator[ComputeManagementClient]:
    client = ComputeManagementClient(
        StaticTokenCredential(), SUBSCRIPTION, **fake_arm.client_options()
    )
    with client:
        yield client


@pytest.fixture
def aks_client(fake_arm: FakeArmServer) -> Iterator[ContainerServiceClient]:
    client = ContainerServiceClient(
        StaticTokenCredential(),
        SUBSCRIPTION,
        api_version=PREVIEW_API_VERSION,
        **fake_arm.client_options(),
    )
    with client:
        yield client


@pytest.fixture
def vm_cloud(compute_client: ComputeManagementClient) -> AzureVmCloud:
    return AzureVmCloud(compute_client, resource_group="rg", profile=PROFILE, max_parallel=4)


@pytest.fixture
def aks_cloud(aks_client: ContainerServiceClient) -> AksMachinesCloud:
    return AksMachinesCloud(
        aks_client,
        resource_group="rg",
        cluster_name="fleet",
        agent_pool="burst",
        clock=ManualClock(EPOCH),
    )


@pytest.fixture
def vm_contract_cloud(compute_client: ComputeManagementClient) -> AzureVmCloud:
    """The VM adapter keeping failed VMs, as the port's create-only contract describes."""
    return AzureVmCloud(
        compute_client, resource_group="rg", profile=PROFILE, max_parallel=4, delete_failed=False
    )


@pytest.fixture
def aks_contract_cloud(aks_client: ContainerServiceClient) -> AksMachinesCloud:
    """The AKS adapter keeping failed machines, as the port's create-only contract describes.

    Deleting failed leftovers (the default) frees their names, which the contract's "a failed
    name stays failed" cannot then hold; ``test_aks`` covers the deletion.
    """
    return AksMachinesCloud(
        aks_client,
        resource_group="rg",
        cluster_name="fleet",
        agent_pool="burst",
        clock=ManualClock(EPOCH),
        delete_failed=False,
    )


@pytest.fixture(params=["fake", "aks", "azure_vm"])
def harness(request: pytest.FixtureRequest) -> Harness:
    """Each ``CloudMachines`` adapter with a way to script its provider."""
    if request.param == "fake":
        return FakeHarness.build()
    server: FakeArmServer = request.getfixturevalue("fake_arm")
    cloud_fixture = "aks_contract_cloud" if request.param == "aks" else "vm_contract_cloud"
    return ArmHarness(request.getfixturevalue(cloud_fixture), server)
