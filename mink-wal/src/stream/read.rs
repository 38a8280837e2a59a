//! Reads by offset and by timestamp: memory first, then segments (through their
//! index footer), then WAL objects not yet compacted.

use std::sync::Arc;

use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::meta::SegmentMeta;
use super::writer::wal_path;
use super::{Held, StoreInner, StreamInner};
use crate::error::{WalError, WalResult};
use crate::format::{
    IndexEntry, Record, SEGMENT_FOOTER_LEN, decode_segment_footer, decode_segment_index,
    decode_segment_records,
};

/// Cached segment indexes beyond this many are dropped (all at once; they reload).
const SEGMENT_INDEXES_CACHED_MAX: usize = 4_096;

/// A segment's index, from cache or from its footer (two range reads).
async fn segment_index(store: &StoreInner, seg: &SegmentMeta) -> WalResult<Arc<Vec<IndexEntry>>> {
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
        .store
        .get_range(
            &path,
            seg.bytes.saturating_sub(SEGMENT_FOOTER_LEN as u64)..seg.bytes,
        )
        .await?;
    let (index_pos, entries, crc) = decode_segment_footer(&seg.key, &footer)?;
    let index_end = seg.bytes - SEGMENT_FOOTER_LEN as u64;
    if index_pos > index_end {
        return Err(WalError::Corrupt(format!(
            "{}: index position beyond its end",
            seg.key
        )));
    }
    let bytes = store.store.get_range(&path, index_pos..index_end).await?;
    let index = Arc::new(decode_segment_index(&seg.key, &bytes, entries, crc)?);
    let mut cache = store
        .segment_indexes
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if cache.len() >= SEGMENT_INDEXES_CACHED_MAX {
        cache.clear();
    }
    cache.insert(seg.key.clone(), index.clone());
    Ok(index)
}

/// Records of `seg` from the one holding `offset`, about `max_bytes` (at least one),
/// in one range read.
async fn read_segment(
    store: &StoreInner,
    seg: &SegmentMeta,
    offset: u64,
    max_bytes: usize,
) -> WalResult<Vec<Record>> {
    let index = segment_index(store, seg).await?;
    let first = index.partition_point(|e| e.end() <= offset);
    let mut last = first;
    let mut bytes = 0usize;
    while last < index.len() && (last == first || bytes < max_bytes) {
        bytes += index[last].payload_len as usize;
        last += 1;
    }
    let entries = &index[first..last];
    let (Some(a), Some(b)) = (entries.first(), entries.last()) else {
        return Ok(vec![]);
    };
    let data = store
        .store
        .get_range(
            &Path::from(seg.key.as_str()),
            a.range().start..b.range().end,
        )
        .await?;
    decode_segment_records(&seg.key, &data, entries)
}

pub(super) async fn read(
    stream: &Arc<StreamInner>,
    offset: u64,
    max_bytes: usize,
) -> WalResult<Vec<Record>> {
    let store = &stream.store;
    let (start, end, segments, held): (u64, u64, Vec<SegmentMeta>, Vec<Held>) = {
        let state = stream.lock();
        (
            state.start_offset,
            state.acked_end,
            state.segments.clone(),
            state.held.iter().cloned().collect(),
        )
    };
    if offset < start {
        return Err(WalError::OffsetOutOfRange {
            stream: stream.name.clone(),
            offset,
            start,
        });
    }
    let mut out: Vec<Record> = Vec::new();
    let mut pos = offset;
    let mut bytes = 0usize;
    while pos < end && (out.is_empty() || bytes < max_bytes) {
        // Memory: held records cover a suffix of the stream.
        let i = held.partition_point(|h| h.record.end() <= pos);
        if let Some(h) = held.get(i).filter(|h| h.record.base <= pos) {
            let payload = match (&h.payload, &h.wal) {
                (Some(p), _) => p.clone(),
                (None, Some((seq, range))) => {
                    store
                        .store
                        .get_range(&wal_path(&store.wal, *seq), range.clone())
                        .await?
                }
                (None, None) => {
                    // Compacted and evicted: fall through to the segments.
                    Default::default()
                }
            };
            if h.payload.is_some() || h.wal.is_some() {
                bytes += payload.len();
                pos = h.record.end();
                out.push(Record {
                    payload,
                    ..h.record.clone()
                });
                continue;
            }
        }
        let Some(seg) = segments.iter().find(|s| s.base <= pos && pos < s.end) else {
            return Err(WalError::Corrupt(format!(
                "stream {}: offset {pos} is in no segment and not in memory",
                stream.name
            )));
        };
        let records = read_segment(store, seg, pos, max_bytes.saturating_sub(bytes)).await?;
        if records.is_empty() {
            return Err(WalError::Corrupt(format!(
                "segment {} has no record at {pos}",
                seg.key
            )));
        }
        for r in records {
            bytes += r.payload.len();
            pos = r.end();
            out.push(r);
        }
    }
    Ok(out)
}

pub(super) async fn offset_for_timestamp(
    stream: &Arc<StreamInner>,
    timestamp_ms: i64,
) -> WalResult<Option<u64>> {
    let (start, segments, held) = {
        let state = stream.lock();
        (
            state.start_offset,
            state.segments.clone(),
            state
                .held
                .iter()
                .map(|h| h.record.clone())
                .collect::<Vec<_>>(),
        )
    };
    for seg in segments.iter().filter(|s| s.end > start) {
        if seg.max_timestamp_ms < timestamp_ms {
            continue;
        }
        let index = segment_index(&stream.store, seg).await?;
        if let Some(e) = index
            .iter()
            .find(|e| e.timestamp_ms >= timestamp_ms && e.end() > start)
        {
            return Ok(Some(e.base.max(start)));
        }
    }
    let compacted_end = segments.last().map_or(start, |s| s.end);
    Ok(held
        .iter()
        .find(|r| r.end() > compacted_end && r.timestamp_ms >= timestamp_ms)
        .map(|r| r.base.max(start)))
}
