"""Which model of the paper a user's model string names: ``anthropic/claude-sonnet-4-20250514`` ->
``Claude-4-Sonnet``.

Both the user's string and every alias go through :func:`normalise`, and a model matches when the
two are equal, so a sibling (``gpt-4o-mini``, ``claude-sonnet-4-5``) never matches by prefix.
Normalising drops what says where or when a model was served rather than which model it is: the
provider route (``bedrock/``, ``openrouter/anthropic/``, a Hugging Face organisation), a region and
vendor prefix (``us.anthropic.``), a version suffix (``-v1:0``, ``@20250514``, ``-latest``),
snapshot dates (``-20250514``, ``-2024-08-06``, OLMo's ``-1124-``), case and separators.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# A region and the vendors whose Bedrock ids carry a dotted prefix before the model's own name.
# DeepSeek is not dropped: its Bedrock id (``deepseek.r1``) names the model through the vendor.
_REGION = re.compile(r"^(?:us|eu|apac|global|us-gov)\.")
_VENDOR = re.compile(r"^(?:anthropic|amazon|meta|openai|google|mistral|cohere)\.")
_SUFFIXES = (
    re.compile(r"@.*$"),  # Vertex AI's model@version
    re.compile(r"-v\d+(?::\d+)?$"),  # Bedrock's -v1:0
    re.compile(r":\d+$"),
    re.compile(r"-latest$"),
)
_DATES = (
    re.compile(r"[-_]?\d{4}-\d{2}-\d{2}"),  # 2024-08-06
    re.compile(r"[-_]?\d{8}(?=[-_:@.]|$)"),  # 20250514
    re.compile(r"-\d{4}(?=-|$)"),  # a month and year between dashes: OLMo's -1124-
)
_SEPARATORS = re.compile(r"[\s._:/-]+")


def normalise(model: str) -> str:
    """The part of ``model`` that names the model: lower case, no route, vendor, version, date or separator."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    name = _VENDOR.sub("", _REGION.sub("", name))
    for suffix in _SUFFIXES:
        name = suffix.sub("", name)
    for date in _DATES:
        name = date.sub("", name)
    return _SEPARATORS.sub("", name)


def alias_index(aliases: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """{normalised alias: paper name} over every alias and every paper name itself.

    Two paper models sharing a normalised alias would make a match depend on the file's order: a
    ValueError names both."""
    index: dict[str, str] = {}
    for paper_name, names in aliases.items():
        for alias in (paper_name, *names):
            key = normalise(alias)
            if index.get(key, paper_name) != paper_name:
                raise ValueError(f"alias {alias!r} names both {index[key]} and {paper_name}")
            index[key] = paper_name
    return index


def paper_model(model: str, aliases: Mapping[str, Sequence[str]]) -> str | None:
    """The paper's name of the model ``model`` names, or None when it is none of the paper's models."""
    return alias_index(aliases).get(normalise(model))
