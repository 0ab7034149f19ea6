"""``ops/Dockerfile``: the image installs the AKS extra, exposes the listeners' ports and checks
its own health. No Docker daemon runs here, so the instructions are read and the health check's
command is run as the image would run it; ``tests/test_packaging.py`` runs every command from
the wheel the image installs."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetledger.adapters.cli import main
from fleetledger.adapters.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    joined = (ROOT / "ops" / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def runtime_stage() -> list[tuple[str, str]]:
    """The instructions of the last stage (the image that runs)."""
    found = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(found) if keyword == "FROM")
    return found[last_from:]


def option_default(command: str, flag: str) -> object:
    subcommands = next(a for a in build_parser()._actions if a.dest == "command")
    parser = subcommands.choices[command]  # type: ignore[index]
    return next(a for a in parser._actions if flag in a.option_strings).default


class TestInstall:
    def test_the_build_stage_builds_the_aks_extra(self) -> None:
        runs = [rest for keyword, rest in instructions() if keyword == "RUN"]
        assert any("pip wheel" in run and "'.[aks]'" in run for run in runs)

    def test_the_image_installs_fleetledger_with_the_aks_extra_from_those_wheels(self) -> None:
        """Only the built wheels (``--no-index``), so the image holds what was built."""
        runs = [rest for keyword, rest in runtime_stage() if keyword == "RUN"]
        [install] = [run for run in runs if "pip install" in run]
        assert "'fleetledger[aks]'" in install and "--no-index --find-links /wheels" in install


class TestPorts:
    def test_exposes_the_api_and_the_extender_ports(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The API's default port (``serve``'s, from the configuration's defaults) and the
        extender's (``fleetledger extender --port``)."""
        for variable in [v for v in os.environ if v.startswith("FLEETLEDGER_")]:
            monkeypatch.delenv(variable)
        assert main(["config", "show"]) == 0
        api_port = tomllib.loads(capsys.readouterr().out)["serve"]["port"]
        exposed = {
            int(port)
            for keyword, rest in runtime_stage()
            if keyword == "EXPOSE"
            for port in rest.split()
        }
        assert {api_port, option_default("extender", "--port")} <= exposed


def healthcheck_command() -> list[str]:
    [check] = [rest for keyword, rest in runtime_stage() if keyword == "HEALTHCHECK"]
    options, _, command = check.partition("CMD ")
    assert {"--interval=30s", "--timeout=5s"} <= set(options.split())
    argv = json.loads(command)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    return argv


class _Probe(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[str, type[_Probe]]]:
    handler = type("Probe", (_Probe,), {})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/healthz", handler
    finally:
        server.shutdown()
        server.server_close()


class TestHealthcheck:
    def test_is_python_without_curl(self) -> None:
        """The slim base image has no curl or wget: the check runs the image's Python."""
        argv = healthcheck_command()
        assert argv[:2] == ["python", "-c"] and "/healthz" in argv[2]

    @pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
    def test_passes_only_while_healthz_answers_200(
        self, health_server: tuple[str, type[_Probe]], status: int, healthy: bool
    ) -> None:
        url, handler = health_server
        handler.status = status
        argv = healthcheck_command()
        result = subprocess.run(
            [sys.executable, *argv[1:]],
            env={**os.environ, "FLEETLEDGER_HEALTHCHECK_URL": url},
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert (result.returncode == 0) is healthy

    def test_fails_when_nothing_listens(self) -> None:
        argv = healthcheck_command()
        result = subprocess.run(
            [sys.executable, *argv[1:]],
            env={**os.environ, "FLEETLEDGER_HEALTHCHECK_URL": "http://127.0.0.1:9/healthz"},
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert result.returncode != 0
