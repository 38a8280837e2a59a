"""Client-side routing: the partition and the bucket of every row, as the nodes compute
them (``mink-types/src/partition.rs``, ``key.rs``, ``bucketing.rs``; docs/key-encoding.md).

Both are computed for a whole batch with numpy, not row by row: the canonical key
encoding of the bucket-key columns is built as byte matrices (one per distinct set of
variable key lengths), and murmur3 (x86, 32-bit, seed 0) runs over all rows of a matrix
at once. A node refuses a bucket-addressed write holding a row of another bucket, so
every test that writes through :class:`~mink.Writer` checks this module against the
server's own rule.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidArgument

__all__ = ["murmur3_rows", "kafka_murmur2", "bucket_of_rows", "partition_names", "PARTITION_SEPARATOR"]

PARTITION_SEPARATOR = "__"
_PARTITION_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,199}$")

U32 = npt.NDArray[np.uint32]
U8 = npt.NDArray[np.uint8]

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)


def _rotl(x: U32, r: int) -> U32:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def murmur3_rows(m: U8) -> U32:
    """murmur3_x86_32 (seed 0) of every row of the byte matrix ``m`` (n rows of L bytes)."""
    n, length = m.shape
    h = np.zeros(n, dtype=np.uint32)
    nblocks = length // 4
    with np.errstate(over="ignore"):
        if nblocks:
            blocks = np.ascontiguousarray(m[:, : nblocks * 4]).view("<u4").reshape(n, nblocks)
            for i in range(nblocks):
                k = blocks[:, i].astype(np.uint32) * _C1
                k = _rotl(k, 15) * _C2
                h ^= k
                h = _rotl(h, 13) * np.uint32(5) + np.uint32(0xE6546B64)
        rem = length & 3
        if rem:
            tail = m[:, nblocks * 4 :].astype(np.uint32)
            k1 = np.zeros(n, dtype=np.uint32)
            if rem >= 3:
                k1 ^= tail[:, 2] << np.uint32(16)
            if rem >= 2:
                k1 ^= tail[:, 1] << np.uint32(8)
            k1 ^= tail[:, 0]
            k1 = _rotl(k1 * _C1, 15) * _C2
            h ^= k1
        h ^= np.uint32(length & 0xFFFFFFFF)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h


def _be_flipped(values: npt.NDArray[np.generic], width: int) -> U8:
    """Big-endian two's complement of signed ints, sign bit flipped: (n, width) bytes."""
    be = values.astype(f">i{width}")
    out = be.view(np.uint8).reshape(len(values), width).copy()
    out[:, 0] ^= 0x80
    return out


def _fixed(array: pa.Array, name: str) -> U8 | None:
    """The key encoding of a fixed-width column as an (n, width) matrix, or None for a
    variable-width one."""
    t = array.type
    n = len(array)
    if pa.types.is_boolean(t):
        return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.uint8).reshape(n, 1)
    if pa.types.is_integer(t) and pa.types.is_signed_integer(t):
        return _be_flipped(array.to_numpy(), t.bit_width // 8)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return _be_flipped(array.cast(pa.int32()).to_numpy(), 4)
    if pa.types.is_time64(t) or pa.types.is_timestamp(t):
        return _be_flipped(array.cast(pa.int64()).to_numpy(), 8)
    if pa.types.is_floating(t):
        width = t.bit_width // 8
        raw = array.to_numpy().view(f"<u{width}").astype(f"u{width}")
        sign = np.array(1 << (t.bit_width - 1), dtype=f"u{width}")
        negative = (raw & sign) != 0
        flipped = np.where(negative, ~raw, raw ^ sign).astype(f">u{width}")
        encoded: U8 = flipped.view(np.uint8).reshape(n, width).copy()
        return encoded
    if pa.types.is_decimal128(t):
        raw = np.frombuffer(array.buffers()[1], dtype=np.uint8)
        raw = raw[array.offset * 16 : (array.offset + n) * 16].reshape(n, 16)
        out = raw[:, ::-1].copy()
        out[:, 0] ^= 0x80
        return out
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return None
    raise InvalidArgument(
        f"invalid bucket key {name!r}: Arrow type {t} cannot be a key", f"bucket key {name!r}"
    )


def _var_parts(array: pa.Array) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], U8]:
    """Starts, lengths and the data bytes of a string or binary column."""
    n = len(array)
    bufs = array.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32)[array.offset : array.offset + n + 1].astype(
        np.int64
    )
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets[:-1], np.diff(offsets), data


def _escaped(value: bytes) -> bytes:
    return value.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def _hash_bytes_rows(rows: Sequence[bytes]) -> U32:
    return np.array(
        [murmur3_rows(np.frombuffer(r, dtype=np.uint8).reshape(1, len(r)))[0] for r in rows],
        dtype=np.uint32,
    )


def _key_hashes(columns: Sequence[pa.Array], names: Sequence[str]) -> U32:
    """murmur3 of the canonical key encoding of every row (docs/key-encoding.md)."""
    n = len(columns[0])
    fixed = [_fixed(c, name) for c, name in zip(columns, names)]
    variable = [i for i, f in enumerate(fixed) if f is None]
    if not variable:
        return murmur3_rows(np.hstack([f for f in fixed if f is not None]))
    parts = {i: _var_parts(columns[i]) for i in variable}
    # Rows holding a 00 byte in a variable column are escaped one by one (rare).
    special = np.zeros(n, dtype=bool)
    for i in variable:
        starts, lengths, data = parts[i]
        zeros = np.flatnonzero(data == 0)
        if len(zeros):
            row = np.searchsorted(starts, zeros, side="right") - 1
            inside = (row >= 0) & (zeros < starts[np.clip(row, 0, None)] + lengths[np.clip(row, 0, None)])
            special[row[inside]] = True
    hashes = np.zeros(n, dtype=np.uint32)
    normal = np.flatnonzero(~special)
    if len(normal):
        lens = np.stack([parts[i][1][normal] for i in variable], axis=1)
        groups, inverse = np.unique(lens, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        for g, group_lens in enumerate(groups):
            rows = normal[inverse == g]
            pieces: list[U8] = []
            for i, f in enumerate(fixed):
                if f is not None:
                    pieces.append(f[rows])
                    continue
                starts, _, data = parts[i]
                width = int(group_lens[variable.index(i)])
                if width:
                    pieces.append(data[starts[rows][:, None] + np.arange(width)])
                pieces.append(np.tile(np.array([0, 1], dtype=np.uint8), (len(rows), 1)))
            hashes[rows] = murmur3_rows(np.hstack(pieces))
    for r in np.flatnonzero(special):
        key = b""
        for i, f in enumerate(fixed):
            if f is not None:
                key += f[r].tobytes()
            else:
                starts, lengths, data = parts[i]
                key += _escaped(data[starts[r] : starts[r] + lengths[r]].tobytes())
        hashes[r] = _hash_bytes_rows([key])[0]
    return hashes


def _iceberg_hashes(column: pa.Array, name: str) -> U32:
    """Iceberg's bucket-transform hash of every row of one column."""
    t = column.type

    def longs(values: npt.NDArray[np.int64]) -> U32:
        le = values.astype("<i8").view(np.uint8).reshape(len(values), 8)
        return murmur3_rows(le)

    if pa.types.is_integer(t):
        return longs(column.cast(pa.int64()).to_numpy())
    if pa.types.is_date32(t):
        return longs(column.cast(pa.int32()).to_numpy().astype(np.int64))
    if pa.types.is_time(t) or pa.types.is_timestamp(t):
        raw = column.cast(pa.int32() if pa.types.is_time32(t) else pa.int64())
        v = raw.to_numpy().astype(np.int64)
        scale = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": -1_000}[t.unit]
        micros = v // 1_000 if scale < 0 else v * scale
        return longs(micros)
    if pa.types.is_decimal128(t):
        values: list[bytes] = []
        for v in column.cast(pa.decimal128(38, t.scale)).to_pylist():
            unscaled = int(v.scaleb(t.scale))
            # The minimal two's complement (Java's BigInteger.toByteArray).
            size = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
            values.append(unscaled.to_bytes(size, "big", signed=True))
        return _hash_bytes_rows(values)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        starts, lengths, data = _var_parts(column)
        out = np.zeros(len(column), dtype=np.uint32)
        for width in np.unique(lengths):
            rows = np.flatnonzero(lengths == width)
            m = data[starts[rows][:, None] + np.arange(int(width))] if width else np.zeros(
                (len(rows), 0), np.uint8
            )
            out[rows] = murmur3_rows(m)
        return out
    raise InvalidArgument(
        f"invalid bucket key {name!r}: the iceberg rule cannot hash {t}", f"bucket key {name!r}"
    )


def _plain(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_large_string(column.type) or pa.types.is_string_view(column.type):
        column = column.cast(pa.string())
    if pa.types.is_large_binary(column.type) or pa.types.is_binary_view(column.type):
        column = column.cast(pa.binary())
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


def check_no_nulls(batch: pa.RecordBatch | pa.Table, names: Sequence[str], what: str) -> None:
    """``InvalidArgument`` naming the column and first row when a key column holds a null."""
    for name in names:
        column = batch.column(name)
        if column.null_count:
            row = pc.index(pc.is_null(column), True).as_py()
            raise InvalidArgument(
                f"invalid {what} {name!r}: row {row} is null; {what}s must not hold nulls",
                f"{what} {name!r}",
                f"row {row} is null",
            )


def kafka_murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c, ``Utils.murmur2``) of a record key, as a
    signed 32-bit value: what its default partitioner hashes."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[whole:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def bucket_of_rows(
    batch: pa.RecordBatch | pa.Table, bucket_keys: Sequence[str], bucket_count: int, rule: str = "hash"
) -> npt.NDArray[np.int64]:
    """The bucket of every row under the table's rule (``hash``, ``iceberg`` or
    ``kafka``: a compacted topic's partitioner over its BYTES key)."""
    check_no_nulls(batch, bucket_keys, "bucket key")
    columns = [_plain(batch.column(k)) for k in bucket_keys]
    if rule == "kafka":
        if len(columns) != 1 or not pa.types.is_binary(columns[0].type):
            raise InvalidArgument("invalid bucketing: the kafka rule takes one BYTES bucket key", "bucketing")
        hashes = np.array([kafka_murmur2(k) & 0x7FFFFFFF for k in columns[0].to_pylist()], dtype=np.uint32)
        return (hashes % np.uint32(bucket_count)).astype(np.int64)
    if rule == "iceberg":
        if len(columns) != 1:
            raise InvalidArgument("invalid bucketing: the iceberg rule takes one bucket key", "bucketing")
        hashes = _iceberg_hashes(columns[0], bucket_keys[0])
    else:
        hashes = _key_hashes(columns, bucket_keys)
    return ((hashes & np.uint32(0x7FFFFFFF)) % np.uint32(bucket_count)).astype(np.int64)


def _render(column: pa.Array, name: str) -> pa.Array:
    t = column.type
    if pa.types.is_string(t):
        return column
    if pa.types.is_boolean(t) or pa.types.is_signed_integer(t) or pa.types.is_date32(t):
        return column.cast(pa.string())
    raise InvalidArgument(
        f"invalid partition key {name!r}: Arrow type {t} cannot name a partition",
        f"partition key {name!r}",
    )


def partition_names(batch: pa.RecordBatch | pa.Table, partition_keys: Sequence[str]) -> pa.Array:
    """The partition name of every row (docs/decisions.md): one value renders as itself
    (STRING as is, integers in decimal, BOOLEAN as ``true``/``false``, DATE as
    ``YYYY-MM-DD``); several join with ``__``. Fails on a null or an invalid name."""
    check_no_nulls(batch, partition_keys, "partition key")
    rendered = [_render(_plain(batch.column(k)), k) for k in partition_keys]
    if len(rendered) == 1:
        names = rendered[0]
    else:
        for k, r in zip(partition_keys, rendered):
            if pc.any(pc.match_substring(r, PARTITION_SEPARATOR)).as_py():
                raise InvalidArgument(
                    f"invalid partition key {k!r}: a value of a multi-key partition may not "
                    f"contain {PARTITION_SEPARATOR!r}",
                    f"partition key {k!r}",
                )
        names = pc.binary_join_element_wise(*rendered, PARTITION_SEPARATOR)
    for name in pc.unique(names).to_pylist():
        if not _PARTITION_NAME.match(name):
            raise InvalidArgument(
                f"invalid partition name: {name!r} is not a valid partition name "
                "([A-Za-z0-9_][A-Za-z0-9_-]{0,199})",
                "partition name",
            )
    return names
