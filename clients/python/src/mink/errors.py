"""Mink's errors as Python exceptions.

Every failed call raises a subclass of :class:`MinkError`, chosen by what the caller
does next, exactly as the server's ``MinkError`` (``mink-types/src/error.rs``) names it.
The server sends the error's text as the gRPC message (``"not found: table db.t"``) and,
for a redirect, a JSON body in the status details; :func:`from_flight` turns the
exception pyarrow raises back into the Mink error.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow.flight as flight

__all__ = [
    "MinkError",
    "NotLeader",
    "Unavailable",
    "InvalidArgument",
    "NotFound",
    "AlreadyExists",
    "SchemaMismatch",
    "OutOfOrderSequence",
    "OffsetOutOfRange",
    "Fenced",
    "StorageFailure",
    "LimitExceeded",
    "Unimplemented",
    "Internal",
    "from_flight",
]


class MinkError(Exception):
    """Base of every Mink error. ``message`` is the server's text."""

    #: Whether a write may be sent again with the same sequence (the leader answers a
    #: retry of a recorded batch with its original offsets).
    retriable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotLeader(MinkError):
    """The node does not lead the bucket; ``leader`` is the leader's address, if known."""

    retriable = True

    def __init__(self, message: str, bucket: dict[str, Any] | None, leader: str | None) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.leader = leader


class Unavailable(MinkError):
    """The target cannot serve now (a bucket opening, no leader yet, a lost connection)."""

    retriable = True


class InvalidArgument(MinkError):
    """The request or its rows are invalid; ``field`` names what is wrong."""

    def __init__(self, message: str, field: str = "request", reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason if reason is not None else message


class NotFound(MinkError):
    """The database, table, partition, bucket or snapshot does not exist."""


class AlreadyExists(MinkError):
    """The object exists already."""


class SchemaMismatch(MinkError):
    """Rows do not match the schema (version) they were written with."""


class OutOfOrderSequence(MinkError):
    """A writer's batch sequence does not follow its window (nothing was recorded)."""

    def __init__(
        self,
        message: str,
        bucket: str | None = None,
        writer_id: int | None = None,
        sequence: int | None = None,
        expected: int | None = None,
    ) -> None:
        super().__init__(message)
        self.bucket = bucket
        self.writer_id = writer_id
        self.sequence = sequence
        self.expected = expected


class OffsetOutOfRange(MinkError):
    """A read below the log start or above the high watermark."""

    def __init__(
        self,
        message: str,
        offset: int | None = None,
        log_start: int | None = None,
        high_watermark: int | None = None,
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.log_start = log_start
        self.high_watermark = high_watermark


class Fenced(MinkError):
    """Another owner took over (a newer epoch, a fenced WAL, a fenced producer)."""

    retriable = True


class StorageFailure(MinkError):
    """The object store failed or timed out; nothing was acknowledged. A write with a
    writer id (:meth:`Table.writer`) may have been recorded all the same and is sent
    again with its sequence (``retriable``). A table write (:meth:`Table.append`,
    ``upsert``, ``delete``) carries none: its outcome is unknown, and the message names
    the buckets whose parts landed; sending it again may write those rows twice."""

    retriable = True


class LimitExceeded(MinkError):
    """A configured limit was exceeded (``what`` is ``actual``, the limit is ``limit``)."""

    def __init__(
        self, message: str, what: str | None = None, limit: int | None = None, actual: int | None = None
    ) -> None:
        super().__init__(message)
        self.what = what
        self.limit = limit
        self.actual = actual


class Unimplemented(MinkError):
    """Part of the protocol that this build does not serve."""


class Internal(MinkError):
    """A bug or broken invariant on the server, or an outcome the client cannot know."""


_OUT_OF_ORDER = re.compile(
    r"out-of-order sequence from writer (-?\d+) on (.+?): got (-?\d+), expected (-?\d+)"
)
_UNKNOWN_WRITER = re.compile(
    r"writer (-?\d+) is unknown to (.+?) and its batch starts at sequence (-?\d+)"
)
_OUT_OF_RANGE = re.compile(
    r"offset (-?\d+) is out of range for .+?: the log holds \[(-?\d+), (-?\d+)\)"
)
_BUCKET = re.compile(r"table (\d+)(?: partition (\d+))? bucket (\d+)")
_LIMIT = re.compile(r"limit exceeded: (.+) is (\d+), the limit is (\d+)")
_INVALID = re.compile(r"invalid (.+?): (.*)", re.S)

# What pyarrow appends to a server's message.
_SUFFIXES = (". gRPC client debug context:", ". Client context:", ". Detail:")


def _server_message(e: Exception) -> str:
    text = str(e)
    marker = "with message: "
    at = text.find(marker)
    if at >= 0:
        text = text[at + len(marker) :]
    for suffix in _SUFFIXES:
        cut = text.find(suffix)
        if cut >= 0:
            text = text[:cut]
    return text.strip()


def _details(e: Exception) -> Any:
    extra = getattr(e, "extra_info", None)
    if not extra:
        return None
    try:
        return json.loads(bytes(extra))
    except (ValueError, TypeError):
        return None


def from_message(message: str, details: Any = None) -> MinkError | None:
    """The Mink error whose text is ``message``, or None when it is not one."""
    if message.startswith("not the leader"):
        bucket = details.get("bucket") if isinstance(details, dict) else None
        leader = details.get("to") if isinstance(details, dict) else None
        if leader is None:
            m = re.search(r"the leader is (\S+)$", message)
            leader = m.group(1) if m else None
        if bucket is None:
            # pyarrow does not pass the status details on; the text names the bucket.
            m = _BUCKET.search(message)
            if m:
                pid = m.group(2)
                bucket = {
                    "table_id": int(m.group(1)),
                    "partition_id": int(pid) if pid is not None else None,
                    "bucket": int(m.group(3)),
                }
        return NotLeader(message, bucket, leader)
    if m := _OUT_OF_ORDER.search(message):
        return OutOfOrderSequence(message, m.group(2), int(m.group(1)), int(m.group(3)), int(m.group(4)))
    if m := _UNKNOWN_WRITER.search(message):
        return OutOfOrderSequence(message, m.group(2), int(m.group(1)), int(m.group(3)), 0)
    if m := _OUT_OF_RANGE.search(message):
        return OffsetOutOfRange(message, int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if m := _LIMIT.match(message):
        return LimitExceeded(message, m.group(1), int(m.group(3)), int(m.group(2)))
    simple: list[tuple[str, type[MinkError]]] = [
        ("unavailable: ", Unavailable),
        ("not found: ", NotFound),
        ("already exists: ", AlreadyExists),
        ("schema mismatch: ", SchemaMismatch),
        ("fenced: ", Fenced),
        ("storage failure: ", StorageFailure),
        ("not implemented: ", Unimplemented),
        ("internal error: ", Internal),
    ]
    for prefix, cls in simple:
        if message.startswith(prefix):
            return cls(message)
    if " is fenced on " in message and message.startswith("writer "):
        return Fenced(message)
    if m := _INVALID.match(message):
        return InvalidArgument(message, m.group(1), m.group(2))
    return None


def from_flight(e: Exception) -> MinkError:
    """The Mink error that a pyarrow (Flight) exception carries.

    A message the server did not write (a transport failure, a deadline) is mapped by
    its gRPC code, as the Rust client does: transport failures, deadlines and unknown
    codes are :class:`Unavailable`.
    """
    if isinstance(e, MinkError):
        return e
    message = _server_message(e)
    known = from_message(message, _details(e))
    if known is not None:
        known.__cause__ = e
        return known
    err: MinkError
    if isinstance(e, flight.FlightInternalError):
        err = Internal(message)
    elif isinstance(e, NotImplementedError):
        err = Unimplemented(message)
    elif isinstance(e, KeyError):
        err = NotFound(message)
    elif isinstance(e, flight.FlightServerError):
        err = Internal(message)
    elif isinstance(e, (flight.FlightError, OSError, ConnectionError)):
        err = Unavailable(message)
    elif type(e).__name__ == "ArrowInvalid":
        err = InvalidArgument(message)
    else:
        err = Unavailable(message)
    err.__cause__ = e
    return err
