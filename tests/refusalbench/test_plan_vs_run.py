"""`plan` against the run it plans: on the scripted server with an empty call cache, the calls
`plan --format json` predicts are the calls `refusalbench run` sends (issue 14, part 5).

Generation is exact; verification, responses and judging depend on earlier outcomes, so the plan
gives ceilings there, and the script makes those outcomes bite (a generator that garbles multi-
document items, a verifier that fails every HIGH perturbation, a target that always refuses) so
that the ceilings are tested as ceilings. Given the benchmark the run produced, ``plan
--benchmark`` sizes the responses exactly. The standalone ``refusalbench pretest`` is checked the
same way against the plan's pre-test stage.

Models share roles as in the paper's configs (a generator is also a verifier, a target and the
judge), so calls are attributed to stages by the JSON schema each request asks for, not by model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from refusalbench.tasks.llm.scripted_server import request_fingerprint
from tests.scripted import (
    fenced,
    generator_reply,
    intensity_of,
    judge_by_reference,
    last_user_text,
    requested_schema,
    run_config,
    verifier_reply,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parents[2]

BASE = [
    {
        "id": "s1",
        "question": "When was the bridge opened?",
        "answers": ["1932"],
        "context": "The bridge opened in 1932.",
    },
    {"id": "s2", "question": "Who founded the firm?", "answers": ["Ada Lee"], "context": "Ada Lee founded the firm."},
    {"id": "s3", "question": "Where is the mill?", "answers": ["Tarn"], "context": "The mill stands in Tarn."},
    {"id": "s4", "question": "How tall is the tower?", "answers": ["80 m"], "context": "The tower is 80 m tall."},
    {
        "id": "m1",
        "question": "What is the dose?",
        "answers": ["5 mg"],
        "passages": [{"text": "The dose is 5 mg.", "relevant": True}, {"text": "Unrelated.", "relevant": False}],
    },
    {
        "id": "m2",
        "question": "Which port is closed?",
        "answers": ["Dover"],
        "passages": [{"text": "Noise.", "relevant": False}, {"text": "The port of Dover is closed.", "relevant": True}],
    },
]  # base_sample 5 of 6 keeps at least one multi-document item, which beta garbles

STAGE_OF_SCHEMA = {
    "GeneratorSingleOutput": "generate",
    "GeneratorMultiOutput": "generate",
    "VerifierOutput": "verify",
    "JudgeSingleOutput": "judge",
    "JudgeMultiOutput": "judge",
    "JudgeDecisionOutput": "judge",
    None: "respond",
}


def write_config(tmp_path: Path, url: str, extra: str = "") -> Path:
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(row) + "\n" for row in BASE))
    return run_config(
        tmp_path,
        url,
        ("alpha", "beta", "gamma", "delta"),
        f"""
generation:
  base_set: base.jsonl
  generators: [alpha, beta]
  verifiers: [alpha, gamma]
  seed: 3
  base_sample: 5
  strata: [P-MissingInfo/LOW, P-Contradiction/LOW, P-MissingInfo/HIGH, P-Ambiguity/MEDIUM]
  target_size: 10
  shard_size: 3
{extra}evaluation:
  targets: [beta, delta]
  judge: gamma
  bootstrap: 50
  shard_size: 4
""",
        max_concurrency=4,
        max_attempts=1,
        params={"max_tokens": 256},
    )


def responder(request: dict) -> str:
    """Replies by role (the schema asked for), with the outcome-dependent twists of the module doc."""
    model, schema = request["model"], requested_schema(request)
    fingerprint = request_fingerprint(request)
    if schema in ("GeneratorSingleOutput", "GeneratorMultiOutput"):
        if model == "beta" and schema == "GeneratorMultiOutput":
            return "no JSON from me"  # a parse error: never verified
        return generator_reply(request, f"{model} {fingerprint}")  # distinct perturbations, distinct prompts later
    if schema == "VerifierOutput":
        return verifier_reply("FAIL" if model == "gamma" and intensity_of(request) == "HIGH" else "PASS")
    if schema in ("JudgeSingleOutput", "JudgeMultiOutput", "JudgeDecisionOutput"):
        return judge_by_reference(request)
    if model == "delta":
        return "REFUSE_INFO_MISSING_IN_CONTEXT"  # a reply that is only a code is never judged
    return f"It might be 1932 ({fingerprint}). Confidence: high"


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def planned(config: Path, *extra: str) -> dict:
    result = cli("plan", "--config", str(config), "--format", "json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def sent_by_stage(calls: list[dict]) -> dict[str, Counter[str]]:
    stages: dict[str, Counter[str]] = {}
    for call in calls:
        name = (call.get("response_format") or {}).get("json_schema", {}).get("name")
        stages.setdefault(STAGE_OF_SCHEMA[name], Counter())[call["model"]] += 1
    return stages


def test_plan_predicts_the_calls_of_the_run(tmp_path, fake_llm):
    import prefect.settings

    fake_llm.responder = responder
    config = write_config(tmp_path, fake_llm.url)
    plan = planned(config)
    assert list(plan["stages"]) == ["generate", "verify", "respond", "judge"]
    assert fake_llm.calls == []  # planning calls no model

    out = tmp_path / "run"
    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_URL=str(prefect.settings.PREFECT_API_URL.value()),
    )
    done = cli("run", "--config", str(config), "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(call["status"] == 200 for call in fake_llm.calls)  # no retry inflates the counts
    sent = sent_by_stage(fake_llm.calls)
    assert set(sent) == {"generate", "verify", "respond", "judge"}

    # Generation: exact, per model.
    assert plan["stages"]["generate"]["by_model"] == dict(sent["generate"])
    assert plan["stages"]["generate"]["calls"] == sum(sent["generate"].values())
    # Outcome-dependent stages: ceilings, per model, and the script makes each one strict somewhere.
    for stage in ("verify", "respond", "judge"):
        predicted = plan["stages"][stage]["by_model"]
        assert set(sent[stage]) <= set(predicted), stage
        assert all(predicted[model] >= count for model, count in sent[stage].items()), (stage, predicted, sent[stage])
        assert plan["stages"][stage]["calls"] > sum(sent[stage].values()), stage
    assert "delta" not in sent["judge"] and sent["judge"]["gamma"] > 0  # delta refuses: nothing to judge
    assert plan["total"]["calls"] >= len(fake_llm.calls)

    # Given the benchmark the run made, the responses are planned exactly; judging stays a ceiling.
    exact = planned(config, "--benchmark", str(out / "benchmark.parquet"))
    assert list(exact["stages"]) == ["respond", "judge"]
    assert exact["stages"]["respond"]["by_model"] == dict(sent["respond"])
    assert exact["stages"]["judge"]["calls"] >= sum(sent["judge"].values())
    assert exact["stages"]["judge"]["by_model"]["gamma"] >= sent["judge"]["gamma"]


def pretest_responder(request: dict) -> str:
    """Pre-test models give the reference answer (delta refuses one item); gamma judges."""
    if requested_schema(request) in ("JudgeSingleOutput", "JudgeMultiOutput"):
        return judge_by_reference(request)
    (question,) = fenced(last_user_text(request), "question")
    if request["model"] == "delta" and "mill" in question:
        return "REFUSE_INFO_MISSING_IN_CONTEXT"
    return next(row["answers"][0] for row in BASE if row["question"] == question)


def test_plan_predicts_the_calls_of_the_pretest(tmp_path, fake_llm):
    import prefect.settings

    fake_llm.responder = pretest_responder
    config = write_config(tmp_path, fake_llm.url, "  pretest: {models: [beta, delta], judge: gamma}\n")
    plan = planned(config)
    assert list(plan["stages"]) == ["pretest", "generate", "verify", "respond", "judge"]
    assert plan["stages"]["generate"]["upper_bound"]  # the pre-test may keep fewer items

    env = dict(
        os.environ,
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_URL=str(prefect.settings.PREFECT_API_URL.value()),
    )
    done = cli("pretest", "--config", str(config), "--out", str(tmp_path / "pre"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("(base items: imported 6 -> pretested 6 -> kept 5 -> sampled 5)")
    sent = sent_by_stage(fake_llm.calls)
    assert set(sent) == {"respond", "judge"}  # answers without a schema, judgments with one
    predicted = plan["stages"]["pretest"]["by_model"]
    # Every base item is answered by every pre-test model: exact. Judging is a ceiling: the refusal
    # is not judged, and two models giving the same answer to an item share one judge call.
    assert {m: predicted[m] for m in ("beta", "delta")} == dict(sent["respond"]) == {"beta": 6, "delta": 6}
    assert predicted["gamma"] == 12 and 0 < sent["judge"]["gamma"] < 12
