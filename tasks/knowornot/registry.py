"""Named extension points of KnowOrNot: one registry per kind (retrievers, embedders, specs).

A registry maps a name to the thing registered under it. Strategies are added by a
decorator in their own module (``@register_retriever("basic_rag")``,
``@register_embedder("minilm")``) or by ``register_eval_spec(spec)``; the config checks
the names it is given against the registry, and the pipeline looks them up by name, so a
new strategy needs no edit anywhere else.

A registration is only seen by a process that imported the module holding it: the
built-ins are imported by the modules that use them; a user's module must be imported
before the config is read (with the Dask runner, in the workers too).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> registered object; a read-only mapping plus ``add``."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; a later registration of the same name replaces it."""
        if not name or not name.strip():
            raise ValueError(f"a {self.kind} needs a name")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    def lookup(self, name: str) -> T:
        """The entry for ``name``, or a ValueError that lists the known names."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(self.unknown_message([name])) from None

    def unknown(self, names: list[str]) -> list[str]:
        return [n for n in names if n not in self._entries]

    def unknown_message(self, names: list[str]) -> str:
        return f"unknown {self.kind} {', '.join(map(repr, names))} (known: {', '.join(self._entries) or 'none'})"

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"
