"""Checks of one raw base-set record against the format; every problem is reported."""

from __future__ import annotations

from typing import Any

from refusalbench.tasks.refusalbench.basesets.problems import BASE_FIELDS, PASSAGE_FIELDS, Problems, Skip, json_type
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage


def _check_text(record: dict[str, Any], name: str, line: int, problems: Problems) -> str | None:
    if name not in record:
        problems.add("missing field", line=line, field=name)
        return None
    value = record[name]
    if isinstance(value, Skip):
        return None
    if not isinstance(value, str):
        problems.add(f"must be a string, got {json_type(value)}", line=line, field=name)
        return None
    if not value.strip():
        problems.add("is blank", line=line, field=name)
        return None
    return value


def _check_answers(record: dict[str, Any], line: int, problems: Problems) -> list[str] | None:
    if "answers" not in record:
        problems.add("missing field", line=line, field="answers")
        return None
    value = record["answers"]
    if isinstance(value, Skip):
        return None
    if not isinstance(value, (list, tuple)):
        problems.add(f"must be a list of strings, got {json_type(value)}", line=line, field="answers")
        return None
    if not value:
        problems.add("is empty: at least one answer is needed", line=line, field="answers")
        return None
    ok = True
    for i, answer in enumerate(value):
        if not isinstance(answer, str):
            problems.add(f"must be a string, got {json_type(answer)}", line=line, field=f"answers[{i}]")
            ok = False
        elif not answer.strip():
            problems.add("is blank", line=line, field=f"answers[{i}]")
            ok = False
    return list(value) if ok else None


def _check_passages(value: Any, line: int, problems: Problems) -> list[Passage] | None:
    if isinstance(value, Skip):
        return None
    if not isinstance(value, (list, tuple)):
        problems.add(
            f"must be a list of {{text, relevant}} objects, got {json_type(value)}", line=line, field="passages"
        )
        return None
    if not value:
        problems.add("is empty: a multi-document item needs passages", line=line, field="passages")
        return None
    passages: list[Passage] = []
    ok = True
    for i, passage in enumerate(value):
        where = f"passages[{i}]"
        if not isinstance(passage, dict):
            problems.add(f"must be an object {{text, relevant}}, got {json_type(passage)}", line=line, field=where)
            ok = False
            continue
        for key in passage:
            if key not in PASSAGE_FIELDS:
                problems.add("unknown field (allowed: text, relevant)", line=line, field=f"{where}.{key}")
                ok = False
        text = passage.get("text")
        if "text" not in passage:
            problems.add("missing field", line=line, field=f"{where}.text")
            ok = False
        elif not isinstance(text, str):
            problems.add(f"must be a string, got {json_type(text)}", line=line, field=f"{where}.text")
            ok = False
        elif not text.strip():
            problems.add("is blank", line=line, field=f"{where}.text")
            ok = False
        relevant = passage.get("relevant")
        if "relevant" not in passage:
            problems.add("missing field", line=line, field=f"{where}.relevant")
            ok = False
        elif not isinstance(relevant, bool):
            problems.add(f"must be true or false, got {json_type(relevant)}", line=line, field=f"{where}.relevant")
            ok = False
        if ok:
            passages.append(Passage(text=text, relevant=relevant))
    if ok and not any(p.relevant for p in passages):
        problems.add("no passage is marked relevant: at least one must carry the answer", line=line, field="passages")
        return None
    return passages if ok else None


def check_record(record: Any, line: int, problems: Problems) -> BaseItem | None:
    """Validate one raw record; report every problem in it; return the item when there were none."""
    if not isinstance(record, dict):
        problems.add(f"expected a JSON object, got {json_type(record)}", line=line)
        return None
    before = len(problems)
    for key in record:
        if key not in BASE_FIELDS:
            problems.add(f"unknown field (allowed: {', '.join(BASE_FIELDS)})", line=line, field=str(key))
    # null for an optional field means absent (Parquet and pandas write nulls for missing values).
    optional = {k: record[k] for k in ("context", "passages", "domain") if record.get(k) is not None}
    item_id = _check_text(record, "id", line, problems)
    question = _check_text(record, "question", line, problems)
    answers = _check_answers(record, line, problems)

    context = passages = None
    if "context" in optional and "passages" in optional:
        problems.add(
            "has both context and passages: give one (context = single-document, passages = multi-document)",
            line=line,
            field="context",
        )
    elif "context" in optional:
        context = _check_text(optional, "context", line, problems)
    elif "passages" in optional:
        passages = _check_passages(optional["passages"], line, problems)
    else:
        problems.add(
            "missing field: give context (single-document) or passages (multi-document)", line=line, field="context"
        )
    domain = optional.get("domain")
    if domain is not None and not isinstance(domain, str):
        problems.add(f"must be a string, got {json_type(domain)}", line=line, field="domain")

    already_reported = any(isinstance(v, Skip) for v in record.values())  # CSV cells that failed to decode
    if already_reported or len(problems) > before:
        return None
    return BaseItem(id=item_id, question=question, answers=answers, context=context, passages=passages, domain=domain)
