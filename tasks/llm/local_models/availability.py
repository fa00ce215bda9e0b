"""Can a model run? Where it runs, its credentials, its endpoint and cached weights (``models list``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from refusalbench.tasks.core.config import ModelConfig
from refusalbench.tasks.llm.local_models.pull import is_pulled
from refusalbench.tasks.llm.local_models.server import LOCAL_EXTRA_HINT, endpoint_models, llama_cpp_installed
from refusalbench.tasks.llm.providers import profile_for, provider_prefix


def model_status(
    name: str,
    cfg: ModelConfig,
    *,
    probe: bool = False,
    cache_dir: str | Path | None = None,
    allow_pull: bool = False,
) -> dict[str, Any]:
    """One row of ``models list``: where it runs, credentials, endpoint, cached weights, availability.

    ``allow_pull``: missing weights do not make a local model unavailable (the caller pulls them).
    """
    row: dict[str, Any] = {
        "name": name,
        "model": cfg.model,
        "runs_on": "",
        "api_base": cfg.api_base,
        "api_key_env": cfg.api_key_env,
        "credentials": "",
        "endpoint": None,
        "weights": None,
        "available": True,
        "reason": None,
    }
    reasons: list[str] = []
    served_here = cfg.local is not None and cfg.api_base is None
    if cfg.rule_based:
        # Rules run in this process: nothing to probe, no key, no weights.
        row["runs_on"] = "in process (rule-based, no calls)"
        row["credentials"] = "not needed"
    elif served_here:
        row["runs_on"] = "local llama.cpp"
        row["credentials"] = "not needed"
        pulled = is_pulled(name, cfg.local, cache_dir)  # type: ignore[arg-type]
        row["weights"] = "cached" if pulled else "not pulled"
        if not pulled and not allow_pull:
            reasons.append(f"weights not pulled (refusalbench models pull {name})")
        if not llama_cpp_installed():
            reasons.append(f"llama-cpp-python not installed ({LOCAL_EXTRA_HINT})")
    else:
        row["runs_on"] = (
            f"endpoint {cfg.api_base}"
            if cfg.api_base
            else f"provider {provider_prefix(cfg.model) or 'inferred by LiteLLM'}"
        )
        if cfg.local is not None:
            row["weights"] = "cached" if is_pulled(name, cfg.local, cache_dir) else "not pulled"
        # Which variables or files hold the credentials is the provider profile's to say.
        creds, why = profile_for(cfg.model, cfg.api_base).credentials(cfg, cfg.api_base)
        row["credentials"] = creds
        if why:
            reasons.append(why)
        if cfg.api_base:
            if probe:
                listed = endpoint_models(cfg.api_base, path=profile_for(cfg.model, cfg.api_base).models_path)
                row["endpoint"] = "reachable" if listed is not None else "unreachable"
                if listed is None:
                    reasons.append(f"endpoint {cfg.api_base} does not answer")
            else:
                row["endpoint"] = "not checked"
    if reasons:
        row["available"] = False
        row["reason"] = "; ".join(reasons)
    return row


def check_available(
    names: list[str],
    models: dict[str, ModelConfig],
    probe: bool = True,
    *,
    cache_dir: str | Path | None = None,
    allow_pull: bool = False,
) -> dict[str, str | None]:
    """For each name: None when it can run, else the reason it cannot (asked before a run starts)."""
    out: dict[str, str | None] = {}
    for name in names:
        cfg = models.get(name)
        if cfg is None:
            out[name] = "not in the model registry"
            continue
        out[name] = model_status(name, cfg, probe=probe, cache_dir=cache_dir, allow_pull=allow_pull)["reason"]
    return out
