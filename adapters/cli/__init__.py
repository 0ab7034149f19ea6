"""The ``fleetledger`` command line: :func:`main` is the console script, and each command group
(``db``, ``events``, ``audit``, ``bench``, ``simulate``, ``serve``, ``dumpstate``,
``extender``) is a module registering its subcommands into :func:`main`'s parser.

The exit statuses and the simulator's default log file are exported for the command's callers.
"""

from __future__ import annotations

from fleetledger.adapters.cli.common import EXIT_ERROR, EXIT_TAMPERED, EXIT_USAGE
from fleetledger.adapters.cli.main import main
from fleetledger.adapters.cli.simulate import SIMULATION_LOG

__all__ = ["EXIT_ERROR", "EXIT_TAMPERED", "EXIT_USAGE", "SIMULATION_LOG", "main"]
