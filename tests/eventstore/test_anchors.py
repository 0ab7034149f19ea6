"""Anchors: a signed head kept outside the log catches truncation and rewrites with recomputed
hashes, which the hash chain alone cannot see."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import shutil
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.eventstore import EventStore
from fleetledger.eventstore._chain import GENESIS_HASH, chain_hash, epoch_micros
from fleetledger.eventstore.anchors import (
    AUDIT_KEY_ENV,
    Anchor,
    AnchorError,
    AnchorRefused,
    Ed25519Signer,
    Ed25519Verifier,
    HmacKey,
    chain_problem,
    check_anchor,
    check_chain,
    hmac_key_from,
    make_anchor,
    read_anchor,
    read_chain,
    record_anchor,
    verifier_for,
)
from tests.eventstore.support import bypassing_append_only_guard, new_events

KEY = HmacKey(b"k" * 32)
AT = datetime(2026, 11, 26, 6, 0, tzinfo=UTC)


def rewrite_with_recomputed_hashes(store: EventStore, backend: str, position: int) -> None:
    """Change one event's data and recompute every hash from it to the head: a consistent
    forgery that the chain alone accepts."""
    bypassing_append_only_guard(
        store.engine,
        f"""UPDATE events SET data = '{{"n":999}}' WHERE global_position = {position}""",
    )
    backend_ = store._backend
    previous = GENESIS_HASH if position == 1 else backend_.hash_at(position - 1)
    assert previous is not None
    for row in backend_.chain_rows(after=position - 1, limit=1000):
        previous = chain_hash(
            previous,
            position=row.global_position,
            stream_id=row.stream_id,
            stream_version=row.stream_version,
            event_id=row.event_id,
            type=row.type,
            schema_version=row.schema_version,
            recorded_at_us=epoch_micros(row.recorded_at),
            data_text=row.data_text,
            metadata_text=row.metadata_text,
        )
        literal = f"X'{previous.hex()}'" if backend == "sqlite" else f"'\\x{previous.hex()}'"
        bypassing_append_only_guard(
            store.engine,
            f"UPDATE events SET hash = {literal} WHERE global_position = {row.global_position}",
        )


def ed25519_pair() -> tuple[bytes, bytes]:
    private = Ed25519PrivateKey.generate()
    return (
        private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()),
        private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo),
    )


class TestIntactLog:
    def test_an_anchor_of_the_head_checks(self, store: EventStore) -> None:
        """An anchor of an untouched log checks, and keeps checking as events are appended."""
        store.append("vm-1", new_events(5))
        anchor = make_anchor(store, KEY, at=AT)
        store.append("vm-1", new_events(3, start=5))

        check = check_anchor(store, anchor, KEY)

        assert (anchor.position, check.ok, check.head) == (5, True, 8)

    def test_an_empty_log_anchors_position_zero(self, store: EventStore) -> None:
        """An empty log's anchor is position 0, which any later log satisfies."""
        anchor = make_anchor(store, KEY, at=AT)
        store.append("vm-1", new_events(1))

        assert anchor.position == 0 and check_anchor(store, anchor, KEY).ok


class TestPositions:
    def test_an_earlier_position_can_be_anchored(self, store: EventStore) -> None:
        """``position`` anchors that event's hash rather than the head's."""
        store.append("vm-1", new_events(5))

        anchor = make_anchor(store, KEY, at=AT, position=3)

        assert (anchor.position, anchor.hash) == (3, store.read_all(after=2, limit=1)[0].hash)
        assert check_anchor(store, anchor, KEY).ok

    def test_a_position_the_log_does_not_hold_is_refused(self, store: EventStore) -> None:
        """Anchoring past the head (or below 0) is an AnchorError, not an anchor of nothing."""
        store.append("vm-1", new_events(2))

        with pytest.raises(AnchorError, match="no event at position 3"):
            make_anchor(store, KEY, at=AT, position=3)
        with pytest.raises(AnchorError, match="positions start at 1"):
            make_anchor(store, KEY, at=AT, position=-1)


class TestTamperingTheChainCannotSee:
    def test_a_deleted_tail_is_truncation(self, store: EventStore) -> None:
        """Deleting the last events leaves a valid chain, but not the anchored head."""
        store.append("vm-1", new_events(6))
        anchor = make_anchor(store, KEY, at=AT)

        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 4")

        assert store.verify().ok
        check = check_anchor(store, anchor, KEY)
        assert not check.ok and "truncated" in (check.reason or "")

    def test_a_rewrite_with_recomputed_hashes_is_found(
        self, store: EventStore, backend: str
    ) -> None:
        """A rewrite of anchored history whose hashes were recomputed verifies as a chain but
        no longer matches the anchored hash."""
        store.append("vm-1", new_events(6))
        anchor = make_anchor(store, KEY, at=AT)

        rewrite_with_recomputed_hashes(store, backend, 2)

        assert store.verify().ok
        check = check_anchor(store, anchor, KEY)
        assert not check.ok and "rewritten" in (check.reason or "")

    def test_a_rewrite_after_the_anchor_is_not_its_business(
        self, store: EventStore, backend: str
    ) -> None:
        """Events appended after the anchor are covered only by the next anchor: a documented
        limit, so a rewrite there leaves this anchor's check ok."""
        store.append("vm-1", new_events(3))
        anchor = make_anchor(store, KEY, at=AT)
        store.append("vm-1", new_events(3, start=3))

        rewrite_with_recomputed_hashes(store, backend, 5)

        assert check_anchor(store, anchor, KEY).ok


class TestForgedAnchors:
    def test_an_edited_anchor_fails_its_signature(self, sqlite_store: EventStore) -> None:
        """Lowering the anchored position (to excuse a truncation) breaks the signature."""
        sqlite_store.append("vm-1", new_events(4))
        anchor = make_anchor(sqlite_store, KEY, at=AT)
        lowered = dataclasses.replace(anchor, position=2)

        check = check_anchor(sqlite_store, lowered, KEY)

        assert not check.ok and "signature" in (check.reason or "")

    def test_another_key_fails_the_signature(self, sqlite_store: EventStore) -> None:
        """An anchor checked with a different HMAC key is refused."""
        sqlite_store.append("vm-1", new_events(1))
        anchor = make_anchor(sqlite_store, KEY, at=AT)

        assert not check_anchor(sqlite_store, anchor, HmacKey(b"o" * 32)).ok

    def test_a_key_of_the_wrong_kind_is_an_error(self, sqlite_store: EventStore) -> None:
        """An HMAC anchor checked with an Ed25519 key is a usage error naming the algorithm."""
        anchor = make_anchor(sqlite_store, KEY, at=AT)

        with pytest.raises(AnchorError, match="hmac-sha256"):
            check_anchor(sqlite_store, anchor, Ed25519Verifier(ed25519_pair()[1]))


class TestEd25519:
    def test_the_public_key_checks_what_the_private_key_signed(
        self, sqlite_store: EventStore
    ) -> None:
        """Verifiers need only the public key; another public key refuses the anchor."""
        private, public = ed25519_pair()
        sqlite_store.append("vm-1", new_events(2))
        anchor = make_anchor(sqlite_store, Ed25519Signer(private), at=AT)

        assert check_anchor(sqlite_store, anchor, Ed25519Verifier(public)).ok
        assert not check_anchor(sqlite_store, anchor, Ed25519Verifier(ed25519_pair()[1])).ok

    def test_the_verifier_for_a_signer_checks_its_anchors(self, sqlite_store: EventStore) -> None:
        """verifier_for derives the public key from an Ed25519 signer (and is the key itself
        for HMAC), so the signing side can check what it signed before."""
        private, public = ed25519_pair()
        signer = Ed25519Signer(private)
        anchor = make_anchor(sqlite_store, signer, at=AT)

        assert verifier_for(signer) == Ed25519Verifier(public)
        assert check_anchor(sqlite_store, anchor, verifier_for(signer)).ok
        assert verifier_for(KEY) is KEY

    def test_a_non_ed25519_key_is_refused(self) -> None:
        """Garbage in the key file is an AnchorError, not a traceback from the library."""
        with pytest.raises(AnchorError, match="Ed25519"):
            Ed25519Signer(b"not a key")


class TestKeys:
    def test_a_short_hmac_key_is_refused(self) -> None:
        """HMAC keys under 32 bytes are refused, saying how long they must be."""
        with pytest.raises(AnchorError, match="at least 32"):
            HmacKey(b"x" * 31)

    def test_the_key_comes_from_the_environment(self) -> None:
        """Without a key file, FLEETLEDGER_AUDIT_KEY is the key."""
        key = hmac_key_from(environ={AUDIT_KEY_ENV: "e" * 32})

        assert key.secret == b"e" * 32

    def test_no_key_at_all_says_where_to_put_one(self) -> None:
        """Neither a key file nor the variable: an error naming both."""
        with pytest.raises(AnchorError, match=AUDIT_KEY_ENV):
            hmac_key_from(environ={})

    def test_a_key_file_loses_its_trailing_newline(self, tmp_path: Path) -> None:
        """`echo $KEY > file` and the variable give the same key."""
        path = tmp_path / "key"
        path.write_text("f" * 32 + "\n")

        assert hmac_key_from(path).secret == b"f" * 32

    def test_the_secret_is_not_in_the_repr(self) -> None:
        """Logging a key object does not leak the secret."""
        assert "kkkk" not in repr(KEY)


class TestFiles:
    def test_record_anchor_writes_a_file_read_anchor_reads(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """The recorded anchor round-trips through its file and checks."""
        sqlite_store.append("vm-1", new_events(3))
        path = tmp_path / "anchor.json"

        recorded = record_anchor(sqlite_store, KEY, path, at=AT)

        assert read_anchor(path) == recorded
        assert check_anchor(sqlite_store, read_anchor(path), KEY).ok
        assert not list(tmp_path.glob(".*partial"))

    def test_a_failed_append_keeps_the_chain_whole(
        self, sqlite_store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """If the new anchor cannot be written, the file still holds the chain as it was."""
        sqlite_store.append("vm-1", new_events(2))
        path = tmp_path / "anchor.json"
        previous = record_anchor(sqlite_store, KEY, path, at=AT)
        sqlite_store.append("vm-1", new_events(2, start=2))

        def full(fd: int, data: object) -> int:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(AnchorError, match="No space left"):
            record_anchor(sqlite_store, KEY, path, at=AT)
        monkeypatch.undo()

        assert read_chain(path) == (previous,)

    def test_a_torn_last_line_is_skipped_and_then_repaired(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """A write cut short by a crash leaves half a line: readers skip it (it was never a
        signed anchor), and the next anchor rewrites the file without it."""
        sqlite_store.append("vm-1", new_events(2))
        path = tmp_path / "anchor.json"
        first = record_anchor(sqlite_store, KEY, path, at=AT)
        with path.open("a") as file:
            file.write(first.to_line()[:40])

        assert read_chain(path) == (first,)
        second = record_anchor(sqlite_store, KEY, path, at=AT)

        assert path.read_text() == first.to_line() + "\n" + second.to_line() + "\n"
        assert check_chain(sqlite_store, read_chain(path), KEY).ok

    def test_a_replaced_anchor_keeps_the_files_mode(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Replacing an anchor keeps the permissions its owner gave the file; a new file is
        readable by auditors (an anchor is no secret)."""
        path = tmp_path / "anchor.json"
        record_anchor(sqlite_store, KEY, path, at=AT)
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o640)

        record_anchor(sqlite_store, KEY, path, at=AT)

        assert path.stat().st_mode & 0o777 == 0o640

    def test_a_file_that_is_not_an_anchor_is_refused(self, tmp_path: Path) -> None:
        """A JSON file of another shape is an AnchorError saying it is not an anchor."""
        path = tmp_path / "other.json"
        path.write_text(json.dumps({"position": 3}))

        with pytest.raises(AnchorError, match="not a fleetledger anchor"):
            read_anchor(path)

    def test_json_round_trip_keeps_every_field(self) -> None:
        """to_json and from_json are inverses."""
        anchor = Anchor(
            position=7, hash="ab" * 32, anchored_at=AT, algorithm="ed25519", signature="c2ln"
        )

        assert Anchor.from_json(anchor.to_json()) == anchor


class TestSignatureCoversEveryField:
    @given(
        position=st.integers(min_value=0, max_value=2**62),
        digest=st.binary(min_size=32, max_size=32),
        moved=st.integers(min_value=1, max_value=2**40),
        sequence=st.integers(min_value=1, max_value=2**40),
        field_=st.sampled_from(["position", "hash", "anchored_at", "sequence", "previous"]),
    )
    def test_changing_any_signed_field_breaks_the_signature(
        self, position: int, digest: bytes, moved: int, sequence: int, field_: str
    ) -> None:
        """Whatever an anchor says, altering its position, hash, time, place in the chain or
        predecessor invalidates it."""
        original = Anchor(
            position=position,
            hash=digest.hex(),
            anchored_at=AT,
            algorithm="hmac-sha256",
            signature="",
            sequence=sequence,
            previous=digest.hex(),
        )
        signature = KEY.sign(original.payload())
        changed = {
            "position": dataclasses.replace(original, position=position + moved),
            "hash": dataclasses.replace(original, hash=bytes(b ^ 0xFF for b in digest).hex()),
            "anchored_at": dataclasses.replace(
                original, anchored_at=AT.replace(microsecond=moved % 1_000_000 or 1)
            ),
            "sequence": dataclasses.replace(original, sequence=sequence + moved),
            "previous": dataclasses.replace(original, previous=None),
        }[field_]

        assert KEY.verify(original.payload(), signature)
        assert not KEY.verify(changed.payload(), signature)


def chain_of(store: EventStore, path: Path, count: int, *, events: int = 2) -> list[Anchor]:
    """``count`` anchors recorded into ``path``, ``events`` appended before each."""
    anchors = []
    for n in range(count):
        store.append("vm-1", new_events(events, start=n * events))
        anchors.append(record_anchor(store, KEY, path, at=AT))
    return anchors


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def resigned(anchor: Anchor, **changes: object) -> Anchor:
    """``anchor`` changed and signed again with KEY: what only a key holder can make."""
    changed = dataclasses.replace(anchor, **changes)  # type: ignore[arg-type]
    signature = base64.b64encode(KEY.sign(changed.payload())).decode()
    return dataclasses.replace(changed, signature=signature)


class TestChain:
    def test_anchors_recorded_into_one_file_form_a_chain(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Each anchor is appended as a line, numbered, and signs the digest of the one
        before; the chain checks against the log."""
        path = tmp_path / "anchors.jsonl"

        anchors = chain_of(sqlite_store, path, 3)

        assert read_chain(path) == tuple(anchors)
        assert [(a.sequence, a.position) for a in anchors] == [(1, 2), (2, 4), (3, 6)]
        assert [a.previous for a in anchors] == [None, anchors[0].digest(), anchors[1].digest()]
        assert lines(path) == [a.to_line() for a in anchors]
        check = check_chain(sqlite_store, anchors, KEY)
        assert (check.ok, check.position, check.sequence) == (True, 6, 3)
        assert check.digest == anchors[-1].digest()

    @pytest.mark.parametrize(
        ("edit", "reason"),
        [
            (lambda ls: [ls[0], ls[2], ls[3]], "anchor 3 (line 2) does not follow anchor 1"),
            (lambda ls: [ls[0], ls[2], ls[1], ls[3]], "does not follow"),
            (lambda ls: ls[1:], "the chain starts at anchor 2"),
            (lambda ls: [ls[0], ls[1].replace('"position":4', '"position":5'), *ls[2:]],
             "anchor 2 (line 2) does not verify"),
        ],
        ids=["removed-from-the-middle", "reordered", "beginning-removed", "altered"],
    )  # fmt: skip
    def test_a_chain_edited_anywhere_but_its_end_is_broken(
        self, sqlite_store: EventStore, tmp_path: Path, edit: Any, reason: str
    ) -> None:
        """Removing, reordering or altering anchors breaks the chain, saying where."""
        path = tmp_path / "anchors.jsonl"
        chain_of(sqlite_store, path, 4)
        path.write_text("\n".join(edit(lines(path))) + "\n")

        check = check_chain(sqlite_store, read_chain(path), KEY)

        assert not check.ok and reason in (check.reason or "")

    def test_an_anchor_going_back_in_position_breaks_the_chain(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """A later anchor of a lower position was signed over a truncated log: even genuine,
        it does not belong in the chain (the recorder never writes one)."""
        path = tmp_path / "anchors.jsonl"
        first, second = chain_of(sqlite_store, path, 2)
        back = resigned(
            second, position=1, hash=sqlite_store.read_all(limit=1)[0].hash, signature=""
        )
        back = resigned(back, sequence=3, previous=second.digest())

        assert chain_problem([first, second, back], KEY) == (
            "anchor 3 goes back to position 1 from 4: it was signed over a truncated log"
        )

    def test_writers_in_threads_append_one_chain(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Writers racing on one file take turns (a lock on its directory): every anchor
        follows the one before, none is lost."""
        sqlite_store.append("vm-1", new_events(1))
        path = tmp_path / "anchors.jsonl"

        def anchor_five() -> None:
            for _ in range(5):
                record_anchor(sqlite_store, KEY, path, at=AT)

        writers = [threading.Thread(target=anchor_five) for _ in range(3)]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(60)

        chain = read_chain(path)
        assert len(chain) == 15 and chain_problem(chain, KEY) is None


class TestRollback:
    def test_a_rolled_back_file_and_a_truncated_log_agree_without_an_expectation(
        self, store: EventStore, tmp_path: Path
    ) -> None:
        """The documented limit: an older copy of the file is a valid chain, and a log cut back
        to its newest anchor matches it. Nothing in the file or the log can tell."""
        path = tmp_path / "anchors.jsonl"
        chain_of(store, path, 1)
        older = path.read_bytes()
        chain_of(store, path, 2)

        path.write_bytes(older)
        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 2")

        assert store.verify().ok
        assert check_chain(store, read_chain(path), KEY).ok

    def test_the_last_known_digest_catches_the_rollback(
        self, store: EventStore, tmp_path: Path
    ) -> None:
        """Given the digest of the newest anchor seen before, the older copy no longer holds
        it: the rollback is reported, naming the anchor the file now ends with."""
        path = tmp_path / "anchors.jsonl"
        chain_of(store, path, 1)
        older = path.read_bytes()
        *_, newest = chain_of(store, path, 2)
        path.write_bytes(older)
        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 2")

        check = check_chain(store, read_chain(path), KEY, expect=newest.digest().upper())

        assert not check.ok
        assert f"does not hold the expected anchor {newest.digest()}" in (check.reason or "")
        assert "rolled back" in (check.reason or "") and "anchor 1, position 2" in (
            check.reason or ""
        )

    def test_the_last_known_position_catches_the_rollback(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Given a position anchored before, a newest anchor below it is a rollback."""
        path = tmp_path / "anchors.jsonl"
        chain_of(sqlite_store, path, 1)
        older = path.read_bytes()
        chain_of(sqlite_store, path, 1)
        path.write_bytes(older)

        check = check_chain(sqlite_store, read_chain(path), KEY, min_position=4)

        assert not check.ok and "below the expected 4" in (check.reason or "")

    def test_an_expectation_older_than_the_newest_anchor_passes(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """The chain grows past the anchor the verifier knew: still held, so it checks."""
        path = tmp_path / "anchors.jsonl"
        known, *_ = chain_of(sqlite_store, path, 3)

        check = check_chain(
            sqlite_store, read_chain(path), KEY, expect=known.digest(), min_position=2
        )

        assert check.ok and check.sequence == 3

    def test_truncation_below_the_newest_anchor_is_still_caught(
        self, store: EventStore, tmp_path: Path
    ) -> None:
        """With the chain in place, a deleted tail is truncation, as with a single anchor."""
        path = tmp_path / "anchors.jsonl"
        chain_of(store, path, 3)
        bypassing_append_only_guard(store.engine, "DELETE FROM events WHERE global_position > 5")

        check = check_chain(store, read_chain(path), KEY)

        assert not check.ok and "truncated: its head is 5, below the anchored position 6" in (
            check.reason or ""
        )


class TestRecordAnchorKeepsEvidence:
    def test_a_truncated_log_is_not_anchored(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Recording checks the log against the newest anchor first: nothing is appended."""
        path = tmp_path / "anchors.jsonl"
        chain_of(sqlite_store, path, 2)
        before = path.read_bytes()
        bypassing_append_only_guard(
            sqlite_store.engine, "DELETE FROM events WHERE global_position > 3"
        )

        with pytest.raises(AnchorRefused, match="truncated"):
            record_anchor(sqlite_store, KEY, path, at=AT)

        assert path.read_bytes() == before

    def test_a_file_without_the_known_anchor_is_not_appended_to(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """A writer that knows its last anchor refuses a file that no longer holds it."""
        path = tmp_path / "anchors.jsonl"
        chain_of(sqlite_store, path, 1)
        older = path.read_bytes()
        *_, known = chain_of(sqlite_store, path, 1)
        path.write_bytes(older)

        with pytest.raises(AnchorRefused, match=r"no longer holds anchor 2 .* rolled back"):
            record_anchor(sqlite_store, KEY, path, at=AT, known=known)

        assert path.read_bytes() == older

    def test_a_chain_signed_with_another_key_is_not_appended_to(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Another key's chain is not extended: move it aside to start a new series."""
        path = tmp_path / "anchors.jsonl"
        record_anchor(sqlite_store, HmacKey(b"o" * 32), path, at=AT)

        with pytest.raises(AnchorRefused, match=r"does not verify with this key.*move it aside"):
            record_anchor(sqlite_store, KEY, path, at=AT)


def legacy_anchor_text(store: EventStore, position: int) -> str:
    """A single anchor as files held it before chains, signed here independently of the code
    under test: format 1, indented JSON, HMAC over the canonical fields."""
    body = {
        "format": "fleetledger-anchor/1",
        "position": position,
        "hash": store.read_all(after=position - 1, limit=1)[0].hash,
        "anchored_at": AT.isoformat(),
        "algorithm": "hmac-sha256",
    }
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    signature = hmac.new(KEY.secret, payload, hashlib.sha256).digest()
    return json.dumps({**body, "signature": base64.b64encode(signature).decode()}, indent=2)


class TestAnchorsFromBeforeChains:
    def test_a_single_anchor_file_still_verifies(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """An existing anchor file is read as a chain of one, and checks as before."""
        sqlite_store.append("vm-1", new_events(3))
        path = tmp_path / "anchor.json"
        path.write_text(legacy_anchor_text(sqlite_store, 3) + "\n")

        (legacy,) = read_chain(path)

        assert legacy.legacy and legacy.position == 3
        assert check_chain(sqlite_store, [legacy], KEY).ok
        bypassing_append_only_guard(
            sqlite_store.engine, "DELETE FROM events WHERE global_position > 2"
        )
        assert "truncated" in (check_chain(sqlite_store, [legacy], KEY).reason or "")

    def test_recording_into_it_continues_the_chain_from_it(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """The next anchor follows the old one (sequence 1, its digest as predecessor); the file
        is rewritten once, one anchor per line, and appended to from then on."""
        sqlite_store.append("vm-1", new_events(3))
        path = tmp_path / "anchor.json"
        path.write_text(legacy_anchor_text(sqlite_store, 3) + "\n")
        (legacy,) = read_chain(path)
        sqlite_store.append("vm-1", new_events(1, start=3))

        upcast = record_anchor(sqlite_store, KEY, path, at=AT)
        shutil.copy(path, tmp_path / "after-upcast")
        appended = record_anchor(sqlite_store, KEY, path, at=AT)

        assert (upcast.sequence, upcast.previous, upcast.position) == (1, legacy.digest(), 4)
        assert read_chain(path) == (legacy, upcast, appended)
        assert lines(path)[:2] == lines(tmp_path / "after-upcast")
        assert check_chain(sqlite_store, read_chain(path), KEY, expect=legacy.digest()).ok

    def test_a_pre_chain_anchor_cannot_follow_others(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """A format-1 anchor has no predecessor to sign: spliced into a chain, it breaks it."""
        sqlite_store.append("vm-1", new_events(3))
        path = tmp_path / "anchors.jsonl"
        (first,) = chain_of(sqlite_store, path, 1)
        legacy = Anchor.from_json(legacy_anchor_text(sqlite_store, 3))

        assert "pre-chain anchor" in (chain_problem([first, legacy], KEY) or "")


class TestLongChains:
    def long_chain(self, store: EventStore, path: Path, count: int) -> list[Anchor]:
        """``count`` anchors of the empty log written straight into ``path``: a file past the
        64 KiB the writers read from its end."""
        chain: list[Anchor] = []
        for _ in range(count):
            chain.append(make_anchor(store, KEY, at=AT, after=chain[-1] if chain else None))
        path.write_text("".join(anchor.to_line() + "\n" for anchor in chain))
        assert path.stat().st_size > 64 * 1024
        return chain

    def test_the_newest_anchor_is_read_from_the_end(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """read_anchor and an append after the last known anchor find it at the end."""
        path = tmp_path / "anchors.jsonl"
        chain = self.long_chain(sqlite_store, path, 400)

        assert read_anchor(path) == chain[-1]
        appended = record_anchor(sqlite_store, KEY, path, at=AT, known=chain[-1])

        assert appended.sequence == 401 and appended.previous == chain[-1].digest()
        assert chain_problem(read_chain(path), KEY) is None

    def test_a_known_anchor_older_than_the_end_is_still_found(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Another writer appended many since: the whole file is read to find the known anchor,
        and the anchors after it are checked before appending."""
        path = tmp_path / "anchors.jsonl"
        chain = self.long_chain(sqlite_store, path, 400)

        appended = record_anchor(sqlite_store, KEY, path, at=AT, known=chain[5])

        assert appended.sequence == 401

    def test_a_long_chain_rolled_back_is_refused(
        self, sqlite_store: EventStore, tmp_path: Path
    ) -> None:
        """Cut back by a few anchors (an older copy), the file no longer holds the known one."""
        path = tmp_path / "anchors.jsonl"
        chain = self.long_chain(sqlite_store, path, 400)
        path.write_text("".join(anchor.to_line() + "\n" for anchor in chain[:-3]))

        with pytest.raises(AnchorRefused, match=r"no longer holds anchor 400 .* but anchor 397"):
            record_anchor(sqlite_store, KEY, path, at=AT, known=chain[-1])
