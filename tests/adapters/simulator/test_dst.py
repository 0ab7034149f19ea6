"""Deterministic simulation testing: seeds run clean, every checker can fail, seeds repeat.

``FLEETLEDGER_DST_SEEDS`` sets how many seeds the sweep runs (200 by default, in CI; 10000 for the
long sweep: ``FLEETLEDGER_DST_SEEDS=10000 pytest tests/adapters/simulator/test_dst.py``).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleetledger.adapters.simulator.dst import (
    EXCLUDED_FAULTS,
    DstSettings,
    LiveState,
    check_chain,
    check_grants,
    check_machines_created_once,
    check_replay,
    check_request_outcomes,
    check_workload_outcomes,
    replayed_state,
    run_seed,
    run_seeds,
)
from fleetledger.adapters.simulator.faults import FAULT_KINDS
from fleetledger.adapters.simulator.node_checks import NodeLogChecks
from fleetledger.adapters.simulator.testbed import double_reservations
from fleetledger.domain.nodes import (
    ResourcesGranted,
)
from fleetledger.domain.testbeds import testbed
from fleetledger.eventstore import RecordedEvent, open_store
from tests.eventstore.support import bypassing_append_only_guard
from tests.node_events import node_with_a_pod

SEEDS = int(os.environ.get("FLEETLEDGER_DST_SEEDS", "200"))
AT = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def seed_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, LiveState]:
    """One seed's log, kept in a file, with the state a replay of it rebuilds."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dst') / 'log.db'}"
    result = run_seed(3, url=url)
    assert result.ok, result.violations
    with contextlib.closing(open_store(url)) as store:
        return url, replayed_state(store)


class TestSeeds:
    def test_no_seed_breaks_an_invariant(self) -> None:
        """Every seed of the sweep keeps every invariant, and the sweep injects every fault kind
        (a sweep that never injected one would prove nothing about it)."""
        report = run_seeds(SEEDS)

        repro = [f"{r.repro}  # {r.violations[0]}" for r in report.failing]
        assert report.failing == (), "\n".join(repro)
        assert (report.lost, report.duplicated, report.stalled) == (0, 0, 0)
        if SEEDS >= 200:  # fewer seeds (a quick local run) need not meet every kind
            missing = set(FAULT_KINDS) - set(EXCLUDED_FAULTS) - set(report.faults_injected)
            assert missing == set()

    def test_a_seed_drives_placement(self, seed_log: tuple[str, LiveState]) -> None:
        """Clients' workloads reach the log and are placed, and overflow waits for a worker
        placement asked the Grouper for, which joins and takes them (seed 3)."""
        url, live = seed_log
        with open_store(url) as store:
            types = [r.type for r in store.read_all(after=0)]
            requests = [r.data["request_id"] for r in store.read_all(after=0, types=(
                "vm.MachineCreated",))]  # fmt: skip
        assert types.count("placement.WorkloadPlaced") > 0
        assert types.count("placement.WorkloadWaiting") > 0
        assert any(r.startswith("placement-") for r in requests)
        assert {status[0] for status in live.workloads.values()} == {"placed"}

    def test_a_failed_worker_machine_sends_its_workloads_to_another(self) -> None:
        """The overflow worker's machine fails (a throttled create): its workloads are planned
        again onto a worker of another name, and every one reaches an outcome (seed 11)."""
        result = run_seed(11)
        assert result.ok, result.violations
        assert result.faults_injected.get("throttle", 0) > 0

    def test_a_process_elected_again_places_what_another_leader_accepted(self) -> None:
        """A leader change, then the new leader's crash: the first process leads again and
        places the workloads submitted to the other meanwhile (seed 132)."""
        result = run_seed(132)
        assert result.ok, result.violations
        assert result.faults_injected.get("leader_change") and result.processes == 3

    def test_a_client_retrying_a_lost_answer_is_not_judged_twice(self) -> None:
        """A submission committed just before its controller crashed is retried by the client
        after the workload was rejected: the retry gets that rejection, not a second one
        (seed 319)."""
        result = run_seed(319)
        assert result.ok, result.violations
        assert result.faults_injected.get("crash_after_commit")

    def test_testbeds_survive_crashes_and_a_leader_change(self) -> None:
        """The testbeds' controller crashes inside group commits and between passes and loses
        its lease once: no slot is held twice, no scheduling is left stuck, nothing leaks
        (seed 8)."""
        result = run_seed(8)
        assert result.ok, result.violations
        assert result.faults_injected["testbed_crash"] >= 2
        assert result.faults_injected["testbed_leader_change"] == 1

    def test_a_leader_elected_before_catching_up_loses_nothing(self) -> None:
        """A process elected before its follower caught up decides on a stale stream and repeats
        ids another leader stored: it catches up and decides again, and nothing stalls."""
        result = run_seed(17, settings=DstSettings(follower_catch_up=False))
        assert result.ok, result.violations

    def test_a_seed_repeats_exactly(self) -> None:
        """The same seed draws the same faults, injects the same ones and ends the same way."""
        first, second = run_seed(24), run_seed(24)

        assert first.schedule == second.schedule
        assert first == second  # everything but wall time
        assert first.faults_injected  # the seed does inject faults

    def test_other_seeds_differ(self) -> None:
        assert run_seed(24).schedule != run_seed(25).schedule

    def test_a_failing_seed_names_its_command(self) -> None:
        assert run_seed(5).repro == "fleetledger simulate --scenario dst --seed 5"

    def test_a_given_database_must_be_empty(self, seed_log: tuple[str, LiveState]) -> None:
        url, _ = seed_log
        with pytest.raises(ValueError, match="empty log"):
            run_seed(4, url=url)

    def test_many_seeds_cannot_share_one_database(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="one seed"):
            run_seeds(2, url=f"sqlite:///{tmp_path / 'x.db'}")


def recorded(position: int, type_name: str, data: dict[str, Any]) -> RecordedEvent:
    return RecordedEvent(
        global_position=position,
        stream_id="s",
        stream_version=position,
        event_id=uuid.uuid4(),
        type=type_name,
        schema_version=1,
        data=data,
        metadata={},
        recorded_at=AT,
        hash="",
    )


def requested(position: int, request_id: str) -> RecordedEvent:
    return recorded(position, "vm.MachineRequested", {"request_id": request_id})


def created(position: int, request_id: str) -> RecordedEvent:
    return recorded(position, "vm.MachineCreated", {"request_id": request_id})


def grouper_outcomes(position: int, *request_ids: str) -> RecordedEvent:
    return recorded(
        position,
        "vm.BatchOutcomesRecorded",
        {"created_request_ids": list(request_ids), "failed_request_ids": []},
    )


class TestRequestOutcomes:
    def test_one_outcome_each_passes(self) -> None:
        log = [requested(1, "a"), created(2, "a"), grouper_outcomes(3, "a")]
        assert check_request_outcomes({"a"}, log) == []

    def test_an_acknowledged_request_missing_from_the_log_is_lost(self) -> None:
        [violation] = check_request_outcomes({"a", "b"}, [requested(1, "a"), created(2, "a"),
                                                          grouper_outcomes(3, "a")])  # fmt: skip
        assert (violation.invariant, violation.detail.split()[0]) == ("lost", "b")

    def test_a_request_without_an_outcome_is_stalled(self) -> None:
        [violation] = check_request_outcomes({"a"}, [requested(1, "a")])
        assert violation.invariant == "stalled"

    def test_an_outcome_the_grouper_never_recorded_is_stalled(self) -> None:
        [violation] = check_request_outcomes({"a"}, [requested(1, "a"), created(2, "a")])
        assert violation.invariant == "stalled"

    def test_two_machine_outcomes_are_duplicated(self) -> None:
        log = [requested(1, "a"), created(2, "a"), created(3, "a"), grouper_outcomes(4, "a")]
        [violation] = check_request_outcomes({"a"}, log)
        assert violation.invariant == "duplicated"

    def test_two_grouper_outcomes_are_duplicated(self) -> None:
        log = [requested(1, "a"), created(2, "a"), grouper_outcomes(3, "a"),
               grouper_outcomes(4, "a")]  # fmt: skip
        [violation] = check_request_outcomes({"a"}, log)
        assert violation.invariant == "duplicated"

    def test_requests_never_acknowledged_are_not_checked(self) -> None:
        assert check_request_outcomes(set(), [requested(1, "a")]) == []


def submitted(position: int, workload: str) -> RecordedEvent:
    return recorded(position, "placement.WorkloadSubmitted", {"request": {"id": workload}})


def outcome(position: int, kind: str, workload: str, **data: Any) -> RecordedEvent:
    return recorded(position, f"placement.Workload{kind}", {"workload_id": workload, **data})


def reserved_on_node(position: int, *pods: str) -> RecordedEvent:
    return recorded(position, "nodes.OtherPodsReserved", {"pods": [{"pod": p} for p in pods]})


def waiting_for(position: int, workload: str, worker: str) -> RecordedEvent:
    return outcome(position, "Waiting", workload, worker=worker, pool="node")


class TestWorkloadOutcomes:
    def test_one_placement_with_its_reservation_passes(self) -> None:
        log = [submitted(1, "w"), reserved_on_node(2, "w"), outcome(3, "Placed", "w", node="n")]
        assert check_workload_outcomes({"w"}, log) == []

    def test_a_rejection_passes(self) -> None:
        log = [submitted(1, "w"), outcome(2, "Rejected", "w", reason="too big")]
        assert check_workload_outcomes({"w"}, log) == []

    def test_an_acknowledged_workload_missing_from_the_log_is_lost(self) -> None:
        [violation] = check_workload_outcomes({"w"}, [])
        assert violation.invariant == "lost"

    def test_a_queued_workload_at_the_end_is_stalled(self) -> None:
        [violation] = check_workload_outcomes({"w"}, [submitted(1, "w")])
        assert (violation.invariant, "queued" in violation.detail) == ("stalled", True)

    def test_waiting_for_a_worker_still_pending_is_an_outcome(self) -> None:
        log = [submitted(1, "w"), waiting_for(2, "w", "node-x")]
        assert check_workload_outcomes({"w"}, log) == []

    def test_waiting_for_a_worker_that_joined_is_stalled(self) -> None:
        log = [submitted(1, "w"), waiting_for(2, "w", "node-x"),
               recorded(3, "nodes.NodeJoined", {"node": "node-x"})]  # fmt: skip
        [violation] = check_workload_outcomes({"w"}, log)
        assert (violation.invariant, "joined" in violation.detail) == ("stalled", True)

    def test_waiting_for_a_worker_whose_machine_failed_is_stalled(self) -> None:
        log = [submitted(1, "w"), waiting_for(2, "w", "node-x"),
               recorded(3, "vm.MachineFailed", {"request_id": "placement-node-x"})]  # fmt: skip
        [violation] = check_workload_outcomes({"w"}, log)
        assert violation.invariant == "stalled"

    def test_a_reservation_without_its_outcome_counts_as_the_placement(self) -> None:
        assert check_workload_outcomes({"w"}, [submitted(1, "w"), reserved_on_node(2, "w")]) == []

    def test_a_placement_no_node_reserves_is_stalled(self) -> None:
        log = [submitted(1, "w"), outcome(2, "Placed", "w", node="n")]
        [violation] = check_workload_outcomes({"w"}, log)
        assert violation.invariant == "stalled"

    def test_two_outcomes_are_duplicated(self) -> None:
        log = [submitted(1, "w"), reserved_on_node(2, "w"), outcome(3, "Placed", "w", node="n"),
               outcome(4, "Rejected", "w", reason="r")]  # fmt: skip
        [violation] = check_workload_outcomes({"w"}, log)
        assert violation.invariant == "duplicated"

    def test_a_workload_reserved_on_two_nodes_is_duplicated(self) -> None:
        log = [submitted(1, "w"), reserved_on_node(2, "w"), reserved_on_node(3, "w"),
               outcome(4, "Placed", "w", node="n")]  # fmt: skip
        [violation] = check_workload_outcomes({"w"}, log)
        assert violation.invariant == "duplicated"

    def test_workloads_never_acknowledged_are_not_checked(self) -> None:
        assert check_workload_outcomes(set(), [submitted(1, "w")]) == []

    def test_a_planted_second_placement_in_a_seeds_log_is_caught(
        self, seed_log: tuple[str, LiveState]
    ) -> None:
        """A seed's real log passes; the same log with one placed workload placed again on
        another node (its reservation and its outcome) breaks ``duplicated``."""
        url, live = seed_log
        with open_store(url) as store:
            records = list(store.read_all(after=0))
        workload = next(k for k, status in sorted(live.workloads.items()) if status[0] == "placed")
        assert check_workload_outcomes(set(live.workloads), records) == []

        head = records[-1].global_position
        planted = [*records, reserved_on_node(head + 1, workload),
                   outcome(head + 2, "Placed", workload, node="node-9")]  # fmt: skip
        [violation] = check_workload_outcomes(set(live.workloads), planted)
        assert violation.invariant == "duplicated"
        assert workload in violation.detail

    def test_a_planted_log_that_lost_a_placement_is_caught(
        self, seed_log: tuple[str, LiveState]
    ) -> None:
        url, live = seed_log
        with open_store(url) as store:
            records = list(store.read_all(after=0))
        workload = next(k for k, status in sorted(live.workloads.items()) if status[0] == "placed")
        # The batch that placed it never landed: neither its outcome nor its node's reservation.
        planted = [r for r in records if workload not in (
            r.data.get("workload_id"), *(p["pod"] for p in r.data.get("pods", ())))]  # fmt: skip
        violations = check_workload_outcomes(set(live.workloads), planted)
        assert ("stalled", True) in {(v.invariant, workload in v.detail) for v in violations}


class TestMachinesCreatedOnce:
    def test_a_name_created_twice_is_caught(self) -> None:
        [violation] = check_machines_created_once(["m-1", "m-2", "m-1"], [])
        assert violation.invariant == "machine_created_twice"
        assert "m-1" in violation.detail

    def test_a_name_made_again_after_its_failed_machine_was_deleted_is_not(self) -> None:
        assert check_machines_created_once(["m-1", "m-1"], ["m-1"]) == []


class TestGrants:
    def test_grants_the_domain_decides_pass(self) -> None:
        checks = NodeLogChecks()
        checks.fold_all(("n", e) for e in node_with_a_pod())
        assert check_grants(checks) == []

    def test_a_grant_beyond_total_minus_system_is_caught(self) -> None:
        events = node_with_a_pod()
        granted = next(e for e in events if isinstance(e, ResourcesGranted))
        forged = replace(granted, cpu_requested_milli=4000, cpu_milli=4000, at=AT)
        checks = NodeLogChecks()
        checks.fold_all(("n", e) for e in [*events, forged])

        [violation] = check_grants(checks)
        assert violation.invariant == "grant_beyond_capacity"
        assert "4000 reserved of 3000 reservable" in violation.detail


def reserved(pod: str, position: int = 0) -> testbed.SlotReserved:
    return testbed.SlotReserved(0, "n1", position, pod, f"uid-{pod}", None, None, AT)


def cleared(pod: str, position: int = 0) -> testbed.ReservationCleared:
    return testbed.ReservationCleared(0, "n1", position, pod, "released", AT)


class TestSlots:
    def test_a_slot_reserved_again_after_it_was_cleared_passes(self) -> None:
        assert double_reservations([reserved("a"), cleared("a"), reserved("b")]) == []

    def test_the_same_pod_reserving_its_slot_again_passes(self) -> None:
        assert double_reservations([reserved("a"), reserved("a")]) == []

    def test_a_slot_reserved_for_a_second_pod_is_caught(self) -> None:
        [found] = double_reservations([reserved("a"), reserved("b", 1), reserved("b")])
        assert found == "slot 0 (n1/0) reserved for b while a held it"


class TestReplay:
    def test_the_live_state_a_replay_rebuilds_passes(self, seed_log: tuple[str, LiveState]) -> None:
        url, live = seed_log
        with open_store(url) as store:
            assert check_replay(store, live) == []

    def test_a_request_the_live_model_holds_differently_is_caught(
        self, seed_log: tuple[str, LiveState]
    ) -> None:
        url, live = seed_log
        request_id, view = next(iter(live.requests.items()))
        altered = replace(live, requests={**live.requests, request_id: replace(view, attempts=9)})  # type: ignore[type-var]
        with open_store(url) as store:
            [violation] = check_replay(store, altered)
        assert violation.invariant == "replay_mismatch"
        assert request_id in violation.detail

    def test_a_workload_the_live_placement_holds_differently_is_caught(
        self, seed_log: tuple[str, LiveState]
    ) -> None:
        url, live = seed_log
        workload = sorted(live.workloads)[0]
        altered = replace(
            live, workloads={**live.workloads, workload: ("queued", None, None, None)}
        )
        with open_store(url) as store:
            [violation] = check_replay(store, altered)
        assert violation.invariant == "replay_mismatch"
        assert workload in violation.detail

    def test_node_accounting_held_differently_is_caught(
        self, seed_log: tuple[str, LiveState]
    ) -> None:
        url, live = seed_log
        altered = replace(live, nodes_hosted={**live.nodes_hosted, "nodes": []})
        with open_store(url) as store:
            [violation] = check_replay(store, altered)
        assert violation.invariant == "replay_mismatch"
        assert "hosted" in violation.detail


class TestChain:
    def test_an_untouched_log_verifies(self, seed_log: tuple[str, LiveState]) -> None:
        url, _ = seed_log
        with open_store(url) as store:
            assert check_chain(store) == []

    def test_an_event_rewritten_in_the_database_is_caught(
        self, seed_log: tuple[str, LiveState], tmp_path: Path
    ) -> None:
        url, _ = seed_log
        copy = tmp_path / "tampered.db"
        copy.write_bytes(Path(url.removeprefix("sqlite:///")).read_bytes())
        with contextlib.closing(open_store(f"sqlite:///{copy}")) as store:
            bypassing_append_only_guard(
                store.engine, "UPDATE events SET data = '{}' WHERE global_position = 5"
            )
            [violation] = check_chain(store)
        assert violation.invariant == "hash_chain"
        assert "position 5" in violation.detail
