"""``fleetledger audit``: tamper evidence — verifying the hash chain and the invariants every
aggregate keeps, and anchoring the log's head outside the database.

``audit verify`` replays the whole log through
:class:`~fleetledger.projections.invariants.InvariantChecks` after the hash chain: a log whose
hashes all verify may still hold what no correct controller writes (a second outcome, a grant
beyond a node's capacity, a slot held twice), and an auditor wants the first such position.

``serve`` signs its anchors with the same key options, so it shares :func:`add_key_options`
and :func:`read_key`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from fleetledger.adapters.cli.common import EXIT_TAMPERED, print_json, require_database
from fleetledger.adapters.cli.options import Subcommands, add_json, add_url, position
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore._engine import resolve_url

if TYPE_CHECKING:
    from fleetledger.projections.invariants import Breach

__all__ = ["add_key_options", "anchor", "read_key", "register", "verify"]

log = structlog.get_logger("cli")


def register(commands: Subcommands) -> None:
    audit = commands.add_parser("audit", help="tamper evidence").add_subparsers(
        dest="audit_command", required=True, metavar="ACTION"
    )
    verify_parser = audit.add_parser(
        "verify", help="recompute the hash chain over the log, and check it against an anchor"
    )
    add_url(verify_parser)
    add_json(verify_parser)
    verify_parser.add_argument(
        "--after",
        type=position,
        default=0,
        metavar="POSITION",
        help="check the chain from this position on",
    )
    verify_parser.add_argument(
        "--anchor",
        type=Path,
        metavar="FILE",
        help="also detect truncation and rewrites (even with recomputed hashes) up to the newest "
        "anchor of the chain in FILE, and a chain with anchors removed, reordered or altered",
    )
    verify_parser.add_argument(
        "--expect-anchor",
        type=_digest,
        metavar="DIGEST",
        help="with --anchor: the digest of an anchor seen before (verify prints the newest's); "
        "the chain must still hold it, so that FILE rolled back to an older copy is caught",
    )
    verify_parser.add_argument(
        "--min-position",
        type=position,
        metavar="POSITION",
        help="with --anchor: a position anchored before; the newest anchor must reach it",
    )
    verify_parser.add_argument(
        "--skip-invariants",
        action="store_true",
        help="check the hash chain (and anchor) only, without replaying the aggregates' "
        "invariants (one outcome per request, no grant beyond a node's capacity, no slot "
        "held by two pods, legal state transitions)",
    )
    add_key_options(
        verify_parser, ed25519_help="the Ed25519 public key (PEM) that checks the anchor"
    )
    verify_parser.set_defaults(run=verify)
    anchor_parser = audit.add_parser(
        "anchor",
        help="sign the log's head, to keep outside the database: appended to the chain in "
        "--output once the log was checked against its newest anchor, else printed",
    )
    add_url(anchor_parser)
    add_key_options(anchor_parser, ed25519_help="sign with this Ed25519 private key (PEM, PKCS#8)")
    anchor_parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="append the anchor to the chain in this file (default: print it alone)",
    )
    anchor_parser.set_defaults(run=anchor)


def add_key_options(parser: argparse.ArgumentParser, *, ed25519_help: str) -> None:
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument(
        "--key-file",
        type=Path,
        metavar="FILE",
        help="HMAC-SHA256 key, at least 32 bytes (default: $FLEETLEDGER_AUDIT_KEY)",
    )
    keys.add_argument("--ed25519-key", type=Path, metavar="FILE", help=ed25519_help)


def _digest(value: str) -> str:
    if len(value) != 64 or any(c not in "0123456789abcdefABCDEF" for c in value):
        raise argparse.ArgumentTypeError(
            f"must be an anchor's digest, 64 hexadecimal digits, not {value[:70]!r}"
        )
    return value.lower()


def verify(args: argparse.Namespace) -> int:
    from fleetledger.eventstore.anchors import check_chain, read_chain

    if args.anchor is None and (args.expect_anchor is not None or args.min_position is not None):
        raise ValueError("--expect-anchor and --min-position check an anchor chain: give --anchor")
    kept = read_chain(args.anchor) if args.anchor is not None else None
    verifier = _verifier(args) if kept is not None else None
    require_database(resolve_url(args.url))
    with open_store(args.url) as store:
        head = store.head()

        def progress(checked: int, last: int) -> None:
            log.info("verifying hash chain", checked=checked, position=last, head=head)

        report = store.verify(after=args.after, progress=progress)
        checked = (
            check_chain(
                store, kept, verifier, expect=args.expect_anchor, min_position=args.min_position
            )
            if kept is not None and verifier is not None
            else None
        )
        invariants = None if args.skip_invariants else _check_invariants(store, head)
    breach = None if invariants is None else invariants[0]
    ok = report.ok and (checked is None or checked.ok) and breach is None
    if args.json:
        print_json(
            {
                "ok": ok,
                "checked": report.checked,
                "first_bad_position": report.first_bad_position,
                "last_position": report.last_position,
                "reason": report.reason,
                "anchor": None
                if checked is None
                else {
                    "ok": checked.ok,
                    "position": checked.position,
                    "reason": checked.reason,
                    "sequence": checked.sequence,
                    "digest": checked.digest,
                },
                "invariants": None
                if invariants is None
                else {
                    "ok": breach is None,
                    "checked": invariants[1],
                    "first_breach": None if breach is None else breach.to_dict(),
                },
            }
        )
    elif not report.ok:
        print(
            f"TAMPERED: first bad position {report.first_bad_position} ({report.reason}); "
            f"{report.checked} events before it verified. Restore from backup or investigate "
            "who wrote to the events table outside fleetledger.",
            file=sys.stderr,
        )
    elif checked is not None and not checked.ok:
        print(
            f"TAMPERED: {checked.reason}. Restore from backup or investigate who wrote to the "
            "events table or the anchor file outside fleetledger.",
            file=sys.stderr,
        )
    elif breach is not None and invariants is not None:
        print(
            f"BROKEN INVARIANT: first offending position {breach.position} ({breach.invariant}: "
            f"{breach.detail}); {invariants[1] - 1} events before it keep every invariant. See "
            "how it came about with `fleetledger explain ID` for an id it names, and "
            "investigate the controller that wrote it.",
            file=sys.stderr,
        )
    else:
        print(f"ok: {report.checked} events verified up to position {report.last_position}")
        if checked is not None:
            print(
                f"ok: the log holds the anchored head {checked.position} unchanged (anchor "
                f"{checked.sequence}, digest {checked.digest}); keep the digest and pass it as "
                "--expect-anchor next time to catch the anchor file being rolled back"
            )
        else:
            print(
                "  without --anchor a deleted tail or a rewrite with recomputed hashes goes "
                "unnoticed; see `fleetledger audit anchor`"
            )
        if invariants is not None:
            print(
                f"ok: {invariants[1]} events replayed from position 0 keep every invariant "
                "(one outcome per request, no grant beyond a node's capacity, no slot held by "
                "two pods, legal state transitions)"
            )
    return 0 if ok else EXIT_TAMPERED


def _check_invariants(store: EventStore, head: int) -> tuple[Breach | None, int]:
    """The first breach of an invariant in the log up to ``head``, and how many events the
    replay checked (up to and including the breach)."""
    from fleetledger.projections.invariants import first_breach

    def progress(position: int) -> None:
        log.info("replaying invariants", position=position, head=head)

    return first_breach(store, until=head, progress=progress)


def _verifier(args: argparse.Namespace) -> Any:
    from fleetledger.eventstore.anchors import Ed25519Verifier, hmac_key_from

    if args.ed25519_key is not None:
        return Ed25519Verifier(read_key(args.ed25519_key))
    return hmac_key_from(args.key_file)


def read_key(path: Path) -> bytes:
    from fleetledger.eventstore.anchors import AnchorError

    try:
        return path.read_bytes()
    except OSError as e:
        raise AnchorError(f"cannot read the key file {str(path)!r}: {e.strerror}") from e


def anchor(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from fleetledger.eventstore.anchors import (
        Ed25519Signer,
        Signer,
        hmac_key_from,
        make_anchor,
        record_anchor,
    )

    signer: Signer = (
        Ed25519Signer(read_key(args.ed25519_key))
        if args.ed25519_key is not None
        else hmac_key_from(args.key_file)
    )
    require_database(resolve_url(args.url))
    with open_store(args.url) as store:
        at = datetime.now(UTC)
        if args.output is None:
            print(make_anchor(store, signer, at=at).to_json())
            return 0
        recorded = record_anchor(store, signer, args.output, at=at)
    print(
        f"anchored position {recorded.position} in {args.output} (anchor {recorded.sequence}, "
        f"digest {recorded.digest()})",
        file=sys.stderr,
    )
    return 0
