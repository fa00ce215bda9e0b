"""The judge's and verifier's shared prompt prefix, cached by the provider: marked, read, forecast, reported.

Every target's reply to one item gets a judge call whose prompt opens with the same instructions and
item (context, question, references); the template says where that part ends. On an Anthropic model
the gateway marks it ``cache_control`` when it is long enough and shared; the scripted server caches
it as Anthropic does (a write, then reads), the costs show the reads and the savings beside what
was expected, and ``plan`` forecasts them before the run.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core.config import ModelConfig, load_config
from refusalbench.tasks.core.tables import to_table
from refusalbench.tasks.llm import accounting
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.prompt_cache import prefix_tokens, shared_prefix
from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.plan.estimate import plan_run, plan_table
from refusalbench.tasks.refusalbench.report.cost_section import cost_rows, cost_section
from refusalbench.tasks.refusalbench.schema.records import BaseItem, BenchmarkItem, Candidate, Response
from refusalbench.tasks.refusalbench.stages.judge import judge_messages, judge_prompt, judge_responses
from refusalbench.tasks.refusalbench.stages.verify import verification_calls
from tests.scripted import judge_by_reference

PRICE = {"input_per_mtok": 1000.0, "output_per_mtok": 2000.0, "cached_input_per_mtok": 100.0}
TARGETS = ("t1", "t2", "t3")
# A long passage (well over 1,024 tokens as LiteLLM counts them) and a short one.
LONG_CONTEXT = " ".join(f"The harbour log entry {i} records a ship named vessel-{i}." for i in range(150))


def item(item_id: str, context: str) -> BenchmarkItem:
    return BenchmarkItem(
        item_id=item_id,
        base_id=item_id,
        variant="single",
        perturbation_class="-",
        intensity="LOW",
        lever_id="-",
        generator="-",
        question="Which ship is named in entry 7?",
        context=context,
        original_question="Which ship is named in entry 7?",
        original_context=context,
        answers=["vessel-7"],
        expected="ANSWER_CORRECTLY",
    )


def test_an_anthropic_judge_reads_each_items_shared_prefix_from_the_cache_and_the_costs_show_it():
    long_item, short_item = item("long", LONG_CONTEXT), item("short", "Entry 7 names vessel-7.")
    items = {i.item_id: i for i in (long_item, short_item)}
    responses = [Response(item_id=i, model=t, raw=f"{t} says vessel-7") for i in items for t in TARGETS]
    with ScriptedLLMServer(responder=judge_by_reference) as server:
        server.prompt_cache.min_tokens = 30  # the scripted cache's words; the gateway's minimum is LiteLLM's tokens
        cfg = ModelConfig(
            model="anthropic/claude-judge",
            api_base=server.anthropic_url,
            price=PRICE,
            max_concurrency=1,  # one at a time: the first call writes the prefix, the next ones read it
            params={"max_tokens": 300},
        )
        gateway = Gateway({"judge": cfg})
        with accounting.stage("judge"):
            judgments = judge_responses(gateway, items, responses, "judge", shared_by=len(TARGETS))
        assert all(j.error is None for j in judgments)
        calls = server.calls_for("claude-judge")

    prompt = judge_prompt(long_item, responses[0])
    user = prompt.messages[-1]["content"]
    assert prompt.shared_chars is not None and user[prompt.shared_chars :].startswith("<response>")
    # The messages as sent: the user message's first block (the item, up to the reply) carries the
    # mark, the system prompt (short) none; the text is the judge prompt's, unchanged.
    long_calls = [c for c in calls if "harbour log entry 149" in c["messages"][-1]["content"]]
    short_calls = [c for c in calls if c not in long_calls]
    assert len(long_calls) == len(short_calls) == 3
    assert [c.get("cache_control") for c in long_calls] == [["messages[0][0]"]] * 3
    assert long_calls[0]["messages"][-1]["content"].split() == user.split()
    assert all("cache_control" not in c for c in short_calls)  # too short to cache: not marked
    # The first call wrote the system prompt and the item (the scripted server's words), the others read it.
    prefix_words = sum(len(m["content"].split()) for m in shared_prefix(prompt.messages, prompt.shared_chars))
    assert long_calls[0]["cache_written"] == prefix_words
    assert [c["billed"]["cached_tokens"] for c in long_calls] == [0, prefix_words, prefix_words]
    assert all(c["billed"]["cached_tokens"] == 0 for c in short_calls)

    # The costs: two reads at the cached price less one write's premium saved; the expected reads are
    # plan's arithmetic over the calls sent (LiteLLM's count of the prefix, two reads of three calls).
    costs = accounting.cost_summary(gateway.stage_snapshot())
    judge = costs["by_stage"]["judge"]["by_model"]["judge"]
    saved = (2 * prefix_words * (1000 - 100) - prefix_words * 250) / 1e6
    assert judge["cached_tokens"] == 2 * prefix_words and judge["cache_write_tokens"] == prefix_words
    assert judge["cached_savings_usd"] == pytest.approx(saved) and saved > 0
    tokens = prefix_tokens(cfg.model, shared_prefix(prompt.messages, prompt.shared_chars))
    assert judge["expected_cached_tokens"] == 2 * tokens
    assert judge["expected_cached_savings_usd"] == pytest.approx((2 * tokens * 900 - tokens * 250) / 1e6)
    (row, total) = cost_rows(costs)
    assert row["cached prompt tokens"] == 2 * prefix_words and row["expected cached tokens"] == 2 * tokens
    assert row["cached-prefix savings (USD)"] == pytest.approx(saved, abs=1e-6)
    html = cost_section({"costs": costs})
    assert "expected cached tokens" in html and f"(expected: {2 * tokens:,}" in html


def test_verifier_calls_share_the_prefix_of_one_item_and_lever_across_generators():
    base = item("b1", LONG_CONTEXT)
    lever = next(lv for lv in load_catalogue() if lv.perturbation_class == "P-MissingInfo" and lv.intensity == "HIGH")
    candidates = [
        Candidate(
            candidate_id=f"c-{g}",
            assignment_id="a1",
            base_id="b1",
            lever_id=lever.id,
            perturbation_class="P-MissingInfo",
            intensity="HIGH",
            variant="single",
            generator=g,
            status="ok",
            question=base.question,
            context=LONG_CONTEXT.replace("vessel-7", f"ship-{g}"),
            expected=lever.expected,
            prompt_hash="-",
        )
        for g in ("gen-a", "gen-b")
    ]
    items = {"b1": BaseItem(id="b1", question=base.question, answers=base.answers, context=LONG_CONTEXT)}
    specs = verification_calls(candidates, items, {lever.id: lever}, "ver")
    assert [s.shared_by for s in specs] == [2, 2]
    prefixes = [s.messages[-1]["content"][: s.shared_chars] for s in specs]
    assert prefixes[0] == prefixes[1] and prefixes[0].endswith("</reference_answer>\n\n")
    assert specs[0].messages[-1]["content"][specs[0].shared_chars :].startswith("# Perturbed")


BENCH_CONFIG = """
models:
  claude: {model: anthropic/claude-sonnet-4-5-20250929, api_key_env: ANTHROPIC_API_KEY, params: {max_tokens: 100}}
  t1: {model: openai/t1, api_base: http://127.0.0.1:9/v1, params: {max_tokens: 50}}
  t2: {model: openai/t2, api_base: http://127.0.0.1:9/v1, params: {max_tokens: 50}}
  t3: {model: openai/t3, api_base: http://127.0.0.1:9/v1, params: {max_tokens: 50}}
evaluation:
  targets: [t1, t2, t3]
  judge: claude
"""


def test_plan_forecasts_the_judges_cached_tokens_and_savings(tmp_path):
    (tmp_path / "run.yaml").write_text(BENCH_CONFIG)
    cfg = load_config(tmp_path / "run.yaml")
    long_item, short_item = item("long", LONG_CONTEXT), item("short", "Entry 7 names vessel-7.")
    pq.write_table(to_table([long_item, short_item], BenchmarkItem), tmp_path / "benchmark.parquet")
    plan = plan_run(cfg, benchmark=str(tmp_path / "benchmark.parquet"))

    import litellm

    info = litellm.get_model_info("anthropic/claude-sonnet-4-5-20250929")
    stand_in = Response(item_id="long", model="-", raw="vessel-7")  # plan's stand-in reply: the reference
    prompt = judge_prompt(long_item, stand_in)
    tokens = prefix_tokens("anthropic/claude-sonnet-4-5-20250929", shared_prefix(prompt.messages, prompt.shared_chars))
    judge = plan.stages["judge"].models["claude"]
    # Three targets' replies to the long item share its prefix: two reads and one write; the short item none.
    assert judge.cached_tokens == 2 * tokens and judge.cache_write_tokens == tokens
    full, read, write = (
        info["input_cost_per_token"],
        info["cache_read_input_token_cost"],
        info["cache_creation_input_token_cost"],
    )
    assert judge.cached_savings_usd == pytest.approx(2 * tokens * (full - read) - tokens * (write - full), abs=1e-6)
    assert judge.cached_savings_usd > 0
    assert plan.stages["judge"].cached_savings_usd == judge.cached_savings_usd == plan.total.cached_savings_usd
    assert plan.stages["respond"].cached_tokens == 0  # the targets are self-hosted: no prompt cache
    data = plan.model_dump()
    assert data["stages"]["judge"]["models"]["claude"]["cached_tokens"] == 2 * tokens
    table = plan_table(plan)
    assert f"judge: claude: {2 * tokens:,} prompt tokens read from the cache, saving $" in table
    assert judge_messages(long_item, stand_in) == prompt.messages
