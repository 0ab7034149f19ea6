"""The argument types and flags several commands share, and the shapes a command group's
registration and handlers have."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

from fleetledger.eventstore._engine import DATABASE_URL_ENV

__all__ = [
    "Command",
    "Subcommands",
    "add_json",
    "add_max_body_bytes",
    "add_url",
    "database_url",
    "port_number",
]

Command = Callable[[argparse.Namespace], int]
"""A command's handler: the parsed arguments in, the exit status out."""

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def database_url(value: str) -> str:
    # An empty --url (an unset shell variable, typically) must not quietly mean the default log.
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"is empty; give a database URL, or leave --url out to use ${DATABASE_URL_ENV}"
        )
    return value


def port_number(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0-65535")
    return port


def add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=database_url,
        help=f"database URL (default: ${DATABASE_URL_ENV}, else sqlite:///fleetledger.db)",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_max_body_bytes(parser: argparse.ArgumentParser) -> None:
    """``--max-body-bytes``, for every command that serves HTTP (the same edge rules)."""
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=1024 * 1024,
        metavar="BYTES",
        help="larger request bodies get 413 (default 1 MiB)",
    )
