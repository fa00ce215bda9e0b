"""``${NAME}`` and ``${NAME:-default}`` in config values, expanded from the environment.

One config then serves every place it runs: ``api_base: ${REFUSALBENCH_MODELS_URL:-http://models:8080/v1}``
reaches the compose network's model server by default and whatever the local cluster exports
otherwise. The rules are the shell's (and Compose's) for these two forms: ``:-`` takes the default
when the variable is unset or empty; ``${NAME}`` with the variable unset or empty is an error, never
an empty URL. Nothing else is special: a ``$`` not followed by ``{`` stays as written.

A model config keeps its ``api_base`` as written beside the expanded one (``ExpandedApiBase``): calls
go to the expanded address, the call cache keys on the written one, so one deployment keeps its cache
when the same config runs where the variable says another address (compose, the local cluster).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, PrivateAttr, field_validator, model_validator

_REFERENCE = re.compile(r"\$\{(?P<body>[^}]*)\}")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_FORM = re.compile(rf"(?P<name>{_NAME})(?::-(?P<default>.*))?", re.DOTALL)


def has_references(value: str) -> bool:
    """Whether ``value`` names an environment variable (``${...}``)."""
    return "${" in value


def expand_env(value: str, environ: Mapping[str, str] | None = None) -> str:
    """``value`` with every ``${NAME}`` / ``${NAME:-default}`` replaced from ``environ`` (default: os.environ).

    Raises ValueError naming the variable when one without a default is unset or empty, or
    naming the reference when it is not one of the two forms (``${}``, ``${1X}``, an unclosed ``${``).
    """
    env = os.environ if environ is None else environ

    def substitute(match: re.Match[str]) -> str:
        form = _FORM.fullmatch(match.group("body"))
        if form is None:
            raise ValueError(f"{match.group(0)!r} is not ${{NAME}} or ${{NAME:-default}}")
        found = env.get(form.group("name"))
        if found:
            return found
        if form.group("default") is not None:
            return form.group("default")
        name = form.group("name")
        raise ValueError(f"environment variable {name} is not set (give a default: ${{{name}:-...}})")

    expanded = _REFERENCE.sub(substitute, value)
    if "${" in _REFERENCE.sub("", value):
        raise ValueError(f"unclosed '${{' in {value!r}")
    return expanded


def expand_references(value: str | None) -> str | None:
    """``value`` expanded when it names variables (None and plain strings unchanged): a config field's validator."""
    return expand_env(value) if value and has_references(value) else value


class ExpandedApiBase(BaseModel):
    """A model config's ``api_base``, expanded when validated, that remembers how it was written."""

    if TYPE_CHECKING:
        # The field itself is declared by the model that mixes this in (ModelConfig); declaring it here
        # at run time would make it a field of the mixin.
        api_base: str | None

    # (api_base as written, what it expanded to) when it named environment variables.
    _api_base_expansion: tuple[str, str] | None = PrivateAttr(default=None)
    _expand_api_base = field_validator("api_base", check_fields=False)(expand_references)

    @model_validator(mode="wrap")
    @classmethod
    def _remember_written_api_base(cls, data: Any, handler: Any) -> Any:
        model = handler(data)
        written = data.get("api_base") if isinstance(data, dict) else None
        if isinstance(written, str) and written != model.api_base:
            model._api_base_expansion = (written, model.api_base)
        return model

    @property
    def api_base_as_written(self) -> str | None:
        """``api_base`` as the config wrote it (``${NAME:-default}`` unexpanded): the deployment the config
        names wherever it runs. The call cache keys on this (tasks/llm/endpoints.py); calls go to ``api_base``.
        A copy given another ``api_base`` (a local server the run started) is that one, as written."""
        expansion = self._api_base_expansion
        return expansion[0] if expansion is not None and expansion[1] == self.api_base else self.api_base
