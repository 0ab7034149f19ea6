"""Where a simulation keeps its log: the database it is given, or a scratch SQLite file.

The scratch file lives in RAM-backed ``/dev/shm`` when there is one (a throwaway log gains nothing
from ``fsync``) and is removed afterwards. A given database is migrated to the schema's head first.
Either is opened without ``fsync`` (``durable=False``): a scenario crashes its processes, never
the machine, and a SQLite commit survives a process crash without one.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fleetledger.eventstore import EventStore, migrate, open_store

__all__ = ["simulation_store"]


@contextlib.contextmanager
def simulation_store(url: str | None, *, fresh: bool = False) -> Iterator[EventStore]:
    """An open store on ``url`` (migrated), or on a scratch SQLite file removed on exit.

    ``fresh``: the scenario names its streams after its fleet (``node-00``…), so a given database
    must hold no events yet; ``ValueError`` otherwise, before anything is written.
    """
    if url is not None:
        migrate.upgrade(url)
        with open_store(url, durable=False) as store:
            head = store.head()
            if fresh and head:
                raise ValueError(
                    f"the scenario needs an empty log, and {url} already holds {head} events; "
                    "give it a new database, or leave --url out to use ./fleetledger-sim.db"
                )
            yield store
        return
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(prefix="fleetledger-sim-", dir=shm if shm.is_dir() else None))
    try:
        scratch_url = f"sqlite:///{scratch / 'simulation.db'}"
        migrate.upgrade(scratch_url)
        with open_store(scratch_url, durable=False) as store:
            yield store
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
