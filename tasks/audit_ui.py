"""The audit's two labelling screens: a terminal prompt and a one-page web form on loopback.

Both show an annotator the audit cases they have not labelled yet: the lever (name,
instruction, where the change belongs, expected response), the original and perturbed
question and context side by side, a word diff of what changed, the reference answers
and the verifiers' rubric. The verdict is PASS or FAIL; a FAIL may name the criteria that
do not hold, and any label may carry a note. Every label is saved (``AuditLabelStore``:
appended and fsync'ed) before the next case is shown, so a restart resumes where it stopped.

The web page follows ``knowornot.labelling_ui`` and reuses its page frame, loopback check
and running-server handle: standard library only, every text HTML-escaped, loopback only
unless told otherwise, and forms accepted only with the server's random token.
"""

from __future__ import annotations

import datetime as dt
import difflib
import html
import re
import secrets
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from refusalbench.tasks.audit import AuditCase, AuditLabelStore
from refusalbench.tasks.documents import AuditLabel
from refusalbench.tasks.knowornot.labelling_ui import _MAX_FORM_BYTES, _PAGE, LabellingServer, _is_loopback
from refusalbench.tasks.records import BenchmarkItem, Passage

WHERE = {"query": "the question only", "context": "the context only",
         "query-context": "the fit between question and context (question, context, or both)"}
MAX_NOTE_CHARS = 2000


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def passages_text(passages: Sequence[Passage] | None) -> str:
    return "\n".join(f"[{i}] ({'relevant' if p.relevant else 'not relevant'}) {p.text}"
                     for i, p in enumerate(passages or [], start=1))


def context_of(item: BenchmarkItem, original: bool) -> str:
    """The context (single) or the numbered passages (multi), before or after the perturbation."""
    if item.variant == "multi":
        return passages_text(item.original_passages if original else item.passages)
    return (item.original_context if original else item.context) or ""


def parse_criteria(answer: str, names: Sequence[str]) -> list[str] | None:
    """'1 3' or 'lever_fidelity, 3' -> criterion names in rubric order; None if any is not one."""
    chosen: set[str] = set()
    for token in re.split(r"[\s,]+", answer.strip()):
        if not token:
            continue
        if token.isdigit() and 1 <= int(token) <= len(names):
            chosen.add(names[int(token) - 1])
        elif token.lower() in names:
            chosen.add(token.lower())
        else:
            return None
    return [name for name in names if name in chosen]


# ----------------------------------------------------------------- terminal

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _plain(text: str) -> str:
    # Generated text goes to a terminal: control characters (escape sequences) are shown, not obeyed.
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def case_lines(case: AuditCase) -> list[str]:
    item, lever = case.item, case.lever
    lines = [f"{item.perturbation_class}/{item.intensity} · lever {lever.id} · generator {item.generator} · item {item.item_id}",
             f"Lever: {lever.name}",
             f"Where the change belongs: {WHERE.get(lever.target, lever.target)}",
             f"Instruction: {lever.instruction}"]
    if item.variant == "multi":
        lines.append(f"Across passages: {lever.multi_document}")
    lines += [f"Expected response: {item.expected}", f"Reference answer(s): {'; '.join(item.answers)}", "",
              f"Original question:  {item.original_question}",
              f"Perturbed question: {item.question}" if item.question != item.original_question
              else "Perturbed question: (unchanged)"]
    before, after = context_of(item, True), context_of(item, False)
    lines += ["", "Original context:", before, "", "Perturbed context:", after if after != before else "(unchanged)", "",
              "Rubric (PASS only when every criterion holds):"]
    lines += [f"  {i}. {name}: {text}" for i, (name, text) in enumerate(case.criteria, start=1)]
    return [_plain(line) for line in lines]


def label_in_terminal(
    cases: Sequence[AuditCase],
    store_path: str | Path,
    annotator: str,
    input_fn: Callable[[str], str] = input,
    output_fn: Callable[[str], None] = print,
) -> list[AuditLabel]:
    """Ask for a verdict on every case this annotator has not labelled yet; return the new labels.

    ``p``/``f`` give PASS/FAIL (or type the word); after a FAIL, the numbers or names of the
    criteria that do not hold (Enter: none named); then an optional note. ``s`` skips a case,
    ``q`` (or end of input) stops; a label is saved only once its note is answered.
    """
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    store = AuditLabelStore(store_path)
    pending = store.pending(cases, annotator)  # type: ignore[arg-type]
    output_fn(f"{len(cases) - len(pending)} of {len(cases)} already audited by {annotator}; {len(pending)} to go.")
    new: list[AuditLabel] = []
    try:
        for position, case in enumerate(pending, start=1):
            lines = case_lines(case)
            output_fn("")
            output_fn(f"[{position}/{len(pending)}] {lines[0]}")
            for line in lines[1:]:
                output_fn(line)
            label = _ask_label(case, annotator, input_fn, output_fn)
            if label is None:
                continue
            store.append(label)
            new.append(label)
    except (EOFError, _Quit):
        return new
    output_fn("All items audited.")
    return new


class _Quit(Exception):
    pass


def _ask(input_fn: Callable[[str], str], prompt: str) -> str:
    answer = input_fn(prompt)
    if answer.strip().lower() in ("q", "quit"):
        raise _Quit
    return answer.strip()


def _ask_label(case: AuditCase, annotator: str, input_fn: Callable[[str], str],
               output_fn: Callable[[str], None]) -> AuditLabel | None:
    while True:
        answer = _ask(input_fn, "p) PASS  f) FAIL  s) skip  q) quit > ").lower()
        if answer in ("s", "skip"):
            return None
        verdict = {"p": "PASS", "pass": "PASS", "f": "FAIL", "fail": "FAIL"}.get(answer)
        if verdict:
            break
        output_fn(f"Not an option: {answer!r}. Type p, f, s or q.")
    failed: list[str] = []
    while verdict == "FAIL":
        picked = parse_criteria(_ask(input_fn, "Criteria that do not hold (numbers or names; Enter: none named) > "),
                                case.criterion_names)
        if picked is not None:
            failed = picked
            break
        output_fn(f"Give numbers 1-{len(case.criteria)} or criterion names, separated by spaces or commas.")
    note = _ask(input_fn, "Note (Enter: none) > ")[:MAX_NOTE_CHARS]
    return AuditLabel(item_id=case.item_id, annotator=annotator, label=verdict, failed_criteria=failed,
                      note=note or None, labelled_at=_now())


# ----------------------------------------------------------------- web page

_STYLE = """<style>
body{max-width:76rem}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1rem} .pair .box{max-height:24rem;overflow:auto}
del{background:#fdd;text-decoration:line-through} ins{background:#dfd;text-decoration:none}
ol.rubric li{margin:.35rem 0} textarea{width:100%;min-height:4rem} code{background:#f4f4f4;padding:0 .2rem}
</style>"""


def word_diff_html(before: str, after: str) -> str:
    """Word-level diff as HTML: removed words in <del>, added ones in <ins>, every token escaped."""
    a, b = re.split(r"(\s+)", before), re.split(r"(\s+)", after)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(html.escape("".join(a[i1:i2])))
            continue
        if i2 > i1:
            out.append(f"<del>{html.escape(''.join(a[i1:i2]))}</del>")
        if j2 > j1:
            out.append(f"<ins>{html.escape(''.join(b[j1:j2]))}</ins>")
    return "".join(out)


def _pair(title: str, before: str, after: str) -> str:
    esc = html.escape
    changed = "" if before != after else ' <span class="meta">(unchanged)</span>'
    return (f"<h2>{esc(title)}{changed}</h2><div class='pair'><div><p class='meta'>Original</p>"
            f"<div class='box'>{esc(before)}</div></div><div><p class='meta'>Perturbed</p>"
            f"<div class='box'>{esc(after)}</div></div></div>")


def case_html(case: AuditCase, token: str) -> str:
    """One case and its form; every piece of data is escaped."""
    esc, item, lever = html.escape, case.item, case.lever
    parts = [
        _STYLE,
        f"<p class='meta'>{esc(item.perturbation_class)}/{esc(item.intensity)} · lever <code>{esc(lever.id)}</code>"
        f" · generator {esc(item.generator)} · item <code>{esc(item.item_id)}</code></p>",
        f"<h2>Lever: {esc(lever.name)}</h2><div class='box'>{esc(lever.instruction)}</div>",
        f"<p>Where the change belongs: <b>{esc(WHERE.get(lever.target, lever.target))}</b>. "
        f"Expected response of a careful reader: <code>{esc(item.expected)}</code></p>",
    ]
    if item.variant == "multi":
        parts.append(f"<p class='meta'>Across passages: {esc(lever.multi_document)}</p>")
    before_context, after_context = context_of(item, True), context_of(item, False)
    parts += [
        _pair("Question", item.original_question, item.question),
        _pair("Passages" if item.variant == "multi" else "Context", before_context, after_context),
        "<details open><summary>What changed (word diff)</summary>"
        f"<div class='box'>{word_diff_html(item.original_question, item.question)}</div>"
        f"<div class='box'>{word_diff_html(before_context, after_context)}</div></details>",
        "<h2>Reference answer(s)</h2>" + "".join(f"<div class='box'>{esc(a)}</div>" for a in item.answers),
    ]
    criteria = "".join(
        f"<li><label><input type='checkbox' name='failed' value='{esc(name)}'> <b>{esc(name)}</b> does not hold"
        f"</label><br><span>{esc(text)}</span></li>" for name, text in case.criteria)
    parts.append(
        "<form method='post' action='/label'><h2>Rubric: PASS only when every criterion holds</h2>"
        f"<ol class='rubric'>{criteria}</ol>"
        f"<p><label>Note (optional)<br><textarea name='note' maxlength='{MAX_NOTE_CHARS}'></textarea></label></p>"
        f"<input type='hidden' name='item_id' value='{esc(item.item_id)}'>"
        f"<input type='hidden' name='token' value='{esc(token)}'>"
        "<button type='submit' name='label' value='PASS'>PASS</button>"
        "<button type='submit' name='label' value='FAIL'>FAIL</button></form>"
    )
    return "\n".join(parts)


def label_from_form(form: Mapping[str, list[str]], by_id: Mapping[str, AuditCase], annotator: str) -> AuditLabel | str:
    """The label a submitted form asks for, or why it cannot be saved."""
    case = by_id.get(form.get("item_id", [""])[0])
    if case is None:
        return "Unknown item."
    verdict = form.get("label", [""])[0].strip().upper()
    if verdict not in ("PASS", "FAIL"):
        return f"{verdict or '(none)'} is not a verdict: PASS or FAIL."
    failed = form.get("failed", [])
    unknown = [name for name in failed if name not in case.criterion_names]
    if unknown:
        return f"Not a criterion of this rubric: {', '.join(unknown)}."
    if verdict == "PASS" and failed:
        return "A PASS cannot have criteria that do not hold: untick them or choose FAIL."
    note = form.get("note", [""])[0].strip()[:MAX_NOTE_CHARS]
    return AuditLabel(item_id=case.item_id, annotator=annotator, label=verdict,
                      failed_criteria=[n for n in case.criterion_names if n in failed], note=note or None,
                      labelled_at=_now())


def serve_audit(
    cases: Sequence[AuditCase],
    store_path: str | Path,
    annotator: str,
    host: str = "127.0.0.1",
    port: int = 0,
    allow_remote: bool = False,
) -> LabellingServer:
    """Serve the audit page in a background thread and return at once.

    GET / shows the next case this annotator has not audited; POST /label saves the label
    (fsync'ed) and redirects back. Binds to loopback unless ``allow_remote``; ``port=0``
    picks a free port; POSTs must echo the page's per-server token.
    """
    if not annotator.strip():
        raise ValueError("annotator must not be blank")
    if not _is_loopback(host) and not allow_remote:
        raise ValueError(f"refusing to serve on {host!r}: not a loopback address (pass allow_remote=True to expose it)")
    store = AuditLabelStore(store_path)
    by_id = {case.item_id: case for case in cases}
    token = secrets.token_urlsafe(16)
    saved: list[AuditLabel] = []
    post_lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "RefusalBenchAudit/1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep the terminal quiet
            return

        def _send(self, status: HTTPStatus, body: str) -> None:
            pending = store.pending(cases, annotator)  # type: ignore[arg-type]
            data = _PAGE.format(annotator=html.escape(annotator), done=len(cases) - len(pending), total=len(cases),
                                body=body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
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
            pending = store.pending(cases, annotator)  # type: ignore[arg-type]
            self._send(HTTPStatus.OK, case_html(pending[0], token) if pending else "<h1>All items audited. Thank you!</h1>")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/label":
                self._refuse(HTTPStatus.NOT_FOUND, "Not found.")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= _MAX_FORM_BYTES:
                self._refuse(HTTPStatus.BAD_REQUEST, "Bad request size.")
                return
            form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"), keep_blank_values=True)
            if not secrets.compare_digest(form.get("token", [""])[0], token):
                self._refuse(HTTPStatus.FORBIDDEN, "Stale or foreign form: reload the page.")
                return
            label = label_from_form(form, by_id, annotator)
            if isinstance(label, str):
                self._refuse(HTTPStatus.BAD_REQUEST, label)
                return
            with post_lock:  # one label per (annotator, item), even on a double click
                if label.item_id not in store.labelled_ids(annotator):
                    store.append(label)
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
    bound_host, bound_port = httpd.server_address[0], httpd.server_address[1]
    shown_host = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    thread = threading.Thread(target=httpd.serve_forever, name="audit-server", daemon=True)
    thread.start()
    return LabellingServer(url=f"http://{shown_host}:{bound_port}/", httpd=httpd, thread=thread, store=store,
                           annotator=annotator, saved=saved)  # type: ignore[arg-type]
