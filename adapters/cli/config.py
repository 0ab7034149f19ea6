"""``fleetledger config show``: the effective configuration — the flags, the ``FLEETLEDGER_*``
environment and the ``--config`` file merged over the defaults — secrets redacted."""

from __future__ import annotations

import argparse

from fleetledger.adapters.cli.options import Subcommands, add_json

__all__ = ["register", "show"]


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("config", help="show the effective configuration")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show_parser = actions.add_parser(
        "show",
        help="print the merged configuration (flags > FLEETLEDGER_* env > --config file > "
        "defaults) as TOML, secrets redacted",
    )
    add_json(show_parser)
    show_parser.set_defaults(run=show)


def show(args: argparse.Namespace) -> int:
    from fleetledger.adapters.config import as_json, as_toml, settings_for

    settings = settings_for(args)
    print(as_json(settings) if args.json else as_toml(settings), end="" if not args.json else "\n")
    return 0
