"""Choosing the ``CloudMachines`` adapter the runtime talks to: the fake, plain VMs, or AKS.

Each choice also says how fast the cloud lets this controller write (``write_limits``): Azure
Resource Manager's documented per-subscription budget for AKS, the same refilled at Compute's
sustained create rate for plain VMs, and no limit for the fakes, which have no ARM in front of them
(see :mod:`fleetledger.adapters.cloud.throttling`); and how many batches may run at once. A
deployment can set them in the environment: ``FLEETLEDGER_WRITE_RATE`` (writes per second, or
``none`` for no local budget), ``FLEETLEDGER_WRITE_BURST`` (writes at once) and
``FLEETLEDGER_MAX_CONCURRENT_BATCHES``. :meth:`CloudChoice.coordinator_options` turns a choice,
and any figures given on a command line (which win), into the coordinator's options.

The fake needs nothing. The real adapters read their settings from the environment, so a deployment
configures them once (and no secret ever sits on a command line); credentials come from
``azure.identity.DefaultAzureCredential`` (workload identity, managed identity, ``az login``…). A
missing setting raises :class:`~fleetledger.adapters.machines.errors.CloudNotConfigured` naming
every variable to set, before anything is started.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from fleetledger.adapters.clock import Clock
from fleetledger.adapters.cloud import CloudMachines, FakeCloud
from fleetledger.adapters.cloud.errors import CloudSetupError
from fleetledger.adapters.cloud.throttling import (
    ARM_SUBSCRIPTION_WRITES,
    COMPUTE_PUT_VM_WRITES,
    BucketLimits,
)

from .coordinator import DEFAULT_MAX_CONCURRENT_BATCHES, CoordinatorOptions, DispatchMode
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
    """The adapter, how the coordinator dispatches to it, its write budget, a line for the logs."""

    cloud: CloudMachines
    dispatch_mode: DispatchMode
    description: str
    close: Callable[[], None] = _nothing_to_close
    """Releases the adapter's credential and clients (call it on shutdown)."""
    write_limits: BucketLimits | None = None
    """The cloud's write budget (documented, or as configured); ``None``: none (the fakes)."""
    max_concurrent_batches: int = DEFAULT_MAX_CONCURRENT_BATCHES
    """The ceiling of batches executed at once (as configured)."""

    def coordinator_options(
        self,
        *,
        write_rate: float | None = None,
        write_burst: int | None = None,
        max_concurrent_batches: int | None = None,
    ) -> CoordinatorOptions:
        """The coordinator's options for this cloud: its dispatch mode and write budget, with
        the figures given here (an operator's) in place of the cloud's own."""
        limits = self.write_limits
        rate = (
            write_rate
            if write_rate is not None
            else (limits.refill_per_second if limits is not None else None)
        )
        burst = (
            write_burst
            if write_burst is not None
            else (limits.bucket_size if limits is not None else ARM_SUBSCRIPTION_WRITES.bucket_size)
        )
        return CoordinatorOptions(
            dispatch_mode=self.dispatch_mode,
            write_rate=rate,
            write_burst=burst,
            max_concurrent_batches=(
                max_concurrent_batches
                if max_concurrent_batches is not None
                else self.max_concurrent_batches
            ),
        )


_WRITE_RATE = "FLEETLEDGER_WRITE_RATE"
_WRITE_BURST = "FLEETLEDGER_WRITE_BURST"
_MAX_CONCURRENT_BATCHES = "FLEETLEDGER_MAX_CONCURRENT_BATCHES"


@dataclass(frozen=True, slots=True)
class _Configured:
    """What the environment sets of the write budget and the ceiling (``None``: not set)."""

    no_budget: bool
    write_rate: float | None
    write_burst: int | None
    max_concurrent_batches: int | None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> _Configured:
        rate = env.get(_WRITE_RATE, "").strip()
        burst = env.get(_WRITE_BURST, "").strip()
        ceiling = env.get(_MAX_CONCURRENT_BATCHES, "").strip()
        no_budget = rate.lower() == "none"
        return cls(
            no_budget=no_budget,
            write_rate=None if no_budget or not rate else _positive(_WRITE_RATE, rate, float),
            write_burst=int(_positive(_WRITE_BURST, burst, int)) if burst else None,
            max_concurrent_batches=(
                int(_positive(_MAX_CONCURRENT_BATCHES, ceiling, int)) if ceiling else None
            ),
        )

    def apply(self, choice: CloudChoice) -> CloudChoice:
        limits = choice.write_limits
        if self.no_budget:
            limits = None
        elif self.write_rate is not None or self.write_burst is not None:
            rate = self.write_rate or (limits.refill_per_second if limits is not None else None)
            burst = self.write_burst or (
                limits.bucket_size if limits is not None else ARM_SUBSCRIPTION_WRITES.bucket_size
            )
            limits = None if rate is None else BucketLimits(burst, rate)
        return replace(
            choice,
            write_limits=limits,
            max_concurrent_batches=self.max_concurrent_batches or choice.max_concurrent_batches,
        )


def _positive(name: str, text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not (math.isfinite(value) and value > 0):
        what = "a whole number" if kind is int else "a number"
        extra = " (or none: no local budget)" if name == _WRITE_RATE else ""
        raise CloudNotConfigured(f"{name} must be {what} > 0{extra}, not {text!r}")
    return value


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
    # Read first: a bad setting is reported before any credential or client is made.
    configured = _Configured.read(env)
    return configured.apply(_choose(kind, clock, fake_latency, fake_state, env))


def _choose(
    kind: str, clock: Clock, fake_latency: float, fake_state: str | None, env: Mapping[str, str]
) -> CloudChoice:
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
        write_limits=COMPUTE_PUT_VM_WRITES,
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
        write_limits=ARM_SUBSCRIPTION_WRITES,
    )


def _owner(env: Mapping[str, str]) -> str:
    """Who this controller is in the ownership tags of the machines it creates."""
    return env.get("FLEETLEDGER_OWNER") or "fleetledger"
