"""Metrics folded from the log, at scrape time: they count what every process appended.

:class:`LogMetrics` is a prometheus-client collector over an event store. Each scrape first reads
what the log gained since the last one (at most :data:`MAX_EVENTS_PER_SCRAPE` events of the
types below, so a scrape after a long silence cannot hold the endpoint for minutes: the rest
follows at the next scrape, and ``fleetledger_subscription_lag_events{subscriber="metrics"}``
says how far behind it still is), folds it into counters and histograms, and folds the node,
subnet and testbed events into read models of its own, whose current state gives the gauges.
A request appended by ``fleetledger simulate --url`` against a running ``serve``'s database is
therefore counted by that ``serve``, and every value can be recomputed from the log.

The folds read the stored JSON of the counted events directly (a few fields each) rather than
decoding whole domain events; the read models decode with the projections' own folds.

Families (every timestamp is the events' own ``at``: virtual time in a simulation):

==================================================  =========================================
``fleetledger_vm_requests_total``                   machine requests accepted
``fleetledger_vm_batches_sealed_total{reason}``     batches sealed, by seal reason
``fleetledger_vm_batch_size``                       requests per sealed batch (histogram)
``fleetledger_vm_batch_duration_seconds``           from seal to the batch's completion
``fleetledger_cloud_calls_total{operation}``        create calls the batches recorded before
                                                    making them (``create_batch``: one per
                                                    batch; ``create``: one per machine)
``fleetledger_vm_machines_total{outcome}``          machines created or failed
``fleetledger_vm_machine_errors_total{code}``       failed machines by the cloud's error code
``fleetledger_cloud_throttle_wait_seconds{reason}`` waits for the write budget or a 429's
                                                    ``Retry-After`` (histogram)
``fleetledger_placement_workloads_submitted_total`` workloads accepted
``fleetledger_placement_decisions_total{outcome}``  each workload's first decision: placed,
                                                    waiting for a new worker, rejected
``fleetledger_placement_batch_latency_seconds``     from a workload's submission to the batch
                                                    that decided it (histogram)
``fleetledger_placement_workers_requested_total``   new workers the overflow asked for, by pool
``fleetledger_node_{cpu,memory}_*``                 per present node (capped): reservable
                                                    (``total − system``), reserved, buffer,
                                                    pressure, in cores and bytes
``fleetledger_nodes``                               nodes present
``fleetledger_subnet_*``                            per subnet (capped): capacity, used IPs,
                                                    utilization, batch size, exhausted, nodes
``fleetledger_subnet_batch_size_changes_total``     batch size changes, by direction
``fleetledger_testbed_slots{testbed,state}``        slots per state (creating, free, reserved,
                                                    occupied, error)
``fleetledger_leader_term``                         the latest term elected in the log
``fleetledger_leader_elections_total``              elections recorded
``fleetledger_log_head_position``                   the log's last position
``fleetledger_subscription_lag_events``             events not folded yet, per subscriber
==================================================  =========================================

Series past a cap fold into one labelled ``_other`` (:mod:`.labels`): summed, except batch size
(the largest) and the exhausted flag (any).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from fleetledger.domain import ipam
from fleetledger.domain.machines import ERROR_CODES, SEAL_REASONS
from fleetledger.domain.nodes import NodeState
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore, EventStoreError, RecordedEvent
from fleetledger.projections.nodes import NODE_EVENT_TYPE_NAMES, NodesProjection
from fleetledger.projections.recent import decode
from fleetledger.projections.subnets import SUBNET_EVENT_TYPE_NAMES, SubnetsProjection

from .labels import (
    MAX_NODE_SERIES,
    MAX_POOL_SERIES,
    MAX_SUBNET_SERIES,
    MAX_TESTBED_SERIES,
    OTHER,
    capped,
    known,
)

__all__ = [
    "COUNTED_EVENT_TYPES",
    "MAX_EVENTS_PER_SCRAPE",
    "LogMetrics",
    "Subscriber",
]

log = structlog.get_logger(__name__)

MAX_EVENTS_PER_SCRAPE = 20_000
"""The most events one scrape folds; a scrape reading 20 pages stays well within a second."""
_PAGE = 1000
_MAX_PENDING = 100_000
"""Batches and workloads waiting for their outcome, remembered for their latency: the oldest
are forgotten past this (their latency is then not observed)."""
_MAX_WORKERS_SEEN = 100_000

_THROTTLE_REASONS = ("write_budget", "retry_after")
_CALL_OPERATIONS = ("create_batch", "create")
_DIRECTIONS = ("rising", "falling", "steady")
_PLACEMENT_OUTCOMES = ("placed", "waiting", "rejected")
_MACHINE_OUTCOMES = ("created", "failed")
SLOT_STATES = ("creating", "free", "reserved", "occupied", "error")

_MACHINE_TYPES = (
    "vm.MachineRequested",
    "vm.BatchSealed",
    "vm.BatchDispatched",
    "vm.BatchThrottled",
    "vm.MachineCreated",
    "vm.MachineFailed",
    "vm.BatchCompleted",
)
_PLACEMENT_TYPES = (
    "placement.WorkloadSubmitted",
    "placement.WorkloadPlaced",
    "placement.WorkloadWaiting",
    "placement.WorkloadRejected",
    "placement.WorkloadReleased",
)
_TESTBED_TYPES = (
    "testbed.TestbedDefined",
    "testbed.ClusterObserved",
    "testbed.SlotReserved",
    "testbed.ReservationCleared",
    "testbed.TestbedClaimed",
    "testbed.TestbedReleased",
    "testbed.ProblemsReported",
    "testbed.TestbedDeleted",
)
_LEADERSHIP_TYPES = ("leadership.LeaderElected",)
COUNTED_EVENT_TYPES: tuple[str, ...] = tuple(
    sorted(
        {
            *_MACHINE_TYPES,
            *_PLACEMENT_TYPES,
            *_TESTBED_TYPES,
            *_LEADERSHIP_TYPES,
            *NODE_EVENT_TYPE_NAMES,
            *SUBNET_EVENT_TYPE_NAMES,
        }
    )
)
"""Every event type the metrics read."""
# Node reservations that place workloads (a placement batch reserves a node's workloads as its
# non-VM pods, the pod named by the workload id).
_RESERVATIONS = ("nodes.OtherPodsReserved", "nodes.OtherPodReserved")
_CORES_PER_MILLI = 1 / 1000


@dataclass(frozen=True, slots=True)
class Subscriber:
    """A read model whose lag is shown: where it has folded to, and the types it reads."""

    name: str
    position: Callable[[], int]
    types: Sequence[str]


class LogMetrics:
    """The collector (see the module docstring). Thread-safe: scrapes of two listeners fold
    one at a time."""

    def __init__(
        self,
        store: EventStore,
        *,
        subscribers: Sequence[Subscriber] = (),
        max_events_per_scrape: int = MAX_EVENTS_PER_SCRAPE,
        max_nodes: int = MAX_NODE_SERIES,
        max_subnets: int = MAX_SUBNET_SERIES,
        max_testbeds: int = MAX_TESTBED_SERIES,
    ) -> None:
        for option, value in (
            ("max_events_per_scrape", max_events_per_scrape),
            ("max_nodes", max_nodes),
            ("max_subnets", max_subnets),
            ("max_testbeds", max_testbeds),
        ):
            if value < 1:
                raise ValueError(f"{option} must be at least 1, got {value}")
        self.store = store
        self._subscribers = tuple(subscribers)
        self._budget = max_events_per_scrape
        self._max_nodes = max_nodes
        self._max_subnets = max_subnets
        self._max_testbeds = max_testbeds
        self._lock = threading.Lock()
        self._position = 0
        self._head = 0
        self._term = 0
        self._nodes = NodesProjection()
        self._subnets = SubnetsProjection()
        self._testbeds: dict[str, testbed.TestbedState] = {}
        self._sealed_at: OrderedDict[str, datetime] = OrderedDict()
        self._submitted_at: OrderedDict[str, datetime] = OrderedDict()
        self._workers: OrderedDict[str, None] = OrderedDict()
        self._pools: set[str] = set()
        self._counters = _Counters()
        self._folds: dict[str, Callable[[RecordedEvent], None]] = {
            "vm.MachineRequested": self._requested,
            "vm.BatchSealed": self._sealed,
            "vm.BatchDispatched": self._dispatched,
            "vm.BatchThrottled": self._throttled,
            "vm.MachineCreated": self._created,
            "vm.MachineFailed": self._failed,
            "vm.BatchCompleted": self._completed,
            "placement.WorkloadSubmitted": self._submitted,
            "placement.WorkloadPlaced": self._placed,
            "placement.WorkloadWaiting": self._waiting,
            "placement.WorkloadRejected": self._rejected,
            "placement.WorkloadReleased": self._released,
            "leadership.LeaderElected": self._elected,
            "ipam.BatchSizeChanged": self._batch_size_changed,
        }

    @property
    def position(self) -> int:
        """The log position folded up to."""
        with self._lock:
            return self._position

    # -- folding ---------------------------------------------------------------------------------

    def catch_up(self) -> int:
        """Fold what the log gained, up to this scrape's budget; return how many events.
        ``EventStoreError`` when the log cannot be read (what was folded stays)."""
        with self._lock:
            return self._catch_up()

    def _catch_up(self) -> int:
        # The head gauge shows the log's head even when the budget ends the fold short of it.
        self._head = max(self._head, self.store.head())
        folded = 0
        while folded < self._budget:
            limit = min(_PAGE, self._budget - folded)
            page = self.store.read_types(
                after=self._position, types=COUNTED_EVENT_TYPES, limit=limit
            )
            for record in page.events:
                self._fold(record)
                self._position = record.global_position
            # Past the other types' events too, once a short page read the log to its end.
            self._position = max(self._position, page.through)
            self._head = max(self._head, self._position)
            folded += len(page.events)
            if len(page.events) < limit:
                break
        return folded

    def _fold(self, record: RecordedEvent) -> None:
        self._counters.folded.inc()
        try:
            self._fold_one(record)
        except (KeyError, TypeError, ValueError) as e:
            # One event this version cannot read (a newer writer's shape) must not stop the
            # metrics at its position for ever: it is skipped, logged and counted.
            self._counters.unreadable.inc()
            log.warning(
                "metrics skipped an event they cannot read",
                position=record.global_position,
                type=record.type,
                error=str(e),
            )

    def _fold_one(self, record: RecordedEvent) -> None:
        kind = record.type
        if kind in _RESERVATIONS:
            self._reserved(record)
        if kind.startswith("nodes."):
            self._nodes.apply(record)
        elif kind.startswith("ipam."):
            self._subnets.apply(record)
        elif kind.startswith("testbed."):
            self._testbed(record)
        fold = self._folds.get(kind)
        if fold is not None:
            fold(record)

    def _requested(self, record: RecordedEvent) -> None:
        self._counters.requests.inc()

    def _sealed(self, record: RecordedEvent) -> None:
        data = record.data
        self._counters.sealed.labels(known(data.get("reason"), SEAL_REASONS)).inc()
        self._counters.batch_size.observe(len(data.get("request_ids") or ()))
        sealed = _at(data)
        if sealed is not None:
            _remember(self._sealed_at, str(data.get("batch_id")), sealed)

    def _dispatched(self, record: RecordedEvent) -> None:
        for call in record.data.get("calls") or ():
            operation = call.split(" ", 1)[0] if isinstance(call, str) else None
            self._counters.calls.labels(known(operation, _CALL_OPERATIONS)).inc()

    def _throttled(self, record: RecordedEvent) -> None:
        data = record.data
        wait = data.get("wait_seconds")
        if isinstance(wait, int | float) and wait >= 0:
            reason = known(data.get("reason"), _THROTTLE_REASONS)
            self._counters.throttle_wait.labels(reason).observe(wait)

    def _created(self, record: RecordedEvent) -> None:
        self._counters.machines.labels("created").inc()

    def _failed(self, record: RecordedEvent) -> None:
        self._counters.machines.labels("failed").inc()
        self._counters.errors.labels(known(record.data.get("code"), ERROR_CODES)).inc()

    def _completed(self, record: RecordedEvent) -> None:
        data = record.data
        sealed = self._sealed_at.pop(str(data.get("batch_id")), None)
        done = _at(data)
        if sealed is not None and done is not None:
            self._counters.batch_duration.observe(max(0.0, (done - sealed).total_seconds()))

    def _submitted(self, record: RecordedEvent) -> None:
        self._counters.submitted.inc()
        request = record.data.get("request")
        submitted = _at(record.data)
        if isinstance(request, Mapping) and submitted is not None:
            _remember(self._submitted_at, str(request.get("id")), submitted)

    def _decided(self, workload_id: object, outcome: str, data: Mapping[str, Any]) -> None:
        submitted = self._submitted_at.pop(str(workload_id), None)
        if submitted is None:
            return  # decided before (this is a later step of it), or never seen submitted
        self._counters.decisions.labels(outcome).inc()
        decided = _at(data)
        if decided is not None:
            latency = (decided - submitted).total_seconds()
            self._counters.placement_latency.observe(max(0.0, latency))

    def _reserved(self, record: RecordedEvent) -> None:
        data = record.data
        pods = data.get("pods") if record.type == "nodes.OtherPodsReserved" else [data]
        for pod in pods or ():
            if isinstance(pod, Mapping):
                self._decided(pod.get("pod"), "placed", data)

    def _placed(self, record: RecordedEvent) -> None:
        self._decided(record.data.get("workload_id"), "placed", record.data)

    def _waiting(self, record: RecordedEvent) -> None:
        data = record.data
        self._decided(data.get("workload_id"), "waiting", data)
        worker = str(data.get("worker"))
        if worker not in self._workers:
            _remember(self._workers, worker, None, limit=_MAX_WORKERS_SEEN)
            self._counters.workers.labels(self._pool_label(data.get("pool"))).inc()

    def _pool_label(self, pool: object) -> str:
        name = str(pool)
        if name in self._pools:
            return name
        if len(self._pools) < MAX_POOL_SERIES:
            self._pools.add(name)
            return name
        return OTHER

    def _rejected(self, record: RecordedEvent) -> None:
        self._decided(record.data.get("workload_id"), "rejected", record.data)

    def _released(self, record: RecordedEvent) -> None:
        self._submitted_at.pop(str(record.data.get("workload_id")), None)

    def _elected(self, record: RecordedEvent) -> None:
        self._counters.elections.inc()
        term = record.data.get("term")
        if isinstance(term, int):
            self._term = max(self._term, term)

    def _batch_size_changed(self, record: RecordedEvent) -> None:
        direction = known(record.data.get("direction"), _DIRECTIONS)
        self._counters.subnet_changes.labels(direction).inc()

    def _testbed(self, record: RecordedEvent) -> None:
        state = self._testbeds.get(record.stream_id, testbed.initial_state())
        event = decode(record)
        self._testbeds[record.stream_id] = testbed.evolve(state, event)  # type: ignore[arg-type]

    # -- collecting ------------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """Catch up (within the budget), then every family. An unreadable log is logged and
        counted; the values folded so far are still served."""
        with self._lock:
            try:
                self._catch_up()
                lags = self._lags()
            except EventStoreError as e:
                log.warning("metrics could not read the log; serving what was folded", error=str(e))
                self._counters.read_errors.inc()
                lags = {}
            yield from self._counters.collect()
            yield from self._log_gauges(lags)
            yield from self._node_gauges()
            yield from self._subnet_gauges()
            yield from self._testbed_gauges()

    def _lags(self) -> dict[str, int]:
        lags = {"metrics": max(0, self._head - self._position)}
        for subscriber in self._subscribers:
            # Events of its types after its position, counted up to a page: its position moves
            # only with its own types, so the head alone would overstate its lag.
            behind = self.store.read_all(
                after=subscriber.position(), limit=_PAGE, types=list(subscriber.types)
            )
            lags[subscriber.name] = len(behind)
        return lags

    def _log_gauges(self, lags: Mapping[str, int]) -> Iterator[Metric]:
        yield _gauge("fleetledger_log_head_position", "The log's last global position.", self._head)
        yield _gauge("fleetledger_leader_term", "The latest leader term in the log.", self._term)
        lag = GaugeMetricFamily(
            "fleetledger_subscription_lag_events",
            "Events of a subscriber's types in the log that it has not folded yet (counted up "
            "to 1000 for read models).",
            labels=["subscriber"],
        )
        for name, value in sorted(lags.items()):
            lag.add_metric([name], value)
        yield lag

    def _node_gauges(self) -> Iterator[Metric]:
        present = {n: s for n, s in self._nodes.states().items() if s.present}
        yield _gauge("fleetledger_nodes", "Nodes present in node accounting.", len(present))
        sums = capped(
            {name: _node_figures(state) for name, state in present.items()},
            limit=self._max_nodes,
            merge=_sum_figures,
        )
        for field, help_text in _NODE_FIELDS:
            for resource, unit in (("cpu", "cores"), ("memory", "bytes")):
                family = GaugeMetricFamily(
                    f"fleetledger_node_{resource}_{field}_{unit}",
                    f"{help_text} ({resource}, {unit}).",
                    labels=["node"],
                )
                for name, figures in sums.items():
                    family.add_metric([name], figures[f"{resource}_{field}"])
                yield family

    def _subnet_gauges(self) -> Iterator[Metric]:
        figures = capped(
            {sid: _SubnetFigures.of(state) for sid, state in self._subnets.subnets().items()},
            limit=self._max_subnets,
            merge=_SubnetFigures.sum,
        )
        for name, help_text, read in _SUBNET_FIELDS:
            family = GaugeMetricFamily(name, help_text, labels=["subnet"])
            for subnet_id, figure in figures.items():
                family.add_metric([subnet_id], read(figure))
            yield family

    def _testbed_gauges(self) -> Iterator[Metric]:
        counts: dict[str, dict[str, int]] = {}
        for state in self._testbeds.values():
            if state.defined is None or state.deleted:
                continue
            per_state = dict.fromkeys(SLOT_STATES, 0)
            for slot in testbed.slots(state):
                per_state[slot.status] = per_state.get(slot.status, 0) + 1
            counts[state.defined.name] = per_state
        family = GaugeMetricFamily(
            "fleetledger_testbed_slots",
            "Slots of each testbed by state (creating, free, reserved, occupied, error).",
            labels=["testbed", "state"],
        )
        for name, per_state in capped(counts, limit=self._max_testbeds, merge=_sum_states).items():
            for slot_state, value in sorted(per_state.items()):
                family.add_metric([name, slot_state], value)
        yield family


# -- counters ------------------------------------------------------------------------------------


class _Counters:
    """The counters and histograms, unregistered: :meth:`LogMetrics.collect` yields them.
    Closed-set labels start at zero for every value, so a rate exists before the first event."""

    def __init__(self) -> None:
        self.requests = Counter(
            "fleetledger_vm_requests", "Machine requests accepted.", registry=None
        )
        self.sealed = Counter(
            "fleetledger_vm_batches_sealed",
            "Batches sealed, by seal reason (full, idle, max, skip, shutdown).",
            ["reason"],
            registry=None,
        )
        self.batch_size = Histogram(
            "fleetledger_vm_batch_size",
            "Requests per sealed batch.",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=None,
        )
        self.batch_duration = Histogram(
            "fleetledger_vm_batch_duration_seconds",
            "From a batch's seal to its completion (every machine's outcome known).",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
            registry=None,
        )
        self.calls = Counter(
            "fleetledger_cloud_calls",
            "Create calls to the cloud (create_batch: one per batch; create: one per machine).",
            ["operation"],
            registry=None,
        )
        self.machines = Counter(
            "fleetledger_vm_machines", "Machines by outcome.", ["outcome"], registry=None
        )
        self.errors = Counter(
            "fleetledger_vm_machine_errors",
            "Machines the cloud failed, by error code.",
            ["code"],
            registry=None,
        )
        self.throttle_wait = Histogram(
            "fleetledger_cloud_throttle_wait_seconds",
            "Waits before a dispatch for the write budget (write_budget) or a 429 (retry_after).",
            ["reason"],
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=None,
        )
        self.submitted = Counter(
            "fleetledger_placement_workloads_submitted", "Workloads accepted.", registry=None
        )
        self.decisions = Counter(
            "fleetledger_placement_decisions",
            "Each workload's first placement decision: placed, waiting (for a new worker) or "
            "rejected.",
            ["outcome"],
            registry=None,
        )
        self.placement_latency = Histogram(
            "fleetledger_placement_batch_latency_seconds",
            "From a workload's submission to the placement batch that decided it.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=None,
        )
        self.workers = Counter(
            "fleetledger_placement_workers_requested",
            "New workers placement asked for, by pool.",
            ["pool"],
            registry=None,
        )
        self.subnet_changes = Counter(
            "fleetledger_subnet_batch_size_changes",
            "Pod-IP batch size changes, by direction (rising, falling, steady).",
            ["direction"],
            registry=None,
        )
        self.elections = Counter(
            "fleetledger_leader_elections", "Leader elections recorded.", registry=None
        )
        self.folded = Counter(
            "fleetledger_metrics_events_folded", "Log events the metrics folded.", registry=None
        )
        self.unreadable = Counter(
            "fleetledger_metrics_events_unreadable",
            "Log events the metrics could not read and skipped (see the warning logged).",
            registry=None,
        )
        self.read_errors = Counter(
            "fleetledger_metrics_log_read_errors",
            "Scrapes that could not read the log (their values are the last folded).",
            registry=None,
        )
        for counter, values in (
            (self.sealed, SEAL_REASONS),
            (self.calls, _CALL_OPERATIONS),
            (self.machines, _MACHINE_OUTCOMES),
            (self.errors, ERROR_CODES),
            (self.decisions, _PLACEMENT_OUTCOMES),
            (self.subnet_changes, _DIRECTIONS),
        ):
            for value in values:
                counter.labels(value)
        for reason in _THROTTLE_REASONS:
            self.throttle_wait.labels(reason)

    def collect(self) -> Iterator[Metric]:
        for metric in (
            self.requests,
            self.sealed,
            self.batch_size,
            self.batch_duration,
            self.calls,
            self.machines,
            self.errors,
            self.throttle_wait,
            self.submitted,
            self.decisions,
            self.placement_latency,
            self.workers,
            self.subnet_changes,
            self.elections,
            self.folded,
            self.unreadable,
            self.read_errors,
        ):
            yield from metric.collect()


# -- gauges --------------------------------------------------------------------------------------

_NODE_FIELDS = (
    ("reservable", "What grants may hand out in all: total less the system reserve"),
    ("reserved", "Reserved by pods, buffers included"),
    ("buffer", "Held as buffer for pods that may grow"),
    ("pressure", "Capacity pressure: what pods asked for beyond what could be granted"),
)


def _node_figures(state: NodeState) -> dict[str, float]:
    """Each ``<resource>_<field>`` of :data:`_NODE_FIELDS` in base units: cores and bytes."""
    slot_bytes = state.config.memory_slot_bytes if state.config is not None else 0
    figures: dict[str, float] = {}
    for resource, amounts, scale in (
        ("cpu", state.cpu, _CORES_PER_MILLI),
        ("memory", state.memory, float(slot_bytes)),
    ):
        figures[f"{resource}_reservable"] = amounts.reservable * scale
        figures[f"{resource}_reserved"] = amounts.reserved * scale
        figures[f"{resource}_buffer"] = amounts.buffer * scale
        figures[f"{resource}_pressure"] = amounts.capacity_pressure * scale
    return figures


def _sum_figures(items: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for figures in items:
        for key, value in figures.items():
            total[key] = total.get(key, 0.0) + value
    return total


@dataclass(frozen=True, slots=True)
class _SubnetFigures:
    capacity: int
    used: int
    batch_size: int
    exhausted: bool
    nodes: int

    @classmethod
    def of(cls, state: ipam.SubnetState) -> _SubnetFigures:
        return cls(
            capacity=state.capacity,
            used=ipam.allocated(state),
            batch_size=state.batch_size,
            exhausted=state.exhausted,
            nodes=len(state.nodes),
        )

    @staticmethod
    def sum(items: Iterable[_SubnetFigures]) -> _SubnetFigures:
        listed = list(items)
        return _SubnetFigures(
            capacity=sum(f.capacity for f in listed),
            used=sum(f.used for f in listed),
            batch_size=max(f.batch_size for f in listed),
            exhausted=any(f.exhausted for f in listed),
            nodes=sum(f.nodes for f in listed),
        )

    @property
    def utilization(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0


_SUBNET_FIELDS: tuple[tuple[str, str, Callable[[_SubnetFigures], float]], ...] = (
    ("fleetledger_subnet_capacity_ips", "Pod IPs the subnet holds.", lambda f: f.capacity),
    ("fleetledger_subnet_used_ips", "Pod IPs allocated to nodes.", lambda f: f.used),
    (
        "fleetledger_subnet_utilization_ratio",
        "Allocated pod IPs over capacity (0 to 1).",
        lambda f: f.utilization,
    ),
    (
        "fleetledger_subnet_batch_size_ips",
        "Pod IPs a node's pool grows by at a time (the largest, for _other).",
        lambda f: f.batch_size,
    ),
    (
        "fleetledger_subnet_exhausted",
        "1 while the subnet is short of IPs (its batch size at the floor), else 0.",
        lambda f: float(f.exhausted),
    ),
    ("fleetledger_subnet_nodes", "Nodes drawing pod IPs from the subnet.", lambda f: f.nodes),
)


def _sum_states(items: Iterable[dict[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(SLOT_STATES, 0)
    for per_state in items:
        for name, value in per_state.items():
            total[name] = total.get(name, 0) + value
    return total


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _at(data: Mapping[str, Any]) -> datetime | None:
    at = data.get("at")
    if not isinstance(at, str):
        return None
    try:
        return datetime.fromisoformat(at)
    except ValueError:
        return None


def _remember(
    book: OrderedDict[str, Any], key: str, value: Any, *, limit: int = _MAX_PENDING
) -> None:
    book[key] = value
    while len(book) > limit:
        book.popitem(last=False)
