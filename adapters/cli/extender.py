"""``fleetledger extender``: the kube-scheduler extender for slot testbeds, on its own port."""

from __future__ import annotations

import argparse

import structlog

from fleetledger.adapters.cli.options import Subcommands, add_url
from fleetledger.eventstore import open_store

__all__ = ["register", "run"]

log = structlog.get_logger("cli")


def register(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "extender",
        help="the kube-scheduler extender (filter, preempt) for slot testbeds, on its own port",
    )
    add_url(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from fleetledger.adapters.clock import SystemClock
    from fleetledger.adapters.extender.server import create_extender_app
    from fleetledger.adapters.testbeds.service import TestbedsService

    with open_store(args.url) as store:
        # Answers come from the testbeds' streams as this process folds them; reservations are
        # appended with expected versions, so any number of extenders may serve one scheduler.
        service = TestbedsService(store, clock=SystemClock())
        log.info("serving the scheduler extender", url=f"http://{args.host}:{args.port}")
        uvicorn.run(create_extender_app(service), host=args.host, port=args.port, log_config=None)
    return 0
