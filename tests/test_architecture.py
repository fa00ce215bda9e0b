"""ARCHITECTURE.md matches the tree: it names every module, and every module it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("tasks", "flows", "deployments", "extend")


def documented_modules(text: str) -> set[str]:
    """Paths named under "Every module": a ``### `folder/` `` heading, then ``- `name.py`: ...`` bullets."""
    section = text.split("## Every module", 1)[1]
    found: set[str] = set()
    folder = None
    for line in section.splitlines():
        heading = re.match(r"### `([\w/]+)/`", line)
        if heading:
            folder = heading.group(1)
            continue
        bullet = re.match(r"- `([\w]+\.py)`", line)
        if bullet and folder:
            found.add(f"{folder}/{bullet.group(1)}")
    return found


def tree_modules() -> set[str]:
    return {
        str(p.relative_to(ROOT))
        for folder in FOLDERS
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts and p.name != "__init__.py"
    }


def test_architecture_names_every_module_and_only_those():
    documented = documented_modules((ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8"))
    tree = tree_modules()
    assert sorted(tree - documented) == [], "modules missing from ARCHITECTURE.md"
    assert sorted(documented - tree) == [], "ARCHITECTURE.md names modules that do not exist"


def test_every_path_in_the_change_table_exists():
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").split("## Every module", 1)[0]
    paths = set(re.findall(r"`((?:tasks|flows|deployments|extend|levers|prompts)/[\w/.<>-]*)`", text))
    missing = [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()]
    assert missing == []


def test_the_checker_sees_a_missing_module(tmp_path):
    text = "## Every module\n\n### `tasks/core/`\n\n- `config.py`: the config\n"
    assert documented_modules(text) == {"tasks/core/config.py"}
