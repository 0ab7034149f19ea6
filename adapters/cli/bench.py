"""``fleetledger bench``: benchmarks printing figures and ratios. Each benchmark's code is
imported only when it runs."""

from __future__ import annotations

import argparse

from fleetledger.adapters.cli.common import print_json
from fleetledger.adapters.cli.options import (
    Subcommands,
    add_json,
    add_url,
    count,
    database_url,
    finite_float,
    name,
    seconds,
    seed,
)
from fleetledger.eventstore._engine import DATABASE_URL_ENV

__all__ = [
    "extender",
    "grouper",
    "nodes",
    "placement",
    "register",
    "reliability",
    "replay",
    "serve",
    "shard_counts",
    "shards",
    "store",
]


def register(commands: Subcommands) -> None:
    bench = commands.add_parser("bench", help="benchmarks printing figures and ratios")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    store_parser = bench_commands.add_parser("store", help="appends and replay against raw psycopg")
    add_url(store_parser)
    add_json(store_parser)
    store_parser.add_argument(
        "--events", type=count(maximum=10_000_000), default=2000, help="events each phase appends"
    )
    store_parser.set_defaults(run=store)
    _add_grouper(bench_commands)
    _add_serve(bench_commands)
    _add_nodes(bench_commands)
    _add_placement(bench_commands)
    _add_reliability(bench_commands)
    _add_extender(bench_commands)
    _add_replay(bench_commands)
    _add_shards(bench_commands)


def shard_counts(value: str) -> tuple[int, ...]:
    """``--shards``: shard counts, comma-separated (``1,2,4``), each from 1 to 64, none twice."""
    parts = value.split(",")
    if not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"must be shard counts separated by commas, like 1,2,4, not {value!r}"
        )
    counts = tuple(int(part) for part in parts)
    if not all(1 <= c <= _MAX_SHARDS for c in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(
            f"must be distinct shard counts from 1 to {_MAX_SHARDS} (a process each), not {value!r}"
        )
    return counts


_MAX_SHARDS = 64
"""The most child processes ``bench shards`` starts for one count."""


def _add_shards(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "shards",
        help="node accounting split into shards, one process each: take-over and sync passes "
        "of a fake fleet per shard count, wall and CPU seconds, speed-up against one shard",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help="database server to make each count's scratch database on (default: "
        f"${DATABASE_URL_ENV}, else the Postgres at 127.0.0.1:5432; sqlite:///FILE measures "
        "SQLite)",
    )
    parser.add_argument(
        "--nodes",
        type=count(maximum=1_000_000),
        default=10_000,
        help="nodes in the fake cluster (default 10000)",
    )
    parser.add_argument(
        "--shards",
        type=shard_counts,
        default=(1, 2),
        metavar="COUNTS",
        help="shard counts to run, comma-separated, each on a fresh database (default 1,2)",
    )
    parser.add_argument(
        "--passes",
        type=count(minimum=0, maximum=10_000),
        default=5,
        help="sync passes after the take-over, each after a tenth of the nodes changed (default 5)",
    )
    parser.add_argument("--seed", type=seed, default=0, help="fixes which nodes change")
    add_json(parser)
    parser.set_defaults(run=shards)


def _add_extender(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "extender",
        help="scheduler-extender filter/preempt calls per second through a real "
        "`fleetledger extender` on loopback",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help="database server to make the scratch database on (default: "
        f"${DATABASE_URL_ENV}, else the Postgres at 127.0.0.1:5432; sqlite:///FILE measures "
        "SQLite)",
    )
    parser.add_argument(
        "--nodes", type=count(maximum=100_000), default=16, help="testbed nodes (default 16)"
    )
    parser.add_argument(
        "--slots", type=count(maximum=10_000), default=4, help="slots per node (default 4)"
    )
    parser.add_argument(
        "--clients", type=count(maximum=10_000), default=32, help="concurrent callers (default 32)"
    )
    parser.add_argument(
        "--seconds", type=seconds(), default=10.0, help="timed seconds of each phase (default 10)"
    )
    parser.add_argument(
        "--warmup",
        type=seconds(at_least=0),
        default=2.0,
        help="warm-up seconds of each phase (default 2)",
    )
    parser.add_argument(
        "--rate",
        type=finite_float(minimum=0, maximum=10_000_000, minimum_excluded=True),
        default=2000.0,
        help="calls per second offered in the latency phase (default 2000, the target)",
    )
    parser.add_argument(
        "--mix",
        default="80:10:10",
        type=name,
        metavar="REASK:FIRST:PREEMPT",
        help="shares of re-asked filters, first filters and preemptions (default 80:10:10)",
    )
    parser.add_argument("--seed", type=seed, default=0, help="fixes the calls' order")
    add_json(parser)
    parser.set_defaults(run=extender)


def _add_replay(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "replay",
        help="every read model rebuilt from position 0 of a long log of every capability's "
        "events: events/s and peak RSS",
    )
    parser.add_argument(
        "--url",
        type=database_url,
        help="database server to make the scratch log on (default: "
        f"${DATABASE_URL_ENV}, else the Postgres at 127.0.0.1:5432; sqlite:///FILE measures "
        "SQLite)",
    )
    parser.add_argument(
        "--log-url",
        type=database_url,
        metavar="URL",
        help="replay this log instead, kept for the next run and first topped up to --events "
        "if it holds fewer (default: a scratch log, dropped afterwards)",
    )
    parser.add_argument(
        "--events",
        type=count(maximum=100_000_000),
        default=1_000_000,
        help="events in the log and replayed (default 1000000)",
    )
    parser.add_argument(
        "--page",
        type=count(maximum=1_000_000),
        default=5000,
        help="events per read of the log (default 5000)",
    )
    parser.add_argument(
        "--seed", type=seed, default=1, help="seed of the scenarios the log copies (default 1)"
    )
    add_json(parser)
    parser.set_defaults(run=replay)


def _add_nodes(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "nodes", help="agent permit requests per second through the HTTP endpoint (Postgres)"
    )
    add_url(parser)
    parser.add_argument("--nodes", type=count(maximum=100_000), default=100, help="nodes")
    parser.add_argument(
        "--pods", type=count(maximum=10_000_000), default=2000, help="VM pods over the nodes"
    )
    parser.add_argument(
        "--clients", type=count(maximum=10_000), default=64, help="concurrent agents"
    )
    parser.add_argument("--seconds", type=seconds(), default=10.0, help="timed seconds")
    add_json(parser)
    parser.set_defaults(run=nodes)


def _add_placement(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "placement", help="planning and end-to-end placements per second over 1,000 nodes"
    )
    add_url(parser)
    parser.add_argument(
        "--nodes", type=count(maximum=100_000), default=1000, help="workers in the snapshot"
    )
    parser.add_argument("--batch", type=count(), default=100, help="workloads per batch")
    add_json(parser)
    parser.set_defaults(run=placement)


def _add_reliability(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "reliability",
        help="hostile inputs and database faults against the API: nothing lost or stalled "
        "(exit 1 otherwise)",
    )
    add_url(parser)
    parser.add_argument(
        "--requests",
        type=count(),
        default=300,
        help="requests in the faulted bursts (default 300)",
    )
    parser.add_argument(
        "--drops",
        type=count(minimum=0, maximum=1000),
        default=2,
        help="connection cuts on Postgres (default 2)",
    )
    parser.add_argument(
        "--outage-seconds",
        type=seconds(at_most=3600),
        default=2.0,
        help="how long each cut lasts (default 2)",
    )
    parser.add_argument(
        "--fuzz-inputs",
        type=count(minimum=0, maximum=10_000),
        default=40,
        help="hostile inputs per route of every listener of a real serve (default 40; 0 skips)",
    )
    parser.add_argument(
        "--idle-connections",
        type=count(minimum=0, maximum=100_000),
        default=2000,
        help="idle sockets left on serve's API, all of which it must close (default 2000)",
    )
    parser.add_argument(
        "--seeds",
        type=count(minimum=0, maximum=1_000_000),
        default=200,
        help="deterministic simulation seeds, every capability under faults (default 200)",
    )
    parser.add_argument(
        "--no-partition",
        dest="partition",
        action="store_false",
        help="skip cutting a leader from the database (Postgres only; about a minute)",
    )
    add_json(parser)
    parser.set_defaults(run=reliability)


def _add_serve(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "serve", help="machine-request POSTs per second through a real `serve` on loopback"
    )
    add_url(parser)
    parser.add_argument(
        "--clients", type=count(maximum=10_000), default=32, help="concurrent clients (default 32)"
    )
    parser.add_argument(
        "--requests",
        type=count(maximum=10_000_000),
        default=6000,
        help="POSTs to time with the python driver (default 6000)",
    )
    parser.add_argument(
        "--driver",
        choices=["python", "wrk"],
        default="python",
        help="python: asyncio clients in this process, --requests POSTs; wrk: the C load "
        "generator (apt-get install wrk) for --seconds, then every accepted request followed "
        "to its outcome (default python)",
    )
    parser.add_argument(
        "--seconds",
        type=seconds(at_least=1, at_most=3600),
        default=10.0,
        help="how long wrk posts (default 10)",
    )
    parser.add_argument(
        "--runs",
        type=count(maximum=100),
        default=1,
        help="consecutive wrk runs against the same serve (default 1; the tail target asks "
        "for 5 with --fake-latency 0.05)",
    )
    parser.add_argument(
        "--fake-latency",
        type=seconds(at_least=0, at_most=600),
        default=None,
        help="seconds the fake cloud takes per batch (default 0 with python, 2 with wrk)",
    )
    add_json(parser)
    parser.set_defaults(run=serve)


def _add_grouper(bench_commands: Subcommands) -> None:
    parser = bench_commands.add_parser(
        "grouper", help="the pure Grouper's decide throughput and batching vs the minimum"
    )
    add_json(parser)
    parser.add_argument(
        "--requests", type=count(maximum=10_000_000), default=10_000, help="VM requests"
    )
    parser.add_argument(
        "--templates", type=count(maximum=100_000), default=5, help="distinct templates"
    )
    parser.add_argument("--seed", type=seed, default=0, help="fixes the arrivals")
    parser.add_argument(
        "--repeat", type=count(maximum=1000), default=5, help="timed runs; the best is reported"
    )
    parser.set_defaults(run=grouper)


def store(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.store import run_store_bench

    report = run_store_bench(args.url, events=args.events)
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def nodes(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.nodes import bench_nodes
    from fleetledger.adapters.benchmarks.scratch import scratch_database

    with scratch_database(args.url) as scratch:
        report = bench_nodes(
            scratch, nodes=args.nodes, pods=args.pods, clients=args.clients, seconds=args.seconds
        )
    if args.json:
        print_json(report)
    else:
        for key, value in report.items():
            print(f"  {key:<24} {value}")
    return 0


def placement(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.placement import run_placement_bench
    from fleetledger.adapters.benchmarks.scratch import scratch_database

    with scratch_database(args.url) as scratch:
        report = run_placement_bench(scratch, nodes=args.nodes, batch=args.batch)
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def replay(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.replay import run_replay_bench

    report = run_replay_bench(
        args.url, events=args.events, log=args.log_url, page=args.page, seed=args.seed
    )
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def reliability(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.reliability import run_reliability_bench

    report = run_reliability_bench(
        args.url,
        requests=args.requests,
        connection_drops=args.drops,
        outage_seconds=args.outage_seconds,
        fuzz_inputs_per_route=args.fuzz_inputs,
        idle_connections=args.idle_connections,
        seeds=args.seeds,
        partition=args.partition,
    )
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0 if report.passed else 1


def serve(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.serve import run_serve_bench
    from fleetledger.adapters.benchmarks.serve_wrk import run_serve_wrk_bench

    if args.driver == "wrk":
        wrk_report = run_serve_wrk_bench(
            args.url,
            connections=args.clients,
            seconds=args.seconds,
            fake_latency=2.0 if args.fake_latency is None else args.fake_latency,
            runs=args.runs,
        )
        if args.json:
            print_json(wrk_report.to_dict())
        else:
            print(wrk_report.render())
        return 0 if wrk_report.passed else 1
    if args.fake_latency is not None or args.runs != 1:
        raise ValueError("--fake-latency and --runs apply to --driver wrk only")
    report = run_serve_bench(args.url, clients=args.clients, requests=args.requests)
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def shards(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.shards import run_shards_bench

    report = run_shards_bench(
        args.url, nodes=args.nodes, shards=args.shards, passes=args.passes, seed=args.seed
    )
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0 if report.passed else 1


def extender(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.extender import Mix, run_extender_bench

    report = run_extender_bench(
        args.url,
        nodes=args.nodes,
        slots=args.slots,
        clients=args.clients,
        seconds=args.seconds,
        warmup=args.warmup,
        rate=args.rate,
        mix=Mix.parse(args.mix),
        seed=args.seed,
    )
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def grouper(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.grouper import run_grouper_bench

    report = run_grouper_bench(
        requests=args.requests, templates=args.templates, seed=args.seed, repeat=args.repeat
    )
    if args.json:
        print_json(report.to_dict())
        return 0
    target = report.target_requests_per_second
    reasons = ", ".join(f"{reason} {count}" for reason, count in report.seal_reasons)
    print(
        f"grouper decide: {report.requests} requests over {report.templates} templates "
        f"(seed {report.seed}; idle {report.idle_timeout_s:g} s, max {report.max_timeout_s:g} s, "
        f"batch <= {report.max_batch_size})"
    )
    print(
        f"  throughput   {report.requests_per_second:,.0f} requests/s best of {report.repeat} "
        f"(median {report.median_requests_per_second:,.0f}); "
        f"{report.requests_per_second / target:.2f}x the {target:,} /s target "
        f"({'met' if report.meets_target else 'MISSED'})"
    )
    print(
        f"  cloud calls  {report.cloud_calls} for a minimum of {report.min_cloud_calls} "
        f"({report.calls_ratio:.2f}x the minimum); mean batch {report.mean_batch_size:.1f}, "
        f"largest {report.largest_batch}; sealed by {reasons}"
    )
    return 0
