"""The dataset card (``README.md`` with YAML metadata) of an exported benchmark.

Every figure on the card is computed from the run folder (:class:`RunFacts`, gathered by
``tasks.export``): the composition from ``benchmark.parquet``, the funnel and the
generator x verifier pass rates from ``gv_analysis.json``, the human audit from
``audit.json``, the provenance (seed, hashes, settings) from the generation's manifest.
What the run does not record is said to be missing, never filled in. The licence is left
to the user: the YAML carries :data:`LICENSE_PLACEHOLDER` and the card says to replace it.

Text from the run (model names, lever ids, domains) is escaped for Markdown tables. The run
facts, the Markdown helpers and the Provenance section are in ``card_provenance``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from refusalbench.tasks.refusalbench.export.card_provenance import (
    RunFacts,
    cell,
    crosstab,
    generation_config,
    md_table,
    ordered,
    plural,
    provenance,
    rate,
    type_name,
)
from refusalbench.tasks.refusalbench.schema.json_files import AuditPassRate
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, STRATA

LICENSE_PLACEHOLDER = "FILL-IN"  # not a licence id on purpose: the user must choose one
LICENSE_SENTENCE = (
    f"**Licence: not set.** Replace `license: {LICENSE_PLACEHOLDER}` in the YAML header with the "
    "licence you share this dataset under (a Hub licence id such as `cc-by-sa-4.0`, or `other` with "
    "`license_name` and `license_link`). It has to respect the licence of the base set the items "
    "were written from and the terms of use of the generator models."
)
SIZE_CATEGORIES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
)
COLUMNS = {
    "item_id": "the test case's id",
    "base_id": "id of the base item it was written from",
    "variant": "`single` (one context) or `multi` (passages)",
    "perturbation_class": "uncertainty class of the lever",
    "intensity": "LOW (must still be answered), MEDIUM or HIGH (must be refused)",
    "lever_id": "the lever applied (catalogue id)",
    "generator": "the model (registry name) that wrote the perturbation",
    "question": "the perturbed question a model is asked",
    "context": "the perturbed context (single-document items)",
    "passages": "the perturbed passages, each with text and relevant (multi-document items)",
    "original_question": "the base item's question",
    "original_context": "the base item's context",
    "original_passages": "the base item's passages",
    "answers": "reference answers of the base item",
    "expected": "ANSWER_CORRECTLY or the refusal code the item calls for",
    "domain": "domain of the base item",
}


@dataclass
class ExportConfig:
    """One ``configs:`` entry of the card: its name, split and the files' glob (relative to DIR)."""

    name: str
    split: str
    path: str
    rows: int
    default: bool = False


# ---------------------------------------------------------------- YAML header


def size_category(n: int) -> str:
    return next((label for bound, label in SIZE_CATEGORIES if n < bound), "n>100M")


def metadata(facts: RunFacts, configs: Sequence[ExportConfig], *, pretty_name: str, languages: Sequence[str]) -> str:
    """The YAML header (between ``---`` lines), the licence placeholder with its comment."""
    frame = facts.frame
    tags = ["refusalbench", "rag", "selective-refusal", "synthetic"]
    if "multi" in set(frame["variant"]):
        tags.append("multi-document")
    config_entries = []
    for config in configs:
        entry: dict[str, Any] = {"config_name": config.name}
        if config.default:
            entry["default"] = True
        entry["data_files"] = [{"split": config.split, "path": config.path}]
        config_entries.append(entry)

    def dump(data: dict[str, Any]) -> str:
        text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000)
        return text

    return "".join(
        [
            "---\n",
            dump({"pretty_name": pretty_name}),
            "# license: fill in before sharing (see the Licence section below)\n",
            dump({"license": LICENSE_PLACEHOLDER}),
            dump(
                {
                    "language": list(languages),
                    "task_categories": ["question-answering"],
                    "tags": tags,
                    "size_categories": [size_category(len(frame))],
                    "configs": config_entries,
                }
            ),
            "---\n",
        ]
    )


# ---------------------------------------------------------------- sections


def _model_string(facts: RunFacts, name: str) -> str:
    models = facts.manifest.config.get("models", {}) if facts.manifest else {}
    model = (models.get(name) or {}).get("model")
    return f"{name} = `{model}`" if model and model != name else name


def _funnel(facts: RunFacts) -> dict[str, int] | None:
    if facts.gv is not None:
        return dict(facts.gv.funnel)
    return None


def intro(facts: RunFacts, pretty_name: str) -> list[str]:
    frame = facts.frame
    variants = Counter(frame["variant"])
    parts = [
        f"{variants[v]} {'single-document' if v == 'single' else 'multi-document' if v == 'multi' else v}"
        for v in ordered(list(variants), ("single", "multi"))
    ]
    made = ""
    if facts.manifest is not None:
        m = facts.manifest
        made = (
            f" It was generated by RefusalBench run `{m.run_id}` ({m.created_at:%Y-%m-%d}, refusalbench "
            f"{m.package_version}, seed {m.seed})."
        )
    return [
        f"# {pretty_name}",
        "",
        f"A RefusalBench selective-refusal benchmark for retrieval-augmented generation: "
        f"{len(frame)} test cases ({', '.join(parts)}), each a question with its context that a lever has "
        f"perturbed. LOW-intensity items must still be answered (`ANSWER_CORRECTLY`); MEDIUM and HIGH items must "
        f"be refused with the code of their uncertainty class (`expected`).{made}",
        "",
        "## Licence",
        "",
        LICENSE_SENTENCE,
        "",
    ]


def loading(configs: Sequence[ExportConfig]) -> list[str]:
    default = next(c for c in configs if c.default)
    lines = [
        "## Loading",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'ds = load_dataset("path/to/this/folder")          # config "{default.name}", split "{default.split}"',
        'ds = load_dataset("parquet", data_dir="path/to/this/folder")  # the same rows, without the card',
    ]
    others = [c for c in configs if not c.default]
    if others:
        lines.append(f'single = load_dataset("path/to/this/folder", "{others[0].name}")  # one variant only')
    lines += [
        "```",
        "",
        md_table(
            ["config", "split", "files", "rows"],
            [[c.name + (" (default)" if c.default else ""), c.split, f"`{c.path}`", c.rows] for c in configs],
        ),
        "",
    ]
    return lines


def fields_section(facts: RunFacts) -> list[str]:
    rows = [[f"`{f.name}`", f"`{type_name(f.type)}`", COLUMNS.get(f.name, "")] for f in facts.benchmark.schema]
    return ["## Fields", "", md_table(["column", "type", "meaning"], rows), ""]


def composition(facts: RunFacts) -> list[str]:
    frame = facts.frame
    lines = [
        "## Composition",
        "",
        "### Class × intensity",
        "",
        md_table(*crosstab(frame, "perturbation_class", "intensity", PERTURBATION_CLASSES, INTENSITIES)),
        "",
        "### Generator × class",
        "",
        md_table(*crosstab(frame, "generator", "perturbation_class", (), PERTURBATION_CLASSES)),
        "",
        "### Expected behaviour",
        "",
    ]
    expected = Counter(frame["expected"])
    lines += [md_table(["expected", "items"], [[k, expected[k]] for k in sorted(expected)]), ""]
    if "domain" in frame.columns and frame["domain"].notna().any():
        lines += [
            "### Variant × domain",
            "",
            md_table(*crosstab(frame.fillna({"domain": "(none)"}), "domain", "variant", (), ("single", "multi"))),
            "",
        ]
    return lines


def methods(facts: RunFacts) -> list[str]:
    """How the benchmark was made, with the run's numbers (paper §3.3-3.4)."""
    gen = generation_config(facts)
    lines = ["## How it was made", ""]
    if facts.manifest is None:
        lines += [
            "This run folder holds no generation manifest (the benchmark was generated elsewhere and only "
            "evaluated here, or the manifest was removed): the settings and hashes it was made with are "
            "unknown.",
            "",
        ]
    counts = facts.manifest.counts if facts.manifest else {}
    funnel = _funnel(facts)
    generators = gen.get("generators") or sorted(set(facts.frame["generator"]))
    verifiers = gen.get("verifiers") or []
    rule = gen.get("filter") or (facts.gv.filter if facts.gv else None)
    sentences = []
    base = counts.get("base_set_funnel") or {}
    if base and facts.manifest is not None:  # the counts come from the manifest: no manifest, no base counts
        pretest = (
            f", {base['kept']} of {base['pretested']} kept by the pre-test (every pre-test model answered correctly)"
            if "kept" in base and "pretested" in base
            else ""
        )
        sentences.append(
            f"{base.get('sampled', counts.get('base_items', '?'))} base items were drawn (seed "
            f"{facts.manifest.seed}) from the {base.get('imported', '?')} items of `{gen.get('base_set')}`"
            f"{pretest}."
        )
    if "assignments" in counts:
        strata = f"the strata {', '.join(gen['strata'])}" if gen.get("strata") else f"all {len(STRATA)} strata"
        sentences.append(
            f"Levers from the catalogue were assigned to them, {gen.get('levers_per_stratum', 1)} per "
            f"class × intensity stratum ({strata}): {counts['assignments']} assignments."
        )
    gen_text = ", ".join(_model_string(facts, g) for g in generators)
    if funnel:
        sentences.append(
            f"{plural(len(generators), 'generator')} ({gen_text}) were given the assignments "
            f"to perturb: {funnel['attempted']} attempts, {funnel['parsed']} parsed, "
            f"{funnel['prechecked']} passed the rule-based pre-checks."
        )
    else:
        sentences.append(f"Generators (as the items name them): {gen_text}.")
    if verifiers:
        verdicts = facts.gv.verdict_counts if facts.gv else counts.get("verifications_by_verdict", {})
        mode = (
            "every verifier judged every pre-checked candidate"
            if gen.get("verification", "exhaustive") == "exhaustive"
            else "the verifiers judged each pre-checked candidate in turn, stopping at the first FAIL"
        )
        names = ", ".join(_model_string(facts, v) for v in verifiers)
        other = sum(verdicts.values()) - verdicts.get("PASS", 0) - verdicts.get("FAIL", 0)
        sentences.append(
            f"{plural(len(verifiers), 'verifier')} ({names}) checked them against the lever's rubric "
            f"({mode}): {sum(verdicts.values())} verifications, {verdicts.get('PASS', 0)} PASS, "
            f"{verdicts.get('FAIL', 0)} FAIL" + (f", {other} without a verdict (errors, skipped)." if other else ".")
        )
    if rule and funnel:
        if rule == "none":
            sentences.append(
                f"No verification filter was applied (`filter: none`): every pre-checked candidate was "
                f"kept whatever the verdicts, {funnel['accepted']} accepted. These items are not verified."
            )
        else:
            what = (
                "every verifier passed"
                if rule == "unanimous"
                else "more than half of the verifiers that answered passed"
            )
            sentences.append(f"The {rule} filter kept the candidates {what}: {funnel['accepted']} accepted.")
    if funnel:
        target = gen.get("target_size")
        balance = gen.get("balance", "natural")
        size = f"target {target}" if target else "no target size: every accepted item"
        seed = facts.manifest.seed if facts.manifest else "unknown"
        sentences.append(
            f"Stratified sampling over the class × intensity strata ({size}, {balance} balance of the "
            f"generators within a stratum, seed {seed}) gave the {funnel['sampled']} items of this "
            "dataset."
        )
    shortfalls = facts.gv.shortfalls if facts.gv else counts.get("shortfalls")
    if shortfalls:
        sentences.append(
            f"{len(shortfalls)} strata have fewer items than their quota: {', '.join(sorted(shortfalls))}."
        )
    lines += [" ".join(sentences), ""]
    return lines


def gv_section(facts: RunFacts) -> list[str]:
    lines = ["## Generator–verifier analysis", ""]
    gv = facts.gv
    if gv is None:
        return lines + ["No `gv_analysis.json` in the run folder: the funnel and the pass rates are not available.", ""]
    lines += [
        "### Funnel",
        "",
        "Candidates at each step (sampled: items in this dataset).",
        "",
        md_table(["step", "candidates"], [[k, v] for k, v in gv.funnel.items()]),
        "",
        "### Pass rate: generator × verifier",
        "",
        "PASS / (PASS + FAIL) of each verifier over each generator's candidates (errors and skips left out); "
        "n: verdicts.",
        "",
    ]
    verifiers = list(dict.fromkeys(v for row in gv.pass_rate_matrix.values() for v in row))
    rows = [
        [
            gen,
            *[
                f"{rate(gv.pass_rate_matrix[gen].get(v))} (n={gv.judged_counts.get(gen, {}).get(v, 0)})"
                for v in verifiers
            ],
        ]
        for gen in gv.pass_rate_matrix
    ]
    lines += [md_table(["generator", *verifiers], rows), ""]
    if gv.self_evaluation:
        lines += [
            "Self-evaluation bias (a model verifying its own candidates vs the others'):",
            "",
            md_table(
                ["model", "self pass rate", "cross pass rate", "bias"],
                [
                    [m, rate(s.self_pass_rate), rate(s.cross_pass_rate), rate(s.self_evaluation_bias)]
                    for m, s in gv.self_evaluation.items()
                ],
            ),
            "",
        ]
    if gv.verifier_kappa:
        lines += [
            md_table(
                ["verifier a", "verifier b", "Cohen's kappa", "n", "note"],
                [[k.verifier_a, k.verifier_b, rate(k.kappa), k.n, k.reason or ""] for k in gv.verifier_kappa],
            ),
            "",
        ]
    if gv.precheck_failures:
        lines += ["Pre-check rejections: " + ", ".join(f"{rule} {n}" for rule, n in gv.precheck_failures.items()), ""]
    return lines


def _pass_rows(group: str, rates: Sequence[AuditPassRate]) -> list[list[Any]]:
    return [[group, r.value, r.n, r.passed, rate(r.pass_rate), f"[{rate(r.ci_low)}, {rate(r.ci_high)}]"] for r in rates]


def audit_section(facts: RunFacts) -> list[str]:
    lines = ["## Human audit", ""]
    audit = facts.audit
    if audit is None:
        return lines + ["No human audit in this run folder (`refusalbench audit sample|label|report` adds one).", ""]
    kappa = audit.annotator_agreement.get("kappa")
    kind = audit.annotator_agreement.get("kappa_kind")
    strata = ", ".join(f"{n} {name}" for name, n in audit.sampled_per_stratum.items())
    lines += [
        f"A stratified sample of {audit.sample_size} items ({strata}) was checked by hand against the "
        f"verifier rubric by {plural(len(audit.labels_per_annotator), 'annotator')}; {audit.item_rule}. "
        f"Overall pass rate {rate(audit.overall.pass_rate)} ({audit.overall.passed}/{audit.overall.n}, "
        f"{audit.interval} [{rate(audit.overall.ci_low)}, {rate(audit.overall.ci_high)}])"
        + (f"; {str(kind).capitalize()}'s kappa between annotators {rate(kappa)}." if kind else "."),
        "",
        md_table(
            ["group", "value", "n", "passed", "pass rate", "95% CI"],
            _pass_rows("class", audit.by_class)
            + _pass_rows("intensity", audit.by_intensity)
            + _pass_rows("all", [audit.overall]),
        ),
        "",
    ]
    consensus = audit.verifier_agreement.get("consensus") if audit.verifier_agreement else None
    if isinstance(consensus, dict) and consensus.get("n"):
        lines += [
            f"Humans vs the verifier consensus: {rate(consensus.get('percent_agreement'))} agreement over "
            f"{consensus['n']} items.",
            "",
        ]
    return lines


def notes_section(facts: RunFacts) -> list[str]:
    notes = list(facts.notes) + (list(facts.manifest.notes) if facts.manifest else [])
    if not notes:
        return []
    return ["## Notes", "", *[f"- {cell(n)}" for n in notes], ""]


def limitations(facts: RunFacts) -> list[str]:
    rule = generation_config(facts).get("filter") or (facts.gv.filter if facts.gv else None) or "model"
    checked = (
        "- The items were written by language models and kept without a verification filter (`filter: none`): "
        "the verifiers' verdicts were recorded but did not decide. Audit them before relying on them."
        if rule == "none"
        else f"- The items were written and checked by language models. The {rule} verification filter removes many "
        "bad items but not all; see the human audit above, where one exists."
    )
    return [
        "## Limitations",
        "",
        checked,
        "- `expected` is the label the lever calls for; it is not a human annotation of every item.",
        "- The answers and contexts come from the base set: its biases, errors and licence carry over.",
        "",
    ]


def render_card(facts: RunFacts, configs: Sequence[ExportConfig], *, pretty_name: str, languages: Sequence[str]) -> str:
    """The whole ``README.md``: YAML metadata, then the card."""
    body = (
        intro(facts, pretty_name)
        + loading(configs)
        + fields_section(facts)
        + composition(facts)
        + methods(facts)
        + gv_section(facts)
        + audit_section(facts)
        + provenance(facts)
        + notes_section(facts)
        + limitations(facts)
        + [
            "<!-- written by `refusalbench export --format hf` from the run folder; regenerate rather than edit "
            "the figures -->",
            "",
        ]
    )
    return metadata(facts, configs, pretty_name=pretty_name, languages=languages) + "\n" + "\n".join(body)
