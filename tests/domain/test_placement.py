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
                request("a", gpu=1, gpu_types=("any",)),
                [pool("cpu"), pool("v100", gpu_type="v100", worker_gpu=2)],
                [worker("w-cpu", "cpu", free_gpu=2), worker("w-v100", "v100", free_gpu=2)],
                "w-v100",
                id="gpu type any accepts every gpu pool",
            ),
            pytest.param(
                request("a", gpu=1, gpu_types=("a100", "any")),
                [
                    pool("t4", gpu_type="t4", worker_gpu=4),
                    pool("a100", gpu_type="a100", worker_gpu=4),
                ],
                [worker("w-t4", "t4", free_gpu=4), worker("w-a100", "a100", free_gpu=0)],
                "w-t4",
                id="types before any preferred, then any other",
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


class TestGpuTypeAny:
    def test_any_means_the_same_as_no_list(self) -> None:
        """``["any"]`` is beta9's ``GPU_ANY``: every GPU type is acceptable, exactly as an empty
        list — same placement, same overflow, never a rejection."""
        pools = [
            pool("t4", gpu_type="t4", worker_gpu=2),
            pool("h100", gpu_type="h100", worker_gpu=8),
        ]
        workers = (worker("w-t4", "t4", free_gpu=1), worker("w-h100", "h100", free_gpu=8))
        reqs = [request(f"g{i}", gpu=1, gpu_types=("any",)) for i in range(4)]
        plain = [request(f"g{i}", gpu=1) for i in range(4)]
        with_any = plan(reqs, Snapshot(workers=workers), pools)
        without = plan(plain, Snapshot(workers=workers), pools)
        assert with_any.rejected == {}
        assert with_any.placed == without.placed
        overflow = plan(reqs, Snapshot(), pools)
        assert overflow.rejected == {}
        assert [n.pool for n in overflow.provisions] == [
            n.pool for n in plan(plain, Snapshot(), pools).provisions
        ]

    def test_any_still_needs_a_gpu_count(self) -> None:
        """Listing GPU types (``any`` included) without asking for a GPU is still refused."""
        result = plan([request("g", gpu_types=("any",))], Snapshot(), [pool()])
        assert "asks for no GPU" in result.rejected["g"]


class TestSpread:
    def test_binpack_is_the_default(self) -> None:
        """Without a strategy a pool packs: every small request goes to the tightest worker."""
        assert pool().strategy == "binpack"
        workers = (worker("w1"), worker("w2", free_cpu_milli=3000), worker("w3"))
        reqs = [request(f"r{i}", 250, GIB // 4) for i in range(8)]
        result = plan(reqs, Snapshot(workers=workers), [pool()])
        assert set(result.placed.values()) == {"w2"}

    def test_spread_shares_cpu_work_across_the_workers_that_fit(self) -> None:
        """A ``spread`` pool places CPU-only work on any worker it fits, chosen by a hash of the
        request id (beta9's worker affinity), so equal candidates share the load."""
        workers = (worker("w1"), worker("w2", free_cpu_milli=3000), worker("w3"))
        reqs = [request(f"r{i}", 250, GIB // 4) for i in range(8)]
        result = plan(reqs, Snapshot(workers=workers), [pool(strategy="spread")])
        assert len(set(result.placed.values())) == 3
        again = plan(reqs, Snapshot(workers=workers[::-1]), [pool(strategy="spread")])
        assert again == result

    def test_spread_never_overbooks(self) -> None:
        """Spreading still only picks workers the request fits on."""
        workers = (worker("w1", free_cpu_milli=500), worker("w2", free_cpu_milli=4000))
        reqs = [request(f"r{i}", 1000) for i in range(4)]
        result = plan(reqs, Snapshot(workers=workers), [pool(strategy="spread")])
        assert set(result.placed.values()) == {"w2"}

    def test_gpu_work_is_still_packed(self) -> None:
        """GPU requests go to the tightest GPU worker even in a spread pool (beta9 applies its
        affinity to CPU-only work): GPUs stay together for large requests."""
        pools = [pool("gpu", gpu_type="t4", worker_gpu=4, strategy="spread")]
        workers = (worker("g1", "gpu", free_gpu=4), worker("g2", "gpu", free_gpu=1))
        result = plan([request("r0", 100, gpu=1)], Snapshot(workers=workers), pools)
        assert result.placed == {"r0": "g2"}

    def test_unknown_strategy_refused(self) -> None:
        """A pool's strategy is ``binpack`` or ``spread``; anything else is refused at once."""
        with pytest.raises(ValueError, match="strategy"):
            pool(strategy="random")


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

    def test_exact_where_first_fit_decreasing_is_not(self) -> None:
        """Six requests on 4,000m workers that first-fit decreasing spreads over three workers
        fit on two ({2000, 1200, 800} and {1600, 1600, 800}): the exact search finds the two,
        and says it proved them minimal."""
        sizes = [2000, 1600, 1600, 1200, 800, 800]
        reqs = [request(f"r{i}", cpu, GIB) for i, cpu in enumerate(sizes)]
        result = plan(reqs, Snapshot(), [pool()])
        assert len(result.provisions) == 2
        assert result.optimality_gap == 0
        assert all(n.used_cpu_milli <= 4000 for n in result.provisions)
        assert sorted(r for n in result.provisions for r in n.request_ids) == sorted(
            r.id for r in reqs
        )

    def test_exact_in_every_dimension(self) -> None:
        """Memory and GPUs are packed as exactly as CPU: five requests (GPUs, GiB) that
        first-fit decreasing spreads over three 4-GPU, 16 GiB workers fit on two:
        {(2, 8), (2, 5)} and {(2, 1), (1, 6), (1, 6)}."""
        gpu_pool = pool("gpu", gpu_type="t4", worker_gpu=4, worker_memory_bytes=16 * GIB)
        shapes = [(2, 1), (1, 6), (1, 6), (2, 5), (2, 8)]
        reqs = [request(f"g{i}", 100, m * GIB, gpu=g) for i, (g, m) in enumerate(shapes)]
        exact = plan(reqs, Snapshot(), [gpu_pool])
        heuristic = plan(reqs, Snapshot(), [gpu_pool], search_steps=0)
        assert (len(heuristic.provisions), len(exact.provisions)) == (3, 2)
        assert exact.optimality_gap == 0
        for new in exact.provisions:
            assert new.used_gpu <= 4 and new.used_memory_bytes <= 16 * GIB

    def test_a_workload_shares_a_worker_another_pool_needed(self) -> None:
        """A preemptible workload (spot pool first) shares the regular worker a regular workload
        needs, though it is the larger one: one new worker, not a spot one and a regular one.
        No worker is asked for in a pool none of its workloads prefers."""
        pools = [pool("spot", preemptible=True, priority=2), pool("cpu")]
        reqs = [request("spot-ok", 2500, preemptible=True), request("regular", 1500)]
        heuristic = plan(reqs, Snapshot(), pools, search_steps=0)
        assert sorted(n.pool for n in heuristic.provisions) == ["cpu", "spot"]
        exact = plan(reqs, Snapshot(), pools)
        assert [(n.pool, sorted(n.request_ids)) for n in exact.provisions] == [
            ("cpu", ["regular", "spot-ok"])
        ]
        assert exact.optimality_gap == 0

    def test_out_of_budget_falls_back_and_reports_the_gap(self) -> None:
        """With no search steps to spend the plan is first-fit decreasing's, and the gap says
        how far it may be from the best proven lower bound."""
        sizes = [2000, 1600, 1600, 1200, 800, 800]
        reqs = [request(f"r{i}", cpu, GIB) for i, cpu in enumerate(sizes)]
        result = plan(reqs, Snapshot(), [pool()], search_steps=0)
        assert (len(result.provisions), result.optimality_gap) == (3, 1)

    def test_the_search_is_deterministic(self) -> None:
        """The same overflow gives the same plan, worker names included."""
        sizes = [2000, 1600, 1600, 1200, 800, 800] * 3
        reqs = [request(f"r{i}", cpu, GIB) for i, cpu in enumerate(sizes)]
        first, again = plan(reqs, Snapshot(), [pool()]), plan(reqs, Snapshot(), [pool()])
        assert first == again
        assert len(first.provisions) == 6

    def test_a_bad_step_budget_refused(self) -> None:
        """The search budget is a count of steps, never negative."""
        with pytest.raises(ValueError, match="search_steps"):
            plan([request("a")], Snapshot(), [pool()], search_steps=-1)

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

    def test_a_retired_name_is_never_asked_for_again(self) -> None:
        """The same overflow with its worker's name retired (its machine failed) names another
        worker, the same one every time."""
        reqs = [request("a", 3000)]
        [first] = plan(reqs, Snapshot(), [pool()]).provisions
        retired = Snapshot(retired=frozenset({first.name}))
        [again] = plan(reqs, retired, [pool()]).provisions
        [repeat] = plan(reqs, retired, [pool()]).provisions
        assert again.name != first.name
        assert again.name == repeat.name
        assert again.name.startswith(f"{pool().name}-")


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
