"""The burst-workloads scenario: zero workers when the burst fits, the bin-packing minimum when
it overflows, one snapshot and one append per batch, never an overcommitted node."""

from __future__ import annotations

import contextlib
import json

import pytest

from fleetledger.adapters.simulator.placement import PlacementReport, run_placement_scenario
from fleetledger.eventstore import open_store
from fleetledger.projections.dumpstate import dumpstate_at


@pytest.fixture(scope="module")
def compared() -> PlacementReport:
    return run_placement_scenario(7, compare_naive=True)


class TestBurstWorkloads:
    @pytest.mark.parametrize("seed", [1, 2])
    def test_the_issue_assertions_hold(self, seed: int) -> None:
        """fits: all placed, 0 workers, 1 snapshot and 1 append per batch; overflow: workers
        requested equal the minimum and all end placed; no node overcommitted; each touched
        node stream got exactly one reservation event per batch."""
        report = run_placement_scenario(seed)
        fits, overflow = report.phases
        assert (fits.name, fits.requests, fits.placed, fits.workers_requested) == (
            "fits",
            100,
            100,
            0,
        )
        assert (fits.snapshot_reads_per_batch, fits.appends_per_batch, fits.batches) == (1, 1, 1)
        assert overflow.name == "overflow"
        assert overflow.workers_requested == overflow.bin_packing_minimum > 0
        assert overflow.placed == overflow.requests == 100
        assert report.overcommitted_nodes == 0
        assert report.node_events_per_batch == 1

    def test_naive_asks_for_unnecessary_workers(self, compared: PlacementReport) -> None:
        """The one-at-a-time placer on a 500 ms cache asks for workers the fleet did not need."""
        assert compared.naive is not None
        naive_fits, naive_overflow = compared.naive
        assert naive_fits.workers_requested > 50
        assert naive_overflow.workers_requested > naive_overflow.bin_packing_minimum
        assert compared.naive_overcommitted_nodes == 0

    def test_json_keys_are_the_contract(self, compared: PlacementReport) -> None:
        """--json carries phases with the agreed keys, overcommitted_nodes and naive phases."""
        data = json.loads(json.dumps(compared.to_dict()))
        keys = {
            "name",
            "requests",
            "placed",
            "workers_requested",
            "bin_packing_minimum",
            "snapshot_reads_per_batch",
            "appends_per_batch",
        }
        assert [p["name"] for p in data["phases"]] == ["fits", "overflow"]
        assert all(keys <= set(p) for p in data["phases"])
        assert data["overcommitted_nodes"] == 0
        assert [p["name"] for p in data["naive"]["phases"]] == ["fits", "overflow"]
        assert all(keys <= set(p) for p in data["naive"]["phases"])

    def test_json_reports_the_optimality_gap(self) -> None:
        """--json adds ``optimality_gap`` (how many workers the overflow's plans may exceed the
        minimum by: 0 on the default seed, every plan proven minimal) beside every key it had."""
        data = json.loads(json.dumps(run_placement_scenario(1).to_dict()))
        assert data["optimality_gap"] == 0
        assert {
            "scenario",
            "seed",
            "config",
            "phases",
            "overcommitted_nodes",
            "node_events_per_batch",
        } <= set(data)

    def test_render_names_both_placers(self, compared: PlacementReport) -> None:
        """The text report shows the batch and naive rows and the unnecessary workers."""
        text = compared.render()
        assert "naive" in text and "batch" in text and "unnecessary workers" in text

    def test_deterministic(self) -> None:
        """The same seed gives the same figures."""
        assert run_placement_scenario(3).to_dict() == run_placement_scenario(3).to_dict()


class TestTheLog:
    def test_the_log_verifies_and_replays_to_each_checkpoint(self, store_url: str) -> None:
        """On SQLite and Postgres: the hash chain holds, and with the fits placed, the
        overflow's workers requested and the overflow placed, a replay of the log equals the
        nodes the placement runtime held."""
        report = run_placement_scenario(2, url=store_url)
        assert [c.label for c in report.checkpoints] == [
            "fits placed",
            "overflow workers requested",
            "overflow placed",
        ]
        assert len({c.sha256 for c in report.checkpoints}) == 3
        with contextlib.closing(open_store(store_url)) as store:
            assert store.verify().ok
            for checkpoint in report.checkpoints:
                assert dumpstate_at(store, checkpoint.position) == checkpoint.state

    def test_compared_the_naive_fleet_follows_in_the_same_log(self, sqlite_url: str) -> None:
        """With --compare naive the naive placer's fleet is added after the batch run: the
        checkpoints, taken before it, still replay."""
        report = run_placement_scenario(2, url=sqlite_url, compare_naive=True)
        with contextlib.closing(open_store(sqlite_url)) as store:
            last = report.checkpoints[-1]
            assert store.head() > last.position
            assert dumpstate_at(store, last.position) == last.state

    def test_the_log_must_be_empty(self, sqlite_url: str) -> None:
        """A log that already holds a run is refused, before anything is written."""
        run_placement_scenario(2, url=sqlite_url)
        with pytest.raises(ValueError, match="needs an empty log"):
            run_placement_scenario(2, url=sqlite_url)
