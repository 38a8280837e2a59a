//! `mink-wal`: the object-storage toolkit Mink's durability rests on.
//!
//! It owns opening object stores from a URL ([`store`]) and, as it grows, the
//! `ObjectLog` (a totally ordered log of objects appended by conditional create) and
//! s3stream (streams with epochs, a group-commit WAL, fencing, recovery, compaction
//! into segments, range reads and trim).
//!
//! Architecture invariant: mink-wal knows nothing of tables, buckets, Arrow or any
//! protocol. Its unit is a stream of opaque records with offsets; another project can
//! use it on its own. It depends on object_store, tokio and bytes, never on another
//! Mink crate.

pub mod config;
pub mod error;
pub mod fault;
pub mod format;
pub mod objectlog;
pub mod store;
pub mod stream;

pub use config::{ObjectStoreConfig, WalConfig};
pub use error::{WalError, WalResult};
pub use format::Record;
pub use objectlog::{Appended, LogState, ObjectLog, ObjectLogOptions};
pub use store::open_object_store;
pub use stream::{PendingAppend, Reservation, Stream, StreamStore, WalId};
