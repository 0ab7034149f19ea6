"""A fake cloud that several processes share, through one SQLite file.

The in-memory :class:`~fleetledger.adapters.cloud.fake.FakeCloud` lives and dies with its
process, so two controllers each get their own cloud and a machine one of them created is
invisible to the other. This one keeps its machines in a file, so controllers taking over from
each other (a leader election demo, the failover tests) see the same cloud, as they would see the
same Azure subscription. It keeps the port's create-only promise across processes: the machine
name is the table's key, so a second create of a name reports the machine that exists.

Machines succeed ``latency`` seconds after they were accepted; there is no fault injection here
(script faults with the in-memory fake).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

from fleetledger.adapters.clock import Clock, SystemClock

from .port import (
    BatchCreate,
    BatchCreateResult,
    MachineObservation,
    ProgressCallback,
    ProgressNote,
)

__all__ = ["SharedFakeCloud"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS machines (
    name TEXT PRIMARY KEY,
    provider_id TEXT NOT NULL,
    ready_at REAL NOT NULL,
    created_by INTEGER NOT NULL
)
"""


class SharedFakeCloud:
    """A fake cloud in the SQLite file ``path``; thread- and process-safe."""

    def __init__(self, path: str | Path, *, clock: Clock | None = None, latency: float = 0.0):
        if latency < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {latency}")
        self._path = str(path)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._latency = latency
        self._lock = threading.Lock()
        with self._connect() as conn:
            conn.execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, timeout=30, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 30000")
        return conn

    def machine_names(self) -> tuple[str, ...]:
        """Every machine that exists, in creation order."""
        with self._connect() as conn:
            rows = conn.execute("SELECT name FROM machines ORDER BY rowid").fetchall()
        return tuple(name for (name,) in rows)

    def create_batch(
        self,
        request: BatchCreate,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> BatchCreateResult:
        ready_at = self._clock.now().timestamp() + self._latency
        with self._lock, self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            for name in request.machine_names:
                # Create-only by name: an existing machine is reported, never made twice.
                conn.execute(
                    "INSERT OR IGNORE INTO machines (name, provider_id, ready_at, created_by) "
                    "VALUES (?, ?, ?, ?)",
                    (name, f"/fake/{request.batch_id}/{name}", ready_at, os.getpid()),
                )
            conn.execute("COMMIT")
        if on_progress is not None:
            on_progress(
                [ProgressNote(name, f"shared-fake:{name}") for name in request.machine_names]
            )
        self._clock.sleep(self._latency)
        created: dict[str, str] = {}
        for name in request.machine_names:
            seen = self.read_machine(name, resume_token="wait")
            if seen.status == "succeeded" and seen.provider_id is not None:
                created[name] = seen.provider_id
        return BatchCreateResult(created=created)

    def read_machine(
        self, machine_name: str, *, resume_token: str | None = None
    ) -> MachineObservation:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT provider_id, ready_at FROM machines WHERE name = ?", (machine_name,)
            ).fetchone()
        if row is None:
            return MachineObservation(machine_name, "not_found")
        provider_id, ready_at = row
        wait = ready_at - self._clock.now().timestamp()
        if wait > 0:
            if resume_token is None:
                return MachineObservation(machine_name, "creating", provider_id)
            self._clock.sleep(wait)
        return MachineObservation(machine_name, "succeeded", provider_id)
