"""A small script for runner tests: 20 requests over two templates, 50 ms apart."""

from __future__ import annotations

from fleetledger.adapters.machines import MachineRequest
from fleetledger.adapters.simulator import Arrival, Script
from tests.adapters.machines.support import D4, D8


def small_script(requests: int = 20) -> Script:
    return Script(
        arrivals=tuple(
            Arrival(
                at_seconds=n * 0.05,
                request=MachineRequest(
                    request_id=f"r-{n}", machine_name=f"m-{n}", template=D4 if n % 2 else D8
                ),
            )
            for n in range(requests)
        ),
        cloud_latency_seconds=1.0,
    )
