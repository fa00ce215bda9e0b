"""The scripted model server as a user feature: its default replies fit every role of a run."""

from __future__ import annotations

import pytest

from refusalbench.tasks.knowornot.stages.evaluation import extract_tag
from refusalbench.tasks.llm import structured_outputs
from refusalbench.tasks.llm.providers import response_format_for
from refusalbench.tasks.llm.scripted_server import dry_run_responder, requested_schema
from refusalbench.tasks.llm.structured_outputs import LLMOutput, json_schema_for, parse_output

SCHEMAS = [
    cls
    for cls in vars(structured_outputs).values()
    if isinstance(cls, type) and issubclass(cls, LLMOutput) and cls is not LLMOutput
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda cls: cls.__name__)
def test_a_structured_request_gets_a_valid_object(schema):
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "response_format": response_format_for("json_schema", schema.__name__, json_schema_for(schema)),
    }
    assert requested_schema(request) == schema.__name__
    parsed, error = parse_output(schema, dry_run_responder(request))
    assert error is None and parsed is not None


def test_an_evaluator_gets_one_of_the_labels_it_lists():
    prompt = "<question>\nq\n</question>\n\nFinish with one of:\n<tier>tier_1</tier>\n<tier>tier_2</tier>\n<tier>tier_3</tier>\n"
    replies = {
        dry_run_responder({"model": "e", "messages": [{"role": "user", "content": prompt + str(i)}]}) for i in range(30)
    }
    labels = {extract_tag(reply, "tier", ["tier_1", "tier_2", "tier_3"])[0] for reply in replies}
    assert labels == {"tier_1", "tier_2", "tier_3"}  # spread over the labels, so every branch is reached


def test_a_free_text_request_gets_the_same_answer_every_time():
    request = {"model": "t", "messages": [{"role": "user", "content": "Where is it?"}]}
    assert dry_run_responder(request) == dry_run_responder(dict(request))
    assert "<" not in dry_run_responder(request)
