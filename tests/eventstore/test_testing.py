"""The eventstore.testing pytest plugin, as a user of fleetledger would meet it."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
from fleetledger.eventstore import NO_STREAM, EventStore, NewEvent


def test_postgres_store(postgres_store: EventStore) -> None:
    postgres_store.append("order-1", [NewEvent("Placed", {"n": 1})], expected_version=NO_STREAM)
    [event] = postgres_store.read_all()
    assert (event.stream_id, event.stream_version, event.data) == ("order-1", 1, {"n": 1})


def test_sqlite_store(sqlite_store: EventStore) -> None:
    sqlite_store.append("order-1", [NewEvent("Placed", {"n": 2})])
    assert sqlite_store.head() == 1
    assert sqlite_store.verify().ok


def test_each_test_gets_a_fresh_database(
    postgres_store: EventStore, sqlite_store: EventStore
) -> None:
    assert postgres_store.head() == sqlite_store.head() == 0
"""


class TestPlugin:
    def test_a_users_tests_get_migrated_stores(self, pytester: pytest.Pytester) -> None:
        """A user's test file using postgres_store and sqlite_store passes with no setup: the
        plugin is found through its entry point and hands out fresh, migrated stores."""
        pytester.makepyfile(test_user=USER_TESTS)

        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")

        result.assert_outcomes(passed=3)

    def test_fixtures_are_listed(self, pytester: pytest.Pytester) -> None:
        """pytest --fixtures shows the plugin's documented fixtures."""
        result = pytester.runpytest_subprocess("--fixtures")

        for name in ("postgres_store", "sqlite_store", "postgres_url", "sqlite_url"):
            result.stdout.fnmatch_lines([f"{name}*"])
