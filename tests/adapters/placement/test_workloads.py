"""Workload streams in the log: the codec's names, the ledger's appends, the read-back."""

from __future__ import annotations

import pytest

from fleetledger.adapters.placement.workloads import (
    WORKLOAD_CODEC,
    WorkloadLedger,
    read_workload,
    read_workloads,
)
from fleetledger.adapters.runtime import Writer
from fleetledger.domain.placement import (
    RecordWaiting,
    ReleaseWorkload,
    SubmitWorkload,
    WorkloadCommand,
)
from fleetledger.eventstore import EventStore, WrongExpectedVersion

from .support import T0, workload

WRITER = Writer(actor="test")


def record(store: EventStore, ledger: WorkloadLedger, rid: str, *commands: WorkloadCommand) -> None:
    """Decide ``commands`` on the ledger, append them, and note what landed."""
    events, state = ledger.decide(rid, commands)
    store.append_many([ledger.append_for(rid, events, writer=WRITER, cause="test")])
    ledger.put(rid, ledger.get(rid)[0] + len(events), state)


class TestCodec:
    def test_stored_names(self) -> None:
        """The workload events are stored under their pinned names."""
        assert WORKLOAD_CODEC.type_names() == [
            "placement.WorkloadPlaced",
            "placement.WorkloadRejected",
            "placement.WorkloadReleased",
            "placement.WorkloadSubmitted",
            "placement.WorkloadWaiting",
        ]


class TestLedger:
    def test_appends_expect_the_known_version(self, store: EventStore) -> None:
        """An append made on a stale fold is refused by the log, not written over it."""
        ledger, stale = WorkloadLedger(), WorkloadLedger()
        record(store, ledger, "a", SubmitWorkload(workload("a"), T0))
        events, _ = stale.decide("a", [SubmitWorkload(workload("a", 2000), T0)])
        with pytest.raises(WrongExpectedVersion):
            store.append_many([stale.append_for("a", events, writer=WRITER, cause="test")])
        assert read_workload(store, "a")[1].request == workload("a")

    def test_read_back_in_submission_order(self, store: EventStore) -> None:
        """Every workload stream is folded from the log, first submitted first; the
        correlation id of each event is its workload."""
        ledger = WorkloadLedger()
        record(store, ledger, "b", SubmitWorkload(workload("b"), T0))
        record(store, ledger, "a", SubmitWorkload(workload("a"), T0))
        record(store, ledger, "b", RecordWaiting("b", "cpu-x", "cpu", T0))
        record(store, ledger, "a", ReleaseWorkload("a", T0))
        folded = read_workloads(store)
        assert list(folded) == ["b", "a"]
        assert [(version, state.phase) for version, state in folded.values()] == [
            (2, "waiting"),
            (2, "released"),
        ]
        records = store.read_all(limit=10)
        assert [r.metadata["correlation_id"] for r in records] == ["b", "a", "b", "a"]
