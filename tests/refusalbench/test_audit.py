"""The human audit of generated items (paper App. C.2): sample, label (terminal and web), report."""

from __future__ import annotations

import datetime as dt
import html
import http.client
import json
import math
from urllib.parse import urlencode, urlparse

import pandas as pd
import pytest
from typer.testing import CliRunner

from refusalbench.flows.cli_audit import audit_app
from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.runfolder import RunManifest
from refusalbench.tasks.core.stats import fleiss_kappa, wilson_interval
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.refusalbench.audit.audit_screens import serve_audit, word_diff_html
from refusalbench.tasks.refusalbench.audit.human_audit import (
    AuditLabelStore,
    audit_document,
    draw_sample,
    open_audit_session,
    rubric,
    sample_run,
)
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.report import ReportInputs, build_report
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import AuditDocument, AuditLabel
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Passage, Verification
from refusalbench.tasks.refusalbench.stages.verify import required_criteria
from refusalbench.tasks.refusalbench.taxonomy import expected_behaviour

EVIL = "<script>alert(1)</script>"
STRATA = {("P-MissingInfo", "LOW"): 4, ("P-Contradiction", "HIGH"): 4, ("P-FalsePremise", "MEDIUM"): 2}
runner = CliRunner()


@pytest.fixture(scope="module")
def levers():
    return load_catalogue()


def make_items(levers) -> list[BenchmarkItem]:
    items = []
    for (cls, intensity), count in STRATA.items():
        lever = next(lv for lv in levers if lv.perturbation_class == cls and lv.intensity == intensity)
        for k in range(count):
            multi = cls == "P-MissingInfo" and k == 0
            common = dict(
                item_id=f"{cls[2:5].lower()}-{intensity[0]}-{k}",
                base_id=f"b{k}",
                perturbation_class=cls,
                intensity=intensity,
                lever_id=lever.id,
                generator=f"gen-{'ab'[k % 2]}",
                question=f"When did the bridge {k} open?",
                original_question=f"When did bridge {k} open?",
                answers=["1932"],
                expected=expected_behaviour(cls, intensity),
                domain="history",
            )
            if multi:
                items.append(
                    BenchmarkItem(
                        variant="multi",
                        **common,
                        passages=[Passage(text="It opened in 19xx.", relevant=True)],
                        original_passages=[
                            Passage(text="It opened in 1932.", relevant=True),
                            Passage(text="Noise.", relevant=False),
                        ],
                    )
                )
            else:
                items.append(
                    BenchmarkItem(
                        variant="single",
                        **common,
                        context=f"It opened in 1932. {EVIL}\x1b[2J",
                        original_context="It opened in 1932.",
                    )
                )
    items[-1] = items[-1].model_copy(update={"lever_id": "retired-lever"})  # gone from the catalogue
    return items


def make_verifications(items) -> list[Verification]:
    rows = []
    for index, item in enumerate(items):
        verdicts = {"ver-a": "PASS", "ver-b": "PASS"}
        if index == 1:
            verdicts["ver-b"] = "FAIL"  # a tie: the consensus is FAIL
        if index == 2:
            verdicts["ver-b"] = "ERROR"  # only ver-a answered: PASS
        rows += [
            Verification(candidate_id=item.item_id, generator=item.generator, verifier=v, verdict=verdict)
            for v, verdict in verdicts.items()
        ]
    return rows


@pytest.fixture
def run(tmp_path, levers):
    store = ArtifactStore(tmp_path / "run")
    items = make_items(levers)
    store.save(rb_files.BENCHMARK, items)
    store.save(rb_files.VERIFICATIONS, make_verifications(items))
    return store


def now():
    return dt.datetime.now(dt.UTC)


# ---------------------------------------------------------------- sampling


def test_sample_is_stratified_reproducible_and_guarded(run):
    first = sample_run(run.root, per_stratum=3, seed=5)
    assert first == {
        "P-MissingInfo/LOW": {"available": 4, "sampled": 3},
        "P-Contradiction/HIGH": {"available": 4, "sampled": 3},
        "P-FalsePremise/MEDIUM": {"available": 2, "sampled": 2},
    }
    drawn = [i.item_id for i in run.load(rb_files.AUDIT_SAMPLE)]
    assert len(drawn) == len(set(drawn)) == 8
    sample_run(run.root, per_stratum=3, seed=5)
    assert [i.item_id for i in run.load(rb_files.AUDIT_SAMPLE)] == drawn

    items = run.load(rb_files.BENCHMARK)
    assert [i.item_id for i in draw_sample(list(reversed(items)), 3, seed=5)] == drawn  # input order does not matter
    others = {tuple(i.item_id for i in draw_sample(items, 3, seed=s)) for s in range(6)}
    assert len(others) > 1

    # Once labelled, a different sample needs --force; the same one may be drawn again.
    AuditLabelStore(run.uri(rb_files.AUDIT_LABELS.name)).append(
        AuditLabel(item_id=drawn[0], annotator="ann", label="PASS", labelled_at=now())
    )
    other_seed = next(s for s in range(6, 40) if [i.item_id for i in draw_sample(items, 3, s)] != drawn)
    with pytest.raises(InputError, match="--force"):
        sample_run(run.root, per_stratum=3, seed=other_seed)
    sample_run(run.root, per_stratum=3, seed=5)
    sample_run(run.root, per_stratum=3, seed=other_seed, force=True)
    assert [i.item_id for i in run.load(rb_files.AUDIT_SAMPLE)] != drawn


def test_sample_rejects_bad_input(tmp_path, run):
    with pytest.raises(InputError, match="no such run folder"):
        sample_run(str(tmp_path / "typo"), per_stratum=2)
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no benchmark"):
        sample_run(str(tmp_path / "empty"), per_stratum=2)
    with pytest.raises(InputError, match="at least 1"):
        sample_run(run.root, per_stratum=0)
    result = runner.invoke(audit_app, ["label", str(tmp_path / "empty"), "--annotator", "ann"])
    assert isinstance(result.exception, InputError) and "audit sample" in str(result.exception)


# ---------------------------------------------------------------- what an annotator reads


def test_rubric_is_the_verifiers_rubric(levers):
    items = make_items(levers)
    single = next(i for i in items if i.variant == "single" and i.intensity == "HIGH")
    multi = next(i for i in items if i.variant == "multi")
    lever = {lv.id: lv for lv in levers}
    for item in (single, multi):
        criteria = rubric(item, lever[item.lever_id])
        assert [name for name, _ in criteria] == list(required_criteria(item.variant))
        wording = dict(criteria)
        assert item.intensity in wording["intensity_achieved"]
        assert item.expected in wording["predicted_behaviour"]
    assert "passages" in dict(rubric(multi, lever[multi.lever_id]))["answer_constraint"]


def test_word_diff_marks_changes_and_escapes():
    diff = word_diff_html("It opened in 1932.", f"It opened in 19xx. {EVIL}")
    assert diff.startswith("It opened in <del>1932.</del><ins>19xx. ")
    assert EVIL not in diff and "&lt;script&gt;" in diff


# ---------------------------------------------------------------- labelling


def test_terminal_labelling_saves_every_label_and_resumes(run):
    sample_run(run.root, per_stratum=3, seed=1)
    session = open_audit_session(run.root)
    labels_path = session.labels_path
    first = runner.invoke(
        audit_app,
        ["label", run.root, "--annotator", "ann"],
        input="x\np\n\nf\n1 zz\nlever_fidelity, 3\ntoo subtle\ns\n",
    )
    assert first.exit_code == 0, first.output
    assert "Not an option" in first.output and "Give numbers" in first.output
    assert "0 of 8 already audited" in first.output and "2 new labels saved" in first.output
    assert "Rubric (PASS only when every criterion holds)" in first.output
    assert "\\x1b[2J" in first.output and "\x1b[2J" not in first.output  # control characters shown, not obeyed
    saved = AuditLabelStore(labels_path).load()
    cases = session.cases
    assert [(label.item_id, label.label, label.failed_criteria, label.note) for label in saved] == [
        (cases[0].item_id, "PASS", [], None),
        (cases[1].item_id, "FAIL", ["lever_fidelity", "target_compliance"], "too subtle"),
    ]

    # A crash mid-write leaves a torn line: it is ignored on load and cut off by the next append.
    with open(labels_path, "a", encoding="utf-8") as handle:
        handle.write('{"item_id": "torn')
    resumed = runner.invoke(audit_app, ["label", run.root, "--annotator", "ann"], input="p\n\nq\n")
    assert resumed.exit_code == 0, resumed.output
    assert "2 of 8 already audited" in resumed.output
    saved = AuditLabelStore(labels_path).load()
    assert [label.item_id for label in saved] == [cases[0].item_id, cases[1].item_id, cases[2].item_id]

    other = runner.invoke(audit_app, ["label", run.root, "--annotator", "bob"], input="")
    assert "0 of 8 already audited by bob" in other.output


def _request(url: str, method: str, path: str = "/", form: dict | list | None = None) -> tuple[int, str]:
    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    body = urlencode(form, doseq=True) if form is not None else None
    headers = {"Content-Type": "application/x-www-form-urlencoded"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, text


def test_web_labelling_over_loopback_http(run):
    sample_run(run.root, per_stratum=3, seed=2)
    session = open_audit_session(run.root)
    with pytest.raises(ValueError, match="loopback"):
        serve_audit(session.cases, session.labels_path, "ann", host="0.0.0.0")
    with serve_audit(session.cases, session.labels_path, "ann") as server:
        assert server.url.startswith("http://127.0.0.1:")
        status, page = _request(server.url, "GET")
        assert status == 200 and "0 of 8 labelled" in page
        case = session.cases[0]
        assert case.item_id in page and html.escape(case.lever.instruction) in page
        for name, _wording in case.criteria:
            assert f"value='{name}'" in page
        assert "Rubric: PASS only when every criterion holds" in page
        if EVIL in (case.item.context or ""):
            assert "&lt;script&gt;" in page
        assert "<script>" not in page
        token = page.split("name='token' value='")[1].split("'")[0]

        assert (
            _request(server.url, "POST", "/label", {"item_id": case.item_id, "label": "PASS", "token": "x"})[0] == 403
        )
        bad = {"item_id": case.item_id, "label": "PASS", "token": token, "failed": ["lever_fidelity"]}
        status, text = _request(server.url, "POST", "/label", bad)
        assert status == 400 and "untick them" in text
        assert _request(server.url, "POST", "/label", {**bad, "label": "FAIL", "failed": ["no_such"]})[0] == 400
        assert _request(server.url, "POST", "/label", {**bad, "label": "MAYBE", "failed": []})[0] == 400
        good = {
            "item_id": case.item_id,
            "label": "FAIL",
            "token": token,
            "failed": ["answer_constraint", "lever_fidelity"],
            "note": f"note {EVIL}",
        }
        assert _request(server.url, "POST", "/label", good)[0] == 303
        assert _request(server.url, "POST", "/label", good)[0] == 303  # a double click saves once
        status, page = _request(server.url, "GET")
        assert "1 of 8 labelled" in page and session.cases[1].item_id in page
        second = session.cases[1].item_id
        assert _request(server.url, "POST", "/label", {"item_id": second, "label": "PASS", "token": token})[0] == 303
        assert len(server.saved) == 2
    saved = AuditLabelStore(session.labels_path).load()
    assert [(label.item_id, label.label, label.failed_criteria, label.note) for label in saved] == [
        (case.item_id, "FAIL", ["lever_fidelity", "answer_constraint"], f"note {EVIL}"),
        (second, "PASS", [], None),
    ]
    with serve_audit(session.cases, session.labels_path, "ann") as server:  # resumes at the third item
        assert "2 of 8 labelled" in _request(server.url, "GET")[1]


# ---------------------------------------------------------------- the audit's numbers


def test_wilson_interval_matches_known_values():
    low, high = wilson_interval(9, 10)
    assert (round(low, 4), round(high, 4)) == (0.5958, 0.9821)
    assert wilson_interval(10, 10)[1] == 1.0 and round(wilson_interval(10, 10)[0], 4) == 0.7225
    assert wilson_interval(0, 5)[0] == 0.0
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


# Two annotators' verdicts over the sample (sorted by item id): 6 of 8 agree.
ANN = ["PASS", "PASS", "PASS", "PASS", "PASS", "FAIL", "FAIL", "PASS"]
BOB = ["PASS", "PASS", "PASS", "FAIL", "PASS", "FAIL", "PASS", "PASS"]


def _label_all(run, names_and_verdicts):
    sample = sorted(run.load(rb_files.AUDIT_SAMPLE), key=lambda i: i.item_id)
    store = AuditLabelStore(run.uri(rb_files.AUDIT_LABELS.name))
    for annotator, verdicts in names_and_verdicts:
        for item, verdict in zip(sample, verdicts):
            store.append(
                AuditLabel(
                    item_id=item.item_id,
                    annotator=annotator,
                    label=verdict,
                    labelled_at=now(),
                    failed_criteria=["lever_fidelity"] if verdict == "FAIL" else [],
                )
            )
    return sample


def test_report_end_to_end_with_two_annotators(run):
    sample_run(run.root, per_stratum=3, seed=3)
    sample = _label_all(run, [("ann", ANN), (EVIL, BOB)])
    result = runner.invoke(audit_app, ["report", run.root])
    assert result.exit_code == 0, result.output
    assert "Cohen's kappa between annotators: 0.333 over 8 items" in result.output
    assert "report: not rebuilt" in result.output
    as_json = runner.invoke(audit_app, ["report", run.root, "--format", "json"])
    assert as_json.exit_code == 0, as_json.output
    rows = json.loads(as_json.stdout)  # the notes go to stderr: stdout stays JSON
    assert rows[-1]["group"] == "all" and rows[-1]["n"] == 8 and isinstance(rows[-1]["pass_rate"], float)

    audit = AuditDocument.model_validate(json.loads(run.read_text(rb_files.AUDIT.name)))
    # By hand: p_o = 6/8, both annotators PASS 6/8, p_e = .75^2 + .25^2 = .625, kappa = (.75-.625)/.375.
    assert audit.annotator_agreement["kappa_kind"] == "cohen"
    assert audit.annotator_agreement["kappa"] == pytest.approx(1 / 3)
    # With two annotators an item passes only when both passed it.
    verdict = {item.item_id: "PASS" if a == b == "PASS" else "FAIL" for item, a, b in zip(sample, ANN, BOB)}
    assert audit.overall.n == 8 and audit.overall.passed == sum(v == "PASS" for v in verdict.values()) == 5
    for rate in audit.by_class:
        members = [i.item_id for i in sample if i.perturbation_class == rate.value]
        passed = sum(verdict[m] == "PASS" for m in members)
        assert (rate.n, rate.passed) == (len(members), passed)
        assert (rate.ci_low, rate.ci_high) == pytest.approx(wilson_interval(passed, len(members)))
    assert [r.value for r in audit.by_class] == ["P-Contradiction", "P-MissingInfo", "P-FalsePremise"]
    assert [r.value for r in audit.by_intensity] == ["LOW", "MEDIUM", "HIGH"]
    assert sum(r.n for r in audit.by_stratum) == 8
    assert audit.failed_criteria == {"lever_fidelity": ANN.count("FAIL") + BOB.count("FAIL")}
    assert {r.value: r.passed for r in audit.by_annotator} == {"ann": 6, EVIL: 6}

    # Humans vs the verifier consensus (benchmark positions 1: tie -> FAIL, 2: one verdict -> PASS).
    items = run.load(rb_files.BENCHMARK)
    consensus = {item.item_id: "FAIL" if index == 1 else "PASS" for index, item in enumerate(items)}
    agreed = [i.item_id for i, a, b in zip(sample, ANN, BOB) if a == b]
    hits = sum(verdict[i] == consensus[i] for i in agreed)
    assert audit.verifier_agreement["consensus"]["n"] == len(agreed)
    assert audit.verifier_agreement["consensus"]["percent_agreement"] == pytest.approx(hits / len(agreed))
    assert audit.verifier_agreement["ann"]["n"] == 8


def test_fleiss_kappa_for_three_annotators_and_labels_of_an_old_sample_drop_out(levers):
    sample = sorted(make_items(levers), key=lambda i: i.item_id)[:4]
    third = ["PASS", "FAIL", "PASS", "PASS"]
    labels = [
        AuditLabel(item_id=item.item_id, annotator=name, label=v, labelled_at=now())
        for name, verdicts in (("a", ANN[:4]), ("b", BOB[:4]), ("c", third))
        for item, v in zip(sample, verdicts)
    ]
    labels.append(AuditLabel(item_id="not-in-sample", annotator="a", label="FAIL", labelled_at=now()))
    audit = audit_document(sample, labels, consensus=None)
    # Items x (PASS, FAIL) counts: [3,0], [2,1], [3,0], [2,1].
    assert audit.annotator_agreement["kappa_kind"] == "fleiss"
    assert audit.annotator_agreement["kappa"] == pytest.approx(fleiss_kappa([[3, 0], [2, 1], [3, 0], [2, 1]]))
    assert audit.overall.n == 4 and audit.overall.passed == 4  # majority: 2 of 3 pass
    assert audit.verifier_agreement == {} and "no verification table" in audit.verifier_rule


def test_report_section_and_rebuilt_report(run):
    sample_run(run.root, per_stratum=3, seed=4)
    sample = _label_all(run, [("ann", ANN), (EVIL, BOB)])
    run.save(
        runfolder.MANIFEST,
        RunManifest(
            run_id="t",
            kind="run",
            created_at=now(),
            package_version="0",
            config_hash="x",
            config={"evaluation": {"bootstrap": 20, "seed": 0}},
        ),
    )
    judged = pd.DataFrame(
        [
            {
                "model": "m",
                "item_id": i.item_id,
                "expected": i.expected,
                "decision": "ANSWER",
                "answer_correct": True,
                "confidence": None,
                "perturbation_class": i.perturbation_class,
                "intensity": i.intensity,
                "lever_id": i.lever_id,
                "domain": i.domain,
                "generator": i.generator,
            }
            for i in sample
        ]
    )
    run.save(rb_files.JUDGED, judged)
    result = runner.invoke(audit_app, ["report", run.root])
    assert result.exit_code == 0, result.output
    page = run.read_text(runfolder.REPORT.name)
    assert "Human audit of generated items" in page and "Table 2 form" in page
    assert "P-Contradiction" in page and "Cohen&#x27;s kappa" in page
    assert EVIL not in page and "&lt;script&gt;" in page

    audit = json.loads(run.read_text(rb_files.AUDIT.name))
    alone = build_report(ReportInputs(metrics={}, audit=audit))
    assert "Human audit of generated items" in alone and "95% Wilson score interval" in alone
    assert "Human audit" not in build_report(ReportInputs(metrics={}))
