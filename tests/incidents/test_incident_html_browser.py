"""The HTML report in a real headless Chromium: it loads without console errors and the plots decode.

The page records each plot's natural size on ``<body data-plot-sizes>`` after ``load``;
``--dump-dom`` reads it back. A deliberately broken page proves the checks can fail.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from supervisor.incidents import IncidentStore
from supervisor.incidents.render import render_report
from tests.incidents.builders import full_incident

_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--window-size=1200,2000",
]  # fmt: skip


def _chromium(binary: str, page: Path, profile: Path, *action: str) -> subprocess.CompletedProcess[str]:
    cmd = [binary, *_FLAGS, f"--user-data-dir={profile}", *action, page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _load(binary: str, page: Path, tmp: Path) -> tuple[list[str], list[tuple[int, int]], Path]:
    """(console messages, natural sizes of the plots, screenshot) of ``page``."""
    shot = tmp / f"{page.stem}.png"
    shot_run = _chromium(binary, page, tmp / "profile-shot", f"--screenshot={shot}")
    dom_run = _chromium(binary, page, tmp / "profile-dom", "--dump-dom")
    console = [line for run in (shot_run, dom_run) for line in run.stderr.splitlines() if ":CONSOLE" in line]
    body = re.search(r"<body[^>]*>", dom_run.stdout)
    assert body is not None and 'data-loaded="1"' in body.group(0), dom_run.stdout[:500]
    sizes = re.search(r'data-plot-sizes="([^"]*)"', body.group(0))
    pairs = (
        [tuple(int(n) for n in s.split("x")) for s in sizes.group(1).split(",")]
        if sizes and sizes.group(1)
        else []
    )
    return console, [(w, h) for w, h in pairs], shot


def test_html_report_loads_cleanly_and_its_plots_have_size(chromium: str, tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    page = tmp_path / "report.html"
    page.write_text(render_report(store, full_incident(store), "html"), encoding="utf-8")
    console, sizes, shot = _load(chromium, page, tmp_path)
    assert console == []
    assert len(sizes) == 4 and all(w > 300 and h > 100 for w, h in sizes), sizes
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_checks_catch_a_broken_page(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><body><img class="plot" src="data:image/png;base64,AAAA">'
        '<script>window.addEventListener("load", function () { document.body.setAttribute("data-loaded", "1");'
        'document.body.setAttribute("data-plot-sizes", [...document.images].map(i => i.naturalWidth + "x" + '
        "i.naturalHeight).join(',')); }); missingFunction();</script></body></html>"
    )
    console, sizes, _ = _load(chromium, page, tmp_path)
    assert any("missingFunction is not defined" in line for line in console)
    assert sizes == [(0, 0)]


def test_rollback_report_in_chromium_reads_as_sentences(chromium: str, tmp_path: Path) -> None:
    """The report of a runtime-shaped incident with a rollback: the browser shows the timeline in
    sentences, one plot per panel decoded, and the plots' legend names both timelines."""
    from tests.incidents.builders import rollback_incident

    store = IncidentStore(tmp_path / "incidents.sqlite")
    page = tmp_path / "rollback.html"
    page.write_text(render_report(store, rollback_incident(store, rank_local=True, top_cause="data"), "html"))
    console, sizes, shot = _load(chromium, page, tmp_path)
    assert console == []
    assert len(sizes) == 4 and all(w > 300 and h > 100 for w, h in sizes), sizes
    dom = _chromium(chromium, page, tmp_path / "profile-text", "--dump-dom").stdout
    rows = re.findall(r"<tr class=\"(?:done|pending|failed)\"[^>]*>(.*?)</tr>", dom, flags=re.S)
    cells = [re.sub(r"<[^>]+>", " ", row) for row in rows]
    assert any("Froze all 2 ranks at step 104." in c for c in cells), cells
    assert any("Rolled back from step 104 to healthy checkpoint 80" in c for c in cells)
    assert not any(re.search(r"[{}]|memo|\w+=\S", c) for c in cells), cells
    assert dom.count("web-000017") == 1
