"""``fleetledger serve``: the HTTP API with the machines runtime, and beside it the other
capabilities' runtimes, on one lease; with ``--extender-port``, the kube-scheduler extender on a
listener of its own in the same process; with ``--nodes-shard I/N`` (``--ipam-shard I/N``),
node accounting (the subnets' allocator calls) leading only partition I of N of the nodes (the
subnets) on a lease of its own (:mod:`.serve_shards`).

Both listeners are bound before anything else starts (a taken port fails the command at once) and
served by one event loop; the first SIGTERM stops both gracefully, a second exits at once.

The web server, the cloud adapters and the runtimes are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from fleetledger.adapters.cli.audit import add_key_options, read_key
from fleetledger.adapters.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    require_database,
)
from fleetledger.adapters.cli.options import (
    Subcommands,
    add_max_body_bytes,
    add_url,
    count,
    finite_float,
    name,
    port_number,
    seconds,
)
from fleetledger.adapters.cli.serve_capabilities import (
    LEADER_ELECTIONS,
    build_capabilities,
    build_lease,
    fenced_cloud,
)
from fleetledger.adapters.cli.serve_shards import (
    SHARD_FORMAT,
    SHARDED_CAPABILITIES,
    capability_shard,
    check_interval,
    lead_shard,
    shard_spec,
)
from fleetledger.eventstore import EventStore, open_store
from fleetledger.eventstore._engine import resolve_url

__all__ = ["ExtenderListener", "GracefulServers", "bind_listener", "register", "run"]

log = structlog.get_logger("cli")


def register(commands: Subcommands) -> None:
    parser = commands.add_parser("serve", help="run the HTTP API with the machines runtime")
    add_url(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address the API listens on")
    parser.add_argument("--port", type=port_number, default=8080, help="the API's port")
    parser.add_argument(
        "--cloud",
        choices=["fake", "azure-vm", "aks"],
        default="fake",
        help="fake (default), or a real Azure adapter configured by FLEETLEDGER_AZURE_* env vars",
    )
    parser.add_argument(
        "--grouper", type=name, default="default", help="grouper name (one stream per name)"
    )
    parser.add_argument(
        "--idle-timeout",
        type=seconds(at_most=3600),
        default=0.5,
        metavar="SECONDS",
        help="seal a VM batch after this long without a new request",
    )
    parser.add_argument(
        "--max-timeout",
        type=seconds(at_most=3600),
        default=5.0,
        metavar="SECONDS",
        help="seal a VM batch this long after its first request",
    )
    parser.add_argument(
        "--max-batch-size", type=count(), default=50, help="seal a VM batch at this many requests"
    )
    parser.add_argument(
        "--max-concurrent-batches",
        type=count(),
        metavar="BATCHES",
        help="batches executed at once, at most (default: $FLEETLEDGER_MAX_CONCURRENT_BATCHES, "
        "else 1200: the cloud's write budget, not this ceiling, paces them)",
    )
    parser.add_argument(
        "--write-rate",
        type=finite_float(minimum=0, maximum=1_000_000, minimum_excluded=True),
        metavar="WRITES_PER_SECOND",
        help="refill rate of the cloud write budget (default: $FLEETLEDGER_WRITE_RATE, else the "
        "cloud's documented one: 10/s for aks, 500/min for azure-vm, none for fake)",
    )
    parser.add_argument(
        "--write-burst",
        type=count(),
        metavar="WRITES",
        help="writes the budget allows at once (default: $FLEETLEDGER_WRITE_BURST, else 200, "
        "ARM's per-subscription write bucket)",
    )
    parser.add_argument(
        "--fake-latency",
        type=seconds(at_least=0, at_most=3600),
        default=2.0,
        metavar="SECONDS",
        help="fake cloud's latency",
    )
    parser.add_argument(
        "--fake-cloud-file",
        metavar="PATH",
        help="keep the fake cloud in this file, shared by every controller given the same file "
        "(to try failover between controllers)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=seconds(at_least=1, at_most=3600),
        default=10.0,
        metavar="SECONDS",
        help="how long a silent leader keeps the lease before another process takes over "
        "(default 10); a leader that could not renew it stops calling the cloud and the "
        "cluster a quarter of it earlier",
    )
    parser.add_argument(
        "--leader-election",
        choices=LEADER_ELECTIONS,
        default="database",
        help="where the leader lease is held: the database (default: an advisory lock on "
        "Postgres, a lock file beside SQLite), or a Kubernetes Lease (coordination.k8s.io/v1)",
    )
    parser.add_argument(
        "--lease-name",
        metavar="NAME",
        help="with --leader-election kubernetes: the Lease's name (default fleetledger)",
    )
    parser.add_argument(
        "--lease-namespace",
        metavar="NAMESPACE",
        help="with --leader-election kubernetes: the Lease's namespace (default: the pod's "
        "own, else default)",
    )
    parser.add_argument(
        "--nodes-shard",
        type=shard_spec,
        metavar=SHARD_FORMAT,
        help="node accounting leads only this partition of the nodes (e.g. 1/4), on a lease, "
        "term and fence of its own, while the other capabilities keep the process's; run each "
        "partition on two processes or more for failover (default: every node, on the "
        "process's lease)",
    )
    parser.add_argument(
        "--ipam-shard",
        type=shard_spec,
        metavar=SHARD_FORMAT,
        help="the subnets' allocator calls are led only for this partition of the subnets "
        "(e.g. 1/4), on a lease, term and fence of their own, as --nodes-shard (default: every "
        "subnet, on the process's lease)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=seconds(at_least=0, at_most=3600),
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
        type=name,
        metavar="ID=CAPACITY",
        help="manage pod IPs of this subnet (repeatable), e.g. --subnet aks-pods=1024",
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        type=name,
        metavar="NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB[:STRATEGY]",
        help="a worker pool placement may grow (repeatable), e.g. "
        "--pool general=Standard_D4s_v5:4000:16; workloads need at least one. STRATEGY: binpack "
        "(default: the fullest node that fits) or spread (the emptiest)",
    )
    parser.add_argument(
        "--placement-search-steps",
        type=count(minimum=0, maximum=1_000_000_000),
        metavar="STEPS",
        help="each placement plan's budget for packing overflow on the fewest new workers "
        "exactly (default 1000; 0: first-fit only; the plan reports its optimality gap)",
    )
    parser.add_argument(
        "--ipam-max-ips",
        type=count(maximum=250),
        metavar="IPS",
        help="the most pod IPs a node takes, 1-250 (default 250; a node joined with its own "
        "max pods uses the smaller)",
    )
    parser.add_argument(
        "--ipam-x-nsf",
        type=finite_float(minimum=1, maximum=1000),
        metavar="FACTOR",
        help="node safety factor of the pod-IP batch, >= 1 (seed 03's X_nsf)",
    )
    parser.add_argument(
        "--ipam-x-ssf",
        type=finite_float(minimum=0, maximum=1, minimum_excluded=True),
        metavar="FACTOR",
        help="subnet safety factor of the pod-IP batch, in (0, 1] (seed 03's X_ssf)",
    )
    parser.add_argument(
        "--cluster",
        choices=["fake", "kubernetes"],
        default="fake",
        help="where nodes and pods are read from: an empty fake cluster (default), or the "
        "Kubernetes API (in-cluster config, else ~/.kube/config)",
    )
    add_max_body_bytes(parser)
    parser.add_argument(
        "--anchor-file",
        type=Path,
        metavar="FILE",
        help="as the leader, keep a signed anchor of the log's head here (replaced atomically), "
        "for `audit verify --anchor`; keep it where the database's writers cannot write",
    )
    parser.add_argument(
        "--anchor-every",
        type=seconds(at_most=365 * 24 * 3600),
        default=300.0,
        metavar="SECONDS",
        help="with --anchor-file: anchor this often (default 300), once elected and at stop",
    )
    add_key_options(parser, ed25519_help="with --anchor-file: sign with this Ed25519 private key")
    parser.add_argument(
        "--testbeds-namespace",
        default="default",
        metavar="NAMESPACE",
        help="where the testbeds' jobs run their applications (default: default)",
    )
    parser.add_argument(
        "--extender-port",
        type=port_number,
        metavar="PORT",
        help="also serve the kube-scheduler extender (POST /filter, /preempt) on this port, "
        "on a listener of its own (default: no extender)",
    )
    parser.add_argument(
        "--extender-host",
        metavar="HOST",
        help="with --extender-port: the extender's address (default 127.0.0.1, beside the "
        "scheduler); elsewhere it needs extender tokens or --insecure-no-auth",
    )
    parser.add_argument(
        "--extender-token",
        action="append",
        metavar="TOKEN",
        help="with --extender-port: a bearer token the extender accepts (repeatable); not the "
        "API's. Default: FLEETLEDGER_EXTENDER_TOKENS, comma-separated. The kube-scheduler sends "
        "none: use them behind a proxy that adds one",
    )
    parser.add_argument(
        "--extender-tls-cert",
        metavar="FILE",
        help="with --extender-port: serve the extender over TLS with this PEM certificate "
        "(chain); with --extender-tls-key",
    )
    parser.add_argument(
        "--extender-tls-key", metavar="FILE", help="the PEM private key of --extender-tls-cert"
    )
    from fleetledger.adapters.config import defer_defaults

    # The configuration model holds the defaults: a flag left out must not mask the
    # environment or the --config file (adapters/config/arguments.py).
    defer_defaults(parser, "serve")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.http import ApiTokens, create_app
    from fleetledger.adapters.http.auth import check_exposure
    from fleetledger.adapters.http.limits import checked_max_body_bytes
    from fleetledger.adapters.machines import (
        CloudNotConfigured,
        MachinesRuntime,
        build_cloud,
    )
    from fleetledger.adapters.runtime.leadership import default_holder
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
            environ=args.environ,
        )
        coordinator_options = choice.coordinator_options(
            write_rate=args.write_rate,
            write_burst=args.write_burst,
            max_concurrent_batches=args.max_concurrent_batches,
        )
        holder = default_holder()
        lease, shard_leases = _leases(args, holder)
        tokens = ApiTokens(args.api_token) if args.api_token else ApiTokens.from_env()
        check_exposure(args.host, tokens, allow_open=args.insecure_no_auth)
        max_body_bytes = checked_max_body_bytes(args.max_body_bytes)
        extender = _extender_settings(args)
        namespace = _namespace(args.testbeds_namespace)
        capability_options = _capability_options(args)
        anchor_signer = _serve_anchor_signer(args)
    except (CloudNotConfigured, InvalidCommand, ValueError) as e:
        print(f"fleetledger: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    binding = _bind_all(
        [(args.host, args.port, "--port")]
        + ([] if extender is None else [(extender.host, extender.port, "--extender-port")])
    )
    if isinstance(binding, str):
        choice.close()
        print(f"fleetledger: error: {binding}", file=sys.stderr)
        return EXIT_ERROR
    try:
        store = _open_existing_store(args.url)
    except BaseException:
        for listener in binding:
            listener.close()
        choice.close()
        raise
    try:
        leadership, led_shards = _leaderships(
            store, lease, shard_leases, clock=clock, holder=holder, lease_seconds=args.lease_seconds
        )
        runtime = MachinesRuntime(
            store,
            fenced_cloud(choice.cloud, leadership),
            clock=clock,
            config=config,
            grouper_name=args.grouper,
            coordinator_options=coordinator_options,
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
            shards=[led.shard.name for led in led_shards.values()] or "none",
            auth=f"{len(tokens)} bearer token(s)" if tokens else "none (open API)",
        )
        capabilities = build_capabilities(
            store,
            leadership,
            clock,
            runtime,
            cluster=args.cluster,
            testbeds_namespace=namespace,
            nodes_shard=led_shards.get("nodes"),
            ipam_shard=led_shards.get("ipam"),
            **capability_options,
        )
        if anchoring is not None:
            # First among the companions, so stopped last: its stop-time anchor follows the
            # other runtimes' last appends, while this process still leads.
            capabilities.runtimes.insert(0, anchoring)
        configs = _server_configs(
            args,
            create_app(
                runtime,
                manage_runtime=True,
                api_tokens=tokens,
                max_body_bytes=max_body_bytes,
                routers=capabilities.routers,
                companions=capabilities.runtimes,
                readiness_checks=capabilities.readiness_checks,
                metrics=capabilities.metrics,
            ),
            extender,
            capabilities.testbeds.service,
            binding,
            max_body_bytes=max_body_bytes,
            metrics=capabilities.metrics,
        )
        GracefulServers(configs).run(binding)
    finally:
        for listener in binding:
            listener.close()
        store.close()
        choice.close()
    return 0


def _leases(args: argparse.Namespace, holder: str) -> tuple[Any, dict[str, tuple[Any, Any]]]:
    """The process's lease and, for each ``--<capability>-shard`` given, the shard it names
    with the shard's own lease; ``ValueError`` saying what to fix (see ``build_lease``)."""
    lease_of = functools.partial(
        build_lease,
        resolve_url(args.url),
        election=args.leader_election,
        lease_seconds=args.lease_seconds,
        holder=holder,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
    )
    lease = lease_of()
    shards = {}
    for capability in SHARDED_CAPABILITIES:
        spec = getattr(args, f"{capability}_shard")
        if spec is not None:
            shard = capability_shard(capability, spec)
            shards[capability] = (shard, lease_of(shard=shard))
    return lease, shards


def _leaderships(
    store: EventStore,
    lease: Any,
    shard_leases: dict[str, tuple[Any, Any]],
    *,
    clock: Any,
    holder: str,
    lease_seconds: float,
) -> tuple[Any, dict[str, Any]]:
    """The process's leadership on ``lease`` and, by capability, each shard's leadership on its
    own lease (a ``LedShard``)."""
    from fleetledger.adapters.runtime.leadership import Leadership

    leadership = Leadership(
        store,
        lease,
        clock=clock,
        holder=holder,
        check_interval=check_interval(lease_seconds),
        lease_seconds=lease_seconds,
    )
    return leadership, {
        capability: lead_shard(
            store, shard_lease, shard, clock=clock, holder=holder, lease_seconds=lease_seconds
        )
        for capability, (shard, shard_lease) in shard_leases.items()
    }


def _server_configs(
    args: argparse.Namespace,
    api: Any,
    extender: Any,
    testbeds: Any,
    listeners: list[socket.socket],
    *,
    max_body_bytes: int,
    metrics: Any = None,
) -> list[Any]:
    """uvicorn's configuration of the API's server and, with ``--extender-port``, the
    extender's over the testbeds service (announced on its listener)."""
    import uvicorn

    from fleetledger.adapters.http.listener import requires_tokens, uvicorn_settings

    grace = max(1, int(args.grace_seconds))
    # The listeners share the process's file limit (adapters/http/listener.py).
    shared = len(listeners)
    configs = [
        uvicorn.Config(
            api,
            host=args.host,
            port=args.port,
            timeout_graceful_shutdown=grace,
            log_config=None,
            **uvicorn_settings(authenticated=requires_tokens(api), listeners=shared),
        )
    ]
    if extender is not None:
        configs.append(
            extender.uvicorn_config(
                testbeds,
                max_body_bytes=max_body_bytes,
                grace=grace,
                listeners=shared,
                metrics=metrics,
            )
        )
        extender.announce(listeners[1])
    return configs


def _open_existing_store(url: str | None) -> EventStore:
    """The store at ``url``; a SQLite file that does not exist is refused rather than created
    empty (serving it would fail on its schema anyway, and leave the file behind)."""
    require_database(resolve_url(url))
    return open_store(url)


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
    return hmac_key_from(args.key_file, environ=args.environ)


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


def bind_listener(host: str, port: int) -> socket.socket:
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


def _bind_all(specs: list[tuple[str, int, str]]) -> list[socket.socket] | str:
    """Every ``(host, port, flag)`` bound, or (all closed again) the line saying which not."""
    bound: list[socket.socket] = []
    for host, port, flag in specs:
        try:
            bound.append(bind_listener(host, port))
        except OSError as e:
            for listener in bound:
                listener.close()
            return (
                f"cannot listen on {host}:{port}: {e.strerror or e}; choose another {flag} or "
                "stop the process using it"
            )
    return bound


def _extender_settings(args: argparse.Namespace) -> Any:
    """The extender's listener settings, or None without ``--extender-port``; ValueError for
    extender options given without it, or an open extender beyond loopback."""
    tls_given = args.extender_tls_cert is not None or args.extender_tls_key is not None
    if args.extender_port is None:
        if args.extender_host is not None or args.extender_token or tls_given:
            raise ValueError(
                "--extender-host, --extender-token and --extender-tls-* configure the extender: "
                "give --extender-port too"
            )
        return None
    if args.extender_port == args.port and args.port != 0:
        raise ValueError(
            f"--extender-port {args.port} is the API's --port: the extender needs a port of its own"
        )
    return ExtenderListener.from_options(
        args.extender_host or "127.0.0.1",
        args.extender_port,
        args.extender_token,
        allow_open=args.insecure_no_auth,
        tls_cert=args.extender_tls_cert,
        tls_key=args.extender_tls_key,
        tls_flag="--extender-tls",
    )


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _namespace(name: str) -> str:
    if _DNS_LABEL.match(name) is None:
        raise ValueError(
            f"--testbeds-namespace must be a Kubernetes namespace name (lower-case letters, "
            f"digits and '-', at most 63), not {name!r}"
        )
    return name


@dataclass(frozen=True, slots=True)
class ExtenderListener:
    """Where the extender listens and the tokens it requires (``None``: open)."""

    host: str
    port: int
    tokens: Any
    tls: Any = None
    """The certificate and key files (``adapters.http.listener.TlsFiles``), or None: plain HTTP."""

    @classmethod
    def from_options(
        cls,
        host: str,
        port: int,
        given_tokens: list[str] | None,
        *,
        allow_open: bool,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_flag: str = "--tls",
    ) -> ExtenderListener:
        """Validated settings; ``ValueError`` for an unusable token or TLS file, or an open
        listener beyond loopback (neither tokens nor TLS) without ``allow_open``."""
        from fleetledger.adapters.extender.server import check_extender_exposure, extender_tokens
        from fleetledger.adapters.http.listener import TlsFiles

        if not host.strip():
            raise ValueError("the extender's host is empty; give an address such as 127.0.0.1")
        tokens = extender_tokens(given_tokens)
        tls = TlsFiles.from_options(tls_cert, tls_key, flag=tls_flag)
        check_extender_exposure(host, tokens, allow_open=allow_open, tls=tls is not None)
        return cls(host, port, tokens, tls)

    def uvicorn_config(
        self,
        service: Any,
        *,
        max_body_bytes: int,
        grace: int,
        listeners: int = 1,
        metrics: Any = None,
    ) -> Any:
        """The extender's server over ``service`` (a ``TestbedsService``), one of ``listeners``
        in the process; ``/metrics`` serves ``metrics`` (a registry the API shares), else the
        log's."""
        import uvicorn

        from fleetledger.adapters.extender.server import PUBLIC_PATHS, create_extender_app
        from fleetledger.adapters.http.listener import uvicorn_settings

        return uvicorn.Config(
            create_extender_app(
                service, tokens=self.tokens, max_body_bytes=max_body_bytes, metrics=metrics
            ),
            host=self.host,
            port=self.port,
            timeout_graceful_shutdown=grace,
            log_config=None,
            **uvicorn_settings(
                authenticated=self.tokens is not None,
                public_paths=PUBLIC_PATHS,
                listeners=listeners,
                tls=self.tls,
            ),
        )

    def announce(self, listener: socket.socket) -> None:
        """Log where the extender answers (the bound port, when 0 was asked for)."""
        port = listener.getsockname()[1]
        log.info(
            "serving the scheduler extender",
            url=f"{'http' if self.tls is None else 'https'}://{self.host}:{port}",
            auth=f"{len(self.tokens)} bearer token(s)" if self.tokens else "none (open)",
        )


def _subnet(spec: str) -> tuple[str, int]:
    subnet_id, _, capacity = spec.partition("=")
    if not subnet_id or not capacity.isdigit() or int(capacity) < 1:
        raise ValueError(f"--subnet takes ID=CAPACITY with a positive capacity, not {spec!r}")
    return subnet_id, int(capacity)


def _capability_options(args: argparse.Namespace) -> dict[str, Any]:
    """The subnets', placement's and IPAM's settings, each validated (``ValueError`` or
    ``InvalidCommand`` says what to fix)."""
    return {
        "subnets": [_subnet(spec) for spec in args.subnet],
        "pools": [_pool(spec) for spec in args.pool],
        "ipam_config": _ipam_config(args),
        "search_steps": _search_steps(args),
    }


def _ipam_config(args: argparse.Namespace) -> Any:
    from fleetledger.domain.ipam import IpamConfig

    given = {
        "max_ips": args.ipam_max_ips,
        "x_nsf": args.ipam_x_nsf,
        "x_ssf": args.ipam_x_ssf,
    }
    # IpamConfig validates each with the seed's meaning; what is not given keeps its default.
    return IpamConfig(**{key: value for key, value in given.items() if value is not None})


def _search_steps(args: argparse.Namespace) -> int | None:
    if args.placement_search_steps is None:
        return None
    from fleetledger.domain.placement import check_search_steps

    return check_search_steps(args.placement_search_steps)


def _pool(spec: str) -> Any:
    from fleetledger.domain.placement import Pool, Strategy
    from fleetledger.domain.template import MachineTemplate

    strategies: dict[str, Strategy] = {"binpack": "binpack", "spread": "spread"}
    name, _, shape = spec.partition("=")
    parts = shape.split(":")
    strategy = strategies.get(parts.pop() if len(parts) == 4 else "binpack")
    if not name or len(parts) != 3 or not all(p.isdigit() for p in parts[1:]) or strategy is None:
        raise ValueError(
            f"--pool takes NAME=VM_SIZE:CPU_MILLI:MEMORY_GIB[:binpack|spread], e.g. "
            f"general=Standard_D4s_v5:4000:16 or batch=Standard_D4s_v5:4000:16:spread, "
            f"not {spec!r}"
        )
    return Pool(
        name=name,
        template=MachineTemplate(vm_size=parts[0]),
        worker_cpu_milli=int(parts[1]),
        worker_memory_bytes=int(parts[2]) << 30,
        strategy=strategy,
    )


class GracefulServers:
    """uvicorn servers on one event loop, each on its own listener; the first signal stops them
    all gracefully, a second SIGTERM or Ctrl-C exits at once.

    The first server takes the signals (the others install no handlers of their own). The first
    signal is uvicorn's graceful shutdown of every server: stop accepting, finish the requests in
    flight, then each app's shutdown (the API's stops the runtimes: seal, finish cloud calls
    within the grace period, answer waiting callers, release the lease). An operator who sends
    another signal wants out now; the log keeps everything acknowledged, and the next leader
    resumes it.
    """

    def __init__(self, configs: list[Any]) -> None:
        import uvicorn

        if not configs:
            raise ValueError("GracefulServers needs at least one server")
        outer = self
        self._signals: list[int] = []

        class Primary(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                if self.should_exit:
                    outer.exit_now(sig)
                outer._signals.append(sig)
                super().handle_exit(sig, frame)
                outer.stop()

        class Companion(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield  # the primary server's handlers stop every server

        self._loop_factory = configs[0].get_loop_factory()
        self._servers: list[Any] = [Primary(configs[0]), *(Companion(c) for c in configs[1:])]

    def stop(self) -> None:
        """Ask every server to shut down gracefully."""
        for server in self._servers:
            server.should_exit = True

    def exit_now(self, sig: int) -> None:
        log.warning("second signal: exiting at once; the next leader resumes the work", signal=sig)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    def run(self, listeners: list[socket.socket]) -> None:
        """Serve until a signal (or a server ending by itself) stops them all. A SIGTERM that
        was handled gracefully is a clean return; a Ctrl-C is a ``KeyboardInterrupt`` after it."""
        if len(listeners) != len(self._servers):
            raise ValueError(f"{len(self._servers)} servers need as many listeners")
        # uvicorn re-raises the signal it stopped on once it has shut down, to end the process
        # the default way; here the remaining servers may still be finishing, so the re-raised
        # signal is ignored and reported once all are done.
        quiet = {
            sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            with asyncio.Runner(loop_factory=self._loop_factory) as runner:
                runner.run(self._serve(listeners))
        finally:
            for sig, handler in quiet.items():
                signal.signal(sig, handler)
        if signal.SIGINT in self._signals:
            raise KeyboardInterrupt

    async def _serve(self, listeners: list[socket.socket]) -> None:
        tasks = [
            asyncio.create_task(server.serve(sockets=[listener]))
            for server, listener in zip(self._servers, listeners, strict=True)
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        # One ended by itself (its app failed to start): the process stops as a whole.
        self.stop()
        await asyncio.gather(*tasks)
