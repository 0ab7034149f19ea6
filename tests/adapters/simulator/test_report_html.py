"""The all-capabilities HTML report: self-contained, every chart drawn, the same for a seed.

The drawing is checked in a real browser: headless Chromium (Debian's ``chromium`` package,
which ``.ci/run`` installs) loads a copy of the page with a probe script appended, which
measures each chart's SVG and counts the paths with a non-empty box, then ``--dump-dom`` prints
the page with the probe's findings in it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetledger.adapters.simulator.all import SCENARIOS, AllReport, run_all
from fleetledger.adapters.simulator.report_charts import draw_charts
from fleetledger.adapters.simulator.report_csv import write_csv
from fleetledger.adapters.simulator.report_html import render_html, write_html
from fleetledger.adapters.simulator.scenario_file import load_scenario_file
from fleetledger.eventstore import open_store

SMALL = Path(__file__).resolve().parents[3] / "ops" / "scenarios" / "small.toml"

_PROBE = """
<script>
const charts = [...document.querySelectorAll("figure.chart")].map((figure) => {
  const svg = figure.querySelector("svg");
  const box = svg.getBoundingClientRect();
  const drawn = [...svg.querySelectorAll("path")].filter((p) => {
    const b = p.getBBox();
    return b.width > 0 || b.height > 0;
  });
  return { id: figure.id, width: box.width, height: box.height, paths: drawn.length };
});
const out = document.createElement("pre");
out.id = "probe";
out.textContent = JSON.stringify(charts);
document.body.appendChild(out);
</script>
"""


def _run(folder: Path) -> AllReport:
    logs = {name: f"sqlite:///{folder / f'{name}.db'}" for name in SCENARIOS}
    return run_all(5, logs=logs, scenario_file=load_scenario_file(SMALL))


@pytest.fixture(scope="module")
def first_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("first")


@pytest.fixture(scope="module")
def report(first_logs: Path) -> AllReport:
    return _run(first_logs)


def _log_of(database: Path) -> list[tuple[int, str, str, object]]:
    """A log as the same seed must reproduce it: positions, streams, types and data (the
    store's wall-clock recording times aside)."""
    with open_store(f"sqlite:///{database}") as store:
        return [
            (r.global_position, r.stream_id, r.type, r.data)
            for r in store.read_all(after=0, limit=1_000_000)
        ]


@pytest.fixture(scope="module")
def page(report: AllReport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_html(report, tmp_path_factory.mktemp("page") / "report.html")


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("needs Debian's chromium package (apt-get install chromium)")
    return found


def _headless(page: Path, profile: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [
        _chromium(),
        "--headless",
        "--disable-gpu",
        # Root (CI containers) may not use Chromium's sandbox; the page is our own file.
        "--no-sandbox",
        f"--user-data-dir={profile}",
        "--window-size=1100,4400",
        *options,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)


class TestPage:
    def test_fetches_nothing(self, page: Path) -> None:
        """No script, stylesheet, font or image from elsewhere: the page opens offline.
        (SVG's own namespace names are URIs but never fetched.)"""
        text = page.read_text(encoding="utf-8")
        without_namespaces = re.sub(r'xmlns(:\w+)?="[^"]*"', "", text)

        assert "<script" not in text
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", without_namespaces)
        assert "@import" not in text and "url(http" not in text

    def test_has_the_summary_and_every_chart(self, report: AllReport, page: Path) -> None:
        text = page.read_text(encoding="utf-8")

        for label, figure, _ in report.headlines():
            assert label in text and figure in text
        for chart in draw_charts(report):
            assert f'id="chart-{chart.name}"' in text

    def test_leaves_out_wall_clock_figures(self, page: Path) -> None:
        """A rebuild's wall time and the extender's latency vary between runs: not shown."""
        text = page.read_text(encoding="utf-8")

        assert "wall time" not in text and "wall clock" not in text


class TestDeterminism:
    def test_same_seed_gives_the_same_logs_page_and_series(
        self, report: AllReport, first_logs: Path, tmp_path: Path
    ) -> None:
        """A second run with the same seed and file, on other logs in another folder, writes
        the same logs and gives the same HTML byte for byte and the same CSV files."""
        (tmp_path / "logs").mkdir()
        again = _run(tmp_path / "logs")

        for name in SCENARIOS:
            log = _log_of(first_logs / f"{name}.db")
            assert log and log == _log_of(tmp_path / "logs" / f"{name}.db"), name
        assert render_html(again) == render_html(report)
        first = write_csv(report.series, tmp_path / "first")
        second = write_csv(again.series, tmp_path / "second")
        assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


class TestCsv:
    def test_one_file_per_series_with_a_header(self, report: AllReport, tmp_path: Path) -> None:
        written = write_csv(report.series, tmp_path / "series")

        assert sorted(p.stem for p in written) == sorted(report.series)
        for path in written:
            with path.open(encoding="utf-8", newline="") as f:
                rows = list(csv.reader(f))
            series = report.series[path.stem]
            assert tuple(rows[0]) == series.columns and rows[0][0] == "t_s"
            assert len(rows) == len(series.rows) + 1


class TestChromium:
    def test_every_chart_draws(self, report: AllReport, page: Path, tmp_path: Path) -> None:
        """Each chart's SVG has a non-zero size and paths with a non-empty box."""
        probed = tmp_path / "probed.html"
        probed.write_text(
            page.read_text(encoding="utf-8").replace("</body>", f"{_PROBE}</body>"),
            encoding="utf-8",
        )

        dom = _headless(probed, tmp_path / "profile", "--dump-dom").stdout
        found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
        assert found is not None, "the probe did not run"
        charts = json.loads(found.group(1).replace("&quot;", '"'))

        assert [c["id"] for c in charts] == [f"chart-{c.name}" for c in draw_charts(report)]
        for chart in charts:
            assert chart["width"] > 0 and chart["height"] > 0, chart
            assert chart["paths"] > 0, chart

    def test_screenshot(self, page: Path, tmp_path: Path) -> None:
        """The page renders to a PNG (the picture a reviewer looks at)."""
        shot = tmp_path / "report.png"

        _headless(page, tmp_path / "profile", f"--screenshot={shot}", "--hide-scrollbars")

        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert shot.stat().st_size > 50_000
