"""Testbeds end to end: ``fleetledger serve`` on Postgres against a loopback Kubernetes API.

A real ``python -m fleetledger serve --cluster kubernetes`` process reads its cluster from the fake
API server (through a kubeconfig, as a deployment outside the cluster would), keeps ghost pods
there with the official client, and creates the jobs' SparkApplications on it. This test is the
rest of the cluster:

* the **Spark operator**: for every SparkApplication it creates the executor pods the operator
  and Spark would make of it (:func:`~tests.adapters.kubernetes.operators.spark_executor_pods`),
  reports RUNNING once they are all bound and COMPLETED a round later, and — as the garbage
  collector under a foreground deletion — removes a deleted application's pods, then the
  application;
* the **kube-scheduler**: every pending pod naming the ``fleetledger`` scheduler goes to the
  extender's ``/filter`` with kube-scheduler's JSON; when its node has no room left, to
  ``/preempt``, evicting the victims it answers before binding the pod;
* an **external scheduler** client: it creates the testbed, two jobs and a scheduling over HTTP,
  and follows ``/v1/watch`` — dropping the connection mid-run and resuming from the last position
  it saw.

Done when both jobs completed, their applications are gone, and the watch's messages equal the
log's testbed, job and scheduling events, each once, in order.
"""

from __future__ import annotations

import contextlib
import json
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
from websockets.sync.client import ClientConnection, connect

from fleetledger.adapters.extender import wire
from fleetledger.adapters.testbeds import BATCH_JOB, SCHEDULING, TESTBED
from fleetledger.adapters.testbeds.manifests import SPARK_APPLICATION
from fleetledger.eventstore import open_store
from tests.adapters.kubernetes.fake_api import FakeApiServer, fake_api_server, node_object
from tests.adapters.kubernetes.operators import spark_executor_pods
from tests.adapters.kubernetes.test_applications import served
from tests.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TOKEN = "end-to-end-api-token-0123456789"
EXTENDER_TOKEN = "end-to-end-extender-token-0123456789"
SPARK_KEY = f"{SPARK_APPLICATION.plural}.{SPARK_APPLICATION.group}"
SCHEDULER = "fleetledger"
NODES = ("n1", "n2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "loopback", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "loopback"}}],
        "contexts": [{"name": "loopback", "context": {"cluster": "loopback", "user": "test"}}],
        "current-context": "loopback",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture
def cluster() -> Iterator[FakeApiServer]:
    """Two labelled nodes with room for exactly their two 1-CPU/2-GiB slots each."""
    with fake_api_server() as api:
        api.serve(served(SPARK_APPLICATION, "sparkapplication-v1beta2.json"))
        for index, name in enumerate(NODES, start=1):
            node = node_object(name, cpu="2", memory="4Gi", testbed=str(index))
            node["metadata"]["labels"]["kubernetes.io/hostname"] = name
            api.put("nodes", node)
        yield api


class Serve:
    """One ``fleetledger serve`` process with the extender on its own port."""

    def __init__(self, url: str, kubeconfig: Path, log_file: Path) -> None:
        self.api_port, self.extender_port = _free_port(), _free_port()
        self._log = log_file.open("w")
        self.log_file = log_file
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "fleetledger", "serve",
                "--url", url,
                "--port", str(self.api_port),
                "--api-token", TOKEN,
                "--cluster", "kubernetes",
                "--extender-port", str(self.extender_port),
                "--extender-token", EXTENDER_TOKEN,
                "--lease-seconds", "2",
                "--grace-seconds", "5",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )  # fmt: skip
        self.api = httpx.Client(
            base_url=f"http://127.0.0.1:{self.api_port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        self.extender = httpx.Client(
            base_url=f"http://127.0.0.1:{self.extender_port}",
            headers={"Authorization": f"Bearer {EXTENDER_TOKEN}"},
            timeout=10,
        )

    def leading(self) -> bool:
        try:
            return bool(self.api.get("/healthz").json().get("role") == "leader")
        except httpx.HTTPError:
            return False

    def output(self) -> str:
        self._log.flush()
        return self.log_file.read_text()

    def stop(self) -> None:
        self.api.close()
        self.extender.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


@pytest.fixture
def serve(postgres_url: str, cluster: FakeApiServer, tmp_path: Path) -> Iterator[Serve]:
    process = Serve(
        postgres_url, _kubeconfig(tmp_path / "kubeconfig", cluster.url), tmp_path / "serve.log"
    )
    try:
        wait_until(process.leading, timeout=60, what="serve up and leading")
        yield process
    finally:
        process.stop()


class Watcher:
    """The external scheduler's watch: every message kept, reconnecting from the last position."""

    def __init__(self, port: int) -> None:
        self._url = f"ws://127.0.0.1:{port}/v1/watch"
        self.messages: list[dict[str, Any]] = []
        self.connections = 0
        self._socket: ClientConnection | None = None
        self._connections = contextlib.ExitStack()

    def open(self) -> None:
        last = self.messages[-1]["position"] if self.messages else 0
        headers = {"Authorization": f"Bearer {TOKEN}"}
        self._socket = self._connections.enter_context(
            connect(f"{self._url}?from={last}", additional_headers=headers)
        )
        self.connections += 1

    def drain(self, *, timeout: float = 0.05) -> int:
        """Receive what has arrived (waiting at most ``timeout`` for the first message)."""
        assert self._socket is not None
        received = 0
        with contextlib.suppress(TimeoutError):
            while True:
                text = self._socket.recv(timeout=timeout if received == 0 else 0)
                self.messages.append(json.loads(text))
                received += 1
        return received

    def drop(self) -> None:
        """Disconnect abruptly mid-run (what arrives meanwhile must come on the next connection)."""
        assert self._socket is not None
        self._socket.close()
        self._socket = None

    def close(self) -> None:
        self._connections.close()


class World:
    """The cluster's other actors, played one round at a time."""

    def __init__(self, api: FakeApiServer, serve: Serve) -> None:
        self.api = api
        self.serve = serve
        self.filters = 0
        self.preemptions = 0
        self.running: set[str] = set()

    def round(self) -> None:
        self._operator()
        self._scheduler()

    # -- the Spark operator and the garbage collector --------------------------------------------

    def _operator(self) -> None:
        for app in self.api.list_body(SPARK_KEY)["items"]:
            name = app["metadata"]["name"]
            pods = self._pods_of(name)
            if app["metadata"].get("deletionTimestamp"):
                for pod in pods:
                    self.api.delete("pods", pod["metadata"]["name"])
                self.api.remove_finalizer(SPARK_KEY, name, "foregroundDeletion")
                continue
            state = (app.get("status") or {}).get("applicationState", {}).get("state")
            if not pods and state is None:
                for pod in spark_executor_pods(app):
                    pod["metadata"]["namespace"] = "default"
                    pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
                    pod["status"] = {"phase": "Pending"}
                    self.api.put("pods", pod)
                self._status(name, "SUBMITTED")
            elif state == "SUBMITTED" and pods and all(p["spec"].get("nodeName") for p in pods):
                self._status(name, "RUNNING")
            elif state == "RUNNING":
                for pod in pods:
                    self.api.put("pods", {**pod, "status": {"phase": "Succeeded"}})
                self._status(name, "COMPLETED")

    def _status(self, name: str, state: str) -> None:
        self.api.set_status(SPARK_KEY, name, {"applicationState": {"state": state}})

    def _pods_of(self, app: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.api.list_body("pods")["items"]
            if p["metadata"].get("labels", {}).get("sparkoperator.k8s.io/app-name") == app
        ]

    # -- the kube-scheduler ----------------------------------------------------------------------

    def _scheduler(self) -> None:
        for pod in self.api.list_body("pods")["items"]:
            spec = pod["spec"]
            if spec.get("nodeName") or spec.get("schedulerName") != SCHEDULER:
                continue
            if pod["status"].get("phase") != "Pending":
                continue
            self._place(pod)

    def _place(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        extender_pod = wire.ExtenderPod(
            metadata["name"],
            metadata.get("namespace", "default"),
            metadata["uid"],
            metadata.get("annotations", {}),
            metadata.get("labels", {}),
        )
        args = wire.FilterArgs(extender_pod, NODES)
        answer = self.serve.extender.post("/filter", json=wire.encode_filter_args(args))
        assert answer.status_code == 200, answer.text
        self.filters += 1
        result = wire.parse_filter_result(answer.json())
        if not result.node_names:
            return
        node = result.node_names[0]
        if not self._fits(pod, node):
            victims = {n: wire.MetaVictims(tuple(self._ghost_uids(n))) for n in NODES}
            preempt = wire.PreemptArgs(extender_pod, victims)
            answer = self.serve.extender.post("/preempt", json=wire.encode_preempt_args(preempt))
            assert answer.status_code == 200, answer.text
            chosen = wire.parse_preempt_result(answer.json()).victims
            if node not in chosen:
                return
            self.preemptions += 1
            for victim in self.api.list_body("pods")["items"]:
                if victim["metadata"]["uid"] in chosen[node].pod_uids:
                    self.api.delete("pods", victim["metadata"]["name"])
        self.api.put("pods", {**pod, "spec": {**pod["spec"], "nodeName": node}})

    def _on(self, node: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.api.list_body("pods")["items"]
            if p["spec"].get("nodeName") == node
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]

    def _ghost_uids(self, node: str) -> list[str]:
        return [
            p["metadata"]["uid"]
            for p in self._on(node)
            if p["spec"].get("priorityClassName") == "fleetledger-ghost"
        ]

    def _fits(self, pod: dict[str, Any], node: str) -> bool:
        # Every slot is 1 CPU; a node holds two: room is what its bound pods leave.
        return len(self._on(node)) < 2


def _log_positions(url: str) -> list[int]:
    types = [*TESTBED.codec.type_names(), *BATCH_JOB.codec.type_names()]
    types += SCHEDULING.codec.type_names()
    with contextlib.closing(open_store(url)) as store:
        positions: list[int] = []
        while True:
            page = store.read_all(after=positions[-1] if positions else 0, types=types)
            positions += [r.global_position for r in page]
            if not page:
                return positions


def test_a_scheduling_runs_through_serve_the_extender_and_the_operator(
    serve: Serve, cluster: FakeApiServer, postgres_url: str
) -> None:
    api = serve.api
    watcher = Watcher(serve.api_port)
    watcher.open()
    try:
        created = api.post(
            "/v1/testbeds",
            json={
                "name": "bed",
                "node_label": "testbed",
                "slots_per_node": 2,
                "slot": {"cpu_millis": 1000, "memory_mib": 2048},
            },
        )
        assert created.status_code == 201, created.text
        for job in ("j1", "j2"):
            answer = api.post(
                "/v1/jobs",
                json={
                    "name": job,
                    "kind": "spark",
                    "image": "spark:3.5.3",
                    "main_file": "local:///opt/spark/examples/jars/spark-examples.jar",
                    "arguments": ["100"],
                },
            )
            assert answer.status_code == 201, answer.text
        answer = api.post(
            "/v1/schedulings",
            json={"name": "s1", "testbed": "bed", "strategy": "queue", "queue": ["j2", "j1"] * 2},
        )
        assert answer.status_code == 201, answer.text

        world = World(cluster, serve)
        dropped = False

        def done() -> bool:
            world.round()
            watcher.drain()
            nonlocal dropped
            if not dropped and len(watcher.messages) >= 10:
                # Mid-run: whatever is appended while the client is away must come on reconnect.
                watcher.drop()
                world.round()
                watcher.open()
                dropped = True
            jobs = {j: api.get(f"/v1/jobs/{j}").json() for j in ("j1", "j2")}
            phase = api.get("/v1/schedulings/s1").json()["phase"]
            return (
                phase == "finished"
                and all(j["runs"] for j in jobs.values())
                and not cluster.list_body(SPARK_KEY)["items"]
            )

        wait_until(done, timeout=120, what="both jobs completed and their applications deleted")

        jobs = {j: api.get(f"/v1/jobs/{j}").json() for j in ("j1", "j2")}
        assert {j: [r["outcome"] for r in job["runs"]] for j, job in jobs.items()} == {
            "j1": ["completed"],
            "j2": ["completed"],
        }, serve.output()[-3000:]
        assert world.filters >= 4 and world.preemptions >= 4
        # Ghost pods hold the slots again once the jobs are gone.
        wait_until(
            lambda: sum(len(world._ghost_uids(n)) for n in NODES) == 4,
            timeout=30,
            what="the testbed's four ghost pods back",
        )

        # The watch saw every event once, in log order, across the reconnection.
        log = _log_positions(postgres_url)
        wait_until(
            lambda: watcher.drain() >= 0 and len(watcher.messages) >= len(log),
            timeout=30,
            what="the watch catching up with the log",
        )
        seen = [m["position"] for m in watcher.messages]
        assert watcher.connections == 2 and dropped
        assert seen == log[: len(seen)] and len(seen) == len(_log_positions(postgres_url))
    finally:
        watcher.close()
