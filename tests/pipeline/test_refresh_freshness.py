"""Refresh rounds under the cache scopes, freshness.json from the rounds' data, and --fresh (issue 26)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from refusalbench.flows.results import RefreshResult
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.llm.scripted_server import Behaviour
from refusalbench.tasks.refusalbench.rounds.freshness import fingerprint_changes, item_digest
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from tests.pipeline.test_generation_flow import BASE
from tests.scripted import by_model, generator_reply, judge_by_reference, run_config, verifier_reply

SECTIONS = """
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH]
evaluation:
  targets: [drift]
  judge: judge
  bootstrap: 20
"""
MODELS = ["gen-a", "ver-a", "drift", "judge"]


def _script(fake_llm, state):
    """The generator writes the same item whatever the lever (so later rounds send the targets the
    same prompts); ``drift`` changes its answers and its fingerprint in round 2."""
    fake_llm.responder = by_model(
        {
            "gen-a": lambda req: generator_reply(req, "a"),
            "ver-a": lambda req: verifier_reply("PASS"),
            "drift": lambda req: "REFUSE_OTHER" if state["round"] == 1 else "REFUSE_INFO_MISSING",
            "judge": judge_by_reference,
        }
    )
    fake_llm.behaviours["drift"] = Behaviour(system_fingerprint=f"fp_{state['round']}")


def _folder(tmp_path, name, policy=""):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    return folder, policy


def _config(folder, url, policy):
    config = run_config(folder, url, MODELS, SECTIONS, max_attempts=2)
    if policy:
        config.write_text(config.read_text().replace("cache:\n", f"cache:\n  policy: {policy}\n", 1))
    return config


def _round(root, result):
    folder = root / result.round
    responses = pd.read_parquet(folder / "responses.parquet")
    freshness = json.loads((folder / "freshness.json").read_text())
    return folder, responses, freshness


@pytest.mark.slow  # four refresh rounds
@pytest.mark.usefixtures("prefect_harness")
def test_refresh_defaults_ask_a_changed_model_again_and_forever_does_not(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_refresh

    state = {"round": 1}
    _script(fake_llm, state)
    scoped = {
        "defaults": _folder(tmp_path, "defaults"),
        "forever": _folder(tmp_path, "forever", "{generation: forever, pretest: forever, targets: forever}"),
    }
    configs = {name: _config(folder, fake_llm.url, policy) for name, (folder, policy) in scoped.items()}
    results: dict[str, list[RefreshResult]] = {name: [] for name in scoped}
    for round_number, seed in ((1, 11), (2, 22)):
        state["round"] = round_number
        _script(fake_llm, state)
        for name, (folder, _) in scoped.items():
            results[name].append(run_refresh(str(configs[name]), str(folder / "rounds"), seed=seed))

    # Refresh defaults: round 2 asks the target again; its new answers and fingerprint show.
    root = scoped["defaults"][0] / "rounds"
    first, second = (_round(root, r) for r in results["defaults"])
    assert set(first[1]["raw"]) == {"REFUSE_OTHER"} and set(second[1]["raw"]) == {"REFUSE_INFO_MISSING"}
    (change,) = fingerprint_changes(first[2]["fingerprints"], second[2]["fingerprints"])
    assert change["model"] == "drift" and change["after"] == ["drift / fp_2"]
    fresh = second[2]
    assert fresh["cache_policy"] == {"generation": "round", "pretest": "round", "targets": "round", "judge": "forever"}
    assert fresh["by_role"]["targets"] == {"calls": len(second[1]), "from_earlier_rounds": 0}

    # freshness.json from the data: the generator wrote the same items, on new (base item, lever) pairs.
    benchmark = ArtifactStore(second[0]).load(rb_files.BENCHMARK)
    earlier = {item_digest(item) for item in ArtifactStore(first[0]).load(rb_files.BENCHMARK)}
    assignments = pd.read_parquet(second[0] / "assignments.parquet")
    earlier_pairs = set(map(tuple, pd.read_parquet(first[0] / "assignments.parquet")[["base_id", "lever_id"]].values))
    assert fresh["items_total"] == len(benchmark) > 0
    assert fresh["items_seen_before"] == sum(item_digest(item) in earlier for item in benchmark) == len(benchmark)
    assert fresh["pairs_total"] == len(assignments) and fresh["pairs_seen_before"] == 0
    assert not earlier_pairs & set(map(tuple, assignments[["base_id", "lever_id"]].values))
    assert fresh["pool_exhausted"] is False and first[2]["pairs_seen_before"] == 0
    assert fresh["calls_total"] == sum(r["calls"] for r in fresh["by_role"].values())
    # ...and the round's trend.json and report carry them, beside the trend.
    trend = json.loads((second[0] / "trend.json").read_text())
    assert trend["freshness"]["items_total"] == fresh["items_total"]
    assert [c["model"] for c in trend["fingerprint_changes"]] == ["drift"]
    page = (second[0] / "report.html").read_text()
    assert "drift: drift / fp_1 -&gt; drift / fp_2" in page or "drift: drift / fp_1 -> drift / fp_2" in page
    assert f"items seen in earlier rounds: {fresh['items_seen_before']:,} of {fresh['items_total']:,}" in page
    read_the_trend_section(second[0] / "report.html", tmp_path / "trend-section.png", fresh)

    # Forever: round 2 sends the target the same prompts and the cache answers them as in round 1.
    root = scoped["forever"][0] / "rounds"
    first, second = (_round(root, r) for r in results["forever"])
    assert set(second[1]["raw"]) == {"REFUSE_OTHER"}
    assert fingerprint_changes(first[2]["fingerprints"], second[2]["fingerprints"]) == []
    assert second[2]["by_role"]["targets"] == {"calls": len(second[1]), "from_earlier_rounds": len(second[1])}
    assert second[2]["calls_from_earlier_rounds"] >= len(second[1])


@pytest.mark.usefixtures("prefect_harness")
def test_fresh_targets_asks_only_the_targets_again_and_a_resume_repeats_nothing(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_main

    _script(fake_llm, {"round": 1})
    ((folder, _),) = [_folder(tmp_path, "run")]
    config = str(_config(folder, fake_llm.url, ""))
    run_main(config, str(folder / "first"))
    before = len(fake_llm.calls)
    result = run_main(config, str(folder / "again"), fresh=["targets"])
    asked = [call["model"] for call in fake_llm.calls[before:]]
    assert set(asked) == {"drift"}  # the generator, verifier and judge replies came from the cache
    assert len(asked) == sum(call["model"] == "drift" for call in fake_llm.calls[:before])  # every target prompt
    manifest = json.loads((folder / "again" / "manifest.json").read_text())
    salt = manifest["config"]["cache"]["fresh"]["targets"]
    # The same command again (a resume of that run): its salt is found in the manifest, nothing is asked.
    after = len(fake_llm.calls)
    assert run_main(config, str(folder / "again"), fresh=["targets"]).report == result.report
    assert len(fake_llm.calls) == after
    assert json.loads((folder / "again" / "manifest.json").read_text())["config"]["cache"]["fresh"] == {"targets": salt}


def read_the_trend_section(report, shot, fresh) -> None:
    """The report's trend section as a person reads it in headless Chromium: freshness and fingerprint change."""
    from tests.browser import Browser

    script = """(() => {
      const section = Array.from(document.querySelectorAll('section'))
        .find(s => s.querySelector('h2') && s.querySelector('h2').innerText.trim() === 'Trend across rounds');
      return section ? section.innerText : null;
    })()"""
    with Browser() as browser:
        text = browser.look(f"file://{report}", script=script, screenshot=shot)
    assert text and "drift: drift / fp_1 -> drift / fp_2" in text
    assert f"items seen in earlier rounds: {fresh['items_seen_before']:,} of {fresh['items_total']:,}" in text
    assert shot.exists()
