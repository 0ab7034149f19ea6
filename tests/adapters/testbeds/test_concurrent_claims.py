"""Two hosts acquiring schedulings that share a job, at once, on Postgres: the log lets exactly
one hold it; the other holds nothing, waits in acquire, and neither blocks."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from fleetledger.adapters.clock import ManualClock
from fleetledger.adapters.testbeds import FakeApplications, TestbedsRuntime
from fleetledger.eventstore import EventStore, open_store

from .support import EPOCH, two_nodes

ROUNDS = 6


@pytest.fixture
def hosts(postgres_url: str) -> Iterator[tuple[TestbedsRuntime, TestbedsRuntime]]:
    """Two runtimes, each with its own connection pool to one Postgres log."""
    stores: list[EventStore] = [open_store(postgres_url), open_store(postgres_url)]
    cluster = two_nodes()
    runtimes = tuple(
        TestbedsRuntime(
            store,
            cluster,
            FakeApplications(cluster),
            clock=ManualClock(EPOCH),
            threads=False,
            actor=f"host-{i}",
        )
        for i, store in enumerate(stores)
    )
    try:
        yield runtimes[0], runtimes[1]
    finally:
        for store in stores:
            store.close()


class TestConcurrentClaims:
    def test_exactly_one_scheduling_holds_the_shared_job(
        self, hosts: tuple[TestbedsRuntime, TestbedsRuntime]
    ) -> None:
        """Round after round, two schedulings sharing a job and a testbed acquire at the same
        moment from two hosts: one holds all of its claims, the other none, and both threads
        return."""
        a, b = hosts
        for r in range(ROUNDS):
            bed, shared = f"bed{r}", f"shared{r}"
            a.service.define_testbed(
                bed, node_label="testbed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
            )
            for job in (shared, f"own-a{r}", f"own-b{r}"):
                a.service.define_job(job, kind="spark", image="i", main_file="f")
            a.service.create_scheduling(f"sa{r}", testbed=bed, queue=(shared, f"own-a{r}"))
            a.service.create_scheduling(f"sb{r}", testbed=bed, queue=(shared, f"own-b{r}"))
            b.service.catch_up()
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def acquire(
                runtime: TestbedsRuntime,
                name: str,
                barrier: threading.Barrier = barrier,
                errors: list[BaseException] = errors,
            ) -> None:
                try:
                    barrier.wait(timeout=10)
                    runtime.process.advance(name)
                except BaseException as e:  # the assertion below reports it
                    errors.append(e)

            threads = [
                threading.Thread(target=acquire, args=(a, f"sa{r}")),
                threading.Thread(target=acquire, args=(b, f"sb{r}")),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)

            assert not any(t.is_alive() for t in threads), "a claim blocked"
            assert errors == []
            states = {
                name: host.service.scheduling(name).state
                for host, name in ((a, f"sa{r}"), (b, f"sb{r}"))
            }
            for host in (a, b):
                host.service.job(shared).load()
                host.service.testbed(bed).load()
            holder = a.service.job(shared).state.holder
            assert holder in states
            loser = next(name for name in states if name != holder)
            assert states[holder].held_jobs == set(states[holder].jobs)
            assert states[holder].holds_testbed
            assert states[loser].phase == "acquire"
            assert not states[loser].held_jobs and not states[loser].holds_testbed
            conflict = states[loser].last_conflict
            assert conflict is not None and f"held by scheduling {holder}" in conflict.reason
            assert a.service.testbed(bed).state.holder == holder
            own_of_loser = f"own-{loser[1]}{r}"
            assert a.service.job(own_of_loser).state.holder is None
