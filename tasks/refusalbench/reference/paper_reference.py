"""The paper's reported figures, shipped as reference data: loaded, validated, matched to a run's models.

``paper_reference.yaml`` beside this module holds one record per figure the RefusalBench paper
states about its own runs (its items, its judge, its sampling), each with the section, table or
figure it comes from, and the table of the paper's model names with their aliases. The numbers are
kept as the paper prints them (``73.0``, ``0.580``): a figure shows its own text, never a value
rounded again. Nothing here is a metric of a user's run: metrics.json never holds these.

- :func:`load_reference`: the file, validated into :class:`PaperReference` (a bad record raises a
  ``ValueError`` naming its index and field)
- :meth:`PaperReference.match`: the paper's model a user's model string names (``model_names``)
- :meth:`PaperReference.beside`: the figures of one paper model on one benchmark, by metric, that
  a leaderboard can show beside the user's values
- :func:`run_dataset`: the benchmark a run's model was scored on, from metrics.json's
  ``multi_document`` block (single-document items: NQ; multi-document items: GaRAGe)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from refusalbench.tasks.refusalbench.reference.model_names import alias_index, normalise

FILE = "paper_reference.yaml"
DATASET_NAMES = {
    "nq": "RefusalBench-NQ",
    "garage": "RefusalBench-GaRAGe",
    "both": "both benchmarks",
    "method": "method",
}
LABEL = "as reported in the paper"
_PRINTED = re.compile(r"^-?\d+(?:\.\d+)?$")


# libyaml's parser where PyYAML was built with it (its wheels are): the pure-Python one took ~0.15 s
# of each report's CPU for this file.
_SafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _PrintedLoader(_SafeLoader):  # type: ignore[misc]  # yaml has no type information here
    """YAML whose numbers stay the text they were written as (``0.580`` keeps its last zero)."""


def _printed(loader: Any, node: yaml.ScalarNode) -> str:
    return str(node.value)


_PrintedLoader.add_constructor("tag:yaml.org,2002:float", _printed)
_PrintedLoader.add_constructor("tag:yaml.org,2002:int", _printed)


class PaperFigure(BaseModel):
    """One figure of the paper: what it measures, on which benchmark and model, its value and source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Literal["nq", "garage", "both", "method"]
    model: str | None = Field(description="the paper's model name; None for a figure about no one model")
    metric: str = Field(min_length=1, description="the metrics.json name where the project has one")
    value: str | tuple[str, str] = Field(description="as printed; [low, high] for a range")
    unit: Literal["percent", "pp", "score", "r", "ratio", "count"]
    comparator: Literal["<", ">", "range"] | None = None
    subset: str | None = None
    source: str = Field(min_length=1, description="section, appendix, table or figure of the paper")
    description: str = Field(min_length=1)

    @field_validator("value", mode="before")
    @classmethod
    def _numbers(cls, value: Any) -> Any:
        texts = value if isinstance(value, (list, tuple)) else [value]
        for text in texts:
            if not isinstance(text, str) or not _PRINTED.match(text):
                raise ValueError(f"{text!r} is not a number as printed")
        return tuple(value) if isinstance(value, (list, tuple)) else value

    @model_validator(mode="after")
    def _range(self) -> PaperFigure:
        if (self.comparator == "range") != isinstance(self.value, tuple):
            raise ValueError("a range has comparator: range and a [low, high] value; nothing else has two values")
        return self

    @property
    def number(self) -> float:
        """The value as a number (a range: its low end)."""
        return float(self.value[0] if isinstance(self.value, tuple) else self.value)

    def text(self) -> str:
        """The figure as a reader sees it: ``73.0%``, ``> 60%``, ``0.226–0.519``, ``r = -0.78``."""
        shown = "–".join(self.value) if isinstance(self.value, tuple) else self.value
        shown += {"percent": "%", "pp": " pp", "ratio": "×"}.get(self.unit, "")
        if self.unit == "r":
            shown = f"r = {shown}"
        return f"{self.comparator} {shown}" if self.comparator in ("<", ">") else shown

    @property
    def whole_model(self) -> bool:
        """A figure about one model on a whole benchmark (no class, domain or budget slice)."""
        return self.model is not None and self.subset is None


class PaperReference(BaseModel):
    """Every figure of the paper and its model-name table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: dict[str, tuple[str, ...]]
    figures: tuple[PaperFigure, ...]

    @model_validator(mode="after")
    def _known_models(self) -> PaperReference:
        alias_index(self.models)  # two models sharing an alias: ValueError
        for index, figure in enumerate(self.figures):
            if figure.model is not None and figure.model not in self.models:
                raise ValueError(f"figures[{index}]: model {figure.model!r} is not in the models table")
        return self

    @functools.cached_property
    def _index(self) -> dict[str, str]:
        return alias_index(self.models)

    def match(self, model: str) -> str | None:
        """The paper's name of the model a user's ``model`` string names, or None."""
        return self._index.get(normalise(model))

    def beside(self, paper_model: str, dataset: str, metrics: Sequence[str] | None = None) -> dict[str, PaperFigure]:
        """{metric: figure}: the paper's whole-benchmark figures of ``paper_model`` on ``dataset``
        (``nq`` or ``garage``), limited to ``metrics`` when given. Where the paper states a metric
        twice (a bound in the text, the exact value in an appendix), the exact value wins."""
        found: dict[str, PaperFigure] = {}
        for figure in self.figures:
            if figure.model != paper_model or figure.dataset != dataset or not figure.whole_model:
                continue
            if metrics is not None and figure.metric not in metrics:
                continue
            if figure.metric not in found or found[figure.metric].comparator is not None:
                found[figure.metric] = figure
        return found


@functools.cache
def load_reference() -> PaperReference:
    """The shipped reference figures, validated (read once per process)."""
    text = resources.files("refusalbench.tasks.refusalbench.reference").joinpath(FILE).read_text(encoding="utf-8")
    return parse_reference(text)


def parse_reference(text: str) -> PaperReference:
    """A reference file's text, validated; a ValueError names the first bad record and field."""
    raw = yaml.load(text, Loader=_PrintedLoader)  # noqa: S506 - a SafeLoader subclass
    try:
        return PaperReference.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{FILE}: {where}: {first['msg']}") from None


def run_dataset(
    model: str, scored: Mapping[str, Any], multi_document: Mapping[str, Mapping[str, Any]] | None
) -> str | None:
    """The benchmark ``model`` was scored on: ``nq`` (single-document items only), ``garage``
    (multi-document items only) or None (a mix of both, or nothing scored), from its metrics
    (``scored``: metrics.json's ``models[model]``, whose ``n`` counts its scored rows) and
    metrics.json's ``multi_document`` block."""
    counts = (multi_document or {}).get(model)
    if not counts:
        return "nq"
    n = scored.get("n")
    items = counts.get("n_items")
    if n is None or items is None:
        return None
    return "garage" if int(items) >= int(n) > 0 else None


def matched_figures(
    models: Mapping[str, Mapping[str, Any]],
    multi_document: Mapping[str, Mapping[str, Any]] | None,
    metrics: Sequence[str],
    reference: PaperReference | None = None,
) -> dict[str, tuple[str, str, dict[str, PaperFigure]]]:
    """{user model: (paper model, dataset, {metric: figure})} for every model of a run that names a
    paper model and has a paper figure among ``metrics`` on the benchmark it was scored on."""
    reference = reference or load_reference()
    out: dict[str, tuple[str, str, dict[str, PaperFigure]]] = {}
    for model, values in models.items():
        paper = reference.match(model)
        dataset = run_dataset(model, values, multi_document) if paper else None
        if paper is None or dataset is None:
            continue
        figures = reference.beside(paper, dataset, metrics)
        if figures:
            out[model] = (paper, dataset, figures)
    return out
