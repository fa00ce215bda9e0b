"""KnowOrNot flow end to end against scripted models: LOO on every row, rates computed."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from tests.cli.test_bad_input import run_in_process
from tests.scripted import by_model, fenced, last_user_text, requested_schema, run_config

pytestmark = pytest.mark.usefixtures("prefect_harness")

PAIRS = [
    {"id": f"p{i}", "question": q, "answer": a}
    for i, (q, a) in enumerate(
        [
            ("How long is the warranty on laptops?", "Two years from purchase."),
            ("Who approves travel claims?", "The line manager approves them."),
            ("When are salaries paid?", "On the last working day of the month."),
            ("What is the parking fee per day?", "Four dollars per day."),
            ("How many leave days do new staff get?", "Eighteen days a year."),
            ("Which form requests a new badge?", "Form B-12 at reception."),
        ]
    )
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
        return "The model " + (
            "declined. <abstained>yes</abstained>" if "don't know" in answer else "answered. <abstained>no</abstained>"
        )
    return "Reasoning... <tier>tier_1</tier>"


def test_knowornot_flow(tmp_path, fake_llm, capsys):
    from refusalbench.flows.launch import run_knowornot

    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")

    def helper_model(request):
        if requested_schema(request) == "OOKBQuestionsOutput":
            return json.dumps(
                {
                    "questions": [
                        "What is the dress code on Fridays?",
                        "Who runs the canteen?",
                        "When are salaries paid?",
                    ]
                }
            )  # the last repeats a known question
        return json.dumps({"answers": ["A warranty lasts years."]})

    fake_llm.responder = by_model(
        {
            "tgt": target,
            "hyde": helper_model,
            "eval": evaluator,
            "strict": lambda r: "<abstained>yes</abstained> <tier>tier_3</tier>",
            "lenient": lambda r: "<abstained>no</abstained> <tier>tier_1</tier>",
        }
    )
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["tgt", "hyde", "eval", "strict", "lenient"],
        """
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt]
  evaluator: eval
  evaluator_comparison: [strict, lenient]
  extractor: hyde
  retrieval: [direct, long_context, basic_rag, hyde_rag]
  prompts: [basic, conservative]
  k: 2
  filters: [semantic]
  semantic_threshold: 0.05
  embedder: hashing
  label_sample: 4
  synthetic_ookb: 2
""",
        max_attempts=2,
    )
    out = tmp_path / "run"
    result = run_knowornot(str(config), str(out))
    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    # 6 known questions + 2 synthetic out-of-KB ones (a repeat of a known question is dropped).
    assert len(inputs) == (6 + 2) * 4 * 2 == result.experiments
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
    # Leave-one-out and synthetic out-of-KB are two experiments (App. D.2): the salaries question is 1 of the
    # 6 leave-one-out questions; the 2 synthetic questions (answered) have rates of their own, never pooled.
    assert row["n"] == 6 and row["abstention_rate"] == pytest.approx(1 / 6)
    assert row["factuality_rate"] == pytest.approx(1.0)
    synthetic = pd.DataFrame(json.loads((out / "metrics.json").read_text())["synthetic_ookb"])
    assert len(synthetic) == 4 * 2 and set(synthetic["n"]) == {2}
    assert (synthetic["abstention_rate"] == 0).all() and synthetic["factuality_rate"].isna().all()
    assert "Synthetic out-of-KB questions (their own experiment)" in (out / "report.html").read_text()
    from refusalbench.tasks.knowornot.stages.ookb import open_validity_session

    validity = open_validity_session(str(out))  # what `knowornot label --spec ookb_validity` shows
    assert sorted(item.question for item in validity.items) == [
        "What is the dress code on Fridays?",
        "Who runs the canteen?",
    ]
    assert all(len(item.context.splitlines()) == 2 for item in validity.items)  # the k = 2 closest pairs
    # One sample per spec, each from the rows it applies to: factuality never shows an abstention.
    sample = pd.read_parquet(out / "label_sample.parquet")
    assert sample.groupby("label_spec").size().to_dict() == {"abstention": 4, "factuality": 4}
    assert (sample[sample.label_spec == "factuality"].abstention == "no").all()
    # The comparison evaluators judged exactly the sample: each spec on its own sample's rows.
    compared = pd.read_parquet(out / "evaluator_comparison.parquet")
    assert compared.groupby(["evaluator", "spec"]).size().to_dict() == {
        (e, s): 4 for e in ("strict", "lenient") for s in ("abstention", "factuality")
    }
    assert json.loads((out / "manifest.json").read_text())["counts"]["comparison_evaluations"] == 16
    assert "KnowOrNot" in (out / "report.html").read_text()
    # A second run, from the command line, reuses everything: no new calls. It prints the rates per
    # target, retrieval and prompt, and --fail-under names each configuration below its bar (exit 1).
    sent = len(fake_llm.calls)
    code, printed, err = run_in_process(
        ["knowornot", "run", "--config", str(config), "--out", str(tmp_path / "run2")]
        + ["--fail-under", "abstention=0.5", "--fail-under", "factuality_rate=0.9"],
        capsys,
    )
    assert len(fake_llm.calls) == sent
    assert code == 1, err
    rows = [line.split() for line in printed.splitlines() if line.startswith("tgt ")]
    assert len(rows) == 4 * 2 and all(row[3] == "16.7%" and "100.0%" in row[4:] for row in rows), printed
    assert f"explore:   refusalbench view {tmp_path / 'run2'}" in printed.splitlines()
    failed = re.findall(r"^fail: (tgt \(\w+, \w+\)): abstention_rate = 0.1667, below the bar 0.5$", err, re.M)
    assert len(set(failed)) == 4 * 2 and "factuality_rate" not in err, err

    # Two annotators label the sample in the terminal; agreement is computed from the files.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for annotator, answers in (("ann", "1\n1\n2\n2\n"), ("bob", "1\n2\n2\n2\n")):
        done = subprocess.run(
            [sys.executable, "-m", "refusalbench.flows.cli", "knowornot", "label", str(out), "--annotator", annotator],
            input=answers,
            capture_output=True,
            text=True,
            cwd=root,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
    labels = (out / "labels" / "abstention.jsonl").read_text().splitlines()
    assert len(labels) == 8
    # They disagree on the second item only: the consensus pass shows just that one, with both labels.
    from refusalbench.tasks.knowornot.human.labels import open_label_session

    (pending,) = open_label_session(str(out), "abstention", consensus=True).items
    assert pending.shown_labels == "ann: yes · bob: no"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "refusalbench.flows.cli",
            "knowornot",
            "label",
            str(out),
            "--annotator",
            "ann+bob",
            "--consensus",
        ],
        input="1\n",
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert not open_label_session(str(out), "abstention", consensus=True).items
    done = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "knowornot", "agreement", str(out)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "agreement-abstention.json").read_text())
    assert set(report["evaluator_vs_human"]) >= {"ann", "bob"}
    assert report["disagreements_open"] == [] and report["evaluator_vs_human"]["consensus"]["n"] == 4
    pair = report["annotators"]["pairwise"]["ann|bob"]
    assert pair["percent_agreement"] == 0.75 and pair["kappa"] == pytest.approx(0.5)
    assert pair["percent_agreement_ci"][0] < 0.75 < pair["percent_agreement_ci"][1] and len(pair["kappa_ci"]) == 2
    # Consensus yes, yes, no, no: "strict" always says abstained, "lenient" never (App. D.3, Table 3).
    rows = {r["evaluator"]: r for r in report["evaluator_comparison"]}
    assert [rows[e]["role"] for e in ("eval", "strict", "lenient")] == ["run", "comparison", "comparison"]
    assert {k: rows["strict"][k] for k in ("n", "tp", "tn", "fp", "fn")} == {"n": 4, "tp": 2, "tn": 0, "fp": 2, "fn": 0}
    assert (
        rows["strict"]["precision"] == 0.5
        and rows["strict"]["recall"] == 1
        and rows["strict"]["f1"] == pytest.approx(2 / 3)
    )
    assert {k: rows["lenient"][k] for k in ("tp", "tn", "fp", "fn", "f1")} == {
        "tp": 0,
        "tn": 2,
        "fp": 0,
        "fn": 2,
        "f1": 0,
    }
    assert "Evaluators against the human consensus" in (out / "report.html").read_text()


# ---------------------------------------------------------------- the shipped demo, from documents

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "configs" / "knowornot-demo.yaml"
CHART = 'class="vl-chart"'


def demo_model(request):
    """One scripted model plays every role of the demo, decided by the request.

    Facts: the sentence, and a restatement of it (a near-duplicate the filters should drop); QA: the fact as
    question and answer;
    HyDE: the question restated; target: abstains without context, otherwise answers citing
    a fact; evaluator: abstained when the reply says so, tier by the answer's length, and a
    citation when the reply names a fact.
    """
    text = last_user_text(request)
    schema = requested_schema(request)
    if schema == "AtomicFacts":
        (sentence,) = fenced(text, "sentence")
        return json.dumps({"facts": [sentence, f"The town handbook states that {sentence[0].lower()}{sentence[1:]}"]})
    if schema == "QAPairOutput":
        (fact,) = fenced(text, "fact")
        return json.dumps(
            {"question": f"According to the town handbook, {fact[0].lower()}{fact[1:].rstrip('.')}?", "answer": fact}
        )
    if schema == "HydeOutput":
        (question,) = fenced(text, "question")
        return json.dumps({"answers": [f"A passage on this: {question}"]})
    if "<abstained>" in text:
        (answer,) = fenced(text, "model_answer")
        return "Reasoning. <abstained>" + ("yes" if "don't know" in answer else "no") + "</abstained>"
    if "<tier>" in text:
        return "Compared. <tier>" + ("tier_1" if len(text) % 2 else "tier_3") + "</tier>"
    system = request["messages"][0]["content"]
    if "<cited></cited>" in system:
        return "Checked. <cited>" + ("yes" if "Fact 1" in text else "no") + "</cited>"
    if "no context was retrieved" in system:
        return "I don't know. No citation."
    return "Fact 1 says so: " + text[:60]


def demo_config(tmp_path, server) -> str:
    """The demo's knowornot section as shipped, its models replaced by scripted ones of the same names."""
    import yaml

    section = yaml.safe_load(DEMO_CONFIG.read_text())["knowornot"]
    section["documents"] = [str(ROOT / "data" / "knowornot-kb")]
    names = dict.fromkeys([*section["targets"], section["evaluator"], section["extractor"]])
    config = {
        "models": {n: {"model": f"openai/{n}", "api_base": server.url, "max_attempts": 2} for n in names},
        "cache": {"path": str(tmp_path / "calls.sqlite")},
        "knowornot": section,
    }
    path = tmp_path / "kon-demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def look_at_report_in_a_browser(report, shot, charts: int) -> None:
    """Headless Chromium opens the page as a person would: every chart drawn offline, no section short of data."""
    import os
    import shutil

    from tests.browser import CHARTS_DRAWN, PAGE_FACTS, Browser

    with Browser() as browser:
        facts = browser.look(f"file://{report}", script=PAGE_FACTS, screenshot=shot, wait_for=CHARTS_DRAWN)
    assert facts["charts"] == facts["drawn"] == charts and facts["broken"] == 0, facts["headings"]
    assert "not enough data" not in facts["text"].lower()
    assert {"Abstention and factuality per configuration", "Duplicate-overlap audit of the question set"} <= set(
        facts["headings"]
    )
    assert shot.stat().st_size > 50_000  # a real full-page photograph, not a blank tab
    keep = os.environ.get("REFUSALBENCH_SCREENSHOTS")
    if keep:
        shutil.copy(shot, os.path.join(keep, "knowornot-report.png"))


def test_demo_config_loads_and_its_documents_exist():
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.knowornot.document_readers import read_documents
    from refusalbench.tasks.pipeline.knowornot.knowornot_inputs import check_knowornot_inputs, with_resolved_sources

    cfg = load_config(DEMO_CONFIG)
    check_knowornot_inputs(cfg)
    kon = with_resolved_sources(cfg).knowornot
    documents = read_documents(kon.documents)
    assert len(documents) == 3 and all(len(d.text.split(". ")) >= 10 for d in documents)
    assert kon.retrieval == ["direct", "long_context", "basic_rag", "hyde_rag"] and not kon.qa_pairs
    assert all(cfg.models[m].local is not None for m in cfg.used_models())  # local models only: no key, no hub
    assert [s.name for s in kon.evaluations] == ["cites_context"]


def test_knowornot_demo_from_documents(tmp_path, fake_llm):
    """documents -> sentences -> facts -> QA -> filters -> LOO -> answers -> evaluations (built-in and the
    config's own spec) -> rates, audit, label sample, report with figures; then labels for the custom spec."""
    import subprocess
    import sys

    from refusalbench.flows.launch import run_knowornot
    from refusalbench.tasks.core.charts import specs_in
    from refusalbench.tasks.core.human_labels import HumanLabel
    from refusalbench.tasks.knowornot.human.labels import open_label_session, write_agreement
    from refusalbench.tasks.labelling.label_store import LabelStore

    fake_llm.responder = demo_model
    out = tmp_path / "run"
    result = run_knowornot(demo_config(tmp_path, fake_llm), str(out))

    sentences = pd.read_parquet(out / "sentences.parquet")
    assert len(sentences) == 3 and sentences.doc_id.nunique() == 3  # max_sentences, spread over the documents
    facts = pd.read_parquet(out / "facts.parquet")
    assert len(facts) == 6 and set(facts.doc_id) == set(sentences.doc_id)
    filtered = json.loads((out / "filter_report.json").read_text())
    assert filtered["n_input"] == 6 and filtered["n_kept"] < 6  # the restatements do not all survive
    pairs = pd.read_parquet(out / "qa_pairs.parquet")
    assert len(pairs) == 2 and set(pairs.source) <= set(facts.fact_id)  # max_questions, traced back to facts
    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    assert result.experiments == len(inputs) == 2 * 4 * 1 * 2
    assert not any(row.question_id in list(row.context_ids) for row in inputs.itertuples())

    results = pd.read_parquet(out / "results.parquet")
    assert {"abstention", "factuality", "cites_context"} <= set(results.columns)
    answered = results.abstention == "no"
    assert (results[results.retrieval == "direct"].abstention == "yes").all() and answered.sum() == 2 * 3 * 2
    # The custom spec applies to answered responses only, like factuality.
    assert results[~answered].cites_context.isna().all() and (results[answered].cites_context == "yes").all()
    specs = json.loads((out / "eval_specs.json").read_text())
    assert [s["name"] for s in specs] == ["abstention", "factuality", "cites_context"]
    rates = pd.read_parquet(out / "spec_rates.parquet")
    cited = rates[(rates.spec == "cites_context") & (rates.outcome == "yes") & (rates.retrieval != "direct")]
    assert len(cited) == 6 and (cited.rate == 1.0).all() and (cited.n_judged == 2).all()
    metrics = json.loads((out / "metrics.json").read_text())
    assert {r["spec"] for r in metrics["spec_rates"]} == {"abstention", "factuality", "cites_context"}
    audit = metrics["overlap_audit"]
    assert audit["n_questions"] == 2 and len(audit["most_similar"]) == 1 and len(audit["tfidf"]) == 3

    report = (out / "report.html").read_text()
    specs = specs_in(report)
    assert len(specs) == report.count(CHART) >= 4  # abstention, factuality, the custom spec's outcomes, the overlap
    assert "data:image/png" not in report
    abstention = next(s for s in specs if s["title"]["text"].startswith("Abstention rate"))
    direct = [r for r in abstention["data"]["values"] if r["retrieval"] == "direct"]
    assert direct and all(r["rate"] == 1 for r in direct)  # every direct question abstained (above)
    assert "not enough data" not in report.lower()
    assert "Duplicate-overlap audit" in report and "cites_context" in report
    look_at_report_in_a_browser(out / "report.html", tmp_path / "kon-report.png", len(specs))

    # The label command finds the run's own spec (from eval_specs.json, not the registry).
    session = open_label_session(str(out), "cites_context")
    sample = pd.read_parquet(out / "label_sample.parquet")
    assert session.spec.tag == "cited" and len(session.items) == (sample.label_spec == "cites_context").sum()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "refusalbench.flows.cli",
            "knowornot",
            "label",
            str(out),
            "--annotator",
            "ann",
            "--spec",
            "cites_context",
        ],
        input="1\n" * len(session.items),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    import datetime as dt

    store = LabelStore(session.labels_path)
    for item in session.items:
        store.append(
            HumanLabel(
                item_id=item.item_id,
                spec="cites_context",
                annotator="bob",
                label="yes",
                labelled_at=dt.datetime.now(dt.UTC),
            )
        )
    agreement = write_agreement(str(out), "cites_context")
    assert agreement["annotators"]["pairwise"]["ann|bob"]["n"] == len(session.items)
    rebuilt = (out / "report.html").read_text()
    assert "Fleiss" in rebuilt and "ann vs bob" in rebuilt  # the agreement command rebuilt the page


# ---------------------------------------------------------------- several knowledge bases in one run

OTHER_PAIRS = [
    {"id": f"p{i}", "question": q, "answer": a}  # the same ids as PAIRS: the run must keep the bases apart
    for i, (q, a) in enumerate(
        [
            ("What time does the library open?", "At eight in the morning."),
            ("How many books may a member borrow?", "Up to ten books."),
            ("What is the fine for a late book?", "Ten cents a day."),
        ]
    )
]


def test_knowornot_runs_several_knowledge_bases_each_leave_one_out_within_itself(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_knowornot

    (tmp_path / "hr.jsonl").write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    (tmp_path / "library.jsonl").write_text("\n".join(json.dumps(p) for p in OTHER_PAIRS) + "\n")
    fake_llm.responder = by_model(
        {"tgt": target, "hyde": lambda r: json.dumps({"answers": ["A guess."]}), "eval": evaluator}
    )
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["tgt", "hyde", "eval"],
        """
knowornot:
  knowledge_bases:
    - {name: hr, qa_pairs: hr.jsonl}
    - {name: library, qa_pairs: library.jsonl}
  targets: [tgt]
  evaluator: eval
  extractor: hyde
  retrieval: [long_context, basic_rag, hyde_rag]
  prompts: [basic]
  k: 2
  filters: []
  embedder: hashing
  label_sample: 4
""",
        max_attempts=2,
    )
    out = tmp_path / "run"
    result = run_knowornot(str(config), str(out))
    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    assert len(inputs) == (6 + 3) * 3 == result.experiments
    assert inputs.groupby("knowledge_base").size().to_dict() == {"hr": 18, "library": 9}
    # Ids carry their base; a question's context comes from its own base only, never its own pair.
    for row in inputs.itertuples():
        assert row.question_id.startswith(f"{row.knowledge_base}/")
        assert all(i.startswith(f"{row.knowledge_base}/") for i in row.context_ids)
        assert row.question_id not in list(row.context_ids)
    long = inputs[inputs.retrieval == "long_context"]
    assert set(long[long.knowledge_base == "hr"].context_ids.map(len)) == {5}
    assert set(long[long.knowledge_base == "library"].context_ids.map(len)) == {2}
    # Each base has its own index in its own folder.
    assert (out / "kb" / "hr" / "kb.faiss").exists() and (out / "kb" / "library" / "kb.faiss").exists()
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["configurations"]) == 3  # pooled over the bases
    per_base = pd.DataFrame(metrics["configurations_by_knowledge_base"])
    assert len(per_base) == 6 and set(per_base.knowledge_base) == {"hr", "library"}
    hr = per_base[(per_base.knowledge_base == "hr") & (per_base.retrieval == "long_context")].iloc[0]
    assert hr["abstention_rate"] == pytest.approx(1 / 6)  # the salaries question
    assert metrics["filter_report"]["n_input"] == 9
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["qa_pairs_all"] == 9 and manifest["counts"]["qa_pairs"] == 9
    report = (out / "report.html").read_text()
    assert "Per knowledge base" in report and "within each of 2 knowledge bases" in report
    # Re-run: every call comes from the cache.
    sent = len(fake_llm.calls)
    run_knowornot(str(config), str(tmp_path / "run2"))
    assert len(fake_llm.calls) == sent


def test_knowledge_bases_exclude_documents_and_need_distinct_names():
    from pydantic import ValidationError

    from refusalbench.tasks.core.config import KnowOrNotConfig

    base = {"targets": ["t"], "evaluator": "e"}
    with pytest.raises(ValidationError, match="not both"):
        KnowOrNotConfig(**base, qa_pairs="a.jsonl", knowledge_bases=[{"name": "a", "qa_pairs": "a.jsonl"}])
    with pytest.raises(ValidationError, match="must differ"):
        KnowOrNotConfig(
            **base, knowledge_bases=[{"name": "a", "qa_pairs": "a.jsonl"}, {"name": "a", "qa_pairs": "b.jsonl"}]
        )
    with pytest.raises(ValidationError, match="either documents or qa_pairs"):
        KnowOrNotConfig(**base, knowledge_bases=[{"name": "a"}])
    with pytest.raises(ValidationError):
        KnowOrNotConfig(**base, knowledge_bases=[{"name": "../up", "qa_pairs": "a.jsonl"}])
