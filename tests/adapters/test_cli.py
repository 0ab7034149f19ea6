"""The log commands of the ``fleetledger`` CLI: db, events tail, audit, bench store."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from fleetledger.adapters.cli import EXIT_ERROR, EXIT_TAMPERED, EXIT_USAGE, main
from fleetledger.eventstore import NewEvent, migrate, open_store
from fleetledger.eventstore.anchors import AUDIT_KEY_ENV, read_anchor, read_chain
from tests.eventstore.support import bypassing_append_only_guard


@pytest.fixture
def empty_sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def appended(url: str, count: int) -> None:
    with contextlib.closing(open_store(url)) as store:
        store.append("cli-1", [NewEvent("Tested", {"n": n}) for n in range(count)])


def tamper(url: str, statement: str) -> None:
    """Run ``statement`` on the log as its owner would, past the append-only triggers."""
    engine = sa.create_engine(url)
    try:
        bypassing_append_only_guard(engine, statement)
    finally:
        engine.dispose()


class TestDb:
    def test_upgrade_current_downgrade(
        self, empty_sqlite: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """db upgrade brings an empty database to head, current says so, downgrade empties it."""
        assert main(["db", "upgrade", "--url", empty_sqlite]) == 0
        assert main(["db", "current", "--url", empty_sqlite]) == 0
        assert f"{migrate.head_revision()} (head)" in capsys.readouterr().out
        assert main(["db", "downgrade", "--url", empty_sqlite, "--revision", "base"]) == 0
        assert migrate.current_revision(empty_sqlite) is None

    def test_downgrade_needs_an_explicit_revision(self, sqlite_url: str) -> None:
        """`db downgrade` alone is a usage error, and the schema stays at head."""
        with pytest.raises(SystemExit) as exit_:
            main(["db", "downgrade", "--url", sqlite_url])

        assert exit_.value.code == EXIT_USAGE
        assert migrate.current_revision(sqlite_url) == migrate.head_revision()

    def test_downgrade_to_base_refuses_to_drop_events_unconfirmed(
        self, store_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Going to base on a log holding events exits 1 naming the confirmation flag, and the
        log is intact."""
        appended(store_url, 3)

        code = main(["db", "downgrade", "--url", store_url, "--revision", "base"])

        err = capsys.readouterr().err
        assert code == EXIT_ERROR and "--yes-drop-events" in err and "3 events" in err
        with contextlib.closing(open_store(store_url)) as store:
            assert store.head() == 3

    def test_confirmed_downgrade_to_base_drops_the_log(self, store_url: str) -> None:
        """With --yes-drop-events the downgrade to base goes ahead."""
        appended(store_url, 3)

        argv = ["db", "downgrade", "--url", store_url, "--revision", "base", "--yes-drop-events"]

        assert main(argv) == 0
        assert migrate.current_revision(store_url) is None

    @pytest.mark.parametrize("revision", ["0002", "0001"])
    def test_downgrade_that_keeps_the_events_needs_no_confirmation(
        self, store_url: str, revision: str
    ) -> None:
        """Going down to 0002 or 0001 keeps the events table, so a non-empty log may go there."""
        appended(store_url, 2)

        assert main(["db", "downgrade", "--url", store_url, "--revision", revision]) == 0
        assert migrate.current_revision(store_url) == revision
        assert migrate.count_events(store_url) == 2

    def test_an_unknown_revision_is_one_line(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`db upgrade --revision nosuch` exits 1 with one line naming the revision."""
        code = main(["db", "upgrade", "--url", sqlite_url, "--revision", "nosuch"])

        err = capsys.readouterr().err.strip()
        assert code == EXIT_ERROR
        assert len(err.splitlines()) == 1 and "'nosuch'" in err

    def test_an_empty_url_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`--url ''` is a usage error rather than silently the default database."""
        with pytest.raises(SystemExit) as exit_:
            main(["db", "current", "--url", ""])

        assert exit_.value.code == EXIT_USAGE
        assert "--url: is empty" in capsys.readouterr().err

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

    def test_a_missing_sqlite_file_is_not_created(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Tailing a SQLite path that does not exist says so and leaves no empty file behind."""
        path = tmp_path / "typo.db"

        code = main(["events", "tail", "--url", f"sqlite:///{path}"])

        assert code == EXIT_ERROR
        assert "does not exist" in capsys.readouterr().err
        assert not path.exists()


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
        tamper(sqlite_url, "UPDATE events SET data = '{\"n\":99}' WHERE global_position = 2")
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


def key_file(tmp_path: Path, secret: str = "s" * 32) -> str:
    path = tmp_path / "audit.key"
    path.write_text(secret + "\n")
    return str(path)


def truncate(url: str, keep: int) -> None:
    """Delete the tail past ``keep`` as the database's owner, past the append-only triggers."""
    tamper(url, f"DELETE FROM events WHERE global_position > {keep}")


class TestAuditAnchor:
    def test_verify_with_an_anchor_finds_a_deleted_tail(
        self, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The chain alone passes a log whose last events were deleted; with the anchor
        written before, verify exits 3 saying it was truncated."""
        appended(store_url, 5)
        key = key_file(tmp_path)
        anchor = str(tmp_path / "anchor.json")
        assert main(["audit", "anchor", "--url", store_url, "--key-file", key, "-o", anchor]) == 0
        truncate(store_url, keep=3)
        assert main(["audit", "verify", "--url", store_url]) == 0
        capsys.readouterr()

        code = main(["audit", "verify", "--url", store_url, "--anchor", anchor, "--key-file", key])

        assert code == EXIT_TAMPERED
        assert "truncated" in capsys.readouterr().err

    def test_an_intact_log_passes_its_anchor(
        self,
        sqlite_url: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Anchor to stdout with the key from FLEETLEDGER_AUDIT_KEY, append more, verify ok."""
        monkeypatch.setenv(AUDIT_KEY_ENV, "v" * 40)
        appended(sqlite_url, 2)
        assert main(["audit", "anchor", "--url", sqlite_url]) == 0
        anchor = tmp_path / "anchor.json"
        anchor.write_text(capsys.readouterr().out)
        appended(sqlite_url, 2)

        code = main(["audit", "verify", "--url", sqlite_url, "--anchor", str(anchor), "--json"])

        report = json.loads(capsys.readouterr().out)
        assert code == 0
        assert report["ok"] and report["anchor"] == {
            "ok": True,
            "position": 2,
            "reason": None,
            "sequence": 1,
            "digest": read_anchor(anchor).digest(),
        }

    def test_a_short_key_is_refused_before_anything_is_written(
        self, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A key under 32 bytes exits 1 saying how long it must be; no anchor file appears."""
        anchor = tmp_path / "anchor.json"

        code = main(
            [
                "audit", "anchor", "--url", sqlite_url,
                "--key-file", key_file(tmp_path, "short"), "--output", str(anchor),
            ]
        )  # fmt: skip

        assert code == EXIT_ERROR
        assert "at least 32" in capsys.readouterr().err
        assert not anchor.exists()

    def test_ed25519_anchors_verify_with_the_public_key(
        self, sqlite_url: str, tmp_path: Path
    ) -> None:
        """Signed with the private key, checked with only the public one."""
        private = Ed25519PrivateKey.generate()
        private_file = tmp_path / "signing.pem"
        private_file.write_bytes(
            private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        )
        public_file = tmp_path / "verifying.pem"
        public_file.write_bytes(
            private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        anchor = str(tmp_path / "anchor.json")
        appended(sqlite_url, 2)

        signed = ["audit", "anchor", "--url", sqlite_url, "--ed25519-key", str(private_file)]
        assert main([*signed, "--output", anchor]) == 0
        checked = ["audit", "verify", "--url", sqlite_url, "--anchor", anchor]
        assert main([*checked, "--ed25519-key", str(public_file)]) == 0


class TestAuditAnchorChain:
    def test_anchoring_into_a_file_appends_and_prints_the_digest(
        self, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`audit anchor -o` twice: a chain of two, each line naming the digest to keep."""
        key, anchor = key_file(tmp_path), tmp_path / "anchors.jsonl"
        argv = ["audit", "anchor", "--url", sqlite_url, "--key-file", key, "-o", str(anchor)]
        appended(sqlite_url, 2)
        assert main(argv) == 0
        appended(sqlite_url, 1)
        assert main(argv) == 0

        chain = read_chain(anchor)
        err = capsys.readouterr().err.splitlines()
        assert [(a.sequence, a.position) for a in chain] == [(1, 2), (2, 3)]
        assert err[-1] == f"anchored position 3 in {anchor} (anchor 2, digest {chain[-1].digest()})"

    def test_a_rolled_back_anchor_file_is_caught_with_the_last_known_digest(
        self, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The attack: the anchor file replaced by an older genuine copy and the log cut back
        to it. Alone they agree; given the digest verify printed before, exit 3 naming it."""
        key, anchor = key_file(tmp_path), tmp_path / "anchors.jsonl"
        argv = ["audit", "anchor", "--url", store_url, "--key-file", key, "-o", str(anchor)]
        appended(store_url, 2)
        assert main(argv) == 0
        older = anchor.read_bytes()
        appended(store_url, 3)
        assert main(argv) == 0
        verify = ["audit", "verify", "--url", store_url, "--anchor", str(anchor), "--key-file", key]
        assert main(verify) == 0
        last_known = read_anchor(anchor).digest()
        assert f"digest {last_known}" in capsys.readouterr().out

        anchor.write_bytes(older)
        truncate(store_url, keep=2)

        assert main(verify) == 0  # the limit: nothing in the file or the log tells
        capsys.readouterr()
        assert main([*verify, "--expect-anchor", last_known]) == EXIT_TAMPERED
        (refusal,) = [e for e in capsys.readouterr().err.splitlines() if "TAMPERED" in e]
        assert "rolled back" in refusal and last_known in refusal
        assert main([*verify, "--min-position", "5"]) == EXIT_TAMPERED

    def test_an_expectation_without_an_anchor_file_is_a_usage_error(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--expect-anchor alone would check nothing: exit 2 saying what is missing."""
        code = main(["audit", "verify", "--url", sqlite_url, "--expect-anchor", "ab" * 32])

        assert code == EXIT_USAGE
        assert "give --anchor" in capsys.readouterr().err

    def test_a_digest_that_is_not_one_is_refused_by_the_parser(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A truncated or mistyped digest is a one-line usage error, before anything runs."""
        with pytest.raises(SystemExit) as exit_:
            main(["audit", "verify", "--anchor", "a.json", "--expect-anchor", "abc"])

        assert exit_.value.code == EXIT_USAGE
        assert "64 hexadecimal digits" in capsys.readouterr().err
