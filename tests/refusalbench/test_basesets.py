"""Base sets: loading (JSONL/CSV/Parquet), every bad-input message, importers' curation, bundled samples."""

from __future__ import annotations

import io
import json
import tracemalloc
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from refusalbench.tasks.core.errors import InputErrors
from refusalbench.tasks.core.tables import to_table
from refusalbench.tasks.refusalbench.basesets import (
    MAX_PROBLEMS,
    PAPER_GARAGE_DOMAINS,
    import_garage,
    import_kilt_nq,
    load_base_set,
    validate_base_set,
    write_base_set,
)
from refusalbench.tasks.refusalbench.schema.records import BaseItem, Passage

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def jl(*records: object) -> bytes:
    """JSONL bytes, one record per line (strings are written as they are)."""
    return b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in records)


def single(item_id: str = "a", **overrides: object) -> dict:
    record = {"id": item_id, "question": "Where is it?", "answers": ["here"], "context": "It is here."}
    record.update(overrides)
    return {k: v for k, v in record.items() if v is not _DROP}


def multi(item_id: str = "m", **overrides: object) -> dict:
    record = {
        "id": item_id,
        "question": "Where is it?",
        "answers": ["here"],
        "passages": [{"text": "It is here.", "relevant": True}, {"text": "Other.", "relevant": False}],
    }
    record.update(overrides)
    return {k: v for k, v in record.items() if v is not _DROP}


_DROP = object()


def parquet_bytes(columns: dict[str, list]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


GOOD_PARQUET = parquet_bytes(
    {"id": ["a", "b"], "question": ["q1", "q2"], "answers": [["x"], ["y"]], "context": ["x is here", "y is here"]}
)

# (case, file suffix, file content, every expected line after the file name; "…" at the end = prefix match)
BAD_INPUT_CASES: list[tuple[str, str, bytes, list[str]]] = [
    ("empty file", ".jsonl", b"", [": -: empty file: no records"]),
    ("only blank lines", ".jsonl", b"\n   \n\n", [": -: empty file: no records"]),
    (
        "not json",
        ".jsonl",
        jl(single("a"), '{"id": "a",}'),
        [":2: -: not valid JSON: Expecting property name enclosed in double quotes (column 12)"],
    ),
    (
        "truncated last line",
        ".jsonl",
        jl(single("a")) + b'{"id": "b", "question": "q',
        [":2: -: not valid JSON: Unterminated string starting at (column 25)"],
    ),
    (
        "not an object",
        ".jsonl",
        jl(single("a"), "[1, 2]", '"text"'),
        [":2: -: expected a JSON object, got list", ":3: -: expected a JSON object, got string"],
    ),
    ("missing question", ".jsonl", jl(single("a", question=_DROP)), [":1: question: missing field"]),
    ("missing id", ".jsonl", jl(single(id=_DROP)), [":1: id: missing field"]),
    ("missing answers", ".jsonl", jl(single("a", answers=_DROP)), [":1: answers: missing field"]),
    ("id mistyped", ".jsonl", jl(single(7)), [":1: id: must be a string, got number"]),
    ("question null", ".jsonl", jl(single("a", question=None)), [":1: question: must be a string, got null"]),
    ("blank question", ".jsonl", jl(single("a"), single("b", question="  \t")), [":2: question: is blank"]),
    ("blank id", ".jsonl", jl(single(" ")), [":1: id: is blank"]),
    ("empty answers", ".jsonl", jl(single("a", answers=[])), [":1: answers: is empty: at least one answer is needed"]),
    (
        "answers not a list",
        ".jsonl",
        jl(single("a", answers="here")),
        [":1: answers: must be a list of strings, got string"],
    ),
    (
        "non-string answer",
        ".jsonl",
        jl(single("a", answers=["here", 3])),
        [":1: answers[1]: must be a string, got number"],
    ),
    ("blank answer", ".jsonl", jl(single("a", answers=[""])), [":1: answers[0]: is blank"]),
    (
        "duplicate id",
        ".jsonl",
        jl(single("a"), single("b"), single("a")),
        [":3: id: duplicate id 'a' (first used on line 1)"],
    ),
    (
        "non-utf8",
        ".jsonl",
        jl(single("a")) + b'{"id": "b", "question": "caf\xe9?", "answers": ["x"], "context": "c"}\n',
        [":2: -: not UTF-8 (byte 0xe9 at column 29)"],
    ),
    (
        "context and passages",
        ".jsonl",
        jl(single("a", passages=[{"text": "t", "relevant": True}])),
        [":1: context: has both context and passages: give one (context = single-document, passages = multi-document)"],
    ),
    (
        "neither context nor passages",
        ".jsonl",
        jl(single("a", context=_DROP)),
        [":1: context: missing field: give context (single-document) or passages (multi-document)"],
    ),
    ("blank context", ".jsonl", jl(single("a", context=" ")), [":1: context: is blank"]),
    ("context mistyped", ".jsonl", jl(single("a", context=["x"])), [":1: context: must be a string, got list"]),
    (
        "unknown field",
        ".jsonl",
        jl(single("a", answer="here")),
        [":1: answer: unknown field (allowed: id, question, answers, context, passages, domain)"],
    ),
    ("domain mistyped", ".jsonl", jl(single("a", domain=3)), [":1: domain: must be a string, got number"]),
    (
        "passages not a list",
        ".jsonl",
        jl(multi(passages="It is here.")),
        [":1: passages: must be a list of {text, relevant} objects, got string"],
    ),
    (
        "passages empty",
        ".jsonl",
        jl(multi(passages=[])),
        [":1: passages: is empty: a multi-document item needs passages"],
    ),
    (
        "passage not an object",
        ".jsonl",
        jl(multi(passages=["It is here."])),
        [":1: passages[0]: must be an object {text, relevant}, got string"],
    ),
    (
        "passage missing text",
        ".jsonl",
        jl(multi(passages=[{"relevant": True}])),
        [":1: passages[0].text: missing field"],
    ),
    (
        "passage missing relevant",
        ".jsonl",
        jl(multi(passages=[{"text": "t", "relevant": True}, {"text": "u"}])),
        [":1: passages[1].relevant: missing field"],
    ),
    (
        "passage relevant not bool",
        ".jsonl",
        jl(multi(passages=[{"text": "t", "relevant": "yes"}])),
        [":1: passages[0].relevant: must be true or false, got string"],
    ),
    (
        "passage text blank",
        ".jsonl",
        jl(multi(passages=[{"text": "", "relevant": True}])),
        [":1: passages[0].text: is blank"],
    ),
    (
        "passage unknown key",
        ".jsonl",
        jl(multi(passages=[{"text": "t", "relevant": True, "score": 1}])),
        [":1: passages[0].score: unknown field (allowed: text, relevant)"],
    ),
    (
        "no relevant passage",
        ".jsonl",
        jl(multi(passages=[{"text": "t", "relevant": False}])),
        [":1: passages: no passage is marked relevant: at least one must carry the answer"],
    ),
    (
        "every problem of a record and of the file",
        ".jsonl",
        jl(single("a", question="", answers=[]), "nope", single("a", extra=1)),
        [
            ":1: question: is blank",
            ":1: answers: is empty: at least one answer is needed",
            ":2: -: not valid JSON: Expecting value (column 1)",
            ":3: extra: unknown field (allowed: id, question, answers, context, passages, domain)",
            ":3: id: duplicate id 'a' (first used on line 1)",
        ],
    ),
    ("unsupported suffix", ".txt", b"hello\n", [": -: unsupported file type '.txt' (use .jsonl, .parquet or .csv)"]),
    # ---- CSV: the header is line 1; a record's line is where it starts
    ("csv header only", ".csv", b"id,question,answers,context\n", [": -: empty file: no records"]),
    ("csv missing column", ".csv", b"id,question,context\na,q,c\n", [":1: answers: missing column"]),
    (
        "csv unknown column",
        ".csv",
        b"id,question,answers,context,notes\na,q,x,c x,n\n",
        [":1: notes: unknown column (allowed: id, question, answers, context, passages, domain)"],
    ),
    (
        "csv no context column",
        ".csv",
        b"id,question,answers\na,q,x\n",
        [":1: -: needs a context column (single-document) or a passages column (multi-document)"],
    ),
    (
        "csv field count",
        ".csv",
        b"id,question,answers,context\na,q,x,c x\nb,q,x\n",
        [":3: -: record has 3 fields but the header has 4"],
    ),
    (
        "csv blank question after multi-line record",
        ".csv",
        b'id,question,answers,context\na,q,x,"line one\nline two x"\nb, ,x,c x\n',
        [":4: question: is blank"],
    ),
    (
        "csv empty answers",
        ".csv",
        b"id,question,answers,context\na,q,,c\n",
        [":2: answers: is empty: at least one answer is needed"],
    ),
    ("csv blank pipe answer", ".csv", b"id,question,answers,context\na,q,x||y,c\n", [":2: answers[1]: is blank"]),
    (
        "csv answers bad json",
        ".csv",
        b'id,question,answers,context\na,q,"[""x"",",c\n',
        [":2: answers: looks like a JSON list but is not valid JSON: Expecting value"],
    ),
    (
        "csv passages bad json",
        ".csv",
        b"id,question,answers,passages\na,q,x,not json\n",
        [":2: passages: not valid JSON: Expecting value"],
    ),
    (
        "csv passage relevant not bool",
        ".csv",
        b'id,question,answers,passages\na,q,x,"[{""text"": ""t"", ""relevant"": 1}]"\n',
        [":2: passages[0].relevant: must be true or false, got number"],
    ),
    (
        "csv duplicate id",
        ".csv",
        b"id,question,answers,context\na,q,x,c\na,q,x,c\n",
        [":3: id: duplicate id 'a' (first used on line 2)"],
    ),
    (
        "csv neither context nor passages",
        ".csv",
        b"id,question,answers,context,passages\na,q,x,,\n",
        [":2: context: missing field: give context (single-document) or passages (multi-document)"],
    ),
    (
        "csv non-utf8",
        ".csv",
        b"id,question,answers,context\na,q,x,c\nb,caf\xe9,x,c\n",
        [":3: -: not UTF-8 (byte 0xe9 at column 6)"],
    ),
    (
        "csv unterminated quote",
        ".csv",
        b'id,question,answers,context\na,q,x,"c\n',
        [":2: -: malformed CSV: unexpected end of data"],
    ),
    # ---- Parquet: LINE is the 1-based row number
    (
        "parquet id mistyped",
        ".parquet",
        parquet_bytes({"id": [1, 2], "question": ["q", "q"], "answers": [["x"], ["x"]], "context": ["c", "c"]}),
        [":1: id: must be a string, got number", ":2: id: must be a string, got number"],
    ),
    (
        "parquet blank question row 2",
        ".parquet",
        parquet_bytes({"id": ["a", "b"], "question": ["q", ""], "answers": [["x"], ["x"]], "context": ["c", "c"]}),
        [":2: question: is blank"],
    ),
    (
        "parquet empty answers",
        ".parquet",
        parquet_bytes({"id": ["a"], "question": ["q"], "answers": [[]], "context": ["c"]}),
        [":1: answers: is empty: at least one answer is needed"],
    ),
    (
        "parquet missing column",
        ".parquet",
        parquet_bytes({"id": ["a"], "question": ["q"], "context": ["c"]}),
        [": answers: missing column"],
    ),
    (
        "parquet no rows",
        ".parquet",
        parquet_bytes(
            {
                "id": pa.array([], pa.string()),
                "question": pa.array([], pa.string()),
                "answers": pa.array([], pa.list_(pa.string())),
                "context": pa.array([], pa.string()),
            }
        ),
        [": -: empty file: no records"],
    ),
    ("parquet truncated", ".parquet", GOOD_PARQUET[: len(GOOD_PARQUET) // 2], [": -: not a readable Parquet file: …"]),
    ("parquet file that is text", ".parquet", b"id,question\n", [": -: not a readable Parquet file: …"]),
]


@pytest.mark.parametrize(
    ("case", "suffix", "content", "expected"), BAD_INPUT_CASES, ids=[c[0] for c in BAD_INPUT_CASES]
)
def test_bad_input_reports_every_problem_as_file_line_field(tmp_path, case, suffix, content, expected):
    path = tmp_path / f"base{suffix}"
    path.write_bytes(content)
    lines = validate_base_set(path)
    assert len(lines) == len(expected), lines
    for line, want in zip(lines, expected):
        if want.endswith("…"):
            assert line.startswith(f"{path}{want[:-1]}"), line
        else:
            assert line == f"{path}{want}"
    with pytest.raises(InputErrors) as info:
        load_base_set(path)
    assert info.value.lines() == lines
    assert "Traceback" not in "\n".join(lines)


def test_missing_file_and_directory(tmp_path):
    assert validate_base_set(tmp_path / "nope.jsonl") == [f"{tmp_path / 'nope.jsonl'}: -: file not found"]
    assert validate_base_set(tmp_path) == [f"{tmp_path}: -: not a regular file"]


def test_enormous_line_is_refused_and_later_lines_are_still_checked(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as out:
        out.write(b'{"id": "a", "context": "' + b"x" * (10 * 1024 * 1024) + b'"}\n')
        out.write(jl(single("b", question="")))
    assert validate_base_set(path) == [
        f"{path}:1: -: line is longer than 10 MiB; refusing to read it",
        f"{path}:2: question: is blank",
    ]


def test_oversized_line_is_skipped_without_loading_it(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(jl(single("a")) + b"[" + b"1," * 2_000_000 + b"1]\n" + jl(single("b")))
    tracemalloc.start()
    try:
        lines = validate_base_set(path, max_line_bytes=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines == [f"{path}:2: -: line is longer than 4096 bytes; refusing to read it"]
    assert peak < 1_000_000  # the 4 MB line never sat in memory


def test_reading_stops_after_the_problem_cap(tmp_path):
    path = tmp_path / "junk.jsonl"
    path.write_bytes(b"nope\n" * (MAX_PROBLEMS + 500))
    lines = validate_base_set(path)
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[-1] == f"{path}: -: stopped after {MAX_PROBLEMS} problems; fix these first"


# ----------------------------------------------------------------- happy paths


def test_jsonl_with_bom_blank_lines_and_nulls(tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + jl(single("a", domain="science")) + b"\n" + jl(multi("m", context=None, domain=None))
    )
    items = load_base_set(path)
    assert [i.id for i in items] == ["a", "m"]
    assert items[0].variant == "single" and items[0].domain == "science"
    assert items[1].variant == "multi" and items[1].passages[0] == Passage(text="It is here.", relevant=True)
    assert validate_base_set(path) == []


def test_csv_answers_as_json_or_pipes_and_passages_as_json(tmp_path):
    path = tmp_path / "ok.csv"
    passages = json.dumps([{"text": "P one.", "relevant": True}, {"text": "P two.", "relevant": False}]).replace(
        '"', '""'
    )
    path.write_bytes(
        "\ufeffid,question,answers,context,passages,domain\n"
        'a,"Who, then?","[""Ann"", ""Anne""]",Ann did it.,,history\n'
        f'b,What?,x | y ,,"{passages}",\n'
        'c,Why?,because,"two\nlines",,\n'.encode()
    )
    items = load_base_set(path)
    assert [(i.id, i.answers, i.variant, i.domain) for i in items] == [
        ("a", ["Ann", "Anne"], "single", "history"),
        ("b", ["x", "y"], "multi", None),
        ("c", ["because"], "single", None),
    ]
    assert items[0].question == "Who, then?"
    assert items[1].passages[1].text == "P two."
    assert items[2].context == "two\nlines"


def test_parquet_round_trip_of_records_schema(tmp_path):
    items = [
        BaseItem(id="a", question="q", answers=["x"], context="x here", domain="d"),
        BaseItem(id="m", question="q2", answers=["y", "z"], passages=[Passage(text="y", relevant=True)]),
    ]
    path = tmp_path / "ok.parquet"
    pq.write_table(to_table(items, BaseItem), path)
    assert load_base_set(path) == items


def test_write_base_set_round_trips_and_leaves_no_temporary_file(tmp_path):
    items = load_base_set(ROOT / "data" / "sample_multi.jsonl")
    out = write_base_set(items, tmp_path / "sub" / "copy.jsonl")
    assert load_base_set(out) == items
    assert [p.name for p in out.parent.iterdir()] == ["copy.jsonl"]


# ----------------------------------------------------------------- bundled samples


def test_bundled_single_document_sample():
    path = ROOT / "data" / "sample_single.jsonl"
    assert validate_base_set(path) == []
    items = load_base_set(path)
    assert len(items) >= 24
    assert len({i.domain for i in items}) >= 5
    for item in items:
        assert item.variant == "single" and 1 <= len(item.answers) <= 3
        assert any(a.casefold() in item.context.casefold() for a in item.answers), item.id
        assert 40 <= len(item.context.split()) <= 130, item.id


def test_bundled_multi_document_sample():
    path = ROOT / "data" / "sample_multi.jsonl"
    assert validate_base_set(path) == []
    items = load_base_set(path)
    assert len(items) >= 12
    assert len({i.domain for i in items}) >= 5
    for item in items:
        assert len(item.passages) == 10
        signal = [p for p in item.passages if p.relevant]
        assert 2 <= len(signal) <= 5, item.id
        assert any(a.casefold() in p.text.casefold() for p in signal for a in item.answers), item.id
    # shuffled: relevant passages are not all at the front
    assert any(not item.passages[0].relevant for item in items)


# ----------------------------------------------------------------- KILT NQ importer


def test_kilt_keeps_only_items_whose_passage_contains_a_short_answer():
    stats: Counter[str] = Counter()
    items = import_kilt_nq(FIXTURES / "kilt_nq_sample.jsonl", stats=stats)
    by_id = {i.id: i for i in items}
    assert list(by_id) == ["kq-001", "kq-002", "kq-006", "7"]
    assert stats == Counter(kept=4, answer_not_in_passage=2, no_short_answer=1, not_sampled=0)
    # provenance text carries the answer
    assert "1931" in by_id["kq-001"].context
    # top-level passage; answer matched regardless of case
    assert by_id["kq-002"].answers == ["Odile Marchand"] and "ODILE MARCHAND" in by_id["kq-002"].context
    # the first provenance lacks every answer: the second one is chosen; aliases in the context come first
    assert by_id["kq-006"].context.startswith("At 212 metres, the Meridian")
    assert by_id["kq-006"].answers == ["the Meridian", "Meridian Tower"]
    assert all(i.variant == "single" for i in items)


def test_kilt_reads_passages_from_the_knowledge_source():
    items = import_kilt_nq(FIXTURES / "kilt_nq_sample.jsonl", FIXTURES / "kilt_knowledge_sample.jsonl")
    aldermoor = next(i for i in items if i.id == "kq-005")
    # paragraphs 1..3, section heading dropped, bullet marker removed
    assert aldermoor.context == (
        "Aldermoor is a market town in the western uplands, known for its wool trade. "
        "The town lies on both banks of the Wend, a tributary of the larger Sarne."
    )


def test_kilt_n_samples_by_seed():
    path = FIXTURES / "kilt_nq_sample.jsonl"
    first = [i.id for i in import_kilt_nq(path, n=2, seed=1)]
    assert len(first) == 2 and first == [i.id for i in import_kilt_nq(path, n=2, seed=1)]
    assert len({tuple(i.id for i in import_kilt_nq(path, n=2, seed=s)) for s in range(12)}) > 1
    assert len(import_kilt_nq(path, n=50)) == 4


def test_kilt_malformed_records_are_input_errors(tmp_path):
    path = tmp_path / "nq.jsonl"
    path.write_bytes(
        jl(
            {"id": "x", "output": []},
            {"id": "y", "input": "q", "output": "1931"},
            {"id": "x", "input": "q", "output": [{"answer": 5}]},
        )
    )
    with pytest.raises(InputErrors) as info:
        import_kilt_nq(path)
    assert info.value.lines() == [
        f"{path}:1: input: missing, blank or not a string (the question)",
        f"{path}:2: output: must be a list, got string",
        f"{path}:3: output[0].answer: must be a string, got number",
    ]


# ----------------------------------------------------------------- GaRAGe importer


def garage(**kwargs) -> dict[str, BaseItem]:
    kwargs.setdefault("domains", None)  # every domain of the fixture; the paper's five are the importer's default
    return {i.id: i for i in import_garage(FIXTURES / "garage_sample.jsonl", **kwargs)}


def test_garage_curation_rules():
    stats: Counter[str] = Counter()
    items = garage(stats=stats)
    assert list(items) == ["g-sci-1", "g-sci-2", "g-sci-3", "g-fin-1", "g-travel-1", "g-biz-4"]
    assert stats == Counter(
        kept=6,
        temporal_type=2,
        complexity=1,
        question_not_valid=1,
        answer_not_validated=1,
        false_premise=1,
        too_few_passages=1,
        no_answering_passage=1,
        too_few_noise_passages=1,
        not_sampled=0,
    )
    assert all(len(i.passages) == 10 and i.variant == "multi" for i in items.values())


def numbers(item: BaseItem, relevant: bool | None = None) -> list[int]:
    """The fixture's passage numbers (its texts say 'Report N ...' / 'item N' / 'note N')."""
    import re

    return [
        int(re.search(r"\b(\d+)\b", p.text).group(1))
        for p in item.passages
        if relevant is None or p.relevant is relevant
    ]


def test_garage_signal_capped_at_five_cited_first_in_original_order():
    item = garage()["g-sci-1"]
    # 7 answering passages (numbers 2,3,5,6,8,9,10; cited 2,5,9): cited first, then 3 and 6
    assert numbers(item, relevant=True) == [2, 3, 5, 6, 9]
    assert numbers(item) == [1, 2, 3, 4, 5, 6, 7, 9, 11, 12]


def test_garage_noise_prefers_related_then_relevant_passages():
    item = garage()["g-fin-1"]
    assert numbers(item, relevant=True) == [6]
    # 13 noise passages for 9 slots: related-information 10, 13; relevant 3, 14; then 1, 2, 4, 5, 7
    assert numbers(item, relevant=False) == [1, 2, 3, 4, 5, 7, 10, 13, 14]


def test_garage_strips_citation_markers():
    item = garage()["g-biz-4"]
    assert item.answers == ["The mill opened in 1912."]
    assert all(not p.text.startswith("[") for p in item.passages)


def test_garage_allowed_types_and_complexity_and_domains():
    assert "g-health-1" in garage(allowed_types=["Static", "slow-changing"])
    assert "g-health-2" not in garage(allowed_types=["Static", "Slow-Changing"])
    assert "g-health-3" in garage(allowed_complexity=["multi hop"])
    assert "g-sci-2" not in garage(allowed_complexity=["Simple"])
    paper = garage(domains=PAPER_GARAGE_DOMAINS)
    assert "g-travel-1" not in paper and {"g-sci-1", "g-fin-1", "g-biz-4"} <= set(paper)


def test_garage_per_domain_sampling_by_seed():
    science = {"g-sci-1", "g-sci-2", "g-sci-3"}
    picks = set()
    for seed in range(10):
        chosen = garage(per_domain=2, seed=seed)
        assert len(set(chosen) & science) == 2  # 'Science' and 'science' are one domain
        assert {"g-fin-1", "g-travel-1", "g-biz-4"} <= set(chosen)  # smaller domains keep all they have
        assert list(chosen) == list(garage(per_domain=2, seed=seed))
        picks.add(frozenset(set(chosen) & science))
    assert len(picks) > 1


def test_garage_malformed_records_are_input_errors(tmp_path):
    good = json.loads((FIXTURES / "garage_sample.jsonl").read_text().splitlines()[0])
    short_labels = dict(good, sample_id="b", evidence_correct=good["evidence_correct"][:3])
    path = tmp_path / "garage.jsonl"
    path.write_bytes(jl(good, short_labels, dict(good, grounding="text"), good))
    with pytest.raises(InputErrors) as info:
        import_garage(path)
    assert info.value.lines() == [
        f"{path}:2: evidence_correct: has 3 labels but grounding has 12 passages",
        f"{path}:3: grounding: must be a list of passages, got string",
        f"{path}:4: sample_id: duplicate id 'g-sci-1' (first used on line 1)",
    ]
