"""The ``fleet`` scenario: one controller holding a whole fleet, every capability on one log.

``fleetledger simulate --scenario fleet [--nodes N] [--workloads-per-hour W] [--hours H]`` runs,
on virtual time (:class:`~fleetledger.adapters.simulator.virtual_time.VirtualTime`), the
runtimes ``serve`` runs, wired as the ``dst`` scenario wires them (threadless, on a
:class:`~fleetledger.adapters.runtime.Leadership`), without faults and at scale:

- **nodes**: ``N`` nodes of 8 CPUs and 16 GiB in ``pool0-…``, ``pool1-…`` (a fake cluster),
  accounted by :class:`~fleetledger.adapters.nodes.NodesRuntime`, whose cluster sync runs every
  ``sync_seconds``;
- **subnets**: each pool's nodes in subnets of ``nodes_per_subnet``
  (:class:`~fleetledger.adapters.ipam.IpamRuntime` over an in-memory allocator); each sync pass
  reports the nodes whose pod count changed (2 system IPs, the VM pod, the workloads placed
  there) and the allocator calls run;
- **workloads**: ``W`` an hour arrive (Poisson), each submitted by its client and placed by
  :class:`~fleetledger.adapters.placement.PlacementRuntime` in batches every second, and leave
  after an exponential lifetime (released through their nodes' streams);
- **agents**: one VM pod per ``vm_pod_every`` nodes whose agent asks for resources (a random walk
  of its demand) every ``agent_period_seconds``: the node resource permits;
- **machines**: the fleet's autoscaler asks for new machines
  (:class:`~fleetledger.adapters.machines.MachinesRuntime`, batched, against the fake cloud);
  each joins the cluster, the node accounting and its pool's subnet once the log shows it
  created; placement's overflow asks the same runtime for workers;
- **a controller restart** at ``restart_at`` of the run: the process dies, a new one rebuilds its
  read models from the log (node streams from their snapshots, the read models by replay) —
  ``rebuild_seconds`` — and its dump must equal the old process's at the same position (and, with
  ``check_replay``, a replay of the log); then it takes the fleet over as leader
  (``takeover_seconds``);
- **a testbed**: the ``testbed`` scenario (jobs on slots through the extender) runs on the same
  log after the virtual run, on a manual clock of its own, as ``dst`` runs it.

The figures: virtual and wall seconds and their ratio, events appended (by capability), peak RSS
(``ru_maxrss``), the rebuild, and the live ``dumpstate`` (what ``GET /v1/dumpstate`` builds) in
seconds and bytes, beside the targets for 10,000 nodes and one hour
(:data:`~fleetledger.adapters.simulator.fleet_report.TARGETS`).
"""

from __future__ import annotations

import hashlib
import heapq
import resource
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from random import Random

import sqlalchemy as sa
import structlog

from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.ipam import InMemoryAllocator
from fleetledger.adapters.machines import MachineRequest
from fleetledger.adapters.nodes import NodesError, ResourceRequest, vm_annotations
from fleetledger.adapters.placement import PlacementError, PlacementRuntime
from fleetledger.adapters.runtime import RetryPolicy
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.nodes import Bounds, ComputeUnit, NodeConfig
from fleetledger.domain.placement import Pool, WorkloadRequest
from fleetledger.domain.template import MachineTemplate
from fleetledger.eventstore import EventStore, open_store
from fleetledger.projections.dumpstate import dumpstate_at, with_subnets
from fleetledger.projections.nodes import dump_json

from .controller import controller_runtimes
from .fleet_report import FleetReport, FleetSettings
from .logs import simulation_store
from .placement import placement_runtime
from .testbed import run_testbed_scenario
from .virtual_time import VirtualTime

__all__ = ["FleetReport", "FleetSettings", "run_fleet_scenario"]

log = structlog.get_logger(__name__)

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
_GIB = 1 << 30
_MIB = 1 << 20
GROUPER = "fleet"
_NODE_CPU_MILLI = 8000
_NODE_MEMORY_MIB = 16 * 1024
_NODE_CONFIG = NodeConfig(
    cpu_system_milli=1000,
    memory_system_slots=2,
    cpu_watermark=0.9,
    memory_watermark=0.9,
    compute_unit=ComputeUnit(250, 1),
    memory_slot_bytes=_GIB,
)
_TEMPLATE = MachineTemplate(vm_size="Standard_D8s_v5", orchestrator_version="1.31.2")
_CONFIG = GrouperConfig(
    idle_timeout=timedelta(milliseconds=500), max_timeout=timedelta(seconds=3), max_batch_size=50
)
_RETRY = RetryPolicy(backoff_seconds=0.0)
"""As ``dst``: virtual time runs one task at a time, so a back-off would only stall it."""
_IPS_PER_NODE = 32
_SYSTEM_IPS = 2
_HEARTBEAT_SECONDS = 1.0
_CLOUD_LATENCY_SECONDS = 60.0
_STUCK_AFTER_SECONDS = 300.0
_SCALE_UP_PREFIX = "scale-"
_PROGRESS_REPORTS = 20
"""Progress lines over a run (one every twentieth of the virtual time)."""


def _pool(index: int) -> Pool:
    # A new worker is counted below what a joined node offers, as in ``dst``.
    return Pool(
        name=f"pool{index}",
        template=_TEMPLATE,
        worker_cpu_milli=6000,
        worker_memory_bytes=12 * _GIB,
    )


@dataclass(slots=True)
class _Restart:
    """The restart's figures, filled in when it happens."""

    rebuild_seconds: float = 0.0
    takeover_seconds: float = 0.0
    position: int = 0
    state_equal: bool = False
    replay_equal: bool | None = None
    state_check_seconds: float = 0.0
    """Wall seconds the comparison of the dumps before and after took (not the run's)."""
    replay_check_seconds: float = 0.0
    """Wall seconds the replay check took (not the run's)."""

    @property
    def check_seconds(self) -> float:
        return self.state_check_seconds + self.replay_check_seconds


class _Process:
    """One controller process: its own store connection, its leadership and its runtimes."""

    def __init__(self, world: _World, name: str) -> None:
        self.name = name
        runtimes = controller_runtimes(
            # As the scenario's reader (see .logs): processes crash here, never the machine.
            open_store(world.url, durable=False),
            name=name,
            board=world.board,
            time=world.time,
            cloud=world.cloud,
            cluster=world.cluster,
            allocator=world.allocator,
            grouper=GROUPER,
            grouper_config=_CONFIG,
            node_config=_NODE_CONFIG,
            retry=_RETRY,
            sync_seconds=world.settings.sync_seconds,
        )
        self.store, self.lease, self.leadership = (
            runtimes.store,
            runtimes.lease,
            runtimes.leadership,
        )
        self.machines, self.nodes, self.ipam = runtimes.machines, runtimes.nodes, runtimes.ipam
        self.placement: PlacementRuntime = placement_runtime(
            self.store,
            self.nodes.service,
            world.pools,
            machines=self.machines.service,
            clock=world.time,
            leadership=self.leadership,
            retry=_RETRY,
        )

    def start(self) -> None:
        """Every runtime started as a follower: read models and streams rebuilt from the log."""
        self.machines.start()
        self.nodes.start()
        self.ipam.start()
        self.placement.start()

    def dump(self) -> dict[str, object]:
        """The live dumpstate (``GET /v1/dumpstate``): the node read model and the subnets."""
        return with_subnets(self.store, self.nodes.dump(), held=self.ipam.projection)

    def die(self) -> None:
        self.lease.expire()
        self.store.close()


class _World:
    """The fleet's discrete-event loop on virtual time (see the module docstring)."""

    def __init__(
        self,
        seed: int,
        settings: FleetSettings,
        url: str,
        reader: EventStore,
        *,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.seed = seed
        self._progress = progress
        self._started = time.perf_counter()
        self._next_report = 0.0
        self.settings = settings
        self.url = url
        self.reader = reader
        self.rng = Random(seed)
        self._per_subnet = settings.nodes_per_subnet
        self.time = VirtualTime(EPOCH, max_concurrent=8, stuck_after=_STUCK_AFTER_SECONDS)
        self.board: dict[str, str] = {}
        self.fake = FakeCloud(clock=self.time, latency=_CLOUD_LATENCY_SECONDS)
        self.cloud = self.fake
        self.pools = tuple(_pool(i) for i in range(settings.pools))
        self.allocator = InMemoryAllocator()
        # Room in each subnet for its nodes and every machine the autoscaler may add to its
        # pool (they all join the pool's last subnet).
        added = -(-settings.scale_ups // settings.pools)
        self.subnet_capacity = _IPS_PER_NODE * (settings.nodes_per_subnet + added)
        self.pool_subnets: dict[str, list[str]] = {p.name: [] for p in self.pools}
        self.subnet_nodes: dict[str, list[str]] = {}
        self.subnet_members: dict[str, set[str]] = {}
        self.subnet_of: dict[str, str] = {}
        self.changed: set[str] = set()
        """Nodes whose pod count may differ from the demand their subnet last heard."""
        nodes = []
        for n in range(settings.nodes):
            pool = self.pools[n % settings.pools].name
            name = f"{pool}-{n:06d}"
            self._assign_subnet(pool, name, grow=True)
            nodes.append(Node(name, cpu_millis=_NODE_CPU_MILLI, memory_mib=_NODE_MEMORY_MIB))
        self.cluster = FakeCluster(nodes)
        self.vm_pods: dict[str, str] = {}
        self.demand: dict[str, tuple[int, int]] = {}
        self.queue: list[tuple[datetime, int, str]] = []
        self._order = 0
        self.process: _Process | None = None
        self.processes = 0
        # Workloads: the next arrival (virtual seconds), departures, where each is placed.
        self.horizon = settings.horizon_seconds
        self._rate = settings.workloads_per_hour / 3600.0
        self._next_arrival = self._draw_arrival(0.0)
        self.submitted = 0
        self.departures: list[tuple[float, str]] = []
        self.unsettled: set[str] = set()
        self.placed_on: dict[str, str] = {}
        self.per_node: Counter[str] = Counter()
        self.agent_requests = 0
        self.scale_ups_sent = 0
        self._read_machines_after = 0
        self.phases: dict[str, float] = defaultdict(float)
        self.restart = _Restart()
        self.agent_refusals = 0

    # -- plumbing --------------------------------------------------------------------------------

    def _assign_subnet(self, pool: str, node: str, *, grow: bool) -> None:
        """``node`` takes its pod IPs from its pool's last subnet; with ``grow``, a full one
        (``nodes_per_subnet``) makes the pool a new subnet. A machine added later joins the
        pool's last subnet, which has room for it."""
        subnets = self.pool_subnets[pool]
        if not subnets or (grow and len(self.subnet_nodes[subnets[-1]]) >= self._per_subnet):
            subnet = f"{pool}-pods-{len(subnets)}"
            subnets.append(subnet)
            self.subnet_nodes[subnet] = []
            self.subnet_members[subnet] = set()
            self.allocator.add_subnet(subnet, self.subnet_capacity)
        self.subnet_nodes[subnets[-1]].append(node)
        self.subnet_of[node] = subnets[-1]
        self.changed.add(node)

    def seconds(self) -> float:
        return (self.time.now() - EPOCH).total_seconds()

    def schedule(self, at_seconds: float, kind: str) -> None:
        self._order += 1
        heapq.heappush(self.queue, (EPOCH + timedelta(seconds=at_seconds), self._order, kind))

    @property
    def leader(self) -> _Process:
        assert self.process is not None
        return self.process

    def boot(self) -> _Process:
        self.processes += 1
        process = _Process(self, f"p{self.processes}")
        process.start()
        self.process = process
        return process

    def lead(self, process: _Process) -> None:
        process.leadership.step()
        if process.leadership.term() is None:
            raise RuntimeError(f"{process.name} was not elected though no other process leads")

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> None:
        started = time.perf_counter()
        self.lead(self.boot())
        self._sync()
        for index, node in enumerate(n for names in self.subnet_nodes.values() for n in names):
            if index % self.settings.vm_pod_every == 0:
                self._place_vm_pod(node)
        self._sync()
        # The fleet joining the log at virtual time 0: a one-off, apart from the steady state.
        self.phases["setup"] += time.perf_counter() - started
        end = self.horizon
        self.schedule(self.settings.placement_seconds, "tick")
        self.schedule(self.settings.agent_period_seconds / 2, "agents")
        self.schedule(self.settings.sync_seconds, "sync")
        self.schedule(_HEARTBEAT_SECONDS, "heartbeat")
        self.schedule(self.settings.restart_at * end, "restart")
        for k in range(self.settings.scale_ups):
            self.schedule((k + 0.5) * end / self.settings.scale_ups, "scale")
        self._loop(EPOCH + timedelta(seconds=end))

    def _loop(self, deadline: datetime) -> None:
        while True:
            started = time.perf_counter()
            self.time.settle()
            self.phases["machines"] += time.perf_counter() - started
            candidates: list[tuple[datetime, int]] = []
            wake = self.time.next_wakeup()
            if wake is not None:
                candidates.append((wake, 0))
            due = self.leader.machines.service.next_deadline()
            if due is not None:
                candidates.append((due, 1))
            if self.queue:
                candidates.append((self.queue[0][0], 2))
            if not candidates:
                return
            when, kind = min(candidates)
            if when > deadline:
                self.time.advance_to(deadline)
                return
            self.time.advance_to(when)
            if self._progress is not None and self.seconds() >= self._next_report:
                self._report_progress()
            started = time.perf_counter()
            if kind == 1:
                self.leader.machines.driver.step()
                self.phases["machines"] += time.perf_counter() - started
            elif kind == 2:
                _, _, what = heapq.heappop(self.queue)
                self._do(what)
                self.phases[what] += time.perf_counter() - started

    def _report_progress(self) -> None:
        """One line on how far the run is: a long run (minutes at 10,000 nodes) shows it is
        moving, and at what speed. Read on the side: the simulation's order is untouched."""
        assert self._progress is not None
        virtual, wall = self.seconds(), time.perf_counter() - self._started
        speed = f"{virtual / wall:.1f}x real time" if wall > 0 else "starting"
        self._progress(
            f"fleet: {virtual:,.0f} of {self.horizon:,.0f} virtual s, {wall:,.0f} s wall "
            f"({speed}), {self.reader.head():,} events, {self.submitted:,} workloads"
        )
        self._next_report = virtual + self.horizon / _PROGRESS_REPORTS

    def _do(self, what: str) -> None:
        handlers: dict[str, Callable[[], None]] = {
            "tick": self._tick,
            "agents": self._agents,
            "sync": self._sync_round,
            "heartbeat": self._heartbeat,
            "restart": self._restart,
            "scale": self._scale_up,
        }
        handlers[what]()

    # -- workloads -------------------------------------------------------------------------------

    def _draw_arrival(self, after: float) -> float:
        return after + self.rng.expovariate(self._rate) if self._rate > 0 else float("inf")

    def _tick(self) -> None:
        """One placement round: the clients' submissions since the last, the workloads that
        leave, the batches, then where the new ones went."""
        now = self.seconds()
        placement = self.leader.placement
        lifetime = self.settings.workload_minutes * 60.0
        arrived: list[WorkloadRequest] = []
        while self._next_arrival <= now:
            request = WorkloadRequest(
                id=f"w-{self.submitted:07d}",
                cpu_milli=self.rng.choice((250, 500, 750, 1000)),
                memory_bytes=self.rng.choice((512, 1024, 1536, 2048)) * _MIB,
                priority=self.rng.choice((0, 0, 0, 1)),
            )
            self.submitted += 1
            arrived.append(request)
            self.unsettled.add(request.id)
            leaves = self._next_arrival + self.rng.expovariate(1.0 / lifetime)
            heapq.heappush(self.departures, (leaves, request.id))
            self._next_arrival = self._draw_arrival(self._next_arrival)
        if arrived:
            # The clients of one round post at once, and serve's group commit records their
            # submissions in one transaction: one call with all of them is that commit.
            placement.submit(arrived)
        leaving: list[str] = []
        while self.departures and self.departures[0][0] <= now:
            leaving.append(heapq.heappop(self.departures)[1])
        if leaving:
            self._depart(leaving)
        try:
            placement.step()
        except PlacementError as e:
            log.info("fleet: placement batch failed; the next round retries", error=str(e))
        for workload in list(self.unsettled):
            status = placement.status(workload)
            if status.state == "placed" and status.node is not None:
                self.placed_on[workload] = status.node
                self.per_node[status.node] += 1
                self.changed.add(status.node)
                self.unsettled.discard(workload)
            elif status.state in ("rejected", "released"):
                self.unsettled.discard(workload)
        if now < self.horizon:
            self.schedule(now + self.settings.placement_seconds, "tick")

    def _depart(self, workloads: list[str]) -> None:
        """The round's departures, released together (the clients' DELETEs of one round)."""
        placement = self.leader.placement
        leaving = []
        for workload in workloads:
            if placement.status(workload).state in ("rejected", "released"):
                self.unsettled.discard(workload)
            else:
                leaving.append(workload)
        failed = placement.release_each(leaving)
        if failed:
            raise RuntimeError(f"fleet: releases failed: {failed}")
        for workload in leaving:
            self.unsettled.discard(workload)
            # Counted on its node once a round saw it placed; placed by this round's batch, never.
            node = self.placed_on.pop(workload, None)
            if node is not None:
                self.per_node[node] -= 1
                self.changed.add(node)

    # -- agents ----------------------------------------------------------------------------------

    def _place_vm_pod(self, node: str) -> None:
        unit = _NODE_CONFIG.compute_unit
        cpu = Bounds(unit.cpu_milli, unit.cpu_milli, 8 * unit.cpu_milli)
        memory = Bounds(unit.memory_slots, unit.memory_slots, 4 * unit.memory_slots)
        pod = f"vm-{node}"
        self.cluster.create_pod(PodSpec(pod, node=node, annotations=vm_annotations(cpu, memory)))
        self.vm_pods[pod] = node
        self.demand[pod] = (cpu.use, memory.use)
        self.per_node[node] += 1
        self.changed.add(node)

    def _agents(self) -> None:
        """Every VM pod's agent asks for its resources: its demand walks up and down. The
        agents of one period post together, and ``serve`` group-commits them: asked at once."""
        unit = _NODE_CONFIG.compute_unit
        requests = []
        for pod in self.vm_pods:
            cpu, memory = self.demand[pod]
            cpu = max(
                unit.cpu_milli,
                min(8 * unit.cpu_milli, cpu + unit.cpu_milli * self.rng.randint(-2, 2)),
            )
            memory = max(1, min(4, memory + self.rng.randint(-1, 1)))
            self.demand[pod] = (cpu, memory)
            requests.append(ResourceRequest(pod=pod, cpu_milli=cpu, memory_slots=memory))
        answers = self.leader.nodes.service.request_resources_each(requests)
        for request, answer in zip(requests, answers, strict=True):
            if isinstance(answer, NodesError):
                # A pod whose VM is migrating may only ask for its reservation meanwhile.
                log.debug("fleet: agent request refused", pod=request.pod, error=str(answer))
                self.agent_refusals += 1
        self.agent_requests += len(requests)
        if self.seconds() < self.horizon:
            self.schedule(self.seconds() + self.settings.agent_period_seconds, "agents")

    # -- machines --------------------------------------------------------------------------------

    def _scale_up(self) -> None:
        """The fleet's autoscaler asks for one more machine in a pool (round robin)."""
        pool = self.pools[self.scale_ups_sent % len(self.pools)]
        name = f"{pool.name}-{_SCALE_UP_PREFIX}{self.scale_ups_sent:04d}"
        self.scale_ups_sent += 1
        self.leader.machines.machines.enqueue(
            MachineRequest(
                machine_name=name,
                template=pool.template,
                zones=(str(1 + self.scale_ups_sent % 3),),
                request_id=f"{_SCALE_UP_PREFIX}{name}",
            )
        )

    def _join_created(self) -> None:
        """Machines the log shows created join the cluster (the kubelet registers them)."""
        for record in self.reader.read_all(
            after=self._read_machines_after, types=("vm.MachineCreated",)
        ):
            self._read_machines_after = record.global_position
            name = record.data["machine_name"]
            pool = next((p.name for p in self.pools if name.startswith(f"{p.name}-")), None)
            if pool is None:
                continue
            self.cluster.add_node(
                Node(name, cpu_millis=_NODE_CPU_MILLI, memory_mib=_NODE_MEMORY_MIB)
            )
            self._assign_subnet(pool, name, grow=False)

    # -- the cluster sync and the subnets --------------------------------------------------------

    def _sync_round(self) -> None:
        self._sync()
        if self.seconds() < self.horizon:
            self.schedule(self.seconds() + self.settings.sync_seconds, "sync")

    def _sync(self) -> None:
        """One pass: nodes joined, the node accounting's sync, then the subnets'."""
        started = time.perf_counter()
        self._join_created()
        process = self.leader
        process.nodes.step()
        self.phases["sync.nodes"] += time.perf_counter() - started
        started = time.perf_counter()
        service = process.ipam.service
        for subnet, names in self.subnet_nodes.items():
            members = self.subnet_members[subnet]
            if not members:
                service.create(subnet, self.subnet_capacity)
            if len(members) < len(names):
                service.join(subnet, names[len(members) :])
                members.update(names)
        states = {subnet: service.stream(subnet).state.nodes for subnet in self.subnet_nodes}
        reports = []
        for node in sorted(self.changed):
            demand = _SYSTEM_IPS + self.per_node[node]
            pool_state = states[self.subnet_of[node]].get(node)
            # The subnet's state holds the demand last reported (by this process or the one
            # before the restart): a node back at that count is not reported again.
            if pool_state is not None and pool_state.demand == demand:
                continue
            held = pool_state.held if pool_state is not None else ()
            reports.append((self.subnet_of[node], node, demand, held[:demand]))
        # The nodes' reports of one pass arrive together: group-committed, as serve would.
        for outcome in service.report_demands(reports):
            if isinstance(outcome, Exception):
                raise outcome
        self.changed.clear()
        process.ipam.step()
        self.phases["sync.subnets"] += time.perf_counter() - started

    def _heartbeat(self) -> None:
        self.leader.leadership.step()
        if self.seconds() < self.horizon:
            self.schedule(self.seconds() + _HEARTBEAT_SECONDS, "heartbeat")

    # -- the restart -----------------------------------------------------------------------------

    def _restart(self) -> None:
        """The controller dies; a new process rebuilds from the log, must hold what the old one
        held, then takes the fleet over."""
        # The dumps and their comparison are the simulator's checks, not the controller's
        # work (a controller dies without dumping its state): kept out of wall time.
        old = self.leader
        old.machines.projection.catch_up(old.store)
        begun = time.perf_counter()
        before = _sha(old.dump())
        self.restart.state_check_seconds += time.perf_counter() - begun
        self.restart.position = self.reader.head()
        self.time.abandon(old.name)
        old.die()
        started = time.perf_counter()
        new = self.boot()
        self.restart.rebuild_seconds = time.perf_counter() - started
        begun = time.perf_counter()
        self.restart.state_equal = before == _sha(new.dump())
        self.restart.state_check_seconds += time.perf_counter() - begun
        if self.settings.check_replay:
            begun = time.perf_counter()
            replayed = dumpstate_at(self.reader, self.restart.position)
            self.restart.replay_equal = _sha(replayed) == before
            self.restart.replay_check_seconds += time.perf_counter() - begun
        started = time.perf_counter()
        self.lead(new)
        self.restart.takeover_seconds = time.perf_counter() - started
        self._sync()

    def close(self) -> None:
        if self.process is not None:
            self.time.abandon(self.process.name)
            self.process.die()


def run_fleet_scenario(
    seed: int,
    *,
    url: str | None = None,
    settings: FleetSettings | None = None,
    progress: Callable[[str], None] | None = None,
) -> FleetReport:
    """Run the fleet (see the module docstring) on ``url`` (empty) or a scratch SQLite log;
    ``progress``, if given, hears a line on the run's advance twenty times over the run."""
    settings = settings or FleetSettings()
    with simulation_store(url, fresh=True) as reader:
        log_url = reader.engine.url.render_as_string(hide_password=False)
        world = _World(seed, settings, log_url, reader, progress=progress)
        started = time.perf_counter()
        try:
            world.run()
            wall = time.perf_counter() - started - world.restart.check_seconds
            world.phases["state_check"] = world.restart.state_check_seconds
            world.phases["replay_check"] = world.restart.replay_check_seconds
            process = world.leader
            begun = time.perf_counter()
            dump = dump_json(process.dump()).encode("utf-8")
            dumpstate_seconds = time.perf_counter() - begun
            outcomes: Counter[str] = Counter(
                process.placement.status(f"w-{n:07d}").state for n in range(world.submitted)
            )
            nodes = len(process.nodes.service.hosted())
            # Before the testbed and the counting below, which are not the fleet's.
            peak_rss = _peak_rss_bytes()
        finally:
            world.close()
        begun = time.perf_counter()
        testbed = run_testbed_scenario(seed, store=reader)
        world.phases["testbed"] += time.perf_counter() - begun
        testbed_ok = not (
            testbed.slots_held_by_two_pods
            or testbed.applications_leaked
            or testbed.deadlocked_schedulings
        )
        events = reader.head()
        by_capability = _events_by_capability(reader)
    return FleetReport(
        seed=seed,
        settings=settings,
        nodes=nodes,
        workloads=world.submitted,
        workload_outcomes=dict(outcomes),
        machines_created=len(set(world.fake.creations)),
        agent_requests=world.agent_requests,
        agent_refusals=world.agent_refusals,
        subnets=len(world.subnet_nodes),
        virtual_seconds=settings.horizon_seconds,
        wall_seconds=wall,
        events=events,
        events_by_capability=by_capability,
        peak_rss_bytes=peak_rss,
        rebuild_seconds=world.restart.rebuild_seconds,
        takeover_seconds=world.restart.takeover_seconds,
        restart_position=world.restart.position,
        restart_state_equal=world.restart.state_equal,
        replay_equal=world.restart.replay_equal,
        dumpstate_seconds=dumpstate_seconds,
        dumpstate_bytes=len(dump),
        testbed_ok=testbed_ok,
        phases=dict(world.phases),
    )


def _sha(dump: dict[str, object]) -> str:
    return hashlib.sha256(dump_json(dump).encode("utf-8")).hexdigest()


def _events_by_capability(store: EventStore) -> dict[str, int]:
    """Events in the log by their type's prefix (``nodes``, ``placement``, ``vm``, ``ipam``…),
    counted by the database: reading 700,000 events back took longer than the rebuild."""
    found: Counter[str] = Counter()
    with store.engine.connect() as connection:
        for event_type, count in connection.execute(_COUNT_BY_TYPE):
            found[str(event_type).split(".", 1)[0]] += int(count)
    return dict(found)


_COUNT_BY_TYPE = sa.text("SELECT type, count(*) FROM events GROUP BY type")


def _peak_rss_bytes() -> int:
    """The process's peak resident set: ``ru_maxrss`` is KiB on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024
