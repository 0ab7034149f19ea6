"""``fleetledger dumpstate``: the nodes' and subnets' accounting as JSON, now or as of a
position in the log."""

from __future__ import annotations

import argparse

from fleetledger.adapters.cli.common import require_database
from fleetledger.adapters.cli.options import Subcommands, add_url, position
from fleetledger.eventstore import open_store
from fleetledger.eventstore._engine import resolve_url

__all__ = ["register", "run"]


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "dumpstate", help="the nodes' and subnets' accounting as JSON, now or as of a position"
    )
    add_url(parser)
    parser.add_argument(
        "--as-of", type=position, metavar="POSITION", help="replay the log up to this position"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.projections.dumpstate import dumpstate_at
    from fleetledger.projections.nodes import dump_json

    # Opening a SQLite file that is not there would create an empty database (and say only that
    # it lacks the schema).
    require_database(resolve_url(args.url))
    with open_store(args.url) as store:
        print(dump_json(dumpstate_at(store, args.as_of)))
    return 0
