"""Replies that are no answer, as real providers send them (issue 24, items 3, 4 and 9).

Against the scripted server speaking both wire formats through LiteLLM's real adapters (and the
gateway's direct path), one behaviour per scripted model:

- a truncated reply (``finish_reason: length``, Anthropic ``max_tokens``), a reasoning model
  that spent its budget (empty content), a safety block (``content_filter`` empty or with
  canned text, Anthropic ``refusal``, OpenAI's refusal channel, a 400 saying the prompt was
  filtered) and an empty reply are recorded per row as an outcome, never parsed, sent at most
  twice (once more only when empty, or truncated with a larger ``retry_truncated_max_tokens``),
  and never served from the call cache as a success for a structured role;
- every billed reply is counted: the manifest's tokens equal what the server billed;
- the metrics leave those rows out of accuracy and report them as rates; the judged table and
  metrics.json say how each was treated; the response distribution has a seventh column;
- after each stage the story names, per model, the rows lost; a target scored on less than
  ``min_coverage`` of its rows is marked incomplete on the leaderboard (report and Prefect
  artifact), unranked; targets with no scored row are listed; ``--strict`` exits 1;
  ``generate`` exits 1 with one line when calls failed and the benchmark is empty.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter

import pandas as pd
import pytest

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.llm.callcache import SQLiteCache
from refusalbench.tasks.llm.gateway import Gateway
from refusalbench.tasks.llm.scripted_server import CANNED_REFUSAL, Behaviour, ScriptedLLMServer, last_user_text
from refusalbench.tasks.llm.structured_outputs import JudgeSingleOutput
from refusalbench.tasks.refusalbench.scoring import prepare, score_frame
from tests.pipeline.test_evaluation_flow import ITEMS, oracle
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply

ANSWER = "The capital is Paris."
QUESTION = [{"role": "user", "content": "Where is the capital?"}]


def answer_or_judge(request):
    return json.dumps({"quality": 5, "rationale": "stated"}) if request.get("response_format") else ANSWER


# What each scripted behaviour comes to, and how many times its prompt is sent.
BEHAVIOURS = {
    "cutoff": (Behaviour(truncate_at=6, finish="length"), "truncated", 1),
    "thinker": (Behaviour(reasoning="Let me weigh the passage first.", content="", finish="length"), "truncated", 1),
    "filtered": (Behaviour(content="", finish="content_filter"), "provider_blocked", 1),
    "canned": (Behaviour(content=CANNED_REFUSAL, finish="content_filter"), "provider_blocked", 1),
    "refuses": (Behaviour(content=CANNED_REFUSAL, finish="refusal"), "provider_blocked", 1),
    "prompt-filtered": (Behaviour(prompt_filtered=True), "provider_blocked", 1),
    "silent": (Behaviour(content=""), "empty", 2),
    "polite": (Behaviour(), "ok", 1),
}


def gateway_for_server(server: ScriptedLLMServer, wire: str, names, cache=None, **fields) -> Gateway:
    api_base = server.url if wire == "openai" else server.anthropic_url
    models = {
        name: ModelConfig(
            model=f"{wire}/{name}", api_base=api_base, params={"max_tokens": 40}, max_attempts=3, **fields
        )
        for name in names
    }
    return Gateway(models, cache)


def billed_by_gateway(gateway: Gateway, model: str) -> dict[str, int]:
    stats = gateway.stats_snapshot().get(model, {})
    return {
        "prompt_tokens": int(stats.get("prompt_tokens", 0)),
        "completion_tokens": int(stats.get("completion_tokens", 0)),
    }


def billed_by_server(server: ScriptedLLMServer, model: str) -> dict[str, int]:
    billed = server.billed(model)
    return {"prompt_tokens": billed["prompt_tokens"], "completion_tokens": billed["completion_tokens"]}


# ---------------------------------------------------------------- the gateway, one reply at a time


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
@pytest.mark.parametrize("structured", [False, True], ids=["text", "structured"])
def test_each_behaviour_comes_to_its_outcome_sent_at_most_twice_and_billed(wire, structured):
    behaviours = {name: behaviour for name, (behaviour, _, _) in BEHAVIOURS.items()}
    with ScriptedLLMServer(responder=answer_or_judge, behaviours=behaviours) as server:
        gateway = gateway_for_server(server, wire, BEHAVIOURS)
        for name, (_, outcome, sends) in BEHAVIOURS.items():
            if wire == "anthropic" and name == "refuses":
                sends = 1  # the Messages API has no refusal channel: stop_reason refusal, blocked all the same
            result = gateway.complete(name, QUESTION, schema=JudgeSingleOutput if structured else None)
            assert result.outcome == outcome, (name, result.error)
            assert len(server.calls_for(name)) == sends == result.attempts, name
            if outcome != "ok":
                assert result.error.startswith(f"{outcome}: ") and result.error_kind == outcome
                assert result.parsed is None  # a cut or filtered JSON is no output, even when it parses
            # Every billed reply is counted, rejected ones too.
            assert billed_by_gateway(gateway, name) == billed_by_server(server, name), name
        assert billed_by_server(server, "cutoff")["completion_tokens"] == 40  # a length finish bills the budget
        assert billed_by_server(server, "filtered")["prompt_tokens"] > 0
        assert billed_by_server(server, "prompt-filtered") == {"prompt_tokens": 0, "completion_tokens": 0}
        canned = gateway.complete("canned", QUESTION)
        assert canned.text == CANNED_REFUSAL  # the canned text is kept for the record, never scored
        stats = gateway.stats_snapshot()
        assert stats["cutoff"]["truncated"] == 1 and stats["silent"]["outcome_retries"] == 1


def test_the_refusal_channel_names_what_the_provider_said():
    with ScriptedLLMServer(
        responder=answer_or_judge, behaviours={"refuses": Behaviour(content=CANNED_REFUSAL, finish="refusal")}
    ) as server:
        for direct in (True, False):  # the gateway's own HTTP path and LiteLLM read the same channel
            gateway = gateway_for_server(server, "openai", ["refuses"])
            gateway.direct_http = direct
            result = gateway.complete("refuses", QUESTION)
            assert result.outcome == "provider_blocked"
            assert CANNED_REFUSAL in result.error and result.finish_reason == "stop"


def test_a_truncated_reply_is_asked_once_more_with_the_larger_budget(tmp_path):
    behaviour = Behaviour(finish="length")

    def needs_a_hundred_tokens(request):
        # A model whose answer needs more than 100 tokens: cut below that budget, whole above it.
        behaviour.finish = "length" if request["max_tokens"] < 100 else "stop"
        return ANSWER

    with ScriptedLLMServer(responder=needs_a_hundred_tokens, behaviours={"long": behaviour}) as server:
        cache = SQLiteCache(tmp_path / "calls.sqlite")
        gateway = gateway_for_server(server, "openai", ["long"], cache, retry_truncated_max_tokens=400)
        result = gateway.complete("long", QUESTION)
        assert result.outcome == "ok" and result.text == ANSWER and result.attempts == 2
        assert [c["params"]["max_tokens"] for c in server.calls_for("long")] == [40, 400]
        assert billed_by_gateway(gateway, "long") == billed_by_server(server, "long")
        # The usable reply is cached under the request as configured: a re-run sends nothing.
        again = gateway_for_server(server, "openai", ["long"], cache, retry_truncated_max_tokens=400)
        assert again.complete("long", QUESTION).cached and len(server.calls_for("long")) == 2

        # Still cut at the larger budget: truncated, after exactly two sends.
        behaviour_always = Behaviour(finish="length")
        server.behaviours["always"] = behaviour_always
        server.responder = answer_or_judge
        stubborn = gateway_for_server(server, "openai", ["always"], retry_truncated_max_tokens=400)
        assert stubborn.complete("always", QUESTION).outcome == "truncated"
        assert [c["params"]["max_tokens"] for c in server.calls_for("always")] == [40, 400]
        # Without the knob a truncated reply is never re-sent; a budget already that large is not raised.
        plain = gateway_for_server(server, "openai", ["always"], retry_truncated_max_tokens=40)
        assert plain.complete("always", [{"role": "user", "content": "Another?"}]).attempts == 1


def test_structured_replies_that_are_no_answer_are_never_served_from_the_cache(tmp_path):
    behaviours = {
        "cutoff": Behaviour(truncate_at=6, finish="length"),
        "filtered": Behaviour(content="", finish="content_filter"),
    }
    with ScriptedLLMServer(responder=answer_or_judge, behaviours=behaviours) as server:
        cache = SQLiteCache(tmp_path / "calls.sqlite")
        for round_ in (1, 2):  # the second round is a re-run over the same cache
            gateway = gateway_for_server(server, "openai", behaviours, cache)
            for name in behaviours:
                judged = gateway.complete(name, QUESTION, schema=JudgeSingleOutput)
                assert not judged.cached and judged.parsed is None
                assert len([c for c in server.calls_for(name) if c["response_format"]]) == round_
                # A target's truncated or blocked reply is the measurement: cached, served with its outcome.
                target = gateway.complete(name, QUESTION)
                assert target.cached == (round_ == 2) and target.outcome == judged.outcome
                assert len([c for c in server.calls_for(name) if not c["response_format"]]) == 1

        # An entry cached as a success before outcomes were told apart is not served to a structured role.
        from refusalbench.tasks.llm.gateway import request_key

        cfg = ModelConfig(model="openai/cutoff", api_base=server.url, params={"max_tokens": 40})
        key = request_key(cfg, [{"role": "user", "content": "Old?"}], {}, JudgeSingleOutput)
        cache.put(
            key,
            {
                "text": '{"quality": 5, "rationale": "x"}',
                "finish_reason": "length",
                "prompt_tokens": 1,
                "completion_tokens": 40,
                "cost_usd": None,
                "latency_s": 0.1,
            },
        )
        old = gateway_for_server(server, "openai", ["cutoff"], cache).complete(
            "cutoff", [{"role": "user", "content": "Old?"}], schema=JudgeSingleOutput
        )
        assert not old.cached and old.outcome == "truncated"


# ---------------------------------------------------------------- scoring


def judged_rows(outcomes):
    rows = []
    for i, outcome in enumerate(outcomes):
        answerable = i % 2 == 0
        rows.append(
            {
                "model": "m",
                "item_id": f"i{i}",
                "outcome": outcome,
                "expected": "ANSWER_CORRECTLY" if answerable else "REFUSE_INFO_MISSING_IN_CONTEXT",
                "decision": (
                    ("ANSWER" if answerable else "REFUSE_INFO_MISSING_IN_CONTEXT") if outcome == "ok" else None
                ),
                "answer_correct": True if outcome == "ok" and answerable else None,
            }
        )
    return pd.DataFrame(rows)


def test_rows_without_a_usable_response_are_rates_not_answers():
    frame = judged_rows(["ok"] * 4 + ["truncated", "truncated", "provider_blocked", "too_long", "empty", "call_error"])
    result = score_frame(frame, n_resamples=50)
    m = result.metrics["m"]
    # The four scored rows are all right: accuracy is theirs alone, nothing counted as wrong or refused.
    assert m["answer_accuracy"] == 1.0 and m["refusal_accuracy"] == 1.0 and m["n"] == 4
    assert m["false_refusal_rate"] == 0.0 and m["refusal_rate"] == 0.5
    assert m["coverage"] == pytest.approx(0.4)
    assert m["truncated_rate"] == pytest.approx(0.2) and m["blocked_rate"] == pytest.approx(0.1)
    assert m["too_long_rate"] == pytest.approx(0.1) and m["failed_rate"] == pytest.approx(0.1)
    assert m["non_response_rate"] == pytest.approx(0.5)
    assert result.outcomes["m"]["truncated"] == 2 and result.outcomes["m"]["ok"] == 4
    assert result.incomplete == {"m": pytest.approx(0.4)}
    distribution = result.response_distribution.set_index("outcome")
    assert distribution.loc["no_usable_response", "count"] == 6 and set(distribution["n"]) == {10}
    assert distribution["fraction"].sum() == pytest.approx(1.0)
    # Old judged files (no outcome column) score as before.
    assert "coverage" in score_frame(judged_rows(["ok"] * 4).drop(columns="outcome"), n_resamples=0).metrics["m"]


def test_an_unknown_outcome_is_a_bad_row():
    with pytest.raises(InputError, match="outcome: not an outcome: 'lost'"):
        prepare(judged_rows(["ok", "lost"]))


# ---------------------------------------------------------------- the evaluation flow

# Targets on both wire formats, one behaviour each; "polite" and "flaky" read the context.
TARGETS = {
    "polite": ("openai", Behaviour()),
    "flaky": ("openai", Behaviour()),  # its call for item0 fails every attempt (500)
    "cutoff": ("openai", Behaviour(truncate_at=4, finish="length")),
    "thinker": ("openai", Behaviour(reasoning="Let me weigh the passage.", content="", finish="length")),
    "filtered": ("openai", Behaviour(content="", finish="content_filter")),
    "canned": ("openai", Behaviour(content=CANNED_REFUSAL, finish="content_filter")),
    "refuses": ("openai", Behaviour(content=CANNED_REFUSAL, finish="refusal")),
    "prompt-filtered": ("openai", Behaviour(prompt_filtered=True)),
    "silent": ("openai", Behaviour(content="")),
    "claude-refusal": ("anthropic", Behaviour(content="", finish="refusal")),
    "claude-cutoff": ("anthropic", Behaviour(truncate_at=4, finish="length")),
}
EXPECTED = {
    "polite": "ok",
    "cutoff": "truncated",
    "thinker": "truncated",
    "filtered": "provider_blocked",
    "canned": "provider_blocked",
    "refuses": "provider_blocked",
    "prompt-filtered": "provider_blocked",
    "silent": "empty",
    "claude-refusal": "provider_blocked",
    "claude-cutoff": "truncated",
}


def flaky(request):
    if "What is item 0?" in last_user_text(request):
        raise RuntimeError("scripted outage")
    return oracle(request)


def evaluation_config(tmp_path, server, **evaluation) -> str:
    lines = ["models:"]
    for name, (wire, _) in {**TARGETS, "judge": ("openai", None)}.items():
        api_base = server.url if wire == "openai" else server.anthropic_url
        lines += [
            f"  {name}:",
            f"    model: {wire}/{name}",
            f"    api_base: {api_base}",
            "    max_attempts: 2",
            "    params: {max_tokens: 64}",
        ]
    settings = "".join(f"  {k}: {v}\n" for k, v in evaluation.items())
    config = tmp_path / "eval.yaml"
    config.write_text(
        "\n".join(lines)
        + f"""
cache:
  path: {tmp_path / "calls.sqlite"}
evaluation:
  targets: [{", ".join(TARGETS)}]
  judge: judge
  bootstrap: 50
  shard_size: 5
{settings}"""
    )
    return str(config)


def leaderboard_artifact() -> list[dict]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        (latest,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["leaderboard"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )
    data = latest.data
    return json.loads(data) if isinstance(data, str) else data


@contextlib.contextmanager
def story_warnings():
    """The warnings the story sends to the terminal (the ``refusalbench`` logger), as lines."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("refusalbench")
    handler = Collect(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def run_in_process(argv, capsys) -> tuple[int, str]:
    from refusalbench.flows.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


@pytest.mark.usefixtures("prefect_harness")
def test_evaluation_records_scores_bills_and_shows_every_outcome(tmp_path, capsys):
    from refusalbench.flows.launch import run_evaluation

    behaviours = {name: behaviour for name, (_, behaviour) in TARGETS.items()}
    table = {name: oracle for name in TARGETS} | {"flaky": flaky, "judge": judge_by_reference}
    with ScriptedLLMServer(responder=by_model(table), behaviours=behaviours) as server:
        from refusalbench.tasks.core.store import ArtifactStore
        from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem

        benchmark = ArtifactStore(tmp_path / "bench").write_records("benchmark.parquet", ITEMS, BenchmarkItem)
        out = tmp_path / "eval"
        config = evaluation_config(tmp_path, server)
        with story_warnings() as lines:
            run_evaluation(config, benchmark, str(out))

        n = len(ITEMS)
        responses = pd.read_parquet(out / "responses.parquet")
        outcomes = responses.groupby("model")["outcome"].agg(lambda s: Counter(s))
        for name, outcome in EXPECTED.items():
            assert outcomes[name] == Counter({outcome: n}), name
        assert outcomes["flaky"] == Counter({"ok": n - 1, "call_error": 1})
        unusable = responses[responses.outcome != "ok"]
        assert unusable.decision.isna().all() and unusable.error.notna().all()  # never parsed as an answer
        assert set(unusable.loc[unusable.model == "canned", "raw"]) == {CANNED_REFUSAL}

        # No prompt sent more than twice for an empty, truncated or blocked reply; blocked and
        # truncated ones once, empty ones twice.
        for name in EXPECTED:
            sends = Counter(c["fingerprint"] for c in server.calls_for(name))
            assert len(sends) == n and set(sends.values()) == {2 if name == "silent" else 1}, name

        # Billing: the manifest counts every billed reply, rejected ones too.
        manifest = json.loads((out / "manifest.json").read_text())
        for name in [*TARGETS, "judge"]:
            stats = manifest["calls"][name]
            assert {k: int(stats.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")} == billed_by_server(
                server, name
            ), name
        assert manifest["calls"]["cutoff"]["completion_tokens"] == 64 * n  # the whole budget, each time

        # The judged table says what became of each row and how it was treated.
        judged = pd.read_parquet(out / "judged.parquet")
        assert len(judged) == n * len(TARGETS)
        by_row = judged.set_index(["model", "item_id"])
        assert by_row.loc[("cutoff", "item0"), "outcome"] == "truncated"
        assert (
            by_row.loc[("cutoff", "item0"), "treatment"]
            == "excluded from accuracy; counted in non_response_rate and truncated_rate"
        )
        assert by_row.loc[("flaky", "item0"), "treatment"] == "excluded from accuracy; counted in failed_rate"
        assert by_row.loc[("polite", "item0"), "treatment"] == "scored"

        # Metrics: accuracy from scored rows only; the rest as rates, every target listed.
        document = json.loads((out / "metrics.json").read_text())
        metrics = document["models"]
        assert set(metrics) == set(TARGETS)
        assert metrics["polite"]["answer_accuracy"] == 1.0 and metrics["polite"]["coverage"] == 1.0
        assert metrics["flaky"]["answer_accuracy"] == 1.0 and metrics["flaky"]["n"] == n - 1  # item0 left out
        assert metrics["flaky"]["coverage"] == pytest.approx(0.9) and metrics["flaky"]["failed_rate"] == pytest.approx(
            0.1
        )
        for name in ("cutoff", "thinker", "claude-cutoff"):
            assert metrics[name]["truncated_rate"] == 1.0 and metrics[name]["non_response_rate"] == 1.0
        for name in ("filtered", "canned", "refuses", "prompt-filtered", "claude-refusal"):
            assert metrics[name]["blocked_rate"] == 1.0 and metrics[name]["refusal_rate"] is None
            assert metrics[name]["answer_accuracy"] is None and metrics[name]["coverage"] == 0.0
        assert metrics["silent"]["non_response_rate"] == 1.0 and metrics["silent"]["blocked_rate"] == 0.0
        assert document["outcomes"]["canned"]["provider_blocked"] == n
        assert document["outcome_treatment"]["provider_blocked"].startswith("excluded from accuracy")
        assert document["coverage"]["incomplete"]["flaky"] == pytest.approx(0.9)
        assert set(document["coverage"]["no_scored_rows"]) == set(EXPECTED) - {"polite"}
        assert document["response_distribution"]["cutoff"]["no_usable_response"] == 1.0
        assert document["response_distribution"]["polite"]["no_usable_response"] == 0.0
        assert manifest["counts"]["incomplete"]["flaky"] == pytest.approx(0.9)

        # The story: per model, what each stage lost (warnings, so the terminal shows them).
        assert (
            f"respond: cutoff: {n} of {n} rows excluded (0 failed, {n} truncated, 0 blocked, 0 too long, 0 empty)"
            in lines
        )
        assert (
            f"respond: flaky: 1 of {n} rows excluded (1 failed, 0 truncated, 0 blocked, 0 too long, 0 empty)" in lines
        )
        assert any(line.startswith("score: flaky is incomplete: 90.0% of its rows scored") for line in lines)
        assert any(line.startswith("score: no row could be scored for ") and "silent" in line for line in lines)

        # The report: the complete target ranked, the others listed after it, unranked, marked.
        report = (out / "report.html").read_text()
        leaderboard = report.split("<h2>Leaderboard</h2>")[1].split("</table>")[0]
        assert "<tr><td>1</td><td class='name'>polite</td>" in leaderboard
        assert (
            "<td>—</td><td class='name'>flaky <span class='ci'>(incomplete: 90.0% of rows scored)</span></td>"
            in leaderboard
        )
        assert leaderboard.index("polite") < leaderboard.index("flaky") < leaderboard.index("cutoff")
        assert "(incomplete: 0.0% of rows scored)" in leaderboard.split("canned", 1)[1].split("</tr>")[0]
        assert "<h2>Rows not scored</h2>" in report and "No row could be scored for: canned" in report

        # The Prefect leaderboard artifact says the same.
        board = {row["model"]: row for row in leaderboard_artifact()}
        assert set(board) == set(TARGETS)
        assert (board["polite"]["rank"], board["polite"]["status"]) == (1, "complete")
        assert (board["flaky"]["rank"], board["flaky"]["status"], board["flaky"]["coverage"]) == (
            None,
            "incomplete",
            0.9,
        )
        assert board["cutoff"]["coverage"] == 0.0 and board["cutoff"]["rank"] is None

        # --strict fails a run with an incomplete target. A re-run: the call cache serves every
        # reply but the empty ones and the failed call, which are asked again.
        calls = len(server.calls)
        code, err = run_in_process(
            ["evaluate", "--config", config, "--benchmark", benchmark, "--out", str(tmp_path / "strict"), "--strict"],
            capsys,
        )
        assert code == 1, err
        assert f"--strict: {len(TARGETS) - 1} incomplete target(s): canned (0.0% of rows scored)" in err
        assert Counter(c["model"] for c in server.calls[calls:]) == {"silent": 2 * n, "flaky": 2}
        code, err = run_in_process(
            ["evaluate", "--config", config, "--benchmark", benchmark, "--out", str(tmp_path / "lenient")], capsys
        )
        assert code == 0 and "incomplete (listed unranked on the leaderboard): canned" in err


# ---------------------------------------------------------------- the generation flow


@pytest.mark.usefixtures("prefect_harness")
def test_generate_exits_1_naming_the_cause_when_calls_failed_and_the_benchmark_is_empty(tmp_path, capsys):
    from tests.llm.test_faults import BASE

    behaviours = {
        "gen-a": Behaviour(content="", finish="content_filter"),
        "gen-b": Behaviour(truncate_at=10, finish="length"),
    }
    table = {"gen-a": generator_reply, "gen-b": generator_reply, "ver-a": lambda r: verifier_reply("PASS")}
    with ScriptedLLMServer(responder=by_model(table), behaviours=behaviours) as server:
        (tmp_path / "base.jsonl").write_text("".join(json.dumps(row) + "\n" for row in BASE))
        models = "".join(
            f"  {m}:\n    model: openai/{m}\n    api_base: {server.url}\n    params: {{max_tokens: 50}}\n"
            for m in ("gen-a", "gen-b", "ver-a")
        )
        config = tmp_path / "gen.yaml"
        config.write_text(f"""models:
{models}cache:
  path: {tmp_path / "calls.sqlite"}
generation:
  base_set: base.jsonl
  generators: [gen-a, gen-b]
  verifiers: [ver-a]
  strata: [P-Ambiguity/LOW]
  seed: 1
""")
        out = tmp_path / "gen"
        code, err = run_in_process(["generate", "--config", str(config), "--out", str(out)], capsys)
        assert code == 1
        (line,) = [line for line in err.splitlines() if line.startswith("error: ")]
        assert line.startswith("error: the benchmark is empty: ")
        assert "generator calls brought no usable reply" in line
        assert "provider_blocked" in line and "truncated" in line

        candidates = pd.read_parquet(out / "candidates.parquet")
        assert set(candidates.status) == {"call_error"}
        assert dict(Counter(zip(candidates.generator, candidates.outcome))) == {
            ("gen-a", "provider_blocked"): len(BASE),
            ("gen-b", "truncated"): len(BASE),
        }
        # Sent once each (no retry of a blocked or truncated structured call), and billed.
        for name in ("gen-a", "gen-b"):
            assert set(Counter(c["fingerprint"] for c in server.calls_for(name)).values()) == {1}
        manifest = json.loads((out / "manifest.json").read_text())
        for name in ("gen-a", "gen-b"):
            stats = manifest["calls"][name]
            assert {k: int(stats.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")} == billed_by_server(
                server, name
            )
        assert manifest["counts"]["generate_outcomes"]["gen-a"]["blocked"] == len(BASE)
        assert "natural imbalance" not in json.dumps(manifest.get("notes", []))
