"""Batch workload placement: the planner's filters, scoring, ties, overflow packing and rejects."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleetledger.domain.placement import (
    PendingWorker,
    Pool,
    Snapshot,
    Worker,
    WorkloadRequest,
    plan,
)
from fleetledger.domain.template import MachineTemplate

AT = datetime(2025, 1, 1, tzinfo=UTC)
GIB = 1 << 30
TEMPLATE = MachineTemplate(vm_size="Standard_D4s_v5")


def pool(name: str = "cpu", **overrides: object) -> Pool:
    fields: dict[str, object] = {
        "name": name,
        "template": TEMPLATE,
        "worker_cpu_milli": 4000,
        "worker_memory_bytes": 16 * GIB,
    }
    fields.update(overrides)
    return Pool(**fields)  # type: ignore[arg-type]


def worker(name: str, pool_name: str = "cpu", **overrides: object) -> Worker:
    fields: dict[str, object] = {
        "name": name,
        "pool": pool_name,
        "version": 3,
        "free_cpu_milli": 4000,
        "free_memory_bytes": 16 * GIB,
        "free_gpu": 0,
    }
    fields.update(overrides)
    return Worker(**fields)  # type: ignore[arg-type]


def request(rid: str, cpu: int = 1000, memory: int = GIB, **overrides: object) -> WorkloadRequest:
    return WorkloadRequest(id=rid, cpu_milli=cpu, memory_bytes=memory, **overrides)  # type: ignore[arg-type]


class TestFilters:
    @pytest.mark.parametrize(
        ("req", "pools", "workers", "expected"),
        [
            pytest.param(
                request("a"),
                [pool("cpu"), pool("special", requires_selector=True, priority=9)],
                [worker("w-cpu", "cpu"), worker("w-special", "special")],
                "w-cpu",
                id="no selector avoids pools that require one",
            ),
            pytest.param(
                request("a", selector="special"),
                [pool("cpu", priority=9), pool("special", requires_selector=True)],
                [worker("w-cpu", "cpu"), worker("w-special", "special")],
                "w-special",
                id="a selector picks its pool",
            ),
            pytest.param(
                request("a", gpu=1, gpu_types=("a100", "t4")),
                [
                    pool("t4", gpu_type="t4", worker_gpu=4),
                    pool("a100", gpu_type="a100", worker_gpu=4),
                ],
                [worker("w-t4", "t4", free_gpu=4), worker("w-a100", "a100", free_gpu=4)],
                "w-a100",
                id="earlier gpu type preferred",
            ),
            pytest.param(
                request("a", gpu=1, gpu_types=("a100", "t4")),
                [
                    pool("t4", gpu_type="t4", worker_gpu=4),
                    pool("a100", gpu_type="a100", worker_gpu=4),
                ],
                [worker("w-t4", "t4", free_gpu=4), worker("w-a100", "a100", free_gpu=0)],
                "w-t4",
                id="later gpu type when the preferred is full",
            ),
            pytest.param(
                request("a", gpu=1),
                [pool("cpu"), pool("v100", gpu_type="v100", worker_gpu=2)],
                [worker("w-cpu", "cpu", free_gpu=2), worker("w-v100", "v100", free_gpu=2)],
                "w-v100",
                id="gpu request only on a gpu pool",
            ),
            pytest.param(
                request("a"),
                [pool("cpu"), pool("v100", gpu_type="v100", worker_gpu=2, priority=5)],
                [worker("w-cpu", "cpu", free_cpu_milli=1000), worker("w-v100", "v100")],
                "w-cpu",
                id="non-gpu request never on a gpu worker",
            ),
            pytest.param(
                request("a"),
                [pool("spot", preemptible=True, priority=5), pool("cpu")],
                [worker("w-spot", "spot"), worker("w-cpu", "cpu", free_cpu_milli=1000)],
                "w-cpu",
                id="non-preemptible never on a preemptible worker",
            ),
            pytest.param(
                request("a", preemptible=True),
                [pool("spot", preemptible=True, priority=5), pool("cpu")],
                [worker("w-spot", "spot"), worker("w-cpu", "cpu")],
                "w-spot",
                id="preemptible may use preemptible workers",
            ),
            pytest.param(
                request("a"),
                [pool("cpu")],
                [worker("w1", status="draining"), worker("w2", status="disabled"), worker("w3")],
                "w3",
                id="draining and disabled workers excluded",
            ),
            pytest.param(
                request("a"),
                [pool("old", status="draining", priority=9), pool("cpu")],
                [worker("w-old", "old"), worker("w-cpu", "cpu")],
                "w-cpu",
                id="a draining pool is excluded",
            ),
            pytest.param(
                request("a", cpu=2000),
                [pool("cpu")],
                [worker("w1", free_cpu_milli=1000), worker("w2", free_cpu_milli=4000)],
                "w2",
                id="fit on cpu",
            ),
            pytest.param(
                request("a", memory=3 * GIB),
                [pool("cpu")],
                [worker("w1", free_memory_bytes=2 * GIB), worker("w2", free_memory_bytes=8 * GIB)],
                "w2",
                id="fit on memory",
            ),
            pytest.param(
                request("a", memory=GIB + 1),
                [pool("cpu")],
                [worker("w1", free_memory_bytes=GIB), worker("w2", free_memory_bytes=2 * GIB)],
                "w2",
                id="fit to the byte",
            ),
            pytest.param(
                request("a", cpu=1000),
                [pool("cpu")],
                [worker("w1", free_cpu_milli=4000), worker("w2", free_cpu_milli=1500)],
                "w2",
                id="tightest fit wins",
            ),
            pytest.param(
                request("a"),
                [pool("cheap", priority=1), pool("pricey", priority=5)],
                [worker("w-cheap", "cheap"), worker("w-pricey", "pricey")],
                "w-pricey",
                id="pool priority before tightness",
            ),
        ],
    )
    def test_table(
        self, req: WorkloadRequest, pools: list[Pool], workers: list[Worker], expected: str
    ) -> None:
        """Each filter and score of the issue decides where one request lands."""
        result = plan([req], Snapshot(workers=tuple(workers)), pools)
        assert result.placed == {req.id: expected}
        assert result.versions == {expected: 3}


class TestOrder:
    def test_priority_first_then_arrival(self) -> None:
        """Higher priority requests are planned first; equal priorities keep their arrival."""
        reqs = [request("low", 3000), request("high", 3000, priority=5), request("late", 3000)]
        workers = (worker("w1"), worker("w2"))
        result = plan(reqs, Snapshot(workers=workers), [pool()])
        assert set(result.placed) == {"high", "low"}
        assert set(result.waiting) | {w for n in result.provisions for w in n.request_ids} == {
            "late"
        }

    def test_ties_broken_by_request_hash_not_input_order(self) -> None:
        """Among equally tight workers the choice depends on the request id alone."""
        workers = tuple(worker(f"w{i}") for i in range(8))
        reqs = [request(f"r{i}", 4000) for i in range(8)]
        forward = plan(reqs, Snapshot(workers=workers), [pool()])
        backward = plan(reqs, Snapshot(workers=workers[::-1]), [pool()])
        assert forward == backward
        single = {r.id: plan([r], Snapshot(workers=workers), [pool()]).placed for r in reqs}
        assert len({p[r] for r, p in single.items()}) > 1  # equal workers share the load

    def test_joined_worker_takes_its_waiting_requests_first(self) -> None:
        """A requested worker that joined is filled with the workloads it was requested for
        before higher-priority newcomers."""
        pending = PendingWorker(
            name="w-new",
            pool="cpu",
            request_ids=("waited",),
            free_cpu_milli=0,
            free_memory_bytes=0,
            free_gpu=0,
        )
        snapshot = Snapshot(workers=(worker("w-new"),), pending=(pending,))
        reqs = [request("urgent", 4000, priority=9), request("waited", 4000)]
        result = plan(reqs, snapshot, [pool()])
        assert result.placed == {"waited": "w-new"}
        assert "urgent" in {r for n in result.provisions for r in n.request_ids}


class TestOverflow:
    @pytest.mark.parametrize(
        ("sizes", "minimum"),
        [
            pytest.param([3000, 1000] * 30, 30, id="pairs"),
            pytest.param([2000] * 9, 5, id="halves"),
            pytest.param([2500, 1500] * 4 + [1000] * 4, 5, id="three sizes"),
            pytest.param([4000] * 3 + [500] * 8, 4, id="full and small"),
        ],
    )
    def test_new_workers_are_the_minimum(self, sizes: list[int], minimum: int) -> None:
        """Overflow asks for the bin-packing minimum of new workers for known bursts."""
        reqs = [request(f"r{i}", cpu, GIB) for i, cpu in enumerate(sizes)]
        result = plan(reqs, Snapshot(), [pool()])
        assert len(result.provisions) == minimum
        assert sorted(r for n in result.provisions for r in n.request_ids) == sorted(
            r.id for r in reqs
        )
        assert all(n.used_cpu_milli <= 4000 for n in result.provisions)

    def test_capacity_already_requested_is_used_first(self) -> None:
        """Workers requested and not yet joined take overflow before a new one is asked for."""
        pending = PendingWorker(
            name="w-coming",
            pool="cpu",
            request_ids=("old",),
            free_cpu_milli=2000,
            free_memory_bytes=8 * GIB,
            free_gpu=0,
        )
        reqs = [request("a", 1000), request("b", 1000), request("c", 1000)]
        result = plan(reqs, Snapshot(pending=(pending,)), [pool()])
        assert result.waiting == {"a": "w-coming", "b": "w-coming"}
        assert [n.request_ids for n in result.provisions] == [("c",)]

    def test_new_worker_names_are_stable(self) -> None:
        """Planning the same overflow twice names the same machines."""
        reqs = [request(f"r{i}", 3000) for i in range(3)]
        first = plan(reqs, Snapshot(), [pool()])
        again = plan(reqs, Snapshot(), [pool()])
        assert [n.name for n in first.provisions] == [n.name for n in again.provisions]
        assert len({n.name for n in first.provisions}) == 3


class TestRejected:
    def test_too_large_for_every_pool(self) -> None:
        """A request larger than any worker of its pools is rejected at once, saying so."""
        result = plan([request("huge", 64000)], Snapshot(), [pool()])
        assert result.provisions == ()
        assert "more than any worker of its pools can hold" in result.rejected["huge"]

    def test_no_pool_accepts(self) -> None:
        """A gpu request with no gpu pool is rejected naming what it wants."""
        result = plan([request("g", gpu=1, gpu_types=("h100",))], Snapshot(), [pool()])
        assert "no available pool accepts it" in result.rejected["g"]
        assert "h100" in result.rejected["g"]

    @pytest.mark.parametrize(
        ("bad", "words"),
        [
            (request("", 1), "non-empty id"),
            (request("neg", -1), "cpu_milli must be a non-negative integer"),
            (request("types", gpu_types=("t4",)), "asks for no GPU"),
        ],
    )
    def test_malformed(self, bad: WorkloadRequest, words: str) -> None:
        """A malformed request is rejected with what to fix; the rest of the batch goes on."""
        result = plan([bad, request("ok")], Snapshot(workers=(worker("w1"),)), [pool()])
        assert words in result.rejected[bad.id]
        assert result.placed == {"ok": "w1"}

    def test_duplicate_in_batch(self) -> None:
        """An id sent twice in one batch is one workload: placed once, never rejected."""
        reqs = [request("a"), request("a")]
        result = plan(reqs, Snapshot(workers=(worker("w1"),)), [pool()])
        assert result.placed == {"a": "w1"}
        assert result.reservations["w1"] == (reqs[0],)
        assert result.rejected == {}
