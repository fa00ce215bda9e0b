"""The JSON documents of a run folder: their base model and the rate type they share.

Parquet artifacts are typed by record classes (``tables.Record``); the JSON ones by
:class:`Document` models, one per file, declared in each method's ``documents.py``, so
every file a run writes has one declared shape (see ``runfolder.py`` and each method's
``artifacts.py``). A ratio that is undefined (no data) is NaN in memory and ``null`` on
disk, hence the ``Rate`` type. Documents accept no unknown top-level keys: a producer that
adds a field has to declare it first, which keeps the README's contract true.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

Rate = float | None  # NaN in memory, null in JSON


class Document(BaseModel):
    """A JSON document of a run folder: unknown keys are an error."""

    model_config = ConfigDict(extra="forbid")
