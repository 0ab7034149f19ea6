"""The ``fleetledger`` command line: the parser every command group registers into, and the
dispatch that turns errors into exit statuses.

Every command that touches the database takes ``--url``; without it the URL comes from
``FLEETLEDGER_DATABASE_URL``, else the embedded SQLite default (``sqlite:///fleetledger.db``).
Errors print one line saying what to do next and exit non-zero (1 for operational errors,
2 for bad usage, 3 when an audit finds the log tampered with).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import version as package_version
from typing import Protocol

from fleetledger.adapters.cli import audit, bench, db, dumpstate, events, extender, serve, simulate
from fleetledger.adapters.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE
from fleetledger.adapters.cli.options import Command, Subcommands
from fleetledger.adapters.logging import configure_logging
from fleetledger.eventstore import EventStoreError

__all__ = ["build_parser", "main"]


class _CommandGroup(Protocol):
    """A command group's module: it adds its subcommands, each with its handler as ``run``."""

    def register(self, commands: Subcommands) -> None: ...


# In the order `fleetledger --help` lists them.
_GROUPS: tuple[_CommandGroup, ...] = (
    db,
    events,
    audit,
    bench,
    simulate,
    serve,
    dumpstate,
    extender,
)


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
    for group in _GROUPS:
        group.register(commands)
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
        return EXIT_INTERRUPTED
