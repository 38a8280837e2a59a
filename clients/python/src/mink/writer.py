"""Client-routed, idempotent writes: the Python counterpart of the Rust client's writer
(``mink-flight/src/client.rs``; the rules are in docs/protocol.md, "Writes").

Each bucket has a *lane*: a writer id from ``init_writer`` and the next batch sequence.
A call splits its rows by partition and bucket (:mod:`mink.routing`) and writes every
bucket's part at once, each part under its lane's next sequence. The rules that keep
every acknowledged batch in the log exactly once:

- A sequence is reused for another batch only when the leader certainly did not record
  the last one under it; a failure that may have recorded it is retried with the *same*
  sequence (the leader answers a recorded one as a duplicate with its offsets) or, when
  retrying cannot tell, the writer id is retired and the next batch starts a new one.
- Up to ``depth`` batches of a lane are in flight (five for appends, the leader's writer
  window; one for Puts). A writer's first batch, and its first at a leader that has not
  acknowledged one of its batches yet, goes alone; a retry, and a batch bound for
  another leader than earlier ones in flight, waits for the earlier ones.
- A batch the leader refused as out of order while an earlier one was in flight is sent
  again once the earlier ones are resolved.
- A bucket's parts take their sequences in the order of their calls (a ticket per part,
  taken when the call is submitted), so the log holds them in that order.
"""

from __future__ import annotations

import heapq
import itertools
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight

from . import routing
from ._convert import Data, conform, one_batch
from .errors import (
    AlreadyExists,
    InvalidArgument,
    LimitExceeded,
    MinkError,
    NotFound,
    NotLeader,
    OutOfOrderSequence,
    SchemaMismatch,
    Unavailable,
    Unimplemented,
)

if TYPE_CHECKING:
    from .table import Table

__all__ = ["Writer", "BucketWritten"]

#: Attempts of one bucket write before its error is returned (about 30 s with backoff).
WRITE_ATTEMPTS_MAX = 24
#: The longest one bucket write may take, waits for earlier batches included.
WRITE_DEADLINE_S = 45.0
#: Batches of one bucket in flight: the leader's writer window for appends; one Put.
APPEND_DEPTH = 5
PUT_DEPTH = 1
#: A bucket's part is sent in batches of at most this many bytes (the node's
#: ``log.batch_bytes_max`` is 16 MiB).
PART_BYTES_MAX = 4 << 20
#: How long a Writer spreads a round-robin table's rows over the buckets it knows
#: before it reads the table's definition again (it may have grown buckets).
ROUTING_MAX_AGE_S = 10.0

_REFUSED = (InvalidArgument, SchemaMismatch, NotFound, AlreadyExists, LimitExceeded, Unimplemented)


@dataclass(frozen=True)
class BucketWritten:
    """Where one bucket's rows of a write landed: offsets ``first_offset..=last_offset``.
    ``duplicated`` says a retry found the batch already written (same offsets)."""

    bucket: int
    partition: str | None
    partition_id: int | None
    first_offset: int
    last_offset: int
    duplicated: bool = False

    @staticmethod
    def of(answer: dict[str, Any], partition: str | None = None) -> "BucketWritten":
        b = answer["bucket"]
        return BucketWritten(
            b["bucket"],
            answer.get("partition", partition),
            b.get("partition_id"),
            answer["first_offset"],
            answer["last_offset"],
            answer.get("duplicated", False),
        )


class _Lane:
    """One bucket's sequences under the current writer id."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.writer_id: int | None = None
        self.next = 0
        # Sequences handed out and not resolved, with the leader each was last sent to.
        self.unresolved: dict[int, str | None] = {}
        self.acked_by: str | None = None
        self.retire = False
        # Tickets (call order) of the parts waiting for a sequence, as a heap under the
        # Writer's `_lock` (not `cond`, which `_admit` holds across `init_writer`): a part
        # is admitted only when its ticket is the smallest, so that sequences follow the
        # calls and not the order in which pool threads happen to reach the lane.
        self.waiting: list[int] = []

    def earlier(self, seq: int) -> list[str | None]:
        return [leader for s, leader in self.unresolved.items() if s < seq]


class _Unknown(Exception):
    """A bucket write whose outcome the client cannot know: its writer is retired."""


def _window_behind_acknowledged(e: OutOfOrderSequence) -> bool:
    """Whether the leader's window of the writer ends before sequences acknowledged to
    it: it expects a sequence above 0 (it knows the writer) but below the batch's. Any
    recorded attempt of the batch would be in that window (durable, so rebuilt into every
    later incarnation of the tablet, or lost with the one that held it), and the window
    can never reach it: the batch was not written, even if an earlier attempt's answer
    was lost. A primary-key tablet rebuilt from a log written before sequence markers,
    after Puts that changed nothing, answers so (docs/protocol.md)."""
    seq, expected = e.sequence, e.expected
    return seq is not None and expected is not None and 0 < expected < seq


class Writer:
    """Routes rows on the client and writes each bucket's part straight to its leader,
    idempotently. Get one with :meth:`Table.writer`; share it between threads.

    ``write`` blocks until every part is durable and returns where each landed;
    ``submit`` returns a future at once, so that a thread can keep several writes in
    flight (their sequences are taken in call order, and the log holds them in that
    order). ``flush`` waits for every submitted write; ``close`` flushes and stops."""

    def __init__(self, table: "Table", depth: int | None = None, threads: int = 32) -> None:
        self.table = table
        self._put = table.has_primary_key
        self.depth = depth if depth is not None else (PUT_DEPTH if self._put else APPEND_DEPTH)
        if self.depth < 1 or self.depth > APPEND_DEPTH:
            raise InvalidArgument(
                f"invalid depth: {self.depth}; between 1 and {APPEND_DEPTH}", "depth"
            )
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mink-writer")
        self._lanes: dict[tuple[int | None, int], _Lane] = {}
        self._lock = threading.Lock()
        self._round_robin: dict[int | None, int] = {}
        self._read_at = time.monotonic()
        self._pending: set[Future[list[BucketWritten]]] = set()
        self._order = threading.Lock()
        self._tickets = itertools.count()
        self._closed = False

    # -- the public calls ------------------------------------------------------------

    def write(
        self,
        data: Data,
        columns: Sequence[str] | None = None,
        changes: Sequence[str] | None = None,
    ) -> list[BucketWritten]:
        """Writes ``data`` (appends to a log table, upserts to a primary-key table, with
        ``columns`` a partial update and ``changes`` a ``+I``/``+U``/``-D``/``-U`` per
        row); returns each bucket's offsets once all are durable."""
        return self.submit(data, columns, changes).result()

    def delete(self, keys: Data) -> list[BucketWritten]:
        """Deletes the rows with these primary keys (a primary-key table)."""
        if not self._put:
            raise InvalidArgument("invalid write: deletes need a primary-key table", "changes")
        from .table import delete_rows

        rows = delete_rows(keys, self.table.arrow_schema, self.table.primary_key)
        return self.write(rows, None, ["-D"] * rows.num_rows)

    def submit(
        self,
        data: Data,
        columns: Sequence[str] | None = None,
        changes: Sequence[str] | None = None,
    ) -> "Future[list[BucketWritten]]":
        """Like :meth:`write`, but returns a future; the rows are checked, routed and
        given their place in each bucket's order (its sequences follow the calls) before
        it returns."""
        if self._closed:
            raise InvalidArgument("invalid writer: it is closed", "writer")
        parts = self._route(data, columns, changes)
        # Sequences in call order: every part takes a ticket under one lock, and a lane
        # hands out its sequences in ticket order (the pool's threads may start the parts
        # in any order, and a condition wakes its waiters in any order).
        futures = []
        with self._order:
            for p in parts:
                lane = self._lane(p[0])
                with self._lock:
                    ticket = next(self._tickets)
                    heapq.heappush(lane.waiting, ticket)
                try:
                    futures.append(self._pool.submit(self._write_part, *p, ticket))
                except BaseException:
                    with lane.cond:
                        self._leave(lane, ticket)
                    raise
        result: Future[list[BucketWritten]] = Future()
        remaining = [len(futures)]
        done_lock = threading.Lock()

        def finished(_: Future[BucketWritten]) -> None:
            with done_lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            errors = [f.exception() for f in futures if f.exception() is not None]
            if errors:
                result.set_exception(errors[0])
            else:
                result.set_result([f.result() for f in futures])
            self._pending.discard(result)

        self._pending.add(result)
        if not futures:
            result.set_result([])
            self._pending.discard(result)
        for f in futures:
            f.add_done_callback(finished)
        return result

    def flush(self) -> None:
        """Waits for every submitted write (raising the first error)."""
        for f in list(self._pending):
            f.result()

    def close(self) -> None:
        """Flushes and releases the writer's threads."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routing ---------------------------------------------------------------------

    def _route(
        self, data: Data, columns: Sequence[str] | None, changes: Sequence[str] | None
    ) -> list[tuple[tuple[int | None, int], str | None, pa.RecordBatch, list[str] | None]]:
        t = self.table
        if columns is not None and not self._put:
            raise InvalidArgument("invalid columns: partial updates need a primary-key table", "columns")
        if changes is not None and not self._put:
            raise InvalidArgument("invalid changes: change types need a primary-key table", "changes")
        rows = conform(data, t.arrow_schema, columns)
        if changes is not None:
            changes = list(changes)
            if len(changes) != rows.num_rows:
                raise InvalidArgument(
                    f"invalid changes: {len(changes)} change types for {rows.num_rows} rows", "changes"
                )
            bad = [c for c in changes if c not in ("+I", "+U", "-D", "-U")]
            if bad:
                raise InvalidArgument(f"invalid changes: {bad[0]!r} is not +I, +U, -D or -U", "changes")
        if t.has_primary_key:
            routing.check_no_nulls(rows, t.primary_key, "primary key")
        if rows.num_rows == 0:
            return []
        groups: list[tuple[str | None, np.ndarray]] = []
        if t.partition_keys:
            names = routing.partition_names(rows, t.partition_keys)
            encoded = names.dictionary_encode()
            codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False))
            for code, name in enumerate(encoded.dictionary.to_pylist()):
                groups.append((name, np.flatnonzero(codes == code)))
            t._ensure_partitions([g[0] for g in groups if g[0] is not None])
        else:
            groups.append((None, np.arange(rows.num_rows)))
        parts = []
        if not t.bucket_keys and time.monotonic() - self._read_at > ROUTING_MAX_AGE_S:
            # A table that spreads rows round-robin may have grown buckets (a Kafka
            # topic given more partitions): its definition is read again now and then.
            t.refresh()
            self._read_at = time.monotonic()
        count = t.bucket_count
        for name, idx in groups:
            pid = t._partition_id(name)
            sub = rows if len(groups) == 1 else rows.take(pa.array(idx))
            sub_changes = changes if (changes is None or len(groups) == 1) else [changes[i] for i in idx]
            if t.bucket_keys:
                buckets = routing.bucket_of_rows(sub, t.bucket_keys, count, t.bucketing)
                order = np.argsort(buckets, kind="stable")
                sorted_b = buckets[order]
                cuts = np.flatnonzero(np.diff(sorted_b)) + 1
                for chunk in np.split(order, cuts):
                    b = int(buckets[chunk[0]])
                    part = sub.take(pa.array(chunk))
                    part_changes = None if sub_changes is None else [sub_changes[i] for i in chunk]
                    parts += self._chunks((pid, b), name, part, part_changes)
            else:
                with self._lock:
                    b = self._round_robin.get(pid, 0)
                    self._round_robin[pid] = (b + 1) % count
                parts += self._chunks((pid, b), name, sub, sub_changes)
        return parts

    @staticmethod
    def _chunks(
        key: tuple[int | None, int], partition: str | None, part: pa.Table, changes: list[str] | None
    ) -> list[tuple[tuple[int | None, int], str | None, pa.RecordBatch, list[str] | None]]:
        rows = part.num_rows
        pieces = max(1, -(-part.nbytes // PART_BYTES_MAX))
        step = -(-rows // pieces)
        out = []
        for start in range(0, rows, step):
            piece = one_batch(part.slice(start, step))
            c = None if changes is None else changes[start : start + step]
            out.append((key, partition, piece, c))
        return out

    # -- one bucket's write ----------------------------------------------------------

    def _lane(self, key: tuple[int | None, int]) -> _Lane:
        with self._lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane()
            return lane

    def _admit(self, lane: _Lane, deadline: float, ticket: int) -> tuple[int, int]:
        """A sequence for the next batch of ``lane``: waits for its turn (``ticket``), a
        writer id and room in the pipeline."""
        with lane.cond:
            try:
                while True:
                    if lane.retire and not lane.unresolved:
                        lane.writer_id, lane.retire = None, False
                    if lane.writer_id is None and not lane.unresolved:
                        lane.writer_id = int(self.table._conn.action("init_writer")["writer_id"])
                        lane.next, lane.acked_by = 0, None
                    # The sequences in flight span at most `depth` from the oldest one, not
                    # just `depth` of them: the leader's window holds a writer's last five
                    # batches, so with later ones completing past a slow oldest one, a
                    # retry of the oldest would fall out of it and be refused as out of
                    # order although it is in the log.
                    oldest = min(lane.unresolved, default=lane.next)
                    room = not lane.unresolved or (
                        lane.acked_by is not None and lane.next < oldest + self.depth
                    )
                    with self._lock:
                        turn = lane.waiting[0] == ticket
                    if turn and lane.writer_id is not None and not lane.retire and room:
                        seq = lane.next
                        lane.next += 1
                        lane.unresolved[seq] = None
                        return lane.writer_id, seq
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Unavailable("unavailable: the bucket's earlier writes did not finish in time")
                    lane.cond.wait(left)
            finally:
                self._leave(lane, ticket)

    def _leave(self, lane: _Lane, ticket: int) -> None:
        """Takes ``ticket`` off ``lane``'s waiting parts (called under ``lane.cond``)."""
        with self._lock:
            if lane.waiting[0] == ticket:
                heapq.heappop(lane.waiting)
            else:
                lane.waiting.remove(ticket)
                heapq.heapify(lane.waiting)
        lane.cond.notify_all()

    def _wait_earlier(self, lane: _Lane, seq: int, deadline: float) -> None:
        with lane.cond:
            while lane.earlier(seq):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Unknown("unavailable: earlier writes of the bucket did not finish in time")
                lane.cond.wait(left)

    def _write_part(
        self,
        key: tuple[int | None, int],
        partition: str | None,
        batch: pa.RecordBatch,
        changes: list[str] | None,
        ticket: int,
    ) -> BucketWritten:
        lane = self._lane(key)
        deadline = time.monotonic() + WRITE_DEADLINE_S
        restarted = False
        while True:
            writer_id, seq = self._admit(lane, deadline, ticket)
            refused: MinkError | None = None
            restart = False
            try:
                return self._attempts(lane, key, partition, batch, changes, writer_id, seq, deadline)
            except _Restart:
                if restarted:
                    raise Unavailable(
                        "unavailable: the leader refused the batch as out of order twice"
                    ) from None
                restarted = restart = True
            except _Refused as r:
                refused = r.error
            finally:
                with lane.cond:
                    lane.unresolved.pop(seq, None)
                    if refused is not None:
                        # Refused before recording: the sequence is free again unless a
                        # later one was handed out. Decided here, together with taking
                        # the batch off `unresolved`: freed any earlier, another part could
                        # be admitted at `seq` meanwhile and lose its entry to this pop
                        # (untracked in flight, it would not hold back a retirement, a new
                        # writer id or a later batch that must wait for it).
                        later = any(s > seq for s in lane.unresolved)
                        if lane.next == seq + 1 and not later and lane.writer_id == writer_id:
                            lane.next = seq
                        else:
                            lane.retire = True
                    if restart:
                        # Sent again under a new writer, ahead of the calls after it.
                        with self._lock:
                            heapq.heappush(lane.waiting, ticket)
                    lane.cond.notify_all()
            if refused is not None:
                raise refused

    def _attempts(
        self,
        lane: _Lane,
        key: tuple[int | None, int],
        partition: str | None,
        batch: pa.RecordBatch,
        changes: list[str] | None,
        writer_id: int,
        seq: int,
        deadline: float,
    ) -> BucketWritten:
        t = self.table
        attempt = 0
        maybe_recorded = False
        backoff = 0.05
        while True:
            leader = t._leader(key)
            with lane.cond:
                others = lane.earlier(seq)
                lane.unresolved[seq] = leader
                must_wait = attempt > 0 or lane.acked_by != leader or any(o != leader for o in others)
            sent_with_earlier = False
            try:
                if must_wait and others:
                    self._wait_earlier(lane, seq, deadline)
                # An out-of-order answer means "overtaken" if an earlier batch was in
                # flight when this one was sent, even if that one is resolved by the time
                # the answer comes back.
                with lane.cond:
                    sent_with_earlier = bool(lane.earlier(seq))
                answer = self._send(key, batch, changes, writer_id, seq, leader)
            except _Unknown as e:
                self._retire(lane)
                raise Unavailable(str(e)) from None
            except MinkError as e:
                if isinstance(e, NotLeader):
                    t._moved(key, e.leader)
                elif e.retriable:
                    maybe_recorded = True
                    t._refresh()
                elif isinstance(e, OutOfOrderSequence):
                    with lane.cond:
                        had_earlier = sent_with_earlier or bool(lane.earlier(seq))
                        # A retired writer had an earlier batch of unknown outcome, or
                        # one refused with this one after it: then this refusal is that
                        # batch's doing and is reported (docs/protocol.md), not a window
                        # that lost the writer.
                        unknown_before = lane.retire
                    if had_earlier:
                        self._wait_earlier_or_unknown(lane, seq, deadline)
                        attempt += 1
                        continue
                    if not unknown_before and (not maybe_recorded or _window_behind_acknowledged(e)):
                        self._retire(lane)
                        raise _Restart() from e
                    self._retire(lane)
                    raise
                elif isinstance(e, _REFUSED) and not maybe_recorded:
                    # The sequence is freed (or the writer retired) where the batch is
                    # resolved, in _write_part.
                    raise _Refused(e) from e
                else:
                    self._retire(lane)
                    raise
                attempt += 1
                if attempt >= WRITE_ATTEMPTS_MAX or time.monotonic() + backoff > deadline:
                    self._retire(lane)
                    raise Unavailable(
                        f"unavailable: bucket {key[1]} not written after {attempt} attempts "
                        f"(the batch may or may not be in the log; its writer is retired): {e}"
                    ) from e
                time.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            with lane.cond:
                if lane.writer_id == writer_id:
                    lane.acked_by = leader
            return BucketWritten(
                key[1],
                partition,
                key[0],
                answer["first_offset"],
                answer["last_offset"],
                answer.get("duplicated", False),
            )

    def _wait_earlier_or_unknown(self, lane: _Lane, seq: int, deadline: float) -> None:
        try:
            self._wait_earlier(lane, seq, deadline)
        except _Unknown as e:
            self._retire(lane)
            raise Unavailable(str(e)) from None

    @staticmethod
    def _retire(lane: _Lane) -> None:
        with lane.cond:
            lane.retire = True
            lane.cond.notify_all()

    def _send(
        self,
        key: tuple[int | None, int],
        batch: pa.RecordBatch,
        changes: list[str] | None,
        writer_id: int,
        seq: int,
        leader: str | None,
    ) -> dict[str, Any]:
        t = self.table
        bucket = {"table_id": t.id, "partition_id": key[0], "bucket": key[1]}
        if self._put:
            target = list(batch.schema.names) if batch.num_columns != len(t.arrow_schema) else None
            command: dict[str, Any] = {
                "Put": {
                    "bucket": bucket,
                    "schema_id": t.schema_id,
                    "writer_id": writer_id,
                    "target_columns": target,
                }
            }
        else:
            command = {"Append": {"bucket": bucket, "schema_id": t.schema_id, "writer_id": writer_id}}
        meta: dict[str, Any] = {"batch_sequence": seq}
        if changes is not None:
            meta["changes"] = changes
        if leader is None:
            raise Unavailable(f"unavailable: bucket {key[1]} has no leader yet")
        answer = t._do_put(command, batch, meta, leader)
        written = answer.get("Written")
        if written is None:
            raise MinkError(f"internal error: the node answered {answer}")
        return dict(written)


class _Restart(Exception):
    """Refused as out of order with nothing before it: send again under a new writer."""


class _Refused(Exception):
    """Refused before anything was recorded (``error``): the sequence may be free."""

    def __init__(self, error: MinkError) -> None:
        super().__init__(str(error))
        self.error = error


def put_descriptor(command: dict[str, Any]) -> flight.FlightDescriptor:
    return flight.FlightDescriptor.for_command(json.dumps(command).encode())
