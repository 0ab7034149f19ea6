"""The log ``fleetledger bench replay`` replays: every capability's events, as many as asked for.

Each of the simulator's per-capability scenarios (:data:`~fleetledger.adapters.simulator.all.
SCENARIOS`: machine requests, placement workloads on nodes, subnets, node restarts, testbeds) runs
once with one seed on a scratch SQLite log of its own, through the same runtime ``serve`` runs, so
every event is one the real aggregates decided and the real codecs encoded. Those few thousand
events, the scenarios' logs merged evenly (each in its own order), are then copied onto the
benchmark's log, copy after copy, each under names of its own, in commits of a few thousand events
until the log holds the events asked for: one run of the scenarios costs seconds, a million
events of them a minute or two.

A copy renames every entity, not just its streams, so that each copy is a fleet of its own to
every read model: ``node-cpu-000`` becomes ``node-c7-cpu-000`` and a data field naming the
stream's entity (a ``NodeJoined``'s ``node``, a workload's ``workload_id``) follows; the grouper
label ``sim-batched-1-0`` becomes ``c7-sim-batched-1-0``, whose grouper and batch streams are
exactly the renamed ones. Leader terms are left out of the copies: the restart scenario's terms
rise within one copy and would be fenced when the next copy starts again at term 1.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetledger.eventstore import (
    ANY,
    EventStore,
    NewEvent,
    StreamAppend,
    canonical_json,
    open_store,
)
from fleetledger.eventstore._encoding import LEADER_TERM_KEY

__all__ = [
    "GeneratedLog",
    "Template",
    "copy_of",
    "generate_log",
    "record_scenarios",
]

_GROUPER_LABEL = "grouper"
# The streams whose category holds a dash; every other category ends at the first dash.
_CATEGORIES = ("batch-job-",)
_TRANSACTION_EVENTS = 5000
"""Events per ``append_many``: large enough that a commit costs little per event, small enough
that one transaction stays a few megabytes."""


@dataclass(frozen=True, slots=True)
class Template:
    """One event of a scenario's log, ready to be copied under other names."""

    category: str
    """What the stream id starts with (``node-``); the entity's name follows."""
    entity: str
    type: str
    schema_version: int
    data: Mapping[str, Any]
    data_json: str
    metadata: Mapping[str, Any]
    renamed_fields: tuple[str, ...]
    """Top-level data fields whose value is the entity's name, renamed with it."""


@dataclass(frozen=True, slots=True)
class GeneratedLog:
    """What :func:`generate_log` appended."""

    events: int
    copies: int
    template_events: int
    seconds: float


def record_scenarios(
    *, seed: int = 1, scenarios: Sequence[str] | None = None, folder: Path | None = None
) -> list[Template]:
    """Run each of ``scenarios`` (default: every capability's) once with ``seed`` on a scratch
    log of its own; their events as templates, interleaved."""
    from fleetledger.adapters.simulator.all import SCENARIOS

    names = tuple(SCENARIOS if scenarios is None else scenarios)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; pick from {', '.join(SCENARIOS)}")
    logs: list[list[Template]] = []
    with tempfile.TemporaryDirectory(prefix="fleetledger-replay-", dir=folder) as scratch:
        for name in names:
            url = f"sqlite:///{Path(scratch) / name}.db"
            _run_scenario(name, seed, url)
            with open_store(url) as store:
                logs.append(_templates_of(store))
    return _interleaved(logs)


def _interleaved(logs: Sequence[Sequence[Template]]) -> list[Template]:
    """The logs' events merged evenly, each log's in its own order: every part of a copy holds
    every capability, as a controller running them all writes its log. The scenarios' streams
    are disjoint, so no log's events depend on another's order."""
    keyed = [
        ((index + 1) / len(log), which, template)
        for which, log in enumerate(logs)
        for index, template in enumerate(log)
    ]
    keyed.sort(key=lambda entry: entry[:2])
    return [template for _, _, template in keyed]


def _run_scenario(name: str, seed: int, url: str) -> None:
    from fleetledger.adapters.simulator.placement import run_placement_scenario
    from fleetledger.adapters.simulator.restart import run_restart_scenario
    from fleetledger.adapters.simulator.runner import run_scenario
    from fleetledger.adapters.simulator.scenario_file import ScenarioFile
    from fleetledger.adapters.simulator.subnet import run_subnet_scenario
    from fleetledger.adapters.simulator.testbed import run_testbed_scenario

    file = ScenarioFile.defaults()
    if name == "burst-vms":
        run_scenario(name, seed=seed, url=url, definition=file.burst_vms)
    elif name == "burst-workloads":
        run_placement_scenario(seed, compare_naive=False, url=url, settings=file.placement)
    elif name == "subnet":
        run_subnet_scenario(seed, url=url, **file.subnet.kwargs())
    elif name == "restart":
        run_restart_scenario(seed, file.restart, url=url)
    else:
        run_testbed_scenario(seed, url=url)


def _templates_of(store: EventStore) -> list[Template]:
    templates: list[Template] = []
    after = 0
    while page := store.read_all(after=after, limit=5000):
        for record in page:
            category, entity = _split(record.stream_id)
            templates.append(
                Template(
                    category=category,
                    entity=entity,
                    type=record.type,
                    schema_version=record.schema_version,
                    data=record.data,
                    data_json=canonical_json(record.data, what="data"),
                    metadata={k: v for k, v in record.metadata.items() if k != LEADER_TERM_KEY},
                    renamed_fields=tuple(k for k, v in record.data.items() if v == entity),
                )
            )
        after = page[-1].global_position
    return templates


def _split(stream_id: str) -> tuple[str, str]:
    for category in _CATEGORIES:
        if stream_id.startswith(category):
            return category, stream_id[len(category) :]
    category, dash, entity = stream_id.partition("-")
    return (category + dash, entity) if dash else ("", stream_id)


def copy_of(templates: Sequence[Template], tag: str) -> list[StreamAppend]:
    """The templates as appends under names tagged ``tag``: one per run of consecutive events
    of a stream, in the templates' order (their streams' versions are kept)."""
    appends: list[StreamAppend] = []
    run: list[NewEvent] = []
    stream = ""
    for template in templates:
        renamed = f"{tag}-{template.entity}"
        stream_id = template.category + renamed
        if stream_id != stream and run:
            appends.append(StreamAppend(stream, run, expected_version=ANY))
            run = []
        stream = stream_id
        run.append(_copied(template, tag, renamed))
    if run:
        appends.append(StreamAppend(stream, run, expected_version=ANY))
    return appends


def _copied(template: Template, tag: str, renamed: str) -> NewEvent:
    data, data_json = template.data, template.data_json
    if template.renamed_fields:
        data = {**data, **dict.fromkeys(template.renamed_fields, renamed)}
        data_json = canonical_json(data, what="data")
    metadata = template.metadata
    grouper = metadata.get(_GROUPER_LABEL)
    if isinstance(grouper, str):
        metadata = {**metadata, _GROUPER_LABEL: f"{tag}-{grouper}"}
    return NewEvent(
        template.type,
        data,
        metadata=metadata,
        schema_version=template.schema_version,
        data_json=data_json,
    )


def generate_log(
    url: str,
    *,
    events: int,
    seed: int = 1,
    scenarios: Sequence[str] | None = None,
    templates: Sequence[Template] | None = None,
    progress: Callable[[str], None] | None = None,
) -> GeneratedLog:
    """Append copies of every scenario's events to the log at ``url`` until it holds at least
    ``events`` events (the last copy is cut short); nothing if it already does. The copies are
    of ``templates`` when given, else of what :func:`record_scenarios` records."""
    say = progress or (lambda line: None)
    began = time.perf_counter()
    with open_store(url) as store:
        held = _count(store)
        if held >= events:
            return GeneratedLog(events=0, copies=0, template_events=0, seconds=0.0)
        if templates is None:
            say(f"running the simulator's scenarios once (seed {seed}) for the events to copy")
            templates = record_scenarios(seed=seed, scenarios=scenarios)
        if not templates:
            raise ValueError("the scenarios recorded no events; pick others")
        say(f"{len(templates):,} events per copy; appending {events - held:,} events")
        # A run's own prefix keeps a log topped up twice free of clashing names.
        run = uuid.uuid4().hex[:4]
        appended, copies, reported = 0, 0, 0
        while held + appended < events:
            copy = copy_of(templates[: events - held - appended], f"c{run}{copies}")
            copies += 1
            for transactions in _commits(copy):
                _append(store, transactions)
                appended += sum(len(a.events) for t in transactions for a in t)
            if appended - reported >= 100_000 or held + appended >= events:
                reported = appended
                rate = appended / (time.perf_counter() - began)
                say(f"  {held + appended:,} of {events:,} events ({rate:,.0f}/s)")
    seconds = time.perf_counter() - began
    say(f"  {held + appended:,} events in the log ({seconds:.1f} s)")
    return GeneratedLog(
        events=appended, copies=copies, template_events=len(templates), seconds=seconds
    )


def _commits(appends: Sequence[StreamAppend]) -> list[list[list[StreamAppend]]]:
    """``appends`` in order, as commits of about :data:`_TRANSACTION_EVENTS` events, each a list
    of transactions in which no stream appears twice (``append_many`` refuses that)."""
    commits: list[list[list[StreamAppend]]] = []
    transactions: list[list[StreamAppend]] = []
    transaction: list[StreamAppend] = []
    streams: set[str] = set()
    size = 0
    for append in appends:
        if append.stream_id in streams:
            transactions.append(transaction)
            transaction, streams = [], set()
        transaction.append(append)
        streams.add(append.stream_id)
        size += len(append.events)
        if size >= _TRANSACTION_EVENTS:
            commits.append([*transactions, transaction])
            transactions, transaction, streams, size = [], [], set(), 0
    if transaction:
        commits.append([*transactions, transaction])
    return commits


def _append(store: EventStore, transactions: Sequence[Sequence[StreamAppend]]) -> None:
    """One commit of ``transactions``, in order; an error if any was refused."""
    for outcome in store.append_each(transactions):
        if isinstance(outcome, Exception):
            raise outcome


def _count(store: EventStore) -> int:
    """How many events the log holds (its positions may have gaps)."""
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT count(*) FROM events").scalar() or 0)
