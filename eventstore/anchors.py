"""Signed anchors: the log's head written down outside the events table, to check it against.

The hash chain alone (``EventStore.verify``) proves that every event follows from the ones before
it. It cannot see what an attacker with write access to the database does consistently:

* **Detected without an anchor:** a changed, inserted or deleted event *inside* the log whose
  later hashes were left alone; a gap in the global positions; a stored hash that was edited.
* **Not detected without an anchor:** a deleted tail (the last event or the last thousand: what is
  left is still a valid chain), and a rewrite of any event whose hashes were recomputed from that
  point to the head (the chain is public, unkeyed SHA-256, so anyone can recompute it).

An anchor is ``(position, hash at that position, time)`` signed with a key the database does not
hold. ``check_anchor`` together with ``EventStore.verify`` then also detects:

* **truncation below the anchored head:** the log's head is below the anchored position;
* **any rewrite of anchored history,** even with recomputed hashes: the hash at the anchored
  position commits, through the chain, to every event up to it, so it no longer matches.

Still not detected with an anchor: changes made *after* the newest anchor (rewrites of events
beyond it, or a tail cut back to exactly the anchored head), and anything done by someone who holds
the signing key and can replace the anchor file. Anchor often (``fleetledger serve
--anchor-file`` does, on the leader) and keep anchors where the database's writers cannot write.

Two signatures: HMAC-SHA256 under a shared secret of at least 32 bytes (from a key file or
``FLEETLEDGER_AUDIT_KEY``), or Ed25519, so that verifiers need only the public key and cannot sign.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from fleetledger.eventstore._store import EventStore
from fleetledger.eventstore.errors import EventStoreError

__all__ = [
    "AUDIT_KEY_ENV",
    "MIN_HMAC_KEY_BYTES",
    "Anchor",
    "AnchorCheck",
    "AnchorError",
    "Ed25519Signer",
    "Ed25519Verifier",
    "HmacKey",
    "Signer",
    "Verifier",
    "check_anchor",
    "hmac_key_from",
    "make_anchor",
    "read_anchor",
    "record_anchor",
    "signed_by",
    "verifier_for",
]

AUDIT_KEY_ENV = "FLEETLEDGER_AUDIT_KEY"
MIN_HMAC_KEY_BYTES = 32
_FORMAT = "fleetledger-anchor/1"
_HMAC = "hmac-sha256"
_ED25519 = "ed25519"


class AnchorError(EventStoreError, ValueError):
    """A key or an anchor file cannot be used: too short, unreadable, malformed, wrong kind."""


class Signer(Protocol):
    @property
    def algorithm(self) -> str: ...

    def sign(self, payload: bytes) -> bytes: ...


class Verifier(Protocol):
    @property
    def algorithm(self) -> str: ...

    def verify(self, payload: bytes, signature: bytes) -> bool: ...


@dataclass(frozen=True, slots=True)
class HmacKey:
    """A shared secret: signs and verifies, so whoever verifies could also forge."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_HMAC_KEY_BYTES:
            raise AnchorError(
                f"the audit key has {len(self.secret)} bytes; HMAC-SHA256 anchors need at least "
                f"{MIN_HMAC_KEY_BYTES} (e.g. `openssl rand -hex 32`)"
            )

    @property
    def algorithm(self) -> str:
        return _HMAC

    def sign(self, payload: bytes) -> bytes:
        return hmac.new(self.secret, payload, hashlib.sha256).digest()

    def verify(self, payload: bytes, signature: bytes) -> bool:
        return hmac.compare_digest(self.sign(payload), signature)


@dataclass(frozen=True, slots=True)
class Ed25519Signer:
    """An Ed25519 private key (PEM, PKCS#8, unencrypted): only its holder can write anchors."""

    private_key_pem: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _private_key(self.private_key_pem)

    @property
    def algorithm(self) -> str:
        return _ED25519

    def sign(self, payload: bytes) -> bytes:
        return _private_key(self.private_key_pem).sign(payload)


@dataclass(frozen=True, slots=True)
class Ed25519Verifier:
    """An Ed25519 public key (PEM): checks anchors without being able to forge one."""

    public_key_pem: bytes

    def __post_init__(self) -> None:
        _public_key(self.public_key_pem)

    @property
    def algorithm(self) -> str:
        return _ED25519

    def verify(self, payload: bytes, signature: bytes) -> bool:
        try:
            _public_key(self.public_key_pem).verify(signature, payload)
        except InvalidSignature:
            return False
        return True


def verifier_for(signer: Signer) -> Verifier:
    """What checks ``signer``'s anchors: the HMAC key itself, or the Ed25519 public key."""
    if isinstance(signer, HmacKey):
        return signer
    if isinstance(signer, Ed25519Signer):
        public = _private_key(signer.private_key_pem).public_key()
        return Ed25519Verifier(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    raise AnchorError(f"no verifier is known for {signer.algorithm} anchors")


def _private_key(pem: bytes) -> Ed25519PrivateKey:
    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as e:
        raise AnchorError(f"cannot read the Ed25519 private key: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise AnchorError("the signing key is not an Ed25519 private key")
    return key


def _public_key(pem: bytes) -> Ed25519PublicKey:
    try:
        key = load_pem_public_key(pem)
    except (ValueError, TypeError) as e:
        raise AnchorError(f"cannot read the Ed25519 public key: {e}") from e
    if not isinstance(key, Ed25519PublicKey):
        raise AnchorError("the verifying key is not an Ed25519 public key")
    return key


def hmac_key_from(
    key_file: Path | None = None, *, environ: Mapping[str, str] | None = None
) -> HmacKey:
    """The HMAC key in ``key_file`` (its text, without the trailing newline), else in
    ``FLEETLEDGER_AUDIT_KEY``; AnchorError when neither is given or the key is too short."""
    if key_file is not None:
        try:
            text = key_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise AnchorError(f"cannot read the audit key file {str(key_file)!r}: {e}") from e
        return HmacKey(text.rstrip("\r\n").encode())
    value = (os.environ if environ is None else environ).get(AUDIT_KEY_ENV)
    if not value:
        raise AnchorError(
            f"no audit key: pass --key-file, set {AUDIT_KEY_ENV} (at least "
            f"{MIN_HMAC_KEY_BYTES} bytes), or use an Ed25519 key"
        )
    return HmacKey(value.encode())


@dataclass(frozen=True, slots=True)
class Anchor:
    """The log's hash at ``position``, as of ``anchored_at``, signed."""

    position: int
    hash: str
    anchored_at: datetime
    algorithm: str
    signature: str

    def payload(self) -> bytes:
        """The signed bytes: canonical JSON of everything but the signature."""
        return _payload(self.position, self.hash, self.anchored_at, self.algorithm)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "position": self.position,
                "hash": self.hash,
                "anchored_at": self.anchored_at.isoformat(),
                "algorithm": self.algorithm,
                "signature": self.signature,
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> Anchor:
        try:
            body = json.loads(text)
            if body.get("format") != _FORMAT:
                raise ValueError(f"format is not {_FORMAT!r}")
            anchor = cls(
                position=body["position"],
                hash=body["hash"],
                anchored_at=datetime.fromisoformat(body["anchored_at"]),
                algorithm=body["algorithm"],
                signature=body["signature"],
            )
            if not (
                isinstance(anchor.position, int)
                and anchor.position >= 0
                and isinstance(anchor.hash, str)
                and isinstance(anchor.signature, str)
                and anchor.algorithm in (_HMAC, _ED25519)
            ):
                raise ValueError("a field has the wrong type")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise AnchorError(f"not a fleetledger anchor: {e}") from e
        return anchor


def _payload(position: int, hash: str, anchored_at: datetime, algorithm: str) -> bytes:
    body = {
        "format": _FORMAT,
        "position": position,
        "hash": hash,
        "anchored_at": anchored_at.isoformat(),
        "algorithm": algorithm,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def make_anchor(
    store: EventStore, signer: Signer, *, at: datetime, position: int | None = None
) -> Anchor:
    """Sign the log's hash at ``position`` (default: the current head). An empty log anchors
    position 0 (nothing to cut below)."""
    head = store.head() if position is None else position
    if head < 0:
        raise AnchorError(f"cannot anchor position {head}: positions start at 1 (0: empty)")
    digest = _hash_at(store, head) if head else bytes(32).hex()
    if digest is None:
        raise AnchorError(f"the log holds no event at position {head} to anchor")
    signature = signer.sign(_payload(head, digest, at, signer.algorithm))
    return Anchor(
        position=head,
        hash=digest,
        anchored_at=at,
        algorithm=signer.algorithm,
        signature=base64.b64encode(signature).decode(),
    )


def _hash_at(store: EventStore, position: int) -> str | None:
    events = store.read_all(after=position - 1, limit=1)
    if not events or events[0].global_position != position:
        return None
    digest: str = events[0].hash
    return digest


@dataclass(frozen=True, slots=True)
class AnchorCheck:
    """Whether the log agrees with an anchor; ``reason`` says how it does not."""

    ok: bool
    position: int
    head: int
    reason: str | None = None


def check_anchor(store: EventStore, anchor: Anchor, verifier: Verifier) -> AnchorCheck:
    """Whether ``anchor`` is genuine and the log still holds the anchored head unchanged.

    This compares one hash; it proves the history up to the anchor only together with a chain
    that verifies (``EventStore.verify``), which is what ``fleetledger audit verify`` runs.
    """
    head = store.head()
    if not signed_by(anchor, verifier):
        return AnchorCheck(
            ok=False,
            position=anchor.position,
            head=head,
            reason="the anchor's signature does not verify: it was altered or signed with "
            "another key",
        )
    if head < anchor.position:
        return AnchorCheck(
            ok=False,
            position=anchor.position,
            head=head,
            reason=f"the log was truncated: its head is {head}, below the anchored "
            f"position {anchor.position}",
        )
    if anchor.position == 0:
        return AnchorCheck(ok=True, position=0, head=head)
    found = _hash_at(store, anchor.position)
    if found != anchor.hash:
        return AnchorCheck(
            ok=False,
            position=anchor.position,
            head=head,
            reason=f"history up to the anchored position {anchor.position} was rewritten: "
            "its hash differs from the anchored one",
        )
    return AnchorCheck(ok=True, position=anchor.position, head=head)


def signed_by(anchor: Anchor, verifier: Verifier) -> bool:
    """Whether ``anchor``'s signature verifies under ``verifier`` (nothing about the log).

    Raises AnchorError when the verifier is of another algorithm than the anchor's, or the
    signature is not base64: a usage error rather than a forgery.
    """
    if anchor.algorithm != verifier.algorithm:
        raise AnchorError(
            f"the anchor is signed with {anchor.algorithm}; give a {anchor.algorithm} key"
        )
    try:
        signature = base64.b64decode(anchor.signature, validate=True)
    except ValueError as e:
        raise AnchorError(f"the anchor's signature is not base64: {e}") from e
    return verifier.verify(anchor.payload(), signature)


def read_anchor(path: Path) -> Anchor:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AnchorError(f"cannot read the anchor file {str(path)!r}: {e}") from e
    return Anchor.from_json(text)


def record_anchor(
    store: EventStore, signer: Signer, path: Path, *, at: datetime, position: int | None = None
) -> Anchor:
    """Anchor the head into ``path``, replacing it atomically: a reader, or the file after a
    crash, holds the previous anchor or this one, never half of one.

    ``fleetledger serve --anchor-file`` calls it periodically on the leader
    (fleetledger/adapters/anchoring.py); ``path`` should be somewhere the database's writers
    cannot write (another host, a bucket with object lock), else whoever
    rewrites the log can also rewrite the anchor.
    """
    anchor = make_anchor(store, signer, at=at, position=position)
    try:
        _replace_atomically(path, (anchor.to_json() + "\n").encode())
    except OSError as e:
        raise AnchorError(f"cannot write the anchor to {str(path)!r}: {e}") from e
    return anchor


def _replace_atomically(path: Path, content: bytes) -> None:
    """Write ``content`` to ``path`` so that ``path`` holds the old or the new file, whole.

    The bytes go to a temporary file of a name no other writer uses (two processes anchoring
    into one file must not write into each other's), are flushed to disk before the rename (else
    after a crash the rename may be on disk and the bytes not: an empty anchor), and the
    directory is flushed after it so that the rename itself survives the crash.
    """
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644  # an anchor is no secret (its signature is): auditors read it
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as partial:
            os.fchmod(partial.fileno(), mode)
            partial.write(content)
            partial.flush()
            os.fsync(partial.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
