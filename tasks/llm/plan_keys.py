"""Which credentials a config's models still lack: one warning line per variable, naming its models.

Plans are made before keys are set, so a missing key is a warning, not an error. Each model's
provider profile says what it reads (``ProviderProfile.credentials``): the config's ``api_key_env``,
else the provider's own key variables or its default credential chain (an AWS profile, Google's
application default credentials). Local models and servers without auth need nothing.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.llm.providers import profile_for


def wanted_variables(cfg: RunConfig, name: str) -> str | None:
    """What model ``name`` still lacks, worded for a warning (``X is not set``, ``none of A, B is set``);
    None: nothing."""
    model = cfg.models[name]
    if model.rule_based or (model.local is not None and not model.api_base):
        return None
    if model.api_key_env:
        return None if os.environ.get(model.api_key_env) else f"{model.api_key_env} is not set"
    profile = profile_for(model.model, model.api_base)
    status, _ = profile.credentials(model, model.api_base)
    if status != "missing":
        return None
    names = profile.key_env + profile.credential_env
    files = f" (nor {', '.join(profile.credential_files)})" if profile.credential_files else ""
    if not names:
        return f"no credentials file{files}"
    if len(names) == 1:
        return f"{names[0]} is not set{files}"
    return f"none of {', '.join(names)} is set{files}"


def missing_key_warnings(cfg: RunConfig, names: Collection[str]) -> list[str]:
    """One line per missing variable (or set of alternatives), listing the models that need it."""
    needed: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        wanted = wanted_variables(cfg, name)
        if wanted is not None:
            needed.setdefault(wanted, []).append(name)
    return [
        f"missing credentials: {wanted}, needed by {', '.join(models)}" for wanted, models in sorted(needed.items())
    ]
