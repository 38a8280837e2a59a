//! `KvStore`: the local store behind KV tablets, one namespace per bucket.
//!
//! Every write is an atomic batch that also records the log offset it brings the
//! namespace up to (`flushed_offset`). The store is never fsynced: after a crash it is
//! consistent at *some* flushed offset, and the changelog replays from there.

use std::path::Path;
use std::sync::Arc;

use mink_types::{MinkError, Result};

use crate::config::KvBackend;

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
    /// Opens (creating if needed) the namespace `name` (`[A-Za-z0-9_-]+`).
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

/// Opens the configured backend in `dir`.
pub fn open_kv_store(backend: KvBackend, dir: &Path) -> Result<Arc<dyn KvStore>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| store_error(format!("cannot create {}: {e}", dir.display())))?;
    match backend {
        #[cfg(feature = "fjall")]
        KvBackend::Fjall => Ok(Arc::new(crate::fjall_store::FjallStore::open(dir)?)),
        #[cfg(feature = "redb")]
        KvBackend::Redb => Ok(Arc::new(crate::redb_store::RedbStore::open(dir)?)),
        #[allow(unreachable_patterns)]
        other => Err(MinkError::invalid(
            "kv.backend",
            format!("{other:?} is not compiled into this build"),
        )),
    }
}
