"""How long the call cache serves each role's replies: the config's ``cache.policy``.

A role is what a call is for: ``generation`` (generate and verify), ``pretest`` (the pre-test's
answers and their judging), ``targets`` (the evaluated models' answers) and ``judge`` (the
evaluation's judge). Each role has a scope:

- ``forever``: a cached reply serves every later run (a re-run or a resume repeats nothing);
- ``round``: the round id is part of the call's key, so a new refresh round asks again while a
  resumed round still repeats nothing;
- ``ttl: <duration>`` (``7d``, ``12h``, ``30m``): a cached reply serves calls while it is younger.

A role the config leaves out takes the default of the run's kind: a refresh round asks the
generators, the pre-test and the targets again every round and keeps the judge's replies
forever; any other run keeps everything forever. The run itself adds its round id
(``cache.round``, set by the refresh flow) and the roles ``--fresh`` asks afresh
(``cache.fresh``, each with a salt of its own that the manifest records, so a resume of that
run finds the same salt and repeats nothing). The call-cache side is ``tasks/llm/cache_scope.py``.
"""

from __future__ import annotations

import re
import secrets
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

CACHE_ROLES: tuple[str, ...] = ("generation", "pretest", "targets", "judge")
FOREVER, ROUND = "forever", "round"
TTL_PREFIX = "ttl:"

# Defaults by the kind of run: a refresh round draws fresh replies except the judge's (a fixed
# yardstick); an ordinary run keeps today's behaviour, so existing caches keep hitting.
REFRESH_DEFAULTS: dict[str, str] = {"generation": ROUND, "pretest": ROUND, "targets": ROUND, "judge": FOREVER}
ORDINARY_DEFAULTS: dict[str, str] = {role: FOREVER for role in CACHE_ROLES}

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def duration_seconds(text: str) -> float:
    """``"7d"`` -> 604800.0: a number and one unit of s, m, h, d, w; ValueError otherwise."""
    match = _DURATION.match(str(text).lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is no duration: a positive number and one unit of s, m, h, d, w (e.g. 7d, 12h)")
    return float(match.group(1)) * _UNITS_S[match.group(2)]


def parse_scope(value: Any) -> str | None:
    """One role's scope as written (``forever``, ``round``, ``{ttl: 7d}`` or ``"ttl: 7d"``), in the one
    spelling the manifest and ``freshness.json`` show: ``forever``, ``round`` or ``ttl:<seconds>s``."""
    if value is None:
        return None
    if isinstance(value, dict):
        if set(value) != {"ttl"}:
            raise ValueError(f"a scope mapping takes one key, ttl (e.g. {{ttl: 7d}}), not {sorted(value)}")
        return f"{TTL_PREFIX}{duration_seconds(value['ttl']):g}s"
    text = str(value).strip().lower()
    if text in (FOREVER, ROUND):
        return text
    if text.startswith("ttl"):
        return f"{TTL_PREFIX}{duration_seconds(text[3:].lstrip(' :')):g}s"
    raise ValueError(f"unknown cache scope {value!r}: forever, round or ttl: <duration> (e.g. ttl: 7d)")


def ttl_seconds(scope: str) -> float | None:
    """The age limit of a ``ttl:<seconds>s`` scope; None for ``forever`` and ``round``."""
    return float(scope[len(TTL_PREFIX) :].rstrip("s")) if scope.startswith(TTL_PREFIX) else None


Scope = Annotated[str | None, BeforeValidator(parse_scope)]


class CachePolicy(BaseModel):
    """``cache.policy``: the scope of each role's cached replies; a role left out takes the run's default."""

    model_config = ConfigDict(extra="forbid")

    generation: Scope = Field(default=None, description="generate + verify: forever | round | {ttl: 7d}")
    pretest: Scope = Field(default=None, description="the pre-test's answers and their judging")
    targets: Scope = Field(default=None, description="the evaluated models' answers")
    judge: Scope = Field(default=None, description="the evaluation judge")

    def resolved(self, *, refresh: bool) -> dict[str, str]:
        """Every role's scope: the configured one, else the default of a refresh round or an ordinary run."""
        defaults = REFRESH_DEFAULTS if refresh else ORDINARY_DEFAULTS
        return {role: getattr(self, role) or defaults[role] for role in CACHE_ROLES}


def check_roles(roles: list[str] | None) -> list[str]:
    """``--fresh`` roles, checked against :data:`CACHE_ROLES` (ValueError naming the unknown one)."""
    unknown = [role for role in roles or [] if role not in CACHE_ROLES]
    if unknown:
        raise ValueError(f"unknown role {unknown[0]!r} for --fresh (roles: {', '.join(CACHE_ROLES)})")
    return list(dict.fromkeys(roles or []))


def fresh_salts(roles: list[str], recorded: dict[str, str] | None) -> dict[str, str]:
    """A salt per role asked afresh: the one an earlier start of the same run recorded (a resume
    repeats nothing), else a new one (the role's earlier cache entries do not match it)."""
    recorded = recorded or {}
    return {role: recorded.get(role) or secrets.token_hex(8) for role in check_roles(roles)}
