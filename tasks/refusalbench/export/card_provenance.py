"""The run facts a dataset card is written from, and the card's Provenance section.

:class:`RunFacts` is what ``tasks.export`` reads from one run folder. The Provenance section
states where the benchmark came from: the run and its manifest, the lever catalogue and prompt
templates (recorded hashes against the installed ones) and the generation settings, with the
models' endpoints and keys left out. The Markdown helpers live here too, below ``dataset_card``,
so that both modules table their figures the same way without importing each other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pandas as pd
import pyarrow as pa
import yaml

from refusalbench.tasks.core.runfolder import RunManifest
from refusalbench.tasks.refusalbench.schema.json_files import AuditDocument, GVAnalysis
from refusalbench.tasks.refusalbench.schema.records import Lever
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES

# Model settings that are safe to publish (no endpoint, key variable or headers).
PUBLIC_MODEL_KEYS = ("model", "params", "json_schema", "thinking_budget", "family", "parameters_b")


@dataclass
class RunFacts:
    """What the card is written from, read from one run folder."""

    run_uri: str
    benchmark: pa.Table
    manifest: RunManifest | None = None  # the generation's manifest
    manifest_source: str | None = None  # which file it came from
    evaluated: bool = False  # the folder also holds an evaluation of the benchmark
    gv: GVAnalysis | None = None
    audit: AuditDocument | None = None
    assigned_levers: list[str] | None = None  # lever ids of assignments.parquet (one per assignment)
    catalogue: list[Lever] = field(default_factory=list)  # the catalogue installed now
    catalogue_hash_now: str | None = None
    prompt_hashes_now: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # mismatches found while reading

    @property
    def frame(self) -> pd.DataFrame:
        return self.benchmark.to_pandas()


# ---------------------------------------------------------------- formatting


def cell(value: Any) -> str:
    """A value as one Markdown table cell: no line breaks, pipes or HTML."""
    text = "" if value is None else str(value)
    text = " ".join(text.split())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def rate(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def type_name(arrow_type: pa.DataType) -> str:
    """An Arrow type without angle brackets: ``list[{text: string, relevant: bool}]``."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return f"list[{type_name(arrow_type.value_type)}]"
    if pa.types.is_struct(arrow_type):
        return "{" + ", ".join(f"{f.name}: {type_name(f.type)}" for f in arrow_type) + "}"
    return str(arrow_type)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def ordered(values: Sequence[str], order: Sequence[str]) -> list[str]:
    present = set(values)
    return [v for v in order if v in present] + sorted(present - set(order))


def crosstab(
    frame: pd.DataFrame, rows: str, columns: str, row_order: Sequence[str] = (), column_order: Sequence[str] = ()
) -> tuple[list[str], list[list[Any]]]:
    """Counts of ``rows`` x ``columns`` with a total column and a total row (headers, rows)."""
    counts = Counter(zip(frame[rows].astype(str), frame[columns].astype(str)))
    row_values = ordered(list(frame[rows].astype(str)), row_order)
    column_values = ordered(list(frame[columns].astype(str)), column_order)
    body = [
        [r, *[counts.get((r, c), 0) for c in column_values], sum(counts.get((r, c), 0) for c in column_values)]
        for r in row_values
    ]
    totals = ["total", *[sum(counts.get((r, c), 0) for r in row_values) for c in column_values], len(frame)]
    return [rows, *column_values, "total"], body + [totals]


# ---------------------------------------------------------------- provenance


def generation_config(facts: RunFacts) -> dict[str, Any]:
    """The generation section of the run's config; the base set by file name (a local path is no use to readers)."""
    gen = dict((facts.manifest.config.get("generation") or {}) if facts.manifest else {})
    if gen.get("base_set"):
        gen["base_set"] = PurePosixPath(str(gen["base_set"]).replace("\\", "/")).name
    return gen


def levers_section(facts: RunFacts) -> list[str]:
    frame = facts.frame
    by_id = {lever.id: lever for lever in facts.catalogue}
    used = Counter(frame["lever_id"])
    lines = ["### Lever catalogue", ""]
    recorded = facts.manifest.catalogue_hash if facts.manifest else None
    now = facts.catalogue_hash_now
    if not recorded:
        catalogue = (
            f"- catalogue hash at generation: not recorded; the catalogue installed now has "
            f"{len(facts.catalogue)} levers, hash `{now}`"
        )
    elif recorded == now:
        catalogue = (
            f"- catalogue hash at generation (sha256): `{recorded}`; the catalogue installed now is the same "
            f"({len(facts.catalogue)} levers)"
        )
    else:
        catalogue = (
            f"- catalogue hash at generation (sha256): `{recorded}`; the catalogue installed now differs "
            f"({len(facts.catalogue)} levers, hash `{now}`)"
        )
    lines += [
        catalogue,
        f"- levers in this dataset: {len(used)} distinct"
        + (
            f"; levers assigned: {len(set(facts.assigned_levers))} distinct over {len(facts.assigned_levers)} "
            "assignments"
            if facts.assigned_levers is not None
            else ""
        ),
        "",
        "Distinct levers per class × intensity in this dataset:",
        "",
    ]
    distinct = frame.drop_duplicates("lever_id")
    lines += [md_table(*crosstab(distinct, "perturbation_class", "intensity", PERTURBATION_CLASSES, INTENSITIES)), ""]
    rows = [
        [
            lid,
            by_id[lid].name if lid in by_id else "(not in the installed catalogue)",
            *frame.loc[frame["lever_id"] == lid, ["perturbation_class", "intensity"]].iloc[0],
            used[lid],
        ]
        for lid in sorted(used)
    ]
    lines += [
        "<details><summary>Levers used</summary>",
        "",
        md_table(["lever", "name", "class", "intensity", "items"], rows),
        "",
        "</details>",
        "",
    ]
    return lines


def prompts_section(facts: RunFacts) -> list[str]:
    recorded = facts.manifest.prompt_hashes if facts.manifest else {}
    rows = [
        [name, f"`{value}`", ("same" if facts.prompt_hashes_now.get(name) == value else "differs")]
        for name, value in recorded.items()
        if not name.startswith("kon_")
    ]
    if not rows:
        return ["### Prompt templates", "", "No template hashes recorded.", ""]
    return [
        "### Prompt templates",
        "",
        "sha256 prefixes of the templates the run used (generator and verifier: how the items were made; "
        "target and judge: how RefusalBench evaluates them), and whether the installed package's are the same.",
        "",
        md_table(["template", "hash", "installed now"], rows),
        "",
    ]


def _folder_name(uri: str) -> str:
    return PurePosixPath(uri.replace("\\", "/").rstrip("/")).name or uri


def provenance(facts: RunFacts) -> list[str]:
    lines = ["## Provenance", ""]
    m = facts.manifest
    if m is not None:
        rows: list[list[Any]] = [
            ["run folder", _folder_name(facts.run_uri)],
            ["manifest", facts.manifest_source],
            ["run id", m.run_id],
            ["status", m.status],
            ["created", m.created_at.isoformat()],
            ["finished", m.finished_at.isoformat() if m.finished_at else ""],
            ["refusalbench", m.package_version],
            ["run-folder schema", m.schema_version],
            ["config hash", m.config_hash],
            ["seed", m.seed],
        ]
        if facts.evaluated:
            rows.append(["evaluated", "yes: the run folder also holds an evaluation (not part of this export)"])
        lines += [md_table(["", ""], rows), ""]
    else:
        lines += [f"Run folder: `{cell(_folder_name(facts.run_uri))}`; no generation manifest.", ""]
    lines += levers_section(facts) + prompts_section(facts)
    if m is not None:
        gen = generation_config(facts)
        pretest = gen.get("pretest") or {}
        names = list(
            dict.fromkeys(
                [
                    *gen.get("generators", []),
                    *gen.get("verifiers", []),
                    *pretest.get("models", []),
                    *([pretest["judge"]] if pretest.get("judge") else []),
                ]
            )
        )
        models = {
            n: {
                k: v
                for k, v in (m.config.get("models", {}).get(n) or {}).items()
                if k in PUBLIC_MODEL_KEYS and v not in (None, {}, [])
            }
            for n in names
        }
        settings = {"generation": gen, "models": models}
        lines += [
            "### Configuration",
            "",
            "The generation settings (the base set by file name) and the models they name (endpoints, key "
            "variables and headers left out).",
            "",
            "```yaml",
            yaml.safe_dump(settings, sort_keys=False, allow_unicode=True, width=1000).rstrip(),
            "```",
            "",
        ]
    return lines
