"""structlog configuration: a console renderer for people, JSON lines for machines.

Commands whose output is a report (``simulate``, ``bench``) log warnings only by default: the
runtimes they drive log every takeover and migration at info, which buried the report's table
under hundreds of lines. ``--verbose`` (or an explicit level) brings those lines back.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

__all__ = ["configure_logging"]

LOG_LEVEL_ENV = "FLEETLEDGER_LOG_LEVEL"


def configure_logging(
    *, level: str | None = None, json_output: bool | None = None, quiet: bool = False
) -> None:
    """Configure structlog (and the stdlib root logger it may route through) once per process.

    The level is ``level``, else ``$FLEETLEDGER_LOG_LEVEL``, else ``warning`` if ``quiet`` (a
    command printing a report) and ``info`` otherwise. ``json_output`` defaults to "stderr is
    not a terminal": containers and CI get JSON lines, a person at a terminal gets readable,
    coloured output.
    """
    default = "warning" if quiet else "info"
    name = (level or os.environ.get(LOG_LEVEL_ENV) or default).upper()
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
