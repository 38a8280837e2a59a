//! `KvStore`: the local store behind KV tablets, one namespace per bucket.
//!
//! Every write is an atomic batch that also records the log offset it brings the
//! namespace up to (`flushed_offset`). The store is never fsynced: after a crash it is
//! consistent at *some* flushed offset, and the changelog replays from there.

use std::sync::{Arc, Mutex};

use mink_types::{MinkError, Result};

/// One change of a write batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// Key-value pairs in key order.
pub type KvPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// A consistent iterator over a namespace.
pub type PairIter = Box<dyn Iterator<Item = Result<(Vec<u8>, Vec<u8>)>> + Send>;

/// A store holding many namespaces.
pub trait KvStore: Send + Sync {
    /// Opens (creating if needed) the namespace `name` (`[A-Za-z0-9_-]+`). Every call
    /// for one name shares one [`Owner`].
    fn namespace(&self, name: &str) -> Result<Arc<dyn KvNamespace>>;
    /// Removes a namespace and its data.
    fn drop_namespace(&self, name: &str) -> Result<()>;
}

/// One bucket's keys and values.
pub trait KvNamespace: Send + Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;
    fn multi_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }
    /// Applies `ops` and records `flushed_offset`, atomically.
    fn write(&self, ops: &[KvOp], flushed_offset: i64) -> Result<()>;
    /// The offset the last write recorded; `None` for a fresh namespace.
    fn flushed_offset(&self) -> Result<Option<i64>>;
    /// Pairs with keys in `[start, end)` (`end` `None`: to the last), at most `limit`.
    fn range(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<KvPairs>;
    /// Pairs whose key starts with `prefix`, at most `limit`.
    fn prefix(&self, prefix: &[u8], limit: usize) -> Result<KvPairs>;
    /// Every pair, from one consistent snapshot, in key order.
    fn snapshot(&self) -> Result<PairIter>;
    /// Removes every pair and the flushed offset.
    fn clear(&self) -> Result<()>;
    /// Which tablet may write this namespace (shared by every handle of the name).
    fn owner(&self) -> &Owner;
    /// Whether a tablet's flushes (writes) should run beside its merges (reads) rather
    /// than between them. Yes for an LSM tree, whose writes and reads barely meet.
    fn flush_beside_merges(&self) -> bool {
        true
    }
}

/// Which KV tablet may write a namespace: the one that claimed it last, and never one
/// opened under an older epoch than the holder's.
///
/// A bucket's KV tablet can be opened again on the same local store while an older one
/// is still alive: a reopen after a failure or a leadership move while requests and
/// duties still hold the old tablet, two opens under different epochs racing, a WAL
/// replacement while an open on the old generation goes on. The store is a cache of the
/// log at one flushed offset, so a write by a superseded tablet (a late flush, a replay
/// from its older view) would put older rows over newer ones, under the newer
/// tablet's feet. Every write of a tablet (and every read that must be consistent
/// with its flushed offset) runs through its [`Claim`], under this lock, and is refused
/// once another tablet has claimed the namespace.
///
/// In memory only: it orders tablets of one process; after a restart the store is at
/// some flushed offset and the first tablet claims it.
#[derive(Debug)]
pub struct Owner {
    name: String,
    holder: Mutex<Holder>,
}

#[derive(Debug, Default)]
struct Holder {
    /// Claims made so far; the latest one holds the namespace.
    claims: u64,
    /// The epoch of the latest claim.
    epoch: u64,
}

/// One tablet's claim of a namespace ([`Owner::claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    epoch: u64,
    number: u64,
}

impl Owner {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            holder: Mutex::new(Holder::default()),
        }
    }

    fn holder(&self) -> std::sync::MutexGuard<'_, Holder> {
        self.holder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims the namespace for a tablet opened under `epoch`, superseding the holder;
    /// `Fenced` when the holder was opened under a newer epoch.
    pub fn claim(&self, epoch: u64) -> Result<Claim> {
        let mut holder = self.holder();
        if holder.claims > 0 && epoch < holder.epoch {
            return Err(MinkError::Fenced(format!(
                "KV namespace {}: held by a tablet under epoch {}, newer than {epoch}",
                self.name, holder.epoch
            )));
        }
        holder.claims += 1;
        holder.epoch = epoch;
        Ok(Claim {
            epoch,
            number: holder.claims,
        })
    }

    /// Runs `f` (a write, or reads that must agree with each other) for the holder of
    /// `claim`, with no other claimed work on the namespace meanwhile; `Fenced` once
    /// another tablet has claimed it.
    pub fn with<T>(&self, claim: Claim, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let holder = self.holder();
        if holder.claims != claim.number {
            return Err(MinkError::Fenced(format!(
                "KV namespace {}: the tablet under epoch {} was superseded by one under \
                 epoch {}",
                self.name, claim.epoch, holder.epoch
            )));
        }
        f()
    }
}

pub(crate) fn store_error(what: impl std::fmt::Display) -> MinkError {
    MinkError::Internal(format!("KV store: {what}"))
}

pub(crate) fn check_namespace(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 200
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(MinkError::invalid(
            "KV namespace",
            format!("{name:?} must be 1 to 200 of [A-Za-z0-9_-]"),
        ));
    }
    Ok(())
}

/// The smallest key greater than every key with this prefix, if any.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
