"""The KnowOrNot pages: the experiment table and one experiment in full (question, withheld fact,
retrieval and passages, the answer, the evaluator's and the annotators' labels)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusalbench.tasks.viewer.knowornot_data import FILTERS, KnowOrNotRun
from refusalbench.tasks.viewer.layout import badge, esc, facts, options, pager, segment, table, td, text_block


def _path(run: KnowOrNotRun) -> str:
    return f"/runs/{segment(run.name)}/items"


def experiments_section(run: KnowOrNotRun, params: Mapping[str, str], *, with_form: bool = True) -> str:
    result = run.query(params)
    choices = run.options()
    form = ""
    if with_form:
        parts = [
            options(c, c.replace("_", " ").capitalize(), choices[c], params.get(c, "")) for c in FILTERS if c in choices
        ]
        parts.append(options("kind", "Question", ["loo", "ookb"], params.get("kind", "")))
        parts += [options(f"spec_{s}", s, choices.get(f"spec_{s}", []), params.get(f"spec_{s}", "")) for s in run.specs]
        parts.append(
            f'<label>Search<input type="search" name="q" value="{esc(params.get("q", ""))}"></label>'
            '<button type="submit" id="apply">Apply</button>'
            f'<a href="{esc(_path(run))}">clear</a>'
        )
        form = f'<form class="filters" method="get" action="{esc(_path(run))}">{"".join(parts)}</form>'
    rows = []
    for row in result["rows"]:
        link = f"{_path(run)}/{segment(row['experiment_id'])}"
        rows.append(
            [
                td(f'<a class="item-link" href="{esc(link)}">{esc(row["question"])}</a>', "question"),
                td(esc(row.get("target"))),
                td(esc(row.get("retrieval"))),
                td(esc(row.get("prompt"))),
                td(esc("out of KB" if row.get("ookb") else "leave-one-out")),
                *(td(badge(row.get(s) or "–")) for s in run.specs),
            ]
        )
    kept = {k: v for k, v in params.items() if k != "page" and v}
    nav = pager(_path(run), kept, result["page"], result["pages"], result["total"], "experiments")
    headers = ["Question", "Target", "Retrieval", "Prompt", "Kind", *run.specs]
    return form + nav + table(headers, rows, css="items")


def experiments_body(run: KnowOrNotRun, params: Mapping[str, str]) -> str:
    return (
        f'<h1>{esc(run.name)}: experiments</h1><p class="muted">{esc(run.uri)} · KnowOrNot run · '
        f"{len(run.results)} experiments</p>{experiments_section(run, params)}"
    )


def home_section(run: KnowOrNotRun) -> str:
    return (
        f'<section class="run" data-run="{esc(run.name)}"><h1>{esc(run.name)}</h1>'
        f'<p class="muted">{esc(run.uri)} · KnowOrNot run · {len(run.results)} experiments</p>'
        f'<h2>Experiments <a class="muted" href="{esc(_path(run))}">(all, with filters)</a></h2>'
        f"{experiments_section(run, {}, with_form=False)}</section>"
    )


def _pair(pair: Mapping[str, Any] | None) -> str:
    if not pair:
        return ""
    return f"Q: {pair.get('question', '')}\nA: {pair.get('answer', '')}"


def experiment_body(run: KnowOrNotRun, detail: dict[str, Any]) -> str:
    row = detail["row"]
    withheld, fact = detail.get("withheld"), detail.get("fact")
    summary = facts(
        [
            ("experiment", esc(row.get("experiment_id"))),
            ("target", esc(row.get("target"))),
            ("retrieval", esc(row.get("retrieval"))),
            ("passages retrieved (k)", esc(row.get("k"))),
            ("prompt", esc(row.get("prompt"))),
            ("knowledge base", esc(row.get("knowledge_base"))),
            (
                "question",
                esc(
                    "synthetic, out of the knowledge base"
                    if row.get("ookb")
                    else "leave-one-out: its own fact withheld"
                ),
            ),
            ("expected answer", esc(row.get("expected_answer"))),
        ]
    )
    withheld_html = ""
    if withheld and not row.get("ookb"):
        withheld_html = (
            f'<section class="withheld"><h2>Withheld fact</h2>{text_block(_pair(withheld))}'
            + (facts([("from the fact", esc(fact.get("text")))]) if fact else "")
            + "</section>"
        )
    passages = "".join(
        f"<li>{text_block(_pair(p) if p.get('question') else p.get('id'))}</li>" for p in detail["passages"]
    )
    output = detail.get("output") or {}
    answer = text_block(row.get("response")) if row.get("response") is not None else '<p class="muted">no reply</p>'
    if output.get("reasoning"):
        answer += f"<details><summary>reasoning</summary>{text_block(output['reasoning'])}</details>"
    answer += facts(
        [
            ("error", esc(row.get("error"))),
            ("finish reason", esc(output.get("finish_reason"))),
            (
                "tokens",
                esc(
                    " · ".join(
                        f"{output[k]} {k.split('_')[0]}"
                        for k in ("prompt_tokens", "completion_tokens")
                        if output.get(k) is not None
                    )
                ),
            ),
            ("cost", esc(f"${output['cost_usd']:.6f}" if output.get("cost_usd") is not None else "")),
        ]
    )
    evaluations = [
        [
            td(esc(e.get("spec"))),
            td(esc(e.get("evaluator"))),
            td(badge(e.get("outcome") or "–")),
            td(
                f"<details><summary>evaluator's reply</summary>{text_block(e.get('raw'))}</details>"
                if e.get("raw")
                else esc(e.get("error"))
            ),
        ]
        for e in detail["evaluations"]
    ]
    labels = [
        [
            td(esc(label["spec"])),
            td(esc(label["annotator"]) + (" (consensus)" if label["consensus"] else "")),
            td(badge(label["label"])),
            td(esc(label.get("note"))),
            td(esc(str(label["labelled_at"])[:19])),
        ]
        for label in detail["labels"]
    ]
    return (
        f'<h1 class="item-question">{esc(row.get("question"))}</h1><div class="card">{summary}</div>'
        f'{withheld_html}<section class="passages"><h2>Passages in the context ({len(detail["passages"])})</h2>'
        f"<ol>{passages}</ol></section><section><h2>The answer</h2>{answer}</section>"
        f'<section class="evaluations"><h2>Evaluator\'s labels</h2>'
        f"{table(['Spec', 'Evaluator', 'Outcome', 'Why'], evaluations) if evaluations else ''}</section>"
        f'<section class="human-labels"><h2>Human labels</h2>'
        + (
            table(["Spec", "Annotator", "Label", "Note", "When"], labels)
            if labels
            else '<p class="muted">No human labels for this experiment.</p>'
        )
        + "</section>"
    )
