"""A lean HTTP/1.1 client for the gateway's direct path: POST a body, read the reply, keep the connection.

aiohttp spends about 0.45 ms of CPU per request on objects the direct path never looks at
(request and response objects, multidict headers, URL parsing, the cookie jar, tracing hooks);
at hundreds of calls per second on the gateway's one event-loop thread that is most of a call's
cost. This client writes the request line and headers itself and parses the reply's head and
body (``Content-Length``, chunked, or up to the server closing) on keep-alive connections,
pooled per host, about ten times cheaper. It speaks plain ``http://`` only; ``transport``
sends ``https://`` and redirects through aiohttp as before.

Timeouts are per phase, as aiohttp's ``sock_connect``/``sock_read``: connecting, and the
silence between two reads. A connection is closed, never reused, after a timeout, a
cancellation or a reply it cannot read to its end.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any
from urllib.parse import urlsplit

USER_AGENT = "refusalbench-direct"


class Disconnected(ConnectionError):
    """The server closed the connection before the reply was complete."""


# A reply as ``post`` returns it: status, headers with lower-case names, body.
_Reply = tuple[int, dict[str, str], bytes]


class MalformedReply(ConnectionError):
    """The bytes the server sent are no HTTP/1.1 reply this client reads."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request on it at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: Any = None
        self.closed = False
        self.buffer = bytearray()
        self.waiter: asyncio.Future[_Reply] | None = None
        self.last_activity = 0.0
        self.head: tuple[int, dict[str, str], int, bool] | None = None  # status, headers, body start, keep-alive

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.last_activity = self.loop.time()
        if self.waiter is not None and not self.waiter.done():
            try:
                self._parse(eof=False)
            except MalformedReply as exc:
                self._fail(exc)

    def eof_received(self) -> bool:
        self._ended()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended()

    # ------------------------------------------------------------ one exchange

    def send(self, data: bytes) -> asyncio.Future[_Reply]:
        self.waiter = self.loop.create_future()
        self.buffer.clear()
        self.head = None
        self.last_activity = self.loop.time()
        self.transport.write(data)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _ended(self) -> None:
        was_closed, self.closed = self.closed, True
        if self.waiter is not None and not self.waiter.done():
            try:
                if not self._parse(eof=True):
                    self._fail(Disconnected("Server disconnected" if not was_closed else "Connection closed"))
            except MalformedReply as exc:
                self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def _parse(self, *, eof: bool) -> bool:
        """Hand the waiter the reply once it is complete; True when it was."""
        if self.head is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return False
            self.head = _head(bytes(self.buffer[:end]), end + 4)
        status, headers, start, keep_alive = self.head
        if status in (204, 304):
            body: bytes | None = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = _dechunked(self.buffer, start)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise MalformedReply(f"bad Content-Length {headers['content-length']!r}") from None
            body = bytes(self.buffer[start : start + length]) if len(self.buffer) - start >= length else None
        else:  # the reply ends where the server closes the connection
            body, keep_alive = (bytes(self.buffer[start:]) if eof else None), False
        if body is None:
            return False
        if not keep_alive:
            self.close()
        self.waiter.set_result((status, headers, _decoded(body, headers.get("content-encoding", ""))))  # type: ignore[union-attr]
        return True


def _head(raw: bytes, body_start: int) -> tuple[int, dict[str, str], int, bool]:
    """Status, headers (names lower-case; repeated ones joined by ", "), where the body starts, keep-alive."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    try:
        status = int(rest[:3])
    except ValueError:
        raise MalformedReply(f"not an HTTP status line: {lines[0][:100]!r}") from None
    if not version.startswith("HTTP/1."):
        raise MalformedReply(f"not an HTTP/1.x reply: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise MalformedReply(f"bad header line: {line[:100]!r}")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection and (version == "HTTP/1.1" or "keep-alive" in connection)
    return status, headers, body_start, keep_alive


def _dechunked(buffer: bytearray, start: int) -> bytes | None:
    """The body of a chunked reply, or None while its last chunk has not come."""
    body = bytearray()
    at = start
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        try:
            size = int(bytes(buffer[at:line_end]).split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise MalformedReply("bad chunk size") from None
        if size == 0:  # then trailers (rare), up to an empty line
            if buffer[line_end + 2 : line_end + 4] == b"\r\n" or buffer.find(b"\r\n\r\n", line_end + 2) >= 0:
                return bytes(body)
            return None
        chunk_start = line_end + 2
        if len(buffer) < chunk_start + size + 2:
            return None
        body += buffer[chunk_start : chunk_start + size]
        at = chunk_start + size + 2


def _decoded(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:  # raw deflate, as some servers send it
            return zlib.decompress(body, -zlib.MAX_WBITS)
    return body


class PostClient:
    """Keep-alive connections per (host, port), idle ones reused last-in first-out."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._targets: dict[str, tuple[str, int, bytes]] = {}

    @staticmethod
    def handles(url: str) -> bool:
        return url.startswith("http://")

    def _target(self, url: str) -> tuple[str, int, bytes]:
        """(host, port, the request line and Host header) of ``url``, parsed once per URL."""
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port or 80
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            netloc = parts.netloc.rpartition("@")[2]
            target = self._targets[url] = (host, port, f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\n".encode())
        return target

    async def post(
        self, url: str, body: bytes, headers: dict[str, str], *, connect_timeout: float, read_timeout: float
    ) -> tuple[int, dict[str, str], bytes]:
        """POST ``body`` to ``url``: (status, headers with lower-case names, body). Raises
        ``TimeoutError`` or a ``ConnectionError``/``OSError`` when no complete reply came."""
        host, port, request_line = self._target(url)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
            raise ValueError("a header name or value holds a line break")
        data = b"".join(
            (
                request_line,
                f"User-Agent: {USER_AGENT}\r\nAccept-Encoding: identity\r\n{lines}"
                f"Content-Length: {len(body)}\r\n\r\n".encode(),
                body,
            )
        )
        conn = await self._connection(host, port, connect_timeout)
        loop = conn.loop
        waiter = conn.send(data)
        timer = loop.call_later(read_timeout, self._check_silence, conn, waiter, read_timeout)
        done = False
        try:
            reply = await waiter
            done = True
        finally:
            timer.cancel()
            if not done:
                conn.close()
        if not conn.closed:
            self._idle.setdefault((host, port), []).append(conn)
        return reply

    async def _connection(self, host: str, port: int, timeout: float) -> _Connection:
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.transport.is_closing():
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(loop.create_connection(lambda: _Connection(loop), host, port), timeout)
        return conn

    def _check_silence(self, conn: _Connection, waiter: asyncio.Future[_Reply], timeout: float) -> None:
        """The read timeout: no byte for ``timeout`` seconds fails the request; a read since re-arms it."""
        if waiter.done():
            return
        silent = conn.loop.time() - conn.last_activity
        if silent >= timeout:
            waiter.set_exception(TimeoutError(f"no reply within {timeout:g} s"))
            conn.close()
        else:
            conn.loop.call_later(timeout - silent, self._check_silence, conn, waiter, timeout)

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
