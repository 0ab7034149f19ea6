"""The informer against a fake API server on loopback, through the real ``kubernetes`` client:
keys by namespace, order by resource version, stalled watches, staleness."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from fleetledger.adapters.cluster import Pod
from fleetledger.adapters.kubernetes import Informer, pod_from
from tests.waiting import wait_until

from .fake_api import FakeApiServer, fake_api_server, pod_object


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        yield server


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pods(api: FakeApiServer, clock: Clock) -> Informer[Pod]:
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    return Informer(
        core.list_pod_for_all_namespaces,
        pod_from,
        kind="Pod",
        watch_seconds=1,
        read_grace_seconds=0.5,
        clock=clock,
    )


def cached(informer: Informer[Pod]) -> list[tuple[str, str, str]]:
    return [(p.namespace, p.name, p.uid) for p in informer.items()]


def uid_of(api: FakeApiServer, name: str, namespace: str = "default") -> str:
    stored = api.get("pods", name, namespace=namespace)
    assert stored is not None
    return str(stored["metadata"]["uid"])


class TestNamespaces:
    def test_one_name_in_two_namespaces_is_two_entries(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """Listed and watched, each namespace's pod of the name is its own entry."""
        api.put("pods", pod_object("p", namespace="a"))
        pods.relist()
        api.put("pods", pod_object("p", namespace="b"))
        pods.watch()
        assert cached(pods) == [
            ("a", "p", uid_of(api, "p", "a")),
            ("b", "p", uid_of(api, "p", "b")),
        ]

    def test_deleting_one_leaves_the_other(self, api: FakeApiServer, pods: Informer[Pod]) -> None:
        """A DELETED in one namespace removes that namespace's entry only."""
        api.put("pods", pod_object("p", namespace="a"))
        api.put("pods", pod_object("p", namespace="b"))
        pods.relist()
        api.delete("pods", "p", namespace="a")
        assert pods.watch() == 1
        assert cached(pods) == [("b", "p", uid_of(api, "p", "b"))]


class TestOrder:
    def test_a_repeated_change_changes_nothing(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """Events the cache already holds, sent again after newer ones, are dropped."""
        api.put("pods", pod_object("p", phase="Pending"))
        pods.relist()
        api.put("pods", pod_object("p", phase="Running"))
        api.put("pods", pod_object("q"))
        assert pods.watch() == 2
        before = pods.items()
        api.resend("pods", 2, 3, 2, 1)
        assert pods.watch() == 0
        assert pods.items() == before
        assert [p.phase for p in before] == ["Running", "Running"]

    def test_a_late_delete_of_an_older_uid_leaves_the_newer_pod(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """A pod deleted and created again under its name: the old pod's ADDED and DELETED,
        replayed late, neither bring it back nor remove the newer one."""
        pods.relist()
        api.put("pods", pod_object("p"))
        old = uid_of(api, "p")
        api.delete("pods", "p")
        api.put("pods", pod_object("p"))
        newer = uid_of(api, "p")
        assert pods.watch() == 3
        api.resend("pods", 2, 1)
        assert pods.watch() == 0
        assert cached(pods) == [("default", "p", newer)]
        assert newer != old

    def test_a_change_older_than_the_list_changes_nothing(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """The list shows the pod at its latest version; its earlier versions replayed after
        the list (a DELETED of its predecessor included) are dropped."""
        api.put("pods", pod_object("p"))
        api.delete("pods", "p")
        api.put("pods", pod_object("p", phase="Pending"))
        pods.relist()
        before = pods.items()
        api.resend("pods", 1, 2, 3)
        assert pods.watch() == 0
        assert pods.items() == before

    def test_a_fresher_read_replaces_the_cached_pod_and_a_staler_does_not(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """observe() applies an object read from the API by its version, as an event."""
        api.put("pods", pod_object("p", phase="Pending"))
        pods.relist()
        stale = api.get("pods", "p")
        api.put("pods", pod_object("p", phase="Running"))
        fresh = api.get("pods", "p")
        assert stale is not None and fresh is not None
        assert pods.observe(fresh)
        assert not pods.observe(stale)
        assert [p.phase for p in pods.items()] == ["Running"]


class TestStalledWatch:
    def test_a_stalled_watch_lists_again_within_the_read_timeout(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """Headers and then silence: the read timeout (server timeout + grace, 1.5 s) fires and
        the cache is listed again, showing what changed meanwhile."""
        pods.relist()
        api.stall_watches("pods")
        api.put("pods", pod_object("during-the-stall"))
        started = time.monotonic()
        pods.watch()
        took = time.monotonic() - started
        assert (pods.stalls, pods.relists) == (1, 2)
        assert 1.5 <= took < 5.0
        assert [p.name for p in pods.items()] == ["during-the-stall"]

    def test_a_running_informer_recovers_from_a_stall(
        self, api: FakeApiServer, pods: Informer[Pod]
    ) -> None:
        """In its watch loop, a stalled informer comes back and keeps watching."""
        pods.relist()
        api.stall_watches("pods")
        thread = threading.Thread(target=pods.run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: pods.stalls == 1, timeout=5, what="the stall to be noticed")
            api.put("pods", pod_object("after"))
            wait_until(
                lambda: [p.name for p in pods.items()] == ["after"],
                timeout=5,
                what="the pod created after the stall",
            )
        finally:
            pods.stop()
            thread.join(5)
        assert not thread.is_alive()


class TestStaleness:
    def test_staleness_counts_from_the_last_word_of_the_server(
        self, api: FakeApiServer, pods: Informer[Pod], clock: Clock
    ) -> None:
        """A list, an event or a watch the server ended resets it; silence grows it."""
        clock.now += 7
        assert pods.staleness_seconds() == 7
        pods.relist()
        assert pods.staleness_seconds() == 0
        clock.now += 30
        assert pods.staleness_seconds() == 30
        pods.watch()
        assert pods.staleness_seconds() == 0

    def test_a_stall_shows_as_staleness_until_the_list(
        self, api: FakeApiServer, pods: Informer[Pod], clock: Clock
    ) -> None:
        """While a watch hangs nothing is heard; the list after the read timeout ends it."""
        pods.relist()
        api.stall_watches("pods")
        clock.now += 100
        observed: list[float] = []
        thread = threading.Thread(target=pods.watch, daemon=True)
        thread.start()
        wait_until(
            lambda: any(r.startswith("GET /api/v1/pods?") and "watch" in r for r in api.requests),
            timeout=5,
            what="the watch to start",
        )
        observed.append(pods.staleness_seconds())
        thread.join(5)
        assert observed == [100]
        assert pods.staleness_seconds() == 0
