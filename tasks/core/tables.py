"""Typed rows and the one place that maps them to Parquet schemas.

Every artifact table is a list of one :class:`Record` type (each method declares its own
in its ``records.py``). ``arrow_schema(Record)`` derives the pyarrow schema from the
pydantic fields, so a record and its Parquet file cannot drift apart; ``to_table`` /
``from_table`` convert both ways. Fields several record types share are declared once in a
:class:`FieldGroup` the records inherit.
"""

from __future__ import annotations

import datetime as dt
import functools
import types
import typing
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """One row of an artifact table: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


class FieldGroup(BaseModel):
    """Fields several record types share (e.g. a model call's metadata), declared once: a record
    inherits them by naming the group among its bases, ``class Row(Record, SomeGroup)``.

    Pydantic puts inherited fields first, which would open every such table with the shared
    metadata. So a table's columns are the record's fields in declaration order, except those named
    in ``TRAILING_COLUMNS``: they come last, in that order (a name the record lacks is skipped). A
    group names its fields there; a record may name its own order instead, own fields included.
    """

    TRAILING_COLUMNS: ClassVar[tuple[str, ...]] = ()


# ----------------------------------------------------------------- Parquet mapping

R = TypeVar("R", bound=BaseModel)


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def _arrow_type(annotation: Any) -> pa.DataType:
    annotation, _ = _unwrap_optional(annotation)
    origin = get_origin(annotation)
    if annotation is str or origin is Literal:
        return pa.string()
    if annotation is bool:
        return pa.bool_()
    if annotation is int:
        return pa.int64()
    if annotation is float:
        return pa.float64()
    if annotation is dt.datetime:
        return pa.timestamp("us", tz="UTC")
    if origin in (list, typing.List):  # noqa: UP006
        (inner,) = get_args(annotation)
        return pa.list_(_arrow_field("item", inner))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return pa.struct([_arrow_field(n, f.annotation) for n, f in annotation.model_fields.items()])
    if origin is dict or annotation is Any:
        # Free-form mappings are stored as JSON text: Parquet has no schemaless map.
        return pa.string()
    raise TypeError(f"no Parquet mapping for {annotation!r}")


def _arrow_field(name: str, annotation: Any) -> pa.Field:
    """A column (or struct member, or list item): nullable exactly where the record allows None.

    A default does not make a field nullable: a validated record always holds a value
    there. Mappings are JSON text, never null. Reading ignores nullability (rows go
    through the record), so files written with every column nullable read the same.
    """
    _, optional = _unwrap_optional(annotation)
    return pa.field(name, _arrow_type(annotation), nullable=optional)


def column_names(record_type: type[BaseModel]) -> tuple[str, ...]:
    """A record type's columns in table order: its fields as declared, ``TRAILING_COLUMNS`` last (``FieldGroup``)."""
    fields = record_type.model_fields
    trailing = record_type.TRAILING_COLUMNS if issubclass(record_type, FieldGroup) else ()
    last = [name for name in dict.fromkeys(trailing) if name in fields]
    return (*(name for name in fields if name not in last), *last)


@functools.cache  # a record type's fields are fixed once declared; a shard task writes one table per call
def arrow_schema(record_type: type[BaseModel]) -> pa.Schema:
    """The Parquet schema of a record type, one column per field in table order (``column_names``)."""
    fields = record_type.model_fields
    return pa.schema([_arrow_field(name, fields[name].annotation) for name in column_names(record_type)])


@functools.cache
def _json_fields(record_type: type[BaseModel]) -> tuple[str, ...]:
    out = []
    for name, field in record_type.model_fields.items():
        ann, _ = _unwrap_optional(field.annotation)
        if get_origin(ann) is dict or ann is Any:
            out.append(name)
    return tuple(out)


def to_table(records: list[BaseModel], record_type: type[BaseModel]) -> pa.Table:
    import json

    json_fields = _json_fields(record_type)
    rows = []
    for rec in records:
        row = rec.model_dump(mode="python")
        for name in json_fields:
            row[name] = json.dumps(row[name], sort_keys=True, default=str)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=arrow_schema(record_type))


def from_table(table: pa.Table, record_type: type[R]) -> list[R]:
    import json

    json_fields = _json_fields(record_type)
    fields = record_type.model_fields  # once: pydantic's class attribute is a slow property per access
    extra = [name for name in table.column_names if name not in fields]  # columns the record no longer has
    validate = record_type.model_validate
    out = []
    for row in table.to_pylist():
        for name in json_fields:
            if isinstance(row.get(name), str):
                row[name] = json.loads(row[name])
        for name in extra:
            row.pop(name, None)
        out.append(validate(row))
    return out
