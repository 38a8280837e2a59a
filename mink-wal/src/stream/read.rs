//! Reads by offset and by timestamp: memory first, then segments (through their
//! index footer), then WAL objects not yet compacted.

use std::sync::Arc;

use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::meta::SegmentMeta;
use super::{Held, StoreInner, StreamInner};
use crate::error::{WalError, WalResult};
use crate::format::{
    IndexEntry, Record, SEGMENT_FOOTER_LEN, decode_segment_footer, decode_segment_index,
    decode_segment_records,
};

/// Cached segment indexes beyond this many are dropped (all at once; they reload).
const SEGMENT_INDEXES_CACHED_MAX: usize = 4_096;

/// Passes of a read that met an object deleted under it (by WAL GC after a compaction,
/// or by a trim) before it gives up; each pass starts from a fresh view.
const READ_PASSES_MAX: u32 = 3;

/// Why one pass of a read failed.
enum ReadFail {
    /// An object the view named is gone: look again.
    Gone(String),
    Wal(WalError),
}

impl From<WalError> for ReadFail {
    fn from(e: WalError) -> Self {
        ReadFail::Wal(e)
    }
}

impl From<object_store::Error> for ReadFail {
    fn from(e: object_store::Error) -> Self {
        match e {
            object_store::Error::NotFound { path, .. } => ReadFail::Gone(path),
            other => ReadFail::Wal(other.into()),
        }
    }
}

impl From<ReadFail> for WalError {
    fn from(f: ReadFail) -> Self {
        match f {
            ReadFail::Gone(path) => WalError::Storage(format!("{path} is gone")),
            ReadFail::Wal(e) => e,
        }
    }
}

/// A segment's index, from cache or from its footer (two range reads).
async fn segment_index(
    store: &StoreInner,
    seg: &SegmentMeta,
) -> Result<Arc<Vec<IndexEntry>>, ReadFail> {
    if let Some(index) = store
        .segment_indexes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&seg.key)
    {
        return Ok(index.clone());
    }
    let path = Path::from(seg.key.as_str());
    let footer = store
        .segment_store
        .get_range(
            &path,
            seg.bytes.saturating_sub(SEGMENT_FOOTER_LEN as u64)..seg.bytes,
        )
        .await?;
    let (index_pos, entries, crc) = decode_segment_footer(&seg.key, &footer)?;
    let index_end = seg.bytes - SEGMENT_FOOTER_LEN as u64;
    if index_pos > index_end {
        return Err(ReadFail::Wal(WalError::Corrupt(format!(
            "{}: index position beyond its end",
            seg.key
        ))));
    }
    let bytes = store
        .segment_store
        .get_range(&path, index_pos..index_end)
        .await?;
    let index = Arc::new(decode_segment_index(&seg.key, &bytes, entries, crc)?);
    store.cache_segment_index(&seg.key, &index);
    Ok(index)
}

impl StoreInner {
    /// Keeps a segment's decoded index for later reads.
    pub(super) fn cache_segment_index(&self, key: &str, index: &Arc<Vec<IndexEntry>>) {
        let mut cache = self
            .segment_indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if cache.len() >= SEGMENT_INDEXES_CACHED_MAX {
            cache.clear();
        }
        cache.insert(key.to_owned(), index.clone());
    }
}

/// The index entries of a read from the record holding `offset`: about `max_bytes` of
/// payload, at least one record (none past the index's end).
pub(super) fn entries_from(index: &[IndexEntry], offset: u64, max_bytes: usize) -> &[IndexEntry] {
    let first = index.partition_point(|e| e.end() <= offset);
    let mut last = first;
    let mut bytes = 0usize;
    while last < index.len() && (last == first || bytes < max_bytes) {
        bytes += index[last].payload_len as usize;
        last += 1;
    }
    &index[first..last]
}

/// Records of `seg` from the one holding `offset`, about `max_bytes` (at least one),
/// in one range read.
async fn read_segment(
    store: &StoreInner,
    seg: &SegmentMeta,
    offset: u64,
    max_bytes: usize,
) -> Result<Vec<Record>, ReadFail> {
    let index = segment_index(store, seg).await?;
    let entries = entries_from(&index, offset, max_bytes);
    let (Some(a), Some(b)) = (entries.first(), entries.last()) else {
        return Ok(vec![]);
    };
    let data = store
        .segment_store
        .get_range(
            &Path::from(seg.key.as_str()),
            a.range().start..b.range().end,
        )
        .await?;
    Ok(decode_segment_records(&seg.key, &data, entries)?)
}

/// Reads whole units from the one holding `offset`, about `max_bytes`. A read that
/// meets an object deleted under it (its records were compacted and the WAL object
/// collected, or a trim removed the segment) looks again from a fresh view: the data
/// is then in a segment, or below the start offset (`OffsetOutOfRange`).
pub(super) async fn read(
    stream: &Arc<StreamInner>,
    offset: u64,
    max_bytes: usize,
) -> WalResult<Vec<Record>> {
    let mut pass = 0;
    loop {
        pass += 1;
        match read_pass(stream, offset, max_bytes).await {
            Ok(records) => return Ok(records),
            Err(ReadFail::Gone(path)) if pass < READ_PASSES_MAX => {
                tracing::debug!(stream = stream.name, offset, %path, "read raced a deletion; reading again");
            }
            Err(fail) => return Err(fail.into()),
        }
    }
}

/// What the next step of a read takes, located under the stream's lock (one record
/// or one segment: nothing else of the stream's state is copied).
enum Step {
    Held(Held),
    Segment(SegmentMeta),
}

async fn read_pass(
    stream: &Arc<StreamInner>,
    offset: u64,
    max_bytes: usize,
) -> Result<Vec<Record>, ReadFail> {
    let store = &stream.store;
    let mut out: Vec<Record> = Vec::new();
    let mut pos = offset;
    let mut bytes = 0usize;
    loop {
        let step = {
            let state = stream.lock();
            if pos < state.start_offset {
                if out.is_empty() {
                    return Err(ReadFail::Wal(WalError::OffsetOutOfRange {
                        stream: stream.name.clone(),
                        offset: pos,
                        start: state.start_offset,
                    }));
                }
                break;
            }
            if pos >= state.acked_end || (!out.is_empty() && bytes >= max_bytes) {
                break;
            }
            // Memory: held records cover a suffix of the stream.
            let i = state.held.partition_point(|h| h.record.end() <= pos);
            match state
                .held
                .get(i)
                .filter(|h| h.record.base <= pos && (h.payload.is_some() || h.wal.is_some()))
            {
                Some(h) => Step::Held(h.clone()),
                None => {
                    let j = state.segments.partition_point(|s| s.end <= pos);
                    match state.segments.get(j).filter(|s| s.base <= pos) {
                        Some(seg) => Step::Segment(seg.clone()),
                        None => {
                            return Err(ReadFail::Wal(WalError::Corrupt(format!(
                                "stream {}: offset {pos} is in no segment and not in memory",
                                stream.name
                            ))));
                        }
                    }
                }
            }
        };
        match step {
            Step::Held(h) => {
                let payload = match (&h.payload, &h.wal) {
                    (Some(p), _) => p.clone(),
                    (None, Some((seq, range))) => {
                        super::fetch_evicted(store, &h.record, *seq, range.clone()).await?
                    }
                    (None, None) => {
                        return Err(ReadFail::Gone(format!("{} in memory", h.record.base)));
                    }
                };
                bytes += payload.len();
                pos = h.record.end();
                out.push(Record {
                    payload,
                    ..h.record
                });
            }
            Step::Segment(seg) => {
                let records =
                    read_segment(store, &seg, pos, max_bytes.saturating_sub(bytes)).await?;
                if records.is_empty() {
                    return Err(ReadFail::Wal(WalError::Corrupt(format!(
                        "segment {} has no record at {pos}",
                        seg.key
                    ))));
                }
                for r in records {
                    bytes += r.payload.len();
                    pos = r.end();
                    out.push(r);
                }
            }
        }
    }
    Ok(out)
}

/// The first offset at or after `timestamp_ms` (by record timestamps), if any. Looks
/// at one segment at a time (located under the stream's lock), then memory; a segment
/// deleted under it (a merge or trim) makes it look again from a fresh view.
pub(super) async fn offset_for_timestamp(
    stream: &Arc<StreamInner>,
    timestamp_ms: i64,
) -> WalResult<Option<u64>> {
    let mut pass = 0;
    loop {
        pass += 1;
        match offset_for_timestamp_pass(stream, timestamp_ms).await {
            Ok(found) => return Ok(found),
            Err(ReadFail::Gone(path)) if pass < READ_PASSES_MAX => {
                tracing::debug!(stream = stream.name, %path, "lookup raced a deletion; looking again");
            }
            Err(fail) => return Err(fail.into()),
        }
    }
}

async fn offset_for_timestamp_pass(
    stream: &Arc<StreamInner>,
    timestamp_ms: i64,
) -> Result<Option<u64>, ReadFail> {
    // Segments from `pos` on, one at a time.
    let mut pos = 0u64;
    loop {
        let (start, seg) = {
            let state = stream.lock();
            let start = state.start_offset;
            let from = pos.max(start);
            let i = state.segments.partition_point(|s| s.end <= from);
            match state.segments[i..]
                .iter()
                .find(|s| s.max_timestamp_ms >= timestamp_ms)
            {
                Some(seg) => (start, seg.clone()),
                None => {
                    // No segment from `from` on has one: the records not in a segment
                    // yet, judged under the same lock as the segments. (Looked up
                    // after releasing it, a compaction in between could have moved
                    // records from memory into a segment this pass never saw.)
                    let compacted_end = state.segments.last().map_or(start, |s| s.end);
                    return Ok(state
                        .held
                        .iter()
                        .find(|h| {
                            h.record.end() > compacted_end.max(from)
                                && h.record.timestamp_ms >= timestamp_ms
                        })
                        .map(|h| h.record.base.max(start)));
                }
            }
        };
        let index = segment_index(&stream.store, &seg).await?;
        if let Some(e) = index
            .iter()
            .find(|e| e.timestamp_ms >= timestamp_ms && e.end() > start)
        {
            return Ok(Some(e.base.max(start)));
        }
        pos = seg.end;
    }
}
