"""The ``subnet`` scenario: naive and formula policies oscillate, the settled one does not."""

from __future__ import annotations

import contextlib
import json

import pytest

from fleetledger.adapters.simulator.subnet import (
    POLICIES,
    SubnetReport,
    run_subnet_scenario,
)
from fleetledger.eventstore import open_store
from fleetledger.projections.dumpstate import dumpstate_at

SMALL = {"nodes": 6, "capacity": 128, "rise_s": 30, "hold_s": 30, "fall_s": 30}


@pytest.fixture(scope="module")
def report() -> SubnetReport:
    return run_subnet_scenario(1)


class TestOscillation:
    @pytest.mark.parametrize("policy", ["naive", "formula"])
    def test_feedback_policies_oscillate(self, report: SubnetReport, policy: str) -> None:
        """Sized from the IPs they allocated, naive and formula flip the flag and change the
        batch again and again while no node's demand changes (32 nodes on a /22)."""
        figures = report.policies[policy]  # type: ignore[index]
        assert figures.exhaustion_flips >= 10
        assert figures.steady_batch_changes >= 10

    def test_settled_does_not_oscillate(self, report: SubnetReport) -> None:
        """The settled aggregate never flips and never changes the batch at steady demand; as
        demand rises then falls the batch only steps down then up (at most twice per power of
        two below 16)."""
        settled = report.policies["settled"]
        assert settled.exhaustion_flips == 0
        assert settled.steady_batch_changes == 0
        assert 0 < settled.batch_changes <= 2 * 4

    def test_settled_calls_the_allocator_least(self, report: SubnetReport) -> None:
        """Without oscillation the settled policy makes far fewer allocator calls."""
        settled = report.policies["settled"].ip_requests
        assert settled * 10 < report.policies["naive"].ip_requests
        assert settled * 10 < report.policies["formula"].ip_requests

    @pytest.mark.parametrize("policy", POLICIES)
    def test_no_policy_over_allocates(self, report: SubnetReport, policy: str) -> None:
        """At no moment do the nodes hold more IPs than the subnet has."""
        figures = report.policies[policy]  # type: ignore[index]
        assert 0 < figures.peak_allocated <= report.capacity
        assert figures.peak_utilization <= 1.0

    @pytest.mark.parametrize("policy", POLICIES)
    def test_every_pod_is_counted(self, report: SubnetReport, policy: str) -> None:
        """Every pod of the script has one wait, whatever the policy."""
        assert report.policies[policy].pods == report.policies["settled"].pods  # type: ignore[index]


class TestOtherSeeds:
    @pytest.mark.parametrize("seed", [2, 3])
    def test_only_the_feedback_policies_oscillate(self, seed: int) -> None:
        """Other pods, same verdict: naive and formula flip at steady demand, settled never."""
        policies = run_subnet_scenario(seed).policies
        assert policies["naive"].steady_batch_changes > 0
        assert policies["formula"].steady_batch_changes > 0
        assert policies["settled"].exhaustion_flips == 0
        assert policies["settled"].steady_batch_changes == 0


class TestReport:
    def test_json_shape(self, report: SubnetReport) -> None:
        """``to_dict`` carries the scenario, the seed and the five figures for each policy."""
        data = json.loads(json.dumps(report.to_dict()))
        assert (data["scenario"], data["seed"]) == ("subnet", 1)
        assert set(data["policies"]) == {"naive", "formula", "settled"}
        for figures in data["policies"].values():
            assert {
                "exhaustion_flips",
                "batch_changes",
                "ip_requests",
                "pod_ip_wait_p99_s",
                "peak_utilization",
            } <= set(figures)

    def test_render_names_each_policy(self, report: SubnetReport) -> None:
        """The text report has a column per policy and a row per figure."""
        text = report.render()
        header = text.splitlines()[1].split()
        assert header == ["naive", "formula", "settled"]
        assert "exhaustion flips" in text and "pod IP wait p99" in text

    def test_same_seed_same_report(self) -> None:
        """The run is a function of its seed (on a smaller cluster, to keep the test short)."""
        first = run_subnet_scenario(7, **SMALL)  # type: ignore[arg-type]
        again = run_subnet_scenario(7, **SMALL)  # type: ignore[arg-type]
        assert first.to_dict() == again.to_dict()
        assert first.to_dict() != run_subnet_scenario(8, **SMALL).to_dict()  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "options",
        [{"nodes": 0}, {"capacity": 0}, {"allocator_latency_s": 0}, {"peak_range": (5, 2)}],
    )
    def test_bad_options_refused(self, options: dict[str, object]) -> None:
        """Options out of range are refused with the reason."""
        with pytest.raises(ValueError, match="must be"):
            run_subnet_scenario(1, **options)  # type: ignore[arg-type]


class TestTheLog:
    """The settled policy runs the pod-IP runtime on the scenario's log."""

    def test_the_log_verifies_and_replays_to_each_checkpoint(self, store_url: str) -> None:
        """On SQLite and Postgres: the hash chain holds, and at the end of the rise, of the
        plateau and of the run a replay of the log equals the subnet the runtime held."""
        report = run_subnet_scenario(3, url=store_url, **SMALL)  # type: ignore[arg-type]
        assert [c.label for c in report.checkpoints] == [
            "end of the rise",
            "end of the plateau",
            "end",
        ]
        with contextlib.closing(open_store(store_url)) as store:
            assert store.verify().ok
            for checkpoint in report.checkpoints:
                assert dumpstate_at(store, checkpoint.position) == checkpoint.state

    def test_the_runtime_decided_the_settled_figures(self, store_url: str) -> None:
        """The settled figures are the log's: its allocations, releases and batch changes are
        events in it."""
        report = run_subnet_scenario(3, url=store_url, **SMALL)  # type: ignore[arg-type]
        settled = report.policies["settled"]
        with contextlib.closing(open_store(store_url)) as store:
            records = store.read_all(limit=100_000)
        types = [r.type for r in records]
        assert types.count("ipam.IpsAllocated") == settled.allocation_calls > 0
        assert types.count("ipam.IpsReleased") == settled.release_calls
        # The batch the join sets is not a change under load (see the module docstring).
        under_load = [
            r
            for r in records
            if r.type == "ipam.BatchSizeChanged" and not str(r.data["cause"]).startswith("join")
        ]
        assert len(under_load) == settled.batch_changes > 0

    def test_the_checkpoints_differ_as_the_pools_grow_and_shrink(
        self, report: SubnetReport
    ) -> None:
        """The subnet held at the end of the rise, of the plateau and of the run differ."""
        assert len({c.sha256 for c in report.checkpoints}) == 3
        assert [c.position for c in report.checkpoints] == sorted(
            c.position for c in report.checkpoints
        )

    def test_the_log_must_be_empty(self, sqlite_url: str) -> None:
        """A log that already holds a run is refused."""
        run_subnet_scenario(3, url=sqlite_url, **SMALL)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="needs an empty log"):
            run_subnet_scenario(3, url=sqlite_url, **SMALL)  # type: ignore[arg-type]
