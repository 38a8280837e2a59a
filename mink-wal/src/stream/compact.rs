//! Compaction of WAL data into per-stream segments, clean close, trim, WAL GC.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path;

use super::meta::{SegmentMerge, SegmentMeta, StreamUpdate};
use super::writer::wal_path;
use super::{Status, StoreInner, StreamCommand, StreamInner, propose};
use crate::error::{WalError, WalResult};
use crate::format::{Record, encode_segment};

/// Writes `records` (contiguous) as one segment object; returns its metadata.
pub(super) async fn write_segment(
    store: &StoreInner,
    stream: &str,
    epoch: u64,
    records: &[Record],
) -> WalResult<SegmentMeta> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Err(WalError::Corrupt("an empty segment".into()));
    };
    let (payload, _) = encode_segment(records);
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let key = format!("seg/{stream}/{:020}-{epoch}-{}", first.base, &unique[..12]);
    let len = payload.content_length() as u64;
    store
        .segment_store
        .put(&Path::from(key.as_str()), payload)
        .await?;
    metrics::counter!("mink_wal_segments_written_total").increment(1);
    Ok(SegmentMeta {
        key,
        base: first.base,
        end: last.end(),
        bytes: len,
        min_timestamp_ms: records.iter().map(|r| r.timestamp_ms).min().unwrap_or(0),
        max_timestamp_ms: records.iter().map(|r| r.timestamp_ms).max().unwrap_or(0),
    })
}

/// The uncompacted records of a stream with their payloads (fetched from the WAL
/// when evicted from memory), and the WAL sequence of the first.
async fn collect(store: &StoreInner, stream: &StreamInner) -> WalResult<(u64, Vec<Record>)> {
    let (epoch, held) = {
        let state = stream.lock();
        let held: Vec<_> = state
            .held
            .iter()
            .filter(|h| h.wal.is_some())
            .cloned()
            .collect();
        (state.epoch, held)
    };
    // Evicted payloads are read back in order, `EVICTED_READS_AT_ONCE` at a time (one
    // after another, a round after a backlog of thousands of evicted records takes
    // minutes on moto; more at once waits for a bound by bytes).
    let fetches = held.into_iter().map(|h| async move {
        let payload = match h.payload {
            Some(p) => p,
            None => {
                let (seq, range) = h.wal.clone().unwrap_or_default();
                super::fetch_evicted(store, &h.record, seq, range).await?
            }
        };
        Ok::<_, WalError>(Record {
            payload,
            ..h.record
        })
    });
    let records = futures::stream::iter(fetches)
        .buffered(EVICTED_READS_AT_ONCE)
        .try_collect()
        .await?;
    Ok((epoch, records))
}

/// Evicted payloads one stream's compaction reads back at once. One: at sixteen, the
/// overload test's peak memory went past its bound (257 MiB over its baseline against
/// 240) with a store slower than the writers; reading several at once needs a bound by
/// bytes first.
const EVICTED_READS_AT_ONCE: usize = 1;

/// Splits contiguous records into runs of about `segment_bytes_max`.
fn split(records: Vec<Record>, max: u64) -> Vec<Vec<Record>> {
    let mut out: Vec<Vec<Record>> = Vec::new();
    let mut size = 0u64;
    for r in records {
        let len = r.payload.len() as u64;
        match out.last_mut() {
            Some(run) if size + len <= max => {
                run.push(r);
                size += len;
            }
            _ => {
                size = len;
                out.push(vec![r]);
            }
        }
    }
    out
}

/// After a committed compaction: record the new segments and WAL position, and keep
/// compacted payloads only as tail cache.
fn committed(store: &StoreInner, stream: &StreamInner, segments: &[SegmentMeta], wal_from: u64) {
    let mut state = stream.lock();
    let mut released = 0u64;
    for seg in segments {
        state.segments.push(seg.clone());
        state.committed_end = seg.end;
    }
    state.committed_wal_from = wal_from;
    let end = state.committed_end;
    for h in state.held.iter_mut() {
        if h.record.end() <= end && h.wal.take().is_some() {
            released += h.len;
        }
    }
    while state
        .held
        .front()
        .is_some_and(|h| h.payload.is_none() && h.wal.is_none())
    {
        state.held.pop_front();
    }
    store.uncompacted_bytes.fetch_sub(
        released.min(store.uncompacted_bytes.load(Ordering::Relaxed)),
        Ordering::Relaxed,
    );
    store.evict(&mut state);
}

/// Brings the local streams in line with the stream-metadata log (caught up by the
/// caller): a commit that landed although its proposer saw an error is adopted, and
/// an open stream the log says another writer owns now is failed and forgotten. An
/// outcome is never assumed: this is where unknown outcomes get resolved.
fn resync(store: &Arc<StoreInner>, streams: &[Arc<StreamInner>]) {
    for stream in streams {
        resync_one(store, stream, false);
    }
}

/// [`resync`] of one stream; `closing` includes a stream being closed (by its close).
fn resync_one(store: &Arc<StoreInner>, stream: &Arc<StreamInner>, closing: bool) {
    {
        let meta = store.meta.read(|s, _| s.streams.get(&stream.name).cloned());
        let ours = meta
            .as_ref()
            .is_some_and(|m| m.owner.as_ref() == Some(&store.wal));
        let mut state = stream.lock();
        let eligible = match state.status {
            Status::Open => true,
            Status::Closing => closing,
            _ => false,
        };
        if !eligible {
            // Closing streams are resolved by their close; failed ones are gone.
            return;
        }
        match meta {
            Some(meta) if ours => {
                if meta.committed_end > state.committed_end {
                    let local_end = state.committed_end;
                    let adopted: Vec<SegmentMeta> = meta
                        .segments
                        .iter()
                        .filter(|s| s.base >= local_end)
                        .cloned()
                        .collect();
                    drop(state);
                    tracing::info!(
                        stream = stream.name,
                        from = local_end,
                        to = meta.committed_end,
                        "adopting a compaction commit that landed unseen"
                    );
                    committed(store, stream, &adopted, meta.wal_from);
                } else {
                    drop(state);
                }
                // Merges and trims that landed unseen: for a stream it owns, the log's
                // list is the truth (a local list only ever lags it).
                let mut state = stream.lock();
                let keys = |list: &[SegmentMeta]| -> Vec<String> {
                    list.iter().map(|s| s.key.clone()).collect()
                };
                if keys(&state.segments) != keys(&meta.segments) {
                    state.segments = meta.segments.clone();
                }
                state.start_offset = state.start_offset.max(meta.start_offset);
            }
            _ => {
                state.status = Status::Failed(WalError::Fenced(format!(
                    "stream {} was taken over by another WAL writer",
                    stream.name
                )));
                drop(state);
                tracing::info!(stream = stream.name, "dropping a stream taken over");
                store.remove_stream(&stream.name, stream);
            }
        }
    }
}

/// Streams whose segments one compaction round writes at once. One: at eight, each
/// stream's segment being encoded (small payloads are copied into it) and uploaded at
/// once raised the node's peak memory past the overload test's bound (263 MiB over its
/// baseline against 240) when the store is slower than the writers. Writing several
/// at once needs a bound by bytes first.
const SEGMENT_WRITES_AT_ONCE: usize = 1;

/// Compacts every open stream of the node in one metadata commit, then deletes WAL
/// objects below the WAL floor the log computed from that commit.
pub(super) async fn compact_all(store: &Arc<StoreInner>) -> WalResult<usize> {
    let _guard = store.compaction.lock().await;
    if let Some(e) = store.writer.failure() {
        return Err(e);
    }
    store.meta.catch_up().await?;
    // Read the oldest unacknowledged sequence before collecting: a record acked after
    // this point lives at or above it.
    let oldest = store.writer.oldest_unacked.load(Ordering::SeqCst);
    let streams: Vec<Arc<StreamInner>> = store.lock_streams().values().cloned().collect();
    resync(store, &streams);
    // A round's length is how far the streams' WAL positions trail, and what a takeover
    // reads (on moto, rounds of five sequential segment PUTs took 2–6 s); the segments
    // are still written one stream at a time (`SEGMENT_WRITES_AT_ONCE`).
    let open: Vec<Arc<StreamInner>> = streams
        .iter()
        .filter(|s| s.lock().status == Status::Open)
        .cloned()
        .collect();
    // Futures made by an iterator over owned handles (a stream combinator's closure
    // over borrowed ones is not `Send` for every lifetime).
    let writes = open.into_iter().map(|stream| {
        let store = store.clone();
        async move {
            let (epoch, records) = collect(&store, &stream).await?;
            let mut segments = Vec::new();
            for run in split(records, store.config.segment_bytes_max) {
                segments.push(write_segment(&store, &stream.name, epoch, &run).await?);
            }
            Ok::<_, WalError>((stream, epoch, segments))
        }
    });
    let sealed: Vec<(Arc<StreamInner>, u64, Vec<SegmentMeta>)> = futures::stream::iter(writes)
        .buffered(SEGMENT_WRITES_AT_ONCE)
        .try_collect()
        .await?;
    let mut updates = Vec::new();
    let mut written = 0;
    for (stream, epoch, segments) in sealed {
        let previous = stream.lock().committed_wal_from;
        if segments.is_empty() && oldest <= previous {
            continue;
        }
        written += segments.len();
        updates.push((
            stream.clone(),
            StreamUpdate {
                stream: stream.name.clone(),
                epoch,
                segments,
                wal_from: oldest.max(previous),
            },
        ));
    }
    let mut attempts = 0;
    while !updates.is_empty() {
        attempts += 1;
        let command = StreamCommand::Commit {
            owner: store.wal.clone(),
            updates: updates.iter().map(|(_, u)| u.clone()).collect(),
            oldest_unacked: Some(oldest),
        };
        // An error leaves the outcome unknown: the next round's resync reads it.
        match propose(store, &command).await? {
            Ok(_) => break,
            Err(why) if attempts < 4 => {
                // The log moved under us (a takeover, a commit of ours that landed
                // late): bring the local streams in line, then keep the updates that
                // are still valid each on its own. The others' segments are orphans.
                tracing::info!("compaction commit rejected ({why}); rebuilding it");
                let touched: Vec<Arc<StreamInner>> =
                    updates.iter().map(|(stream, _)| stream.clone()).collect();
                resync(store, &touched);
                updates.retain(|(stream, u)| {
                    let alone = StreamCommand::Commit {
                        owner: store.wal.clone(),
                        updates: vec![u.clone()],
                        oldest_unacked: Some(oldest),
                    };
                    stream.lock().status == Status::Open
                        && store
                            .meta
                            .read(|s, _| crate::objectlog::LogState::validate(s, &alone).is_ok())
                });
            }
            Err(why) => {
                return Err(WalError::Corrupt(format!(
                    "compaction commit rejected: {why}"
                )));
            }
        }
    }
    for (stream, u) in &updates {
        committed(store, stream, &u.segments, u.wal_from);
    }
    store.compacted_from.fetch_max(oldest, Ordering::Relaxed);
    if !updates.is_empty() {
        metrics::counter!("mink_wal_compactions_total").increment(1);
    }
    if let Err(e) = merge_segments(store).await {
        tracing::warn!("segment merge failed: {e}; the next round tries again");
    }
    gc_own_wal(store).await?;
    maybe_snapshot_metadata(store).await;
    Ok(written)
}

/// The most segments one merge reads.
const MERGE_INPUTS_MAX: usize = 64;

/// The run of consecutive segments to merge next, if any: the first (oldest first)
/// of at least `fanin` segments, together at most `max` bytes, none holding half of
/// the run's bytes, and the longest such run from its start. The last condition
/// makes every merge move each byte into a segment at least twice as large as the one
/// it leaves, so a byte is rewritten at most log2(max / smallest) times; the first
/// two bound the segments a stream keeps (those left unmerged are either few or large).
pub(crate) fn merge_run(
    segments: &[SegmentMeta],
    fanin: usize,
    max: u64,
) -> Option<std::ops::Range<usize>> {
    if fanin < 2 {
        return None;
    }
    for i in 0..segments.len() {
        let (mut sum, mut largest, mut best) = (0u64, 0u64, None);
        for (j, seg) in segments[i..].iter().enumerate().take(MERGE_INPUTS_MAX) {
            if sum.saturating_add(seg.bytes) > max {
                break;
            }
            sum += seg.bytes;
            largest = largest.max(seg.bytes);
            if j + 1 >= fanin && largest * 2 < sum {
                best = Some(i..i + j + 1);
            }
        }
        if best.is_some() {
            return best;
        }
    }
    None
}

/// Every record of a segment, read whole and checked (footer, index and record CRCs).
async fn read_whole_segment(store: &StoreInner, seg: &SegmentMeta) -> WalResult<Vec<Record>> {
    use crate::format::{
        SEGMENT_FOOTER_LEN, decode_segment_footer, decode_segment_index, decode_segment_records,
    };
    let bytes = store
        .segment_store
        .get(&Path::from(seg.key.as_str()))
        .await?
        .bytes()
        .await?;
    let (index_pos, entries, crc) = decode_segment_footer(&seg.key, &bytes)?;
    let index_end = bytes.len().saturating_sub(SEGMENT_FOOTER_LEN);
    let index_pos = usize::try_from(index_pos).unwrap_or(usize::MAX);
    if index_pos > index_end {
        return Err(WalError::Corrupt(format!(
            "{}: index position beyond its end",
            seg.key
        )));
    }
    let index = decode_segment_index(&seg.key, &bytes[index_pos..index_end], entries, crc)?;
    let records = decode_segment_records(&seg.key, &bytes.slice(..index_pos), &index)?;
    let contiguous = records.windows(2).all(|w| w[0].end() == w[1].base);
    match (records.first(), records.last()) {
        (Some(a), Some(b)) if contiguous && a.base == seg.base && b.end() == seg.end => Ok(records),
        _ => Err(WalError::Corrupt(format!(
            "{}: its records do not cover {}..{}",
            seg.key, seg.base, seg.end
        ))),
    }
}

/// Merges runs of small segments ([`merge_run`]) of the open streams, reading at most
/// about two `segment_bytes_max` per round, and records them in one `Merge` entry.
/// Runs under the caller's compaction lock, so orphan GC never meets a merged segment
/// whose entry is undecided. A rejected or unknown outcome is settled by the next
/// round's resync; the merged objects it leaves unnamed are orphans. Returns the
/// number of merges recorded.
async fn merge_segments(store: &Arc<StoreInner>) -> WalResult<usize> {
    let fanin = store.config.segment_merge_fanin as usize;
    let max = store.config.segment_bytes_max;
    if fanin < 2 {
        return Ok(0);
    }
    let mut budget = max.saturating_mul(2);
    let streams: Vec<Arc<StreamInner>> = store.lock_streams().values().cloned().collect();
    let mut merges: Vec<(Arc<StreamInner>, SegmentMerge)> = Vec::new();
    for stream in &streams {
        let (epoch, run) = {
            let state = stream.lock();
            if state.status != Status::Open {
                continue;
            }
            match merge_run(&state.segments, fanin, max) {
                Some(range) => (state.epoch, state.segments[range].to_vec()),
                None => continue,
            }
        };
        let bytes: u64 = run.iter().map(|s| s.bytes).sum();
        if bytes > budget {
            continue;
        }
        budget -= bytes;
        let mut records = Vec::new();
        let mut readable = true;
        for seg in &run {
            match read_whole_segment(store, seg).await {
                Ok(more) => records.extend(more),
                Err(e) => {
                    // A trim may have removed it meanwhile; the next round looks again.
                    tracing::debug!(stream = stream.name, "segment merge skipped: {e}");
                    readable = false;
                    break;
                }
            }
        }
        if !readable {
            continue;
        }
        let segment = write_segment(store, &stream.name, epoch, &records).await?;
        merges.push((
            stream.clone(),
            SegmentMerge {
                stream: stream.name.clone(),
                replaces: run.iter().map(|s| s.key.clone()).collect(),
                segment,
            },
        ));
    }
    if merges.is_empty() {
        return Ok(0);
    }
    let command = StreamCommand::Merge {
        owner: store.wal.clone(),
        merges: merges.iter().map(|(_, m)| m.clone()).collect(),
    };
    // An error leaves the outcome unknown: the next round's resync reads it, and the
    // replaced objects are then orphans.
    if let Err(why) = propose(store, &command).await? {
        tracing::info!("segment merge rejected ({why}); the next round looks again");
        let touched: Vec<Arc<StreamInner>> = merges.iter().map(|(s, _)| s.clone()).collect();
        resync(store, &touched);
        return Ok(0);
    }
    let mut doomed = Vec::new();
    for (stream, m) in &merges {
        // The log (which now holds the merge) gives the stream's list; a stream
        // whose close is waiting for this lock is brought in line too.
        resync_one(store, stream, true);
        let mut cache = store
            .segment_indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for key in &m.replaces {
            cache.remove(key);
            doomed.push(Ok(Path::from(key.as_str())));
        }
    }
    metrics::counter!("mink_wal_segment_merges_total").increment(merges.len() as u64);
    store
        .merges
        .fetch_add(merges.len() as u64, Ordering::Relaxed);
    // Reads that located a replaced segment meet NotFound and look again.
    if let Err(e) = delete_paths(&store.gc_store, doomed).await {
        tracing::warn!("could not delete merged segments: {e}; orphan GC will");
    }
    Ok(merges.len())
}

/// Deletes this writer's WAL objects below its WAL floor in the stream-metadata log
/// (never below a floor from the local map: a stream this writer owns but has not
/// installed holds the floor down there, and only there).
async fn gc_own_wal(store: &Arc<StoreInner>) -> WalResult<()> {
    let floor = store.meta.read(|s, _| s.wal_floor(&store.wal));
    let from = store.gc_floor.load(Ordering::SeqCst);
    if floor <= from {
        return Ok(());
    }
    let paths: Vec<object_store::Result<Path>> = (from..floor)
        .map(|seq| Ok(wal_path(&store.wal, seq)))
        .collect();
    delete_paths(&store.gc_store, paths).await?;
    store.gc_floor.store(floor, Ordering::SeqCst);
    Ok(())
}

/// Writes a metadata snapshot every 1,000 entries and deletes what it covers.
///
/// Counted from the newest snapshot of the log this node knows of (loaded at start,
/// written by it, or seen in a catch-up's listing), not from the last this node wrote:
/// a node that had just started used to write a full snapshot and delete what it
/// covers (LISTs and DELETEs on the store) in its first round, which on a joiner fell
/// in the middle of its first takeovers and held their metadata catch-ups back
/// (3.6 s of a 12.67 s join in chaos seed 92); and every node wrote its own snapshot
/// per 1,000 entries where one does.
async fn maybe_snapshot_metadata(store: &StoreInner) {
    let index = store.meta.applied_index();
    if index < store.meta.newest_snapshot() + 1_000 {
        return;
    }
    match store.meta.write_snapshot().await {
        Ok(at) => {
            if let Err(e) = store.meta.delete_covered(at).await {
                tracing::debug!("stream metadata cleanup: {e}");
            }
        }
        Err(e) => tracing::warn!("stream metadata snapshot failed: {e}"),
    }
}

/// A clean close: flush, compact this stream completely, record the close.
///
/// A close whose proposal fails ambiguously leaves the stream `Closing` (it accepts
/// no appends) and installed; calling `close` again resolves it from the log.
pub(super) async fn close(stream: &Arc<StreamInner>, epoch: Option<u64>) -> WalResult<()> {
    let store = stream.store.clone();
    let lock = store.open_lock(&stream.name);
    let _serialized = lock.lock().await;
    if let Some(mine) = epoch {
        let now = stream.lock().epoch;
        if now != mine {
            return Err(WalError::Fenced(format!(
                "stream {} is open under epoch {now}, not {mine}: not closing it",
                stream.name
            )));
        }
    }
    close_locked(&store, stream).await
}

/// Closes again every stream whose close failed before its outcome was settled
/// (`Closing`, with no open or close of it running). Until it is settled, such a
/// stream is still this writer's in the log: its `wal_from` stays where it was while
/// the node goes on writing, so it holds the WAL floor down and a takeover of this
/// generation would read every WAL object written since (chaos seed 73: 4,344
/// objects, 101 s on moto). A newer open settles it as well ([`super::takeover`]).
/// Returns how many were settled.
pub(super) async fn settle_closes(store: &Arc<StoreInner>) -> usize {
    let closing: Vec<Arc<StreamInner>> = store
        .lock_streams()
        .values()
        .filter(|s| s.lock().status == Status::Closing)
        .cloned()
        .collect();
    let mut settled = 0;
    for stream in closing {
        let lock = store.open_lock(&stream.name);
        let Ok(_serialized) = lock.try_lock() else {
            continue; // a close or an open of it is running; the next tick looks again
        };
        // Decided again under the lock: an open under a newer epoch may have made it
        // Open (or replaced it) since the list was taken, and that one stays open.
        let still_closing = stream.lock().status == Status::Closing
            && store
                .lock_streams()
                .get(&stream.name)
                .is_some_and(|s| Arc::ptr_eq(s, &stream));
        if !still_closing {
            continue;
        }
        match close_locked(store, &stream).await {
            Ok(()) => {
                settled += 1;
                tracing::info!(stream = stream.name, "settled a close that had failed");
            }
            Err(e) => tracing::debug!(stream = stream.name, "settling a failed close: {e}"),
        }
    }
    settled
}

/// [`close`] under the stream's open lock.
async fn close_locked(store: &Arc<StoreInner>, stream: &Arc<StreamInner>) -> WalResult<()> {
    // Whether an earlier close left it Closing: its Close may have been proposed and
    // may still land, so a failure here must leave it Closing (only a write of our
    // own to the log settles it), never reopen it.
    let earlier_close = {
        let mut state = stream.lock();
        match &state.status {
            Status::Open => {
                state.status = Status::Closing;
                false
            }
            Status::Failed(e) => return Err(e.clone()),
            Status::Closed => return Ok(()),
            Status::Closing => true, // an earlier close did not finish: resolve it
        }
    };
    let reopen_unless_earlier = |stream: &StreamInner| {
        if !earlier_close {
            reopen_after_failed_close(stream);
        }
    };
    let target = stream.lock().next_offset;
    let mut rx = stream.acked.subscribe();
    while *rx.borrow_and_update() < target {
        if let Some(e) = store.writer.failure() {
            return Err(e);
        }
        let mut failed = store.writer.failed.subscribe();
        tokio::select! {
            biased;
            _ = rx.changed() => {}
            _ = failed.changed() => {}
        }
    }
    let _guard = store.compaction.lock().await;
    store.meta.catch_up().await?;
    if let Some(done) = close_resolved(store, stream) {
        return done;
    }
    // Adopt a compaction commit that landed unseen, or the close would restart
    // below the compacted end.
    resync_one(store, stream, true);
    let written = async {
        let (epoch, records) = collect(store, stream).await?;
        let mut segments = Vec::new();
        for run in split(records, store.config.segment_bytes_max) {
            segments.push(write_segment(store, &stream.name, epoch, &run).await?);
        }
        Ok::<_, WalError>((epoch, segments))
    }
    .await;
    let (epoch, segments) = match written {
        Ok(done) => done,
        Err(e) => {
            // Nothing was proposed by this call: the stream stays open and usable,
            // unless an earlier close's proposal may still land.
            reopen_unless_earlier(stream);
            return Err(e);
        }
    };
    let end_offset = stream.lock().acked_end;
    let command = StreamCommand::Close {
        stream: stream.name.clone(),
        epoch,
        owner: store.wal.clone(),
        segments: segments.clone(),
        end_offset,
    };
    // An error leaves the outcome unknown: the stream stays Closing.
    match propose(store, &command).await? {
        Ok(_) => {
            finish_close(store, stream, &segments);
            Ok(())
        }
        Err(why) => match close_resolved(store, stream) {
            Some(done) => done,
            None => {
                reopen_unless_earlier(stream);
                Err(WalError::Corrupt(format!(
                    "close of {} rejected: {why}",
                    stream.name
                )))
            }
        },
    }
}

fn reopen_after_failed_close(stream: &StreamInner) {
    let mut state = stream.lock();
    if state.status == Status::Closing {
        state.status = Status::Open;
    }
}

/// Whether the log already settles a close of `stream`: closed (by an earlier
/// attempt of ours whose answer was lost) or owned by another writer.
fn close_resolved(store: &Arc<StoreInner>, stream: &Arc<StreamInner>) -> Option<WalResult<()>> {
    let meta = store.meta.read(|s, _| s.streams.get(&stream.name).cloned());
    match meta {
        Some(m) if m.owner.as_ref() == Some(&store.wal) => None,
        Some(m) if m.owner.is_none() && m.committed_end >= stream.lock().acked_end => {
            let adopted: Vec<SegmentMeta> = {
                let end = stream.lock().committed_end;
                m.segments
                    .iter()
                    .filter(|s| s.base >= end)
                    .cloned()
                    .collect()
            };
            finish_close(store, stream, &adopted);
            Some(Ok(()))
        }
        _ => {
            let err = WalError::Fenced(format!(
                "stream {} is owned by another WAL writer",
                stream.name
            ));
            stream.lock().status = Status::Failed(err.clone());
            store.remove_stream(&stream.name, stream);
            Some(Err(err))
        }
    }
}

fn finish_close(store: &Arc<StoreInner>, stream: &Arc<StreamInner>, segments: &[SegmentMeta]) {
    committed(store, stream, segments, 0);
    let mut state = stream.lock();
    state.status = Status::Closed;
    let held: u64 = state
        .held
        .iter()
        .filter_map(|h| h.payload.as_ref())
        .map(|p| p.len() as u64)
        .sum();
    state.held.clear();
    state.held_bytes = 0;
    store.held_bytes.fetch_sub(
        held.min(store.held_bytes.load(Ordering::Relaxed)),
        Ordering::Relaxed,
    );
    drop(state);
    store.remove_stream(&stream.name, stream);
}

/// Moves the start offset forward and deletes segments wholly below it. Only an open
/// stream of the owner may; a trim whose outcome is unknown is resolved from the log.
pub(super) async fn trim(stream: &Arc<StreamInner>, start: u64) -> WalResult<u64> {
    let store = stream.store.clone();
    let (epoch, committed_end, current) = {
        let state = stream.lock();
        state.status.check_open(&stream.name)?;
        (state.epoch, state.committed_end, state.start_offset)
    };
    let start = start.min(committed_end);
    if start <= current {
        return Ok(current);
    }
    let command = StreamCommand::Trim {
        stream: stream.name.clone(),
        epoch,
        start_offset: start,
        owner: Some(store.wal.clone()),
    };
    let start = match propose(&store, &command).await {
        Ok(Ok(_)) => start,
        Ok(Err(why)) => {
            return Err(WalError::Fenced(format!(
                "trim of {} rejected: {why}",
                stream.name
            )));
        }
        Err(e) => {
            // It may have landed: adopt whatever start the log has.
            store.meta.catch_up().await?;
            let logged = store
                .meta
                .read(|s, _| s.streams.get(&stream.name).map(|m| m.start_offset));
            match logged {
                Some(logged) if logged > current => logged,
                _ => return Err(e),
            }
        }
    };
    let doomed: Vec<SegmentMeta> = {
        let mut state = stream.lock();
        state.start_offset = state.start_offset.max(start);
        let start = state.start_offset;
        let (gone, kept) = state.segments.drain(..).partition(|s| s.end <= start);
        state.segments = kept;
        gone
    };
    for seg in &doomed {
        match store.gc_store.delete(&Path::from(seg.key.as_str())).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!("could not delete trimmed segment {}: {e}", seg.key),
        }
        store
            .segment_indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&seg.key);
    }
    Ok(start)
}

/// Deletes WAL objects of dead generations: generations whose node has claimed a newer
/// one and that no stream names as owner, objects older than `dead_wal_grace_ms`. Any
/// node may run it. Returns the number of objects deleted.
pub(super) async fn gc_dead_wals(store: &Arc<StoreInner>) -> WalResult<usize> {
    let claims: Vec<Path> = store
        .gc_store
        .list(Some(&Path::from("walgen")))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    let mut newest: std::collections::BTreeMap<String, u64> = Default::default();
    let mut all = Vec::new();
    for claim in claims {
        let segments: Vec<String> = claim.parts().map(|p| p.as_ref().to_string()).collect();
        let [_, node, generation] = segments.as_slice() else {
            continue;
        };
        let Ok(generation) = generation.parse::<u64>() else {
            continue;
        };
        let entry = newest.entry(node.clone()).or_default();
        *entry = (*entry).max(generation);
        all.push(super::meta::WalId {
            node: node.clone(),
            generation,
        });
    }
    store.meta.catch_up().await?;
    let (referenced, fences, retired): (
        std::collections::BTreeSet<super::meta::WalId>,
        std::collections::BTreeMap<String, u64>,
        std::collections::BTreeSet<super::meta::WalId>,
    ) = store.meta.read(|s, _| {
        (
            s.streams.values().filter_map(|m| m.owner.clone()).collect(),
            s.fences.clone(),
            all.iter().filter(|w| s.retired(w)).cloned().collect(),
        )
    });
    let cutoff = cutoff_ms(store, store.config.dead_wal_grace_ms).await?;
    let mut deleted = 0;
    for wal in all {
        // Dead: the node claimed a newer generation, and the stream metadata retired
        // this one (fenced it, or saw a newer generation of the node): from then on it
        // refuses any open by it, so no stream can come to depend on these objects
        // again, however late that open. A generation that closed everything cleanly
        // and whose node has appended nothing since waits (a few objects at most).
        if wal == store.wal
            || referenced.contains(&wal)
            || newest.get(&wal.node).is_none_or(|g| *g <= wal.generation)
            || !retired.contains(&wal)
        {
            continue;
        }
        // Fence objects stay, the recorded one and any other: a fencer whose write
        // timed out after it landed, or who lost the race to record its fence, leaves
        // one below the recorded fence, and that is where the owner's writer stopped.
        // A process of that generation may only be paused: deleting the slot would let
        // it write there and acknowledge records no takeover recovers (the model
        // test found this, seed 4211). Data objects it already wrote it never writes
        // again (a retry of one rewrites the same bytes).
        let fence = fences
            .get(&wal.to_string())
            .map(|at| super::writer::wal_path(&wal, *at));
        let old: Vec<object_store::ObjectMeta> = store
            .gc_store
            .list(Some(&super::writer::wal_dir(&wal)))
            .try_filter(|m| {
                let is_fence = fence.as_ref() == Some(&m.location);
                futures::future::ready(!is_fence && m.last_modified.timestamp_millis() <= cutoff)
            })
            .try_collect()
            .await?;
        // The small objects' first bytes are read a few at a time: one after another,
        // a generation of 1,485 objects took minutes on moto.
        let checks = old.into_iter().map(|m| {
            let store = store.clone();
            async move {
                let fence = (8..=FENCE_OBJECT_BYTES_MAX).contains(&m.size)
                    && is_fence_object(&store, &m.location).await?;
                Ok::<_, WalError>((!fence).then_some(m.location))
            }
        });
        let doomed: Vec<object_store::Result<Path>> = futures::stream::iter(checks)
            .buffered(GC_CHECKS_AT_ONCE)
            .try_filter_map(|p| futures::future::ready(Ok(p.map(Ok))))
            .try_collect()
            .await?;
        let count = doomed.len();
        delete_paths(&store.gc_store, doomed).await?;
        if count > 0 {
            tracing::info!(%wal, objects = count, "deleted the WAL objects of a dead generation");
        }
        deleted += count;
    }
    Ok(deleted)
}

/// Objects whose first bytes dead-WAL collection reads at once.
const GC_CHECKS_AT_ONCE: usize = 16;

/// Fence objects are this small at most (magic, who fenced as JSON, CRC); larger
/// objects are WAL data and need no look.
const FENCE_OBJECT_BYTES_MAX: u64 = 4096;

/// Whether the object at `path` is a fence (its first bytes are the fence magic).
async fn is_fence_object(store: &StoreInner, path: &Path) -> WalResult<bool> {
    let magic = crate::format::FENCE_MAGIC;
    match store.gc_store.get_range(path, 0..magic.len() as u64).await {
        Ok(head) => Ok(head.as_ref() == magic),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Deletes segment objects that no metadata entry names and none ever will: those of
/// streams this writer owns (in the log), keyed with an epoch no newer than the
/// stream's, and older than `dead_wal_grace_ms`. Runs under the compaction lock, so
/// none of them belongs to a commit or close of ours still in flight; a takeover's
/// recovered segment carries a newer epoch until its open lands, and only the owner's
/// commits name older ones. Returns the number deleted.
pub(super) async fn gc_orphan_segments(store: &Arc<StoreInner>) -> WalResult<usize> {
    let _guard = store.compaction.lock().await;
    store.meta.catch_up().await?;
    let cutoff = cutoff_ms(store, store.config.dead_wal_grace_ms).await?;
    let owned: Vec<(String, u64, std::collections::BTreeSet<String>)> = store.meta.read(|s, _| {
        s.owned_by(&store.wal)
            .map(|(name, m)| {
                // Compared as paths: listings return keys percent-encoded.
                let known = m
                    .segments
                    .iter()
                    .map(|seg| Path::from(seg.key.as_str()).to_string())
                    .collect();
                (name.clone(), m.epoch, known)
            })
            .collect()
    });
    let mut deleted = 0;
    for (name, epoch, known) in owned {
        let orphans: Vec<object_store::Result<Path>> = store
            .gc_store
            .list(Some(&Path::from(format!("seg/{name}"))))
            .try_filter(|m| {
                // Checked, not assumed: object_store lists a prefix by path segments
                // (`seg/t1-b1` does not list `seg/t1-b10/…`), and a segment of another
                // stream must never be taken for an orphan of this one.
                let ours = segment_stream(&m.location) == Some(name.as_str());
                let named = known.contains(m.location.as_ref());
                // A segment of a newer epoch is a takeover's recovery not committed
                // yet: a new owner opens under an epoch above every earlier one.
                let old_epoch = segment_epoch(&m.location).is_some_and(|e| e <= epoch);
                futures::future::ready(
                    ours && !named && old_epoch && m.last_modified.timestamp_millis() <= cutoff,
                )
            })
            .map_ok(|m| m.location)
            .collect()
            .await;
        let orphans: Vec<object_store::Result<Path>> =
            orphans.into_iter().filter(|p| p.is_ok()).collect();
        deleted += orphans.len();
        delete_paths(&store.gc_store, orphans).await?;
    }
    Ok(deleted)
}

/// The epoch in a segment key `seg/{stream}/{base:020}-{epoch}-{unique}`.
fn segment_epoch(path: &Path) -> Option<u64> {
    path.filename()?.split('-').nth(1)?.parse().ok()
}

/// The stream of a segment key `seg/{stream}/{file}`; `None` for any other shape.
fn segment_stream(path: &Path) -> Option<&str> {
    let (stream, file) = path.as_ref().strip_prefix("seg/")?.split_once('/')?;
    (!file.is_empty() && !file.contains('/')).then_some(stream)
}

/// The store's clock (see [`crate::store::store_now_ms`]), `grace_ms` ago.
async fn cutoff_ms(store: &StoreInner, grace_ms: u64) -> WalResult<i64> {
    let now =
        crate::store::store_now_ms(&store.gc_store, &format!("clock/{}", store.wal.node)).await?;
    Ok(now.saturating_sub(grace_ms.min(i64::MAX as u64) as i64))
}

/// Deletes `paths`; paths already gone are fine.
async fn delete_paths(
    store: &Arc<dyn object_store::ObjectStore>,
    paths: Vec<object_store::Result<Path>>,
) -> WalResult<()> {
    let results: Vec<object_store::Result<Path>> = store
        .delete_stream(futures::stream::iter(paths).boxed())
        .collect()
        .await;
    for r in results {
        match r {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_key_names_exactly_one_stream() {
        let key = |k: &str| Path::from(k);
        assert_eq!(
            segment_stream(&key("seg/t1-b1/00000000000000000000-3-ab")),
            Some("t1-b1")
        );
        assert_eq!(
            segment_stream(&key("seg/t1-b10/00000000000000000000-3-ab")),
            Some("t1-b10")
        );
        assert_eq!(segment_stream(&key("seg/t1-b1/x/y")), None);
        assert_eq!(segment_stream(&key("wal/n/1/2")), None);
        assert_eq!(segment_stream(&key("seg/t1-b1")), None);
    }

    /// Size-tiered merging on a stream that gets one small segment per round: the
    /// number of segments stays bounded and no byte is rewritten more than
    /// log2(max / smallest) + 1 times.
    #[test]
    fn merging_bounds_segments_and_rewrites() {
        for (fanin, max) in [(8usize, 1_000u64), (4, 1_000), (8, 64), (2, 500)] {
            let mut segments: Vec<SegmentMeta> = Vec::new();
            let (mut written, mut rewritten, mut most) = (0u64, 0u64, 0usize);
            for round in 0..20_000u64 {
                segments.push(SegmentMeta {
                    key: format!("{round}"),
                    base: round,
                    end: round + 1,
                    bytes: 1,
                    min_timestamp_ms: 0,
                    max_timestamp_ms: 0,
                });
                written += 1;
                // One merge per round, as compaction does per stream.
                if let Some(run) = merge_run(&segments, fanin, max) {
                    let merged = SegmentMeta {
                        key: format!("m{round}"),
                        base: segments[run.start].base,
                        end: segments[run.end - 1].end,
                        bytes: segments[run.clone()].iter().map(|s| s.bytes).sum(),
                        min_timestamp_ms: 0,
                        max_timestamp_ms: 0,
                    };
                    rewritten += merged.bytes;
                    segments.splice(run, [merged]);
                }
                most = most.max(segments.len());
                assert!(segments.iter().all(|s| s.bytes <= max));
            }
            let levels = (max as f64).log2().ceil() as u64 + 1;
            let bound = 2 * written as usize / max as usize + fanin * levels as usize;
            assert!(
                segments.len() <= bound,
                "fanin {fanin} max {max}: {} segments > {bound}",
                segments.len()
            );
            assert!(
                rewritten <= written * levels,
                "fanin {fanin} max {max}: rewrote {rewritten} of {written}"
            );
            // Nothing that could merge is left unmerged for long.
            assert!(most <= bound + fanin, "{most}");
        }
    }

    #[test]
    fn nothing_merges_without_a_fanin() {
        let seg = |i: u64| SegmentMeta {
            key: format!("{i}"),
            base: i,
            end: i + 1,
            bytes: 1,
            min_timestamp_ms: 0,
            max_timestamp_ms: 0,
        };
        let many: Vec<SegmentMeta> = (0..100).map(seg).collect();
        assert_eq!(merge_run(&many, 0, 1_000), None);
        assert_eq!(merge_run(&many[..7], 8, 1_000), None);
        assert_eq!(merge_run(&many[..8], 8, 1_000), Some(0..8));
        // Too big together: no run fits.
        assert_eq!(merge_run(&many, 8, 7), None);
    }
}
