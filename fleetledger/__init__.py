"""fleetledger: an event-sourced capacity controller for Kubernetes fleets on Azure.

The subpackages (``eventstore``, ``domain``, ``projections``, ``adapters``, ``migrations``) live
in the repository's top-level folders; this folder links to each, so that Python, mypy, editors
and import-graph tools all resolve ``fleetledger.<folder>`` from a checkout.
"""

from __future__ import annotations

__all__: list[str] = []
