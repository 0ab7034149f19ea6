"""Schema migrations for the log: ``upgrade``, ``downgrade``, ``current_revision``.

The same Alembic scripts (``migrations/``) serve Postgres and SQLite. ``fleetledger db …`` is a thin
wrapper over these functions; users who embed the store can call them directly.

A downgrade to ``base`` drops the events table; on a log that holds events it is refused unless the
caller passes ``drop_events=True``, because the log is the only copy of the system's history.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError

from fleetledger import migrations
from fleetledger.eventstore._engine import make_engine, normalise_url, resolve_url
from fleetledger.eventstore.errors import EventStoreError, StoreUnavailable

__all__ = [
    "BASE",
    "DowngradeRefused",
    "MigrationFailed",
    "count_events",
    "current_revision",
    "downgrade",
    "head_revision",
    "upgrade",
]

BASE = "base"
"""The revision before any fleetledger table exists."""


class MigrationFailed(EventStoreError, ValueError):
    """Alembic refused the request itself, e.g. a revision that does not exist."""


class DowngradeRefused(EventStoreError):
    """The downgrade would drop events and the caller did not say that is intended."""


def _config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # configparser interpolation treats '%' specially (URL-encoded passwords contain it).
    rendered = normalise_url(url).render_as_string(hide_password=False)
    cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config("sqlite:///unused.db")).get_current_head()
    assert head is not None
    return head


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the schema up to ``revision``; safe to run concurrently and repeatedly."""
    try:
        command.upgrade(_config(resolve_url(url)), revision)
    except CommandError as e:
        raise MigrationFailed(f"cannot upgrade to {revision!r}: {_one_line(e)}") from e
    except sa.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot migrate {_safe(url)}: {e.orig}") from e


def downgrade(url: str | None = None, revision: str = BASE, *, drop_events: bool = False) -> None:
    """Take the schema down to ``revision`` (``base`` drops every fleetledger table).

    Raises DowngradeRefused when going to ``base`` would drop a non-empty event log and
    ``drop_events`` is false; MigrationFailed for a revision that is not named (``-1``).
    """
    if _drops_the_log(revision) and not drop_events:
        held = count_events(url)
        if held:
            raise DowngradeRefused(
                f"downgrading to base drops the event log, which holds {held} events; back it "
                "up, then confirm with --yes-drop-events (drop_events=True)"
            )
    try:
        command.downgrade(_config(resolve_url(url)), revision)
    except CommandError as e:
        raise MigrationFailed(f"cannot downgrade to {revision!r}: {_one_line(e)}") from e
    except sa.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot migrate {_safe(url)}: {e.orig}") from e


def _drops_the_log(revision: str) -> bool:
    """Whether going down to ``revision`` leaves no fleetledger revision (drops the events).

    Only names that resolve on their own are accepted: a relative one (``-3``) would need the
    database's current revision to judge, and counting down past 0001 must not slip by unasked.
    """
    if revision == BASE:
        return True
    try:
        target = ScriptDirectory.from_config(_config("sqlite:///unused.db")).get_revision(revision)
    except CommandError as e:
        raise MigrationFailed(
            f"cannot downgrade to {revision!r}: {_one_line(e)}; give a revision id (e.g. 0002) "
            "or 'base'"
        ) from e
    return target is None


def count_events(url: str | None = None) -> int:
    """How many events the log holds; 0 when the database has no events table yet."""
    engine = make_engine(resolve_url(url))
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("events"):
                return 0
            return int(conn.exec_driver_sql("SELECT count(*) FROM events").scalar_one())
    except sa.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot reach {_safe(url)}: {e.orig}") from e
    finally:
        engine.dispose()


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def current_revision(url: str | None = None) -> str | None:
    """The revision the database is at, or None for an empty database."""
    engine = make_engine(resolve_url(url))
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except sa.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot reach {_safe(url)}: {e.orig}") from e
    finally:
        engine.dispose()


def _safe(url: str | None) -> str:
    return normalise_url(resolve_url(url)).render_as_string(hide_password=True)
