"""AzureSession: subscription from the environment, sovereign endpoints and scopes, closing."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.credentials import AccessToken

from fleetledger.adapters.cloud import CloudSetupError
from fleetledger.adapters.cloud.aks import PREVIEW_API_VERSION
from fleetledger.adapters.cloud.azure_session import AzureSession, AzureSettings
from tests.adapters.cloud.fake_arm import FakeArmServer, StaticTokenCredential


class RecordingCredential(StaticTokenCredential):
    """Records the scopes asked for and whether it was closed."""

    def __init__(self) -> None:
        self.scopes: list[str] = []
        self.closed = False

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.extend(scopes)
        return super().get_token(*scopes)

    def close(self) -> None:
        self.closed = True


def _transport(server: FakeArmServer) -> dict[str, Any]:
    options = server.client_options()
    options.pop("base_url")
    return options


class TestSettings:
    def test_the_subscription_may_come_from_azure_subscription_id(self) -> None:
        """The Azure tools' variable is enough when fleetledger's own is not set."""
        settings = AzureSettings.from_environment({"AZURE_SUBSCRIPTION_ID": "sub-a"})

        assert settings.subscription_id == "sub-a"

    def test_fleetledgers_own_variable_wins(self) -> None:
        """FLEETLEDGER_AZURE_SUBSCRIPTION_ID is read first."""
        settings = AzureSettings.from_environment(
            {"AZURE_SUBSCRIPTION_ID": "sub-a", "FLEETLEDGER_AZURE_SUBSCRIPTION_ID": "sub-f"}
        )

        assert settings.subscription_id == "sub-f"

    def test_no_subscription_names_both_variables(self) -> None:
        """The error says which variables would supply it."""
        with pytest.raises(CloudSetupError, match="FLEETLEDGER_AZURE_SUBSCRIPTION_ID or AZURE"):
            AzureSettings.from_environment({})

    def test_a_sovereign_endpoint_brings_its_own_scope(self) -> None:
        """Azure Government's endpoint asks tokens for its own .default scope."""
        settings = AzureSettings.from_environment(
            {
                "AZURE_SUBSCRIPTION_ID": "s",
                "FLEETLEDGER_AZURE_ARM_ENDPOINT": "https://management.usgovcloudapi.net/",
            }
        )

        assert settings.scope == "https://management.usgovcloudapi.net/.default"

    def test_the_scope_may_be_set_explicitly(self) -> None:
        """An explicit credential scope is used as given."""
        settings = AzureSettings.from_environment(
            {"AZURE_SUBSCRIPTION_ID": "s", "FLEETLEDGER_AZURE_CREDENTIAL_SCOPE": "api://x/.default"}
        )

        assert settings.scope == "api://x/.default"

    def test_a_plain_http_endpoint_is_refused(self) -> None:
        """Tokens never go out in the clear."""
        with pytest.raises(CloudSetupError, match="https"):
            AzureSettings(subscription_id="s", arm_endpoint="http://management.example")


class TestSession:
    def test_clients_call_the_configured_endpoint_with_its_scope(
        self, fake_arm: FakeArmServer
    ) -> None:
        """Requests reach the configured ARM endpoint, signed for the configured scope."""
        credential = RecordingCredential()
        settings = AzureSettings(subscription_id="s", arm_endpoint=fake_arm.url)
        with AzureSession(
            settings, credential=lambda: credential, client_options=_transport(fake_arm)
        ) as session:
            pool = session.aks_client(api_version=PREVIEW_API_VERSION).agent_pools.get(
                "rg", "fleet", "burst"
            )

        assert pool.name == "burst"
        assert credential.scopes == [f"{fake_arm.url}/.default"]

    def test_closing_closes_the_credential(self, fake_arm: FakeArmServer) -> None:
        """Shutdown closes the credential (and the clients), once."""
        credential = RecordingCredential()
        settings = AzureSettings(subscription_id="s", arm_endpoint=fake_arm.url)
        session = AzureSession(
            settings, credential=lambda: credential, client_options=_transport(fake_arm)
        )
        session.compute_client()

        session.close()
        session.close()

        assert credential.closed
        with pytest.raises(CloudSetupError, match="closed"):
            session.compute_client()
