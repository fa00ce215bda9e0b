"""Photograph a finished run's report and viewer for the documentation, as a reader sees them.

    .venv/bin/python scripts/docs_screenshots.py RUN_FOLDER [--out docs/images]

Writes ``report-top.png`` (the summary card and contents), ``report-charts.png`` (a section of
charts drawn by the inlined Vega bundle), ``viewer-items.png`` (the item table) and
``viewer-item.png`` (the first item's page), at 1,400 px in Debian's headless Chromium, driven
by the browser helper the tests use. The viewer is the real ``refusalbench view`` process on a
free loopback port, stopped afterwards.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/browser.py: the tests' DevTools client

from tests.browser import Browser  # noqa: E402

WIDTH, HEIGHT = 1400, 1000
CHART_SECTION = "false-vs-missed-refusals"  # a section whose chart every report with two targets has


def shoot(browser: Browser, url: str, out: Path, *, section: str | None = None, wait_for: str | None = None) -> None:
    with browser.tab(WIDTH, HEIGHT) as tab:
        tab.open(url)
        if wait_for:
            tab.wait_for(wait_for)
        if section:
            tab.evaluate(f"document.getElementById({json.dumps(section)}).scrollIntoView()")
        time.sleep(1.0)  # charts draw after load
        tab.screenshot(out, full_page=False)
    print(f"wrote {out}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def photograph_viewer(browser: Browser, run: Path, out: Path) -> None:
    port = free_port()
    cli = Path(sys.executable).with_name("refusalbench")
    process = subprocess.Popen([str(cli), "view", str(run), "--port", str(port)], stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):  # the viewer reads the run's files before it listens
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        shoot(browser, f"{base}/runs/{run.name}/items", out / "viewer-items.png")
        with browser.tab(WIDTH, HEIGHT) as tab:
            tab.open(f"{base}/runs/{run.name}/items")
            first = tab.evaluate("(document.querySelector('a.item-link') || {}).href || ''")
        if first:
            shoot(browser, first, out / "viewer-item.png")
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run folder (local)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    run, out = args.run.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = (run / "report.html").as_uri()
    drawn = "document.querySelectorAll('.vl-chart svg, .vl-chart canvas').length > 0"
    with Browser() as browser:
        shoot(browser, report, out / "report-top.png")
        shoot(browser, report, out / "report-charts.png", section=CHART_SECTION, wait_for=drawn)
        photograph_viewer(browser, run, out)


if __name__ == "__main__":
    main()
