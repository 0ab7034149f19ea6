"""The ``fleetledger`` command line: the parser every command group registers into, and the
dispatch that turns errors into exit statuses.

Every command that touches the database takes ``--url``; without it the URL comes from
``FLEETLEDGER_DATABASE_URL``, else the embedded SQLite default (``sqlite:///fleetledger.db``).
Errors print one line saying what to do next and exit with one of :data:`EXIT_CODES`, which
``fleetledger --help`` lists: a bad option value too (argparse's usage block is left out, so that
every refusal is one line a script can log).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from importlib.metadata import version as package_version
from typing import NoReturn, Protocol, cast

from fleetledger.adapters.cli import audit, bench, db, dumpstate, events, extender, serve, simulate
from fleetledger.adapters.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TAMPERED,
    EXIT_USAGE,
)
from fleetledger.adapters.cli.options import Command, Subcommands
from fleetledger.adapters.logging import configure_logging
from fleetledger.eventstore import EventStoreError

__all__ = ["EXIT_CODES", "OneLineParser", "build_parser", "main"]

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (EXIT_ERROR, "an operational error: the database unreachable or not migrated, a file or key "
     "unusable, a port taken, a benchmark or reliability check failed"),
    (EXIT_USAGE, "bad usage: an unknown command or option, an option's value out of range "
     "(inf, nan, negative, too large, empty, control characters) or options that conflict"),
    (EXIT_TAMPERED, "`audit verify` found the log (or its anchors) tampered with"),
    (EXIT_INTERRUPTED, "interrupted: Ctrl-C, or a second SIGTERM"),
)  # fmt: skip
"""Every status a command exits with, and when; the help's epilog lists them."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line on stderr, exit 2: the flag, what is wrong,
    and where the help is. Subcommands' parsers are of the same class (argparse makes them of
    their parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


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
    parser = OneLineParser(
        prog="fleetledger",
        description="Event-sourced capacity controller for Kubernetes fleets on Azure.",
        epilog=_exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version('fleetledger')}"
    )
    parser.add_argument("--log-level", help="debug, info, warning or error (default: info)")
    parser.add_argument(
        "--log-json", action="store_true", default=None, help="JSON log lines even on a terminal"
    )
    # Typed as the base parser's: the groups add plain subcommands (of this class at run time).
    commands = cast(
        Subcommands, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    )
    for group in _GROUPS:
        group.register(commands)
    return parser


def _exit_codes_epilog() -> str:
    lines = ["exit codes:"]
    for code, meaning in EXIT_CODES:
        lines.extend(
            textwrap.wrap(
                meaning, width=92, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7
            )
        )
    return "\n".join(lines)


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
