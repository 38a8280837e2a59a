//! Opening a stream: create, reopen after a clean close, move it to a newer epoch in
//! place, or take it over from an owner that did not close it (fence its WAL, recover
//! the stream's records from it).
//!
//! Every decision is taken against a fresh view of the stream-metadata log, and an
//! open whose outcome is unknown (a proposal that failed ambiguously, a caller that
//! went away mid-open) is resolved by the next open reading the log, never assumed:
//! a stream the log says this WAL writer owns but that is not installed here is a
//! *ghost* of a landed open and is adopted. No local stream that may have appended
//! is ever dropped while the log says this writer owns it, so a ghost holds no record
//! in this writer's WAL. Opens of one stream on one node are serialized.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::meta::{Expected, StreamMeta, WalId};
use super::remembered::StreamMemory;
use super::writer::{wal_dir, wal_path};
use super::{Status, StoreInner, Stream, StreamCommand, StreamInner, StreamState, propose};
use crate::error::{WalError, WalResult};
use crate::format::{Record, WalObject, decode_wal_object};

/// Attempts of the open loop before giving up (each retry follows a concurrent
/// change of the stream's metadata or an unresolved proposal).
const TAKEOVER_ATTEMPTS_MAX: u32 = 16;

/// Bytes of WAL objects one takeover may have in flight while recovering a stream:
/// it reads `RECOVERY_BYTES / group_bytes_max` objects at once (each up to
/// `group_bytes_max`, held until applied), from `RECOVERY_GETS_MIN` to
/// `RECOVERY_GETS_MAX`. A takeover's time on a slow store is nearly all these reads
/// (docs/reliability.md): with 8 MiB groups, 8 at once.
const RECOVERY_BYTES: u64 = 64 << 20;
const RECOVERY_GETS_MIN: usize = 2;
const RECOVERY_GETS_MAX: usize = 16;

/// How many WAL objects a takeover reads at once, for groups of `group_bytes_max`.
fn recovery_gets(group_bytes_max: u64) -> usize {
    ((RECOVERY_BYTES / group_bytes_max.max(1)) as usize).clamp(RECOVERY_GETS_MIN, RECOVERY_GETS_MAX)
}

/// Bytes of WAL objects all the takeovers of one node may hold at once (a failed
/// node's buckets all move at once, and each takeover holds up to `RECOVERY_BYTES`):
/// four takeovers' worth. Each object read takes one of `recovery_budget` permits,
/// from before its GET until it is decoded; a takeover takes its permits in the order
/// of its objects, so the one it waits on first always holds its own (no takeover
/// holding permits can be stuck behind another's).
const RECOVERY_NODE_BYTES: u64 = 4 * RECOVERY_BYTES;

/// Permits of a node's recovery budget, for groups of `group_bytes_max`: at least as
/// many as one takeover reads at once.
pub(super) fn recovery_budget(group_bytes_max: u64) -> usize {
    ((RECOVERY_NODE_BYTES / group_bytes_max.max(1)) as usize)
        .clamp(RECOVERY_GETS_MIN, 4 * RECOVERY_GETS_MAX)
        .max(recovery_gets(group_bytes_max))
}

/// The pause before the next attempt after `attempt` failed ones.
fn retry_pause(attempt: u32) -> Duration {
    Duration::from_millis((5u64 << attempt.min(7)).min(500))
}

/// A stream open that takes this long is logged with its phases.
const SLOW_OPEN: Duration = Duration::from_secs(1);

/// Where a stream open spent its time, summed over its attempts (logged for a slow
/// one: on a slow store the takeover's phases are what bounds recovery).
#[derive(Default)]
struct Phases {
    attempts: u32,
    catch_up: Duration,
    fence: Duration,
    read: Duration,
    objects_read: u64,
    /// WAL objects whose records came from memory (`remembered`), not read.
    objects_remembered: u64,
    segment: Duration,
    propose: Duration,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// What one pass of the open loop concluded.
enum Step {
    Done(Stream),
    /// The view was stale or the outcome unknown: read the log and decide again.
    Retry,
}

pub(super) async fn open_stream(
    store: &Arc<StoreInner>,
    name: &str,
    epoch: u64,
) -> WalResult<Stream> {
    if name.is_empty() || name.contains('/') || name.len() > 512 {
        return Err(WalError::Config(format!(
            "stream name {name:?} must be 1 to 512 bytes without '/'"
        )));
    }
    if let Some(e) = store.writer.failure() {
        return Err(e);
    }
    let started = Instant::now();
    let lock = store.open_lock(name);
    let _serialized = lock.lock().await;
    let queued = started.elapsed();
    let mut phases = Phases::default();
    let opened = open_attempts(store, name, epoch, &mut phases).await;
    let took = started.elapsed();
    if took >= SLOW_OPEN {
        tracing::info!(
            stream = name,
            epoch,
            ok = opened.is_ok(),
            took_ms = ms(took),
            queued_ms = ms(queued),
            attempts = phases.attempts,
            catch_up_ms = ms(phases.catch_up),
            fence_ms = ms(phases.fence),
            read_ms = ms(phases.read),
            objects_read = phases.objects_read,
            objects_remembered = phases.objects_remembered,
            segment_ms = ms(phases.segment),
            propose_ms = ms(phases.propose),
            "a slow stream open"
        );
    }
    opened
}

async fn open_attempts(
    store: &Arc<StoreInner>,
    name: &str,
    epoch: u64,
    phases: &mut Phases,
) -> WalResult<Stream> {
    let mut last_error: Option<WalError> = None;
    for attempt in 0..TAKEOVER_ATTEMPTS_MAX {
        if attempt > 0 {
            tokio::time::sleep(retry_pause(attempt)).await;
        }
        if let Some(e) = store.writer.failure() {
            return Err(e);
        }
        phases.attempts += 1;
        match open_once(store, name, epoch, phases).await {
            Ok(Step::Done(stream)) => return Ok(stream),
            Ok(Step::Retry) => {}
            // Storage trouble: the outcome of what we proposed is unknown; the next
            // pass resolves it from the log.
            Err(WalError::Storage(e)) => {
                tracing::debug!(stream = name, epoch, "open attempt failed: {e}");
                last_error = Some(WalError::Storage(e));
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        WalError::Storage(format!(
            "stream {name}: gave up after {TAKEOVER_ATTEMPTS_MAX} concurrent changes while opening"
        ))
    }))
}

/// One pass: catch up, look at the stream as the log and this node know it, act.
async fn open_once(
    store: &Arc<StoreInner>,
    name: &str,
    epoch: u64,
    phases: &mut Phases,
) -> WalResult<Step> {
    let caught_up = Instant::now();
    store.meta.catch_up().await?;
    phases.catch_up += caught_up.elapsed();
    // A WAL another node fenced (or a newer generation of this node replaced) opens
    // nothing: fail now, so that the node replaces it, rather than after a takeover's
    // fence and reads, at the proposal. An idle writer learns of its fence only here:
    // it meets the fence object at its next upload, which may never come (chaos seed
    // 76: a node whose buckets had all moved away took over a dead node's streams on
    // a WAL fenced 17 s before, read 315 objects for each, and had every open refused).
    if store.meta.read(|s, _| s.retired(&store.wal)) {
        let err = WalError::Fenced(format!(
            "stream {name}: WAL {} is fenced or replaced by a newer generation; it opens nothing",
            store.wal
        ));
        store.writer.retire(err.clone());
        return Err(err);
    }
    let current = store.meta.read(|s, _| s.streams.get(name).cloned());
    let ours = current
        .as_ref()
        .is_some_and(|m| m.owner.as_ref() == Some(&store.wal));
    let local = store.lock_streams().get(name).cloned();
    if let Some(local) = local {
        if let (true, Some(meta)) = (ours, &current) {
            return reopen_local(store, local, epoch, meta, phases).await;
        }
        // Taken over or closed since: the local stream is stale. Whatever it
        // acknowledged was recovered by the takeover (our WAL was fenced first) or is
        // in the segments of its close.
        let local_epoch = {
            let mut state = local.lock();
            if !matches!(state.status, Status::Failed(_)) {
                state.status = Status::Failed(WalError::Fenced(format!(
                    "stream {name} was taken over after epoch {}",
                    state.epoch
                )));
            }
            state.epoch
        };
        tracing::info!(stream = name, local_epoch, "dropping a stale local stream");
        store.remove_stream(name, &local);
    }
    let Some(meta) = current else {
        return create_or_take_over(store, name, epoch, None, phases).await;
    };
    if ours {
        // A ghost: our open landed but was never installed. Adopt it.
        if epoch < meta.epoch {
            return Err(WalError::Fenced(format!(
                "stream {name} was opened under epoch {}; {epoch} is older",
                meta.epoch
            )));
        }
        tracing::info!(stream = name, epoch = meta.epoch, "adopting a landed open");
        let inner = install(store, name, meta.epoch, &meta);
        store.forget_remembered(name);
        if epoch == meta.epoch {
            return Ok(Step::Done(Stream { inner }));
        }
        return reopen_local(store, inner, epoch, &meta, phases).await;
    }
    if epoch <= meta.epoch {
        return Err(WalError::Fenced(format!(
            "stream {name} was opened under epoch {}; {epoch} is not newer",
            meta.epoch
        )));
    }
    create_or_take_over(store, name, epoch, Some(meta), phases).await
}

/// Creates the stream, reopens it after a clean close, or takes it over from its
/// owner (fence, recover, write what was recovered as a segment), then proposes the
/// open. Installs it when the open landed.
async fn create_or_take_over(
    store: &Arc<StoreInner>,
    name: &str,
    epoch: u64,
    current: Option<StreamMeta>,
    phases: &mut Phases,
) -> WalResult<Step> {
    let recovered = match current
        .as_ref()
        .and_then(|m| m.owner.clone().map(|o| (m, o)))
    {
        Some((meta, owner)) => match recover(store, name, meta, &owner, epoch, phases).await? {
            Some(records) => records,
            None => return Ok(Step::Retry),
        },
        None => vec![],
    };
    let written = Instant::now();
    let segment = if recovered.is_empty() {
        None
    } else {
        Some(super::compact::write_segment(store, name, epoch, &recovered).await?)
    };
    phases.segment += written.elapsed();
    let wal_from = store.writer.oldest_unacked.load(Ordering::SeqCst);
    let command = StreamCommand::Open {
        stream: name.to_string(),
        epoch,
        owner: store.wal.clone(),
        wal_from,
        expected: current.as_ref().map(Expected::of),
        recovered: segment.clone(),
    };
    let proposed = Instant::now();
    let outcome = propose(store, &command).await;
    phases.propose += proposed.elapsed();
    match outcome? {
        Ok(_) => {
            let meta = store
                .meta
                .read(|s, _| s.streams.get(name).cloned())
                .ok_or_else(|| {
                    WalError::Corrupt(format!("stream {name} vanished after its open"))
                })?;
            let inner = install(store, name, epoch, &meta);
            store.forget_remembered(name);
            if let Some(seg) = &segment {
                tracing::info!(
                    stream = name,
                    epoch,
                    from = seg.base,
                    to = seg.end,
                    objects_read = phases.objects_read,
                    objects_remembered = phases.objects_remembered,
                    "recovered records from the previous owner's WAL"
                );
            }
            Ok(Step::Done(Stream { inner }))
        }
        Err(why) if why.contains("changed during the takeover") => {
            tracing::debug!(stream = name, "open raced: {why}");
            Ok(Step::Retry)
        }
        // Perhaps our own earlier proposal, which landed late: the next pass adopts
        // it, or reports a newer epoch as Fenced.
        Err(why) if why.contains("is not newer") => Ok(Step::Retry),
        // This WAL is done (fenced, or replaced by a newer generation of this node).
        Err(why) if store.meta.read(|s, _| s.retired(&store.wal)) => {
            let err = WalError::Fenced(format!("open of {name} refused: {why}"));
            retire_if_retired(store, &err);
            Err(err)
        }
        Err(why) => Err(WalError::Corrupt(format!("open of {name} rejected: {why}"))),
    }
}

fn install(store: &Arc<StoreInner>, name: &str, epoch: u64, meta: &StreamMeta) -> Arc<StreamInner> {
    let end = meta.committed_end;
    let inner = Arc::new(StreamInner {
        name: name.to_string(),
        state: Mutex::new(StreamState {
            epoch,
            status: Status::Open,
            next_offset: end,
            acked_end: end,
            start_offset: meta.start_offset,
            committed_end: end,
            committed_wal_from: meta.wal_from,
            segments: meta.segments.clone(),
            held: VecDeque::new(),
            held_bytes: 0,
        }),
        acked: tokio::sync::watch::channel(end).0,
        store: store.clone(),
    });
    store.lock_streams().insert(name.to_string(), inner.clone());
    inner
}

/// The stream is open here and the log says this writer owns it (`current`): return
/// it under `epoch`, moving it there in place when `epoch` is newer.
async fn reopen_local(
    store: &Arc<StoreInner>,
    local: Arc<StreamInner>,
    epoch: u64,
    current: &StreamMeta,
    phases: &mut Phases,
) -> WalResult<Step> {
    let name = local.name.clone();
    {
        let mut state = local.lock();
        if let Status::Failed(e) = &state.status {
            return Err(e.clone());
        }
        if epoch == current.epoch {
            // A close whose outcome is unknown may still land: only a write of our own
            // to the log (a newer epoch, or the close again) can settle it, so the
            // stream may not be reopened as it is.
            // Not a storage error: retried here, it held the open lock for seconds, and
            // the node's ghost sweep asks again every second, so the compactor's
            // settling of the close (`settle_closes`) never got the lock.
            if state.status == Status::Closing {
                return Err(WalError::Closed(format!(
                    "stream {name} has a close whose outcome is unknown: close it again, \
                     or open it under a newer epoch"
                )));
            }
            // Already there: a retried open, or an earlier move whose proposal landed
            // although its caller saw an error.
            state.epoch = epoch;
            drop(state);
            return Ok(Step::Done(Stream { inner: local }));
        }
        if epoch < current.epoch {
            return Err(WalError::Fenced(format!(
                "stream {name} is open under epoch {}; {epoch} is not newer",
                current.epoch
            )));
        }
    }
    let command = StreamCommand::Open {
        stream: name.clone(),
        epoch,
        owner: store.wal.clone(),
        wal_from: current.wal_from,
        expected: Some(Expected::of(current)),
        recovered: None,
    };
    let proposed = Instant::now();
    let outcome = propose(store, &command).await;
    phases.propose += proposed.elapsed();
    match outcome? {
        Ok(_) => {
            let mut state = local.lock();
            state.epoch = epoch;
            if state.status == Status::Closing {
                state.status = Status::Open;
            }
            drop(state);
            Ok(Step::Done(Stream { inner: local }))
        }
        // Compacted or taken over meanwhile, or our own earlier proposal landed late:
        // decide again from a fresh view.
        Err(why) if why.contains("changed during the takeover") || why.contains("is not newer") => {
            Ok(Step::Retry)
        }
        Err(why) => {
            let err = WalError::Fenced(format!("reopen of {name} under epoch {epoch}: {why}"));
            retire_if_retired(store, &err);
            Err(err)
        }
    }
}

/// When the log says this WAL is done (fenced, or replaced by a newer generation of
/// this node), the writer fails now, so that the node replaces it, rather than at an
/// upload that may never come (an idle writer never meets its fence).
fn retire_if_retired(store: &Arc<StoreInner>, err: &WalError) {
    if store.meta.read(|s, _| s.retired(&store.wal)) {
        store.writer.retire(err.clone());
    }
}

/// Fences `owner`'s WAL (once; the metadata log records where) and returns the
/// stream's records it holds above the compacted end, checked contiguous. `None`
/// when the view was stale (an object below the fence is gone because the owner
/// compacted meanwhile): read the log and try again.
async fn recover(
    store: &Arc<StoreInner>,
    name: &str,
    meta: &StreamMeta,
    owner: &WalId,
    epoch: u64,
    phases: &mut Phases,
) -> WalResult<Option<Vec<Record>>> {
    let fenced = Instant::now();
    let fence = fence(store, owner, epoch, name, meta).await;
    phases.fence += fenced.elapsed();
    let Some(fence) = fence? else {
        return Ok(None);
    };
    let read = Instant::now();
    let memory = store.remembered(owner, name, meta.committed_end);
    let mut records =
        read_owner_wal(store, name, meta, owner, fence, memory.as_ref(), phases).await;
    if let Some((_, memory)) = &memory {
        records = check_remembered(store, name, meta, owner, fence, memory, records, phases).await;
    }
    phases.read += read.elapsed();
    records
}

/// Memory is the fast path, never the last word: a recovery from memory that does
/// not line up (a record where another was expected) or ends short of what the
/// failed generation acknowledged reads the WAL after all; debug builds read it every
/// time and check that both agree.
#[expect(
    clippy::too_many_arguments,
    reason = "the takeover's state, passed through"
)]
async fn check_remembered(
    store: &Arc<StoreInner>,
    name: &str,
    meta: &StreamMeta,
    owner: &WalId,
    fence: u64,
    memory: &StreamMemory,
    remembered: WalResult<Option<Vec<Record>>>,
    phases: &mut Phases,
) -> WalResult<Option<Vec<Record>>> {
    let why = match remembered {
        Ok(Some(records)) => {
            let end = records.last().map_or(meta.committed_end, Record::end);
            if end >= memory.acked_end {
                #[cfg(debug_assertions)]
                cross_check(store, name, meta, owner, fence, &records).await;
                return Ok(Some(records));
            }
            format!(
                "they end at {end}, short of {} acknowledged",
                memory.acked_end
            )
        }
        Err(WalError::Corrupt(why)) => why,
        other => return other,
    };
    let read = read_owner_wal(store, name, meta, owner, fence, None, phases).await;
    if let Ok(Some(_)) = &read {
        metrics::counter!("mink_wal_recovery_memory_mismatches_total").increment(1);
        tracing::warn!(
            stream = name,
            %owner,
            "the records remembered from the failed generation were wrong ({why}); \
             recovered from its WAL instead"
        );
    }
    read
}

/// Debug builds: the records taken from memory are the WAL's, as long as the stream's
/// metadata is still what the takeover saw (otherwise the open is refused anyway, and
/// the WAL may legitimately read otherwise: a slot freed by a newer commit).
#[cfg(debug_assertions)]
async fn cross_check(
    store: &Arc<StoreInner>,
    name: &str,
    meta: &StreamMeta,
    owner: &WalId,
    fence: u64,
    remembered: &[Record],
) {
    let mut phases = Phases::default();
    let read = read_owner_wal(store, name, meta, owner, fence, None, &mut phases).await;
    let Ok(Some(read)) = read else {
        return;
    };
    if store.meta.catch_up().await.is_err() {
        return;
    }
    let unchanged = store.meta.read(|s, _| {
        s.streams.get(name).is_some_and(|m| {
            m.owner.as_ref() == Some(owner)
                && m.committed_end == meta.committed_end
                && m.wal_from == meta.wal_from
        })
    });
    if unchanged {
        assert_eq!(
            remembered, read,
            "stream {name}: the records remembered from {owner} differ from its WAL's"
        );
    }
}

/// Where the stream's records in one WAL object come from.
enum Source {
    /// Read the object (shared with the other takeovers of this WAL on this node).
    Read(
        object_store::path::Path,
        Result<bytes::Bytes, object_store::Error>,
    ),
    /// The failed generation this one replaced acknowledged the object: its records
    /// of the stream, from memory (`remembered`).
    Remembered(Vec<Record>),
}

/// The stream's records in `owner`'s WAL from the stream's `wal_from` up to `fence`:
/// read from the store, or, for the objects `memory` covers (the uploads our own
/// failed generation acknowledged, below its first unknown one), from memory.
async fn read_owner_wal(
    store: &Arc<StoreInner>,
    name: &str,
    meta: &StreamMeta,
    owner: &WalId,
    fence: u64,
    memory: Option<&(u64, StreamMemory)>,
    phases: &mut Phases,
) -> WalResult<Option<Vec<Record>>> {
    let mut records: Vec<Record> = Vec::new();
    let mut expected = meta.committed_end;
    // Which objects to read, and what memory answers for the others: an
    // acknowledged object holding none of the stream's records is skipped.
    let sources = (meta.wal_from..fence).filter_map(|seq| match memory {
        Some((unknown_from, memory)) if seq < *unknown_from => match memory.by_seq.get(&seq) {
            None => None,
            Some(Some(records)) => Some((seq, Some(records.clone()))),
            // A payload evicted from memory: read the object.
            Some(None) => Some((seq, None)),
        },
        _ => Some((seq, None)),
    });
    // Read `recovery_gets` objects at a time, taken in order (one after another took
    // seconds on a slow store for a WAL of a few hundred objects), each under a permit
    // of the node's recovery budget taken in order before its GET and held until it is
    // decoded; objects fetched ahead of a fence object are dropped without being
    // decoded.
    let budget = store.recovery_budget.clone();
    let objects = futures::stream::iter(sources)
        .then(move |(seq, remembered)| {
            let budget = budget.clone();
            async move {
                let permit = match remembered {
                    Some(_) => None,
                    // The semaphore is never closed.
                    None => budget.acquire_owned().await.ok(),
                };
                (seq, remembered, permit)
            }
        })
        .map(|(seq, remembered, permit)| async move {
            let source = match remembered {
                Some(records) => Source::Remembered(records),
                None => {
                    let path = wal_path(owner, seq);
                    let got = store.recovery_reads.get(&store.store, &path).await;
                    Source::Read(path, got)
                }
            };
            (seq, source, permit)
        })
        .buffered(recovery_gets(store.config.group_bytes_max));
    let mut objects = std::pin::pin!(objects);
    while let Some((seq, source, _permit)) = objects.next().await {
        let found = match source {
            Source::Remembered(records) => {
                phases.objects_remembered += 1;
                records
            }
            Source::Read(path, got) => {
                phases.objects_read += 1;
                let bytes = match got {
                    Ok(bytes) => bytes,
                    Err(object_store::Error::NotFound { .. }) => {
                        // A stale view (`Ok`: read the log and try again) or a loss.
                        missing(store, name, meta, owner, seq, fence).await?;
                        return Ok(None);
                    }
                    Err(e) => return Err(e.into()),
                };
                match decode_wal_object(path.as_ref(), &bytes)? {
                    WalObject::Fence(_) => break,
                    WalObject::Data(objects) => objects
                        .into_iter()
                        .filter(|r| r.stream == name)
                        .map(|r| r.record)
                        .collect(),
                }
            }
        };
        for record in found {
            if record.end() <= meta.committed_end {
                continue; // compacted already
            }
            if record.base != expected {
                return Err(WalError::Corrupt(format!(
                    "stream {name}: WAL {owner} holds offset {} where {expected} was expected",
                    record.base
                )));
            }
            expected = record.end();
            records.push(record);
        }
    }
    tracing::debug!(
        stream = name,
        %owner,
        wal_from = meta.wal_from,
        fence,
        committed_end = meta.committed_end,
        records = records.len(),
        to = expected,
        "read the previous owner's WAL"
    );
    Ok(Some(records))
}

/// WAL object `seq` of `owner`, below the fence at `fence`, is missing: deleted under
/// a newer commit of the owner (`Ok`: the view was stale), or a true loss (`Corrupt`).
/// Only a fresh view tells.
async fn missing(
    store: &Arc<StoreInner>,
    name: &str,
    meta: &StreamMeta,
    owner: &WalId,
    seq: u64,
    fence: u64,
) -> WalResult<()> {
    store.meta.catch_up().await?;
    let moved = store.meta.read(|s, _| {
        s.wal_floor(owner) > seq
            || s.streams.get(name).is_none_or(|m| {
                m.wal_from > seq
                    || m.committed_end != meta.committed_end
                    || m.owner.as_ref() != Some(owner)
            })
    });
    if moved {
        return Ok(());
    }
    Err(WalError::Corrupt(format!(
        "WAL object {} below the fence at {fence} is missing",
        wal_path(owner, seq)
    )))
}

/// Where `owner`'s WAL is fenced: the recorded fence, or a new fence object at the
/// first missing sequence at or above the owner's fence floor (its WAL floor and
/// every owned stream's `wal_from`: below it objects may have been deleted, and a
/// fence in a deleted slot would never be met). The state machine refuses a fence
/// below the floor of the moment it is recorded; `None` then asks for a fresh view.
async fn fence(
    store: &Arc<StoreInner>,
    owner: &WalId,
    epoch: u64,
    stream: &str,
    seen: &StreamMeta,
) -> WalResult<Option<u64>> {
    // A fence already recorded in this node's view is the fence: no lock, no catch-up
    // (a dead node's takeovers queued here one behind another, each catching up the
    // stream metadata first: fence phases of 5-10 s in chaos seed 84). A view that is
    // stale otherwise (the stream compacted or closed since) is caught by the reads
    // below the fence and by the Open's check of the stream's metadata.
    if let Some(at) = store
        .meta
        .read(|s, _| s.fences.get(&owner.to_string()).copied())
    {
        return Ok(Some(at));
    }
    let lock = store.fence_lock(owner);
    let mut last_failure = lock.lock().await;
    if let Some((at, e)) = last_failure.as_ref()
        && at.elapsed() < FENCE_FAILURE_SHARED_FOR
    {
        return Err(e.clone());
    }
    let fenced = fence_locked(store, owner, epoch, stream, seen).await;
    *last_failure = fenced.as_ref().err().map(|e| (Instant::now(), e.clone()));
    fenced
}

/// How long the takeovers queued behind a fence that failed fail with it.
const FENCE_FAILURE_SHARED_FOR: Duration = Duration::from_secs(1);

/// [`fence`], under the owner's fence lock.
async fn fence_locked(
    store: &Arc<StoreInner>,
    owner: &WalId,
    epoch: u64,
    stream: &str,
    seen: &StreamMeta,
) -> WalResult<Option<u64>> {
    for attempt in 0..TAKEOVER_ATTEMPTS_MAX {
        if attempt > 0 {
            tokio::time::sleep(retry_pause(attempt)).await;
        }
        store.meta.catch_up().await?;
        // The owner closed the stream (a handover) or compacted since our view: no
        // fence may be needed at all, and a live owner must not be fenced for nothing.
        let unchanged = store.meta.read(|s, _| {
            s.streams.get(stream).is_some_and(|m| {
                m.owner.as_ref() == Some(owner) && m.committed_end == seen.committed_end
            })
        });
        if !unchanged {
            return Ok(None);
        }
        let (recorded, from) = store.meta.read(|s, _| {
            (
                s.fences.get(&owner.to_string()).copied(),
                s.fence_floor(owner),
            )
        });
        if let Some(at) = recorded {
            return Ok(Some(at));
        }
        // The objects from the fence floor on (names sort as their numbers do):
        // the WAL below it may be long.
        let listed = match from.checked_sub(1) {
            Some(below) => store
                .store
                .list_with_offset(Some(&wal_dir(owner)), &wal_path(owner, below)),
            None => store.store.list(Some(&wal_dir(owner))),
        };
        let mut seqs: Vec<u64> = listed
            .try_filter_map(|m| async move {
                Ok(m.location.filename().and_then(|f| f.parse::<u64>().ok()))
            })
            .try_collect()
            .await?;
        seqs.sort_unstable();
        let mut at = from;
        for seq in seqs.into_iter().filter(|s| *s >= from) {
            if seq != at {
                break;
            }
            at += 1;
        }
        let who = serde_json::json!({"fenced_by": store.wal.to_string(), "stream": stream, "epoch": epoch}).to_string();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let path = wal_path(owner, at);
        match store
            .store
            .put_opts(
                &path,
                PutPayload::from(crate::format::encode_fence(&who)),
                opts,
            )
            .await
        {
            Ok(_) => {}
            // The owner (or another fencer) wrote `at` meanwhile: look again.
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            // Ambiguous: our fence may be there. Looking again is safe either way:
            // recovery stops at the first fence object it meets.
            Err(e) => {
                tracing::debug!(%owner, at, "writing a fence failed: {e}");
                continue;
            }
        }
        metrics::counter!("mink_wal_fences_written_total").increment(1);
        match propose(
            store,
            &StreamCommand::Fence {
                wal: owner.clone(),
                at,
            },
        )
        .await?
        {
            Ok(_) => {
                tracing::info!(%owner, at, stream, "fenced a WAL");
                return Ok(Some(at));
            }
            Err(why) => {
                // Someone recorded a fence first (the next pass uses theirs), or our
                // view was stale and the slot lies below the owner's floor: that
                // object is below everything anyone reads; remove it.
                tracing::debug!(%owner, at, "fence not recorded: {why}");
                if why.contains("below its floor") {
                    let _ = store.store.delete(&path).await;
                    return Ok(None);
                }
            }
        }
    }
    Err(WalError::Storage(format!("could not fence WAL {owner}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_recovery_reads_are_bounded_by_bytes_in_all() {
        assert_eq!(recovery_budget(8 << 20), 32);
        assert_eq!(recovery_budget(1 << 20), 4 * RECOVERY_GETS_MAX);
        assert_eq!(recovery_budget(1 << 30), RECOVERY_GETS_MIN);
        for group in [1, 4 << 20, 8 << 20, 32 << 20, 1 << 30] {
            assert!(recovery_budget(group) >= recovery_gets(group), "{group}");
        }
    }

    #[test]
    fn recovery_reads_are_bounded_by_bytes_in_flight() {
        assert_eq!(recovery_gets(8 << 20), 8);
        assert_eq!(recovery_gets(1 << 20), RECOVERY_GETS_MAX);
        assert_eq!(recovery_gets(1 << 30), RECOVERY_GETS_MIN);
        assert_eq!(recovery_gets(0), RECOVERY_GETS_MAX);
        for group in [1, 4 << 20, 8 << 20, 32 << 20] {
            assert!(recovery_gets(group) as u64 * group <= RECOVERY_BYTES.max(group * 2));
        }
    }

    /// A failed generation whose streams were taken over by its replacement is freed
    /// once released and dropped (its streams hold it, so without the release the two
    /// kept each other alive); the replacement keeps what it took over, and forgets
    /// the remembered records of each stream it took over.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_released_failed_generation_is_freed() {
        use crate::fault::{FaultConfig, FaultyStore};
        use crate::{StreamStore, WalConfig};
        let faulty = FaultyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig::default(),
        );
        let store: Arc<dyn object_store::ObjectStore> = Arc::new(faulty.clone());
        let config = || WalConfig {
            upload_retry_budget_ms: 0,
            compaction_interval_ms: 3_600_000,
            ..WalConfig::default()
        };
        let failed = StreamStore::open(store.clone(), "n", config())
            .await
            .unwrap();
        let s = failed.open_stream("s", 1).await.unwrap();
        s.append_durable(1, 1, 0, bytes::Bytes::from_static(b"kept"))
            .await
            .unwrap();
        faulty.fail_next_puts(1);
        assert!(
            s.append_durable(1, 1, 0, bytes::Bytes::from_static(b"lost"))
                .await
                .is_err()
        );
        let replacement = StreamStore::open_after(&failed, store, "n", config())
            .await
            .unwrap();
        assert_eq!(replacement.inner.lock_remembered().len(), 1);
        let taken = replacement.open_stream("s", 2).await.unwrap();
        assert_eq!(taken.durable_end(), 1);
        assert!(
            replacement.inner.lock_remembered().is_empty(),
            "every stream of it taken over"
        );
        let weak = Arc::downgrade(&failed.inner);
        failed.release();
        drop((s, failed));
        // The WAL writer task answers the failed append before it drops the append's
        // job, which holds the stream, which holds the service: on another worker
        // thread, a moment after the answer (a fresh-clone run saw it still held).
        for _ in 0..500 {
            if weak.upgrade().is_none() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(weak.upgrade().is_none(), "the failed generation is freed");
        assert_eq!(
            taken.read(0, 1 << 20).await.unwrap()[0].payload.as_ref(),
            b"kept"
        );
    }
}
