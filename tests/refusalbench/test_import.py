"""Importing KILT-NQ and GaRAGe from files in their published formats (issue 14, part 1).

The fixtures under tests/fixtures/kilt are tiny, self-written files in KILT's real layout: the NQ
questions carry only provenance (page id + paragraph range), the passage text lives in the
knowledge source, one Wikipedia page per line.
"""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter
from pathlib import Path

import pytest

from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.refusalbench.basesets import (
    PAPER_GARAGE_DOMAINS,
    import_garage,
    import_kilt_nq,
    load_base_set,
    validate_base_set,
    write_base_set,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NQ = FIXTURES / "kilt" / "nq-sample-kilt.jsonl"
KS = FIXTURES / "kilt" / "knowledge-sample.jsonl"
GARAGE = FIXTURES / "garage_sample.jsonl"

PASSING = ["nq-01", "nq-02", "nq-04", "nq-05", "nq-08", "nq-09", "nq-10"]  # a short answer is in the cited paragraphs


def kilt(n=None, seed=0, questions=NQ, knowledge=KS, **kwargs):
    stats: Counter[str] = Counter()
    items = import_kilt_nq(questions, knowledge, n=n, seed=seed, stats=stats, **kwargs)
    return items, stats


# ----------------------------------------------------------------- KILT NQ


def test_kilt_curation_reads_passages_from_the_knowledge_source():
    items, stats = kilt()
    by_id = {i.id: i for i in items}
    assert list(by_id) == PASSING
    assert stats == Counter(
        kept=7,
        no_short_answer=1,
        answer_not_in_passage=2,
        not_sampled=0,
        pages_read=17,
        pages_kept=5,
        pages_not_found=1,
    )
    assert by_id["nq-01"].context == "Building work began in 1861 and the viaduct opened to trains in 1864."
    # paragraphs 1..3, the title line excluded by the range; the found alias first
    assert by_id["nq-09"].context.endswith("directed by his daughter, Freya Lind.")
    assert by_id["nq-05"].answers == ["Marta Vell", "M. Vell"]
    # bullet marker removed
    assert by_id["nq-10"].context == "The lake freezes over in most winters."
    assert all(i.variant == "single" for i in items)


def test_kilt_n_draws_uniformly_from_the_passing_pool_reproducibly():
    draws = {}
    for seed in range(20):
        items, stats = kilt(n=3, seed=seed)
        ids = [i.id for i in items]
        assert len(ids) == 3 and set(ids) <= set(PASSING)
        assert ids == sorted(ids)  # file order
        assert ids == [i.id for i in kilt(n=3, seed=seed)[0]]
        assert stats["kept"] == 3 and stats["no_short_answer"] == 1
        assert stats["kept"] + stats["answer_not_in_passage"] + stats["not_sampled"] == 9
        draws[seed] = tuple(ids)
    assert len(set(draws.values())) > 5
    # over the seeds every passing question is drawn at some point, and no failing one ever
    assert set().union(*map(set, draws.values())) == set(PASSING)
    # n larger than the pool: the whole pool
    assert [i.id for i in kilt(n=50)[0]] == PASSING


def test_kilt_keeps_only_pages_the_candidates_cite():
    # Every page line is read once; only the 5 cited pages that exist are parsed and cut.
    _, everything = kilt()
    assert everything["pages_read"] == 17 and everything["pages_kept"] == 5
    # A sample of 1 needs no more pages than the whole pool does.
    for seed in range(5):
        assert kilt(n=1, seed=seed)[1]["pages_kept"] <= 5


def test_kilt_stops_reading_once_every_cited_page_is_seen(tmp_path):
    questions = tmp_path / "nq.jsonl"
    questions.write_text("".join(line for line in NQ.read_text().splitlines(keepends=True) if '"nq-06"' not in line))
    items, stats = kilt(questions=questions)
    assert [i.id for i in items] == PASSING
    # page 1006, the last one cited, is line 12 of 17: the 5 lines after it are never read
    assert stats["pages_read"] == 12 and stats["pages_not_found"] == 0


def test_kilt_progress_runs_over_both_files_to_their_total():
    calls = []
    kilt(on_progress=lambda done, total: calls.append((done, total)))
    total = NQ.stat().st_size + KS.stat().st_size
    assert calls and calls[-1] == (total, total)
    assert all(t == total for _, t in calls) and [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_kilt_output_passes_validation(tmp_path):
    items, _ = kilt(n=4, seed=3)
    out = write_base_set(items, tmp_path / "nq-base.jsonl")
    assert validate_base_set(out) == []
    assert load_base_set(out) == items


def test_kilt_malformed_knowledge_line_is_one_clear_error(tmp_path):
    lines = KS.read_text().splitlines(keepends=True)
    lines[5] = lines[5][: len(lines[5]) // 2] + "\n"  # a page cut off mid-way (e.g. an interrupted download)
    broken = tmp_path / "kilt_knowledgesource.json"
    broken.write_text("".join(lines))
    with pytest.raises(InputError) as info:
        kilt(knowledge=broken)
    message = str(info.value)
    assert message.startswith(f"{broken}:6: -: not valid JSON: ")
    assert "\n" not in message
    assert not isinstance(info.value, InputErrors) or len(info.value.errors) == 1


def test_kilt_knowledge_line_of_a_page_nobody_cites_is_still_checked(tmp_path):
    broken = tmp_path / "ks.jsonl"
    broken.write_text(KS.read_text() + '{"_id": "3001", "wikipedia_id": "3001", "text": ["cut\n')
    with pytest.raises(InputError) as info:
        kilt(knowledge=broken)
    assert str(info.value).startswith(f"{broken}:18: -: not valid JSON")


def test_kilt_knowledge_page_without_paragraph_list(tmp_path):
    lines = KS.read_text().splitlines(keepends=True)
    page = json.loads(lines[1])  # page 1001, cited
    page["text"] = "one string"
    lines[1] = json.dumps(page) + "\n"
    broken = tmp_path / "ks.jsonl"
    broken.write_text("".join(lines))
    with pytest.raises(InputError) as info:
        kilt(knowledge=broken)
    assert str(info.value) == f"{broken}:2: text: must be a list of paragraphs, got string"


def test_kilt_malformed_question_lines_name_file_and_line(tmp_path):
    lines = NQ.read_text().splitlines(keepends=True)
    lines[2] = '{"id": "nq-03", "input": "who designed it", "output": [{"answer": 3}]}\n'
    lines[6] = "not json\n"
    broken = tmp_path / "nq-dev-kilt.jsonl"
    broken.write_text("".join(lines))
    with pytest.raises(InputErrors) as info:
        kilt(questions=broken)
    assert info.value.lines() == [
        f"{broken}:3: output[0].answer: must be a string, got number",
        f"{broken}:7: -: not valid JSON: Expecting value (column 1)",
    ]


def test_json_array_is_refused_with_the_conversion(tmp_path):
    array = tmp_path / "nq.json"
    array.write_text(json.dumps([json.loads(line) for line in NQ.read_text().splitlines()]))
    with pytest.raises(InputError) as info:
        kilt(questions=array)
    assert str(info.value).startswith(f"{array}:1: -: this is one JSON array, not JSON lines")
    assert "jq -c '.[]'" in str(info.value)


def test_missing_knowledge_file_fails_before_reading(tmp_path):
    with pytest.raises(InputError) as info:
        kilt(knowledge=tmp_path / "absent.json")
    assert str(info.value) == f"{tmp_path / 'absent.json'}: -: file not found"


def test_kilt_streams_a_large_knowledge_source_in_bounded_memory(tmp_path):
    # 4000 uncited pages of ~2 KB (8 MB) around the cited ones: memory must not grow with the file.
    filler = KS.read_text().splitlines(keepends=True)[0]
    page = json.loads(filler)
    page["text"] = page["text"] + ["padding " * 250]
    big = tmp_path / "ks.jsonl"
    with open(big, "w") as out:
        for i in range(4000):
            page["_id"] = page["wikipedia_id"] = str(100000 + i)
            out.write(json.dumps(page) + "\n")
        out.write(KS.read_text())
    tracemalloc.start()
    try:
        items, stats = kilt(knowledge=big)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [i.id for i in items] == PASSING and stats["pages_read"] == 4017 and stats["pages_kept"] == 5
    assert peak < 1_000_000, peak


# ----------------------------------------------------------------- GaRAGe


def test_garage_default_is_the_papers_five_domains():
    stats: Counter[str] = Counter()
    items = import_garage(GARAGE, stats=stats)
    assert [i.id for i in items] == ["g-sci-1", "g-sci-2", "g-sci-3", "g-fin-1", "g-biz-4"]
    assert stats["domain"] == 1  # g-travel-1
    assert {i.domain.casefold() for i in items} <= {d.casefold() for d in PAPER_GARAGE_DOMAINS}


def test_garage_n_is_split_evenly_over_the_domains_by_seed(tmp_path):
    seen = set()
    for seed in range(10):
        stats: Counter[str] = Counter()
        items = import_garage(GARAGE, n=5, seed=seed, stats=stats)
        ids = [i.id for i in items]
        assert ids == [i.id for i in import_garage(GARAGE, n=5, seed=seed)]
        # one per domain: Health and Law & Government have no eligible item, which is reported, not refilled
        assert len([i for i in ids if i.startswith("g-sci")]) == 1 and {"g-fin-1", "g-biz-4"} <= set(ids)
        assert stats["domain_shortfall"] == 2 and stats["kept"] == 3
        seen.add(tuple(ids))
        out = write_base_set(items, tmp_path / f"garage-{seed}.jsonl")
        assert validate_base_set(out) == []
    assert len(seen) > 1


def test_garage_n_without_domains_draws_from_the_whole_pool():
    ids = [i.id for i in import_garage(GARAGE, n=4, seed=2, domains=None)]
    assert len(ids) == 4 and ids == [i.id for i in import_garage(GARAGE, n=4, seed=2, domains=None)]
    with pytest.raises(ValueError):
        import_garage(GARAGE, n=4, per_domain=2)


def test_garage_progress_and_malformed_line(tmp_path):
    calls = []
    import_garage(GARAGE, on_progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (GARAGE.stat().st_size, GARAGE.stat().st_size)
    broken = tmp_path / "GaRAGe_benchmark.jsonl"
    broken.write_text(GARAGE.read_text().splitlines(keepends=True)[0] + "{oops\n")
    with pytest.raises(InputError) as info:
        import_garage(broken)
    assert str(info.value).startswith(f"{broken}:2: -: not valid JSON")
