"""The ``fleet`` scenario's settings and report: the figures beside the scale targets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["TARGETS", "FleetReport", "FleetSettings", "Target"]

_GIB = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSettings:
    """The fleet and its traffic. The defaults are the scale targets' fleet: 10,000 nodes in
    four pools (in subnets of 250 nodes), 100,000 workloads an hour, one virtual hour."""

    nodes: int = 10_000
    workloads_per_hour: int = 100_000
    hours: float = 1.0
    pools: int = 4
    nodes_per_subnet: int = 250
    """A pool's nodes share subnets of this many (a /19 of 32 IPs a node, with headroom)."""
    workload_minutes: float = 15.0
    """A workload's mean lifetime (exponential): with the defaults ~25,000 run at once."""
    vm_pod_every: int = 10
    """One VM pod (with an autoscaler agent) per this many nodes."""
    agent_period_seconds: float = 30.0
    sync_seconds: float = 5.0
    """The cluster sync's period (``serve``'s default); the subnets' demand goes with it."""
    placement_seconds: float = 1.0
    scale_ups_per_hour: int | None = None
    """Machines the fleet's autoscaler asks for an hour (default: one per 100 nodes, at least
    2); each joins the cluster, the node accounting and its pool's subnet once created."""
    restart_at: float = 0.5
    """The controller restarts at this fraction of the run."""
    check_replay: bool = True
    """Also replay the log to the restart's position and compare (costs a full replay)."""

    def __post_init__(self) -> None:
        if not 4 <= self.nodes <= 200_000:
            raise ValueError(f"--nodes must be 4-200000, got {self.nodes}")
        if not 0 <= self.workloads_per_hour <= 10_000_000:
            raise ValueError(
                f"--workloads-per-hour must be 0-10000000, got {self.workloads_per_hour}"
            )
        if not 0 < self.hours <= 24:
            raise ValueError(f"--hours must be above 0 and at most 24, got {self.hours}")
        if not 1 <= self.pools <= self.nodes:
            raise ValueError(f"pools must be 1 to the node count, got {self.pools}")
        if self.nodes_per_subnet < 1:
            raise ValueError(f"nodes_per_subnet must be positive, got {self.nodes_per_subnet}")
        if not 0 < self.restart_at < 1:
            raise ValueError(f"restart_at is a fraction of the run, got {self.restart_at}")

    @property
    def horizon_seconds(self) -> float:
        return self.hours * 3600.0

    @property
    def scale_ups(self) -> int:
        per_hour = self.scale_ups_per_hour
        if per_hour is None:
            per_hour = max(2, self.nodes // 100)
        return max(1, round(per_hour * self.hours))


@dataclass(frozen=True, slots=True)
class Target:
    """A figure's bound: ``at_least`` or at most ``limit``."""

    figure: str
    limit: float
    at_least: bool
    label: str

    def met(self, value: float) -> bool:
        return value >= self.limit if self.at_least else value < self.limit


TARGETS = (
    Target("speedup", 100.0, True, "≥ 100× real time"),
    Target("peak_rss_bytes", 2 * _GIB, False, "< 2 GiB"),
    Target("rebuild_seconds", 10.0, False, "< 10 s"),
    Target("dumpstate_seconds", 2.0, False, "< 2 s"),
)
"""The targets for 10,000 nodes and one virtual hour; printed beside any run's figures."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetReport:
    """What one fleet run measured, and what it checked."""

    seed: int
    settings: FleetSettings
    nodes: int
    """Nodes in the node accounting at the end (the fleet plus the machines it scaled up)."""
    workloads: int
    """Workloads submitted."""
    workload_outcomes: Mapping[str, int]
    machines_created: int
    agent_requests: int
    agent_refusals: int
    subnets: int
    virtual_seconds: float
    wall_seconds: float
    events: int
    events_by_capability: Mapping[str, int]
    peak_rss_bytes: int
    rebuild_seconds: float
    takeover_seconds: float
    restart_position: int
    restart_state_equal: bool
    replay_equal: bool | None
    dumpstate_seconds: float
    dumpstate_bytes: int
    testbed_ok: bool
    phases: Mapping[str, float] = field(default_factory=dict)
    """Wall seconds per part of the run: ``setup`` (the fleet joining at virtual time 0), the
    loop's work by kind (``tick``: workloads and placement; ``sync``, of which ``sync.nodes``
    and ``sync.subnets``, also counted within ``setup`` and ``restart``; ``agents``;
    ``machines``; ``restart``, with ``state_check`` and ``replay_check``, the comparisons of
    its dumps which wall time leaves out), ``testbed``."""

    @property
    def speedup(self) -> float:
        return self.virtual_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def figure(self, name: str) -> float:
        value = self.speedup if name == "speedup" else getattr(self, name)
        return float(value)

    def to_dict(self) -> dict[str, object]:
        return {
            "scenario": "fleet",
            "seed": self.seed,
            "nodes": self.nodes,
            "nodes_asked": self.settings.nodes,
            "workloads": self.workloads,
            "workloads_per_hour": self.settings.workloads_per_hour,
            "workload_outcomes": dict(sorted(self.workload_outcomes.items())),
            "machines_created": self.machines_created,
            "agent_requests": self.agent_requests,
            "agent_refusals": self.agent_refusals,
            "subnets": self.subnets,
            "virtual_seconds": round(self.virtual_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "speedup": round(self.speedup, 2),
            "events": self.events,
            "events_by_capability": dict(sorted(self.events_by_capability.items())),
            "events_per_wall_second": round(self.events / self.wall_seconds, 1)
            if self.wall_seconds
            else 0.0,
            "peak_rss_bytes": self.peak_rss_bytes,
            "rebuild_seconds": round(self.rebuild_seconds, 3),
            "takeover_seconds": round(self.takeover_seconds, 3),
            "restart_position": self.restart_position,
            "restart_state_equal": self.restart_state_equal,
            "replay_equal": self.replay_equal,
            "dumpstate_seconds": round(self.dumpstate_seconds, 3),
            "dumpstate_bytes": self.dumpstate_bytes,
            "testbed_ok": self.testbed_ok,
            "phases_wall_seconds": {k: round(v, 3) for k, v in sorted(self.phases.items())},
            "targets": {
                t.figure: {"target": t.label, "met": t.met(self.figure(t.figure))} for t in TARGETS
            },
        }

    def render(self) -> str:
        s = self.settings
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(self.workload_outcomes.items()))
        by_capability = ", ".join(f"{k} {n}" for k, n in sorted(self.events_by_capability.items()))
        lines = [
            f"scenario fleet (seed {self.seed}): {self.nodes} nodes in {s.pools} pools and "
            f"{self.subnets} subnets, {s.hours:g} virtual hour(s)",
            f"  workloads: {self.workloads} submitted ({outcomes or 'none'})",
            f"  agents: {self.agent_requests} resource requests ({self.agent_refusals} refused "
            f"during migrations); machines created: "
            f"{self.machines_created}",
            f"  events: {self.events} ({by_capability})",
            f"  time: {self.virtual_seconds:.0f} virtual s in {self.wall_seconds:.1f} wall s "
            "(the restart's checks left out)",
            f"  restart at position {self.restart_position}: rebuilt state "
            + ("equal" if self.restart_state_equal else "DIFFERENT")
            + (
                ""
                if self.replay_equal is None
                else f", replay {'equal' if self.replay_equal else 'DIFFERENT'}"
            )
            + f"; take-over {self.takeover_seconds:.2f} s",
            f"  testbed on the same log: {'ok' if self.testbed_ok else 'FAILED'}",
            f"  dumpstate: {self.dumpstate_bytes} bytes",
            "  wall seconds by part: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.phases.items())),
            "  figure              value          target       ",
        ]
        shown = {
            "speedup": f"{self.speedup:.1f}×",
            "peak_rss_bytes": f"{self.peak_rss_bytes / _GIB:.2f} GiB",
            "rebuild_seconds": f"{self.rebuild_seconds:.2f} s",
            "dumpstate_seconds": f"{self.dumpstate_seconds:.2f} s",
        }
        for target in TARGETS:
            met = "met" if target.met(self.figure(target.figure)) else "MISSED"
            lines.append(
                f"  {target.figure:<19} {shown[target.figure]:<14} {target.label:<12} {met}"
            )
        if s.nodes != 10_000 or s.hours != 1.0:
            lines.append("  (the targets are for 10,000 nodes and one virtual hour)")
        return "\n".join(lines)
