"""The ``fleetledger`` command line.

Every command that touches the database takes ``--url``; without it the URL comes from
``FLEETLEDGER_DATABASE_URL``, else the embedded SQLite default (``sqlite:///fleetledger.db``).
Errors print one line saying what to do next and exit non-zero (1 for operational errors,
2 for bad usage, 3 when an audit finds the log tampered with).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from adapters.logging import configure_logging
from eventstore import EventStoreError, RecordedEvent, open_store
from eventstore import migrate
from eventstore._engine import DATABASE_URL_ENV, resolve_url

__all__ = ["main"]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_TAMPERED = 3

log = structlog.get_logger("cli")
Command = Callable[[argparse.Namespace], int]


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help=f"database URL (default: ${DATABASE_URL_ENV}, else sqlite:///fleetledger.db)",
    )


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetledger",
        description="Event-sourced capacity controller for Kubernetes fleets on Azure.",
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
    downgrade = db.add_parser("downgrade", help="migrate the schema down (default: to base)")
    downgrade.add_argument("--revision", default="base")
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

    audit = commands.add_parser("audit", help="tamper evidence").add_subparsers(
        dest="audit_command", required=True, metavar="ACTION"
    )
    verify = audit.add_parser("verify", help="recompute the hash chain over the log")
    _add_url(verify)
    _add_json(verify)
    verify.add_argument("--after", type=int, default=0)
    verify.set_defaults(run=_audit_verify)

    bench = commands.add_parser("bench", help="benchmarks printing figures and ratios")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    store = bench_commands.add_parser("store", help="appends and replay against raw psycopg")
    _add_url(store)
    _add_json(store)
    store.add_argument("--events", type=int, default=2000)
    store.set_defaults(run=_bench_store)

    demo = commands.add_parser(
        "demo", help="create the schema, append and replay a sample, verify the chain"
    )
    _add_url(demo)
    demo.set_defaults(run=_demo)
    return parser


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
        return 130


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _db_upgrade(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    migrate.upgrade(url, args.revision)
    print(f"schema at {migrate.current_revision(url)}")
    return 0


def _db_downgrade(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    migrate.downgrade(url, args.revision)
    print(f"schema at {migrate.current_revision(url) or 'base (empty)'}")
    return 0


def _db_current(args: argparse.Namespace) -> int:
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
    with open_store(args.url) as store:
        head = store.head()

        def progress(checked: int, last: int) -> None:
            log.info("verifying hash chain", checked=checked, position=last, head=head)

        report = store.verify(after=args.after, progress=progress)
    if args.json:
        _print_json(
            {
                "ok": report.ok,
                "checked": report.checked,
                "first_bad_position": report.first_bad_position,
                "last_position": report.last_position,
                "reason": report.reason,
            }
        )
    elif report.ok:
        print(f"ok: {report.checked} events verified up to position {report.last_position}")
    else:
        print(
            f"TAMPERED: first bad position {report.first_bad_position} ({report.reason}); "
            f"{report.checked} events before it verified. Restore from backup or investigate "
            "who wrote to the events table outside fleetledger.",
            file=sys.stderr,
        )
    return 0 if report.ok else EXIT_TAMPERED


def _bench_store(args: argparse.Namespace) -> int:
    from adapters.benchmarks.store import run_store_bench

    report = run_store_bench(args.url, events=args.events)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from eventstore import NO_STREAM, NewEvent

    url = resolve_url(args.url)
    migrate.upgrade(url)
    with open_store(url) as store:
        stream = f"demo-{store.head() + 1}"
        store.append(
            stream,
            [
                NewEvent("MachineRequested", {"machine_name": "m-a", "vm_size": "Standard_D4s_v5"}),
                NewEvent("MachineRequested", {"machine_name": "m-b", "vm_size": "Standard_D4s_v5"}),
                NewEvent("BatchSealed", {"machines": ["m-a", "m-b"], "reason": "idle"}),
            ],
            expected_version=NO_STREAM,
        )
        for event in store.read_stream(stream):
            print(_event_line(event))
        report = store.verify()
        print(f"log head {store.head()}; hash chain ok={report.ok} over {report.checked} events")
    return 0 if report.ok else EXIT_TAMPERED


if __name__ == "__main__":
    raise SystemExit(main())
