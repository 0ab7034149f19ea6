"""``fleetledger explain ID``: why something happened — the causal chain of a machine request,
workload, batch, machine or node, pod, job or scheduling, from the originating request through
every decision to the outcome (:mod:`fleetledger.projections.explain`)."""

from __future__ import annotations

import argparse

from fleetledger.adapters.cli.common import print_json, require_database
from fleetledger.adapters.cli.options import Subcommands, add_json, add_url, name
from fleetledger.eventstore import open_store
from fleetledger.eventstore._engine import resolve_url

__all__ = ["register", "run"]


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "explain",
        help="the causal chain of an id, from the originating request to the outcome",
        description="Print every event of the log on the way from the request that started it "
        "to the outcome of ID, one line each (position, time, type, stream, step, key fields, "
        "the event its causation names). ID is a machine request id, workload id, batch id, "
        "machine or node name, pod name, job or scheduling name.",
    )
    parser.add_argument("id", type=name, metavar="ID", help="the id to explain")
    add_url(parser)
    add_json(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.projections.explain import UnknownId, explain

    require_database(resolve_url(args.url))
    with open_store(args.url) as store:
        try:
            explanation = explain(store, args.id)
        except UnknownId as e:
            # Bad input, as a flag's value would be: one line, exit 2 (see main).
            raise ValueError(str(e)) from e
    if args.json:
        print_json(explanation.to_dict())
    else:
        for line in explanation.lines():
            print(line)
    return 0
