"""KnowOrNot's registries: a strategy, embedder or spec added by one decorator is used by name.

Each test registers its extension inside the test (and the fixture removes it after), so
other tests still see only the built-ins.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.knowornot.stages.embeddings import EMBEDDERS, HashingEmbedder, register_embedder
from refusalbench.tasks.knowornot.stages.evaluation import EVAL_SPECS, register_eval_spec
from refusalbench.tasks.knowornot.stages.retrieval import RETRIEVERS, register_retriever
from tests.scripted import by_model, fenced, last_user_text, run_config

PAIRS = [
    {"id": f"p{i}", "question": q, "answer": a}
    for i, (q, a) in enumerate(
        [
            ("How long is the warranty on laptops?", "Two years from purchase."),
            ("Who approves travel claims?", "The line manager approves them."),
            ("When are salaries paid?", "On the last working day of the month."),
            ("What is the parking fee per day?", "Four dollars per day."),
        ]
    )
]


def target(request):
    return "I don't know based on the context." if "salaries" in last_user_text(request) else "It is two years."


def evaluator(request):
    text = last_user_text(request)
    if "<abstained>" in text:
        answer = " ".join(fenced(text, "model_answer"))
        return "<abstained>yes</abstained>" if "don't know" in answer else "<abstained>no</abstained>"
    return "<tier>tier_1</tier>"


@pytest.fixture
def restore_registries():
    """Whatever a test registers is removed again afterwards."""
    registries = (RETRIEVERS, EMBEDDERS, EVAL_SPECS)
    before = [set(registry) for registry in registries]
    yield
    for registry, names in zip(registries, before):
        for name in set(registry) - names:
            registry.remove(name)


def write_config(tmp_path, server, **knowornot) -> str:
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    section = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in knowornot.items())
    return str(
        run_config(
            tmp_path,
            server.url,
            ["tgt", "eval"],
            f"""
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt]
  evaluator: eval
  prompts: [basic]
  k: 2
  label_sample: 2
{section}
""",
            max_attempts=2,
        )
    )


@pytest.mark.usefixtures("prefect_harness", "restore_registries")
def test_a_registered_retrieval_strategy_runs_in_the_flow(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_knowornot

    @register_retriever("two_after", uses_k=True)
    class TwoAfter:
        """The two pairs that follow the question's own pair in the KB (wrapping round)."""

        def select_context(self, query, kb, k):
            n = len(kb.pairs)
            return [kb.pairs[(query.own_position + step) % n].id for step in (1, 2)]

    fake_llm.responder = by_model({"tgt": target, "eval": evaluator})
    config = write_config(tmp_path, fake_llm, retrieval=["two_after", "direct"], filters=[], embedder="hashing")
    out = tmp_path / "run"
    result = run_knowornot(config, str(out))

    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    assert result.experiments == len(inputs) == 4 * 2
    mine = inputs[inputs.retrieval == "two_after"].set_index("question_id")
    assert {q: list(ids) for q, ids in mine.context_ids.items()} == {
        "p0": ["p1", "p2"],
        "p1": ["p2", "p3"],
        "p2": ["p3", "p0"],
        "p3": ["p0", "p1"],
    }
    assert (mine.k == 2).all()  # uses_k: the rows record k
    results = pd.read_parquet(out / "results.parquet")
    assert set(results[results.retrieval == "two_after"].abstention) == {"yes", "no"}
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert set(metrics.retrieval) == {"two_after", "direct"}


@pytest.mark.usefixtures("prefect_harness", "restore_registries")
def test_a_registered_embedder_builds_the_index(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_knowornot

    made = []

    @register_embedder("small_hashing")
    def small_hashing():
        made.append(1)
        return HashingEmbedder(dimension=16)

    fake_llm.responder = by_model({"tgt": target, "eval": evaluator})
    config = write_config(
        tmp_path,
        fake_llm,
        retrieval=["basic_rag"],
        filters=["semantic"],
        semantic_threshold=0.0,
        embedder="small_hashing",
    )
    out = tmp_path / "run"
    run_knowornot(config, str(out))

    assert made  # the flow asked the registry for it by name
    meta = json.loads((out / "kb.faiss.json").read_text())
    assert meta["embedder"] == "hashing-bow-16" and meta["size"] == 4
    from refusalbench.tasks.knowornot.stages.retrieval import index_from_bytes

    assert index_from_bytes((out / "kb.faiss").read_bytes()).d == 16
    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    assert set(map(len, inputs.context_ids)) == {2}


@pytest.mark.usefixtures("restore_registries")
def test_config_accepts_only_registered_names(tmp_path):
    from refusalbench.tasks.core.config import load_config

    def config_with(**knowornot):
        path = tmp_path / "kon.yaml"
        section = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in knowornot.items())
        path.write_text(
            f"models:\n  m:\n    model: openai/m\nknowornot:\n  qa_pairs: qa.jsonl\n  targets: [m]\n"
            f"  evaluator: m\n{section}\n"
        )
        return path

    with pytest.raises(InputError) as info:
        load_config(config_with(retrieval=["direct", "bm25"]))
    assert info.value.field == "knowornot.retrieval" and "unknown retrieval strategy 'bm25'" in str(info.value)
    assert "known: direct, long_context, basic_rag, hyde_rag" in str(info.value)
    with pytest.raises(InputError, match="unknown embedder 'tfidf'"):
        load_config(config_with(embedder="tfidf"))

    @register_retriever("bm25")
    def bm25(query, kb, k):
        return []

    register_embedder("tfidf")(HashingEmbedder)
    cfg = load_config(config_with(retrieval=["direct", "bm25"], embedder="tfidf"))
    assert cfg.knowornot.retrieval == ["direct", "bm25"] and RETRIEVERS["bm25"].uses_k is False


@pytest.mark.usefixtures("restore_registries")
def test_label_session_finds_a_registered_spec(tmp_path):
    from refusalbench.tasks.core.store import ArtifactStore
    from refusalbench.tasks.knowornot.human.labels import open_label_session
    from refusalbench.tasks.knowornot.schema import artifacts as kon_files

    sample = pd.DataFrame([{"experiment_id": "e1", "question": "Q?", "response": "R.", "expected_answer": "A."}])
    ArtifactStore(tmp_path).save(kon_files.LABEL_SAMPLE, sample)
    with pytest.raises(InputError, match="unknown evaluation spec"):
        open_label_session(str(tmp_path), "politeness")
    register_eval_spec(EvalSpec(name="politeness", tag="polite", outcomes=["polite", "rude"], prompt="Is it polite?"))
    session = open_label_session(str(tmp_path), "politeness")
    assert [(i.item_id, i.outcomes) for i in session.items] == [("e1", ["polite", "rude"])]
    assert session.labels_path == tmp_path / "labels" / "politeness.jsonl"
