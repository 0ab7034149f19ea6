"""Schema migrations for the log: ``upgrade``, ``downgrade``, ``current_revision``.

The same Alembic scripts (``migrations/``) serve Postgres and SQLite. ``fleetledger db …`` is a thin
wrapper over these functions; users who embed the store can call them directly.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from fleetledger import migrations
from fleetledger.eventstore._engine import make_engine, normalise_url, resolve_url
from fleetledger.eventstore.errors import StoreUnavailable

__all__ = ["current_revision", "downgrade", "head_revision", "upgrade"]


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
    except sa.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot migrate {_safe(url)}: {e.orig}") from e


def downgrade(url: str | None = None, revision: str = "base") -> None:
    """Take the schema down to ``revision`` (``base`` drops every fleetledger table)."""
    try:
        command.downgrade(_config(resolve_url(url)), revision)
    except sa.exc.OperationalError as e:
        raise StoreUnavailable(f"cannot migrate {_safe(url)}: {e.orig}") from e


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
