"""``simulate --scenario all --csv DIR``: the report's time series as CSV files, one a series.

Each file is ``DIR/<series>.csv`` with a header row (``t_s`` first: virtual seconds since the
run's start) and one row per change — the very tables the HTML report's charts are drawn from,
for a spreadsheet or a notebook.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

from .report_series import Series

__all__ = ["write_csv"]


def write_csv(series: Mapping[str, Series], directory: Path) -> tuple[Path, ...]:
    """Write every series into ``directory`` (created if missing); the files written, sorted."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the CSV folder {directory}: {e.strerror or e}") from e
    written = []
    for name in sorted(series):
        path = directory / f"{name}.csv"
        # newline="": the csv module writes its own line ends (RFC 4180's CRLF).
        with path.open("w", encoding="utf-8", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(series[name].columns)
            writer.writerows(series[name].rows)
        written.append(path)
    return tuple(written)
