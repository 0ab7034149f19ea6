"""``fleetledger simulate``: a scenario on virtual time against the fake cloud, and its report.

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
        "simulate", help="run a scenario on virtual time against the fake cloud and report"
    )
    parser.add_argument("--scenario", required=True, help="scenario name, e.g. burst-vms")
    parser.add_argument("--seed", type=int, default=1, help="fixes the whole run (default 1)")
    parser.add_argument(
        "--compare",
        choices=["naive"],
        help="also run the same arrivals with batching off and print both side by side",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help=f"log to this database (e.g. Postgres; its schema is upgraded to head first) "
        f"instead of ./{SIMULATION_LOG} (replaced at each run and kept, for `events tail`, "
        "`audit verify`, `dumpstate`)",
    )
    add_json(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.adapters.simulator import compare_scenario, run_scenario, scenario_names

    capability = _CAPABILITY_SCENARIOS.get(args.scenario)
    if capability is None and args.scenario not in scenario_names():
        known = ", ".join(sorted([*scenario_names(), *_CAPABILITY_SCENARIOS]))
        raise ValueError(f"unknown scenario {args.scenario!r}; choose one of: {known}")
    if capability is not None and args.compare and args.scenario not in _COMPARABLE:
        raise ValueError(f"--compare does not apply to the {args.scenario!r} scenario")
    writes_log = capability is None or capability[1]
    if args.url is not None and writes_log:
        print(f"fleetledger: migrating {args.url} to the schema's head", file=sys.stderr)
    url = args.url if args.url is not None or not writes_log else _fresh_simulation_log()
    report: Any
    if capability is not None:
        report = capability[0](args.seed, url, args.compare)
    elif args.compare:
        report = compare_scenario(args.scenario, seed=args.seed, url=url, against=args.compare)
    else:
        report = run_scenario(args.scenario, seed=args.seed, url=url)
    if args.json:
        print_json({**report.to_dict(), "log_url": url} if writes_log else report.to_dict())
    else:
        print(report.render())
        if writes_log:
            print(
                f"  the log: {url} — read it with `fleetledger events tail --url {url}`, "
                f"check it with `fleetledger audit verify --url {url}`"
            )
    return 0


def _run_subnet(seed: int, url: str | None, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.subnet import run_subnet_scenario

    return run_subnet_scenario(seed)


def _run_restart(seed: int, url: str | None, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.restart import run_restart_scenario

    return run_restart_scenario(seed)


def _run_testbed(seed: int, url: str | None, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.testbed import run_testbed_scenario

    return run_testbed_scenario(seed, url=url)


def _run_placement(seed: int, url: str | None, compare: str | None) -> Any:
    from fleetledger.adapters.simulator.placement import run_placement_scenario

    return run_placement_scenario(seed, compare_naive=compare == "naive", url=url)


# The scenarios of the other capabilities: (runner, whether it writes a log).
_CAPABILITY_SCENARIOS: dict[str, tuple[Callable[[int, str | None, str | None], Any], bool]] = {
    "subnet": (_run_subnet, False),
    "restart": (_run_restart, False),
    "testbed": (_run_testbed, True),
    "burst-workloads": (_run_placement, True),
}
_COMPARABLE = {"burst-workloads"}


def _fresh_simulation_log() -> str:
    """``./fleetledger-sim.db``, emptied: the run's log, left for ``events tail`` and friends."""
    path = Path(SIMULATION_LOG).resolve()
    for leftover in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        leftover.unlink(missing_ok=True)
    return f"sqlite:///{path}"
