"""Provider prompt caching and the run's cost report, on the scripted server.

A shared prefix long enough to cache (a long system prompt; the judge's item part, shared by every
target's reply) goes to Anthropic marked ``cache_control`` through LiteLLM's real Messages API adapter; the scripted server caches marked prefixes as Anthropic does (a write,
then reads) and repeated long prefixes as OpenAI does (automatic, in 128-token steps). Cached
tokens come back, are priced at the cached price and counted as savings in the run's costs; the
call cache key and what a provider without explicit caching receives stay as they were.
"""

from __future__ import annotations

import json

import pytest

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.callcache import open_cache
from refusalbench.tasks.llm.gateway import CallSpec, Gateway, request_key
from refusalbench.tasks.llm.prompt_cache import marked_messages, min_prefix_tokens
from refusalbench.tasks.llm.providers import profile_for
from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer
from refusalbench.tasks.refusalbench.report.cost_section import cost_rows, cost_section

MIN_TOKENS = 30  # the scripted cache's minimum (its words), lowered from 1,024 to keep its arithmetic small
# Over 1,024 tokens as LiteLLM counts them (the gateway marks nothing shorter); 407 of the scripted server's words.
SYSTEM = "Grade the response against the reference answers. " + " ".join(f"rule-{i}" for i in range(400))
SHORT_SYSTEM = "Grade the response against the reference answers."
PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0, "cached_input_per_mtok": 100.0}
MAPPED_CLAUDE = "anthropic/claude-sonnet-4-5-20250929"  # in LiteLLM's map, with cache read and write prices


def prompt(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def server():
    with ScriptedLLMServer() as scripted:
        scripted.prompt_cache.min_tokens = MIN_TOKENS
        yield scripted


def test_anthropic_gets_the_system_prompt_marked_reads_it_cached_and_the_costs_show_the_savings(server, tmp_path):
    models = {
        "claude": ModelConfig(
            model="anthropic/claude-priced", api_base=server.anthropic_url, price=PRICE, params={"max_tokens": 20}
        ),
        "mapped": ModelConfig(model=MAPPED_CLAUDE, api_base=server.anthropic_url, params={"max_tokens": 20}),
    }
    cache = open_cache("sqlite", path=str(tmp_path / "calls.sqlite"))
    gateway = Gateway(models, cache)
    with accounting.stage("judge"):
        first, second = (
            gateway.complete_many([CallSpec(model="claude", messages=prompt("first item"))])[0],
            gateway.complete_many([CallSpec(model="claude", messages=prompt("second item"))])[0],
        )
        mapped = [gateway.complete_many([CallSpec(model="mapped", messages=prompt(q))])[0] for q in ("one", "two")]

    # The request carried cache_control on the system prompt; the prefix was written once, then read.
    calls = server.calls_for("claude-priced")
    assert [c.get("cache_control") for c in calls] == [["system[0]"], ["system[0]"]]
    assert calls[0]["messages"][0] == {"role": "system", "content": SYSTEM}  # the text itself unchanged
    system_tokens = len(SYSTEM.split())
    assert (calls[0].get("cache_written"), first.cached_tokens) == (system_tokens, 0)
    assert second.cached_tokens == system_tokens and "cache_written" not in calls[1]
    assert first.prompt_tokens == second.prompt_tokens == system_tokens + 2  # cached tokens stay prompt tokens

    # Priced at the cached price (the config's), the write at 1.25x the input price.
    assert first.cost_usd == pytest.approx(
        ((first.prompt_tokens + 0.25 * system_tokens) * 1000 + first.completion_tokens * 2000) / 1e6
    )
    assert second.cost_usd == pytest.approx(
        ((second.prompt_tokens - system_tokens) * 1000 + system_tokens * 100 + second.completion_tokens * 2000) / 1e6
    )
    saved = system_tokens * (1000 - 100) / 1e6 - system_tokens * 250 / 1e6  # the read's discount less the write premium

    # Without a config price, LiteLLM's map prices the cached tokens (its cache read and write prices).
    import litellm

    info = litellm.get_model_info(MAPPED_CLAUDE)
    assert mapped[1].cached_tokens == system_tokens
    assert mapped[1].cost_usd == pytest.approx(
        (mapped[1].prompt_tokens - system_tokens) * info["input_cost_per_token"]
        + system_tokens * info["cache_read_input_token_cost"]
        + mapped[1].completion_tokens * info["output_cost_per_token"]
    )
    mapped_saved = system_tokens * (
        info["input_cost_per_token"] - info["cache_read_input_token_cost"]
    ) - system_tokens * (info["cache_creation_input_token_cost"] - info["input_cost_per_token"])

    # The manifest's costs: cached tokens and savings per stage and model, the total their sum.
    costs = accounting.cost_summary(gateway.stage_snapshot())
    judge = costs["by_stage"]["judge"]["by_model"]
    assert judge["claude"]["cached_tokens"] == system_tokens and judge["claude"]["cache_write_tokens"] == system_tokens
    assert judge["claude"]["cached_savings_usd"] == pytest.approx(saved)
    assert judge["mapped"]["cached_savings_usd"] == pytest.approx(mapped_saved)
    assert costs["total"]["cached_savings_usd"] == pytest.approx(saved + mapped_saved)
    assert costs["total"]["batch_savings_usd"] == 0
    assert costs["total"]["cost_usd"] == pytest.approx(
        first.cost_usd + second.cost_usd + sum(r.cost_usd for r in mapped)
    )

    # The cost report: a row per stage and model, the totals, the savings.
    rows = cost_rows(costs)
    assert [(r["stage"], r["model"]) for r in rows] == [
        ("judge", "claude"),
        ("judge", "mapped"),
        ("judge", "all models"),
        ("all stages", "all models"),
    ]
    assert rows[-1]["cached prompt tokens"] == 2 * system_tokens
    html = cost_section({"costs": costs})
    assert "Cost of this run" in html and "cached-prefix savings" in html and cost_section({}) is None

    # The marking is not part of the call cache key: the key is the unmarked messages', and a
    # gateway on the same cache answers the same call without sending it.
    assert first.key == request_key(models["claude"], prompt("first item"), {}, None)
    again = Gateway(models, cache).complete("claude", prompt("first item"))
    assert again.cached and again.text == first.text and len(server.calls_for("claude-priced")) == 2


def test_openai_receives_unmarked_messages_and_reports_repeated_prefixes_as_cached(server):
    gateway = Gateway(
        {"gpt": ModelConfig(model="openai/gpt-scripted", api_base=server.url, price=PRICE)}, direct_http=False
    )  # through LiteLLM's OpenAI adapter, as a hosted OpenAI model goes
    long_user = " ".join(f"passage-{i}" for i in range(40))
    first = gateway.complete("gpt", prompt(long_user + " question one"))
    second = gateway.complete("gpt", prompt(long_user + " question two"))
    calls = server.calls_for("gpt-scripted")
    assert all(isinstance(m["content"], str) for c in calls for m in c["messages"])  # nothing marked
    assert "cache_control" not in calls[0] and first.cached_tokens is None
    # The shared prefix is the system prompt and the passages (407 + 40 words): cached from the
    # minimum on, in steps of 128 tokens (30 + 3 x 128 = 414 <= 447).
    shared = len(SYSTEM.split()) + 40
    cached = MIN_TOKENS + (shared - MIN_TOKENS) // 128 * 128
    assert second.cached_tokens == cached == 414
    assert second.cost_usd == pytest.approx(
        ((second.prompt_tokens - cached) * 1000 + cached * 100 + second.completion_tokens * 2000) / 1e6
    )


def test_only_explicit_caching_providers_get_marked_messages():
    messages = prompt("an item")
    for model, api_base, marked in [
        ("anthropic/claude-x", None, True),
        ("bedrock/anthropic.claude-3-7-sonnet-20250219-v1:0", None, True),
        ("bedrock/anthropic.claude-3-haiku-20240307-v1:0", None, False),  # caches from 2,048 tokens
        ("bedrock/meta.llama3-70b-instruct-v1:0", None, False),
        ("openai/gpt-4o", None, False),
        ("openai/local", "http://127.0.0.1:9/v1", False),
        ("gemini/gemini-2.0-flash", None, False),
        ("vertex_ai/claude-sonnet-4-5", None, True),
        ("vertex_ai/gemini-2.0-flash", None, False),
    ]:
        sent = marked_messages(profile_for(model, api_base), model, messages)
        if marked:
            assert sent[0]["content"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
            assert sent[1] is messages[1]
        else:
            assert sent is messages
    assert messages == prompt("an item")  # the spec's messages are never changed
    assert marked_messages(profile_for("anthropic/claude-x"), "anthropic/claude-x", messages[1:]) == messages[1:]
    # A system prompt under the minimum is not marked: it would not be cached anyway.
    short = [{"role": "system", "content": SHORT_SYSTEM}, {"role": "user", "content": "an item"}]
    assert marked_messages(profile_for("anthropic/claude-x"), "anthropic/claude-x", short) is short


def test_minimum_prefix_per_model_and_the_shared_user_prefix_marked_only_when_long_enough_and_reused():
    anthropic = profile_for("anthropic/claude-x")
    assert min_prefix_tokens(anthropic, "anthropic/claude-sonnet-4-5") == 1024
    assert min_prefix_tokens(anthropic, "anthropic/claude-3-5-haiku-20241022") == 2048
    assert min_prefix_tokens(anthropic, "anthropic/claude-3-haiku-20240307") == 2048
    assert min_prefix_tokens(anthropic, "anthropic/claude-haiku-4-5") == 4096
    assert min_prefix_tokens(profile_for("bedrock/x"), "bedrock/anthropic.claude-3-haiku-20240307-v1:0") == 2048
    assert min_prefix_tokens(profile_for("openai/gpt-4o"), "openai/gpt-4o") == 1024

    item = " ".join(f"passage-{i}" for i in range(400))  # ~1,200 tokens
    user = item + "\n\n<response>\nthe reply\n</response>\n# Output"
    messages = [{"role": "system", "content": SHORT_SYSTEM}, {"role": "user", "content": user}]
    cut = len(item) + 2
    sent = marked_messages(anthropic, "anthropic/claude-x", messages, cut, 3)
    assert sent[0] is messages[0]  # the short system prompt: not marked on its own
    assert sent[1]["content"] == [
        {"type": "text", "text": user[:cut], "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": user[cut:]},
    ]
    assert marked_messages(anthropic, "anthropic/claude-x", messages, cut, 1) is messages  # nobody reads it again
    # Haiku 3.5 caches from 2,048 tokens: the same prefix is too short for it.
    assert marked_messages(anthropic, "anthropic/claude-3-5-haiku-20241022", messages, cut, 3) is messages
    short = [messages[0], {"role": "user", "content": "a short item\n\n<response>\nx\n</response>"}]
    assert marked_messages(anthropic, "anthropic/claude-x", short, 14, 3) is short
    assert marked_messages(profile_for("openai/gpt-4o"), "openai/gpt-4o", messages, cut, 3) is messages


@pytest.mark.usefixtures("prefect_harness")
def test_the_run_costs_table_artifact_shows_spend_per_stage_and_model_and_the_savings():
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.context import FlowRunContext

    from refusalbench.tasks.pipeline.ui import publish_run_costs

    by_stage = {
        "respond": {
            "a": {
                "http_calls": 2,
                "prompt_tokens": 90,
                "cached_tokens": 40,
                "cost_usd": 0.5,
                "cached_savings_usd": 0.03,
            },
            "b": {"http_calls": 1, "prompt_tokens": 10, "unpriced_calls": 1},
        },
        "judge": {"a": {"http_calls": 1, "prompt_tokens": 50, "cost_usd": 0.25, "batch_savings_usd": 0.25}},
    }
    costs = {**accounting.cost_summary(by_stage), "budget_usd": 5.0}

    @flow
    def costed() -> str:
        publish_run_costs(costs)
        return str(FlowRunContext.get().flow_run.id)

    run_id = costed()
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    assert artifact.key == "run-costs" and artifact.type == "table"
    assert "Spent $0.7500 on 4 calls (and 1 calls with no known price" in artifact.description
    table = json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data  # Prefect keeps JSON text
    rows = {(row["stage"], row["model"]): row for row in table}
    assert rows[("respond", "a")]["cached-prefix savings (USD)"] == pytest.approx(0.03)
    assert rows[("respond", "b")]["unpriced calls"] == 1
    assert rows[("judge", "a")]["batch savings (USD)"] == pytest.approx(0.25)
    total = rows[("all stages", "all models")]
    assert total["cost (USD)"] == "0.7500 + unpriced" and total["cached prompt tokens"] == 40
