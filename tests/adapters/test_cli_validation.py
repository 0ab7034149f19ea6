"""Every option of every ``fleetledger`` command refuses a bad value in one line, exit 2.

The options are found by walking the parser, so a flag added later is checked without a test
of its own: a number parsed by bare ``int``/``float`` (which take ``inf``, ``nan``, ``-1`` and
``1e308``) fails :class:`TestEveryNumericOptionIsBounded`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetledger.adapters.cli import EXIT_ERROR, EXIT_TAMPERED, EXIT_USAGE, main
from fleetledger.adapters.cli.common import EXIT_INTERRUPTED
from fleetledger.adapters.cli.main import EXIT_CODES, build_parser
from fleetledger.adapters.cli.options import (
    Number,
    Text,
    bounded_int,
    finite_float,
    port_number,
    seconds,
)

PARSER = build_parser()
"""One parser for the many refusals (``main`` builds a new one per call: the same parser)."""


def options(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.Action]]:
    """Every optional argument of ``parser`` and of its subcommands, with the command path."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from options(subparser, (*path, name))
        elif action.option_strings and action.nargs != 0:
            yield path, action


FOUND = list(options(PARSER))


def params(found: list[tuple[tuple[str, ...], argparse.Action]]) -> list[Any]:
    return [
        pytest.param(path, action, id=f"{' '.join(path)} {action.option_strings[-1]}")
        for path, action in found
    ]


ALL_OPTIONS = params(FOUND)
NUMERIC_OPTIONS = params([(p, a) for p, a in FOUND if isinstance(a.type, Number)])
TEXT_OPTIONS = params([(p, a) for p, a in FOUND if isinstance(a.type, Text)])

# Each is refused by every numeric option: not finite, negative (no count or duration is),
# beyond any bound, not a number at all.
BAD_NUMBERS = ["inf", "-inf", "nan", "-1", "1e308", "1" * 30, "", " ", "\x1b[2J", "12abc"]
BAD_TEXT = ["", "   ", "a\x00b", "a\nb", "Standard\x1b[31m", "x\u202ey", "\ud800"]


def refused_in_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str], *, parse: bool = False
) -> str:
    with pytest.raises(SystemExit) as exit_:
        if parse:
            PARSER.parse_args(argv)
        else:
            main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_USAGE, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


class TestEveryNumericOptionIsBounded:
    @pytest.mark.parametrize(("path", "action"), ALL_OPTIONS)
    def test_no_option_parses_with_bare_int_or_float(
        self, path: tuple[str, ...], action: argparse.Action
    ) -> None:
        """A number is parsed by a bounded type from adapters/cli/options.py, never by ``int``
        or ``float`` alone (nor is a numeric default left to the string parser)."""
        assert action.type not in (int, float), (
            f"{' '.join(path)} {action.option_strings[-1]}: use a Number from "
            "fleetledger.adapters.cli.options (count, seconds, position, finite_float, ...)"
        )
        numeric_default = isinstance(action.default, int | float) and not isinstance(
            action.default, bool
        )
        if numeric_default:
            assert isinstance(action.type, Number) or action.type is port_number

    def test_the_walk_finds_the_options(self) -> None:
        """The parametrisation is not vacuous: the serve timings, the log positions and the
        benchmarks' counts are among the options found."""
        found = {
            (" ".join(path), action.option_strings[-1])
            for path, action in FOUND
            if isinstance(action.type, Number)
        }

        assert {
            ("serve", "--lease-seconds"),
            ("serve", "--max-timeout"),
            ("serve", "--grace-seconds"),
            ("events tail", "--after"),
            ("audit verify", "--after"),
            ("dumpstate", "--as-of"),
            ("bench grouper", "--repeat"),
        } <= found


class TestBadValuesAreOneLineUsageErrors:
    @pytest.mark.parametrize(("path", "action"), NUMERIC_OPTIONS)
    def test_every_numeric_option_refuses_bad_numbers(
        self, path: tuple[str, ...], action: argparse.Action, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """inf, nan, -1, 1e308, a 30-digit integer, empty, blank, escapes and garbage: each
        exits 2 with one line naming the flag, and the command never runs."""
        flag = action.option_strings[-1]
        for value in BAD_NUMBERS:
            err = refused_in_one_line([*path, f"{flag}={value}"], capsys, parse=True)
            assert f"argument {'/'.join(action.option_strings)}:" in err

    @pytest.mark.parametrize(("path", "action"), TEXT_OPTIONS)
    def test_every_name_option_refuses_control_characters_and_blanks(
        self, path: tuple[str, ...], action: argparse.Action, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Empty, blank, NUL, newline, escape sequences, bidi overrides, lone surrogates."""
        flag = action.option_strings[-1]
        for value in BAD_TEXT:
            refused_in_one_line([*path, f"{flag}={value}"], capsys, parse=True)

    @pytest.mark.parametrize(
        "argv",
        [
            ["serve", "--lease-seconds", "inf"],
            ["serve", "--max-timeout", "1e308"],
            ["serve", "--grace-seconds", "-1"],
            ["serve", "--pool", "general=Standard_D4s\x07_v5:4000:16"],
            ["db", "downgrade", "--revision", ""],
            ["events", "tail", "--after", "-1"],
        ],
        ids=["lease-inf", "max-timeout-1e308", "grace-negative", "pool-bell", "revision-empty",
             "after-negative"],
    )  # fmt: skip
    def test_the_values_that_once_crashed_or_slipped_through(
        self, argv: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The inputs that ended in tracebacks (overflowing timedelta, Alembic's assertion) or
        were accepted are refused at parse time."""
        refused_in_one_line(argv, capsys)

    def test_the_installed_command_exits_2_with_one_line(self, tmp_path: Path) -> None:
        """Through the real process: exit 2, one line on stderr, nothing on stdout."""
        result = subprocess.run(
            [sys.executable, "-m", "fleetledger", "serve", "--lease-seconds", "inf"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env={**os.environ, "FLEETLEDGER_DATABASE_URL": "sqlite:///never-created.db"},
        )

        assert result.returncode == EXIT_USAGE
        assert result.stdout == ""
        assert result.stderr.splitlines() == [
            "fleetledger serve: error: argument --lease-seconds: must be a number of seconds "
            "from 1 to 3600, not 'inf' (not a finite number) (see `fleetledger serve --help`)"
        ]

    def test_an_unknown_option_is_one_line_too(self, capsys: pytest.CaptureFixture[str]) -> None:
        """argparse's own refusals drop the usage block as well."""
        err = refused_in_one_line(["events", "tail", "--nosuch"], capsys)

        assert "unrecognized arguments: --nosuch" in err


class TestGoodValuesStillParse:
    def test_bounds_are_inclusive_where_documented(self) -> None:
        """The limits themselves parse; the lease's floor of 1 s and the ratio's (0, 1]."""
        args = build_parser().parse_args(
            ["serve", "--lease-seconds", "1", "--grace-seconds", "0", "--ipam-x-ssf", "1",
             "--fake-latency", "0", "--max-timeout", "3600"]
        )  # fmt: skip

        assert (args.lease_seconds, args.grace_seconds, args.ipam_x_ssf) == (1.0, 0.0, 1.0)
        assert (args.fake_latency, args.max_timeout) == (0.0, 3600.0)

    def test_positions_reach_the_largest_the_log_can_hold(self) -> None:
        """A position up to 2^63 - 1 parses; one more is refused."""
        top = str(2**63 - 1)

        assert build_parser().parse_args(["events", "tail", "--after", top]).after == 2**63 - 1
        with pytest.raises(SystemExit):
            build_parser().parse_args(["events", "tail", "--after", str(2**63)])


class TestNumber:
    def test_an_excluded_minimum_is_refused_and_the_maximum_kept(self) -> None:
        """``seconds()`` is more than 0 and at most its maximum."""
        parse = seconds(at_most=10)

        assert parse("10") == 10.0 and parse("1e-9") == 1e-9
        for bad in ("0", "-0", "10.000001"):
            with pytest.raises(argparse.ArgumentTypeError, match="more than 0 and at most 10"):
                parse(bad)

    def test_a_float_that_overflows_to_infinity_says_so(self) -> None:
        """``1e309`` looks like a number but parses as inf: the message says it is not finite."""
        with pytest.raises(argparse.ArgumentTypeError, match="not a finite number"):
            finite_float(minimum=0, maximum=1e308)("1e309")

    def test_integers_refuse_fractions(self) -> None:
        """An integer option takes no ``2.5`` (nor ``2.0``: int() refuses it)."""
        with pytest.raises(argparse.ArgumentTypeError, match="an integer from 1 to 5"):
            bounded_int(minimum=1, maximum=5)("2.5")

    def test_bounds_must_be_finite_and_ordered(self) -> None:
        """A validator that could never accept anything is a programming error at import."""
        with pytest.raises(ValueError, match="empty range"):
            bounded_int(minimum=5, maximum=1)
        with pytest.raises(ValueError, match="finite"):
            finite_float(minimum=0, maximum=float("inf"))


class TestExitCodes:
    def test_the_help_lists_every_exit_code(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`fleetledger --help` ends with the exit codes, each with its meaning."""
        with pytest.raises(SystemExit) as exit_:
            main(["--help"])

        out = capsys.readouterr().out
        assert exit_.value.code == 0
        listed = out[out.index("exit codes:") :]
        for code in (0, EXIT_ERROR, EXIT_USAGE, EXIT_TAMPERED, EXIT_INTERRUPTED):
            assert f"\n  {code:<5}" in listed
        assert [code for code, _ in EXIT_CODES] == [0, 1, 2, 3, 130]
