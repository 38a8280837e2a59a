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
//! budget ([`BUDGET_BYTES`]). Every segment fetched ahead takes permits of the budget
//! when its fetch starts and keeps them until the step after the one that returned its
//! last records (the records share its buffer; the callers, recoveries, drop a step's
//! records before the next). A step returns about the caller's `max_bytes`, as a plain
//! read does. Permits are only ever *tried* (never waited for), so a scan holding some
//! never waits on another; a scan that gets none reads the plain way, one step at a
//! time, as before. Reads on behalf of clients never fetch ahead: a fetch ahead of a
//! reader that stops early is wasted, and the overload test measured that holding more
//! per read raises a node's peak memory (docs/s3stream.md).
//!
//! Anything unexpected (a segment deleted under it by a merge or a trim, a failed
//! GET, records not where the index says) falls back to the plain read at the same
//! position, which looks again from a fresh view (`mink_wal_scan_fallbacks_total`
//! counts them): a scan returns exactly what plain reads would. A segment fetched
//! before a trim removed it is not served below the new start: that is
//! `OffsetOutOfRange`, as for a plain read.

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
    IndexEntry, Record, SEGMENT_FOOTER_LEN, decode_segment_footer, decode_segment_index,
    decode_segment_records,
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

/// A whole segment fetched ahead, with the budget it holds until its records are
/// taken.
struct Ahead {
    seg: SegmentMeta,
    fetched: Fetched,
    /// Taken into [`Scan::in_hand`] with the segment's last records.
    permit: Option<OwnedSemaphorePermit>,
}

enum Fetched {
    InFlight(JoinHandle<object_store::Result<Bytes>>),
    /// The object and its index, checked against its footer.
    Read(Bytes, Arc<Vec<IndexEntry>>),
}

impl Drop for Ahead {
    fn drop(&mut self) {
        if let Fetched::InFlight(task) = &self.fetched {
            task.abort();
        }
    }
}

/// A read of a stream from one offset up to an end, in order; see the module docs.
/// The records a step returns share the fetched segment's buffer, which the scan
/// counts against the node's budget until its next step: a caller that keeps records
/// across steps keeps memory the budget no longer sees. Dropping a scan cancels what
/// it fetched ahead.
pub struct Scan {
    stream: Arc<StreamInner>,
    pos: u64,
    end: u64,
    max_bytes: usize,
    ahead: VecDeque<Ahead>,
    /// The budget of the segment the last step's records came from.
    in_hand: Option<OwnedSemaphorePermit>,
}

impl Scan {
    pub(super) fn new(stream: Arc<StreamInner>, from: u64, end: u64, max_bytes: usize) -> Self {
        // Nothing past the acknowledged end can be read: a plain read stops there.
        let end = end.min(stream.lock().acked_end);
        Self {
            stream,
            pos: from,
            end,
            max_bytes: max_bytes.max(1),
            ahead: VecDeque::new(),
            in_hand: None,
        }
    }

    /// The offset the next records start at (or hold).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The next whole units from the scan's position, about `max_bytes` of payload (at
    /// least one unit), or `None` at its end. As a plain read: the first may begin
    /// before the position; an offset below the stream's start is `OffsetOutOfRange`.
    pub async fn next(&mut self) -> WalResult<Option<Vec<Record>>> {
        self.in_hand = None;
        if self.pos >= self.end {
            return Ok(None);
        }
        while self.ahead.front().is_some_and(|a| a.seg.end <= self.pos) {
            self.ahead.pop_front();
        }
        self.plan();
        let records = match self.served_ahead().await? {
            Some(records) => records,
            None => {
                // Nothing fetched ahead holds the position, or what was did not serve:
                // the plain read, from a fresh view. What was planned after it may
                // still serve (its segments follow this one's).
                let records = super::read::read(&self.stream, self.pos, self.max_bytes).await?;
                if records.is_empty() {
                    return Err(WalError::Corrupt(format!(
                        "stream {}: a scan made no progress at {} below its end {}",
                        self.stream.name, self.pos, self.end
                    )));
                }
                records
            }
        };
        self.pos = records.last().map_or(self.pos, Record::end);
        if self.ahead.front().is_some_and(|a| a.seg.end <= self.pos) {
            self.in_hand = self.ahead.pop_front().and_then(|mut a| a.permit.take());
        }
        Ok(Some(records))
    }

    /// The step's records from the segment fetched ahead that holds the position, if
    /// one does and it serves; a fetched segment that does not serve is dropped with
    /// everything planned after it.
    async fn served_ahead(&mut self) -> WalResult<Option<Vec<Record>>> {
        let pos = self.pos;
        let Some(a) = self.ahead.front_mut().filter(|a| a.seg.base <= pos) else {
            return Ok(None);
        };
        if let Fetched::InFlight(task) = &mut a.fetched {
            let read = match task.await {
                Ok(Ok(bytes)) => index_of(&a.seg, &bytes).map(|index| (bytes, index)),
                Ok(Err(e)) => Err(e.into()),
                Err(e) => Err(WalError::Storage(format!("segment fetch: {e}"))),
            };
            match read {
                Ok((bytes, index)) => {
                    self.stream.store.cache_segment_index(&a.seg.key, &index);
                    a.fetched = Fetched::Read(bytes, index);
                }
                Err(e) => {
                    self.fall_back(&e);
                    return Ok(None);
                }
            }
        }
        let Fetched::Read(bytes, index) = &a.fetched else {
            unreachable!("fetched above");
        };
        // The segment may have been trimmed away since it was fetched: below the
        // start, a scan fails as a plain read does.
        let start = self.stream.lock().start_offset;
        if pos < start {
            return Err(WalError::OffsetOutOfRange {
                stream: self.stream.name.clone(),
                offset: pos,
                start,
            });
        }
        match records_at(&a.seg, bytes, index, pos, self.max_bytes) {
            Ok(records) if !records.is_empty() => {
                metrics::counter!("mink_wal_scan_segments_ahead_total").increment(1);
                Ok(Some(records))
            }
            Ok(_) => {
                let e = WalError::Corrupt(format!("segment {} has no record at {pos}", a.seg.key));
                self.fall_back(&e);
                Ok(None)
            }
            Err(e) => {
                self.fall_back(&e);
                Ok(None)
            }
        }
    }

    /// Drops what was planned after a fetched segment did not serve.
    fn fall_back(&mut self, e: &WalError) {
        metrics::counter!("mink_wal_scan_fallbacks_total").increment(1);
        tracing::debug!(stream = self.stream.name, pos = self.pos, error = %e,
            "a segment fetched ahead did not serve; reading the plain way");
        self.ahead.clear();
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
            let task = tokio::spawn(async move { store.get(&path).await?.bytes().await });
            self.ahead.push_back(Ahead {
                seg,
                fetched: Fetched::InFlight(task),
                permit: Some(permit),
            });
        }
    }
}

/// A whole segment's index, checked against its footer (and its CRC).
fn index_of(seg: &SegmentMeta, bytes: &Bytes) -> WalResult<Arc<Vec<IndexEntry>>> {
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
    let index = decode_segment_index(&seg.key, &bytes[index_pos..index_end], entries, crc)?;
    if index
        .last()
        .is_some_and(|e| e.range().end > index_pos as u64)
    {
        return Err(WalError::Corrupt(format!(
            "segment {}: records past its index",
            seg.key
        )));
    }
    Ok(Arc::new(index))
}

/// The records of a fetched segment from the one holding `pos`, about `max_bytes` of
/// payload (at least one), each checked against its index entry and CRC.
fn records_at(
    seg: &SegmentMeta,
    bytes: &Bytes,
    index: &[IndexEntry],
    pos: u64,
    max_bytes: usize,
) -> WalResult<Vec<Record>> {
    let entries = super::read::entries_from(index, pos, max_bytes);
    let (Some(a), Some(b)) = (entries.first(), entries.last()) else {
        return Ok(vec![]);
    };
    if a.base > pos {
        return Err(WalError::Corrupt(format!(
            "segment {}: no record holds {pos} (the next is at {})",
            seg.key, a.base
        )));
    }
    let range = a.range().start as usize..b.range().end as usize;
    decode_segment_records(&seg.key, &bytes.slice(range), entries)
}
