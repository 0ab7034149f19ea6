"""``fleetledger extender``: the kube-scheduler extender for slot testbeds, on its own.

It answers from the testbeds' streams as this process folds them and appends reservations with
expected versions, so any number of extenders (and ``serve --extender-port`` processes) may serve
schedulers from one database; the ghost pods and the jobs' applications are the leader's work
(``serve``). The app and its edge rules are the ones ``serve --extender-port`` runs
(:func:`~fleetledger.adapters.extender.server.create_extender_app`).

The kube-scheduler calls it as configured in its ``KubeSchedulerConfiguration``::

    extenders:
      - urlPrefix: "http://127.0.0.1:8081"
        filterVerb: filter
        preemptVerb: preempt
        nodeCacheCapable: true       # either form is understood
        httpTimeout: 5s
        enableHTTPS: false

The scheduler's extender client sends no ``Authorization`` header (its only credentials are
``tlsConfig`` client certificates). So either keep the extender on loopback beside the scheduler
(the default), or serve it over TLS (``--tls-cert``/``--tls-key``; ``enableHTTPS: true`` and the
CA in the scheduler's ``tlsConfig``), or require extender tokens (``--extender-token`` /
``FLEETLEDGER_EXTENDER_TOKENS``, never the API's) and put a proxy between them — a sidecar that
accepts the scheduler's mutual TLS and adds ``Authorization: Bearer <token>``. A listener beyond
loopback with neither tokens nor TLS is refused unless ``--insecure-no-auth`` says so. Its
connections are guarded as the API's are (:mod:`fleetledger.adapters.http.listener`).
"""

from __future__ import annotations

import argparse
import sys

from fleetledger.adapters.cli.common import EXIT_ERROR, EXIT_USAGE
from fleetledger.adapters.cli.options import (
    Subcommands,
    add_max_body_bytes,
    add_url,
    port_number,
    seconds,
)
from fleetledger.adapters.cli.serve import ExtenderListener, GracefulServers, bind_listener
from fleetledger.eventstore import open_store

__all__ = ["register", "run"]


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "extender",
        help="the kube-scheduler extender (filter, preempt) for slot testbeds, on its own port",
    )
    add_url(parser)
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8081, help="default 8081")
    parser.add_argument(
        "--extender-token",
        action="append",
        metavar="TOKEN",
        help="a bearer token the extender accepts (repeatable). Default: "
        "FLEETLEDGER_EXTENDER_TOKENS, comma-separated. The kube-scheduler sends none: use them "
        "behind a proxy that adds one",
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without tokens on a non-loopback address (anyone who reaches the port can "
        "reserve slots)",
    )
    parser.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve over TLS with this PEM certificate (chain), with --tls-key; the scheduler "
        "then needs enableHTTPS and the CA in its tlsConfig",
    )
    parser.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    add_max_body_bytes(parser)
    parser.add_argument(
        "--grace-seconds",
        type=seconds(at_least=0, at_most=3600),
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long to finish the calls in flight (default 10); a second SIGTERM "
        "exits at once",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.heap import FrozenStartupHeap
    from fleetledger.adapters.http.limits import checked_max_body_bytes
    from fleetledger.adapters.testbeds.service import TestbedsService

    try:
        settings = ExtenderListener.from_options(
            args.host,
            args.port,
            args.extender_token,
            allow_open=args.insecure_no_auth,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
        )
        max_body_bytes = checked_max_body_bytes(args.max_body_bytes)
    except ValueError as e:
        print(f"fleetledger: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as e:
        print(
            f"fleetledger: error: cannot listen on {args.host}:{args.port}: {e.strerror or e}; "
            "choose another --port or stop the process using it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        with open_store(args.url) as store:
            service = TestbedsService(store, clock=SystemClock())
            config = settings.uvicorn_config(
                service, max_body_bytes=max_body_bytes, grace=max(1, int(args.grace_seconds))
            )
            settings.announce(listener)
            # The reads of start-up (the testbeds' streams) stay out of full collections, whose
            # pauses (~100 ms about once a second under load) would set the tail.
            heap = FrozenStartupHeap()
            heap.start()
            try:
                GracefulServers([config]).run([listener])
            finally:
                heap.stop()
    finally:
        listener.close()
    return 0
