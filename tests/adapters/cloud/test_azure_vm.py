"""AzureVmCloud specifics: create-only PUTs, continuation tokens, bounded parallelism, the body."""

from __future__ import annotations

import pytest
from azure.mgmt.compute import ComputeManagementClient

from fleetledger.adapters.cloud import ProgressNote
from fleetledger.adapters.cloud.azure_vm import TEMPLATE_HASH_TAG, AzureVmCloud
from fleetledger.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential
from fleetledger.domain.template import template_hash

from .support import PROFILE, SUBSCRIPTION, TEMPLATE, batch


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
            TEMPLATE_HASH_TAG: template_hash(TEMPLATE),
        }
        assert properties["hardwareProfile"] == {"vmSize": "Standard_D4s_v5"}
        assert (properties["priority"], properties["evictionPolicy"]) == ("Spot", "Delete")
        assert properties["storageProfile"]["osDisk"]["diffDiskSettings"] == {"option": "Local"}
        assert properties["osProfile"]["computerName"] == "m-1"


class TestContinuationToken:
    def test_a_new_process_resumes_the_create_from_the_token(
        self, vm_cloud: AzureVmCloud, fake_arm: FakeArmServer
    ) -> None:
        """A fresh client and adapter, given only the token, finish the create without a PUT."""
        notes: list[ProgressNote] = []

        def record_then_crash(note: ProgressNote) -> None:
            notes.append(note)
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
