"""Every problem of a run config at once: each at the file and line of its key, with a "did you mean".

``core/config.py`` asks for three kinds: pydantic's errors (all of them, not the first), the model
names the sections refer to (checked on the raw document, so they are found even when another
key fails validation) and the local files the config names (``refusalbench config validate``).
Nothing here calls a model or reads more than a file's existence.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from refusalbench.tasks.core.config_files import Located
from refusalbench.tasks.core.errors import InputError, closest_names

# The keys whose values are names of the ``models:`` registry, in the order ``RunConfig.referenced_models``
# lists them (a string or a list of strings each).
MODEL_REFERENCES: tuple[str, ...] = (
    "generation.generators",
    "generation.verifiers",
    "generation.pretest.models",
    "generation.pretest.judge",
    "evaluation.targets",
    "evaluation.judge",
    "knowornot.targets",
    "knowornot.evaluator",
    "knowornot.extractor",
    "knowornot.evaluator_comparison",
    "knowornot.embedding_model",
)
RULES_PROVIDER = "rules/"  # a model entry that is the rule-based generator (``model: rules/<set>``)


def did_you_mean(word: object, choices: Iterable[str], n: int = 3) -> str:
    """``; did you mean 'x'?`` (or ``'x' or 'y'``) for the closest of ``choices``; "" when none is close.
    At most ``n`` names: a long list of valid names is never dumped whole."""
    close = closest_names(str(word), choices, n)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    listed = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
    return f"; did you mean {listed}?"


# ---------------------------------------------------------------- model names


def _at(node: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, Mapping) else getattr(node, key, None)
        if node is None:
            return None
    return node


def model_references(root: Any) -> list[tuple[str, int | None, str]]:
    """(key path, list index or None, model name) for every registry name ``root`` refers to; ``root`` is a
    validated config or the raw document (whatever is not a string or a list of strings is skipped)."""
    refs: list[tuple[str, int | None, str]] = []
    for where in MODEL_REFERENCES:
        value = _at(root, where)
        if isinstance(value, str):
            refs.append((where, None, value))
        elif isinstance(value, list):
            refs += [(where, i, name) for i, name in enumerate(value) if isinstance(name, str)]
    return refs


def reference_problems(data: Mapping[str, Any], located: Located) -> list[InputError]:
    """Names that are not in the document's ``models:``, and the rule-based generator used elsewhere
    than as a generator: one error each, at the line of the name, with the closest registry names."""
    models = data.get("models", {})
    if not isinstance(models, Mapping):
        return []  # pydantic reports the section itself
    problems: list[InputError] = []
    for where, index, name in model_references(data):
        path = (*where.split("."), *(() if index is None else (index,)))
        file, line = located.find(path)
        if name not in models:
            hint = did_you_mean(name, models) or " (no registry name is close; `refusalbench models list` lists them)"
            problems.append(InputError(file, f"model {name!r} is not in the registry{hint}", line=line, field=where))
            continue
        entry = models[name]
        model = entry.get("model") if isinstance(entry, Mapping) else None
        if where != "generation.generators" and isinstance(model, str) and model.startswith(RULES_PROVIDER):
            problem = f"{name!r} is the rule-based generator; list it only under generation.generators"
            problems.append(InputError(file, problem, line=line, field=where))
    return problems


# ---------------------------------------------------------------- pydantic's errors


def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of an ``X | Y`` / ``Optional[X]`` annotation (itself otherwise)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _fields_at(root: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The keys the section at ``path`` accepts (its model's fields); [] when it is not a model."""
    current: list[Any] = [root]
    for part in path:
        following: list[Any] = []
        for annotation in (a for c in current for a in _unwrap(c)):
            origin = typing.get_origin(annotation)
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                if isinstance(part, str) and part in annotation.model_fields:
                    following.append(annotation.model_fields[part].annotation)
            elif origin is dict and isinstance(part, str):
                following.append(typing.get_args(annotation)[1])
            elif origin is list and isinstance(part, int):
                following.append(typing.get_args(annotation)[0])
        current = following
    for annotation in (a for c in current for a in _unwrap(c)):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return list(annotation.model_fields)
    return []


def _data_path(data: Any, loc: tuple[Any, ...], *, keep_last: bool) -> tuple[Any, ...]:
    """``loc`` without pydantic's own parts (a union member's tag such as ``literal['a','b']``): the key path
    as written in the document. ``keep_last``: the final key need not be there (a missing key)."""
    path: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif keep_last and i == len(loc) - 1:
            pass
        else:
            continue
        path.append(part)
    return tuple(path)


def _choices(expected: str) -> list[str]:
    """The values named by pydantic's ``expected`` text: ``'a', 'b' or 'c'``."""
    return re.findall(r"'([^']*)'", expected)


def validation_problems(
    exc: ValidationError, located: Located, data: Mapping[str, Any], root: type[BaseModel]
) -> list[InputError]:
    """Every error pydantic found, one per key as written, each at the file and line of its key."""
    problems: list[InputError] = []
    seen: set[tuple[Any, ...]] = set()
    for err in exc.errors():
        kind = err["type"]
        loc = tuple(err.get("loc", ()))
        path = _data_path(data, loc, keep_last=kind == "missing")
        if path in seen:
            continue  # another member of the same union rejected the same value
        seen.add(path)
        field = ".".join(str(p) for p in path) or "-"
        file, line = located.find(path)
        if kind == "extra_forbidden":
            problem = f"unknown key {path[-1]!r}" + did_you_mean(path[-1], _fields_at(root, path[:-1]))
        elif kind == "missing":
            problem = "required key missing"
            file, line = located.find(path[:-1])
        elif kind in ("literal_error", "enum"):
            expected = (err.get("ctx") or {}).get("expected", "")
            problem = f"{err['msg']} (got {err['input']!r})" + did_you_mean(err["input"], _choices(expected))
        else:
            problem = err["msg"].removeprefix("Value error, ")
            # Whole-config checks name the key they concern as "key.path: problem".
            head, separator, rest = problem.partition(": ")
            if not path and separator and re.fullmatch(r"[A-Za-z_][\w.]*", head):
                field, problem = head, rest
                file, line = located.find(tuple(head.split(".")))
        problems.append(InputError(file, problem, line=line, field=field))
    return problems


# ---------------------------------------------------------------- files


def _file_keys(data: Any) -> list[tuple[tuple[Any, ...], str]]:
    """(key path, value) of every file a config (validated, or the raw document) names as input."""
    found: list[tuple[tuple[Any, ...], str]] = []

    def add(path: tuple[Any, ...], value: Any) -> None:
        if isinstance(value, str):
            found.append((path, value))
        elif isinstance(value, list):
            found.extend((path + (i,), v) for i, v in enumerate(value) if isinstance(v, str))

    add(("generation", "base_set"), _at(data, "generation.base_set"))
    for key in ("documents", "qa_pairs"):
        add(("knowornot", key), _at(data, f"knowornot.{key}"))
    bases = _at(data, "knowornot.knowledge_bases")
    for i, base in enumerate(bases if isinstance(bases, list) else []):
        for key in ("documents", "qa_pairs"):
            add(("knowornot", "knowledge_bases", i, key), _at(base, key))
    return found


def missing_file_problems(data: Any, located: Located, source: Path) -> list[InputError]:
    """The local files a config (validated, or the raw document) names that do not exist, resolved as ``RunConfig.resolve_path`` does
    (beside the config file, then the working directory); URLs and glob patterns are left to the run."""
    problems: list[InputError] = []
    for path, value in _file_keys(data):
        if "://" in value or any(c in value for c in "*?["):
            continue
        if (source.parent / value).exists() or Path(value).exists():
            continue
        file, line = located.find(path)
        field = ".".join(str(p) for p in path if not isinstance(p, int))
        problems.append(InputError(file, f"file not found: {value}", line=line, field=field))
    return problems


def ordered(problems: list[InputError], top: str) -> list[InputError]:
    """The top config's problems first, then each included file's, each by line."""
    return sorted(problems, key=lambda p: (p.file != top, p.file, p.line or 0))
