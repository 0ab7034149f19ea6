"""structlog configuration: a console renderer for people, JSON lines for machines."""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging"]

LOG_LEVEL_ENV = "FLEETLEDGER_LOG_LEVEL"


def configure_logging(*, level: str | None = None, json_output: bool | None = None) -> None:
    """Configure structlog (and the stdlib root logger it may route through) once per process.

    ``json_output`` defaults to "stderr is not a terminal": containers and CI get JSON lines, a
    person at a terminal gets readable, coloured output.
    """
    name = (level or os.environ.get(LOG_LEVEL_ENV) or "info").upper()
    numeric = logging.getLevelNamesMapping().get(name)
    if numeric is None:
        raise ValueError(f"unknown log level {name!r}: use debug, info, warning or error")
    as_json = (not sys.stderr.isatty()) if json_output is None else json_output
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
