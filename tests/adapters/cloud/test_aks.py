"""AksMachinesCloud specifics, with the real SDK against the fake ARM server.

The batch PUT, its per-machine answers (flat ``BatchMachineClientError`` details, JSON inside a
``BatchMachineInternalServerError`` message), per-machine reads, retries that must not turn
started machines into failures, the agent pool check, ownership tags and failed leftovers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from azure.mgmt.containerservice import ContainerServiceClient

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cloud import (
    BatchCreate,
    CapacityUnavailable,
    CloudSetupError,
    MachineSpec,
    NameInUse,
    ProgressNote,
    QuotaExceeded,
    SkuUnavailable,
    Throttled,
    UnknownCloudError,
)
from fleetledger.adapters.cloud.aks import (
    BATCH_TAG,
    OWNER_TAG,
    PREVIEW_API_VERSION,
    AksMachinesCloud,
)
from fleetledger.domain.machines import REQUEST_TAG
from tests.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential

from .support import EPOCH, SUBSCRIPTION, TEMPLATE, batch

_MACHINES = "/managedClusters/fleet/agentPools/burst/machines/"


class Crash(Exception):
    """Stands for the controller dying right after it recorded a progress note."""


def _cloud(client: ContainerServiceClient, **options: object) -> AksMachinesCloud:
    return AksMachinesCloud(
        client,
        resource_group="rg",
        cluster_name="fleet",
        agent_pool="burst",
        clock=ManualClock(EPOCH),
        **options,  # type: ignore[arg-type]
    )


@pytest.fixture
def retrying_client(fake_arm: FakeArmServer) -> Iterator[ContainerServiceClient]:
    """A client with azure-core's retries on, as a deployment has them (without back-off)."""
    options = {**fake_arm.client_options(retry_total=3), "retry_backoff_factor": 0}
    with ContainerServiceClient(
        StaticTokenCredential(), SUBSCRIPTION, api_version=PREVIEW_API_VERSION, **options
    ) as client:
        yield client


@pytest.fixture
def retrying_cloud(retrying_client: ContainerServiceClient) -> AksMachinesCloud:
    return _cloud(retrying_client)


class TestBatchPut:
    def test_sends_one_put_for_the_whole_batch(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Three machines cost one PUT, not three."""
        aks_cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert len(fake_arm.puts()) == 1

    def test_lists_every_machine_in_the_batch_put_machine_header(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The header is the compact JSON of every machine, in order, with [] and {} defaults,
        each machine tagged with its owner, its batch and its request: batch mode applies only
        the header's tags."""
        request = batch("m-1", "m-2", zones=("1",))

        aks_cloud.create_batch(request)

        assert fake_arm.puts()[0].header("BatchPutMachine") == (
            '{"vmSkus":{"value":[]},"batchMachines":['
            '{"machineName":"m-1","zones":["1"],"tags":{"team":"platform","machine":"m-1",'
            '"fleetledger-owner":"fleetledger","fleetledger-batch":"batch-1",'
            '"fleetledger-request":"req-m-1"}},'
            '{"machineName":"m-2","zones":[],"tags":{"team":"platform","machine":"m-2",'
            '"fleetledger-owner":"fleetledger","fleetledger-batch":"batch-1",'
            '"fleetledger-request":"req-m-2"}}]}'
        )

    def test_addresses_the_put_to_the_first_machine_in_the_preview_version(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The resource URL names the batch's first machine; the version is the preview's."""
        aks_cloud.create_batch(batch("m-7", "m-8"))

        put = fake_arm.puts()[0]
        assert put.path.endswith(_MACHINES + "m-7")
        assert put.query["api-version"] == PREVIEW_API_VERSION

    def test_body_is_the_typed_template_without_zones_or_tags(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The body is the typed model's JSON (``enableFIPS``, as the API spells it) and nothing
        else: batch mode discards a body's zones and tags, so names, zones and every tag
        (ownership included) stay in the header."""
        aks_cloud.create_batch(batch("m-1", zones=("1",)))

        body = fake_arm.puts()[0].json()
        assert body == {
            "properties": {
                "hardware": {"vmSize": "Standard_D4s_v5"},
                "kubernetes": {
                    "orchestratorVersion": "1.31.2",
                    "maxPods": 110,
                    "kubeletConfig": {"cpuManagerPolicy": "static"},
                },
                "operatingSystem": {
                    "osType": "Linux",
                    "osSKU": "Ubuntu",
                    "osDiskSizeGB": 128,
                    "osDiskType": "Ephemeral",
                    "enableFIPS": False,
                },
                "mode": "User",
                "priority": "Spot",
                "network": {
                    "vnetSubnetID": "/subscriptions/s/resourceGroups/rg/providers"
                    "/Microsoft.Network/virtualNetworks/v/subnets/a"
                },
            }
        }

    def test_caps_a_put_at_fifty_machines(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A batch of 120 goes out as PUTs of 50, 50 and 20, and every machine is created."""
        names = [f"m-{i:03d}" for i in range(120)]

        result = aks_cloud.create_batch(batch(*names))

        counts = [(p.header("BatchPutMachine") or "").count("machineName") for p in fake_arm.puts()]
        assert counts == [50, 50, 20]
        assert set(result.created) == set(names)

    def test_a_later_put_refused_as_a_whole_fails_only_its_machines_and_the_unsent(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """PUTs of 2, 2 and 1: the second gets a 429. The first's machines exist, so nothing
        is raised (that would say none was made): the second's and the third's machines fail
        with the 429, and the third PUT, which would meet it again, is not sent."""
        cloud = _cloud(aks_client, max_batch_machines=2)
        fake_arm.throttle(retry_after=9, after=1)

        result = cloud.create_batch(batch("m-1", "m-2", "m-3", "m-4", "m-5"))

        assert len(fake_arm.puts()) == 2
        assert set(result.created) == {"m-1", "m-2"}
        assert set(result.failed) == {"m-3", "m-4", "m-5"}
        assert all(isinstance(e, Throttled) for e in result.failed.values())
        assert {e.retry_after for e in result.failed.values()} == {9}


@pytest.fixture
def paged_arm() -> Iterator[FakeArmServer]:
    """A fake whose machine lists come in pages of 20, so a list of 50 follows two nextLinks."""
    with FakeArmServer(list_page_size=20) as server:
        yield server


@pytest.fixture
def paged_cloud(paged_arm: FakeArmServer) -> Iterator[AksMachinesCloud]:
    with ContainerServiceClient(
        StaticTokenCredential(),
        SUBSCRIPTION,
        api_version=PREVIEW_API_VERSION,
        **paged_arm.client_options(),
    ) as client:
        yield _cloud(client)


class TestProgress:
    def test_a_poll_of_fifty_machines_is_one_paged_list_not_fifty_gets(
        self, paged_cloud: AksMachinesCloud, paged_arm: FakeArmServer
    ) -> None:
        """Each poll lists the pool once (three pages of 20, following nextLink) and reads no
        machine on its own: two polls (Creating, then Succeeded) cost six list pages."""
        names = [f"m-{i:02d}" for i in range(50)]

        result = paged_cloud.create_batch(batch(*names))

        assert set(result.created) == set(names)
        assert paged_arm.machine_reads() == ()
        pages = paged_arm.machine_lists()
        assert len(pages) == 6
        assert [p.query.get("$skipToken") is None for p in pages] == [True, False, False] * 2
        assert {p.query["api-version"] for p in pages} == {PREVIEW_API_VERSION}

    def test_a_machine_missing_from_the_list_is_read_by_one_get(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The first list lags m-2: that poll reads m-2 alone with its own GET; the machines the
        list shows are never read one by one."""
        fake_arm.hide_from_lists("m-2")

        result = aks_cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert set(result.created) == {"m-1", "m-2", "m-3"}
        assert [r.path.rsplit("/", 1)[-1] for r in fake_arm.machine_reads()] == ["m-2"]

    def test_a_machine_going_to_deleting_fails_at_once(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """A machine deleted under its create will never succeed: the poll that sees it
        ``Deleting`` fails it (retryable, saying why), without waiting out ``poll_timeout``, and
        sends no delete of its own."""
        fake_arm.delete_while_creating("m-2")
        clock = ManualClock(EPOCH)
        cloud = AksMachinesCloud(
            aks_client, resource_group="rg", cluster_name="fleet", agent_pool="burst", clock=clock
        )

        result = cloud.create_batch(batch("m-1", "m-2"))

        assert set(result.created) == {"m-1"}
        error = result.failed["m-2"]
        assert isinstance(error, UnknownCloudError)
        assert (error.provider_code, error.retryable) == ("MachineDeleting", True)
        assert "m-2 is being deleted" in error.message
        assert result.deleted == ()
        assert _delete_posts(fake_arm) == []
        assert len(fake_arm.machine_lists()) == 2
        assert (clock.now() - EPOCH).total_seconds() == 5.0

    def test_a_failed_machine_seen_in_the_list_is_failed_and_deleted(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """``Failed`` in the list ends the create with the machine's own provisioning error,
        and the leftover is deleted; it is never read one by one."""
        fake_arm.fail_async("m-1", "AllocationFailed", "no capacity for m-1")

        result = aks_cloud.create_batch(batch("m-1", "m-2", zones=("3", "1")))

        error = result.failed["m-1"]
        assert isinstance(error, CapacityUnavailable)
        assert (error.message, error.zone) == ("no capacity for m-1", "3")
        assert result.deleted == ("m-1",)
        assert _delete_posts(fake_arm) == [["m-1"]]
        assert fake_arm.machine_reads() == ()

    def test_a_failed_list_is_tried_again_at_the_next_poll(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A list answered 500 says nothing about the machines: they are not read one by one
        nor left unknown, and the next poll's list settles them."""
        fake_arm.break_next_lists()

        result = aks_cloud.create_batch(batch("m-1", "m-2"))

        assert set(result.created) == {"m-1", "m-2"}
        assert [r.status for r in fake_arm.machine_lists()] == [500, 200, 200]
        assert fake_arm.machine_reads() == ()

    def test_a_read_of_a_deleting_machine_sends_no_delete(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """``read_machine`` reports a ``Deleting`` machine failed but leaves its deletion to
        whoever started it."""
        fake_arm.plant_machine("m-1", tags={OWNER_TAG: "fleetledger"}, state="Deleting")

        seen = aks_cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", False)
        assert _delete_posts(fake_arm) == []


class TestRefusedBeforeSending:
    def test_a_tag_key_azure_refuses_refuses_the_batch_without_a_put(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Azure refuses '/' in tag names; the header cannot drop the machine, so the batch is
        refused whole, naming the machine and the key."""
        request = BatchCreate(
            "b", TEMPLATE, (MachineSpec("m-1"), MachineSpec("m-2", tags=(("k8s.io/role", "x"),)))
        )

        with pytest.raises(UnknownCloudError, match=r"m-2: k8s\.io/role"):
            aks_cloud.create_batch(request)

        assert fake_arm.puts() == ()


class TestPerMachineResults:
    def test_every_machine_is_read_from_the_pool_list_in_the_preview_version(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The operation covers only the first machine: every machine's outcome comes from the
        pool's list, asked in the preview version (only its machines carry a state)."""
        result = aks_cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert set(result.created) == {"m-1", "m-2", "m-3"}
        lists = fake_arm.machine_lists()
        assert lists
        assert {r.query["api-version"] for r in lists} == {PREVIEW_API_VERSION}

    def test_the_first_machines_failure_is_not_applied_to_the_others(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """m-1 failing ZonalAllocationFailed leaves m-2 created, not failed with m-1's error."""
        fake_arm.fail_async("m-1", "ZonalAllocationFailed")

        result = aks_cloud.create_batch(batch("m-1", "m-2", zones=("1", "2")))

        assert set(result.created) == {"m-2"}
        error = result.failed["m-1"]
        assert isinstance(error, CapacityUnavailable)
        assert error.zone == "1"

    def test_client_error_details_fail_only_their_targets(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A 400 BatchMachineClientError fails the machines in ``details[].target``, each with its
        own code; the machines it does not list started and are created."""
        fake_arm.refuse_machine("m-2", "SkuNotAvailable", "Standard_D4s_v5 is not offered")

        result = aks_cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert set(result.created) == {"m-1", "m-3"}
        error = result.failed["m-2"]
        assert isinstance(error, SkuUnavailable)
        assert error.message == "Standard_D4s_v5 is not offered"

    def test_internal_error_details_are_read_from_the_message(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A 500 BatchMachineInternalServerError carries the failed machines as JSON in
        ``message``; each fails retryably, the rest are created."""
        fake_arm.refuse_machine("m-1", "InternalOperationError", "try again", internal=True)

        result = aks_cloud.create_batch(batch("m-1", "m-2"))

        assert set(result.created) == {"m-2"}
        error = result.failed["m-1"]
        assert isinstance(error, UnknownCloudError)
        assert (error.provider_code, error.retryable) == ("InternalOperationError", True)

    def test_any_other_error_code_refuses_the_whole_batch(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """An ordinary error (a bad shared property) raises for the batch; nothing is made."""
        fake_arm.fail_next_puts(400, "InvalidParameter", "osDiskSizeGB is too small")

        with pytest.raises(UnknownCloudError) as raised:
            aks_cloud.create_batch(batch("m-1", "m-2"))

        assert raised.value.message == "osDiskSizeGB is too small"
        assert fake_arm.creations == ()

    def test_a_batch_over_quota_raises_quota_exceeded(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A batch refused for a cores quota (409 OperationNotAllowed) raises QuotaExceeded."""
        fake_arm.set_quota(1)

        with pytest.raises(QuotaExceeded) as raised:
            aks_cloud.create_batch(batch("m-1", "m-2"))

        assert raised.value.provider_code == "OperationNotAllowed"
        assert fake_arm.creations == ()

    def test_vm_size_not_supported_is_sku_unavailable(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The AKS spelling of an unavailable size, BadRequest "is not supported for
        subscription", raises SkuUnavailable."""
        fake_arm.fail_next_puts(
            400,
            "BadRequest",
            "The VM size of Standard_D4s_v5 is not supported for subscription s in westus3",
        )

        with pytest.raises(SkuUnavailable):
            aks_cloud.create_batch(batch("m-1"))


class TestRetries:
    def test_the_batch_put_is_never_resent_by_the_transport(
        self, retrying_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """With azure-core retries on, a 500 with per-machine details is not replayed: one PUT,
        and the machines it started are created, not failed as "already exists"."""
        fake_arm.refuse_machine("m-2", "InternalOperationError", internal=True)

        result = retrying_cloud.create_batch(batch("m-1", "m-2", "m-3"))

        assert len(fake_arm.puts()) == 1
        assert set(result.created) == {"m-1", "m-3"}
        assert set(result.failed) == {"m-2"}

    def test_throttling_is_not_retried_inside_the_call(
        self, retrying_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A 429 reaches the caller after one PUT, so its back-off, not the SDK's, applies."""
        fake_arm.throttle(retry_after=0)

        with pytest.raises(Throttled):
            retrying_cloud.create_batch(batch("m-1"))

        assert len(fake_arm.puts()) == 1

    def test_a_lost_answer_is_resolved_by_reading_not_by_resending(
        self, retrying_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The PUT's answer is lost after the machines started: they are found by GET and
        reported created; the PUT is not sent again."""
        fake_arm.drop_next_puts()
        request = batch("m-1", "m-2")

        result = retrying_cloud.create_batch(request)

        assert len(fake_arm.puts()) == 1
        assert set(result.created) == {"m-1", "m-2"}
        assert fake_arm.creations == ("m-1", "m-2")

    def test_machines_known_not_to_have_started_are_sent_once_more(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A 503 without details started nothing the GETs can find: one more PUT creates them."""
        fake_arm.fail_next_puts(503, "ServiceUnavailable", "try later")

        result = aks_cloud.create_batch(batch("m-1", "m-2"))

        assert len(fake_arm.puts()) == 2
        assert set(result.created) == {"m-1", "m-2"}
        assert fake_arm.creations == ("m-1", "m-2")

    def test_a_resend_refused_as_a_whole_fails_only_the_unstarted_machines(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The one re-send is refused outright: its error fails the machines it carried."""
        fake_arm.fail_next_puts(503, "ServiceUnavailable", "try later")
        fake_arm.fail_next_puts(400, "InvalidParameter", "maxPods is out of range")

        result = aks_cloud.create_batch(batch("m-1", "m-2"))

        assert len(fake_arm.puts()) == 2
        assert {n: e.message for n, e in result.failed.items()} == {
            "m-1": "maxPods is out of range",
            "m-2": "maxPods is out of range",
        }
        assert fake_arm.creations == ()

    def test_a_replayed_batch_reports_no_false_failure_and_creates_nothing_twice(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The caller re-sends a batch whose answer was lost: the service answers "exists" for
        every machine; each is read, found ours, and reported created."""
        fake_arm.drop_next_puts()
        request = batch("m-1", "m-2")
        aks_cloud.create_batch(request)

        again = aks_cloud.create_batch(request)

        assert fake_arm.puts()[-1].status == 400  # BatchMachineClientError: both exist
        assert set(again.created) == {"m-1", "m-2"}
        assert again.failed == {}
        assert fake_arm.creations == ("m-1", "m-2")


class TestAgentPool:
    def test_a_missing_agent_pool_is_refused_at_start_up(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """Construction reads the pool; a missing one is a set-up error naming it."""
        fake_arm.set_agent_pool("burst", mode=None)

        with pytest.raises(CloudSetupError, match="rg/fleet/burst does not exist"):
            _cloud(aks_client)

    def test_a_pool_not_in_machines_mode_is_refused_at_start_up(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """A User-mode pool cannot take machines: the error says which mode is needed."""
        fake_arm.set_agent_pool("burst", mode="User")

        with pytest.raises(CloudSetupError, match=r"'User'.*mode Machines"):
            _cloud(aks_client)

    def test_a_client_on_a_stable_api_version_is_refused(self, fake_arm: FakeArmServer) -> None:
        """On a stable version machines cannot be created nor their state read: refused."""
        with (
            ContainerServiceClient(
                StaticTokenCredential(),
                SUBSCRIPTION,
                api_version="2025-08-01",
                **fake_arm.client_options(),
            ) as client,
            pytest.raises(CloudSetupError, match=PREVIEW_API_VERSION),
        ):
            _cloud(client)

    def test_more_than_fifty_machines_per_put_is_refused(
        self, aks_client: ContainerServiceClient
    ) -> None:
        """The API's cap holds whatever the configuration asks for."""
        with pytest.raises(ValueError, match="1-50"):
            _cloud(aks_client, max_batch_machines=51)


class TestOwnership:
    def test_every_machine_carries_the_owner_and_batch_tags(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Read back from the service, every machine carries the owner and batch tags beside
        its own tags: they travel in its header entry, the only tags batch mode applies."""
        aks_cloud.create_batch(batch("m-1", "m-2", batch_id="b-9"))

        for name in ("m-1", "m-2"):
            tags = fake_arm.machine_tags(name)
            assert (tags[OWNER_TAG], tags[BATCH_TAG], tags["machine"]) == (
                "fleetledger",
                "b-9",
                name,
            )

    def test_every_machine_carries_its_request_tag(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Each machine's request id rides in the header and ends up on that machine alone."""
        aks_cloud.create_batch(batch("m-1", "m-2"))

        assert [fake_arm.machine_tags(n)[REQUEST_TAG] for n in ("m-1", "m-2")] == [
            "req-m-1",
            "req-m-2",
        ]

    def test_a_name_held_by_another_owner_is_never_taken_over(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The machine exists under someone else's tags: that request fails NameInUse and the
        machine is left as it was; the rest of the batch is created."""
        fake_arm.plant_machine("m-2", tags={OWNER_TAG: "someone-else"})

        result = aks_cloud.create_batch(batch("m-1", "m-2"))

        assert set(result.created) == {"m-1"}
        assert isinstance(result.failed["m-2"], NameInUse)
        assert "another owner" in result.failed["m-2"].message
        assert fake_arm.machine_tags("m-2") == {OWNER_TAG: "someone-else"}
        assert fake_arm.deletions == ()

    def test_a_caller_tag_cannot_claim_ownership(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A caller's tag named like the owner tag is overridden: ownership is ours to state."""
        request = BatchCreate(
            "b-1",
            TEMPLATE,
            (MachineSpec("m-1", tags=((OWNER_TAG, "mallory"),), request_id="req-m-1"),),
        )

        aks_cloud.create_batch(request)

        assert fake_arm.machine_tags("m-1")[OWNER_TAG] == "fleetledger"

    def test_an_earlier_versions_machine_is_recognised_by_its_request_tag(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A machine made before ownership moved into the header has no owner tag (the service
        discarded the body's) but carries the request it was made for: it is ours, created."""
        fake_arm.plant_machine("m-1", tags={REQUEST_TAG: "req-m-1"})

        result = aks_cloud.create_batch(batch("m-1"))

        assert set(result.created) == {"m-1"}

    def test_an_untagged_machine_of_another_request_is_not_ours(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Without an owner tag, only the very request id makes a machine ours."""
        fake_arm.plant_machine("m-1", tags={REQUEST_TAG: "req-other"})

        result = aks_cloud.create_batch(batch("m-1"))

        assert isinstance(result.failed["m-1"], NameInUse)
        assert fake_arm.deletions == ()

    def test_a_name_held_by_us_is_taken_over(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Our own machine from an earlier run is reported created, not failed."""
        fake_arm.plant_machine("m-1", tags={OWNER_TAG: "fleetledger"})

        result = aks_cloud.create_batch(batch("m-1"))

        assert set(result.created) == {"m-1"}


class TestFailedLeftovers:
    def test_a_machine_that_failed_to_provision_is_deleted_and_reported(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The failed machine would stay billed as a failed resource: it is deleted, and the
        result names it in ``deleted``."""
        fake_arm.fail_async("m-2", "AllocationFailed")

        result = aks_cloud.create_batch(batch("m-1", "m-2"))

        assert result.deleted == ("m-2",)
        assert isinstance(result.failed["m-2"], CapacityUnavailable)
        assert fake_arm.deletions == ("m-2",)
        assert fake_arm.machine_names() == ("m-1",)

    def test_deletion_can_be_turned_off(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """With ``delete_failed=False`` the failed machine stays and nothing is reported deleted."""
        fake_arm.fail_async("m-1", "AllocationFailed")

        result = _cloud(aks_client, delete_failed=False).create_batch(batch("m-1"))

        assert result.deleted == ()
        assert fake_arm.machine_state("m-1") == "Failed"

    def test_a_failed_machine_found_by_a_read_is_deleted(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A failed machine of ours met by a read (after a restart, say) would stay billed too:
        the read deletes it and says so."""
        fake_arm.plant_machine("m-1", tags={OWNER_TAG: "fleetledger"}, state="Failed")

        seen = aks_cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", True)
        assert isinstance(seen.error, CapacityUnavailable)
        assert fake_arm.deletions == ("m-1",)
        assert aks_cloud.read_machine("m-1").status == "not_found"

    def test_a_failed_create_resumed_after_a_crash_is_deleted(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """The controller died after the batch PUT; resuming the create finds it failed, and
        that read deletes the leftover."""
        fake_arm.fail_async("m-1", "AllocationFailed")
        notes: list[ProgressNote] = []

        def crash(accepted: Sequence[ProgressNote]) -> None:
            notes.extend(accepted)
            raise Crash

        with pytest.raises(Crash):
            _cloud(aks_client).create_batch(batch("m-1"), on_progress=crash)
        (note,) = notes
        seen = _cloud(aks_client).read_machine("m-1", resume_token=note.resume_token)

        assert (seen.status, seen.deleted) == ("failed", True)
        assert fake_arm.deletions == ("m-1",)

    def test_another_owners_failed_machine_is_never_deleted_by_a_read(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """Only our own leftovers are ours to delete."""
        fake_arm.plant_machine("m-1", tags={OWNER_TAG: "someone-else"}, state="Failed")

        seen = aks_cloud.read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", False)
        assert fake_arm.deletions == ()

    def test_a_read_deletes_nothing_when_deletion_is_off(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """With ``delete_failed=False`` a read leaves the failed machine where it is."""
        fake_arm.plant_machine("m-1", tags={OWNER_TAG: "fleetledger"}, state="Failed")

        seen = _cloud(aks_client, delete_failed=False).read_machine("m-1")

        assert (seen.status, seen.deleted) == ("failed", False)
        assert fake_arm.machine_state("m-1") == "Failed"


def _delete_posts(server: FakeArmServer) -> list[list[str]]:
    """The machine names of every ``deleteMachines`` POST, in order."""
    return [
        list(r.json()["machineNames"])
        for r in server.requests
        if r.method == "POST" and r.path.endswith("/deleteMachines")
    ]


def _assert_ours(server: FakeArmServer, names: Sequence[str], batch_id: str) -> None:
    for name in names:
        tags = server.machine_tags(name)
        assert (tags[OWNER_TAG], tags[BATCH_TAG], tags[REQUEST_TAG]) == (
            "fleetledger",
            batch_id,
            f"req-{name}",
        ), name


class TestBatchModeRecovery:
    """The service applies only header tags: after a lost answer, a 5xx or a replay, every
    machine must still read back as ours, and a failed leftover must be deleted."""

    def test_after_a_lost_answer_machines_are_ours_and_a_failed_one_is_deleted(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The service made the machines but the answer never came: each is read back, found
        ours by its tags, and the one that failed is deleted through deleteMachines."""
        fake_arm.drop_next_puts()
        fake_arm.fail_async("m-2", "AllocationFailed")

        result = aks_cloud.create_batch(batch("m-1", "m-2", "m-3", batch_id="b-lost"))

        assert set(result.created) == {"m-1", "m-3"}
        assert isinstance(result.failed["m-2"], CapacityUnavailable)
        assert result.deleted == ("m-2",)
        assert _delete_posts(fake_arm) == [["m-2"]]
        assert len(fake_arm.puts()) == 1
        _assert_ours(fake_arm, ["m-1", "m-3"], "b-lost")
        assert fake_arm.machine_names() == ("m-1", "m-3")

    def test_after_a_5xx_machines_are_ours_and_a_failed_one_is_deleted(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A 500 without per-machine details came after the service made the machines: none is
        reported "name in use", none is sent again, and the failed one is deleted."""
        fake_arm.fail_next_puts_after_handling(500, "InternalServerError", "oops")
        fake_arm.fail_async("m-1", "AllocationFailed")

        result = aks_cloud.create_batch(batch("m-1", "m-2", batch_id="b-5xx"))

        assert set(result.created) == {"m-2"}
        assert isinstance(result.failed["m-1"], CapacityUnavailable)
        assert result.deleted == ("m-1",)
        assert _delete_posts(fake_arm) == [["m-1"]]
        assert len(fake_arm.puts()) == 1
        assert fake_arm.creations == ("m-1", "m-2")
        _assert_ours(fake_arm, ["m-2"], "b-5xx")

    def test_a_replayed_batch_finds_its_machines_ours_and_deletes_a_failed_one(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """The controller died after the batch PUT; a new process replays the batch. The service
        answers "exists" for every machine; each reads back as ours, the failed one is deleted,
        and nothing is made twice."""
        fake_arm.fail_async("m-2", "AllocationFailed")

        def crash(accepted: Sequence[ProgressNote]) -> None:
            raise Crash

        with pytest.raises(Crash):
            _cloud(aks_client).create_batch(batch("m-1", "m-2", batch_id="b-re"), on_progress=crash)

        again = _cloud(aks_client).create_batch(batch("m-1", "m-2", batch_id="b-re"))

        assert fake_arm.puts()[-1].status == 400  # BatchMachineClientError: both exist
        assert set(again.created) == {"m-1"}
        assert isinstance(again.failed["m-2"], CapacityUnavailable)
        assert again.deleted == ("m-2",)
        assert _delete_posts(fake_arm) == [["m-2"]]
        assert fake_arm.creations == ("m-1", "m-2")
        _assert_ours(fake_arm, ["m-1"], "b-re")
