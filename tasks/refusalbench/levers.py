"""The lever catalogue: load it from levers/*.yaml, check it, hash it, slice it.

Each lever file holds ``levers: [...]`` records of ``records.Lever``. Loading is strict:
bad YAML or a record that does not validate raises ``InputError`` naming the file and the
line of the offending field. Semantic checks (duplicate ids, strata too small, reference
names missing, a target the lever's class does not allow) live in ``validate_catalogue``,
which returns a list of problems instead of raising, so ``levers validate`` can show them all
at once; a loaded lever remembers its file and lines, so its problems can name FILE:LINE.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from refusalbench.levers import CATALOGUE_DIR
from refusalbench.tasks.core.errors import InputError, InputErrors
from refusalbench.tasks.core.textinput import read_text
from refusalbench.tasks.refusalbench.schema.records import Lever
from refusalbench.tasks.refusalbench.taxonomy import (
    CLASS_SLUG,
    INTENSITIES,
    PERTURBATION_CLASSES,
    STRATA,
    expected_behaviour,
    parse_class,
    parse_intensity,
)

# Lives in levers/ next to the lever files but holds names only, so the loader skips it.
REFERENCE_NAMES_FILE = "reference_names.yaml"
MIN_PER_STRATUM = 8

# Paper App. I.3: the part of an item each class's levers modify. The paper lets P-Ambiguity
# sit in "either the query or the context"; the catalogue's query-context target tells the
# generator "the question, the context, or both", which is that choice, so all three pass.
# A lever that must depart from its class's rule says why in ``target_exception``.
ALLOWED_TARGETS: dict[str, tuple[str, ...]] = {
    "P-Ambiguity": ("query", "context", "query-context"),
    "P-Contradiction": ("context",),
    "P-MissingInfo": ("context",),
    "P-FalsePremise": ("query",),
    "P-GranularityMismatch": ("query-context",),
    "P-EpistemicMismatch": ("query-context",),
}

Stratum = tuple[str, str]

_APOSTROPHES = re.compile(r"['\u2019]")
_NON_SLUG = re.compile(r"[^a-z0-9]+")


# ----------------------------------------------------------------- ids


def name_slug(name: str) -> str:
    """Slug of a lever name: lowercase; apostrophes dropped; other runs of non-[a-z0-9] become '-'.

    "Contradiction in Speaker's Title" -> "contradiction-in-speakers-title",
    "Pronoun w/o Antecedent" -> "pronoun-w-o-antecedent".
    """
    return _NON_SLUG.sub("-", _APOSTROPHES.sub("", name.lower())).strip("-")


def lever_id(perturbation_class: str, intensity: str, name: str) -> str:
    """The id a lever must carry: ``<class-slug>-<intensity lower>-<name slug>``."""
    return f"{CLASS_SLUG[perturbation_class]}-{intensity.lower()}-{name_slug(name)}"


# ----------------------------------------------------------------- loading

# libyaml's parser when PyYAML was built with it: the catalogue parses several times faster.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Every stage task loads the catalogue; parse each version of the files once per process.
_parsed_catalogues: dict[tuple[Any, ...], list[Lever]] = {}


def _compose(path: Path) -> tuple[yaml.Node | None, Any]:
    """Parse one YAML file into (node tree, python data); YAML errors become InputError."""
    file = str(path)
    text = read_text(path)
    loader = _SafeLoader(text)
    try:
        node = loader.get_single_node()
        _reject_duplicate_keys(node, file)
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(file, f"invalid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    finally:
        loader.dispose()
    return node, data


def _reject_duplicate_keys(node: yaml.Node | None, file: str) -> None:
    # PyYAML silently keeps the last of two equal keys; in a lever that hides an edit.
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                raise InputError(file, f"duplicate key {key!r}", line=key_node.start_mark.line + 1, field=key)
            seen.add(key)
            _reject_duplicate_keys(value_node, file)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _reject_duplicate_keys(item, file)


def _mapping_value(node: yaml.Node, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if str(key_node.value) == key:
                return key_node, value_node
    return None


def _line_of(node: yaml.Node, loc: Sequence[Any]) -> int:
    """1-based line of the deepest node on ``loc`` that exists (the key's line for a mapping entry)."""
    line: int = node.start_mark.line + 1
    for part in loc:
        found = _mapping_value(node, str(part))
        if found is None:
            break
        key_node, node = found
        line = key_node.start_mark.line + 1
    return line


def _key_lines(node: yaml.Node) -> dict[str, int]:
    """1-based line of every key of a mapping node."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(key.value): key.start_mark.line + 1 for key, _ in node.value}


def _lever_nodes(path: Path) -> tuple[list[Any], list[yaml.Node]]:
    """The raw lever records of a file and their nodes, after checking the file's shape."""
    file = str(path)
    root, data = _compose(path)
    if root is None:
        raise InputError(file, "empty lever file; expected a mapping with a 'levers' list")
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        line = root.start_mark.line + 1
        raise InputError(file, "a lever file must be a mapping with a 'levers' list", line=line)
    for key_node, _ in root.value:
        if str(key_node.value) != "levers":
            raise InputError(
                file,
                "unknown top-level key; only 'levers' is allowed",
                line=key_node.start_mark.line + 1,
                field=str(key_node.value),
            )
    found = _mapping_value(root, "levers")
    if found is None:
        raise InputError(file, "missing 'levers' list", line=1, field="levers")
    key_node, seq = found
    if not isinstance(seq, yaml.SequenceNode):
        raise InputError(file, "'levers' must be a list", line=key_node.start_mark.line + 1, field="levers")
    return list(data["levers"]), list(seq.value)


def load_lever_file(path: Path) -> list[Lever]:
    """The levers of one file in file order; every invalid record is reported (InputErrors)."""
    file = str(path)
    records, nodes = _lever_nodes(path)
    levers: list[Lever] = []
    errors: list[InputError] = []
    for index, (record, node) in enumerate(zip(records, nodes)):
        where = f"levers[{index}]"
        if not isinstance(record, dict):
            line = node.start_mark.line + 1
            errors.append(InputError(file, "a lever must be a mapping", line=line, field=where))
            continue
        try:
            lever = Lever.model_validate(record)
        except ValidationError as exc:
            for err in exc.errors():
                loc = [str(part) for part in err["loc"]]
                field = ".".join([where, *loc])
                errors.append(InputError(file, err["msg"], line=_line_of(node, loc), field=field))
            continue
        lever._source = (file, index, {"": node.start_mark.line + 1, **_key_lines(node)})
        levers.append(lever)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(errors)
    return levers


def lever_files(directory: Path | None = None) -> list[Path]:
    """The lever files of a catalogue directory, sorted by name (the reference list excluded)."""
    root = Path(directory) if directory is not None else CATALOGUE_DIR
    return sorted(p for p in root.glob("*.yaml") if p.name != REFERENCE_NAMES_FILE)


def _sort_key(lever: Lever) -> tuple[int, int]:
    return PERTURBATION_CLASSES.index(lever.perturbation_class), INTENSITIES.index(lever.intensity)


def load_catalogue(directory: Path | None = None) -> list[Lever]:
    """All levers of ``directory`` (default levers/), ordered by class, intensity, then file order."""
    root = Path(directory) if directory is not None else CATALOGUE_DIR
    if not root.is_dir():
        raise InputError(str(root), "lever catalogue directory not found")
    files = lever_files(root)
    version = (str(root.resolve()), *((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files))
    if version not in _parsed_catalogues:
        _parsed_catalogues[version] = _parse_catalogue(files)
    return [lever.model_copy(deep=True) for lever in _parsed_catalogues[version]]


def _parse_catalogue(files: list[Path]) -> list[Lever]:
    levers: list[Lever] = []
    errors: list[InputError] = []
    for path in files:
        try:
            levers.extend(load_lever_file(path))
        except InputErrors as exc:
            errors.extend(exc.errors)
        except InputError as exc:
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise InputErrors(errors)
    # sorted() is stable, so within a stratum the file order (files by name) is kept.
    return sorted(levers, key=_sort_key)


def load_reference_names(path: Path | None = None) -> dict[Stratum, list[str]]:
    """Reference lever names per (class, intensity), from levers/reference_names.yaml."""
    path = Path(path) if path is not None else CATALOGUE_DIR / REFERENCE_NAMES_FILE
    file = str(path)
    if not path.is_file():
        raise InputError(file, "reference name list not found")
    _, data = _compose(path)
    if not isinstance(data, dict):
        raise InputError(file, "expected a mapping: class -> intensity -> list of names")
    names: dict[Stratum, list[str]] = {}
    for cls, by_intensity in data.items():
        if cls not in PERTURBATION_CLASSES:
            raise InputError(file, f"unknown perturbation class {cls!r}", field=str(cls))
        if not isinstance(by_intensity, dict):
            raise InputError(file, "expected a mapping intensity -> list of names", field=str(cls))
        for intensity, listed in by_intensity.items():
            field = f"{cls}.{intensity}"
            if intensity not in INTENSITIES:
                raise InputError(file, f"unknown intensity {intensity!r}", field=field)
            if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
                raise InputError(file, "expected a list of names", field=field)
            names[(cls, intensity)] = list(listed)
    return {stratum: names[stratum] for stratum in STRATA if stratum in names}


# ----------------------------------------------------------------- validation


def _describe_record(index: int, record: Mapping[str, Any]) -> str:
    ident = record.get("id") if isinstance(record, Mapping) else None
    return f"lever #{index} ({ident!r})" if ident else f"lever #{index}"


def _coerce(levers: Sequence[Lever | Mapping[str, Any]]) -> tuple[list[Lever], list[str]]:
    """Validate raw dicts into Levers; their schema errors (unknown class, ...) become problems."""
    valid: list[Lever] = []
    problems: list[str] = []
    for index, item in enumerate(levers):
        if isinstance(item, Lever):
            valid.append(item)
            continue
        if not isinstance(item, Mapping):
            problems.append(f"lever #{index}: not a mapping ({type(item).__name__})")
            continue
        try:
            valid.append(Lever.model_validate(dict(item)))
        except ValidationError as exc:
            for err in exc.errors():
                field = ".".join(str(part) for part in err["loc"]) or "-"
                problems.append(f"{_describe_record(index, item)}: {field}: {err['msg']}")
    return valid, problems


def _record_problems(lever: Lever) -> list[str]:
    """Checks that concern one lever on its own."""
    problems: list[str] = []
    tag = f"lever {lever.id!r}"
    wanted_id = lever_id(lever.perturbation_class, lever.intensity, lever.name)
    if lever.id != wanted_id:
        problems.append(f"{tag}: id should be {wanted_id!r} (<class-slug>-<intensity>-<name slug>)")
    truth = expected_behaviour(lever.perturbation_class, lever.intensity)
    stratum = f"{lever.perturbation_class}/{lever.intensity}"
    if lever.example.expected != truth:
        problems.append(f"{tag}: example.expected is {lever.example.expected!r} but {stratum} expects {truth!r}")
    if lever.intensity == "LOW" and not (lever.example.answer or "").strip():
        problems.append(f"{tag}: a LOW example needs an 'answer' that stays derivable")
    if lever.intensity != "LOW" and lever.example.answer is not None:
        problems.append(f"{tag}: a {lever.intensity} example must not carry an 'answer' (it expects a refusal)")
    texts = {
        "name": lever.name,
        "instruction": lever.instruction,
        "multi_document": lever.multi_document,
        "example.question": lever.example.question,
        "example.context": lever.example.context,
    }
    problems.extend(f"{tag}: {field} is empty" for field, text in texts.items() if not text.strip())
    return problems


def _located(lever: Lever, field: str, problem: str) -> str:
    """A problem with the lever's FILE:LINE when the loader read it (the ``InputError`` form)."""
    if lever.source is None:
        return f"lever {lever.id!r}: {field}: {problem}"
    file, index, lines = lever.source
    line = lines.get(field) or lines.get("target") or lines[""]
    return str(InputError(file, f"lever {lever.id!r}: {problem}", line=line, field=f"levers[{index}].{field}"))


def _target_problems(lever: Lever) -> list[str]:
    """The class-to-target rule of paper App. I.3, and the reasons given for departing from it."""
    allowed = ALLOWED_TARGETS[lever.perturbation_class]
    follows = lever.target in allowed
    reason = lever.target_exception
    wanted = " or ".join(repr(target) for target in allowed)
    if reason is not None and not reason.strip():
        return [_located(lever, "target_exception", "is empty; say why the target departs from the rule")]
    if not follows and reason is None:
        return [
            _located(
                lever,
                "target",
                (
                    f"{lever.perturbation_class} levers modify {wanted} (paper App. I.3), not {lever.target!r}; "
                    "fix the target, or say why this lever must differ in target_exception"
                ),
            )
        ]
    if follows and reason is not None:
        return [
            _located(
                lever,
                "target_exception",
                (f"target {lever.target!r} already follows the {lever.perturbation_class} rule; drop the exception"),
            )
        ]
    return []


def validate_catalogue(
    levers: Sequence[Lever | Mapping[str, Any]],
    reference_names: Mapping[Stratum, Sequence[str]] | None = None,
    min_per_stratum: int = MIN_PER_STRATUM,
) -> list[str]:
    """Every problem of a catalogue as a readable line; an empty list means it is valid.

    ``reference_names`` defaults to the shipped reference list; pass ``{}`` to skip that check.
    """
    valid, problems = _coerce(levers)
    for lever in valid:
        problems.extend(_record_problems(lever))
        problems.extend(_target_problems(lever))

    for ident, count in Counter(lever.id for lever in valid).items():
        if count > 1:
            problems.append(f"duplicate id {ident!r} ({count} levers)")
    names_by_stratum = {stratum: [lv.name for lv in group] for stratum, group in levers_by_stratum(valid).items()}
    for (cls, intensity), names in names_by_stratum.items():
        for name, count in Counter(names).items():
            if count > 1:
                problems.append(f"duplicate name {name!r} in {cls}/{intensity} ({count} levers)")

    for cls, intensity in STRATA:
        count = len(names_by_stratum.get((cls, intensity), []))
        if count < min_per_stratum:
            problems.append(f"stratum {cls}/{intensity} has {count} levers; at least {min_per_stratum} needed")

    reference = load_reference_names() if reference_names is None else reference_names
    for (cls, intensity), wanted in reference.items():
        present = set(names_by_stratum.get((cls, intensity), []))
        for name in wanted:
            if name not in present:
                elsewhere = [f"{c}/{i}" for (c, i), names in names_by_stratum.items() if name in names]
                hint = f" (found in {', '.join(elsewhere)})" if elsewhere else ""
                problems.append(f"stratum {cls}/{intensity} lacks reference lever {name!r}{hint}")
    return problems


# ----------------------------------------------------------------- hashing and slicing


def catalogue_hash(levers: Sequence[Lever]) -> str:
    """sha256 of the catalogue's canonical JSON: levers sorted by id, keys sorted, compact."""

    def canonical(lever: Lever) -> str:
        return json.dumps(lever.model_dump(mode="json"), sort_keys=True, ensure_ascii=False, separators=(",", ":"))

    # the id first, the whole record second: a stable order even when ids collide
    records = sorted((lever.id, canonical(lever)) for lever in levers)
    blob = "[" + ",".join(record for _, record in records) + "]"
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def filter_levers(
    levers: Sequence[Lever],
    classes: Sequence[str] | None = None,
    intensities: Sequence[str] | None = None,
) -> list[Lever]:
    """The levers of the given classes and intensities (None = all), in their input order.

    Names are read by ``taxonomy.parse_class`` / ``parse_intensity`` (any case, ``P-`` optional).
    An unknown name raises ``UnknownName`` (a ValueError): a typo must not silently select nothing.
    """
    if classes is not None:
        classes = [parse_class(c) for c in classes]
    if intensities is not None:
        intensities = [parse_intensity(i) for i in intensities]
    return [
        lever
        for lever in levers
        if (classes is None or lever.perturbation_class in classes)
        and (intensities is None or lever.intensity in intensities)
    ]


def levers_by_stratum(levers: Iterable[Lever]) -> dict[Stratum, list[Lever]]:
    """Levers grouped by (class, intensity): only non-empty strata, in taxonomy order, each group
    sorted by id so that the order the levers were read in does not matter (the lever draw,
    ``assign.assign_levers``, shuffles each group from this order)."""
    groups: dict[Stratum, list[Lever]] = {}
    for lever in levers:
        groups.setdefault((lever.perturbation_class, lever.intensity), []).append(lever)
    for group in groups.values():
        group.sort(key=lambda lever: lever.id)
    return {stratum: groups[stratum] for stratum in STRATA if stratum in groups}


def catalogue_listing(levers: Sequence[Lever]) -> list[dict[str, Any]]:
    """JSON-ready rows for ``levers list --format json``: every field plus ``expected``."""
    return [{**lever.model_dump(mode="json"), "expected": lever.expected} for lever in levers]
