"""``simulate --scenario all --report FILE.html``: one self-contained page of the whole run.

The page holds the summary (what batching bought), a chart per capability (inline SVG from
:mod:`.report_charts`) and each scenario's own text report. It fetches nothing — no script, no
stylesheet, no font, no image from elsewhere — so it opens offline, attaches to a ticket and
archives as one file. It names each log by its file name only (never a folder or a database
URL), so the same seed and scenario file give the same page, byte for byte, wherever it runs.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from urllib.parse import urlsplit

from .all import LOG_PER_SCENARIO, SCENARIOS, AllReport
from .report_charts import Chart, draw_charts

__all__ = ["render_html", "write_html"]

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 60rem; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
.meta { color: #666; margin-top: 0; }
table.summary { border-collapse: collapse; width: 100%; }
table.summary td { border-bottom: 1px solid #eee; padding: 0.35rem 0.5rem; vertical-align: top; }
table.summary td.figure { text-align: right; font-weight: 600; white-space: nowrap; }
figure.chart { margin: 1.5rem 0; }
figure.chart svg { width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: 0.9rem; }
figcaption strong { color: #222; display: block; font-size: 1rem; }
pre { background: #f6f6f6; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
"""


def render_html(report: AllReport) -> str:
    """The page's text (see the module docstring)."""
    charts = draw_charts(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>fleetledger simulation, seed {report.seed}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        "<h1>fleetledger: every capability, simulated</h1>",
        f'<p class="meta">Seed {report.seed}, scenarios: {_e(report.source)}. '
        f"{_e(LOG_PER_SCENARIO.capitalize())}: {_e(_log_names(report))}.</p>",
        "<h2>What batching bought</h2>",
        '<table class="summary">',
        *(
            f'<tr><td>{_e(label)}</td><td class="figure">{_e(figure)}</td><td>{_e(text)}</td></tr>'
            for label, figure, text in report.headlines()
        ),
        "</table>",
        "<h2>Over time</h2>",
        *(_figure(chart) for chart in charts),
        "<h2>Each scenario's report</h2>",
        *_texts(report),
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


def write_html(report: AllReport, path: Path) -> Path:
    """Write the page to ``path`` (whole: a temporary file beside it replaces it; missing
    folders are made); the path."""
    text = render_html(report)
    scratch = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_text(text, encoding="utf-8")
        os.replace(scratch, path)
    except OSError as e:
        scratch.unlink(missing_ok=True)
        raise ValueError(f"cannot write the report to {path}: {e.strerror or e}") from e
    return path


def _figure(chart: Chart) -> str:
    return (
        f'<figure class="chart" id="chart-{chart.name}">\n{chart.svg}\n'
        f"<figcaption><strong>{_e(chart.title)}</strong>{_e(chart.caption)}</figcaption>\n"
        "</figure>"
    )


def _texts(report: AllReport) -> list[str]:
    # The per-scenario text reports, less the lines that carry wall-clock figures (a rebuild's
    # seconds, the extender's latency): those differ from run to run, the page must not.
    texts = {
        "burst-vms": report.burst_vms.render(),
        "burst-workloads": report.placement.render(),
        "subnet": report.subnet.render(),
        "restart": report.restart.render(),
        "testbed": report.testbed.render(),
    }
    out = []
    for name in SCENARIOS:
        lines = [line for line in texts[name].splitlines() if not _wall_clock(line)]
        out.append(f"<h3>{_e(name)}</h3>\n<pre>{_e(chr(10).join(lines))}</pre>")
    return out


def _wall_clock(line: str) -> bool:
    """The restart's "rebuild wall time" row and the testbed's extender latency line."""
    text = line.strip()
    return text.startswith("rebuild wall time") or "(wall clock" in text


def _log_names(report: AllReport) -> str:
    return ", ".join(
        f"{name} → {Path(urlsplit(report.logs[name]).path).name}" for name in SCENARIOS
    )


def _e(text: str) -> str:
    return html.escape(text, quote=True)
