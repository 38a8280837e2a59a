"""What a read returns: a stream of Arrow record batches, and its conversions."""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa

__all__ = ["ScanResult"]


class ScanResult:
    """The batches of one read, streamed as they arrive. Iterate it for
    ``pyarrow.RecordBatch`` es, or collect it with :meth:`to_arrow`, :meth:`to_pandas`,
    :meth:`to_polars` or :meth:`to_pylist` (a result is read once)."""

    def __init__(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> None:
        self._batches = batches
        self.schema = schema
        self._used = False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        if self._used:
            raise RuntimeError("this result was read already; read the table again")
        self._used = True
        return self._batches

    def to_arrow(self) -> pa.Table:
        """Every batch as one ``pyarrow.Table``."""
        batches = list(self)
        if not batches:
            return self.schema.empty_table()
        return pa.Table.from_batches(batches, schema=batches[0].schema)

    def to_pandas(self, **kwargs: Any) -> Any:
        """A pandas DataFrame (needs pandas: ``pip install 'mink-client[pandas]'``)."""
        try:
            import pandas  # noqa: F401
        except ImportError as e:
            raise ImportError("to_pandas() needs pandas: pip install 'mink-client[pandas]'") from e
        return self.to_arrow().to_pandas(**kwargs)

    def to_polars(self) -> Any:
        """A Polars DataFrame (needs polars: ``pip install 'mink-client[polars]'``)."""
        try:
            import polars
        except ImportError as e:
            raise ImportError("to_polars() needs polars: pip install 'mink-client[polars]'") from e

        return polars.from_arrow(self.to_arrow())

    def to_pylist(self) -> list[dict[str, Any]]:
        """The rows as dicts."""
        return list(self.to_arrow().to_pylist())

    def to_reader(self) -> pa.RecordBatchReader:
        """A ``pyarrow.RecordBatchReader`` over the batches (DuckDB, Polars and Arrow
        consumers take one without a copy)."""
        return pa.RecordBatchReader.from_batches(self.schema, iter(self))
