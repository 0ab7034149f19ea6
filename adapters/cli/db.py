"""``fleetledger db``: the schema's migrations."""

from __future__ import annotations

import argparse

from fleetledger.adapters.cli.common import require_database
from fleetledger.adapters.cli.options import Subcommands, Text, add_url
from fleetledger.eventstore import migrate
from fleetledger.eventstore._engine import resolve_url

__all__ = ["current", "downgrade", "register", "upgrade"]

# Alembic asserts on an empty revision instead of refusing it.
_revision = Text(max_length=64)


def register(commands: Subcommands) -> None:
    db = commands.add_parser("db", help="schema migrations").add_subparsers(
        dest="db_command", required=True, metavar="ACTION"
    )
    upgrade_parser = db.add_parser("upgrade", help="migrate the schema up (default: to head)")
    upgrade_parser.add_argument("--revision", type=_revision, default="head", help="default: head")
    add_url(upgrade_parser)
    upgrade_parser.set_defaults(run=upgrade)
    downgrade_parser = db.add_parser(
        "downgrade", help="migrate the schema down to --revision (base drops the event log)"
    )
    downgrade_parser.add_argument(
        "--revision",
        type=_revision,
        required=True,
        help="the revision to go down to, e.g. 0001; 'base' drops every fleetledger table",
    )
    downgrade_parser.add_argument(
        "--yes-drop-events",
        action="store_true",
        help="confirm a downgrade to base that drops a log holding events",
    )
    add_url(downgrade_parser)
    downgrade_parser.set_defaults(run=downgrade)
    current_parser = db.add_parser("current", help="print the schema revision of the database")
    add_url(current_parser)
    current_parser.set_defaults(run=current)


def upgrade(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    migrate.upgrade(url, args.revision)
    print(f"schema at {migrate.current_revision(url)}")
    return 0


def downgrade(args: argparse.Namespace) -> int:
    url = resolve_url(args.url)
    require_database(url)
    migrate.downgrade(url, args.revision, drop_events=args.yes_drop_events)
    print(f"schema at {migrate.current_revision(url) or 'base (empty)'}")
    return 0


def current(args: argparse.Namespace) -> int:
    require_database(resolve_url(args.url))
    revision = migrate.current_revision(resolve_url(args.url))
    head = migrate.head_revision()
    if revision is None:
        print(f"empty (head is {head}); run: fleetledger db upgrade")
    else:
        print(f"{revision}{' (head)' if revision == head else f' (head is {head})'}")
    return 0
