//! `mink-log`: the log tablet of one bucket.
//!
//! It owns, as it grows, the batch header and format, offset assignment, the commit
//! timestamp, the high watermark and log start, writer windows (idempotence), tailing
//! readers, scans, timestamp lookup and TTL. Today it holds its configuration.
//!
//! Architecture invariant: a log tablet is one s3stream stream and knows nothing of
//! leadership, metadata, KV state or protocols. It is told its epoch; it never decides
//! who leads.

pub mod config;

pub use config::LogConfig;
