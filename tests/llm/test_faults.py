"""Reliability under faults, against the fake OpenAI-compatible server (real HTTP).

- A fault mix (500s, 429s with Retry-After, hung requests, 200s that are not JSON, empty
  replies): both flows complete and every (item, model) pair ends as a result or a
  recorded error; the manifest's counts add up.
- SIGKILL in the middle of ``refusalbench generate``; the same command again finishes and
  re-sends no call that had completed (was in the call cache) before the kill.
- Retries do not multiply: a model that always fails gets exactly ``max_attempts``
  requests per distinct call, although the shard tasks also have Prefect retries.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.scripted_server import FaultRates, ScriptedLLMServer
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Passage
from tests.scripted import by_model, fenced, generator_reply, judge_by_reference, last_user_text, verifier_reply

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parents[2]

# The mix of issue 9: 20% 500, 10% 429 (+Retry-After), 5% hung, 5% non-JSON 200, 5% empty.
FAULT_MIX = FaultRates(server_error=0.20, rate_limited=0.10, hang=0.05, not_json=0.05, empty=0.05, retry_after_s=0.05)

BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
    },
    {"id": "s2", "question": "Who founded the firm?", "answers": ["Ada Lee"], "context": "Ada Lee founded the firm."},
    {"id": "s3", "question": "How tall is the tower?", "answers": ["90 m"], "context": "The tower is 90 m tall."},
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
]
GENERATORS = ["gen-a", "gen-b"]
VERIFIERS = ["ver-a", "ver-b"]


def models_yaml(url: str, names: list[str], **settings) -> str:
    lines = ["models:"]
    for name in names:
        lines += [f"  {name}:", f"    model: openai/{name}", f"    api_base: {url}"]
        lines += [f"    {key}: {value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def write_generation_config(folder: Path, url: str, **settings) -> Path:
    (folder / "base.jsonl").write_text("".join(json.dumps(row) + "\n" for row in BASE))
    config = folder / "generate.yaml"
    config.write_text(
        models_yaml(url, GENERATORS + VERIFIERS, **settings)
        + f"""cache:
  path: {folder / "gen-calls.sqlite"}
generation:
  base_set: base.jsonl
  generators: [{", ".join(GENERATORS)}]
  verifiers: [{", ".join(VERIFIERS)}]
  seed: 3
  strata: [P-Ambiguity/LOW, P-MissingInfo/HIGH]
  shard_size: 3
"""
    )
    return config


def write_evaluation_config(folder: Path, url: str, targets: list[str], **settings) -> Path:
    config = folder / "evaluate.yaml"
    config.write_text(
        models_yaml(url, targets + ["judge"], **settings)
        + f"""cache:
  path: {folder / "eval-calls.sqlite"}
evaluation:
  targets: [{", ".join(targets)}]
  judge: judge
  bootstrap: 50
  shard_size: 3
"""
    )
    return config


def benchmark_items(n: int) -> list[BenchmarkItem]:
    """Half answerable (reference in the context), half missing-info; one multi-document item."""
    items = []
    for i in range(n):
        answerable = i % 2 == 0
        multi = i == n - 1
        reference = f"ref{i}"
        items.append(
            BenchmarkItem(
                item_id=f"item{i}",
                base_id=f"b{i}",
                variant="multi" if multi else "single",
                perturbation_class="P-MissingInfo",
                intensity="LOW" if answerable else "HIGH",
                lever_id="lever",
                generator="gen-a",
                question=f"What is item {i}?",
                context=None if multi else f"The answer is {reference}.",
                passages=[Passage(text=f"The answer is {reference}.", relevant=True)] if multi else None,
                original_question="q",
                answers=[reference],
                expected="ANSWER_CORRECTLY" if answerable else "REFUSE_INFO_MISSING_IN_CONTEXT",
            )
        )
    return items


def write_benchmark(folder: Path, n: int) -> str:
    return ArtifactStore(folder / "bench").write_records("benchmark.parquet", benchmark_items(n), BenchmarkItem)


def reads_reference(request) -> str:
    """A target that answers with whatever the context says."""
    blocks = fenced(last_user_text(request), "context") + fenced(last_user_text(request), "passage")
    for block in blocks:
        if "The answer is" in block:
            return "It is " + block.split("The answer is", 1)[1].strip(" .") + "."
    return "unknown"


def scripted_generation(server: ScriptedLLMServer) -> None:
    server.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "gen-b": lambda req: generator_reply(req, "b"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "ver-b": lambda req: verifier_reply("PASS"),
        }
    )


def one_fault_of_each_kind(server: ScriptedLLMServer) -> None:
    """Queue one fault of every kind ahead of the random mix, so each kind surely occurs."""
    server.fail_next(kind="status", status=500)
    server.fail_next(kind="status", status=429, retry_after=0.05)
    server.fail_next(kind="hang")
    server.fail_next(kind="not_json")
    server.fail_next(kind="empty")


def http_calls(manifest: dict) -> int:
    return int(sum(stats.get("http_calls", 0) for stats in manifest["calls"].values()))


def assert_every_request_counted(manifest: dict, server) -> None:
    """Every request the server saw is in the manifest's HTTP calls: nothing hidden. The manifest may also
    count a request the server never logged: on a loaded machine the client's 1 s timeout can cut one
    before the server (a thread of this process) has read its body. Each such request failed, so it was
    retried or its row failed: at most that many more."""
    sent, seen = http_calls(manifest), len(server.calls)
    failed = int(sum(stats.get("retries", 0) + stats.get("errors", 0) for stats in manifest["calls"].values()))
    assert seen <= sent <= seen + failed, (sent, seen, failed)


# ----------------------------------------------------------------- fault mix


@pytest.fixture
def faulty_llm():
    # hang_s > timeout_s: a hung request is cut by the client's timeout, then retried.
    with ScriptedLLMServer(faults=FAULT_MIX, hang_s=3.0, seed=9) as server:
        one_fault_of_each_kind(server)
        yield server


def test_generation_completes_under_the_fault_mix(tmp_path, faulty_llm):
    from refusalbench.flows.launch import run_generation

    scripted_generation(faulty_llm)
    out = tmp_path / "gen"
    config = write_generation_config(tmp_path, faulty_llm.url, timeout_s=1, max_attempts=4, max_concurrency=4)
    run_generation(str(config), str(out))

    faults = Counter(call["fault"] for call in faulty_llm.calls)
    assert {"status", "hang", "not_json", "empty"} <= set(faults)
    assert {500, 429} <= {call["status"] for call in faulty_llm.calls}

    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    assert manifest["status"] == "completed"
    assert_every_request_counted(manifest, faulty_llm)

    # Candidates: exactly one row per assignment x generator, whatever happened to the call.
    assignments = pd.read_parquet(out / "assignments.parquet")
    candidates = pd.read_parquet(out / "candidates.parquet")
    expected_pairs = {(a, g) for a in assignments.assignment_id for g in GENERATORS}
    assert len(expected_pairs) == len(BASE) * 2 * len(GENERATORS)
    assert len(candidates) == len(expected_pairs)
    assert set(zip(candidates.assignment_id, candidates.generator)) == expected_pairs
    assert set(candidates.status) <= {"ok", "parse_error", "call_error"}
    failed = candidates[candidates.status != "ok"]
    assert failed.error.notna().all() and failed.error.str.len().gt(0).all()
    assert counts["candidates"] == len(candidates) == sum(counts["candidates_by_status"].values())
    for status, n in counts["candidates_by_status"].items():
        assert n == (candidates.status == status).sum()

    # Verifications: one row per parsed candidate x verifier; failed ones are ERROR with the error kept.
    ok = candidates[candidates.status == "ok"]
    verifications = pd.read_parquet(out / "verifications.parquet")
    assert len(verifications) == len(ok) * len(VERIFIERS)
    assert set(zip(verifications.candidate_id, verifications.verifier)) == {
        (c, v) for c in ok.candidate_id for v in VERIFIERS
    }
    assert set(verifications.verdict) <= {"PASS", "FAIL", "ERROR"}
    assert verifications.loc[verifications.verdict == "ERROR", "error"].notna().all()
    assert counts["verifications"] == len(verifications) == sum(counts["verifications_by_verdict"].values())
    for verdict, n in counts["verifications_by_verdict"].items():
        assert n == (verifications.verdict == verdict).sum()

    # Unanimous filter: accepted = parsed candidates that every verifier passed; the funnel agrees.
    passes = verifications[verifications.verdict == "PASS"].groupby("candidate_id").size()
    accepted = set(passes[passes == len(VERIFIERS)].index)
    benchmark = pd.read_parquet(out / "benchmark.parquet")
    assert counts["accepted"] == len(accepted) and counts["sampled"] == len(benchmark)
    gv = json.loads((out / "gv_analysis.json").read_text())
    assert gv["funnel"]["attempted"] == len(candidates)
    assert gv["funnel"]["parsed"] == len(ok)
    assert gv["funnel"]["accepted"] == len(accepted)


def test_evaluation_completes_under_the_fault_mix(tmp_path, faulty_llm):
    from refusalbench.flows.launch import run_evaluation

    faulty_llm.responder = by_model(
        {"reader": reads_reference, "refuser": lambda req: "REFUSE_MISSING", "judge": judge_by_reference}
    )
    targets = ["reader", "refuser"]
    n_items = 8
    out = tmp_path / "eval"
    config = write_evaluation_config(tmp_path, faulty_llm.url, targets, timeout_s=1, max_attempts=4, max_concurrency=4)
    run_evaluation(str(config), write_benchmark(tmp_path, n_items), str(out))

    assert {"status", "hang", "not_json", "empty"} <= {call["fault"] for call in faulty_llm.calls}
    manifest = json.loads((out / "manifest.json").read_text())
    counts = manifest["counts"]
    assert manifest["status"] == "completed"
    assert_every_request_counted(manifest, faulty_llm)

    pairs = {(f"item{i}", t) for i in range(n_items) for t in targets}
    responses = pd.read_parquet(out / "responses.parquet")
    assert len(responses) == len(pairs) and set(zip(responses.item_id, responses.model)) == pairs
    # Each response is either a parsed decision or a recorded error, never neither.
    assert (responses.decision.notna() ^ responses.error.notna()).all()
    assert counts["responses"] == len(responses)
    assert counts["response_errors"] == {
        t: int(((responses.model == t) & responses.error.notna()).sum()) for t in targets
    }

    judgments = pd.read_parquet(out / "judgments.parquet")
    assert len(judgments) == len(pairs) and set(zip(judgments.item_id, judgments.model)) == pairs
    assert counts["judgments"] == len(judgments)
    # A failed response stays failed in its judgment; judge failures are errors too; both are counted.
    failed_responses = set(
        zip(responses.loc[responses.error.notna(), "item_id"], responses.loc[responses.error.notna(), "model"])
    )
    judgment_errors = judgments[judgments.error.notna()]
    assert failed_responses <= set(zip(judgment_errors.item_id, judgment_errors.model))
    excluded = judgment_errors.groupby("model").size().to_dict()
    assert counts["excluded_from_metrics"] == {k: int(v) for k, v in excluded.items()}
    # The judged table holds every judgment: the scored ones (outcome ok) and the errors, each
    # with the outcome and treatment that keep it out of the metrics.
    judged = pd.read_parquet(out / "judged.parquet")
    assert len(judged) == len(judgments)
    assert (judged.outcome == "ok").sum() + len(judgment_errors) == len(judgments)
    unscored = judged[judged.outcome != "ok"]
    assert set(zip(unscored.item_id, unscored.model)) == set(zip(judgment_errors.item_id, judgment_errors.model))
    assert unscored.treatment.str.startswith("excluded from accuracy").all()
    for target in targets:
        assert counts["judged_by_model"][target] == int(((judgments.model == target) & judgments.judge.notna()).sum())
    metrics = json.loads((out / "metrics.json").read_text())["models"]
    assert set(metrics) == {t for t in targets if (judged.model == t).any()}
    for target in targets:
        scored = ((judged.model == target) & (judged.outcome == "ok")).sum()
        assert metrics[target]["n"] == scored
        assert metrics[target]["coverage"] == pytest.approx(scored / n_items)
    assert (out / "report.html").exists()


# ----------------------------------------------------------------- bounded attempts


def test_a_failing_model_gets_exactly_max_attempts_per_call(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_evaluation
    from refusalbench.tasks.pipeline.refusalbench.shard_tasks import respond_shard

    def down(request):
        raise RuntimeError("outage")  # the fake server answers HTTP 500 to every attempt

    fake_llm.responder = by_model({"down": down, "judge": judge_by_reference})
    n_items, max_attempts = 6, 3
    out = tmp_path / "eval"
    config = write_evaluation_config(tmp_path, fake_llm.url, ["down"], max_attempts=max_attempts, max_concurrency=8)
    run_evaluation(str(config), write_benchmark(tmp_path, n_items), str(out))

    # The shard task has Prefect retries too, but a failed call is a value (a recorded
    # error), not an exception, so the task never retries and attempts do not multiply.
    assert respond_shard.retries == 1
    per_request = Counter(call["fingerprint"] for call in fake_llm.calls_for("down"))
    assert len(per_request) == n_items
    assert set(per_request.values()) == {max_attempts}
    assert fake_llm.calls_for("judge") == []  # failed responses are never judged

    responses = pd.read_parquet(out / "responses.parquet")
    assert len(responses) == n_items
    assert responses.error.str.contains(f"after {max_attempts} attempts").all()
    stats = json.loads((out / "manifest.json").read_text())["calls"]["down"]
    assert stats["http_calls"] == n_items * max_attempts
    assert stats["retries"] == n_items * (max_attempts - 1)
    assert stats["errors"] == n_items


# ----------------------------------------------------------------- SIGKILL and resume


def _cached_keys(cache_path: Path) -> set[str]:
    if not cache_path.exists():
        return set()
    with sqlite3.connect(f"file:{cache_path}?mode=ro", uri=True, timeout=5) as conn:
        try:
            return {row[0] for row in conn.execute("SELECT key FROM calls")}
        except sqlite3.OperationalError:  # table not created yet
            return set()


def _logged(log_path: Path) -> list[dict]:
    if not log_path.exists():
        return []
    lines = log_path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _request_key(entry: dict, api_base: str) -> str:
    """The gateway's call-cache key of a request the server at ``api_base`` logged."""
    from refusalbench.tasks.core.config import ModelConfig
    from refusalbench.tasks.llm import structured_outputs as llm_outputs
    from refusalbench.tasks.llm.gateway import request_key

    name = ((entry.get("response_format") or {}).get("json_schema") or {}).get("name")
    schema = getattr(llm_outputs, name) if name else None
    return request_key(ModelConfig(model=f"openai/{entry['model']}", api_base=api_base), entry["messages"], {}, schema)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_resends_no_completed_call(tmp_path):
    import prefect.settings

    log_path = tmp_path / "calls.jsonl"
    with ScriptedLLMServer(latency_s=0.25, log_path=log_path) as server:
        scripted_generation(server)
        config = write_generation_config(tmp_path, server.url, max_concurrency=1, max_attempts=2)
        cache_path = tmp_path / "gen-calls.sqlite"
        out = tmp_path / "run"
        command = [
            sys.executable,
            "-m",
            "refusalbench.flows.cli",
            "generate",
            "--config",
            str(config),
            "--out",
            str(out),
        ]
        # The harness's Prefect API spares each process the start of an ephemeral server.
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            PREFECT_HOME=str(tmp_path / "prefect-home"),
            PREFECT_API_URL=str(prefect.settings.PREFECT_API_URL.value()),
        )

        first = subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 180
            while len(_cached_keys(cache_path)) < 4:
                assert first.poll() is None, first.stdout.read().decode(errors="replace")
                assert time.monotonic() < deadline, "no call completed in time"
                time.sleep(0.05)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(30)
        assert first.returncode == -signal.SIGKILL
        cached_before = _cached_keys(cache_path)
        sent_before = _logged(log_path)
        assert not (out / "benchmark.parquet").exists()  # it really died mid-run
        # Writes are atomic: whatever exists under a final name is whole (temp files are dot-named).
        for path in out.rglob("*.parquet"):
            pq.read_metadata(path)
        for path in out.rglob("*.json"):
            json.loads(path.read_text())

        second = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr[-3000:]

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    everything = _logged(log_path)
    sent_after = everything[len(sent_before) :]
    keys_before = {_request_key(entry, server.url) for entry in sent_before}
    keys_after = [_request_key(entry, server.url) for entry in sent_after]
    all_keys = keys_before | set(keys_after)
    # Sanity of the mapping: whatever was cached had been sent.
    assert cached_before and cached_before <= keys_before
    # The claim: nothing that had completed before the kill was sent again ...
    assert not cached_before & set(keys_after)
    # ... each remaining request was sent once, and the run finished the whole job.
    assert len(keys_after) == len(set(keys_after)) == len(all_keys) - len(cached_before)
    assert manifest["counts"]["candidates"] == len(BASE) * 2 * len(GENERATORS)
    assert len(cached_before) < len(all_keys)
