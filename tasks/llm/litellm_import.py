"""LiteLLM, imported on first use: a process whose calls all take the direct path never pays for it.

A module of its own, below everything else in ``tasks/llm``, so code that must not depend on the
provider profiles (the batch protocols, which the profiles name) can import LiteLLM the same way.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=1)
def litellm_module() -> Any:
    """LiteLLM, imported (seconds) and quietened on first use: a process whose calls all take
    the direct path never imports it."""
    import litellm

    litellm.suppress_debug_info = True
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    return litellm


@functools.cache
def cost_map() -> dict[str, Any]:
    """LiteLLM's offline cost map, read from its JSON without importing LiteLLM ({} when not found)."""
    spec = importlib.util.find_spec("litellm")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "model_prices_and_context_window_backup.json"
        if path.exists():
            loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return loaded
    return {}
