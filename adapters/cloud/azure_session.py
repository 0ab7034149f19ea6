"""One Azure credential and the management clients built on it, for the length of a process.

``DefaultAzureCredential`` (workload identity, managed identity, ``az login``…) signs every call.
The subscription may come from ``FLEETLEDGER_AZURE_SUBSCRIPTION_ID`` or, as the Azure tools
spell it, ``AZURE_SUBSCRIPTION_ID``. Sovereign clouds (Azure Government, Azure China) answer on
another Resource Manager endpoint and take tokens for another scope:
``FLEETLEDGER_AZURE_ARM_ENDPOINT`` sets the endpoint, and the scope is ``<endpoint>/.default``
unless ``FLEETLEDGER_AZURE_CREDENTIAL_SCOPE`` says otherwise (the sign-in authority is
azure-identity's own ``AZURE_AUTHORITY_HOST``).

:meth:`AzureSession.close` closes the clients it made and then the credential (whose token
caches and HTTP sessions would otherwise outlive the process's shutdown).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

from .errors import CloudSetupError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.containerservice import ContainerServiceClient

__all__ = ["DEFAULT_ARM_ENDPOINT", "AzureSession", "AzureSettings"]

#: Azure's public cloud.
DEFAULT_ARM_ENDPOINT = "https://management.azure.com"

_SUBSCRIPTION_VARIABLES = ("FLEETLEDGER_AZURE_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID")


_Client = TypeVar("_Client", "ComputeManagementClient", "ContainerServiceClient")


@dataclass(frozen=True, slots=True, kw_only=True)
class AzureSettings:
    """Which subscription, and which Resource Manager endpoint and token scope, to use."""

    subscription_id: str
    arm_endpoint: str = DEFAULT_ARM_ENDPOINT
    credential_scope: str | None = None

    def __post_init__(self) -> None:
        if not self.subscription_id:
            raise CloudSetupError(
                f"no Azure subscription: set {' or '.join(_SUBSCRIPTION_VARIABLES)}"
            )
        if not self.arm_endpoint.startswith("https://"):
            raise CloudSetupError(
                f"the ARM endpoint must be an https:// URL (credentials are never sent in the "
                f"clear), got {self.arm_endpoint!r}"
            )

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> AzureSettings:
        """Settings from the environment variables named in the module docstring."""
        subscription = next((environ[v] for v in _SUBSCRIPTION_VARIABLES if environ.get(v)), "")
        return cls(
            subscription_id=subscription,
            arm_endpoint=environ.get("FLEETLEDGER_AZURE_ARM_ENDPOINT") or DEFAULT_ARM_ENDPOINT,
            credential_scope=environ.get("FLEETLEDGER_AZURE_CREDENTIAL_SCOPE") or None,
        )

    @property
    def scope(self) -> str:
        """The token scope: the configured one, else the endpoint's ``/.default``."""
        return self.credential_scope or f"{self.arm_endpoint.rstrip('/')}/.default"


def _default_credential() -> TokenCredential:
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()


class AzureSession:
    """The credential and the clients made from it; close it (or use ``with``) on shutdown.

    ``client_options`` go to every client (transport settings, retry policy…).
    """

    def __init__(
        self,
        settings: AzureSettings,
        *,
        credential: Callable[[], TokenCredential] = _default_credential,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self._credential = credential()
        self._options = dict(client_options or {})
        self._clients: list[ComputeManagementClient | ContainerServiceClient] = []
        self._closed = False

    @property
    def credential(self) -> TokenCredential:
        return self._credential

    def compute_client(self) -> ComputeManagementClient:
        """A compute client on the configured endpoint and scope."""
        from azure.mgmt.compute import ComputeManagementClient

        client = ComputeManagementClient(
            self._credential,
            self.settings.subscription_id,
            base_url=self.settings.arm_endpoint,
            credential_scopes=[self.settings.scope],
            **self._options,
        )
        return self._keep(client)

    def aks_client(self, *, api_version: str) -> ContainerServiceClient:
        """A container service client speaking ``api_version`` on the configured endpoint."""
        try:
            from azure.mgmt.containerservice import ContainerServiceClient
        except ImportError as e:
            raise CloudSetupError(
                "the AKS adapter needs the optional AKS SDK: pip install 'fleetledger[aks]'"
            ) from e
        client = ContainerServiceClient(
            self._credential,
            self.settings.subscription_id,
            base_url=self.settings.arm_endpoint,
            credential_scopes=[self.settings.scope],
            api_version=api_version,
            **self._options,
        )
        return self._keep(client)

    def close(self) -> None:
        """Close every client made, then the credential; closing twice does nothing."""
        if self._closed:
            return
        self._closed = True
        for client in self._clients:
            client.close()
        self._clients.clear()
        # DefaultAzureCredential holds token caches and HTTP sessions; the protocol has no close.
        close = getattr(self._credential, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _keep(self, client: _Client) -> _Client:
        if self._closed:
            client.close()
            raise CloudSetupError("this AzureSession is closed; open a new one")
        self._clients.append(client)
        return client
