"""The evaluation report: one self-contained HTML page, plus leaderboard forms for Prefect.

Everything is inline: CSS in a <style> block, charts as Vega-Lite specs with their data,
drawn in the browser by the Vega JavaScript inlined once in the head (``core.charts``; no
network). Every piece of text that comes from data — model names, group values, manifest
entries — is escaped before it reaches the page; in a chart's spec it is JSON data, with
``<`` escaped so a model name cannot end the script.

- :mod:`.page`: :class:`ReportInputs` (what a report shows) and :func:`build_report`.
- :mod:`.leaderboard`: the ranking and its markdown / JSON-row forms for Prefect artifacts.
- :mod:`.figures`: the per-model charts (scatter, class × intensity, confusion, intensity curves, calibration).
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
