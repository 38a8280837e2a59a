"""Following a table: the long poll (DoExchange ``Tail``) over every bucket at once.

One thread per bucket holds a ``Tail`` exchange with the bucket's leader and sends the
next poll from the offset the last answer ended at; the node answers when rows are
readable (woken by the high watermark) or at the poll's deadline. A bucket that moves is
followed to its new leader; partitions created while the tail runs are picked up from
the table's metadata (read every ``partition_refresh_s``) and followed from their start.
Batches reach the caller through one queue, so iteration needs no lock.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.flight as flight

from ._conn import location
from .errors import MinkError, NotLeader, OffsetOutOfRange, Unavailable

if TYPE_CHECKING:
    from .table import Table

__all__ = ["Tail", "TailBatch"]

#: A poll's ``max_wait_ms``: how long an idle bucket's request waits at the node.
POLL_WAIT_MS = 5_000
#: Batches read ahead of the caller before the bucket threads wait.
QUEUE_MAX = 64


@dataclass(frozen=True)
class TailBatch:
    """Rows of one bucket, at offsets ``offset .. offset + num_rows``."""

    data: pa.RecordBatch
    bucket: int
    partition: str | None
    offset: int
    change_types: list[str] | None
    commit_timestamp: int | None

    @property
    def num_rows(self) -> int:
        return int(self.data.num_rows)

    def to_pylist(self) -> list[dict[str, Any]]:
        return list(self.data.to_pylist())


_END = object()


class Tail:
    """An iterator of :class:`TailBatch` (also ``async for``). ``positions`` is the next
    offset of every bucket the caller has been given rows of, or started at: pass it as
    ``from_`` to resume. Stops at ``stop_after`` seconds, ``max_rows`` rows,
    ``idle_timeout`` seconds without rows, or :meth:`close`."""

    partition_refresh_s = 1.0

    def __init__(
        self,
        table: "Table",
        from_: str | Mapping[Any, int],
        buckets: Sequence[int] | None,
        partitions: Sequence[str] | None,
        stop_after: float | None,
        max_rows: int | None,
        idle_timeout: float | None,
    ) -> None:
        if isinstance(from_, str) and from_ not in ("latest", "earliest"):
            raise MinkError(f"invalid from_: {from_!r}; 'latest', 'earliest' or offsets")
        self.table = table
        self._from = from_
        self._buckets = None if buckets is None else set(buckets)
        self._partitions = None if partitions is None else set(partitions)
        self._deadline = None if stop_after is None else time.monotonic() + stop_after
        self._max_rows = max_rows
        self._idle = idle_timeout
        self._rows = 0
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_MAX)
        self._stop = threading.Event()
        self._followed: set[tuple[int | None, int]] = set()
        self._readers: dict[tuple[int | None, int], Any] = {}
        self._lock = threading.Lock()
        self.positions: dict[tuple[str | None, int], int] = {}
        self._error: BaseException | None = None
        self._started = False
        self._threads: list[threading.Thread] = []

    # -- iteration -------------------------------------------------------------------

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        self._discover(first=True)
        watcher = threading.Thread(target=self._watch, name="mink-tail-partitions", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    def __iter__(self) -> Iterator[TailBatch]:
        self._start()
        return self

    def __next__(self) -> TailBatch:
        item = self._next(block=True)
        if item is None:
            raise StopIteration
        return item

    def _next(self, block: bool) -> TailBatch | None:
        self._start()
        idle_since = time.monotonic()
        while True:
            if self._stop.is_set() and self._queue.empty():
                self._raise_error()
                return None
            if self._max_rows is not None and self._rows >= self._max_rows:
                self.close()
                return None
            now = time.monotonic()
            waits = [0.2]
            if self._deadline is not None:
                if now >= self._deadline:
                    self.close()
                    return None
                waits.append(self._deadline - now)
            if self._idle is not None:
                if now - idle_since >= self._idle:
                    self.close()
                    return None
                waits.append(self._idle - (now - idle_since))
            try:
                item = self._queue.get(timeout=max(0.001, min(waits)))
            except queue.Empty:
                continue
            if item is _END:
                self._raise_error()
                continue
            batch: TailBatch = item
            self._rows += batch.num_rows
            self.positions[(batch.partition, batch.bucket)] = batch.offset + batch.num_rows
            return batch

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            self.close()
            raise error

    def __aiter__(self) -> AsyncIterator[TailBatch]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[TailBatch]:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await loop.run_in_executor(None, self._next, True)
                if item is None:
                    return
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stops every bucket's poll."""
        self._stop.set()
        with self._lock:
            readers = list(self._readers.values())
        for r in readers:
            try:
                r.cancel()
            except Exception:  # noqa: BLE001 - the stream may have ended already
                pass

    def __enter__(self) -> "Tail":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- buckets ---------------------------------------------------------------------

    def _discover(self, first: bool) -> None:
        t = self.table
        t.refresh()
        names = {pid: name for name, pid in t.partitions.items()}
        keys = [k for k in t._leaders]
        new = []
        for pid, b in keys:
            name = names.get(pid) if pid is not None else None
            if pid is not None and name is None:
                continue
            if self._partitions is not None and name not in self._partitions:
                continue
            if self._buckets is not None and b not in self._buckets:
                continue
            if (pid, b) not in self._followed:
                new.append((pid, b, name))
        for pid, b, name in new:
            start = self._start_offset(pid, b, name, first)
            self._followed.add((pid, b))
            self.positions.setdefault((name, b), start)
            th = threading.Thread(
                target=self._follow, args=(pid, b, name, start), name=f"mink-tail-{b}", daemon=True
            )
            th.start()
            self._threads.append(th)

    def _start_offset(self, pid: int | None, b: int, name: str | None, first: bool) -> int:
        if isinstance(self._from, Mapping):
            for k in ((name, b), b) if name is not None else (b, (None, b)):
                if k in self._from:
                    return int(self._from[k])
        # A partition that appears after the start is read from its beginning.
        spec = self._from if (first and isinstance(self._from, str)) else "earliest"
        if isinstance(self._from, Mapping) and first:
            spec = "latest"
        offsets = self.table.offsets(spec, partition=name, buckets=[b])
        return int(offsets.get(b) or 0)

    def _watch(self) -> None:
        # New partitions, and new buckets of a table that grew (a Kafka topic given
        # more partitions), are followed from their start.
        while not self._stop.wait(self.partition_refresh_s):
            try:
                self._discover(first=False)
            except MinkError:
                continue

    def _follow(self, pid: int | None, b: int, name: str | None, offset: int) -> None:
        t = self.table
        key = (pid, b)
        bucket = {"table_id": t.id, "partition_id": pid, "bucket": b}
        descriptor = flight.FlightDescriptor.for_command(json.dumps({"Tail": {"bucket": bucket}}).encode())
        address: str | None = None
        backoff = 0.05
        while not self._stop.is_set():
            try:
                if address is None:
                    address = t._leader(key)
                writer, reader = t._conn.call(lambda c: c.do_exchange(descriptor), address)
                with self._lock:
                    self._readers[key] = reader
                try:
                    while not self._stop.is_set():
                        offset = self._poll(writer, reader, address, offset, b, name)
                        backoff = 0.05
                finally:
                    with self._lock:
                        self._readers.pop(key, None)
                    try:
                        writer.close()
                    except Exception:  # noqa: BLE001
                        pass
            except NotLeader as e:
                address = location(e.leader) if e.leader else None
            except OffsetOutOfRange as e:
                if e.log_start is None or e.offset is None or e.offset >= int(e.log_start):
                    # Beyond the high watermark: the caller's offset is wrong.
                    self._fail(e)
                    return
                # Trimmed below the position: continue from the log's start.
                offset = int(e.log_start)
            except MinkError as e:
                if self._stop.is_set():
                    return
                if not e.retriable:
                    self._fail(e)
                    return
                address = None
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _poll(self, writer: Any, reader: Any, address: str | None, offset: int, b: int, name: str | None) -> int:
        conn = self.table._conn
        poll = {"offset": offset, "max_wait_ms": POLL_WAIT_MS, "min_bytes": 1}
        conn.call(lambda _c: writer.write_metadata(pa.py_buffer(json.dumps(poll).encode())), address)
        while True:
            try:
                chunk = conn.call(lambda _c: reader.read_chunk(), address)
            except StopIteration:
                raise Unavailable("unavailable: the node ended the tail") from None
            meta = json.loads(chunk.app_metadata.to_pybytes()) if chunk.app_metadata else {}
            if "TailEnd" in meta:
                return int(meta["TailEnd"]["next_offset"])
            if chunk.data is None:
                continue
            base = int(meta.get("base_offset", offset))
            if chunk.data.num_rows == 0:
                # Past sequence markers (Puts that changed nothing): no rows to hand out.
                offset = base
                continue
            self._put(
                TailBatch(
                    chunk.data,
                    b,
                    name,
                    base,
                    meta.get("change_types"),
                    meta.get("commit_timestamp"),
                )
            )
            offset = base + chunk.data.num_rows

    def _fail(self, e: MinkError) -> None:
        self._error = e
        self._stop.set()
        self._put(_END)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set() or item is _END:
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                if item is _END:
                    return
