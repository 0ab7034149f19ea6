"""``fleetledger events``: reading the log, and the catalog of the event types it may hold.

``events types`` lists every type registered with the codec (its stored name, schema version and
fields); ``--markdown`` prints the page ``docs/EVENTS.md`` is generated from. ``events tail
--type`` refuses a name that is neither registered nor in the log, naming the registered ones
closest to it: a filter that silently matches nothing (``BatchSealed`` for ``vm.BatchSealed``)
looks exactly like a quiet log.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import json
import types
import typing
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleetledger.adapters.cli.common import print_json, require_database
from fleetledger.adapters.cli.options import (
    MAX_POSITION,
    Subcommands,
    add_json,
    add_url,
    bounded_int,
    name,
    position,
)
from fleetledger.domain.codec import EventType, registered_event_types
from fleetledger.eventstore import EventStore, RecordedEvent, open_store
from fleetledger.eventstore._engine import resolve_url

__all__ = [
    "CODEC_MODULES",
    "EventField",
    "EventTypeInfo",
    "close_matches",
    "event_catalog",
    "Shape",
    "markdown",
    "register",
    "shape_catalog",
    "tail",
    "types_command",
]

CODEC_MODULES: tuple[str, ...] = (
    "fleetledger.domain.codec",
    "fleetledger.adapters.runtime.leadership",
    "fleetledger.adapters.machines.records",
    "fleetledger.adapters.machines.throttled",
    "fleetledger.adapters.placement.workloads",
    "fleetledger.adapters.ipam.aggregate",
    "fleetledger.adapters.nodes.aggregate",
    "fleetledger.adapters.testbeds.aggregates",
)
"""The modules that build an ``EventCodec`` or register events: importing them fills the
registry. ``tests/adapters/test_cli_events.py`` fails when a module doing either is missing."""


@dataclass(frozen=True, slots=True)
class EventField:
    name: str
    type: str
    """The annotation as the codec reads it: ``str``, ``int | None``, ``tuple[str, ...]``."""


@dataclass(frozen=True, slots=True)
class EventTypeInfo:
    """One registered event type: its stored name, schema version, fields and what it records."""

    name: str
    version: int
    fields: tuple[EventField, ...]
    summary: str

    @property
    def context(self) -> str:
        """The part of the name before the event's own (``vm`` of ``vm.BatchSealed``)."""
        return self.name.rpartition(".")[0]


@dataclass(frozen=True, slots=True)
class Shape:
    """A structured value inside events (a dataclass a field holds): its class name and fields."""

    name: str
    fields: tuple[EventField, ...]
    summary: str


def _registry() -> Mapping[str, EventType]:
    """The product's registered event types: a library user's own types (or a test's)
    registered in the same process are theirs to document, not this catalog's."""
    for module in CODEC_MODULES:
        importlib.import_module(module)
    return {
        name: registered
        for name, registered in registered_event_types().items()
        if registered.cls.__module__.startswith("fleetledger.")
    }


def event_catalog() -> tuple[EventTypeInfo, ...]:
    """Every registered event type, by name."""
    return tuple(
        EventTypeInfo(
            name=type_name,
            version=registered.schema_version,
            fields=_fields_of(registered.cls),
            summary=_summary_of(registered.cls),
        )
        for type_name, registered in sorted(_registry().items())
    )


def shape_catalog() -> tuple[Shape, ...]:
    """Every dataclass held, at any depth, by a registered event's fields, by class name."""
    found: dict[type, None] = {}
    pending = [registered.cls for registered in _registry().values()]
    while pending:
        cls = pending.pop()
        for hint in typing.get_type_hints(cls).values():
            for nested in _dataclasses_in(hint):
                if nested not in found:
                    found[nested] = None
                    pending.append(nested)
    return tuple(
        Shape(cls.__name__, _fields_of(cls), _summary_of(cls) + _own_form(cls))
        for cls in sorted(found, key=lambda c: (c.__name__, c.__module__))
    )


def _own_form(cls: type) -> str:
    # A type with its own to_data is stored as that returns, which may differ from its fields.
    if callable(getattr(cls, "to_data", None)):
        return f" Stored as `{cls.__name__}.to_data()` returns it."
    return ""


def _dataclasses_in(hint: object) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    return [found for arg in typing.get_args(hint) for found in _dataclasses_in(arg)]


def _fields_of(cls: type) -> tuple[EventField, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        EventField(field.name, _type_text(hints[field.name])) for field in dataclasses.fields(cls)
    )


def _type_text(hint: object) -> str:
    if hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_text(arg) for arg in args)
    if origin is typing.Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin is not None:
        inner = ", ".join("..." if arg is Ellipsis else _type_text(arg) for arg in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _summary_of(cls: type) -> str:
    """The first sentence of the event's docstring (a dataclass without one gets its signature
    as ``__doc__``: no summary then)."""
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    sentence, dot, _ = paragraph.partition(". ")
    return sentence + ("." if dot else "")


def close_matches(wanted: str, known: Iterable[str], *, limit: int = 5) -> list[str]:
    """The known names ``wanted`` most likely meant: those whose own part (after the context)
    equals it, ignoring case (``BatchSealed`` is ``vm.BatchSealed``); failing that, the closest
    spellings."""
    names = sorted(known)
    own = wanted.rpartition(".")[2].lower()
    same = [n for n in names if n.rpartition(".")[2].lower() == own]
    return (same or difflib.get_close_matches(wanted, names, n=limit, cutoff=0.6))[:limit]


def markdown(catalog: Sequence[EventTypeInfo], shapes: Sequence[Shape]) -> str:
    """``docs/EVENTS.md``: every event type by context, with its version and fields, then the
    shapes its fields hold."""
    contexts: dict[str, list[EventTypeInfo]] = {}
    for info in catalog:
        contexts.setdefault(info.context, []).append(info)
    lines = [
        "# Event types",
        "",
        "<!-- Generated by `fleetledger events types --markdown > docs/EVENTS.md`; do not edit.",
        "     tests/test_docs.py fails when this page and the codec registry differ. -->",
        "",
        f"The log holds {len(catalog)} event types in {len(contexts)} contexts. A type's stored "
        "name never",
        "changes; a change its stored data cannot satisfy gets a new schema version and an "
        "upcaster, so",
        "the version below is the one the code writes and reads. Every event also carries metadata",
        "(`correlation_id`, `causation_id`, `actor`, and `leader_term` for the leader's duties): "
        "see",
        "[ARCHITECTURE.md](ARCHITECTURE.md#the-log).",
        "",
        "`fleetledger events tail --type NAME` (repeatable) filters the log by these names.",
        "",
    ]
    lines += [f"- [`{context}`](#{context})" for context in contexts]
    lines.append("- [shapes inside events](#shapes-inside-events)")
    for context, infos in contexts.items():
        lines += ["", f"## {context}", ""]
        for info in infos:
            lines += [f"### `{info.name}` (v{info.version})", ""]
            if info.summary:
                lines += [info.summary, ""]
            lines += ["| field | type |", "|---|---|"]
            lines += [f"| `{f.name}` | `{_cell(f.type)}` |" for f in info.fields]
            lines.append("")
    lines += [
        "",
        "## Shapes inside events",
        "",
        "The structured values some fields hold, stored as JSON objects of their fields.",
    ]
    for shape in shapes:
        lines += ["", f"### `{shape.name}`", ""]
        if shape.summary:
            lines += [shape.summary, ""]
        lines += ["| field | type |", "|---|---|"]
        lines += [f"| `{f.name}` | `{_cell(f.type)}` |" for f in shape.fields]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def register(commands: Subcommands) -> None:
    events = commands.add_parser("events", help="read the log").add_subparsers(
        dest="events_command", required=True, metavar="ACTION"
    )
    tail_parser = events.add_parser("tail", help="print events in global order")
    add_url(tail_parser)
    add_json(tail_parser)
    tail_parser.add_argument(
        "--after",
        type=position,
        default=None,
        help="start after this global position (default: the last --limit events)",
    )
    tail_parser.add_argument(
        "--limit",
        type=bounded_int(minimum=1, maximum=MAX_POSITION),
        default=20,
        help="without --after: the last N events (of the --type ones) (default 20)",
    )
    tail_parser.add_argument(
        "--type",
        action="append",
        dest="types",
        type=name,
        metavar="TYPE",
        help="only events of this type, e.g. vm.BatchSealed (repeatable; default: every type; "
        "`fleetledger events types` lists them)",
    )
    tail_parser.add_argument(
        "--follow", action="store_true", help="keep printing new events (default: stop at the head)"
    )
    tail_parser.set_defaults(run=tail)

    types_parser = events.add_parser(
        "types", help="list the registered event types, their versions and fields"
    )
    output = types_parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON instead of text")
    output.add_argument(
        "--markdown", action="store_true", help="print the page docs/EVENTS.md is generated from"
    )
    types_parser.set_defaults(run=types_command)


def types_command(args: argparse.Namespace) -> int:
    catalog = event_catalog()
    if args.markdown:
        print(markdown(catalog, shape_catalog()), end="")
    elif args.json:
        print_json([dataclasses.asdict(info) for info in catalog])
    else:
        width = max(len(info.name) for info in catalog)
        for info in catalog:
            fields = ", ".join(field.name for field in info.fields)
            print(f"{info.name:<{width}}  v{info.version}  {fields}")
    return 0


def tail(args: argparse.Namespace) -> int:
    render = _event_json if args.json else _event_line
    require_database(resolve_url(args.url))
    with open_store(args.url) as store:
        if args.types:
            _refuse_unknown_types(store, args.types)
        if args.after is not None:
            position = args.after
        elif args.types:
            position = _before_last_matching(store, args.types, args.limit)
        else:
            position = max(0, store.head() - args.limit)
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


def _before_last_matching(store: EventStore, wanted: Sequence[str], count: int) -> int:
    """The position after which the last ``count`` events of the ``wanted`` types start.

    The log reads forward only; reading just the matching events (the type index serves them)
    costs what the filtered log holds, never the whole log."""
    recent: deque[int] = deque(maxlen=count + 1)
    position = 0
    while page := store.read_all(after=position, limit=1000, types=wanted):
        recent.extend(event.global_position for event in page)
        position = page[-1].global_position
    return recent[0] if len(recent) > count else 0


def _refuse_unknown_types(store: EventStore, wanted: Sequence[str]) -> None:
    """``ValueError`` (a usage error) for the first type neither registered nor in the log.

    A type in the log but not in the registry is still a fine filter: the store's own
    benchmarks and a user's events appended through the library have names of their own."""
    known: Mapping[str, EventTypeInfo] = {info.name: info for info in event_catalog()}
    for type_name in wanted:
        if type_name in known or store.read_all(after=0, limit=1, types=[type_name]):
            continue
        guesses = close_matches(type_name, known)
        hint = f"did you mean {' or '.join(guesses)}? " if guesses else ""
        raise ValueError(
            f"--type {type_name!r} is no registered event type and none is in the log; "
            f"{hint}`fleetledger events types` lists them all"
        )


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
