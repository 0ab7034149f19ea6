"""AzureVmCloud specifics: create-only PUTs, continuation tokens, bounded parallelism, the body."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

import pytest
from azure.mgmt.compute import ComputeManagementClient

from fleetledger.adapters.cloud import (
    BatchCreate,
    CapacityUnavailable,
    MachineSpec,
    NameInUse,
    ProgressNote,
    Throttled,
    UnknownCloudError,
)
from fleetledger.adapters.cloud.azure_vm import (
    BATCH_TAG,
    OWNER_TAG,
    REQUEST_TAG,
    TEMPLATE_HASH_TAG,
    AzureVmCloud,
)
from fleetledger.domain.template import template_hash
from tests.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential

from .support import PROFILE, SUBSCRIPTION, TEMPLATE, batch


@pytest.fixture
def retrying_client(fake_arm: FakeArmServer) -> Iterator[ComputeManagementClient]:
    """A client with azure-core's retries on, as a deployment has them (without back-off)."""
    options = {**fake_arm.client_options(retry_total=3), "retry_backoff_factor": 0}
    with ComputeManagementClient(StaticTokenCredential(), SUBSCRIPTION, **options) as client:
        yield client


class Crash(Exception):
    """Stands for the controller dying right after it recorded a progress note."""


class TestCreateOnlyPuts:
    def test_sends_one_if_none_match_put_per_machine(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """Every machine gets its own PUT, and every PUT is create-only (If-None-Match: *)."""
        vm_cloud.create_batch(batch("m-1", "m-2", "m-3"))

        puts = fake_arm.puts()
        assert sorted(p.path.rsplit("/", 1)[1] for p in puts) == ["m-1", "m-2", "m-3"]
        assert [p.header("If-None-Match") for p in puts] == ["*", "*", "*"]

    def test_an_existing_vm_is_read_after_the_precondition_fails(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A re-create meets 412 and is answered from a GET of the VM, not a second create."""
        vm_cloud.create_batch(batch("m-1"))

        vm_cloud.create_batch(batch("m-1", batch_id="batch-2"))

        last_put, read = fake_arm.requests[-2:]
        assert (last_put.method, last_put.status) == ("PUT", 412)
        assert (read.method, read.path.endswith("/virtualMachines/m-1")) == ("GET", True)


class TestUnknownOutcomes:
    def test_a_broken_poll_leaves_the_machine_unknown(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A failed status request is not a failed create: the machine is unknown, not failed."""
        fake_arm.break_next_polls()
        request = batch("m-1")

        result = vm_cloud.create_batch(request)

        assert result.unknown(request) == ("m-1",)


class TestBody:
    def test_builds_the_vm_from_the_template_zones_and_tags(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """Size, spot priority and disk come from the template; zones and tags from the machine."""
        vm_cloud.create_batch(batch("m-1", zones=("2",)))

        body = fake_arm.puts()[0].json()
        properties = body["properties"]
        assert body["zones"] == ["2"]
        assert body["tags"] == {
            "team": "platform",
            "machine": "m-1",
            OWNER_TAG: "fleetledger",
            BATCH_TAG: "batch-1",
            REQUEST_TAG: "req-m-1",
            TEMPLATE_HASH_TAG: template_hash(TEMPLATE),
        }
        assert properties["hardwareProfile"] == {"vmSize": "Standard_D4s_v5"}
        assert (properties["priority"], properties["evictionPolicy"]) == ("Spot", "Delete")
        assert properties["storageProfile"]["osDisk"]["diffDiskSettings"] == {"option": "Local"}
        assert properties["osProfile"]["computerName"] == "m-1"

    def test_an_ephemeral_os_disk_is_cached_read_only(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """Compute takes an ephemeral OS disk only with ReadOnly caching."""
        vm_cloud.create_batch(batch("m-1"))

        os_disk = fake_arm.puts()[0].json()["properties"]["storageProfile"]["osDisk"]
        assert os_disk["caching"] == "ReadOnly"

    def test_a_template_without_subnet_takes_the_profiles(
        self, compute_client: ComputeManagementClient, fake_arm: FakeArmServer
    ) -> None:
        """VmProfile.subnet_id gives the NIC its subnet when the template names none."""
        profile = replace(PROFILE, subnet_id="/subscriptions/s/subnets/default")
        cloud = AzureVmCloud(compute_client, resource_group="rg", profile=profile)
        request = BatchCreate("b", replace(TEMPLATE, vnet_subnet_id=None), (MachineSpec("m-1"),))

        cloud.create_batch(request)

        nic = fake_arm.puts()[0].json()["properties"]["networkProfile"]
        configuration = nic["networkInterfaceConfigurations"][0]["properties"]
        subnet = configuration["ipConfigurations"][0]["properties"]["subnet"]
        assert subnet == {"id": "/subscriptions/s/subnets/default"}


class TestRefusedBeforeSending:
    def test_more_than_one_zone_fails_that_machine_without_a_put(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A VM lives in one zone: asking for two fails the machine, naming the fix."""
        request = BatchCreate(
            "b", TEMPLATE, (MachineSpec("m-1", zones=("1", "2")), MachineSpec("m-2"))
        )

        result = vm_cloud.create_batch(request)

        assert set(result.created) == {"m-2"}
        error = result.failed["m-1"]
        assert isinstance(error, UnknownCloudError)
        assert "one zone" in error.message
        assert not error.retryable
        assert [p.path.rsplit("/", 1)[1] for p in fake_arm.puts()] == ["m-2"]

    def test_a_tag_key_azure_refuses_fails_that_machine_without_a_put(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """Azure refuses '/' in tag names; the machine fails at once, naming the key."""
        request = BatchCreate("b", TEMPLATE, (MachineSpec("m-1", tags=(("k8s.io/role", "x"),)),))

        result = vm_cloud.create_batch(request)

        assert "k8s.io/role" in result.failed["m-1"].message
        assert fake_arm.puts() == ()

    def test_no_subnet_anywhere_refuses_the_batch(
        self, compute_client: ComputeManagementClient, fake_arm: FakeArmServer
    ) -> None:
        """Without a subnet the VM would have no NIC and fail late: the call is refused."""
        profile = replace(PROFILE, subnet_id=None)
        cloud = AzureVmCloud(compute_client, resource_group="rg", profile=profile)
        request = BatchCreate("b", replace(TEMPLATE, vnet_subnet_id=None), (MachineSpec("m-1"),))

        with pytest.raises(UnknownCloudError, match="subnet"):
            cloud.create_batch(request)

        assert fake_arm.puts() == ()


class TestThrottling:
    def test_a_429_is_not_retried_inside_the_call_and_stops_the_batch(
        self, retrying_client: ComputeManagementClient, fake_arm: FakeArmServer
    ) -> None:
        """With azure-core retries on, the first 429 is reported, not slept out holding a slot;
        the machines not yet sent are reported throttled without being sent."""
        fake_arm.throttle(retry_after=30)
        cloud = AzureVmCloud(retrying_client, resource_group="rg", profile=PROFILE, max_parallel=1)

        result = cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert len(fake_arm.puts()) == 1
        assert set(result.failed) == {"m-1", "m-2", "m-3"}
        assert all(isinstance(e, Throttled) for e in result.failed.values())
        assert {e.retry_after for e in result.failed.values()} == {30}


class TestOwnership:
    def test_the_request_id_is_tagged_when_known(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A machine made for a request carries that request's id."""
        request = BatchCreate("b-3", TEMPLATE, (MachineSpec("m-1", request_id="req-9"),))

        vm_cloud.create_batch(request)

        tags = fake_arm.machine_tags("m-1")
        assert (tags[OWNER_TAG], tags[BATCH_TAG], tags[REQUEST_TAG]) == (
            "fleetledger",
            "b-3",
            "req-9",
        )

    def test_a_vm_of_another_owner_is_never_taken_over(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """After the 412, the existing VM's owner tag is not ours: NameInUse, VM untouched."""
        fake_arm.plant_machine("m-1", kind="vm", tags={OWNER_TAG: "someone-else"})

        result = vm_cloud.create_batch(batch("m-1"))

        assert isinstance(result.failed["m-1"], NameInUse)
        assert fake_arm.machine_tags("m-1") == {OWNER_TAG: "someone-else"}
        assert fake_arm.deletions == ()

    def test_our_own_vm_is_taken_over(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """After the 412, a VM tagged as ours is reported as it is (created here)."""
        fake_arm.plant_machine("m-1", kind="vm", tags={OWNER_TAG: "fleetledger"})

        result = vm_cloud.create_batch(batch("m-1"))

        assert set(result.created) == {"m-1"}


class TestFailedLeftovers:
    def test_a_vm_that_failed_to_provision_is_deleted_and_reported(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """The failed VM would stay billed: it is deleted and named in ``deleted``."""
        fake_arm.fail_async("m-2", "AllocationFailed")

        result = vm_cloud.create_batch(batch("m-1", "m-2"))

        assert isinstance(result.failed["m-2"], CapacityUnavailable)
        assert result.deleted == ("m-2",)
        assert fake_arm.deletions == ("m-2",)
        assert fake_arm.machine_names() == ("m-1",)

    def test_a_refused_put_leaves_nothing_to_delete(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A quota refusal made no VM: nothing is deleted or reported deleted."""
        fake_arm.set_quota(0)

        result = vm_cloud.create_batch(batch("m-1"))

        assert set(result.failed) == {"m-1"}
        assert (result.deleted, fake_arm.deletions) == ((), ())

    def test_a_failed_vm_found_by_a_read_is_deleted(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A failed VM of ours met by a read (after a restart, say) would stay billed too: the
        read deletes it and says so."""
        fake_arm.plant_machine("m-1", kind="vm", tags={OWNER_TAG: "fleetledger"}, state="Failed")

        seen = vm_cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", True)
        assert isinstance(seen.error, CapacityUnavailable)
        assert fake_arm.deletions == ("m-1",)
        assert vm_cloud.read_machine("m-1").status == "not_found"

    def test_another_owners_failed_vm_is_never_deleted_by_a_read(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """Only our own leftovers are ours to delete."""
        fake_arm.plant_machine("m-1", kind="vm", tags={OWNER_TAG: "someone-else"}, state="Failed")

        seen = vm_cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", False)
        assert fake_arm.deletions == ()

    def test_a_read_deletes_nothing_when_deletion_is_off(
        self, vm_contract_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """With ``delete_failed=False`` a read leaves the failed VM where it is."""
        fake_arm.plant_machine("m-1", kind="vm", tags={OWNER_TAG: "fleetledger"}, state="Failed")

        seen = vm_contract_cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", False)
        assert fake_arm.machine_state("m-1") == "Failed"


class TestContinuationToken:
    def test_a_new_process_resumes_the_create_from_the_token(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A fresh client and adapter, given only the token, finish the create without a PUT."""
        notes: list[ProgressNote] = []

        def record_then_crash(accepted: Sequence[ProgressNote]) -> None:
            notes.extend(accepted)
            raise Crash

        with pytest.raises(Crash):
            vm_cloud.create_batch(batch("m-1"), on_progress=record_then_crash)
        with ComputeManagementClient(
            StaticTokenCredential(), SUBSCRIPTION, **fake_arm.client_options()
        ) as client:
            restarted = AzureVmCloud(client, resource_group="rg", profile=PROFILE)
            seen = restarted.read_machine("m-1", resume_token=notes[0].resume_token)

        assert seen.status == "succeeded"
        assert len(fake_arm.puts()) == 1


class TestParallelism:
    def test_never_has_more_puts_in_flight_than_max_parallel(
        self, compute_client: ComputeManagementClient, fake_arm: FakeArmServer
    ) -> None:
        """With max_parallel=2, at most two PUTs are ever in flight at once.

        The server holds each PUT until three are in flight or 0.1 s passes: a bounded client
        waits out the timeout per wave, an unbounded one opens the gate at once and is caught.
        """
        fake_arm.gate_puts(release_at=3, timeout=0.1)
        cloud = AzureVmCloud(compute_client, resource_group="rg", profile=PROFILE, max_parallel=2)

        result = cloud.create_batch(batch("m-1", "m-2", "m-3", "m-4"))

        assert len(result.created) == 4
        assert fake_arm.max_concurrent_puts == 2
