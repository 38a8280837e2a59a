//! Byte formats of the objects s3stream writes: WAL objects, fence objects and
//! segments. All integers are little-endian; every object ends with a CRC32C.
//!
//! WAL object (`wal/{node}/{generation:020}/{seq:020}`):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `MKWAL001` |
//! | repeated | record: stream name length u16, name, epoch u64, base offset u64, record count u32, timestamp i64 (ms), payload length u32, payload CRC32C u32, payload |
//! | 4 | record count u32 |
//! | 4 | CRC32C of everything before |
//!
//! Fence object (same key space as WAL objects): magic `MKFENCE1`, then JSON naming
//! who fenced, then CRC32C.
//!
//! Segment (`seg/{stream}/{base:020}-{epoch}-{unique}`): records
//! (base u64, count u32, timestamp i64, payload length u32, payload CRC32C u32,
//! payload), then the index (one entry per record: base u64, count u32, timestamp
//! i64, position u64, payload length u32), then the footer: index position u64, entry
//! count u32, index CRC32C u32, magic `MKSEG001`.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{WalError, WalResult};

pub const WAL_MAGIC: &[u8; 8] = b"MKWAL001";
pub const FENCE_MAGIC: &[u8; 8] = b"MKFENCE1";
pub const SEGMENT_MAGIC: &[u8; 8] = b"MKSEG001";
/// Footer of a segment: index position, entry count, index CRC, magic.
pub const SEGMENT_FOOTER_LEN: usize = 8 + 4 + 4 + 8;
/// Bytes of one record header in a segment, before the payload.
pub const SEGMENT_RECORD_HEADER_LEN: usize = 8 + 4 + 8 + 4 + 4;
const INDEX_ENTRY_LEN: usize = 8 + 4 + 8 + 8 + 4;

/// One appended unit as stored: `count` records from `base`, one payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub base: u64,
    pub count: u32,
    pub timestamp_ms: i64,
    pub payload: Bytes,
    /// The CRC32C of `payload`: computed once, where the payload was made (the append)
    /// or read and checked (a WAL object, a segment), and carried with it, so that
    /// writing it again (compaction, a takeover's recovery) costs no second pass.
    pub crc: u32,
}

impl Record {
    /// The offset after the last record of this unit.
    pub fn end(&self) -> u64 {
        self.base + self.count as u64
    }
}

/// A record of one stream inside a WAL object.
#[derive(Debug, Clone)]
pub struct WalRecord {
    pub stream: String,
    pub epoch: u64,
    pub record: Record,
    /// Where the payload sits in the object (for range reads).
    pub payload_range: std::ops::Range<u64>,
}

/// Builds one WAL object without copying payloads: the object is a list of chunks
/// (record headers and the payloads themselves), and its CRC is combined from each
/// payload's CRC, computed once by the appender.
pub struct WalObjectBuilder {
    chunks: Vec<Bytes>,
    crc: u32,
    len: usize,
    records: u32,
}

impl Default for WalObjectBuilder {
    fn default() -> Self {
        Self {
            chunks: vec![Bytes::from_static(WAL_MAGIC)],
            crc: crc32c::crc32c(WAL_MAGIC),
            len: WAL_MAGIC.len(),
            records: 0,
        }
    }
}

impl WalObjectBuilder {
    /// Appends a record (with the CRC32C of its payload); returns where its payload
    /// sits in the object.
    pub fn push(&mut self, stream: &str, epoch: u64, record: &Record) -> std::ops::Range<u64> {
        let mut header = BytesMut::with_capacity(2 + stream.len() + 36);
        header.put_u16_le(stream.len() as u16);
        header.put_slice(stream.as_bytes());
        header.put_u64_le(epoch);
        header.put_u64_le(record.base);
        header.put_u32_le(record.count);
        header.put_i64_le(record.timestamp_ms);
        header.put_u32_le(record.payload.len() as u32);
        header.put_u32_le(record.crc);
        self.crc = crc32c::crc32c_append(self.crc, &header);
        self.len += header.len();
        self.chunks.push(header.freeze());
        let start = self.len as u64;
        self.crc = crate::crc::combine(self.crc, record.crc, record.payload.len() as u64);
        self.len += record.payload.len();
        self.chunks.push(record.payload.clone());
        self.records += 1;
        start..self.len as u64
    }

    /// Bytes so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The finished object.
    pub fn finish(mut self) -> object_store::PutPayload {
        let count = self.records.to_le_bytes();
        self.crc = crc32c::crc32c_append(self.crc, &count);
        self.chunks.push(Bytes::copy_from_slice(&count));
        self.chunks
            .push(Bytes::copy_from_slice(&self.crc.to_le_bytes()));
        self.chunks.into_iter().collect()
    }
}

/// What a WAL-space object turned out to be.
#[derive(Debug)]
pub enum WalObject {
    Data(Vec<WalRecord>),
    Fence(String),
}

fn corrupt(what: &str, why: impl std::fmt::Display) -> WalError {
    WalError::Corrupt(format!("{what}: {why}"))
}

fn need(buf: &[u8], n: usize, what: &str) -> WalResult<()> {
    if buf.len() < n {
        Err(corrupt(what, "truncated"))
    } else {
        Ok(())
    }
}

/// Decodes a WAL object or a fence, checking magic, CRCs and lengths.
pub fn decode_wal_object(what: &str, bytes: &Bytes) -> WalResult<WalObject> {
    need(bytes, 12, what)?;
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if crc32c::crc32c(body) != crc {
        return Err(corrupt(what, "CRC mismatch"));
    }
    if &body[..8] == FENCE_MAGIC {
        return Ok(WalObject::Fence(
            String::from_utf8_lossy(&body[8..]).into_owned(),
        ));
    }
    if &body[..8] != WAL_MAGIC {
        return Err(corrupt(what, "wrong magic"));
    }
    need(body, 12, what)?;
    let declared = u32::from_le_bytes(
        body[body.len() - 4..]
            .try_into()
            .map_err(|_| corrupt(what, "truncated"))?,
    );
    let mut cur = &body[8..body.len() - 4];
    let mut records = Vec::new();
    while !cur.is_empty() {
        need(cur, 2, what)?;
        let name_len = cur.get_u16_le() as usize;
        need(cur, name_len + 8 + 8 + 4 + 8 + 4 + 4, what)?;
        let stream = std::str::from_utf8(&cur[..name_len])
            .map_err(|_| corrupt(what, "stream name is not UTF-8"))?
            .to_string();
        cur.advance(name_len);
        let epoch = cur.get_u64_le();
        let base = cur.get_u64_le();
        let count = cur.get_u32_le();
        let timestamp_ms = cur.get_i64_le();
        let len = cur.get_u32_le() as usize;
        let payload_crc = cur.get_u32_le();
        need(cur, len, what)?;
        let start = bytes.len() - 4 - cur.len() - 4;
        let payload = bytes.slice(start..start + len);
        if crc32c::crc32c(&payload) != payload_crc {
            return Err(corrupt(
                what,
                format!("payload CRC mismatch at offset {base}"),
            ));
        }
        cur.advance(len);
        records.push(WalRecord {
            stream,
            epoch,
            record: Record {
                base,
                count,
                timestamp_ms,
                payload,
                crc: payload_crc,
            },
            payload_range: start as u64..(start + len) as u64,
        });
    }
    if records.len() != declared as usize {
        return Err(corrupt(
            what,
            format!("{} records, {declared} declared", records.len()),
        ));
    }
    Ok(WalObject::Data(records))
}

/// A fence object's bytes; `who` says who fenced and why (JSON by convention).
pub fn encode_fence(who: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(16 + who.len());
    buf.put_slice(FENCE_MAGIC);
    buf.put_slice(who.as_bytes());
    let crc = crc32c::crc32c(&buf);
    buf.put_u32_le(crc);
    buf.freeze()
}

/// One entry of a segment's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub base: u64,
    pub count: u32,
    pub timestamp_ms: i64,
    /// Position of the record header in the segment.
    pub position: u64,
    pub payload_len: u32,
}

impl IndexEntry {
    pub fn end(&self) -> u64 {
        self.base + self.count as u64
    }

    /// The byte range of the whole record (header and payload) in the segment.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.position..self.position + SEGMENT_RECORD_HEADER_LEN as u64 + self.payload_len as u64
    }
}

/// Payloads at least this large go into a segment by reference (one more chunk of the
/// object); smaller ones are copied next to their headers, so that a segment of small
/// records is a few large chunks, not two writes per record.
const SEGMENT_COPY_BELOW: usize = 64 << 10;

/// The most copied bytes one chunk of a segment holds. A segment of small records
/// (a primary-key table's changelog batches are often just under `SEGMENT_COPY_BELOW`)
/// used to be one buffer of up to the whole segment, written with one `write(2)`: a
/// fresh allocation of tens of MB per segment, and on `file://` one huge write into
/// fresh page cache, which cost this machine's kernel 5–10 times the CPU per byte of the
/// same bytes in 64 KiB writes (docs/benchmarks.md, 2026-12-06, session 32). Chunks of
/// this size come from the allocator's reused memory and are written one at a time.
const SEGMENT_CHUNK_MAX: usize = 256 << 10;

/// A segment's chunks as they are built: copied bytes fill buffers of exactly
/// `SEGMENT_CHUNK_MAX` (a record's bytes may run on into the next buffer, so none is
/// left part empty), shared payloads go in between as their own chunks.
#[derive(Default)]
struct Copied {
    chunks: Vec<Bytes>,
    buf: BytesMut,
}

impl Copied {
    fn copy(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.buf.len() == self.buf.capacity() {
                self.cut();
                self.buf = BytesMut::with_capacity(SEGMENT_CHUNK_MAX);
            }
            let n = (self.buf.capacity() - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
    }

    /// A payload shared by reference: the bytes copied before it become a chunk (the
    /// rest of their buffer takes the bytes copied after it).
    fn share(&mut self, payload: Bytes) {
        self.cut();
        self.chunks.push(payload);
    }

    fn cut(&mut self) {
        if !self.buf.is_empty() {
            self.chunks.push(self.buf.split().freeze());
        }
    }

    fn finish(mut self) -> Vec<Bytes> {
        self.cut();
        self.chunks
    }
}

/// Encodes records (contiguous offsets) into a segment: the object (as chunks that
/// share the large payloads instead of copying them: compaction of 64 MiB used to
/// allocate and fill 64 MiB) and its index. Each record's header takes the CRC the
/// record carries: no pass over the payloads.
pub fn encode_segment(records: &[Record]) -> (object_store::PutPayload, Vec<IndexEntry>) {
    let mut copied = Copied::default();
    let mut index = Vec::with_capacity(records.len());
    let mut position = 0u64;
    for r in records {
        index.push(IndexEntry {
            base: r.base,
            count: r.count,
            timestamp_ms: r.timestamp_ms,
            position,
            payload_len: r.payload.len() as u32,
        });
        let mut header = [0u8; SEGMENT_RECORD_HEADER_LEN];
        let mut h = &mut header[..];
        h.put_u64_le(r.base);
        h.put_u32_le(r.count);
        h.put_i64_le(r.timestamp_ms);
        h.put_u32_le(r.payload.len() as u32);
        h.put_u32_le(r.crc);
        copied.copy(&header);
        if r.payload.len() < SEGMENT_COPY_BELOW {
            copied.copy(&r.payload);
        } else {
            copied.share(r.payload.clone());
        }
        position += (SEGMENT_RECORD_HEADER_LEN + r.payload.len()) as u64;
    }
    let mut chunks = copied.finish();
    let mut tail = BytesMut::with_capacity(index.len() * INDEX_ENTRY_LEN + SEGMENT_FOOTER_LEN);
    for e in &index {
        tail.put_u64_le(e.base);
        tail.put_u32_le(e.count);
        tail.put_i64_le(e.timestamp_ms);
        tail.put_u64_le(e.position);
        tail.put_u32_le(e.payload_len);
    }
    let index_crc = crc32c::crc32c(&tail);
    tail.put_u64_le(position);
    tail.put_u32_le(index.len() as u32);
    tail.put_u32_le(index_crc);
    tail.put_slice(SEGMENT_MAGIC);
    chunks.push(tail.freeze());
    (chunks.into_iter().collect(), index)
}

pub fn decode_segment_footer(what: &str, footer: &[u8]) -> WalResult<(u64, u32, u32)> {
    need(footer, SEGMENT_FOOTER_LEN, what)?;
    let mut cur = &footer[footer.len() - SEGMENT_FOOTER_LEN..];
    let index_pos = cur.get_u64_le();
    let entries = cur.get_u32_le();
    let crc = cur.get_u32_le();
    if cur != SEGMENT_MAGIC {
        return Err(corrupt(what, "wrong segment magic"));
    }
    Ok((index_pos, entries, crc))
}

/// Decodes a segment's index bytes.
pub fn decode_segment_index(
    what: &str,
    bytes: &[u8],
    entries: u32,
    crc: u32,
) -> WalResult<Vec<IndexEntry>> {
    if bytes.len() != entries as usize * INDEX_ENTRY_LEN {
        return Err(corrupt(what, "index length does not match its entry count"));
    }
    if crc32c::crc32c(bytes) != crc {
        return Err(corrupt(what, "index CRC mismatch"));
    }
    let mut cur = bytes;
    let mut index = Vec::with_capacity(entries as usize);
    for _ in 0..entries {
        index.push(IndexEntry {
            base: cur.get_u64_le(),
            count: cur.get_u32_le(),
            timestamp_ms: cur.get_i64_le(),
            position: cur.get_u64_le(),
            payload_len: cur.get_u32_le(),
        });
    }
    Ok(index)
}

/// Decodes consecutive segment records from `bytes` (read at `entries[0].position`).
pub fn decode_segment_records(
    what: &str,
    bytes: &Bytes,
    entries: &[IndexEntry],
) -> WalResult<Vec<Record>> {
    let Some(first) = entries.first() else {
        return Ok(vec![]);
    };
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let start = (e.position - first.position) as usize;
        let end = start + SEGMENT_RECORD_HEADER_LEN + e.payload_len as usize;
        need(&bytes[start.min(bytes.len())..], end - start, what)?;
        let mut cur = &bytes[start..end];
        let base = cur.get_u64_le();
        let count = cur.get_u32_le();
        let timestamp_ms = cur.get_i64_le();
        let len = cur.get_u32_le();
        let crc = cur.get_u32_le();
        if base != e.base || count != e.count || len != e.payload_len {
            return Err(corrupt(
                what,
                format!("record at offset {} does not match the index", e.base),
            ));
        }
        let payload = bytes.slice(start + SEGMENT_RECORD_HEADER_LEN..end);
        if crc32c::crc32c(&payload) != crc {
            return Err(corrupt(
                what,
                format!("payload CRC mismatch at offset {base}"),
            ));
        }
        out.push(Record {
            base,
            count,
            timestamp_ms,
            payload,
            crc,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(base: u64, count: u32, body: &'static [u8]) -> Record {
        Record {
            base,
            count,
            timestamp_ms: base as i64 * 10,
            payload: Bytes::from_static(body),
            crc: crc32c::crc32c(body),
        }
    }

    #[test]
    fn wal_objects_round_trip_and_detect_corruption() {
        let mut b = WalObjectBuilder::default();
        let r1 = b.push("s1", 3, &rec(0, 2, b"hello"));
        b.push("s2", 1, &rec(7, 1, b"w"));
        let bytes: Bytes = b
            .finish()
            .iter()
            .flat_map(|c| c.to_vec())
            .collect::<Vec<u8>>()
            .into();
        let WalObject::Data(records) = decode_wal_object("t", &bytes).unwrap() else {
            panic!("not data");
        };
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].stream, "s1");
        assert_eq!(records[0].epoch, 3);
        assert_eq!(records[0].record, rec(0, 2, b"hello"));
        assert_eq!(&bytes[r1.start as usize..r1.end as usize], b"hello");
        assert_eq!(records[1].record.base, 7);

        let mut flipped = bytes.to_vec();
        flipped[20] ^= 1;
        assert!(
            decode_wal_object("t", &Bytes::from(flipped))
                .unwrap_err()
                .to_string()
                .contains("CRC")
        );
        let truncated = bytes.slice(..bytes.len() - 3);
        assert!(decode_wal_object("t", &truncated).is_err());
        assert!(
            matches!(decode_wal_object("t", &encode_fence("x")).unwrap(), WalObject::Fence(w) if w == "x")
        );
    }

    /// A segment's index, read back through its footer; and where the index starts.
    fn read_index(bytes: &Bytes) -> (u64, Vec<IndexEntry>) {
        let (pos, n, crc) = decode_segment_footer("s", bytes).unwrap();
        let index = decode_segment_index(
            "s",
            &bytes[pos as usize..bytes.len() - SEGMENT_FOOTER_LEN],
            n,
            crc,
        )
        .unwrap();
        (pos, index)
    }

    #[test]
    fn segments_round_trip_through_their_index() {
        // Large payloads (from 64 KiB) are shared, not copied; small ones around them
        // are copied next to their headers.
        static LARGE: [u8; 70 << 10] = [7; 70 << 10];
        let records = vec![
            rec(10, 3, b"abc"),
            rec(13, 1, b""),
            rec(14, 5, &LARGE),
            rec(19, 5, b"0123456789"),
            rec(24, 1, &LARGE),
        ];
        let (payload, index) = encode_segment(&records);
        // The first three headers with the small payloads, the first large payload,
        // the next two headers with the small payload between them, the last large
        // payload, the index with the footer.
        assert_eq!(payload.iter().count(), 5);
        let bytes = Bytes::from(payload);
        let (_, decoded) = read_index(&bytes);
        assert_eq!(decoded, index);
        // A range read of all records but the first.
        let range = decoded[1].range().start..decoded[4].range().end;
        let slice = bytes.slice(range.start as usize..range.end as usize);
        let got = decode_segment_records("s", &slice, &decoded[1..]).unwrap();
        assert_eq!(got, records[1..].to_vec());
        let mut bad = bytes.to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(decode_segment_footer("s", &bad).is_err());
    }

    #[test]
    fn a_segment_of_small_records_is_written_in_bounded_chunks() {
        // 300 records of 60 KiB (under the copy threshold) make a segment of ~18 MB:
        // it goes out in chunks of `SEGMENT_CHUNK_MAX`, not in one write, and records
        // run on from one chunk into the next, so no buffer is left part empty.
        let records: Vec<Record> = (0..300u32)
            .map(|i| {
                let body = vec![(i % 251) as u8; (60 << 10) + i as usize];
                Record {
                    base: i as u64 * 2,
                    count: 2,
                    timestamp_ms: i as i64,
                    crc: crc32c::crc32c(&body),
                    payload: Bytes::from(body),
                }
            })
            .collect();
        let (payload, index) = encode_segment(&records);
        let sizes: Vec<usize> = payload.iter().map(|c| c.len()).collect();
        assert!(sizes.len() > 60, "{} chunks", sizes.len());
        // Every copied chunk but the last is full; then the index.
        let copied = &sizes[..sizes.len() - 1];
        assert!(
            copied[..copied.len() - 1]
                .iter()
                .all(|&n| n == SEGMENT_CHUNK_MAX),
            "{copied:?}"
        );
        assert!(copied[copied.len() - 1] <= SEGMENT_CHUNK_MAX);
        let bytes = Bytes::from(payload);
        let (pos, decoded) = read_index(&bytes);
        assert_eq!(decoded, index);
        let got = decode_segment_records("s", &bytes.slice(..pos as usize), &decoded).unwrap();
        assert_eq!(got, records);
    }
}
