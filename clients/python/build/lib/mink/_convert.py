"""Rows in, as Arrow of the table's schema: pyarrow, pandas, Polars or Python rows."""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidArgument
from .types import to_mink_type

#: What the write calls take.
Data = Any


_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def to_arrow(data: Data) -> pa.Table:
    """``data`` as a pyarrow Table, without casting; a value Arrow cannot hold is
    :class:`InvalidArgument` naming its column where the library says which."""
    try:
        return _to_arrow(data)
    except InvalidArgument:
        raise
    except _CONVERSION_ERRORS as e:
        column = _failing_column(data)
        where = f"column {column!r}" if column else "rows"
        raise InvalidArgument(f"invalid {where}: cannot convert to Arrow: {e}", where) from e


def _failing_column(data: Data) -> str | None:
    if type(data).__module__.split(".")[0] != "pandas":
        return None
    for name in data.columns:
        try:
            pa.Array.from_pandas(data[name])
        except _CONVERSION_ERRORS:
            return str(name)
    return None


def _to_arrow(data: Data) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    if module == "polars":
        return data.to_arrow()
    if isinstance(data, dict):
        return pa.table(data)
    if isinstance(data, (list, tuple)):
        if data and not all(isinstance(r, dict) for r in data):
            raise InvalidArgument(
                "invalid rows: a list of rows must hold dicts of column name to value", "rows"
            )
        return pa.Table.from_pylist(list(data))
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise InvalidArgument(
        f"invalid rows: cannot write a {type(data).__name__}; pass a pyarrow Table or "
        "RecordBatch, a pandas or Polars DataFrame, or a list of dicts",
        "rows",
    )


def conform(
    data: Data, schema: pa.Schema, columns: Sequence[str] | None = None, fill_missing: bool = True
) -> pa.Table:
    """``data`` cast to ``schema`` (or to its ``columns``, in table order), checked
    before anything is written: an unknown column, a missing column that cannot be null,
    a value that does not fit its column's type and a null in a NOT NULL column are
    :class:`InvalidArgument` naming the column (and row)."""
    if isinstance(data, (list, tuple)) and data and all(isinstance(r, dict) for r in data):
        wanted = pa.schema([schema.field(c) for c in columns]) if columns else schema
        unknown = sorted({k for r in data for k in r} - set(wanted.names))
        if unknown:
            raise InvalidArgument(
                f"invalid column {unknown[0]!r}: the table has no such column "
                f"(it has {', '.join(wanted.names)})",
                f"column {unknown[0]!r}",
            )
        try:
            table = pa.Table.from_pylist(list(data), schema=_nullable(wanted))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            raise InvalidArgument(
                f"invalid rows: they do not fit the table's schema: {e}", "rows"
            ) from e
    else:
        table = to_arrow(data)
    names = list(columns) if columns else schema.names
    for n in table.column_names:
        if n not in schema.names:
            raise InvalidArgument(
                f"invalid column {n!r}: the table has no such column "
                f"(it has {', '.join(schema.names)})",
                f"column {n!r}",
            )
        if columns is not None and n not in columns:
            raise InvalidArgument(
                f"invalid column {n!r}: not one of the target columns {list(columns)}",
                f"column {n!r}",
            )
    arrays = []
    fields = []
    for name in [n for n in schema.names if n in names]:
        field = schema.field(name)
        if name in table.column_names:
            column = table.column(name)
            try:
                column = column.cast(field.type) if column.type != field.type else column
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise InvalidArgument(
                    f"invalid column {name!r}: {column.type} values cannot be written as "
                    f"{to_mink_type(field.type, name)}: {e}",
                    f"column {name!r}",
                ) from e
        elif field.nullable and fill_missing:
            column = pa.chunked_array([pa.nulls(table.num_rows, field.type)])
        else:
            raise InvalidArgument(
                f"invalid column {name!r}: missing, and the column is NOT NULL",
                f"column {name!r}",
            )
        if not field.nullable and column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise InvalidArgument(
                f"invalid column {name!r}: row {row} is null and the column is NOT NULL",
                f"column {name!r}",
            )
        arrays.append(column)
        fields.append(field)
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _nullable(schema: pa.Schema) -> pa.Schema:
    # from_pylist checks nullability loosely; `conform` reports the row itself.
    return pa.schema([f.with_nullable(True) for f in schema])


def one_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as one record batch (its chunks combined)."""
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
