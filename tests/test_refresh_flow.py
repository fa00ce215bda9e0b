"""Refresh rounds: fresh seeds, one folder per round, trend across rounds, flags."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from refusalbench.tasks.refusalbench.trend import flag_moves
from tests.scripted import by_model, generator_reply, judge_by_reference, verifier_reply
from tests.test_generation_flow import BASE


def test_flag_moves_outside_previous_interval():
    trend = pd.DataFrame([
        {"round": "r1", "model": "a", "calibrated_refusal_score": 0.50, "calibrated_refusal_score_ci_low": 0.4,
         "calibrated_refusal_score_ci_high": 0.6},
        {"round": "r2", "model": "a", "calibrated_refusal_score": 0.75, "calibrated_refusal_score_ci_low": 0.6,
         "calibrated_refusal_score_ci_high": 0.9},
        {"round": "r1", "model": "b", "calibrated_refusal_score": 0.50, "calibrated_refusal_score_ci_low": 0.4,
         "calibrated_refusal_score_ci_high": 0.6},
        {"round": "r2", "model": "b", "calibrated_refusal_score": 0.55, "calibrated_refusal_score_ci_low": 0.4,
         "calibrated_refusal_score_ci_high": 0.7},
    ])
    (flag,) = flag_moves(trend)
    assert flag["model"] == "a" and flag["direction"] == "up" and flag["previous_interval"] == [0.4, 0.6]


@pytest.mark.usefixtures("prefect_harness")
def test_two_rounds_trend_and_flag(tmp_path, fake_llm):
    from refusalbench.flows.launch import run_refresh

    state = {"round": 1}

    def flipper(req):
        # Refuses with the wrong code in round 1, answers correctly-ish in round 2: its score moves.
        return "REFUSE_OTHER" if state["round"] == 1 else "REFUSE_INFO_MISSING"

    fake_llm.responder = by_model({
        "gen-a": lambda req: generator_reply(req, "a"), "ver-a": lambda req: verifier_reply("PASS"),
        "flip": flipper, "judge": judge_by_reference,
    })
    (tmp_path / "base.jsonl").write_text("\n".join(json.dumps(r) for r in BASE) + "\n")
    models = "\n".join(f"  {n}:\n    model: openai/{n}\n    api_base: {fake_llm.url}\n    max_attempts: 2"
                       for n in ["gen-a", "ver-a", "flip", "judge"])
    config = tmp_path / "refresh.yaml"
    config.write_text(f"""
models:
{models}
cache:
  backend: none   # the scripted target changes its mind between rounds; a cache would hide that
generation:
  base_set: base.jsonl
  generators: [gen-a]
  verifiers: [ver-a]
  base_sample: 3
  strata: [P-MissingInfo/LOW, P-MissingInfo/MEDIUM, P-MissingInfo/HIGH]
evaluation:
  targets: [flip]
  judge: judge
  bootstrap: 100
""")
    first = run_refresh(str(config), str(tmp_path / "rounds"), seed=11)
    state["round"] = 2
    second = run_refresh(str(config), str(tmp_path / "rounds"), seed=22)
    assert first["round"] != second["round"] and first["round"].endswith("-s11")
    rounds = sorted(p.name for p in (tmp_path / "rounds").iterdir())
    assert len(rounds) == 2
    assert second["rounds"] == 2
    (flag,) = second["flags"]
    assert flag["model"] == "flip" and flag["direction"] == "up"
    trend = pd.read_parquet(tmp_path / "rounds" / second["round"] / "round_trend.parquet")
    assert list(trend["calibrated_refusal_score"]) == [0.0, 0.5]
    assert "Trend across rounds" in (tmp_path / "rounds" / second["round"] / "report.html").read_text()
