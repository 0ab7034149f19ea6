"""``fleetledger replay``: the read models rebuilt up to a position or a recorded time, printing
what ``dumpstate --as-of`` prints, with progress on stderr."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest

from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.cli.replay import Progress
from fleetledger.adapters.simulator.dst import run_seed
from fleetledger.eventstore import open_store


@pytest.fixture(scope="module")
def seed_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """DST seed 3's log: nodes, subnets, machine requests and workloads."""
    url = f"sqlite:///{tmp_path_factory.mktemp('replay') / 'seed3.db'}"
    assert run_seed(3, url=url).ok
    return url


def printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert main(argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


class TestReplay:
    @pytest.mark.parametrize("position", [1, 40, 80])
    def test_a_position_prints_what_dumpstate_as_of_prints(
        self, seed_url: str, position: int, capsys: pytest.CaptureFixture[str]
    ) -> None:
        dumped, _ = printed(["dumpstate", "--url", seed_url, "--as-of", str(position)], capsys)
        replayed, err = printed(["replay", "--url", seed_url, "--until", str(position)], capsys)
        assert replayed == dumped
        assert f"replayed to position {position}" in err

    def test_without_until_it_replays_to_the_head(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        dumped, _ = printed(["dumpstate", "--url", seed_url], capsys)
        replayed, err = printed(["replay", "--url", seed_url], capsys)
        assert replayed == dumped
        assert "machine requests dst: " in err and " created" in err

    def test_a_time_stops_before_the_first_event_recorded_after_it(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with open_store(seed_url) as store:
            records = store.read_all(after=0)
        cut = records[len(records) // 2].recorded_at
        expected = max(r.global_position for r in records if r.recorded_at <= cut)

        out, _ = printed(["replay", "--url", seed_url, "--until", cut.isoformat()], capsys)

        assert json.loads(out)["position"] == expected

    def test_a_time_before_the_log_replays_nothing(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with open_store(seed_url) as store:
            first = store.read_all(after=0, limit=1)[0].recorded_at
        early = (first - timedelta(days=1)).isoformat()
        out, _ = printed(["replay", "--url", seed_url, "--until", early], capsys)
        assert json.loads(out)["position"] == 0

    def test_progress_is_logged_every_n_events_off_a_terminal(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        argv = [
            "--log-json",
            "replay",
            "--url",
            seed_url,
            "--until",
            "50",
            "--progress-every",
            "20",
        ]
        _, err = printed(argv, capsys)
        lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        assert [(line["event"], line["events"]) for line in lines] == [
            ("replaying", 20),
            ("replaying", 40),
        ]


class TestRefusals:
    def test_a_position_past_the_head_is_one_line(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["replay", "--url", seed_url, "--until", "999999"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "outside the log" in err

    @pytest.mark.parametrize(
        ("value", "says"),
        [
            ("2025-01-01T00:00:00", "no time zone"),
            ("yesterday", "a log position"),
            ("-1", "a log position"),
            ("inf", "a log position"),
        ],
    )
    def test_an_unusable_until_is_a_usage_error(
        self, value: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["replay", "--url", f"sqlite:///{tmp_path / 'none.db'}", "--until", value])
        err = capsys.readouterr().err
        assert exit_.value.code == EXIT_USAGE and len(err.splitlines()) == 1
        assert "--until" in err and says in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class TestProgress:
    def test_a_terminal_gets_a_bar_redrawn_in_place(self) -> None:
        terminal = _Terminal()
        progress = Progress(total=200, every=10, stream=terminal)
        for position in range(1, 201):
            progress.advance(position)
        progress.finish(200)
        drawn = terminal.getvalue()
        assert drawn.startswith("\rreplaying [") and drawn.endswith("\n")
        assert "100% position 200/200 (200 events)" in drawn.split("\r")[-1]
        assert "\n" not in drawn[:-1]  # redrawn on one line, not scrolled
