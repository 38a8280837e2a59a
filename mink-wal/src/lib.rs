//! `mink-wal`: the object-storage toolkit Mink's durability rests on.
//!
//! - [`store`]: object stores from a URL; [`fault`]: a seeded fault and latency
//!   injecting wrapper for tests and benchmarks; [`accounting`]: every request
//!   counted by operation and purpose, with one tagged handle per component.
//! - [`objectlog`]: `ObjectLog`, a totally ordered log of objects appended by
//!   conditional create, feeding a deterministic state machine.
//! - [`stream`]: s3stream — streams with epochs, one group-commit WAL per node with
//!   acks in upload order, fencing, recovery, compaction into indexed segments, reads
//!   and trim. [`format`] holds the byte formats of its objects; [`crc`] combines
//!   CRC32Cs.
//!
//! Architecture invariant: mink-wal knows nothing of tables, buckets, Arrow or any
//! protocol. Its unit is a stream of opaque records with offsets; another project can
//! use it on its own. It depends on object_store, tokio and bytes, never on another
//! Mink crate.
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod accounting;
pub mod config;
pub mod crc;
pub mod error;
pub mod fault;
pub mod format;
pub mod objectlog;
pub mod store;
pub mod stream;

pub use accounting::{Accounting, AccountingReport, Op, Purpose, Stores};
pub use config::{
    DEFAULT_BUDGET_LINGER_MS, DEFAULT_PUT_RATE_MAX, ObjectStoreConfig, REDACTED, WalConfig,
};
pub use error::{WalError, WalResult};
pub use format::Record;
pub use objectlog::{Appended, LogState, ObjectLog, ObjectLogOptions};
pub use store::open_object_store;
pub use stream::{Cork, PendingAppend, Reservation, Scan, Stream, StreamStore, WalId};

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;
