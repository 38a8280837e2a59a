"""The client: a connection to a Mink cluster through any of its nodes."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import pyarrow as pa

from ._conn import Connections
from .errors import InvalidArgument, Unimplemented
from .table import Table
from .types import columns_of

__all__ = ["Client", "connect"]

#: How long ``create_table`` waits for the new table's buckets to get leaders.
_READY_WAIT_S = 30.0


def connect(
    address: str = "grpc://127.0.0.1:9120",
    sql: str | None = None,
    timeout: float | None = 60.0,
    compression: str | None = None,
) -> "Client":
    """A :class:`Client` of the cluster that the node at ``address`` belongs to (any node
    will do: writes and reads are routed to the bucket leaders). ``sql`` is the address
    of a ``mink-query`` server for :meth:`Client.sql`; ``timeout`` bounds every call in
    seconds; ``compression`` (``"zstd"`` or ``"lz4"``) asks the nodes for compressed
    rows on every read, worth it across a network."""
    return Client(address, sql, timeout, compression)


class Client:
    """Catalog calls, tables, and SQL. Thread-safe; close it (or use ``with``) to release
    its connections."""

    def __init__(
        self,
        address: str = "grpc://127.0.0.1:9120",
        sql: str | None = None,
        timeout: float | None = 60.0,
        compression: str | None = None,
    ) -> None:
        self._conn = Connections(address, timeout, compression)
        self._sql_address = sql
        self._sql: Any = None

    # -- catalog ---------------------------------------------------------------------

    def databases(self) -> list[str]:
        """Every database."""
        return list(self._conn.action("list_databases"))

    def create_database(self, name: str, ignore_if_exists: bool = False) -> None:
        """Creates a database (``AlreadyExists`` if it exists, unless ignored)."""
        from .errors import AlreadyExists

        try:
            self._conn.action("create_database", {"name": name})
        except AlreadyExists:
            if not ignore_if_exists:
                raise

    def drop_database(self, name: str, cascade: bool = False) -> None:
        """Drops a database; with ``cascade``, its tables too."""
        self._conn.action("drop_database", {"name": name, "cascade": cascade})

    def database_exists(self, name: str) -> bool:
        return bool(self._conn.action("database_exists", {"name": name})["exists"])

    def tables(self, database: str) -> list[str]:
        """The tables of ``database``, by name."""
        return list(self._conn.action("list_tables", {"database": database}))

    def table_exists(self, path: str) -> bool:
        return bool(self._conn.action("table_exists", {"path": path})["exists"])

    def create_table(
        self,
        path: str,
        schema: pa.Schema | Sequence[dict[str, Any]],
        primary_key: Sequence[str] = (),
        partition_keys: Sequence[str] = (),
        bucket_keys: Sequence[str] | None = None,
        buckets: int = 1,
        bucketing: str = "hash",
        properties: Mapping[str, Any] | None = None,
        comment: str | None = None,
        ignore_if_exists: bool = False,
    ) -> Table:
        """Creates table ``db.name`` and returns it.

        ``schema`` is a ``pyarrow.Schema`` (a field's nullability is kept; a type Mink
        lacks is ``InvalidArgument``) or Mink's column list (``[{"name": "id", "type":
        "BIGINT", "nullable": False}]``). A ``primary_key`` makes a primary-key table
        (upserts, lookups, a changelog); ``bucket_keys`` default to the primary key
        without the partition keys, or none (round-robin) for a log table. ``properties``
        as docs/protocol.md lists them (``log_ttl``, ``merge_engine``, ``lake``, ...)."""
        if buckets < 1:
            raise InvalidArgument(f"invalid buckets: {buckets}; at least 1", "buckets")
        columns = columns_of(schema)
        if isinstance(schema, pa.Schema):
            # A key column cannot be null; say so in the definition too.
            keys = set(primary_key) | set(partition_keys)
            for c in columns:
                if c["name"] in keys:
                    c["nullable"] = False
        descriptor: dict[str, Any] = {
            "schema": {"columns": columns},
            "primary_key": list(primary_key),
            "partition_keys": list(partition_keys),
            "bucket_count": buckets,
            "bucketing": bucketing,
            "properties": dict(properties or {}),
        }
        if bucket_keys is not None:
            descriptor["bucket_keys"] = list(bucket_keys)
        if comment is not None:
            descriptor["comment"] = comment
        self._conn.action(
            "create_table", {"path": path, "descriptor": descriptor, "ignore_if_exists": ignore_if_exists}
        )
        table = self.table(path)
        table._wait_for_leaders(_READY_WAIT_S)
        return table

    def table(self, path: str) -> Table:
        """Table ``db.name`` (``NotFound`` when it does not exist)."""
        return Table(self._conn, path)

    def drop_table(self, path: str) -> None:
        self._conn.action("drop_table", {"path": path})

    # -- the cluster -----------------------------------------------------------------

    def cluster(self) -> dict[str, Any]:
        """The cluster's nodes and the lease (``describe_cluster``)."""
        return dict(self._conn.action("describe_cluster"))

    def health(self) -> dict[str, Any]:
        """The connected node's health."""
        return dict(self._conn.action("health"))

    def action(self, name: str, body: Any = None) -> Any:
        """Any action of docs/protocol.md by name, with a JSON body; the JSON answer."""
        return self._conn.action(name, body)

    @property
    def applied_index(self) -> int:
        """The highest metadata index a node has answered with; later calls wait for it."""
        return self._conn.applied.index

    # -- SQL -------------------------------------------------------------------------

    def sql(self, query: str, parameters: Sequence[Any] | None = None) -> pa.Table:
        """Runs ``query`` on ``mink-query`` (Flight SQL, through the ADBC driver: install
        ``mink-client[sql]``) and returns its rows as a ``pyarrow.Table``. ``parameters``
        bind its ``?`` (or ``$1``, ``$2``, ...) placeholders by position."""
        if self._sql_address is None:
            raise Unimplemented(
                "not implemented: no SQL address; connect with mink.connect(..., sql=\"grpc://host:9130\")"
            )
        if self._sql is None:
            try:
                import adbc_driver_flightsql.dbapi as dbapi
            except ImportError as e:
                raise Unimplemented(
                    "not implemented: SQL needs the ADBC Flight SQL driver: pip install 'mink-client[sql]'"
                ) from e
            self._sql = dbapi.connect(_grpc(self._sql_address), autocommit=True)
        from .errors import from_flight

        cursor = self._sql.cursor()
        try:
            cursor.execute(query, parameters)
            return cursor.fetch_arrow_table()
        except Exception as e:  # noqa: BLE001 - the driver's errors become Mink's
            raise _sql_error(e, from_flight) from e
        finally:
            cursor.close()

    # -- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        if self._sql is not None:
            self._sql.close()
            self._sql = None
        self._conn.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<mink.Client {self._conn.bootstrap}>"


def _grpc(address: str) -> str:
    return address if "://" in address else f"grpc://{address}"


def _sql_error(e: Exception, from_flight: Any) -> Exception:
    from .errors import InvalidArgument as Invalid, MinkError

    err: MinkError = from_flight(e)
    text = str(e)
    if type(e).__name__ in ("ProgrammingError", "DataError") and not isinstance(err, Invalid):
        return Invalid(text, "sql")
    err.message = text
    err.args = (text,)
    return err


_ = json  # the module's JSON is in Connections
