"""Choosing the cloud adapter: the fake needs nothing, real ones say what they miss."""

from __future__ import annotations

import pytest

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.machines import CloudNotConfigured, build_cloud


class TestBuildCloud:
    def test_the_fake_batches_with_the_header(self) -> None:
        """``fake`` is the in-memory cloud, dispatched one call per batch."""
        choice = build_cloud("fake", clock=SystemClock(), environ={})

        assert isinstance(choice.cloud, FakeCloud)
        assert choice.dispatch_mode == "batch"

    @pytest.mark.parametrize("kind", ["azure-vm", "aks"])
    def test_a_real_cloud_without_settings_names_what_to_set(self, kind: str) -> None:
        """The error lists every missing variable, so one attempt is enough to fix it."""
        with pytest.raises(CloudNotConfigured, match="FLEETLEDGER_AZURE_SUBSCRIPTION_ID"):
            build_cloud(kind, clock=SystemClock(), environ={})

    def test_azure_vms_are_dispatched_per_machine(self) -> None:
        """Plain VMs have no batch API: the coordinator records one call per machine."""
        environ = {
            "FLEETLEDGER_AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
            "FLEETLEDGER_AZURE_RESOURCE_GROUP": "rg",
            "FLEETLEDGER_AZURE_LOCATION": "westus3",
            "FLEETLEDGER_AZURE_IMAGE_ID": "/subscriptions/s/images/i",
            "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY": "ssh-ed25519 AAAA test",
        }

        choice = build_cloud("azure-vm", clock=SystemClock(), environ=environ)

        assert choice.dispatch_mode == "per_machine"

    def test_an_unknown_kind_lists_the_known_ones(self) -> None:
        """A typo is reported with the choices."""
        with pytest.raises(ValueError, match="fake, azure-vm, aks"):
            build_cloud("gcp", clock=SystemClock(), environ={})
