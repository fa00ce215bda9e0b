"""Headless Chromium for tests that look at pages the way a person does.

Debian's ``chromium`` (installed by ``.ci/run``) is started headless on loopback with its
DevTools port; a page is opened, given time to render, inspected with JavaScript (what a
person would see: broken images, visible text) and photographed as a full-page PNG. The
DevTools protocol is spoken over a websocket with aiohttp, which the project already has.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


def chromium_path() -> str:
    """The browser, or a skip where none is installed (CI installs it, so CI never skips)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium for the browser tests")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    return found


class Browser:
    """One headless Chromium process; ``look(url)`` opens a page in a fresh tab."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="rb-chromium-")
        self.process = subprocess.Popen([chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def look(self, url: str, *, script: str, screenshot: Path | None = None, settle_s: float = 1.0,
             wait_for: str | None = None, timeout_s: float = 60.0) -> Any:
        """Open ``url``, wait for load (and for the JS condition ``wait_for``), run ``script``, photograph."""
        return asyncio.run(self._look(url, script, screenshot, settle_s, wait_for, timeout_s))

    async def _look(self, url: str, script: str, screenshot: Path | None, settle_s: float, wait_for: str | None,
                    timeout_s: float) -> Any:
        base = f"http://127.0.0.1:{self.port}"
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{base}/json/new?about:blank") as reply:
                target = await reply.json(content_type=None)
            try:
                async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    page = _Page(ws)
                    await page.call("Page.enable")
                    await page.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1,
                                    mobile=False)
                    await page.call("Page.navigate", url=url)
                    await page.wait_event("Page.loadEventFired", timeout_s)
                    deadline = time.monotonic() + timeout_s
                    while wait_for and not await page.evaluate(wait_for):
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"page never satisfied: {wait_for}")
                        await asyncio.sleep(0.5)
                    await asyncio.sleep(settle_s)
                    result = await page.evaluate(script)
                    if screenshot is not None:
                        height = await page.evaluate("Math.max(document.body.scrollHeight, 900)")
                        await page.call("Emulation.setDeviceMetricsOverride", width=1280, height=min(int(height), 16000),
                                        deviceScaleFactor=1, mobile=False)
                        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                        screenshot.write_bytes(base64.b64decode(shot["data"]))
                    return result
            finally:
                async with session.get(f"{base}/json/close/{target['id']}") as reply:
                    await reply.read()


class _Page:
    """The DevTools protocol on one tab: commands with ids, events kept until asked for."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads((await self.ws.receive()).data)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    async def wait_event(self, method: str, timeout_s: float) -> None:
        if any(e.get("method") == method for e in self.events):
            return
        async with asyncio.timeout(timeout_s):
            while True:
                message = json.loads((await self.ws.receive()).data)
                if message.get("method") == method:
                    return

    async def evaluate(self, expression: str) -> Any:
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"script failed: {reply['exceptionDetails'].get('text')}")
        return reply["result"].get("value")


# What a person sees: images that failed to render, and the visible text.
PAGE_FACTS = """(() => ({
  images: document.images.length,
  broken: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).length,
  alts: Array.from(document.images).map(i => i.alt),
  headings: Array.from(document.querySelectorAll('h1,h2,h3')).map(h => h.innerText.trim()),
  text: document.body.innerText,
}))()"""
