"""The ``burst-vms`` scenario: bursts of machine requests over a few templates.

Karpenter under waves of pending pods (seed 01, "Why Batching?"): three bursts of 50–200 requests,
10–20 s apart, arrivals within a burst ~20 ms apart (exponential gaps), over four templates with
Zipf-like popularity. About 3 % of the requests are flagged skip-batching (urgent ones). The cloud
misbehaves the ways PRODUCT.md §4.1 lists, so the outcomes include failures:

- three machines fail with ``ZonalAllocationFailed`` in their zone (capacity, per machine);
- six machines are refused because they would exceed the regional vCPU quota
  (``OperationNotAllowed`` → ``quota_exceeded``, per machine);
- three machines are left out of their batch's result map (the original counted these as
  created): the coordinator reads them back;
- at the start of the last burst the next create call is throttled as a whole.

Injections name machines, not calls, so a run without batching (``--compare naive``) meets the
same faults — except the throttle, which by nature hits one call: one batch, or one machine.
"""

from __future__ import annotations

from random import Random

from fleetledger.adapters.cloud import CapacityUnavailable, FakeCloud, QuotaExceeded
from fleetledger.adapters.machines import MachineRequest
from fleetledger.domain.template import MachineTemplate

from .scenarios import Arrival, Injection, Scenario, Script

__all__ = ["BURST_VMS"]

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
        injections=_injections(rng, arrivals, burst_starts),
        bursts=_BURSTS,
    )


def _injections(
    rng: Random, arrivals: list[Arrival], burst_starts: list[float]
) -> tuple[Injection, ...]:
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

    def throttle(cloud: FakeCloud) -> None:
        cloud.throttle(retry_after=2.0)

    return (
        Injection(
            at_seconds=0.0,
            description=(
                f"{_CAPACITY_FAILURES} machines out of zonal capacity, {_QUOTA} over quota, "
                f"{_OMITTED} left out of their result map"
            ),
            apply=prepare,
        ),
        Injection(
            at_seconds=burst_starts[-1],
            description="next create call throttled (Retry-After 2 s)",
            apply=throttle,
        ),
    )


BURST_VMS = Scenario(
    name="burst-vms",
    summary="bursts of 50-200 VM requests over 4 templates, with quota, capacity, "
    "lost-result and throttling faults",
    build=_build,
)
