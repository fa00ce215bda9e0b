"""Two ways to give labels: a terminal prompt and a one-page web form on loopback.

Both show an annotator the items they have not labelled yet and save every label (via
``LabelStore``) before showing the next, so a restart resumes where it stopped. The web
page is standard library only, escapes all text, binds to loopback unless told
otherwise, and accepts only forms carrying its per-server token.
"""

from __future__ import annotations

import datetime as dt
import html
import ipaddress
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from refusalbench.tasks.knowornot.labels import LabelStore
from refusalbench.tasks.knowornot.records import HumanLabel, LabelItem


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _match_outcome(answer: str, outcomes: Sequence[str]) -> str | None:
    answer = answer.strip()
    if answer.isdigit() and 1 <= int(answer) <= len(outcomes):
        return outcomes[int(answer) - 1]
    for outcome in outcomes:
        if answer.lower() == outcome.lower():
            return outcome
    return None


# ----------------------------------------------------------------- terminal


def label_in_terminal(
    items: Sequence[LabelItem],
    store_path: str | Path,
    annotator: str,
    input_fn: Callable[[str], str] = input,
    output_fn: Callable[[str], None] = print,
) -> list[HumanLabel]:
    """Ask for a label for every item this annotator has not labelled yet; return the new labels.

    Each label is saved before the next item is shown. Answer with the outcome's number or
    name; ``s`` skips the item, ``q`` (or end of input) stops.
    """
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    store = LabelStore(store_path)
    pending = store.pending(items, annotator)
    output_fn(f"{len(items) - len(pending)} of {len(items)} already labelled by {annotator}; {len(pending)} to go.")
    new: list[HumanLabel] = []
    for position, item in enumerate(pending, start=1):
        output_fn("")
        output_fn(f"[{position}/{len(pending)}] {item.spec} · {item.item_id}")
        output_fn(f"Question: {item.question}")
        if item.context:
            output_fn(f"Context:\n{item.context}")
        if item.expected_answer:
            output_fn(f"Expected answer: {item.expected_answer}")
        output_fn(f"Response: {item.response}")
        choices = "  ".join(f"{i}) {o}" for i, o in enumerate(item.outcomes, start=1))
        while True:
            try:
                answer = input_fn(f"{choices}  s) skip  q) quit > ")
            except EOFError:
                return new
            command = answer.strip().lower()
            if command in ("q", "quit"):
                return new
            if command in ("s", "skip"):
                break
            outcome = _match_outcome(answer, item.outcomes)
            if outcome is None:
                output_fn(f"Not an option: {answer.strip()!r}. Type a number, an outcome, s or q.")
                continue
            label = HumanLabel(item_id=item.item_id, spec=item.spec, annotator=annotator, label=outcome, labelled_at=_now())
            store.append(label)
            new.append(label)
            break
    output_fn("All items labelled.")
    return new


# ----------------------------------------------------------------- web page

_PAGE = """<!doctype html>
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


def _item_html(item: LabelItem, token: str) -> str:
    esc = html.escape
    parts = [
        f'<p class="meta">{esc(item.spec)} · {esc(item.item_id)}</p>',
        f'<h2>Question</h2><div class="box">{esc(item.question)}</div>',
    ]
    if item.context:
        parts.append(f'<details><summary>Context given to the model</summary><div class="box">{esc(item.context)}</div></details>')
    if item.expected_answer:
        parts.append(f'<h2>Expected answer</h2><div class="box">{esc(item.expected_answer)}</div>')
    parts.append(f'<h2>Model response</h2><div class="box">{esc(item.response)}</div>')
    buttons = "".join(f'<button type="submit" name="label" value="{esc(o)}">{esc(o)}</button>' for o in item.outcomes)
    parts.append(
        '<form method="post" action="/label">'
        f'<input type="hidden" name="item_id" value="{esc(item.item_id)}">'
        f'<input type="hidden" name="spec" value="{esc(item.spec)}">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        f"{buttons}</form>"
    )
    return "\n".join(parts)


@dataclass
class LabellingServer:
    """A running labelling page: open ``url`` in a browser; ``shutdown()`` stops it."""

    url: str
    httpd: ThreadingHTTPServer
    thread: threading.Thread
    store: LabelStore
    annotator: str
    saved: list[HumanLabel] = field(default_factory=list)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> LabellingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_MAX_FORM_BYTES = 16 * 1024


def serve_labelling(
    items: Sequence[LabelItem],
    store_path: str | Path,
    annotator: str,
    host: str = "127.0.0.1",
    port: int = 0,
    allow_remote: bool = False,
) -> LabellingServer:
    """Serve the labelling page in a background thread and return at once.

    GET / shows the next item this annotator has not labelled (all text HTML-escaped) with
    one button per allowed outcome; POST /label saves the label (fsync'ed) and redirects
    back. Binds to loopback unless ``allow_remote`` is set; ``port=0`` picks a free port.
    Each page carries a random per-server token that POSTs must echo, so other web pages
    open in the annotator's browser cannot submit labels.
    """
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(f"refusing to serve on {host!r}: not a loopback address (pass allow_remote=True to expose it)")
    store = LabelStore(store_path)
    by_key = {(item.spec, item.item_id): item for item in items}
    token = secrets.token_urlsafe(16)
    state: dict[str, Any] = {"saved": []}
    post_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "RefusalBenchLabeller/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep the terminal quiet
            return

        def _send(self, status: HTTPStatus, body: str, extra: Mapping[str, str] | None = None) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _page(self, body: str) -> str:
            pending = store.pending(items, annotator)
            return _PAGE.format(
                annotator=html.escape(annotator), done=len(items) - len(pending), total=len(items), body=body
            )

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            if self.path.split("?")[0] != "/":
                self._send(HTTPStatus.NOT_FOUND, "<p>Not found.</p>")
                return
            pending = store.pending(items, annotator)
            body = _item_html(pending[0], token) if pending else "<h1>All items labelled. Thank you!</h1>"
            self._send(HTTPStatus.OK, self._page(body))

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/label":
                self._send(HTTPStatus.NOT_FOUND, "<p>Not found.</p>")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= _MAX_FORM_BYTES:
                self._send(HTTPStatus.BAD_REQUEST, "<p>Bad request size.</p>")
                return
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode("utf-8", "replace")).items()}
            if not secrets.compare_digest(form.get("token", ""), token):
                self._send(HTTPStatus.FORBIDDEN, "<p>Stale or foreign form: reload the page.</p>")
                return
            item = by_key.get((form.get("spec", ""), form.get("item_id", "")))
            if item is None:
                self._send(HTTPStatus.BAD_REQUEST, "<p>Unknown item.</p>")
                return
            given = form.get("label", "").strip()
            outcome = next((o for o in item.outcomes if o.lower() == given.lower()), None)
            if outcome is None:
                self._send(HTTPStatus.BAD_REQUEST, f"<p>{html.escape(given)} is not an allowed outcome.</p>")
                return
            with post_lock:  # one label per (annotator, item), even on a double click
                if item.item_id not in store.labelled_ids(annotator, item.spec):
                    label = HumanLabel(item_id=item.item_id, spec=item.spec, annotator=annotator, label=outcome, labelled_at=_now())
                    store.append(label)
                    state["saved"].append(label)
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", "/")
            self.send_header("Content-Length", "0")
            self.end_headers()

    family_server = ThreadingHTTPServer
    if ":" in host:
        import socket

        class _V6Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6

        family_server = _V6Server
    httpd = family_server((host, port), Handler)
    httpd.daemon_threads = True
    bound_host, bound_port = httpd.server_address[0], httpd.server_address[1]
    shown_host = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    thread = threading.Thread(target=httpd.serve_forever, name="labelling-server", daemon=True)
    thread.start()
    return LabellingServer(
        url=f"http://{shown_host}:{bound_port}/",
        httpd=httpd,
        thread=thread,
        store=store,
        annotator=annotator,
        saved=state["saved"],
    )
