"""The structured-output mode each model uses in this process, lowered when its provider rejects one.

A model's provider profile says how a response schema is sent (``json_schema``, ``tool``,
``json_object``, ``none``). Some providers, or some models behind an OpenAI-compatible server,
answer that mode with a 400 (the scripted server words it as they do: ``response_format``
for chat completions, ``output_format`` for the Messages API). The profile recognises the 400
(``rejects_structured_output``) and names the next mode (``fallback_mode``); this module remembers
the fallback for the rest of the run, for every call of the model in the process, so the 400 is
paid once per model and not once per item.

Once per model means one probe: the first structured call of a model is sent alone, and the
other structured calls of the model wait for its answer before they are sent in the mode it
settled. A fallback is written in the run's manifest (``structured_output_fallbacks``).
"""

from __future__ import annotations

import asyncio
import threading


class StructuredModes:
    """Per model (registry name): the fallback mode in use, and the probe that settles it. Used on
    the gateway's event loop; :meth:`fallbacks` may be read from any thread."""

    def __init__(self) -> None:
        self._fallbacks: dict[str, str] = {}
        self._settled: dict[str, asyncio.Event] = {}
        self._lock = threading.Lock()

    def mode(self, model: str, configured: str) -> str:
        """The mode to send ``model``'s structured calls in: its fallback, else ``configured``."""
        with self._lock:
            return self._fallbacks.get(model, configured)

    def fallbacks(self) -> dict[str, str]:
        """{model: mode} for every model that fell back in this process."""
        with self._lock:
            return dict(self._fallbacks)

    async def enter(self, model: str) -> bool:
        """Wait until ``model``'s mode is settled; True when the caller is the one to settle it
        (its first structured call), which must then call :meth:`settle`."""
        event = self._settled.get(model)
        if event is None:
            self._settled[model] = asyncio.Event()
            return True
        await event.wait()
        return False

    def settle(self, model: str) -> None:
        """The probe got an answer that is not a rejection of the mode: every waiting call may go."""
        event = self._settled.get(model)
        if event is not None:
            event.set()

    def fall_back(self, model: str, rejected: str, fallback: str) -> bool:
        """Use ``fallback`` for ``model`` from now on, unless ``rejected`` is no longer its mode (a
        concurrent call fell back first); True when this call made the change."""
        with self._lock:
            current = self._fallbacks.get(model)
            if current is not None and current != rejected:
                return False
            self._fallbacks[model] = fallback
            return True
