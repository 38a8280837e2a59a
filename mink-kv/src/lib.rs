//! `mink-kv`: KV tablets of primary-key tables.
//!
//! - [`store`]: the `KvStore` trait, one namespace per bucket, with the fjall and redb
//!   backends (cargo features, both on by default; `kv.backend` chooses).
//!
//! Architecture invariant: the local store is a cache of the log, never a source of
//! truth. It is never fsynced; after a crash it is consistent at some flushed offset
//! and the changelog in the log tablet replays from there. mink-kv knows nothing of
//! leadership, metadata or protocols.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod config;
#[cfg(feature = "fjall")]
mod fjall_store;
pub mod merge;
mod prewrite;
mod recovery;
#[cfg(feature = "redb")]
mod redb_store;
pub mod row;
pub mod snapshot;
pub mod store;
pub mod tablet;

pub use config::{KvBackend, KvConfig, open_kv_store};
pub use prewrite::WriteBackBudget;
pub use snapshot::{SnapshotData, SnapshotInfo, SnapshotStore};
pub use store::{Claim, KvNamespace, KvOp, KvStore, Owner};
pub use tablet::{
    BeforeImages, KafkaBatch, KvTablet, LookupResult, PendingPut, PutRequest, StagingPause,
};
