"""Reading a run config's YAML files: ``include:`` merged, every key path located by file and line.

``core/config.py`` validates the merged document; the positions kept here let every error it
reports (``core/config_problems.py``: unknown key, bad value, a registered check's problem) name
the file and line where the key was written, which for an included registry is the registry,
not the run config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.textinput import read_text


class Located:
    """Where each key path of the merged document came from: (file, line)."""

    def __init__(self) -> None:
        self.origin: dict[tuple[Any, ...], tuple[str, int]] = {}

    def find(self, path: tuple[Any, ...]) -> tuple[str, int | None]:
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.origin:
                return self.origin[path[:cut]]
        return ("<config>", None)


def not_found_problem(as_written: str, looked: str | Path, *, relative_to: str) -> str:
    """``file not found: PATH (looked for /ABS/PATH, ...)``: the path as the user wrote it, and, for a
    relative one, the absolute path it stood for, so a run started from another folder explains itself."""
    if Path(as_written).is_absolute():
        return f"file not found: {as_written}"
    return f"file not found: {as_written} (looked for {os.path.abspath(looked)}: relative to {relative_to})"


def _node_to_python(node: yaml.Node, file: str, path: tuple[Any, ...], located: Located) -> Any:
    located.origin[path] = (file, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = (
                yaml.safe_load(yaml.serialize(key_node))
                if not isinstance(key_node, yaml.ScalarNode)
                else key_node.value
            )
            if key in out:
                raise InputError(
                    file,
                    f"duplicate key {key!r}",
                    line=key_node.start_mark.line + 1,
                    field=".".join(map(str, path + (key,))),
                )
            located.origin[path + (key,)] = (file, key_node.start_mark.line + 1)
            out[key] = _node_to_python(value_node, file, path + (key,), located)
            # keep the key's own line for the key path (more useful than the value's)
            located.origin[path + (key,)] = (file, key_node.start_mark.line + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_node_to_python(item, file, path + (i,), located) for i, item in enumerate(node.value)]
    # Scalars: let the safe constructor decide the type (int, bool, null, str ...).
    return yaml.safe_load(yaml.serialize(node))


# A run config is a short hand-written file; PyYAML's pure-Python parser needs about 3 s
# per MiB, so anything far larger is refused before parsing rather than parsed for minutes.
MAX_CONFIG_BYTES = 1024 * 1024


def _read_yaml(path: Path, located: Located) -> dict[str, Any]:
    file = str(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise InputError(file, "file not found") from None
    if size > MAX_CONFIG_BYTES:
        raise InputError(file, f"too large for a config ({size} bytes; the limit is {MAX_CONFIG_BYTES // 1024} KiB)")
    text = read_text(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(file, f"invalid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    if node is None:
        raise InputError(file, "empty config file")
    data = _node_to_python(node, file, (), located)
    if not isinstance(data, dict):
        raise InputError(file, "a config must be a mapping at top level", line=1)
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_tree(path: Path, located: Located, stack: tuple[Path, ...]) -> dict[str, Any]:
    """The document of ``path`` with its includes merged under it (``stack``: the files including it)."""
    path = path.resolve()
    if path in stack:
        raise InputError(str(path), "include cycle: " + " -> ".join(p.name for p in (*stack, path)))
    data = _read_yaml(path, located)
    includes = data.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        file, line = located.find(("include",))
        raise InputError(file, "include must be a file name or a list of file names", line=line, field="include")
    merged: dict[str, Any] = {}
    for inc in includes:
        target = (path.parent / inc) if not Path(inc).is_absolute() else Path(inc)
        if not target.exists():
            file, line = located.find(("include",))
            problem = not_found_problem(inc, target, relative_to="the including file's folder")
            raise InputError(file, f"included {problem}", line=line, field="include")
        merged = _merge(merged, load_tree(target, located, (*stack, path)))
    # The including file wins; re-register its positions last so errors point at it.
    merged = _merge(merged, data)
    if stack == ():
        # re-read positions of the top file so they take precedence over included ones
        _read_yaml(path, located)
    return merged
