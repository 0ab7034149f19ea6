"""Scratch databases for benchmarks: never the log a benchmark is pointed at.

On Postgres a fresh database on the same server (dropped afterwards), on SQLite a file in a
temporary folder; either way migrated to head.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fleetledger.eventstore import migrate
from fleetledger.eventstore._engine import normalise_url, resolve_url
from fleetledger.eventstore.scratch import scratch_postgres_database

__all__ = ["scratch_database"]


@contextlib.contextmanager
def scratch_database(url: str | None, *, migrated: bool = True) -> Iterator[str]:
    """A throwaway database beside ``url`` (default: the configured one), at the schema's head
    unless ``migrated`` is false."""
    parsed = normalise_url(resolve_url(url))
    if parsed.get_backend_name() == "sqlite":
        with tempfile.TemporaryDirectory(prefix="fleetledger-bench-") as folder:
            scratch = f"sqlite:///{Path(folder) / 'bench.db'}"
            if migrated:
                migrate.upgrade(scratch)
            yield scratch
        return
    server = parsed.render_as_string(hide_password=False)
    with scratch_postgres_database(server, prefix="fleetledger_bench") as scratch:
        if migrated:
            migrate.upgrade(scratch)
        yield scratch
