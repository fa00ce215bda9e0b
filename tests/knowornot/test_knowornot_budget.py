"""``budget_usd`` over every stage of ``knowornot run``, on the scripted server with priced models and a fresh
call cache: the knowledge base's calls (facts, QA pairs), HyDE answers, synthetic questions and the embedding
model's requests are admitted shard by shard like the answers and evaluations; the embedding requests are
priced and counted in the manifest's costs; a budget over an unpriced embedding model is refused."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.cli.test_bad_input import run_in_process
from tests.knowornot.test_knowornot_kb_formats import KB_FIXTURES, pdf_kb_model
from tests.knowornot.test_knowornot_registries import PAIRS
from tests.pipeline.test_budget import spend_within, stopped
from tests.scripted import fenced, last_user_text, requested_schema, run_config

pytestmark = pytest.mark.usefixtures("prefect_harness")

PRICE = {"input_per_mtok": 5.0, "output_per_mtok": 15.0}
EMBEDDING_PRICE = {"input_per_mtok": 130.0, "output_per_mtok": 0.0}

FROM_DOCUMENTS = f"""
knowornot:
  documents: [{KB_FIXTURES / "clinic-handbook.pdf"}]
  extractor: ext
  targets: [tgt]
  evaluator: ev
  retrieval: [hyde_rag]
  hyde_answers: 1
  synthetic_ookb: 2
  prompts: [basic]
  k: 2
  filters: []
  embedder: api
  embedding_model: emb
  label_sample: 0
  shard_size: 2
"""

FROM_QA_FILE = """
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt]
  evaluator: ev
  retrieval: [basic_rag]
  prompts: [basic]
  k: 2
  filters: []
  embedder: api
  embedding_model: emb
  label_sample: 0
  shard_size: 2
"""


def every_role(request):
    """The PDF knowledge base's roles (facts, QA pairs, answers, verdicts), plus HyDE answers and synthetic
    out-of-KB questions."""
    schema = requested_schema(request)
    if schema == "HydeOutput":
        return json.dumps({"answers": ["The handbook answers it."]})
    if schema == "OOKBQuestionsOutput":
        return json.dumps({"questions": ["Does the clinic treat horses?", "Is parking on the roof free?"]})
    if schema == "AtomicFacts":
        (sentence,) = fenced(last_user_text(request), "sentence")
        return json.dumps({"facts": [sentence] if sentence.endswith(".") else []})
    return pdf_kb_model(request)


def write_config(
    tmp_path: Path, url: str, budget: float, sections: str = FROM_DOCUMENTS, *, embedding_price=EMBEDDING_PRICE
) -> Path:
    """Chat models at $5 / $15 per million tokens (max_tokens 100); the embedding model at ``embedding_price``
    (None: unpriced, so LiteLLM's map, which has no ``openai/emb``, cannot price it either)."""
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    prices = {name: {"price": PRICE} for name in ("ext", "tgt", "ev")}
    if embedding_price is not None:
        prices["emb"] = {"price": embedding_price}
    return run_config(
        tmp_path,
        url,
        ["ext", "tgt", "ev", "emb"],
        f"budget_usd: {budget}\n" + sections,
        per_model=prices,
        params={"max_tokens": 100},
        max_attempts=2,
    )


def sent_once(fake_llm) -> None:
    """No request went twice: every chat call's fingerprint and every embedding request's texts once."""
    seen = Counter(
        tuple(call["input"]) if call["wire"] == "embeddings" else call["fingerprint"] for call in fake_llm.calls
    )
    assert seen.most_common(1)[0][1] == 1


def test_knowornot_from_documents_stops_in_its_knowledge_base_and_a_larger_budget_finishes(tmp_path, fake_llm, capfd):
    fake_llm.responder = every_role
    out = tmp_path / "kon"
    budget = 0.01  # a few fact-extraction shards (2 calls each, about $0.003 a call), never the QA pairs
    argv = ["knowornot", "run", "--config", str(write_config(tmp_path, fake_llm.url, budget)), "--out", str(out)]
    code, stdout, err = result = run_in_process(argv, capfd)
    estimate = stopped(result)
    assert "stage facts: the next shard (ext, shard " in err
    spent = spend_within(out / "manifest.json", budget, estimate)
    assert 0 < spent and fake_llm.calls and {call["model"] for call in fake_llm.calls} == {"ext"}
    assert len(fake_llm.calls) < 7  # not every sentence's facts: the budget held inside the knowledge-base task
    costs = json.loads((out / "manifest.json").read_text())["costs"]
    assert costs["by_stage"]["kon-knowledge-base"]["by_model"]["ext"]["cost_usd"] == pytest.approx(spent)

    write_config(tmp_path, fake_llm.url, 10)
    code, _, err = run_in_process(argv, capfd)
    assert code == 0, err
    sent_once(fake_llm)  # the re-run found the first run's facts in the call cache
    assert {call["model"] for call in fake_llm.calls} == {"ext", "tgt", "ev", "emb"}
    manifest = json.loads((out / "manifest.json").read_text())
    embed = manifest["costs"]["by_stage"]["embed"]["by_model"]["emb"]
    embedded = [call for call in fake_llm.calls if call["wire"] == "embeddings"]
    tokens = sum(call["billed"]["prompt_tokens"] for call in embedded)  # the server's usage, as billed
    assert embed["http_calls"] == len(embedded) and embed["prompt_tokens"] == tokens > 0
    assert embed["cost_usd"] == pytest.approx(tokens * EMBEDDING_PRICE["input_per_mtok"] / 1e6)
    assert manifest["calls"]["emb"]["http_calls"] == len(embedded)
    # The embedding spend is part of the run's, which the budget counts.
    total = manifest["costs"]["total"]["cost_usd"]
    assert total == pytest.approx(sum(s["cost_usd"] for s in manifest["costs"]["by_stage"].values()))
    assert total > embed["cost_usd"] > 0


def test_embedding_requests_count_against_the_budget(tmp_path, fake_llm, capfd):
    """An embedding model expensive enough that its first request's estimate is over the budget: the run stops
    at the embeddings, in one line, before any chat call."""
    fake_llm.responder = every_role
    out = tmp_path / "kon"
    config = write_config(
        tmp_path, fake_llm.url, 0.001, FROM_QA_FILE, embedding_price={"input_per_mtok": 1000.0, "output_per_mtok": 0}
    )
    result = run_in_process(["knowornot", "run", "--config", str(config), "--out", str(out)], capfd)
    stopped(result)
    assert "stage embed: the next shard (emb, " in result[2]
    assert fake_llm.calls == []


def test_a_budget_over_an_unpriced_embedding_model_is_refused_before_any_call(tmp_path, fake_llm, capfd):
    fake_llm.responder = every_role
    config = write_config(tmp_path, fake_llm.url, 10, FROM_QA_FILE, embedding_price=None)
    code, out, err = run_in_process(
        ["knowornot", "run", "--config", str(config), "--out", str(tmp_path / "out")], capfd
    )
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in out + err, err
    assert "budget_usd cannot bound emb:" in err and "models.<name>.price" in err and "budget_unpriced" in err
    assert fake_llm.calls == [] and not (tmp_path / "out").exists()


def test_plan_shows_the_embedding_requests_and_their_cost(tmp_path):
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.knowornot.run_plan import plan_knowornot

    plan = plan_knowornot(load_config(write_config(tmp_path, "http://127.0.0.1:9/v1", 10, FROM_DOCUMENTS)))
    embed = plan.stages["embed"]
    assert embed.by_model == {"emb": 1} and embed.models["emb"].output_tokens_max == 0
    assert embed.cost_usd == pytest.approx(embed.input_tokens * EMBEDDING_PRICE["input_per_mtok"] / 1e6)
    assert embed.cost_usd > 0 and "HyDE answers" in embed.note
    assert plan.total.cost_usd == pytest.approx(sum(s.cost_usd for s in plan.stages.values()), abs=1e-5)

    local = plan_knowornot(
        load_config(
            write_config(
                tmp_path,
                "http://127.0.0.1:9/v1",
                10,
                FROM_QA_FILE.replace("  embedder: api\n  embedding_model: emb\n", "  embedder: hashing\n"),
            )
        )
    )
    assert "embed" not in local.stages  # an embedder in this process makes no call
