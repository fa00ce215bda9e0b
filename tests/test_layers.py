"""The layers of ``tasks/`` and their import rules (ARCHITECTURE.md), checked on the source.

Every import counts, at module level or inside a function: a function-level import still
makes the importing layer depend on the imported one.
"""

from __future__ import annotations

import ast
import concurrent.futures
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "refusalbench"

# layer -> the layers it may import (itself included). Methods never import each other;
# only the pipeline (and flows/, deployments/ above it) may import Prefect. extend/ (the public module
# plugins import) sits on top like flows/, but without Prefect: loading a plugin never costs it.
ALLOWED: dict[str, set[str]] = {
    "core": {"core"},
    "llm": {"core", "llm"},
    "labelling": {"core", "labelling"},
    "refusalbench": {"core", "llm", "labelling", "refusalbench"},
    "knowornot": {"core", "llm", "labelling", "knowornot"},
    "integrations": {"core", "llm", "refusalbench", "integrations"},
    "viewer": {"core", "llm", "labelling", "refusalbench", "knowornot", "viewer"},
    "pipeline": {"core", "llm", "labelling", "refusalbench", "knowornot", "integrations", "viewer", "pipeline"},
}
PREFECT_LAYERS = {"pipeline", "flows", "deployments"}
TOP_LAYERS = ("flows", "deployments", "extend")  # above tasks/: they may import any layer of it
SCANNED = ("tasks", *TOP_LAYERS)
# Module basenames that one module of the same role may carry in each method's own package.
SAME_ROLE = {"__init__", "records", "json_files", "artifacts", "report", "figures", "page", "stages", "schema"}
METHODS = {"refusalbench", "knowornot"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def parse_source(path: Path) -> ast.Module:
    """``path``'s syntax tree. CPython 3.11's parser can raise "AST constructor recursion depth mismatch"
    in a thread whose recursion counter an earlier test left off; a new thread starts with a clean one."""
    text = path.read_text(encoding="utf-8")
    try:
        return ast.parse(text)
    except SystemError:
        with concurrent.futures.ThreadPoolExecutor(1) as fresh:
            return fresh.submit(ast.parse, text).result()


def imports_of(path: Path, root: Path) -> set[str]:
    """Every module ``path`` imports (dotted, without the ``refusalbench.`` prefix for our own)."""
    tree = parse_source(path)
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            found.add(name[len(PACKAGE) + 1 :] if name.startswith(PACKAGE + ".") else name)
    return found


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "tasks":
        return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None
    if parts[0] in TOP_LAYERS:
        return parts[0]
    return None


def violations(root: Path) -> list[str]:
    """Every import that breaks the layer rules, as ``module -> imported (why)``."""
    problems = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            module = module_name(path, root)
            layer = layer_of(module)
            if module == "tasks":
                continue
            if folder == "tasks" and layer is None:
                problems.append(f"{module}: not inside a layer folder of tasks/ ({', '.join(ALLOWED)})")
                continue
            for imported in sorted(imports_of(path, root)):
                top = imported.split(".")[0]
                if top == "prefect" or top.startswith("prefect_"):
                    if layer not in PREFECT_LAYERS:
                        problems.append(
                            f"{module} -> {imported} (only pipeline/, flows/ and deployments/ import Prefect)"
                        )
                    continue
                target = layer_of(imported)
                if target is None or layer not in ALLOWED:
                    continue
                if target not in ALLOWED[layer]:
                    problems.append(f"{module} -> {imported} ({layer} may import {', '.join(sorted(ALLOWED[layer]))})")
    return problems


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = {module_name(p, root): p for p in (root / "tasks").rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        graph[module] = {m for m in imports_of(path, root) if m in modules and m != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between modules (a package's ``__init__`` re-exporting its own modules is not one)."""

    def edges(module: str) -> set[str]:
        return {m for m in graph[module] if not (module.startswith(m + ".") or m.startswith(module + "."))}

    found, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for nxt in sorted(edges(module)):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


# ---------------------------------------------------------------- the project


def test_every_import_keeps_to_the_layer_rules():
    assert violations(ROOT) == []


def test_no_import_cycle_inside_tasks():
    assert cycles(import_graph(ROOT)) == []


def test_only_the_pipeline_and_flows_import_prefect():
    importers = {
        module_name(p, ROOT)
        for folder in SCANNED
        for p in (ROOT / folder).rglob("*.py")
        if any(m.split(".")[0] == "prefect" for m in imports_of(p, ROOT))
    }
    assert importers and all(
        m.split(".")[0] in ("flows", "deployments") or m.startswith("tasks.pipeline") for m in importers
    ), sorted(importers)


def test_no_two_modules_share_a_name_but_one_of_a_role_per_package():
    names = Counter(p.stem for p in (ROOT / "tasks").rglob("*.py"))
    shared = {name for name, count in names.items() if count > 1 and name not in SAME_ROLE}
    assert shared == set()
    # A same-role name stands only in the methods' own packages, once in each.
    for name in SAME_ROLE - {"__init__"}:
        homes = [p.relative_to(ROOT / "tasks").parts[0] for p in (ROOT / "tasks").rglob(f"{name}.py")]
        homes += [p.relative_to(ROOT / "tasks").parts[0] for p in (ROOT / "tasks").rglob(f"{name}/__init__.py")]
        assert len(homes) == len(set(homes)) and set(homes) <= METHODS, (name, homes)


def test_every_flow_reads_like_its_dag():
    for path in (ROOT / "flows").glob("*.py"):
        for node in ast.walk(parse_source(path)):
            if isinstance(node, ast.FunctionDef) and any(
                "flow" in ast.unparse(d).split("(")[0] for d in node.decorator_list
            ):
                assert node.end_lineno - node.lineno + 1 <= 40, f"{path.name}: {node.name} is over 40 lines"


# ---------------------------------------------------------------- the checker itself


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in SCANNED:
        (tmp_path / folder).mkdir(exist_ok=True)
    return tmp_path


def test_the_checker_finds_a_method_importing_the_other(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tasks/knowornot/report/contents.py": "def page():\n    from refusalbench.tasks.refusalbench.report import layout\n",
            "tasks/refusalbench/report/layout.py": "X = 1\n",
        },
    )
    assert violations(root) == [
        "tasks.knowornot.report.contents -> tasks.refusalbench.report "
        "(knowornot may import core, knowornot, labelling, llm)",
        "tasks.knowornot.report.contents -> tasks.refusalbench.report.layout "
        "(knowornot may import core, knowornot, labelling, llm)",
    ]


def test_the_checker_finds_prefect_and_upward_imports_in_the_kernel(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tasks/core/store.py": "import prefect\nfrom refusalbench.tasks.llm import gateway\n",
            "tasks/llm/gateway.py": "X = 1\n",
            "tasks/pipeline/runtime.py": "from prefect import task\n",
            "tasks/stray.py": "X = 1\n",
        },
    )
    assert violations(root) == [
        "tasks.core.store -> prefect (only pipeline/, flows/ and deployments/ import Prefect)",
        "tasks.core.store -> tasks.llm (core may import core)",
        "tasks.core.store -> tasks.llm.gateway (core may import core)",
        "tasks.stray: not inside a layer folder of tasks/ (core, llm, labelling, refusalbench, knowornot, "
        "integrations, viewer, pipeline)",
    ]


def test_the_checker_finds_a_cycle_held_by_a_function_level_import(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tasks/integrations/inspect/bridge.py": "from refusalbench.tasks.integrations.inspect import logs\n",
            "tasks/integrations/inspect/logs.py": "def read():\n    from refusalbench.tasks.integrations.inspect import bridge\n",
        },
    )
    assert cycles(import_graph(root)) == [
        ["tasks.integrations.inspect.bridge", "tasks.integrations.inspect.logs", "tasks.integrations.inspect.bridge"]
    ]
