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

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


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
        self.process = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
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

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def tab(self, width: int = 1280, height: int = 900) -> Tab:
        """A tab kept open across steps (open, click, type, read, photograph); close it, or use ``with``."""
        return Tab(self.port, width, height)

    def look(
        self,
        url: str,
        *,
        script: str,
        screenshot: Path | None = None,
        settle_s: float = 1.0,
        wait_for: str | None = None,
        timeout_s: float = 60.0,
    ) -> Any:
        """Open ``url``, wait for load (and for the JS condition ``wait_for``), run ``script``, photograph."""
        return asyncio.run(self._look(url, script, screenshot, settle_s, wait_for, timeout_s))

    async def _look(
        self, url: str, script: str, screenshot: Path | None, settle_s: float, wait_for: str | None, timeout_s: float
    ) -> Any:
        base = f"http://127.0.0.1:{self.port}"
        async with aiohttp.ClientSession() as session:
            async with session.put(f"{base}/json/new?about:blank") as reply:
                target = await reply.json(content_type=None)
            try:
                async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    page = _Page(ws)
                    await page.call("Page.enable")
                    await page.call(
                        "Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False
                    )
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
                        await page.call(
                            "Emulation.setDeviceMetricsOverride",
                            width=1280,
                            height=min(int(height), 16000),
                            deviceScaleFactor=1,
                            mobile=False,
                        )
                        shot = await page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                        screenshot.write_bytes(base64.b64decode(shot["data"]))
                    return result
            finally:
                async with session.get(f"{base}/json/close/{target['id']}") as reply:
                    await reply.read()


class Tab:
    """One tab driven as a person would: real mouse clicks at an element's box, real typing.

    Each step runs on the tab's own event loop, so tests call it step by step:
    ``tab.open(url)``, ``tab.click("a.item-link", navigates=True)``, ``tab.type("input[name=q]", "x")``,
    ``tab.evaluate(js)``, ``tab.screenshot(path)``.
    """

    def __init__(self, port: int, width: int, height: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.width, self.height = width, height
        self.loop = asyncio.new_event_loop()
        self.session: aiohttp.ClientSession | None = None
        self.target: dict[str, Any] = {}
        self.page = self._run(self._connect())

    def _run(self, step: Any) -> Any:
        return self.loop.run_until_complete(step)

    async def _connect(self) -> _Page:
        self.session = aiohttp.ClientSession()
        async with self.session.put(f"{self.base}/json/new?about:blank") as reply:
            self.target = await reply.json(content_type=None)
        self.ws = await self.session.ws_connect(self.target["webSocketDebuggerUrl"], max_msg_size=0)
        page = _Page(self.ws)
        await page.call("Page.enable")
        await page.call(
            "Emulation.setDeviceMetricsOverride",
            width=self.width,
            height=self.height,
            deviceScaleFactor=1,
            mobile=False,
        )
        return page

    def close(self) -> None:
        async def shut() -> None:
            await self.ws.close()
            assert self.session is not None
            async with self.session.get(f"{self.base}/json/close/{self.target['id']}") as reply:
                await reply.read()
            await self.session.close()

        try:
            self._run(shut())
        finally:
            self.loop.close()

    def __enter__(self) -> Tab:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def _loaded(self, timeout_s: float) -> None:
        await self.page.wait_event("Page.loadEventFired", timeout_s)

    def open(self, url: str, timeout_s: float = 60.0) -> None:
        async def go() -> None:
            self.page.events.clear()
            await self.page.call("Page.navigate", url=url)
            await self._loaded(timeout_s)

        self._run(go())

    def evaluate(self, expression: str) -> Any:
        return self._run(self.page.evaluate(expression))

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied: {expression}")
            time.sleep(0.1)

    def centre_of(self, selector: str, text: str | None = None) -> tuple[float, float]:
        """The middle of the first element matching ``selector`` (and containing ``text``), scrolled into view."""
        found = self.evaluate(f"""(() => {{
            const e = Array.from(document.querySelectorAll({json.dumps(selector)}))
                .find(e => {json.dumps(text)} === null || e.innerText.includes({json.dumps(text)}));
            if (!e) return null;
            e.scrollIntoView({{block: 'center'}});
            const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        }})()""")
        if not found:
            raise LookupError(f"nothing on the page matches {selector!r}" + (f" with {text!r}" if text else ""))
        return found[0], found[1]

    def click(
        self, selector: str, *, text: str | None = None, navigates: bool = False, timeout_s: float = 60.0
    ) -> None:
        """A left click with the mouse at the element's centre; ``navigates``: wait for the next page's load."""
        x, y = self.centre_of(selector, text)

        async def press() -> None:
            self.page.events.clear()
            await self.page.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
            for kind in ("mousePressed", "mouseReleased"):
                await self.page.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
            if navigates:
                await self._loaded(timeout_s)

        self._run(press())

    def type(self, selector: str, text: str) -> None:
        """Click into the field, then type ``text`` as keyboard input."""
        self.click(selector)
        self._run(self.page.call("Input.insertText", text=text))

    def press_enter(self, *, navigates: bool = False, timeout_s: float = 60.0) -> None:
        async def enter() -> None:
            self.page.events.clear()
            for kind in ("keyDown", "keyUp"):
                await self.page.call(
                    "Input.dispatchKeyEvent",
                    type=kind,
                    key="Enter",
                    code="Enter",
                    windowsVirtualKeyCode=13,
                    nativeVirtualKeyCode=13,
                    **({"text": "\r"} if kind == "keyDown" else {}),
                )
            if navigates:
                await self._loaded(timeout_s)

        self._run(enter())

    def screenshot(self, path: Path, *, full_page: bool = True) -> None:
        async def shoot() -> None:
            if full_page:
                height = await self.page.evaluate("Math.max(document.body.scrollHeight, 600)")
                await self.page.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=self.width,
                    height=min(int(height), 16000),
                    deviceScaleFactor=1,
                    mobile=False,
                )
            shot = await self.page.call("Page.captureScreenshot", format="png", captureBeyondViewport=full_page)
            path.write_bytes(base64.b64decode(shot["data"]))
            await self.page.call(
                "Emulation.setDeviceMetricsOverride",
                width=self.width,
                height=self.height,
                deviceScaleFactor=1,
                mobile=False,
            )

        self._run(shoot())


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
# Every chart of the page (core.charts) has drawn its SVG or canvas.
CHARTS_DRAWN = "Array.from(document.querySelectorAll('div.vl-chart')).every(c => c.querySelector('svg, canvas'))"

PAGE_FACTS = """(() => ({
  images: document.images.length,
  charts: document.querySelectorAll('div.vl-chart').length,
  drawn: document.querySelectorAll('div.vl-chart svg, div.vl-chart canvas').length,
  labels: Array.from(document.querySelectorAll('div.vl-chart')).map(c => c.getAttribute('aria-label')),
  broken: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).length,
  alts: Array.from(document.images).map(i => i.alt),
  headings: Array.from(document.querySelectorAll('h1,h2,h3')).map(h => h.innerText.trim()),
  text: document.body.innerText,
}))()"""
