"""The in-process HTTP client the simulator and the benchmarks drive the ASGI apps with.

Starlette's test client runs an app in this process over httpx. Recent Starlette releases warn
on import that they would rather have their own httpx fork; httpx itself still works (the
testbed scenario and ``bench reliability`` run through it), and a report printed by the CLI is
no place for that warning, so it is silenced here, for this one import only.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

__all__ = ["TestClient"]
