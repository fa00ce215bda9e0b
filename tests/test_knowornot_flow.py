"""KnowOrNot flow end to end against scripted models: LOO on every row, rates computed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.scripted import by_model, fenced, last_user_text, schema_name

pytestmark = pytest.mark.usefixtures("prefect_harness")

PAIRS = [
    {"id": f"p{i}", "question": q, "answer": a}
    for i, (q, a) in enumerate([
        ("How long is the warranty on laptops?", "Two years from purchase."),
        ("Who approves travel claims?", "The line manager approves them."),
        ("When are salaries paid?", "On the last working day of the month."),
        ("What is the parking fee per day?", "Four dollars per day."),
        ("How many leave days do new staff get?", "Eighteen days a year."),
        ("Which form requests a new badge?", "Form B-12 at reception."),
    ])
]


def target(request):
    # Abstains when the question is about salaries, answers otherwise.
    question = last_user_text(request)
    return "I don't know based on the context." if "salaries" in question else "It is two years."


def evaluator(request):
    # The built-in specs ask for <abstained>yes|no</abstained> and <tier>tier_N</tier>.
    text = last_user_text(request)
    if "<abstained>" in text:
        answer = " ".join(fenced(text, "model_answer"))
        return "The model " + ("declined. <abstained>yes</abstained>" if "don't know" in answer else "answered. <abstained>no</abstained>")
    return "Reasoning... <tier>tier_1</tier>"


def test_knowornot_flow(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_knowornot

    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    def helper_model(request):
        if schema_name(request) == "OOKBQuestionsOutput":
            return json.dumps({"questions": ["What is the dress code on Fridays?", "Who runs the canteen?",
                                             "When are salaries paid?"]})  # the last repeats a known question
        return json.dumps({"answers": ["A warranty lasts years."]})

    fake_llm.responder = by_model({"tgt": target, "hyde": helper_model, "eval": evaluator})
    models = "\n".join(f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 2" for n in ["tgt", "hyde", "eval"])
    config = tmp_path / "kon.yaml"
    config.write_text(f"""
models:
{models}
cache:
  path: {tmp_path / 'calls.sqlite'}
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt]
  evaluator: eval
  extractor: hyde
  retrieval: [direct, long_context, basic_rag, hyde_rag]
  prompts: [basic, conservative]
  k: 2
  filters: [semantic]
  semantic_threshold: 0.05
  embedder: hashing
  label_sample: 4
  synthetic_ookb: 2
""")
    out = tmp_path / "run"
    result = run_knowornot(str(config), str(out))
    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    # 6 known questions + 2 synthetic out-of-KB ones (a repeat of a known question is dropped).
    assert len(inputs) == (6 + 2) * 4 * 2 == result["experiments"]
    assert inputs.ookb.sum() == 2 * 4 * 2
    # Leave-one-out: a question's own pair is never in its context.
    assert not any(row.question_id in list(row.context_ids) for row in inputs.itertuples())
    known = inputs[~inputs.ookb]
    sizes = known.groupby("retrieval")["context_ids"].apply(lambda s: set(map(len, s))).to_dict()
    assert sizes == {"direct": {0}, "long_context": {5}, "basic_rag": {2}, "hyde_rag": {2}}
    # A synthetic question has no pair of its own: its long context is the whole KB.
    assert set(map(len, inputs[inputs.ookb & (inputs.retrieval == "long_context")].context_ids)) == {6}
    assert (out / "kb.faiss").exists()
    results = pd.read_parquet(out / "results.parquet")
    assert set(results.abstention.dropna()) == {"yes", "no"}
    salary = results[results.question.str.contains("salaries")]
    assert (salary.abstention == "yes").all() and salary.factuality.isna().all()
    others = results[~results.question.str.contains("salaries") & ~results.ookb]
    assert (others.abstention == "no").all() and (others.factuality == "tier_1").all()
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert len(metrics) == 4 * 2
    assert results[results.ookb].factuality.isna().all()  # nothing to compare a synthetic question's answer with
    row = metrics.iloc[0]
    assert row["abstention_rate"] == pytest.approx(1 / 8)
    assert row["factuality_rate"] == pytest.approx(1.0)
    assert len(pd.read_parquet(out / "label_sample.parquet")) == 4
    assert "KnowOrNot" in (out / "report.html").read_text()
    # A second run reuses everything: no new calls.
    sent = len(fake_llm.calls)
    run_knowornot(str(config), str(tmp_path / "run2"))
    assert len(fake_llm.calls) == sent

    # Two annotators label the sample in the terminal; agreement is computed from the files.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for annotator, answers in (("ann", "1\n1\n2\n2\n"), ("bob", "1\n2\n2\n2\n")):
        done = subprocess.run([sys.executable, "-m", "refusalbench.flows.cli", "knowornot", "label", str(out), "--annotator", annotator],
                              input=answers, capture_output=True, text=True, cwd=root, timeout=120)
        assert done.returncode == 0, done.stderr
    labels = (out / "labels" / "abstention.jsonl").read_text().splitlines()
    assert len(labels) == 8
    done = subprocess.run([sys.executable, "-m", "refusalbench.flows.cli", "knowornot", "agreement", str(out)],
                          capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "agreement-abstention.json").read_text())
    assert set(report["evaluator_vs_human"]) >= {"ann", "bob"}
