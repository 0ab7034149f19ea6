"""Choosing the ``CloudMachines`` adapter the runtime talks to: the fake, plain VMs, or AKS.

The fake needs nothing. The real adapters read their settings from the environment, so a deployment
configures them once (and no secret ever sits on a command line); credentials come from
``azure.identity.DefaultAzureCredential`` (workload identity, managed identity, ``az login``…). A
missing setting raises :class:`~fleetledger.adapters.machines.errors.CloudNotConfigured` naming
every variable to set, before anything is started.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.cloud import CloudMachines, FakeCloud
from fleetledger.adapters.cloud.errors import CloudSetupError

from .coordinator import DispatchMode
from .errors import CloudNotConfigured

if TYPE_CHECKING:
    from fleetledger.adapters.cloud.azure_session import AzureSession

__all__ = ["CLOUD_KINDS", "CloudChoice", "CloudKind", "build_cloud"]

CloudKind = Literal["fake", "azure-vm", "aks"]
CLOUD_KINDS: tuple[CloudKind, ...] = ("fake", "azure-vm", "aks")

# The subscription may also be given as the Azure tools spell it.
_SUBSCRIPTION = ("FLEETLEDGER_AZURE_SUBSCRIPTION_ID", "AZURE_SUBSCRIPTION_ID")
_COMMON = ("FLEETLEDGER_AZURE_RESOURCE_GROUP",)
_VM = (
    "FLEETLEDGER_AZURE_LOCATION",
    "FLEETLEDGER_AZURE_IMAGE_ID",
    "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY",
)
_AKS = ("FLEETLEDGER_AKS_CLUSTER", "FLEETLEDGER_AKS_AGENT_POOL")


def _nothing_to_close() -> None:
    return None


@dataclass(frozen=True, slots=True)
class CloudChoice:
    """The adapter, how the coordinator dispatches to it, and a line for the logs."""

    cloud: CloudMachines
    dispatch_mode: DispatchMode
    description: str
    close: Callable[[], None] = _nothing_to_close
    """Releases the adapter's credential and clients (call it on shutdown)."""


def build_cloud(
    kind: str,
    *,
    clock: Clock,
    fake_latency: float = 2.0,
    fake_state: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> CloudChoice:
    """The adapter for ``kind`` (one of :data:`CLOUD_KINDS`); with ``fake_state`` the fake
    lives in that file and every process given the same file shares it."""
    env = os.environ if environ is None else environ
    if kind == "fake" and fake_state is not None:
        from fleetledger.adapters.cloud.shared_fake import SharedFakeCloud

        return CloudChoice(
            SharedFakeCloud(fake_state, clock=clock, latency=fake_latency),
            "batch",
            f"fake cloud shared through {fake_state} ({fake_latency:g} s per create)",
        )
    if kind == "fake":
        return CloudChoice(
            FakeCloud(clock=clock, latency=fake_latency),
            "batch",
            f"in-memory fake cloud ({fake_latency:g} s per create)",
        )
    if kind == "azure-vm":
        settings = _settings(kind, env, (*_COMMON, *_VM))
        return _azure_vm(settings, env)
    if kind == "aks":
        settings = _settings(kind, env, (*_COMMON, *_AKS))
        return _aks(settings, env, clock)
    raise ValueError(f"unknown cloud {kind!r}: choose one of {', '.join(CLOUD_KINDS)}")


def _settings(kind: str, env: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    missing = [name for name in names if not env.get(name)]
    if not any(env.get(name) for name in _SUBSCRIPTION):
        missing.insert(0, " or ".join(_SUBSCRIPTION))
    if missing:
        raise CloudNotConfigured(
            f"--cloud {kind} needs these environment variables: {', '.join(missing)}; "
            "set them (credentials come from DefaultAzureCredential, e.g. `az login`), "
            "or use --cloud fake"
        )
    return {name: env[name] for name in names}


def _session(env: Mapping[str, str]) -> AzureSession:
    from fleetledger.adapters.cloud.azure_session import AzureSession, AzureSettings

    try:
        return AzureSession(AzureSettings.from_environment(env))
    except CloudSetupError as e:
        raise CloudNotConfigured(str(e)) from e


def _azure_vm(settings: dict[str, str], env: Mapping[str, str]) -> CloudChoice:
    from fleetledger.adapters.cloud.azure_vm import AzureVmCloud, VmProfile

    session = _session(env)
    group = settings["FLEETLEDGER_AZURE_RESOURCE_GROUP"]
    profile = VmProfile(
        location=settings["FLEETLEDGER_AZURE_LOCATION"],
        image_id=settings["FLEETLEDGER_AZURE_IMAGE_ID"],
        ssh_public_key=settings["FLEETLEDGER_AZURE_SSH_PUBLIC_KEY"],
        subnet_id=env.get("FLEETLEDGER_AZURE_SUBNET_ID") or None,
    )
    cloud = AzureVmCloud(
        session.compute_client(), resource_group=group, profile=profile, owner=_owner(env)
    )
    return CloudChoice(
        cloud,
        "per_machine",
        f"Azure VMs in resource group {group} (create-only PUT per machine)",
        close=session.close,
    )


def _aks(settings: dict[str, str], env: Mapping[str, str], clock: Clock) -> CloudChoice:
    from fleetledger.adapters.cloud import aks

    session = _session(env)
    try:
        client = session.aks_client(api_version=aks.PREVIEW_API_VERSION)
        cluster = settings["FLEETLEDGER_AKS_CLUSTER"]
        pool = settings["FLEETLEDGER_AKS_AGENT_POOL"]
        cloud = aks.AksMachinesCloud(
            client,
            resource_group=settings["FLEETLEDGER_AZURE_RESOURCE_GROUP"],
            cluster_name=cluster,
            agent_pool=pool,
            owner=_owner(env),
            clock=clock,
        )
    except CloudSetupError as e:
        session.close()
        raise CloudNotConfigured(str(e)) from e
    return CloudChoice(
        cloud,
        "batch",
        f"AKS machines in {cluster}/{pool} (BatchPutMachine)",
        close=session.close,
    )


def _owner(env: Mapping[str, str]) -> str:
    """Who this controller is in the ownership tags of the machines it creates."""
    return env.get("FLEETLEDGER_OWNER") or "fleetledger"
