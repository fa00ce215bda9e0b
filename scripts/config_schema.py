"""Write the run config's JSON Schema for YAML editors (default: docs/schema/config.schema.json).

    .venv/bin/python scripts/config_schema.py [OUT]

The schema is generated from the configuration models by the documentation hook
(docs/hooks/reference.py), which also publishes it with the site; tests/test_docs.py checks
that the checked-in copy is current.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "schema" / "config.schema.json"


def reference_hook() -> ModuleType:
    """The documentation hook module, loaded from its file (it is not an installed module)."""
    spec = importlib.util.spec_from_file_location(
        "refusalbench_docs_reference", ROOT / "docs" / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(reference_hook().config_schema_text(), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
