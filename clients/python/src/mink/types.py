"""Mink's column types and their Arrow types, both ways.

Mink's types are ``BOOLEAN``, ``TINYINT``, ``SMALLINT``, ``INT``, ``BIGINT``, ``FLOAT``,
``DOUBLE``, ``DECIMAL(p,s)``, ``STRING``, ``BYTES``, ``DATE``, ``TIME(p)``,
``TIMESTAMP(p)`` and ``TIMESTAMP_LTZ(p)`` (``mink-types/src/types.rs``). Each maps to one
Arrow type; an Arrow type maps to a Mink type where Mink has one (``large_string`` and
``string_view`` are written as ``STRING``, a timestamp with any zone as
``TIMESTAMP_LTZ``), and is refused with :class:`~mink.errors.InvalidArgument` otherwise.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import pyarrow as pa

from .errors import InvalidArgument

__all__ = ["to_mink_type", "to_arrow_type", "columns_of", "arrow_schema"]

_UNIT_PRECISION = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _unit(precision: int) -> str:
    if precision == 0:
        return "s"
    if precision <= 3:
        return "ms"
    if precision <= 6:
        return "us"
    return "ns"


def to_mink_type(t: pa.DataType, column: str = "column") -> str:
    """The Mink type name of Arrow type ``t``; ``InvalidArgument`` when Mink has none."""
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    simple = {
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.date32(): "DATE",
    }
    if t in simple:
        return simple[t]
    if pa.types.is_decimal128(t) and t.scale >= 0:
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "STRING"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "BYTES"
    if pa.types.is_time(t):
        return f"TIME({_UNIT_PRECISION[t.unit]})"
    if pa.types.is_timestamp(t):
        p = _UNIT_PRECISION[t.unit]
        return f"TIMESTAMP_LTZ({p})" if t.tz is not None else f"TIMESTAMP({p})"
    if pa.types.is_dictionary(t):
        return to_mink_type(t.value_type, column)
    raise InvalidArgument(
        f"invalid column {column!r}: Arrow type {t} has no Mink type",
        f"column {column!r}",
        f"Arrow type {t} has no Mink type (Mink has BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, "
        "FLOAT, DOUBLE, DECIMAL(p,s), STRING, BYTES, DATE, TIME(p), TIMESTAMP(p), TIMESTAMP_LTZ(p))",
    )


_PARAM = re.compile(r"^([A-Z_]+)(?:\((\d+)(?:,\s*(\d+))?\))?$")


def to_arrow_type(name: str) -> pa.DataType:
    """The Arrow type of Mink type ``name`` (as the node maps it)."""
    m = _PARAM.match(name.strip().upper())
    if not m:
        raise InvalidArgument(f"invalid type: {name!r} is not a Mink type", "type", name)
    base, a, b = m.group(1), m.group(2), m.group(3)
    plain: dict[str, pa.DataType] = {
        "BOOLEAN": pa.bool_(),
        "TINYINT": pa.int8(),
        "SMALLINT": pa.int16(),
        "INT": pa.int32(),
        "BIGINT": pa.int64(),
        "FLOAT": pa.float32(),
        "DOUBLE": pa.float64(),
        "STRING": pa.string(),
        "BYTES": pa.binary(),
        "DATE": pa.date32(),
    }
    if base in plain and a is None:
        return plain[base]
    if base == "DECIMAL":
        # DECIMAL alone is DECIMAL(10,0), as in SQL (docs/decisions.md).
        return pa.decimal128(int(a) if a is not None else 10, int(b or 0))
    if base in ("TIME", "TIMESTAMP", "TIMESTAMP_LTZ"):
        # Without a precision: 0 for TIME, 6 for the timestamps, as in SQL.
        precision = int(a) if a is not None else (0 if base == "TIME" else 6)
        unit = _unit(precision)
        if base == "TIME":
            return pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)
        return pa.timestamp(unit, tz="UTC" if base == "TIMESTAMP_LTZ" else None)
    raise InvalidArgument(f"invalid type: {name!r} is not a Mink type", "type", name)


def columns_of(schema: pa.Schema | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mink's column list for ``schema``: a pyarrow schema, or already Mink's list of
    ``{"name", "type", "nullable"}``."""
    if isinstance(schema, pa.Schema):
        return [
            {"name": f.name, "type": to_mink_type(f.type, f.name), "nullable": f.nullable}
            for f in schema
        ]
    columns = []
    for i, c in enumerate(schema):
        if not isinstance(c, dict) or "name" not in c or "type" not in c:
            raise InvalidArgument(
                f"invalid columns[{i}]: a column is a dict with 'name' and 'type'", f"columns[{i}]"
            )
        to_arrow_type(str(c["type"]))
        columns.append({"name": c["name"], "type": c["type"], "nullable": c.get("nullable", True)})
    return columns


def arrow_schema(columns: Sequence[dict[str, Any]]) -> pa.Schema:
    """The Arrow schema of a Mink column list, as the node builds it."""
    return pa.schema(
        [
            pa.field(c["name"], to_arrow_type(c["type"]), c.get("nullable", True))
            for c in columns
        ]
    )
