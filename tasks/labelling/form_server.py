"""A one-page labelling form served on loopback: what the audit and KnowOrNot screens share.

Both labelling screens (``refusalbench.audit_screens`` for benchmark audits,
``knowornot.label_screens`` for evaluator labels) show one pending item at a time and save
each label before the next page. What differs is the item's HTML and how a submitted form
becomes a label; that is the ``LabelForm`` a screen hands to ``serve_form``. Everything a
person's browser touches is handled here once: standard library only, loopback only unless
told otherwise, a strict content-security policy, bounded form size, and a random per-server
token that every POST must echo (so another page open in the same browser cannot submit labels).
"""

from __future__ import annotations

import html
import ipaddress
import secrets
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

MAX_FORM_BYTES = 16 * 1024

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Labelling · {annotator}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;line-height:1.5;color:#222}}
.box{{border:1px solid #ccc;border-radius:6px;padding:.75rem 1rem;margin:.75rem 0;white-space:pre-wrap}}
.meta{{color:#666;font-size:.9rem}} button{{font-size:1.1rem;margin:.25rem .5rem .25rem 0;padding:.5rem 1.25rem;cursor:pointer}}
h2{{font-size:1rem;margin:1rem 0 .25rem}}
</style></head><body>
<p class="meta">Annotator <b>{annotator}</b> · {done} of {total} labelled</p>
{body}
</body></html>"""


class LabelForm(Protocol):
    """One labelling screen: its pending items as pages, and how a form becomes a saved label."""

    def progress(self) -> tuple[int, int]:
        """(labelled, total) for this annotator."""
        ...

    def next_page(self, token: str) -> str | None:
        """The next pending item's HTML (its form carries ``token``), or None when all are done."""
        ...

    def accept(self, form: Mapping[str, list[str]]) -> Any:
        """The label a submitted form stands for, or a str saying why it is refused."""
        ...

    def save(self, label: Any) -> bool:
        """Store the label unless this annotator already labelled its item; True when stored."""
        ...


@dataclass
class LabellingServer:
    """A running labelling page: open ``url`` in a browser; ``shutdown()`` stops it."""

    url: str
    httpd: ThreadingHTTPServer
    thread: threading.Thread
    store: Any
    annotator: str
    saved: list[Any] = field(default_factory=list)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> LabellingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_serve_args(annotator: str, host: str, allow_remote: bool) -> None:
    """Refuse a blank annotator, and a non-loopback address unless ``allow_remote``."""
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    if not is_loopback(host) and not allow_remote:
        raise ValueError(f"refusing to serve on {host!r}: not a loopback address (pass allow_remote=True to expose it)")


def serve_form(
    form: LabelForm,
    *,
    store: Any,
    annotator: str,
    done_text: str,
    name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    allow_remote: bool = False,
) -> LabellingServer:
    """Serve ``form`` in a background thread and return at once.

    GET / shows the next pending item (or ``done_text``); POST /label saves the label and
    redirects back. ``port=0`` picks a free port.
    """
    check_serve_args(annotator, host, allow_remote)
    token = secrets.token_urlsafe(16)
    saved: list[Any] = []
    post_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = f"RefusalBench-{name}/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep the terminal quiet
            return

        def _send(self, status: HTTPStatus, body: str) -> None:
            done, total = form.progress()
            data = PAGE.format(annotator=html.escape(annotator), done=done, total=total, body=body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header(
                "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"
            )
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def _refuse(self, status: HTTPStatus, why: str) -> None:
            self._send(status, f"<p>{html.escape(why)}</p><p><a href='/'>Back to the item</a></p>")

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.split("?")[0] != "/":
                self._refuse(HTTPStatus.NOT_FOUND, "Not found.")
                return
            page = form.next_page(token)
            self._send(HTTPStatus.OK, page if page is not None else f"<h1>{html.escape(done_text)}</h1>")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/label":
                self._refuse(HTTPStatus.NOT_FOUND, "Not found.")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_FORM_BYTES:
                self._refuse(HTTPStatus.BAD_REQUEST, "Bad request size.")
                return
            fields = parse_form(self.rfile.read(length))
            if not secrets.compare_digest(fields.get("token", [""])[0], token):
                self._refuse(HTTPStatus.FORBIDDEN, "Stale or foreign form: reload the page.")
                return
            label = form.accept(fields)
            if isinstance(label, str):
                self._refuse(HTTPStatus.BAD_REQUEST, label)
                return
            with post_lock:  # one label per (annotator, item), even on a double click
                if form.save(label):
                    saved.append(label)
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", "/")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server_class = ThreadingHTTPServer
    if ":" in host:

        class _V6Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        server_class = _V6Server
    httpd = server_class((host, port), Handler)
    httpd.daemon_threads = True
    # An IP server's address is (host, port, ...) with a str host; typeshed allows any socket address.
    bound_host, bound_port = str(httpd.server_address[0]), httpd.server_address[1]
    shown_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    thread = threading.Thread(target=httpd.serve_forever, name=f"{name}-server", daemon=True)
    thread.start()
    return LabellingServer(
        url=f"http://{shown_host}:{bound_port}/",
        httpd=httpd,
        thread=thread,
        store=store,
        annotator=annotator,
        saved=saved,
    )


def parse_form(body: bytes) -> dict[str, list[str]]:
    from urllib.parse import parse_qs

    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
