"""The ``fleetledger`` command line: the parser every command group registers into, and the
dispatch that turns errors into exit statuses.

Every command that touches the database takes ``--url``; without it the URL comes from
``FLEETLEDGER_DATABASE_URL``, else the ``--config`` file's ``database.url``, else the embedded
SQLite default (``sqlite:///fleetledger.db``). Every configurable flag resolves the same way
(given > ``FLEETLEDGER_*`` > ``--config`` file > default; :mod:`fleetledger.adapters.config`),
once, before the command runs; a refused setting is a usage error naming its key.
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
from typing import Any, NoReturn, Protocol, cast

from fleetledger.adapters.cli import (
    audit,
    bench,
    completion,
    config,
    db,
    dumpstate,
    events,
    explain,
    extender,
    replay,
    serve,
    simulate,
)
from fleetledger.adapters.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TAMPERED,
    EXIT_USAGE,
)
from fleetledger.adapters.cli.options import Command, Subcommands
from fleetledger.adapters.logging import configure_logging
from fleetledger.eventstore import EventStoreError

__all__ = ["EXIT_CODES", "DefaultsHelpFormatter", "OneLineParser", "build_parser", "main"]

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (EXIT_ERROR, "an operational error: the database unreachable or not migrated, a file or key "
     "unusable, a port taken, a benchmark or reliability check failed"),
    (EXIT_USAGE, "bad usage: an unknown command or option, an option's value out of range "
     "(inf, nan, negative, too large, empty, control characters) or options that conflict"),
    (EXIT_TAMPERED, "`audit verify` found the log (or its anchors) tampered with, or an "
     "invariant broken"),
    (EXIT_INTERRUPTED, "interrupted: Ctrl-C, or a second SIGTERM"),
)  # fmt: skip
"""Every status a command exits with, and when; the help's epilog lists them."""


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that ends each option's text with its default, unless the text already says it or
    the option has none (a switch, an absent value, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text
            or not action.option_strings
            or action.nargs == 0
            or action.default in (None, argparse.SUPPRESS)
            or action.default == []
        ):
            return text
        return f"{text} (default: %(default)s)"


class _RootHelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """The top-level help: its epilog (the exit codes) keeps its layout."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line on stderr, exit 2: the flag, what is wrong,
    and where the help is. Subcommands' parsers are of the same class (argparse makes them of
    their parent's), and show each option's default in their help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

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
    replay,
    explain,
    bench,
    simulate,
    serve,
    dumpstate,
    extender,
    config,
)


_REPORTING_COMMANDS = frozenset({"simulate", "bench"})
"""Commands whose output is a report: their logs are warnings only unless ``--verbose``."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fleetledger",
        description="Event-sourced capacity controller for Kubernetes fleets on Azure.",
        epilog=_exit_codes_epilog(),
        formatter_class=_RootHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version('fleetledger')}"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration file (default: $FLEETLEDGER_CONFIG, else none); flags and "
        "FLEETLEDGER_* variables override it; see `fleetledger config show`",
    )
    parser.add_argument("--log-level", help="debug, info, warning or error (default: info)")
    parser.add_argument(
        "--log-json", action="store_true", default=None, help="JSON log lines even on a terminal"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="log at --log-level during simulate and bench too (default: warnings only there, "
        "so that their reports stay readable)",
    )
    # Typed as the base parser's: the groups add plain subcommands (of this class at run time).
    commands = cast(
        Subcommands, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    )
    for group in _GROUPS:
        group.register(commands)
    completion.register(commands, root=parser)
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
    # Imported here: the configuration's model uses the CLI's argument types (options.py).
    from fleetledger.adapters.config import ConfigError, apply_settings

    try:
        # Every configurable flag resolved in args: given > FLEETLEDGER_* > --config > default.
        settings = apply_settings(args)
    except ConfigError as e:
        print(e.report("fleetledger: error: "), file=sys.stderr)
        return EXIT_USAGE
    try:
        configure_logging(
            level=settings.log.level,
            json_output=settings.log.json_lines,
            quiet=args.command in _REPORTING_COMMANDS and not args.verbose,
        )
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
