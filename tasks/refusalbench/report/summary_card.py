"""The top of the RefusalBench report: the summary card and the run metadata folded away.

Everything the card says is read from the run's files: the configuration and costs from
``manifest.json``, the verification filter from ``gv_analysis.json`` (else the configuration),
items and base items from ``benchmark.parquet`` (else the judged rows, else the manifest's
counts), the warnings from metrics.json's coverage and outcomes. The run metadata shows
``manifest.json`` with the registry cut down to the models the run used and a local model's
weight files counted rather than listed; the file on disk keeps everything.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pandas as pd

from refusalbench.tasks.core.html_page import escape, folded, mapping_html, run_kind_and_status, section, summary_card
from refusalbench.tasks.llm.reply_outcomes import OK
from refusalbench.tasks.refusalbench.report.cost_section import cost_summary_line
from refusalbench.tasks.refusalbench.report.headings import heading
from refusalbench.tasks.refusalbench.report.leaderboard import incomplete_models, incomplete_note
from refusalbench.tasks.refusalbench.report.support import ClusterSupport, floor_warning
from refusalbench.tasks.refusalbench.scoring.inputs import CLUSTER_COLUMN

# (role, config section, key): where the configuration names the models of each role.
ROLES: tuple[tuple[str, str, str], ...] = (
    ("Generators", "generation", "generators"),
    ("Verifiers", "generation", "verifiers"),
    ("Judge", "evaluation", "judge"),
    ("Targets", "evaluation", "targets"),
)
VERIFIED = {"unanimous": "every verifier accepted", "majority": "most verifiers accepted"}


def _names(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def models_by_role(config: Mapping[str, Any], metrics: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
    """Role -> the models the configuration gives it (pre-test models with the generators' section);
    without an evaluation section, the scored models are the targets."""
    out: dict[str, list[str]] = {}
    for role, part, key in ROLES:
        names = _names((config.get(part) or {}).get(key))
        if names:
            out[role] = names
    pretest = (config.get("generation") or {}).get("pretest") or {}
    if pretest:
        out["Pre-test models"] = _names(pretest.get("models"))
        out["Pre-test judge"] = _names(pretest.get("judge"))
    if "Targets" not in out and metrics:
        out["Targets"] = sorted(metrics)
    return out


def used_models(manifest: Mapping[str, Any]) -> set[str]:
    """Registry names the run used: every role's, and every model the call and cost records name."""
    config = manifest.get("config") or {}
    used = {name for names in models_by_role(config).values() for name in names}
    used |= set(manifest.get("calls") or {})
    for entry in ((manifest.get("costs") or {}).get("by_stage") or {}).values():
        used |= set((entry or {}).get("by_model") or {})
    return used


def shown_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest as the page shows it: ``config.models`` cut to :func:`used_models`, each local
    model's file list replaced by its count."""
    shown = copy.deepcopy(dict(manifest))
    config = shown.get("config")
    if isinstance(config, dict) and isinstance(config.get("models"), dict):
        used = used_models(manifest)
        models = {name: entry for name, entry in config["models"].items() if name in used}
        for entry in models.values():
            local = entry.get("local") if isinstance(entry, dict) else None
            if isinstance(local, dict) and isinstance(local.get("files"), list):
                local["files"] = f"{len(local['files'])} file(s) (listed in manifest.json)"
        left_out = len(config["models"]) - len(models)
        config["models"] = models
        if left_out:
            config["models_not_used"] = f"{left_out} registry entries not used by this run (in manifest.json)"
    return shown


def metadata_section(manifest: Mapping[str, Any]) -> str:
    """The run metadata, folded: what produced the run, with only the models it used."""
    body = mapping_html(shown_manifest(manifest), heading=heading)
    note = (
        "<p class='note'>From manifest.json: the models this run used (the file lists the whole registry "
        "and every weight file).</p>"
    )
    return section("Run metadata", folded("Show the run metadata", note + body))


def _items(
    benchmark: pd.DataFrame | None, support: ClusterSupport, counts: Mapping[str, Any]
) -> tuple[int | None, int | None]:
    """(items, base items) of the benchmark the targets answered."""
    if benchmark is not None and not benchmark.empty and "item_id" in benchmark.columns:
        bases = benchmark[CLUSTER_COLUMN].nunique() if CLUSTER_COLUMN in benchmark.columns else None
        return int(benchmark["item_id"].nunique()), None if bases is None else int(bases)
    items = counts.get("items")
    return (int(items) if isinstance(items, int) else None), support.total()


def verification_text(gv_analysis: Mapping[str, Any] | None, config: Mapping[str, Any]) -> str:
    """Whether the benchmark was verified, from the G-V analysis (else the configuration)."""
    rule = (gv_analysis or {}).get("filter") or (config.get("generation") or {}).get("filter")
    if rule is None:
        return "unknown: this run folder holds no generation record"
    if rule == "none":
        return "no — filter: none (every candidate kept whatever the verifiers said)"
    return f"yes — filter: {rule} ({VERIFIED.get(str(rule), 'per the filter')})"


def _warnings(
    manifest: Mapping[str, Any],
    metrics: Mapping[str, Mapping[str, float]],
    min_coverage: float,
    outcomes: Mapping[str, Mapping[str, int]] | None,
    base_items: int | None,
    rule: str | None,
) -> list[str]:
    out = []
    status = manifest.get("status")
    # "running": the report is written by the run's last stage, before the run records its end.
    if status and status not in ("completed", "running"):
        out.append(f"The run's status is {status}.")
    for model, coverage in incomplete_models(metrics, min_coverage).items():
        out.append(f"{model}: {incomplete_note(coverage)} (below {100 * min_coverage:.0f}%; unranked).")
    for model, counts in (outcomes or {}).items():
        lost = {name: int(n) for name, n in counts.items() if name != OK and int(n or 0) > 0}
        if lost:
            rows = sum(int(n or 0) for n in counts.values())
            detail = ", ".join(f"{name} {n}" for name, n in lost.items())
            out.append(f"{model}: {sum(lost.values())} of {rows} rows not scored ({detail}).")
    if rule == "none":
        out.append("Not a verified benchmark (filter: none).")
    if base_items is not None and (line := floor_warning(base_items)):
        out.append(line)
    return out


def summary_section(
    *,
    manifest: Mapping[str, Any] | None,
    gv_analysis: Mapping[str, Any] | None,
    metrics: Mapping[str, Mapping[str, float]],
    min_coverage: float,
    outcomes: Mapping[str, Mapping[str, int]] | None,
    benchmark: pd.DataFrame | None,
    support: ClusterSupport,
) -> str:
    """The summary card: configuration, models by role, items, cost, verification and warnings."""
    manifest = manifest or {}
    config = manifest.get("config") or {}
    rows: list[tuple[str, str]] = []
    if config or manifest.get("config_hash"):
        name = escape(config.get("name", "—"))
        rows.append(
            ("Configuration", f"{name} <span class='ci'>(hash {escape(manifest.get('config_hash') or '—')})</span>")
        )
    if manifest.get("run_id"):
        rows.append(("Run", escape(f"{manifest['run_id']} ({run_kind_and_status(manifest)})")))
    for role, names in models_by_role(config, metrics).items():
        rows.append((role, escape(", ".join(names)) if names else "—"))
    items, bases = _items(benchmark, support, manifest.get("counts") or {})
    rows.append(("Items", "—" if items is None else f"{items:,}"))
    rows.append(("Base items", "—" if bases is None else f"{bases:,}"))
    costs = manifest.get("costs") or {}
    if costs.get("total"):
        rows.append(("Total cost", escape(cost_summary_line(costs))))
    rule = (gv_analysis or {}).get("filter") or (config.get("generation") or {}).get("filter")
    rows.append(("Verified benchmark", escape(verification_text(gv_analysis, config))))
    warnings = _warnings(manifest, metrics, min_coverage, outcomes, bases, rule)
    return summary_card(rows, warnings)
