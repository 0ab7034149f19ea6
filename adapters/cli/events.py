"""``fleetledger events``: reading the log."""

from __future__ import annotations

import argparse
import json

from fleetledger.adapters.cli.common import require_database
from fleetledger.adapters.cli.options import (
    MAX_POSITION,
    Subcommands,
    add_json,
    add_url,
    bounded_int,
    name,
    position,
)
from fleetledger.eventstore import RecordedEvent, open_store
from fleetledger.eventstore._engine import resolve_url

__all__ = ["register", "tail"]


def register(commands: Subcommands) -> None:
    events = commands.add_parser("events", help="read the log").add_subparsers(
        dest="events_command", required=True, metavar="ACTION"
    )
    tail_parser = events.add_parser("tail", help="print events in global order")
    add_url(tail_parser)
    add_json(tail_parser)
    tail_parser.add_argument(
        "--after", type=position, default=None, help="start after this global position"
    )
    tail_parser.add_argument(
        "--limit",
        type=bounded_int(minimum=1, maximum=MAX_POSITION),
        default=20,
        help="without --after: the last N events (default 20)",
    )
    tail_parser.add_argument(
        "--type", action="append", dest="types", type=name, help="only this event type"
    )
    tail_parser.add_argument("--follow", action="store_true", help="keep printing new events")
    tail_parser.set_defaults(run=tail)


def tail(args: argparse.Namespace) -> int:
    render = _event_json if args.json else _event_line
    require_database(resolve_url(args.url))
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
