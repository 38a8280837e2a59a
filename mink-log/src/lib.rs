//! `mink-log`: the log tablet of one bucket.
//!
//! - [`batch`]: the batch format — a fixed binary header (offsets, commit timestamp,
//!   leader epoch, schema id, writer and sequences, change types) and the Arrow IPC
//!   record batch without its schema (docs/log-format.md).
//! - [`window`]: writer windows, which make idempotent writers exactly-once.
//! - [`tablet`]: `LogTablet` — appends with offsets and commit timestamps, the high
//!   watermark, scans, the long-poll tail, offset lookups, recovery and TTL.
//!
//! Architecture invariant: a log tablet is one s3stream stream and knows nothing of
//! leadership, metadata, KV state or protocols. It is told its epoch; it never decides
//! who leads. Readers never see past the high watermark (the durable end).
// Function length, for the code that ships (tests may tell a long story): at most
// clippy.toml's threshold, but for the functions named with an `#[expect]` and its reason.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod batch;
mod checkpoint;
pub mod config;
pub mod tablet;
pub mod window;

pub use batch::{BatchHeader, LogBatch, NO_WRITER};
pub use config::LogConfig;
pub use tablet::{
    AppendRequest, Appended, LogScan, LogTablet, OffsetSpec, ScanResult, Submitted, wal_error,
};
