"""The audit's two labelling screens: a terminal prompt and a one-page web form on loopback.

Both show an annotator the audit cases they have not labelled yet: the lever (name,
instruction, where the change belongs, expected response), the original and perturbed
question and context side by side, a word diff of what changed, the reference answers
and the verifiers' rubric. The verdict is PASS or FAIL; a FAIL may name the criteria that
do not hold, and any label may carry a note. Every label is saved (``AuditLabelStore``:
appended and fsync'ed) before the next case is shown, so a restart resumes where it stopped.

The web page is a ``labelling.form_server.LabelForm``, like KnowOrNot's labelling page; that module
holds the server and its safeguards (loopback only unless told otherwise, every text
HTML-escaped, forms accepted only with the server's random token).
"""

from __future__ import annotations

import datetime as dt
import difflib
import html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from refusalbench.tasks.labelling.form_server import LabellingServer, check_serve_args, serve_form
from refusalbench.tasks.refusalbench.audit.human_audit import AuditCase, AuditLabelStore
from refusalbench.tasks.refusalbench.schema.json_files import AuditLabel
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Passage

WHERE = {
    "query": "the question only",
    "context": "the context only",
    "query-context": "the fit between question and context (question, context, or both)",
}
MAX_NOTE_CHARS = 2000


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def passages_text(passages: Sequence[Passage] | None) -> str:
    return "\n".join(
        f"[{i}] ({'relevant' if p.relevant else 'not relevant'}) {p.text}"
        for i, p in enumerate(passages or [], start=1)
    )


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
    lines = [
        f"{item.perturbation_class}/{item.intensity} · lever {lever.id} · generator {item.generator} · item {item.item_id}",
        f"Lever: {lever.name}",
        f"Where the change belongs: {WHERE.get(lever.target, lever.target)}",
        f"Instruction: {lever.instruction}",
    ]
    if item.variant == "multi":
        lines.append(f"Across passages: {lever.multi_document}")
    lines += [
        f"Expected response: {item.expected}",
        f"Reference answer(s): {'; '.join(item.answers)}",
        "",
        f"Original question:  {item.original_question}",
        f"Perturbed question: {item.question}"
        if item.question != item.original_question
        else "Perturbed question: (unchanged)",
    ]
    before, after = context_of(item, True), context_of(item, False)
    lines += [
        "",
        "Original context:",
        before,
        "",
        "Perturbed context:",
        after if after != before else "(unchanged)",
        "",
        "Rubric (PASS only when every criterion holds):",
    ]
    lines += [f"  {i}. {name}: {text}" for i, (name, text) in enumerate(case.criteria, start=1)]
    return [_plain(line) for line in lines]


def audit_in_terminal(
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
    pending = store.pending(cases, annotator)
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


def _ask_label(
    case: AuditCase, annotator: str, input_fn: Callable[[str], str], output_fn: Callable[[str], None]
) -> AuditLabel | None:
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
        picked = parse_criteria(
            _ask(input_fn, "Criteria that do not hold (numbers or names; Enter: none named) > "), case.criterion_names
        )
        if picked is not None:
            failed = picked
            break
        output_fn(f"Give numbers 1-{len(case.criteria)} or criterion names, separated by spaces or commas.")
    note = _ask(input_fn, "Note (Enter: none) > ")[:MAX_NOTE_CHARS]
    return AuditLabel(
        item_id=case.item_id,
        annotator=annotator,
        label=verdict,
        failed_criteria=failed,
        note=note or None,
        labelled_at=_now(),
    )


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
    return (
        f"<h2>{esc(title)}{changed}</h2><div class='pair'><div><p class='meta'>Original</p>"
        f"<div class='box'>{esc(before)}</div></div><div><p class='meta'>Perturbed</p>"
        f"<div class='box'>{esc(after)}</div></div></div>"
    )


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
        f"</label><br><span>{esc(text)}</span></li>"
        for name, text in case.criteria
    )
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
    return AuditLabel(
        item_id=case.item_id,
        annotator=annotator,
        label=verdict,
        failed_criteria=[n for n in case.criterion_names if n in failed],
        note=note or None,
        labelled_at=_now(),
    )


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
    picks a free port; POSTs must echo the page's per-server token (see ``labelling.form_server``).
    """
    check_serve_args(annotator, host, allow_remote)  # before the store touches any file
    store = AuditLabelStore(store_path)
    return serve_form(
        _AuditForm(cases, store, annotator),
        store=store,
        annotator=annotator,
        done_text="All items audited. Thank you!",
        name="audit",
        host=host,
        port=port,
        allow_remote=allow_remote,
    )


@dataclass
class _AuditForm:
    """The audit screen for ``serve_form``: PASS/FAIL, failed criteria and a note per case."""

    cases: Sequence[AuditCase]
    store: AuditLabelStore
    annotator: str

    def __post_init__(self) -> None:
        self.by_id = {case.item_id: case for case in self.cases}

    def progress(self) -> tuple[int, int]:
        return len(self.cases) - len(self.store.pending(self.cases, self.annotator)), len(self.cases)

    def next_page(self, token: str) -> str | None:
        pending = self.store.pending(self.cases, self.annotator)
        return case_html(pending[0], token) if pending else None

    def accept(self, form: Mapping[str, list[str]]) -> AuditLabel | str:
        return label_from_form(form, self.by_id, self.annotator)

    def save(self, label: AuditLabel) -> bool:
        if label.item_id in self.store.labelled_ids(self.annotator):
            return False
        self.store.append(label)
        return True
