//! What a failed WAL generation of this node acknowledged, kept in memory for the
//! generation that replaces it.
//!
//! When a node's WAL writer fails (the store refused uploads past the retry budget,
//! or the WAL was fenced), the node opens a new generation in the same process and
//! takes its own streams over from the failed one: fence the failed WAL, recover each
//! stream's records from it, write them as a segment. Reading them back is one GET
//! per WAL object from the stream's `wal_from` to the fence, hundreds of objects on a
//! busy node: in chaos seed 66 on moto, 214 reads took 2.6–3.8 s of each bucket's
//! reopen (docs/reliability.md). Yet every record the failed writer *acknowledged*
//! is still in this process's memory, in its streams' held records.
//!
//! So [`Remembered::of`] takes, when the replacement starts, the failed writer's
//! first unacknowledged WAL sequence `unknown_from` and each stream's uncompacted
//! records by the WAL sequence that holds them. A takeover of one of those streams
//! then reads, for each sequence of `[wal_from, fence)`:
//!
//! - below `unknown_from`, the stream's records from memory, with no request; an
//!   object that holds none of the stream's records is not read at all. Where a
//!   record's payload was evicted from memory, the object is read as before.
//! - from `unknown_from` on, the object from the store, as before: those uploads
//!   have an unknown outcome (they may have landed after the writer gave up on
//!   them), and only the store tells: the uploads in flight when the writer failed,
//!   at most `inflight_uploads_max`, and the fence.
//!
//! Why memory equals the store below `unknown_from`:
//! - the writer calls `on_durable` for every record of an upload, in upload order,
//!   under the stream's lock, before it moves `oldest_unacked` (SeqCst) past that
//!   upload; so with `unknown_from` loaded first and each stream's lock taken after,
//!   every record of an object below `unknown_from` is in its stream's held records.
//!   An upload acknowledged while the snapshot is taken (a writer retired but not yet
//!   stopped, or one that has not failed) is at or above `unknown_from`: read;
//! - a held record loses its WAL position only in `committed`, under the same lock
//!   that moves the stream's `committed_end` past it; so when the remembered
//!   `committed_end` equals the one the takeover sees, the remembered records are
//!   exactly the stream's records in those objects above the compacted end. When
//!   they differ (a compaction landed that this view does not show, or the reverse),
//!   memory is not used and the takeover reads the WAL as before;
//! - no fence object lies below `unknown_from`: an upload that meets a fence is not
//!   acknowledged.
//!
//! Memory is the fast path, never the truth of last resort: records from memory go
//! through the same contiguity check as records read, and must reach the end of what
//! the failed generation acknowledged; a recovery that fails either falls back to
//! reading the WAL (counted as `mink_wal_recovery_memory_mismatches_total` when the
//! WAL then tells otherwise), and debug builds read the WAL as well and check that
//! both agree while the stream's metadata stayed as the takeover saw it.
//! What is remembered is the failed writer's held records (at most
//! `tail_cache_bytes_max` of payloads), kept until every stream is taken over or for
//! [`REMEMBERED_FOR`], whichever comes first.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::StoreInner;
use super::meta::WalId;
use crate::format::Record;

/// How long a failed generation's acknowledged records are kept for the takeovers
/// of its streams. Buckets reopen on their next request, busy ones within seconds;
/// an idle one reopened later reads the WAL as any takeover does.
pub(crate) const REMEMBERED_FOR: Duration = Duration::from_secs(300);

/// Failed generations a node keeps the records of at once: the one it just
/// replaced, and those that one still kept (a replacement that failed again before
/// every bucket reopened).
pub(crate) const REMEMBERED_MAX: usize = 4;

/// One stream's acknowledged, uncompacted records in the failed WAL.
#[derive(Clone, Debug)]
pub(crate) struct StreamMemory {
    /// The stream's compacted end as the failed generation knew it.
    pub committed_end: u64,
    /// The end of what it had acknowledged: a recovery from memory that ends short
    /// of it is wrong (each acknowledged record is in memory or in a landed upload).
    pub acked_end: u64,
    /// The stream's records by the WAL sequence holding them, in offset order, for
    /// sequences below [`Remembered::unknown_from`]; `None` where a payload was
    /// evicted from memory (the object is read).
    pub by_seq: BTreeMap<u64, Option<Vec<Record>>>,
}

/// A failed generation's acknowledged records (see the module documentation).
pub(crate) struct Remembered {
    pub wal: WalId,
    /// The first WAL sequence the failed writer did not acknowledge.
    pub unknown_from: u64,
    streams: Mutex<HashMap<String, StreamMemory>>,
    until: Instant,
}

impl Remembered {
    /// What `failed` acknowledged and has not compacted, per stream.
    pub(crate) fn of(failed: &StoreInner) -> Self {
        // Loaded before any stream's lock is taken: see the module documentation.
        let unknown_from = failed.writer.oldest_unacked.load(Ordering::SeqCst);
        let streams: Vec<_> = failed.lock_streams().values().cloned().collect();
        let mut remembered = HashMap::new();
        let mut records = 0usize;
        for stream in streams {
            let state = stream.lock();
            let mut by_seq: BTreeMap<u64, Option<Vec<Record>>> = BTreeMap::new();
            for held in &state.held {
                let Some((seq, _)) = &held.wal else {
                    continue; // compacted: below `committed_end`
                };
                if *seq >= unknown_from {
                    continue; // acknowledged meanwhile, or not at all: read
                }
                let slot = by_seq.entry(*seq).or_insert_with(|| Some(Vec::new()));
                match (&held.payload, slot.as_mut()) {
                    (Some(payload), Some(list)) => {
                        records += 1;
                        list.push(Record {
                            payload: payload.clone(),
                            ..held.record.clone()
                        });
                    }
                    // Evicted: this object is read.
                    _ => *slot = None,
                }
            }
            remembered.insert(
                stream.name.clone(),
                StreamMemory {
                    committed_end: state.committed_end,
                    acked_end: state.acked_end,
                    by_seq,
                },
            );
        }
        tracing::info!(
            wal = %failed.wal,
            unknown_from,
            streams = remembered.len(),
            records,
            "remembering what the failed WAL generation acknowledged"
        );
        Self {
            wal: failed.wal.clone(),
            unknown_from,
            streams: Mutex::new(remembered),
            until: Instant::now() + REMEMBERED_FOR,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StreamMemory>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `stream`'s memory when it is of `owner`'s WAL and agrees with the view being
    /// recovered from (`committed_end`), still kept.
    pub(crate) fn for_takeover(
        &self,
        owner: &WalId,
        stream: &str,
        committed_end: u64,
    ) -> Option<StreamMemory> {
        if &self.wal != owner || self.expired() {
            return None;
        }
        let memory = self.lock().get(stream).cloned()?;
        if memory.committed_end != committed_end {
            tracing::debug!(
                stream,
                remembered = memory.committed_end,
                seen = committed_end,
                "the remembered compacted end differs from the log's: reading the WAL"
            );
            return None;
        }
        Some(memory)
    }

    /// Forgets `stream` (taken over).
    pub(crate) fn forget(&self, stream: &str) {
        self.lock().remove(stream);
    }

    /// Keeps only the streams for which `keep` holds.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.lock().retain(|name, _| keep(name));
    }

    /// Whether nothing more is to be had from it.
    pub(crate) fn spent(&self) -> bool {
        self.expired() || self.lock().is_empty()
    }

    fn expired(&self) -> bool {
        Instant::now() >= self.until
    }
}
