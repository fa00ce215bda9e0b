"""KnowOrNot's two ways to give labels: a terminal prompt and a one-page web form on loopback.

Both show an annotator the items they have not labelled yet and save every label (via
``labelling.label_store.LabelStore``) before showing the next, so a restart resumes where it
stopped. The web page is a ``labelling.form_server.LabelForm`` (that module holds the server
and its safeguards): all text escaped, loopback unless told otherwise, forms accepted only
with its token.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from refusalbench.tasks.core.human_labels import HumanLabel, LabelItem
from refusalbench.tasks.knowornot.stages.ookb import OOKB_VALIDITY, VALIDITY_CONTEXT_TITLE, VALIDITY_INSTRUCTION
from refusalbench.tasks.labelling.form_server import LabellingServer, check_serve_args, serve_form
from refusalbench.tasks.labelling.label_store import LabelStore


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


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
        validity = item.spec == OOKB_VALIDITY.name  # a synthetic question itself, no response to judge
        if validity:
            output_fn(VALIDITY_INSTRUCTION)
        output_fn(f"Question: {item.question}")
        if item.context:
            output_fn(f"{VALIDITY_CONTEXT_TITLE if validity else 'Context'}:\n{item.context}")
        if item.expected_answer:
            output_fn(f"Expected answer: {item.expected_answer}")
        if not validity:
            output_fn(f"Response: {item.response}")
        if item.shown_labels:
            output_fn(f"Annotators' labels: {item.shown_labels}  (record the label you agreed on)")
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
            label = HumanLabel(
                item_id=item.item_id, spec=item.spec, annotator=annotator, label=outcome, labelled_at=_now()
            )
            store.append(label)
            new.append(label)
            break
    output_fn("All items labelled.")
    return new


# ----------------------------------------------------------------- web page


def _item_html(item: LabelItem, token: str) -> str:
    esc = html.escape
    parts = [
        f'<p class="meta">{esc(item.spec)} · {esc(item.item_id)}</p>',
        f'<h2>Question</h2><div class="box">{esc(item.question)}</div>',
    ]
    validity = item.spec == OOKB_VALIDITY.name  # a synthetic question itself, no response to judge
    if validity:
        parts.insert(1, f'<p class="note">{esc(VALIDITY_INSTRUCTION)}</p>')
        if item.context:
            parts.append(f'<h2>{esc(VALIDITY_CONTEXT_TITLE)}</h2><div class="box">{esc(item.context)}</div>')
    elif item.context:
        parts.append(
            f'<details><summary>Context given to the model</summary><div class="box">{esc(item.context)}</div></details>'
        )
    if item.expected_answer:
        parts.append(f'<h2>Expected answer</h2><div class="box">{esc(item.expected_answer)}</div>')
    if not validity:
        parts.append(f'<h2>Model response</h2><div class="box">{esc(item.response)}</div>')
    if item.shown_labels:
        parts.append(
            f'<h2>Annotators\' labels (record the label you agreed on)</h2><div class="box">{esc(item.shown_labels)}</div>'
        )
    buttons = "".join(f'<button type="submit" name="label" value="{esc(o)}">{esc(o)}</button>' for o in item.outcomes)
    parts.append(
        '<form method="post" action="/label">'
        f'<input type="hidden" name="item_id" value="{esc(item.item_id)}">'
        f'<input type="hidden" name="spec" value="{esc(item.spec)}">'
        f'<input type="hidden" name="token" value="{esc(token)}">'
        f"{buttons}</form>"
    )
    return "\n".join(parts)


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
    back. Binds to loopback unless ``allow_remote`` is set; ``port=0`` picks a free port;
    POSTs must echo the page's per-server token (see ``labelling.form_server``).
    """
    check_serve_args(annotator, host, allow_remote)  # before the store touches any file
    store = LabelStore(store_path)
    return serve_form(
        _LabelForm(items, store, annotator),
        store=store,
        annotator=annotator,
        done_text="All items labelled. Thank you!",
        name="labelling",
        host=host,
        port=port,
        allow_remote=allow_remote,
    )


@dataclass
class _LabelForm:
    """The KnowOrNot labelling screen for ``serve_form``: one button per allowed outcome."""

    items: Sequence[LabelItem]
    store: LabelStore
    annotator: str

    def __post_init__(self) -> None:
        self.by_key = {(item.spec, item.item_id): item for item in self.items}

    def progress(self) -> tuple[int, int]:
        return len(self.items) - len(self.store.pending(self.items, self.annotator)), len(self.items)

    def next_page(self, token: str) -> str | None:
        pending = self.store.pending(self.items, self.annotator)
        return _item_html(pending[0], token) if pending else None

    def accept(self, form: Mapping[str, list[str]]) -> HumanLabel | str:
        item = self.by_key.get((form.get("spec", [""])[0], form.get("item_id", [""])[0]))
        if item is None:
            return "Unknown item."
        given = form.get("label", [""])[0].strip()
        outcome = next((o for o in item.outcomes if o.lower() == given.lower()), None)
        if outcome is None:
            return f"{given} is not an allowed outcome."
        return HumanLabel(
            item_id=item.item_id, spec=item.spec, annotator=self.annotator, label=outcome, labelled_at=_now()
        )

    def save(self, label: HumanLabel) -> bool:
        if label.item_id in self.store.labelled_ids(self.annotator, label.spec):
            return False
        self.store.append(label)
        return True
