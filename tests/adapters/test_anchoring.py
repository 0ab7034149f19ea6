"""The anchor recorder: the leader anchors the head into a file, periodically and at stop; a
follower never writes; an anchor it wrote verifies, and truncation below it is caught."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from structlog.testing import capture_logs

from fleetledger.adapters.anchoring import AnchoringRefused, AnchorRecorder
from fleetledger.adapters.cli import EXIT_ERROR, EXIT_TAMPERED, EXIT_USAGE, main
from fleetledger.adapters.clock import ManualClock, SystemClock
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore.anchors import (
    AUDIT_KEY_ENV,
    AnchorError,
    Ed25519Signer,
    Ed25519Verifier,
    HmacKey,
    chain_problem,
    check_anchor,
    make_anchor,
    read_anchor,
    read_chain,
)
from tests.eventstore.support import bypassing_append_only_guard, new_events

SECRET = "a" * 32
KEY = HmacKey(SECRET.encode())
EPOCH = datetime(2026, 11, 26, 8, 0, tzinfo=UTC)
EVERY = 60.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(EPOCH)


@pytest.fixture
def anchor_file(tmp_path: Path) -> Path:
    return tmp_path / "anchors" / "anchor.json"


@pytest.fixture(autouse=True)
def anchor_directory(anchor_file: Path) -> None:
    anchor_file.parent.mkdir()


def recorder(
    store: EventStore,
    path: Path,
    clock: ManualClock,
    *,
    leadership: Leadership | None = None,
    signer: HmacKey | Ed25519Signer = KEY,
) -> AnchorRecorder:
    return AnchorRecorder(
        store, signer, path, clock=clock, every_seconds=EVERY, leadership=leadership, threads=False
    )


def elector(
    store: EventStore, board: dict[str, str], holder: str, clock: ManualClock
) -> Leadership:
    return Leadership(store, MemoryLease(board, holder=holder), clock=clock, holder=holder)


def audit_verify(url: str, anchor: Path) -> int:
    return main(
        ["audit", "verify", "--url", url, "--anchor", str(anchor), "--key-file", key_file(anchor)]
    )


def key_file(beside: Path) -> str:
    path = beside.parent.parent / "audit.key"
    path.write_text(SECRET + "\n")
    return str(path)


class TestLeaderOnly:
    def test_the_leader_writes_and_the_follower_does_not(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """Of two controllers on one log and one anchor file, only the elected one writes."""
        board: dict[str, str] = {}
        first, second = elector(store, board, "a", clock), elector(store, board, "b", clock)
        assert (first.step(), second.step()) == ("leader", "follower")
        leading = recorder(store, anchor_file, clock, leadership=first).start()
        following = recorder(store, anchor_file, clock, leadership=second).start()
        store.append("vm-1", new_events(3))

        assert following.record_now() is None
        assert not anchor_file.exists()
        written = leading.record_now()

        assert written is not None and written.position == store.head()
        assert read_anchor(anchor_file) == written
        clock.advance(EVERY)
        assert following.tick() is None
        assert read_anchor(anchor_file) == written

    def test_a_deposed_leader_stops_writing_and_the_new_one_anchors_at_once(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """Losing the lease ends the anchoring; the next leader anchors on its first tick,
        without waiting a period."""
        board: dict[str, str] = {}
        first, second = elector(store, board, "a", clock), elector(store, board, "b", clock)
        first.step()
        old = recorder(store, anchor_file, clock, leadership=first).start()
        new = recorder(store, anchor_file, clock, leadership=second).start()
        assert old.tick() is not None
        board.clear()  # the old leader's lease lapsed
        assert first.step() == "follower"
        assert second.step() == "leader"
        store.append("vm-1", new_events(2))

        assert old.record_now() is None
        anchored = new.tick()

        assert anchored is not None and anchored.position == store.head()
        assert read_anchor(anchor_file) == anchored

    def test_without_leadership_a_started_recorder_leads(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """One process and no election: it anchors from start to stop, and not before start."""
        alone = recorder(store, anchor_file, clock)
        assert alone.record_now() is None

        alone.start()

        assert alone.record_now() is not None


class TestPeriod:
    def test_it_anchors_again_once_the_period_has_passed(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """A tick within the period writes nothing; the first tick after it anchors the head."""
        alone = recorder(store, anchor_file, clock).start()
        first = alone.tick()
        store.append("vm-1", new_events(4))

        clock.advance(EVERY - 1)
        assert alone.tick() is None
        assert read_anchor(anchor_file) == first
        clock.advance(1)
        second = alone.tick()

        assert first is not None and second is not None
        assert (first.position, second.position) == (0, 4)
        assert second.anchored_at == EPOCH.replace(minute=1)
        assert read_anchor(anchor_file) == second

    def test_stop_anchors_the_head_once_more(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """Appends made since the last period are anchored when the leader stops."""
        alone = recorder(store, anchor_file, clock).start()
        alone.tick()
        store.append("vm-1", new_events(2))

        alone.stop()

        assert read_anchor(anchor_file).position == 2
        store.append("vm-1", new_events(1, start=2))
        assert alone.record_now() is None  # stopped: no longer leading

    def test_a_follower_stops_without_writing(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """A stopping follower leaves the leader's anchor file alone."""
        board = {"leader": "someone else"}
        following = recorder(
            store, anchor_file, clock, leadership=elector(store, board, "b", clock)
        ).start()

        following.stop()

        assert not anchor_file.exists()

    def test_the_thread_starts_and_stops_with_a_final_anchor(
        self, store: EventStore, anchor_file: Path
    ) -> None:
        """With its thread, start and stop return promptly and the head is anchored by stop."""
        store.append("vm-1", new_events(2))
        threaded = AnchorRecorder(
            store, KEY, anchor_file, clock=SystemClock(), every_seconds=3600, threads=True
        )

        threaded.start()
        store.append("vm-1", new_events(1, start=2))
        threaded.stop(timeout=10)

        assert read_anchor(anchor_file).position == 3
        assert not [t for t in threading.enumerate() if t.name == "anchoring"]


class TestWhatTheAnchorsShow:
    def test_an_anchor_it_wrote_verifies(
        self, store: EventStore, store_url: str, anchor_file: Path, clock: ManualClock
    ) -> None:
        """`audit verify --anchor` accepts the recorder's anchor while the log only grows."""
        store.append("vm-1", new_events(3))
        recorder(store, anchor_file, clock).start().record_now()
        store.append("vm-1", new_events(2, start=3))

        assert check_anchor(store, read_anchor(anchor_file), KEY).ok
        assert audit_verify(store_url, anchor_file) == 0

    def test_truncation_below_it_is_detected(
        self,
        store: EventStore,
        store_url: str,
        anchor_file: Path,
        clock: ManualClock,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A tail deleted past the guard leaves a valid chain, but `audit verify --anchor`
        exits 3 saying the log was truncated."""
        store.append("vm-1", new_events(5))
        recorder(store, anchor_file, clock).start().record_now()

        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 3")

        assert store.verify().ok
        assert audit_verify(store_url, anchor_file) == EXIT_TAMPERED
        assert "truncated" in capsys.readouterr().err

    def test_ed25519_anchors_verify_with_the_public_key(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """Signed by the recorder with the private key, checked with only the public one."""
        private = Ed25519PrivateKey.generate()
        signer = Ed25519Signer(
            private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        )
        public = Ed25519Verifier(
            private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        store.append("vm-1", new_events(2))
        alone = recorder(store, anchor_file, clock, signer=signer).start()
        alone.record_now()
        store.append("vm-1", new_events(1, start=2))

        clock.advance(EVERY)
        assert alone.tick() is not None
        assert check_anchor(store, read_anchor(anchor_file), public).ok


class TestEvidenceIsKept:
    def test_a_truncated_log_is_not_anchored_over_its_anchor(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """After a truncation the next anchor is refused and the file still shows the cut."""
        store.append("vm-1", new_events(5))
        alone = recorder(store, anchor_file, clock).start()
        before = alone.record_now()
        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 3")

        with pytest.raises(AnchoringRefused, match="truncated"):
            alone.record_now()

        assert read_anchor(anchor_file) == before
        assert not check_anchor(store, read_anchor(anchor_file), KEY).ok

    def test_a_broken_chain_after_the_anchor_is_not_signed(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """An edit after the anchored head breaks the chain; the recorder refuses to sign it."""
        store.append("vm-1", new_events(2))
        alone = recorder(store, anchor_file, clock).start()
        before = alone.record_now()
        store.append("vm-1", new_events(3, start=2))
        bypassing_append_only_guard(
            store.engine, """UPDATE events SET data = '{"n":99}' WHERE global_position = 4"""
        )

        with pytest.raises(AnchoringRefused, match="position 4"):
            alone.record_now()

        assert read_anchor(anchor_file) == before

    def test_an_anchor_file_replaced_by_another_key_is_not_overwritten(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """A file swapped for one this key did not sign, while running, is left alone."""
        store.append("vm-1", new_events(2))
        alone = recorder(store, anchor_file, clock).start()
        alone.record_now()
        foreign = make_anchor(store, HmacKey(b"o" * 32), at=EPOCH).to_json()
        anchor_file.write_text(foreign)

        with pytest.raises(AnchoringRefused, match="does not verify with this key"):
            alone.record_now()

        assert anchor_file.read_text() == foreign

    def test_a_refusal_at_stop_is_logged_not_raised(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """Stopping on a truncated log keeps the file and logs an error saying how to look
        into it, rather than failing the shutdown."""
        store.append("vm-1", new_events(4))
        alone = recorder(store, anchor_file, clock).start()
        before = alone.record_now()
        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 2")

        with capture_logs() as logs:
            alone.stop()

        assert read_anchor(anchor_file) == before
        errors = [e for e in logs if e["log_level"] == "error"]
        assert len(errors) == 1 and "audit verify --anchor" in errors[0]["event"]
        assert "truncated" in errors[0]["reason"]


class TestChain:
    def test_every_anchor_is_kept_as_a_chain(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """Each period appends an anchor to the file, following the one before."""
        alone = recorder(store, anchor_file, clock).start()
        for n in range(3):
            store.append("vm-1", new_events(2, start=2 * n))
            assert alone.tick() is not None
            clock.advance(EVERY)

        chain = read_chain(anchor_file)

        assert [(a.sequence, a.position) for a in chain] == [(1, 2), (2, 4), (3, 6)]
        assert chain_problem(chain, KEY) is None

    def test_a_file_rolled_back_while_running_is_not_appended_to(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """The file replaced by an older genuine copy no longer holds the anchor this leader
        wrote last: refused, the copy kept as it is, and the error names the rollback."""
        alone = recorder(store, anchor_file, clock).start()
        store.append("vm-1", new_events(2))
        alone.record_now()
        older = anchor_file.read_bytes()
        store.append("vm-1", new_events(2, start=2))
        alone.record_now()

        anchor_file.write_bytes(older)
        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 2")

        with pytest.raises(AnchoringRefused, match="rolled back"):
            alone.record_now()
        assert anchor_file.read_bytes() == older

    def test_leaders_one_after_another_extend_one_chain(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """The next leader continues the chain its predecessor wrote, and the old one, leading
        again later, continues the new one's: one chain, never a fork."""
        board: dict[str, str] = {}
        first, second = elector(store, board, "a", clock), elector(store, board, "b", clock)
        first.step()
        a = recorder(store, anchor_file, clock, leadership=first).start()
        b = recorder(store, anchor_file, clock, leadership=second).start()
        store.append("vm-1", new_events(2))
        assert a.record_now() is not None
        for n, (leader, lease, deposed) in enumerate([(b, second, first), (a, first, second)]):
            board.clear()  # the leader's lease lapsed
            assert (deposed.step(), lease.step()) == ("follower", "leader")
            store.append("vm-1", new_events(2, start=2 * n + 2))
            assert leader.record_now() is not None

        chain = read_chain(anchor_file)

        # Each election is in the log too: positions grow by more than the appended events.
        assert [x.sequence for x in chain] == [1, 2, 3]
        assert chain[0].position < chain[1].position < chain[2].position == store.head()
        assert chain_problem(chain, KEY) is None

    def test_a_file_from_before_chains_is_continued(
        self, store: EventStore, store_url: str, anchor_file: Path, clock: ManualClock
    ) -> None:
        """An anchor file written before chains (one indented anchor) is taken up: the next
        anchor follows it, and `audit verify --anchor` accepts the result."""
        store.append("vm-1", new_events(2))
        legacy = dataclasses.replace(
            make_anchor(store, KEY, at=EPOCH), format="fleetledger-anchor/1", sequence=0
        )
        legacy = dataclasses.replace(
            legacy, signature=base64.b64encode(KEY.sign(legacy.payload())).decode()
        )
        anchor_file.write_text(legacy.to_json() + "\n")
        alone = recorder(store, anchor_file, clock).start()
        store.append("vm-1", new_events(1, start=2))

        written = alone.record_now()

        assert written is not None and written.previous == legacy.digest()
        assert read_chain(anchor_file) == (legacy, written)
        assert audit_verify(store_url, anchor_file) == 0


class TestConfiguration:
    def test_an_anchor_file_from_another_key_is_refused_at_construction(
        self, store: EventStore, anchor_file: Path, clock: ManualClock
    ) -> None:
        """A file this key cannot verify is not silently replaced: it says how to proceed."""
        anchor_file.write_text(make_anchor(store, HmacKey(b"o" * 32), at=EPOCH).to_json())

        with pytest.raises(AnchorError, match="move it aside"):
            recorder(store, anchor_file, clock)

    def test_a_missing_directory_is_refused(self, store: EventStore, tmp_path: Path) -> None:
        """The directory must exist: anchors are not written into one made up on the spot."""
        with pytest.raises(ValueError, match="create it"):
            recorder(store, tmp_path / "nowhere" / "anchor.json", ManualClock(EPOCH))

    @pytest.mark.parametrize("every", [0.0, -5.0, float("inf"), float("nan")])
    def test_a_period_that_cannot_work_is_refused(
        self, store: EventStore, anchor_file: Path, every: float
    ) -> None:
        """Zero, negative, infinite or NaN periods are refused with the range that works."""
        with pytest.raises(ValueError, match="anchor period"):
            AnchorRecorder(store, KEY, anchor_file, clock=ManualClock(EPOCH), every_seconds=every)


class TestServeOptions:
    def test_an_anchor_file_without_a_key_is_refused_at_start(
        self,
        sqlite_url: str,
        anchor_file: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """No key: a usage error naming where the key goes; nothing is written."""
        monkeypatch.delenv(AUDIT_KEY_ENV, raising=False)

        code = main(["serve", "--url", sqlite_url, "--anchor-file", str(anchor_file)])

        assert code == EXIT_USAGE
        assert AUDIT_KEY_ENV in capsys.readouterr().err
        assert not anchor_file.exists()

    def test_a_short_key_is_refused_at_start(
        self,
        sqlite_url: str,
        anchor_file: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A key under 32 bytes is a usage error saying how long it must be."""
        monkeypatch.setenv(AUDIT_KEY_ENV, "short")

        code = main(["serve", "--url", sqlite_url, "--anchor-file", str(anchor_file)])

        assert code == EXIT_USAGE
        assert "at least 32" in capsys.readouterr().err

    def test_a_key_without_an_anchor_file_is_refused(
        self, sqlite_url: str, anchor_file: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A signing key given alone would sign nothing: say what is missing."""
        code = main(["serve", "--url", sqlite_url, "--key-file", key_file(anchor_file)])

        assert code == EXIT_USAGE
        assert "--anchor-file" in capsys.readouterr().err

    def test_an_anchor_file_this_key_cannot_verify_stops_serve(
        self,
        sqlite_url: str,
        anchor_file: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """An anchor from another key is neither served over nor replaced: exit 1 saying how
        to go on, and the file is as it was."""
        monkeypatch.setenv(AUDIT_KEY_ENV, SECRET)
        with contextlib.closing(open_store(sqlite_url)) as store:
            foreign = make_anchor(store, HmacKey(b"o" * 32), at=EPOCH).to_json()
        anchor_file.write_text(foreign)

        code = main(
            ["serve", "--url", sqlite_url, "--port", "0", "--anchor-file", str(anchor_file)]
        )

        assert code == EXIT_ERROR
        assert "move it aside" in capsys.readouterr().err
        assert anchor_file.read_text() == foreign


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(sqlite_url: str, anchor_file: Path) -> Iterator[subprocess.Popen[str]]:
    """`fleetledger serve --anchor-file` in a process of its own, killed if a test hangs."""
    process = subprocess.Popen(
        [
            sys.executable, "-m", "fleetledger", "--log-json", "serve",
            "--url", sqlite_url, "--port", str(_free_port()), "--fake-latency", "0",
            "--anchor-file", str(anchor_file), "--anchor-every", "3600",
        ],
        env={**os.environ, AUDIT_KEY_ENV: SECRET},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    try:
        yield process
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


class TestServe:
    def test_serve_anchors_when_elected_and_at_stop(
        self, served: subprocess.Popen[str], sqlite_url: str, anchor_file: Path
    ) -> None:
        """The leader anchors once elected (its election is in the log) and again on SIGTERM;
        the file verifies against the log."""
        assert served.stdout is not None
        seen: list[str] = []
        positions = []
        for line in served.stdout:  # ends at EOF if the process dies (or the watchdog kills it)
            seen.append(line)
            if line.startswith("{") and json.loads(line).get("event") == "anchored the log":
                positions.append(json.loads(line)["position"])
                break
        assert positions and positions[0] >= 1, "the leader never anchored:\n" + "".join(seen)

        served.send_signal(signal.SIGTERM)
        rest, _ = served.communicate(timeout=60)

        assert served.returncode == 0, rest
        assert "anchored the log" in rest
        assert audit_verify(sqlite_url, anchor_file) == 0
