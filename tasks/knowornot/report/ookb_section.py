"""The KnowOrNot report's section on synthetic out-of-KB questions: their own experiment (App. D.2).

Leave-one-out questions are answerable from the KB minus their own pair, so an abstention
there is the right call; a synthetic question is only out of the KB if its generator got it
right (the paper found 30-78% were), so its abstention rate means little until its validity
is labelled. The section shows the synthetic questions' rates per configuration, apart from
the leave-one-out ones, and the validity labels given so far (``ookb.validity_summary``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from refusalbench.tasks.core.html_page import escape, frame_table
from refusalbench.tasks.knowornot.stages.ookb import OOKB_VALIDITY


def _share(rate: Any, low: Any, high: Any) -> str:
    if rate is None or pd.isna(rate):
        return "–"
    return f"{rate:.3f}" if pd.isna(low) or pd.isna(high) else f"{rate:.3f} [{low:.3f}, {high:.3f}]"


def synthetic_ookb_html(metrics: pd.DataFrame | None, validity: Sequence[Mapping[str, Any]]) -> str:
    """The section's HTML: rates of the synthetic questions, then their validity labels."""
    if metrics is None or metrics.empty:
        return (
            "<p>This run asked no synthetic out-of-KB questions (<code>knowornot.synthetic_ookb: 0</code>); "
            "every rate above is leave-one-out.</p>"
        )
    questions = int(metrics["n"].max())
    table = metrics.assign(
        **{
            "abstention (95% CI)": [
                _share(r, lo, hi)
                for r, lo, hi in zip(
                    metrics["abstention_rate"], metrics["abstention_ci_low"], metrics["abstention_ci_high"]
                )
            ]
        }
    )
    shown = ["target", "retrieval", "prompt", "n", "n_abstention_judged", "abstention (95% CI)"]
    intro = (
        f"<p>{questions} question{'s' if questions != 1 else ''} an LLM wrote to lie outside the knowledge "
        "base, each asked in every configuration with its context drawn from the whole KB (no pair withheld). "
        "They are their own experiment: the rates above are leave-one-out only. An abstention here is right "
        "only where the question really is outside the KB (the paper found 30–78% were, App. D.2): label "
        f"their validity with <code>refusalbench knowornot label RUN --annotator NAME --spec "
        f"{OOKB_VALIDITY.name}</code>.</p>"
    )
    parts = [intro, frame_table(table[shown])]
    if validity:
        rows = [
            {
                "annotator": v["annotator"],
                "labelled": v["labelled"],
                "out of the KB": v["out_of_kb"],
                "valid share (95% CI)": _share(v["valid_share"], v["ci_low"], v["ci_high"]),
            }
            for v in validity
        ]
        parts.append("<p>Validity labels given so far:</p>" + frame_table(pd.DataFrame(rows)))
    else:
        parts.append(f"<p>{escape('No validity labels yet.')}</p>")
    return "".join(parts)
