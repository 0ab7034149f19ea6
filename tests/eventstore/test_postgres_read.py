"""Pages of the log on Postgres: which statements the reader keeps prepared."""

from __future__ import annotations

from fleetledger.eventstore._engine import libpq_conninfo
from fleetledger.eventstore._postgres_read import PostgresReader


def _prepared(reader: PostgresReader) -> list[str]:
    """The statements prepared on the reader's (only) idle connection."""
    [connection] = reader._idle
    rows = connection.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    return [str(statement) for (statement,) in rows]


class TestPlans:
    def test_pages_of_some_types_are_planned_for_their_types_every_time(
        self, postgres_url: str
    ) -> None:
        """A page filtered by type is never served from a plan cached without its types
        (prepared, Postgres would settle on one after five runs); an unfiltered page is."""
        reader = PostgresReader(libpq_conninfo(postgres_url), max_idle=1)
        try:
            for _ in range(8):
                reader.read_all(after=0, limit=10, types=["Rare"])
                reader.read_all(after=0, limit=10, types=None)

            prepared = _prepared(reader)
        finally:
            reader.close()

        assert len(prepared) == 1
        assert "global_position > $1 ORDER BY" in prepared[0]
