"""Human audit of generated items (seed paper App. C.2 and its Table 2).

The paper checks its own generator-verifier pipeline by hand: an expert reads a stratified
sample of the items that passed verification (10 per class x intensity stratum) against
the verifiers' rubric and passes or fails each one; the pass rate per class is Table 2.

- ``draw_sample``: N items per stratum of the benchmark (seeded), in shuffled order.
- ``rubric``: the criteria the verifiers were given for an item, rendered from the
  verifier template itself, so annotators and verifiers read the same rubric.
- ``AuditLabelStore``: the shared label store (``labelling.label_store``: one fsync'ed line
  per label) for audit labels.
- ``verifier_consensus``, ``audit_document``: pass rates per class, intensity and stratum
  with Wilson intervals (``core.stats``), kappa between annotators (``labelling.agreement``),
  and agreement of the humans with the verifier consensus.
- ``sample_run``, ``open_audit_session``, ``write_audit``: the same over a run folder
  (what ``refusalbench audit sample|label|report`` do).

The labelling screens (terminal and loopback web page) are in ``audit_screens``.
"""

from __future__ import annotations

import math
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.eval_spec import EvalSpec
from refusalbench.tasks.core.narration import publish_table
from refusalbench.tasks.core.stats import wilson_interval
from refusalbench.tasks.core.store import ArtifactStore
from refusalbench.tasks.labelling.agreement import annotator_agreement, evaluator_vs_human
from refusalbench.tasks.labelling.label_store import LabelStore
from refusalbench.tasks.llm.prompting import render_messages
from refusalbench.tasks.refusalbench.levers import load_catalogue
from refusalbench.tasks.refusalbench.prompt_vocabulary import VERIFIER_VOCABULARY
from refusalbench.tasks.refusalbench.report.run_outputs import build_report_for
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files
from refusalbench.tasks.refusalbench.schema.json_files import AuditDocument, AuditLabel, AuditPassRate
from refusalbench.tasks.refusalbench.schema.records import BenchmarkItem, Lever, LeverExample, Verification
from refusalbench.tasks.refusalbench.stages.verify import required_criteria, verifier_template
from refusalbench.tasks.refusalbench.taxonomy import INTENSITIES, PERTURBATION_CLASSES, STRATA

AUDIT_VERDICTS: tuple[str, str] = ("PASS", "FAIL")
# The audit as a labelling spec, so the KnowOrNot agreement functions apply as they are.
AUDIT_SPEC = EvalSpec(
    name="audit",
    tag="audit",
    outcomes=list(AUDIT_VERDICTS),
    prompt="Does this generated test case meet every criterion of the verifier rubric?",
)
ITEM_RULE = (
    "an item passes when more than half of the annotators who labelled it passed it "
    "(a tie is a FAIL: a case one of two experts rejects is not a clean test case)"
)
VERIFIER_RULE = (
    "verifier consensus: PASS when more than half of the verifiers that gave a verdict passed the "
    "item (by the verdict that counts: a stated PASS its own criteria contradict is a FAIL); "
    "items no verifier judged are left out"
)
INTERVAL = "95% Wilson score interval"  # chosen over the bootstrap: strata hold ~10 items, pass rates near 1


def stratum_name(perturbation_class: str, intensity: str) -> str:
    return f"{perturbation_class}/{intensity}"


# ----------------------------------------------------------------- sampling


def draw_sample(items: Sequence[BenchmarkItem], per_stratum: int, seed: int = 0) -> list[BenchmarkItem]:
    """Up to ``per_stratum`` items of every class x intensity stratum, seeded, in shuffled order.

    Independent of the order of ``items``; a stratum with fewer items gives all it has.
    The shuffle keeps an annotator from reading one stratum in a block.
    """
    if per_stratum < 1:
        raise ValueError("per_stratum must be at least 1")
    rng = random.Random(seed)
    by_stratum: dict[tuple[str, str], list[BenchmarkItem]] = defaultdict(list)
    for item in sorted(items, key=lambda i: i.item_id):
        by_stratum[(item.perturbation_class, item.intensity)].append(item)
    order = [s for s in STRATA if s in by_stratum] + sorted(s for s in by_stratum if s not in STRATA)
    sample: list[BenchmarkItem] = []
    for stratum in order:
        pool = by_stratum[stratum]
        sample.extend(rng.sample(pool, min(per_stratum, len(pool))))
    rng.shuffle(sample)
    return sample


def stratum_counts(items: Iterable[BenchmarkItem]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[stratum_name(item.perturbation_class, item.intensity)] += 1
    return dict(counts)


# ----------------------------------------------------------------- what an annotator reads

_CRITERION_LINE = re.compile(r'^- "(?P<name>[a-z_]+)": (?P<text>.+)$')


def rubric(item: BenchmarkItem, lever: Lever) -> list[tuple[str, str]]:
    """``(criterion, wording)`` for every criterion the verifiers of this item were given.

    The verifier template is rendered for the item's lever and expected response (with no
    texts: the wording of the criteria depends on neither), and its criteria section read back.
    """
    messages = render_messages(
        verifier_template(item.variant),
        lever=lever,
        expected=item.expected,
        question="",
        answers=[],
        perturbed_question="",
        context="",
        perturbed_context="",
        passages=[],
        perturbed_passages=[],
        changes="",
        **VERIFIER_VOCABULARY,
    )
    text = messages[-1]["content"]
    section = text[text.rindex("# Criteria") :].split("\n# ", 1)[0]
    found = {m["name"]: m["text"].strip() for m in map(_CRITERION_LINE.match, section.splitlines()) if m}
    wanted = required_criteria(item.variant)
    missing = [name for name in wanted if name not in found]
    if missing:
        raise RuntimeError(f"{verifier_template(item.variant)} no longer words the criteria {missing}")
    return [(name, found[name]) for name in wanted]


def stand_in_lever(item: BenchmarkItem) -> Lever:
    """A lever for an item whose lever is gone from the catalogue: the rubric still renders."""
    unknown = "(this lever is not in the current catalogue)"
    return Lever(
        id=item.lever_id,
        name=item.lever_id,
        perturbation_class=item.perturbation_class,
        intensity=item.intensity,
        target="query-context",
        instruction=unknown,
        example=LeverExample(question="", context="", expected=item.expected),
        multi_document=unknown,
    )


@dataclass(frozen=True)
class AuditCase:
    """One item as an annotator sees it: the item, its lever and the rubric."""

    item: BenchmarkItem
    lever: Lever
    criteria: tuple[tuple[str, str], ...]
    spec: str = AUDIT_SPEC.name

    @property
    def item_id(self) -> str:
        return self.item.item_id

    @property
    def criterion_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.criteria)


def audit_cases(items: Sequence[BenchmarkItem], levers: Iterable[Lever]) -> list[AuditCase]:
    by_id = {lever.id: lever for lever in levers}
    cases = []
    for item in items:
        lever = by_id.get(item.lever_id) or stand_in_lever(item)
        cases.append(AuditCase(item, lever, tuple(rubric(item, lever))))
    return cases


# ----------------------------------------------------------------- storage


class AuditLabelStore(LabelStore):
    """``LabelStore`` (append + fsync per label, resumable) holding ``AuditLabel`` lines."""

    record = AuditLabel
    record_name = "an audit label"

    def load(self) -> list[AuditLabel]:  # type: ignore[override]
        return super().load()  # type: ignore[return-value]


def latest_labels(labels: Iterable[AuditLabel]) -> dict[str, dict[str, AuditLabel]]:
    """annotator -> item id -> that annotator's latest label of the item."""
    out: dict[str, dict[str, AuditLabel]] = {}
    for label in labels:
        out.setdefault(label.annotator, {})[label.item_id] = label
    return out


# ----------------------------------------------------------------- the audit's numbers


def pass_rate(value: str, verdicts: Sequence[str]) -> AuditPassRate:
    n, passed = len(verdicts), sum(v == "PASS" for v in verdicts)
    low, high = wilson_interval(passed, n)
    return AuditPassRate(
        value=value, n=n, passed=passed, pass_rate=passed / n if n else math.nan, ci_low=low, ci_high=high
    )


def item_verdicts(labels: Iterable[AuditLabel]) -> dict[str, str]:
    """The audit's verdict per item under ``ITEM_RULE``."""
    votes: dict[str, list[str]] = defaultdict(list)
    for given in latest_labels(labels).values():
        for item_id, label in given.items():
            votes[item_id].append(label.label)
    return {item_id: "PASS" if v.count("PASS") * 2 > len(v) else "FAIL" for item_id, v in votes.items()}


def verifier_consensus(verifications: Iterable[Verification]) -> dict[str, str]:
    """Candidate id -> the verifiers' consensus verdict under ``VERIFIER_RULE``."""
    votes: dict[str, list[str]] = defaultdict(list)
    for row in verifications:
        if row.verdict in AUDIT_VERDICTS:
            votes[row.candidate_id].append(row.verdict)
    return {cid: "PASS" if v.count("PASS") * 2 > len(v) else "FAIL" for cid, v in votes.items()}


def _grouped(
    items: Sequence[BenchmarkItem], verdicts: Mapping[str, str], key: Any, order: Sequence[str]
) -> list[AuditPassRate]:
    groups: dict[str, list[str]] = defaultdict(list)
    for item in items:
        if item.item_id in verdicts:
            groups[key(item)].append(verdicts[item.item_id])
    ordered = [v for v in order if v in groups] + sorted(v for v in groups if v not in order)
    return [pass_rate(value, groups[value]) for value in ordered]


def _headline_kappa(agreement: dict[str, Any]) -> dict[str, Any]:
    """Cohen's kappa for two annotators, Fleiss' for more (the pairwise ones stay beside it)."""
    annotators = agreement["annotators"]
    if len(annotators) == 2:
        pair = next(iter(agreement["pairwise"].values()))
        return {"kappa_kind": "cohen", "kappa": pair["kappa"], "kappa_items": pair["n"]}
    if len(annotators) > 2:
        return {"kappa_kind": "fleiss", "kappa": agreement["fleiss_kappa"], "kappa_items": agreement["fleiss_items"]}
    return {"kappa_kind": None, "kappa": math.nan, "kappa_items": 0}


def audit_document(
    sample: Sequence[BenchmarkItem], labels: Iterable[AuditLabel], consensus: Mapping[str, str] | None
) -> AuditDocument:
    """The audit of ``sample`` from its labels; ``consensus`` maps item id -> verifier
    consensus (None: the run folder has no verification table)."""
    sample_ids = {item.item_id for item in sample}
    kept = [label for label in labels if label.item_id in sample_ids]  # labels of an earlier sample drop out
    verdicts = item_verdicts(kept)
    latest = latest_labels(kept)
    criteria_order = list(required_criteria("multi"))  # every criterion, in rubric order
    failed: dict[str, int] = {}
    for given in latest.values():
        for label in given.values():
            for name in label.failed_criteria:
                failed[name] = failed.get(name, 0) + 1
    agreement = annotator_agreement(kept, AUDIT_SPEC)
    agreement.update(_headline_kappa(agreement))
    versus = (
        {name: report.model_dump() for name, report in evaluator_vs_human(kept, consensus, AUDIT_SPEC).items()}
        if consensus is not None
        else {}
    )
    return AuditDocument(
        sample_size=len(sample),
        sampled_per_stratum=stratum_counts(sample),
        labels_per_annotator={name: len(given) for name, given in sorted(latest.items())},
        item_rule=ITEM_RULE,
        interval=INTERVAL,
        overall=pass_rate("all", list(verdicts.values())),
        by_class=_grouped(sample, verdicts, lambda i: i.perturbation_class, PERTURBATION_CLASSES),
        by_intensity=_grouped(sample, verdicts, lambda i: i.intensity, INTENSITIES),
        by_stratum=_grouped(
            sample,
            verdicts,
            lambda i: stratum_name(i.perturbation_class, i.intensity),
            [stratum_name(*s) for s in STRATA],
        ),
        by_annotator=[
            pass_rate(name, [label.label for label in given.values()]) for name, given in sorted(latest.items())
        ],
        failed_criteria={
            name: failed[name]
            for name in [*criteria_order, *sorted(set(failed) - set(criteria_order))]
            if name in failed
        },
        annotator_agreement=agreement,
        verifier_rule=VERIFIER_RULE if consensus is not None else "no verification table in this run folder",
        verifier_agreement=versus,
    )


def pass_rate_rows(audit: AuditDocument) -> list[dict[str, Any]]:
    """Table 2 form (class, then intensity, then all) as rows for a Prefect table artifact."""
    rows = []
    for group, rates in (("class", audit.by_class), ("intensity", audit.by_intensity), ("all", [audit.overall])):
        for rate in rates:
            rows.append(
                {
                    "group": group,
                    "value": rate.value,
                    "n": rate.n,
                    "pass_rate": rate.pass_rate,
                    "ci_low": rate.ci_low,
                    "ci_high": rate.ci_high,
                }
            )
    return rows


# ----------------------------------------------------------------- a run folder's audit


def _run_store(run_dir: str) -> ArtifactStore:
    # A local store creates its folder: a mistyped path must fail before it leaves one behind.
    if "://" not in run_dir and not Path(run_dir).is_dir():
        raise InputError(run_dir, "no such run folder")
    return ArtifactStore(run_dir)


def sample_run(run_dir: str, per_stratum: int = 10, seed: int = 0, force: bool = False) -> dict[str, dict[str, int]]:
    """Draw the audit sample from the run's benchmark into ``audit_sample.parquet``.

    Returns ``{stratum: {"available": n, "sampled": k}}``. A different sample does not
    replace one that already has labels unless ``force`` is set.
    """
    if per_stratum < 1:
        raise InputError(str(per_stratum), "must be at least 1", field="--per-stratum")
    store = _run_store(run_dir)
    if not store.has(rb_files.BENCHMARK):
        raise InputError(store.uri(rb_files.BENCHMARK.name), "no benchmark in this run folder (run generate first)")
    items = store.load(rb_files.BENCHMARK)
    if not items:
        raise InputError(store.uri(rb_files.BENCHMARK.name), "the benchmark is empty: nothing to audit")
    sample = draw_sample(items, per_stratum, seed)
    if store.has(rb_files.AUDIT_SAMPLE) and store.has(rb_files.AUDIT_LABELS) and not force:
        if [i.item_id for i in store.load(rb_files.AUDIT_SAMPLE)] != [i.item_id for i in sample]:
            raise InputError(
                store.uri(rb_files.AUDIT_SAMPLE.name),
                "this audit sample already has labels; pass --force to draw a different one",
            )
    store.save(rb_files.AUDIT_SAMPLE, sample)
    available, drawn = stratum_counts(items), stratum_counts(sample)
    return {name: {"available": available[name], "sampled": drawn.get(name, 0)} for name in available}


@dataclass(frozen=True)
class AuditSession:
    """What an annotator audits in a run folder: the cases and the labels file."""

    store: ArtifactStore
    cases: list[AuditCase]
    labels_path: Path


def open_audit_session(run_dir: str) -> AuditSession:
    store = _run_store(run_dir)
    if not store.has(rb_files.AUDIT_SAMPLE):
        raise InputError(
            store.uri(rb_files.AUDIT_SAMPLE.name), "no audit sample in this run folder (run audit sample first)"
        )
    if not store.is_local:
        raise InputError(run_dir, "labels are written to a local run folder: copy the folder here first")
    cases = audit_cases(store.load(rb_files.AUDIT_SAMPLE), load_catalogue())
    return AuditSession(store, cases, Path(store.uri(rb_files.AUDIT_LABELS.name)))


def refresh_report(store: ArtifactStore) -> str | None:
    """Rebuild an evaluated run's ``report.html`` so it carries the audit; None before the
    evaluation (whose report will then include the audit)."""
    return build_report_for(store.root) if store.has(rb_files.JUDGED) else None


def write_audit(run_dir: str) -> tuple[AuditDocument, str | None]:
    """``audit.json`` from the run's sample, labels and verifications; the report and a
    Prefect table (inside a flow run) follow. Returns the document and the report's path."""
    session = open_audit_session(run_dir)
    store = session.store
    labels = AuditLabelStore(session.labels_path).load()
    if not labels:
        raise InputError(str(session.labels_path), "no audit labels yet (run audit label first)")
    consensus = verifier_consensus(store.load(rb_files.VERIFICATIONS)) if store.has(rb_files.VERIFICATIONS) else None
    audit = audit_document([case.item for case in session.cases], labels, consensus)
    store.save(rb_files.AUDIT, audit)
    publish_table("audit-pass-rates", pass_rate_rows(audit), description=f"Human audit pass rates ({INTERVAL})")
    return audit, refresh_report(store)
