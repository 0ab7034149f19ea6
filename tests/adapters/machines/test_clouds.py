"""Choosing the cloud adapter: the fake needs nothing, real ones say what they miss."""

from __future__ import annotations

import pytest

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.cloud.throttling import ARM_SUBSCRIPTION_WRITES
from fleetledger.adapters.machines import (
    DEFAULT_MAX_CONCURRENT_BATCHES,
    CloudChoice,
    CloudNotConfigured,
    build_cloud,
)

VM_ENVIRON = {
    "FLEETLEDGER_AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000",
    "FLEETLEDGER_AZURE_RESOURCE_GROUP": "rg",
    "FLEETLEDGER_AZURE_LOCATION": "westus3",
    "FLEETLEDGER_AZURE_IMAGE_ID": "/subscriptions/s/images/i",
    "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY": "ssh-ed25519 AAAA test",
}


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
        choice = build_cloud("azure-vm", clock=SystemClock(), environ=VM_ENVIRON)

        assert choice.dispatch_mode == "per_machine"
        # ARM's write bucket, refilled at Compute's sustained create rate (500 a minute).
        options = choice.coordinator_options()
        assert options.write_burst == 200
        assert options.write_rate == pytest.approx(500 / 60)

    def test_an_unknown_kind_lists_the_known_ones(self) -> None:
        """A typo is reported with the choices."""
        with pytest.raises(ValueError, match="fake, azure-vm, aks"):
            build_cloud("gcp", clock=SystemClock(), environ={})


class TestWriteBudgets:
    def test_the_fake_has_no_write_budget(self) -> None:
        """No ARM in front of the fake: nothing to wait for, unless the operator says so."""
        choice = build_cloud("fake", clock=SystemClock(), environ={})

        options = choice.coordinator_options()

        assert options.write_rate is None
        assert options.max_concurrent_batches == DEFAULT_MAX_CONCURRENT_BATCHES

    def test_aks_gets_arms_documented_write_budget(self) -> None:
        choice = CloudChoice(FakeCloud(), "batch", "aks", write_limits=ARM_SUBSCRIPTION_WRITES)

        options = choice.coordinator_options()

        assert (options.dispatch_mode, options.write_rate, options.write_burst) == (
            "batch",
            10.0,
            200,
        )

    def test_an_operators_figures_win(self) -> None:
        choice = CloudChoice(FakeCloud(), "batch", "aks", write_limits=ARM_SUBSCRIPTION_WRITES)

        options = choice.coordinator_options(
            write_rate=2.5, write_burst=40, max_concurrent_batches=16
        )

        assert (options.write_rate, options.write_burst, options.max_concurrent_batches) == (
            2.5,
            40,
            16,
        )

    def test_the_environment_configures_the_budget_and_the_ceiling(self) -> None:
        """Set once for a deployment: the fake given ARM's pace and a lower ceiling."""
        environ = {
            "FLEETLEDGER_WRITE_RATE": "10",
            "FLEETLEDGER_MAX_CONCURRENT_BATCHES": "64",
        }

        options = build_cloud("fake", clock=SystemClock(), environ=environ).coordinator_options()

        assert (options.write_rate, options.write_burst, options.max_concurrent_batches) == (
            10.0,
            200,
            64,
        )

    def test_the_environment_can_turn_a_real_clouds_budget_off(self) -> None:
        """``none``: no local budget, for a subscription with limits raised by Azure."""
        environ = {**VM_ENVIRON, "FLEETLEDGER_WRITE_RATE": "none"}

        choice = build_cloud("azure-vm", clock=SystemClock(), environ=environ)

        assert choice.coordinator_options().write_rate is None

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("FLEETLEDGER_WRITE_RATE", "fast"),
            ("FLEETLEDGER_WRITE_RATE", "0"),
            ("FLEETLEDGER_WRITE_BURST", "1.5"),
            ("FLEETLEDGER_MAX_CONCURRENT_BATCHES", "-3"),
        ],
    )
    def test_a_bad_setting_is_named(self, name: str, value: str) -> None:
        with pytest.raises(CloudNotConfigured, match=name):
            build_cloud("fake", clock=SystemClock(), environ={name: value})
