"""The restart scenario: buffers held after a controller restart, log-bound rule vs the seed's."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.simulator.restart import (
    RestartReport,
    RestartSettings,
    run_restart_scenario,
)

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
)


@pytest.fixture(scope="module")
def default_run() -> RestartReport:
    return run_restart_scenario(1)


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

    def test_log_bound_holds_less_buffer_than_assume_max(self, default_run: RestartReport) -> None:
        """Knowing the last permit holds less capacity back than assuming every VM at its max."""
        ours, seeds = default_run.log_bound, default_run.assume_max
        assert ours.buffer_cpu_milli < seeds.buffer_cpu_milli
        assert ours.buffer_memory_slots < seeds.buffer_memory_slots
        assert ours.reserved_cpu_milli < seeds.reserved_cpu_milli
        assert ours.buffer_cpu_seconds < seeds.buffer_cpu_seconds

    def test_buffers_clear_once_agents_reconnect(self, default_run: RestartReport) -> None:
        """Every buffer is back to zero within the reconnect spread plus one agent period."""
        settings = default_run.settings
        limit = settings.reconnect_spread_seconds + 1.2 * settings.agent_period_seconds
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
        assert report.assume_max.pods_with_buffer == report.vm_pods == 14

    def test_same_seed_same_report_other_seed_other_report(self) -> None:
        """The run is a function of its seed."""
        first = run_restart_scenario(7, SMALL).to_dict()
        assert run_restart_scenario(7, SMALL).to_dict() == first
        assert run_restart_scenario(8, SMALL).to_dict() != first


class TestText:
    def test_render_shows_both_rules_side_by_side(self, default_run: RestartReport) -> None:
        """The text report has a column per rule and the capacity the log-bound rule frees."""
        text = default_run.render()
        assert "log-bound" in text and "assume-max" in text
        assert "buffer after restart, CPU" in text
        assert "until buffers are zero" in text
        assert "the log-bound rule frees" in text


class TestSettings:
    def test_a_run_too_short_for_reconnects_is_refused(self) -> None:
        """Settings that could never show buffers clearing say what to change."""
        with pytest.raises(ValueError, match="run_after_restart_seconds must exceed"):
            RestartSettings(reconnect_spread_seconds=60.0, run_after_restart_seconds=30.0)
