"""Anchors: a signed head kept outside the log catches truncation and rewrites with recomputed
hashes, which the hash chain alone cannot see."""

from __future__ import annotations

import dataclasses
import json
import os
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
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.eventstore import EventStore
from fleetledger.eventstore._chain import GENESIS_HASH, chain_hash, epoch_micros
from fleetledger.eventstore.anchors import (
    AUDIT_KEY_ENV,
    Anchor,
    AnchorError,
    Ed25519Signer,
    Ed25519Verifier,
    HmacKey,
    check_anchor,
    hmac_key_from,
    make_anchor,
    read_anchor,
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

    def test_a_failed_replace_keeps_the_previous_anchor_whole(
        self, sqlite_store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """If the new anchor cannot be put in place, the file still holds the previous one,
        and no temporary file is left behind."""
        sqlite_store.append("vm-1", new_events(2))
        (tmp_path / "anchors").mkdir()
        path = tmp_path / "anchors" / "anchor.json"
        previous = record_anchor(sqlite_store, KEY, path, at=AT)
        sqlite_store.append("vm-1", new_events(2, start=2))

        def crash(source: object, target: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "replace", crash)
        with pytest.raises(AnchorError, match="No space left"):
            record_anchor(sqlite_store, KEY, path, at=AT)
        monkeypatch.undo()

        assert read_anchor(path) == previous
        assert [p.name for p in path.parent.iterdir()] == ["anchor.json"]

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
        field_=st.sampled_from(["position", "hash", "anchored_at"]),
    )
    def test_changing_any_signed_field_breaks_the_signature(
        self, position: int, digest: bytes, moved: int, field_: str
    ) -> None:
        """Whatever an anchor says, altering its position, hash or time invalidates it."""
        original = Anchor(
            position=position,
            hash=digest.hex(),
            anchored_at=AT,
            algorithm="hmac-sha256",
            signature="",
        )
        signature = KEY.sign(original.payload())
        changed = {
            "position": dataclasses.replace(original, position=position + moved),
            "hash": dataclasses.replace(original, hash=bytes(b ^ 0xFF for b in digest).hex()),
            "anchored_at": dataclasses.replace(
                original, anchored_at=AT.replace(microsecond=moved % 1_000_000 or 1)
            ),
        }[field_]

        assert KEY.verify(original.payload(), signature)
        assert not KEY.verify(changed.payload(), signature)
