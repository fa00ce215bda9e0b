"""The scripted model server's replies: what a request asks for, and the replies a dry run gives.

A judge request (its schema has a ``classification``) is answered with a deterministic
classification of the reply it shows (:func:`scripted_classification`), so scripted runs exercise
the judge's answer-vs-refusal decision.

Responders read every request in the chat-completions shape (``scripted_server`` translates an
Anthropic request first) and return the reply's text; they depend only on the request, so a
second run is served from the call cache like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable

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
    "cannot answer", "can't answer", "cannot be answered", "unable to answer", "does not say", "doesn't say",
    "does not mention", "doesn't mention", "not in the context", "not mentioned", "no information",
    "not enough information", "i don't know", "i do not know",
)
PROSE_REFUSAL_CODE = next(c for c in JUDGE_CLASSIFICATIONS if "INFO_MISSING" in c)


def _classification_of_code(token: str) -> str | None:
    """The judge classification a code spelling names (``REFUSE_MISSING`` -> ..._INFO_MISSING_IN_CONTEXT)."""
    token = token.upper()
    refusals = JUDGE_CLASSIFICATIONS[1:]
    return (next((c for c in refusals if c.startswith(token)), None)
            or next((c for c in refusals if token.removeprefix("REFUSE_") in c), None))


def scripted_classification(response: str) -> tuple[str, str]:
    """(classification, refusal reasons) the scripted judge gives a reply, decided by its text alone.

    A known refusal code that opens or closes the reply (after markup and a final CONFIDENCE line
    are stripped) makes it that refusal; a code quoted inside an answer does not. Without such a
    code, prose that declines (:data:`PROSE_REFUSALS`) is a refusal for missing information;
    anything else is an answer attempt.
    """
    body = _FINAL_CONFIDENCE_LINE.sub("", "\n" + (response or "").strip()).strip(_MARKUP)
    codes = [(m, _classification_of_code(m.group(1))) for m in _CODE_TOKEN.finditer(body)]
    codes = [(m, code) for m, code in codes if code]
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
