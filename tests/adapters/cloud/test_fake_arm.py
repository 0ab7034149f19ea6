"""The fake ARM server answers the AKS machines batch PUT as the service does, seen through the
real SDK: flat per-machine error bodies, an operation covering only the first machine, errors for
machines that exist, and machine reads shaped by the API version asked for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.mgmt.containerservice import ContainerServiceClient

from fleetledger.adapters.cloud.aks import PREVIEW_API_VERSION, machine_body
from fleetledger.adapters.cloud.port import BATCH_PUT_MACHINE_HEADER, MachineSpec
from fleetledger.adapters.cloud.port import encode_batch_put_machine_header as header_of
from tests.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential

from .support import SUBSCRIPTION, TEMPLATE


def _specs(*names: str) -> list[MachineSpec]:
    return [MachineSpec(n, request_id=f"req-{n}") for n in names]


def _put(client: ContainerServiceClient, *names: str) -> None:
    machines = _specs(*names)
    client.machines.begin_create_or_update(
        "rg",
        "fleet",
        "burst",
        names[0],
        machine_body(TEMPLATE),
        headers={BATCH_PUT_MACHINE_HEADER: header_of(machines)},
        polling=False,
    )


def _refused(client: ContainerServiceClient, *names: str) -> tuple[int, dict[str, Any]]:
    with pytest.raises(HttpResponseError) as raised:
        _put(client, *names)
    assert raised.value.response is not None
    body = json.loads(raised.value.response.text())
    return raised.value.status_code or 0, body


class TestRequestTags:
    def test_a_batch_with_a_machine_lacking_its_request_tag_is_refused_whole(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """Every machine the controller makes names its request: a header entry without the
        ``fleetledger-request`` tag fails the whole batch, and nothing is created."""
        specs = [MachineSpec("m-1", request_id="req-m-1"), MachineSpec("m-2")]

        with pytest.raises(HttpResponseError) as raised:
            aks_client.machines.begin_create_or_update(
                "rg",
                "fleet",
                "burst",
                "m-1",
                machine_body(TEMPLATE),
                headers={BATCH_PUT_MACHINE_HEADER: header_of(specs)},
                polling=False,
            )

        assert raised.value.status_code == 400
        assert raised.value.error is not None and raised.value.error.code == "MissingRequestTag"
        assert "m-2" in str(raised.value)
        assert fake_arm.creations == ()


class TestBatchMode:
    def test_body_zones_and_tags_are_discarded_and_each_entry_applies_its_own(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """With the header, the body's zones and tags reach no machine; each machine gets exactly
        its own header entry's zones and tags, nothing merged."""
        body = machine_body(TEMPLATE)
        assert body.properties is not None
        body.properties.tags = {"from-body": "x"}
        body.zones = ["3"]
        specs = [
            MachineSpec("m-1", zones=("1",), tags=(("k", "a"),), request_id="req-m-1"),
            MachineSpec("m-2", request_id="req-m-2"),
        ]

        aks_client.machines.begin_create_or_update(
            "rg",
            "fleet",
            "burst",
            "m-1",
            body,
            headers={BATCH_PUT_MACHINE_HEADER: header_of(specs)},
            polling=False,
        )

        assert fake_arm.machine_tags("m-1") == {"k": "a", "fleetledger-request": "req-m-1"}
        assert fake_arm.machine_tags("m-2") == {"fleetledger-request": "req-m-2"}
        zones = {
            n: aks_client.machines.get("rg", "fleet", "burst", n).zones for n in ("m-1", "m-2")
        }
        assert zones == {"m-1": ["1"], "m-2": []}

    def test_without_the_header_the_body_is_the_one_machine(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """A plain PUT (no header) makes the URL's machine with the body's zones and tags."""
        body = machine_body(TEMPLATE)
        assert body.properties is not None
        body.properties.tags = {"fleetledger-request": "req-m-1"}
        body.zones = ["2"]

        aks_client.machines.begin_create_or_update(
            "rg", "fleet", "burst", "m-1", body, polling=False
        )

        assert fake_arm.machine_tags("m-1") == {"fleetledger-request": "req-m-1"}
        assert aks_client.machines.get("rg", "fleet", "burst", "m-1").zones == ["2"]


class TestBatchErrors:
    def test_client_errors_come_flat_with_a_target_per_failed_machine(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """400 BatchMachineClientError: no ``error`` wrapper, ``details[].target`` names only the
        machines that failed; the others were started."""
        fake_arm.refuse_machine("m-2", "InvalidParameter", "bad zone")

        status, body = _refused(aks_client, "m-1", "m-2", "m-3")

        assert status == 400
        assert "error" not in body
        assert body["code"] == "BatchMachineClientError"
        assert body["details"] == [
            {"code": "InvalidParameter", "message": "bad zone", "target": "m-2"}
        ]
        assert fake_arm.creations == ("m-1", "m-3")

    def test_internal_errors_carry_their_details_as_json_in_the_message(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """500 BatchMachineInternalServerError: the per-machine list is JSON inside ``message``."""
        fake_arm.refuse_machine("m-1", "InternalOperationError", "boom", internal=True)

        status, body = _refused(aks_client, "m-1", "m-2")

        assert (status, body["code"]) == (500, "BatchMachineInternalServerError")
        details = json.loads(str(body["message"]))["details"]
        assert details == [{"code": "InternalOperationError", "message": "boom", "target": "m-1"}]

    def test_a_machine_that_exists_is_answered_with_an_error(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """Sending a batch again reports its existing machines as failed: a replay's trap."""
        _put(aks_client, "m-1", "m-2")

        status, body = _refused(aks_client, "m-1", "m-2")

        assert status == 400
        assert [d["target"] for d in body["details"]] == ["m-1", "m-2"]
        assert fake_arm.creations == ("m-1", "m-2")


class TestOperation:
    def test_the_operation_covers_only_the_first_machine(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """m-2's failure does not show in the operation; only m-2's own read reveals it."""
        fake_arm.fail_async("m-2", "ZonalAllocationFailed")
        poller = aks_client.machines.begin_create_or_update(
            "rg",
            "fleet",
            "burst",
            "m-1",
            machine_body(TEMPLATE),
            headers={BATCH_PUT_MACHINE_HEADER: header_of(_specs("m-1", "m-2"))},
        )

        poller.result()
        m2 = aks_client.machines.get("rg", "fleet", "burst", "m-2")

        assert poller.status() == "Succeeded"
        assert m2.properties is not None and m2.properties.provisioning_state == "Failed"


class TestReadsByVersion:
    def test_a_stable_version_read_has_no_provisioning_state(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """Only the preview's machine says how its create went; the stable one never does."""
        _put(aks_client, "m-1")
        with ContainerServiceClient(
            StaticTokenCredential(),
            SUBSCRIPTION,
            api_version="2025-08-01",
            **fake_arm.client_options(),
        ) as stable:
            raw = stable.machines.get("rg", "fleet", "burst", "m-1")

        preview = aks_client.machines.get("rg", "fleet", "burst", "m-1")

        assert raw.properties is not None and raw.properties.provisioning_state is None
        assert preview.properties is not None and preview.properties.provisioning_state
        assert aks_client._config.api_version == PREVIEW_API_VERSION


class TestMachineList:
    def test_the_sdk_list_follows_next_link_through_every_page(self) -> None:
        """Pages of ``list_page_size``: the SDK's ``machines.list`` follows each ``nextLink`` and
        sees every machine once, each page asked in the client's version."""
        with (
            FakeArmServer(list_page_size=2) as server,
            ContainerServiceClient(
                StaticTokenCredential(),
                SUBSCRIPTION,
                api_version=PREVIEW_API_VERSION,
                **server.client_options(),
            ) as client,
        ):
            _put(client, "m-1", "m-2", "m-3", "m-4", "m-5")

            names = [m.name for m in client.machines.list("rg", "fleet", "burst")]

            pages = server.machine_lists()
        assert names == ["m-1", "m-2", "m-3", "m-4", "m-5"]
        assert len(pages) == 3
        assert {p.query["api-version"] for p in pages} == {PREVIEW_API_VERSION}

    def test_a_list_moves_machines_on_as_their_own_reads_do(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """Each list is a read of every machine it shows: Creating once, then Succeeded."""
        _put(aks_client, "m-1")

        first = list(aks_client.machines.list("rg", "fleet", "burst"))
        second = list(aks_client.machines.list("rg", "fleet", "burst"))

        assert [m.properties.provisioning_state for m in first if m.properties] == ["Creating"]
        assert [m.properties.provisioning_state for m in second if m.properties] == ["Succeeded"]

    def test_a_hidden_machine_is_left_out_but_still_read_by_its_get(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """``hide_from_lists`` leaves the machine out of the next list only; its GET finds it."""
        _put(aks_client, "m-1", "m-2")
        fake_arm.hide_from_lists("m-2")

        first = [m.name for m in aks_client.machines.list("rg", "fleet", "burst")]
        m2 = aks_client.machines.get("rg", "fleet", "burst", "m-2")
        second = [m.name for m in aks_client.machines.list("rg", "fleet", "burst")]

        assert (first, m2.name, second) == (["m-1"], "m-2", ["m-1", "m-2"])

    def test_a_machine_deleted_under_its_create_reads_deleting(
        self, aks_client: ContainerServiceClient, fake_arm: FakeArmServer
    ) -> None:
        """``delete_while_creating``: where the create would settle, the machine is Deleting."""
        fake_arm.delete_while_creating("m-1")
        _put(aks_client, "m-1")

        states = [
            m.properties.provisioning_state
            for _ in range(3)
            for m in aks_client.machines.list("rg", "fleet", "burst")
            if m.properties
        ]

        assert states == ["Creating", "Deleting", "Deleting"]
