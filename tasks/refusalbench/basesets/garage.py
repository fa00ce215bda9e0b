"""GaRAGe: multi-document base items curated as in the paper (App. C.1)."""

from __future__ import annotations

import logging
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from refusalbench.tasks.refusalbench.basesets.curation import id_text, seeded_subset, squash_spaces, stable_rng
from refusalbench.tasks.refusalbench.basesets.problems import (
    MAX_LINE_BYTES,
    Problems,
    TooManyProblems,
    json_type,
    open_problems,
)
from refusalbench.tasks.refusalbench.basesets.streaming import (
    ByteProgress,
    ProgressCallback,
    iter_json_lines,
    refuse_json_array,
)
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage

log = logging.getLogger(__name__)

# The five domains the paper sampled 20 items from (App. C.1); pass as ``domains=`` to reproduce it.
PAPER_GARAGE_DOMAINS = ("Science", "Health", "Business & Industrial", "Law & Government", "Finance")
# Low-to-moderate complexity: single facts, conditions, sets and comparisons; aggregation, multi-hop and
# post-processing-heavy questions are excluded.
DEFAULT_GARAGE_COMPLEXITY = ("Simple", "Simple w. condition", "Set", "Comparison")
# Temporally stable: the question is not time-sensitive ("Static"). GaRAGe types time-sensitive questions
# as Slow-Changing or Fast-Changing; add "Slow-Changing" to admit those.
DEFAULT_GARAGE_TYPES = ("Static",)
GARAGE_CONTEXT_SIZE = 10
GARAGE_MAX_SIGNAL = 5

_ANSWERS_LABEL = "answerthequestion"
_RELATED_LABEL = "relatedinformation"
_CITATION_PREFIX = re.compile(r"^\s*\[\d+\]\s*")
_CITATION_MARK = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")


def _norm_label(value: Any) -> str:
    """Case-, space- and punctuation-insensitive form of a label ("Multi-Hop" == "multi hop")."""
    return re.sub(r"[^0-9a-z]", "", str(value).casefold()) if value is not None else ""


def _flag(value: Any) -> bool | None:
    """GaRAGe writes yes/no flags as booleans or as strings (YES, No, true ...); None when unknown."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().casefold()
        if word.startswith(("yes", "true")) or word in ("y", "1"):
            return True
        if word.startswith(("no", "false")) or word in ("n", "0"):
            return False
    return None


def _garage_passage_text(passage: Any) -> str | None:
    text = passage.get("text") if isinstance(passage, dict) else passage
    if not isinstance(text, str):
        return None
    return squash_spaces(_CITATION_PREFIX.sub("", text))


def _garage_labels(record: dict[str, Any], name: str, n: int, line: int, problems: Problems) -> list[Any] | None:
    """A per-passage label list; absent means unknown for every passage; a wrong length is a problem."""
    labels = record.get(name)
    if labels is None:
        return [None] * n
    if not isinstance(labels, list):
        problems.add(f"must be a list with one label per passage, got {json_type(labels)}", line=line, field=name)
        return None
    if len(labels) != n:
        problems.add(f"has {len(labels)} labels but grounding has {n} passages", line=line, field=name)
        return None
    return labels


@dataclass(frozen=True)
class _GarageRecord:
    """The fields of one GaRAGe record the curation needs, after structural checks."""

    sample_id: str
    question: str
    answer: str
    texts: list[str]
    correct: list[str]  # normalised evidence_correct labels, one per passage
    relevant: list[bool | None]
    cited: list[bool]
    domain: str | None
    question_valid: bool | None
    answer_validated: bool | None
    false_premise: bool | None
    time_sensitive: bool | None
    temporal_type: Any
    complexity: Any


def _garage_record(record: Any, line: int, problems: Problems) -> _GarageRecord | None:
    if not isinstance(record, dict):
        problems.add(f"expected a JSON object, got {json_type(record)}", line=line)
        return None
    before = len(problems)
    sample_id = id_text(record.get("sample_id"))
    if sample_id is None:
        problems.add("missing, blank or not a string", line=line, field="sample_id")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        problems.add("missing, blank or not a string", line=line, field="question")
    answer = record.get("answer_generate")
    if answer is not None and not isinstance(answer, str):
        problems.add(f"must be a string, got {json_type(answer)}", line=line, field="answer_generate")
    grounding = record.get("grounding")
    texts: list[str | None] = []
    if not isinstance(grounding, list):
        problems.add(f"must be a list of passages, got {json_type(grounding)}", line=line, field="grounding")
    else:
        texts = [_garage_passage_text(p) for p in grounding]
        for i, text in enumerate(texts):
            if text is None:
                problems.add("must be a string or an object with a text string", line=line, field=f"grounding[{i}]")
    # Label lists are checked against the passages only when the passages themselves are sound.
    grounding_ok = isinstance(grounding, list) and None not in texts
    correct = _garage_labels(record, "evidence_correct", len(texts), line, problems) if grounding_ok else None
    relevant = _garage_labels(record, "evidence_relevant", len(texts), line, problems) if grounding_ok else None
    cited = _garage_labels(record, "evidence_cited", len(texts), line, problems) if grounding_ok else None
    category = record.get("question_category")
    if category is not None and not isinstance(category, str):
        problems.add(f"must be a string, got {json_type(category)}", line=line, field="question_category")
    # Each failed check added a problem above; the explicit checks narrow the types for the record.
    if (
        len(problems) > before
        or sample_id is None
        or not isinstance(question, str)
        or correct is None
        or relevant is None
        or cited is None
    ):
        return None
    passages = [text for text in texts if text is not None]  # all of them: the passages are sound here
    return _GarageRecord(
        sample_id=sample_id,
        question=question.strip(),
        answer=answer or "",
        texts=passages,
        correct=[_norm_label(c) for c in correct],
        relevant=[_flag(r) for r in relevant],
        cited=[_flag(c) is True for c in cited],
        domain=category,
        question_valid=_flag(record.get("question_valid")),
        answer_validated=_flag(record.get("answer_validate")),
        false_premise=_flag(record.get("question_false_premise")),
        time_sensitive=_flag(record.get("question_sensitive")),
        temporal_type=record.get("question_type"),
        complexity=record.get("question_complexity"),
    )


def _garage_temporal_type(rec: _GarageRecord) -> str:
    """'Static' for questions that are not time-sensitive, else GaRAGe's question_type (e.g. Slow-Changing)."""
    if rec.time_sensitive is False or (rec.time_sensitive is None and not rec.temporal_type):
        return "Static"
    return str(rec.temporal_type or "")


def _garage_normalised_passages(rec: _GarageRecord) -> list[Passage] | None:
    """Ten passages: up to five signal ones (cited first), then the most relevant noise; None if short.

    Signal = labelled ANSWER-THE-QUESTION. Noise ranks RELATED-INFORMATION first, then passages the
    annotators marked relevant, then the rest; ties keep the dataset's (retrieval) order. The chosen
    passages are returned in their original order so position does not reveal which are signal.
    """
    indices = range(len(rec.texts))
    signal = [i for i in indices if rec.correct[i] == _ANSWERS_LABEL]
    signal.sort(key=lambda i: (not rec.cited[i], i))
    signal = signal[:GARAGE_MAX_SIGNAL]
    noise = [i for i in indices if rec.correct[i] != _ANSWERS_LABEL]
    noise.sort(key=lambda i: (rec.correct[i] != _RELATED_LABEL, rec.relevant[i] is not True, i))
    needed = GARAGE_CONTEXT_SIZE - len(signal)
    if len(noise) < needed:
        return None
    chosen = sorted(signal + noise[:needed])
    signal_set = set(signal)
    return [Passage(text=rec.texts[i], relevant=i in signal_set) for i in chosen]


def _garage_rejection(
    rec: _GarageRecord, complexity: set[str], types: set[str], domains: set[str] | None
) -> str | None:
    """The first curation rule a record fails, or None when it is eligible."""
    if rec.question_valid is not True:
        return "question_not_valid"
    if rec.answer_validated is not True:
        return "answer_not_validated"
    if rec.false_premise is True:
        return "false_premise"
    if not squash_spaces(_CITATION_MARK.sub("", rec.answer)):
        return "no_answer"
    if _norm_label(_garage_temporal_type(rec)) not in types:
        return "temporal_type"
    if _norm_label(rec.complexity) not in complexity:
        return "complexity"
    if domains is not None and _norm_label(rec.domain) not in domains:
        return "domain"
    if len(rec.texts) < GARAGE_CONTEXT_SIZE:
        return "too_few_passages"
    if _ANSWERS_LABEL not in rec.correct:
        return "no_answering_passage"
    return None


def _domain_quotas(n: int, keys: list[str], seed: int) -> dict[str, int]:
    """``n`` split evenly over the domains; the remainder goes to domains drawn by seed."""
    base, extra = divmod(n, len(keys))
    bonus = set(stable_rng(seed, "garage-quota").sample(keys, extra))
    return {key: base + (key in bonus) for key in keys}


def _draw(
    eligible: list[BaseItem],
    n: int | None,
    per_domain: int | None,
    domains: list[str] | None,
    seed: int,
    counts: Counter[str],
    seen_domains: dict[str, str],
) -> list[int]:
    """Indices of the items drawn: all, ``n`` uniformly, or per domain (evenly or ``per_domain`` each)."""
    if n is None and per_domain is None:
        return list(range(len(eligible)))
    if per_domain is None and domains is None:
        return seeded_subset(list(range(len(eligible))), n, stable_rng(seed, "garage"))
    by_domain: dict[str, list[int]] = {}
    for i, item in enumerate(eligible):
        by_domain.setdefault(_norm_label(item.domain), []).append(i)
    keys = sorted(set(domains)) if domains is not None else sorted(by_domain)
    if per_domain is not None:
        quotas = {key: per_domain for key in keys}
    else:
        assert n is not None, "the first check returned when neither n nor per_domain is set"
        quotas = _domain_quotas(n, keys, seed)
    chosen: list[int] = []
    for key in keys:
        indices = by_domain.get(key, [])
        chosen.extend(seeded_subset(indices, quotas[key], stable_rng(seed, "garage", key)))
        if len(indices) < quotas[key]:
            counts["domain_shortfall"] += quotas[key] - len(indices)
            name = eligible[indices[0]].domain if indices else seen_domains.get(key, key)
            hint = "" if indices else f" (domains in the file: {', '.join(sorted(seen_domains.values())) or 'none'})"
            log.warning(
                "GaRAGe domain %r has only %d eligible items (asked for %d)%s", name, len(indices), quotas[key], hint
            )
    return sorted(chosen)


def import_garage(
    path: str | os.PathLike[str],
    *,
    n: int | None = None,
    seed: int = 0,
    on_progress: ProgressCallback | None = None,
    domains: Iterable[str] | None = PAPER_GARAGE_DOMAINS,
    per_domain: int | None = None,
    allowed_complexity: Iterable[str] = DEFAULT_GARAGE_COMPLEXITY,
    allowed_types: Iterable[str] = DEFAULT_GARAGE_TYPES,
    stats: Counter[str] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> list[BaseItem]:
    """Multi-document base items from GaRAGe JSON lines, curated as in the paper (App. C.1).

    The file is GaRAGe's ``GaRAGe_benchmark.jsonl`` (one JSON object per line; a file holding
    one JSON array is refused with the command that converts it). Fields read: ``sample_id,
    question, answer_generate, answer_validate, question_valid, question_false_premise,
    question_sensitive, question_type, question_complexity, question_category, grounding``
    (passages as strings or ``{text, ...}``, citation prefix ``[n]`` removed), and the
    per-passage lists ``evidence_correct`` (ANSWER-THE-QUESTION / RELATED-INFORMATION / UNKNOWN),
    ``evidence_relevant`` and ``evidence_cited`` (yes/no). Flags may be booleans or yes/no strings.

    Kept: valid question, validated answer, no false premise, temporal type in ``allowed_types``
    ('Static' = not time-sensitive), complexity in ``allowed_complexity``, domain in ``domains``
    (default: the paper's five, ``PAPER_GARAGE_DOMAINS``; None = every domain), at least 10
    passages of which at least one answers the question. Each kept item gets exactly 10 passages
    (see ``_garage_normalised_passages``). Matching of labels is case- and punctuation-insensitive.

    Drawn by ``seed``: ``n`` items split evenly over ``domains`` as the paper did (100 = 20 from
    each of five; a domain with too few keeps all it has and the shortfall is counted and logged,
    not refilled from other domains), or ``n`` uniformly when ``domains`` is None, or
    ``per_domain`` from each domain; all when both are None. Items come back in file order.
    ``on_progress(bytes_read, total)`` follows the read. ``stats`` (optional) receives a count
    per outcome (kept, not_sampled, domain_shortfall and one per curation rule).
    """
    if n is not None and per_domain is not None:
        raise ValueError("give n or per_domain, not both")
    if (n is not None and n < 1) or (per_domain is not None and per_domain < 1):
        raise ValueError("n and per_domain must be at least 1")
    p, problems = open_problems(path)
    refuse_json_array(p, problems)
    progress = ByteProgress([p], on_progress)
    complexity = {_norm_label(c) for c in allowed_complexity}
    types = {_norm_label(t) for t in allowed_types}
    wanted_domains = None if domains is None else [_norm_label(d) for d in domains]

    counts: Counter[str] = Counter()
    eligible: list[BaseItem] = []
    first_line_of: dict[str, int] = {}
    seen_domains: dict[str, str] = {}
    try:
        for line, raw in iter_json_lines(p, problems, max_line_bytes, progress):
            rec = _garage_record(raw, line, problems)
            if rec is None:
                continue
            if rec.sample_id in first_line_of:
                problems.add(
                    f"duplicate id {rec.sample_id!r} (first used on line {first_line_of[rec.sample_id]})",
                    line=line,
                    field="sample_id",
                )
                continue
            first_line_of[rec.sample_id] = line
            if rec.domain:
                seen_domains.setdefault(_norm_label(rec.domain), rec.domain)
            reason = _garage_rejection(rec, complexity, types, None if wanted_domains is None else set(wanted_domains))
            passages = _garage_normalised_passages(rec) if reason is None else None
            if reason is None and passages is None:
                reason = "too_few_noise_passages"
            if reason is not None:
                counts[reason] += 1
                continue
            answer = squash_spaces(_CITATION_MARK.sub("", rec.answer))
            eligible.append(
                BaseItem(
                    id=rec.sample_id, question=rec.question, answers=[answer], passages=passages, domain=rec.domain
                )
            )
    except TooManyProblems:
        pass
    problems.raise_if_any()
    progress.finish()

    items = [eligible[i] for i in _draw(eligible, n, per_domain, wanted_domains, seed, counts, seen_domains)]
    counts["kept"] = len(items)
    counts["not_sampled"] = len(eligible) - len(items)
    if stats is not None:
        stats.update(counts)
    return items
