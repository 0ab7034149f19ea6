"""Statements run through psycopg's libpq binding (``connection.pgconn``), bypassing the cursor.

The hot statements (appends, wake-ups) need neither parameter adaptation nor rows back, and the
cursor's machinery would be most of their client cost. Their results are checked here, so a
failure still surfaces as the exception psycopg itself would raise.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg_errors
from psycopg import pq

__all__ = ["check_result"]

_SUCCEEDED = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)


def check_result(pgconn: pq.abc.PGconn, result: pq.abc.PGresult) -> None:
    """Raise what psycopg's cursor would have raised for a failed ``result``."""
    if result.status in _SUCCEEDED:
        return
    message = (result.error_message or pgconn.error_message).decode("utf-8", "replace").strip()
    sqlstate = result.error_field(pq.DiagnosticField.SQLSTATE)
    if sqlstate is None or pgconn.status != pq.ConnStatus.OK:
        raise psycopg.OperationalError(message or "the connection to the server was lost")
    try:
        error_class = pg_errors.lookup(sqlstate.decode("ascii"))
    except KeyError:  # a code newer than this psycopg
        error_class = psycopg.DatabaseError
    raise error_class(message)
