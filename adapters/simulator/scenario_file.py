"""Scenario files: the fleets, subnets, demand curves and cloud behaviour of ``simulate``, in TOML.

One file holds one section per scenario it changes; a section left out keeps that scenario's
defaults (the figures the README quotes)::

    seed = 7                      # optional: the seed when --seed is not given

    [burst-vms]                   # the VM-request bursts and the cloud they meet
    cloud_profile = "fake"        # "fake" (3 seeded bursts) or "aks" (one burst, AKS timings)
    burst_size = 1000             # aks only: requests in the burst
    cloud_latency_s = 3.0         # how long one batch create takes in the fake cloud
    max_concurrent_calls = 4      # creates in flight at once
    [burst-vms.batching]
    idle_timeout_ms = 500
    max_timeout_s = 5.0
    max_batch_size = 50

    [subnet]                      # one subnet shared by a fleet of nodes
    nodes = 32
    capacity = 1024               # IPs in the subnet
    peak_pods_per_node = [8, 18]  # each node's peak demand, drawn in this range
    allocator_latency_s = 2
    [subnet.demand]               # the demand curve: ramp up, plateau, ramp down, quiet tail
    rise_s = 180
    hold_s = 180
    fall_s = 180
    tail_s = 60

    [burst-workloads]             # the placement fleet and its two bursts
    workers = 20                  # workers joined before the bursts
    burst = 100                   # workloads in each burst
    [burst-workloads.pool]        # the pool the workers belong to and overflow grows
    name = "cpu"
    vm_size = "Standard_D4s_v5"
    worker_cpu_milli = 4000       # a multiple of 4, at least 2000 (the overflow is quarters)
    worker_memory_gib = 16        # at least 8, so that CPU binds

    [restart]                     # the fleet whose controller restarts (any RestartSettings field)
    nodes = 10
    pods_per_node = 12
    restart_at_seconds = 60.0

The ``burst-vms`` section becomes the scenario *definition* the catalog's runner already takes
(:func:`~fleetledger.adapters.simulator.runner.run_scenario`'s ``definition``): its script is the
chosen cloud profile's, with the file's cloud and batching settings put in. The other sections
become the keyword arguments of their scenario's runner. ``testbed`` runs a fixed testbed and
takes no settings; a section for it, an unknown key or a value of the wrong type or out of range
is refused with the file, the section and the key, and what is allowed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from random import Random
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fleetledger.domain.placement import Pool
from fleetledger.domain.template import MachineTemplate

from .burst_vms import burst_vms
from .placement import PlacementSettings
from .restart import RestartSettings
from .scenarios import Scenario, Script

__all__ = ["ScenarioFile", "SubnetSettings", "load_scenario_file", "parse_scenario_file"]

_EXAMPLE = "ops/scenarios/example.toml"
"""Where a user finds every key with its default."""

_SETTLED_SCENARIOS = ("testbed",)
"""Scenarios with a fixed fleet: nothing in them is read from a file."""


class _Strict(BaseModel):
    # Unknown keys are typos: refuse them rather than run the defaults the user meant to change.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


PositiveInt = Annotated[int, Field(ge=1, le=1_000_000)]
Seconds = Annotated[float, Field(gt=0, le=86_400)]


class _Batching(_Strict):
    idle_timeout_ms: Annotated[float, Field(gt=0, le=3_600_000)] | None = None
    max_timeout_s: Seconds | None = None
    max_batch_size: Annotated[int, Field(ge=1, le=10_000)] | None = None


class _BurstVms(_Strict):
    cloud_profile: Literal["fake", "aks"] = "fake"
    # At least 12: the scenario pins its faults (3 machines out of capacity, 6 over quota, 3
    # left out of the result) on distinct requests of the burst.
    burst_size: Annotated[int, Field(ge=12, le=100_000)] | None = None
    cloud_latency_s: Seconds | None = None
    max_concurrent_calls: Annotated[int, Field(ge=1, le=1_000)] | None = None
    batching: _Batching = _Batching()

    @model_validator(mode="after")
    def _burst_size_needs_aks(self) -> _BurstVms:
        if self.burst_size is not None and self.cloud_profile != "aks":
            raise ValueError(
                'burst_size applies to cloud_profile = "aks"; the fake profile draws its 3 '
                "bursts of 50-200 requests from the seed"
            )
        return self


class _Demand(_Strict):
    rise_s: Annotated[int, Field(ge=1, le=86_400)] = 180
    hold_s: Annotated[int, Field(ge=1, le=86_400)] = 180
    fall_s: Annotated[int, Field(ge=1, le=86_400)] = 180
    tail_s: Annotated[int, Field(ge=0, le=86_400)] = 60


class _Subnet(_Strict):
    nodes: Annotated[int, Field(ge=1, le=10_000)] = 32
    capacity: Annotated[int, Field(ge=1, le=1 << 20)] = 1024
    peak_pods_per_node: Annotated[
        list[Annotated[int, Field(ge=0, le=10_000)]], Field(min_length=2, max_length=2)
    ] = Field(default_factory=lambda: [8, 18])
    allocator_latency_s: Annotated[int, Field(ge=1, le=3_600)] = 2
    demand: _Demand = _Demand()

    @model_validator(mode="after")
    def _range_ordered(self) -> _Subnet:
        low, high = self.peak_pods_per_node
        if low > high:
            raise ValueError(
                f"peak_pods_per_node must be [low, high] with low <= high, got [{low}, {high}]"
            )
        return self


class _WorkloadPool(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,11}$")] = "cpu"
    vm_size: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")] = "Standard_D4s_v5"
    worker_cpu_milli: Annotated[int, Field(ge=2000, le=1_000_000, multiple_of=4)] = 4000
    worker_memory_gib: Annotated[int, Field(ge=8, le=16_384)] = 16


class _BurstWorkloads(_Strict):
    workers: Annotated[int, Field(ge=1, le=10_000)] = 20
    burst: Annotated[int, Field(ge=1, le=100_000)] = 100
    pool: _WorkloadPool = _WorkloadPool()


_RESTART_DEFAULTS = RestartSettings()


def _restart_model() -> type[BaseModel]:
    """The ``[restart]`` section: every scalar field of :class:`RestartSettings`, its defaults
    taken from the dataclass so the file and the CLI's scenario never drift apart."""
    from pydantic import create_model

    scalar: dict[str, Any] = {}
    for f in fields(RestartSettings):
        default = getattr(_RESTART_DEFAULTS, f.name)
        if isinstance(default, bool) or not isinstance(default, int | float):
            continue  # compute_unit: a pair the scenario fixes to the product's 250 m / 1 slot
        kind: Any
        if f.name == "watermark":
            kind = Annotated[float, Field(gt=0, le=1)]  # a fraction of the node
        elif isinstance(default, int):
            kind = Annotated[int, Field(ge=0, le=1_000_000)]
        else:
            kind = Annotated[float, Field(ge=0, le=86_400)]
        scalar[f.name] = (kind, default)
    return create_model("_Restart", __base__=_Strict, **scalar)


_Restart = _restart_model()


class _File(_Strict):
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    burst_vms: _BurstVms = Field(default=_BurstVms(), alias="burst-vms")
    burst_workloads: _BurstWorkloads = Field(default=_BurstWorkloads(), alias="burst-workloads")
    subnet: _Subnet = _Subnet()
    # Checked on its own (its model is built from RestartSettings at import, which a static
    # annotation cannot name): see parse_scenario_file.
    restart: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubnetSettings:
    """The ``subnet`` scenario's keyword arguments (``run_subnet_scenario``'s)."""

    nodes: int = 32
    capacity: int = 1024
    peak_range: tuple[int, int] = (8, 18)
    rise_s: int = 180
    hold_s: int = 180
    fall_s: int = 180
    tail_s: int = 60
    allocator_latency_s: int = 2

    def kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioFile:
    """What a scenario file sets; :meth:`defaults` is a file with no sections."""

    source: str = "defaults"
    seed: int | None = None
    burst_vms: Scenario | None = None
    """The ``burst-vms`` definition for the catalog's runner; ``None``: the catalog's own."""
    placement: PlacementSettings = field(default_factory=PlacementSettings)
    """The ``burst-workloads`` scenario's fleet and bursts."""
    subnet: SubnetSettings = field(default_factory=SubnetSettings)
    restart: RestartSettings = field(default_factory=RestartSettings)

    @classmethod
    def defaults(cls) -> ScenarioFile:
        return cls()


def load_scenario_file(path: Path) -> ScenarioFile:
    """Read and validate ``path``; ``ValueError`` naming the file, section and key otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the scenario file {path}: {e.strerror or e}") from e
    return parse_scenario_file(text, source=str(path))


def parse_scenario_file(text: str, *, source: str = "<scenario file>") -> ScenarioFile:
    """Validate a scenario file's text (see the module docstring)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source} is not valid TOML: {e}") from e
    for name in _SETTLED_SCENARIOS:
        if name in raw:
            raise ValueError(
                f"{source}: [{name}] takes no settings (its fleet is fixed); remove the section. "
                "Sections a file may hold: [burst-vms], [burst-workloads], [subnet], [restart]"
            )
    try:
        parsed = _File.model_validate(raw)
        restart_section = _Restart.model_validate(parsed.restart)
    except ValidationError as e:
        section = () if e.title == "_File" else ("restart",)
        raise ValueError(f"{source}: {_first_problem(e, section)}") from None
    try:
        restart = RestartSettings(**restart_section.model_dump())
    except ValueError as e:
        raise ValueError(f"{source}: [restart] {e}") from None
    subnet = parsed.subnet
    workloads = parsed.burst_workloads
    return ScenarioFile(
        source=source,
        seed=parsed.seed,
        burst_vms=_burst_vms(parsed.burst_vms, source) if "burst-vms" in raw else None,
        placement=PlacementSettings(
            workers=workloads.workers,
            burst=workloads.burst,
            pool=Pool(
                name=workloads.pool.name,
                template=MachineTemplate(vm_size=workloads.pool.vm_size),
                worker_cpu_milli=workloads.pool.worker_cpu_milli,
                worker_memory_bytes=workloads.pool.worker_memory_gib << 30,
            ),
        ),
        subnet=SubnetSettings(
            nodes=subnet.nodes,
            capacity=subnet.capacity,
            peak_range=(subnet.peak_pods_per_node[0], subnet.peak_pods_per_node[1]),
            allocator_latency_s=subnet.allocator_latency_s,
            **subnet.demand.model_dump(),
        ),
        restart=restart,
    )


def _burst_vms(section: _BurstVms, source: str) -> Scenario:
    base = burst_vms(section.cloud_profile, burst_size=section.burst_size)
    batching = section.batching
    overrides: dict[str, Any] = {}
    if batching.idle_timeout_ms is not None:
        overrides["idle_timeout"] = timedelta(milliseconds=batching.idle_timeout_ms)
    if batching.max_timeout_s is not None:
        overrides["max_timeout"] = timedelta(seconds=batching.max_timeout_s)
    if batching.max_batch_size is not None:
        overrides["max_batch_size"] = batching.max_batch_size
    # Checked now, on the profile's own script, so a bad pair fails before anything runs.
    script = base.build(Random(0))
    try:
        replace(script.config, **overrides)
    except ValueError as e:
        raise ValueError(f"{source}: [burst-vms.batching] {e}") from None

    def build(rng: Random) -> Script:
        script = base.build(rng)
        changed = replace(script, config=replace(script.config, **overrides))
        if section.cloud_latency_s is not None:
            changed = replace(changed, cloud_latency_seconds=section.cloud_latency_s)
        if section.max_concurrent_calls is not None:
            changed = replace(changed, max_concurrent_batches=section.max_concurrent_calls)
        return changed

    return Scenario(name=base.name, summary=f"{base.summary} (from {source})", build=build)


def _first_problem(error: ValidationError, section: tuple[str, ...] = ()) -> str:
    """The first problem pydantic found, as ``[section] key: what is wrong (got X)``;
    ``section`` is where the model that found it sits in the file."""
    problem = error.errors()[0]
    where = [*section, *(str(part) for part in problem["loc"] if not isinstance(part, int))]
    kind, message = problem["type"], problem["msg"]
    if kind == "extra_forbidden" and len(where) == 1:
        return (
            f"unknown section or key {where[0]!r}; a file holds `seed` and the sections "
            f"[burst-vms], [burst-workloads], [subnet], [restart] (see {_EXAMPLE})"
        )
    if kind == "extra_forbidden":
        return f"[{'.'.join(where[:-1])}] {where[-1]}: unknown key (see {_EXAMPLE})"
    if kind == "value_error":
        # A check across keys (model_validator): its message names the keys already.
        message = message.removeprefix("Value error, ")
        return f"[{'.'.join(where)}] {message}" if where else message
    got = f" (got {problem['input']!r})" if "input" in problem else ""
    if len(where) == 1:
        return f"{where[0]}: {message}{got}"
    return f"[{'.'.join(where[:-1])}] {where[-1]}: {message}{got}"
