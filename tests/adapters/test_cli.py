"""The log commands of the ``fleetledger`` CLI: db, events tail, audit verify, bench store."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from fleetledger.adapters.cli import EXIT_ERROR, EXIT_TAMPERED, main
from fleetledger.eventstore import NewEvent, migrate, open_store


@pytest.fixture
def empty_sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def appended(url: str, count: int) -> None:
    with contextlib.closing(open_store(url)) as store:
        store.append("cli-1", [NewEvent("Tested", {"n": n}) for n in range(count)])


class TestDb:
    def test_upgrade_current_downgrade(
        self, empty_sqlite: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """db upgrade brings an empty database to head, current says so, downgrade empties it."""
        assert main(["db", "upgrade", "--url", empty_sqlite]) == 0
        assert main(["db", "current", "--url", empty_sqlite]) == 0
        assert f"{migrate.head_revision()} (head)" in capsys.readouterr().out
        assert main(["db", "downgrade", "--url", empty_sqlite]) == 0
        assert migrate.current_revision(empty_sqlite) is None

    def test_unmigrated_database_is_refused_in_one_line(
        self, empty_sqlite: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A command on an unmigrated database exits 1 naming the command that fixes it."""
        assert main(["events", "tail", "--url", empty_sqlite]) == EXIT_ERROR
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "fleetledger db upgrade" in err


class TestEventsTail:
    def test_prints_the_last_events_as_json_lines(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Without --after, tail prints the last --limit events in order."""
        appended(sqlite_url, 5)
        assert main(["events", "tail", "--url", sqlite_url, "--limit", "2", "--json"]) == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(e["global_position"], e["data"]) for e in lines] == [(4, {"n": 3}), (5, {"n": 4})]


class TestAuditVerify:
    def test_intact_log_exits_zero(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An untouched log verifies, with the number of events checked."""
        appended(sqlite_url, 3)
        assert main(["audit", "verify", "--url", sqlite_url]) == 0
        assert "ok: 3 events verified" in capsys.readouterr().out

    def test_tampered_log_exits_three(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A changed event body is reported with its position and exit code 3."""
        appended(sqlite_url, 3)
        engine = sa.create_engine(sqlite_url)
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE events SET data = '{\"n\":99}' WHERE global_position = 2")
        engine.dispose()
        assert main(["audit", "verify", "--url", sqlite_url, "--json"]) == EXIT_TAMPERED
        report = json.loads(capsys.readouterr().out)
        assert (report["ok"], report["first_bad_position"]) == (False, 2)


class TestBenchStore:
    def test_reports_figures_without_touching_the_target_log(
        self, store_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """bench store measures in a scratch database and prints figures with ratios."""
        appended(store_url, 1)
        assert main(["bench", "store", "--url", store_url, "--events", "80", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        names = {m["name"] for m in report["measurements"]}
        assert {"append 1 event, 1 writer", "read_all replay into RecordedEvent"} <= names
        assert all(m["rate"] > 0 for m in report["measurements"])
        with contextlib.closing(open_store(store_url)) as store:
            assert store.head() == 1
