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

The simulator is imported only when a scenario runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetledger.adapters.cli.common import EXIT_ERROR, print_json
from fleetledger.adapters.cli.options import Subcommands, add_json, count, database_url, seed

__all__ = ["SIMULATION_LOG", "register", "run"]

SIMULATION_LOG = "fleetledger-sim.db"
"""Where ``simulate`` keeps its log without ``--url``: replaced by each run, kept afterwards."""


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "simulate", help="run a scenario on virtual time against the fakes and report"
    )
    parser.add_argument("--scenario", required=True, help="scenario name, e.g. burst-vms")
    parser.add_argument("--seed", type=seed, help="fixes the whole run (default 1)")
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
        "`audit verify`, `dumpstate --as-of`); scenarios of nodes and subnets need it empty",
    )
    add_json(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.adapters.simulator import compare_scenario, run_scenario, scenario_names

    if args.scenario == "dst":
        return _run_dst(args)
    if args.seeds is not None or args.seed_start is not None:
        raise ValueError("--seeds and --seed-start apply to the dst scenario only")
    if args.seed is None:
        args.seed = 1
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
    """``./fleetledger-sim.db``, empty and migrated: the run's log, left for ``events tail`` and
    friends. Created whole (see the module docstring): the schema goes into a temporary file in
    the same folder (so the rename stays on one file system), which then replaces the log."""
    from fleetledger.eventstore import migrate

    path = Path(SIMULATION_LOG).resolve()
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
