"""The evaluation report: one self-contained HTML page, plus leaderboard forms for Prefect.

Everything is inline: CSS in a <style> block, plots as base64 PNGs drawn with matplotlib's
Agg canvas (no pyplot global state, no network, no JavaScript). Every piece of text that
comes from data — model names, group values, manifest entries — is escaped before it
reaches the page; in plots, ``$`` is escaped so a model name cannot switch matplotlib into
mathtext.

- :mod:`.page`: :class:`ReportInputs` (what a report shows) and :func:`build_report`.
- :mod:`.leaderboard`: the ranking and its markdown / JSON-row forms for Prefect artifacts.
- :mod:`.figures`: the matplotlib plots (``core.plotting``: canvas to base64 PNG, safe plot text).
- :mod:`.outcomes`: response distribution, standard errors, multi-document judging, FRR-MRR correlation.
- :mod:`.audit_section`: the human-audit section (``audit.json``, Table 2 form).
- :mod:`.gv`: the generator × verifier section (funnel, verdict consistency, pre-checks).
- :mod:`.generation_figures`: composition, contributions, pass rates, self-evaluation bias, verifier kappa.
- :mod:`.comparison_figures`: scaling, SFT vs DPO, thinking budget, domain difficulty (from the registry).
- :mod:`.paper_figures` (tables: :mod:`.paper_tables`): dashboards, refusal-accuracy ranking, class difficulty,
  domains, confusion across models and by intensity; figures left out, with reasons.
- :mod:`.summary_card`: the summary card at the top and the run metadata folded at the bottom.
- :mod:`.support`, :mod:`.guarded_tables`: the base items behind each number, and the small-sample
  guardrail (``core.stats.MIN_CLUSTERS``) on intervals, standard errors and significance.
- :mod:`.headings`: readable headings for the keys of the run's data files.
- ``core.html_page``: HTML building blocks (style sheet, escaping, tables, sections, the table of
  contents), shared with KnowOrNot.
"""

from refusalbench.tasks.refusalbench.report.leaderboard import (
    leaderboard_markdown,
    leaderboard_metrics,
    leaderboard_rows,
    ranked_models,
)
from refusalbench.tasks.refusalbench.report.page import ReportInputs, build_generation_report, build_report

__all__ = [
    "ReportInputs",
    "build_generation_report",
    "build_report",
    "leaderboard_markdown",
    "leaderboard_metrics",
    "leaderboard_rows",
    "ranked_models",
]
