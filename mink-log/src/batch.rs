//! The log batch: a fixed binary header, then the Arrow IPC record batch message
//! without its schema (the header's `schema_id` names it). docs/log-format.md holds the
//! byte table; every integer is little-endian.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::writer::StreamWriter;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use mink_types::{ChangeType, Compression, IpcEncoded, MinkError, Result, SchemaId};

/// `MKB1`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"MKB1");
/// Bytes before the change types: magic 4, base offset 8, commit timestamp 8, leader
/// epoch 8, CRC 4, record count 4, schema id 4, writer id 8, first sequence 8, last
/// sequence 8, attributes 2.
pub const FIXED_HEADER_LEN: usize = 4 + 8 + 8 + 8 + 4 + 4 + 4 + 8 + 8 + 8 + 2;
/// Where the CRC sits; it covers every byte after it. The fields before it are
/// assigned by the leader at append time (like Kafka's base offset), so a batch is
/// encoded once, outside the tablet's lock, and stamped under it.
pub const CRC_AT: usize = 4 + 8 + 8 + 8;
/// Attribute bit: the header holds one change type per row (primary-key tables).
pub const ATTR_CHANGE_TYPES: u16 = 1;
/// Attribute bit: a **sequence marker**, the log record of a primary-key Put that
/// changed nothing. It holds no rows (an IPC length of 0, no change types) but takes
/// one offset, so that its writer's sequence is durable like any other batch's and a
/// window rebuilt from the log knows it (a stale attempt of it arriving after a
/// reopen is then a duplicate, not a new Put applied out of order). Readers never see
/// it as rows: [`crate::LogTablet::scan`] leaves it out.
pub const ATTR_MARKER: u16 = 1 << 1;
/// The writer id of a batch written without idempotence.
pub const NO_WRITER: i64 = -1;

/// Everything in a batch's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub record_count: i32,
    pub commit_timestamp: i64,
    pub leader_epoch: i64,
    pub schema_id: SchemaId,
    pub writer_id: i64,
    pub first_sequence: i64,
    pub last_sequence: i64,
    pub attributes: u16,
    /// One per row for primary-key tables; empty (all `+A`) for log tables.
    pub change_types: Vec<ChangeType>,
}

impl BatchHeader {
    /// Whether this is a sequence marker ([`ATTR_MARKER`]).
    pub fn is_marker(&self) -> bool {
        self.attributes & ATTR_MARKER != 0
    }

    /// The offset after the batch's last row.
    pub fn end_offset(&self) -> i64 {
        self.base_offset + self.record_count as i64
    }

    /// The change type of row `i`.
    pub fn change_type(&self, i: usize) -> ChangeType {
        self.change_types
            .get(i)
            .copied()
            .unwrap_or(ChangeType::AppendOnly)
    }
}

/// A decoded batch.
#[derive(Debug, Clone)]
pub struct LogBatch {
    pub header: BatchHeader,
    pub batch: RecordBatch,
    /// Encoded size in bytes.
    pub size: usize,
}

fn corrupt(what: impl std::fmt::Display) -> MinkError {
    MinkError::Internal(format!("corrupt log batch: {what}"))
}

/// Encodes `batch` with `header` (whose `record_count` and change types must match),
/// its IPC body compressed as `compression` says.
///
/// Arrow's stream writer writes the IPC message straight into the batch after the
/// header, in its stream framing (the continuation marker, the message length, the
/// message, the body): the rows are copied once, into a buffer sized for them up front.
/// Through `IpcDataGenerator::encode` they were copied into a body that grew by
/// reallocation, then again behind the header.
pub fn encode(
    header: &BatchHeader,
    batch: &RecordBatch,
    compression: Compression,
) -> Result<BytesMut> {
    let changes = check_counts(header, batch.num_rows())?;
    let mut hint = ipc_size_hint(batch);
    if compression != Compression::None {
        // Columnar rows usually shrink to well under half; a short hint costs one
        // reallocation, a long one holds memory until the batch is written.
        hint /= 2;
    }
    let mut buf = BytesMut::with_capacity(FIXED_HEADER_LEN + changes + hint);
    put_header(&mut buf, header);
    let mut writer = StreamWriter::try_new_with_options(
        Skipping {
            buf,
            skipping: true,
        },
        &batch.schema(),
        compression.ipc_options(),
    )?;
    // The schema message (written by `try_new`) and the end-of-stream marker (by
    // `into_inner`) are skipped: the header's schema id names the schema.
    writer.get_mut().skipping = false;
    writer.write(batch)?;
    writer.get_mut().skipping = true;
    let mut buf = writer.into_inner()?.buf;
    if buf.capacity() > buf.len() + buf.len() / 4 + 4096 {
        // Compressed rows took less than the room made for them, and the batch is
        // held as it is (the WAL's queue and tail cache count its length): its own
        // allocation, of its size. Rows of one letter repeated shrink a thousandfold,
        // and their batches would otherwise hold the uncompressed room each.
        buf = BytesMut::from(&buf[..]);
    }
    set_crc(&mut buf);
    Ok(buf)
}

/// A sequence marker ([`ATTR_MARKER`]) for `header`'s writer and sequences: the header
/// with one record, no change types, and an IPC message length of 0.
pub fn encode_marker(header: &BatchHeader) -> BytesMut {
    let header = BatchHeader {
        record_count: 1,
        attributes: ATTR_MARKER,
        change_types: vec![],
        ..header.clone()
    };
    let mut buf = BytesMut::with_capacity(FIXED_HEADER_LEN + 4);
    put_header(&mut buf, &header);
    buf.put_u32_le(0);
    set_crc(&mut buf);
    buf
}

/// The IPC stream marker before a message's length: a batch whose IPC part begins with
/// it was encoded by [`encode`] (in the stream framing); one without it holds the
/// message length first (a client's IPC stored by [`encode_from_ipc`], and every batch
/// written before the marker was).
const CONTINUATION: u32 = 0xFFFF_FFFF;

/// A writer into the batch buffer that drops what it is given while `skipping`.
struct Skipping {
    buf: BytesMut,
    skipping: bool,
}

impl std::io::Write for Skipping {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if !self.skipping {
            self.buf.put_slice(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// About the bytes of `batch`'s IPC message and body: each buffer padded to 64 bytes,
/// and room for the message. Exact for arrays that own their buffers whole (a slice is
/// counted whole); a short hint only costs the buffer a reallocation.
fn ipc_size_hint(batch: &RecordBatch) -> usize {
    fn data(d: &arrow::array::ArrayData) -> (usize, usize) {
        let pad = |n: usize| n.next_multiple_of(64);
        let mut bytes = d.nulls().map_or(0, |n| pad(n.buffer().len()));
        let mut buffers = 1 + d.buffers().len();
        bytes += d.buffers().iter().map(|b| pad(b.len())).sum::<usize>();
        for child in d.child_data() {
            let (b, n) = data(child);
            bytes += b;
            buffers += n;
        }
        (bytes, buffers)
    }
    let (bytes, buffers) = batch
        .columns()
        .iter()
        .map(|c| data(&c.to_data()))
        .fold((0, 0), |(b, n), (b2, n2)| (b + b2, n + n2));
    bytes + 256 + 64 * buffers
}

/// The bytes of `batch`'s buffers (values, offsets, validity, children's), as a read
/// decodes them: what a batch costs in memory once decoded, whatever its stored size.
/// Buffers shared by slices are counted at their length, not their allocation.
pub fn decoded_bytes(batch: &RecordBatch) -> usize {
    fn data(d: &arrow::array::ArrayData) -> usize {
        d.nulls().map_or(0, |n| n.buffer().len())
            + d.buffers().iter().map(|b| b.len()).sum::<usize>()
            + d.child_data().iter().map(data).sum::<usize>()
    }
    batch.columns().iter().map(|c| data(&c.to_data())).sum()
}

/// [`encode`] that stores `ipc`, the batch's IPC encoding as the client sent it,
/// instead of encoding the rows again: one copy of the bytes, no Arrow work, when the
/// client's body is compressed as `compression` says (uncompressed for `none`; a client
/// may send zstd or lz4 bodies, pyarrow's `IpcWriteOptions(compression=...)`).
/// Otherwise the rows are encoded again, compressed. The caller has decoded `ipc` into
/// `batch` and checked it against the table schema the header names, with exactly
/// that schema's Arrow types (so [`decode`] with that schema gives the same batch). A
/// message that is not a record batch of `batch`'s row count is refused.
pub fn encode_from_ipc(
    header: &BatchHeader,
    batch: &RecordBatch,
    ipc: &IpcEncoded,
    compression: Compression,
) -> Result<BytesMut> {
    let message = arrow::ipc::root_as_message(&ipc.message)
        .map_err(|e| MinkError::invalid("batch", format!("bad IPC message: {e}")))?;
    let rows = message
        .header_as_record_batch()
        .ok_or_else(|| MinkError::invalid("batch", "the IPC message is not a record batch"))?;
    if rows.length() != batch.num_rows() as i64 {
        return Err(MinkError::invalid(
            "batch",
            "the IPC message does not describe this batch",
        ));
    }
    let sent = rows.compression().map(|c| c.codec());
    if sent != compression.ipc_codec() {
        return encode(header, batch, compression);
    }
    frame(header, batch.num_rows(), &ipc.message, &ipc.body)
}

/// The log batch around an IPC message and body; the CRC is set, the leader's fields
/// are left for [`stamp`].
fn frame(header: &BatchHeader, rows: usize, message: &[u8], body: &[u8]) -> Result<BytesMut> {
    let changes = check_counts(header, rows)?;
    let mut buf =
        BytesMut::with_capacity(FIXED_HEADER_LEN + changes + 4 + message.len() + body.len());
    put_header(&mut buf, header);
    buf.put_u32_le(message.len() as u32);
    buf.put_slice(message);
    buf.put_slice(body);
    set_crc(&mut buf);
    Ok(buf)
}

/// Checks the header's counts against `rows`; the number of change-type bytes.
fn check_counts(header: &BatchHeader, rows: usize) -> Result<usize> {
    if header.record_count as usize != rows {
        return Err(MinkError::Internal(format!(
            "header says {} rows, the batch has {rows}",
            header.record_count,
        )));
    }
    if header.attributes & ATTR_CHANGE_TYPES == 0 {
        return Ok(0);
    }
    if header.change_types.len() != rows {
        return Err(MinkError::invalid(
            "changes",
            format!("{} change types for {rows} rows", header.change_types.len()),
        ));
    }
    Ok(rows)
}

/// The header and change types, with a zero CRC for [`set_crc`].
fn put_header(buf: &mut BytesMut, header: &BatchHeader) {
    buf.put_u32_le(MAGIC);
    buf.put_i64_le(header.base_offset);
    buf.put_i64_le(header.commit_timestamp);
    buf.put_i64_le(header.leader_epoch);
    buf.put_u32_le(0); // CRC, set once the batch is complete
    buf.put_i32_le(header.record_count);
    buf.put_i32_le(header.schema_id);
    buf.put_i64_le(header.writer_id);
    buf.put_i64_le(header.first_sequence);
    buf.put_i64_le(header.last_sequence);
    buf.put_u16_le(header.attributes);
    if header.attributes & ATTR_CHANGE_TYPES != 0 {
        for c in &header.change_types {
            buf.put_u8(c.to_byte());
        }
    }
}

fn set_crc(buf: &mut BytesMut) {
    let crc = crc32c::crc32c(&buf[CRC_AT + 4..]);
    buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
}

/// The CRC32C of a whole encoded batch, from the CRC in its header (which covers
/// everything after it) and the few bytes before it: no second pass over the rows.
pub fn whole_crc(encoded: &[u8]) -> u32 {
    let stored = u32::from_le_bytes(
        encoded[CRC_AT..CRC_AT + 4]
            .try_into()
            .expect("a batch has a header"),
    );
    let head = crc32c::crc32c(&encoded[..CRC_AT + 4]);
    mink_wal::crc::combine(head, stored, (encoded.len() - (CRC_AT + 4)) as u64)
}

/// Sets the fields the leader assigns at append time (outside the CRC).
pub fn stamp(buf: &mut BytesMut, base_offset: i64, commit_timestamp: i64, leader_epoch: i64) {
    buf[4..12].copy_from_slice(&base_offset.to_le_bytes());
    buf[12..20].copy_from_slice(&commit_timestamp.to_le_bytes());
    buf[20..28].copy_from_slice(&leader_epoch.to_le_bytes());
}

/// Decodes and checks a header (magic, CRC over the whole batch, lengths) without
/// decoding the rows. Returns the header and where the IPC message starts.
pub fn decode_header(bytes: &[u8]) -> Result<(BatchHeader, usize)> {
    if bytes.len() < FIXED_HEADER_LEN + 4 {
        return Err(corrupt(format!("truncated: {} bytes", bytes.len())));
    }
    let mut cur = bytes;
    let magic = cur.get_u32_le();
    if magic != MAGIC {
        return Err(corrupt(format!("wrong magic {magic:#010x}")));
    }
    let base_offset = cur.get_i64_le();
    let commit_timestamp = cur.get_i64_le();
    let leader_epoch = cur.get_i64_le();
    let crc = cur.get_u32_le();
    if crc32c::crc32c(&bytes[CRC_AT + 4..]) != crc {
        return Err(corrupt("CRC mismatch"));
    }
    let mut header = BatchHeader {
        base_offset,
        record_count: cur.get_i32_le(),
        commit_timestamp,
        leader_epoch,
        schema_id: cur.get_i32_le(),
        writer_id: cur.get_i64_le(),
        first_sequence: cur.get_i64_le(),
        last_sequence: cur.get_i64_le(),
        attributes: cur.get_u16_le(),
        change_types: vec![],
    };
    if header.record_count < 1 {
        return Err(corrupt(format!("record count {}", header.record_count)));
    }
    if header.is_marker() && (header.record_count != 1 || header.attributes != ATTR_MARKER) {
        return Err(corrupt(format!(
            "a sequence marker with record count {} and attributes {:#06x}",
            header.record_count, header.attributes
        )));
    }
    if header.attributes & ATTR_CHANGE_TYPES != 0 {
        let n = header.record_count as usize;
        if cur.len() < n + 4 {
            return Err(corrupt("truncated change types"));
        }
        header.change_types = cur[..n]
            .iter()
            .map(|b| {
                ChangeType::from_byte(*b).map_err(|_| corrupt(format!("unknown change type {b}")))
            })
            .collect::<Result<_>>()?;
        cur.advance(n);
    }
    if cur.len() < 4 {
        return Err(corrupt("truncated IPC message length"));
    }
    let mut ipc_len = cur.get_u32_le();
    if ipc_len == CONTINUATION {
        if cur.len() < 4 {
            return Err(corrupt("truncated IPC message length"));
        }
        ipc_len = cur.get_u32_le();
    }
    if cur.len() < ipc_len as usize {
        return Err(corrupt("truncated IPC message"));
    }
    Ok((header, bytes.len() - cur.len()))
}

/// Decodes a whole batch. `schema_of` maps a schema id to its Arrow schema; an unknown
/// id is an error.
pub fn decode(
    bytes: &Bytes,
    schema_of: impl Fn(SchemaId) -> Option<SchemaRef>,
) -> Result<LogBatch> {
    decode_columns(bytes, schema_of, None)
}

/// [`decode`] of the columns named in `columns` alone (`None`: all), in the order of
/// the batch's schema; names its schema lacks (columns added since) are left out.
/// The other columns' buffers are skipped, never decompressed.
pub fn decode_columns(
    bytes: &Bytes,
    schema_of: impl Fn(SchemaId) -> Option<SchemaRef>,
    columns: Option<&[String]>,
) -> Result<LogBatch> {
    let (header, ipc_start) = decode_header(bytes)?;
    let schema = schema_of(header.schema_id).ok_or_else(|| {
        MinkError::SchemaMismatch(format!(
            "the batch at offset {} names schema id {}, which this table does not have",
            header.base_offset, header.schema_id
        ))
    })?;
    let ipc_len = u32::from_le_bytes(
        bytes[ipc_start - 4..ipc_start]
            .try_into()
            .map_err(|_| corrupt("truncated"))?,
    ) as usize;
    let projection: Option<Vec<usize>> = columns.map(|names| {
        (0..schema.fields().len())
            .filter(|i| names.iter().any(|n| n == schema.field(*i).name()))
            .collect()
    });
    if header.is_marker() {
        if ipc_len != 0 || bytes.len() != ipc_start {
            return Err(corrupt("a sequence marker with rows"));
        }
        let schema = match &projection {
            Some(p) => Arc::new(
                schema
                    .project(p)
                    .map_err(|e| corrupt(format!("projecting a marker: {e}")))?,
            ),
            None => schema,
        };
        return Ok(LogBatch {
            header,
            batch: RecordBatch::new_empty(schema),
            size: bytes.len(),
        });
    }
    let message = arrow::ipc::root_as_message(&bytes[ipc_start..ipc_start + ipc_len])
        .map_err(|e| corrupt(format!("bad IPC message: {e}")))?;
    let ipc_batch = message
        .header_as_record_batch()
        .ok_or_else(|| corrupt("the IPC message is not a record batch"))?;
    let body = Buffer::from(bytes.slice(ipc_start + ipc_len..));
    let batch = arrow::ipc::reader::read_record_batch(
        &body,
        ipc_batch,
        schema,
        &HashMap::new(),
        projection.as_deref(),
        &message.version(),
    )
    .map_err(|e| corrupt(format!("bad IPC body: {e}")))?;
    if batch.num_rows() != header.record_count as usize {
        return Err(corrupt(format!(
            "the header says {} rows, the IPC batch holds {}",
            header.record_count,
            batch.num_rows()
        )));
    }
    Ok(LogBatch {
        header,
        batch,
        size: bytes.len(),
    })
}

/// A schema registry as a function, for [`decode`].
pub fn schemas(map: &HashMap<SchemaId, SchemaRef>) -> impl Fn(SchemaId) -> Option<SchemaRef> + '_ {
    |id| map.get(&id).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::ipc::writer::{
        DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
    };
    use std::sync::Arc;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    fn sample(changes: bool) -> (BatchHeader, RecordBatch) {
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("c")])),
            ],
        )
        .unwrap();
        let header = BatchHeader {
            base_offset: 42,
            record_count: 3,
            commit_timestamp: 1_700_000_000_000,
            leader_epoch: 7,
            schema_id: 1,
            writer_id: 9,
            first_sequence: 5,
            last_sequence: 5,
            attributes: if changes { ATTR_CHANGE_TYPES } else { 0 },
            change_types: if changes {
                vec![
                    ChangeType::Insert,
                    ChangeType::UpdateBefore,
                    ChangeType::UpdateAfter,
                ]
            } else {
                vec![]
            },
        };
        (header, batch)
    }

    fn registry() -> HashMap<SchemaId, SchemaRef> {
        HashMap::from([(1, schema())])
    }

    #[test]
    fn batches_round_trip() {
        for changes in [false, true] {
            let (header, batch) = sample(changes);
            let bytes = encode(&header, &batch, Compression::None).unwrap().freeze();
            let decoded = decode(&bytes, schemas(&registry())).unwrap();
            assert_eq!(decoded.header, header);
            assert_eq!(decoded.batch, batch);
            assert_eq!(decoded.size, bytes.len());
            assert_eq!(decode_header(&bytes).unwrap().0, header);
        }
        // Stamping leaves the CRC valid.
        let (header, batch) = sample(false);
        let mut buf = encode(&header, &batch, Compression::None).unwrap();
        stamp(&mut buf, 1000, 5, 3);
        let got = decode(&buf.freeze(), schemas(&registry())).unwrap().header;
        assert_eq!(
            (got.base_offset, got.commit_timestamp, got.leader_epoch),
            (1000, 5, 3)
        );
    }

    /// The node writes the IPC part in Arrow's stream framing, into a buffer sized for it
    /// up front; batches from before (the message length first) still decode.
    #[test]
    fn batches_in_either_ipc_framing_decode() {
        for changes in [false, true] {
            let (header, batch) = sample(changes);
            let buf = encode(&header, &batch, Compression::None).unwrap();
            let ipc_at = FIXED_HEADER_LEN + if changes { 3 } else { 0 };
            assert_eq!(buf[ipc_at..ipc_at + 4], CONTINUATION.to_le_bytes());
            assert!(
                buf.len() <= FIXED_HEADER_LEN + 3 + ipc_size_hint(&batch),
                "the hint is short: {} bytes written",
                buf.len()
            );
            let decoded = decode(&buf.freeze(), schemas(&registry())).unwrap();
            assert_eq!(decoded.batch, batch);

            let (_, old) = IpcDataGenerator::default()
                .encode(
                    &batch,
                    &mut DictionaryTracker::new(false),
                    &IpcWriteOptions::default(),
                    &mut IpcWriteContext::default(),
                )
                .unwrap();
            let buf = frame(&header, 3, &old.ipc_message, &old.arrow_data).unwrap();
            let decoded = decode(&buf.freeze(), schemas(&registry())).unwrap();
            assert_eq!(decoded.header, header);
            assert_eq!(decoded.batch, batch);
        }
    }

    /// A client's IPC encoding, stored as it is, decodes to the same batch; the whole
    /// CRC from the header agrees with a full pass after stamping.
    #[test]
    fn a_clients_ipc_encoding_is_stored_as_it_is() {
        for changes in [false, true] {
            let (header, batch) = sample(changes);
            // Not the node's own options: 8-byte alignment, as pyarrow writes.
            let (_, encoded) = IpcDataGenerator::default()
                .encode(
                    &batch,
                    &mut DictionaryTracker::new(false),
                    &IpcWriteOptions::try_new(8, false, arrow::ipc::MetadataVersion::V5).unwrap(),
                    &mut IpcWriteContext::default(),
                )
                .unwrap();
            let ipc = IpcEncoded {
                message: Buffer::from_vec(encoded.ipc_message.clone()),
                body: Buffer::from_vec(encoded.arrow_data.clone()),
            };
            let mut buf = encode_from_ipc(&header, &batch, &ipc, Compression::None).unwrap();
            assert!(buf.ends_with(&encoded.arrow_data));
            stamp(&mut buf, 77, 5, 3);
            assert_eq!(whole_crc(&buf), crc32c::crc32c(&buf));
            let decoded = decode(&buf.freeze(), schemas(&registry())).unwrap();
            assert_eq!(decoded.batch, batch);
            assert_eq!(decoded.header.base_offset, 77);

            // A message of another row count is refused.
            let (other_header, other) = sample(changes);
            let shorter = other.slice(0, 2);
            let err = encode_from_ipc(
                &BatchHeader {
                    record_count: 2,
                    change_types: other_header.change_types[..if changes { 2 } else { 0 }].to_vec(),
                    ..other_header
                },
                &shorter,
                &ipc,
                Compression::None,
            )
            .unwrap_err();
            assert!(
                err.to_string().contains("does not describe this batch"),
                "{err}"
            );
        }
    }

    /// Every codec round-trips; a compressed body is what Arrow's IPC compression
    /// makes (every Arrow reader decodes it), and repetitive rows shrink.
    /// 4096 rows that compress well (a tiny batch may not: Arrow then keeps each
    /// buffer uncompressed, whatever the codec).
    fn compressible() -> (BatchHeader, RecordBatch) {
        let ids: Vec<i64> = (0..4096).collect();
        let names: Vec<String> = (0..4096).map(|i| format!("customer-{}", i % 50)).collect();
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap();
        let header = BatchHeader {
            record_count: 4096,
            ..sample(false).0
        };
        (header, batch)
    }

    #[test]
    fn batches_round_trip_under_every_compression() {
        let (header, batch) = compressible();
        let plain = encode(&header, &batch, Compression::None).unwrap().len();
        for compression in [Compression::Zstd, Compression::Lz4] {
            let buf = encode(&header, &batch, compression).unwrap();
            // Held at its own size, not the room made for the uncompressed rows.
            assert!(
                buf.capacity() <= buf.len() + buf.len() / 4 + 4096,
                "{compression}"
            );
            let bytes = buf.freeze();
            assert!(
                bytes.len() * 2 < plain,
                "{compression}: {} bytes against {plain} uncompressed",
                bytes.len()
            );
            let decoded = decode(&bytes, schemas(&registry())).unwrap();
            assert_eq!(decoded.header, header);
            assert_eq!(decoded.batch, batch);
        }
    }

    #[test]
    fn a_batch_decodes_the_columns_named_and_no_others() {
        let (header, batch) = compressible();
        for compression in [Compression::None, Compression::Zstd, Compression::Lz4] {
            let bytes = encode(&header, &batch, compression).unwrap().freeze();
            // In the batch's order whatever the order asked; a name the batch's schema
            // lacks (a column added since) is left out.
            let names = ["later".to_string(), "name".to_string()];
            let only = decode_columns(&bytes, schemas(&registry()), Some(&names)).unwrap();
            assert_eq!(only.batch.schema().fields().len(), 1);
            assert_eq!(only.batch.column(0), batch.column(1));
            assert_eq!(only.header, header);
            // None at all: the rows are still counted.
            let none = decode_columns(&bytes, schemas(&registry()), Some(&[])).unwrap();
            assert_eq!((none.batch.num_columns(), none.batch.num_rows()), (0, 4096));
            assert_eq!(decoded_bytes(&none.batch), 0, "{compression}");
        }
        let marker = encode_marker(&BatchHeader {
            record_count: 1,
            attributes: ATTR_MARKER,
            ..sample(false).0
        })
        .freeze();
        let names = ["id".to_string()];
        let decoded = decode_columns(&marker, schemas(&registry()), Some(&names)).unwrap();
        assert_eq!(decoded.batch.schema().fields().len(), 1);
    }

    /// A client's IPC is stored as it came when its body is compressed as the table
    /// says; otherwise its rows are encoded again under the table's compression.
    #[test]
    fn a_clients_ipc_is_kept_when_its_compression_is_the_tables() {
        let (header, batch) = compressible();
        let client = |options: IpcWriteOptions| {
            let (_, encoded) = IpcDataGenerator::default()
                .encode(
                    &batch,
                    &mut DictionaryTracker::new(false),
                    &options,
                    &mut IpcWriteContext::default(),
                )
                .unwrap();
            IpcEncoded {
                message: Buffer::from_vec(encoded.ipc_message),
                body: Buffer::from_vec(encoded.arrow_data),
            }
        };
        let zstd_ipc = client(Compression::Zstd.ipc_options());
        let plain_ipc = client(IpcWriteOptions::default());
        let stored_codec = |buf: &BytesMut| {
            let (_, at) = decode_header(buf).unwrap();
            let len = u32::from_le_bytes(buf[at - 4..at].try_into().unwrap()) as usize;
            let message = arrow::ipc::root_as_message(&buf[at..at + len]).unwrap();
            let rows = message.header_as_record_batch().unwrap();
            rows.compression().map(|c| c.codec())
        };
        for (ipc, table, kept) in [
            (&zstd_ipc, Compression::Zstd, true),
            (&plain_ipc, Compression::Zstd, false),
            (&zstd_ipc, Compression::None, false),
            (&plain_ipc, Compression::None, true),
            (&zstd_ipc, Compression::Lz4, false),
        ] {
            let buf = encode_from_ipc(&header, &batch, ipc, table).unwrap();
            assert_eq!(buf.ends_with(&ipc.body), kept, "{table}, kept {kept}");
            assert_eq!(stored_codec(&buf), table.ipc_codec(), "{table}");
            let decoded = decode(&buf.freeze(), schemas(&registry())).unwrap();
            assert_eq!(decoded.batch, batch);
        }
    }

    #[test]
    fn every_kind_of_corruption_is_detected() {
        let (header, batch) = sample(true);
        let bytes = encode(&header, &batch, Compression::None).unwrap().freeze();
        let err = |b: Vec<u8>| {
            decode(&Bytes::from(b), schemas(&registry()))
                .unwrap_err()
                .to_string()
        };

        let mut wrong_magic = bytes.to_vec();
        wrong_magic[0] = b'X';
        assert!(err(wrong_magic).contains("wrong magic"));

        let mut flipped = bytes.to_vec();
        let last = flipped.len() - 1;
        flipped[last] ^= 0x40;
        assert!(err(flipped).contains("CRC mismatch"));

        assert!(err(bytes[..bytes.len() - 10].to_vec()).contains("CRC mismatch"));
        assert!(err(bytes[..20].to_vec()).contains("truncated"));

        // A record count that disagrees with the IPC batch (CRC made valid again).
        let mut count = bytes.to_vec();
        count[CRC_AT + 4..CRC_AT + 8].copy_from_slice(&2i32.to_le_bytes());
        let changes_end = FIXED_HEADER_LEN + 3;
        // Drop one change type so the layout stays consistent with the new count.
        count.remove(changes_end - 1);
        let crc = crc32c::crc32c(&count[CRC_AT + 4..]);
        count[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(err(count).contains("the header says 2 rows, the IPC batch holds 3"));

        let unknown = decode(&bytes, |_| None).unwrap_err();
        assert!(matches!(unknown, MinkError::SchemaMismatch(_)));
        assert!(unknown.to_string().contains("schema id 1"));
    }

    /// A sequence marker keeps its writer and sequences, takes one record, holds no
    /// rows, and is stamped like any batch; one that claims rows or more records is
    /// corrupt.
    #[test]
    fn a_sequence_marker_round_trips_without_rows() {
        let (header, _) = sample(true);
        let mut buf = encode_marker(&header);
        stamp(&mut buf, 99, 5, 3);
        assert_eq!(whole_crc(&buf), crc32c::crc32c(&buf));
        let bytes = buf.freeze();
        let decoded = decode(&bytes, schemas(&registry())).unwrap();
        assert!(decoded.header.is_marker());
        assert_eq!(decoded.header.record_count, 1);
        assert_eq!(decoded.header.end_offset(), 100);
        assert!(decoded.header.change_types.is_empty());
        assert_eq!(
            (decoded.header.writer_id, decoded.header.first_sequence),
            (header.writer_id, header.first_sequence)
        );
        assert_eq!(decoded.batch.num_rows(), 0);
        assert_eq!(decoded.batch.schema(), schema());
        assert_eq!(decode_header(&bytes).unwrap().0, decoded.header);

        let recrc = |mut b: Vec<u8>| {
            let crc = crc32c::crc32c(&b[CRC_AT + 4..]);
            b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
            Bytes::from(b)
        };
        let mut two = bytes.to_vec();
        two[CRC_AT + 4..CRC_AT + 8].copy_from_slice(&2i32.to_le_bytes());
        let e = decode(&recrc(two), schemas(&registry())).unwrap_err();
        assert!(
            e.to_string()
                .contains("a sequence marker with record count 2"),
            "{e}"
        );
        let mut rows = bytes.to_vec();
        rows.extend_from_slice(&[0; 8]);
        let e = decode(&recrc(rows), schemas(&registry())).unwrap_err();
        assert!(e.to_string().contains("a sequence marker with rows"), "{e}");
    }
}
