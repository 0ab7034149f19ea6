"""``fleetledger extender``: the extender on its own, with the edge options ``serve`` gives it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetledger.adapters.cli import EXIT_ERROR, EXIT_USAGE, main
from fleetledger.adapters.cli import extender as command
from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.testbeds import TestbedsService
from fleetledger.eventstore import open_store
from tests.adapters.http.test_listener import self_signed

TOKEN = "extender-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TestOptions:
    def test_an_open_extender_beyond_loopback_is_a_usage_error(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.delenv("FLEETLEDGER_EXTENDER_TOKENS", raising=False)

        code = main(["extender", "--url", sqlite_url, "--host", "0.0.0.0"])

        assert code == EXIT_USAGE
        assert "neither extender tokens nor TLS" in capsys.readouterr().err

    def test_a_bad_body_limit_is_a_usage_error(
        self, sqlite_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            main(["extender", "--url", sqlite_url, "--max-body-bytes", "0"])

        assert exited.value.code == EXIT_USAGE
        assert "--max-body-bytes" in capsys.readouterr().err

    def test_a_taken_port_fails_before_the_log_is_opened(
        self, sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        opened: list[Any] = []
        monkeypatch.setattr(command, "open_store", lambda *a, **k: opened.append(a))
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            port = holder.getsockname()[1]

            code = main(["extender", "--url", sqlite_url, "--port", str(port)])

        assert code == EXIT_ERROR
        assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
        assert opened == []


@pytest.fixture
def running(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    log = (tmp_path / "extender.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetledger", "extender", "--url", sqlite_url, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "FLEETLEDGER_EXTENDER_TOKENS": TOKEN},
    )
    try:
        deadline = time.monotonic() + 60
        while not _healthy(port):
            assert process.poll() is None, (tmp_path / "extender.log").read_text()
            assert time.monotonic() < deadline, "the extender did not answer within 60 s"
            time.sleep(0.05)
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()


def _healthy(port: int) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    return False


class TestRunning:
    def test_it_answers_from_the_log_behind_its_token_and_stops_on_sigterm(
        self, sqlite_url: str, running: tuple[subprocess.Popen[bytes], int]
    ) -> None:
        process, port = running
        with contextlib.closing(open_store(sqlite_url)) as store:
            TestbedsService(store, clock=SystemClock()).define_testbed(
                "bed", node_label="bed", slots_per_node=1, cpu_millis=1000, memory_mib=1024
            )
        pod = {
            "metadata": {
                "name": "p",
                "uid": "u",
                "labels": {
                    "batchjob.tuberlin.de/slots-resource-name": "bed",
                    "batchjob.tuberlin.de/slots-ids": "0",
                },
            }
        }
        call = {"Pod": pod, "NodeNames": ["n1"]}
        url = f"http://127.0.0.1:{port}/filter"

        refused = httpx.post(url, json=call)
        answer = httpx.post(url, json=call, headers={"Authorization": f"Bearer {TOKEN}"})

        assert refused.status_code == 401
        assert answer.status_code == 200
        assert "no free slot for pod p" in answer.json()["FailedNodes"]["n1"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


class TestEdgeOptions:
    def test_a_port_out_of_range_exits_2_in_one_line(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            main(["extender", "--port", "99999"])

        assert exited.value.code == EXIT_USAGE
        assert len(capsys.readouterr().err.strip().splitlines()) == 1

    def test_a_certificate_without_its_key_is_a_usage_error(
        self, sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        cert, _ = self_signed(tmp_path)
        code = main(["extender", "--url", sqlite_url, "--tls-cert", str(cert)])

        assert code == EXIT_USAGE
        assert "--tls-cert and --tls-key go together" in capsys.readouterr().err

    def test_over_tls_it_answers_https_beyond_loopback_without_tokens(
        self, sqlite_url: str, tmp_path: Path
    ) -> None:
        """TLS alone lets the extender listen beyond loopback; it answers over HTTPS only."""
        cert, key = self_signed(tmp_path)
        port = free_port()
        log = (tmp_path / "extender.log").open("wb")
        argv = ["extender", "--url", sqlite_url, "--host", "0.0.0.0", "--port", str(port)]
        tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
        process = subprocess.Popen(
            [sys.executable, "-m", "fleetledger", *argv, *tls],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if k != "FLEETLEDGER_EXTENDER_TOKENS"},
        )
        try:
            url = f"https://localhost:{port}/healthz"
            trusted = ssl.create_default_context(cafile=str(cert))
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, (tmp_path / "extender.log").read_text()
                assert time.monotonic() < deadline, "the extender did not answer within 60 s"
                with contextlib.suppress(httpx.HTTPError):
                    answer = httpx.get(url, verify=trusted, timeout=2)
                    break
                time.sleep(0.1)
            assert answer.status_code == 200
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        finally:
            process.kill()
            process.wait(10)
            log.close()
