//! Configuration of the metadata log and the lease.

use serde::{Deserialize, Serialize};

/// Metadata timings. Object-store requests cost money even when nothing happens, so
/// the defaults are unhurried; tests shorten them. An idle node makes one heartbeat
/// PUT per `heartbeat_interval_ms` and one LIST per `tail_idle_interval_max_ms` (the
/// tail, which also shows every node's heartbeat): 1,440 requests an hour at the
/// defaults (docs/operations.md has the budget and the failover times it buys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConfig {
    /// How often a node rewrites its heartbeat object, in milliseconds. Default 5,000.
    pub heartbeat_interval_ms: u64,
    /// A lease holder whose heartbeat has not changed for this long is replaced, in
    /// milliseconds. Must exceed `heartbeat_interval_ms` plus
    /// `tail_idle_interval_max_ms` (a live node's heartbeat is seen that late at
    /// worst). Default 20,000.
    pub lease_timeout_ms: u64,
    /// A node whose heartbeat has not changed for this long is dead and its buckets
    /// move, in milliseconds. Same lower bound as `lease_timeout_ms`. Default 25,000.
    pub node_session_timeout_ms: u64,
    /// The slowest the metadata log is polled while idle, in milliseconds; the same
    /// listing shows heartbeats, so this is also how often liveness is observed.
    /// Default 5,000.
    pub tail_idle_interval_max_ms: u64,
    /// A snapshot of the state machine is written every this many entries. Default 1,000.
    pub snapshot_every_entries: u64,
    /// The longest a request waits for `mink-min-applied-index`, in milliseconds.
    /// Default 5,000.
    pub applied_index_wait_max_ms: u64,
    /// How often the lease holder expires Kafka group offsets past their retention
    /// (Kafka's `offsets.retention.check.interval.ms`), in milliseconds. A round with
    /// nothing to expire writes nothing. Default 60,000; from 100 to 86,400,000.
    pub offsets_expire_interval_ms: u64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 5_000,
            lease_timeout_ms: 20_000,
            node_session_timeout_ms: 25_000,
            tail_idle_interval_max_ms: 5_000,
            snapshot_every_entries: 1_000,
            applied_index_wait_max_ms: 5_000,
            offsets_expire_interval_ms: 60_000,
        }
    }
}

impl MetaConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_interval_ms == 0 {
            return Err("meta.heartbeat_interval_ms must be at least 1".into());
        }
        // A live node's heartbeat changes every heartbeat interval and is seen at the
        // next listing: a timeout at or below their sum declares live nodes dead.
        let seen_within = self
            .heartbeat_interval_ms
            .saturating_add(self.tail_idle_interval_max_ms);
        if self.lease_timeout_ms <= seen_within {
            return Err("meta.lease_timeout_ms must exceed meta.heartbeat_interval_ms + meta.tail_idle_interval_max_ms".into());
        }
        if self.node_session_timeout_ms <= seen_within {
            return Err(
                "meta.node_session_timeout_ms must exceed meta.heartbeat_interval_ms + meta.tail_idle_interval_max_ms".into(),
            );
        }
        if self.snapshot_every_entries == 0 {
            return Err("meta.snapshot_every_entries must be at least 1".into());
        }
        if !(100..=86_400_000).contains(&self.offsets_expire_interval_ms) {
            return Err(
                "meta.offsets_expire_interval_ms must be from 100 to 86400000 (a day)".into(),
            );
        }
        Ok(())
    }
}
