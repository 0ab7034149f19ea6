"""How the schema tests judge a refusal of schema-violating input.

Schemathesis's own list of refusals leaves out ``413``, which every listener answers for a body
over its limit before reading it (adapters/http/limits.py) and every operation documents. A
negative case whose invalid part is its size (a list past ``maxItems`` with long strings in
it) may cross that limit: refused as it should be, and counted a failure without this.
"""

from __future__ import annotations

from schemathesis.config import SchemathesisConfig

__all__ = ["REFUSALS"]

REFUSALS = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429]
            }
        }
    }
)
"""The configuration to load a schema with: ``413`` counts as a refusal."""
