"""Throwaway Postgres databases: created on a server, dropped afterwards.

Used by the pytest plugin (:mod:`fleetledger.eventstore.testing`), our own tests and ``fleetledger
bench store``, which must never write into the log it is pointed at.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import make_url

__all__ = ["admin_engine", "scratch_postgres_database"]


def admin_engine(server_url: str) -> sa.Engine:
    """An autocommit engine for CREATE/DROP DATABASE and other server-level statements."""
    return sa.create_engine(
        make_url(server_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )


@contextlib.contextmanager
def scratch_postgres_database(
    server_url: str, *, template: str | None = None, prefix: str = "fleetledger_scratch"
) -> Iterator[str]:
    """The URL of a new database on ``server_url`` (a copy of ``template`` if given).

    The database is dropped on exit, even with connections still open to it.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = admin_engine(server_url)
    clause = f' TEMPLATE "{template}"' if template else ""
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"{clause}')
        try:
            yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()
