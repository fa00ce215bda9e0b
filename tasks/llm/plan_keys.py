"""Which credentials a config's models still lack: one warning line per variable, naming its models.

Plans are made before keys are set, so a missing key is a warning, not an error. Each model's
provider profile says what it reads (``ProviderProfile.credentials``): the config's ``api_key_env``,
else the provider's own key variables or its default credential chain (an AWS profile, Google's
application default credentials). Local models and servers without auth need nothing.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from refusalbench.tasks.core.config import RunConfig
from refusalbench.tasks.llm.providers import profile_for


def wanted_variables(cfg: RunConfig, name: str) -> str | None:
    """What model ``name`` still needs set, as the one variable or ``one of A, B, ...``; None: nothing."""
    model = cfg.models[name]
    if model.rule_based or (model.local is not None and not model.api_base):
        return None
    profile = profile_for(model.model, model.api_base)
    if model.api_key_env:
        return None if os.environ.get(model.api_key_env) else model.api_key_env
    status, _ = profile.credentials(model, model.api_base)
    if status != "missing":
        return None
    names = profile.key_env + profile.credential_env
    if not names:
        files = ", ".join(profile.credential_files)
        return f"a credentials file ({files})"
    if len(names) == 1:
        return names[0]
    extra = [str(Path(f)) for f in profile.credential_files]
    return "one of " + ", ".join([*names, *extra])


def missing_key_warnings(cfg: RunConfig, names: Collection[str]) -> list[str]:
    """One line per missing variable (or set of alternatives), listing the models that need it."""
    needed: dict[str, list[str]] = {}
    for name in sorted(set(names)):
        wanted = wanted_variables(cfg, name)
        if wanted is not None:
            needed.setdefault(wanted, []).append(name)
    return [
        f"missing credentials: {variable} is not set, needed by {', '.join(models)}"
        for variable, models in sorted(needed.items())
    ]
