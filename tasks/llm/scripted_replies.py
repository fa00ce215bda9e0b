"""The scripted model server's replies: what a request asks for, and the replies a dry run gives.

A judge request (its schema has a ``classification``) is answered with a deterministic
classification of the reply it shows (:func:`scripted_classification`), so scripted runs exercise
the judge's answer-vs-refusal decision. An edit-style generator request gets edits that quote the
item it shows (:func:`scripted_generator_reply`, which also answers full-rewrite generator
requests with the same change for ``scripted_generator_responder``).

Responders read every request in the chat-completions shape (``scripted_server`` translates an
Anthropic request first) and return the reply's text; they depend only on the request, so a
second run is served from the call cache like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from refusalbench.tasks.llm.structured_outputs import ANSWER_ATTEMPT, JUDGE_CLASSIFICATIONS

Responder = Callable[[dict[str, Any]], str]


def last_user_text(request: dict[str, Any]) -> str:
    for message in reversed(request.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def request_fingerprint(request: dict[str, Any]) -> str:
    blob = json.dumps({"model": request.get("model"), "messages": request.get("messages")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def requested_schema(request: dict[str, Any]) -> str | None:
    """The name of the JSON schema a request asks for (e.g. ``VerifierOutput``), if any."""
    fmt = request.get("response_format") or {}
    return (fmt.get("json_schema") or {}).get("name")


def fenced(text: str, tag: str) -> list[str]:
    """Contents of <tag ...>...</tag> blocks in a rendered prompt."""
    return [m.strip() for m in re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", text, flags=re.DOTALL)]


def echo_responder(request: dict[str, Any]) -> str:
    return "echo: " + last_user_text(request)[:200]


def example_for_schema(schema: dict[str, Any], label: str = "scripted") -> Any:
    """The smallest value that satisfies a (references-inlined) JSON schema.

    Booleans are true and enums take their first value, so verifiers say PASS; numbers take their
    minimum; strings carry ``label`` so replies to different requests differ.
    """
    if "enum" in schema:
        return schema["enum"][0]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return example_for_schema(next((o for o in options if o.get("type") != "null"), options[0]), label)
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: example_for_schema(sub, f"{label} {name}") for name, sub in properties.items()}
    if kind == "array":
        count = max(1, schema.get("minItems", 1))
        return [example_for_schema(schema.get("items", {}), f"{label} {i + 1}") for i in range(count)]
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    if kind == "null":
        return None
    return label


# ----------------------------------------------------------------- the scripted judge's classification

_CODE_TOKEN = re.compile(r"(?<![A-Za-z0-9])(REFUSE_[A-Za-z_]*[A-Za-z])(?![A-Za-z0-9])", re.IGNORECASE)
_FINAL_CONFIDENCE_LINE = re.compile(r"\n[^\n]*confidence[^\n]*[:=][^\n]*\s*\Z", re.IGNORECASE)
_MARKUP = " \t\r\n*_`\"'.,;:!()[]{}<>#-"
# Prose a scripted target uses to refuse without a code.
PROSE_REFUSALS: tuple[str, ...] = (
    "cannot answer",
    "can't answer",
    "cannot be answered",
    "unable to answer",
    "does not say",
    "doesn't say",
    "does not mention",
    "doesn't mention",
    "not in the context",
    "not mentioned",
    "no information",
    "not enough information",
    "i don't know",
    "i do not know",
)
PROSE_REFUSAL_CODE = next(c for c in JUDGE_CLASSIFICATIONS if "INFO_MISSING" in c)


def _classification_of_code(token: str) -> str | None:
    """The judge classification a code spelling names (``REFUSE_MISSING`` -> ..._INFO_MISSING_IN_CONTEXT)."""
    token = token.upper()
    refusals = JUDGE_CLASSIFICATIONS[1:]
    return next((c for c in refusals if c.startswith(token)), None) or next(
        (c for c in refusals if token.removeprefix("REFUSE_") in c), None
    )


def scripted_classification(response: str) -> tuple[str, str]:
    """(classification, refusal reasons) the scripted judge gives a reply, decided by its text alone.

    A known refusal code that opens or closes the reply (after markup and a final CONFIDENCE line
    are stripped) makes it that refusal; a code quoted inside an answer does not. Without such a
    code, prose that declines (:data:`PROSE_REFUSALS`) is a refusal for missing information;
    anything else is an answer attempt.
    """
    body = _FINAL_CONFIDENCE_LINE.sub("", "\n" + (response or "").strip()).strip(_MARKUP)
    spelled = [(m, _classification_of_code(m.group(1))) for m in _CODE_TOKEN.finditer(body)]
    codes = [(m, code) for m, code in spelled if code]
    if codes and codes[-1][0].end() == len(body):
        return codes[-1][1], "the reply ends with its refusal code"
    if codes and codes[0][0].start() == 0:
        return codes[0][1], "the reply opens with its refusal code"
    if any(phrase in body.lower() for phrase in PROSE_REFUSALS):
        return PROSE_REFUSAL_CODE, "the reply says the information is not in the context"
    return ANSWER_ATTEMPT, ""


def scripted_judge_reply(request: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` (a judge's JSON object) with the scripted classification of the request's response."""
    responses = fenced(last_user_text(request), "response")
    classification, reasons = scripted_classification(responses[-1] if responses else "")
    return {**reply, "classification": classification, "refusal_reasons": reasons}


# The last lines of a KnowOrNot evaluator prompt list the allowed verdicts as <tag>label</tag>.
_LABEL_LINE = re.compile(r"^<([A-Za-z_][\w-]*)>([^<>\n]+)</\1>\s*$", re.MULTILINE)


def dry_run_responder(request: dict[str, Any]) -> str:
    """A plausible reply for any role, decided by the request alone (see the module docstring)."""
    if requested_schema(request) in GENERATOR_EDIT_SCHEMAS:  # edits must quote the item to apply
        return scripted_generator_reply(request) or ""
    fingerprint = request_fingerprint(request)
    schema = ((request.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if isinstance(schema, dict):
        example = example_for_schema(schema, f"scripted {fingerprint[:6]}")
        if "classification" in schema.get("properties", {}):  # a judge: classify the reply it was shown
            example = scripted_judge_reply(request, example)
        return json.dumps(example)
    labels = _LABEL_LINE.findall(last_user_text(request))
    if labels:
        tag = labels[-1][0]
        choices = [label for name, label in labels if name == tag]
        # Spread the verdicts over the labels, so a dry run reaches every branch that depends on them.
        return f"Scripted verdict. <{tag}>{choices[int(fingerprint, 16) % len(choices)]}</{tag}>"
    return f"Scripted answer {fingerprint[:6]}."


# ----------------------------------------------------------------- the scripted generator (full rewrite or edits)

GENERATOR_SCHEMAS: tuple[str, ...] = ("GeneratorSingleOutput", "GeneratorMultiOutput")
GENERATOR_EDIT_SCHEMAS: tuple[str, ...] = ("GeneratorSingleEdit", "GeneratorMultiEdit")
SCRIPTED_CONTEXT_CHANGE = "Accounts of this differ."
SCRIPTED_NEW_PASSAGE = "Another source gives a different account of this."
_PASSAGE_FENCE = re.compile(r'<passage index="(\d+)" relevant="(true|false)">\n(.*?)\n</passage>', re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _prompt_field(text: str, pattern: str) -> str:
    match = re.search(pattern, text)
    return match.group(1).strip() if match else ""


def _unique_opening(text: str) -> str:
    """The shortest run of opening words that occurs once in ``text`` (an edit's ``find``)."""
    words = text.split(" ")
    for count in range(1, len(words) + 1):
        opening = " ".join(words[:count])
        if text.count(opening) == 1:
            return opening
    return text


def _scripted_edits(text: str, change_question: bool, question: str) -> dict[str, Any]:
    """What the scripted generator changes: the question's opening words (when the lever may change the
    question) and the first sentence of the text it edits (when the lever may change the context)."""
    edits: dict[str, Any] = {"question": [], "text": []}
    if change_question:
        opening = _unique_opening(question)
        edits["question"].append(
            {"find": opening, "replace": "In the text given, " + opening[:1].lower() + opening[1:]}
        )
    if text:
        edits["text"].append({"find": _SENTENCE_END.split(text.strip(), 1)[0], "replace": SCRIPTED_CONTEXT_CHANGE})
    return edits


def _spliced(text: str, edits: list[dict[str, str]]) -> str:
    for edit in edits:
        text = text.replace(edit["find"], edit["replace"], 1)
    return text


def scripted_generator_reply(request: dict[str, Any]) -> str | None:
    """The scripted generator's reply to a generator request, as a full rewrite or as edits (whichever
    schema the request asks for); None for any other request.

    Both styles carry the same change, so a run in either style yields the same candidates: the
    question's opening words reworded unless the lever is context-only, the first sentence of the
    context (multi: of the first relevant passage) replaced unless it is question-only, and for a
    HIGH lever on passages one new relevant passage.
    """
    schema = requested_schema(request)
    if schema not in GENERATOR_SCHEMAS + GENERATOR_EDIT_SCHEMAS:
        return None
    prompt = last_user_text(request)
    where = _prompt_field(prompt, r"Where to make the change: ([^\n(]*)")
    question = (fenced(prompt, "question") or [""])[0]
    passages = [(int(n), flag == "true", body) for n, flag, body in _PASSAGE_FENCE.findall(prompt)]
    multi = schema in ("GeneratorMultiOutput", "GeneratorMultiEdit")
    target = next((n for n, relevant, _ in passages if relevant), passages[0][0] if passages else 1)
    text = (
        dict((n, body) for n, _, body in passages).get(target, "") if multi else (fenced(prompt, "context") or [""])[0]
    )
    edits = _scripted_edits(
        "" if where.endswith("question only") else text, not where.endswith(("context only", "passages only")), question
    )
    new_passages = (
        [{"text": SCRIPTED_NEW_PASSAGE, "relevant": True}]
        if multi and _prompt_field(prompt, r"Intensity: (\w+)") == "HIGH" and edits["text"]
        else []
    )
    tail = {
        "lever_applied": _prompt_field(prompt, r"- Name: ([^\n]*)"),
        "rationale": "Scripted: the opening of the question or the context was reworded.",
        "answer_constraint_holds": True,
        "expected_behaviour": _prompt_field(prompt, r"should respond with: (\S+)"),
    }
    if schema == "GeneratorSingleEdit":
        return json.dumps({"question_edits": edits["question"], "context_edits": edits["text"], **tail})
    if schema == "GeneratorMultiEdit":
        return json.dumps(
            {
                "question_edits": edits["question"],
                "passage_edits": [{"passage": target, **edit} for edit in edits["text"]],
                "new_passages": new_passages,
                **tail,
            }
        )
    new_question = _spliced(question, edits["question"])
    if schema == "GeneratorSingleOutput":
        return json.dumps(
            {"perturbed_question": new_question, "perturbed_context": _spliced(text, edits["text"]), **tail}
        )
    full = [
        {"index": n, "text": _spliced(body, edits["text"]) if n == target else body, "relevant": relevant}
        for n, relevant, body in passages
    ]
    full += [{"index": len(passages) + i, **new} for i, new in enumerate(new_passages, 1)]
    return json.dumps({"perturbed_question": new_question, "passages": full, **tail})


def scripted_generator_responder(request: dict[str, Any]) -> str:
    """Generators answered by :func:`scripted_generator_reply`, every other role by the dry run's replies."""
    return scripted_generator_reply(request) or dry_run_responder(request)
