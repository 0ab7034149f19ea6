"""The restart scenario: the node runtime restarted mid-run, log-bound rule vs the seed's."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest

from fleetledger.adapters.simulator.restart import (
    RestartReport,
    RestartSettings,
    run_restart_scenario,
)
from fleetledger.eventstore import open_store
from fleetledger.projections.dumpstate import dumpstate_at

SMALL = RestartSettings(
    nodes=3,
    pods_per_node=6,
    node_cpu_milli=16_000,
    node_memory_slots=48,
    restart_at_seconds=40.0,
    downtime_seconds=20.0,
    reconnect_spread_seconds=30.0,
    run_after_restart_seconds=60.0,
    pods_placed_while_down=1,
    snapshot_every=20,
)


def without_wall_time(figures: dict[str, object]) -> dict[str, object]:
    """The report minus ``rebuild_seconds``, the one figure not fixed by the seed."""
    data = json.loads(json.dumps(figures))
    data.pop("rebuild_seconds")
    for rule in data["by_rule"].values():
        rule.pop("rebuild_seconds")
    return dict(data)


@pytest.fixture(scope="module")
def default_run() -> RestartReport:
    return run_restart_scenario(1)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, RestartReport]:
    """The small fleet's run on a SQLite log that stays for the tests to read."""
    url = f"sqlite:///{tmp_path_factory.mktemp('restart') / 'log.db'}"
    return url, run_restart_scenario(5, SMALL, url=url)


class TestFigures:
    def test_json_carries_the_promised_figures(self, default_run: RestartReport) -> None:
        """--json names both rules' buffers, the time to zero, safety counts and traffic."""
        figures = json.loads(json.dumps(default_run.to_dict()))
        assert set(figures["buffer_after_restart"]) == {"log_bound", "assume_max"}
        for rule in ("log_bound", "assume_max"):
            assert set(figures["buffer_after_restart"][rule]) == {"cpu_milli", "memory_slots"}
        assert figures["negative_values"] == 0
        assert figures["grants_beyond_capacity"] == 0
        assert figures["requests"] > 1000
        assert isinstance(figures["migrations_started"], int)
        assert figures["by_rule"]["log_bound"]["replay_mismatches"] == 0
        assert figures["by_rule"]["assume_max"]["replay_mismatches"] == 0

    def test_json_adds_the_rebuild_and_what_it_assumed(self, default_run: RestartReport) -> None:
        """--json adds where the rebuild read up to, its wall time, the snapshots it started
        from, what the takeover assumed and the checkpoints."""
        figures = json.loads(json.dumps(default_run.to_dict()))
        assert figures["rebuilt_from_position"] > 0
        assert figures["rebuild_seconds"] > 0
        assert set(figures["rebuild"]) == {"nodes_from_snapshots", "events_after_snapshots"}
        assert figures["assumed"] == {
            "pods_bounded_by_last_permit": 120,
            "pods_never_seen_held_at_max": 3,
        }
        assert [c["label"] for c in figures["checkpoints"]] == [
            "before the restart",
            "after the restart",
            "end",
        ]

    def test_log_bound_holds_less_buffer_than_assume_max(self, default_run: RestartReport) -> None:
        """Knowing the last permit holds less capacity back than assuming every VM at its max."""
        ours, seeds = default_run.log_bound, default_run.assume_max
        assert ours.buffer_cpu_milli < seeds.buffer_cpu_milli
        assert ours.buffer_memory_slots < seeds.buffer_memory_slots
        assert ours.reserved_cpu_milli < seeds.reserved_cpu_milli
        assert ours.buffer_cpu_seconds < seeds.buffer_cpu_seconds

    def test_buffers_clear_once_agents_reconnect(self, default_run: RestartReport) -> None:
        """Every buffer is back to zero within the reconnect spread plus one agent period (and
        the round an agent's request waits for)."""
        settings = default_run.settings
        limit = settings.reconnect_spread_seconds + 1.2 * settings.agent_period_seconds + 1
        for outcome in (default_run.log_bound, default_run.assume_max):
            assert outcome.seconds_until_buffers_zero is not None
            assert 0 < outcome.seconds_until_buffers_zero <= limit

    def test_without_downtime_the_log_bound_rule_holds_no_buffer(self) -> None:
        """With nothing uncertain our rule holds no buffer; the seed's rule still holds some."""
        quiet = RestartSettings(
            nodes=3,
            pods_per_node=4,
            downtime_seconds=0.0,
            pods_placed_while_down=0,
            reconnect_spread_seconds=10.0,
            run_after_restart_seconds=30.0,
        )
        report = run_restart_scenario(3, quiet)
        # With no downtime every agent's use equals its last permit: nothing is uncertain.
        assert (report.log_bound.buffer_cpu_milli, report.log_bound.buffer_memory_slots) == (0, 0)
        assert report.log_bound.seconds_until_buffers_zero == 0.0
        assert report.assume_max.buffer_cpu_milli > 0

    def test_pods_the_log_never_saw_are_held_at_their_max(self) -> None:
        """Pods placed while no controller ran are the only ones holding a buffer."""
        quiet = RestartSettings(
            nodes=3,
            pods_per_node=4,
            downtime_seconds=0.0,
            pods_placed_while_down=2,
            reconnect_spread_seconds=10.0,
            run_after_restart_seconds=30.0,
        )
        report = run_restart_scenario(3, quiet)
        assert report.log_bound.pods_with_buffer == 2
        assert report.log_bound.pods_never_seen == 2
        assert report.assume_max.pods_with_buffer == report.vm_pods == 14

    def test_same_seed_same_report_other_seed_other_report(self) -> None:
        """The run is a function of its seed (but for the rebuild's wall time)."""
        first = without_wall_time(run_restart_scenario(7, SMALL).to_dict())
        assert without_wall_time(run_restart_scenario(7, SMALL).to_dict()) == first
        assert without_wall_time(run_restart_scenario(8, SMALL).to_dict()) != first


class TestTheRestart:
    def test_the_new_runtime_rebuilds_from_where_the_old_one_stopped(
        self, logged: tuple[str, RestartReport]
    ) -> None:
        """The rebuild reads the log up to the position the stopped runtime left it at, and the
        takeover's own events follow it."""
        _, report = logged
        before, after, _ = report.checkpoints
        assert report.log_bound.rebuilt_from_position == before.position
        assert after.position > before.position

    def test_the_rebuild_starts_from_snapshots(self, logged: tuple[str, RestartReport]) -> None:
        """Node streams snapshot every 20 events: every node is rebuilt from one, folding fewer
        events than the log holds."""
        _, report = logged
        ours = report.log_bound
        assert ours.nodes_from_snapshots == SMALL.nodes
        assert 0 < ours.events_after_snapshots < ours.rebuilt_from_position

    def test_without_snapshots_the_rebuild_reads_every_event(self) -> None:
        """With snapshots too rare to be taken, the rebuild folds every event the log holds
        then: they are all node events."""
        report = run_restart_scenario(5, replace(SMALL, snapshot_every=1_000_000))
        ours = report.log_bound
        assert ours.nodes_from_snapshots == 0
        assert ours.events_after_snapshots == ours.rebuilt_from_position

    def test_the_takeover_names_what_it_assumed(self, logged: tuple[str, RestartReport]) -> None:
        """Pods the log knew are bounded by their last permit; the one placed while the
        controller was down is held at its max."""
        _, report = logged
        ours = report.log_bound
        assert ours.pods_never_seen == SMALL.pods_placed_while_down
        assert ours.pods_bounded_by_last_permit == SMALL.nodes * SMALL.pods_per_node


class TestTheLog:
    def test_the_log_verifies(self, logged: tuple[str, RestartReport]) -> None:
        """The run's log has an intact hash chain."""
        url, _ = logged
        with contextlib.closing(open_store(url)) as store:
            assert store.verify().ok

    def test_replaying_the_log_gives_the_state_the_runtime_held(
        self, logged: tuple[str, RestartReport]
    ) -> None:
        """At each checkpoint — before the restart, right after the takeover, at the end — a
        replay of the log to its position equals what the live runtime held there."""
        url, report = logged
        with contextlib.closing(open_store(url)) as store:
            for checkpoint in report.checkpoints:
                assert dumpstate_at(store, checkpoint.position) == checkpoint.state, (
                    checkpoint.label
                )

    def test_the_checkpoints_tell_the_states_apart(self, logged: tuple[str, RestartReport]) -> None:
        """Each checkpoint holds a different state: right after the takeover, buffers."""
        _, report = logged
        digests = {c.sha256 for c in report.checkpoints}
        assert len(digests) == 3
        after = report.checkpoints[1].state["nodes"]
        assert isinstance(after, dict)
        assert any(n["resources"]["cpu"]["buffer"] for n in after.values())

    def test_the_log_must_be_empty(self, logged: tuple[str, RestartReport]) -> None:
        """A log that already holds a run is refused, before anything is written."""
        url, _ = logged
        with contextlib.closing(open_store(url)) as store:
            head = store.head()
        with pytest.raises(ValueError, match="needs an empty log"):
            run_restart_scenario(5, SMALL, url=url)
        with contextlib.closing(open_store(url)) as store:
            assert store.head() == head

    def test_on_postgres_too(self, postgres_url: str) -> None:
        """The scenario writes to Postgres when given its URL; the replay matches there too."""
        report = run_restart_scenario(5, SMALL, url=postgres_url)
        with contextlib.closing(open_store(postgres_url)) as store:
            assert store.verify().ok
            mid = report.checkpoints[1]
            assert dumpstate_at(store, mid.position) == mid.state


class TestText:
    def test_render_shows_both_rules_side_by_side(self, default_run: RestartReport) -> None:
        """The text report has a column per rule, the capacity the log-bound rule frees and
        the rebuild."""
        text = default_run.render()
        assert "log-bound" in text and "assume-max" in text
        assert "buffer after restart, CPU" in text
        assert "until buffers are zero" in text
        assert "the log-bound rule frees" in text
        assert "rebuilt from log position" in text


class TestSettings:
    def test_a_run_too_short_for_reconnects_is_refused(self) -> None:
        """Settings that could never show buffers clearing say what to change."""
        with pytest.raises(ValueError, match="run_after_restart_seconds must exceed"):
            RestartSettings(reconnect_spread_seconds=60.0, run_after_restart_seconds=30.0)

    def test_snapshots_need_a_positive_interval(self) -> None:
        """A snapshot interval below one event is refused."""
        with pytest.raises(ValueError, match="snapshot_every"):
            RestartSettings(snapshot_every=0)
