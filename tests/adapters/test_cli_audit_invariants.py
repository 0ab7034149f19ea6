"""``fleetledger audit verify`` replays every aggregate's invariants after the hash chain: a log
whose hashes verify but which holds a crafted event exits 3 naming its position."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleetledger.adapters.cli import EXIT_TAMPERED, main
from fleetledger.adapters.simulator.dst import run_seed
from fleetledger.domain.codec import to_data
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import EventStore, NewEvent, RecordedEvent, open_store


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DST seed 3's log (every invariant kept), to copy and tamper with."""
    path = tmp_path_factory.mktemp("audit") / "seed3.db"
    assert run_seed(3, url=f"sqlite:///{path}").ok
    return path


@pytest.fixture
def seed_url(seed_file: Path, tmp_path: Path) -> str:
    """A copy of the seed's log for one test."""
    copy = tmp_path / "copy.db"
    with sqlite3.connect(seed_file) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    return f"sqlite:///{copy}"


def first(store: EventStore, type_name: str) -> RecordedEvent:
    return store.read_all(after=0, types=[type_name], limit=1)[0]


def again(record: RecordedEvent, **changes: object) -> NewEvent:
    """``record`` appended once more, with ``changes`` to its data (outside any leader's term,
    as a writer past the controller would)."""
    return NewEvent(record.type, {**record.data, **changes}, metadata=unfenced(record))


def unfenced(record: RecordedEvent) -> dict[str, object]:
    return {k: v for k, v in record.metadata.items() if k != "leader_term"}


def second_outcome(store: EventStore) -> int:
    created = first(store, "vm.MachineCreated")
    return store.append(created.stream_id, [again(created)]).last_position


def grant_beyond_capacity(store: EventStore) -> int:
    # The node's 8 CPUs less the system's 1 leave 7 reservable: 8 granted overruns it.
    granted = first(store, "nodes.ResourcesGranted")
    forged = again(granted, cpu_milli=8000, cpu_requested_milli=8000, cpu_pressure=0)
    return store.append(granted.stream_id, [forged]).last_position


def slot_held_twice(store: EventStore) -> int:
    def reserved(pod: str) -> NewEvent:
        at = datetime(2025, 1, 1, tzinfo=UTC)
        event = testbed.SlotReserved(0, "n1", 0, pod, f"uid-{pod}", None, None, at)
        type_name, version, data = to_data(event)
        return NewEvent(type_name, data, schema_version=version)

    return store.append("testbed-bed", [reserved("a"), reserved("b")]).last_position


def waiting_after_placed(store: EventStore) -> int:
    placed = first(store, "placement.WorkloadPlaced")
    waiting = NewEvent(
        "placement.WorkloadWaiting",
        {
            "workload_id": placed.data["workload_id"],
            "worker": "w",
            "pool": "node",
            "at": placed.data["at"],
        },
        metadata=unfenced(placed),
    )
    return store.append(placed.stream_id, [waiting]).last_position


TAMPERS: dict[str, Callable[[EventStore], int]] = {
    "one_outcome": second_outcome,
    "grant_beyond_capacity": grant_beyond_capacity,
    "slot_held_twice": slot_held_twice,
    "illegal_transition": waiting_after_placed,
}


class TestAuditVerifyInvariants:
    def test_a_clean_log_keeps_every_invariant(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["audit", "verify", "--url", seed_url]) == 0
        assert "keep every invariant" in capsys.readouterr().out

    @pytest.mark.parametrize("invariant", sorted(TAMPERS))
    def test_a_crafted_event_exits_3_naming_its_position(
        self, invariant: str, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with open_store(seed_url) as store:
            position = TAMPERS[invariant](store)

        assert main(["audit", "verify", "--url", seed_url]) == EXIT_TAMPERED

        [said] = [line for line in capsys.readouterr().err.splitlines() if "INVARIANT" in line]
        assert said.startswith("BROKEN INVARIANT: ")
        assert f"first offending position {position} ({invariant}:" in said

    def test_json_reports_the_first_breach(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with open_store(seed_url) as store:
            position = second_outcome(store)

        assert main(["audit", "verify", "--url", seed_url, "--json"]) == EXIT_TAMPERED

        report = json.loads(capsys.readouterr().out)
        assert report["ok"] is False and report["first_bad_position"] is None  # hashes hold
        assert report["invariants"]["first_breach"]["position"] == position
        assert report["invariants"]["checked"] == position

    def test_skip_invariants_checks_the_hash_chain_only(
        self, seed_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with open_store(seed_url) as store:
            second_outcome(store)
        assert main(["audit", "verify", "--url", seed_url, "--skip-invariants"]) == 0
        assert "invariant" not in capsys.readouterr().out
