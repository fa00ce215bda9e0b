"""The paper's reference figures: the shipped file loads and validates, a few figures are pinned
against the paper, and a user's model string finds the paper's model it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from refusalbench.tasks.refusalbench.reference.model_names import alias_index, normalise, paper_model
from refusalbench.tasks.refusalbench.reference.paper_reference import (
    load_reference,
    matched_figures,
    parse_reference,
    run_dataset,
)
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS

PAPER = Path("/work/shared/seeds/refusalbench-paper.txt")

# (dataset, model, metric, printed value): figures the brief and the paper's text agree on.
PINNED = [
    ("nq", "Claude-4-Sonnet", "refusal_accuracy", "73.0"),
    ("garage", "DeepSeek-R1", "refusal_accuracy", "47.4"),
    ("garage", "Claude-4-Sonnet", "refusal_accuracy", "36.1"),
    ("nq", "GPT-4o", "missed_refusal_rate", "4.3"),
    ("nq", "GPT-4o", "category_accuracy", "54.1"),
    ("nq", "Qwen-1.5-4B-Chat", "answer_accuracy", "13.0"),
    ("nq", "Qwen-1.5-7B-Chat", "answer_accuracy", "56.1"),
    ("nq", None, "human_pass_rate", "93.1"),
    ("garage", None, "human_pass_rate", "88.3"),
    ("nq", None, "verifier_self_pass_rate", "91.0"),
    ("nq", None, "verifier_cross_pass_rate", "82.1"),
    ("nq", None, "frr_mrr_correlation", "-0.78"),
]


def _find(dataset, model, metric):
    reference = load_reference()
    found = [f for f in reference.figures if (f.dataset, f.model, f.metric, f.subset) == (dataset, model, metric, None)]
    assert found, (dataset, model, metric)
    return found


def test_the_file_loads_and_every_record_has_a_source_and_a_description():
    reference = load_reference()
    assert len(reference.figures) > 100
    for figure in reference.figures:
        assert figure.source.strip() and figure.description.strip(), figure
        assert figure.model is None or figure.model in reference.models


@pytest.mark.parametrize(("dataset", "model", "metric", "value"), PINNED)
def test_pinned_figures(dataset, model, metric, value):
    assert value in [f.value for f in _find(dataset, model, metric)]


def test_the_bounds_and_ranges_the_paper_states():
    (frr,) = [f for f in _find("nq", "GPT-4o", "false_refusal_rate") if f.comparator == ">"]
    assert (frr.value, frr.text()) == ("60", "> 60%")
    (refusals,) = _find("nq", None, "ece_refusal")
    (answers,) = _find("nq", None, "ece_answer")
    assert (refusals.value, answers.value) == (("0.226", "0.519"), ("0.406", "0.580"))
    assert answers.text() == "0.406–0.580", "a trailing zero the paper prints is kept"


def test_every_leaderboard_metric_id_is_a_declared_metric():
    """A figure named like a metrics.json metric is one the project declares: no near-miss names."""
    declared = set(METRIC_SPECS)
    whole = [f for f in load_reference().figures if f.whole_model and "." not in f.metric]
    assert {"refusal_accuracy", "answer_accuracy", "calibrated_refusal_score"} <= {f.metric for f in whole}
    for figure in whole:
        looks_like_metric = figure.metric.endswith(("_accuracy", "_rate", "_score")) or figure.metric == "ece"
        if looks_like_metric and figure.unit in ("percent", "score"):
            assert figure.metric in declared or figure.metric.startswith(("verifier_", "generation_")), figure


@pytest.mark.skipif(not PAPER.is_file(), reason="the paper's text is not on this machine")
def test_every_figure_is_printed_in_the_paper_text():
    text = PAPER.read_text(encoding="utf-8")
    numbers = set(re.findall(r"\d+(?:\.\d+)?", text.replace(",", "")))
    for figure in load_reference().figures:
        for value in figure.value if isinstance(figure.value, tuple) else (figure.value,):
            assert value.lstrip("-") in numbers, (figure.source, figure.metric, value)
    # The best NQ refusal accuracy is stated beside the model it belongs to.
    assert re.search(r"73\.0% \(Claude-4-Sonnet\)", text)
    assert re.search(r"DeepSeek-R1\) achieves only 47\.4%", text)


def test_a_bad_record_is_named_by_its_index_and_field():
    good = "models: {M: [m]}\nfigures:\n  - {dataset: nq, model: M, metric: x, value: 1.0, unit: percent, source: s, description: d}\n"
    assert len(parse_reference(good).figures) == 1
    with pytest.raises(ValueError, match=r"figures\.0\.source"):
        parse_reference(good.replace("source: s", "source: ''"))
    with pytest.raises(ValueError, match="not in the models table"):
        parse_reference(good.replace("model: M", "model: Other"))
    with pytest.raises(ValueError, match="range"):
        parse_reference(good.replace("value: 1.0", "value: [1.0, 2.0]"))


# ---------------------------------------------------------------- model names

ALIASES = load_reference().models


@pytest.mark.parametrize(
    ("model", "paper"),
    [
        ("anthropic/claude-sonnet-4-20250514", "Claude-4-Sonnet"),
        ("bedrock/anthropic.claude-sonnet-4-20250514-v1:0", "Claude-4-Sonnet"),
        ("bedrock/us.anthropic.claude-sonnet-4-20250514-v1:0", "Claude-4-Sonnet"),
        ("vertex_ai/claude-sonnet-4@20250514", "Claude-4-Sonnet"),
        ("Claude-4-Sonnet", "Claude-4-Sonnet"),
        ("openrouter/anthropic/claude-3.5-sonnet", "Claude-3.5-Sonnet"),
        ("anthropic/claude-3-5-sonnet-20240620", "Claude-3.5-Sonnet"),
        ("openai/gpt-4o", "GPT-4o"),
        ("gpt-4o-2024-08-06", "GPT-4o"),
        ("openai/gpt-4.1-2025-04-14", "GPT-4.1"),
        ("deepseek/deepseek-reasoner", "DeepSeek-R1"),
        ("bedrock/us.deepseek.r1-v1:0", "DeepSeek-R1"),
        ("together_ai/deepseek-ai/DeepSeek-R1", "DeepSeek-R1"),
        ("bedrock/amazon.nova-premier-v1:0", "Nova-Premier"),
        ("hosted_vllm/Qwen/Qwen1.5-4B-Chat", "Qwen-1.5-4B-Chat"),
        ("qwen-1.5-72b-chat", "Qwen-1.5-72B-Chat"),
        ("allenai/OLMo-2-0425-1B-DPO", "OLMo-2-1B-DPO"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama-3.1-70B-Instruct"),
        # siblings never match by prefix
        ("openai/gpt-4o-mini", None),
        ("anthropic/claude-sonnet-4-5-20250929", None),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", None),
        ("Qwen/Qwen2.5-7B-Instruct", None),
        ("my-local-model", None),
    ],
)
def test_a_model_string_finds_the_paper_model_it_names(model, paper):
    assert paper_model(model, ALIASES) == paper


def test_normalising_drops_route_vendor_version_date_case_and_separators():
    assert normalise("bedrock/us.anthropic.Claude-Sonnet-4-20250514-v1:0") == "claudesonnet4"
    assert normalise("gpt-4o-2024-08-06") == normalise("GPT_4o") == "gpt4o"


def test_an_alias_shared_by_two_models_is_refused():
    with pytest.raises(ValueError, match="names both"):
        alias_index({"A": ["gpt-4o"], "B": ["GPT 4o"]})


# ---------------------------------------------------------------- which benchmark a run's model was on


def test_the_benchmark_comes_from_the_multi_document_counts():
    multi = {"m": {"n_items": 40}, "mixed": {"n_items": 10}}
    assert run_dataset("s", {"n": 40}, multi) == "nq"
    assert run_dataset("m", {"n": 40}, multi) == "garage"
    assert run_dataset("mixed", {"n": 40}, multi) is None


def test_matched_figures_keep_the_leaderboard_metrics_of_matched_models_only():
    models = {"anthropic/claude-sonnet-4-20250514": {"n": 10}, "my-model": {"n": 10}, "openai/gpt-4o": {"n": 10}}
    found = matched_figures(models, {"openai/gpt-4o": {"n_items": 10}}, ["refusal_accuracy", "false_refusal_rate"])
    assert set(found) == {"anthropic/claude-sonnet-4-20250514", "openai/gpt-4o"}
    paper, dataset, figures = found["anthropic/claude-sonnet-4-20250514"]
    assert (paper, dataset, {k: f.text() for k, f in figures.items()}) == (
        "Claude-4-Sonnet",
        "nq",
        {"refusal_accuracy": "73.0%"},
    )
    assert {k: f.text() for k, f in found["openai/gpt-4o"][2].items()} == {"refusal_accuracy": "39.9%"}
