"""One log holding every capability's events, for the metrics tests to scrape.

``burst-workloads`` (which needs an empty log), then ``burst-vms`` and ``testbed`` on the same
log, then a fleet of extra nodes each reserving a pod: more nodes than the metrics give series
of their own, and ids (requests, batches, workloads, pods) in the thousands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.nodes import DEFAULT_NODE_CONFIG, NodeService
from fleetledger.adapters.simulator import run_scenario
from fleetledger.adapters.simulator.placement import run_placement_scenario
from fleetledger.adapters.simulator.testbed import run_testbed_scenario
from fleetledger.domain.nodes import (
    ContainerResources,
    JoinNode,
    NodeCommand,
    OtherPodSpec,
    ReservePod,
)
from fleetledger.eventstore import EventStore

EXTRA_NODES = 250
"""Nodes joined beside the scenarios' (67): more than the per-node cap of 100."""
_GIB = 1 << 30


def build_world(url: str) -> None:
    """Run the scenarios onto ``url`` (an empty, migrated database) and join the extra nodes."""
    run_placement_scenario(1, url=url)
    run_scenario("burst-vms", seed=1, url=url)
    run_testbed_scenario(1, url=url)


def join_fleet(store: EventStore, count: int, *, prefix: str = "extra") -> None:
    """``count`` nodes of 8 CPUs and 32 GiB, each reserving one pod of 1 CPU and 1 GiB."""
    service = NodeService(store, clock=ManualClock(datetime(2025, 1, 2, tzinfo=UTC)))
    for i in range(count):
        name = f"{prefix}-{i:04}"
        pod = OtherPodSpec(
            name=f"pod-{name}",
            containers=(ContainerResources(cpu_request_milli=1000, memory_request_bytes=_GIB),),
        )
        service.execute(name, _joined_with(name, pod), cause="test:join")


def _joined_with(name: str, pod: OtherPodSpec) -> Callable[[datetime], list[NodeCommand]]:
    def commands(at: datetime) -> list[NodeCommand]:
        return [
            JoinNode(name, 8000, 32 * _GIB, 0, DEFAULT_NODE_CONFIG, at=at),
            ReservePod(pod, at=at),
        ]

    return commands


def samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def families(text: str) -> dict[str, list[Sample]]:
    """The exposition's samples by family name (counters without ``_total``)."""
    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float:
    """The one sample ``name`` with exactly ``labels``; ``KeyError`` if there is none."""
    for sample in samples(text):
        if sample.name == name and sample.labels == labels:
            return float(sample.value)
    raise KeyError(f"{name}{labels}")


def total(text: str, name: str, **labels: str) -> float:
    """The sum of every sample ``name`` whose labels include ``labels``."""
    return sum(
        float(s.value)
        for s in samples(text)
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def ids_in_log(store: EventStore) -> set[str]:
    """Every request, batch, workload, pod and scheduling id the log holds."""
    found: set[str] = set()
    after = 0
    while page := store.read_all(after=after, limit=1000):
        for record in page:
            found.update(_ids_of(record.type, record.data))
        after = page[-1].global_position
    return found - {""}


def _ids_of(kind: str, data: Mapping[str, Any]) -> Iterable[str]:
    for key in ("request_id", "batch_id", "workload_id", "pod", "pod_name", "scheduling", "job"):
        if isinstance(data.get(key), str):
            yield str(data[key])
    for key in ("request_ids", "created_request_ids", "failed_request_ids"):
        for item in data.get(key) or ():
            yield str(item)
    request = data.get("request")
    if kind == "placement.WorkloadSubmitted" and isinstance(request, dict):
        yield str(request["id"])
    for pod in data.get("pods") or ():
        if isinstance(pod, dict) and "pod" in pod:
            yield str(pod["pod"])
