"""``fleetledger bench serve``: machine-request POSTs per second through a real ``serve``.

A ``fleetledger serve`` process (fake cloud, no latency) runs on a scratch database of the given
server; ``clients`` concurrent HTTP clients on loopback post single-machine requests as fast as
it answers, each waiting for its answer before sending the next — the way controllers call it.
The figures: acknowledged POSTs per second, latency p50/p99/max, answers other than 202, and
*lost* requests — acknowledged (202) yet absent from the log — which must be 0. Also how many of
the machines were created by the time the last answer came: the server's coordinator creates
them meanwhile on the same cores, so a rate bought by letting it fall behind would show there.
And the server process's CPU time per POST during the timed run (Linux, from ``/proc``): the
rate also depends on how much of the cores the clients and the database take; this figure is the
server's own cost, the one to compare two builds of it by.

The clients share this process's event loop; the server is another process, so both use the
machine's cores as they would in production on one box.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import structlog

from fleetledger.eventstore import open_store

from .scratch import scratch_database

__all__ = [
    "TARGET_POSTS_PER_SECOND",
    "TARGET_P99_MS",
    "ServeBenchReport",
    "drive",
    "process_cpu_seconds",
    "run_serve_bench",
    "serve_process",
]

log = structlog.get_logger("bench.serve")

TARGET_POSTS_PER_SECOND = 2_000
TARGET_P99_MS = 100.0
_TEMPLATE = {"vm_size": "Standard_D4s_v5", "orchestrator_version": "1.31.2"}


@dataclass(frozen=True, slots=True)
class ServeBenchReport:
    backend: str
    clients: int
    requests: int
    seconds: float
    acknowledged: int
    refused: int
    lost: int
    latencies_ms: tuple[float, ...]
    created: int = 0
    """Machines created (``MachineCreated`` in the log) when the last answer came."""
    requested: int = 0
    """Machine requests in the log then, the warm-up's included."""
    server_cpu_seconds: float | None = None
    """The server process's CPU time (user and system) during the timed POSTs, if known."""

    @property
    def posts_per_second(self) -> float:
        return self.acknowledged / self.seconds if self.seconds else 0.0

    @property
    def server_cpu_ms_per_post(self) -> float | None:
        if self.server_cpu_seconds is None or not self.acknowledged:
            return None
        return self.server_cpu_seconds * 1000 / self.acknowledged

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return 0.0
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "clients": self.clients,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "posts_per_second": round(self.posts_per_second, 1),
            "latency_ms": {
                "p50": round(self.percentile(0.50), 2),
                "p99": round(self.percentile(0.99), 2),
                "max": round(max(self.latencies_ms, default=0.0), 2),
            },
            "acknowledged": self.acknowledged,
            "refused": self.refused,
            "lost": self.lost,
            "machines": {"requested": self.requested, "created": self.created},
            "server_cpu_ms_per_post": _rounded(self.server_cpu_ms_per_post),
            "targets": {"posts_per_second": TARGET_POSTS_PER_SECOND, "p99_ms": TARGET_P99_MS},
        }

    def render(self) -> str:
        rate, p99 = self.posts_per_second, self.percentile(0.99)
        slowest = max(self.latencies_ms, default=0.0)
        cpu = self.server_cpu_ms_per_post
        return "\n".join(
            [
                f"bench serve ({self.backend}, {self.clients} clients, {self.requests} "
                "single-machine POSTs)",
                f"  throughput  {rate:,.0f} POSTs/s "
                f"({rate / TARGET_POSTS_PER_SECOND:.2f}x the {TARGET_POSTS_PER_SECOND:,}/s target)",
                f"  latency     p50 {self.percentile(0.5):.1f} ms, p99 {p99:.1f} ms "
                f"(target < {TARGET_P99_MS:.0f} ms), max {slowest:.1f} ms",
                f"  answers     {self.acknowledged} accepted, {self.refused} refused; "
                f"{self.lost} lost (accepted but not in the log; must be 0)",
                f"  machines    {self.created} of the {self.requested} requested (warm-up "
                "included) created by the last answer",
                "  server CPU  "
                + ("unknown (no /proc)" if cpu is None else f"{cpu:.3f} ms per POST")
                + " (the serve process, user + system, during the timed POSTs)",
            ]
        )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_serve_bench(
    url: str | None, *, clients: int = 32, requests: int = 6000, warmup: int = 200
) -> ServeBenchReport:
    """Serve a scratch database of ``url``'s server and drive it; see the module docstring."""
    if clients < 1 or requests < 1 or warmup < 0:
        raise ValueError("clients and requests must be at least 1, warmup at least 0")
    with scratch_database(url) as scratch, serve_process(scratch) as (base_url, pid):
        backend = "sqlite" if scratch.startswith("sqlite") else "postgres"
        asyncio.run(drive(base_url, clients=clients, count=warmup, prefix="warm"))
        log.info("warm-up done; measuring", clients=clients, requests=requests)
        cpu_before = process_cpu_seconds(pid)
        started = time.perf_counter()
        latencies, acknowledged, refused = asyncio.run(
            drive(base_url, clients=clients, count=requests, prefix="bench")
        )
        seconds = time.perf_counter() - started
        cpu_after = process_cpu_seconds(pid)
        with contextlib.closing(open_store(scratch)) as store:
            created = len(store.read_all(after=0, limit=10_000_000, types=["vm.MachineCreated"]))
            logged = {
                str(e.data["request_id"])
                for e in store.read_all(after=0, limit=10_000_000, types=["vm.MachineRequested"])
            }
        lost = len(set(acknowledged) - logged)
    return ServeBenchReport(
        backend=backend,
        clients=clients,
        requests=requests,
        seconds=seconds,
        acknowledged=len(acknowledged),
        refused=refused,
        lost=lost,
        latencies_ms=tuple(latencies),
        created=created,
        requested=len(logged),
        server_cpu_seconds=(
            None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
        ),
    )


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process ``pid`` so far, or ``None`` without ``/proc``.

    The kernel counts it in clock ticks (usually 10 ms), so a span of a few milliseconds
    may read as none at all.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields 14 and 15 (utime, stime), counted after the command name, which may hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(
    base_url: str, *, clients: int, count: int, prefix: str
) -> tuple[list[float], list[str], int]:
    """``count`` single-machine POSTs from ``clients`` concurrent clients, each sending its next
    once answered: the latencies (ms), the request ids accepted, and how many were refused."""
    latencies: list[float] = []
    acknowledged: list[str] = []
    refused = 0
    names = iter(range(count))
    # aiohttp rather than httpx: httpx's async client alone tops out near 200 requests/s here,
    # which would be the figure this bench printed.
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(base_url, connector=connector) as session:

        async def one_client() -> None:
            nonlocal refused
            for n in names:
                request_id = f"{prefix}-{n}"
                body = {
                    "request_id": request_id,
                    "machine_name": f"{prefix}-m-{n}",
                    "template": _TEMPLATE,
                }
                sent = time.perf_counter()
                async with session.post("/v1/machines", json=body) as answer:
                    await answer.read()
                    status = answer.status
                latencies.append((time.perf_counter() - sent) * 1000)
                if status == 202:
                    acknowledged.append(request_id)
                else:
                    refused += 1
                if len(latencies) % 2000 == 0:
                    log.info("progress", prefix=prefix, done=len(latencies), of=count)

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return latencies, acknowledged, refused


@contextlib.contextmanager
def serve_process(url: str, *, fake_latency: float = 0.0) -> Iterator[tuple[str, int]]:
    """A ``fleetledger serve`` on ``url`` with the fake cloud (``fake_latency`` seconds a
    batch), leading: its base URL and process id; stopped with SIGTERM on leaving."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    command = [
        sys.executable, "-m", "fleetledger", "--log-level", "warning", "serve",
        "--url", url, "--port", str(port), "--fake-latency", f"{fake_latency:g}",
        "--idle-timeout", "0.05",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_leading(base_url, process)
        yield base_url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def _wait_until_leading(base_url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            errors = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"fleetledger serve exited with {process.returncode}:\n{errors}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/healthz", timeout=2).json().get("role") == "leader":
                return
        time.sleep(0.1)
    raise RuntimeError("fleetledger serve did not start leading within 60 s")
