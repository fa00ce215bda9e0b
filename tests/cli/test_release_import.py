"""``data import release`` and ``evaluate`` on the authors' released layout, with ``protocol: paper``."""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.refusalbench.schema.released import RELEASE_METADATA_KEY
from tests.cli.test_bad_input import run_in_process
from tests.refusalbench.test_released import STRATA, released_records, write_jsonl
from tests.scripted import by_model, fenced, last_user_text, requested_schema, run_config, scripted_judge_reply


def paper_oracle(request: dict[str, Any]) -> str:
    """Answers the answerable records and replies with the expected code alone to the others."""
    text = last_user_text(request)
    (question,) = fenced(text, "question")
    n = int(re.search(r"thing (\d+)", question).group(1))  # type: ignore[union-attr]
    expected = STRATA[n][2]
    return f"It is Answer{n}." if expected == "ANSWER_CORRECTLY" else expected


def paper_judge(request: dict[str, Any]) -> str:
    text = last_user_text(request)
    (response,) = fenced(text, "response")
    hit = any(ref.lower() in response.lower() for ref in fenced(text, "reference_answer"))
    reply: dict[str, Any] = {"quality_score": 5 if hit else 1}
    if requested_schema(request) == "JudgePaperMultiOutput":
        reply |= {"eligibility": int(hit), "factuality": int(hit), "raf": int(hit)}
    return json.dumps(scripted_judge_reply(request, reply))


def test_import_writes_the_benchmark_with_its_license_and_source_hash(tmp_path, capsys):
    source = write_jsonl(tmp_path / "garage.jsonl", released_records("garage"))
    out = tmp_path / "garage.parquet"
    code, printed, err = run_in_process(["data", "import", "release", str(source), "--out", str(out)], capsys)
    assert code == 0, err
    assert printed.strip().startswith(f"{out}: 6 items (single 0, multi 6), license CC-BY-NC-4.0")
    facts = json.loads(pq.read_schema(out).metadata[RELEASE_METADATA_KEY])
    assert facts["license"] == "CC-BY-NC-4.0" and facts["source"] == "garage.jsonl"
    assert pq.read_table(out).column("item_id").to_pylist() == [f"garage-{n}" for n in range(6)]


def test_a_malformed_record_exits_2_naming_file_line_and_field(tmp_path, capsys):
    records = released_records("nq")
    del records[2]["unique_id"]
    source = write_jsonl(tmp_path / "nq.jsonl", records)
    argv = ["data", "import", "release", str(source), "--out", str(tmp_path / "nq.parquet")]
    code, _, err = run_in_process(argv, capsys)
    assert code == 2
    assert err.strip() == f"{source}:3: unique_id: required field is missing"
    assert not (tmp_path / "nq.parquet").exists()


@pytest.mark.usefixtures("prefect_harness")
def test_evaluate_scores_both_releases_item_for_item_under_the_paper_protocol(tmp_path, fake_llm, capsys):
    fake_llm.responder = by_model({"target": paper_oracle, "judge": paper_judge})
    config = run_config(
        tmp_path,
        fake_llm.url,
        ["target", "judge"],
        """
        evaluation:
          targets: [target]
          judge: judge
          protocol: paper
          bootstrap: 50
        """,
    )
    nq_out = tmp_path / "nq.parquet"
    source = write_jsonl(tmp_path / "nq.jsonl", released_records("nq"))
    assert run_in_process(["data", "import", "release", str(source), "--out", str(nq_out)], capsys)[0] == 0
    garage = write_jsonl(tmp_path / "garage.jsonl", released_records("garage"))  # given to evaluate as it is
    for benchmark, name in ((nq_out, "nq"), (garage, "garage")):
        out = tmp_path / f"eval-{name}"
        argv = ["evaluate", "--config", str(config), "--benchmark", str(benchmark), "--out", str(out)]
        code, _, err = run_in_process(argv, capsys)
        assert code == 0, err
        judged = pq.read_table(out / "judgments.parquet").to_pylist()
        assert sorted(j["item_id"] for j in judged) == [f"{name}-{n}" for n in range(6)]
        # Every reply went to the judge, bare codes too; every one is right under the authors' rule.
        assert {j["decision_source"] for j in judged} == {"judge"}
        for j in judged:
            assert (j["answer_correct"] if j["expected"] == "ANSWER_CORRECTLY" else j["refusal_correct"]) is True
        # The run's manifest says where the benchmark came from and under which license.
        notes = json.loads((out / "manifest.json").read_text())["notes"]
        license = "Apache-2.0" if name == "nq" else "CC-BY-NC-4.0"
        assert any(n.startswith(f"benchmark: the released {name}.jsonl (sha256 ") and license in n for n in notes)
        if name == "nq":
            # The viewer's item page shows the votes the released file records for the item.
            from refusalbench.tasks.core.store import ArtifactStore
            from refusalbench.tasks.viewer.data import load_run
            from refusalbench.tasks.viewer.item_page import item_body

            page = item_body("nq", load_run("nq", ArtifactStore(out)).item("nq-1") or {})
            assert "Verifiers (as released)" in page and 'title="no"' in page and 'title="yes"' in page
    prompts = [last_user_text(r) for r in fake_llm.calls_for("target")]
    systems = [r["messages"][0]["content"] for r in fake_llm.calls_for("target")]
    assert len(prompts) == 12 and all("reply with only one of these codes" in s for s in systems)
    assert len(fake_llm.calls_for("judge")) == 12
