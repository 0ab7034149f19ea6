"""The argument types and flags several commands share, and the shapes a command group's
registration and handlers have.

Every option that takes a number parses it with a :class:`Number` (``finite_float``,
``bounded_int``, ``seconds`` or one of the named ones below), and every free-form name with a
:class:`Text`: argparse then refuses a value out of range — ``inf``, ``nan``, ``1e308``, a
negative count, an empty or control-character name — as a usage error (exit 2) in one line
naming the flag and the range, before the command runs. Unchecked, such values surfaced as
tracebacks from deep inside (``timedelta`` overflowing, Alembic asserting) or were accepted and
misbehaved. ``tests/adapters/test_cli_validation.py`` walks the parser so that a new numeric flag
without one of these fails the tests.
"""

from __future__ import annotations

import argparse
import math
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from fleetledger.domain.template import text_problem
from fleetledger.eventstore._engine import DATABASE_URL_ENV

__all__ = [
    "MAX_COUNT",
    "MAX_POSITION",
    "MAX_SECONDS",
    "Command",
    "Number",
    "Subcommands",
    "Text",
    "add_json",
    "add_max_body_bytes",
    "add_url",
    "bounded_int",
    "count",
    "database_url",
    "finite_float",
    "max_body_bytes",
    "name",
    "port_number",
    "position",
    "seconds",
    "seed",
]

Command = Callable[[argparse.Namespace], int]
"""A command's handler: the parsed arguments in, the exit status out."""

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

MAX_POSITION = 2**63 - 1
"""The largest log position: both backends keep positions in a signed 64-bit integer, and a
larger one overflows the driver instead of finding nothing."""

MAX_COUNT = 1_000_000
"""The default ceiling of a count (clients, requests, batches): far above any sensible value,
far below what overflows."""

MAX_SECONDS = 24 * 3600.0
"""The default ceiling of a duration: a day. Larger values are typos (``1e308`` overflows
``timedelta``)."""


@dataclass(frozen=True, slots=True)
class Number:
    """An argparse ``type=``: an integer or a finite float within ``[minimum, maximum]`` (or
    ``(minimum, maximum]`` with ``minimum_excluded``); ``ArgumentTypeError`` saying the range
    otherwise."""

    integral: bool
    minimum: float
    maximum: float
    minimum_excluded: bool = False
    noun: str = ""
    """What the value is, with its article: "a number of seconds" (default: "an integer" or
    "a number")."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.minimum) and math.isfinite(self.maximum)):
            raise ValueError("a Number's bounds must be finite")
        if self.minimum > self.maximum:
            raise ValueError(f"empty range: {self.minimum} > {self.maximum}")

    def __call__(self, text: str) -> int | float:
        value = self._parse(text)
        low_ok = value > self.minimum if self.minimum_excluded else value >= self.minimum
        if not (low_ok and value <= self.maximum):
            raise argparse.ArgumentTypeError(f"must be {self.describe()}, not {text!r}")
        return value

    def _parse(self, text: str) -> int | float:
        if self.integral:
            try:
                return int(text)
            except ValueError:
                # int() also refuses more than 4,300 digits with a ValueError: the same answer.
                raise argparse.ArgumentTypeError(
                    f"must be {self.describe()}, not {_shown(text)}"
                ) from None
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {self.describe()}, not {_shown(text)}"
            ) from None
        if not math.isfinite(value):
            # "1e309" parses as inf: say so, since the text itself looks like a number.
            raise argparse.ArgumentTypeError(
                f"must be {self.describe()}, not {text!r} (not a finite number)"
            )
        return value

    def describe(self) -> str:
        """``"an integer from 1 to 1000000"``, ``"a number of seconds more than 0 and at most
        3600"``."""
        kind = self.noun or ("an integer" if self.integral else "a number")
        low, high = _figure(self.minimum, self.integral), _figure(self.maximum, self.integral)
        if self.minimum_excluded:
            return f"{kind} more than {low} and at most {high}"
        return f"{kind} from {low} to {high}"


@dataclass(frozen=True, slots=True)
class Text:
    """An argparse ``type=``: a name or a spec of at most ``max_length`` characters, not blank,
    without control characters (NUL, newlines, escapes), invisible format characters (bidi
    overrides) or lone surrogates — they would end up in the log, in stream ids and in terminals
    reading ``events tail``."""

    max_length: int = 256

    def __call__(self, text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"must not be empty or blank, not {text!r}")
        if len(text) > self.max_length:
            raise argparse.ArgumentTypeError(
                f"is {len(text)} characters long; the limit is {self.max_length}"
            )
        problem = text_problem(text) or _invisible(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{problem} (in {text!r})")
        return text


def _invisible(text: str) -> str | None:
    # Format characters (bidi overrides, zero-width joiners) and line separators are not control
    # characters, but they make a name display as another or break the line it is printed on.
    for index, char in enumerate(text):
        if unicodedata.category(char) in ("Cf", "Zl", "Zp"):
            return f"contains an invisible character (U+{ord(char):04X}) at position {index}"
    return None


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:40] + "…")


def _figure(value: float, integral: bool) -> str:
    return str(int(value)) if integral else f"{value:g}"


def finite_float(
    *, minimum: float, maximum: float, minimum_excluded: bool = False, noun: str = ""
) -> Number:
    """A finite float in ``[minimum, maximum]`` (``(minimum, maximum]`` if excluded)."""
    return Number(False, minimum, maximum, minimum_excluded, noun)


def bounded_int(*, minimum: int, maximum: int, noun: str = "") -> Number:
    """An integer in ``[minimum, maximum]``."""
    return Number(True, minimum, maximum, noun=noun)


def seconds(*, at_least: float | None = None, at_most: float = MAX_SECONDS) -> Number:
    """A duration of at most ``at_most`` seconds: more than 0, or at least ``at_least``."""
    return finite_float(
        minimum=0.0 if at_least is None else at_least,
        maximum=at_most,
        minimum_excluded=at_least is None,
        noun="a number of seconds",
    )


def count(*, minimum: int = 1, maximum: int = MAX_COUNT) -> Number:
    """How many of something: an integer from ``minimum`` (1) to ``maximum``."""
    return bounded_int(minimum=minimum, maximum=maximum)


position = bounded_int(minimum=0, maximum=MAX_POSITION, noun="a log position")
"""A global position in the log (0: before the first event)."""

seed = bounded_int(minimum=0, maximum=2**63 - 1)
"""A random seed."""


name = Text()
"""A free-form name or spec: not blank, no control characters, at most 256 characters."""

max_body_bytes = bounded_int(minimum=1, maximum=1 << 30, noun="a number of bytes")
"""A request body limit: at least a byte, at most 1 GiB."""


def database_url(value: str) -> str:
    # An empty --url (an unset shell variable, typically) must not quietly mean the default log.
    if not value.strip():
        raise argparse.ArgumentTypeError(
            f"is empty; give a database URL, or leave --url out to use ${DATABASE_URL_ENV}"
        )
    problem = text_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def port_number(value: str) -> int:
    """A TCP port, 0-65535; 0 asks the system for a free one."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_shown(value)} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is outside 0-65535")
    return port


def add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=database_url,
        help=f"database URL (default: ${DATABASE_URL_ENV}, else the --config file's "
        "database.url, else sqlite:///fleetledger.db)",
    )


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_max_body_bytes(parser: argparse.ArgumentParser) -> None:
    """``--max-body-bytes``, for every command that serves HTTP (the same edge rules)."""
    parser.add_argument(
        "--max-body-bytes",
        type=max_body_bytes,
        default=1024 * 1024,
        metavar="BYTES",
        help="larger request bodies get 413 (default 1 MiB, at most 1 GiB)",
    )
