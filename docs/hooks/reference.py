"""MkDocs hook: the reference pages are generated from the code at every build.

A page asks for generated content with a marker line, ``<!-- generated: NAME -->``, which is
replaced by the markdown of :data:`GENERATORS`:

- ``cli``: every command of the ``refusalbench`` Typer app, its help and its options;
- ``config``: every key of the run config, from the pydantic models' JSON Schema;
- ``run-folder``: every file of a run folder, from the artifact declarations.

The site also gets ``schema/config.schema.json``, the JSON Schema a YAML editor validates run
configs with; ``scripts/config_schema.py`` writes the same file into the checkout.

The project is imported by its installed names inside the functions, so that MkDocs loads this
file (and a test imports it) without importing the project at module level.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

MARKER = re.compile(r"^<!--\s*generated:\s*([a-z-]+)\s*-->\s*$", re.MULTILINE)
SCHEMA_PATH = "schema/config.schema.json"


# ---------------------------------------------------------------- the command line


def _cell(text: str) -> str:
    """One table cell: a single line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    """A parameter's default as a user types it; empty when there is nothing worth showing."""
    value = param.default
    if callable(value) or value is None or getattr(param, "is_flag", False) or param.multiple:
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value}`" if value != "" else ""


def _param_row(param: Any) -> str:
    if param.param_type_name == "argument":
        name = f"`{param.name.upper()}`" + (" …" if param.nargs == -1 else "")
    else:
        name = ", ".join(f"`{opt}`" for opt in [*param.opts, *param.secondary_opts])
    notes = []
    if param.required:
        notes.append("required")
    if param.multiple:
        notes.append("repeatable")
    help_text = getattr(param, "help", None) or ""
    if notes:
        help_text = f"{help_text} ({', '.join(notes)})" if help_text else ", ".join(notes)
    return f"| {name} | {_default(param)} | {_cell(help_text)} |"


def _command_markdown(path: tuple[str, ...], command: Any) -> list[str]:
    lines = ["", f"### `refusalbench {' '.join(path)}`", ""]
    if command.help:
        lines += [paragraph.strip() for paragraph in command.help.split("\n\n")]
        lines.append("")
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name != "argument"]
    usage = " ".join(["refusalbench", *path, *(p.name.upper() + ("..." if p.nargs == -1 else "") for p in arguments)])
    lines += ["```", usage + (" [OPTIONS]" if options else ""), "```"]
    if command.params:
        lines += ["", "| argument / option | default | what it does |", "|---|---|---|"]
        lines += [_param_row(p) for p in [*arguments, *options]]
    return lines


def _group_markdown(path: tuple[str, ...], group: Any) -> list[str]:
    """A command group's commands, nested groups' commands after a line of their help."""
    lines: list[str] = []
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        if hasattr(command, "commands"):
            lines += ["", f"`refusalbench {' '.join((*path, name))}`: {_cell(command.help or '')}"]
            lines += _group_markdown((*path, name), command)
        else:
            lines += _command_markdown((*path, name), command)
    return lines


def cli_markdown() -> str:
    """Every command of the ``refusalbench`` command line, with its help and its options."""
    import typer.main

    from refusalbench.flows.cli import app

    root: Any = typer.main.get_command(app)
    plain = {name: command for name, command in root.commands.items() if not hasattr(command, "commands")}
    groups = {name: command for name, command in root.commands.items() if hasattr(command, "commands")}
    lines = [
        f"`refusalbench`: {_cell(root.help or '')}",
        "",
        "Options of `refusalbench` itself, given before the command:",
        "",
        "| option | default | what it does |",
        "|---|---|---|",
    ]
    lines += [_param_row(p) for p in root.params]
    lines += ["", "## Running and scoring"]
    for name, command in plain.items():
        lines += _command_markdown((name,), command)
    for name, group in groups.items():
        lines += ["", f"## `refusalbench {name}`", "", _cell(group.help or "")]
        lines += _group_markdown((name,), group)
    return "\n".join(lines)


# ---------------------------------------------------------------- the run config


def config_schema() -> dict[str, Any]:
    """The run config's JSON Schema for editors: what ``RunConfig`` accepts, plus ``include:``.

    ``required`` lists are left out: a config that includes another may give only the keys it
    overrides (``models: {gpt-4o: {rpm: 500}}``), which only the merged file must complete, and
    the loader checks that merged file. Fields the loader sets itself are left out too.
    """
    from refusalbench.tasks.core.config import RunConfig

    schema = RunConfig.model_json_schema()
    for name, field in RunConfig.model_fields.items():
        if field.exclude:
            schema["properties"].pop(name, None)

    def relax(node: Any) -> None:
        if isinstance(node, dict):
            node.pop("required", None)
            for value in node.values():
                relax(value)
        elif isinstance(node, list):
            for value in node:
                relax(value)

    relax(schema)
    schema["properties"] = {
        "include": {
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
            "description": "other config files merged under this one (paths relative to this file); "
            "this file's keys win",
        },
        **schema["properties"],
    }
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "RefusalBench run config", **schema}


def config_schema_text() -> str:
    return json.dumps(config_schema(), indent=2, sort_keys=False) + "\n"


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A short human form of a JSON Schema type."""
    if "$ref" in node:
        return "section"
    if "anyOf" in node:
        kinds = [_type(option, defs) for option in node["anyOf"] if option.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds)) or "null"
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type")
    if kind == "array":
        return f"list of {_type(node.get('items', {}), defs)}"
    if kind == "object":
        inner = node.get("additionalProperties")
        return f"map of name → {_type(inner, defs)}" if isinstance(inner, dict) else "mapping"
    return {"string": "text", "integer": "integer", "number": "number", "boolean": "true/false"}.get(kind or "", "any")


def _refs(node: Any) -> Iterator[str]:
    """The ``$defs`` names a property refers to, directly or inside anyOf / items / maps."""
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"].rsplit("/", 1)[-1]
        for key in ("anyOf", "items", "additionalProperties"):
            value = node.get(key)
            for item in value if isinstance(value, list) else [value]:
                yield from _refs(item)


def _bounds(node: dict[str, Any]) -> str:
    options = [node, *node.get("anyOf", [])]
    words = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<", "minItems": "items ≥"}
    found = [f"{words[key]} {option[key]}" for option in options for key in words if key in option]
    return f" ({', '.join(found)})" if found else ""


# What the configuration models leave without a description, said here for the reference page.
KEY_NOTES: dict[tuple[str, str], str] = {
    ("top level", "name"): "the run's name, recorded in the manifest and shown in the report",
    ("top level", "models"): "the model registry: a name of your choosing per model, referred to by the other sections",
    ("top level", "generation"): "the generation flow: base set, generators, verifiers, filter, sampling",
    ("top level", "evaluation"): "the evaluation flow: targets, judge, decision, calibration pass",
    ("top level", "knowornot"): "the KnowOrNot pipeline",
    ("top level", "cache"): "the persistent call cache",
    ("top level", "refresh"): "the statistics of refresh rounds",
    ("top level", "runner"): "Prefect's task runner: threads in the flow's process, or a Dask cluster",
    ("top level", "skip_unavailable"): "skip models without a key or reachable endpoint (with a warning) instead of "
    "refusing the config",
    ("models.NAME", "api_base"): "the endpoint, e.g. a self-hosted OpenAI-compatible server's /v1 URL; "
    "${NAME} and ${NAME:-default} are read from the environment",
    ("models.NAME", "max_concurrency"): "calls to this model in flight at once",
    ("models.NAME", "rpm"): "requests per minute",
    ("models.NAME", "params"): "sent with every call: temperature, max_tokens, top_p, ...",
    ("models.NAME", "timeout_s"): "seconds one call may take",
    ("models.NAME", "max_attempts"): "tries on server errors and timeouts, with backoff and jitter",
    ("models.NAME", "local"): "a local GGUF model: where its weights come from (refusalbench models pull)",
    ("models.NAME", "batch"): "how a model in batch mode polls and waits",
    ("models.NAME", "description"): "free text, shown by refusalbench models list",
    ("models.NAME", "extra_headers"): "HTTP headers sent with every call (those selecting a deployment are part "
    "of the cache key; credential headers are not)",
    ("generation", "base_set"): "the base set: JSONL, Parquet or CSV (see the base-set format)",
    ("generation", "generators"): "models that write the perturbations (rules: the rule-based generator)",
    ("generation", "verifiers"): "models that check every pre-checked candidate",
    ("generation", "filter"): "which verified candidates may enter the benchmark: every verifier passes it, "
    "a majority does, or none (verdicts recorded only)",
    ("generation", "verification"): "ask every verifier, or stop at the first FAIL",
    ("generation", "seed"): "the seed of the base sample, the lever assignment and the sampling",
    ("generation", "levers_per_stratum"): "levers assigned per base item and stratum",
    (
        "generation",
        "shard_size",
    ): "rows per Prefect task; left out, sized from the models' max_concurrency (at least the default)",
    ("evaluation", "targets"): "the models measured",
    ("evaluation", "judge"): "the model that grades answers (and, with decision: judge, classifies every reply)",
    ("evaluation", "confidence"): "add the calibration pass: every item asked again with a confidence level; ECE "
    "comes from it",
    (
        "evaluation",
        "shard_size",
    ): "rows per Prefect task; left out, sized from the models' max_concurrency (at least the default)",
    ("evaluation", "bootstrap"): "bootstrap resamples for the intervals (0: none)",
    ("evaluation", "seed"): "the bootstrap's seed",
    ("knowornot", "documents"): "files or folders of .txt, .md, .pdf, .html documents",
    ("knowornot", "qa_pairs"): "a QA file instead of documents: one {id, question, answer} per line",
    ("knowornot", "prompts"): "the system prompts to compare",
    ("knowornot", "targets"): "the models measured",
    ("knowornot", "evaluator"): "the model that labels abstention, factuality and the config's own specs",
    ("knowornot", "k"): "pairs retrieved per question by basic_rag and hyde_rag",
    ("knowornot", "filters"): "the diversity filters applied to the QA pairs",
    ("knowornot", "keyword_threshold"): "threshold of the keyword (TF-IDF) diversity filter",
    ("knowornot", "semantic_threshold"): "threshold of the semantic (embedding) diversity filter",
    ("knowornot", "max_questions"): "evaluate at most this many questions",
    ("knowornot", "hyde_answers"): "hypothetical answers written per question for hyde_rag",
    ("knowornot", "seed"): "the seed of sampling and the bootstrap",
    ("knowornot", "shard_size"): "rows per Prefect task",
}


def config_markdown() -> str:
    """Every key of the run config, section by section, from the pydantic models' JSON Schema."""
    from refusalbench.tasks.core.config import RunConfig

    schema = RunConfig.model_json_schema()
    defs = schema.get("$defs", {})
    for name, field in RunConfig.model_fields.items():
        if field.exclude:
            schema["properties"].pop(name, None)
    sections: list[tuple[str, dict[str, Any]]] = [("top level", schema)]
    seen: set[str] = set()
    queue: list[tuple[str, dict[str, Any]]] = [("", schema)]
    while queue:
        prefix, node = queue.pop(0)
        for key, prop in node.get("properties", {}).items():
            for ref in _refs(prop):
                if ref in seen:
                    continue
                seen.add(ref)
                many = (
                    "additionalProperties" in prop
                    or "items" in prop
                    or any("items" in option or "additionalProperties" in option for option in prop.get("anyOf", []))
                )
                path = f"{prefix}{key}" + ("[…]" if "items" in json.dumps(prop) and many else ".NAME" if many else "")
                sections.append((path, defs[ref]))
                queue.append((path + ".", defs[ref]))
    lines: list[str] = []
    for path, node in sections:
        title = "Top level" if path == "top level" else f"`{path}`"
        lines += ["", f"## {title}", ""]
        if node.get("description") and path != "top level":
            lines += [_cell(node["description"]), ""]
        required = set(node.get("required", []))
        lines += ["| key | type | default | what it is |", "|---|---|---|---|"]
        if path == "top level":
            lines.append(
                "| `include` | text or list of text | | other config files merged under this one "
                "(paths relative to this file); this file's keys win |"
            )
        for key, prop in node.get("properties", {}).items():
            default = (
                "required"
                if key in required
                else (
                    f"`{json.dumps(prop['default'])}`"
                    if "default" in prop and prop["default"] not in (None, {}, [])
                    else ""
                )
            )
            about = prop.get("description") or KEY_NOTES.get(("top level" if path == "top level" else path, key), "")
            lines.append(f"| `{key}` | {_type(prop, defs)}{_bounds(prop)} | {default} | {_cell(about)} |")
    return "\n".join(lines).strip()


# ---------------------------------------------------------------- the run folder


def run_folder_markdown() -> str:
    """The run folder's files, from their one declaration."""
    from refusalbench.tasks.pipeline.runfolder_doc import runfolder_markdown

    return str(runfolder_markdown())


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "config": config_markdown,
    "run-folder": run_folder_markdown,
}


def render(markdown: str) -> str:
    """``markdown`` with every generated-content marker replaced (KeyError for an unknown one)."""
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)


# ---------------------------------------------------------------- MkDocs events


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    try:
        return str(render(markdown))
    except KeyError as exc:
        raise ValueError(
            f"{page.file.src_uri}: unknown generated section {exc}; known: {', '.join(GENERATORS)}"
        ) from None


def on_files(files: Any, config: Any) -> Any:
    """Serve the schema as the code declares it now (it replaces the checked-in copy in the site)."""
    from mkdocs.structure.files import File

    existing = files.get_file_from_path(SCHEMA_PATH)
    if existing is not None:
        files.remove(existing)
    files.append(File.generated(config, SCHEMA_PATH, content=config_schema_text()))
    return files
