"""``fleetledger serve``: the HTTP API with the machines runtime, and beside it the other
capabilities' runtimes, on one lease.

The web server, the cloud adapters and the runtimes are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import structlog

from fleetledger.adapters.cli.audit import add_key_options, read_key
from fleetledger.adapters.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE
from fleetledger.adapters.cli.options import Subcommands, add_url, port_number
from fleetledger.adapters.cli.serve_capabilities import build_capabilities
from fleetledger.eventstore import open_store
from fleetledger.eventstore._engine import resolve_url

__all__ = ["register", "run"]

log = structlog.get_logger("cli")


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("serve", help="run the HTTP API with the machines runtime")
    add_url(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8080)
    parser.add_argument(
        "--cloud",
        choices=["fake", "azure-vm", "aks"],
        default="fake",
        help="fake (default), or a real Azure adapter configured by FLEETLEDGER_AZURE_* env vars",
    )
    parser.add_argument("--grouper", default="default", help="grouper name (one stream per name)")
    parser.add_argument("--idle-timeout", type=float, default=0.5, metavar="SECONDS")
    parser.add_argument("--max-timeout", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--max-batch-size", type=int, default=50)
    parser.add_argument(
        "--fake-latency", type=float, default=2.0, metavar="SECONDS", help="fake cloud's latency"
    )
    parser.add_argument(
        "--fake-cloud-file",
        metavar="PATH",
        help="keep the fake cloud in this file, shared by every controller given the same file "
        "(to try failover between controllers)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a silent leader keeps the lease before another process takes over "
        "(default 10)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long to finish requests and cloud calls in flight (default 30); "
        "a second SIGTERM exits at once",
    )
    parser.add_argument(
        "--api-token",
        action="append",
        metavar="TOKEN",
        help="a bearer token the API accepts; repeat it to accept several (rotation). "
        "Default: FLEETLEDGER_API_TOKENS, comma-separated (preferred: flags show in `ps`)",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without tokens on a non-loopback address (anyone who reaches the port can "
        "create VMs)",
    )
    parser.add_argument(
        "--subnet",
        action="append",
        default=[],
        metavar="ID=CAPACITY",
        help="manage pod IPs of this subnet (repeatable), e.g. --subnet aks-pods=1024",
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB",
        help="a worker pool placement may grow (repeatable), e.g. "
        "--pool general=Standard_D4s_v5:4000:16; workloads need at least one",
    )
    parser.add_argument(
        "--cluster",
        choices=["fake", "kubernetes"],
        default="fake",
        help="where nodes and pods are read from: an empty fake cluster (default), or the "
        "Kubernetes API (in-cluster config, else ~/.kube/config)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=1024 * 1024,
        metavar="BYTES",
        help="larger request bodies get 413 (default 1 MiB)",
    )
    parser.add_argument(
        "--anchor-file",
        type=Path,
        metavar="FILE",
        help="as the leader, keep a signed anchor of the log's head here (replaced atomically), "
        "for `audit verify --anchor`; keep it where the database's writers cannot write",
    )
    parser.add_argument(
        "--anchor-every",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="with --anchor-file: anchor this often (default 300), once elected and at stop",
    )
    add_key_options(parser, ed25519_help="with --anchor-file: sign with this Ed25519 private key")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import uvicorn

    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.http import ApiTokens, create_app
    from fleetledger.adapters.http.auth import check_exposure
    from fleetledger.adapters.http.limits import checked_max_body_bytes
    from fleetledger.adapters.machines import (
        CloudNotConfigured,
        CoordinatorOptions,
        MachinesRuntime,
        build_cloud,
    )
    from fleetledger.adapters.runtime.leadership import Leadership, lease_for
    from fleetledger.domain.errors import InvalidCommand
    from fleetledger.domain.machines import GrouperConfig

    try:
        config = GrouperConfig(
            idle_timeout=timedelta(seconds=args.idle_timeout),
            max_timeout=timedelta(seconds=args.max_timeout),
            max_batch_size=args.max_batch_size,
        )
        clock = SystemClock()
        choice = build_cloud(
            args.cloud,
            clock=clock,
            fake_latency=args.fake_latency,
            fake_state=args.fake_cloud_file,
        )
        lease = lease_for(resolve_url(args.url), lease_seconds=args.lease_seconds)
        tokens = ApiTokens(args.api_token) if args.api_token else ApiTokens.from_env()
        check_exposure(args.host, tokens, allow_open=args.insecure_no_auth)
        max_body_bytes = checked_max_body_bytes(args.max_body_bytes)
        subnets = [_subnet(spec) for spec in args.subnet]
        pools = [_pool(spec) for spec in args.pool]
        anchor_signer = _serve_anchor_signer(args)
    except (CloudNotConfigured, InvalidCommand, ValueError) as e:
        print(f"fleetledger: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        listener = _serve_bind(args.host, args.port)
    except OSError as e:
        choice.close()
        print(
            f"fleetledger: error: cannot listen on {args.host}:{args.port}: {e.strerror or e}; "
            "choose another --port or stop the process using it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        store = open_store(args.url)
    except BaseException:
        listener.close()
        choice.close()
        raise
    try:
        leadership = Leadership(
            store, lease, clock=clock, check_interval=max(0.2, args.lease_seconds / 5)
        )
        runtime = MachinesRuntime(
            store,
            choice.cloud,
            clock=clock,
            config=config,
            grouper_name=args.grouper,
            coordinator_options=CoordinatorOptions(dispatch_mode=choice.dispatch_mode),
            leadership=leadership,
            stop_timeout=args.grace_seconds,
        )
        # Before the other capabilities start anything: an anchor file this key cannot verify
        # stops the command here.
        anchoring = _serve_anchoring(args, anchor_signer, store, leadership, clock)
        log.info(
            "serving machine requests",
            url=f"http://{args.host}:{args.port}",
            cloud=choice.description,
            log=store,
            holder=leadership.holder,
            auth=f"{len(tokens)} bearer token(s)" if tokens else "none (open API)",
        )
        capabilities = build_capabilities(
            store, leadership, clock, runtime, subnets=subnets, pools=pools, cluster=args.cluster
        )
        if anchoring is not None:
            # First among the companions, so stopped last: its stop-time anchor follows the
            # other runtimes' last appends, while this process still leads.
            capabilities.runtimes.insert(0, anchoring)
        server = _GracefulServer(
            uvicorn.Config(
                create_app(
                    runtime,
                    manage_runtime=True,
                    api_tokens=tokens,
                    max_body_bytes=max_body_bytes,
                    routers=capabilities.routers,
                    companions=capabilities.runtimes,
                ),
                host=args.host,
                port=args.port,
                timeout_graceful_shutdown=max(1, int(args.grace_seconds)),
                log_config=None,
            )
        )
        server.run(listener)
    finally:
        listener.close()
        store.close()
        choice.close()
    return 0


def _serve_anchor_signer(args: argparse.Namespace) -> Any:
    """The key ``serve`` signs anchors with, or None without ``--anchor-file``; ValueError
    (AnchorError) for a key that is missing or unusable, before anything starts."""
    from fleetledger.adapters.anchoring import checked_anchor_period
    from fleetledger.eventstore.anchors import Ed25519Signer, hmac_key_from

    if args.anchor_file is None:
        if args.key_file is not None or args.ed25519_key is not None:
            raise ValueError("--key-file and --ed25519-key sign anchors: give --anchor-file too")
        return None
    checked_anchor_period(args.anchor_every)
    if args.ed25519_key is not None:
        return Ed25519Signer(read_key(args.ed25519_key))
    return hmac_key_from(args.key_file)


def _serve_anchoring(
    args: argparse.Namespace, signer: Any, store: Any, leadership: Any, clock: Any
) -> Any:
    """The recorder anchoring the log on the leader, or None without ``--anchor-file``."""
    if signer is None:
        return None
    from fleetledger.adapters.anchoring import AnchorRecorder

    return AnchorRecorder(
        store,
        signer,
        args.anchor_file,
        clock=clock,
        every_seconds=args.anchor_every,
        leadership=leadership,
    )


def _serve_bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a taken port fails the command
    before the runtime takes the lease or touches the cloud."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except BaseException:
        listener.close()
        raise
    return listener


def _subnet(spec: str) -> tuple[str, int]:
    subnet_id, _, capacity = spec.partition("=")
    if not subnet_id or not capacity.isdigit() or int(capacity) < 1:
        raise ValueError(f"--subnet takes ID=CAPACITY with a positive capacity, not {spec!r}")
    return subnet_id, int(capacity)


def _pool(spec: str) -> Any:
    from fleetledger.domain.placement import Pool
    from fleetledger.domain.template import MachineTemplate

    name, _, shape = spec.partition("=")
    parts = shape.split(":")
    if not name or len(parts) != 3 or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(
            f"--pool takes NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB, e.g. "
            f"general=Standard_D4s_v5:4000:16, not {spec!r}"
        )
    return Pool(
        name=name,
        template=MachineTemplate(vm_size=parts[0]),
        worker_cpu_milli=int(parts[1]),
        worker_memory_bytes=int(parts[2]) << 30,
    )


class _GracefulServer:
    """uvicorn's server, where a second SIGTERM or Ctrl-C exits at once.

    The first signal is uvicorn's graceful shutdown: stop accepting, finish the requests in
    flight, then the app's shutdown stops the runtime (seal, finish cloud calls within the grace
    period, answer waiting callers, release the lease). An operator who sends another signal
    wants out now; the log keeps everything acknowledged, and the next leader resumes it.
    """

    def __init__(self, config: Any) -> None:
        import uvicorn

        outer = self

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                if self.should_exit:
                    outer.exit_now(sig)
                super().handle_exit(sig, frame)

        self._server = Server(config)

    def exit_now(self, sig: int) -> None:
        log.warning("second signal: exiting at once; the next leader resumes the work", signal=sig)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def run(self, listener: socket.socket) -> None:
        # uvicorn re-raises the signal it stopped on once it has shut down, to end the process
        # the default way; a SIGTERM that was handled gracefully is a clean exit (status 0).
        previous = signal.signal(signal.SIGTERM, lambda *_: None)
        try:
            self._server.run(sockets=[listener])
        finally:
            signal.signal(signal.SIGTERM, previous)
