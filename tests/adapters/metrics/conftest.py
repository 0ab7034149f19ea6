"""The log every metrics test reads (see :mod:`.world`), built once per run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetledger.eventstore import EventStore, migrate, open_store

from .world import EXTRA_NODES, build_world, join_fleet


@pytest.fixture(scope="session")
def world_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite log holding placement, VM, testbed and node events (read it, never append)."""
    path: Path = tmp_path_factory.mktemp("metrics-world") / "world.db"
    url = f"sqlite:///{path}"
    migrate.upgrade(url)
    build_world(url)
    with contextlib.closing(open_store(url)) as store:
        join_fleet(store, EXTRA_NODES)
    return url


@pytest.fixture
def world(world_url: str) -> Iterator[EventStore]:
    with contextlib.closing(open_store(world_url)) as store:
        yield store
