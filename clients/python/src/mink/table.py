"""A Mink table: its definition, writes, reads, lookups and tail."""

from __future__ import annotations

import decimal
import json
import threading
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight

from ._conn import Connections, location
from ._convert import Data, conform, one_batch, to_arrow
from .errors import InvalidArgument, MinkError, NotFound, NotLeader, StorageFailure, Unavailable
from .result import ScanResult
from .types import arrow_schema
from .writer import BucketWritten, Writer

if TYPE_CHECKING:
    from .tail import Tail

__all__ = ["Table", "BucketWritten"]

#: Keys of one ``lookup`` call (the node's limit); longer lists are sent in parts.
LOOKUP_KEYS_MAX = 10_000
#: Attempts of a read that keeps finding the bucket moved.
_READ_ATTEMPTS = 8


def _bucket_key(b: Mapping[str, Any]) -> tuple[int | None, int]:
    return (b.get("partition_id"), int(b["bucket"]))


class Table:
    """One table, as ``client.table("db.t")`` returns it. Its definition is read once
    and refreshed when a write or read finds it stale (a moved leader, a new partition);
    call :meth:`refresh` after altering the table elsewhere."""

    def __init__(self, conn: Connections, path: str, info: dict[str, Any] | None = None) -> None:
        self._conn = conn
        self.path = path
        self._lock = threading.Lock()
        self._leaders: dict[tuple[int | None, int], str | None] = {}
        self._info: dict[str, Any] = {}
        self._writer: Writer | None = None
        if info is None:
            self._refresh()
        else:
            self._set_info(info)

    # -- definition ------------------------------------------------------------------

    def _set_info(self, info: dict[str, Any]) -> None:
        d = info["descriptor"]
        with self._lock:
            self._info = info
            self.id: int = int(info["id"])
            self.descriptor: dict[str, Any] = d
            self.schema_id: int = int(d["schema"].get("schema_id", 1))
            self.columns: list[dict[str, Any]] = d["schema"]["columns"]
            self.arrow_schema: pa.Schema = arrow_schema(self.columns)
            self.primary_key: list[str] = list(d.get("primary_key") or [])
            self.partition_keys: list[str] = list(d.get("partition_keys") or [])
            keys = d.get("bucket_keys")
            if keys is None:
                keys = [k for k in self.primary_key if k not in self.partition_keys]
            self.bucket_keys: list[str] = list(keys)
            self.bucket_count: int = int(d.get("bucket_count", 1))
            self.bucketing: str = str(d.get("bucketing", "hash"))
            self.properties: dict[str, Any] = dict(d.get("properties") or {})
            self.partitions: dict[str, int] = {
                name: int(p["id"]) for name, p in (info.get("partitions") or {}).items()
            }

    @property
    def has_primary_key(self) -> bool:
        return bool(self.primary_key)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """Every schema version of the table, oldest first."""
        return list(self._info.get("schemas") or [self.descriptor["schema"]])

    def _refresh(self) -> None:
        meta = self._conn.action("metadata", {"path": self.path})
        self._set_info(meta["table"])
        with self._lock:
            self._leaders = {
                _bucket_key(b["bucket"]): b.get("leader_address") for b in meta["buckets"]
            }

    def _wait_for_leaders(self, timeout: float) -> None:
        """Waits (up to ``timeout`` s) until every bucket has a leader: a new table's
        first writes then need no retry."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                ready = all(self._leaders.values())
            if ready:
                return
            time.sleep(0.05)
            self._refresh()

    def refresh(self) -> "Table":
        """Reads the table's definition, partitions and bucket leaders again."""
        self._refresh()
        return self

    def _leader(self, key: tuple[int | None, int]) -> str | None:
        with self._lock:
            if key in self._leaders and self._leaders[key]:
                return self._leaders[key]
        self._refresh()
        with self._lock:
            return self._leaders.get(key)

    def _moved(self, key: tuple[int | None, int], leader: str | None) -> None:
        if leader:
            with self._lock:
                self._leaders[key] = leader
        else:
            self._refresh()

    def _partition_id(self, name: str | None) -> int | None:
        if name is None:
            return None
        with self._lock:
            pid = self.partitions.get(name)
        if pid is None:
            self._refresh()
            with self._lock:
                pid = self.partitions.get(name)
        if pid is None:
            raise NotFound(f"not found: partition {name!r} of {self.path}")
        return pid

    def _ensure_partitions(self, names: Iterable[str]) -> None:
        missing = [n for n in names if n not in self.partitions]
        for name in missing:
            self._conn.action("create_partition", {"path": self.path, "name": name})
        if missing:
            self._refresh()

    def __repr__(self) -> str:
        kind = "primary-key" if self.has_primary_key else "log"
        return f"<mink.Table {self.path} ({kind}, {self.bucket_count} buckets)>"

    # -- administration --------------------------------------------------------------

    def alter(
        self,
        add_columns: pa.Schema | Sequence[dict[str, Any]] | None = None,
        set_properties: Mapping[str, Any] | None = None,
    ) -> "Table":
        """Adds nullable columns (a new schema version) and sets properties."""
        from .types import columns_of

        body: dict[str, Any] = {"path": self.path}
        if add_columns is not None:
            body["add_columns"] = columns_of(add_columns)
        if set_properties:
            body["set_properties"] = {
                k: v if isinstance(v, str) else json.dumps(v) for k, v in set_properties.items()
            }
        self._conn.action("alter_table", body)
        return self.refresh()

    def drop(self) -> None:
        """Drops the table and its data."""
        self._conn.action("drop_table", {"path": self.path})

    def partition_names(self) -> list[str]:
        """The table's partitions, by name."""
        return [p["name"] for p in self._conn.action("list_partitions", {"path": self.path})]

    def create_partition(self, name: str) -> int:
        """Creates a partition (an existing one is fine); returns its id."""
        answer = self._conn.action("create_partition", {"path": self.path, "name": name})
        self._refresh()
        return int(answer["partition_id"])

    def drop_partition(self, name: str) -> None:
        self._conn.action("drop_partition", {"path": self.path, "name": name})
        self._refresh()

    def buckets(self) -> list[dict[str, Any]]:
        """Every bucket (of every partition) with its leader, leader address and epoch."""
        self._refresh()
        return list(self._conn.action("metadata", {"path": self.path})["buckets"])

    def offsets(
        self,
        spec: str = "latest",
        timestamp: int | None = None,
        partition: str | None = None,
        buckets: Sequence[int] | None = None,
    ) -> dict[int, int | None]:
        """Each bucket's ``earliest`` or ``latest`` offset, or the first at or after
        ``timestamp`` (ms) with ``spec="timestamp"``."""
        body: dict[str, Any] = {"path": self.path, "spec": spec}
        if timestamp is not None:
            body["timestamp"] = timestamp
        if partition is not None:
            body["partition"] = partition
        if buckets is not None:
            body["buckets"] = list(buckets)
        return {int(o["bucket"]["bucket"]): o["offset"] for o in self._conn.action("list_offsets", body)}

    # -- writes ----------------------------------------------------------------------

    def _do_put(
        self, command: dict[str, Any], batch: pa.RecordBatch, meta: dict[str, Any] | None, address: str | None
    ) -> dict[str, Any]:
        descriptor = flight.FlightDescriptor.for_command(json.dumps(command).encode())

        def run(c: flight.FlightClient) -> dict[str, Any]:
            writer, reader = c.do_put(descriptor, batch.schema, options=self._conn.options())
            try:
                body = pa.py_buffer(json.dumps(meta).encode()) if meta else None
                if body is not None:
                    writer.write_with_metadata(batch, body)
                else:
                    writer.write_batch(batch)
                answer = reader.read()
                writer.done_writing()
            finally:
                writer.close()
            if answer is None:
                # Not the node's own refusal: it may have written the rows first.
                raise Unavailable("the node closed the write without an answer")
            return dict(json.loads(answer.to_pybytes()))

        return self._conn.call(run, address)

    def append(self, data: Data) -> list[BucketWritten]:
        """Appends rows to a log table in one call: the node splits them by partition and
        bucket and writes every part (not idempotent across retries; use
        :meth:`writer` for that). Returns each bucket's offsets once durable."""
        if self.has_primary_key:
            raise InvalidArgument(
                f"invalid write: {self.path} has a primary key; use upsert() and delete()", "write"
            )
        rows = conform(data, self.arrow_schema)
        return self._write_table({"AppendTable": {"path": self.path, "schema_id": self.schema_id}}, rows, None)

    def upsert(self, data: Data, columns: Sequence[str] | None = None) -> list[BucketWritten]:
        """Inserts or updates rows of a primary-key table by key; with ``columns``, only
        those columns (which must include the key): a partial update."""
        self._need_key("upsert")
        rows = conform(data, self.arrow_schema, self._targets(columns))
        return self._write_table(self._put_command(columns), rows, None)

    def delete(self, keys: Data) -> list[BucketWritten]:
        """Deletes rows of a primary-key table by key (``keys`` holds the key columns)."""
        self._need_key("delete")
        rows = delete_rows(keys, self.arrow_schema, self.primary_key)
        return self._write_table(self._put_command(None), rows, ["-D"] * rows.num_rows)

    def _need_key(self, what: str) -> None:
        if not self.has_primary_key:
            raise InvalidArgument(f"invalid write: {what} needs a primary-key table; {self.path} is a log table", "write")

    def _targets(self, columns: Sequence[str] | None) -> list[str] | None:
        if columns is None:
            return None
        missing = [k for k in self.primary_key if k not in columns]
        if missing:
            raise InvalidArgument(
                f"invalid columns: a partial update must include the primary key; {missing[0]!r} is missing",
                "columns",
            )
        return [c for c in self.arrow_schema.names if c in columns]

    def _put_command(self, columns: Sequence[str] | None) -> dict[str, Any]:
        targets = self._targets(columns)
        if targets is not None and len(targets) == len(self.arrow_schema):
            targets = None
        return {"PutTable": {"path": self.path, "schema_id": self.schema_id, "target_columns": targets}}

    def _write_table(
        self, command: dict[str, Any], rows: pa.Table, changes: list[str] | None
    ) -> list[BucketWritten]:
        from . import routing

        if self.partition_keys:
            routing.partition_names(rows, self.partition_keys)
        if self.has_primary_key:
            routing.check_no_nulls(rows, self.primary_key, "primary key")
        if rows.num_rows == 0:
            return []
        out: list[BucketWritten] = []
        # One DoPut per chunk of at most a few MiB; the node routes each.
        step = max(1, -(-rows.num_rows // max(1, -(-rows.nbytes // (8 << 20)))))
        for start in range(0, rows.num_rows, step):
            batch = one_batch(rows.slice(start, step))
            meta = {"changes": changes[start : start + step]} if changes is not None else None
            try:
                answer = self._do_put(command, batch, meta, None)
            except Unavailable as e:
                raise table_write_error(e) from e
            routed = answer.get("Routed")
            if routed is None:
                raise MinkError(f"internal error: the node answered {answer}")
            out += [BucketWritten.of(b) for b in routed["buckets"]]
        return out

    def writer(self, depth: int | None = None) -> Writer:
        """A :class:`Writer`: routes on the client, writes each bucket at its leader with
        idempotent sequences, retries through leader moves; share it between threads."""
        return Writer(self, depth)

    # -- reads -----------------------------------------------------------------------

    def _endpoints(self) -> list[tuple[dict[str, Any], str | None]]:
        descriptor = flight.FlightDescriptor.for_path(self.path)
        info = self._conn.call(lambda c: c.get_flight_info(descriptor, options=self._conn.options()))
        out = []
        for e in info.endpoints:
            ticket = json.loads(e.ticket.ticket)
            loc = e.locations[0].uri.decode() if e.locations else None
            out.append((ticket["Scan"], loc))
        return out

    def _read_bucket(
        self, ticket: dict[str, Any], address: str | None, kind: str = "Scan"
    ) -> Iterator[tuple[pa.RecordBatch, dict[str, Any]]]:
        """Every batch of a bucket read (``Scan`` from ``offset`` to ``end_offset``, or
        ``Snapshot``), following the bucket's leader when it moves."""
        key = _bucket_key(ticket["bucket"])
        ticket = dict(ticket)
        for _ in range(_READ_ATTEMPTS):
            if address is None:
                address = self._leader(key)
            t = flight.Ticket(json.dumps({kind: ticket}).encode())
            try:
                reader = self._conn.call(lambda c: c.do_get(t, options=self._conn.options()), address)
                while True:
                    try:
                        chunk = self._conn.call(lambda _c: reader.read_chunk(), address)
                    except StopIteration:
                        return
                    if chunk.data is None:
                        continue
                    meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
                    if kind == "Scan" and "base_offset" in meta:
                        # A filtered batch says where its stored rows ended.
                        ticket["offset"] = meta.get("next_offset", meta["base_offset"] + chunk.data.num_rows)
                    yield chunk.data, meta
            except NotLeader as e:
                address = location(e.leader) if e.leader else None
                if address is None:
                    self._refresh()
                continue
            except Unavailable:
                self._refresh()
                address = None
                continue
            except MinkError as e:
                if kind == "Scan" and "end_offset" in ticket and ticket["offset"] >= ticket["end_offset"]:
                    return
                raise e
        raise Unavailable(f"unavailable: {self.path} bucket {key[1]} kept moving while it was read")

    def _read_whole(self, ticket: dict[str, Any], address: str | None) -> list[pa.RecordBatch]:
        """A log bucket's ``Scan`` read whole in one call (pyarrow's ``read_all``, no
        Python per batch); a moved leader is read again from the ticket's start (nothing
        of the failed read was handed out)."""
        key = _bucket_key(ticket["bucket"])
        t = flight.Ticket(json.dumps({"Scan": ticket}).encode())
        for _ in range(_READ_ATTEMPTS):
            if address is None:
                address = self._leader(key)
            try:
                table = self._conn.call(
                    lambda c: c.do_get(t, options=self._conn.options()).read_all(), address
                )
                return list(table.to_batches())
            except NotLeader as e:
                address = location(e.leader) if e.leader else None
                if address is None:
                    self._refresh()
            except Unavailable:
                self._refresh()
                address = None
        raise Unavailable(f"unavailable: {self.path} bucket {key[1]} kept moving while it was read")

    def scan(
        self,
        columns: Sequence[str] | None = None,
        partitions: Sequence[str] | None = None,
        buckets: Sequence[int] | None = None,
        from_offsets: Mapping[Any, int] | None = None,
        until: str | Mapping[Any, int] = "now",
        filter: Mapping[str, Any] | None = None,
    ) -> ScanResult:
        """The table's rows up to now (each bucket's high watermark when the call is
        made), bucket by bucket in offset order; for a primary-key table its changelog,
        with a ``_change_type`` column (``+I``, ``-U``, ``+U``, ``-D``).

        ``partitions`` and ``buckets`` narrow the read; ``from_offsets`` maps a bucket
        (or ``(partition, bucket)``) to the offset to start from, ``until`` (``"now"``
        or offsets mapped the same way) to the offset to stop before. ``filter`` (the
        protocol's typed filter, docs/protocol.md, e.g. ``{"compare": {"column":
        "score", "op": ">", "value": 50}}``) is evaluated on the nodes: only the rows
        for which it holds are sent."""
        if isinstance(until, str) and until != "now":
            raise InvalidArgument(f"invalid until: {until!r}; 'now' or offsets by bucket", "until")
        self._check_columns(columns)
        endpoints = self._endpoints()
        wanted_pids = None
        if partitions is not None:
            self._refresh()
            unknown = [p for p in partitions if p not in self.partitions]
            if unknown:
                raise NotFound(f"not found: partition {unknown[0]!r} of {self.path}")
            wanted_pids = {self.partitions[p] for p in partitions}
        names = {pid: name for name, pid in self.partitions.items()}
        chosen = []
        for ticket, address in endpoints:
            pid, b = _bucket_key(ticket["bucket"])
            if wanted_pids is not None and pid not in wanted_pids:
                continue
            if buckets is not None and b not in buckets:
                continue
            if from_offsets is not None:
                start = _by_bucket(from_offsets, names.get(pid) if pid is not None else None, b)
                if start is not None:
                    ticket = dict(ticket, offset=max(int(ticket["offset"]), int(start)))
            if not isinstance(until, str):
                stop = _by_bucket(until, names.get(pid) if pid is not None else None, b)
                if stop is not None:
                    ticket = dict(ticket, end_offset=min(int(ticket.get("end_offset") or 0), int(stop)))
            if columns is not None:
                # The node answers those columns alone (docs/protocol.md, `columns`).
                ticket = dict(ticket, columns=list(columns))
            if filter is not None:
                ticket = dict(ticket, filter=dict(filter))
            chosen.append((ticket, address))
        with_changes = self.has_primary_key

        def batches() -> Iterator[pa.RecordBatch]:
            for ticket, address in chosen:
                if int(ticket["offset"]) >= int(ticket.get("end_offset") or 0):
                    continue
                if not with_changes:
                    # A log table needs no batch metadata: the bucket in one call.
                    for batch in self._read_whole(ticket, address):
                        yield batch if columns is None else batch.select(list(columns))
                    continue
                for batch, meta in self._read_bucket(ticket, address):
                    out = batch
                    if with_changes:
                        types = meta.get("change_types") or ["+I"] * batch.num_rows
                        out = out.append_column("_change_type", pa.array(types, pa.string()))
                    if columns is not None:
                        keep = list(columns) + (["_change_type"] if with_changes else [])
                        out = out.select(keep)
                    yield out

        return ScanResult(batches(), self._scan_schema(columns, with_changes))

    def _check_columns(self, columns: Sequence[str] | None) -> None:
        for c in columns or []:
            if c not in self.arrow_schema.names:
                raise InvalidArgument(
                    f"invalid column {c!r}: {self.path} has no such column (it has {', '.join(self.arrow_schema.names)})",
                    f"column {c!r}",
                )

    def _scan_schema(self, columns: Sequence[str] | None, with_changes: bool) -> pa.Schema:
        schema = self.arrow_schema
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        if with_changes:
            schema = schema.append(pa.field("_change_type", pa.string()))
        return schema

    def snapshot(
        self, columns: Sequence[str] | None = None, filter: Mapping[str, Any] | None = None
    ) -> ScanResult:
        """A primary-key table's current state: every bucket's newest KV snapshot plus
        its changelog since, merged by key (deletes applied). ``filter`` names
        primary-key columns only (a row's values may change after its snapshot) and
        is evaluated on the nodes."""
        self._need_key("snapshot")
        self._check_columns(columns)
        endpoints = self._endpoints()
        # The columns read from the nodes: those asked, and the key the merge needs.
        read = None
        schema = self.arrow_schema
        if columns is not None:
            read = [c for c in schema.names if c in columns or c in self.primary_key]
            schema = pa.schema([schema.field(c) for c in read])
        pieces: list[pa.Table] = []
        for ticket, address in endpoints:
            end = int(ticket.get("end_offset") or 0)
            state: list[pa.RecordBatch] = []
            log_offset = 0
            snapshot: dict[str, Any] = {"bucket": ticket["bucket"]}
            if read is not None:
                snapshot["columns"] = read
            if filter is not None:
                snapshot["filter"] = dict(filter)
            for batch, meta in self._read_bucket(snapshot, address, "Snapshot"):
                state.append(batch)
                log_offset = int(meta.get("log_offset", log_offset))
            if not state:
                # An empty snapshot still names its offset in a metadata-only message;
                # without one, replay the whole retained changelog.
                log_offset = int(ticket["offset"])
            changes: list[pa.RecordBatch] = []
            types: list[str] = []
            if log_offset < end:
                scan = dict(ticket, offset=log_offset, end_offset=end)
                if read is not None:
                    scan["columns"] = read
                if filter is not None:
                    scan["filter"] = dict(filter)
                for batch, meta in self._read_bucket(scan, address):
                    changes.append(batch)
                    types += meta.get("change_types") or ["+I"] * batch.num_rows
            pieces.append(_merge(schema, self.primary_key, state, changes, types))
        table = pa.concat_tables(pieces) if pieces else schema.empty_table()
        if columns is not None:
            table = table.select(list(columns))
        return ScanResult(iter(table.to_batches()), table.schema)

    def lake(self, snapshot_id: int | None = None) -> ScanResult:
        """The table's newest lake (Iceberg) snapshot, or ``snapshot_id``; for a
        primary-key table, its state."""
        body: dict[str, Any] = {"path": self.path}
        if snapshot_id is not None:
            body["snapshot_id"] = snapshot_id
        return self._read_any("Lake", body)

    def union(self) -> ScanResult:
        """The newest lake snapshot plus each bucket's log beyond it: every row once
        (for a primary-key table, its state)."""
        return self._read_any("Union", {"path": self.path})

    def _read_any(self, kind: str, body: dict[str, Any]) -> ScanResult:
        t = flight.Ticket(json.dumps({kind: body}).encode())
        reader = self._conn.call(lambda c: c.do_get(t, options=self._conn.options()))
        schema = self._conn.call(lambda _c: reader.schema)

        def batches() -> Iterator[pa.RecordBatch]:
            while True:
                try:
                    chunk = self._conn.call(lambda _c: reader.read_chunk())
                except StopIteration:
                    return
                if chunk.data is not None:
                    yield chunk.data

        return ScanResult(batches(), schema)

    # -- lookups ---------------------------------------------------------------------

    def lookup(self, keys: Any) -> pa.Table:
        """The rows with these primary keys (absent keys have no row): ``keys`` is one
        key (a value or tuple), a list of them, a list of dicts, or a pyarrow table or
        DataFrame of the key columns."""
        self._need_key("lookup")
        rows = self._json_keys(keys, self.primary_key)
        # The node answers at most LOOKUP_KEYS_MAX keys a call.
        found = [
            self._ipc(self._conn.action_raw("lookup", {"path": self.path, "keys": rows[i : i + LOOKUP_KEYS_MAX]}))
            for i in range(0, max(1, len(rows)), LOOKUP_KEYS_MAX)
        ]
        return pa.concat_tables(found) if len(found) > 1 else found[0]

    def prefix_lookup(self, prefix: Any, limit: int | None = None) -> pa.Table:
        """The rows whose leading primary-key columns (the partition and bucket keys)
        equal ``prefix``, in key order."""
        self._need_key("prefix lookup")
        values = list(prefix) if isinstance(prefix, (list, tuple)) else [prefix]
        columns = self.primary_key[: len(values)]
        [row] = self._json_keys([tuple(values)], columns)
        body: dict[str, Any] = {"path": self.path, "prefix": row}
        if limit is not None:
            body["limit"] = limit
        return self._ipc(self._conn.action_raw("prefix_lookup", body))

    def _ipc(self, payload: bytes) -> pa.Table:
        if not payload:
            return self.arrow_schema.empty_table()
        return pa.ipc.open_stream(payload).read_all()

    def _json_keys(self, keys: Any, columns: Sequence[str]) -> list[list[Any]]:
        if isinstance(keys, (list, tuple)) and keys and all(isinstance(k, dict) for k in keys):
            table = conform(list(keys), self.arrow_schema, columns, fill_missing=False)
        elif isinstance(keys, (list, tuple)) or not hasattr(keys, "__arrow_c_stream__") and not _is_frame(keys):
            rows = list(keys) if isinstance(keys, list) else [keys]
            if isinstance(keys, tuple) and len(columns) > 1 and not isinstance(keys[0], (tuple, list)):
                rows = [keys]
            tuples = [r if isinstance(r, (tuple, list)) else (r,) for r in rows]
            for r in tuples:
                if len(r) != len(columns):
                    raise InvalidArgument(
                        f"invalid key: {tuple(r)!r} has {len(r)} values; the key is {list(columns)}", "key"
                    )
            dicts = [dict(zip(columns, r)) for r in tuples]
            table = conform(dicts, self.arrow_schema, columns, fill_missing=False)
        else:
            table = conform(to_arrow(keys), self.arrow_schema, columns, fill_missing=False)
        from . import routing

        routing.check_no_nulls(table, list(columns), "key column")
        out_columns = [_json_values(table.column(c)) for c in columns]
        return [list(r) for r in zip(*out_columns)]

    # -- tail ------------------------------------------------------------------------

    def tail(
        self,
        from_: str | Mapping[Any, int] = "latest",
        buckets: Sequence[int] | None = None,
        partitions: Sequence[str] | None = None,
        stop_after: float | None = None,
        max_rows: int | None = None,
        idle_timeout: float | None = None,
    ) -> "Tail":
        """Follows the table's new rows: iterate the returned :class:`~mink.tail.Tail`
        for :class:`~mink.tail.TailBatch` es from every bucket (partitions created while
        it runs included). ``from_`` is ``"latest"``, ``"earliest"`` or offsets by
        bucket; it stops after ``stop_after`` seconds, ``max_rows`` rows or
        ``idle_timeout`` seconds without rows, or when closed."""
        from .tail import Tail

        return Tail(self, from_, buckets, partitions, stop_after, max_rows, idle_timeout)


def _by_bucket(offsets: Mapping[Any, int], partition: str | None, bucket: int) -> int | None:
    """The offset ``offsets`` gives a bucket: keyed by ``(partition, bucket)``, or by the
    bucket number alone."""
    for key in ((partition, bucket), bucket):
        if key in offsets:
            return int(offsets[key])
    return None


def delete_rows(keys: Data, schema: pa.Schema, key: Sequence[str]) -> pa.Table:
    """Whole rows that delete these keys: a delete is a ``-D`` row of the full schema
    (with target columns it would be a partial delete, which only clears those
    columns); the other columns are null, or a placeholder where they cannot be null
    (the merge ignores a delete's values: the changelog carries the old row)."""
    ids = conform(keys, schema, key, fill_missing=False)
    columns = []
    for field in schema:
        if field.name in key:
            columns.append(ids.column(field.name))
        elif field.nullable:
            columns.append(pa.chunked_array([pa.nulls(ids.num_rows, field.type)]))
        else:
            columns.append(pa.chunked_array([pc.fill_null(pa.nulls(ids.num_rows, field.type), _placeholder(field.type))]))
    return pa.Table.from_arrays(columns, schema=schema)


def _placeholder(t: pa.DataType) -> pa.Scalar:
    if pa.types.is_string(t):
        return pa.scalar("", t)
    if pa.types.is_binary(t):
        return pa.scalar(b"", t)
    if pa.types.is_boolean(t):
        return pa.scalar(False, t)
    if pa.types.is_decimal(t):
        return pa.scalar(decimal.Decimal(0), t)
    return pa.scalar(0, pa.int64()).cast(t) if not pa.types.is_floating(t) else pa.scalar(0.0, t)


def _is_frame(x: Any) -> bool:
    return type(x).__module__.split(".")[0] in ("pandas", "polars") or isinstance(
        x, (pa.Table, pa.RecordBatch)
    )


def _json_values(column: pa.ChunkedArray) -> list[Any]:
    """Key values as the node's ``lookup`` reads them from JSON."""
    t = column.type
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return list(column.cast(pa.int32()).to_pylist())
    if pa.types.is_time64(t) or pa.types.is_timestamp(t):
        return list(column.cast(pa.int64()).to_pylist())
    if pa.types.is_decimal(t):
        return [str(int(decimal.Decimal(v).scaleb(t.scale))) for v in column.to_pylist()]
    if pa.types.is_binary(t):
        try:
            return [v.decode() for v in column.to_pylist()]
        except UnicodeDecodeError as e:
            raise InvalidArgument("invalid key: a BYTES key value must be UTF-8 to be looked up", "key") from e
    if pa.types.is_floating(t):
        return [repr(float(v)) for v in column.to_pylist()]
    return list(column.to_pylist())


def _merge(
    schema: pa.Schema,
    key: Sequence[str],
    state: list[pa.RecordBatch],
    changes: list[pa.RecordBatch],
    types: list[str],
) -> pa.Table:
    """A bucket's state: the snapshot's rows, then the changelog's in offset order, the
    last row of each key winning, a key whose last change is a delete dropped (``-U``
    rows are always followed by their ``+U`` and are skipped)."""
    parts = [pa.Table.from_batches(state, schema=schema) if state else schema.empty_table()]
    flags = [pa.array([False] * parts[0].num_rows, pa.bool_())]
    if changes:
        log = pa.Table.from_batches(changes).cast(schema)
        kinds = pa.array(types, pa.string())
        keep = pc.not_equal(kinds, "-U")
        parts.append(log.filter(keep))
        flags.append(pc.equal(kinds.filter(keep), "-D"))
    rows = pa.concat_tables(parts)
    if rows.num_rows == 0:
        return rows
    deleted = pa.concat_arrays(flags)
    rows = rows.append_column("__ord", pa.array(range(rows.num_rows), pa.int64()))
    rows = rows.append_column("__del", deleted)
    # The last row of every key: sorted by key, then by position, each run's last.
    order = pc.sort_indices(rows, sort_keys=[(k, "ascending") for k in key] + [("__ord", "ascending")])
    rows = rows.take(order)
    n = rows.num_rows
    last = np.ones(n, dtype=bool)
    if n > 1:
        changed = np.zeros(n - 1, dtype=bool)
        for k in key:
            column = rows.column(k)
            changed |= np.asarray(
                pc.not_equal(column.slice(0, n - 1), column.slice(1)).to_numpy(zero_copy_only=False), dtype=bool
            )
        last[:-1] = changed
    winners = rows.filter(pa.array(last))
    winners = winners.filter(pc.invert(winners.column("__del")))
    winners = winners.take(pc.sort_indices(winners.column("__ord")))
    return winners.drop_columns(["__ord", "__del"])


# gRPC's words for a connection that could not be made: nothing was sent.
_NOT_SENT = ("failed to connect to all addresses", "Connection refused")


def table_write_error(e: Unavailable) -> MinkError:
    """What a table write (no writer id) that failed with ``e`` tells its caller. The
    node's own refusal (its text begins ``unavailable: ``) or a connection never made
    wrote nothing: ``e`` as it is. Any other failure of the call (a connection lost
    mid-request, a deadline, a write closed without an answer) may come after the node
    wrote the rows, and nothing would deduplicate a second attempt: a
    :class:`StorageFailure`, the outcome unknown (``append`` again may write them
    twice), as the node answers when it cannot tell itself."""
    text = e.message
    if text.startswith("unavailable: ") or any(m in text for m in _NOT_SENT):
        return e
    return StorageFailure(f"storage failure: the write's outcome is unknown ({text}); without a writer id it is not retried")
