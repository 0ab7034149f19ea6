"""``fleetledger serve``: refuses what it cannot serve (a real cloud without settings, a bad or
taken port) before starting anything; runs the testbeds on the process's leadership and, with
``--extender-port``, the scheduler extender on a listener of its own."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetledger.adapters.cli import EXIT_ERROR, EXIT_TAMPERED, EXIT_USAGE, main, serve
from fleetledger.adapters.cli.main import build_parser
from fleetledger.adapters.cli.serve_capabilities import build_capabilities
from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cluster import FakeCluster, Node
from fleetledger.adapters.runtime.leadership import Leadership, MemoryLease
from fleetledger.eventstore import EventStore
from tests.waiting import wait_until

EXTENDER_TOKEN = "extender-token-0123456789abcdef"

AZURE_VARIABLES = (
    "FLEETLEDGER_AZURE_SUBSCRIPTION_ID",
    "FLEETLEDGER_AZURE_RESOURCE_GROUP",
    "FLEETLEDGER_AZURE_LOCATION",
    "FLEETLEDGER_AZURE_IMAGE_ID",
    "FLEETLEDGER_AZURE_SSH_PUBLIC_KEY",
)


class TestServe:
    def test_an_unconfigured_azure_cloud_is_a_usage_error_naming_the_settings(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The message lists the environment variables to set, and nothing is started."""
        for name in AZURE_VARIABLES:
            monkeypatch.delenv(name, raising=False)

        code = main(["serve", "--cloud", "azure-vm"])

        error = capsys.readouterr().err
        assert code == EXIT_USAGE
        assert all(name in error for name in AZURE_VARIABLES)
        assert "--cloud fake" in error

    def test_an_invalid_grouper_timing_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Configuration is validated before anything opens, with the domain's advice."""
        code = main(["serve", "--idle-timeout", "10", "--max-timeout", "1"])

        assert code == EXIT_USAGE
        assert "idle_timeout" in capsys.readouterr().err


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port another socket is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


class TestPort:
    def test_a_port_out_of_range_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`--port 99999` is refused by the argument parser, not by a traceback later."""
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--port", "99999"])

        assert exit_.value.code == EXIT_USAGE
        assert "outside 0-65535" in capsys.readouterr().err

    def test_a_taken_port_fails_before_the_log_is_opened(
        self,
        sqlite_url: str,
        taken_port: int,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """A port in use exits 1 (never 3, which means tampered) with one line, and the store
        and so the runtime are never started."""
        opened: list[Any] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))

        code = main(["serve", "--url", sqlite_url, "--port", str(taken_port)])

        err = capsys.readouterr().err.strip()
        assert code == EXIT_ERROR and code != EXIT_TAMPERED
        assert f"cannot listen on 127.0.0.1:{taken_port}" in err and len(err.splitlines()) == 1
        assert opened == []

    def test_a_taken_extender_port_fails_before_the_log_is_opened(
        self,
        sqlite_url: str,
        taken_port: int,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The extender's listener is bound with the API's, before anything starts; the API's
        port is let go again."""
        opened: list[Any] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))
        api_port = free_port()

        ports = ["--port", str(api_port), "--extender-port", str(taken_port)]

        code = main(["serve", "--url", sqlite_url, *ports])

        err = capsys.readouterr().err.strip()
        assert code == EXIT_ERROR
        assert f"cannot listen on 127.0.0.1:{taken_port}" in err and "--extender-port" in err
        assert opened == []
        with socket.socket() as again:
            again.bind(("127.0.0.1", api_port))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestRefusedOptions:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (["--extender-host", "127.0.0.1"], "give --extender-port too"),
            (["--extender-token", EXTENDER_TOKEN], "give --extender-port too"),
            (["--port", "8090", "--extender-port", "8090"], "needs a port of its own"),
            (["--extender-port", "8091", "--extender-host", "0.0.0.0"], "neither extender tokens"),
            (["--extender-tls-cert", "c.pem", "--extender-tls-key", "k.pem"], "--extender-port"),
            (
                ["--extender-port", "8091", "--extender-tls-cert", "c.pem"],
                "--extender-tls-cert and --extender-tls-key go together",
            ),
            (["--extender-port", "8091", "--extender-token", "short"], "extender token 1 is 5"),
            (["--testbeds-namespace", "Not_A_Namespace"], "--testbeds-namespace must be"),
            (["--max-concurrent-batches", "0"], "--max-concurrent-batches"),
            (["--write-rate", "-1"], "--write-rate"),
            (["--write-burst", "0"], "--write-burst"),
            (["--ipam-max-ips", "300"], "--ipam-max-ips"),
            (["--ipam-x-ssf", "1.5"], "--ipam-x-ssf"),
            (["--ipam-x-nsf", "0.5"], "--ipam-x-nsf"),
            (["--placement-search-steps", "-1"], "--placement-search-steps"),
            (["--pool", "a=Standard_D4s_v5:4000:16:wide"], "[:binpack|spread]"),
        ],
    )
    def test_bad_options_are_usage_errors(
        self,
        sqlite_url: str,
        options: list[str],
        message: str,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Each is refused with what to do, before any port is bound or the log opened."""
        monkeypatch.delenv("FLEETLEDGER_EXTENDER_TOKENS", raising=False)
        opened: list[Any] = []
        monkeypatch.setattr(serve, "open_store", lambda *a, **k: opened.append(a))

        try:
            code = main(["serve", "--url", sqlite_url, *options])
        except SystemExit as exited:  # refused by the parser itself, in one line
            code = exited.code  # type: ignore[assignment]

        assert code == EXIT_USAGE
        assert message in capsys.readouterr().err
        assert opened == []

    def test_an_extender_port_out_of_range_is_refused_by_the_parser(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exit_:
            main(["serve", "--extender-port", "70000"])

        assert exit_.value.code == EXIT_USAGE
        assert "outside 0-65535" in capsys.readouterr().err


class TestTestbedsOnTheLeader:
    def test_only_the_elected_process_reconciles_ghost_pods(self, sqlite_store: EventStore) -> None:
        """Two processes' capabilities on one log, each with its leadership: ghost pods appear
        in the leader's cluster only, and in the other's once it takes over."""
        board: dict[str, str] = {}
        clock = SystemClock()
        processes = []
        for holder in ("a", "b"):
            leadership = Leadership(
                sqlite_store, MemoryLease(board, holder=holder), clock=clock, holder=holder
            )
            capabilities = build_capabilities(
                sqlite_store, leadership, clock, None, subnets=[], pools=[], cluster="fake"
            )
            cluster = capabilities.cluster
            assert isinstance(cluster, FakeCluster)
            cluster.add_node(Node("n1", labels={"bed": "1"}, cpu_millis=4000, memory_mib=8192))
            capabilities.testbeds.start()
            processes.append((leadership, capabilities))
        (a, first), (b, second) = processes
        try:
            assert a.step() == "leader" and b.step() == "follower"
            first.testbeds.service.define_testbed(
                "bed", node_label="bed", slots_per_node=2, cpu_millis=1000, memory_mib=2048
            )

            wait_until(lambda: len(ghosts(first.cluster)) == 2, timeout=10, what="a's ghosts")
            assert ghosts(second.cluster) == []
            assert not second.testbeds.leading

            board.clear()  # a's lease lapses
            assert a.step() == "follower" and b.step() == "leader"
            wait_until(lambda: len(ghosts(second.cluster)) == 2, timeout=10, what="b's ghosts")
        finally:
            for _, capabilities in processes:
                capabilities.testbeds.stop()


def ghosts(cluster: FakeCluster) -> list[str]:
    return [p.name for p in cluster.list_pods() if "-ghost-" in p.name]


@pytest.fixture
def served(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``python -m fleetledger serve`` with the extender on a port of its own, requiring a
    token; yields the process and both ports once both answer."""
    api_port, extender_port = free_port(), free_port()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "fleetledger", "serve",
            "--url", sqlite_url,
            "--port", str(api_port),
            "--extender-port", str(extender_port),
            "--fake-latency", "0",
            "--grace-seconds", "5",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "FLEETLEDGER_EXTENDER_TOKENS": EXTENDER_TOKEN},
    )  # fmt: skip
    try:
        wait_until(
            lambda: (
                answers(f"http://127.0.0.1:{api_port}/healthz", "role") == "leader"
                and answers(f"http://127.0.0.1:{extender_port}/healthz", "status") == "ok"
            ),
            timeout=60,
            what="both listeners to answer",
        )
        yield process, api_port, extender_port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


def answers(url: str, key: str) -> object:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return httpx.get(url, timeout=2).json().get(key)
    return None


class TestServeWithTheExtender:
    def test_the_extender_answers_from_the_testbeds_served_beside_the_api(
        self, served: tuple[subprocess.Popen[bytes], int, int]
    ) -> None:
        """A testbed defined through the API is what the extender's own listener answers
        about, behind the extender's token; SIGTERM stops both listeners and exits 0."""
        process, api_port, extender_port = served
        defined = httpx.post(
            f"http://127.0.0.1:{api_port}/v1/testbeds",
            json={"name": "bed", "node_label": "bed", "slots_per_node": 2,
                  "slot": {"cpu_millis": 1000, "memory_mib": 2048}},
        )  # fmt: skip
        assert defined.status_code == 201, defined.text
        pod = {
            "metadata": {
                "name": "p",
                "namespace": "jobs",
                "uid": "u",
                "annotations": {"fleetledger.io/testbed": "bed", "fleetledger.io/slot-ids": "0"},
            }
        }
        call = {"Pod": pod, "NodeNames": ["n1"]}
        extender = f"http://127.0.0.1:{extender_port}/filter"

        refused = httpx.post(extender, json=call)
        answer = httpx.post(
            extender, json=call, headers={"Authorization": f"Bearer {EXTENDER_TOKEN}"}
        )

        assert refused.status_code == 401
        assert answer.status_code == 200
        # The fake cluster has no node for the testbed: its slot does not exist yet.
        assert "no free slot for pod p" in answer.json()["FailedNodes"]["n1"]

        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        for port in (api_port, extender_port):
            with socket.socket() as again:
                again.bind(("127.0.0.1", port))


class TestCapabilityOptions:
    def test_ipam_and_placement_settings_reach_their_configuration(self) -> None:
        """The seed's pod-IP factors and node maximum, the placement search budget and a
        pool's strategy are read from the command line into the capabilities' settings."""
        args = build_parser().parse_args(
            [
                "serve",
                *("--ipam-max-ips", "110", "--ipam-x-nsf", "3", "--ipam-x-ssf", "0.8"),
                *("--placement-search-steps", "50"),
                *("--pool", "batch=Standard_D4s_v5:4000:16:spread"),
                *("--pool", "general=Standard_D8s_v5:8000:32"),
            ]
        )

        options = serve._capability_options(args)

        config = options["ipam_config"]
        assert (config.max_ips, config.x_nsf, config.x_ssf) == (110, 3, 0.8)
        assert options["search_steps"] == 50
        assert [(p.name, p.strategy) for p in options["pools"]] == [
            ("batch", "spread"),
            ("general", "binpack"),
        ]
