"""bench shards on a tiny fleet, through the command: the figures' keys, every node taken over by
exactly one shard, the same node states whatever the shard count; never its speed."""

from __future__ import annotations

import contextlib
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from fleetledger.adapters.benchmarks.shards import audit_log, fleet_changes
from fleetledger.adapters.cli import EXIT_USAGE, main
from fleetledger.adapters.cli.bench import shard_counts
from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.cluster import FakeCluster, Node
from fleetledger.adapters.nodes import NodesRuntime
from fleetledger.adapters.runtime import Leadership, MemoryLease, Shard, partition_of
from fleetledger.eventstore import EventStore

NODES = 40
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
RUN_KEYS = {
    "shards",
    "wall_seconds",
    "events",
    "events_per_second",
    "cpu_seconds",
    "speedup",
    "events_by_shard",
    "takeovers_by_one_shard",
    "takeover_problems",
    "nodes_dumped",
    "state_sha256",
    "transactions_committed",
    "transactions_rolled_back",
    "children",
}
CHILD_KEYS = {
    "shard",
    "nodes",
    "takeover_seconds",
    "seconds",
    "takeover_cpu_seconds",
    "cpu_seconds",
}


@pytest.fixture(scope="module")
def report(eventstore_postgres_server: str) -> dict[str, Any]:
    """``fleetledger bench shards --json`` over 40 nodes, one and two shards, one pass."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            ["bench", "shards", "--url", eventstore_postgres_server, "--nodes", str(NODES),
             "--shards", "1,2", "--passes", "1", "--json"]
        )  # fmt: skip
    assert code == 0, out.getvalue()
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


class TestReport:
    def test_the_figures_keys_are_stable(self, report: dict[str, Any]) -> None:
        assert set(report) == {
            "backend",
            "nodes",
            "passes",
            "changed_per_pass",
            "seed",
            "cpu_count",
            "runs",
            "states_equal",
            "passed",
        }
        assert [run["shards"] for run in report["runs"]] == [1, 2]
        for run in report["runs"]:
            assert set(run) == RUN_KEYS
            assert all(set(child) == CHILD_KEYS for child in run["children"])
        assert (report["backend"], report["nodes"], report["changed_per_pass"]) == (
            "postgresql",
            NODES,
            NODES // 10,
        )

    def test_each_count_ran_its_shards_in_processes_of_their_own(
        self, report: dict[str, Any]
    ) -> None:
        """One child per shard, together holding every node once; the speed-up is against
        the one-shard run; the Postgres counts cover the run's commits."""
        one, two = report["runs"]
        assert [c["shard"] for c in one["children"]] == ["nodes/0-of-1"]
        assert [c["shard"] for c in two["children"]] == ["nodes/0-of-2", "nodes/1-of-2"]
        assert [c["nodes"] for c in two["children"]] == [
            sum(1 for n in range(NODES) if partition_of(f"node-{n:06d}", 2) == p) for p in (0, 1)
        ]
        assert one["speedup"] == 1.0 and two["speedup"] > 0
        assert all(run["transactions_committed"] > 0 for run in report["runs"])
        assert all(c["cpu_seconds"] > 0 for run in report["runs"] for c in run["children"])

    def test_every_node_was_taken_over_by_exactly_one_shard(self, report: dict[str, Any]) -> None:
        """By the ``leader_shard`` of its take-over events, the shard of its partition."""
        for run in report["runs"]:
            assert run["takeovers_by_one_shard"] and run["takeover_problems"] == []
        one, two = report["runs"]
        assert set(one["events_by_shard"]) == {"nodes/0-of-1"}
        assert set(two["events_by_shard"]) == {"nodes/0-of-2", "nodes/1-of-2"}

    def test_every_count_leaves_the_same_node_states(self, report: dict[str, Any]) -> None:
        """The take-over and the resizes give the same states whichever shard made them; the
        events differ by the elections only (one per shard)."""
        one, two = report["runs"]
        assert report["states_equal"] and report["passed"]
        assert one["state_sha256"] == two["state_sha256"]
        assert one["nodes_dumped"] == two["nodes_dumped"] == NODES
        # Per node a join and a restart, then each resize, then each shard's election.
        assert one["events"] == 2 * NODES + NODES // 10 + 1
        assert two["events"] == one["events"] + 1


class TestChanges:
    def test_a_seeded_tenth_of_the_nodes_grows_a_cpu_each_pass(self) -> None:
        changes = fleet_changes(100, 3, seed=7)

        assert changes == fleet_changes(100, 3, seed=7) != fleet_changes(100, 3, seed=8)
        assert [len(resized) for resized in changes] == [10, 10, 10]
        grown: dict[str, int] = {}
        for resized in changes:
            for name, cpu in resized:
                grown[name] = grown.get(name, 16_000) + 1000
                assert cpu == grown[name]


class TestAudit:
    def test_a_node_taken_over_by_another_partitions_shard_is_reported(
        self, postgres_store: EventStore
    ) -> None:
        """A log whose nodes the one shard of a count of one took over, audited as two
        shards' log: every node is reported, each under the shard that took it over — a
        partition of another count is another shard, even partition 0."""
        shard = Shard("nodes", 0, 1)
        clock = ManualClock(EPOCH)
        names = [f"node-{n:06d}" for n in range(NODES)]
        runtime = NodesRuntime(
            postgres_store,
            FakeCluster([Node(name, cpu_millis=4000, memory_mib=8192) for name in names]),
            clock=clock,
            threads=False,
            leadership=Leadership(
                postgres_store, MemoryLease({}, holder="a", name=shard.name), clock=clock,
                holder="a", shard=shard,
            ),
            shard=shard,
        )  # fmt: skip
        runtime.start()
        runtime.stop()

        events, by_shard, problems = audit_log(postgres_store, NODES, 2)

        assert by_shard == {"nodes/0-of-1": events}
        reported = sorted(problem.split(":", 1)[0] for problem in problems)
        assert reported == names
        assert all("taken over by nodes/0-of-1, not nodes/" in problem for problem in problems)
        assert audit_log(postgres_store, NODES, 1)[2] == ()


class TestShardCounts:
    def test_counts_parse(self) -> None:
        assert shard_counts("1,2,4") == (1, 2, 4)

    @pytest.mark.parametrize("value", ["0", "x", "1,,2", "1,1", "65", "", "-1"])
    def test_bad_counts_are_usage_errors(
        self, value: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            main(["bench", "shards", f"--shards={value}"])

        assert exited.value.code == EXIT_USAGE
        assert "argument --shards:" in capsys.readouterr().err
