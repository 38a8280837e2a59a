"""The Python client's Writer (clients/python/src/mink/writer.py) against fake leaders
that keep real writer windows and inject faults: no Mink node, no build.

Two Flight servers share one fake cluster: a log per bucket, a window per (bucket,
writer) as a log tablet keeps it (mink-log/src/window.rs: the last five batches; a
writer it does not know starts at any sequence; a recorded sequence is answered as a
duplicate with its original offsets; a gap is refused as out of order, for some seeds
after waiting a little for the predecessors, like the tablet's REORDER_WAIT) and each
bucket's leader, which an injected NotLeader moves to the other server (a leader move:
both servers see the same windows, as a new leader recovers them from the log). Faults
are a function of (seed, batch, attempt): before recording NotLeader, Unavailable and
InvalidArgument; after recording Internal and Unavailable; and small delays that shuffle
the requests. Threads share one Writer, some pipelining with submit(), and write a
failed batch once more (as a caller that wants its rows would).

Checked, as docs/protocol.md states the write rules and the Rust client's seeded test
(mink-flight/tests/client_writer.rs) checks them:
- every write reported done is in the log at the offsets returned, exactly as written;
- a sequence the fake holds never arrives with another batch's rows;
- rows are in the log more than once only for writes that reported an error, at most
  once more per error;
- while requests are at the fake: two writer ids of one bucket are never in flight
  together; a writer's batch at a leader that has not acknowledged one of its batches is
  alone there; a retry has no earlier batch of its writer in flight; and the Writer
  tracks every batch it has in flight (its own bookkeeping, read without its lock);
- a retry of a recorded batch is still in the writer's window (answered as a duplicate,
  not refused as out of order with its rows in the log);
- every write resolves, well within WRITE_DEADLINE_S.

The targeted tests below pin single interleavings: the retry of the oldest batch in
flight stays inside the leader's window, submitted writes keep their call order, a
refused batch frees its sequence atomically with its resolution, and a batch refused as
out of order while an earlier one was in flight is sent again under the same writer.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import random
import sys
import threading
import time
from typing import Any, Callable

import pyarrow as pa
import pyarrow.flight as flight
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "src"))

from mink.errors import InvalidArgument, MinkError, OutOfOrderSequence  # noqa: E402
from mink._conn import Connections  # noqa: E402
from mink.table import Table  # noqa: E402
from mink.writer import WRITE_DEADLINE_S, Writer  # noqa: E402

TABLE_ID = 1
PATH = "db.t"
WINDOW_BATCHES = 5  # mink_log::window::WINDOW_BATCHES
COLUMNS = [
    {"name": "k", "type": "BIGINT", "nullable": True},
    {"name": "id", "type": "BIGINT", "nullable": True},
    {"name": "v", "type": "STRING", "nullable": True},
]


@dataclasses.dataclass(frozen=True)
class Fault:
    """What the fake does with one attempt of one batch. ``kind``: None, or before
    recording ``not_leader`` (moves the bucket to the other server), ``unavailable``,
    ``invalid``; after recording ``internal``, ``unavailable_after``. ``delay`` is slept
    before the batch is looked at, ``answer_delay`` after it was decided (recorded or
    refused) and before the answer goes out."""

    kind: str | None = None
    delay: float = 0.0
    answer_delay: float = 0.0


# (batch, attempt) -> Fault; a batch is named by its first row's value (see `name`).
Plan = Callable[[str, int], Fault]

NO_FAULTS: Plan = lambda batch, attempt: Fault()  # noqa: E731


def seeded_plan(seed: int) -> Plan:
    """Faults as a function of (seed, batch, attempt): a batch is named by its first
    row, an attempt is the how-manieth time the fake sees that batch."""

    def plan(batch: str, attempt: int) -> Fault:
        r = random.Random(f"{seed}/{batch}/{attempt}")
        delay = r.choice((0.0, 0.0, 0.0, 0.001, 0.004, 0.012))
        answer_delay = r.choice((0.0, 0.0, 0.0, 0.002, 0.008))
        if attempt >= 3:
            return Fault(None, delay, answer_delay)
        x = r.random()
        for kind, p in (
            ("not_leader", 0.07),
            ("unavailable", 0.05),
            ("invalid", 0.02),
            ("internal", 0.03),
            ("unavailable_after", 0.08),
        ):
            if x < p:
                if kind == "unavailable_after" and r.random() < 0.5:
                    # A lost answer that takes a while: later batches complete meanwhile.
                    answer_delay = r.choice((0.03, 0.08, 0.15))
                return Fault(kind, delay, answer_delay)
            x -= p
        return Fault(None, delay, answer_delay)

    return plan


class _Server(flight.FlightServerBase):  # type: ignore[misc]
    def __init__(self, cluster: "Cluster", index: int) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.cluster = cluster
        self.index = index

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        command = json.loads(descriptor.command)
        chunk = reader.read_chunk()
        meta = json.loads(chunk.app_metadata.to_pybytes())
        answer = self.cluster.put(self.index, command, chunk.data, meta)
        writer.write(pa.py_buffer(json.dumps(answer).encode()))

    def do_action(self, context: Any, action: Any) -> Any:
        body = self.cluster.action(action.type, json.loads(action.body.to_pybytes() or b"{}"))
        return [flight.Result(pa.py_buffer(json.dumps(body).encode()))]


class Cluster:
    """The fake leaders' shared state (see the module docs)."""

    def __init__(self, plan: Plan, buckets: int = 3, reorder_wait: float = 0.0) -> None:
        self.plan = plan
        self.buckets = buckets
        self.reorder_wait = reorder_wait
        self.cond = threading.Condition()
        self.servers = [_Server(self, i) for i in range(2)]
        self.addresses = [f"127.0.0.1:{s.port}" for s in self.servers]
        self.leader = {b: b % 2 for b in range(buckets)}
        # Per bucket, every row recorded, by offset: (id, k, v).
        self.log: dict[int, list[tuple[int, int, str]]] = {b: [] for b in range(buckets)}
        # (bucket, first offset) -> (writer, sequence, last offset) of each recorded batch.
        self.batches: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.windows: dict[tuple[int, int], collections.deque[tuple[int, int, int]]] = {}
        # Every sequence ever recorded, with the ids of its rows.
        self.held: dict[tuple[int, int, int], tuple[tuple[int, str], ...]] = {}
        self.seen: collections.Counter[str] = collections.Counter()
        # Arrivals of each batch under each (bucket, writer, sequence): a retry is a second one.
        self.sent: collections.Counter[tuple[Any, ...]] = collections.Counter()
        self.in_flight: dict[object, tuple[int, int, int, int]] = {}
        self.acked: set[tuple[int, int, int]] = set()
        self.next_writer = 1000
        self.violations: list[str] = []
        self.stats: collections.Counter[str] = collections.Counter()
        self.writer: Writer | None = None

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()

    def violation(self, text: str) -> None:
        self.violations.append(text)

    # -- actions ----------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        descriptor = {
            "schema": {"schema_id": 1, "columns": COLUMNS},
            "bucket_keys": ["k"],
            "bucket_count": self.buckets,
            "bucketing": "hash",
        }
        return {"id": TABLE_ID, "path": PATH, "descriptor": descriptor, "partitions": {}}

    def action(self, name: str, body: dict[str, Any]) -> Any:
        with self.cond:
            if name == "init_writer":
                self.next_writer += 1
                return {"writer_id": self.next_writer}
            if name == "metadata":
                return {
                    "table": self.info(),
                    "buckets": [
                        {
                            "bucket": {"table_id": TABLE_ID, "partition_id": None, "bucket": b},
                            "leader": f"n{self.leader[b]}",
                            "leader_address": self.addresses[self.leader[b]],
                            "epoch": 1,
                        }
                        for b in range(self.buckets)
                    ],
                }
        raise flight.FlightServerError(f"not implemented: action {name}")

    # -- writes -----------------------------------------------------------------------

    def put(self, server: int, command: dict[str, Any], batch: pa.RecordBatch, meta: dict[str, Any]) -> Any:
        append = command["Append"]
        bucket = int(append["bucket"]["bucket"])
        writer = int(append["writer_id"])
        seq = int(meta["batch_sequence"])
        rows = list(
            zip(*(batch.column(c).to_pylist() for c in ("id", "k", "v")))
        )
        ids = tuple((i, v) for i, _, v in rows)  # the batch's rows, as the fake compares them
        token = object()
        with self.cond:
            attempt = self.seen[rows[0][2]]
            self.seen[rows[0][2]] += 1
            fault = self.plan(rows[0][2], attempt)
            self._on_arrival(server, bucket, writer, seq, ids)
            self.in_flight[token] = (server, bucket, writer, seq)
        try:
            self._check_tracking(bucket, writer, seq)
            if fault.delay:
                time.sleep(fault.delay)
            outcome = self._decide(server, bucket, writer, seq, ids, rows, fault)
            if fault.answer_delay:
                time.sleep(fault.answer_delay)
        finally:
            # Out of flight before the client can see the answer: the interval a request
            # is in flight here lies within the one the client has it unresolved.
            with self.cond:
                del self.in_flight[token]
                self.cond.notify_all()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _on_arrival(
        self, server: int, bucket: int, writer: int, seq: int, ids: tuple[tuple[int, str], ...]
    ) -> None:
        held = self.held.get((bucket, writer, seq))
        if held is not None and held != ids:
            self.violation(
                f"bucket {bucket} writer {writer} sequence {seq} holds rows {held} and arrived "
                f"with {ids}: the leader would answer it as a duplicate and drop its rows"
            )
        here = [v for v in self.in_flight.values() if v[1] == bucket]
        for s2, _, w2, q2 in here:
            if w2 != writer:
                self.violation(
                    f"bucket {bucket}: writer {writer} (sequence {seq}) in flight while writer "
                    f"{w2} (sequence {q2}) still is"
                )
            elif s2 == server and (server, bucket, writer) not in self.acked:
                self.violation(
                    f"bucket {bucket} writer {writer}: sequence {seq} sent to a leader that has "
                    f"acknowledged none of its batches while sequence {q2} is there"
                )
            elif q2 < seq and self.sent[(bucket, writer, seq, ids)] > 0:
                self.violation(
                    f"bucket {bucket} writer {writer}: sequence {seq} retried while the earlier "
                    f"sequence {q2} is in flight"
                )
        self.sent[(bucket, writer, seq, ids)] += 1

    def _check_tracking(self, bucket: int, writer: int, seq: int) -> None:
        """The Writer has this batch in flight: its lane must be at this writer id and
        hold the sequence as unresolved (read without the lane's lock: a dict lookup)."""
        w = self.writer
        lanes = getattr(w, "_lanes", None)
        if lanes is None:
            return
        lane = lanes.get((None, bucket))
        if lane is None or lane.writer_id != writer or seq not in lane.unresolved:
            self.violation(
                f"bucket {bucket} writer {writer} sequence {seq} is in flight but the Writer's "
                f"lane does not track it (lane at writer {getattr(lane, 'writer_id', None)}, "
                f"unresolved {sorted(getattr(lane, 'unresolved', {}))})"
            )

    def _decide(
        self,
        server: int,
        bucket: int,
        writer: int,
        seq: int,
        ids: tuple[tuple[int, str], ...],
        rows: list[tuple[int, int, str]],
        fault: Fault,
    ) -> Any:
        """The answer (a dict) or the error (an exception) for one request."""
        with self.cond:
            if self.leader[bucket] != server or fault.kind == "not_leader":
                if self.leader[bucket] == server:
                    self.leader[bucket] = 1 - server  # the bucket moves
                    self.stats["moves"] += 1
                self.stats["not_leader"] += 1
                to = self.addresses[self.leader[bucket]]
                return flight.FlightServerError(
                    f"not the leader of table {TABLE_ID} bucket {bucket}; the leader is {to}"
                )
            if fault.kind == "unavailable":
                self.stats["unavailable"] += 1
                return flight.FlightUnavailableError("unavailable: injected, before recording")
            if fault.kind == "invalid":
                self.stats["invalid"] += 1
                return pa.ArrowInvalid("invalid batch: injected refusal, before recording")
            deadline = time.monotonic() + self.reorder_wait
            while True:
                check = self._window(bucket, writer, seq)
                if check[0] != "gap" or seq < check[1]:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            if check[0] == "gap":
                if self.held.get((bucket, writer, seq)) == ids:
                    self.violation(
                        f"bucket {bucket} writer {writer}: the retry of recorded sequence {seq} "
                        f"fell out of the window (now up to {check[1] - 1}): refused as out of "
                        f"order, its write is reported failed although it is in the log"
                    )
                self.stats["out_of_order"] += 1
                return flight.FlightServerError(
                    f"out-of-order sequence from writer {writer} on table {TABLE_ID} bucket "
                    f"{bucket}: got {seq}, expected {check[1]}"
                )
            if check[0] == "duplicate":
                first, last = check[1], check[2]
                duplicated = True
                self.stats["duplicates"] += 1
            else:
                first = len(self.log[bucket])
                self.log[bucket].extend(rows)
                last = len(self.log[bucket]) - 1
                window = self.windows.setdefault((bucket, writer), collections.deque())
                window.append((seq, first, last))
                while len(window) > WINDOW_BATCHES:
                    window.popleft()
                self.held[(bucket, writer, seq)] = ids
                self.batches[(bucket, first)] = (writer, seq, last)
                duplicated = False
                self.cond.notify_all()
            if fault.kind == "internal":
                self.stats["internal"] += 1
                return flight.FlightInternalError("internal error: injected, after recording")
            if fault.kind == "unavailable_after":
                self.stats["unavailable_after"] += 1
                return flight.FlightUnavailableError("unavailable: injected, after recording")
            self.acked.add((server, bucket, writer))
            return {
                "Written": {
                    "bucket": {"table_id": TABLE_ID, "partition_id": None, "bucket": bucket},
                    "first_offset": first,
                    "last_offset": last,
                    "duplicated": duplicated,
                }
            }

    def _window(self, bucket: int, writer: int, seq: int) -> tuple[Any, ...]:
        window = self.windows.get((bucket, writer))
        if window is None:
            return ("new",)  # a log tablet takes an unknown writer's first batch anywhere
        for s, first, last in window:
            if s == seq:
                return ("duplicate", first, last)
        expected = window[-1][0] + 1
        return ("new",) if seq == expected else ("gap", expected)


# -- helpers ------------------------------------------------------------------------


@pytest.fixture()
def make_cluster():
    made: list[tuple[Cluster, Writer | None]] = []

    def make(plan: Plan, buckets: int = 3, reorder_wait: float = 0.0, depth: int | None = None):
        cluster = Cluster(plan, buckets, reorder_wait)
        table = Table(Connections(cluster.addresses[0], 20.0), PATH)
        w = Writer(table, depth)
        cluster.writer = w
        made.append((cluster, w))
        return cluster, w

    yield make
    for cluster, w in made:
        if w is not None:
            try:
                w.close()
            except MinkError:
                pass
        cluster.close()


def name(i: int, call: int = 0) -> str:
    """The value of row ``i`` in its ``call``-th write (a write once more of the same
    rows is another batch, with the same ids)."""
    return f"row-{i}/{call}"


def rows_of(ids: list[int], keys: list[int], call: int = 0) -> pa.Table:
    return pa.table(
        {"k": keys, "id": ids, "v": [name(i, call) for i in ids]},
        schema=pa.schema([("k", pa.int64()), ("id", pa.int64()), ("v", pa.string())]),
    )


def log_ids(cluster: Cluster, bucket: int) -> list[int]:
    return [r[0] for r in cluster.log[bucket]]


def check_written(cluster: Cluster, data: pa.Table, written: list[Any]) -> None:
    """A write reported done: its rows are at the offsets returned, exactly as written,
    each once, each bucket's rows in the order they were given."""
    expected = {i: (k, v) for i, k, v in zip(*(data.column(c).to_pylist() for c in ("id", "k", "v")))}
    found: list[int] = []
    for bw in written:
        batch = cluster.batches.get((bw.bucket, bw.first_offset))
        assert batch is not None and batch[2] == bw.last_offset, (
            f"bucket {bw.bucket}: offsets {bw.first_offset}..{bw.last_offset} are no batch the "
            f"log recorded"
        )
        rows = cluster.log[bw.bucket][bw.first_offset : bw.last_offset + 1]
        ids = [r[0] for r in rows]
        assert ids == sorted(ids), f"bucket {bw.bucket}: rows out of order: {ids}"
        for i, k, v in rows:
            assert expected.get(i) == (k, v), f"bucket {bw.bucket}: row {i} at the offsets returned is not the row written"
        found += ids
    assert sorted(found) == sorted(expected), f"rows written {sorted(expected)}, at the offsets returned {sorted(found)}"


# -- the seeded run -----------------------------------------------------------------


def _seeds() -> list[int]:
    """Ten seeds; MINKTEST_WRITER_SEEDS=first-last runs others (a longer soak)."""
    spec = os.environ.get("MINKTEST_WRITER_SEEDS")
    if not spec:
        return list(range(10))
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


SEEDS = _seeds()


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_faults_lose_and_duplicate_nothing(seed, make_cluster):
    rng = random.Random(seed)
    cluster, w = make_cluster(seeded_plan(seed), buckets=3, reorder_wait=(0.0, 0.03)[seed % 2])
    threads_n, calls_n = 4, 12
    next_id = [0]

    def new_call() -> pa.Table:
        n = rng.randint(1, 6)
        ids = list(range(next_id[0], next_id[0] + n))
        next_id[0] += n
        return rows_of(ids, [rng.randrange(40) for _ in ids])

    def again(data: pa.Table) -> pa.Table:
        return rows_of(data.column("id").to_pylist(), data.column("k").to_pylist(), call=1)

    plans = [([new_call() for _ in range(calls_n)], rng.choice(("write", "submit"))) for _ in range(threads_n)]
    outcomes: list[tuple[pa.Table, Any, float]] = []  # (rows, written or error, seconds)
    lock = threading.Lock()

    def record(data: pa.Table, outcome: Any, took: float) -> None:
        with lock:
            outcomes.append((data, outcome, took))

    def write(data: pa.Table) -> Any:
        start = time.monotonic()
        try:
            out: Any = w.write(data)
        except MinkError as e:
            out = e
        record(data, out, time.monotonic() - start)
        return out

    crashes: list[BaseException] = []

    def drive(calls: list[pa.Table], mode: str) -> None:
        try:
            drive_calls(calls, mode)
        except BaseException as e:  # noqa: BLE001 - reported below
            crashes.append(e)

    def drive_calls(calls: list[pa.Table], mode: str) -> None:
        pending: collections.deque[tuple[pa.Table, Any, float]] = collections.deque()

        def settle() -> None:
            data, future, start = pending.popleft()
            try:
                out: Any = future.result(timeout=WRITE_DEADLINE_S + 15)
            except MinkError as e:
                out = e
            record(data, out, time.monotonic() - start)
            if isinstance(out, MinkError):
                write(again(data))  # once more, as a caller that wants its rows would

        for data in calls:
            if mode == "submit":
                pending.append((data, w.submit(data), time.monotonic()))
                if len(pending) >= 4:
                    settle()
            elif isinstance(write(data), MinkError):
                write(again(data))
        while pending:
            settle()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # more thread switches, more interleavings
    try:
        start = time.monotonic()
        threads = [threading.Thread(target=drive, args=p, daemon=True) for p in plans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=WRITE_DEADLINE_S + 30)
        took = time.monotonic() - start
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads), "a write did not resolve"
    assert not crashes, f"a driver thread failed: {crashes[0]!r}"

    errors = [o for _, o, _ in outcomes if isinstance(o, MinkError)]
    print(
        f"seed {seed}: {len(outcomes)} writes in {took:.2f}s, {len(errors)} errors "
        f"({collections.Counter(type(e).__name__ for e in errors)}), fake: {dict(cluster.stats)}"
    )
    assert not cluster.violations, "\n".join(cluster.violations[:10])
    assert max(t for _, _, t in outcomes) < WRITE_DEADLINE_S
    for data, out, _ in outcomes:
        if not isinstance(out, MinkError):
            check_written(cluster, data, out)
    # Rows twice only after a reported error, at most once more per error.
    ok: collections.Counter[int] = collections.Counter()
    failed: collections.Counter[int] = collections.Counter()
    for data, out, _ in outcomes:
        for i in data.column("id").to_pylist():
            (failed if isinstance(out, MinkError) else ok)[i] += 1
    in_log = collections.Counter(r[0] for b in cluster.log for r in cluster.log[b])
    for i in range(next_id[0]):
        assert ok[i] <= in_log[i] <= ok[i] + failed[i], (
            f"row {i} is in the log {in_log[i]} times after {ok[i]} writes reported done and "
            f"{failed[i]} reported failed"
        )


# -- single interleavings -----------------------------------------------------------


def test_a_retry_of_the_oldest_batch_stays_inside_the_leaders_window(make_cluster):
    """Batch 1 is recorded, but its answer is lost after a while; meanwhile the batches
    after it complete. Its retry must still find it in the window (five batches): at
    most five sequences may be outstanding from the oldest one in flight, however many
    of them completed, or the retry is refused as out of order and the write reported
    failed although its rows are in the log."""

    def plan(batch: str, attempt: int) -> Fault:
        if batch == name(1) and attempt == 0:
            return Fault("unavailable_after", answer_delay=0.4)
        return Fault()

    cluster, w = make_cluster(plan, buckets=1)
    w.write(rows_of([0], [0]))  # the writer's first batch, acknowledged
    futures = [w.submit(rows_of([i], [0])) for i in range(1, 10)]
    results = [f.result(timeout=30) for f in futures]
    assert not cluster.violations, cluster.violations
    assert results[0][0].duplicated, "batch 1 was not answered as a duplicate of itself"
    assert log_ids(cluster, 0) == list(range(10))


@pytest.mark.parametrize("depth", [1, 5])
def test_submitted_writes_keep_their_call_order(depth, make_cluster):
    """One thread submits writes of one bucket: their sequences, and so the log, follow
    the order of the calls (docs/protocol.md; for a primary-key table the order is the
    meaning: the last write of a key wins)."""
    plan = lambda batch, attempt: Fault(delay=random.Random(batch).choice((0.0, 0.002, 0.006)))  # noqa: E731
    cluster, w = make_cluster(plan, buckets=1, depth=depth)
    futures = [w.submit(rows_of([i], [0])) for i in range(40)]
    for f in futures:
        f.result(timeout=30)
    assert not cluster.violations, cluster.violations
    assert log_ids(cluster, 0) == list(range(40))


def test_a_refused_batch_frees_its_sequence_together_with_its_resolution(make_cluster, monkeypatch):
    """Batch 1 is refused (InvalidArgument, nothing recorded) and its thread is slow to
    leave (0.3 s: the window made wide). Batch 2, submitted meanwhile, must not be
    admitted at sequence 1 while batch 1 still holds it: batch 1's resolution would take
    it off the lane, and untracked in flight it holds back neither a retirement nor a
    later batch (batch 3, refused as out of order behind it, would start a second writer
    id while batch 2 is still in flight under the first, and land before it). As the
    rules have it: batch 2 takes sequence 2, so batch 1 cannot free sequence 1 and
    retires the writer, batch 2 is refused as out of order and reported, and batch 3
    starts the new writer."""

    def plan(batch: str, attempt: int) -> Fault:
        if batch == name(1) and attempt == 0:
            return Fault("invalid")
        if batch == name(2) and attempt == 0:
            return Fault(delay=0.6)
        return Fault()

    cluster, w = make_cluster(plan, buckets=1)
    slow = [True]
    attempts = Writer._attempts

    def slow_to_leave(self: Writer, *args: Any, **kwargs: Any) -> Any:
        try:
            return attempts(self, *args, **kwargs)
        except BaseException:
            if slow[0]:
                slow[0] = False
                time.sleep(0.3)
            raise

    monkeypatch.setattr(Writer, "_attempts", slow_to_leave)
    w.write(rows_of([0], [0]))
    refused = w.submit(rows_of([1], [0]))
    time.sleep(0.1)  # batch 1 has been refused; its thread is still leaving
    second = w.submit(rows_of([2], [0]))
    time.sleep(0.3)  # batch 1 is resolved; batch 2 is still at the leader
    third = w.submit(rows_of([3], [0]))
    with pytest.raises(InvalidArgument):
        refused.result(timeout=30)
    third.result(timeout=30)
    assert not cluster.violations, "\n".join(cluster.violations)
    # Batch 2 took the sequence after the refused one: it is refused as out of order
    # and reported (the writer was retired when batch 1 could not free its sequence).
    with pytest.raises(OutOfOrderSequence):
        second.result(timeout=30)
    assert log_ids(cluster, 0) == [0, 3]


def test_out_of_order_behind_an_earlier_batch_is_resent_under_the_same_writer(make_cluster):
    """Batch 2 overtakes batch 1 and is refused as out of order, but its answer comes
    back only after batch 1 was acknowledged. It was refused while an earlier batch was
    in flight, so it is sent again once that one is resolved, under the same writer: no
    retirement, no new writer id."""

    def plan(batch: str, attempt: int) -> Fault:
        if batch == name(1) and attempt == 0:
            return Fault(delay=0.1)
        if batch == name(2) and attempt == 0:
            return Fault(answer_delay=0.3)
        return Fault()

    cluster, w = make_cluster(plan, buckets=1)
    w.write(rows_of([0], [0]))
    first = w.submit(rows_of([1], [0]))
    time.sleep(0.02)
    second = w.submit(rows_of([2], [0]))
    first.result(timeout=30)
    second.result(timeout=30)
    assert not cluster.violations, cluster.violations
    assert log_ids(cluster, 0) == [0, 1, 2]
    writers = {writer for writer, _, _ in cluster.batches.values()}
    assert len(writers) == 1, f"batch 2 was written under another writer: {writers}"


def test_out_of_order_behind_acknowledged_sequences_is_resent_under_a_new_writer(make_cluster):
    """The leader's window lost the writer's last acknowledged batch (a primary-key
    tablet reopened after a Put that changed nothing, which leaves no log record), and
    the next batch's first attempt fails in a way that may have recorded it. Its retry
    is refused as out of order, expecting the sequence already acknowledged: no attempt
    can be in that window, so the batch goes again under a new writer instead of
    failing (docs/protocol.md)."""

    def plan(batch: str, attempt: int) -> Fault:
        if batch == name(2) and attempt == 0:
            return Fault("unavailable")
        return Fault()

    cluster, w = make_cluster(plan, buckets=1)
    w.write(rows_of([0], [0]))
    w.write(rows_of([1], [0]))
    with cluster.cond:
        (window,) = cluster.windows.values()
        window.pop()
    written = w.write(rows_of([2], [0]))
    assert not written[0].duplicated
    assert not cluster.violations, cluster.violations
    assert log_ids(cluster, 0) == [0, 1, 2]
    assert cluster.stats["out_of_order"] == 1
    writers = [cluster.batches[(0, i)][0] for i in range(3)]
    assert writers[0] == writers[1] != writers[2], writers
