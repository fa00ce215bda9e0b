"""The score's numbers stay bit for bit what they were before the bootstrap was sped up (issue 29).

``fixtures/score_reference.json`` holds the intervals, standard errors (cluster and i.i.d.),
pairwise block and breakdown intervals of two small paper-shaped runs, computed by the scoring
code as it was before the change (``python tests/refusalbench/test_score_reference.py`` rewrites it; do so only
when a change of the numbers is intended). Floats are stored with ``repr``, so equality is exact.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from refusalbench.tasks.refusalbench.scoring import score_frame
from refusalbench.tasks.refusalbench.scoring.inputs import ensure_prepared
from refusalbench.tasks.refusalbench.scoring.metrics import metrics_from_stats, model_stats
from refusalbench.tasks.refusalbench.scoring.specs import METRIC_SPECS
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, expected_behaviour

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "score_reference.json"


def paper_rows(n_models: int, n_base: int, confidence: bool, seed: int) -> pd.DataFrame:
    """Judged rows of the paper's shape: base items x the 18 strata, every target on every item."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(n_models):
        for b in range(n_base):
            for s, (cls, intensity) in enumerate((c, i) for c in PERTURBATION_CLASSES for i in INTENSITIES):
                expected = expected_behaviour(cls, intensity)
                draw = rng.random()
                decision = "ANSWER" if draw < 0.5 else expected if draw < 0.8 else "REFUSE_INFO_MISSING"
                conf = None
                if confidence:
                    conf = str(rng.choice(["VERY_CONFIDENT", "UNCERTAIN"])) if m % 2 else f"{rng.random():.3f}"
                rows.append(
                    {
                        "model": f"m{m}",
                        "item_id": f"b{b}-{s}",
                        "base_id": f"b{b}",
                        "expected": expected,
                        "decision": decision,
                        "answer_correct": bool(rng.random() < 0.6),
                        "confidence": conf,
                        "perturbation_class": cls,
                        "intensity": intensity,
                        "lever_id": f"lever-{s}",
                        "domain": ("law", "health")[b % 2],
                        "generator": f"g{s % 2}",
                    }
                )
    return pd.DataFrame(rows)


CASES = {"confidences": (3, 4, True, 1), "no_confidences": (4, 3, False, 2)}


def figures(case: str) -> dict:
    """The numbers under test, as JSON-ready values (floats by repr)."""
    result = score_frame(paper_rows(*CASES[case]), n_resamples=200, seed=0, generated_at="fixed")
    table = result.breakdown.sort_values(["group", "model", "value", "metric"])
    return json.loads(
        json.dumps(
            {
                "intervals": result.intervals,
                "standard_errors": result.standard_errors,
                "intervals_iid": result.intervals_iid,
                "standard_errors_iid": result.standard_errors_iid,
                "pairwise": result.pairwise,
                "breakdown": table[["ci_low", "ci_high"]].to_numpy().tolist(),
            }
        )
    )


def same(a, b) -> bool:
    """Exact equality, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("case", sorted(CASES))
def test_intervals_are_the_stored_ones_bit_for_bit(case):
    stored = json.loads(FIXTURE.read_text())[case]
    now = figures(case)
    for key in stored:
        assert same(now[key], stored[key]), key


def test_metrics_asked_by_name_are_those_of_the_full_computation():
    _, stats = model_stats(ensure_prepared(paper_rows(*CASES["confidences"])))
    full = metrics_from_stats(stats)
    for name in ("hierarchical_score", "ece_refusal", "calibrated_refusal_score", "coverage"):
        part = metrics_from_stats(stats, [name])
        assert list(part) == [name] and np.array_equal(part[name], full[name], equal_nan=True)
    assert set(full) == set(METRIC_SPECS)


if __name__ == "__main__":  # rewrite the fixture from the current code
    FIXTURE.write_text(json.dumps({case: figures(case) for case in CASES}, indent=None) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
