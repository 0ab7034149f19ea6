"""The log's metrics: folded at scrape time within a budget, with bounded labels."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

import fleetledger.adapters.machines
import fleetledger.adapters.placement
import fleetledger.adapters.testbeds  # noqa: F401 - registers every event type
from fleetledger.adapters.machines.write_budget import ThrottleReason
from fleetledger.adapters.metrics import COUNTED_EVENT_TYPES, MAX_NODE_SERIES, LogMetrics, from_log
from fleetledger.adapters.simulator import run_scenario
from fleetledger.domain.codec import registered_event_types
from fleetledger.domain.ipam.aggregate import Direction
from fleetledger.domain.testbeds.testbed import SlotStatus
from fleetledger.eventstore import ANY, EventStore, NewEvent, migrate, open_store

from .world import families, ids_in_log, samples, value


def _scrape(metrics: LogMetrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()


class TestFolding:
    def test_a_scrape_folds_at_most_its_budget(self, store_url: str) -> None:
        """A scrape far behind folds its budget and reports the rest as lag; the next ones
        catch up to the same values as a fold without a budget."""
        run_scenario("burst-vms", seed=1, url=store_url)
        with contextlib.closing(open_store(store_url)) as store:
            bounded = LogMetrics(store, max_events_per_scrape=200)
            first = _scrape(bounded)
            assert value(first, "fleetledger_metrics_events_folded_total") == 200
            assert value(first, "fleetledger_subscription_lag_events", subscriber="metrics") > 0
            texts = [_scrape(bounded) for _ in range(5)]
            whole = _scrape(LogMetrics(store))
        assert value(texts[-1], "fleetledger_subscription_lag_events", subscriber="metrics") == 0
        for name in ("fleetledger_vm_requests_total", "fleetledger_metrics_events_folded_total"):
            assert value(texts[-1], name) == value(whole, name)

    def test_an_unreadable_log_keeps_the_last_values(self, tmp_path: Path) -> None:
        """While the log cannot be read, a scrape still answers with what was folded, and
        counts the failed read."""
        path = tmp_path / "log.db"
        url = f"sqlite:///{path}"
        migrate.upgrade(url)
        run_scenario("burst-vms", seed=1, url=url)
        store = open_store(url)
        metrics = LogMetrics(store)
        before = _scrape(metrics)
        store.close()
        path.unlink()
        after = _scrape(metrics)
        assert value(after, "fleetledger_metrics_log_read_errors_total") == 1
        assert value(after, "fleetledger_vm_requests_total") == value(
            before, "fleetledger_vm_requests_total"
        )

    def test_every_counted_type_is_registered(self) -> None:
        """The metrics read event types by their stored names: each one exists."""
        assert set(COUNTED_EVENT_TYPES) <= set(registered_event_types())

    def test_closed_label_sets_are_the_codes(self) -> None:
        """The closed sets the labels are held to are the code's own."""
        assert get_args(ThrottleReason) == from_log._THROTTLE_REASONS
        assert get_args(Direction) == from_log._DIRECTIONS
        assert get_args(SlotStatus) == from_log.SLOT_STATES

    def test_a_value_outside_its_set_is_other(self, sqlite_store: EventStore) -> None:
        """A failure code or seal reason this version does not know (a newer writer's) is
        counted under ``other``, never as a label value of its own."""
        sqlite_store.append(
            "vmbatch-x",
            [
                NewEvent("vm.MachineFailed", {"code": "brand_new_code", "batch_id": "b"}),
                NewEvent("vm.BatchSealed", {"reason": "moon", "request_ids": ["r-1"]}),
            ],
            expected_version=ANY,
        )
        text = _scrape(LogMetrics(sqlite_store))
        assert value(text, "fleetledger_vm_machine_errors_total", code="other") == 1
        assert value(text, "fleetledger_vm_batches_sealed_total", reason="other") == 1
        assert "brand_new_code" not in text and "moon" not in text

    def test_an_unreadable_event_is_skipped(self, sqlite_store: EventStore) -> None:
        """A testbed event of a shape this version cannot decode is counted and skipped; the
        events after it are still folded."""
        sqlite_store.append(
            "testbed-bed",
            [
                NewEvent("testbed.TestbedDefined", {"name": "bed"}),
                NewEvent("vm.MachineRequested", {"request_id": "r-1"}),
            ],
            expected_version=ANY,
        )
        text = _scrape(LogMetrics(sqlite_store))
        assert value(text, "fleetledger_metrics_events_unreadable_total") == 1
        assert value(text, "fleetledger_vm_requests_total") == 1

    @pytest.mark.parametrize("option", ["max_events_per_scrape", "max_nodes"])
    def test_limits_must_be_positive(self, sqlite_store: EventStore, option: str) -> None:
        """A limit below 1 is refused, naming it."""
        with pytest.raises(ValueError, match=option):
            LogMetrics(sqlite_store, **{option: 0})  # type: ignore[arg-type]


class TestCardinality:
    def test_no_label_carries_an_id(self, world: EventStore) -> None:
        """No label value is a request, batch, workload, pod or scheduling id of the log."""
        text = _scrape(LogMetrics(world))
        ids = ids_in_log(world)
        assert len(ids) > 500
        labels = {v for s in samples(text) for k, v in s.labels.items() if k != "le"}
        assert labels & ids == set()

    def test_series_are_bounded_whatever_the_fleet(self, world: EventStore) -> None:
        """With 300+ nodes, thousands of requests and pods, each per-node family has
        ``MAX_NODE_SERIES`` series and ``_other``; the whole exposition stays small."""
        text = _scrape(LogMetrics(world))
        for name, series in families(text).items():
            if name.startswith("fleetledger_node_"):
                assert len(series) == MAX_NODE_SERIES + 1, name
        assert len(samples(text)) < 1200

    def test_a_smaller_cap_folds_more(self, world: EventStore) -> None:
        """The cap is the metrics' option; totals are the same under any cap."""
        small = _scrape(LogMetrics(world, max_nodes=3))
        large = _scrape(LogMetrics(world))
        series = families(small)["fleetledger_node_memory_reserved_bytes"]
        assert len(series) == 4
        assert sum(s.value for s in series) == pytest.approx(
            sum(s.value for s in families(large)["fleetledger_node_memory_reserved_bytes"])
        )

    def test_names_follow_prometheus_conventions(self, world: EventStore) -> None:
        """Every family is prefixed, snake case; counters end in ``_total``; units are base
        units (seconds, bytes) where a name has one."""
        text = _scrape(LogMetrics(world))
        for sample in samples(text):
            assert re.fullmatch(r"fleetledger_[a-z0-9_]+", sample.name), sample.name
            assert not re.search(r"_(ms|milliseconds|mib|gib|kb|minutes)(_|$)", sample.name)
        for name, kind in ((f.name, f.type) for f in _parsed(text)):
            if kind == "counter":
                assert f"{name}_total" in {s.name for s in samples(text)}, name


def _parsed(text: str) -> list[Metric]:
    return list(text_string_to_metric_families(text))
