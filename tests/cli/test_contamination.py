"""``refusalbench contamination``: a static set against a fresh round of its strata, through the real flows on the
scripted server; the refresh key ``refresh.contamination_static``; the viewer's page; bad input in one line.

The statistics on hand-made frames (insufficient data, the family the flags are adjusted in) are in
tests/refusalbench/test_contamination.py."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from refusalbench.tasks.llm.scripted_server import last_user_text
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply

N_BASE = 12  # >= stats.MIN_CLUSTERS base items in each set: the flags are decided
INTENSITIES = ("LOW", "MEDIUM", "HIGH")
BASE = [
    {"id": f"b{i}", "question": f"Which year is number {i}?", "answers": [str(1900 + i)],
     "context": f"Number {i} is the year {1900 + i}.", "domain": "history"}
    for i in range(N_BASE)
]  # fmt: skip
STATIC_MARK = re.compile(r"Static question (\d+) (LOW|MEDIUM|HIGH)")


def static_record(i: int, intensity: str) -> dict:
    """One item of the static set in the released layout: P-MissingInfo, LOW answerable, else a refusal."""
    return {
        "unique_id": f"static-{i}-{intensity}",
        "perturbed_query": f"Static question {i} {intensity}: which year is number {i}?",
        "perturbed_context": f"Number {i} is the year {1900 + i}." if intensity == "LOW" else "Nothing about it.",
        "expected_rag_behavior": "ANSWER_CORRECTLY" if intensity == "LOW" else "REFUSE_INFO_MISSING",
        "original_answers": [str(1900 + i)],
        "perturbation_class": "P-MissingInfo",
        "intensity": intensity,
        "lever_selected": "x",
        "generator_model": "authors",
        "original_query": f"Which year is number {i}?",
        "original_context": f"Number {i} is the year {1900 + i}.",
    }


def memoriser(request) -> str:
    """Knows the static set by heart (its questions), and refuses with the wrong code on anything else."""
    match = STATIC_MARK.search(last_user_text(request))
    if match is None:
        return "REFUSE_OTHER"
    return str(1900 + int(match.group(1))) if match.group(2) == "LOW" else "REFUSE_INFO_MISSING"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def setup(tmp_path, fake_llm, *, refresh: str = "") -> tuple:
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, digest(last_user_text(req))),
            "ver-a": lambda req: verifier_reply("PASS"),
            "memoriser": memoriser,
            "steady": lambda req: "REFUSE_INFO_MISSING",  # the same rule on both sets
            "judge": judge_by_reference,
        }
    )
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    static = tmp_path / "static.jsonl"
    static.write_text("\n".join(json.dumps(static_record(i, x)) for i in range(N_BASE) for x in INTENSITIES) + "\n")
    models = "\n".join(
        f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 1"
        for n in ["gen-a", "ver-a", "memoriser", "steady", "judge"]
    )
    config = tmp_path / "run.yaml"
    config.write_text(f"""
models:
{models}
cache:
  path: {json.dumps(str(tmp_path / "calls.sqlite"))}
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-Ambiguity/LOW]  # the static set's strata replace these
evaluation:
  targets: [memoriser, steady]
  judge: judge
  bootstrap: 300
{refresh}""")
    return config, static


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    from refusalbench.flows.cli import main

    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.usefixtures("prefect_harness")
def test_a_model_that_knows_the_static_set_is_flagged_and_one_that_does_not_is_not(tmp_path, fake_llm, capsys):
    config, static = setup(tmp_path, fake_llm)
    out = tmp_path / "check"
    code, printed, err = run_cli(
        ["contamination", "--static", str(static), "--config", str(config), "--out", str(out)], capsys
    )
    assert code == 0, err
    document = json.loads((out / "contamination.json").read_text())
    # The shape other tools read.
    assert set(document) >= {"schema_version", "static", "fresh", "models", "strata", "fdr", "direction", "test"}
    assert document["static"]["path"] == str(static) and document["static"]["items"] == 3 * N_BASE
    assert document["static"]["sha256"] == hashlib.sha256(static.read_bytes()).hexdigest()
    assert document["fresh"]["items"] == 3 * N_BASE and document["fresh"]["run"].rstrip("/").endswith("fresh")
    assert document["strata"] == [f"P-MissingInfo/{x}" for x in ("HIGH", "LOW", "MEDIUM")]
    assert set(document["models"]) == {"memoriser", "steady"}
    for entry in document["models"].values():
        assert set(entry) == {"static", "fresh", "gap", "ci", "flagged", "flagged_metrics"}
        for part in ("static", "fresh", "gap", "ci"):
            assert set(entry[part]) == {"overall", *document["strata"]}
        test = entry["ci"]["overall"]["refusal_accuracy"]
        assert set(test) == {"interval", "p_value", "adjusted_p_value", "flagged", "support", "note"}
        assert test["support"] == N_BASE and test["note"] is None
    memo, steady = document["models"]["memoriser"], document["models"]["steady"]
    # The static figures are the static run's metrics.json numbers.
    metrics = json.loads((out / "static" / "metrics.json").read_text())["models"]
    for model, entry in document["models"].items():
        for m in ("calibrated_refusal_score", "answer_accuracy", "refusal_accuracy"):
            assert entry["static"]["overall"][m] == pytest.approx(metrics[model][m])
    assert memo["static"]["overall"]["calibrated_refusal_score"] == 1.0
    assert memo["fresh"]["overall"]["calibrated_refusal_score"] == 0.0
    assert memo["gap"]["overall"]["refusal_accuracy"] == -1.0
    assert memo["flagged"] and set(memo["flagged_metrics"]) == {
        "calibrated_refusal_score", "answer_accuracy", "refusal_accuracy"
    }  # fmt: skip
    low, high = memo["ci"]["overall"]["refusal_accuracy"]["interval"]
    assert high < 0 and memo["ci"]["overall"]["refusal_accuracy"]["adjusted_p_value"] <= document["fdr"]
    assert not steady["flagged"] and steady["gap"]["overall"]["refusal_accuracy"] == 0.0
    # Both sub-folders are real run folders with reports; the page and the terminal say the verdict.
    assert (out / "static" / "report.html").exists() and (out / "fresh" / "report.html").exists()
    html = (out / "contamination.html").read_text()
    assert "memoriser" in html and "flagged" in html and "vegaEmbed" in html
    assert "flagged (significantly lower on fresh items, FDR 0.05): memoriser" in printed
    assert f"contamination: {out / 'contamination.json'}" in printed and "refusalbench view" in printed

    # view DIR opens both run folders and shows the comparison.
    from starlette.testclient import TestClient

    from refusalbench.tasks.viewer.app import create_app, load_runs
    from refusalbench.tasks.viewer.folders import open_folders

    folders = open_folders([str(out)])
    assert [f.name for f in folders] == ["static", "fresh"]
    client = TestClient(create_app(load_runs(folders)))
    assert "Contamination check" in client.get("/").text and "flagged: memoriser" in client.get("/").text
    page = client.get("/contamination").text
    assert "memoriser" in page and "steady" in page and "flagged" in page
    assert client.get("/api/contamination").json()[str(out / "contamination.json")]["models"]["memoriser"]["flagged"]


@pytest.mark.usefixtures("prefect_harness")
def test_a_refresh_round_records_its_check_against_the_pinned_static_set(tmp_path, fake_llm, capsys):
    config, static = setup(tmp_path, fake_llm, refresh="refresh:\n  contamination_static: static.jsonl\n")
    text = config.read_text().replace("strata: [P-Ambiguity/LOW]  # the static set's strata replace these",
                                      "strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM, P-MissingInfo/HIGH]")  # fmt: skip
    config.write_text(text)
    root = tmp_path / "rounds"
    code, printed, err = run_cli(["refresh", "--config", str(config), "--out", str(root), "--seed", "3"], capsys)
    assert code == 0, err
    (round_folder,) = [p for p in root.iterdir() if p.name.startswith("round-")]
    document = json.loads((round_folder / "contamination.json").read_text())
    assert (round_folder / "static" / "metrics.json").exists()
    assert document["fresh"]["run"].rstrip("/") == str(round_folder)
    assert document["models"]["memoriser"]["flagged"] and not document["models"]["steady"]["flagged"]
    assert "(flagged: memoriser)" in printed


BAD = [
    ("missing", lambda tmp: str(tmp / "nope.parquet"), "benchmark file not found"),
    ("unknown layout", lambda tmp: _text_file(tmp), "not a readable Parquet file"),
]


def _text_file(tmp) -> str:
    path = tmp / "notes.txt"
    path.write_text("hello\n")
    return str(path)


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(("name", "static_of", "message"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_static_file_is_one_line_and_exit_2(tmp_path, fake_llm, capsys, name, static_of, message):
    config, _ = setup(tmp_path, fake_llm)
    code, _, err = run_cli(
        ["contamination", "--static", static_of(tmp_path), "--config", str(config), "--out", str(tmp_path / "o")],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not fake_llm.calls and not (tmp_path / "o").exists()


@pytest.mark.usefixtures("prefect_harness")
def test_a_config_without_targets_is_one_line_and_exit_2(tmp_path, fake_llm, capsys):
    config, static = setup(tmp_path, fake_llm)
    config.write_text(config.read_text().split("evaluation:")[0])
    code, _, err = run_cli(
        ["contamination", "--static", str(static), "--config", str(config), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "evaluation" in err, err
    assert not fake_llm.calls


@pytest.mark.usefixtures("prefect_harness")
def test_a_refresh_whose_pinned_static_set_is_missing_is_one_line_at_its_key_and_exit_2(tmp_path, fake_llm, capsys):
    config, _ = setup(tmp_path, fake_llm, refresh="refresh:\n  contamination_static: gone.jsonl\n")
    code, _, err = run_cli(["refresh", "--config", str(config), "--out", str(tmp_path / "rounds")], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "refresh.contamination_static" in err and "gone.jsonl" in err
    assert not fake_llm.calls and not (tmp_path / "rounds").exists()
