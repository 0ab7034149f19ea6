"""``bench serve --driver wrk``: serve under the C load generator, followed to outcomes."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from fleetledger.adapters.benchmarks.serve_wrk import (
    CommitTail,
    WrkServeReport,
    WrkServeSeries,
    commit_tail,
    follow_outcomes,
    run_serve_wrk_bench,
)
from fleetledger.eventstore import EventStore, NewEvent

needs_wrk = pytest.mark.skipif(
    shutil.which("wrk") is None,
    reason="wrk is not installed (apt-get install wrk; .ci/run installs it)",
)


def log_run(store: EventStore, prefix: str, requests: int, *, outcomes: bool = True) -> None:
    """A run's requests as serve logs them, each with its outcome, and a seal between."""
    ids = [f"{prefix}{n}" for n in range(requests)]
    store.append(
        "vmgrouper-default", [NewEvent("vm.MachineRequested", {"request_id": r}) for r in ids]
    )
    store.append("vmgrouper-default", [NewEvent("vm.BatchSealed", {"request_ids": ids})])
    if outcomes:
        created = [NewEvent("vm.MachineCreated", {"request_id": r}) for r in ids]
        store.append(f"vmbatch-default-{prefix}", created)


class TestFollowOutcomes:
    def test_a_run_reads_its_own_requests_and_outcomes_only(self, store: EventStore) -> None:
        """Earlier runs' events are not read again, nor other types: what following a run
        costs does not grow with the runs before it."""
        log_run(store, "wrk-1-", 300)
        start = store.head()
        log_run(store, "wrk-2-", 20)

        followed = follow_outcomes(
            store, prefix="wrk-2-", after=start, accepted=20, since=time.monotonic(), deadline=5
        )

        assert (followed.logged, followed.with_outcome, followed.events_read) == (20, 20, 40)
        assert followed.seconds_to_see is not None
        [last] = store.read_all(after=store.head() - 1)
        assert followed.last_outcome_at == last.recorded_at.timestamp()

    def test_a_request_without_an_outcome_is_reported_past_the_deadline(
        self, store: EventStore
    ) -> None:
        """Requests logged without outcomes: counted, and no time to all outcomes."""
        log_run(store, "wrk-1-", 3, outcomes=False)

        followed = follow_outcomes(
            store, prefix="wrk-1-", after=0, accepted=3, since=time.monotonic(), deadline=0
        )

        assert (followed.logged, followed.with_outcome, followed.seconds_to_see) == (3, 0, None)


def wrk_run(*, accepted: int, p99_ms: float, outcomes_after: float | None) -> WrkServeReport:
    """A 10 s run at 50 ms a batch with these figures."""
    return WrkServeReport(
        backend="postgresql",
        connections=32,
        seconds=10,
        fake_latency=0.05,
        requests=accepted,
        accepted=accepted,
        non_2xx=0,
        socket_errors=0,
        lost=0,
        logged=accepted,
        p50_ms=10,
        p99_ms=p99_ms,
        p999_ms=p99_ms,
        max_ms=p99_ms,
        with_outcome=accepted if outcomes_after is not None else 0,
        seconds_to_all_outcomes=outcomes_after,
    )


class TestTailTarget:
    def test_a_series_names_each_run_that_missed_and_by_what(self) -> None:
        """The series is judged by its worst run; the report says which runs missed and why."""
        series = WrkServeSeries(
            (
                wrk_run(accepted=30_000, p99_ms=25, outcomes_after=0.1),
                wrk_run(accepted=28_000, p99_ms=53.4, outcomes_after=0.1),
                wrk_run(accepted=24_000, p99_ms=40, outcomes_after=6.0),
            )
        )

        assert not series.tail_passed
        assert series.tail_misses() == [
            "run 2: p99 53.4 ms",
            "run 3: 2,400 POSTs/s, outcomes after 6.0 s",
        ]
        assert "MISSED (run 2: p99 53.4 ms; run 3:" in series.render()

    def test_a_series_of_runs_within_every_bound_meets_it(self) -> None:
        series = WrkServeSeries((wrk_run(accepted=26_000, p99_ms=49.9, outcomes_after=4.9),) * 5)

        assert series.tail_passed and series.tail_misses() == []


class TestCommitTail:
    def test_counts_what_the_histogram_gained_past_each_bound(self) -> None:
        """Cumulative buckets read before and after a run: the run's appends, and those slower
        than 50 ms and than 250 ms."""
        before = {"0.05": 90.0, "0.1": 95.0, "0.25": 99.0, "+Inf": 100.0, "count": 100.0}
        after = {
            "0.05": 1_080.0,
            "0.1": 1_090.0,
            "0.25": 1_096.0,
            "+Inf": 1_100.0,
            "count": 1_100.0,
        }

        assert commit_tail(before, after) == CommitTail(appends=1_000, over_50ms=10, over_250ms=3)

    def test_is_unknown_when_either_reading_is(self) -> None:
        assert commit_tail(None, {"count": 1.0}) is None
        assert commit_tail({"count": 1.0}, None) is None

    def test_is_unknown_when_a_reading_lacks_a_bound(self) -> None:
        """A histogram without the 50 ms or 250 ms bucket would count every append as slow:
        the figure is unknown instead."""
        whole = {"0.05": 1.0, "0.25": 1.0, "count": 1.0}
        for bound in ("0.05", "0.25", "count"):
            partial = {k: v for k, v in whole.items() if k != bound}
            assert commit_tail(whole, partial) is None
            assert commit_tail(partial, whole) is None


@needs_wrk
class TestBenchServeWrk:
    def test_a_short_run_follows_every_accepted_post_to_its_outcome(
        self, postgres_url: str
    ) -> None:
        """Every POST wrk sends is accepted, in the log and created; the keys are stable."""
        series = run_serve_wrk_bench(postgres_url, connections=4, seconds=1, fake_latency=0)
        [report] = series.runs

        figures = json.loads(json.dumps(report.to_dict()))
        assert figures["accepted"] > 0
        assert figures["accepted"] + figures["non_2xx"] <= figures["requests"]
        assert (figures["non_2xx"], figures["socket_errors"], figures["lost"]) == (0, 0, 0)
        # wrk may stop before reading the last answers: those requests are logged too.
        assert figures["with_outcome"] == figures["logged"] >= figures["accepted"]
        assert figures["seconds_to_all_outcomes"] is not None
        assert figures["seconds_to_see_outcomes"] is not None
        assert (
            figures["server_cpu_ms_per_machine"] is None or figures["server_cpu_ms_per_machine"] > 0
        )
        latency = figures["latency_ms"]
        assert 0 < latency["p50"] <= latency["p99"] <= latency["p99.9"] <= latency["max"]
        appends = figures["appends"]
        assert appends["count"] >= 1 and 0 <= appends["over_250ms"] <= appends["over_50ms"]
        assert "0 lost (must be 0)" in report.render()
        assert "appends, first POST to outcomes" in report.render()

    def test_consecutive_runs_each_follow_their_own_requests(self, postgres_url: str) -> None:
        """Two runs on one server: each counts its own requests and outcomes; the series says
        whether every run met the targets."""
        series = run_serve_wrk_bench(
            postgres_url, connections=2, seconds=1, fake_latency=0.05, runs=2
        )

        first, second = series.runs
        for run in (first, second):
            assert run.lost == 0 and run.with_outcome == run.logged >= run.accepted > 0
        figures = json.loads(json.dumps(series.to_dict()))
        assert [r["accepted"] for r in figures["runs"]] == [first.accepted, second.accepted]
        assert figures["tail_target"]["passed"] is series.tail_passed
        assert "tail target (fake cloud 50 ms, every run)" in series.render()
