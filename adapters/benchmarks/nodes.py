"""``fleetledger bench nodes``: agents' requests per second through ``POST /v1/agent/resources``.

A server process runs node accounting (``NodesRuntime`` with its threads, on the database at
``url``) behind uvicorn on loopback, over a fake cluster of ``nodes`` nodes and ``pods`` VM pods.
This process plays the agents: ``clients`` concurrent connections, each one agent at a time
asking for new amounts for one of its pods, as fast as answers come. Every answer is a decision
appended durably to its node's stream before it is sent, so the figure includes the log: requests
for one node share an append, requests for different nodes share the store's group commit.

The server gets its own process so the agents' HTTP client does not share its interpreter lock;
on a 2-core machine they still share the cores, as a cluster's agents would not. The headline is
requests per second over ``seconds`` after a ``warmup``, with p50/p99 latency as the agents saw it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import random
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.synchronize import Event as ProcessEvent

from sqlalchemy import make_url

from .loopback import LoopbackClient

__all__ = ["TARGET_P99_MS", "TARGET_REQUESTS_PER_SECOND", "bench_nodes"]

TARGET_REQUESTS_PER_SECOND = 2000.0
TARGET_P99_MS = 50.0

# Sized so that every pod at its max still fits under the watermark: the bench measures the
# request path, not migrations (the restart at start holds never-seen pods at their max).
_NODE_CPUS = 96
_NODE_MEMORY_GIB = 256
_POD_CPU = (250, 1000, 4000)
_POD_MEMORY = (1, 4, 8)
_CPU_STEP = 250


def bench_nodes(
    url: str,
    *,
    nodes: int = 100,
    pods: int = 2000,
    clients: int = 64,
    seconds: float = 10.0,
    warmup: float = 2.0,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, object]:
    """Run the bench against the (migrated, preferably empty) database at ``url``."""
    if nodes < 1 or pods < nodes or clients < 1 or seconds <= 0 or warmup < 0:
        raise ValueError(
            "bench nodes needs nodes >= 1, pods >= nodes, clients >= 1, seconds > 0, warmup >= 0"
        )
    say = progress or _stderr
    port = _free_port()
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(
        target=_serve, args=(url, nodes, pods, port, ready), name="bench-nodes-server"
    )
    backend = make_url(url).get_backend_name()
    say(f"starting the server: {nodes} nodes, {pods} pods, on 127.0.0.1:{port}, log on {backend}")
    server.start()
    try:
        _wait_ready(server, ready)
        say(f"server ready; {clients} agents for {warmup:g} s warm-up + {seconds:g} s")
        latencies, codes, elapsed = asyncio.run(
            _agents(port, pods=pods, clients=clients, seconds=seconds, warmup=warmup, seed=seed)
        )
    finally:
        server.terminate()
        server.join(timeout=30.0)
    ok = codes.get(200, 0)
    rate = len(latencies) / elapsed if elapsed > 0 else 0.0
    p50, p99 = _percentile(latencies, 50), _percentile(latencies, 99)
    say(f"{rate:,.0f} requests/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms ({ok} answered 200)")
    return {
        "backend": backend,
        "nodes": nodes,
        "pods": pods,
        "clients": clients,
        "seconds": round(elapsed, 3),
        "requests": len(latencies),
        "status_codes": {str(code): count for code, count in sorted(codes.items())},
        "requests_per_second": round(rate, 1),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "target": {"requests_per_second": TARGET_REQUESTS_PER_SECOND, "p99_ms": TARGET_P99_MS},
        "met": rate >= TARGET_REQUESTS_PER_SECOND and p99 < TARGET_P99_MS,
    }


def _wait_ready(server: multiprocessing.process.BaseProcess, ready: ProcessEvent) -> None:
    deadline = time.monotonic() + 300.0
    while not ready.wait(timeout=0.2):
        if not server.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(
                f"the bench server did not start (exit code {server.exitcode}); its error is "
                "printed above"
            )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _percentile(values: list[float], percent: int) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def _pod_name(index: int) -> str:
    return f"vm-{index:05d}"


# -- the server process --------------------------------------------------------------------------


def _serve(url: str, nodes: int, pods: int, port: int, ready: ProcessEvent) -> None:
    import uvicorn

    from fleetledger.adapters.cluster import FakeCluster, Node, PodSpec
    from fleetledger.adapters.heap import FrozenStartupHeap
    from fleetledger.adapters.http.agents import agents_router
    from fleetledger.adapters.http.lean import LeanApp
    from fleetledger.adapters.logging import configure_logging
    from fleetledger.adapters.nodes import NodesRuntime, vm_annotations
    from fleetledger.domain.nodes import Bounds
    from fleetledger.eventstore import open_store

    # A spawned process starts with structlog's defaults, which print to stdout: the server's
    # logs belong on stderr, beside the progress lines, so that ``--json`` output stays JSON.
    configure_logging()
    fleet = FakeCluster(
        [
            Node(f"node-{n:03d}", cpu_millis=_NODE_CPUS * 1000, memory_mib=_NODE_MEMORY_GIB * 1024)
            for n in range(nodes)
        ]
    )
    annotations = vm_annotations(Bounds(*_POD_CPU), Bounds(*_POD_MEMORY))
    for index in range(pods):
        fleet.create_pod(
            PodSpec(_pod_name(index), node=f"node-{index % nodes:03d}", annotations=annotations)
        )
    store = open_store(url, pool_size=8)
    runtime = NodesRuntime(store, fleet, sync_seconds=30.0).start()
    FrozenStartupHeap().start()
    app = LeanApp()
    app.include_router(agents_router(runtime))
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, backlog=4096
    )
    server = uvicorn.Server(config)
    ready.set()
    try:
        server.run()
    finally:
        runtime.stop()
        store.close()


# -- the agents ----------------------------------------------------------------------------------
# One keep-alive connection each, through the lean loopback client: on two cores, the agents'
# own client costs are taken from the server they measure (httpx's client alone topped out near
# 200 requests/s here, aiohttp's cost a third of the endpoint's own CPU per request).


async def _agents(
    port: int, *, pods: int, clients: int, seconds: float, warmup: float, seed: int
) -> tuple[list[float], Counter[int], float]:
    await _until_listening(port)
    # The agents' own collector pauses would be counted as the server's latency.
    gc.collect()
    gc.freeze()
    latencies: list[float] = []
    codes: Counter[int] = Counter()
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds
    workers = [
        _agent(
            port,
            own=range(c, pods, clients),
            rng=random.Random(seed + c),
            latencies=latencies,
            codes=codes,
            measure_from=measure_from,
            stop_at=stop_at,
        )
        for c in range(min(clients, pods))
    ]
    await asyncio.gather(*workers)
    return latencies, codes, time.perf_counter() - measure_from


async def _until_listening(port: int) -> None:
    for _ in range(600):
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the bench server never answered on loopback")


async def _agent(
    port: int,
    *,
    own: range,
    rng: random.Random,
    latencies: list[float],
    codes: Counter[int],
    measure_from: float,
    stop_at: float,
) -> None:
    pods = list(own)
    low, _, high = _POD_CPU
    async with LoopbackClient("127.0.0.1", port) as client:
        while time.perf_counter() < stop_at:
            body = {
                "pod": _pod_name(rng.choice(pods)),
                "protocol_version": 3,
                "cpu": rng.randrange(low, high + 1, _CPU_STEP) / 1000,
                "memory": rng.randint(_POD_MEMORY[0], _POD_MEMORY[2]),
                "metrics": {"load_average_1min": round(rng.random() * 4, 2)},
            }
            sent = time.perf_counter()
            code, _ = await client.post_json("/v1/agent/resources", body)
            answered = time.perf_counter()
            if sent >= measure_from:
                latencies.append((answered - sent) * 1000)
                codes[code] += 1
