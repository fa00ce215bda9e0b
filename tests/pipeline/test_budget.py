"""``budget_usd`` in every command that calls models, on the scripted server with priced models and a fresh
call cache: a small budget stops the command in one line (exit 1) with its spend in the manifest, a larger
one resumes without repeating a call, and a budget over an unpriced model is refused before any call."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem
from tests.cli.test_bad_input import run_in_process
from tests.knowornot.test_knowornot_registries import PAIRS
from tests.knowornot.test_knowornot_registries import evaluator as kon_evaluator
from tests.knowornot.test_knowornot_registries import target as kon_target
from tests.pipeline.test_evaluation_flow import ITEMS
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, judge_by_reference, run_config, verifier_reply

pytestmark = pytest.mark.usefixtures("prefect_harness")

PRICE = {"input_per_mtok": 5.0, "output_per_mtok": 15.0}
MODELS = ["gen-a", "ver-a", "answerer", "judge", "tgt", "eval"]
TINY = 0.000001

RB_SECTIONS = """
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH]
  shard_size: 2
evaluation:
  targets: [answerer]
  judge: judge
  bootstrap: 20
  shard_size: 2
"""

KON_SECTION = """
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt]
  evaluator: eval
  prompts: [basic]
  retrieval: [direct]
  filters: []
  embedder: hashing
  k: 2
  label_sample: 2
  shard_size: 2
"""


def scripted(fake_llm):
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "answerer": lambda req: "It is 1932.",
            "judge": judge_by_reference,
            "tgt": kon_target,
            "eval": kon_evaluator,
        }
    )


def write_config(tmp_path: Path, url: str, budget: float, *, unpriced: tuple[str, ...] = (), extra: str = "") -> Path:
    """Every model priced at $5 / $15 per million tokens (those in ``unpriced`` not), max_tokens 100."""
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    return run_config(
        tmp_path,
        url,
        MODELS,
        f"budget_usd: {budget}\n{extra}" + RB_SECTIONS + KON_SECTION,
        per_model={name: {"price": PRICE} for name in MODELS if name not in unpriced},
        params={"max_tokens": 100},
        max_attempts=2,
    )


def stopped(result: tuple[int, str, str]) -> float:
    """The one line of a stop (exit 1, no traceback); returns the refused shard's estimate."""
    code, out, err = result
    assert code == 1, err
    assert "Traceback" not in out + err and "raise " not in out + err, err
    (line,) = [text for text in err.splitlines() if text.startswith("error")]
    assert line.startswith("error: budget_usd: spent $") and "would exceed it" in line, line
    match = re.search(r"about \$([0-9.e+-]+)\)", line)
    assert match is not None, line
    estimate = float(match.group(1))
    assert estimate > 0  # a shard with calls of a priced model never counts as $0
    return estimate


def spend_within(manifest: Path, budget: float, estimate: float) -> float:
    """The stopped run's manifest: failed, its spend and the reason recorded, within one shard of the budget."""
    document = json.loads(manifest.read_text())
    assert document["status"] == "failed"
    record = document["costs"]["budget"]
    assert record["limit_usd"] == budget and "would exceed it" in record["stopped"]
    assert 0 <= record["spent_usd"] <= budget + estimate
    return float(record["spent_usd"])


def no_call_repeated(fake_llm) -> None:
    assert Counter(call["fingerprint"] for call in fake_llm.calls).most_common(1)[0][1] == 1


def test_evaluate_stops_within_its_budget_and_a_larger_one_resumes(tmp_path, fake_llm, capfd):
    scripted(fake_llm)
    benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    out = tmp_path / "eval"
    budget = 0.02  # a few of the five respond shards (2 items each) and none of the judge's
    config = write_config(tmp_path, fake_llm.url, budget)
    argv = ["evaluate", "--config", str(config), "--benchmark", benchmark, "--out", str(out)]
    estimate = stopped(run_in_process(argv, capfd))
    spent = spend_within(out / "manifest.json", budget, estimate)
    first = len(fake_llm.calls)
    assert 0 < first < 2 * len(ITEMS) and spent > 0  # some shards were admitted, not all

    write_config(tmp_path, fake_llm.url, 10)
    code, _, err = run_in_process(argv, capfd)
    assert code == 0, err
    no_call_repeated(fake_llm)
    assert len(fake_llm.calls) > first
    assert json.loads((out / "manifest.json").read_text())["status"] == "completed"


def test_run_stops_before_its_first_shard_and_a_larger_budget_finishes_it(tmp_path, fake_llm, capfd):
    scripted(fake_llm)
    out = tmp_path / "run"
    config = write_config(tmp_path, fake_llm.url, TINY)
    argv = ["run", "--config", str(config), "--out", str(out)]
    estimate = stopped(run_in_process(argv, capfd))
    assert spend_within(out / "manifest.json", TINY, estimate) == 0 and fake_llm.calls == []

    write_config(tmp_path, fake_llm.url, 10)
    code, _, err = run_in_process(argv, capfd)
    assert code == 0, err
    no_call_repeated(fake_llm)
    assert {call["model"] for call in fake_llm.calls} == {"gen-a", "ver-a", "answerer", "judge"}


def test_a_refresh_round_stops_within_its_budget_and_resumes(tmp_path, fake_llm, capfd):
    scripted(fake_llm)
    root = tmp_path / "rounds"
    config = write_config(tmp_path, fake_llm.url, TINY)
    argv = ["refresh", "--config", str(config), "--out", str(root), "--seed", "3"]
    estimate = stopped(run_in_process(argv, capfd))
    (manifest,) = root.glob("*/manifest.json")
    spend_within(manifest, TINY, estimate)
    assert fake_llm.calls == []
    assert json.loads((manifest.parent / "round.json").read_text())["status"] == "stopped"  # resumable

    write_config(tmp_path, fake_llm.url, 10)
    code, _, err = run_in_process(argv, capfd)
    assert code == 0, err
    no_call_repeated(fake_llm)
    assert json.loads(manifest.read_text())["status"] == "completed"  # the same round, finished


def test_knowornot_stops_within_its_budget_and_a_larger_one_resumes(tmp_path, fake_llm, capfd):
    scripted(fake_llm)
    out = tmp_path / "kon"
    budget = 0.002  # one answer shard (2 rows) at most, never the evaluation
    config = write_config(tmp_path, fake_llm.url, budget)
    argv = ["knowornot", "run", "--config", str(config), "--out", str(out)]
    estimate = stopped(run_in_process(argv, capfd))
    spend_within(out / "manifest.json", budget, estimate)
    assert {call["model"] for call in fake_llm.calls} <= {"tgt"}

    write_config(tmp_path, fake_llm.url, 10)
    code, _, err = run_in_process(argv, capfd)
    assert code == 0, err
    no_call_repeated(fake_llm)
    assert {call["model"] for call in fake_llm.calls} == {"tgt", "eval"}


@pytest.mark.parametrize(
    ("command", "unpriced"),
    [
        (["evaluate"], "judge"),
        (["run"], "ver-a"),
        (["generate"], "gen-a"),
        (["refresh"], "answerer"),
        (["knowornot", "run"], "eval"),
    ],
)
def test_a_budget_over_an_unpriced_model_is_refused_before_any_call(tmp_path, fake_llm, capfd, command, unpriced):
    scripted(fake_llm)
    benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    config = write_config(tmp_path, fake_llm.url, 10, unpriced=(unpriced,))
    argv = [*command, "--config", str(config), "--out", str(tmp_path / "out")]
    code, out, err = run_in_process(argv + (["--benchmark", benchmark] if command == ["evaluate"] else []), capfd)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in out + err, err
    assert f"budget_usd cannot bound {unpriced}:" in err and "models.<name>.price" in err and "budget_unpriced" in err
    assert fake_llm.calls == []  # the scripted server saw no request
    assert not (tmp_path / "out").exists()  # nor was a run folder started


def test_budget_unpriced_free_counts_an_unpriced_model_as_free(tmp_path, fake_llm, capfd):
    scripted(fake_llm)
    benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
    out = tmp_path / "eval"
    config = write_config(tmp_path, fake_llm.url, 10, unpriced=("judge",), extra="budget_unpriced: free\n")
    code, _, err = run_in_process(
        ["evaluate", "--config", str(config), "--benchmark", benchmark, "--out", str(out)], capfd
    )
    assert code == 0, err
    notes = json.loads((out / "manifest.json").read_text())["notes"]
    assert any("budget_unpriced: free" in note and "judge" in note for note in notes)
