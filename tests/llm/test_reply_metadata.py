"""A reply's metadata travels with it, and decisions and structured outputs read its final answer only.

Flow-level tests drive ``evaluate`` against the scripted server, each target or judge a scripted
model with one provider behaviour (tasks/llm/provider_wire.py), through the gateway's direct
HTTP path (``openai/<name>``), LiteLLM's real OpenAI adapter (``openai/gpt-...``: an OpenAI family
name never takes the direct path) and LiteLLM's real Anthropic adapter (``anthropic/<name>``).
"""

from __future__ import annotations

import json
import re
import sqlite3

import pandas as pd
import pytest

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm import gateway_sending
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import REPLY_METADATA, CallResult, Gateway, request_key
from refusalbench.tasks.llm.providers import profile_for, reasoning_mode
from refusalbench.tasks.llm.reasoning import split_reasoning, split_think_tags
from refusalbench.tasks.llm.scripted_server import (
    Behaviour,
    ScriptedLLMServer,
    fenced,
    last_user_text,
    requested_schema,
)
from refusalbench.tasks.llm.structured_outputs import JudgeSingleOutput, parse_output
from refusalbench.tasks.refusalbench.decisions import parse_decision
from refusalbench.tasks.refusalbench.report.responses import responses_section
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Judgment, Response
from tests.pipeline.test_evaluation_flow import ITEMS
from tests.scripted import judge_by_reference

# Reasoning that names a refusal code (the wrong one for every item) and carries markup to escape.
REASONING = "Is the context enough? Maybe I should reply REFUSE_FALSE_PREMISE <b>&</b>. No: it is stated."
REASONING_WORDS = len(REASONING.split())


# ---------------------------------------------------------------- splitting and parsing


@pytest.mark.parametrize(
    "text, answer, reasoning",
    [
        ("<think>\nR REFUSE_AMBIGUOUS\n</think>\n\nIt is ref0.", "It is ref0.", "R REFUSE_AMBIGUOUS"),
        ("R REFUSE_AMBIGUOUS\n</think>\n\nIt is ref0.", "It is ref0.", "R REFUSE_AMBIGUOUS"),  # template opened the tag
        ("<THINK>a</THINK><think>b</think> It is ref0.", "It is ref0.", "ab"),
        ("<think>\nthe budget ran out", "", "the budget ran out"),
        ("It is ref0.", "It is ref0.", None),
        ("I would say <think> is a tag. It is ref0.", "I would say <think> is a tag. It is ref0.", None),
    ],
)
def test_inline_reasoning_is_split_off_the_answer(text, answer, reasoning):
    assert split_think_tags(text) == (answer, reasoning)


def test_the_reasoning_mode_decides_what_is_split():
    text = "<think>draft</think>\n\nfinal"
    assert split_reasoning(text, None, "think_tags") == ("final", "draft")
    assert split_reasoning(text, None, "field") == (text, None)
    assert split_reasoning(text, None, "none") == (text, None)
    # The reasoning field is kept in every mode; a blank one is none.
    assert split_reasoning("\n\nfinal", "field says", "field") == ("final", "field says")
    assert split_reasoning(text, "field says", "think_tags") == ("final", "field says\n\ndraft")
    assert split_reasoning("final", "  ", "field") == ("final", None)
    assert split_reasoning(None, None, "think_tags") == (None, None)


def test_each_provider_profile_has_a_reasoning_default_a_model_may_override():
    servers = ModelConfig(model="openai/qwen3", api_base="http://127.0.0.1:1/v1")
    assert reasoning_mode(servers, profile_for(servers.model, servers.api_base)) == "think_tags"
    for model in ("openai/gpt-4o", "anthropic/claude-x", "gemini/gemini-2.5-pro"):
        assert reasoning_mode(ModelConfig(model=model), profile_for(model)) == "field"
    for model in ("deepseek/deepseek-reasoner", "together_ai/x", "ollama/qwen3", "hosted_vllm/x"):
        assert profile_for(model, "http://h/v1").reasoning == "think_tags"
    claude = ModelConfig(model="anthropic/claude-x", reasoning="think_tags")
    assert reasoning_mode(claude, profile_for(claude.model)) == "think_tags"
    with pytest.raises(ValueError):
        ModelConfig(model="openai/x", reasoning="tags")


def test_the_decision_reads_the_final_answer_only():
    raw = f"<think>\n{REASONING}\n</think>\n\nIt is ref0."
    assert parse_decision(raw) == "REFUSE_FALSE_PREMISE_IN_QUERY"  # what reading the raw text did
    answer, _ = split_reasoning(raw, None, "think_tags")
    assert parse_decision(answer) == "ANSWER"


DRAFT, FINAL = '{"quality": 1, "rationale": "draft"}', '{"quality": 5, "rationale": "final"}'


@pytest.mark.parametrize(
    "reply",
    [
        f"<think>\nFirst try: {DRAFT}\n</think>\n\n{FINAL}",
        f"Draft:\n```json\n{DRAFT}\n```\nCorrected:\n```json\n{FINAL}\n```",
        f"{DRAFT} on second thought {FINAL} (a note {{not json}})",
        f'{{"outer": {DRAFT}}} and then {FINAL}',
    ],
)
def test_the_structured_parser_prefers_the_last_valid_object(reply):
    parsed, error = parse_output(JudgeSingleOutput, reply)
    assert error is None and parsed == JudgeSingleOutput(quality=5, rationale="final")


def test_the_last_object_is_found_after_many_brackets():
    reply = "{x} " * 300 + FINAL  # more opening brackets than the scan starts from the front
    assert parse_output(JudgeSingleOutput, reply)[0].quality == 5
    # An enclosing object that fits wins over the objects inside it, which end before it.
    nested = '{"quality": 4, "rationale": "{\\"quality\\": 1}"}'
    assert parse_output(JudgeSingleOutput, nested)[0].quality == 4


# ---------------------------------------------------------------- the gateway, both paths


def _gateway(server: ScriptedLLMServer, tmp_path, **models: dict) -> Gateway:
    configs = {
        name: ModelConfig(**({"model": f"openai/{name}", "api_base": server.url} | fields))
        for name, fields in models.items()
    }
    return Gateway(configs, SQLiteCache(tmp_path / "calls.sqlite"), backoff_base_s=0.01)


@pytest.mark.parametrize("model", ["local-r1", "gpt-r1"])  # direct path, LiteLLM's OpenAI adapter
def test_both_paths_bring_back_the_same_metadata(tmp_path, model):
    with ScriptedLLMServer(responder=lambda request: "It is ref0.") as server:
        server.behaviours[model] = Behaviour(
            reasoning=REASONING, reasoning_in="reasoning_field", served_model="r1-2025-05-28", system_fingerprint="fp_1"
        )
        gateway = _gateway(server, tmp_path, **{model: {}})
        spy = []
        real = gateway_sending.litellm_completion
        gateway_sending.litellm_completion = lambda *a, **k: spy.append(a) or real(*a, **k)
        try:
            result = gateway.complete(model, [{"role": "user", "content": "Q?"}])
        finally:
            gateway_sending.litellm_completion = real
    assert bool(spy) == model.startswith("gpt-")
    assert result.ok and result.text == "It is ref0."
    assert result.metadata() == {
        "finish_reason": "stop",
        "reasoning": REASONING,
        "reasoning_tokens": REASONING_WORDS,
        "served_model": "r1-2025-05-28",
        "system_fingerprint": "fp_1",
    }
    assert result.completion_tokens == REASONING_WORDS + 3


def test_an_old_cache_entry_without_the_new_fields_still_serves(tmp_path):
    with ScriptedLLMServer() as server:
        gateway = _gateway(server, tmp_path, old={})
        messages = [{"role": "user", "content": "Q?"}]
        key = request_key(gateway.models["old"], messages, {}, None)
        # The layout the cache had before replies carried their metadata, inline reasoning left in the text.
        gateway.cache.put(
            key,
            {
                "text": f"<think>{REASONING}</think>\n\nIt is ref0.",
                "latency_s": 0.1,
                "prompt_tokens": 5,
                "completion_tokens": 20,
                "cost_usd": None,
                "created_at": 0.0,
            },
        )
        result = gateway.complete("old", messages)
        assert server.calls == []
    assert result.ok and result.cached and result.text == "It is ref0." and result.reasoning == REASONING
    assert result.finish_reason is None and result.served_model is None and result.reasoning_tokens is None
    assert (result.prompt_tokens, result.completion_tokens) == (5, 20)


def test_the_cache_keeps_the_text_as_it_came_so_the_mode_applies_when_read(tmp_path):
    with ScriptedLLMServer(responder=lambda request: "It is ref0.") as server:
        server.behaviours["r1"] = Behaviour(reasoning=REASONING, reasoning_in="think_tags")
        split = _gateway(server, tmp_path, r1={}).complete("r1", [{"role": "user", "content": "Q?"}])
        kept = _gateway(server, tmp_path, r1={"reasoning": "none"}).complete("r1", [{"role": "user", "content": "Q?"}])
        assert len(server.calls) == 1
    assert (split.text, split.reasoning) == ("It is ref0.", REASONING)
    assert kept.cached and kept.text == f"<think>\n{REASONING}\n</think>\n\nIt is ref0." and kept.reasoning is None
    # Inline reasoning is billed as plain output: its token count is unknown, not 0.
    assert split.reasoning_tokens is None


def test_records_carry_the_metadata_and_old_tables_still_read(tmp_path):
    result = CallResult(
        model="m",
        key="k",
        text="x",
        finish_reason="length",
        reasoning="r",
        reasoning_tokens=3,
        served_model="s",
        system_fingerprint="f",
    )
    assert set(Response.model_fields) >= set(REPLY_METADATA)
    assert set(Judgment.model_fields) >= {f"judge_{name}" for name in REPLY_METADATA}
    assert (
        Judgment(item_id="i", model="m", expected="E", decision=None, **result.metadata("judge_")).judge_reasoning
        == "r"
    )
    # A responses table written before these columns existed reads with them absent.
    store = ArtifactStore(tmp_path)
    old = pd.DataFrame({"item_id": ["i"], "model": ["m"], "raw": ["x"], "decision": ["ANSWER"], "cached": [False]})
    old.to_parquet(tmp_path / "responses.parquet")
    (row,) = store.read_records("responses.parquet", Response)
    assert row.reasoning is None and row.finish_reason is None and row.raw == "x"


def test_the_report_section_escapes_reasoning_and_totals_reasoning_tokens():
    frame = pd.DataFrame(
        [
            {
                "item_id": "i1",
                "model": "m",
                "raw": "It is <x>.",
                "decision": "ANSWER",
                "completion_tokens": 20,
                "finish_reason": "stop",
                "reasoning": "<script>alert(1)</script>",
                "reasoning_tokens": 15,
            },
            {
                "item_id": "i2",
                "model": "m",
                "raw": "REFUSE_MISSING",
                "decision": "REFUSE_INFO_MISSING_IN_CONTEXT",
                "completion_tokens": 5,
                "finish_reason": "stop",
                "reasoning": None,
                "reasoning_tokens": 0,
            },
            {"item_id": "i1", "model": "old", "raw": "y", "decision": "ANSWER"},  # an older folder's row: no metadata
        ]
    )
    html = responses_section(frame, ["m", "old"])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<details><summary>reasoning (15 tokens)</summary>" in html and "It is &lt;x&gt;." in html
    assert "<td>15</td><td>7.5</td><td>60.0%</td>" in html  # total, per reply, share of 25 completion tokens
    assert responses_section(None, []) is None


# ---------------------------------------------------------------- flows


def _answer_right(request) -> str:
    """The right final answer to every item of ``ITEMS``: the reference, or the expected code."""
    text = last_user_text(request)
    number = int(re.search(r"What is item (\d+)\?", text).group(1))
    item = ITEMS[number]
    return f"It is {item.answers[0]}." if item.expected == "ANSWER_CORRECTLY" else item.expected


def _config(tmp_path, server, models: dict[str, dict], targets: list[str], judge: str, name: str) -> str:
    entries = "".join(f"  {label}: {json.dumps({'max_attempts': 2} | fields)}\n" for label, fields in models.items())
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"models:\n{entries}cache:\n  path: {json.dumps(str(tmp_path / 'calls.sqlite'))}\n"
        f"evaluation:\n  targets: {json.dumps(targets)}\n  judge: {judge}\n  bootstrap: 50\n"
    )
    return str(path)


def _openai(server, name, **fields) -> dict:
    return {"model": f"openai/{name}", "api_base": server.url, **fields}


def _anthropic(server, name, **fields) -> dict:
    return {"model": f"anthropic/{name}", "api_base": server.anthropic_url, **fields}


@pytest.fixture
def benchmark(tmp_path):
    return ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)


# target label -> (model entry, behaviour, where its reasoning lands)
def _targets(server) -> dict[str, tuple[dict, Behaviour | None]]:
    inline, r1 = (
        Behaviour(reasoning=REASONING, reasoning_in="think_tags"),
        Behaviour(reasoning=REASONING, reasoning_in="think_end_only"),
    )
    return {
        "plain": (_openai(server, "plain"), None),
        "inline-direct": (_openai(server, "inline-direct"), inline),
        "r1-direct": (_openai(server, "r1-direct"), r1),
        "field-direct": (
            _openai(server, "field-direct"),
            Behaviour(reasoning=REASONING, served_model="ds-r1-0528", system_fingerprint="fp_ds"),
        ),
        "inline-litellm": (_openai(server, "gpt-inline"), inline),
        "r1-litellm": (_openai(server, "gpt-r1"), r1),
        "field-litellm": (_openai(server, "gpt-field"), Behaviour(reasoning=REASONING, reasoning_in="reasoning_field")),
        "inline-anthropic": (_anthropic(server, "claude-inline", reasoning="think_tags"), inline),
        "thinking-anthropic": (_anthropic(server, "claude-thinking"), Behaviour(reasoning=REASONING)),
    }


@pytest.mark.usefixtures("prefect_harness")
def test_a_reasoning_target_with_right_answers_scores_like_the_same_answers_without_reasoning(
    tmp_path, fake_llm, benchmark
):
    from refusalbench.flows.launch import run_evaluation

    targets = _targets(fake_llm)
    fake_llm.responder = lambda request: (
        judge_by_reference(request) if requested_schema(request) else _answer_right(request)
    )
    fake_llm.behaviours.update({entry["model"].split("/", 1)[1]: b for entry, b in targets.values() if b})
    models = {label: entry for label, (entry, _) in targets.items()} | {"judge": _openai(fake_llm, "judge")}
    out = tmp_path / "eval"
    run_evaluation(_config(tmp_path, fake_llm, models, list(targets), "judge", "eval"), str(benchmark), str(out))

    metrics = json.loads((out / "metrics.json").read_text())["models"]
    assert metrics["plain"]["answer_accuracy"] == 1.0 and metrics["plain"]["refusal_accuracy"] == 1.0
    for label in targets:
        assert metrics[label] == metrics["plain"], label

    responses = pd.read_parquet(out / "responses.parquet").set_index(["model", "item_id"]).sort_index()
    assert (responses["decision"].groupby("model").apply(list).map(tuple).nunique()) == 1
    assert not responses["raw"].str.contains("think|REFUSE_FALSE_PREMISE").any()  # answers only
    reasoned = responses.drop(index="plain", level="model")
    assert (reasoned["reasoning"] == REASONING).all() and responses.loc["plain", "reasoning"].isna().all()
    tokens = responses["reasoning_tokens"].groupby("model").first()
    assert tokens["field-direct"] == tokens["field-litellm"] == REASONING_WORDS
    assert tokens["thinking-anthropic"] > 0  # Anthropic counts none: LiteLLM's estimate
    assert pd.isna(tokens["inline-direct"]) and pd.isna(tokens["inline-anthropic"])  # inline: not counted
    assert set(responses["finish_reason"]) == {"stop"}
    field = responses.loc["field-direct"]
    assert set(field["served_model"]) == {"ds-r1-0528"} and set(field["system_fingerprint"]) == {"fp_ds"}
    assert set(responses.loc["thinking-anthropic", "served_model"]) == {"claude-thinking"}
    # The judge saw the final answers only, and its own metadata is in judgments.parquet.
    judged_texts = [fenced(last_user_text(c), "response")[0] for c in fake_llm.calls_for("judge")]
    assert judged_texts and not any("REFUSE" in text or "think" in text for text in judged_texts)
    judgments = pd.read_parquet(out / "judgments.parquet")
    asked = judgments[judgments["judge"].notna()]
    assert len(asked) == 4 * len(targets) and set(asked["judge_finish_reason"]) == {"stop"}
    assert set(asked["judge_served_model"]) == {"judge"}

    report = (out / "report.html").read_text()
    assert "Replies and reasoning" in report and report.count("<details><summary>reasoning") >= 5 * (len(targets) - 1)
    assert REASONING not in report and "REFUSE_FALSE_PREMISE &lt;b&gt;&amp;&lt;/b&gt;" in report
    replies = report[report.index("<h2>Replies and reasoning</h2>") :]  # the section, not its contents link
    row = re.search(r"<tr><td class='name'>field-direct</td>(.*?)</tr>", replies).group(1)
    assert f"<td>{10 * REASONING_WORDS}</td>" in row  # reasoning tokens per model

    # Cache entries written before replies carried metadata still serve: strip the new fields, re-run.
    with sqlite3.connect(tmp_path / "calls.sqlite") as db:
        rows = db.execute("SELECT key, value FROM calls").fetchall()
        db.executemany(
            "UPDATE calls SET value = ? WHERE key = ?",
            [
                (json.dumps({k: v for k, v in json.loads(value).items() if k not in REPLY_METADATA}), key)
                for key, value in rows
            ],
        )
    before = len(fake_llm.calls)
    again = tmp_path / "again"
    run_evaluation(_config(tmp_path, fake_llm, models, list(targets), "judge", "eval"), str(benchmark), str(again))
    # Every target reply comes from the cache. The judge is asked again only about answers whose old
    # entry lost the reasoning LiteLLM split off itself: the answer keeps LiteLLM's leading blank
    # lines then, as it did before these fields existed, so the judge's request is not the same.
    assert {c["model"] for c in fake_llm.calls[before:]} <= {"judge"}
    assert json.loads((again / "metrics.json").read_text())["models"] == metrics
    old = pd.read_parquet(again / "responses.parquet").set_index(["model", "item_id"])
    assert old["finish_reason"].isna().all() and old.loc["field-direct", "reasoning"].isna().all()
    assert (old.loc["inline-direct", "reasoning"] == REASONING).all()  # inline reasoning is split as it is read


def _draft_then_verdict(request) -> str:
    """The judge's reasoning: a draft verdict, the opposite of the one it ends with."""
    final = json.loads(judge_by_reference(request))
    flipped = (
        {"quality": 6 - final["quality"]}
        if "quality" in final
        else {name: 1 - final[name] for name in ("eligibility", "factuality", "raf")}
    )
    draft = {**final, **flipped, "rationale": "draft"}
    return f"Let me draft it: {json.dumps(draft)} Hmm, no."


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(
    "judge, entry",
    [
        ("judge-direct", {}),  # split off by the gateway
        ("gpt-judge", {}),  # LiteLLM's OpenAI adapter splits the leading block itself
        ("judge-unsplit", {"reasoning": "none"}),  # nothing split: the parser takes the last object
    ],
)
def test_a_judge_whose_reasoning_drafts_the_opposite_verdict_is_scored_by_its_final_json(
    tmp_path, fake_llm, benchmark, judge, entry
):
    from refusalbench.flows.launch import run_evaluation

    fake_llm.responder = lambda request: (
        judge_by_reference(request) if requested_schema(request) else _answer_right(request)
    )
    fake_llm.behaviours[judge] = Behaviour(reasoning=_draft_then_verdict, reasoning_in="think_tags")
    models = {"target": _openai(fake_llm, "target"), "judge": _openai(fake_llm, judge, **entry)}
    out = tmp_path / "eval"
    run_evaluation(_config(tmp_path, fake_llm, models, ["target"], "judge", "eval"), str(benchmark), str(out))
    assert json.loads((out / "metrics.json").read_text())["models"]["target"]["answer_accuracy"] == 1.0

    judgments = pd.read_parquet(out / "judgments.parquet")
    asked = judgments[judgments["judge"].notna()]
    assert len(asked) == 4 and asked["answer_correct"].all()
    if entry.get("reasoning") == "none":
        assert asked["judge_raw"].str.startswith("<think>").all() and asked["judge_reasoning"].isna().all()
    else:
        assert not asked["judge_raw"].str.contains("draft").any()
        assert asked["judge_reasoning"].str.contains('"rationale": "draft"').all()
