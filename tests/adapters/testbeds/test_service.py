"""The service's users' commands and reads: where writes land, the catalog's pages, holders."""

from __future__ import annotations

from typing import cast

import pytest

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.testbeds import (
    Conflict,
    InvalidTestbedCommand,
    NotFound,
    TestbedsService,
)
from fleetledger.eventstore import EventStore, NewEvent
from tests.counting_store import CountingStore

from .support import BED, World, world


def define(service: TestbedsService, name: str, *, slots_per_node: int = 2) -> int:
    written = service.define_testbed(
        name, node_label="testbed", slots_per_node=slots_per_node, cpu_millis=1000, memory_mib=512
    )
    return written.position


class TestWritten:
    def test_a_write_says_where_it_landed(self, store: EventStore) -> None:
        """The position is the log's head right after the append."""
        service = TestbedsService(store, clock=SystemClock())

        written = service.define_job("j1", kind="flink", image="flink:1.18", main_file="/j.jar")

        assert written.appended
        assert written.position == store.head()

    def test_a_repeat_appends_nothing_and_points_at_the_latest_event(
        self, store: EventStore
    ) -> None:
        """Idempotent: the same command again gives the resource's latest position."""
        service = TestbedsService(store, clock=SystemClock())
        first = service.define_job("j1", kind="spark", image="spark:3.5", main_file="/j.py")

        again = service.define_job("j1", kind="spark", image="spark:3.5", main_file="/j.py")

        assert (again.appended, again.position) == (False, first.position)
        assert store.head() == first.position


class TestListed:
    def test_pages_are_in_creation_order(self, store: EventStore) -> None:
        """``after`` the returned position gives the next page; ``None`` after the last."""
        service = TestbedsService(store, clock=SystemClock())
        for name in ("c", "a", "b"):
            define(service, name)

        first, after = service.listed("testbed", limit=2)
        assert after is not None
        rest, end = service.listed("testbed", after=after, limit=2)

        assert (first, rest, end) == (["c", "a"], ["b"], None)

    def test_a_change_keeps_the_place(self, store: EventStore) -> None:
        """Resizing appends an event but does not move the testbed in the listing."""
        service = TestbedsService(store, clock=SystemClock())
        define(service, "a")
        define(service, "b")

        define(service, "a", slots_per_node=4)

        assert service.listed("testbed")[0] == ["a", "b"]

    def test_deleted_are_left_out_and_a_redefinition_comes_last(self, store: EventStore) -> None:
        """A testbed deleted then defined again is listed where it was defined again."""
        service = TestbedsService(store, clock=SystemClock())
        define(service, "a")
        define(service, "b")

        service.delete_testbed("a")
        assert service.listed("testbed")[0] == ["b"]
        defined_again = define(service, "a")

        assert service.listed("testbed")[0] == ["b", "a"]
        assert service.position_of("testbed", "a")[0] == defined_again

    def test_sees_what_another_process_created(self, store: EventStore) -> None:
        """The catalog reads the log: resources written through another service are listed
        and found, with their positions."""
        reader = TestbedsService(store, clock=SystemClock())
        writer = TestbedsService(store, clock=SystemClock())
        position = define(writer, "a")

        assert reader.listed("testbed")[0] == ["a"]
        assert reader.existing_testbed("a").state.defined is not None
        assert reader.position_of("testbed", "a") == (position, position)

    @pytest.mark.parametrize(("after", "limit"), [(-1, 10), (0, 0)])
    def test_bad_paging_is_refused(self, store: EventStore, after: int, limit: int) -> None:
        service = TestbedsService(store, clock=SystemClock())

        with pytest.raises(InvalidTestbedCommand):
            service.listed("job", after=after, limit=limit)


class TestCatalog:
    def test_it_reads_on_from_where_its_last_read_ended(self, store: EventStore) -> None:
        """Not from the last definition: a catalog that rarely changes would otherwise read
        everything appended since on every call."""
        reads = CountingStore(store)
        service = TestbedsService(cast(EventStore, reads), clock=SystemClock())
        define(service, "a")
        store.append("other-1", [NewEvent("Unrelated", {}) for _ in range(3)])
        service.catch_up()
        head = store.head()
        reads.types_reads_after.clear()

        define(service, "b")
        service.catch_up()

        assert reads.types_reads_after[0] == head
        assert service.listed("testbed", limit=10)[0] == ["a", "b"]


class TestExisting:
    def test_an_unknown_name_is_not_found(self, store: EventStore) -> None:
        service = TestbedsService(store, clock=SystemClock())

        with pytest.raises(NotFound, match="no scheduling named nope"):
            service.existing_scheduling("nope")

    def test_a_deleted_job_is_not_found(self, store: EventStore) -> None:
        service = TestbedsService(store, clock=SystemClock())
        service.define_job("j1", kind="spark", image="spark:3.5", main_file="/j.py")

        service.delete_job("j1")

        with pytest.raises(NotFound, match="job j1 was deleted"):
            service.existing_job("j1")


def held(w: World) -> World:
    """Scheduling s1 holds job j1 and the testbed."""
    w.service.create_scheduling("s1", testbed=BED, queue=("j1",))
    w.runtime.process.advance("s1")
    assert w.service.job("j1").state.holder == "s1"
    return w


class TestHolders:
    def test_a_job_held_by_another_scheduling_is_a_conflict(self, store: EventStore) -> None:
        """The holder is named on the error."""
        w = held(world(store))

        with pytest.raises(Conflict, match="job j1 is held by scheduling s1") as caught:
            w.service.check_claimable("s2", "j1")

        assert caught.value.holder == "s1"

    def test_its_own_holder_may_claim_it_again(self, store: EventStore) -> None:
        w = held(world(store))

        w.service.check_claimable("s1", "j1")

    def test_an_unknown_job_is_not_found(self, store: EventStore) -> None:
        w = world(store)

        with pytest.raises(NotFound):
            w.service.check_claimable("s1", "nope")

    def test_deleting_a_held_testbed_names_the_holder(self, store: EventStore) -> None:
        """Refused with a Conflict; nothing appended."""
        w = held(world(store))
        head = store.head()

        with pytest.raises(Conflict) as caught:
            w.service.delete_testbed(BED)

        assert caught.value.holder == "s1"
        assert store.head() == head

    def test_deleting_a_held_job_names_the_holder(self, store: EventStore) -> None:
        w = held(world(store))
        head = store.head()

        with pytest.raises(Conflict) as caught:
            w.service.delete_job("j1")

        assert caught.value.holder == "s1"
        assert store.head() == head
