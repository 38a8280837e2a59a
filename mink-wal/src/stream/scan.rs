//! A sequential read of a stream to a given end, fetching the segments ahead of it
//! together: what a recovery does when it reads a whole log back.
//!
//! A plain [`read`](super::read::read) takes one segment per step, and on a node that
//! never read the segment before, three round trips for it (footer, index, records).
//! A log tablet's recovery over the small segments chaos leaves behind did that one
//! segment after another: 2–4 s of a takeover on moto (chaos seed 87). A [`Scan`]
//! instead fetches whole segments, up to [`AHEAD_SEGMENTS`] and [`AHEAD_BYTES`] beyond
//! its position, each in one GET, while the caller works through the one before.
//!
//! Memory is bounded twice: per scan by [`AHEAD_BYTES`], and per node by the scan
//! budget ([`BUDGET_BYTES`]), from which every segment fetched ahead takes permits
//! until the caller has taken its records. Permits are only ever *tried* (never waited
//! for), so a scan holding some never waits on another; a scan that gets none reads
//! the plain way, one step at a time, as before. Reads on behalf of clients never
//! fetch ahead: a fetch ahead of a reader that stops early is wasted, and the overload
//! test measured that holding more per read raises a node's peak memory (docs/s3stream.md).
//!
//! Anything unexpected (a segment deleted under it by a merge or a trim, a failed
//! GET, records not where the index says) falls back to the plain read at the same
//! position, which looks again from a fresh view: a scan returns exactly what plain
//! reads would.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinHandle;

use super::StreamInner;
use super::meta::SegmentMeta;
use crate::error::{WalError, WalResult};
use crate::format::{
    Record, SEGMENT_FOOTER_LEN, decode_segment_footer, decode_segment_index, decode_segment_records,
};

/// Segments a scan fetches ahead of its position, at most.
pub(crate) const AHEAD_SEGMENTS: usize = 8;
/// Bytes of segments a scan fetches ahead, at most. A bigger segment is read the plain
/// way, by ranges of the caller's `max_bytes`.
pub(crate) const AHEAD_BYTES: u64 = 16 << 20;
/// Bytes of segments all the scans of a node hold fetched ahead, at most.
pub(crate) const BUDGET_BYTES: u64 = 64 << 20;
/// One permit of the scan budget.
const PERMIT_BYTES: u64 = 64 << 10;

/// The scan budget's permits for a node.
pub(super) fn budget_permits() -> usize {
    (BUDGET_BYTES / PERMIT_BYTES) as usize
}

fn permits_for(bytes: u64) -> u32 {
    bytes
        .div_ceil(PERMIT_BYTES)
        .clamp(1, BUDGET_BYTES / PERMIT_BYTES) as u32
}

/// A whole segment being fetched ahead, with the budget it holds.
struct Ahead {
    seg: SegmentMeta,
    fetch: JoinHandle<object_store::Result<Bytes>>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.fetch.abort();
    }
}

/// A read of a stream from one offset up to an end, in order; see the module docs.
/// Dropping it cancels what it fetched ahead.
pub struct Scan {
    stream: Arc<StreamInner>,
    pos: u64,
    end: u64,
    max_bytes: usize,
    ahead: VecDeque<Ahead>,
}

impl Scan {
    pub(super) fn new(stream: Arc<StreamInner>, from: u64, end: u64, max_bytes: usize) -> Self {
        Self {
            stream,
            pos: from,
            end,
            max_bytes,
            ahead: VecDeque::new(),
        }
    }

    /// The offset the next records start at (or hold).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The next whole units from the scan's position, or `None` at its end. As a plain
    /// read: the first may begin before the position, and the last may end past the
    /// scan's end; an offset below the stream's start is `OffsetOutOfRange`.
    pub async fn next(&mut self) -> WalResult<Option<Vec<Record>>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        while self.ahead.front().is_some_and(|a| a.seg.end <= self.pos) {
            self.ahead.pop_front();
        }
        self.plan();
        let fetched = match self.ahead.front() {
            Some(a) if a.seg.base <= self.pos => {
                let mut a = self.ahead.pop_front().expect("front");
                let got = (&mut a.fetch).await;
                match got {
                    Ok(Ok(bytes)) => records_at(&self.stream, &a.seg, &bytes, self.pos).ok(),
                    _ => None,
                }
            }
            _ => None,
        };
        let records = match fetched {
            Some(records) if !records.is_empty() => {
                metrics::counter!("mink_wal_scan_segments_ahead_total").increment(1);
                records
            }
            _ => {
                // Nothing fetched ahead holds the position, or what was did not serve:
                // the plain read, from a fresh view. What was planned after it may
                // still serve (its segments are consecutive to this one's).
                let records = super::read::read(&self.stream, self.pos, self.max_bytes).await?;
                if records.is_empty() {
                    return Err(WalError::Corrupt(format!(
                        "stream {}: a scan made no progress at {}",
                        self.stream.name, self.pos
                    )));
                }
                records
            }
        };
        self.pos = records.last().map_or(self.pos, Record::end);
        Ok(Some(records))
    }

    /// Starts fetching the segments after what is planned, while the scan's and the
    /// node's budgets allow.
    fn plan(&mut self) {
        let mut next = self.ahead.back().map_or(self.pos, |a| a.seg.end);
        let mut bytes: u64 = self.ahead.iter().map(|a| a.seg.bytes).sum();
        if self.ahead.len() >= AHEAD_SEGMENTS || next >= self.end {
            return;
        }
        let segments: Vec<SegmentMeta> = {
            let state = self.stream.lock();
            if next < state.start_offset {
                return;
            }
            let j = state.segments.partition_point(|s| s.end <= next);
            let mut out = Vec::new();
            for seg in &state.segments[j..] {
                if self.ahead.len() + out.len() >= AHEAD_SEGMENTS
                    || seg.base > next
                    || seg.base >= self.end
                    || bytes + seg.bytes > AHEAD_BYTES
                {
                    break;
                }
                next = seg.end;
                bytes += seg.bytes;
                out.push(seg.clone());
            }
            out
        };
        let budget = &self.stream.store.scan_budget;
        for seg in segments {
            let Ok(permit) = budget
                .clone()
                .try_acquire_many_owned(permits_for(seg.bytes))
            else {
                return;
            };
            let store = self.stream.store.segment_store.clone();
            let path = Path::from(seg.key.as_str());
            let fetch = tokio::spawn(async move { store.get(&path).await?.bytes().await });
            self.ahead.push_back(Ahead {
                seg,
                fetch,
                _permit: permit,
            });
        }
    }
}

/// The records of a whole segment's `bytes` from the one holding `pos`, checked
/// against its footer and index (and their CRCs).
fn records_at(
    stream: &StreamInner,
    seg: &SegmentMeta,
    bytes: &Bytes,
    pos: u64,
) -> WalResult<Vec<Record>> {
    if bytes.len() as u64 != seg.bytes || bytes.len() < SEGMENT_FOOTER_LEN {
        return Err(WalError::Corrupt(format!(
            "segment {}: {} bytes where its metadata says {}",
            seg.key,
            bytes.len(),
            seg.bytes
        )));
    }
    let index_end = bytes.len() - SEGMENT_FOOTER_LEN;
    let (index_pos, entries, crc) = decode_segment_footer(&seg.key, &bytes[index_end..])?;
    let index_pos = usize::try_from(index_pos)
        .ok()
        .filter(|p| *p <= index_end)
        .ok_or_else(|| WalError::Corrupt(format!("{}: index position beyond its end", seg.key)))?;
    let index = Arc::new(decode_segment_index(
        &seg.key,
        &bytes[index_pos..index_end],
        entries,
        crc,
    )?);
    stream.store.cache_segment_index(&seg.key, &index);
    let first = index.partition_point(|e| e.end() <= pos);
    let entries = &index[first..];
    let (Some(a), Some(b)) = (entries.first(), entries.last()) else {
        return Ok(vec![]);
    };
    let range = a.range().start as usize..b.range().end as usize;
    if range.end > index_pos {
        return Err(WalError::Corrupt(format!(
            "segment {}: records past its index",
            seg.key
        )));
    }
    decode_segment_records(&seg.key, &bytes.slice(range), entries)
}
