//! Configuration of the metadata log and the lease.

use serde::{Deserialize, Serialize};

/// Metadata timings. Object-store requests cost money even when nothing happens, so
/// the defaults are unhurried; tests shorten them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// How often a node rewrites its heartbeat object, in milliseconds. Default 2,000.
    pub heartbeat_interval_ms: u64,
    /// A lease holder whose heartbeat has not changed for this long is replaced, in
    /// milliseconds. Default 10,000.
    pub lease_timeout_ms: u64,
    /// A node whose heartbeat has not changed for this long is dead and its buckets
    /// move, in milliseconds. Default 15,000.
    pub node_session_timeout_ms: u64,
    /// The slowest the metadata log is polled while idle, in milliseconds. Default 1,000.
    pub tail_idle_interval_max_ms: u64,
    /// A snapshot of the state machine is written every this many entries. Default 1,000.
    pub snapshot_every_entries: u64,
    /// The longest a request waits for `mink-min-applied-index`, in milliseconds.
    /// Default 5,000.
    pub applied_index_wait_max_ms: u64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 2_000,
            lease_timeout_ms: 10_000,
            node_session_timeout_ms: 15_000,
            tail_idle_interval_max_ms: 1_000,
            snapshot_every_entries: 1_000,
            applied_index_wait_max_ms: 5_000,
        }
    }
}

impl MetaConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_interval_ms == 0 {
            return Err("meta.heartbeat_interval_ms must be at least 1".into());
        }
        if self.lease_timeout_ms <= self.heartbeat_interval_ms {
            return Err("meta.lease_timeout_ms must exceed meta.heartbeat_interval_ms".into());
        }
        if self.node_session_timeout_ms <= self.heartbeat_interval_ms {
            return Err(
                "meta.node_session_timeout_ms must exceed meta.heartbeat_interval_ms".into(),
            );
        }
        if self.snapshot_every_entries == 0 {
            return Err("meta.snapshot_every_entries must be at least 1".into());
        }
        Ok(())
    }
}
