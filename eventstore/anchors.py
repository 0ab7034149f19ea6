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

Anchors form a chain of their own, kept in one file, one anchor per line, appended to and never
rewritten: each signs its sequence number and the digest of the anchor before it
(:func:`record_anchor`, :func:`chain_problem`). So an anchor removed from the middle, reordered or
altered breaks the chain; but the chain's older prefix is itself a valid chain, so a file rolled
back to an older copy (with the log truncated to match) is caught only by a verifier that knows
something newer — the digest of an anchor it saw before, or a position anchored before
(:func:`check_chain`'s ``expect`` and ``min_position``). A writer that holds the key can forge
anything. Keep the anchors where the database's writers cannot write or roll back (a bucket with
a retention lock), anchor often (``fleetledger serve --anchor-file`` does, on the leader), and
note the digests ``fleetledger audit verify`` prints.

Two signatures: HMAC-SHA256 under a shared secret of at least 32 bytes (from a key file or
``FLEETLEDGER_AUDIT_KEY``), or Ed25519, so that verifiers need only the public key and cannot sign.

Errors::

    AnchorError (an EventStoreError and a ValueError: key or file unusable)
    └── AnchorRefused  record_anchor wrote nothing: the chain in the file does not verify or was
                       rolled back, or the log does not match it
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
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
    "AnchorRefused",
    "Ed25519Signer",
    "Ed25519Verifier",
    "HmacKey",
    "Signer",
    "Verifier",
    "chain_problem",
    "check_anchor",
    "check_chain",
    "hmac_key_from",
    "make_anchor",
    "read_anchor",
    "read_chain",
    "record_anchor",
    "signed_by",
    "verifier_for",
]

AUDIT_KEY_ENV = "FLEETLEDGER_AUDIT_KEY"
MIN_HMAC_KEY_BYTES = 32
_FORMAT = "fleetledger-anchor/2"
_FORMAT_V1 = "fleetledger-anchor/1"  # a single anchor, before chains: read, never written
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


@functools.lru_cache(maxsize=8)
def _public_key(pem: bytes) -> Ed25519PublicKey:
    # Cached: a chain's verification checks every anchor with the same key.
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
    """The log's hash at ``position``, as of ``anchored_at``, signed; the ``sequence``-th link
    of its chain, committing to the anchor before it through that anchor's ``previous`` digest.

    ``format`` is ``fleetledger-anchor/2``; an anchor read from a file written before chains
    existed is ``fleetledger-anchor/1``, without a sequence (0) or a predecessor, and can only
    start a chain.
    """

    position: int
    hash: str
    anchored_at: datetime
    algorithm: str
    signature: str
    sequence: int = 1
    previous: str | None = None
    """The :meth:`digest` of the anchor before this one; None for the first of a chain."""
    format: str = _FORMAT

    @property
    def legacy(self) -> bool:
        """Written before chains: it signs neither a sequence nor a predecessor."""
        return self.format == _FORMAT_V1

    def payload(self) -> bytes:
        """The signed bytes: canonical JSON of everything but the signature."""
        body = self._unsigned()
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> str:
        """SHA-256 (hex) of the whole anchor, signature included: what the next anchor signs as
        its ``previous``, and what an operator notes down to pass as ``--expect-anchor``."""
        return hashlib.sha256(self.to_line().encode()).hexdigest()

    def record(self) -> dict[str, object]:
        return {**self._unsigned(), "signature": self.signature}

    def _unsigned(self) -> dict[str, object]:
        body: dict[str, object] = {
            "format": self.format,
            "position": self.position,
            "hash": self.hash,
            "anchored_at": self.anchored_at.isoformat(),
            "algorithm": self.algorithm,
        }
        if not self.legacy:
            body["sequence"] = self.sequence
            body["previous"] = self.previous
        return body

    def to_json(self) -> str:
        """The anchor alone, indented (``fleetledger audit anchor`` prints it)."""
        return json.dumps(self.record(), indent=2)

    def to_line(self) -> str:
        """The anchor as one line of a chain file: canonical JSON, no newline."""
        return json.dumps(self.record(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Anchor:
        try:
            body = json.loads(text)
        except ValueError as e:
            raise AnchorError(f"not a fleetledger anchor: {e}") from e
        return cls.from_record(body)

    @classmethod
    def from_record(cls, body: object) -> Anchor:
        try:
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
            kind = body.get("format")
            if kind not in (_FORMAT, _FORMAT_V1):
                raise ValueError(f"format is not {_FORMAT!r} (nor {_FORMAT_V1!r})")
            anchor = cls(
                position=body["position"],
                hash=body["hash"],
                anchored_at=datetime.fromisoformat(body["anchored_at"]),
                algorithm=body["algorithm"],
                signature=body["signature"],
                sequence=0 if kind == _FORMAT_V1 else body["sequence"],
                previous=None if kind == _FORMAT_V1 else body["previous"],
                format=kind,
            )
            if not (
                type(anchor.position) is int
                and anchor.position >= 0
                and type(anchor.sequence) is int
                and anchor.sequence >= 0
                and isinstance(anchor.hash, str)
                and isinstance(anchor.signature, str)
                and (anchor.previous is None or isinstance(anchor.previous, str))
                and anchor.algorithm in (_HMAC, _ED25519)
            ):
                raise ValueError("a field has the wrong type")
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise AnchorError(f"not a fleetledger anchor: {e}") from e
        return anchor


def make_anchor(
    store: EventStore,
    signer: Signer,
    *,
    at: datetime,
    position: int | None = None,
    after: Anchor | None = None,
) -> Anchor:
    """Sign the log's hash at ``position`` (default: the current head) as the link of a chain
    that follows ``after`` (None: the first). An empty log anchors position 0 (nothing to cut
    below)."""
    head = store.head() if position is None else position
    if head < 0:
        raise AnchorError(f"cannot anchor position {head}: positions start at 1 (0: empty)")
    if after is not None and head < after.position:
        raise AnchorError(
            f"cannot anchor position {head} after an anchor of position {after.position}: "
            "a chain's positions never go back"
        )
    digest = _hash_at(store, head) if head else bytes(32).hex()
    if digest is None:
        raise AnchorError(f"the log holds no event at position {head} to anchor")
    unsigned = Anchor(
        position=head,
        hash=digest,
        anchored_at=at,
        algorithm=signer.algorithm,
        signature="",
        sequence=1 if after is None else after.sequence + 1,
        previous=None if after is None else after.digest(),
    )
    signature = base64.b64encode(signer.sign(unsigned.payload())).decode()
    return dataclasses.replace(unsigned, signature=signature)


def _hash_at(store: EventStore, position: int) -> str | None:
    events = store.read_all(after=position - 1, limit=1)
    if not events or events[0].global_position != position:
        return None
    digest: str = events[0].hash
    return digest


@dataclass(frozen=True, slots=True)
class AnchorCheck:
    """Whether the log agrees with an anchor (the newest of a chain); ``reason`` says how it
    does not. ``sequence`` and ``digest`` are the checked anchor's, for the operator to keep."""

    ok: bool
    position: int
    head: int
    reason: str | None = None
    sequence: int | None = None
    digest: str | None = None


def check_anchor(store: EventStore, anchor: Anchor, verifier: Verifier) -> AnchorCheck:
    """Whether ``anchor`` is genuine and the log still holds the anchored head unchanged.

    This compares one hash; it proves the history up to the anchor only together with a chain
    that verifies (``EventStore.verify``), which is what ``fleetledger audit verify`` runs.
    """
    head = store.head()
    checked = AnchorCheck(
        ok=True,
        position=anchor.position,
        head=head,
        sequence=anchor.sequence,
        digest=anchor.digest(),
    )
    if not signed_by(anchor, verifier):
        return dataclasses.replace(
            checked,
            ok=False,
            reason="the anchor's signature does not verify: it was altered or signed with "
            "another key",
        )
    if head < anchor.position:
        return dataclasses.replace(
            checked,
            ok=False,
            reason=f"the log was truncated: its head is {head}, below the anchored "
            f"position {anchor.position}",
        )
    if anchor.position == 0:
        return checked
    if _hash_at(store, anchor.position) != anchor.hash:
        return dataclasses.replace(
            checked,
            ok=False,
            reason=f"history up to the anchored position {anchor.position} was rewritten: "
            "its hash differs from the anchored one",
        )
    return checked


def chain_problem(
    chain: Sequence[Anchor], verifier: Verifier, *, from_start: bool = True
) -> str | None:
    """Why ``chain`` (oldest first) is not one series of anchors ``verifier`` signed, or None.

    Every anchor's signature verifies; the first starts the series (sequence 1 without a
    predecessor, or a pre-chain anchor) unless ``from_start`` is false (``chain`` is the later
    part of one); each next one follows the one before it (its sequence plus one, its digest as
    ``previous``) and never anchors a lower position. An anchor removed from the middle,
    reordered or altered is caught here; one removed from the end (the file rolled back to an
    older copy) is not — that takes an expectation from outside (:func:`check_chain`).
    """
    for index, anchor in enumerate(chain):
        where = f" (line {index + 1})" if from_start else ""
        if not signed_by(anchor, verifier):
            return (
                f"anchor {anchor.sequence}{where} does not verify: it was altered or signed with "
                "another key"
            )
        if index == 0:
            if from_start and not anchor.legacy and (anchor.sequence != 1 or anchor.previous):
                return (
                    f"the chain starts at anchor {anchor.sequence}, not 1: its beginning was "
                    "removed"
                )
            continue
        before = chain[index - 1]
        if anchor.legacy:
            return f"anchor{where} is a pre-chain anchor, which can only start a chain"
        if anchor.sequence != before.sequence + 1 or anchor.previous != before.digest():
            return (
                f"anchor {anchor.sequence}{where} does not follow anchor {before.sequence}: "
                "anchors were removed, reordered or replaced"
            )
        if anchor.position < before.position:
            return (
                f"anchor {anchor.sequence} goes back to position {anchor.position} from "
                f"{before.position}: it was signed over a truncated log"
            )
    return None


def check_chain(
    store: EventStore,
    chain: Sequence[Anchor],
    verifier: Verifier,
    *,
    expect: str | None = None,
    min_position: int | None = None,
) -> AnchorCheck:
    """Whether ``chain`` is one intact series and the log still holds its newest anchor.

    A chain cut back to an older prefix — the anchor file replaced by an older copy, or its
    last lines removed — is itself a valid chain, and a log truncated to its newest anchor
    passes it. Only what the verifier knew before tells: ``expect``, the digest of an anchor
    seen earlier (the chain must still hold it), or ``min_position``, a position anchored
    earlier (the newest anchor must reach it).
    """
    head = store.head()
    if not chain:
        return AnchorCheck(ok=False, position=0, head=head, reason="the anchor file is empty")
    newest = chain[-1]
    refused = AnchorCheck(
        ok=False,
        position=newest.position,
        head=head,
        sequence=newest.sequence,
        digest=newest.digest(),
    )
    problem = chain_problem(chain, verifier)
    if problem is not None:
        return dataclasses.replace(refused, reason=f"the anchor chain is broken: {problem}")
    expect = None if expect is None else expect.lower()
    if expect is not None and expect not in {anchor.digest() for anchor in chain}:
        return dataclasses.replace(
            refused,
            reason=f"the anchor chain does not hold the expected anchor {expect}: the anchor "
            f"file was rolled back to an older copy or replaced (its newest is anchor "
            f"{newest.sequence}, position {newest.position})",
        )
    if min_position is not None and newest.position < min_position:
        return dataclasses.replace(
            refused,
            reason=f"the newest anchor is at position {newest.position}, below the expected "
            f"{min_position}: the anchor file was rolled back to an older copy",
        )
    return check_anchor(store, newest, verifier)


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


def read_chain(path: Path) -> tuple[Anchor, ...]:
    """The anchors in ``path``, oldest first: one per line, or a single (indented) anchor as
    ``fleetledger audit anchor`` prints it and as files were written before chains.

    An unterminated last line that is not a whole anchor is a write cut short by a crash and is
    left out (it was never a signed anchor); any other line that is not an anchor is an
    AnchorError.
    """
    try:
        content = path.read_bytes()
    except OSError as e:
        raise AnchorError(f"cannot read the anchor file {str(path)!r}: {e.strerror}") from e
    return _parse_chain(content, path)


def read_anchor(path: Path) -> Anchor:
    """The newest anchor in ``path`` (read from the end: the chain before it is not parsed, nor
    verified)."""
    if not path.exists():
        raise AnchorError(f"cannot read the anchor file {str(path)!r}: no such file")
    newest, _ = _read_newest(path, None)
    if not newest:
        raise AnchorError(f"the anchor file {str(path)!r} holds no anchor")
    return newest[-1]


def _parse_chain(content: bytes, path: Path) -> tuple[Anchor, ...]:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AnchorError(f"cannot read the anchor file {str(path)!r}: {e}") from e
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return (Anchor.from_record(whole),)
    lines = text.split("\n")
    anchors = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            anchors.append(Anchor.from_json(line))
        except AnchorError as e:
            if number == len(lines):
                break  # an unterminated last line: a torn write
            raise AnchorError(f"{str(path)!r} line {number}: {e}") from e
    return tuple(anchors)


class AnchorRefused(AnchorError):
    """:func:`record_anchor` wrote nothing: the anchor file or the log no longer matches what
    it should (a chain that does not verify, an anchor this process wrote missing from it, a log
    truncated or rewritten below its newest anchor). The file is kept as the evidence."""


def record_anchor(
    store: EventStore,
    signer: Signer,
    path: Path,
    *,
    at: datetime,
    position: int | None = None,
    known: Anchor | None = None,
) -> Anchor:
    """Append an anchor of the log to the chain in ``path`` (a new chain if there is none), and
    return it; the log is checked against the chain's newest anchor first, so that a tampered
    log is never anchored over its evidence.

    Under a lock on ``path``'s directory (one writer at a time, across processes), checked are:
    the newest anchor in the file, genuine under ``signer``'s key; with ``known`` (the last
    anchor this caller wrote or checked), that the file still holds it and the anchors after it
    follow it intact (what lies before ``known`` is ``audit verify``'s to check: ``known``
    commits to it); the log against the newest anchor; the hash chain from that anchor to the
    head. The new anchor signs the last position verified (or ``position``, at most that),
    follows the newest, and is appended and flushed to disk. A file that is not in canonical
    one-anchor-per-line form (one indented anchor from before chains, a write cut short) is
    rewritten once, atomically, with its anchors and the new one.

    Raises AnchorRefused when the chain does not verify under ``signer``'s key, does not hold
    ``known`` any more (rolled back, replaced), or the log does not match it; AnchorError when
    the file cannot be read or written. If another writer anchored beyond ``position`` since,
    nothing is written and its anchor is returned.

    ``path`` should be somewhere the database's writers cannot write (another host, a bucket
    with object lock), else whoever rewrites the log can also roll the anchors back.
    """
    verifier = verifier_for(signer)
    try:
        with _locked_directory(path.parent):
            newest, canonical = _newest_in(path, verifier, known)
            start = 0
            if newest is not None:
                checked = check_anchor(store, newest, verifier)
                if not checked.ok:
                    raise AnchorRefused(f"not anchoring over {str(path)!r}: {checked.reason}")
                start = newest.position
            report = store.verify(after=start)
            if not report.ok:
                raise AnchorRefused(
                    f"not anchoring a log whose chain breaks at position "
                    f"{report.first_bad_position} ({report.reason})"
                )
            target = report.last_position if position is None else position
            if target > report.last_position:
                raise AnchorError(f"the log holds no event at position {target} to anchor")
            if newest is not None and target < newest.position:
                return newest  # another writer anchored further meanwhile
            anchor = make_anchor(store, signer, at=at, position=target, after=newest)
            line = (anchor.to_line() + "\n").encode()
            if canonical:
                _append(path, line)
            else:
                chain = _parse_chain(path.read_bytes(), path)
                _replace_atomically(path, _canonical(chain) + line)
    except OSError as e:
        raise AnchorError(f"cannot write the anchor to {str(path)!r}: {e}") from e
    return anchor


def _newest_in(path: Path, verifier: Verifier, known: Anchor | None) -> tuple[Anchor | None, bool]:
    """The newest anchor of the chain in ``path``, checked, and whether the file is in
    canonical form (an anchor per line, each ending in a newline) so it can be appended to.

    Checked is: the newest anchor verifies under ``verifier``, and with ``known`` (the last
    anchor this caller wrote or checked), the chain still holds it and runs intact from it to
    the newest. The part before ``known`` is not read again: ``known`` commits to it through its
    ``previous`` digests, and ``audit verify`` checks the whole chain. So anchoring stays as
    cheap after a year of anchors as on the first day.
    """
    try:
        part, canonical = _read_newest(path, known)
        problem = chain_problem(part, verifier, from_start=False)
    except AnchorRefused:
        # Not a rollback if the file is no longer this key's at all: say that instead.
        newest, _ = _read_newest(path, None)
        if newest and not (
            newest[-1].algorithm == verifier.algorithm and signed_by(newest[-1], verifier)
        ):
            part, canonical, problem = [], False, "its newest anchor is another key's"
        else:
            raise
    except AnchorError as e:
        part, canonical, problem = [], False, str(e)
    if problem is not None:
        raise AnchorRefused(
            f"the anchor chain in {str(path)!r} does not verify with this key ({problem}); check "
            "it with `fleetledger audit verify --anchor`, then move it aside to start a new series"
        )
    return (part[-1] if part else None), canonical


_TAIL_BYTES = 1 << 16
"""How much of the end of an anchor file is read first: a few hundred anchors."""


class _NotInTail(Exception):
    """The anchor looked for is older than the end of the file that was read."""


def _read_newest(path: Path, since: Anchor | None) -> tuple[list[Anchor], bool]:
    """:func:`_newest_part` over the file at ``path``, reading only its end when that holds
    what is looked for (no file: no anchors)."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            if size > _TAIL_BYTES:
                file.seek(size - _TAIL_BYTES)
                tail = file.read()
                start = tail.find(b"\n") + 1  # from the first whole line on
                with contextlib.suppress(_NotInTail):
                    return _newest_part(tail[start:], path, since, tail_from=size - len(tail))
            file.seek(0)
            content = file.read()
    except FileNotFoundError:
        return [], True
    except OSError as e:
        raise AnchorError(f"cannot read the anchor file {str(path)!r}: {e.strerror}") from e
    return _newest_part(content, path, since)


def _newest_part(
    content: bytes, path: Path, since: Anchor | None, *, tail_from: int | None = None
) -> tuple[list[Anchor], bool]:
    """The chain's anchors from ``since`` (included) to the newest — the newest alone without
    ``since`` — read from the end of ``content``; and whether ``content`` is canonical.

    ``tail_from``: ``content`` is the end of the file from that byte on, starting at a line;
    ``_NotInTail`` when ``since`` is not in it. Raises AnchorRefused when ``since`` is not in
    the chain (rolled back or replaced), AnchorError when a line read is not an anchor.
    """
    first_newline = content.find(b"\n")
    one_object = content.lstrip().startswith((b"{\n", b"{\r\n"))
    if tail_from is None and (one_object or content.find(b"\n", first_newline + 1) < 0):
        # One anchor (a line, or indented: as printed, or written before chains), or none.
        chain = _parse_chain(content, path)
        canonical = content == _canonical(chain)
        if since is None or since in chain:
            return list(chain[-1:] if since is None else chain[chain.index(since) :]), canonical
        raise _rolled_back(path, since, chain[-1] if chain else None)
    end = content.rfind(b"\n")
    last = content[end + 1 :]
    canonical = last == b""
    part: list[Anchor] = []
    if last.strip():
        # An unterminated last line is an anchor without its newline, or else a write cut
        # short by a crash (never a signed anchor), skipped.
        with contextlib.suppress(AnchorError, UnicodeDecodeError):
            part.append(Anchor.from_json(last.decode("utf-8")))
            if since is None or part[-1] == since:
                return part, canonical
    since_line = None if since is None else since.to_line().encode()
    while end >= 0:
        start = content.rfind(b"\n", 0, end) + 1
        line, end = content[start:end], start - 1
        if not line.strip():
            continue
        try:
            part.append(Anchor.from_json(line.decode("utf-8")))
        except (AnchorError, UnicodeDecodeError) as e:
            raise AnchorError(
                f"{str(path)!r}, the line at byte {(tail_from or 0) + start}: {e}"
            ) from e
        if since_line is None or line == since_line:
            part.reverse()
            return part, canonical
    if tail_from is not None:
        raise _NotInTail
    if since is None:
        return [], canonical
    raise _rolled_back(path, since, part[0] if part else None)


def _rolled_back(path: Path, since: Anchor, newest: Anchor | None) -> AnchorRefused:
    held = "no anchor" if newest is None else f"anchor {newest.sequence}"
    return AnchorRefused(
        f"{str(path)!r} no longer holds anchor {since.sequence} (position {since.position}), "
        f"which this process wrote or checked, but {held}: the file was rolled back to an "
        "older copy or replaced"
    )


def _canonical(chain: Sequence[Anchor]) -> bytes:
    return b"".join(anchor.to_line().encode() + b"\n" for anchor in chain)


_LOCKS_UNSUPPORTED = frozenset(
    {errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF}
)


@contextlib.contextmanager
def _locked_directory(directory: Path) -> Iterator[None]:
    # The directory rather than the file: a rewrite replaces the file (a new inode), and a lock
    # on the old one would not exclude a writer that opened the new one. flock holds across
    # processes on local file systems; for shared storage, one writer (the leader) is the rule.
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            # Some network file systems (SMB shares among them) refuse locks on directories.
            # The lock only guards against two writers at once, which leadership already rules
            # out; anchoring without it beats not anchoring at all.
            if e.errno not in _LOCKS_UNSUPPORTED:
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


def _append(path: Path, line: bytes) -> None:
    """Append ``line`` to ``path`` and flush it to disk (and, for a new file, its directory
    entry). A crash mid-write leaves an unterminated last line, which readers skip."""
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if created:
            os.fchmod(fd, 0o644)  # an anchor is no secret (its signature is): auditors read it
        remaining = memoryview(line)
        while remaining:
            remaining = remaining[os.write(fd, remaining) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
