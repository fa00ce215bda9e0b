"""LiteLLM, imported on first use: a process whose calls all take the direct path never pays for it.

A module of its own, below everything else in ``tasks/llm``, so code that must not depend on the
provider profiles (the batch protocols, which the profiles name) can import LiteLLM the same way.
"""

from __future__ import annotations

import functools
import logging
from typing import Any


@functools.lru_cache(maxsize=1)
def litellm_module() -> Any:
    """LiteLLM, imported (seconds) and quietened on first use: a process whose calls all take
    the direct path never imports it."""
    import litellm

    litellm.suppress_debug_info = True
    logging.getLogger("LiteLLM").setLevel(logging.WARNING)
    return litellm
