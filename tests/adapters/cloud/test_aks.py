"""AksMachinesCloud specifics: one PUT per batch, its BatchPutMachine header, refusals."""

from __future__ import annotations

import pytest

from fleetledger.adapters.cloud import QuotaExceeded
from fleetledger.adapters.cloud.aks import AksMachinesCloud
from fleetledger.adapters.cloud.fake_arm import FakeArmServer

from .support import batch


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
        """The header is the compact JSON of every machine, in order, with [] and {} defaults."""
        request = batch("m-1", "m-2", zones=("1",))

        aks_cloud.create_batch(request)

        assert fake_arm.puts()[0].header("BatchPutMachine") == (
            '{"vmSkus":{"value":[]},"batchMachines":['
            '{"machineName":"m-1","zones":["1"],"tags":{"team":"platform","machine":"m-1"}},'
            '{"machineName":"m-2","zones":[],"tags":{"team":"platform","machine":"m-2"}}]}'
        )

    def test_addresses_the_put_to_the_first_machine(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The resource URL names the batch's first machine, in the configured pool."""
        aks_cloud.create_batch(batch("m-7", "m-8"))

        put = fake_arm.puts()[0]
        assert put.path.endswith("/managedClusters/fleet/agentPools/burst/machines/m-7")
        assert put.query["api-version"] == "2025-07-02-preview"

    def test_body_carries_the_shared_template_only(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """The body is the template as machine properties; names, zones and tags stay out."""
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
                    "enableFips": False,
                },
                "mode": "User",
                "priority": "Spot",
                "network": {
                    "vnetSubnetID": "/subscriptions/s/resourceGroups/rg/providers"
                    "/Microsoft.Network/virtualNetworks/v/subnets/a"
                },
            }
        }


class TestWholeCall:
    def test_a_refused_batch_raises_instead_of_reporting_machines(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A batch refused as a whole (409 OperationNotAllowed) raises QuotaExceeded."""
        fake_arm.set_quota(1)

        with pytest.raises(QuotaExceeded) as raised:
            aks_cloud.create_batch(batch("m-1", "m-2"))

        assert raised.value.provider_code == "OperationNotAllowed"
        assert fake_arm.creations == ()

    def test_a_lost_answer_leaves_every_machine_unknown(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """When the PUT's answer is lost the batch may exist: nothing is reported either way."""
        fake_arm.drop_next_puts()
        request = batch("m-1", "m-2")

        result = aks_cloud.create_batch(request)

        assert result.unknown(request) == ("m-1", "m-2")
        assert fake_arm.creations == ("m-1", "m-2")

    def test_a_broken_poll_leaves_every_machine_unknown(
        self, aks_cloud: AksMachinesCloud, fake_arm: FakeArmServer
    ) -> None:
        """A failed status request says nothing about the machines: all stay unknown."""
        fake_arm.break_next_polls()
        request = batch("m-1", "m-2")

        result = aks_cloud.create_batch(request)

        assert result.unknown(request) == ("m-1", "m-2")
