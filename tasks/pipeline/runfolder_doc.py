"""The whole run-folder contract in one list, and the README's table generated from it.

The kernel declares the files both methods write (``tasks/core/runfolder.py``), each
method its own (``tasks/refusalbench/schema/artifacts.py``, ``tasks/knowornot/schema/artifacts.py``);
only a layer that may import both methods can put them together, hence this module.
"""

from __future__ import annotations

from refusalbench.tasks.core import runfolder
from refusalbench.tasks.core.runfolder import Artifact
from refusalbench.tasks.knowornot.schema import artifacts as kon_files
from refusalbench.tasks.refusalbench.schema import artifacts as rb_files

# Both methods write a ``metrics.json`` (each run folder holds one method's run).
ARTIFACTS: tuple[Artifact, ...] = runfolder.SHARED + rb_files.ARTIFACTS + kon_files.ARTIFACTS


def runfolder_markdown() -> str:
    """The README's run-folder table, generated from the declarations."""
    lines = ["| file | method | format | shape | what it is |", "|---|---|---|---|---|"]
    for artifact in ARTIFACTS:
        shape = (
            artifact.schema.__name__ if artifact.schema is not None else {"parquet": "table"}.get(artifact.format, "-")
        )
        lines.append(f"| `{artifact.name}` | {artifact.method} | {artifact.format} | {shape} | {artifact.about} |")
    lines.append("| `labels/<spec>.jsonl` | knowornot | jsonl | HumanLabel | human labels, appended one per line |")
    lines.append(
        "| `labels/consensus/<spec>.jsonl` | knowornot | jsonl | HumanLabel | the label agreed in a consensus "
        "pass for each item the annotators labelled differently (`knowornot label --consensus`) |"
    )
    lines.append(
        "| `agreement-<spec>.json` | knowornot | json | AgreementDocument | agreement between annotators (kappa "
        "with intervals), open disagreements, and every evaluator against the human consensus |"
    )
    lines.append(
        "| `kb/<name>/...` | knowornot | (as above) | - | a multi-base run (`knowornot.knowledge_bases`): each "
        "base's own sentences, facts, QA pairs, filter report and FAISS index; the run folder's files merge "
        "them, ids prefixed `<name>/` |"
    )
    lines.append(
        f"| `{runfolder.WORK}/...` | both | parquet | (records) | stage-task shards; safe to delete after a run |"
    )
    return "\n".join(lines) + "\n\n" + schema_versions_markdown()


def schema_versions_markdown() -> str:
    """The versions of the contract, newest first, each with what it changed (``runfolder.SCHEMA_HISTORY``)."""
    lines = [
        "### Schema versions",
        "",
        f"This version of RefusalBench writes `schema_version` {runfolder.SCHEMA_VERSION} and reads every "
        "version below.",
        "",
        "| version | what changed |",
        "|---|---|",
    ]
    lines += [f"| {version} | {change} |" for version, change in reversed(runfolder.SCHEMA_HISTORY)]
    return "\n".join(lines)
