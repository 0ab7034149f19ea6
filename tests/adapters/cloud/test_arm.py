"""Reading ARM provisioning states and zones, shared by the VM and AKS adapters."""

from __future__ import annotations

import pytest

from fleetledger.adapters.cloud.arm import provisioning_status, sole_zone


class TestProvisioningStatus:
    @pytest.mark.parametrize(
        ("state", "status"),
        [
            ("Succeeded", "succeeded"),
            ("Failed", "failed"),
            ("Canceled", "failed"),
            ("Creating", "creating"),
            ("Updating", "creating"),
            ("", "creating"),
            (None, "creating"),
        ],
    )
    def test_only_final_states_end_the_wait(self, state: str | None, status: str) -> None:
        assert provisioning_status(state) == status


class TestSoleZone:
    def test_a_machine_pinned_to_one_zone_names_it(self) -> None:
        assert sole_zone(["2"]) == "2"

    @pytest.mark.parametrize("zones", [None, [], ["1", "2"]])
    def test_no_zone_or_several_name_none(self, zones: list[str] | None) -> None:
        assert sole_zone(zones) is None
