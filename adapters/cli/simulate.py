"""``fleetledger simulate``: a scenario on virtual time against the fakes, and its report.

Every scenario runs the runtime ``serve`` runs and leaves its log — ``--url``, else
``./fleetledger-sim.db`` (replaced at each run) — for ``events tail``, ``audit verify`` and
``dumpstate --as-of``. An option a scenario cannot honour is refused, never ignored.

The simulator is imported only when a scenario runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetledger.adapters.cli.common import print_json
from fleetledger.adapters.cli.options import Subcommands, add_json, database_url

__all__ = ["SIMULATION_LOG", "register", "run"]

SIMULATION_LOG = "fleetledger-sim.db"
"""Where ``simulate`` keeps its log without ``--url``: replaced by each run, kept afterwards."""


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "simulate", help="run a scenario on virtual time against the fakes and report"
    )
    parser.add_argument("--scenario", required=True, help="scenario name, e.g. burst-vms")
    parser.add_argument("--seed", type=int, default=1, help="fixes the whole run (default 1)")
    parser.add_argument(
        "--compare",
        choices=["naive"],
        help="also run the same arrivals with batching off and print both side by side "
        "(burst-vms, burst-workloads)",
    )
    parser.add_argument(
        "--cloud-profile",
        choices=["fake", "aks"],
        help="burst-vms only: the cloud the fake models (default fake); aks = one 1,000-VM "
        "burst, 60-120 s per batch, ARM's write budget",
    )
    parser.add_argument(
        "--burst-size",
        type=int,
        metavar="REQUESTS",
        help="burst-vms with --cloud-profile aks: requests in the burst (default 1000)",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help=f"log to this database (e.g. Postgres; its schema is upgraded to head first) "
        f"instead of ./{SIMULATION_LOG} (replaced at each run and kept, for `events tail`, "
        "`audit verify`, `dumpstate --as-of`); scenarios of nodes and subnets need it empty",
    )
    add_json(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.adapters.simulator import compare_scenario, run_scenario, scenario_names

    capability = _CAPABILITY_SCENARIOS.get(args.scenario)
    if capability is None and args.scenario not in scenario_names():
        known = ", ".join(sorted([*scenario_names(), *_CAPABILITY_SCENARIOS]))
        raise ValueError(f"unknown scenario {args.scenario!r}; choose one of: {known}")
    if args.compare and capability is not None and args.scenario not in _COMPARABLE:
        comparable = ", ".join(sorted({*_COMPARABLE, *scenario_names()}))
        raise ValueError(
            f"--compare does not apply to the {args.scenario!r} scenario (it has no naive "
            f"twin to run); the scenarios that take it: {comparable}"
        )
    definition = _cloud_profile(args)
    if args.url is not None:
        print(f"fleetledger: migrating {args.url} to the schema's head", file=sys.stderr)
    url = args.url if args.url is not None else _fresh_simulation_log()
    report: Any
    if capability is not None:
        report = capability(args.seed, url, args.compare)
    elif args.compare:
        report = compare_scenario(
            args.scenario, seed=args.seed, url=url, against=args.compare, definition=definition
        )
    else:
        report = run_scenario(args.scenario, seed=args.seed, url=url, definition=definition)
    figures = report.to_dict()
    if args.json:
        print_json({**figures, "log_url": url})
        return 0
    print(report.render())
    print(
        f"  the log: {url} — read it with `fleetledger events tail --url {url}`, "
        f"check it with `fleetledger audit verify --url {url}`"
    )
    if "checkpoints" in figures:
        print(
            f"  replay it to a checkpoint's position with `fleetledger dumpstate --url {url} "
            "--as-of POSITION`: its SHA-256 is the checkpoint's (--json shows it whole)"
        )
    return 0


def _cloud_profile(args: argparse.Namespace) -> Any:
    """The burst-vms scenario for ``--cloud-profile``/``--burst-size``, or ``None`` (the
    catalog's); refused for any other scenario."""
    if args.cloud_profile is None and args.burst_size is None:
        return None
    if args.scenario != "burst-vms":
        raise ValueError(
            f"--cloud-profile and --burst-size apply to the burst-vms scenario, not "
            f"{args.scenario!r}"
        )
    from fleetledger.adapters.simulator.burst_vms import burst_vms

    return burst_vms(args.cloud_profile or "fake", burst_size=args.burst_size)


def _run_subnet(seed: int, url: str, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.subnet import run_subnet_scenario

    return run_subnet_scenario(seed, url=url)


def _run_restart(seed: int, url: str, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.restart import run_restart_scenario

    return run_restart_scenario(seed, url=url)


def _run_testbed(seed: int, url: str, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.testbed import run_testbed_scenario

    return run_testbed_scenario(seed, url=url)


def _run_placement(seed: int, url: str, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.placement import run_placement_scenario

    return run_placement_scenario(seed, compare_naive=compare == "naive", url=url)


# The scenarios of the other capabilities: their runners take the seed, the log's URL and the
# compare mode. The catalog's scenarios (burst-vms) all take --compare; of these, only:
_CAPABILITY_SCENARIOS: dict[str, Callable[[int, str, str | None], Any]] = {
    "subnet": _run_subnet,
    "restart": _run_restart,
    "testbed": _run_testbed,
    "burst-workloads": _run_placement,
}
_COMPARABLE = frozenset({"burst-workloads"})


def _fresh_simulation_log() -> str:
    """``./fleetledger-sim.db``, emptied: the run's log, left for ``events tail`` and friends."""
    path = Path(SIMULATION_LOG).resolve()
    for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        leftover.unlink(missing_ok=True)
    return f"sqlite:///{path}"
