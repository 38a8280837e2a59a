//! `mink-kv`: KV tablets of primary-key tables.
//!
//! It owns, as it grows, the `KvStore` trait with its fjall and redb backends, the
//! merge engines, partial updates, the changelog, the prewrite buffer, lookups,
//! snapshots and recovery by replay. Today it holds its configuration.
//!
//! Architecture invariant: the local store is a cache of the log, never a source of
//! truth. It is never fsynced; after a crash it is consistent at some flushed offset
//! and the changelog in the log tablet replays from there. mink-kv knows nothing of
//! leadership, metadata or protocols.

pub mod config;

pub use config::{KvBackend, KvConfig};
