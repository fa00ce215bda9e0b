"""`plan` tells the truth before a run: stages with nothing to do, missing keys, unknown prices,
seconds per call of local models, consistent totals, words (the pure plan logic)."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.plan_keys import missing_key_warnings
from refusalbench.tasks.llm.plan_latency import MIN_MEASURED_CALLS
from refusalbench.tasks.llm.plan_pricing import counted
from refusalbench.tasks.refusalbench.plan.estimate import plan_run, plan_table
from tests.refusalbench.test_plan import BASE, write_config

LOCAL = """
models:
  tiny: {model: openai/tiny, max_concurrency: 1, params: {max_tokens: 50},
         local: {packages: [x==1], files: [a.gguf], sha256: "00", seconds_per_call: 7.5}}
  small: {model: openai/small, max_concurrency: 2, params: {max_tokens: 50},
          local: {packages: [y==1], files: [b.gguf], sha256: "00", alias: small-alias}}
  rules: {model: rules/v1}
cache: {path: CACHE}
generation:
  base_set: base.jsonl
  generators: [tiny, rules]
  verifiers: [small]
  seed: 0
  base_sample: 2
  strata: [P-MissingInfo/LOW]
evaluation:
  targets: [tiny, small]
  judge: small
"""


def local_config(tmp_path, text=LOCAL):
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in BASE))
    # The gateway opens cache.path as given (from the working folder): plan reads that same file.
    (tmp_path / "run.yaml").write_text(text.replace("CACHE", str(tmp_path / "calls.sqlite")))
    return load_config(tmp_path / "run.yaml")


def past_calls(path, served_model, latencies):
    """A call cache with past calls answered as ``served_model``, the layout the gateway writes."""
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS calls (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL)")
        for i, seconds in enumerate(latencies):
            value = {"text": "x", "latency_s": seconds, "served_model": served_model}
            conn.execute("INSERT INTO calls VALUES (?, ?, 0)", (f"{served_model}-{i}", json.dumps(value)))


# ---------------------------------------------------------------- a stage with nothing to do


@pytest.mark.parametrize(
    ("section", "field", "message"),
    [
        ("generation", "generators", "generation: no generators"),
        ("generation", "verifiers", "generation: no verifiers"),
        ("evaluation", "targets", "evaluation: no targets"),
    ],
)
def test_a_role_without_models_is_an_input_error_naming_the_stage(tmp_path, section, field, message):
    cfg = write_config(tmp_path)
    setattr(getattr(cfg, section), field, [])
    with pytest.raises(InputError) as info:
        plan_run(cfg)
    assert info.value.problem == message and info.value.field == f"{section}.{field}"


def test_a_generation_that_makes_no_benchmark_item_names_why(tmp_path):
    # Only the rule generator, on ambiguity levers: its rules realise none of them.
    cfg = local_config(
        tmp_path,
        LOCAL.replace("generators: [tiny, rules]", "generators: [rules]").replace(
            "P-MissingInfo/LOW", "P-Ambiguity/LOW"
        ),
    )
    with pytest.raises(InputError, match=r"generation: 0 benchmark items: the generators make no candidate"):
        plan_run(cfg)


def test_left_out_models_are_a_warning_not_an_error(tmp_path):
    cfg = write_config(tmp_path)
    plan = plan_run(cfg, available={"ver-a", "priced"})  # neither generator can run
    assert plan.stages["generate"].calls == 0
    assert any(
        w.startswith("generation: every generator is left out as unavailable (gen-a, gen-b)") for w in plan.warnings
    )


# ---------------------------------------------------------------- prices and keys


def test_local_models_are_free_and_an_api_model_without_a_price_is_flagged(tmp_path):
    plan = plan_run(local_config(tmp_path))
    rows = [m for s in plan.stages.values() for m in s.models.values()]
    assert rows and all(m.free and m.cost_usd == 0 for m in rows)
    table = plan_table(plan)
    assert "local, free" in table and "0.00" not in table
    # small has neither past calls nor a registry figure: its 2 s per call is said to be a guess
    assert [w.split(":")[0] for w in plan.warnings] == ["no measured speed for local model small"]

    api = tmp_path / "api"
    api.mkdir()
    priced = plan_run(write_config(api))
    assert not any(m.free for s in priced.stages.values() for m in s.models.values())
    flagged = [w for w in priced.warnings if w.startswith("no price for ")]
    assert flagged == [
        "no price for gen-a, gen-b, ver-a (not local; neither the config's price nor LiteLLM's map has one): "
        "the cost is unknown, not zero; set models.NAME.price"
    ]


def test_every_missing_key_is_named_once_with_the_models_that_need_it(tmp_path, monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws/credentials
    (tmp_path / "run.yaml").write_text("""
models:
  a: {model: openai/gpt-4o, api_key_env: OPENAI_API_KEY}
  b: {model: openai/gpt-4.1, api_key_env: OPENAI_API_KEY}
  c: {model: anthropic/claude-sonnet-4-20250514}
  d: {model: bedrock/amazon.nova-pro-v1:0}
  e: {model: hosted_vllm/x, api_base: http://127.0.0.1:9/v1}
""")
    cfg = load_config(tmp_path / "run.yaml")
    lines = missing_key_warnings(cfg, ["a", "b", "c", "d", "e"])
    assert "missing credentials: OPENAI_API_KEY is not set, needed by a, b" in lines
    assert "missing credentials: ANTHROPIC_API_KEY is not set, needed by c" in lines
    assert any(line.startswith("missing credentials: none of AWS_") and line.endswith("needed by d") for line in lines)
    assert len(lines) == 3  # the keyless self-hosted server needs nothing
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert not any("OPENAI_API_KEY" in line for line in missing_key_warnings(cfg, ["a", "b"]))


BEDROCK = """
models:
  m: {model: MODEL, mode: MODE, params: {max_tokens: 50},
      batch: {bedrock: {s3_uri: "s3://bucket/jobs/", role_arn: "arn:aws:iam::123456789012:role/batch"}}}
cache: {path: CACHE}
generation:
  base_set: base.jsonl
  generators: [m]
  verifiers: [m]
  seed: 0
  base_sample: 2
  strata: [P-MissingInfo/LOW]
evaluation:
  targets: [m]
  judge: m
"""


@pytest.mark.parametrize(
    ("model", "batched"), [("bedrock/us.amazon.nova-pro-v1:0", True), ("bedrock/us.deepseek.r1-v1:0", False)]
)
def test_a_bedrock_model_in_batch_mode_is_priced_as_its_batch_jobs_take_it(tmp_path, model, batched):
    # Bedrock's batch inference takes Nova models at half the price; DeepSeek-R1 is sent synchronously.
    (tmp_path / "sync").mkdir(), (tmp_path / "batch").mkdir()
    sync = plan_run(local_config(tmp_path / "sync", BEDROCK.replace("MODEL", model).replace("MODE", "sync"))).total
    planned = plan_run(local_config(tmp_path / "batch", BEDROCK.replace("MODEL", model).replace("MODE", "batch")))
    batch = planned.total
    assert sync.cost_usd > 0 and sync.sync_cost_usd == pytest.approx(batch.sync_cost_usd) == sync.cost_usd
    share = 0.5 if batched else 1.0
    assert batch.cost_usd == pytest.approx(sync.cost_usd * share, abs=1e-5)  # plan rounds to the micro-dollar
    assert sync.batch_cost_usd == pytest.approx(batch.cost_usd, abs=1e-5)  # every model in batch mode: the same jobs
    assert ("does not list DeepSeek-R1" in " ".join(planned.notes)) is not batched


# ---------------------------------------------------------------- seconds per call


def test_local_models_use_measured_then_registry_latency_not_the_default(tmp_path):
    cfg = local_config(tmp_path)
    plan = plan_run(cfg)
    verify = plan.stages["verify"].models["small"]
    respond = plan.stages["respond"].models
    assert (respond["tiny"].latency_s, respond["tiny"].latency_source) == (7.5, "registry")
    assert (verify.latency_s, verify.latency_source) == (2.0, "assumed")  # no figure yet for small

    # Past calls answered under small's alias: their mean wins over any figure.
    past_calls(tmp_path / "calls.sqlite", "small-alias", [4.0, 5.0, 9.0][:MIN_MEASURED_CALLS])
    past_calls(tmp_path / "calls.sqlite", "tiny", [1.0])  # too few to say anything
    plan = plan_run(cfg)
    respond = plan.stages["respond"].models
    assert (respond["small"].latency_s, respond["small"].latency_source) == (6.0, "measured")
    assert respond["tiny"].latency_source == "registry"
    assert any(n.startswith("seconds per call: measured") and "small 6 s" in n for n in plan.notes)
    assert "6 (measured)" in plan_table(plan) and "7.5 (registry)" in plan_table(plan)


def test_time_bounds_and_totals_are_consistent(tmp_path):
    cfg = local_config(tmp_path)
    past_calls(tmp_path / "calls.sqlite", "small-alias", [3.0, 3.0, 3.0])
    plan = plan_run(cfg)
    for stage in plan.stages.values():
        for name, m in stage.models.items():
            assert m.time_bound_s == pytest.approx(m.calls * m.latency_s / cfg.models[name].max_concurrency)
        assert stage.calls == sum(m.calls for m in stage.models.values()) == sum(stage.by_model.values())
        assert stage.input_tokens == sum(m.input_tokens for m in stage.models.values())
        assert stage.output_tokens_max == sum(m.output_tokens_max for m in stage.models.values())
        assert stage.time_bound_s == max(m.time_bound_s for m in stage.models.values())
    total = plan.total
    assert total.calls == sum(s.calls for s in plan.stages.values())
    assert total.input_tokens == sum(s.input_tokens for s in plan.stages.values())
    assert total.output_tokens_max == sum(s.output_tokens_max for s in plan.stages.values())
    assert total.time_bound_s == pytest.approx(sum(s.time_bound_s for s in plan.stages.values()))
    assert total.cost_usd == sum(s.cost_usd for s in plan.stages.values()) == 0


# ---------------------------------------------------------------- words


def test_counts_take_the_right_number_and_no_python_literal_is_printed(tmp_path):
    assert (counted(1, "generator"), counted(2, "generator"), counted(0, "target")) == (
        "1 generator",
        "2 generators",
        "0 targets",
    )
    assert counted(1, "retrieval strategy", "retrieval strategies") == "1 retrieval strategy"
    cfg = local_config(tmp_path, LOCAL.replace("generators: [tiny, rules]", "generators: [tiny]"))
    table = plan_table(plan_run(cfg))
    assert "1 generator\n" in table and "1 verifier " in table and "2 targets" in table
    assert not re.search(r"\b1 (generators|verifiers|targets|base items)\b", table)
    assert not re.search(r"\bNone\b|\bTrue\b|\bFalse\b|\[\'|\{\'", table)


# ---------------------------------------------------------------- KnowOrNot


def test_knowornot_plan_from_a_qa_file_counts_every_stage_from_the_config(tmp_path):
    from refusalbench.tasks.knowornot.run_plan import plan_knowornot

    pairs = [{"id": f"p{i}", "question": f"Question {i}?", "answer": f"Answer {i}."} for i in range(5)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp_path / "kon.yaml").write_text("""
models:
  tgt: {model: openai/gpt-4o, api_key_env: OPENAI_API_KEY, max_concurrency: 4, params: {max_tokens: 100}}
  tgt2: {model: openai/gpt-4.1, api_key_env: OPENAI_API_KEY, params: {max_tokens: 100}}
  eval: {model: openai/gpt-4o-mini, api_key_env: OPENAI_API_KEY, params: {max_tokens: 100}}
  other: {model: openai/gpt-4o-mini, api_key_env: OPENAI_API_KEY, params: {max_tokens: 100}}
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt, tgt2]
  evaluator: eval
  evaluator_comparison: [other]
  retrieval: [direct, long_context, hyde_rag]
  prompts: [basic, conservative]
  filters: []
  synthetic_ookb: 7
  label_sample: 10
""")
    plan = plan_knowornot(load_config(tmp_path / "kon.yaml"))
    assert plan.method == "knowornot"
    assert list(plan.stages) == [
        "filter",
        "hyde",
        "ookb",
        "answer",
        "evaluate",
        "compare",
    ]  # no documents: no facts, qa
    calls = {name: stage.by_model for name, stage in plan.stages.items()}
    asked = 5 + 7  # every pair (no filter, no cap) and the synthetic questions
    assert calls["hyde"] == {"eval": asked}  # the helper model defaults to the evaluator
    assert calls["ookb"] == {"eval": 2}  # 7 questions, five per call
    assert calls["answer"] == {"tgt": asked * 3 * 2, "tgt2": asked * 3 * 2}
    # abstention for all 72 answers, factuality only for the 60 with an expected answer
    assert calls["evaluate"] == {"eval": 2 * (asked + 5) * 3 * 2}
    assert calls["compare"] == {"other": 10 * 2}
    assert plan.stages["answer"].upper_bound  # a synthetic question repeating a known one is dropped
    assert plan.total.calls == sum(s.calls for s in plan.stages.values())
    assert plan.total.cost_usd == pytest.approx(sum(s.cost_usd for s in plan.stages.values()))
    assert plan.stages["answer"].time_bound_s == max(m.time_bound_s for m in plan.stages["answer"].models.values())
    assert plan.stages["answer"].models["tgt"].time_bound_s == pytest.approx(72 * 2.0 / 4)
