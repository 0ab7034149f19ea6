"""``fleetledger simulate``: a scenario on virtual time against the fakes, and its report.

Every scenario runs the runtime ``serve`` runs and leaves its log — ``--url``, else
``./fleetledger-sim.db`` (replaced at each run) — for ``events tail``, ``audit verify`` and
``dumpstate --as-of``. An option a scenario cannot honour is refused, never ignored.

The ``dst`` scenario (deterministic simulation testing) is a scenario like the others rather than
a command of its own: it runs the same runtimes and fakes, and a failing seed is reproduced by the
very command that runs any scenario once, ``simulate --scenario dst --seed N`` (which leaves that
seed's log like every scenario). ``--seeds N [--seed-start S]`` runs many seeds, each on a scratch
log, and reports the faults injected and the invariants broken; it exits 1 if any seed broke one.

``./fleetledger-sim.db`` is created whole: its schema goes into a temporary file beside it, which
then replaces it, so a run killed at any moment leaves either the previous log or a migrated one —
never a file without the schema, which ``audit verify`` would reject.

``--scenario all`` runs every capability's scenario with one seed and prints what batching
bought, each against its naive twin (:mod:`fleetledger.adapters.simulator.all`). Each scenario
writes a log of its own in ``./fleetledger-sim/`` (``<scenario>.db``, replaced at each run): the
node, subnet and placement scenarios need an empty log. ``--report FILE.html`` writes the run as
one self-contained HTML page with charts, ``--csv DIR`` its time series.

``--scenario-file FILE.toml`` sets the fleets, subnets, demand curves and cloud behaviour of the
scenarios (:mod:`fleetledger.adapters.simulator.scenario_file`; ``ops/scenarios/`` has examples).

The simulator is imported only when a scenario runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetledger.adapters.cli.common import EXIT_ERROR, print_json
from fleetledger.adapters.cli.options import (
    Subcommands,
    add_json,
    count,
    database_url,
    finite_float,
    seed,
)

if TYPE_CHECKING:
    from fleetledger.adapters.simulator.scenario_file import ScenarioFile

__all__ = ["SCENARIO_CHOICES", "SIMULATION_LOG", "SIMULATION_LOGS", "register", "run"]

SIMULATION_LOG = "fleetledger-sim.db"
"""Where ``simulate`` keeps its log without ``--url``: replaced by each run, kept afterwards."""
SIMULATION_LOGS = "fleetledger-sim"
"""The folder of ``--scenario all``'s logs, one ``<scenario>.db`` each, replaced by each run."""

SCENARIO_CHOICES = (
    "burst-vms",
    "burst-workloads",
    "subnet",
    "restart",
    "testbed",
    "dst",
    "fleet",
    "all",
)
"""The scenarios ``--scenario`` names (the catalog may register more: those run too)."""


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "simulate", help="run a scenario on virtual time against the fakes and report"
    )
    parser.add_argument(
        "--scenario",
        required=True,
        metavar="NAME",
        help=f"one of: {', '.join(SCENARIO_CHOICES)}. `all` runs every capability's scenario "
        f"(each on its own log in ./{SIMULATION_LOGS}/, since the node, subnet and placement "
        "scenarios need an empty one) and prints what batching bought",
    )
    parser.add_argument(
        "--scenario-file",
        type=Path,
        metavar="FILE.toml",
        help="fleets, subnets, demand curves and cloud behaviour of the scenarios, in TOML "
        "(sections [burst-vms], [burst-workloads], [subnet], [restart]; see "
        "ops/scenarios/example.toml)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE.html",
        help="all only: write the run as one self-contained HTML page with charts",
    )
    parser.add_argument(
        "--csv",
        type=Path,
        metavar="DIR",
        help="all only: write the run's time series as CSV files into DIR",
    )
    parser.add_argument(
        "--seed", type=seed, help="fixes the whole run (default: the scenario file's seed, else 1)"
    )
    parser.add_argument(
        "--seeds",
        type=count(maximum=100_000),
        metavar="N",
        help="dst only: run N seeds (each on a scratch log) and report the invariants broken",
    )
    parser.add_argument(
        "--seed-start",
        type=seed,
        metavar="S",
        help="dst with --seeds: the first seed (default 0)",
    )
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
        type=count(maximum=100_000),
        metavar="REQUESTS",
        help="burst-vms with --cloud-profile aks: requests in the burst (default 1000)",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help=f"log to this database (e.g. Postgres; its schema is upgraded to head first) "
        f"instead of ./{SIMULATION_LOG} (replaced at each run and kept, for `events tail`, "
        "`audit verify`, `dumpstate --as-of`); scenarios of nodes and subnets need it empty; "
        "not with all (a log per scenario)",
    )
    parser.add_argument(
        "--nodes",
        type=count(minimum=4, maximum=200_000),
        metavar="N",
        help="fleet only: nodes in the fleet (default 10000)",
    )
    parser.add_argument(
        "--workloads-per-hour",
        type=count(minimum=0, maximum=10_000_000),
        metavar="W",
        help="fleet only: workloads arriving (and leaving) per virtual hour (default 100000)",
    )
    parser.add_argument(
        "--hours",
        type=finite_float(
            minimum=0.0, maximum=24.0, minimum_excluded=True, noun="a number of hours"
        ),
        metavar="H",
        help="fleet only: virtual hours to run (default 1)",
    )
    add_json(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.adapters.simulator import compare_scenario, run_scenario, scenario_names

    fleet_options = (args.nodes, args.workloads_per_hour, args.hours)
    if args.scenario != "fleet" and any(o is not None for o in fleet_options):
        raise ValueError(
            f"--nodes, --workloads-per-hour and --hours apply to the fleet scenario, not "
            f"{args.scenario!r}"
        )
    if args.scenario == "dst":
        if args.scenario_file is not None:
            raise ValueError(
                "--scenario-file does not apply to dst (its faults come from the seed)"
            )
        _refuse_outputs(args)
        return _run_dst(args)
    if args.seeds is not None or args.seed_start is not None:
        raise ValueError("--seeds and --seed-start apply to the dst scenario only")
    if args.scenario == "fleet":
        _refuse_outputs(args)
        return _run_fleet(args)
    file = _scenario_file(args)
    if args.seed is None:
        args.seed = file.seed if file.seed is not None else 1
    if args.scenario == "all":
        return _run_all(args, file)
    _refuse_outputs(args)
    capability = _CAPABILITY_SCENARIOS.get(args.scenario)
    if capability is None and args.scenario not in scenario_names():
        known = ", ".join(sorted([*scenario_names(), *_CAPABILITY_SCENARIOS, "dst"]))
        raise ValueError(f"unknown scenario {args.scenario!r}; choose one of: {known}")
    if args.compare and capability is not None and args.scenario not in _COMPARABLE:
        comparable = ", ".join(sorted({*_COMPARABLE, *scenario_names()}))
        raise ValueError(
            f"--compare does not apply to the {args.scenario!r} scenario (it has no naive "
            f"twin to run); the scenarios that take it: {comparable}"
        )
    definition = _cloud_profile(args)
    if definition is None and args.scenario == "burst-vms":
        definition = file.burst_vms
    if args.url is not None:
        print(f"fleetledger: migrating {args.url} to the schema's head", file=sys.stderr)
    url = args.url if args.url is not None else _fresh_simulation_log()
    report: Any
    if capability is not None:
        report = capability(args.seed, url, args.compare, file)
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


def _run_dst(args: argparse.Namespace) -> int:
    """One seed (``--seed``: its log is kept, like any scenario's) or many (``--seeds``)."""
    from fleetledger.adapters.simulator.dst import run_seed, run_seeds

    if args.compare or args.cloud_profile is not None or args.burst_size is not None:
        raise ValueError("--compare, --cloud-profile and --burst-size do not apply to dst")
    if args.seeds is not None:
        if args.seed is not None:
            raise ValueError("give either --seed (one seed) or --seeds with --seed-start")
        if args.url is not None:
            raise ValueError(
                "--seeds runs each seed on a scratch log; --url takes one seed (--seed)"
            )
        report = run_seeds(args.seeds, start=args.seed_start or 0)
        if args.json:
            print_json(report.to_dict())
        else:
            print(report.render())
        return 0 if report.ok else EXIT_ERROR
    if args.seed_start is not None:
        raise ValueError("--seed-start goes with --seeds")
    seed = 1 if args.seed is None else args.seed
    url = args.url if args.url is not None else _fresh_simulation_log()
    result = run_seed(seed, url=url)
    if args.json:
        print_json({**result.to_dict(), "log_url": url})
    else:
        print(
            f"scenario dst (seed {seed}): {result.requests} requests, {result.acknowledged} "
            f"acknowledged, {result.processes} controller process(es), {result.events} events"
        )
        for line in result.schedule:
            print(f"  fault scheduled: {line}")
        injected = ", ".join(f"{k} {n}" for k, n in sorted(result.faults_injected.items()))
        print(f"  faults injected: {injected or 'none'}")
        for violation in result.violations:
            print(f"  VIOLATION {violation.invariant}: {violation.detail}")
        if result.ok:
            print("  every invariant held")
        print(f"  the log: {url} — check it with `fleetledger audit verify --url {url}`")
    return 0 if result.ok else EXIT_ERROR


def _run_fleet(args: argparse.Namespace) -> int:
    """The fleet at scale: its figures beside the targets (they are reported, not enforced)."""
    from fleetledger.adapters.simulator.fleet import FleetSettings, run_fleet_scenario

    if args.scenario_file is not None:
        raise ValueError(
            "--scenario-file does not apply to fleet: size it with --nodes, "
            "--workloads-per-hour and --hours"
        )
    if args.compare or args.cloud_profile is not None or args.burst_size is not None:
        raise ValueError("--compare, --cloud-profile and --burst-size do not apply to fleet")
    given = {
        "nodes": args.nodes,
        "workloads_per_hour": args.workloads_per_hour,
        "hours": args.hours,
    }
    settings = FleetSettings(**{k: v for k, v in given.items() if v is not None})
    if args.url is not None:
        print(f"fleetledger: migrating {args.url} to the schema's head", file=sys.stderr)
    url = args.url if args.url is not None else _fresh_simulation_log()
    report = run_fleet_scenario(
        1 if args.seed is None else args.seed,
        url=url,
        settings=settings,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    if args.json:
        print_json({**report.to_dict(), "log_url": url})
        return 0
    print(report.render())
    print(
        f"  the log: {url} — check it with `fleetledger audit verify --url {url}`, "
        f"dump it with `fleetledger dumpstate --url {url}`"
    )
    return 0


def _run_all(args: argparse.Namespace, file: ScenarioFile) -> int:
    """Every capability's scenario, each on a fresh log of its own; the summary, the report."""
    from fleetledger.adapters.simulator.all import SCENARIOS, run_all

    if args.url is not None:
        raise ValueError(
            f"--scenario all writes one log per scenario in ./{SIMULATION_LOGS}/ (the node, subnet "
            "and placement scenarios each need an empty log); run one scenario to use --url"
        )
    if args.compare or args.cloud_profile is not None or args.burst_size is not None:
        raise ValueError(
            "--scenario all compares every scenario with its naive twin already; set the cloud "
            "profile and burst size in a scenario file's [burst-vms] section (--scenario-file)"
        )
    folder = Path(SIMULATION_LOGS).resolve()
    folder.mkdir(exist_ok=True)
    logs = {name: _fresh_simulation_log(folder / f"{name}.db") for name in SCENARIOS}
    report = run_all(args.seed, logs=logs, scenario_file=file)
    written: dict[str, object] = {}
    if args.report is not None:
        from fleetledger.adapters.simulator.report_html import write_html

        written["report"] = str(write_html(report, args.report).resolve())
    if args.csv is not None:
        from fleetledger.adapters.simulator.report_csv import write_csv

        written["csv"] = [str(p.resolve()) for p in write_csv(report.series, args.csv)]
    if args.json:
        print_json({**report.to_dict(), **written})
        return 0
    print(report.render())
    print(
        f"  logs: {folder}/<scenario>.db — e.g. `fleetledger audit verify --url {logs['subnet']}`"
    )
    if "csv" in written:
        print(f"  time series: {args.csv.resolve()}/ ({len(written['csv'])} CSV files)")  # type: ignore[arg-type]
    if "report" in written:
        print(f"  report: {written['report']}")
    return 0


def _scenario_file(args: argparse.Namespace) -> ScenarioFile:
    from fleetledger.adapters.simulator.scenario_file import ScenarioFile, load_scenario_file

    if args.scenario_file is None:
        return ScenarioFile.defaults()
    file = load_scenario_file(args.scenario_file)
    if file.burst_vms is not None and (
        args.cloud_profile is not None or args.burst_size is not None
    ):
        raise ValueError(
            f"{args.scenario_file} has a [burst-vms] section: set the cloud profile and burst "
            "size there, not with --cloud-profile/--burst-size as well"
        )
    return file


def _refuse_outputs(args: argparse.Namespace) -> None:
    if args.report is not None or args.csv is not None:
        raise ValueError(
            f"--report and --csv chart every capability: use them with --scenario all, not "
            f"{args.scenario!r}"
        )


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


def _run_subnet(seed: int, url: str, compare: str | None, file: ScenarioFile) -> Any:
    from fleetledger.adapters.simulator.subnet import run_subnet_scenario

    return run_subnet_scenario(seed, url=url, **file.subnet.kwargs())


def _run_restart(seed: int, url: str, compare: str | None, file: ScenarioFile) -> Any:
    from fleetledger.adapters.simulator.restart import run_restart_scenario

    return run_restart_scenario(seed, file.restart, url=url)


def _run_testbed(seed: int, url: str, compare: str | None, file: ScenarioFile) -> Any:
    from fleetledger.adapters.simulator.testbed import run_testbed_scenario

    return run_testbed_scenario(seed, url=url)


def _run_placement(seed: int, url: str, compare: str | None, file: ScenarioFile) -> Any:
    from fleetledger.adapters.simulator.placement import run_placement_scenario

    return run_placement_scenario(
        seed, compare_naive=compare == "naive", url=url, settings=file.placement
    )


# The scenarios of the other capabilities: their runners take the seed, the log's URL, the
# compare mode and the scenario file. The catalog's scenarios (burst-vms) all take --compare; of
# these, only:
_CAPABILITY_SCENARIOS: dict[str, Callable[[int, str, str | None, ScenarioFile], Any]] = {
    "subnet": _run_subnet,
    "restart": _run_restart,
    "testbed": _run_testbed,
    "burst-workloads": _run_placement,
}
_COMPARABLE = frozenset({"burst-workloads"})


def _fresh_simulation_log(where: Path | None = None) -> str:
    """``where`` (default ``./fleetledger-sim.db``), empty and migrated: the run's log, left for
    ``events tail`` and friends. Created whole (see the module docstring): the schema goes into
    a temporary file in the same folder (so the rename stays on one file system), which then
    replaces the log."""
    from fleetledger.eventstore import migrate

    path = (where if where is not None else Path(SIMULATION_LOG)).resolve()
    # A fresh name that SQLite creates itself, with the usual permissions (mkstemp's are 0600).
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        migrate.upgrade(f"sqlite:///{scratch}")
        # The old log's journal files belong to the old file: a -wal beside the new one would
        # be replayed into it. They go first; until the rename the old log stays whole.
        for leftover in (path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal")):
            leftover.unlink(missing_ok=True)
        os.replace(scratch, path)
    finally:
        for leftover in (scratch, *(scratch.with_name(scratch.name + s) for s in ("-wal", "-shm"))):
            leftover.unlink(missing_ok=True)
    return f"sqlite:///{path}"
