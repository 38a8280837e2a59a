//! Configuration of KV tablets.

use serde::{Deserialize, Serialize};

/// The local store behind KV tablets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvBackend {
    /// fjall, an LSM tree (default).
    #[default]
    Fjall,
    /// redb, a B-tree.
    Redb,
}

impl KvBackend {
    /// Whether this build has the backend (both are cargo features, on by default).
    pub fn is_compiled_in(self) -> bool {
        match self {
            KvBackend::Fjall => cfg!(feature = "fjall"),
            KvBackend::Redb => cfg!(feature = "redb"),
        }
    }
}

/// The default of `kv.prewrite_buffer_bytes_max`.
pub const DEFAULT_WRITE_BACK_BYTES: u64 = 32 << 20;

/// KV tablet settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvConfig {
    /// `fjall` (default) or `redb`.
    pub backend: KvBackend,
    /// How often each KV tablet writes a snapshot to object storage, in milliseconds;
    /// also the most age a snapshot served to readers (the `Snapshot` ticket,
    /// `latest_kv_snapshot`) may have before a read writes a new one. Default 600,000
    /// (10 minutes).
    pub snapshot_interval_ms: u64,
    /// Snapshots kept per bucket. Default 2.
    pub snapshots_retained: u32,
    /// Bytes of rows a KV tablet holds in memory ahead of its local store: rows
    /// waiting for durability, and durable rows kept as a write-back cache (the newest
    /// version of each key recently written). Durable rows go to the store once the
    /// buffer holds more than this or this much was written since the last store
    /// write; each key's newest version is written once however often the key
    /// changed. Past the bound the rows the store has leave the buffer. While the
    /// store is written, Puts go on until the buffer holds twice this (so a replay
    /// after a crash reads back up to about twice this much). 0 writes the store after
    /// every Put.
    /// Default 32 MiB.
    pub prewrite_buffer_bytes_max: u64,
    /// Bytes the prewrite buffers of all of a node's KV tablets may hold together: a
    /// Put that finds them past it has its tablet write its durable rows to the store
    /// and let them go. Default 256 MiB.
    pub prewrite_buffers_bytes_max: u64,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            backend: KvBackend::Fjall,
            snapshot_interval_ms: 600_000,
            snapshots_retained: 2,
            prewrite_buffer_bytes_max: DEFAULT_WRITE_BACK_BYTES,
            prewrite_buffers_bytes_max: 256 << 20,
        }
    }
}

impl KvConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !self.backend.is_compiled_in() {
            return Err(format!(
                "kv.backend: this build was compiled without the {:?} feature",
                self.backend
            ));
        }
        if self.snapshots_retained == 0 {
            return Err("kv.snapshots_retained must be at least 1".into());
        }
        Ok(())
    }
}

/// Opens the configured backend in `dir`.
pub fn open_kv_store(
    backend: KvBackend,
    dir: &std::path::Path,
) -> mink_types::Result<std::sync::Arc<dyn crate::store::KvStore>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| crate::store::store_error(format!("cannot create {}: {e}", dir.display())))?;
    match backend {
        #[cfg(feature = "fjall")]
        KvBackend::Fjall => Ok(std::sync::Arc::new(crate::fjall_store::FjallStore::open(
            dir,
        )?)),
        #[cfg(feature = "redb")]
        KvBackend::Redb => Ok(std::sync::Arc::new(crate::redb_store::RedbStore::open(
            dir,
        )?)),
        #[allow(unreachable_patterns)]
        other => Err(mink_types::MinkError::invalid(
            "kv.backend",
            format!("{other:?} is not compiled into this build"),
        )),
    }
}
