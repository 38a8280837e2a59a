//! Kafka record batches (v2) to and from Arrow rows of a topic table.
//!
//! A topic is a log table with four columns (spec/protocols.txt): `key BYTES`,
//! `value BYTES`, `headers BYTES`, `timestamp TIMESTAMP_LTZ(3) NOT NULL`. Each record is
//! one row. `headers` holds the record's headers in Kafka's own record-header encoding
//! (a zigzag varint count, then per header a varint key length and the UTF-8 key, a
//! varint value length, -1 for null, and the value); null when a record has none.
//! A record without a timestamp (-1) gets the time it arrived.
//!
//! Produced batches are read here, straight into Arrow columns, with the codecs driven
//! under a size bound ([`decode_produce`]); fetched rows are written here as one
//! uncompressed batch ([`encode_fetched`]). Both are checked against kafka-protocol's
//! encoder and decoder by a property test.

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, BinaryArray, BinaryBuilder, RecordBatch, TimestampMillisecondArray};
use arrow::datatypes::SchemaRef;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::records::Compression;
use mink_types::{Column, DataType, Schema};

/// The four columns of a topic table, in order.
pub fn topic_columns() -> Vec<Column> {
    vec![
        Column::new("key", DataType::Bytes, true),
        Column::new("value", DataType::Bytes, true),
        Column::new("headers", DataType::Bytes, true),
        Column::new("timestamp", DataType::TimestampLtz { precision: 3 }, false),
    ]
}

/// The Arrow schema of a topic's rows.
pub fn topic_schema() -> SchemaRef {
    Schema::new(1, topic_columns()).to_arrow()
}

/// Whether a table with these columns began as a topic: its first four columns are
/// the topic columns (`alter_table` only appends columns, so this holds for the
/// table's life).
pub fn starts_as_topic(columns: &[Column]) -> bool {
    columns.len() >= 4 && is_topic(&columns[..4])
}

/// The columns of a compacted topic's table: the topic columns with the key NOT
/// NULL, as a primary key is (a compacted topic refuses a record without a key).
pub fn compacted_topic_columns() -> Vec<Column> {
    let mut columns = topic_columns();
    columns[0].nullable = false;
    columns
}

/// Whether a table with these columns is a (log) topic.
pub fn is_topic(columns: &[Column]) -> bool {
    let want = topic_columns();
    columns.len() == want.len()
        && columns.iter().zip(&want).all(|(c, w)| {
            c.name == w.name && c.data_type == w.data_type && c.nullable == w.nullable
        })
}

/// Why a produced record set was refused: the Kafka error and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    pub code: ResponseError,
    pub message: String,
}

impl RecordError {
    pub(crate) fn new(code: ResponseError, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

/// One produced batch, as rows.
#[derive(Debug, Clone)]
pub struct ProducedBatch {
    /// The producer id (-1 without an idempotent producer).
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub compression: Compression,
    pub rows: RecordBatch,
}

/// The byte of a record batch that holds its format version (magic).
const MAGIC_OFFSET: usize = 16;
/// Bytes of a v2 record batch header.
const BATCH_HEADER_BYTES: usize = 61;
/// Where the batch length ends: the length counts the bytes after it.
const BATCH_LENGTH_ENDS: usize = 12;
/// Where the bytes the CRC covers begin (the attributes).
const CRC_FROM: usize = 21;
/// Attribute bits of a v2 record batch.
const ATTR_TRANSACTIONAL: i16 = 1 << 4;
const ATTR_CONTROL: i16 = 1 << 5;

/// The fields of a v2 record batch header, at their fixed offsets (Kafka's
/// `DefaultRecordBatch`).
struct BatchHead {
    base_offset: i64,
    batch_length: i32,
    crc: u32,
    attributes: i16,
    first_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    record_count: i32,
}

impl BatchHead {
    /// `b` holds at least [`BATCH_HEADER_BYTES`].
    fn parse(b: &[u8]) -> Self {
        let at = |i: usize, n: usize| &b[i..i + n];
        let i16_at = |i| i16::from_be_bytes(at(i, 2).try_into().expect("2 bytes"));
        let i32_at = |i| i32::from_be_bytes(at(i, 4).try_into().expect("4 bytes"));
        let i64_at = |i| i64::from_be_bytes(at(i, 8).try_into().expect("8 bytes"));
        Self {
            base_offset: i64_at(0),
            batch_length: i32_at(8),
            crc: i32_at(17) as u32,
            attributes: i16_at(21),
            first_timestamp: i64_at(27),
            producer_id: i64_at(43),
            producer_epoch: i16_at(51),
            base_sequence: i32_at(53),
            record_count: i32_at(57),
        }
    }
}

/// Decodes the records of one partition of a Produce request: exactly one record
/// batch v2 (as Kafka requires from Produce v3 on), its CRC checked, decompressed,
/// each record a row. `now_ms` stamps records without a timestamp.
///
/// A record without a timestamp gets `now_ms`; one stamped after `latest_ms` is
/// INVALID_TIMESTAMP (Kafka's `message.timestamp.after.max.ms`): a topic is indexed
/// and expired by its record timestamps, and a far-future one would pin both.
///
/// A compressed batch is decompressed to at most `max_bytes` (MESSAGE_TOO_LARGE
/// beyond): a few kilobytes of zstd can hold gigabytes of zeros. A batch whose record
/// count its bytes cannot hold is CORRUPT_MESSAGE before any record is decoded.
pub fn decode_produce(
    records: &Bytes,
    now_ms: i64,
    latest_ms: i64,
    max_bytes: usize,
) -> Result<ProducedBatch, RecordError> {
    let corrupt = |m: String| RecordError::new(ResponseError::CorruptMessage, m);
    if records.len() < BATCH_HEADER_BYTES {
        return Err(corrupt(format!(
            "{} bytes cannot hold a record batch (its header alone is {BATCH_HEADER_BYTES})",
            records.len()
        )));
    }
    let magic = records[MAGIC_OFFSET] as i8;
    if magic != 2 {
        return Err(RecordError::new(
            ResponseError::UnsupportedForMessageFormat,
            format!("message format v{magic} is not supported; send record batches v2"),
        ));
    }
    let head = BatchHead::parse(records);
    let total = BATCH_LENGTH_ENDS + head.batch_length.max(0) as usize;
    if head.batch_length < (BATCH_HEADER_BYTES - BATCH_LENGTH_ENDS) as i32 || total > records.len()
    {
        return Err(corrupt(format!(
            "the batch header gives a length of {} bytes after its first {BATCH_LENGTH_ENDS}, and {} follow",
            head.batch_length,
            records.len() - BATCH_LENGTH_ENDS
        )));
    }
    if total < records.len() {
        return Err(RecordError::new(
            ResponseError::InvalidRecord,
            format!(
                "{} bytes follow the record batch; a Produce carries exactly one batch per partition",
                records.len() - total
            ),
        ));
    }
    if head.record_count <= 0 {
        return Err(RecordError::new(
            ResponseError::InvalidRecord,
            format!("a record batch of {} records", head.record_count),
        ));
    }
    let crc = crc32c::crc32c(&records[CRC_FROM..]);
    if crc != head.crc {
        return Err(corrupt(format!(
            "CRC mismatch: the batch header says {:#010x}, its bytes give {crc:#010x}",
            head.crc
        )));
    }
    if head.attributes & ATTR_TRANSACTIONAL != 0 {
        return Err(RecordError::new(
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactional produce is not implemented",
        ));
    }
    if head.attributes & ATTR_CONTROL != 0 {
        return Err(RecordError::new(
            ResponseError::InvalidRecord,
            "control batches are not accepted from producers",
        ));
    }
    let compression = match head.attributes & 0x7 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        4 => Compression::Zstd,
        other => return Err(corrupt(format!("unknown compression codec {other}"))),
    };
    let mut section = records.slice(BATCH_HEADER_BYTES..);
    let section = decompress_bounded(&mut section, compression, max_bytes)?;
    let section = fits(head.record_count, section)?;
    let rows = rows_of(&section, &head, now_ms, latest_ms)?;
    Ok(ProducedBatch {
        producer_id: head.producer_id,
        producer_epoch: head.producer_epoch,
        base_sequence: head.base_sequence,
        compression,
        rows,
    })
}

/// Bytes of the smallest record a v2 batch can hold: a length, attributes, timestamp
/// delta, offset delta, key length, value length and header count of one byte each.
const RECORD_BYTES_MIN: usize = 7;

/// The records section of a batch, decompressed to at most `max` bytes. kafka-protocol
/// decompresses without a bound (and believes a raw snappy header's length), so the
/// codecs are driven here, each stopped one byte past the bound.
fn decompress_bounded(
    section: &mut Bytes,
    compression: Compression,
    max: usize,
) -> Result<Bytes, RecordError> {
    use std::io::Read;
    let corrupt = |e: &dyn std::fmt::Display| {
        RecordError::new(
            ResponseError::CorruptMessage,
            format!("{compression:?} records: {e}"),
        )
    };
    let too_large = |n: String| {
        RecordError::new(
            ResponseError::MessageTooLarge,
            format!(
                "the {compression:?} records decompress to {n} bytes, more than kafka.max_request_bytes ({max})"
            ),
        )
    };
    let read = |r: &mut dyn Read| -> Result<Bytes, RecordError> {
        let mut out = Vec::new();
        r.take((max as u64).saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| corrupt(&e))?;
        if out.len() > max {
            return Err(too_large("more".into()));
        }
        Ok(out.into())
    };
    match compression {
        Compression::None => Ok(section.clone()),
        Compression::Gzip => read(&mut flate2::read::MultiGzDecoder::new(&section[..])),
        Compression::Zstd => {
            let mut decoder =
                zstd::stream::read::Decoder::with_buffer(&section[..]).map_err(|e| corrupt(&e))?;
            // A frame states the window its decoder allocates (up to 128 MiB by
            // libzstd's default limit) whatever it decompresses to: no window larger
            // than the bound is needed.
            decoder
                .window_log_max(zstd_window_log(max))
                .map_err(|e| corrupt(&e))?;
            read(&mut decoder)
        }
        Compression::Lz4 => read(&mut lz4::Decoder::new(&section[..]).map_err(|e| corrupt(&e))?),
        Compression::Snappy => {
            // Snappy states each block's length up front: check them, then let
            // kafka-protocol decode (Kafka's xerial framing, or one raw block).
            let total = snappy_len(section, max).map_err(|e| corrupt(&e))?;
            if total > max {
                return Err(too_large(total.to_string()));
            }
            <kafka_protocol::compression::Snappy as kafka_protocol::compression::Decompressor<
                Bytes,
            >>::decompress(section, |b: &mut Bytes| Ok(b.clone()))
            .map_err(|e| corrupt(&e))
        }
    }
}

/// The bytes a snappy section decompresses to, as its blocks state them, counted up to
/// the first block that takes the total past `max`. Kafka's snappy framing
/// (snappy-java's, recognised by its whole 16-byte header as kafka-protocol does) is
/// blocks of a 4-byte big-endian length and that many bytes of raw snappy; without the
/// header the whole section is one raw block.
fn snappy_len(section: &[u8], max: usize) -> Result<usize, String> {
    const XERIAL: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
    let len = |block: &[u8]| snap::raw::decompress_len(block).map_err(|e| e.to_string());
    let Some(mut rest) = section.strip_prefix(XERIAL) else {
        return len(section);
    };
    let mut total = 0usize;
    while !rest.is_empty() && total <= max {
        let Some((head, after)) = rest.split_first_chunk::<4>() else {
            return Err("a block length runs past the end".into());
        };
        let n = u32::from_be_bytes(*head) as usize;
        let Some((block, after)) = after.split_at_checked(n) else {
            return Err(format!("a block of {n} bytes runs past the end"));
        };
        total = total.saturating_add(len(block)?);
        rest = after;
    }
    Ok(total)
}

/// The largest zstd window log allowed for output of at most `max` bytes: what `max`
/// needs, but at least 8 MiB (producers' encoders pick windows from their level, not
/// from the batch: 2 MiB at zstd's default level 3) and at most libzstd's default
/// limit of 128 MiB.
fn zstd_window_log(max: usize) -> u32 {
    let needed = usize::BITS - max.max(1).leading_zeros();
    needed.clamp(23, 27)
}

/// `records` decompressed, if they can hold `count` records: room for the header's
/// count is reserved before a record is read, so a forged count would otherwise ask
/// for gigabytes (kafka-protocol's decoder reserves it as it stands).
fn fits(count: i32, records: Bytes) -> Result<Bytes, RecordError> {
    if (count as usize).saturating_mul(RECORD_BYTES_MIN) > records.len() {
        return Err(RecordError::new(
            ResponseError::CorruptMessage,
            format!(
                "the batch header counts {count} records; {} bytes of records cannot hold them",
                records.len()
            ),
        ));
    }
    Ok(records)
}

/// Where one record's fields sit in the records section.
struct RecordAt {
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
    /// The header count and the headers, as on the wire: the `headers` column's
    /// encoding. `None` without headers.
    headers: Option<Range<usize>>,
    timestamp: i64,
}

/// A reader of the records section that knows where it is.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
    end: usize,
}

impl Cursor<'_> {
    fn varlong(&mut self) -> Result<i64, String> {
        let mut rest = &self.bytes[self.at..self.end];
        let before = rest.len();
        let v = get_varint(&mut rest)?;
        self.at += before - rest.len();
        Ok(v)
    }

    /// The varint of a 32-bit field: at most 5 bytes, as Kafka's `ByteUtils.readVarint`
    /// reads it (a longer one is refused there, and kafka-protocol stops after 5 bytes
    /// and reads the rest as the next field).
    fn varint(&mut self, what: &str) -> Result<i32, String> {
        let rest = &self.bytes[self.at..self.end];
        let mut z: u32 = 0;
        for (i, &b) in rest.iter().take(5).enumerate() {
            z |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                self.at += i + 1;
                return Ok(((z >> 1) as i32) ^ -((z & 1) as i32));
            }
        }
        Err(if rest.len() < 5 {
            format!("{what} runs past the end")
        } else {
            format!("{what} is a varint longer than 5 bytes")
        })
    }

    fn take(&mut self, n: usize, what: &str) -> Result<Range<usize>, String> {
        if n > self.end - self.at {
            return Err(format!(
                "{what} of {n} bytes runs past the end ({} left)",
                self.end - self.at
            ));
        }
        self.at += n;
        Ok(self.at - n..self.at)
    }

    /// A length-prefixed field; -1 is null.
    fn nullable(&mut self, what: &str) -> Result<Option<Range<usize>>, String> {
        match self.varint(what)? {
            -1 => Ok(None),
            n if n < 0 => Err(format!("{what} has length {n}")),
            n => self.take(n as usize, what).map(Some),
        }
    }
}

/// Finds the fields of record `i` at `cur.at`, and moves past it.
fn record_at(
    cur: &mut Cursor<'_>,
    head: &BatchHead,
    now_ms: i64,
    latest_ms: i64,
) -> Result<RecordAt, RecordError> {
    let corrupt = |m: String| RecordError::new(ResponseError::CorruptMessage, m);
    let len = cur.varint("a record length").map_err(corrupt)?;
    let body = usize::try_from(len)
        .map_err(|_| format!("a record length of {len}"))
        .and_then(|n| cur.take(n, "a record"))
        .map_err(corrupt)?;
    let mut r = Cursor {
        bytes: cur.bytes,
        at: body.start,
        end: body.end,
    };
    let _attributes = r.take(1, "the attributes").map_err(corrupt)?;
    let timestamp_delta = r.varlong().map_err(corrupt)?;
    let offset_delta = r.varint("an offset delta").map_err(corrupt)?;
    let key = r.nullable("the key").map_err(corrupt)?;
    let value = r.nullable("the value").map_err(corrupt)?;
    let headers_from = r.at;
    let mut count = 0;
    walk_headers(&r.bytes[r.at..r.end], |_, _| count += 1).map_err(corrupt)?;
    // Wrapping, as Kafka's reader adds it (a batch may span timestamps a whole i64
    // apart); what comes out negative is stamped with the arrival time below.
    let timestamp = head.first_timestamp.wrapping_add(timestamp_delta);
    if timestamp > latest_ms {
        return Err(RecordError::new(
            ResponseError::InvalidTimestamp,
            format!(
                "record {} has timestamp {timestamp}, more than kafka.timestamp_after_max_ms ahead of this broker's clock (at most {latest_ms})",
                head.base_offset.saturating_add(offset_delta as i64)
            ),
        ));
    }
    Ok(RecordAt {
        key,
        value,
        headers: (count > 0).then_some(headers_from..r.end),
        timestamp: if timestamp < 0 { now_ms } else { timestamp },
    })
}

/// Walks the `count` records of a (decompressed) records section, each checked whole,
/// and the section has nothing after them.
fn each_record(
    section: &[u8],
    head: &BatchHead,
    now_ms: i64,
    latest_ms: i64,
    mut visit: impl FnMut(RecordAt),
) -> Result<(), RecordError> {
    let count = head.record_count as usize;
    let mut cur = Cursor {
        bytes: section,
        at: 0,
        end: section.len(),
    };
    for _ in 0..count {
        visit(record_at(&mut cur, head, now_ms, latest_ms)?);
    }
    if cur.at != cur.end {
        return Err(RecordError::new(
            ResponseError::CorruptMessage,
            format!(
                "{} bytes after the last of the {count} records the header counts",
                cur.end - cur.at
            ),
        ));
    }
    Ok(())
}

/// The rows of a (decompressed) records section: Kafka's record v2 read straight into
/// Arrow columns. kafka-protocol's decoder builds a `Record` per record (headers in a
/// map, which also drops repeated header keys, which Kafka allows) and sizes its
/// vectors from counts on the wire; this reads the section twice, once to check it and
/// size the columns exactly and once to fill them, copying each key and value once,
/// with nothing per record held in between, and keeps the headers as sent.
fn rows_of(
    section: &[u8],
    head: &BatchHead,
    now_ms: i64,
    latest_ms: i64,
) -> Result<RecordBatch, RecordError> {
    let count = head.record_count as usize;
    let len = |f: &Option<Range<usize>>| f.as_ref().map_or(0, |f| f.len());
    let (mut keys, mut values, mut headers) = (0, 0, 0);
    each_record(section, head, now_ms, latest_ms, |r| {
        keys += len(&r.key);
        values += len(&r.value);
        headers += len(&r.headers);
    })?;
    // Sized exactly: a builder that grows copies everything it holds each time.
    let mut keys = BinaryBuilder::with_capacity(count, keys);
    let mut values = BinaryBuilder::with_capacity(count, values);
    let mut headers = BinaryBuilder::with_capacity(count, headers);
    let mut timestamps = Vec::with_capacity(count);
    let field = |f: Option<Range<usize>>| f.map(|f| &section[f]);
    each_record(section, head, now_ms, latest_ms, |r| {
        keys.append_option(field(r.key));
        values.append_option(field(r.value));
        headers.append_option(field(r.headers));
        timestamps.push(r.timestamp);
    })?;
    let timestamps = TimestampMillisecondArray::from(timestamps).with_timezone("UTC");
    RecordBatch::try_new(
        topic_schema(),
        vec![
            Arc::new(keys.finish()),
            Arc::new(values.finish()),
            Arc::new(headers.finish()),
            Arc::new(timestamps),
        ],
    )
    .map_err(|e| RecordError::new(ResponseError::InvalidRecord, e.to_string()))
}

/// Checks the `headers` of rows written to a topic by other means than Kafka (Flight):
/// each non-null value must be a header section a Kafka consumer reads
/// ([`decode_headers`]), or every fetch of the partition would stop at that batch.
/// An error names the first row that is not.
pub fn check_headers(rows: &RecordBatch) -> Result<(), String> {
    let Some(headers) = rows
        .column_by_name("headers")
        .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
    else {
        return Ok(());
    };
    for i in 0..headers.len() {
        if headers.is_valid(i) {
            walk_headers(headers.value(i), |_, _| ()).map_err(|e| format!("row {i}: {e}"))?;
        }
    }
    Ok(())
}

/// Encodes `(key, value)` headers in Kafka's record-header encoding.
pub fn encode_headers<'a>(
    headers: impl ExactSizeIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    out: &mut Vec<u8>,
) {
    put_varint(out, headers.len() as i64);
    for (k, v) in headers {
        put_varint(out, k.len() as i64);
        out.extend_from_slice(k);
        match v {
            Some(v) => {
                put_varint(out, v.len() as i64);
                out.extend_from_slice(v);
            }
            None => put_varint(out, -1),
        }
    }
}

/// One record header: its key and value (null allowed).
pub type Header = (String, Option<Vec<u8>>);

/// Headers encoded by [`encode_headers`]; an error names what is malformed.
pub fn decode_headers(bytes: &[u8]) -> Result<Vec<Header>, String> {
    let mut out = Vec::new();
    walk_headers(bytes, |key, value| {
        out.push((key.to_string(), value.map(<[u8]>::to_vec)))
    })?;
    Ok(out)
}

/// Walks a header section (Kafka's record-header encoding) and checks it whole, as a
/// Kafka consumer reads it: varints of at most 5 bytes, every key present and UTF-8,
/// nothing after the last header. `visit` gets each key and value. One reader for the
/// produced records, the stored headers a fetch sends, and [`decode_headers`].
fn walk_headers<'a>(
    bytes: &'a [u8],
    mut visit: impl FnMut(&'a str, Option<&'a [u8]>),
) -> Result<(), String> {
    let mut c = Cursor {
        bytes,
        at: 0,
        end: bytes.len(),
    };
    let count = c.varint("a header count or length")?;
    // A header is at least two bytes (two lengths).
    if count < 0 || count as usize > (c.end - c.at) / 2 {
        return Err(format!("a header count of {count}"));
    }
    for i in 0..count {
        let at = |e: String| format!("header {i}: {e}");
        let key = c
            .nullable("a key")
            .map_err(at)?
            .ok_or_else(|| format!("header {i} has a null key"))?;
        let key = std::str::from_utf8(&bytes[key])
            .map_err(|_| format!("header {i}: key is not UTF-8"))?;
        let value = c.nullable("a value").map_err(at)?;
        visit(key, value.map(|v| &bytes[v]));
    }
    if c.at != c.end {
        return Err(format!("{} bytes after the last header", c.end - c.at));
    }
    Ok(())
}

fn put_varint(out: &mut impl BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn get_varint(bytes: &mut &[u8]) -> Result<i64, String> {
    let mut z: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes
            .split_first()
            .ok_or_else(|| "a varint runs past the end".to_string())?;
        *bytes = rest;
        z |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((z >> 1) as i64) ^ -((z & 1) as i64));
        }
    }
    Err("a varint longer than 10 bytes".into())
}

/// Encodes rows of a topic (as [`topic_schema`]) read from offset `base_offset` as one
/// record batch v2, uncompressed, appended to `out`. `leader_epoch` is the one the
/// batch was written under. With `log_append_time` (a topic whose
/// `message.timestamp.type` is LogAppendTime) the batch says so in its attributes and
/// carries that time as its max timestamp, which clients give every record, as Kafka
/// brokers write it.
pub fn encode_fetched(
    base_offset: i64,
    rows: &RecordBatch,
    leader_epoch: i32,
    log_append_time: Option<i64>,
    out: &mut BytesMut,
) -> Result<(), String> {
    encode_fetched_at(base_offset, rows, None, leader_epoch, log_append_time, out)
}

/// Where the records of a fetched batch sit when they are not one per offset from
/// its base: a compacted topic's changelog batch without its before-images (`-U`),
/// whose offsets it skips, as a batch after Kafka's compaction skips those of
/// records compacted away (the batch keeps its last offset delta).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetDeltas {
    /// Each row's offset less the batch's base offset, ascending.
    pub deltas: Vec<i32>,
    /// The offset delta of the batch's last offset, kept or not.
    pub last: i32,
}

/// [`encode_fetched`] of rows at `offsets` (`None`: one per offset from the base).
pub fn encode_fetched_at(
    base_offset: i64,
    rows: &RecordBatch,
    offsets: Option<&OffsetDeltas>,
    leader_epoch: i32,
    log_append_time: Option<i64>,
    out: &mut BytesMut,
) -> Result<(), String> {
    let n = rows.num_rows();
    if n == 0 {
        return Ok(());
    }
    if let Some(o) = offsets
        && (o.deltas.len() != n || o.deltas.last().is_some_and(|d| *d > o.last))
    {
        return Err(format!(
            "{} offsets for {n} rows, the last at most {}",
            o.deltas.len(),
            o.last
        ));
    }
    let delta = |i: usize| offsets.map_or(i as i64, |o| i64::from(o.deltas[i]));
    let last_delta = offsets.map_or(n as i32 - 1, |o| o.last);
    let column = |name: &str| {
        rows.column_by_name(name)
            .ok_or_else(|| format!("the rows lack a {name} column"))
    };
    let binary = |name: &str| -> Result<&BinaryArray, String> {
        column(name)?
            .as_any()
            .downcast_ref::<BinaryArray>()
            .ok_or_else(|| format!("the {name} column is not BYTES"))
    };
    let (keys, values, headers) = (binary("key")?, binary("value")?, binary("headers")?);
    let timestamps = column("timestamp")?
        .as_any()
        .downcast_ref::<TimestampMillisecondArray>()
        .ok_or_else(|| "the timestamp column is not TIMESTAMP_LTZ(3)".to_string())?;
    let timestamp = |i: usize| {
        if timestamps.is_valid(i) {
            timestamps.value(i)
        } else {
            -1
        }
    };
    let first_timestamp = (0..n).map(timestamp).min().unwrap_or(-1);
    let max_timestamp =
        log_append_time.unwrap_or_else(|| (0..n).map(timestamp).max().unwrap_or(-1));
    // Bit 3: the timestamp type is LogAppendTime.
    let attributes: i16 = if log_append_time.is_some() { 0x08 } else { 0 };
    fn field(a: &BinaryArray, i: usize) -> Option<&[u8]> {
        a.is_valid(i).then(|| a.value(i))
    }
    let start = out.len();
    out.put_i64(base_offset);
    out.put_i32(0); // the batch length, set below
    out.put_i32(leader_epoch);
    out.put_i8(2); // magic
    out.put_u32(0); // the CRC, set below
    out.put_i16(attributes); // uncompressed, the timestamp type, no producer state
    out.put_i32(last_delta);
    out.put_i64(first_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(-1); // producer id
    out.put_i16(-1); // producer epoch
    out.put_i32(-1); // base sequence
    out.put_i32(n as i32);
    for i in 0..n {
        // Stored headers are Kafka's own encoding (a table written through Flight may
        // hold anything there: checked), sent as they are; none is a count of 0.
        let record_headers = match field(headers, i) {
            Some(h) => {
                walk_headers(h, |_, _| ())
                    .map_err(|e| format!("offset {}: headers: {e}", base_offset + delta(i)))?;
                h
            }
            None => &[0u8][..],
        };
        let (key, value) = (field(keys, i), field(values, i));
        // Wrapping, as consumers add it back: rows written through Flight may hold
        // timestamps a whole i64 apart.
        let timestamp_delta = timestamp(i).wrapping_sub(first_timestamp);
        let body = 1
            + varint_len(timestamp_delta)
            + varint_len(delta(i))
            + key.map_or(1, |k| varint_len(k.len() as i64) + k.len())
            + value.map_or(1, |v| varint_len(v.len() as i64) + v.len())
            + record_headers.len();
        put_varint(out, body as i64);
        out.put_u8(0); // attributes
        put_varint(out, timestamp_delta);
        put_varint(out, delta(i));
        for f in [key, value] {
            match f {
                Some(f) => {
                    put_varint(out, f.len() as i64);
                    out.put_slice(f);
                }
                None => put_varint(out, -1),
            }
        }
        out.put_slice(record_headers);
    }
    let length = (out.len() - start - BATCH_LENGTH_ENDS) as i32;
    out[start + 8..start + 12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + CRC_FROM..]);
    out[start + 17..start + CRC_FROM].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// Bytes of `v` as a zigzag varint.
fn varint_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - z.max(1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use proptest::prelude::*;

    /// A record of producer 7, epoch 0, at sequence `10 + offset`.
    pub(crate) fn record(
        offset: i64,
        key: &str,
        value: &str,
        ts: i64,
        headers: &[(&str, &str)],
    ) -> Record {
        let mut h = kafka_protocol::indexmap::IndexMap::new();
        for (k, v) in headers {
            h.insert(
                StrBytes::from_string(k.to_string()),
                Some(Bytes::from(v.to_string())),
            );
        }
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 7,
            producer_epoch: 0,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: 10 + offset as i32,
            timestamp: ts,
            key: Some(Bytes::from(key.to_string())),
            value: Some(Bytes::from(value.to_string())),
            headers: h,
        }
    }

    /// `records` as one record batch v2.
    pub(crate) fn produced(records: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    #[test]
    fn a_batch_round_trips_through_rows_with_every_compression() {
        let records = vec![
            record(0, "k0", "v0", 1_700_000_000_000, &[("h", "x"), ("i", "y")]),
            record(1, "k1", "v1", 1_700_000_000_001, &[]),
            record(2, "k2", "v2", -1, &[]),
        ];
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let batch =
                decode_produce(&produced(&records, compression), 42, i64::MAX, 1 << 20).unwrap();
            assert_eq!(batch.compression, compression);
            assert_eq!(batch.producer_id, 7);
            assert_eq!(batch.base_sequence, 10);
            assert_eq!(batch.rows.num_rows(), 3);
            assert_eq!(batch.rows.schema(), topic_schema());
            // Back out as a fetched batch at offset 100.
            let mut out = BytesMut::new();
            encode_fetched(100, &batch.rows, 3, None, &mut out).unwrap();
            let set = RecordBatchDecoder::decode(&mut out.freeze()).unwrap();
            assert_eq!(set.records.len(), 3);
            let r = &set.records;
            assert_eq!(
                r.iter().map(|r| r.offset).collect::<Vec<_>>(),
                [100, 101, 102]
            );
            assert_eq!(r[0].timestamp, 1_700_000_000_000);
            assert_eq!(r[1].timestamp, 1_700_000_000_001);
            assert_eq!(r[2].timestamp, 42, "no timestamp: the arrival time");
            assert_eq!(r[1].key.as_deref(), Some(&b"k1"[..]));
            assert_eq!(r[2].value.as_deref(), Some(&b"v2"[..]));
            assert_eq!(r[0].headers.len(), 2);
            assert_eq!(
                r[0].headers
                    .get(&StrBytes::from_static_str("i"))
                    .unwrap()
                    .as_deref(),
                Some(&b"y"[..])
            );
            assert!(r[1].headers.is_empty());
            assert_eq!(r[0].partition_leader_epoch, 3);
            assert_eq!(r[0].producer_id, -1);
        }
    }

    #[test]
    fn a_record_stamped_too_far_ahead_is_refused() {
        let records = [
            record(0, "k", "v", 1_000, &[]),
            record(1, "k", "v", 2_001, &[]),
        ];
        let err =
            decode_produce(&produced(&records, Compression::None), 0, 2_000, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::InvalidTimestamp);
        assert!(err.message.contains("timestamp 2001"), "{err}");
        let ok = decode_produce(&produced(&records, Compression::None), 0, 2_001, 1 << 20).unwrap();
        assert_eq!(ok.rows.num_rows(), 2);
    }

    #[test]
    fn a_corrupted_batch_is_refused_with_a_precise_error() {
        let good = produced(&[record(0, "k", "v", 1, &[])], Compression::None);
        let mut bad = good.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let err = decode_produce(&Bytes::from(bad), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage);
        assert!(err.message.contains("CRC mismatch"), "{err}");

        let err = decode_produce(&good.slice(..20), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage);
        assert!(err.message.contains("cannot hold a record batch"), "{err}");

        let mut truncated = good.to_vec();
        truncated.truncate(good.len() - 3);
        let err = decode_produce(&Bytes::from(truncated), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage, "{err}");

        let mut v1 = good.to_vec();
        v1[MAGIC_OFFSET] = 1;
        let err = decode_produce(&Bytes::from(v1), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::UnsupportedForMessageFormat);

        let mut two = good.to_vec();
        two.extend_from_slice(&good);
        let err = decode_produce(&Bytes::from(two), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::InvalidRecord);
        assert!(err.message.contains("exactly one batch"), "{err}");

        let mut txn = record(0, "k", "v", 1, &[]);
        txn.transactional = true;
        let err =
            decode_produce(&produced(&[txn], Compression::None), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::TransactionalIdAuthorizationFailed);
    }

    /// `batch` with its header's CRC set again over everything after it, as a forger
    /// (or a buggy client) would.
    fn recrc(mut batch: Vec<u8>) -> Bytes {
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        Bytes::from(batch)
    }

    #[test]
    fn decompression_and_record_counts_are_bounded() {
        // 64 records of 1 KiB of one byte: a few hundred bytes in any codec, 66 KB
        // decompressed.
        let value = "z".repeat(1024);
        let records: Vec<_> = (0..64).map(|i| record(i, "k", &value, 1, &[])).collect();
        for compression in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let batch = produced(&records, compression);
            assert!(batch.len() < 16 << 10, "{compression:?}: {}", batch.len());
            let err = decode_produce(&batch, 0, i64::MAX, 32 << 10).unwrap_err();
            assert_eq!(
                err.code,
                ResponseError::MessageTooLarge,
                "{compression:?}: {err}"
            );
            assert!(err.message.contains("kafka.max_request_bytes"), "{err}");
            let ok = decode_produce(&batch, 0, i64::MAX, 1 << 20).unwrap();
            assert_eq!(ok.rows.num_rows(), 64, "{compression:?}");
        }

        // A raw snappy block whose header claims 4 GiB: refused from the header,
        // before kafka-protocol would allocate it.
        let snappy = produced(&records[..1], Compression::Snappy).to_vec();
        let mut bomb = snappy[..BATCH_HEADER_BYTES].to_vec();
        bomb.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]);
        let length = (bomb.len() - BATCH_LENGTH_ENDS) as i32;
        bomb[8..12].copy_from_slice(&length.to_be_bytes());
        let err = decode_produce(&recrc(bomb), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::MessageTooLarge, "{err}");
        assert!(err.message.contains("4294967295"), "{err}");

        // A record count the bytes cannot hold: refused before anything is reserved
        // for it.
        let mut forged = produced(&records[..2], Compression::None).to_vec();
        forged[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let err = decode_produce(&recrc(forged), 0, i64::MAX, 1 << 20).unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage, "{err}");
        assert!(err.message.contains("cannot hold them"), "{err}");
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        let bytes = || proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40));
        (
            bytes(),
            bytes(),
            proptest::collection::btree_map("[a-z]{0,6}", bytes(), 0..4),
            prop_oneof![Just(-1i64), 0i64..2_000_000_000_000],
        )
            .prop_map(|(key, value, headers, timestamp)| {
                let mut r = record(0, "", "", timestamp, &[]);
                r.key = key.map(Bytes::from);
                r.value = value.map(Bytes::from);
                r.headers = headers
                    .into_iter()
                    .map(|(k, v)| (StrBytes::from_string(k), v.map(Bytes::from)))
                    .collect();
                r
            })
    }

    fn arb_compression() -> impl Strategy<Value = Compression> {
        prop_oneof![
            Just(Compression::None),
            Just(Compression::Gzip),
            Just(Compression::Snappy),
            Just(Compression::Lz4),
            Just(Compression::Zstd),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The produce decoder against kafka-protocol's: whatever kafka-protocol encodes,
        /// every field of every record comes out as kafka-protocol decodes it.
        #[test]
        fn the_produce_decoder_reads_what_kafka_protocol_reads(
            records in proptest::collection::vec(arb_record(), 1..30),
            compression in arb_compression(),
        ) {
            let mut records = records;
            for (i, r) in records.iter_mut().enumerate() {
                r.offset = i as i64;
                r.sequence = 10 + i as i32;
            }
            let batch = produced(&records, compression);
            let theirs = RecordBatchDecoder::decode(&mut batch.clone()).unwrap().records;
            let ours = decode_produce(&batch, 7, i64::MAX, 1 << 20).unwrap();
            prop_assert_eq!(ours.compression, compression);
            prop_assert_eq!(ours.producer_id, 7);
            prop_assert_eq!(ours.base_sequence, 10);
            let rows = &ours.rows;
            prop_assert_eq!(rows.num_rows(), theirs.len());
            let col = |i: usize| rows.column(i).as_any().downcast_ref::<BinaryArray>().unwrap();
            let stamps = rows.column(3).as_any().downcast_ref::<TimestampMillisecondArray>().unwrap();
            for (i, r) in theirs.iter().enumerate() {
                prop_assert_eq!(col(0).is_valid(i).then(|| col(0).value(i)), r.key.as_deref());
                prop_assert_eq!(col(1).is_valid(i).then(|| col(1).value(i)), r.value.as_deref());
                let headers: Vec<Header> = r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.as_ref().map(|v| v.to_vec())))
                    .collect();
                if headers.is_empty() {
                    prop_assert!(col(2).is_null(i));
                } else {
                    prop_assert_eq!(decode_headers(col(2).value(i)).unwrap(), headers);
                }
                prop_assert_eq!(stamps.value(i), if r.timestamp < 0 { 7 } else { r.timestamp });
            }

            // Fetched: kafka-protocol reads the rows back as they were produced, at
            // their offsets; and the produce decoder reads the fetched batch as the
            // same rows.
            let mut fetched = BytesMut::new();
            encode_fetched(100, rows, 3, None, &mut fetched).unwrap();
            let fetched = fetched.freeze();
            let back = RecordBatchDecoder::decode(&mut fetched.clone()).unwrap().records;
            prop_assert_eq!(back.len(), theirs.len());
            for (i, (b, r)) in back.iter().zip(&theirs).enumerate() {
                prop_assert_eq!(b.offset, 100 + i as i64);
                prop_assert_eq!(b.partition_leader_epoch, 3);
                prop_assert_eq!(b.producer_id, -1);
                prop_assert_eq!(&b.key, &r.key);
                prop_assert_eq!(&b.value, &r.value);
                prop_assert_eq!(&b.headers, &r.headers);
                prop_assert_eq!(b.timestamp, if r.timestamp < 0 { 7 } else { r.timestamp });
            }
            let again = decode_produce(&fetched, 8, i64::MAX, 1 << 20).unwrap();
            prop_assert_eq!(&again.rows, rows);
        }

        /// Whatever a batch's bytes are changed to, with the CRC made to match, the
        /// decoder answers: rows or an error, never a panic or a runaway allocation.
        #[test]
        fn a_damaged_batch_is_refused_not_a_crash(
            records in proptest::collection::vec(arb_record(), 1..8),
            compression in arb_compression(),
            damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        ) {
            let mut bytes = produced(&records, compression).to_vec();
            for (at, b) in damage {
                // Past the header fields the length and CRC checks rest on.
                let i = BATCH_LENGTH_ENDS + at.index(bytes.len() - BATCH_LENGTH_ENDS);
                if !(17..21).contains(&i) {
                    bytes[i] = b;
                }
            }
            let _ = decode_produce(&recrc(bytes), 0, i64::MAX, 1 << 20);
        }
    }

    #[test]
    fn varints_of_32_bit_fields_are_at_most_five_bytes() {
        let read = |bytes: &[u8]| {
            let mut c = Cursor {
                bytes,
                at: 0,
                end: bytes.len(),
            };
            c.varint("a length").map(|v| (v, c.at))
        };
        assert_eq!(read(&[0x02]), Ok((1, 1)));
        assert_eq!(read(&[0x01]), Ok((-1, 1)));
        assert_eq!(read(&[0xff, 0xff, 0xff, 0xff, 0x0f]), Ok((i32::MIN, 5)));
        // Zero written in six bytes: Kafka refuses it; kafka-protocol would stop after
        // five and read the sixth as the next field.
        let err = read(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x00]).unwrap_err();
        assert!(err.contains("longer than 5 bytes"), "{err}");
        assert!(
            read(&[0x80, 0x80])
                .unwrap_err()
                .contains("runs past the end")
        );
    }

    #[test]
    fn a_zstd_frame_may_not_ask_for_a_window_beyond_the_bound() {
        assert_eq!(zstd_window_log(0), 23);
        assert_eq!(zstd_window_log(32 << 20), 26, "32 MiB needs a log of 26");
        assert_eq!(zstd_window_log(100 << 20), 27);
        // 64 KiB compressed with a 128 MiB window and no stated size: refused under a
        // 1 MiB bound (an 8 MiB window at most), as the decoder would allocate it.
        let data = vec![7u8; 64 << 10];
        let mut out = Vec::new();
        {
            let mut enc = zstd::stream::write::Encoder::new(&mut out, 3).unwrap();
            enc.include_contentsize(false).unwrap();
            enc.window_log(27).unwrap();
            std::io::Write::write_all(&mut enc, &data).unwrap();
            enc.finish().unwrap();
        }
        let err = decompress_bounded(&mut Bytes::from(out.clone()), Compression::Zstd, 1 << 20)
            .unwrap_err();
        assert_eq!(err.code, ResponseError::CorruptMessage, "{err}");
        let ok = decompress_bounded(&mut Bytes::from(out), Compression::Zstd, 200 << 20).unwrap();
        assert_eq!(ok.len(), data.len());
    }

    #[test]
    fn repeated_header_keys_are_kept_and_fetched_as_sent() {
        // kafka-protocol's encoder keeps headers in a map, so this record's headers
        // are spliced in by hand: two headers, both named "h".
        let mut batch = produced(&[record(0, "k", "v", 5, &[])], Compression::None).to_vec();
        let mut headers = Vec::new();
        encode_headers(
            [(&b"h"[..], Some(&b"1"[..])), (&b"h"[..], Some(&b"2"[..]))].into_iter(),
            &mut headers,
        );
        // The record is its length varint and body; its body ends in a header count of 0.
        let record_at = BATCH_HEADER_BYTES;
        let old_len = (batch[record_at] >> 1) as usize;
        assert_eq!(batch.pop(), Some(0), "no headers");
        batch.extend_from_slice(&headers);
        batch[record_at] = ((old_len - 1 + headers.len()) << 1) as u8;
        let length = (batch.len() - BATCH_LENGTH_ENDS) as i32;
        batch[8..12].copy_from_slice(&length.to_be_bytes());
        let decoded = decode_produce(&recrc(batch), 0, i64::MAX, 1 << 20).unwrap();
        let column = decoded
            .rows
            .column(2)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert_eq!(
            decode_headers(column.value(0)).unwrap(),
            vec![
                ("h".into(), Some(b"1".to_vec())),
                ("h".into(), Some(b"2".to_vec()))
            ]
        );
        // And fetched as they were sent.
        let mut fetched = BytesMut::new();
        encode_fetched(0, &decoded.rows, 0, None, &mut fetched).unwrap();
        let again = decode_produce(&fetched.freeze(), 0, i64::MAX, 1 << 20).unwrap();
        assert_eq!(again.rows, decoded.rows);
    }

    /// Rows at offsets with gaps (a compacted topic's changelog without its
    /// before-images) keep their offsets, and the batch its last offset delta, so that
    /// a consumer goes on after the whole batch; offsets that do not fit are refused.
    #[test]
    fn fetched_rows_keep_their_offsets_across_gaps() {
        let rows = RecordBatch::try_new(
            topic_schema(),
            vec![
                Arc::new(BinaryArray::from_iter_values([b"k1", b"k2", b"k3"])),
                Arc::new(BinaryArray::from_iter([Some(&b"a"[..]), None, Some(b"c")])),
                Arc::new(BinaryArray::from_iter([None::<&[u8]>, None, None])),
                Arc::new(TimestampMillisecondArray::from(vec![1, 2, 3]).with_timezone("UTC")),
            ],
        )
        .unwrap();
        let offsets = OffsetDeltas {
            deltas: vec![0, 2, 3],
            last: 4,
        };
        let mut out = BytesMut::new();
        encode_fetched_at(100, &rows, Some(&offsets), 0, None, &mut out).unwrap();
        let out = out.freeze();
        // base offset 8, length 4, epoch 4, magic 1, CRC 4, attributes 2: the last
        // offset delta.
        assert_eq!(i32::from_be_bytes(out[23..27].try_into().unwrap()), 4);
        let back = RecordBatchDecoder::decode(&mut out.clone())
            .unwrap()
            .records;
        let got: Vec<(i64, Option<Bytes>)> =
            back.iter().map(|r| (r.offset, r.value.clone())).collect();
        assert_eq!(
            got,
            vec![
                (100, Some(Bytes::from_static(b"a"))),
                (102, None),
                (103, Some(Bytes::from_static(b"c")))
            ]
        );
        for bad in [
            OffsetDeltas {
                deltas: vec![0, 1],
                last: 4,
            },
            OffsetDeltas {
                deltas: vec![0, 2, 5],
                last: 4,
            },
        ] {
            assert!(
                encode_fetched_at(100, &rows, Some(&bad), 0, None, &mut BytesMut::new()).is_err()
            );
        }
    }

    #[test]
    fn rows_a_whole_i64_apart_in_time_are_fetched() {
        // A table written through Flight may hold any timestamps: the deltas wrap, as
        // a consumer's sum does.
        let rows = RecordBatch::try_new(
            topic_schema(),
            vec![
                Arc::new(BinaryArray::from_iter([None::<&[u8]>, None, None])),
                Arc::new(BinaryArray::from_iter_values([b"a", b"b", b"c"])),
                Arc::new(BinaryArray::from_iter([None::<&[u8]>, None, None])),
                Arc::new(
                    TimestampMillisecondArray::from(vec![i64::MIN, 0, i64::MAX])
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap();
        let mut out = BytesMut::new();
        encode_fetched(0, &rows, 0, None, &mut out).unwrap();
        let back = decode_produce(&out.freeze(), 42, i64::MAX, 1 << 20).unwrap();
        let stamps = back
            .rows
            .column(3)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        // Negative timestamps are stamped on produce; the others come back exactly.
        assert_eq!(stamps.values().to_vec(), vec![42, 0, i64::MAX]);
    }

    #[test]
    fn a_log_append_time_topic_sends_the_commit_time_as_kafka_brokers_do() {
        let rows = RecordBatch::try_new(
            topic_schema(),
            vec![
                Arc::new(BinaryArray::from_iter([None::<&[u8]>, None])),
                Arc::new(BinaryArray::from_iter_values([b"a", b"b"])),
                Arc::new(BinaryArray::from_iter([None::<&[u8]>, None])),
                Arc::new(TimestampMillisecondArray::from(vec![5, 9]).with_timezone("UTC")),
            ],
        )
        .unwrap();
        let mut out = BytesMut::new();
        encode_fetched(0, &rows, 0, Some(1_000), &mut out).unwrap();
        let batches = kafka_protocol::records::RecordBatchDecoder::decode(&mut out.freeze())
            .unwrap()
            .records;
        for r in &batches {
            assert_eq!(
                r.timestamp_type,
                kafka_protocol::records::TimestampType::LogAppend
            );
        }
        let mut plain = BytesMut::new();
        encode_fetched(0, &rows, 0, None, &mut plain).unwrap();
        let records = kafka_protocol::records::RecordBatchDecoder::decode(&mut plain.freeze())
            .unwrap()
            .records;
        assert_eq!(
            records[1].timestamp_type,
            kafka_protocol::records::TimestampType::Creation
        );
        assert_eq!(
            records.iter().map(|r| r.timestamp).collect::<Vec<_>>(),
            [5, 9]
        );
    }

    #[test]
    fn stored_headers_a_java_consumer_would_refuse_are_not_sent() {
        // A count of 0 written in six bytes: Java's reader throws on it.
        let err = decode_headers(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x00]).unwrap_err();
        assert!(err.contains("longer than 5 bytes"), "{err}");
        let rows = RecordBatch::try_new(
            topic_schema(),
            vec![
                Arc::new(BinaryArray::from_iter([None::<&[u8]>])),
                Arc::new(BinaryArray::from_iter([None::<&[u8]>])),
                Arc::new(BinaryArray::from_iter_values([[
                    0x80u8, 0x80, 0x80, 0x80, 0x80, 0x00,
                ]])),
                Arc::new(TimestampMillisecondArray::from(vec![1]).with_timezone("UTC")),
            ],
        )
        .unwrap();
        let err = encode_fetched(7, &rows, 0, None, &mut BytesMut::new()).unwrap_err();
        assert!(err.contains("offset 7: headers"), "{err}");
    }

    #[test]
    fn headers_round_trip_and_malformed_headers_are_named() {
        let mut out = Vec::new();
        encode_headers(
            [(&b"a"[..], Some(&b"1"[..])), (&b"b"[..], None)].into_iter(),
            &mut out,
        );
        assert_eq!(
            decode_headers(&out).unwrap(),
            vec![("a".into(), Some(b"1".to_vec())), ("b".into(), None)]
        );
        assert!(
            decode_headers(&out[..out.len() - 1])
                .unwrap_err()
                .contains("runs past the end")
        );
        assert_eq!(decode_headers(&[0x04]).unwrap_err(), "a header count of 2");
        let mut extra = out.clone();
        extra.push(0);
        assert!(
            decode_headers(&extra)
                .unwrap_err()
                .contains("after the last header")
        );
    }

    #[test]
    fn only_the_four_column_schema_is_a_topic() {
        assert!(is_topic(&topic_columns()));
        let mut other = topic_columns();
        other[3].nullable = true;
        assert!(!is_topic(&other));
        assert!(!is_topic(&topic_columns()[..3]));
    }
}
