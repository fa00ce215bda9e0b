"""Where human labels are kept: a JSONL file, one label per line, appended and fsync'ed after
every label, so a crash loses at most the label being typed and labelling resumes where it
stopped. Both methods keep their labels here (KnowOrNot's ``HumanLabel``; RefusalBench's
audit, a subclass reading ``AuditLabel`` lines).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar

from pydantic import ValidationError

from refusalbench.tasks.core.errors import InputError
from refusalbench.tasks.core.human_labels import HumanLabel


class _Labelled(Protocol):
    """What a label is matched on: KnowOrNot's ``LabelItem`` and RefusalBench's ``AuditCase`` both have it."""

    @property
    def spec(self) -> str: ...

    @property
    def item_id(self) -> str: ...


Item = TypeVar("Item", bound=_Labelled)


class LabelStore:
    """Labels as JSONL at ``path``: appended one per line and fsync'ed before returning."""

    # The record one line holds, and what a line that is not one is called in the error.
    record: ClassVar[type[HumanLabel]] = HumanLabel
    record_name: ClassVar[str] = "a label record"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def load(self) -> list[HumanLabel]:
        """All labels. A torn last line (crash mid-write) is ignored; a bad line elsewhere is an InputError."""
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").split("\n")
        labels: list[HumanLabel] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                labels.append(self.record.model_validate_json(line))
            except ValidationError as exc:
                if number == len(lines):
                    break  # unterminated last line: a write torn by a crash (append() cuts it off)
                raise InputError(
                    str(self.path), f"not {self.record_name}: {exc.errors()[0]['msg']}", line=number
                ) from None
        return labels

    def labelled_ids(self, annotator: str, spec: str | None = None) -> set[str]:
        return {
            label.item_id
            for label in self.load()
            if label.annotator == annotator and (spec is None or label.spec == spec)
        }

    def append(self, label: HumanLabel) -> None:
        line = label.model_dump_json() + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a+b") as handle:
                size = handle.seek(0, os.SEEK_END)
                if size > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":
                        # A torn last line was never acknowledged as saved: cut it off
                        # so it cannot become a corrupt line in the middle of the file.
                        handle.seek(0)
                        content = handle.read()
                        handle.truncate(content.rfind(b"\n") + 1)
                handle.write(line.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())

    def pending(self, items: Sequence[Item], annotator: str) -> list[Item]:
        """The items ``annotator`` has not labelled yet, in their order."""
        done = {(label.spec, label.item_id) for label in self.load() if label.annotator == annotator}
        return [item for item in items if (item.spec, item.item_id) not in done]
