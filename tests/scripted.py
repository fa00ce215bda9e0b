"""Scripted model behaviour for flow tests: replies decided by model name and request.

The scripted server receives the LiteLLM model string without its provider prefix
(``openai/gen-a`` arrives as ``gen-a``) and the JSON-schema name of the expected output.
The request helpers and the role-aware ``dry_run_responder`` live with the server in the
product (``refusalbench.tasks.llm.scripted_server``); this module adds the tests' own scripts.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from refusalbench.tasks.llm.scripted_server import (
    dry_run_responder,
    fenced,
    last_user_text,
    requested_schema,
    scripted_judge_reply,
)

__all__ = [
    "by_model",
    "dry_run_responder",
    "fenced",
    "generator_reply",
    "intensity_of",
    "judge_by_reference",
    "last_user_text",
    "requested_schema",
    "run_config",
    "verifier_reply",
]


def run_config(
    tmp_path: Path,
    url: str,
    models: Iterable[str],
    sections: str,
    *,
    per_model: dict[str, dict[str, Any]] | None = None,
    **model_fields: Any,
) -> Path:
    """Write ``tmp_path/run.yaml``: each named model served by the scripted server at ``url``
    (plus ``model_fields``, and its own fields in ``per_model``), the call cache inside ``tmp_path``,
    then ``sections`` (YAML)."""
    own = per_model or {}
    entries = "".join(
        f"  {name}: {json.dumps({'model': f'openai/{name}', 'api_base': url, **model_fields, **own.get(name, {})})}\n"
        for name in models
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        f"models:\n{entries}cache:\n  path: {json.dumps(str(tmp_path / 'calls.sqlite'))}\n" + textwrap.dedent(sections)
    )
    return config


def generator_reply(request: dict[str, Any], tweak: str = "") -> str:
    if requested_schema(request) == "GeneratorMultiOutput":
        return json.dumps(
            {
                "perturbed_question": f"Perturbed multi question {tweak}?",
                "passages": [
                    {"index": 1, "text": "Edited passage one.", "relevant": True},
                    {"index": 2, "text": "Noise passage.", "relevant": False},
                ],
                "lever_applied": "x",
                "rationale": "r",
                "answer_constraint_holds": True,
                "expected_behaviour": "x",
            }
        )
    return json.dumps(
        {
            "perturbed_question": f"Perturbed question {tweak}?",
            "perturbed_context": "Perturbed context.",
            "lever_applied": "x",
            "rationale": "r",
            "answer_constraint_holds": True,
            "expected_behaviour": "x",
        }
    )


def verifier_reply(verdict: str) -> str:
    flag = verdict == "PASS"
    return json.dumps(
        {
            name: flag
            for name in (
                "lever_fidelity",
                "intensity_achieved",
                "target_compliance",
                "uncertainty_induced",
                "implementation_quality",
                "answer_constraint",
                "predicted_behaviour",
                "refusal_class_alignment",
            )
        }
        | {"strategy_compliance": flag, "verdict": verdict, "notes": ""}
    )


def intensity_of(request: dict[str, Any]) -> str | None:
    match = re.search(r"Intensity: (LOW|MEDIUM|HIGH)", last_user_text(request))
    return match.group(1) if match else None


def by_model(table: dict[str, Callable[[dict[str, Any]], str]]) -> Callable[[dict[str, Any]], str]:
    def respond(request: dict[str, Any]) -> str:
        return table[request["model"]](request)

    return respond


def judge_by_reference(request: dict[str, Any]) -> str:
    """Scripted judge: quality 5 when the response contains a reference answer, else 1; the
    answer-vs-refusal classification is the scripted server's (``scripted_judge_reply``)."""
    text = last_user_text(request)
    references = fenced(text, "reference_answer")
    (response,) = fenced(text, "response")
    hit = any(ref.lower() in response.lower() for ref in references)
    if requested_schema(request) == "JudgeMultiOutput":
        grade = {"eligibility": int(hit), "factuality": int(hit), "raf": int(hit), "rationale": ""}
    else:
        grade = {"quality": 5 if hit else 1, "rationale": ""}
    return json.dumps(scripted_judge_reply(request, grade))
