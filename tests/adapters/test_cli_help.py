"""Every option of every ``fleetledger`` command says what it does and what it defaults to, and
``simulate``/``bench`` keep their reports free of log lines unless ``--verbose``.

The options are found by walking the parser (as ``test_cli_validation.py`` does), so a flag
added later without help fails here.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from fleetledger.adapters.cli.main import DefaultsHelpFormatter, build_parser
from fleetledger.adapters.logging import LOG_LEVEL_ENV, configure_logging

PARSER = build_parser()


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every subcommand's parser below it, with the command path."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from parsers(subparser, (*path, name))


def arguments() -> list[Any]:
    found = []
    for path, parser in parsers(PARSER):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                continue
            label = action.option_strings[-1] if action.option_strings else action.dest
            found.append(pytest.param(path, parser, action, id=f"{' '.join(path)} {label}"))
    return found


ARGUMENTS = arguments()


class TestEveryOptionIsDocumented:
    def test_the_walk_finds_every_command(self) -> None:
        paths = {" ".join(path) for path, _ in parsers(PARSER)}
        assert {"events types", "completion", "simulate", "serve", "bench store"} <= paths
        assert len(ARGUMENTS) > 100

    @pytest.mark.parametrize(("path", "parser", "action"), ARGUMENTS)
    def test_has_help(
        self, path: tuple[str, ...], parser: argparse.ArgumentParser, action: argparse.Action
    ) -> None:
        assert action.help and action.help.strip() and action.help != argparse.SUPPRESS

    @pytest.mark.parametrize(("path", "parser", "action"), ARGUMENTS)
    def test_its_default_is_in_the_help(
        self, path: tuple[str, ...], parser: argparse.ArgumentParser, action: argparse.Action
    ) -> None:
        """An option with a default value names it in the help (the formatter adds it when the
        text does not say it already); a switch's default is being off."""
        if not action.option_strings or action.nargs == 0 or action.default in (None, []):
            return
        rendered = parser.format_help()
        assert "default" in (action.help or "") or f"(default: {action.default})" in rendered


class TestDefaultsHelpFormatter:
    def test_adds_the_default_once(self) -> None:
        parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
        parser.add_argument("--size", type=int, default=50, help="batch size")
        parser.add_argument("--idle", type=float, default=0.5, help="idle (default 0.5 s)")
        parser.add_argument("--name", help="a name")
        text = parser.format_help()
        assert "batch size (default: 50)" in text
        assert "idle (default 0.5 s)" in text and "(default: 0.5)" not in text
        assert "a name\n" in text


class TestQuietReports:
    @pytest.fixture(autouse=True)
    def _restore_logging(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
        yield
        structlog.reset_defaults()

    def test_quiet_keeps_warnings_only(self, capsys: pytest.CaptureFixture[str]) -> None:
        configure_logging(quiet=True, json_output=True)
        structlog.get_logger().info("took nodes over")
        structlog.get_logger().warning("cloud throttled")
        err = capsys.readouterr().err
        assert "took nodes over" not in err and "cloud throttled" in err

    def test_an_explicit_level_wins_over_quiet(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv(LOG_LEVEL_ENV, "info")
        configure_logging(quiet=True, json_output=True)
        structlog.get_logger().info("took nodes over")
        assert "took nodes over" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("argv", "quiet"),
        [
            (["simulate", "--scenario", "burst-vms"], True),
            (["bench", "grouper"], True),
            (["--verbose", "simulate", "--scenario", "burst-vms"], False),
            (["events", "types"], False),
        ],
    )
    def test_which_commands_are_quiet(self, argv: list[str], quiet: bool) -> None:
        """simulate and bench print reports: quiet unless --verbose; other commands log."""
        from fleetledger.adapters.cli.main import _REPORTING_COMMANDS

        args = PARSER.parse_args(argv)
        assert (args.command in _REPORTING_COMMANDS and not args.verbose) is quiet
