"""Photograph a finished run's report and viewer for the documentation, as a reader sees them.

    .venv/bin/python scripts/docs_screenshots.py RUN_FOLDER [--out docs/images]

Writes ``report-top.png`` (the summary card, contents and leaderboard), ``report-charts.png`` (the
first charts, drawn by the inlined Vega bundle), ``viewer-items.png`` (the item table) and
``viewer-item.png`` (the first item's page) with Debian's headless Chromium at 1,400 px. The viewer
is the real ``refusalbench view`` process on a free loopback port, stopped afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

WIDTH = 1400


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        sys.exit("chromium is not installed (apt-get install chromium)")
    return found


def photograph(url: str, out: Path, height: int = 1100) -> None:
    """``url`` at WIDTH × ``height`` after its scripts have had five seconds of virtual time to draw."""
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={WIDTH},{height}",
                "--virtual-time-budget=5000",
                f"--screenshot={out}",
                url,
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"wrote {out}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def viewer(run: Path, out: Path) -> None:
    port = free_port()
    cli = Path(sys.executable).with_name("refusalbench")
    process = subprocess.Popen([str(cli), "view", str(run), "--port", str(port)], stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # the viewer reads the run's files before it listens
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        items = urllib.request.urlopen(f"{base}/api/runs/{run.name}/items", timeout=10).read().decode()
        photograph(f"{base}/runs/{run.name}/items", out / "viewer-items.png")
        first = items.split('"item_id": "', 1)[-1].split('"', 1)[0] if '"item_id": "' in items else None
        if first is None and '"item_id":"' in items:
            first = items.split('"item_id":"', 1)[1].split('"', 1)[0]
        if first:
            photograph(f"{base}/runs/{run.name}/items/{first}", out / "viewer-item.png", height=1600)
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished run folder (local)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "images")
    args = parser.parse_args()
    run, out = args.run.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = run / "report.html"
    photograph(report.as_uri(), out / "report-top.png")
    photograph(report.as_uri() + "#leaderboard", out / "report-leaderboard.png")
    viewer(run, out)


if __name__ == "__main__":
    main()
