"""Shards: names, the partition of an aggregate, and each shard's own lease."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fleetledger.adapters.runtime import shards
from fleetledger.adapters.runtime.leadership import LEADER_LOCK_KEY, FileLease, lease_for
from fleetledger.adapters.runtime.shards import (
    MAX_SHARD_NAME_LENGTH,
    Shard,
    partition_of,
    shard_lock_key,
    shard_name,
)

MIGRATION_LOCK_KEY = 4_242_000


def test_the_surface_is_what_it_says() -> None:
    """The module exports its names and nothing else: the surface changes only on purpose."""
    assert shards.__all__ == [
        "MAX_SHARD_NAME_LENGTH",
        "Shard",
        "check_runtime_shard",
        "partition_of",
        "shard_lock_key",
        "shard_name",
    ]


class TestPartition:
    def test_the_hash_is_pinned(self) -> None:
        """Partitions are a stored contract (every process must agree on every node's): these
        values never change."""
        assert [partition_of(f"node-{n}", 4) for n in range(8)] == [0, 2, 0, 1, 2, 1, 2, 0]
        assert partition_of("aks-pool1-38151915-vmss00000a", 16) == 1

    def test_every_python_run_agrees(self) -> None:
        """Another interpreter, with a different string-hash seed, gives the same partitions
        (``hash()`` would not)."""
        names = [f"node-{n}" for n in range(50)]
        script = (
            "from fleetledger.adapters.runtime.shards import partition_of\n"
            f"print([partition_of(n, 7) for n in {names!r}])"
        )
        found = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": "12345"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert found.stdout.strip() == str([partition_of(n, 7) for n in names])

    def test_names_spread_evenly(self) -> None:
        """10,000 node names into 4 partitions: each gets within 10 % of a quarter."""
        counts = Counter(partition_of(f"aks-nodepool1-{n:08d}-vmss", 4) for n in range(10_000))
        assert sorted(counts) == [0, 1, 2, 3]
        assert all(2250 <= count <= 2750 for count in counts.values()), counts

    def test_one_partition_owns_everything(self) -> None:
        """A count of 1 puts every name in partition 0."""
        assert {partition_of(f"n{n}", 1) for n in range(100)} == {0}

    @pytest.mark.parametrize("count", [0, -2, True, 2.0])
    def test_a_count_below_one_is_refused(self, count: object) -> None:
        """A partition count is a whole number of at least 1."""
        with pytest.raises(ValueError, match="partition count"):
            partition_of("n1", count)  # type: ignore[arg-type]


class TestShard:
    def test_its_name_is_capability_partition_and_count(self) -> None:
        """Shard("nodes", 3, 4) is nodes/3-of-4: partitions of different counts overlap, so
        they are never one shard."""
        assert Shard("nodes", 3, 4).name == "nodes/3-of-4"
        assert Shard("nodes", 0, 2).name != Shard("nodes", 0, 4).name

    def test_each_name_is_owned_by_exactly_one_partition(self) -> None:
        """The shards of a count split the names between them, with nothing left over."""
        shards_of_three = [Shard("nodes", p, 3) for p in range(3)]
        for n in range(300):
            name = f"node-{n}"
            owners = [s.partition for s in shards_of_three if s.owns(name)]
            assert owners == [partition_of(name, 3)]

    @pytest.mark.parametrize(
        ("capability", "partition", "count", "problem"),
        [
            ("nodes", 2, 2, "from 0 to 1"),
            ("nodes", -1, 2, "from 0 to 1"),
            ("nodes", True, 2, "from 0 to 1"),
            ("nodes", 0, 0, "partition count"),
            ("", 0, 1, "capability"),
            ("nodes/a", 0, 1, "no '/'"),
            ("nodes a", 0, 1, "capability"),
            ("n" * MAX_SHARD_NAME_LENGTH, 0, 1, "at most 200"),
        ],
    )
    def test_a_bad_shard_says_what_to_fix(
        self, capability: str, partition: int, count: int, problem: str
    ) -> None:
        """A partition out of range, a count below one, a capability that is not a plain
        name, a name over 200 characters: refused at construction, saying which."""
        with pytest.raises(ValueError, match=problem):
            Shard(capability, partition, count)


class TestShardName:
    def test_a_shard_or_a_valid_name_is_its_name(self) -> None:
        """A Shard gives its name; a str naming one shard (one grouper) passes as it is."""
        assert shard_name(Shard("nodes", 0, 2)) == "nodes/0-of-2"
        assert shard_name("machines/grouper-a.1_b") == "machines/grouper-a.1_b"
        assert shard_name("s" * MAX_SHARD_NAME_LENGTH) == "s" * MAX_SHARD_NAME_LENGTH

    @pytest.mark.parametrize("name", ["", "nodes 1", "nodes/é", "a\nb", "s" * 201, 3])
    def test_what_the_store_would_refuse_is_refused_here(self, name: object) -> None:
        """Empty, a character outside A-Z a-z 0-9 . _ / -, over 200 characters, not a str."""
        with pytest.raises(ValueError, match="shard name"):
            shard_name(name)  # type: ignore[arg-type]


class TestLease:
    def test_each_shard_has_its_own_negative_key(self) -> None:
        """Lock keys are distinct across shards and never a fixed key of fleetledger's."""
        keys = {shard_lock_key(Shard("nodes", p, 1000)) for p in range(1000)}
        assert len(keys) == 1000
        assert all(-(2**63) <= key < 0 for key in keys)
        assert not keys & {LEADER_LOCK_KEY, MIGRATION_LOCK_KEY}

    def test_the_key_is_pinned(self) -> None:
        """The key is a stored contract too: every process must lock the same one."""
        assert shard_lock_key("nodes/0") == -2380517759847297847

    def test_sqlite_gets_a_lock_file_per_shard(self, tmp_path: Path) -> None:
        """Each shard's lease is a file beside the database: two shards are held at once, one
        shard by one holder at a time, and neither touches the single leader's file."""
        url = f"sqlite:///{tmp_path / 'x.db'}"
        first = lease_for(url, shard=Shard("nodes", 0, 2))
        second = lease_for(url, shard="nodes/1-of-2")
        rival = lease_for(url, shard="nodes/0-of-2")
        single = lease_for(url)
        assert isinstance(first, FileLease)
        try:
            assert first.try_acquire() and second.try_acquire() and single.try_acquire()
            assert not rival.try_acquire()
            assert (tmp_path / "x.db.leader.nodes+0-of-2").exists()
        finally:
            for lease in (first, second, rival, single):
                lease.release()

    def test_a_bad_shard_name_is_refused(self, tmp_path: Path) -> None:
        """lease_for checks the shard's name before choosing a lease."""
        with pytest.raises(ValueError, match="shard name"):
            lease_for(f"sqlite:///{tmp_path / 'x.db'}", shard="nodes 0")
