"""The port's value types, the BatchPutMachine header, and the package's public surface."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.cloud import (
    BatchCreate,
    BatchCreateResult,
    MachineObservation,
    MachineSpec,
    MachineStatus,
    UnknownCloudError,
    batch_put_machine_header,
    encode_batch_put_machine_header,
)
from fleetledger.domain.machines import BatchMachine
from fleetledger.domain.machines import batch as machine_batch

from .support import TEMPLATE, batch


class TestBatchPutMachineHeader:
    def test_lists_every_machine_in_request_order(self) -> None:
        """Machines appear in the order given, each with name, zones and tags."""
        header = batch_put_machine_header(
            [
                MachineSpec("m-b", zones=("2",), tags=(("team", "a"),)),
                MachineSpec("m-a", zones=("1", "3"), tags=(("team", "b"),)),
            ]
        )

        assert header == {
            "vmSkus": {"value": []},
            "batchMachines": [
                {"machineName": "m-b", "zones": ["2"], "tags": {"team": "a"}},
                {"machineName": "m-a", "zones": ["1", "3"], "tags": {"team": "b"}},
            ],
        }

    def test_absent_zones_and_tags_are_empty_not_omitted(self) -> None:
        """A machine without zones or tags still carries "zones": [] and "tags": {}."""
        header = batch_put_machine_header([MachineSpec("m-1")])

        assert header["batchMachines"] == [{"machineName": "m-1", "zones": [], "tags": {}}]

    def test_encodes_compactly_as_ascii(self) -> None:
        """The header value has no spaces and escapes non-ASCII, so it is a valid HTTP field."""
        encoded = encode_batch_put_machine_header([MachineSpec("m-1", tags=(("owner", "zoë"),))])

        assert encoded == (
            '{"vmSkus":{"value":[]},"batchMachines":'
            '[{"machineName":"m-1","zones":[],"tags":{"owner":"zo\\u00eb"}}]}'
        )
        assert json.loads(encoded)["batchMachines"][0]["tags"] == {"owner": "zoë"}

    def test_a_machine_made_for_a_request_is_tagged_with_it(self) -> None:
        """The request id joins the machine's own tags as ``fleetledger-request``."""
        header = batch_put_machine_header(
            [MachineSpec("m-1", tags=(("team", "a"),), request_id="r-1")]
        )

        assert header["batchMachines"] == [
            {"machineName": "m-1", "zones": [], "tags": {"team": "a", "fleetledger-request": "r-1"}}
        ]

    def test_is_the_domain_header_for_the_same_machines(self) -> None:
        """One implementation: the port's header is the domain's, which the log records."""
        specs = [
            MachineSpec("m-1", zones=("2",), tags=(("team", "a"),), request_id="r-1"),
            MachineSpec("m-2", request_id="r-2"),
        ]
        machines = [
            BatchMachine("r-1", "m-1", ("2",), (("team", "a"),)),
            BatchMachine("r-2", "m-2"),
        ]

        assert batch_put_machine_header(specs) == machine_batch.batch_put_machine_header(machines)
        assert json.loads(encode_batch_put_machine_header(specs)) == json.loads(
            machine_batch.encode_batch_put_machine_header(machines)
        )


class TestBatchCreate:
    def test_refuses_an_empty_batch(self) -> None:
        """A batch must name at least one machine."""
        with pytest.raises(ValueError, match="no machines"):
            BatchCreate("b", TEMPLATE, ())

    def test_refuses_a_machine_named_twice(self) -> None:
        """Two specs with one name would be one machine reported twice."""
        with pytest.raises(ValueError, match="names a machine twice"):
            batch("m-1", "m-1")

    def test_refuses_a_repeated_tag_key(self) -> None:
        """Tags become a JSON object, so a repeated key would silently lose a value."""
        with pytest.raises(ValueError, match="repeats a tag key"):
            MachineSpec("m-1", tags=(("team", "a"), ("team", "b")))


class TestMachineSpec:
    @pytest.mark.parametrize(("zones", "zone"), [((), None), (("2",), "2"), (("1", "2"), None)])
    def test_zone_is_the_single_requested_zone(
        self, zones: tuple[str, ...], zone: str | None
    ) -> None:
        """A zonal failure can only be pinned on a zone when exactly one was requested."""
        assert MachineSpec("m-1", zones=zones).zone == zone


class TestMachineObservation:
    @pytest.mark.parametrize("status", ["succeeded", "creating", "not_found"])
    def test_only_a_failed_machine_can_have_been_deleted(self, status: MachineStatus) -> None:
        """A machine that exists or never did left no failed leftover to delete."""
        with pytest.raises(ValueError, match="only a failed machine"):
            MachineObservation("m-1", status, deleted=True)


class TestBatchCreateResult:
    def test_unknown_lists_machines_in_neither_map(self) -> None:
        """Machines neither created nor failed are unknown, in request order."""
        result = BatchCreateResult(
            created={"m-2": "id-2"}, failed={"m-4": UnknownCloudError("boom")}
        )

        assert result.unknown(batch("m-1", "m-2", "m-3", "m-4")) == ("m-1", "m-3")

    def test_refuses_a_machine_both_created_and_failed(self) -> None:
        """An adapter bug that reports both outcomes is caught where the result is made."""
        with pytest.raises(ValueError, match="both created and failed"):
            BatchCreateResult(created={"m-1": "id"}, failed={"m-1": UnknownCloudError("x")})
