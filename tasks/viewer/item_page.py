"""One RefusalBench item in full: the change the lever made, the verifiers' votes, every model's reply.

Whatever the run folder holds is shown; what it lacks (no candidates, no verifications, no
judgments yet) is left out.
"""

from __future__ import annotations

import json
from typing import Any

from refusalbench.tasks.viewer.data import CRITERIA, judge_rationale
from refusalbench.tasks.viewer.layout import badge, esc, facts, table, td, text_block
from refusalbench.tasks.viewer.textdiff import word_diff


def _diff_block(title: str, before: str | None, after: str | None) -> str:
    old, new, changed = word_diff(before, after)
    note = "" if changed else ' <span class="muted">(unchanged)</span>'
    return (
        f'<h3>{esc(title)}{note}</h3><div class="diff"><div><div class="muted">original</div>'
        f'<div class="text original">{old}</div></div><div><div class="muted">perturbed</div>'
        f'<div class="text perturbed">{new}</div></div></div>'
    )


def _passages_text(passages: Any) -> str:
    if not passages:
        return ""
    return "\n\n".join(
        f"[{i}{'' if p.get('relevant', True) else ', noise'}] {p.get('text', '')}"
        for i, p in enumerate(passages, start=1)
    )


def change_section(item: dict[str, Any]) -> str:
    """The question and context before and after the perturbation, the change marked word by word."""
    parts = []
    if item.get("original_question") is not None:
        parts.append(_diff_block("Question", item.get("original_question"), item.get("question")))
    if item.get("context") is not None or item.get("original_context") is not None:
        parts.append(_diff_block("Context", item.get("original_context"), item.get("context")))
    if item.get("passages") is not None or item.get("original_passages") is not None:
        parts.append(
            _diff_block("Passages", _passages_text(item.get("original_passages")), _passages_text(item.get("passages")))
        )
    return f'<section class="change"><h2>What the perturbation changed</h2>{"".join(parts)}</section>' if parts else ""


def _vote(value: Any) -> str:
    if value is True:
        return '<span class="yes" title="yes">✓</span>'
    if value is False:
        return '<span class="no" title="no">✗</span>'
    return '<span class="muted">–</span>'


def verification_section(verifications: list[dict[str, Any]]) -> str:
    if not verifications:
        return ""
    criteria = [c for c in CRITERIA if any(v.get(c) is not None for v in verifications)]
    rows = []
    for v in verifications:
        verdict = v.get("verdict")
        css = {"PASS": "correct", "FAIL": "wrong"}.get(str(verdict))
        rows.append(
            [
                td(esc(v.get("verifier"))),
                td(badge(verdict, css)),
                td(esc(v.get("stated_verdict"))),
                *(td(_vote(v.get(c)), "cell") for c in criteria),
                td(esc(v.get("error") or "")),
            ]
        )
    headers = ["Verifier", "Verdict", "Stated", *(c.replace("_", " ") for c in criteria), "Error"]
    return f'<section class="verification"><h2>Verifiers</h2>{table(headers, rows, css="votes")}</section>'


def released_votes_section(item: dict[str, Any]) -> str:
    """The verifier votes a released benchmark carries with the item (its ``verifier_votes`` field,
    kept as JSON text on import), for an item this project did not verify itself."""
    raw = item.get("verifier_votes")
    if raw in (None, ""):
        return ""
    try:
        votes = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        votes = raw
    if isinstance(votes, dict) and votes:
        rows = [
            [td(esc(verifier)), td(_vote(vote) if isinstance(vote, bool) else esc(_as_text(vote)), "cell")]
            for verifier, vote in votes.items()
        ]
        body = table(["Verifier", "Vote"], rows, css="votes")
    else:
        body = text_block(_as_text(votes))
    return (
        '<section class="verification"><h2>Verifiers (as released)</h2>'
        '<p class="muted">the votes the released file records for this item</p>'
        f"{body}</section>"
    )


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _tokens(row: dict[str, Any] | None, prefix: str = "") -> str:
    if not row:
        return ""
    parts = [
        f"{row.get(prefix + name)} {label}"
        for name, label in (
            ("prompt_tokens", "prompt"),
            ("completion_tokens", "completion"),
            ("reasoning_tokens", "reasoning"),
        )
        if row.get(prefix + name) is not None
    ]
    return " · ".join(parts)


def _cost(value: Any) -> str:
    return "" if value is None else f"${float(value):.6f}"


def reply_card(entry: dict[str, Any]) -> str:
    """One model's reply to the item, its decision, and the judge's view of it."""
    response, judgment = entry.get("response") or {}, entry.get("judgment") or {}
    decision = judgment.get("decision") if judgment else response.get("decision")
    verdict = entry.get("verdict")
    head = (
        f'<h3><span class="model-name">{esc(entry["model"])}</span>{badge(decision or "no decision", verdict)}'
        f"{badge(verdict or 'not judged', verdict)}</h3>"
    )
    body = text_block(response.get("raw")) if response.get("raw") is not None else ""
    if response.get("reasoning"):
        body += f"<details><summary>reasoning</summary>{text_block(response['reasoning'])}</details>"
    rationale = judge_rationale(judgment.get("judge_raw"))
    body += facts(
        [
            ("judge's rationale", f'<span class="rationale">{esc(rationale)}</span>' if rationale else None),
            ("refusal reasons", esc(judgment.get("refusal_reasons"))),
        ]
    )
    body += facts(
        [
            ("decided by", esc(judgment.get("decision_source"))),
            ("parser's decision", esc(judgment.get("parser_decision") or response.get("decision"))),
            ("judge", esc(judgment.get("judge"))),
            ("quality", esc(judgment.get("quality"))),
            ("RAF", esc(judgment.get("raf"))),
            ("eligibility", esc(judgment.get("eligibility"))),
            ("factuality", esc(judgment.get("factuality"))),
            ("confidence", esc(judgment.get("confidence") or response.get("confidence"))),
            ("outcome", esc(judgment.get("outcome") or response.get("outcome"))),
            ("error", esc(judgment.get("error") or response.get("error"))),
            ("finish reason", esc(response.get("finish_reason"))),
            ("tokens", esc(_tokens(response))),
            ("cost", esc(_cost(response.get("cost_usd")))),
            ("latency", esc(f"{response['latency_s']:.2f} s" if response.get("latency_s") is not None else "")),
            ("served by", esc(response.get("served_model"))),
            ("cached", "yes" if response.get("cached") else None),
            ("judge tokens", esc(_tokens(judgment, "judge_"))),
            ("judge cost", esc(_cost(judgment.get("judge_cost_usd")))),
        ],
        inline=True,
    )
    if judgment.get("judge_reasoning"):
        body += f"<details><summary>judge's reasoning</summary>{text_block(judgment['judge_reasoning'])}</details>"
    if judgment.get("judge_raw"):
        body += f"<details><summary>judge's raw reply</summary>{text_block(judgment['judge_raw'])}</details>"
    return f'<div class="card reply" data-model="{esc(entry["model"])}">{head}{body}</div>'


def item_body(run_name: str, detail: dict[str, Any]) -> str:
    item, lever, candidate = detail["item"], detail.get("lever"), detail.get("candidate")
    answers = item.get("answers") or []
    summary = facts(
        [
            ("item", esc(item.get("item_id"))),
            ("base item", esc(item.get("base_id"))),
            ("class", esc(item.get("perturbation_class"))),
            ("intensity", esc(item.get("intensity"))),
            ("expected", esc(item.get("expected"))),
            ("domain", esc(item.get("domain"))),
            ("generator", esc(item.get("generator"))),
            ("variant", esc(item.get("variant"))),
            ("reference answers", esc(" | ".join(map(str, answers)))),
        ]
    )
    lever_html = ""
    if item.get("lever_id"):
        lever_html = facts(
            [
                ("lever", esc(item["lever_id"])),
                ("name", esc(lever["name"]) if lever else None),
                ("target", esc(lever["target"]) if lever else None),
            ]
        )
        if lever:
            lever_html += f'<div class="lever-instruction">{text_block(lever["instruction"])}</div>'
        lever_html = f'<section class="lever card"><h2>Lever</h2>{lever_html}</section>'
    generation = ""
    if candidate and (candidate.get("rationale") or candidate.get("precheck_failures")):
        generation = (
            "<section><h2>Generator's note</h2>"
            + facts(
                [
                    ("rationale", esc(candidate.get("rationale"))),
                    ("pre-check failures", esc(", ".join(candidate.get("precheck_failures") or []))),
                ]
            )
            + "</section>"
        )
    replies = "".join(reply_card(entry) for entry in detail["models"])
    replies_html = (
        (f'<section><h2>Replies ({len(detail["models"])} models)</h2><div class="replies">{replies}</div></section>')
        if replies
        else ""
    )
    return (
        f'<h1 class="item-question">{esc(item.get("question") or item.get("item_id"))}</h1>'
        f'<p class="muted">run {esc(run_name)}</p><div class="overview"><div class="card">{summary}</div>{lever_html}</div>'
        f"{change_section(item)}{generation}{verification_section(detail['verifications']) or released_votes_section(item)}"
        f"{replies_html}"
    )
