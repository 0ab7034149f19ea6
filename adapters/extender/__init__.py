"""The kube-scheduler extender: its v1 wire format (:mod:`.wire`).

The decisions it answers with are pure functions of a testbed's state, in
:mod:`fleetledger.domain.testbeds.extender`.
"""

from __future__ import annotations

# Its modules are imported by name; the package itself exports nothing.
__all__: list[str] = []
