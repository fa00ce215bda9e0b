"""``refusalbench view`` on real run folders, as a real process, driven by headless Chromium with real clicks.

One module-scoped set of runs made by the scripted pipeline: a main run (generate + evaluate), a
second evaluation of its benchmark in which one target changed its mind (the comparison), and a
KnowOrNot run with a human label. One viewer process serves all three for the module.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest

from tests.browser import Browser
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import (
    by_model,
    fenced,
    generator_reply,
    judge_by_reference,
    last_user_text,
    run_config,
    verifier_reply,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["answerer", "cautious", "mixed"]
RATIONALE = "The scripted judge read:"
SCRIPT = "<script>alert('x')</script>"
KEYWORDS = ("bridge", "firm", "dose")  # one per base item of BASE


def generator(request: dict) -> str:
    """A perturbed question naming its base item, so a search finds that base item's items alone."""
    text = json.dumps(request["messages"])
    return generator_reply(request, next((w for w in KEYWORDS if w in text), "other"))


def judge(request: dict) -> str:
    reply = json.loads(judge_by_reference(request))
    (response,) = fenced(last_user_text(request), "response")
    reply["rationale"] = f"{RATIONALE} {response[:24]}"
    return json.dumps(reply)


def target(kind: str, changed: bool = False):
    def reply(request: dict) -> str:
        if kind == "answerer":
            return "REFUSE_INFO_MISSING" if changed else "The answer is Perturbed context."
        if kind == "cautious":
            return "REFUSE_AMBIGUOUS: I cannot tell which is meant."
        return f"Maybe {SCRIPT} it is Perturbed context."

    return reply


def _viewer(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "refusalbench.flows.cli", "view", *args, "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _url_of(process: subprocess.Popen, timeout_s: float = 120) -> str:
    """The URL the viewer prints once it listens."""
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            raise AssertionError(f"the viewer exited {process.returncode}: {process.stderr.read()}")
        found = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
        if found:
            return found.group(1)
    raise AssertionError("the viewer printed no URL")


@pytest.fixture(scope="module")
def llm() -> Iterator:
    from refusalbench.tasks.llm.scripted_server import ScriptedLLMServer

    with ScriptedLLMServer() as server:
        yield server


@pytest.fixture(scope="module")
def runs(tmp_path_factory, llm, prefect_harness) -> dict[str, Path]:
    """round-1: a main run; round-2: its benchmark evaluated again, the answerer now refusing; kon: KnowOrNot."""
    from refusalbench.flows.launch import run_evaluation, run_knowornot, run_main
    from refusalbench.tasks.core.human_labels import HumanLabel
    from refusalbench.tasks.labelling.label_store import LabelStore

    folder = tmp_path_factory.mktemp("viewer")
    (folder / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = ["gen-a", "ver-a", *TARGETS, "judge", "tgt", "eval"]
    table = {
        "gen-a": generator,
        "ver-a": lambda r: verifier_reply("PASS"),
        "judge": judge,
        **{t: target(t) for t in TARGETS},
    }
    llm.responder = by_model(table)
    config = run_config(
        folder,
        llm.url,
        models,
        """
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH, P-Ambiguity/HIGH]
evaluation:
  targets: [answerer, cautious, mixed]
  judge: judge
  bootstrap: 50
""",
        max_attempts=2,
    )
    first, second, kon = folder / "round-1", folder / "round-2", folder / "kon"
    run_main(str(config), str(first))

    llm.responder = by_model({**table, "answerer": target("answerer", changed=True)})
    again = folder / "again"
    again.mkdir()
    config = run_config(
        again,
        llm.url,
        models,
        """
evaluation:
  targets: [answerer, cautious, mixed]
  judge: judge
  bootstrap: 50
""",
        max_attempts=2,
    )
    run_evaluation(str(config), str(first / "benchmark.parquet"), str(second))

    pairs = [
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
    (folder / "qa.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    llm.responder = by_model(
        {
            "tgt": lambda r: "It is two years.",
            "eval": lambda r: "The model answered. <abstained>no</abstained> <tier>tier_2</tier>",
        }
    )
    config = run_config(
        folder,
        llm.url,
        models,
        """
knowornot:
  qa_pairs: qa.jsonl
  targets: [tgt]
  evaluator: eval
  retrieval: [direct, basic_rag]
  prompts: [basic]
  k: 2
  filters: []
  embedder: hashing
  label_sample: 2
  synthetic_ookb: 0
""",
        max_attempts=2,
    )
    run_knowornot(str(config), str(kon))
    experiment = pd.read_parquet(kon / "results.parquet").experiment_id.iloc[0]
    LabelStore(kon / "labels" / "abstention.jsonl").append(
        HumanLabel(
            item_id=experiment,
            spec="abstention",
            annotator="ann",
            label="yes",
            labelled_at="2025-01-02T03:04:05Z",
            note="hedged answer",
        )
    )
    return {"round-1": first, "round-2": second, "kon": kon}


@pytest.fixture(scope="module")
def viewer(runs) -> Iterator[str]:
    process = _viewer(str(runs["round-1"]), str(runs["round-2"]), str(runs["kon"]))
    try:
        yield _url_of(process)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser() as chromium:
        yield chromium


def _benchmark(runs) -> pd.DataFrame:
    return pd.read_parquet(runs["round-1"] / "benchmark.parquet")


# ---------------------------------------------------------------- in the browser

ROW_CLASSES = "Array.from(document.querySelectorAll('table.items tbody tr td.class')).map(c => c.innerText.trim())"


def test_clicking_a_class_filters_the_item_table_to_it(viewer, runs, browser):
    items = _benchmark(runs)
    assert set(items.perturbation_class) == {"P-MissingInfo", "P-Ambiguity"}
    with browser.tab(1400, 900) as tab:
        tab.open(f"{viewer}/runs/round-1/items")
        assert sorted(tab.evaluate(ROW_CLASSES)) == sorted(items.perturbation_class)
        tab.click("a.chip[data-filter=perturbation_class]", text="P-Ambiguity", navigates=True)
        shown = tab.evaluate(ROW_CLASSES)
        assert shown == ["P-Ambiguity"] * int((items.perturbation_class == "P-Ambiguity").sum())
        assert "class=P-Ambiguity" in tab.evaluate("location.search")
        # The filter's own select says what is applied; "clear" brings every item back.
        assert tab.evaluate("document.querySelector('select[name=class]').value") == "P-Ambiguity"
        tab.click("form.filters a", text="clear", navigates=True)
        assert len(tab.evaluate(ROW_CLASSES)) == len(items)


def test_searching_a_question_finds_its_items_alone(viewer, runs, browser):
    items = _benchmark(runs)
    wanted = items[items.question.str.contains("question firm")]
    assert 0 < len(wanted) < len(items)
    with browser.tab(1400, 900) as tab:
        tab.open(f"{viewer}/runs/round-1/items")
        tab.type("input[name=q]", "question FIRM")
        tab.click("#apply", navigates=True)
        questions = tab.evaluate("Array.from(document.querySelectorAll('a.item-link')).map(a => a.innerText)")
        assert sorted(questions) == sorted(wanted.question)
        assert tab.evaluate("document.querySelector('.pager .total').innerText") == str(len(wanted))
        # Enter in the search field searches too.
        tab.evaluate("document.querySelector('input[name=q]').value = ''")
        tab.type("input[name=q]", "no such words anywhere")
        tab.press_enter(navigates=True)
        assert tab.evaluate("document.querySelectorAll('a.item-link').length") == 0


def test_an_item_shows_the_change_every_reply_and_the_judges_rationale(viewer, runs, browser, tmp_path):
    with browser.tab(1400, 900) as tab:
        tab.open(f"{viewer}/runs/round-1/items?class=P-MissingInfo&intensity=HIGH")
        tab.click("a.item-link", navigates=True)
        page = tab.evaluate("""(() => ({
            question: document.querySelector('h1.item-question').innerText,
            removed: Array.from(document.querySelectorAll('.change .original del')).map(e => e.innerText),
            added: Array.from(document.querySelectorAll('.change .perturbed ins')).map(e => e.innerText),
            models: Array.from(document.querySelectorAll('.reply')).map(e => e.dataset.model),
            rationales: Array.from(document.querySelectorAll('.reply .rationale')).map(e => e.innerText),
            lever: document.querySelector('.lever-instruction') && document.querySelector('.lever-instruction').innerText,
            votes: document.querySelectorAll('table.votes tbody tr').length,
            scripts: document.querySelectorAll('.reply script').length,
            text: document.body.innerText,
            overflow: document.documentElement.scrollWidth > window.innerWidth,
        }))()""")
        tab.screenshot(tmp_path / "item.png")
    assert page["question"].startswith("Perturbed question")
    assert page["removed"] and page["added"]  # the original question and context, and what replaced them
    assert any("Perturbed" in text for text in page["added"])
    assert sorted(page["models"]) == sorted(TARGETS)
    assert len(page["rationales"]) == len(TARGETS) and all(r.startswith(RATIONALE) for r in page["rationales"])
    assert page["lever"]  # the lever's instruction from the catalogue
    assert page["votes"] == 1  # one verifier
    assert SCRIPT in page["text"] and page["scripts"] == 0  # a reply's markup is shown as text, never run
    assert not page["overflow"]


def test_comparing_two_runs_shows_the_items_whose_decision_changed(viewer, runs, browser):
    with browser.tab(1400, 900) as tab:
        tab.open(f"{viewer}/")
        tab.click("header a", text="compare runs", navigates=True)
        tab.click("form.filters button", text="Compare", navigates=True)
        changed = tab.evaluate("""Array.from(document.querySelectorAll('table.changed tbody tr'))
            .map(r => Array.from(r.cells).map(c => c.innerText.trim()))""")
        models = {row[4] for row in changed}
        assert models == {"answerer"}  # the one target that changed its mind
        assert len(changed) == len(_benchmark(runs))  # it answered every item, then refused every one
        assert {row[5] for row in changed} == {"answer"} and {row[6] for row in changed} == {"⊘ missing"}
        assert tab.evaluate("document.querySelectorAll('table.metric-changes tbody tr').length") == len(TARGETS)
        tab.click("table.changed a.item-link", navigates=True)
        assert "/runs/round-2/items/" in tab.evaluate("location.pathname")
        assert (
            tab.evaluate("document.querySelector('.reply[data-model=answerer] .badge').innerText")
            == "REFUSE_INFO_MISSING_IN_CONTEXT"
        )


# ---------------------------------------------------------------- over HTTP


def test_item_pages_and_json_are_paged_and_filtered_on_the_server(viewer, runs):
    items = _benchmark(runs)
    judgments = pd.read_parquet(runs["round-1"] / "judgments.parquet")
    with httpx.Client(base_url=viewer, timeout=30) as client:
        first = client.get("/api/runs/round-1/items", params={"page_size": 2}).json()
        assert first["total"] == len(items) and first["pages"] == -(-len(items) // 2) and len(first["rows"]) == 2
        second = client.get("/api/runs/round-1/items", params={"page_size": 2, "page": 2}).json()
        assert {r["item_id"] for r in first["rows"]}.isdisjoint(r["item_id"] for r in second["rows"])
        assert [r["item_id"] for r in first["rows"] + second["rows"]] == list(items.item_id[:4])
        assert set(first["rows"][0]["models"]) == set(TARGETS)

        high = client.get("/api/runs/round-1/items", params={"intensity": "HIGH", "class": "P-MissingInfo"}).json()
        assert high["total"] == int(((items.intensity == "HIGH") & (items.perturbation_class == "P-MissingInfo")).sum())

        # The cautious target refuses everything with the ambiguity code: right on exactly the ambiguity items.
        right = client.get("/api/runs/round-1/items", params={"model": "cautious", "outcome": "correct"}).json()
        assert right["models"] == ["cautious"]
        expected = judgments[(judgments.model == "cautious") & (judgments.decision == judgments.expected)]
        assert sorted(r["item_id"] for r in right["rows"]) == sorted(expected.item_id)

        by_judge = client.get("/api/runs/round-1/items", params={"source": "judge"}).json()
        assert by_judge["total"] == judgments[judgments.decision_source == "judge"].item_id.nunique()

        disagree = client.get("/api/runs/round-1/items", params={"disagree": "1"}).json()
        assert disagree["total"] == int((judgments.groupby("item_id").decision.nunique() > 1).sum())

        found = client.get("/api/runs/round-1/items", params={"q": "Question Dose"}).json()
        assert found["total"] == int(items.question.str.lower().str.contains("question dose").sum()) > 0

        page = client.get("/runs/round-1/items", params={"page_size": 2, "page": 2})
        assert page.status_code == 200 and "page 2 of" in page.text
        one = client.get(f"/api/runs/round-1/items/{items.item_id[0]}").json()
        assert one["item"]["item_id"] == items.item_id[0] and {m["model"] for m in one["models"]} == set(TARGETS)
        html = client.get(f"/runs/round-1/items/{items.item_id[0]}").text
        assert SCRIPT not in html and "&lt;script&gt;alert(" in html

        assert client.get("/runs/round-1/items/no-such-item").status_code == 404
        assert client.get("/api/runs/nope/items").status_code == 404
        assert client.post("/api/runs/round-1/items").status_code == 405  # read-only

        home = client.get("/").text
        assert "Leaderboard" in home and all(t in home for t in TARGETS)
        compared = client.get("/api/compare", params={"a": "round-1", "b": "round-2"}).json()
        assert compared["matched_by"] == "item_id" and compared["changed_total"] == len(items)


def test_a_knowornot_experiment_shows_its_fact_passages_answer_and_labels(viewer, runs):
    results = pd.read_parquet(runs["kon"] / "results.parquet")
    with httpx.Client(base_url=viewer, timeout=30) as client:
        listing = client.get("/api/runs/kon/items", params={"retrieval": "basic_rag"}).json()
        assert listing["total"] == int((results.retrieval == "basic_rag").sum()) > 0
        labelled = results.experiment_id.iloc[0]
        row = results.iloc[0]
        page = client.get(f"/runs/kon/items/{labelled}").text
        assert row.question in page and "It is two years." in page
        assert "Withheld fact" in page and str(row.expected_answer) in page
        assert row.retrieval in page
        assert "tier_2" in page and "The model answered." in page  # the evaluator's label and its words
        assert "hedged answer" in page and "ann" in page  # the human label
        rag = results[results.retrieval == "basic_rag"].iloc[0]
        detail = client.get(f"/api/runs/kon/items/{rag.experiment_id}").json()
        assert [p["id"] for p in detail["passages"]] == list(rag.context_ids)
        assert detail["withheld"]["id"] == rag.question_id and rag.question_id not in list(rag.context_ids)
        assert "Experiments" in client.get("/").text


# ---------------------------------------------------------------- the command


def test_a_folder_that_is_not_a_run_folder_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "nowhere"
    done = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "view", str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and str(missing) in done.stderr
    assert not missing.exists()  # the viewer creates nothing
    (tmp_path / "empty").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "refusalbench.flows.cli", "view", str(tmp_path / "empty")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "not a run folder" in done.stderr and done.stderr.strip().count("\n") == 0


def test_ctrl_c_stops_the_viewer_with_exit_0(runs):
    process = _viewer(str(runs["round-1"]))
    url = _url_of(process)
    assert httpx.get(url + "/", timeout=30).status_code == 200
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0, process.stderr.read() if process.stderr else ""
