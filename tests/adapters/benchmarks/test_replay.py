"""bench replay on tiny logs: the generated log is every capability's, copied under distinct
names, and replaying it rebuilds exactly what the live read models hold; the report's shape,
never its speed."""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence

import pytest

from fleetledger.adapters.benchmarks.replay import (
    TARGET_EVENTS_PER_SECOND,
    TARGET_PEAK_RSS_BYTES,
    replay_models,
    run_replay_bench,
)
from fleetledger.adapters.benchmarks.replay_log import Template, generate_log, record_scenarios
from fleetledger.adapters.machines.streams import batch_stream_prefix, grouper_stream_id
from fleetledger.adapters.placement.workloads import read_workloads
from fleetledger.eventstore import EventStore
from fleetledger.projections._reading import YOUNG_COLLECTION_THRESHOLD, bulk_read
from fleetledger.projections.dumpstate import dumpstate_at
from fleetledger.projections.machine_requests import MachineRequestsProjection
from fleetledger.projections.nodes import NodesProjection

# Every capability the replay folds, without the restart scenario (seconds of its own): nodes
# come with the placement workloads.
_SCENARIOS = ("burst-vms", "burst-workloads", "subnet", "testbed")


@pytest.fixture(scope="module")
def templates() -> list[Template]:
    return record_scenarios(seed=1, scenarios=_SCENARIOS)


def _generated(store: EventStore, templates: Sequence[Template], copies: float) -> int:
    url = store.engine.url.render_as_string(hide_password=False)
    events = int(len(templates) * copies)
    generate_log(url, events=events, templates=templates)
    return events


class TestGeneratedLog:
    def test_copies_are_fleets_of_their_own(
        self, sqlite_store: EventStore, templates: list[Template]
    ) -> None:
        """Two whole copies hold twice each capability's entities: every stream and every
        grouper renamed, the node named in its NodeJoined renamed with its stream."""
        _generated(sqlite_store, templates, 2)
        models, ledger, folded = replay_models(sqlite_store)
        assert folded == 2 * len(templates)
        one_copy_nodes = {t.entity for t in templates if t.category == "node-"}
        states = models.nodes.states()
        assert len(states) == 2 * len(one_copy_nodes)
        assert all(state.name == name for name, state in states.items())
        assert len(models.subnets.subnets()) == 2
        assert len(models.requests) == 2
        assert len(ledger.items()) == 2 * len(
            {t.entity for t in templates if t.type.startswith("placement.")}
        )

    def test_every_part_of_a_copy_holds_every_capability(self, templates: list[Template]) -> None:
        """The scenarios' logs are merged evenly: a tenth of a copy already holds nodes,
        subnets, machine requests, workloads and testbeds."""
        tenth = {t.category for t in templates[: len(templates) // 10]}
        assert {"node-", "subnet-", "vmgrouper-", "workload-", "testbed-"} <= tenth

    def test_a_log_holding_enough_is_left_alone(
        self, sqlite_store: EventStore, templates: list[Template]
    ) -> None:
        """Topping up appends up to the events asked for, and nothing once the log holds them."""
        url = sqlite_store.engine.url.render_as_string(hide_password=False)
        first = generate_log(url, events=100, templates=templates)
        again = generate_log(url, events=150, templates=templates)
        assert (first.events, again.events, sqlite_store.head()) == (100, 50, 150)
        assert generate_log(url, events=150, templates=templates).events == 0


class TestReplay:
    def test_replay_equals_the_live_read_models(
        self, store: EventStore, templates: list[Template]
    ) -> None:
        """Replaying a generated log (one copy and a half, in small pages) rebuilds the nodes,
        subnets, machine requests and workloads the live read models catch up to."""
        events = _generated(store, templates, 1.5)
        models, ledger, folded = replay_models(store, page=97)
        head = store.head()
        assert (folded, models.position) == (events, head)
        assert models.dump(head) == dumpstate_at(store)
        live_nodes = NodesProjection()
        live_nodes.catch_up(store)
        assert models.nodes.states() == live_nodes.states()
        for grouper, replayed in models.requests.items():
            live = MachineRequestsProjection(
                grouper_stream=grouper_stream_id(grouper),
                batch_stream_prefix=batch_stream_prefix(grouper),
            )
            live.catch_up(store)
            assert replayed.views() == live.views()
            assert replayed.views()
        assert ledger.items() == read_workloads(store)
        assert ledger.items()

    def test_replay_stops_after_the_events_asked_for(
        self, sqlite_store: EventStore, templates: list[Template]
    ) -> None:
        """A replay of the first N events folds exactly N, across pages."""
        _generated(sqlite_store, templates, 1)
        models, _, folded = replay_models(sqlite_store, events=250, page=100)
        assert (folded, models.position) == (250, 250)


class TestReplayBench:
    def test_a_tiny_run_reports_figures_beside_targets(self, sqlite_url: str) -> None:
        """The replay is measured in a child process: events/s, seconds and peak RSS come back
        with the targets and whether they were met, under stable JSON keys."""
        lines: list[str] = []
        report = run_replay_bench(
            None, log=sqlite_url, events=60, page=25, scenarios=("testbed",), progress=lines.append
        )
        data = json.loads(json.dumps(report.to_dict()))
        assert set(data) == {"backend", "events", "page", "generated", "replay", "targets"}
        assert data["replay"]["folded"]["events"] == 60
        assert data["replay"]["events_per_second"] > 0
        assert 0 < data["replay"]["peak_rss_bytes"] < TARGET_PEAK_RSS_BYTES
        assert data["targets"]["events_per_second"] == TARGET_EVENTS_PER_SECOND
        assert data["targets"]["peak_rss_met"] is True
        assert data["generated"]["events"] == 60
        assert "peak RSS" in report.render()
        assert any("replaying" in line for line in lines)

    def test_bad_sizes(self, sqlite_url: str) -> None:
        """A size below one is refused before anything runs."""
        with pytest.raises(ValueError, match="at least 1"):
            run_replay_bench(None, log=sqlite_url, events=0)


class TestBulkRead:
    def test_young_collections_are_rarer_while_folding_and_restored_after(self) -> None:
        """The collector's young threshold is raised while any fold runs (nested folds too)
        and back as it was once the last one ends."""
        before = gc.get_threshold()
        with bulk_read():
            with bulk_read():
                assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
            assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
        assert gc.get_threshold() == before

    def test_thresholds_set_meanwhile_are_left_alone(self) -> None:
        """Thresholds another part of the process set during a fold (serve's tuning of the
        heap) are not undone when the fold ends."""
        before = gc.get_threshold()
        try:
            with bulk_read():
                gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, 10, 100)
            assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, 10, 100)
        finally:
            gc.set_threshold(*before)
