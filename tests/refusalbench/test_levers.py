"""The lever catalogue: loading, validation, hashing and slicing (tasks/refusalbench/levers.py)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from refusalbench.levers import CATALOGUE_DIR
from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.refusalbench.levers import (
    ALLOWED_TARGETS,
    catalogue_hash,
    catalogue_listing,
    filter_levers,
    lever_id,
    levers_by_stratum,
    load_catalogue,
    load_lever_file,
    load_reference_names,
    name_slug,
    validate_catalogue,
)
from refusalbench.tasks.refusalbench.schema.records import Lever
from refusalbench.tasks.refusalbench.taxonomy import (
    CANONICAL_CODE,
    CLASS_SLUG,
    PERTURBATION_CLASSES,
    STRATA,
    expected_behaviour,
)

# ----------------------------------------------------------------- helpers


def make_lever(cls: str, intensity: str, name: str) -> dict[str, Any]:
    """A lever record that passes every check for its stratum (its target the class's first allowed one)."""
    example: dict[str, Any] = {
        "question": f"What about {name}?",
        "context": f"Some context for {name}.",
        "expected": expected_behaviour(cls, intensity),
    }
    if intensity == "LOW":
        example["answer"] = "An answer"
    return {
        "id": lever_id(cls, intensity, name),
        "name": name,
        "perturbation_class": cls,
        "intensity": intensity,
        "target": ALLOWED_TARGETS[cls][0],
        "instruction": f"Apply {name} to the context.",
        "example": example,
        "multi_document": "Edit the signal passages.",
    }


def synthetic_records(per_stratum: int = 8) -> list[dict[str, Any]]:
    return [
        make_lever(cls, intensity, f"Lever {cls[2:]} {intensity} {n}")
        for cls, intensity in STRATA
        for n in range(per_stratum)
    ]


def write_catalogue(directory: Path, records: list[dict[str, Any]]) -> Path:
    """One YAML file per class slug, like the shipped catalogue."""
    directory.mkdir(parents=True, exist_ok=True)
    by_file: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        slug = CLASS_SLUG.get(record["perturbation_class"], "unknown").replace("-", "_")
        by_file.setdefault(slug, []).append(record)
    for slug, group in by_file.items():
        (directory / f"{slug}.yaml").write_text(yaml.safe_dump({"levers": group}, sort_keys=False))
    return directory


def line_of(path: Path, needle: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), start=1) if needle in text)


# ----------------------------------------------------------------- ids


def test_name_slug_follows_the_id_rule() -> None:
    assert name_slug("Metonymy (Institution for Building)") == "metonymy-institution-for-building"
    assert name_slug("Contradiction in Speaker's Title") == "contradiction-in-speakers-title"
    assert name_slug("Stacked Quantifier & Negation Tangle") == "stacked-quantifier-negation-tangle"
    assert name_slug("Anaphoric 'One' Collision") == "anaphoric-one-collision"
    assert lever_id("P-MissingInfo", "MEDIUM", "Pronoun w/o Antecedent") == "missing-info-medium-pronoun-w-o-antecedent"


# ----------------------------------------------------------------- shipped data


def test_reference_names_cover_176_levers_in_18_strata() -> None:
    reference = load_reference_names()
    assert list(reference) == list(STRATA)
    assert sum(len(names) for names in reference.values()) == 176
    assert len(reference[("P-MissingInfo", "MEDIUM")]) == 11
    assert "Ambiguous 'Respectively' Mapping" in reference[("P-Ambiguity", "HIGH")]


@pytest.mark.parametrize(
    ("file", "cls", "count"),
    [
        ("ambiguity.yaml", "P-Ambiguity", 29),
        ("contradiction.yaml", "P-Contradiction", 28),
        ("missing_info.yaml", "P-MissingInfo", 30),
    ],
)
def test_class_file_is_complete_and_clean(file: str, cls: str, count: int) -> None:
    levers = load_lever_file(CATALOGUE_DIR / file)
    assert len(levers) == count
    assert {lever.perturbation_class for lever in levers} == {cls}
    own_reference = {stratum: names for stratum, names in load_reference_names().items() if stratum[0] == cls}
    assert validate_catalogue(levers, own_reference, min_per_stratum=0) == []
    assert all(len(lever.example.context) < 400 for lever in levers)


def test_shipped_catalogue_is_valid() -> None:
    levers = load_catalogue()
    assert len(levers) == 176
    assert validate_catalogue(levers) == []


# ----------------------------------------------------------------- loading


def test_synthetic_catalogue_loads_in_class_then_intensity_order(tmp_path: Path) -> None:
    records = synthetic_records()
    # reversed input: the loader, not the files, fixes the order
    write_catalogue(tmp_path, list(reversed(records)))
    (tmp_path / "reference_names.yaml").write_text("not: [a, lever, file]\n")
    levers = load_catalogue(tmp_path)
    assert len(levers) == 18 * 8
    strata = [(lv.perturbation_class, lv.intensity) for lv in levers]
    assert list(dict.fromkeys(strata)) == list(STRATA)
    # within a stratum the file order is kept (here: reversed)
    first = [lv.name for lv in levers[:8]]
    assert first == sorted(first, reverse=True)
    assert validate_catalogue(levers, {}) == []


def test_unknown_class_is_an_input_error_naming_file_and_line(tmp_path: Path) -> None:
    records = [make_lever("P-Ambiguity", "LOW", "Fine"), make_lever("P-Ambiguity", "LOW", "Broken")]
    records[1]["perturbation_class"] = "P-Vagueness"
    path = tmp_path / "ambiguity.yaml"
    path.write_text(yaml.safe_dump({"levers": records}, sort_keys=False))
    with pytest.raises(InputError) as caught:
        load_catalogue(tmp_path)
    err = caught.value
    assert err.file == str(path)
    assert err.line == line_of(path, "P-Vagueness")
    assert err.field == "levers[1].perturbation_class"
    assert str(err).startswith(f"{path}:{err.line}: levers[1].perturbation_class: ")


def test_extra_field_and_missing_field_are_reported(tmp_path: Path) -> None:
    record = make_lever("P-Contradiction", "HIGH", "Odd")
    record["colour"] = "blue"
    del record["multi_document"]
    write_catalogue(tmp_path, [record])
    with pytest.raises(InputError) as caught:
        load_catalogue(tmp_path)
    lines = caught.value.lines()  # type: ignore[attr-defined]
    assert any("colour" in line for line in lines)
    assert any("multi_document" in line and "required" in line.lower() for line in lines)


def test_broken_yaml_is_an_input_error_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "ambiguity.yaml"
    path.write_text("levers:\n  - id: x\n    name: [unclosed\n")
    with pytest.raises(InputError) as caught:
        load_catalogue(tmp_path)
    assert caught.value.file == str(path)
    assert caught.value.line is not None and caught.value.line >= 3
    assert "invalid YAML" in caught.value.problem


def test_duplicate_yaml_key_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "ambiguity.yaml"
    record = make_lever("P-Ambiguity", "LOW", "Twice")
    # a second 'instruction' key at the end of the record: PyYAML alone would keep it silently
    path.write_text(yaml.safe_dump({"levers": [record]}, sort_keys=False) + "  instruction: a second copy\n")
    with pytest.raises(InputError) as caught:
        load_catalogue(tmp_path)
    assert "duplicate key" in caught.value.problem
    assert caught.value.line == len(path.read_text().splitlines())


def test_wrong_top_level_shape_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "ambiguity.yaml").write_text("- just\n- a list\n")
    with pytest.raises(InputError, match="'levers' list"):
        load_catalogue(tmp_path)


# ----------------------------------------------------------------- validation


def test_duplicate_id_is_reported() -> None:
    records = synthetic_records()
    records.append(dict(records[0]))
    problems = validate_catalogue(records, {})
    assert any(p.startswith(f"duplicate id {records[0]['id']!r}") for p in problems)


def test_wrong_code_for_the_stratum_is_reported() -> None:
    records = synthetic_records()
    medium = next(r for r in records if r["intensity"] == "MEDIUM" and r["perturbation_class"] == "P-MissingInfo")
    medium["example"]["expected"] = CANONICAL_CODE["P-Contradiction"]
    low = next(r for r in records if r["intensity"] == "LOW")
    low["example"]["expected"] = CANONICAL_CODE[low["perturbation_class"]]
    problems = validate_catalogue(records, {})
    assert len([p for p in problems if "example.expected" in p]) == 2
    assert any(medium["id"] in p and "REFUSE_INFO_MISSING_IN_CONTEXT" in p for p in problems)


def test_low_example_without_answer_and_refusal_with_answer_are_reported() -> None:
    records = synthetic_records()
    low = next(r for r in records if r["intensity"] == "LOW")
    del low["example"]["answer"]
    high = next(r for r in records if r["intensity"] == "HIGH")
    high["example"]["answer"] = "something"
    problems = validate_catalogue(records, {})
    assert any(low["id"] in p and "answer" in p for p in problems)
    assert any(high["id"] in p and "answer" in p for p in problems)


def test_id_breaking_the_slug_rule_is_reported() -> None:
    records = synthetic_records()
    records[5]["id"] = "Ambiguity_Low_Something"
    problems = validate_catalogue(records, {})
    assert any("Ambiguity_Low_Something" in p and "id should be" in p for p in problems)


def test_short_and_empty_strata_are_reported() -> None:
    records = [
        r for r in synthetic_records() if not (r["perturbation_class"] == "P-FalsePremise" and r["intensity"] == "HIGH")
    ]
    short = [r for r in records if (r["perturbation_class"], r["intensity"]) == ("P-Ambiguity", "MEDIUM")]
    records.remove(short[0])
    problems = validate_catalogue(records, {})
    assert "stratum P-Ambiguity/MEDIUM has 7 levers; at least 8 needed" in problems
    assert "stratum P-FalsePremise/HIGH has 0 levers; at least 8 needed" in problems
    assert len(problems) == 2
    assert validate_catalogue(records, {}, min_per_stratum=0) == []


def test_unknown_class_in_raw_records_is_reported() -> None:
    records = synthetic_records()
    records[0]["perturbation_class"] = "P-Vagueness"
    problems = validate_catalogue(records, {})
    assert any("perturbation_class" in p and records[0]["id"] in p for p in problems)


def test_missing_reference_name_is_reported() -> None:
    records = synthetic_records()
    reference = {
        ("P-Ambiguity", "LOW"): [records[0]["name"], "Dominant-sense Polysemy"],
        ("P-Ambiguity", "HIGH"): [records[0]["name"]],
    }
    problems = validate_catalogue(records, reference)
    assert problems == [
        "stratum P-Ambiguity/LOW lacks reference lever 'Dominant-sense Polysemy'",
        f"stratum P-Ambiguity/HIGH lacks reference lever {records[0]['name']!r} (found in P-Ambiguity/LOW)",
    ]


# ----------------------------------------------------------------- hashing and slicing


def test_hash_is_stable_and_tracks_instruction_changes(tmp_path: Path) -> None:
    records = synthetic_records()
    levers = [Lever.model_validate(r) for r in records]
    digest = catalogue_hash(levers)
    assert len(digest) == 64
    assert catalogue_hash(list(reversed(levers))) == digest
    assert catalogue_hash(load_catalogue(write_catalogue(tmp_path, records))) == digest
    edited = [levers[0].model_copy(update={"instruction": levers[0].instruction + " Keep it short."}), *levers[1:]]
    assert catalogue_hash(edited) != digest


def test_filter_and_group_by_stratum() -> None:
    levers = [Lever.model_validate(r) for r in synthetic_records(per_stratum=2)]
    picked = filter_levers(levers, ["P-Contradiction", "P-FalsePremise"], ["HIGH"])
    assert Counter((lv.perturbation_class, lv.intensity) for lv in picked) == {
        ("P-Contradiction", "HIGH"): 2,
        ("P-FalsePremise", "HIGH"): 2,
    }
    assert filter_levers(levers, None, None) == levers
    with pytest.raises(ValueError, match="P-Vagueness"):
        filter_levers(levers, ["P-Vagueness"], None)
    grouped = levers_by_stratum(picked)
    assert list(grouped) == [("P-Contradiction", "HIGH"), ("P-FalsePremise", "HIGH")]
    assert list(levers_by_stratum(levers)) == list(STRATA)


def test_listing_carries_expected_behaviour() -> None:
    levers = [Lever.model_validate(make_lever("P-MissingInfo", "HIGH", "Gone"))]
    (row,) = catalogue_listing(levers)
    assert row["expected"] == "REFUSE_INFO_MISSING_IN_CONTEXT"
    assert {"id", "perturbation_class", "intensity", "name", "instruction"} <= set(row)


# ----------------------------------------------------------------- class-to-target rule (paper App. I.3)


def test_target_rule_is_the_papers() -> None:
    assert set(ALLOWED_TARGETS) == set(PERTURBATION_CLASSES)
    assert ALLOWED_TARGETS["P-FalsePremise"] == ("query",)
    assert ALLOWED_TARGETS["P-Contradiction"] == ALLOWED_TARGETS["P-MissingInfo"] == ("context",)
    assert {"query", "context"} <= set(ALLOWED_TARGETS["P-Ambiguity"])
    assert ALLOWED_TARGETS["P-GranularityMismatch"] == ALLOWED_TARGETS["P-EpistemicMismatch"] == ("query-context",)


def test_shipped_catalogue_follows_the_target_rule_or_says_why() -> None:
    levers = load_catalogue()
    departures = [lv for lv in levers if lv.target not in ALLOWED_TARGETS[lv.perturbation_class]]
    excused = [lv for lv in levers if lv.target_exception is not None]
    assert [lv.id for lv in departures] == [lv.id for lv in excused]
    for lever in excused:
        # a reason, not a tag
        assert lever.target_exception is not None and len(lever.target_exception.split()) >= 8, lever.id


def copy_catalogue(tmp_path: Path) -> Path:
    copy = tmp_path / "levers"
    copy.mkdir()
    for path in CATALOGUE_DIR.glob("*.yaml"):
        shutil.copy(path, copy / path.name)
    return copy


def retarget_first(path: Path, old: str, new: str) -> int:
    """Change the first ``target: old`` line of a lever file; returns its 1-based line."""
    lines = path.read_text().splitlines(keepends=True)
    index = next(i for i, text in enumerate(lines) if text.strip() == f"target: {old}")
    lines[index] = lines[index].replace(old, new)
    path.write_text("".join(lines))
    return index + 1


def test_false_premise_lever_targeting_context_fails_with_file_and_line(tmp_path: Path) -> None:
    copy = copy_catalogue(tmp_path)
    path = copy / "false_premise.yaml"
    line = retarget_first(path, "query", "context")
    problems = validate_catalogue(load_catalogue(copy))
    assert len(problems) == 1
    assert problems[0].startswith(f"{path}:{line}: levers[0].target: lever 'false-premise-low-")
    assert "P-FalsePremise levers modify 'query' (paper App. I.3), not 'context'" in problems[0]


def test_levers_validate_command_exits_non_zero_on_a_target_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from refusalbench.flows.cli import app

    copy = copy_catalogue(tmp_path)
    path = copy / "contradiction.yaml"
    line = retarget_first(path, "context", "query")
    monkeypatch.setattr("refusalbench.tasks.refusalbench.levers.CATALOGUE_DIR", copy)
    result = CliRunner().invoke(app, ["levers", "validate"])
    assert result.exit_code != 0
    assert f"{path}:{line}: levers[0].target: " in result.output


def test_exceptions_must_be_needed_and_give_a_reason() -> None:
    records = synthetic_records()
    departs = next(r for r in records if r["perturbation_class"] == "P-MissingInfo")
    departs["target"] = "query-context"
    blank = next(r for r in records if r["perturbation_class"] == "P-FalsePremise")
    blank["target"], blank["target_exception"] = "query-context", "   "
    needless = next(r for r in records if r["perturbation_class"] == "P-Contradiction")
    needless["target_exception"] = "It edits the context, like every contradiction lever."
    excused = next(r for r in records if r["perturbation_class"] == "P-GranularityMismatch")
    excused["target"], excused["target_exception"] = "query", "The mismatch is carried by the question alone here."
    problems = validate_catalogue(records, {})
    assert len(problems) == 3
    assert any(
        p.startswith(f"lever {departs['id']!r}: target: P-MissingInfo levers modify 'context'") for p in problems
    )
    assert any(p.startswith(f"lever {blank['id']!r}: target_exception: is empty") for p in problems)
    assert any(
        p.startswith(f"lever {needless['id']!r}: target_exception: ") and "drop the exception" in p for p in problems
    )


def test_levers_list_json_keeps_the_contract_fields() -> None:
    from refusalbench.flows.cli import app

    result = CliRunner().invoke(app, ["levers", "list", "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 176
    contract = {"id", "perturbation_class", "intensity", "name", "instruction", "expected"}
    assert all(contract | {"target", "target_exception"} <= set(row) for row in rows)
    assert all(row["target_exception"] is None or row["target_exception"].strip() for row in rows)
