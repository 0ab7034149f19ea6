"""The ``fleetledger`` command line.

Every command that touches the database takes ``--url``; without it the URL comes from
``FLEETLEDGER_DATABASE_URL``, else the embedded SQLite default (``sqlite:///fleetledger.db``).
Errors print one line saying what to do next and exit non-zero (1 for operational errors,
2 for bad usage, 3 when an audit finds the log tampered with).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any, TypeAlias

import structlog

from fleetledger.adapters.logging import configure_logging
from fleetledger.eventstore import EventStoreError, RecordedEvent, migrate, open_store
from fleetledger.eventstore._engine import DATABASE_URL_ENV, resolve_url

__all__ = ["main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TAMPERED = 3
EXIT_INTERRUPTED = 130

log = structlog.get_logger("cli")
Command = Callable[[argparse.Namespace], int]


def _url(value: str) -> str:
    # An empty --url (an unset shell variable, typically) must not quietly mean the default log.
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"is empty; give a database URL, or leave --url out to use ${DATABASE_URL_ENV}"
        )
    return value


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0-65535")
    return port


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=_url,
        help=f"database URL (default: ${DATABASE_URL_ENV}, else sqlite:///fleetledger.db)",
    )


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetledger",
        description="Event-sourced capacity controller for Kubernetes fleets on Azure.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version('fleetledger')}"
    )
    parser.add_argument("--log-level", help="debug, info, warning or error (default: info)")
    parser.add_argument(
        "--log-json", action="store_true", default=None, help="JSON log lines even on a terminal"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = commands.add_parser("db", help="schema migrations").add_subparsers(
        dest="db_command", required=True, metavar="ACTION"
    )
    upgrade = db.add_parser("upgrade", help="migrate the schema up (default: to head)")
    upgrade.add_argument("--revision", default="head")
    _add_url(upgrade)
    upgrade.set_defaults(run=_db_upgrade)
    downgrade = db.add_parser(
        "downgrade", help="migrate the schema down to --revision (base drops the event log)"
    )
    downgrade.add_argument(
        "--revision",
        required=True,
        help="the revision to go down to, e.g. 0001; 'base' drops every fleetledger table",
    )
    downgrade.add_argument(
        "--yes-drop-events",
        action="store_true",
        help="confirm a downgrade to base that drops a log holding events",
    )
    _add_url(downgrade)
    downgrade.set_defaults(run=_db_downgrade)
    current = db.add_parser("current", help="print the schema revision of the database")
    _add_url(current)
    current.set_defaults(run=_db_current)

    events = commands.add_parser("events", help="read the log").add_subparsers(
        dest="events_command", required=True, metavar="ACTION"
    )
    tail = events.add_parser("tail", help="print events in global order")
    _add_url(tail)
    _add_json(tail)
    tail.add_argument("--after", type=int, default=None, help="start after this global position")
    tail.add_argument("--limit", type=int, default=20, help="without --after: the last N events")
    tail.add_argument("--type", action="append", dest="types", help="only this event type")
    tail.add_argument("--follow", action="store_true", help="keep printing new events")
    tail.set_defaults(run=_events_tail)

    _add_audit(commands)

    bench = commands.add_parser("bench", help="benchmarks printing figures and ratios")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    store = bench_commands.add_parser("store", help="appends and replay against raw psycopg")
    _add_url(store)
    _add_json(store)
    store.add_argument("--events", type=int, default=2000)
    store.set_defaults(run=_bench_store)
    _add_bench_grouper(bench_commands)
    _add_bench_serve(bench_commands)
    _add_bench_nodes(bench_commands)
    _add_bench_placement(bench_commands)
    _add_bench_reliability(bench_commands)
    _add_simulate(commands)
    _add_serve(commands)
    _add_dumpstate(commands)
    _add_extender(commands)

    return parser


Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_audit(commands: Subcommands) -> None:
    audit = commands.add_parser("audit", help="tamper evidence").add_subparsers(
        dest="audit_command", required=True, metavar="ACTION"
    )
    verify = audit.add_parser(
        "verify", help="recompute the hash chain over the log, and check it against an anchor"
    )
    _add_url(verify)
    _add_json(verify)
    verify.add_argument("--after", type=int, default=0)
    verify.add_argument(
        "--anchor",
        type=Path,
        metavar="FILE",
        help="also detect truncation and rewrites (even with recomputed hashes) up to this "
        "anchor's position",
    )
    _add_audit_key(verify, ed25519_help="the Ed25519 public key (PEM) that checks the anchor")
    verify.set_defaults(run=_audit_verify)
    anchor = audit.add_parser(
        "anchor", help="write the log's head, signed, to keep outside the database"
    )
    _add_url(anchor)
    _add_audit_key(anchor, ed25519_help="sign with this Ed25519 private key (PEM, PKCS#8)")
    anchor.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write the anchor here (default: stdout)"
    )
    anchor.set_defaults(run=_audit_anchor)


def _add_audit_key(parser: argparse.ArgumentParser, *, ed25519_help: str) -> None:
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--key-file",
        type=Path,
        metavar="FILE",
        help="HMAC-SHA256 key, at least 32 bytes (default: $FLEETLEDGER_AUDIT_KEY)",
    )
    keys.add_argument("--ed25519-key", type=Path, metavar="FILE", help=ed25519_help)


def _add_extender(commands: Subcommands) -> None:
    extender = commands.add_parser(
        "extender",
        help="the kube-scheduler extender (filter, preempt) for slot testbeds, on its own port",
    )
    _add_url(extender)
    extender.add_argument("--host", default="127.0.0.1")
    extender.add_argument("--port", type=int, default=8081)
    extender.set_defaults(run=_extender)


def _add_dumpstate(commands: Subcommands) -> None:
    dumpstate = commands.add_parser(
        "dumpstate", help="the nodes' and subnets' accounting as JSON, now or as of a position"
    )
    _add_url(dumpstate)
    dumpstate.add_argument(
        "--as-of", type=int, metavar="POSITION", help="replay the log up to this position"
    )
    dumpstate.set_defaults(run=_dumpstate)


def _add_bench_nodes(bench_commands: Subcommands) -> None:
    nodes = bench_commands.add_parser(
        "nodes", help="agent permit requests per second through the HTTP endpoint (Postgres)"
    )
    _add_url(nodes)
    nodes.add_argument("--nodes", type=int, default=100)
    nodes.add_argument("--pods", type=int, default=2000)
    nodes.add_argument("--clients", type=int, default=64)
    nodes.add_argument("--seconds", type=float, default=10.0)
    _add_json(nodes)
    nodes.set_defaults(run=_bench_nodes)


def _add_bench_placement(bench_commands: Subcommands) -> None:
    placement = bench_commands.add_parser(
        "placement", help="planning and end-to-end placements per second over 1,000 nodes"
    )
    _add_url(placement)
    placement.add_argument("--nodes", type=int, default=1000)
    placement.add_argument("--batch", type=int, default=100)
    _add_json(placement)
    placement.set_defaults(run=_bench_placement)


def _add_bench_reliability(bench_commands: Subcommands) -> None:
    reliability = bench_commands.add_parser(
        "reliability",
        help="hostile inputs and database faults against the API: nothing lost or stalled "
        "(exit 1 otherwise)",
    )
    _add_url(reliability)
    reliability.add_argument(
        "--requests", type=int, default=300, help="requests in the faulted bursts (default 300)"
    )
    reliability.add_argument(
        "--drops", type=int, default=2, help="connection cuts on Postgres (default 2)"
    )
    reliability.add_argument(
        "--outage-seconds", type=float, default=2.0, help="how long each cut lasts (default 2)"
    )
    _add_json(reliability)
    reliability.set_defaults(run=_bench_reliability)


def _add_bench_serve(bench_commands: Subcommands) -> None:
    serve = bench_commands.add_parser(
        "serve", help="machine-request POSTs per second through a real `serve` on loopback"
    )
    _add_url(serve)
    serve.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    serve.add_argument("--requests", type=int, default=6000, help="POSTs to time (default 6000)")
    _add_json(serve)
    serve.set_defaults(run=_bench_serve)


def _add_bench_grouper(bench_commands: Subcommands) -> None:
    grouper = bench_commands.add_parser(
        "grouper", help="the pure Grouper's decide throughput and batching vs the minimum"
    )
    _add_json(grouper)
    grouper.add_argument("--requests", type=int, default=10_000)
    grouper.add_argument("--templates", type=int, default=5)
    grouper.add_argument("--seed", type=int, default=0)
    grouper.add_argument("--repeat", type=int, default=5, help="timed runs; the best is reported")
    grouper.set_defaults(run=_bench_grouper)


def _add_simulate(commands: Subcommands) -> None:
    simulate = commands.add_parser(
        "simulate", help="run a scenario on virtual time against the fake cloud and report"
    )
    simulate.add_argument("--scenario", required=True, help="scenario name, e.g. burst-vms")
    simulate.add_argument("--seed", type=int, default=1, help="fixes the whole run (default 1)")
    simulate.add_argument(
        "--compare",
        choices=["naive"],
        help="also run the same arrivals with batching off and print both side by side",
    )
    simulate.add_argument(
        "--url",
        type=_url,
        help=f"log to this database (e.g. Postgres; its schema is upgraded to head first) "
        f"instead of ./{SIMULATION_LOG} (replaced at each run and kept, for `events tail`, "
        "`audit verify`, `dumpstate`)",
    )
    _add_json(simulate)
    simulate.set_defaults(run=_simulate)


def _add_serve(commands: Subcommands) -> None:
    serve = commands.add_parser("serve", help="run the HTTP API with the machines runtime")
    _add_url(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8080)
    serve.add_argument(
        "--cloud",
        choices=["fake", "azure-vm", "aks"],
        default="fake",
        help="fake (default), or a real Azure adapter configured by FLEETLEDGER_AZURE_* env vars",
    )
    serve.add_argument("--grouper", default="default", help="grouper name (one stream per name)")
    serve.add_argument("--idle-timeout", type=float, default=0.5, metavar="SECONDS")
    serve.add_argument("--max-timeout", type=float, default=5.0, metavar="SECONDS")
    serve.add_argument("--max-batch-size", type=int, default=50)
    serve.add_argument(
        "--fake-latency", type=float, default=2.0, metavar="SECONDS", help="fake cloud's latency"
    )
    serve.add_argument(
        "--fake-cloud-file",
        metavar="PATH",
        help="keep the fake cloud in this file, shared by every controller given the same file "
        "(to try failover between controllers)",
    )
    serve.add_argument(
        "--lease-seconds",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a silent leader keeps the lease before another process takes over "
        "(default 10)",
    )
    serve.add_argument(
        "--grace-seconds",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long to finish requests and cloud calls in flight (default 30); "
        "a second SIGTERM exits at once",
    )
    serve.add_argument(
        "--api-token",
        action="append",
        metavar="TOKEN",
        help="a bearer token the API accepts; repeat it to accept several (rotation). "
        "Default: FLEETLEDGER_API_TOKENS, comma-separated (preferred: flags show in `ps`)",
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without tokens on a non-loopback address (anyone who reaches the port can "
        "create VMs)",
    )
    serve.add_argument(
        "--subnet",
        action="append",
        default=[],
        metavar="ID=CAPACITY",
        help="manage pod IPs of this subnet (repeatable), e.g. --subnet aks-pods=1024",
    )
    serve.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB",
        help="a worker pool placement may grow (repeatable), e.g. "
        "--pool general=Standard_D4s_v5:4000:16; workloads need at least one",
    )
    serve.add_argument(
        "--cluster",
        choices=["fake", "kubernetes"],
        default="fake",
        help="where nodes and pods are read from: an empty fake cluster (default), or the "
        "Kubernetes API (in-cluster config, else ~/.kube/config)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=1024 * 1024,
        metavar="BYTES",
        help="larger request bodies get 413 (default 1 MiB)",
    )
    serve.add_argument(
        "--anchor-file",
        type=Path,
        metavar="FILE",
        help="as the leader, keep a signed anchor of the log's head here (replaced atomically), "
        "for `audit verify --anchor`; keep it where the database's writers cannot write",
    )
    serve.add_argument(
        "--anchor-every",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="with --anchor-file: anchor this often (default 300), once elected and at stop",
    )
    _add_audit_key(serve, ed25519_help="with --anchor-file: sign with this Ed25519 private key")
    serve.set_defaults(run=_serve)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_logging(level=args.log_level, json_output=args.log_json)
    except ValueError as e:
        parser.error(str(e))
    run: Command = args.run
    try:
        return run(args)
    except EventStoreError as e:
        print(f"fleetledger: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as e:
        print(f"fleetledger: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _db_upgrade(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    migrate.upgrade(url, args.revision)
    print(f"schema at {migrate.current_revision(url)}")
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    _db_must_exist(url)
    migrate.downgrade(url, args.revision, drop_events=args.yes_drop_events)
    print(f"schema at {migrate.current_revision(url) or 'base (empty)'}")
    return 0


def _db_must_exist(url: str) -> None:
    """Refuse a SQLite file that does not exist: opening it would create an empty database."""
    from fleetledger.eventstore._engine import normalise_url

    parsed = normalise_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    if parsed.database.startswith("file:") or Path(parsed.database).exists():
        return
    from fleetledger.eventstore import StoreUnavailable

    raise StoreUnavailable(
        f"the database {parsed.database!r} does not exist; check --url, or create it with: "
        f"fleetledger db upgrade --url '{url}'"
    )


def _db_current(args: argparse.Namespace) -> int:
    _db_must_exist(resolve_url(args.url))
    revision = migrate.current_revision(resolve_url(args.url))
    head = migrate.head_revision()
    if revision is None:
        print(f"empty (head is {head}); run: fleetledger db upgrade")
    else:
        print(f"{revision}{' (head)' if revision == head else f' (head is {head})'}")
    return 0


def _event_line(event: RecordedEvent) -> str:
    body = json.dumps(event.data, separators=(",", ":"), sort_keys=True)
    return (
        f"{event.global_position:>8}  {event.recorded_at.isoformat(timespec='milliseconds')}  "
        f"{event.stream_id}@{event.stream_version}  {event.type}  {body}"
    )


def _event_json(event: RecordedEvent) -> str:
    return json.dumps(
        {
            "global_position": event.global_position,
            "stream_id": event.stream_id,
            "stream_version": event.stream_version,
            "event_id": str(event.event_id),
            "type": event.type,
            "schema_version": event.schema_version,
            "data": event.data,
            "metadata": event.metadata,
            "recorded_at": event.recorded_at.isoformat(),
            "hash": event.hash,
        },
        separators=(",", ":"),
    )


def _events_tail(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ValueError("--limit must be at least 1")
    render = _event_json if args.json else _event_line
    _db_must_exist(resolve_url(args.url))
    with open_store(args.url) as store:
        position = args.after if args.after is not None else max(0, store.head() - args.limit)
        while True:
            seen = store.wake_sequence()
            page = store.read_all(after=position, limit=1000, types=args.types)
            for event in page:
                print(render(event), flush=True)
            if page:
                position = page[-1].global_position
                continue
            if not args.follow:
                return 0
            store.wait_for_wake(seen, timeout=1.0)


def _audit_verify(args: argparse.Namespace) -> int:
    from fleetledger.eventstore.anchors import check_anchor, read_anchor

    anchor = read_anchor(args.anchor) if args.anchor is not None else None
    verifier = _audit_verifier(args) if anchor is not None else None
    _db_must_exist(resolve_url(args.url))
    with open_store(args.url) as store:
        head = store.head()

        def progress(checked: int, last: int) -> None:
            log.info("verifying hash chain", checked=checked, position=last, head=head)

        report = store.verify(after=args.after, progress=progress)
        checked = (
            check_anchor(store, anchor, verifier)
            if anchor is not None and verifier is not None
            else None
        )
    ok = report.ok and (checked is None or checked.ok)
    if args.json:
        _print_json(
            {
                "ok": ok,
                "checked": report.checked,
                "first_bad_position": report.first_bad_position,
                "last_position": report.last_position,
                "reason": report.reason,
                "anchor": None
                if checked is None
                else {"ok": checked.ok, "position": checked.position, "reason": checked.reason},
            }
        )
    elif not report.ok:
        print(
            f"TAMPERED: first bad position {report.first_bad_position} ({report.reason}); "
            f"{report.checked} events before it verified. Restore from backup or investigate "
            "who wrote to the events table outside fleetledger.",
            file=sys.stderr,
        )
    elif checked is not None and not checked.ok:
        print(
            f"TAMPERED: {checked.reason}. Restore from backup or investigate who wrote to the "
            "events table outside fleetledger.",
            file=sys.stderr,
        )
    else:
        print(f"ok: {report.checked} events verified up to position {report.last_position}")
        if checked is not None:
            print(f"ok: the log holds the anchored head {checked.position} unchanged")
        else:
            print(
                "  without --anchor a deleted tail or a rewrite with recomputed hashes goes "
                "unnoticed; see `fleetledger audit anchor`"
            )
    return 0 if ok else EXIT_TAMPERED


def _audit_verifier(args: argparse.Namespace) -> Any:
    from fleetledger.eventstore.anchors import Ed25519Verifier, hmac_key_from

    if args.ed25519_key is not None:
        return Ed25519Verifier(_audit_key_bytes(args.ed25519_key))
    return hmac_key_from(args.key_file)


def _audit_key_bytes(path: Path) -> bytes:
    from fleetledger.eventstore.anchors import AnchorError

    try:
        return path.read_bytes()
    except OSError as e:
        raise AnchorError(f"cannot read the key file {str(path)!r}: {e.strerror}") from e


def _audit_anchor(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from fleetledger.eventstore.anchors import (
        Ed25519Signer,
        Signer,
        hmac_key_from,
        make_anchor,
        record_anchor,
    )

    signer: Signer = (
        Ed25519Signer(_audit_key_bytes(args.ed25519_key))
        if args.ed25519_key is not None
        else hmac_key_from(args.key_file)
    )
    _db_must_exist(resolve_url(args.url))
    with open_store(args.url) as store:
        at = datetime.now(UTC)
        if args.output is None:
            print(make_anchor(store, signer, at=at).to_json())
            return 0
        anchor = record_anchor(store, signer, args.output, at=at)
    print(f"anchored position {anchor.position} in {args.output}", file=sys.stderr)
    return 0


def _bench_store(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.store import run_store_bench

    report = run_store_bench(args.url, events=args.events)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def _extender(args: argparse.Namespace) -> int:
    import uvicorn

    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.extender.server import create_extender_app
    from fleetledger.adapters.testbeds.service import TestbedsService

    with open_store(args.url) as store:
        # Answers come from the testbeds' streams as this process folds them; reservations are
        # appended with expected versions, so any number of extenders may serve one scheduler.
        service = TestbedsService(store, clock=SystemClock())
        log.info("serving the scheduler extender", url=f"http://{args.host}:{args.port}")
        uvicorn.run(create_extender_app(service), host=args.host, port=args.port, log_config=None)
    return 0


def _dumpstate(args: argparse.Namespace) -> int:
    from fleetledger.projections.dumpstate import dumpstate_at
    from fleetledger.projections.nodes import dump_json

    with open_store(args.url) as store:
        print(dump_json(dumpstate_at(store, args.as_of)))
    return 0


def _bench_nodes(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.nodes import bench_nodes
    from fleetledger.adapters.benchmarks.scratch import scratch_database

    with scratch_database(args.url) as scratch:
        report = bench_nodes(
            scratch, nodes=args.nodes, pods=args.pods, clients=args.clients, seconds=args.seconds
        )
    if args.json:
        _print_json(report)
    else:
        for key, value in report.items():
            print(f"  {key:<24} {value}")
    return 0


def _bench_placement(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.placement import run_placement_bench
    from fleetledger.adapters.benchmarks.scratch import scratch_database

    with scratch_database(args.url) as scratch:
        report = run_placement_bench(scratch, nodes=args.nodes, batch=args.batch)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def _bench_reliability(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.reliability import run_reliability_bench

    report = run_reliability_bench(
        args.url,
        requests=args.requests,
        connection_drops=args.drops,
        outage_seconds=args.outage_seconds,
    )
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return 0 if report.passed else 1


def _bench_serve(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.serve import run_serve_bench

    report = run_serve_bench(args.url, clients=args.clients, requests=args.requests)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def _bench_grouper(args: argparse.Namespace) -> int:
    from fleetledger.adapters.benchmarks.grouper import run_grouper_bench

    report = run_grouper_bench(
        requests=args.requests, templates=args.templates, seed=args.seed, repeat=args.repeat
    )
    if args.json:
        _print_json(report.to_dict())
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


SIMULATION_LOG = "fleetledger-sim.db"
"""Where ``simulate`` keeps its log without ``--url``: replaced by each run, kept afterwards."""


def _simulate(args: argparse.Namespace) -> int:
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
        _print_json({**report.to_dict(), "log_url": url} if writes_log else report.to_dict())
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


def _serve(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import uvicorn

    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.http import ApiTokens, create_app
    from fleetledger.adapters.http.auth import check_exposure
    from fleetledger.adapters.http.limits import checked_max_body_bytes
    from fleetledger.adapters.machines import (
        CloudNotConfigured,
        CoordinatorOptions,
        MachinesRuntime,
        build_cloud,
    )
    from fleetledger.adapters.runtime.leadership import Leadership, lease_for
    from fleetledger.domain.errors import InvalidCommand
    from fleetledger.domain.machines import GrouperConfig

    try:
        config = GrouperConfig(
            idle_timeout=timedelta(seconds=args.idle_timeout),
            max_timeout=timedelta(seconds=args.max_timeout),
            max_batch_size=args.max_batch_size,
        )
        clock = SystemClock()
        choice = build_cloud(
            args.cloud,
            clock=clock,
            fake_latency=args.fake_latency,
            fake_state=args.fake_cloud_file,
        )
        lease = lease_for(resolve_url(args.url), lease_seconds=args.lease_seconds)
        tokens = ApiTokens(args.api_token) if args.api_token else ApiTokens.from_env()
        check_exposure(args.host, tokens, allow_open=args.insecure_no_auth)
        max_body_bytes = checked_max_body_bytes(args.max_body_bytes)
        subnets = [_subnet(spec) for spec in args.subnet]
        pools = [_pool(spec) for spec in args.pool]
        anchor_signer = _serve_anchor_signer(args)
    except (CloudNotConfigured, InvalidCommand, ValueError) as e:
        print(f"fleetledger: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        listener = _serve_bind(args.host, args.port)
    except OSError as e:
        choice.close()
        print(
            f"fleetledger: error: cannot listen on {args.host}:{args.port}: {e.strerror or e}; "
            "choose another --port or stop the process using it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        store = open_store(args.url)
    except BaseException:
        listener.close()
        choice.close()
        raise
    try:
        leadership = Leadership(
            store, lease, clock=clock, check_interval=max(0.2, args.lease_seconds / 5)
        )
        runtime = MachinesRuntime(
            store,
            choice.cloud,
            clock=clock,
            config=config,
            grouper_name=args.grouper,
            coordinator_options=CoordinatorOptions(dispatch_mode=choice.dispatch_mode),
            leadership=leadership,
            stop_timeout=args.grace_seconds,
        )
        # Before the other capabilities start anything: an anchor file this key cannot verify
        # stops the command here.
        anchoring = _serve_anchoring(args, anchor_signer, store, leadership, clock)
        log.info(
            "serving machine requests",
            url=f"http://{args.host}:{args.port}",
            cloud=choice.description,
            log=store,
            holder=leadership.holder,
            auth=f"{len(tokens)} bearer token(s)" if tokens else "none (open API)",
        )
        capabilities = _capabilities(
            store, leadership, clock, runtime, subnets=subnets, pools=pools, cluster=args.cluster
        )
        if anchoring is not None:
            # First among the companions, so stopped last: its stop-time anchor follows the
            # other runtimes' last appends, while this process still leads.
            capabilities.runtimes.insert(0, anchoring)
        server = _GracefulServer(
            uvicorn.Config(
                create_app(
                    runtime,
                    manage_runtime=True,
                    api_tokens=tokens,
                    max_body_bytes=max_body_bytes,
                    routers=capabilities.routers,
                    companions=capabilities.runtimes,
                ),
                host=args.host,
                port=args.port,
                timeout_graceful_shutdown=max(1, int(args.grace_seconds)),
                log_config=None,
            )
        )
        server.run(listener)
    finally:
        listener.close()
        store.close()
        choice.close()
    return 0


def _serve_anchor_signer(args: argparse.Namespace) -> Any:
    """The key ``serve`` signs anchors with, or None without ``--anchor-file``; ValueError
    (AnchorError) for a key that is missing or unusable, before anything starts."""
    from fleetledger.adapters.anchoring import checked_anchor_period
    from fleetledger.eventstore.anchors import Ed25519Signer, hmac_key_from

    if args.anchor_file is None:
        if args.key_file is not None or args.ed25519_key is not None:
            raise ValueError("--key-file and --ed25519-key sign anchors: give --anchor-file too")
        return None
    checked_anchor_period(args.anchor_every)
    if args.ed25519_key is not None:
        return Ed25519Signer(_audit_key_bytes(args.ed25519_key))
    return hmac_key_from(args.key_file)


def _serve_anchoring(
    args: argparse.Namespace, signer: Any, store: Any, leadership: Any, clock: Any
) -> Any:
    """The recorder anchoring the log on the leader, or None without ``--anchor-file``."""
    if signer is None:
        return None
    from fleetledger.adapters.anchoring import AnchorRecorder

    return AnchorRecorder(
        store,
        signer,
        args.anchor_file,
        clock=clock,
        every_seconds=args.anchor_every,
        leadership=leadership,
    )


def _serve_bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a taken port fails the command
    before the runtime takes the lease or touches the cloud."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except BaseException:
        listener.close()
        raise
    return listener


def _subnet(spec: str) -> tuple[str, int]:
    subnet_id, _, capacity = spec.partition("=")
    if not subnet_id or not capacity.isdigit() or int(capacity) < 1:
        raise ValueError(f"--subnet takes ID=CAPACITY with a positive capacity, not {spec!r}")
    return subnet_id, int(capacity)


@dataclass(frozen=True, slots=True)
class _Capabilities:
    runtimes: list[Any]
    routers: list[Any]


def _pool(spec: str) -> Any:
    from fleetledger.domain.placement import Pool
    from fleetledger.domain.template import MachineTemplate

    name, _, shape = spec.partition("=")
    parts = shape.split(":")
    if not name or len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(
            f"--pool takes NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB, e.g. "
            f"general=Standard_D4s_v5:4000:16, not {spec!r}"
        )
    return Pool(
        name=name,
        template=MachineTemplate(vm_size=parts[0]),
        worker_cpu_milli=int(parts[1]),
        worker_memory_bytes=int(parts[2]) << 30,
    )


def _capabilities(
    store: Any,
    leadership: Any,
    clock: Any,
    machines: Any,
    *,
    subnets: list[tuple[str, int]],
    pools: list[Any],
    cluster: str,
) -> _Capabilities:
    """The runtimes and routes served beside the machines API, on the process's leadership."""
    from fleetledger.adapters.heap import FrozenStartupHeap
    from fleetledger.adapters.http.agents import agents_router
    from fleetledger.adapters.http.subnets import subnets_router
    from fleetledger.adapters.ipam import InMemoryAllocator, IpamRuntime
    from fleetledger.adapters.nodes import NodesRuntime

    allocator = InMemoryAllocator()
    for subnet_id, capacity in subnets:
        allocator.add_subnet(subnet_id, capacity)
    ipam = IpamRuntime(
        store, allocator, clock=clock, leadership=leadership, manage_leadership=False
    )
    nodes = NodesRuntime(
        store, _cluster(cluster), clock=clock, leadership=leadership, manage_leadership=False
    )
    runtimes: list[Any] = [nodes, ipam, _ConfiguredSubnets(ipam, subnets)]
    routers: list[Any] = [agents_router(nodes), subnets_router(ipam)]
    if pools:
        from fleetledger.adapters.http.workloads import workloads_router
        from fleetledger.adapters.placement import PlacementRuntime

        placement = PlacementRuntime(
            store, nodes.service, pools, machines=machines.service, clock=clock,
            leadership=leadership,
        )  # fmt: skip
        runtimes.append(placement)
        routers.append(workloads_router(placement))
    # Last, so that it freezes what every runtime loaded at start-up.
    runtimes.append(FrozenStartupHeap())
    return _Capabilities(runtimes=runtimes, routers=routers)


def _cluster(kind: str) -> Any:
    if kind == "fake":
        from fleetledger.adapters.cluster import FakeCluster

        return FakeCluster()
    from kubernetes import client, config

    from fleetledger.adapters.kubernetes import KubernetesCluster

    # The kubernetes client is untyped; these only read the service account or ~/.kube/config.
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return KubernetesCluster(client.ApiClient()).start()


@dataclass(frozen=True, slots=True)
class _ConfiguredSubnets:
    """Records the subnets given on the command line once the subnet runtime runs (creating a
    subnet again with the same capacity changes nothing)."""

    ipam: Any
    subnets: list[tuple[str, int]]

    def start(self) -> None:
        for subnet_id, capacity in self.subnets:
            self.ipam.service.create(subnet_id, capacity)

    def stop(self) -> None:
        return None


class _GracefulServer:
    """uvicorn's server, where a second SIGTERM or Ctrl-C exits at once.

    The first signal is uvicorn's graceful shutdown: stop accepting, finish the requests in
    flight, then the app's shutdown stops the runtime (seal, finish cloud calls within the grace
    period, answer waiting callers, release the lease). An operator who sends another signal
    wants out now; the log keeps everything acknowledged, and the next leader resumes it.
    """

    def __init__(self, config: Any) -> None:
        import uvicorn

        outer = self

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                if self.should_exit:
                    outer.exit_now(sig)
                super().handle_exit(sig, frame)

        self._server = Server(config)

    def exit_now(self, sig: int) -> None:
        log.warning("second signal: exiting at once; the next leader resumes the work", signal=sig)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def run(self, listener: socket.socket) -> None:
        # uvicorn re-raises the signal it stopped on once it has shut down, to end the process
        # the default way; a SIGTERM that was handled gracefully is a clean exit (status 0).
        previous = signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            self._server.run(sockets=[listener])
        finally:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
