"""The contamination check's statistics on hand-made judged rows: gaps, intervals, flags, insufficient data.

The whole command on the scripted server is tests/cli/test_contamination.py."""

from __future__ import annotations

import pandas as pd

from refusalbench.tasks.core.stats import MIN_CLUSTERS
from refusalbench.tasks.refusalbench.rounds.contamination import contamination_document, static_strata


def judged(prefix: str, bases: int, right: dict[str, float], strata=("MEDIUM", "HIGH")) -> pd.DataFrame:
    """Rows of P-MissingInfo refusal items, two per base item; ``right``: each model's share of base items
    it refuses with the right code (the first ones)."""
    rows = []
    for model, share in right.items():
        for b in range(bases):
            for intensity in strata:
                rows.append(
                    {
                        "model": model,
                        "item_id": f"{prefix}-{b}-{intensity}",
                        "base_id": f"{prefix}-base-{b}",
                        "expected": "REFUSE_INFO_MISSING",
                        "response": "REFUSE_INFO_MISSING" if b < share * bases else "REFUSE_OTHER",
                        "answer_correct": None,
                        "perturbation_class": "P-MissingInfo",
                        "intensity": intensity,
                    }
                )
    return pd.DataFrame(rows)


def document(static: pd.DataFrame, fresh: pd.DataFrame) -> dict:
    return contamination_document(static, fresh, {"path": "s"}, {"run": "f"}, fdr=0.05, n_resamples=400, seed=0)


def test_a_drop_on_fresh_items_is_flagged_a_rise_is_not_and_no_change_is_not():
    static = judged("s", 12, {"drops": 1.0, "rises": 0.25, "same": 0.5})
    fresh = judged("f", 12, {"drops": 0.25, "rises": 1.0, "same": 0.5})
    models = document(static, fresh)["models"]
    drops = models["drops"]["ci"]["overall"]["refusal_accuracy"]
    assert models["drops"]["gap"]["overall"]["refusal_accuracy"] == -0.75
    assert drops["interval"][1] < 0 and drops["flagged"] and models["drops"]["flagged"]
    rises = models["rises"]["ci"]["overall"]["refusal_accuracy"]
    assert rises["interval"][0] > 0 and rises["adjusted_p_value"] <= 0.05 and not rises["flagged"]
    assert not models["rises"]["flagged"] and not models["same"]["flagged"]
    # answer accuracy has no answerable item: no value, no test, no flag
    assert models["drops"]["static"]["overall"]["answer_accuracy"] is None
    assert models["drops"]["ci"]["overall"]["answer_accuracy"]["interval"] is None


def test_fewer_base_items_than_min_clusters_give_no_interval_and_no_flag():
    few = MIN_CLUSTERS - 1
    static, fresh = judged("s", few, {"m": 1.0}), judged("f", 20, {"m": 0.0})
    test = document(static, fresh)["models"]["m"]["ci"]["overall"]["refusal_accuracy"]
    assert test["interval"] is None and test["p_value"] is None and not test["flagged"]
    assert test["note"] == f"insufficient data (n = {few})" and test["support"] == few


def test_only_the_strata_both_sets_hold_are_compared():
    static = judged("s", 12, {"m": 1.0}, strata=("MEDIUM", "HIGH"))
    fresh = judged("f", 12, {"m": 1.0}, strata=("HIGH",))
    result = document(static, fresh)
    assert result["strata"] == ["P-MissingInfo/HIGH"]
    assert set(result["models"]["m"]["gap"]) == {"overall", "P-MissingInfo/HIGH"}


def test_static_strata_are_canonical_and_skip_names_outside_the_taxonomy():
    pairs = [("P-MissingInfo", "LOW"), ("missing-info", "high"), ("P-Nonsense", "LOW"), ("P-MissingInfo", "LOW")]
    assert static_strata(pairs) == ["P-MissingInfo/HIGH", "P-MissingInfo/LOW"]
