"""Named extension points: one ``Registry`` per kind of thing (retrievers, cache backends, pre-checks...).

A registry maps a name to the thing registered under it. An extension is one function (or
class) plus one decorator in its own module::

    @CACHE_BACKENDS.register("memory")
    def open_memory_cache(*, path=None, url=None): ...

or one call, ``REGISTRY.add(name, entry)``. The config checks the names it is given against
the registry and the code looks them up by name, so a new entry needs no edit anywhere else.

One collision policy everywhere: registering a name that is already registered is an
error, unless the caller says ``replace=True``. A silent replacement would let an import
order decide which of two strategies runs.

A registration is only seen by a process that imported the module holding it: the
built-ins are imported by the modules that use them; a user's module is a *plugin*
(``core/plugins.py``), named by an installed ``refusalbench.plugins`` entry point or by the
config's ``plugins:`` list, and loaded before the config is validated and by every task in the
process it runs in (Dask worker processes included). ``refusalbench.extend`` gathers every
registry a plugin may add to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")
E = TypeVar("E")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> registered entry of one kind; a read-only mapping plus ``add`` and ``register``."""

    def __init__(self, kind: str):
        self.kind = kind  # what an entry is, in messages: "cache backend", "retrieval strategy"
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: E, *, replace: bool = False) -> E:
        """Register ``entry`` under ``name`` and return it.

        A name already registered raises ValueError naming the kind, the name and the entry
        holding it, unless ``replace`` is True.
        """
        if not name or not name.strip():
            raise ValueError(f"a {self.kind} needs a name")
        if name in self._entries and not replace:
            raise ValueError(
                f"{self.kind} {name!r} is already registered{_by(self._entries[name])}; pass replace=True to replace it"
            )
        self._entries[name] = entry  # type: ignore[assignment]
        return entry

    def register(self, name: str, *, replace: bool = False) -> Callable[[E], E]:
        """Decorator form of ``add``: register the decorated function or class under ``name``."""

        def decorate(entry: E) -> E:
            return self.add(name, entry, replace=replace)

        return decorate

    def remove(self, name: str) -> None:
        """Forget ``name`` (nothing happens when it is not registered)."""
        self._entries.pop(name, None)

    def lookup(self, name: str) -> T:
        """The entry for ``name``, or a ValueError that lists the known names."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(self.unknown_message([name])) from None

    def unknown(self, names: list[str]) -> list[str]:
        """Those of ``names`` that are not registered, in their order."""
        return [n for n in names if n not in self._entries]

    def unknown_message(self, names: list[str], known: list[str] | None = None) -> str:
        """``unknown <kind> 'a', 'b' (known: ...)``; ``known`` orders the list (default: registration order)."""
        listed = list(self._entries) if known is None else known
        return f"unknown {self.kind} {', '.join(map(repr, names))} (known: {', '.join(listed) or 'none'})"

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"


def _by(entry: object) -> str:
    """`` by module.qualname`` for a registered function or class (nothing for a data entry)."""
    qualname = getattr(entry, "__qualname__", None)
    return "" if qualname is None else f" by {getattr(entry, '__module__', '?')}.{qualname}"
