"""``fleetledger serve``: refuses a real cloud it has no settings for, before serving anything."""

from __future__ import annotations

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main

AZURE_VARIABLES = (
    "FLEETLEDGER_AZURE_SUBSCRIPTION_ID",
    "FLEETLEDGER_AZURE_RESOURCE_GROUP",
    "FLEETLEDGER_AZURE_LOCATION",
    "FLEETLEDGER_AZURE_IMAGE_ID",
    "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY",
)


class TestServe:
    def test_an_unconfigured_azure_cloud_is_a_usage_error_naming_the_settings(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The message lists the environment variables to set, and nothing is started."""
        for name in AZURE_VARIABLES:
            monkeypatch.delenv(name, raising=False)

        code = main(["serve", "--cloud", "azure-vm"])

        error = capsys.readouterr().err
        assert code == EXIT_USAGE
        assert all(name in error for name in AZURE_VARIABLES)
        assert "--cloud fake" in error

    def test_an_invalid_grouper_timing_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Configuration is validated before anything opens, with the domain's advice."""
        code = main(["serve", "--idle-timeout", "10", "--max-timeout", "1"])

        assert code == EXIT_USAGE
        assert "idle_timeout" in capsys.readouterr().err
