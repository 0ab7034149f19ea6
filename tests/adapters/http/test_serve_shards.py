"""``serve --nodes-shard I/N`` and ``--ipam-shard I/N``: the options from the flag, the
environment and the file, refused before anything starts when they name no partition; each
shard's own lease; and two processes' capabilities, built as ``serve`` builds them on one
Postgres log, leading nodes/0-of-2 and nodes/1-of-2 (ipam/0-of-2 and ipam/1-of-2) at once, each
taking over only its own nodes (settling only its own subnets) under its shard's term while the
process's main leadership leads nothing."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from fleetledger.adapters.cli import EXIT_USAGE, main, serve
from fleetledger.adapters.cli.main import build_parser
from fleetledger.adapters.cli.serve_capabilities import (
    Capabilities,
    build_capabilities,
    build_lease,
    shard_lease_name,
)
from fleetledger.adapters.cli.serve_shards import (
    LedShard,
    ShardRoles,
    capability_shard,
    check_interval,
    lead_shard,
    shard_spec,
)
from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
from fleetledger.adapters.config import command_arguments, settings_for
from fleetledger.adapters.kubernetes.lease import check_lease_name
from fleetledger.adapters.runtime import LEADER_SHARD_KEY, LEADER_TERM_KEY, Leadership, Shard
from fleetledger.adapters.runtime.self_fencing import LeaseExpired
from fleetledger.adapters.runtime.shards import partition_of
from fleetledger.eventstore import EventStore, open_store
from tests.adapters.ipam.support import answer_fences
from tests.waiting import wait_until

LEASE_SECONDS = 2.0
ZERO, ONE = Shard("nodes", 0, 2), Shard("nodes", 1, 2)
NODES = [f"node-{n:02d}" for n in range(24)]
IPAM_ZERO, IPAM_ONE = Shard("ipam", 0, 2), Shard("ipam", 1, 2)
SUBNETS = {IPAM_ZERO: "pods-a", IPAM_ONE: "pods-b"}
"""A subnet of each partition (partitions are pinned: see the shards' tests)."""


def resolved(argv: list[str], environ: dict[str, str]) -> argparse.Namespace:
    """The arguments ``serve`` runs with, as its handler resolves them."""
    args = build_parser().parse_args(argv)
    return command_arguments(args, settings_for(args, environ), environ=environ)


class TestTheOption:
    @pytest.mark.parametrize("capability", ["nodes", "ipam"])
    def test_the_flag_the_environment_and_the_file_each_set_it(
        self, tmp_path: Path, capability: str
    ) -> None:
        """``--nodes-shard``, ``FLEETLEDGER_NODES_SHARD`` and ``[nodes] shard``, in that order
        of precedence (and the same for ipam); unset, the capability leads all of its own."""
        config = tmp_path / "fleet.toml"
        config.write_text(f'[{capability}]\nshard = "2/4"\n', encoding="utf-8")
        variable = {f"FLEETLEDGER_{capability.upper()}_SHARD": "1/4"}
        option = f"{capability}_shard"

        assert getattr(resolved(["serve"], {}), option) is None
        assert getattr(resolved(["--config", str(config), "serve"], {}), option) == "2/4"
        assert getattr(resolved(["--config", str(config), "serve"], variable), option) == "1/4"
        flagged = ["--config", str(config), "serve", f"--{capability}-shard", "3/4"]
        assert getattr(resolved(flagged, variable), option) == "3/4"

    def test_a_spec_names_a_partition_of_a_capability(self) -> None:
        """The canonical text, and the shard it is; 0/1 is every aggregate, as a shard."""
        assert shard_spec("01/2") == "1/2"
        assert capability_shard("nodes", "1/4") == Shard("nodes", 1, 4)
        assert capability_shard("ipam", "1/4") == Shard("ipam", 1, 4)
        assert capability_shard("nodes", "0/1").owns("any-node")
        with pytest.raises(ValueError, match="--ipam-shard must be PARTITION/COUNT"):
            capability_shard("ipam", "2/2")
        with pytest.raises(ValueError, match="shards of nodes, ipam only, not 'machines'"):
            capability_shard("machines", "0/2")

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ("3/2", "PARTITION below COUNT (0 to 1 of 2), not '3/2'"),
            ("2/2", "PARTITION below COUNT"),
            ("0/0", "COUNT from 1 to"),
            ("x", "must be PARTITION/COUNT, like 0/2"),
            ("1", "must be PARTITION/COUNT"),
            ("-1/2", "must be PARTITION/COUNT"),
            ("1/2/3", "must be PARTITION/COUNT"),
            (" 1/2", "must be PARTITION/COUNT"),
            ("1/99999999", "must be PARTITION/COUNT"),
        ],
    )
    @pytest.mark.parametrize("flag", ["--nodes-shard", "--ipam-shard"])
    def test_a_bad_flag_is_refused_before_anything_starts(
        self,
        *,
        sqlite_url: str,
        flag: str,
        value: str,
        message: str,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A usage error in one line naming the flag; the log is never opened."""
        opened: list[Any] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))

        with pytest.raises(SystemExit) as exited:
            main(["serve", "--url", sqlite_url, f"{flag}={value}"])

        err = capsys.readouterr().err
        assert exited.value.code == EXIT_USAGE
        assert f"argument {flag}:" in err and message in err
        assert len(err.strip().splitlines()) == 1
        assert opened == []

    @pytest.mark.parametrize(
        "case",
        [
            ("nodes", "3/2", None, "variable FLEETLEDGER_NODES_SHARD must be PARTITION/COUNT"),
            ("nodes", None, 'shard = "0/0"', "nodes.shard must be PARTITION/COUNT with a COUNT"),
            ("nodes", None, "shard = 2", "nodes.shard must be text PARTITION/COUNT"),
            ("ipam", "1/0", None, "variable FLEETLEDGER_IPAM_SHARD must be PARTITION/COUNT"),
            ("ipam", None, 'shard = "4/4"', "ipam.shard must be PARTITION/COUNT with a PARTITION"),
        ],
        ids=["variable", "file", "file-number", "ipam-variable", "ipam-file"],
    )
    def test_a_bad_variable_or_file_is_refused_before_anything_starts(
        self,
        sqlite_url: str,
        tmp_path: Path,
        case: tuple[str, str | None, str | None, str],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Refused naming the variable or the file's key, exit 2; the log is never opened."""
        capability, variable, toml, message = case
        opened: list[Any] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))
        for name in ("FLEETLEDGER_NODES_SHARD", "FLEETLEDGER_IPAM_SHARD"):
            monkeypatch.delenv(name, raising=False)
        if variable is not None:
            monkeypatch.setenv(f"FLEETLEDGER_{capability.upper()}_SHARD", variable)
        config = tmp_path / "fleet.toml"
        config.write_text(f"[{capability}]\n{toml or ''}\n", encoding="utf-8")

        code = main(["--config", str(config), "serve", "--url", sqlite_url])

        assert code == EXIT_USAGE
        assert message in capsys.readouterr().err
        assert opened == []


class TestShardLeases:
    def test_each_shard_has_a_database_lease_of_its_own(self, postgres_url: str) -> None:
        """The main lease and both shards' are held at once by different processes' leases;
        a second candidate for a shard already held does not get it."""

        def lease(shard: Shard | None) -> Any:
            return build_lease(
                postgres_url,
                election="database",
                lease_seconds=LEASE_SECONDS,
                holder="h",
                shard=shard,
            )

        held = [lease(None), lease(ZERO), lease(ONE)]
        again = lease(ZERO)
        try:
            assert [candidate.try_acquire() for candidate in held] == [True, True, True]
            assert not again.try_acquire()
        finally:
            for candidate in (*held, again):
                candidate.release()

    def test_a_shards_kubernetes_lease_is_named_after_it(self) -> None:
        """``/`` cannot be in a Lease's name: nodes/3-of-4 beside the Lease ``fleetledger`` is
        ``fleetledger-nodes-3-of-4``, a name the API server takes."""
        name = shard_lease_name("fleetledger", Shard("nodes", 3, 4))

        assert name == "fleetledger-nodes-3-of-4"
        assert check_lease_name(name) == name
        assert shard_lease_name("fleet", Shard("nodes", 3, 8)) == "fleet-nodes-3-of-8"


@dataclass
class Process:
    """One ``serve`` process's leaderships and capabilities, built as ``serve.run`` builds them
    (with no machines runtime: its main leadership is never started, so it never leads)."""

    store: EventStore
    main: Leadership
    led: LedShard
    capabilities: Capabilities

    @property
    def nodes(self) -> Any:
        return self.capabilities.nodes

    @property
    def cluster(self) -> FakeCluster:
        cluster = self.capabilities.cluster
        assert isinstance(cluster, FakeCluster)
        return cluster


def serve_process(url: str, holder: str, shard: Shard) -> Process:
    clock = SystemClock()
    store = open_store(url)

    def lease(of: Shard | None) -> Any:
        return build_lease(
            url, election="database", lease_seconds=LEASE_SECONDS, holder=holder, shard=of
        )

    main_leadership = Leadership(
        store,
        lease(None),
        clock=clock,
        holder=holder,
        check_interval=check_interval(LEASE_SECONDS),
        lease_seconds=LEASE_SECONDS,
    )
    led = lead_shard(
        store, lease(shard), shard, clock=clock, holder=holder, lease_seconds=LEASE_SECONDS
    )
    capabilities = build_capabilities(
        store,
        main_leadership,
        clock,
        None,
        subnets=[(subnet, 1024) for subnet in SUBNETS.values()],
        pools=[],
        cluster="fake",
        nodes_shard=led if shard.capability == "nodes" else None,
        ipam_shard=led if shard.capability == "ipam" else None,
    )
    process = Process(store, main_leadership, led, capabilities)
    for name in NODES:
        process.cluster.add_node(Node(name, cpu_millis=8000, memory_mib=16384))
    return process


@pytest.fixture
def processes(postgres_url: str) -> Iterator[tuple[Process, Process]]:
    """Two processes on one log, a given nodes/0-of-2 and b nodes/1-of-2, their node accounting
    started (each campaigns for its shard in its own thread)."""
    built = [serve_process(postgres_url, "a", ZERO), serve_process(postgres_url, "b", ONE)]
    try:
        for process in built:
            process.nodes.start()
        yield built[0], built[1]
    finally:
        for process in built:
            process.nodes.stop()
            process.store.close()


def duty_shards(store: EventStore) -> dict[str, set[tuple[object, object]]]:
    """Each node's (shard, term) pairs of the duty events on its stream."""
    found: dict[str, set[tuple[object, object]]] = {}
    for record in store.read_all():
        if record.stream_id.startswith("node-") and LEADER_TERM_KEY in record.metadata:
            fence = (record.metadata.get(LEADER_SHARD_KEY), record.metadata[LEADER_TERM_KEY])
            found.setdefault(record.stream_id.removeprefix("node-"), set()).add(fence)
    return found


class TestTwoProcessesLeadTheirShards:
    def test_each_takes_over_only_its_own_nodes(
        self, processes: tuple[Process, Process], postgres_url: str
    ) -> None:
        """Both shards lead at once, in term 1 of their own; every node was taken over by the
        shard of its partition alone, and each process restarted exactly its share."""
        a, b = processes
        wait_until(
            lambda: a.nodes.last_restart is not None and b.nodes.last_restart is not None,
            timeout=30,
            what="both shards to take their nodes over",
        )

        owner = {name: f"nodes/{partition_of(name, 2)}-of-2" for name in NODES}
        assert set(owner.values()) == {"nodes/0-of-2", "nodes/1-of-2"}
        with contextlib.closing(open_store(postgres_url)) as store:
            assert duty_shards(store) == {name: {(owner[name], 1)} for name in NODES}
        for process, shard in ((a, ZERO), (b, ONE)):
            assert process.nodes.leading and process.led.leadership.role == "leader"
            assert process.led.leadership.term() == 1
            assert process.main.role == "follower"
            assert process.nodes.last_restart.nodes_joined == sum(
                1 for name in NODES if shard.owns(name)
            )

    def test_the_nodes_cluster_writes_are_fenced_by_the_shards_lease(
        self, processes: tuple[Process, Process]
    ) -> None:
        """The shard's leader writes to the cluster though the process's main leadership
        follows; once its node accounting stops (the shard's lease released), it may not."""
        a, _ = processes
        wait_until(lambda: a.nodes.leading, timeout=30, what="nodes/0-of-2 to lead")
        assert a.main.term() is None

        a.nodes.cluster.create_pod(PodSpec("written-as-nodes-0", node=NODES[0]))
        a.nodes.stop()

        assert a.led.leadership.role == "follower"
        with pytest.raises(LeaseExpired):
            a.nodes.cluster.create_pod(PodSpec("written-after-stepping-down", node=NODES[0]))
        assert a.cluster.pod("written-as-nodes-0") is not None

    def test_serve_reports_each_shards_role_and_term(
        self, processes: tuple[Process, Process]
    ) -> None:
        """``GET /v1/leadership`` lists the shard beside the main role and term, and the
        metrics give its role and held term."""
        a, _ = processes
        wait_until(lambda: a.nodes.leading, timeout=30, what="nodes/0-of-2 to lead")
        app = FastAPI()
        for router in a.capabilities.routers:
            app.include_router(router)
        registry = CollectorRegistry()
        registry.register(ShardRoles([a.led]))

        with TestClient(app) as client:
            body = client.get("/v1/leadership").json()

        assert body == {
            "holder": "a",
            "role": "follower",
            "term": None,
            "shards": [
                {
                    "name": "nodes/0-of-2",
                    "capability": "nodes",
                    "partition": 0,
                    "count": 2,
                    "role": "leader",
                    "term": 1,
                }
            ],
        }
        labels = {"shard": "nodes/0-of-2"}
        assert registry.get_sample_value("fleetledger_shard_role", {**labels, "role": "leader"})
        assert (
            registry.get_sample_value("fleetledger_shard_role", {**labels, "role": "follower"})
            == 0.0
        )
        assert registry.get_sample_value("fleetledger_shard_held_term", labels) == 1.0


@pytest.fixture
def subnet_processes(postgres_url: str) -> Iterator[tuple[Process, Process]]:
    """Two processes on one log, a given ipam/0-of-2 and b ipam/1-of-2, their subnets' runtimes
    started (each campaigns for its shard in its own thread), and both subnets created."""
    built = [
        serve_process(postgres_url, "a", IPAM_ZERO),
        serve_process(postgres_url, "b", IPAM_ONE),
    ]
    try:
        for process in built:
            process.capabilities.ipam.start()
        for subnet in SUBNETS.values():
            built[0].capabilities.ipam.service.create(subnet, 1024)
        yield built[0], built[1]
    finally:
        for process in built:
            process.capabilities.ipam.stop()
            process.store.close()


class TestTwoProcessesLeadTheirSubnets:
    def test_each_settles_only_its_own_subnets(
        self, subnet_processes: tuple[Process, Process], postgres_url: str
    ) -> None:
        """Nodes join both subnets through one process; each subnet's allocator calls are made
        and recorded by the leader of its partition alone, in its shard's term 1, while both
        processes' main leaderships lead nothing."""
        a, b = subnet_processes
        assert all(shard.owns(subnet) for shard, subnet in SUBNETS.items())
        assert a.capabilities.ipam.shard == IPAM_ZERO and b.capabilities.ipam.shard == IPAM_ONE
        wait_until(
            lambda: a.capabilities.ipam.leading and b.capabilities.ipam.leading,
            timeout=30,
            what="both shards of the subnets to lead",
        )
        for subnet in SUBNETS.values():
            a.capabilities.ipam.service.join(subnet, NODES[:3])

        with contextlib.closing(open_store(postgres_url)) as store:
            wait_until(
                lambda: all(len(answer_fences(store, s)) == 3 for s in SUBNETS.values()),
                timeout=30,
                what="every node's first IPs recorded",
            )
            for shard, subnet in SUBNETS.items():
                assert set(answer_fences(store, subnet)) == {(1, shard.name)}
        assert (a.main.term(), b.main.term()) == (None, None)
        # Each process's allocator was called for its own partition's subnet only.
        for process, mine, theirs in ((a, "pods-a", "pods-b"), (b, "pods-b", "pods-a")):
            allocator = process.capabilities.ipam.allocator
            assert sorted(allocator.held(mine)) == NODES[:3]
            assert allocator.held(theirs) == {}
