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
from fleetledger.projections._reading import bulk_read
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
        """The replay is measured in a child process: events/s, seconds, CPU seconds and peak
        RSS come back with the targets and whether they were met, under stable JSON keys."""
        lines: list[str] = []
        report = run_replay_bench(
            None, log=sqlite_url, events=60, page=25, scenarios=("testbed",), progress=lines.append
        )
        data = json.loads(json.dumps(report.to_dict()))
        assert set(data) == {"backend", "events", "page", "generated", "replay", "targets"}
        assert data["replay"]["folded"]["events"] == 60
        assert data["replay"]["events_per_second"] > 0
        assert data["replay"]["cpu_seconds"] > 0
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
    def test_the_collector_is_off_while_folding_and_on_again_after(self) -> None:
        """Automatic collection is off while any fold runs (nested folds too) and on again
        once the last one ends."""
        assert gc.isenabled()
        with bulk_read():
            with bulk_read():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()

    def test_a_collector_that_was_off_stays_off(self) -> None:
        """A fold does not turn on a collector that was off before it began."""
        gc.disable()
        try:
            with bulk_read():
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()

    def test_a_collector_turned_on_meanwhile_is_left_on(self) -> None:
        """Another part of the process that turns the collector on during a fold decided for
        the process: the fold's end leaves it on."""
        with bulk_read():
            gc.enable()
        assert gc.isenabled()

    def test_folding_makes_no_reference_cycles(
        self, sqlite_store: EventStore, templates: list[Template]
    ) -> None:
        """With the collector off, folding a log three times as long leaves no more garbage for
        it to find: the models free what they replace by reference counting alone."""
        events = _generated(sqlite_store, templates, 3)

        def garbage_after(folded: int) -> int:
            gc.collect()
            with bulk_read():
                replay_models(sqlite_store, events=folded, page=events)
                return gc.collect()

        assert garbage_after(events) <= garbage_after(events // 3)
