"""`plan`: calls, tokens, cost and time of a run, computed without a model call (issue 14, part 5)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core.config import load_config
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.tables import to_table
from refusalbench.tasks.pipeline.refusalbench.assign_step import prepare_inputs
from refusalbench.tasks.refusalbench.basesets import load_base_set
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.plan.estimate import CHARS_PER_TOKEN, plan_run, plan_table, time_bound
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from refusalbench.tasks.refusalbench.stages.assign import assign_levers, parse_strata, sample_base_items

BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
    },
    {"id": "s2", "question": "Who founded the firm?", "answers": ["Ada Lee"], "context": "Ada Lee founded the firm."},
    {"id": "s3", "question": "Where is the mill?", "answers": ["Tarn"], "context": "The mill stands in Tarn."},
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
]

# gen-a/gen-b/ver-a have no price (openai/<made-up name>); priced is GPT-4o in LiteLLM's map.
MODELS = """
models:
  gen-a: {model: openai/gen-a, api_base: http://127.0.0.1:9/v1, max_concurrency: 4, params: {max_tokens: 300}}
  gen-b: {model: openai/gen-b, api_base: http://127.0.0.1:9/v1, max_concurrency: 2}
  ver-a: {model: openai/ver-a, api_base: http://127.0.0.1:9/v1, max_concurrency: 8, params: {max_tokens: 200}}
  priced: {model: openai/gpt-4o, api_key_env: OPENAI_API_KEY, max_concurrency: 2, rpm: 30, params: {max_tokens: 100}}
"""


def write_config(tmp_path, *, generation="", evaluation=True):
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in BASE))
    text = (
        MODELS
        + f"""
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [ver-a, priced]
  seed: 7
  base_sample: 3
  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]
  target_size: 4
{generation}
"""
    )
    if evaluation:
        text += """
evaluation:
  targets: [gen-a, priced]
  judge: ver-a
"""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return load_config(path)


def test_generate_calls_equal_assignments_times_generators(tmp_path):
    cfg = write_config(tmp_path)
    plan = plan_run(cfg)
    gen = plan.stages["generate"]
    # The flow's own draw: 3 sampled items x 2 strata = 6 assignments, sent to each of 2 generators.
    inputs = prepare_inputs(cfg, cfg.generation.seed)
    assert len(inputs.assignments) == 6
    assert gen.calls == len(inputs.assignments) * 2 == 12
    assert gen.by_model == {"gen-a": 6, "gen-b": 6} and not gen.upper_bound
    # ... which is also what the assignment functions give directly with the config's seed
    items = sample_base_items(load_base_set(tmp_path / "base.jsonl"), 3, 7)
    assert (
        len(assign_levers(items, load_catalogue(), seed=7, strata=parse_strata(cfg.generation.strata))) * 2 == gen.calls
    )
    assert gen.input_tokens > 0 and gen.models["gen-a"].input_tokens == gen.models["gen-b"].input_tokens


def test_outcome_dependent_stages_are_upper_bounds(tmp_path):
    plan = plan_run(write_config(tmp_path))
    verify, respond, judge = plan.stages["verify"], plan.stages["respond"], plan.stages["judge"]
    assert verify.upper_bound and verify.by_model == {"ver-a": 12, "priced": 12}
    # target_size 4 over 2 strata: quota 2 each, 6 candidates each -> at most 4 items per target
    assert respond.upper_bound and respond.by_model == {"gen-a": 4, "priced": 4}
    # decision: judge (the default): the judge classifies every reply, at most 4 items x 2 targets
    assert judge.upper_bound and judge.by_model == {"ver-a": 8}
    assert plan.total.calls == 12 + 24 + 8 + 8 and plan.total.upper_bound
    assert list(plan.stages) == ["generate", "verify", "respond", "judge"]
    # decision: codes: only the LOW stratum is answerable, at most 2 items x 2 targets reach the judge
    cfg = write_config(tmp_path)
    cfg.evaluation.decision = "codes"
    assert plan_run(cfg).stages["judge"].by_model == {"ver-a": 4}


def test_the_calibration_pass_counts_in_respond_and_judge(tmp_path):
    """evaluation.confidence adds the calibration pass (App. F.2): the respond and judge calls again,
    the targets' prompts longer by the confidence instructions. DESIGN §4 names plan's stages, so
    the pass counts inside respond and judge, and their notes say so."""
    cfg = write_config(tmp_path)
    plain = plan_run(cfg)
    cfg.evaluation.confidence = True
    plan = plan_run(cfg)
    assert list(plan.stages) == list(plain.stages)
    before, after = plain.stages["respond"], plan.stages["respond"]
    assert after.by_model == {m: 2 * n for m, n in before.by_model.items()} and after.upper_bound
    assert after.models["gen-a"].input_tokens > 2 * before.models["gen-a"].input_tokens
    assert plan.stages["judge"].by_model == {m: 2 * n for m, n in plain.stages["judge"].by_model.items()}
    assert "calibration pass" in after.note and "calibration pass" in plan.stages["judge"].note
    assert plan.total.calls == plain.total.calls + before.calls + plain.stages["judge"].calls


def test_cost_is_none_for_an_unknown_price_and_a_number_for_gpt_4o(tmp_path):
    plan = plan_run(write_config(tmp_path))
    verify = plan.stages["verify"]
    priced = verify.models["priced"]
    # GPT-4o: $2.50 / M input, $10 / M output; output ceiling = calls x max_tokens
    assert priced.output_tokens_max == 12 * 100
    assert priced.cost_usd == pytest.approx(priced.input_tokens * 2.5e-6 + 1200 * 1e-5, rel=1e-6)
    assert priced.input_cost_usd == pytest.approx(priced.input_tokens * 2.5e-6, rel=1e-6)
    unpriced = verify.models["ver-a"]
    assert unpriced.cost_usd is None and unpriced.input_cost_usd is None and unpriced.output_tokens_max == 12 * 200
    assert verify.cost_usd is None and plan.total.cost_usd is None  # never a silent 0
    assert plan.total.priced_cost_usd == pytest.approx(
        priced.cost_usd + plan.stages["respond"].models["priced"].cost_usd
    )
    assert plan.total.unpriced_models == ["gen-a", "gen-b", "ver-a"]
    # gen-b has no max_tokens: its output is not bounded
    assert plan.stages["generate"].models["gen-b"].output_tokens_max is None
    assert plan.stages["generate"].output_tokens_max is None
    assert any("the cost is unknown, not zero" in line and "gen-a" in line for line in plan.warnings)


def test_only_priced_models_give_a_total_cost(tmp_path):
    cfg = write_config(tmp_path, evaluation=False)
    cfg.generation.generators = ["priced"]
    cfg.generation.verifiers = ["priced"]
    plan = plan_run(cfg)
    assert plan.total.cost_usd == pytest.approx(plan.total.priced_cost_usd) and plan.total.cost_usd > 0
    assert plan.total.unpriced_models == []


def test_time_bound_follows_the_formula(tmp_path):
    cfg = write_config(tmp_path)
    plan = plan_run(cfg, latency_s=3.0)
    gen = plan.stages["generate"]
    # gen-a: 6 x 3 s / 4; gen-b: 6 x 3 s / 2 -> the stage takes as long as the slower one
    assert gen.models["gen-a"].time_bound_s == pytest.approx(6 * 3.0 / 4)
    assert gen.models["gen-b"].time_bound_s == pytest.approx(6 * 3.0 / 2)
    assert gen.time_bound_s == pytest.approx(9.0)
    # priced: 12 calls at 30 rpm need 24 s, slower than 12 x 3 s / 2 = 18 s
    assert plan.stages["verify"].models["priced"].time_bound_s == pytest.approx(24.0)
    assert time_bound(cfg.models["priced"], 12, 3.0) == pytest.approx(24.0)
    assert plan.stages["verify"].time_bound_s == pytest.approx(24.0)
    assert plan.total.time_bound_s == pytest.approx(sum(s.time_bound_s for s in plan.stages.values()))
    # short-circuit verifiers take turns: their times add up
    cfg.generation.verification = "short_circuit"
    sequential = plan_run(cfg, latency_s=3.0).stages["verify"]
    assert sequential.time_bound_s == pytest.approx(12 * 3.0 / 8 + 24.0)


def test_input_tokens_are_characters_over_four_of_the_rendered_prompts(tmp_path):
    from refusalbench.tasks.refusalbench.stages.generate import generation_messages

    cfg = write_config(tmp_path)
    cfg.models["gen-b"].json_schema = False  # no schema in the request: only the messages count
    plan = plan_run(cfg)
    inputs = prepare_inputs(cfg, 7)
    levers = {lever.id: lever for lever in inputs.levers}
    chars = sum(
        len(m["content"])
        for a in inputs.assignments
        for m in generation_messages(inputs.items_by_id[a.base_id], levers[a.lever_id])
    )
    assert plan.stages["generate"].models["gen-b"].input_tokens == -(-chars // CHARS_PER_TOKEN)
    assert plan.stages["generate"].models["gen-a"].input_tokens > plan.stages["generate"].models["gen-b"].input_tokens


def test_pretest_stage_and_its_effect_on_generate(tmp_path):
    cfg = write_config(tmp_path, generation="  pretest: {models: [gen-a, priced], judge: ver-a}")
    plan = plan_run(cfg)
    pretest = plan.stages["pretest"]
    # every base item (all 4, before base_sample) x 2 models; the judge scores at most each answer
    assert pretest.by_model == {"gen-a": 4, "priced": 4, "ver-a": 8}
    assert not pretest.models["gen-a"].upper_bound and pretest.models["ver-a"].upper_bound
    # the pre-test may keep fewer items than base_sample: generation becomes a ceiling
    assert plan.stages["generate"].upper_bound and plan.stages["generate"].calls == 12
    assert list(plan.stages)[0] == "pretest"


def test_plan_of_a_benchmark_file_is_exact_for_respond(tmp_path):
    cfg = write_config(tmp_path)
    rows = [
        BenchmarkItem(
            item_id=f"i{k}",
            base_id="s1",
            variant="single",
            perturbation_class="P-Ambiguity",
            intensity=intensity,
            lever_id="x",
            generator="gen-a",
            question="q?",
            context="c.",
            original_question="q?",
            original_context="c.",
            answers=["a"],
            expected=expected,
        )
        for k, (intensity, expected) in enumerate(
            [("LOW", "ANSWER_CORRECTLY"), ("HIGH", "REFUSE_AMBIGUOUS_QUERY"), ("LOW", "ANSWER_CORRECTLY")]
        )
    ]
    pq.write_table(to_table(rows, BenchmarkItem), tmp_path / "benchmark.parquet")
    plan = plan_run(cfg, benchmark=str(tmp_path / "benchmark.parquet"))
    assert list(plan.stages) == ["respond", "judge"]
    assert plan.stages["respond"].by_model == {"gen-a": 3, "priced": 3} and not plan.stages["respond"].upper_bound
    # decision: judge: every reply of 3 items x 2 targets; codes: the 2 answerable items' answers
    assert plan.stages["judge"].by_model == {"ver-a": 6} and plan.stages["judge"].upper_bound
    cfg.evaluation.decision = "codes"
    assert plan_run(cfg, benchmark=str(tmp_path / "benchmark.parquet")).stages["judge"].by_model == {"ver-a": 4}


def test_evaluation_only_config_needs_the_benchmark(tmp_path):
    cfg = write_config(tmp_path)
    cfg.generation = None
    with pytest.raises(InputError, match="needs the benchmark"):
        plan_run(cfg)


def test_unavailable_models_are_left_out(tmp_path):
    plan = plan_run(write_config(tmp_path), available={"gen-a", "ver-a", "priced"})
    assert plan.stages["generate"].by_model == {"gen-a": 6}
    assert plan.stages["verify"].by_model == {"ver-a": 6, "priced": 6}  # one generator: 6 candidates
    assert any("gen-b" in note for note in plan.notes)


def test_json_shape_and_table(tmp_path):
    plan = plan_run(write_config(tmp_path))
    data = json.loads(json.dumps(plan.model_dump()))
    assert set(data) >= {"stages", "total"}
    for stage in data["stages"].values():
        assert isinstance(stage["calls"], int) and isinstance(stage["by_model"], dict)
        assert isinstance(stage["upper_bound"], bool) and sum(stage["by_model"].values()) == stage["calls"]
    assert set(data["total"]) >= {"calls", "cost_usd", "time_bound_s"} and data["total"]["cost_usd"] is None
    table = plan_table(plan)
    assert "generate  gen-a" in table and "unknown" in table and "<=24" in table
    assert "characters / 4" in table


# ---------------------------------------------------------------- round sizing (issue 26, part 3)


def test_round_size_of_theorem_3_1():
    from refusalbench.tasks.core.stats import rounds_epsilon, rounds_sample_size

    # ln(2 * 52 / 0.05) / (2 * 0.05^2) = 1,528.02: a year of weekly rounds needs 1,529 items per round.
    assert rounds_sample_size(0.05, 0.05, 52) == 1529
    assert rounds_sample_size(0.05, 0.05, 1) == 738  # one round: ln(40) / 0.005 = 737.8
    assert rounds_epsilon(1529, 0.05, 52) <= 0.05 < rounds_epsilon(1528, 0.05, 52)
    with pytest.raises(ValueError):
        rounds_sample_size(0.05, 1.5, 52)


def test_round_sizing_against_the_configs_target_size(tmp_path):
    from refusalbench.tasks.refusalbench.rounds.round_sizing import round_sizing, sizing_text

    cfg = write_config(tmp_path)  # target_size 4, two strata
    sizing = round_sizing(cfg, rounds=52, epsilon=0.05, delta=0.05)
    assert (sizing.per_round, sizing.strata, sizing.target_size, sizing.meets) == (1529, 2, 4, False)
    assert sizing.epsilon_achieved == pytest.approx(0.9772, abs=1e-3)  # sqrt(ln(2080) / 8)
    per_stratum = round_sizing(cfg, rounds=52, epsilon=0.05, delta=0.05, per_stratum=True)
    assert per_stratum.per_stratum == 1667  # ln(2 * 52 * 2 / 0.05) / 0.005 = 1,666.65: a union over T x S
    assert "n = 1,529 items per round" in sizing_text(sizing) and "does NOT meet it" in sizing_text(sizing)
    loose = round_sizing(cfg, rounds=1, epsilon=0.9, delta=0.5)
    assert loose.per_round == 1 and loose.meets is True and "meets it" in sizing_text(loose)


def test_plan_command_prints_the_round_size(tmp_path):
    from typer.testing import CliRunner

    from refusalbench.flows.cli import app

    write_config(tmp_path)
    runner = CliRunner()
    table = runner.invoke(
        app, ["plan", "--config", str(tmp_path / "run.yaml"), "--rounds", "52", "--epsilon", "0.05", "--delta", "0.05"]
    )
    assert table.exit_code == 0, table.output
    assert "n = 1,529 items per round" in table.output and "generate  gen-a" in table.output  # the plan stays
    as_json = runner.invoke(
        app, ["plan", "--config", str(tmp_path / "run.yaml"), "--rounds", "52", "--per-stratum", "--format", "json"]
    )
    data = json.loads(as_json.output)
    assert set(data) >= {"stages", "total", "round_sizing"} and data["round_sizing"]["per_round"] == 1529
    plain = json.loads(runner.invoke(app, ["plan", "--config", str(tmp_path / "run.yaml"), "--format", "json"]).output)
    assert "round_sizing" not in plain  # without the options the plan's contract is unchanged
