"""Knowledge bases as users have them: a PDF through facts -> QA -> leave-one-out, and an embedding
model called through LiteLLM's embedding call (the scripted server's ``/v1/embeddings``), cached."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.scripted import fenced, last_user_text, requested_schema, run_config

KB_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "knowornot_docs"


def pdf_kb_model(request):
    """Every KnowOrNot role for the PDF knowledge base: a fact per sentence that states one (headings give
    none), the fact as a question, a target that answers from its context, an evaluator that agrees."""
    text = last_user_text(request)
    schema = requested_schema(request)
    if schema == "AtomicFacts":
        (sentence,) = fenced(text, "sentence")
        return json.dumps({"facts": [sentence] if sentence.endswith(".") else []})
    if schema == "QAPairOutput":
        (fact,) = fenced(text, "fact")
        return json.dumps({"question": f"Is it true that {fact[0].lower()}{fact[1:].rstrip('.')}?", "answer": fact})
    if "<abstained>" in text:
        return "<abstained>no</abstained>"
    if "<tier>" in text:
        return "<tier>tier_1</tier>"
    return "Yes, the handbook says so."


@pytest.mark.usefixtures("prefect_harness")
def test_pdf_knowledge_base_goes_through_facts_qa_and_leave_one_out(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_knowornot

    fake_llm.responder = pdf_kb_model
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["kon", "emb"],
        f"""
knowornot:
  documents: [{KB_FIXTURES / "clinic-handbook.pdf"}]
  targets: [kon]
  evaluator: kon
  retrieval: [basic_rag]
  prompts: [basic]
  k: 2
  filters: []
  embedder: api
  embedding_model: emb
  label_sample: 0
""",
        max_attempts=2,
    )
    out = tmp_path / "run"
    result = run_knowornot(str(config), str(out))

    sentences = pd.read_parquet(out / "sentences.parquet")
    assert set(sentences.doc_id) == {"clinic-handbook"} and len(sentences) == 7  # 2 headings + 5 sentences
    assert sentences.text.iloc[0] == "Harbour Clinic Handbook"  # a heading is never glued to a sentence
    facts = pd.read_parquet(out / "facts.parquet")
    assert len(facts) == 5 and "Children under twelve are seen free of charge." in set(facts.text)
    pairs = pd.read_parquet(out / "qa_pairs.parquet")
    assert len(pairs) == 5 and set(pairs.source) <= set(facts.fact_id)
    inputs = pd.read_parquet(out / "experiment_inputs.parquet")
    assert result.experiments == len(inputs) == 5
    assert not any(row.question_id in list(row.context_ids) for row in inputs.itertuples())  # leave-one-out
    assert set(map(len, inputs.context_ids)) == {2}
    assert json.loads((out / "kb.faiss.json").read_text())["embedder"] == "api:openai/emb"
    assert set(pd.read_parquet(out / "results.parquet").abstention) == {"no"}
    # The index and the questions were embedded by the embedding model, over HTTP, in batches.
    embedded = [c for c in fake_llm.calls if c["wire"] == "embeddings"]
    assert {c["model"] for c in embedded} == {"emb"} and sum(len(c["input"]) for c in embedded) == 10


QA = [
    ("How long is the laptop warranty?", "Laptops carry a two year warranty."),
    ("Does the laptop warranty cover batteries?", "The laptop warranty covers batteries for one year."),
    ("When is the canteen open?", "The canteen opens at noon."),
    ("What does the canteen serve on Fridays?", "The canteen serves fish on Fridays."),
]


def test_api_embedder_retrieves_through_litellm_and_a_rerun_sends_nothing(tmp_path, fake_llm):
    from refusalbench.tasks.core.config import ModelConfig
    from refusalbench.tasks.knowornot.schema.records import QAPair
    from refusalbench.tasks.knowornot.stages.embeddings import make_embedder
    from refusalbench.tasks.knowornot.stages.retrieval import build_experiment_inputs, build_index, pair_text
    from refusalbench.tasks.llm.callcache import open_cache

    pairs = [QAPair(id=f"q{i}", question=q, answer=a) for i, (q, a) in enumerate(QA)]
    model = ModelConfig(
        model="openai/text-embedding-3-small", api_base=fake_llm.url, max_attempts=2, params={"dimensions": 32}
    )
    cache = open_cache("sqlite", path=str(tmp_path / "calls.sqlite"))

    def retrieve():
        embedder = make_embedder("api", cache, model=model)
        index = build_index(embedder.embed([pair_text(p) for p in pairs]))
        return embedder, build_experiment_inputs(
            pairs, embedder.embed([p.question for p in pairs]), index, ["t"], ["basic_rag"], ["basic"], k=1
        )

    fake_llm.fail_next(1, status=500)  # retried by the client, not by the SDK behind it
    embedder, rows = retrieve()
    calls = [c for c in fake_llm.calls if c["wire"] == "embeddings"]
    assert [c["status"] for c in calls] == [500, 200, 200] and embedder.inner.client.requests == 3
    assert calls[1]["params"]["dimensions"] == 32 and len(calls[1]["input"]) == 4  # one batch, the model's params
    assert embedder.dimension == 32 and embedder.name == "api:openai/text-embedding-3-small;dimensions=32"
    # Leave-one-out: each question's nearest other pair is its topic's neighbour.
    assert {r.question_id: list(r.context_ids) for r in rows} == {
        "q0": ["q1"],
        "q1": ["q0"],
        "q2": ["q3"],
        "q3": ["q2"],
    }
    # A re-run (a new embedder over the same call cache) sends no request and gets the same vectors.
    again, rows_again = retrieve()
    assert len(fake_llm.calls) == 3 and again.inner.client.requests == 0
    assert [r.context_ids for r in rows_again] == [r.context_ids for r in rows]
    assert np.array_equal(again.embed(["When is the canteen open?"]), embedder.embed(["When is the canteen open?"]))
    # Another deployment of the same model string is another cache entry: it is asked.
    elsewhere = model.model_copy(update={"api_base": fake_llm.url.replace("127.0.0.1", "localhost")})
    make_embedder("api", cache, model=elsewhere).embed(["When is the canteen open?"])
    assert len(fake_llm.calls) == 4


def test_embedding_requests_skip_litellm_where_it_would_send_them_unchanged(fake_llm):
    """An ``openai/`` model behind an endpoint, with plain parameters, is posted directly: the body LiteLLM's
    OpenAI path sends (``encoding_format: float``, the name without its prefix, a Bearer key), a 429's
    Retry-After waited for; other parameters or providers keep LiteLLM."""
    from refusalbench.tasks.core.config import ModelConfig
    from refusalbench.tasks.llm.embedding_calls import EmbeddingClient

    model = ModelConfig(model="openai/text-embedding-3-large", api_base=fake_llm.url, params={"dimensions": 16})
    client = EmbeddingClient(model)
    assert client.direct
    fake_llm.fail_next(1, status=429, retry_after=0.05)
    vectors = client.embed(["canteen hours", "warranty"])
    calls = [c for c in fake_llm.calls if c["wire"] == "embeddings"]
    assert [c["status"] for c in calls] == [429, 200] and client.requests == 2
    assert calls[1]["model"] == "text-embedding-3-large" and calls[1]["input"] == ["canteen hours", "warranty"]
    assert calls[1]["params"] == {"encoding_format": "float", "dimensions": 16}
    assert calls[1]["authorization"] == "Bearer no-key"
    assert len(vectors) == 2 and {len(v) for v in vectors} == {16}
    fake_llm.fail_next(1, status=400)  # not worth another attempt: the run ends with it
    with pytest.raises(Exception, match="HTTP 400"):
        client.embed(["x"])
    assert not EmbeddingClient(model.model_copy(update={"params": {"input_type": "query"}})).direct
    assert not EmbeddingClient(model.model_copy(update={"model": "hosted_vllm/e5"})).direct
    assert not EmbeddingClient(model.model_copy(update={"api_base": None})).direct


def test_api_embedder_needs_an_embedding_model_of_the_registry(tmp_path):
    from refusalbench.tasks.core.config import load_config

    def problem(knowornot: str) -> str:
        path = tmp_path / "run.yaml"
        path.write_text(
            "models:\n  m: {model: openai/m}\nknowornot:\n  qa_pairs: qa.jsonl\n  targets: [m]\n"
            f"  evaluator: m\n{knowornot}"
        )
        with pytest.raises(Exception) as info:
            load_config(path)
        return str(info.value)

    assert "name it in knowornot.embedding_model" in problem("  embedder: api\n")
    assert "knowornot.embedding_model: model 'nope' is not in the registry" in problem(
        "  embedder: api\n  embedding_model: nope\n"
    )
    assert "embedding_model is called only by embedder 'api'" in problem("  embedder: hashing\n  embedding_model: m\n")
