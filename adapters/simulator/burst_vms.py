"""The ``burst-vms`` scenario: bursts of machine requests over a few templates.

Karpenter under waves of pending pods (seed 01, "Why Batching?"): three bursts of 50–200 requests,
10–20 s apart, arrivals within a burst ~20 ms apart (exponential gaps), over four templates with
Zipf-like popularity. About 3 % of the requests are flagged skip-batching (urgent ones). The cloud
misbehaves the ways docs/ARCHITECTURE.md, "VM creation batching", lists, so the outcomes include
failures:

- three machines fail with ``ZonalAllocationFailed`` in their zone (capacity, per machine);
- six machines are refused because they would exceed the regional vCPU quota
  (``OperationNotAllowed`` → ``quota_exceeded``, per machine);
- three machines are left out of their batch's result map (the original counted these as
  created): the coordinator reads them back;
- at the start of the last burst the next create call is throttled as a whole.

Injections name machines, not calls, so a run without batching (``--compare naive``) meets the
same faults — except the throttle, which by nature hits one call: one batch, or one machine.

Cloud profiles (:func:`burst_vms`): the default, ``fake``, is the above, against a fake cloud
answering every create in 3 s. ``aks`` puts AKS timings and Azure's write budget in front of the
fake cloud and sends one burst of ``burst_size`` requests (1,000 by default) within about two
seconds, the way Karpenter asks for nodes when a deployment scales out:

- each create call (one AKS batch PUT and its long-running operation) takes 60 to 120 s, drawn
  per call from the seed;
- Azure Resource Manager's per-subscription write bucket (200 writes, refilled at 10 a second,
  :data:`~fleetledger.adapters.cloud.throttling.ARM_SUBSCRIPTION_WRITES`) pays for the calls,
  one write per 50 machines; a call it cannot pay for is refused with a 429 and a
  ``Retry-After``, as ARM refuses it;
- the coordinator runs with its defaults: a ceiling of batches in flight far above the burst's
  batches, and a write budget of ARM's size, so that it waits for the budget instead of being
  refused by it;
- the capacity, quota and lost-result faults are the same; there is no scripted throttle (the
  budget is the throttle).

Batched, the burst is some fifty calls, a quarter of the bucket: every machine should have its
outcome about one batch time (at most 120 s) plus the grouper's longest seal delay (5 s) after the
burst begins, with no throttling. Without batching (``without_batching``), the same burst is a
thousand calls: the coordinator spaces them at ARM's 10 writes a second, and the run shows what
that costs.
"""

from __future__ import annotations

from functools import partial
from random import Random
from typing import Literal, get_args

from fleetledger.adapters.cloud import CapacityUnavailable, FakeCloud, QuotaExceeded
from fleetledger.adapters.cloud.throttling import ARM_SUBSCRIPTION_WRITES
from fleetledger.adapters.machines import DEFAULT_MAX_CONCURRENT_BATCHES, MachineRequest
from fleetledger.domain.template import MachineTemplate

from .scenarios import Arrival, Injection, Scenario, Script

__all__ = [
    "AKS_BATCH_SECONDS",
    "AKS_BURST_SIZE",
    "BURST_VMS",
    "CLOUD_PROFILES",
    "CloudProfile",
    "burst_vms",
]

CloudProfile = Literal["fake", "aks"]
CLOUD_PROFILES: tuple[CloudProfile, ...] = get_args(CloudProfile)

AKS_BATCH_SECONDS = (60.0, 120.0)
"""How long one AKS batch create takes in the ``aks`` profile, from its PUT to its machines'
outcome (the operation's duration is drawn uniformly from this range, per call)."""
AKS_BURST_SIZE = 1000
"""Requests in the ``aks`` profile's burst, unless told otherwise."""

_SUBNET = (
    "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/n"
)
_TEMPLATES = (
    MachineTemplate(
        vm_size="Standard_D4s_v5",
        orchestrator_version="1.31.2",
        max_pods=110,
        vnet_subnet_id=_SUBNET,
    ),
    MachineTemplate(
        vm_size="Standard_D8s_v5",
        orchestrator_version="1.31.2",
        max_pods=110,
        vnet_subnet_id=_SUBNET,
    ),
    MachineTemplate(
        vm_size="Standard_D4s_v5",
        priority="spot",
        orchestrator_version="1.31.2",
        max_pods=110,
        vnet_subnet_id=_SUBNET,
    ),
    MachineTemplate(
        vm_size="Standard_NC24ads_A100_v4",
        gpu_profile="MIG1g",
        orchestrator_version="1.31.2",
        max_pods=30,
        os_disk_size_gb=256,
        vnet_subnet_id=_SUBNET,
    ),
)
_WEIGHTS = (8, 4, 2, 1)
_BURSTS = 3
_BURST_SIZE = (50, 200)
_BURST_GAP_SECONDS = (10.0, 20.0)
_MEAN_ARRIVAL_GAP_SECONDS = 0.02
_SKIP_SHARE = 0.03
_TEAMS = ("search", "ads", "ml", "batch")
_CAPACITY_FAILURES = 3
_QUOTA = 6
_OMITTED = 3


_AKS_MEAN_ARRIVAL_GAP_SECONDS = 0.002


def _build(rng: Random) -> Script:
    arrivals: list[Arrival] = []
    at = 0.0
    burst_starts: list[float] = []
    for burst in range(1, _BURSTS + 1):
        if burst > 1:
            at += rng.uniform(*_BURST_GAP_SECONDS)
        burst_starts.append(at)
        for index in range(rng.randint(*_BURST_SIZE)):
            if index:
                at += rng.expovariate(1.0 / _MEAN_ARRIVAL_GAP_SECONDS)
            number = len(arrivals) + 1
            request = MachineRequest(
                request_id=f"req-{number:05d}",
                machine_name=f"aks-burst{burst}-{index:04d}",
                template=rng.choices(_TEMPLATES, _WEIGHTS)[0],
                zones=(str(rng.randint(1, 3)),),
                tags={"fleetledger-burst": str(burst), "team": rng.choice(_TEAMS)},
                skip_batching=rng.random() < _SKIP_SHARE,
            )
            arrivals.append(Arrival(at_seconds=at, request=request, burst=burst))
    return Script(
        arrivals=tuple(arrivals),
        injections=(*_faults(rng, arrivals), _throttle(burst_starts[-1])),
        bursts=_BURSTS,
    )


def _build_aks(rng: Random, *, burst_size: int) -> Script:
    arrivals: list[Arrival] = []
    at = 0.0
    for index in range(burst_size):
        if index:
            at += rng.expovariate(1.0 / _AKS_MEAN_ARRIVAL_GAP_SECONDS)
        request = MachineRequest(
            request_id=f"req-{index + 1:05d}",
            machine_name=f"aks-burst1-{index:04d}",
            template=rng.choices(_TEMPLATES, _WEIGHTS)[0],
            zones=(str(rng.randint(1, 3)),),
            tags={"fleetledger-burst": "1", "team": rng.choice(_TEAMS)},
            skip_batching=rng.random() < _SKIP_SHARE,
        )
        arrivals.append(Arrival(at_seconds=at, request=request, burst=1))
    low, high = AKS_BATCH_SECONDS
    latency_seed = rng.getrandbits(32)

    def model_aks(cloud: FakeCloud) -> None:
        cloud.vary_latency(low, high, seed=latency_seed)
        cloud.limit_writes(ARM_SUBSCRIPTION_WRITES)

    limits = ARM_SUBSCRIPTION_WRITES
    profile = Injection(
        at_seconds=0.0,
        description=(
            f"AKS timings: each batch create takes {low:g}-{high:g} s; ARM's write budget "
            f"({limits.bucket_size} writes, {limits.refill_per_second:g}/s, 50 machines a write) "
            "refuses what it cannot pay for with a 429"
        ),
        apply=model_aks,
    )
    return Script(
        arrivals=tuple(arrivals),
        injections=(profile, *_faults(rng, arrivals)),
        cloud_latency_seconds=(low + high) / 2,
        max_concurrent_batches=DEFAULT_MAX_CONCURRENT_BATCHES,
        bursts=1,
    )


def _faults(rng: Random, arrivals: list[Arrival]) -> tuple[Injection, ...]:
    # Faults are pinned on machine names (not on "the n-th call"), so a run without batching
    # meets the very same ones.
    picked = [a.request for a in rng.sample(arrivals, _CAPACITY_FAILURES + _QUOTA + _OMITTED)]
    out_of_capacity = picked[:_CAPACITY_FAILURES]
    over_quota = [r.machine_name for r in picked[_CAPACITY_FAILURES : _CAPACITY_FAILURES + _QUOTA]]
    omitted = [r.machine_name for r in picked[_CAPACITY_FAILURES + _QUOTA :]]

    def prepare(cloud: FakeCloud) -> None:
        for request in out_of_capacity:
            zone = request.zones[0]
            cloud.fail_machine(
                request.machine_name,
                CapacityUnavailable(
                    f"allocation failed in zone {zone}: no Standard capacity left",
                    zone=zone,
                    provider_code="ZonalAllocationFailed",
                ),
            )
        for name in over_quota:
            cloud.fail_machine(
                name,
                QuotaExceeded(
                    "Operation could not be completed as it results in exceeding approved "
                    "standardDSv5Family Cores quota",
                    provider_code="OperationNotAllowed",
                ),
            )
        cloud.omit_from_result(*omitted)

    return (
        Injection(
            at_seconds=0.0,
            description=(
                f"{_CAPACITY_FAILURES} machines out of zonal capacity, {_QUOTA} over quota, "
                f"{_OMITTED} left out of their result map"
            ),
            apply=prepare,
        ),
    )


def _throttle(at_seconds: float) -> Injection:
    def throttle(cloud: FakeCloud) -> None:
        cloud.throttle(retry_after=2.0)

    return Injection(
        at_seconds=at_seconds,
        description="next create call throttled (Retry-After 2 s)",
        apply=throttle,
    )


BURST_VMS = Scenario(
    name="burst-vms",
    summary="bursts of 50-200 VM requests over 4 templates, with quota, capacity, "
    "lost-result and throttling faults",
    build=_build,
)


def burst_vms(cloud_profile: str = "fake", *, burst_size: int | None = None) -> Scenario:
    """The ``burst-vms`` scenario against ``cloud_profile`` (one of :data:`CLOUD_PROFILES`; see
    the module docstring); ``burst_size`` sets the ``aks`` profile's burst (default
    :data:`AKS_BURST_SIZE`)."""
    if cloud_profile == "fake":
        if burst_size is not None:
            raise ValueError(
                "burst_size applies to the aks cloud profile; the fake profile's bursts are "
                "drawn from the seed (50-200 requests each)"
            )
        return BURST_VMS
    if cloud_profile == "aks":
        size = AKS_BURST_SIZE if burst_size is None else burst_size
        if type(size) is not int or size < 1:
            raise ValueError(f"burst_size must be a whole number of requests >= 1, got {size!r}")
        return Scenario(
            name="burst-vms",
            summary=f"one burst of {size} VM requests over 4 templates against AKS timings "
            "and ARM's write budget, with quota, capacity and lost-result faults",
            build=partial(_build_aks, burst_size=size),
        )
    raise ValueError(
        f"unknown cloud profile {cloud_profile!r}; choose one of: {', '.join(CLOUD_PROFILES)}"
    )
