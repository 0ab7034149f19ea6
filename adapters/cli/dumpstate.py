"""``fleetledger dumpstate``: the nodes' and subnets' accounting as JSON, now or as of a
position in the log."""

from __future__ import annotations

import argparse

from fleetledger.adapters.cli.options import Subcommands, add_url
from fleetledger.eventstore import open_store

__all__ = ["register", "run"]


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "dumpstate", help="the nodes' and subnets' accounting as JSON, now or as of a position"
    )
    add_url(parser)
    parser.add_argument(
        "--as-of", type=int, metavar="POSITION", help="replay the log up to this position"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.projections.dumpstate import dumpstate_at
    from fleetledger.projections.nodes import dump_json

    with open_store(args.url) as store:
        print(dump_json(dumpstate_at(store, args.as_of)))
    return 0
