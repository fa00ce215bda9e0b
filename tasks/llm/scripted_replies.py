"""The scripted model server's replies: what a request asks for, and the replies a dry run gives.

Responders read every request in the chat-completions shape (``scripted_server`` translates an
Anthropic request first) and return the reply's text; they depend only on the request, so a
second run is served from the call cache like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable

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


# The last lines of a KnowOrNot evaluator prompt list the allowed verdicts as <tag>label</tag>.
_LABEL_LINE = re.compile(r"^<([A-Za-z_][\w-]*)>([^<>\n]+)</\1>\s*$", re.MULTILINE)


def dry_run_responder(request: dict[str, Any]) -> str:
    """A plausible reply for any role, decided by the request alone (see the module docstring)."""
    fingerprint = request_fingerprint(request)
    schema = ((request.get("response_format") or {}).get("json_schema") or {}).get("schema")
    if isinstance(schema, dict):
        return json.dumps(example_for_schema(schema, f"scripted {fingerprint[:6]}"))
    labels = _LABEL_LINE.findall(last_user_text(request))
    if labels:
        tag = labels[-1][0]
        choices = [label for name, label in labels if name == tag]
        # Spread the verdicts over the labels, so a dry run reaches every branch that depends on them.
        return f"Scripted verdict. <{tag}>{choices[int(fingerprint, 16) % len(choices)]}</{tag}>"
    return f"Scripted answer {fingerprint[:6]}."
