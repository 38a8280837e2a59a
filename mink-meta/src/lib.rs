//! `mink-meta`: cluster metadata.
//!
//! It owns, as it grows, the metadata log (an `ObjectLog` of commands), its
//! deterministic state machine, the applied index and waiting on it, snapshots, the
//! node registry and heartbeats, the lease, and the lease holder's duties: bucket
//! assignment, leader epochs, failure handling and rebalance. Today it holds its
//! configuration.
//!
//! Architecture invariant: every change to cluster state is an entry of the metadata
//! log, validated before it is appended; nodes coordinate through object storage
//! only, never by talking to each other. mink-meta knows nothing of tablets or
//! protocols.

pub mod config;

pub use config::MetaConfig;
