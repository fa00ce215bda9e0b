"""The structured-output mode each model uses in this process, lowered when its provider rejects one.

A model's provider profile says how a response schema is sent (``json_schema``, ``tool``,
``json_object``, ``none``). Some providers, or some models behind an OpenAI-compatible server,
answer that mode with a 400 (the scripted server words it as they do: ``response_format``
for chat completions, ``output_format`` for the Messages API). The profile recognises the 400
(``rejects_structured_output``) and names the next mode (``fallback_mode``); this module remembers
the fallback for the rest of the run, for every call of the model in the process, so the 400s
come in one round of a model's calls and not once per item.

There is no probe: a model's first structured calls all go in the configured mode. Holding them
back until one call had settled the mode cost every structured model one whole reply in every
run (a second per stage against the 1 s scripted server, tens of seconds for a reasoning model),
to save a rare rejecting server a few 400s. Now, when a server rejects the mode, the calls already
in flight (at most the model's ``max_concurrency``) meet the 400 and are each sent again in the
fallback; every call sent after the first rejection goes in the fallback. The fallback is recorded
once per model and written in the run's manifest (``structured_output_fallbacks``).
"""

from __future__ import annotations

import threading


class StructuredModes:
    """Per model (registry name): the fallback mode in use. Thread-safe."""

    def __init__(self) -> None:
        self._fallbacks: dict[str, str] = {}
        self._lock = threading.Lock()

    def mode(self, model: str, configured: str) -> str:
        """The mode to send ``model``'s structured calls in: its fallback, else ``configured``."""
        with self._lock:
            return self._fallbacks.get(model, configured)

    def fallbacks(self) -> dict[str, str]:
        """{model: mode} for every model that fell back in this process."""
        with self._lock:
            return dict(self._fallbacks)

    def fall_back(self, model: str, rejected: str, fallback: str) -> bool:
        """Use ``fallback`` for ``model`` from now on, unless ``rejected`` is no longer its mode (a
        concurrent call fell back first); True when this call made the change."""
        with self._lock:
            current = self._fallbacks.get(model)
            if current is not None and current != rejected:
                return False
            self._fallbacks[model] = fallback
            return True
